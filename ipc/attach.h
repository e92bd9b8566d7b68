// SPDX-License-Identifier: Apache-2.0
// The attach handshake on the daemon's Unix socket (SOCK_SEQPACKET):
//
//   client -> daemon  AttachRequest (namespace descriptor, ABI version)
//   daemon -> client  AttachReply + SCM_RIGHTS [session segment, host arena]
//
// The first 12 bytes of both messages (magic, ABI version) never change, so
// a client and a daemon of different versions always understand why they
// cannot talk.
#ifndef KVTIER_IPC_ATTACH_H_
#define KVTIER_IPC_ATTACH_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/namespace.h"
#include "kvtier/types.h"

namespace kvtier::ipc {

inline constexpr uint64_t kAttachRequestMagic = 0x5145524854544156ull;  // "VATTHREQ"
inline constexpr uint64_t kAttachReplyMagic = 0x5045524854544156ull;    // "VATTHREP"
inline constexpr size_t kMaxAttachMessage = 8192;
inline constexpr size_t kMaxClientName = 64;

struct AttachRequest {
  uint32_t abi_version = 0;  // filled by EncodeAttachRequest when 0
  NamespaceDescriptor ns;
  std::string client_name;   // shown by kvtierctl; at most kMaxClientName bytes
};

struct AttachReply {
  int32_t status = 0;  // 0 or KVTIER_E*
  std::string message;  // why, when status != 0
  uint64_t session_id = 0;
  NamespaceId namespace_id;
  HashAlgorithm hash = HashAlgorithm::kSha256;
  uint32_t block_tokens = 0;
  uint64_t block_bytes = 0;
  uint64_t arena_bytes = 0;
  std::string tenant;
};

std::vector<std::byte> EncodeAttachRequest(const AttachRequest& req);
// Errors: KVTIER_EPROTONOSUPPORT for another ABI version (message says which),
// KVTIER_EPROTO for anything malformed.
absl::StatusOr<AttachRequest> DecodeAttachRequest(std::span<const std::byte> data);

std::vector<std::byte> EncodeAttachReply(const AttachReply& reply);
absl::StatusOr<AttachReply> DecodeAttachReply(std::span<const std::byte> data);

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_ATTACH_H_
