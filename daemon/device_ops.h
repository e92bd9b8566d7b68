// SPDX-License-Identifier: Apache-2.0
// The device side of one session: the engine's KV-cache registrations and
// the GPU tier's arena export, device stores (an engine's pages gathered into
// GPU or host slots), device loads (scattered back layer by layer, then
// promoted into the GPU tier), and the GPU copies a leased lookup pins for the
// engine to read in place. The session decides what to do with blocks (the
// store's operations); this class moves bytes between the engine's memory,
// the GPU tier and the host arena.
//
// Thread contract: OnKvMessage: the control loop (registration messages come
// over the session's socket). MarkGpuCopies, ReleaseLease, Drop*, Gather,
// DropEverything: the session thread. Scatter: the session thread or an I/O
// thread (after tier reads). Find and kv_caches: any thread.
#ifndef KVTIER_DAEMON_DEVICE_OPS_H_
#define KVTIER_DAEMON_DEVICE_OPS_H_

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/unique_fd.h"
#include "store/block_store.h"
#include "daemon/engine_caches.h"
#include "store/gpu_cache.h"
#include "store/stats.h"
#include "ipc/abi.h"
#include "ipc/kv_registration.h"

namespace kvtier {

class DeviceOps {
 public:
  struct Context {
    uint64_t session_id = 0;
    int32_t pid = 0;                  // the peer, for log lines
    NamespaceInfo ns;
    std::byte* arena_base = nullptr;  // the tenant's host arena in the daemon
    GpuCache* gpu = nullptr;          // the tenant's GPU tier, or null
    BlockStore* store = nullptr;      // publishes GPU copies (with gpu)
    DaemonStats* stats = nullptr;
    std::function<bool()> log_ok;     // whether this tenant may log a line now
  };
  // Without a device backend or an arena, engine caches are refused.
  DeviceOps(Context ctx, DeviceBackend* device, KvCacheBudget* kv_budget);

  // A registration message from the socket: register or unregister an
  // engine cache, or export the GPU tier's arena. *reply_fds: descriptors to
  // send with the reply.
  ipc::KvRegisterReply OnKvMessage(std::span<const std::byte> data, std::vector<UniqueFd> fds,
                                   std::vector<UniqueFd>* reply_fds);
  // The registration `id`, or null.
  std::shared_ptr<const EngineCache> Find(uint64_t id) const;
  uint64_t kv_caches() const;

  // A device store: the pages of each block whose location says `needed`
  // (pages_per_block each, in key order) go to a reserved GPU slot, then on
  // to the block's host slot, or straight to the host slot.
  absl::Status Gather(const EngineCache& reg, std::span<const uint32_t> pages, const std::vector<BlockKey>& keys,
                      std::span<const BlockLocation> locs);
  // A device load of the prefix `lo` loaded: each block from its GPU copy
  // when it has one, else from its host slot, published layer by layer in
  // `progress`; then what came from host memory is promoted into the GPU tier.
  absl::Status Scatter(const EngineCache& reg, std::span<const uint32_t> pages, const std::vector<BlockKey>& keys,
                       const LoadOutcome& lo, ipc::DeviceLoadProgress* progress);

  // A lookup's first `hit` blocks: those with a GPU copy are reported in the
  // GPU tier; under a lease their copies are pinned (offsets in gpu_offsets)
  // until ReleaseLease(lease).
  void MarkGpuCopies(std::span<const BlockKey> keys, uint32_t hit, uint64_t lease, std::span<BlockLocation> locs,
                     std::span<uint64_t> gpu_offsets);
  void ReleaseLease(uint64_t lease);
  void DropNamespace();
  // Session end: every pin released, the engine's memory let go of now (a
  // dead engine's device memory must not be touched again).
  void DropEverything();

 private:
  // Copies the loaded blocks that did not come from the GPU tier into it.
  void PromoteToGpu(const std::vector<BlockKey>& keys, const LoadOutcome& lo, const std::vector<bool>& from_gpu);

  const Context ctx_;
  std::unique_ptr<EngineCaches> engines_;  // null without a device backend
  // GPU copies a leased lookup pinned for the engine to read, by lease.
  absl::flat_hash_map<uint64_t, std::vector<BlockKey>> gpu_pins_;
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_DEVICE_OPS_H_
