// SPDX-License-Identifier: Apache-2.0
#include "ipc/attach.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "ipc/abi.h"
#include "ipc/wire.h"

namespace kvtier::ipc {
namespace {

absl::Status Malformed(absl::string_view what) {
  return CodedStatus(KVTIER_EPROTO, absl::StrCat("malformed ", what));
}

absl::Status CheckPrefix(ByteReader& r, uint64_t want_magic, absl::string_view what) {
  uint64_t magic = 0;
  uint32_t version = 0;
  if (!r.Get(&magic) || magic != want_magic) return Malformed(absl::StrCat(what, " (bad magic)"));
  if (!r.Get(&version)) return Malformed(what);
  if (version != kAbiVersion) {
    return CodedStatus(KVTIER_EPROTONOSUPPORT,
                       absl::StrCat("peer speaks kvtier ABI v", version, ", this side speaks v",
                                    kAbiVersion, ": install libkvtier and kvtierd of one release"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::byte> EncodeAttachRequest(const AttachRequest& req) {
  ByteWriter w;
  w.Put(kAttachRequestMagic);
  w.Put(req.abi_version ? req.abi_version : kAbiVersion);
  const NamespaceDescriptor& d = req.ns;
  for (const std::string* s : {&d.model_id, &d.model_revision, &d.tokenizer_revision,
                               &d.adapter_id, &d.attention_config_hash, &d.kv_dtype,
                               &d.kv_layout, &d.cache_salt, &req.client_name}) {
    w.PutString(*s);
  }
  w.Put(d.block_tokens);
  w.Put(d.block_bytes);
  w.Put(d.tp_rank);
  w.Put(d.tp_size);
  return std::move(w.bytes());
}

absl::StatusOr<AttachRequest> DecodeAttachRequest(std::span<const std::byte> data) {
  if (data.size() > kMaxAttachMessage) return Malformed("attach request (too long)");
  ByteReader r(data);
  RETURN_IF_ERROR(CheckPrefix(r, kAttachRequestMagic, "attach request"));
  AttachRequest req;
  req.abi_version = kAbiVersion;
  NamespaceDescriptor& d = req.ns;
  for (std::string* s : {&d.model_id, &d.model_revision, &d.tokenizer_revision, &d.adapter_id,
                         &d.attention_config_hash, &d.kv_dtype, &d.kv_layout, &d.cache_salt}) {
    if (!r.GetString(s, kMaxDescriptorString)) return Malformed("attach request (namespace)");
  }
  if (!r.GetString(&req.client_name, kMaxClientName)) return Malformed("attach request (name)");
  if (!r.Get(&d.block_tokens) || !r.Get(&d.block_bytes) || !r.Get(&d.tp_rank) ||
      !r.Get(&d.tp_size) || !r.AtEnd()) {
    return Malformed("attach request (sizes)");
  }
  return req;
}

std::vector<std::byte> EncodeAttachReply(const AttachReply& reply) {
  ByteWriter w;
  w.Put(kAttachReplyMagic);
  w.Put(kAbiVersion);
  w.Put(reply.status);
  w.PutString(reply.message);
  w.Put(reply.session_id);
  w.PutBytes(reply.namespace_id.bytes);
  w.Put(static_cast<uint8_t>(reply.hash));
  w.Put(reply.block_tokens);
  w.Put(reply.block_bytes);
  w.Put(reply.arena_bytes);
  w.PutString(reply.tenant);
  return std::move(w.bytes());
}

absl::StatusOr<AttachReply> DecodeAttachReply(std::span<const std::byte> data) {
  if (data.size() > kMaxAttachMessage) return Malformed("attach reply (too long)");
  ByteReader r(data);
  RETURN_IF_ERROR(CheckPrefix(r, kAttachReplyMagic, "attach reply"));
  AttachReply reply;
  uint8_t hash = 0;
  if (!r.Get(&reply.status) || !r.GetString(&reply.message, 1024) ||
      !r.Get(&reply.session_id) || !r.GetBytes(reply.namespace_id.bytes) || !r.Get(&hash) ||
      !r.Get(&reply.block_tokens) || !r.Get(&reply.block_bytes) || !r.Get(&reply.arena_bytes) ||
      !r.GetString(&reply.tenant, 256) || !r.AtEnd()) {
    return Malformed("attach reply");
  }
  if (hash != static_cast<uint8_t>(HashAlgorithm::kSha256) &&
      hash != static_cast<uint8_t>(HashAlgorithm::kXxh3_128)) {
    return Malformed("attach reply (hash algorithm)");
  }
  reply.hash = static_cast<HashAlgorithm>(hash);
  return reply;
}

}  // namespace kvtier::ipc
