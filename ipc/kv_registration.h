// SPDX-License-Identifier: Apache-2.0
// Registering an engine's paged KV cache with the daemon, on the session's
// Unix socket after attach (SOCK_SEQPACKET):
//
//   client -> daemon  KvRegisterRequest + SCM_RIGHTS [one memfd per host region]
//                     or KvUnregisterRequest, or a GPU arena request
//   daemon -> client  KvRegisterReply (registration id and one event per
//                     layer, or the tenant's GPU-tier arena, or why not)
//                     + SCM_RIGHTS [the event pages, or the arena's memfd]
//
// A region is either CUDA device memory (its cudaIpcMemHandle_t travels in
// `handle`) or host memory backed by a memfd (CPU engines, and the
// host-simulated device), passed as a descriptor. Addresses are the engine's;
// the daemon maps them into its own.
#ifndef KVTIER_IPC_KV_REGISTRATION_H_
#define KVTIER_IPC_KV_REGISTRATION_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::ipc {

inline constexpr uint64_t kKvRegisterMagic = 0x3147455256564b56ull;  // "VKVREG1" + 1
inline constexpr uint64_t kKvReplyMagic = 0x3150455256564b56ull;     // "VKVREP1" + 1
inline constexpr uint32_t kMaxKvLayers = 1024;
inline constexpr uint32_t kMaxKvRegions = 64;  // also the most descriptors one message carries
inline constexpr size_t kMaxKvMessage = 64 * 1024;

enum class KvRegionKind : uint8_t { kHostMemfd = 1, kCudaIpc = 2 };

struct KvRegion {
  KvRegionKind kind = KvRegionKind::kHostMemfd;
  uint64_t base = 0;   // the engine's address of the region's first byte
  uint64_t bytes = 0;
  std::array<uint8_t, 64> handle{};  // kCudaIpc: cudaIpcMemHandle_t
};

struct KvRegisterRequest {
  uint32_t layers = 0, page_tokens = 0, kv_heads = 0, head_dim = 0;
  uint8_t dtype = 0;  // kernels::KvDtype
  uint8_t codec = 0;  // kernels::BlockCodec
  uint64_t num_pages = 0;
  uint64_t page_stride = 0;
  std::vector<KvRegion> regions;
  std::vector<uint64_t> k_layers, v_layers;  // engine addresses of page 0 of each layer
};

// Each layer's event: the daemon records it when it has queued that layer of
// a load (DeviceLoadProgress::armed says when all are), so an engine's
// stream can wait for the layer on the device instead of on the host.
enum class KvEventKind : uint8_t {
  kNone = 0,
  kCudaIpc = 1,     // `handle` is a cudaIpcEventHandle_t
  kSharedPage = 2,  // the simulated device's: descriptor `fd_index` of the reply, state at `offset`
};
struct KvEventRef {
  std::array<uint8_t, 64> handle{};
  uint32_t fd_index = 0;
  uint64_t offset = 0;
};

// The tenant's GPU-tier arena (answer to a GPU arena request): leased
// lookups give the offset of each block's pinned copy in it.
enum class KvArenaKind : uint8_t {
  kNone = 0,
  kCudaIpc = 1,  // `arena_handle` is a cudaIpcMemHandle_t
  kMemfd = 2,    // the simulated device's: the reply's first descriptor
};

struct KvRegisterReply {
  int32_t status = 0;  // 0 or KVTIER_E*
  uint64_t registration = 0;
  std::string message;
  KvEventKind event_kind = KvEventKind::kNone;
  std::vector<KvEventRef> layer_events;  // empty, or one per layer
  KvArenaKind arena_kind = KvArenaKind::kNone;
  std::array<uint8_t, 64> arena_handle{};
  uint64_t arena_bytes = 0;
};

std::vector<std::byte> EncodeKvRegister(const KvRegisterRequest& req);
// An unregistration is the same message kind with only the id.
std::vector<std::byte> EncodeKvUnregister(uint64_t registration);

// Asks for the session tenant's GPU-tier arena.
std::vector<std::byte> EncodeGpuArenaRequest();

struct KvMessage {
  bool unregister = false;
  bool gpu_arena = false;
  uint64_t registration = 0;  // unregister
  KvRegisterRequest request;  // register
};
// KVTIER_EPROTO (message says what) for anything malformed or past a limit.
absl::StatusOr<KvMessage> DecodeKvMessage(std::span<const std::byte> data);

std::vector<std::byte> EncodeKvReply(const KvRegisterReply& reply);
// `fds`: how many descriptors came with it (every fd_index must be below).
absl::StatusOr<KvRegisterReply> DecodeKvReply(std::span<const std::byte> data, size_t fds = 0);

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_KV_REGISTRATION_H_
