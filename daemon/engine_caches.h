// SPDX-License-Identifier: Apache-2.0
// The KV caches engines registered with the daemon (one set per session):
// their layout as the kernels see it, in the daemon's own addresses (the
// engine's memory imported through the device backend), and the device work
// that moves blocks between them and the host arena.
//
// Daemon-driven copies: a store gathers the engine's pages straight into the
// block's host-arena slot; a load scatters host-arena blocks into the
// engine's pages layer by layer, publishing each finished layer to the
// client through shared memory (ipc::DeviceLoadProgress), so the engine can
// start on layer 0 while later layers are still in flight. Each registration
// has one device event per layer, exported to the engine at registration:
// the daemon records layer i's event behind layer i's scatter, so an
// engine's stream can wait for a layer on the device itself.
#ifndef KVTIER_DAEMON_ENGINE_CACHES_H_
#define KVTIER_DAEMON_ENGINE_CACHES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/unique_fd.h"
#include "store/namespace_registry.h"
#include "store/stats.h"
#include "ipc/abi.h"
#include "ipc/kv_registration.h"
#include "kernels/kv_kernels.h"
#include "tiers/device_backend.h"

namespace kvtier {

// What one tenant's registered KV caches may take, across its sessions
// (limits.kv_caches_per_tenant, limits.kv_cache_bytes_per_tenant): each
// registration maps the engine's memory into kvtierd, and address space and
// descriptors are shared by every tenant. Owned by the daemon, outlives
// every session. Thread-safe.
class KvCacheBudget {
 public:
  KvCacheBudget(uint32_t max_caches, uint64_t max_bytes, DaemonStats* stats = nullptr)
      : max_caches_(max_caches), max_bytes_(max_bytes), stats_(stats) {}
  // KVTIER_EBUSY (naming the limit) when one more cache of `bytes`
  // would pass either bound; else charges it.
  absl::Status Charge(uint64_t bytes);
  void Refund(uint64_t bytes);
  uint32_t caches() const;
  uint64_t bytes() const;

 private:
  const uint32_t max_caches_;
  const uint64_t max_bytes_;
  DaemonStats* const stats_;
  mutable Mutex mu_;
  uint32_t caches_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// One registered engine cache.
struct EngineCache {
  EngineCache(DeviceBackend* device) : device(device) {}
  ~EngineCache();  // closes the imported memory
  EngineCache(const EngineCache&) = delete;
  EngineCache& operator=(const EngineCache&) = delete;

  uint64_t id = 0;
  kernels::KvShape shape;  // block_tokens from the namespace
  kernels::BlockCodec codec = kernels::BlockCodec::kLossless;
  kernels::PagedCache cache;  // daemon addresses
  uint32_t pages_per_block = 0;
  DeviceBackend* const device;
  std::vector<void*> imported;
  std::vector<DeviceEvent> layer_events;  // one per layer, exported to the engine
  KvCacheBudget* budget = nullptr;        // refunded `charged` bytes when the cache goes
  uint64_t charged = 0;
};

// What a registration hands back to the engine.
struct Registered {
  uint64_t id = 0;
  ipc::KvEventKind event_kind = ipc::KvEventKind::kNone;
  std::vector<ipc::KvEventRef> layer_events;
  std::vector<UniqueFd> fds;  // the event pages (simulated device)
};

class EngineCaches {
 public:
  static constexpr size_t kMaxPerSession = 16;

  // `budget` (may be null: unbounded) is the session tenant's.
  EngineCaches(DeviceBackend* device, NamespaceInfo ns, KvCacheBudget* budget = nullptr)
      : device_(device), ns_(std::move(ns)), budget_(budget) {}
  ~EngineCaches();

  // Thread-safe. Checks the layout against the namespace (block bytes must
  // match), imports every region, maps each layer into daemon addresses and
  // exports one event per layer. InvalidArgument / FailedPrecondition naming
  // what does not fit.
  absl::StatusOr<Registered> Register(const ipc::KvRegisterRequest& req, std::vector<UniqueFd> fds);
  // Thread-safe. NotFound for an unknown id. Work already running keeps its
  // reference and finishes first.
  absl::Status Unregister(uint64_t id);
  // Thread-safe. Drops every registration (the session ended).
  void Clear();
  // Thread-safe. nullptr when unknown.
  std::shared_ptr<const EngineCache> Find(uint64_t id) const;
  size_t size() const;

  // Gathers pages (pages_per_block per block) into the host-arena blocks at
  // `dst` and waits for it. Any thread.
  absl::Status Gather(const EngineCache& c, std::span<const uint32_t> pages, std::span<const uint64_t> dst);
  // Copies `bytes` from each src to its dst (device or registered host
  // memory) on the session's stream and waits. Any thread.
  struct CopyOp {
    void* dst;
    const void* src;
  };
  absl::Status Copy(std::span<const CopyOp> ops, uint64_t bytes);
  // Scatters the host-arena blocks at `src` into pages, layer after layer,
  // recording each layer's event behind it, then arms *progress and
  // publishes each finished layer there (waking the futexes). Any thread.
  absl::Status ScatterByLayer(const EngineCache& c, std::span<const uint32_t> pages, std::span<const uint64_t> src,
                              ipc::DeviceLoadProgress* progress);

 private:
  absl::StatusOr<DeviceStream> Stream();
  absl::Status ExportLayerEvents(EngineCache& c, Registered* out);
  // Register's steps. The layout against the namespace (c's shape, codec and
  // pages); returns a page's bytes.
  absl::StatusOr<uint64_t> CheckLayout(const ipc::KvRegisterRequest& req, EngineCache& c) const;
  // Every region imported into c (its daemon address, by region); memfd
  // regions take the descriptors in order, each checked by CheckMemfdRegion.
  absl::StatusOr<std::vector<uint64_t>> ImportRegions(const ipc::KvRegisterRequest& req, std::vector<UniqueFd> fds,
                                                      EngineCache& c);
  absl::Status CheckMemfdRegion(size_t i, const ipc::KvRegion& r, bool has_fd, const UniqueFd& fd) const;
  // Each layer's K and V pages, found inside one region, in daemon addresses.
  absl::Status MapLayers(const ipc::KvRegisterRequest& req, const std::vector<uint64_t>& local, uint64_t page_bytes,
                         EngineCache& c) const;

  DeviceBackend* const device_;
  const NamespaceInfo ns_;
  KvCacheBudget* const budget_;
  mutable Mutex mu_;
  std::map<uint64_t, std::shared_ptr<EngineCache>> caches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  DeviceStream stream_ ABSL_GUARDED_BY(mu_) = 0;
  Mutex work_mu_;  // one device operation at a time per session: they share the stream
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_ENGINE_CACHES_H_
