// SPDX-License-Identifier: Apache-2.0
// kvtierd's status as one typed value, taken on the control loop
// (Daemon::Snapshot) and written two ways: the status JSON that
// `kvtierctl status --json` and the admin endpoint return (StatusJson), and
// the Prometheus exposition text (PrometheusText, daemon/metrics.h). Both
// writers read fields, never each other's output, so renaming a JSON key
// cannot silently change a metric. Holds only counts, sizes and the names
// of tiers, tenants, clients and policies: never block contents, keys,
// prompts or salts.
#ifndef KVTIER_DAEMON_STATUS_SNAPSHOT_H_
#define KVTIER_DAEMON_STATUS_SNAPSHOT_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "store/block_store.h"
#include "store/cost_tracker.h"
#include "events/kv_events.h"
#include "store/gpu_cache.h"
#include "daemon/session.h"
#include "store/stats.h"
#include "nlohmann/json.hpp"
#include "tiers/block_tier.h"
#include "tiers/nvme_tier.h"
#include "tiers/remote_tier.h"

namespace kvtier {

// The shared tier (tiers.remote): its cluster as this daemon's connections
// see it (summed over the tenants' own connections), and why reads missed.
struct RemoteStatus {
  std::string write_policy;
  uint32_t probe_budget_us = 0;
  RemoteTier::Misses misses;
  RemoteTier::Budget budget;
  uint64_t slots_covered = 0;  // the least any tenant's map covers, of 16384
  uint64_t moved = 0, ask = 0, tryagain = 0, clusterdown = 0, refreshes = 0, refresh_failures = 0;
  uint64_t auth_failures = 0;  // connections a node refused to authenticate (wrong password, revoked user)
  uint64_t tenants_refused = 0;  // tenants the cluster refuses now (left out of slots_covered and nodes)
  struct Node {
    std::string address;
    bool connected = false;  // every tenant's connection to it is up
    uint64_t slots = 0, commands = 0, errors = 0, connects = 0;
  };
  std::vector<Node> nodes;
};

struct StatusSnapshot {
  struct Session {
    uint64_t id = 0;
    SessionInfo info;
  };
  struct Tenant {
    TenantUsage usage;
    uint64_t sessions = 0;
    uint64_t kv_caches = 0, kv_cache_bytes = 0;  // engine KV caches registered
    std::optional<GpuCache::Usage> gpu;           // with a GPU tier
  };
  // The host tier, summed over tenants' arenas; its movement counters are
  // in `stats`.
  struct Host {
    std::string policy;
    uint64_t capacity_bytes = 0, used_bytes = 0, blocks = 0, pinned_blocks = 0, evictions = 0;
    uint64_t stranded_bytes = 0;
    double high_watermark = 0, low_watermark = 0;
  };
  // One block tier of the chain below host memory (chain_position 0 takes
  // demotions; its hits and movement counters are in `stats`).
  struct Lower {
    std::string name;
    std::string kind;  // TierName of its kind: nvme, remote, fs
    bool shared = false;  // the store's shared lane: probes and publishes go there
    std::vector<std::pair<std::string, uint64_t>> counters;  // BlockTier::VisitCounters
    size_t chain_position = 0;
    std::string policy;
    bool durable = false;
    BlockTierStats io;
    uint64_t blocks = 0;  // index records whose lower copy is here
    uint64_t hits = 0;    // blocks of leased lookups' hit prefixes found here
    TierHealth health = TierHealth::kHealthy;
    std::optional<NvmeStats> nvme;  // what only the NVMe tier has: engine, journal, recovery
    std::optional<RemoteStatus> remote;  // what only the shared tier has: its cluster, misses by cause
  };
  // The GPU tier, summed over tenants' arenas.
  struct Gpu {
    std::string device;
    GpuCache::Usage usage;
    TierHealth health = TierHealth::kHealthy;
  };

  std::string version;
  pid_t pid = 0;
  double uptime_s = 0;
  std::string device, hash, socket;
  uint64_t namespaces = 0, indexed_blocks = 0;
  std::vector<Session> sessions;
  std::vector<Tenant> tenants;
  Host host;
  std::vector<Lower> lower;
  std::optional<Gpu> gpu;
  CostTracker::Report cost_model;
  // KV events ([events] enabled): the counters and each tenant's endpoints.
  struct Events {
    KvEventStats stats;
    std::vector<std::tuple<std::string, std::string, std::string>> tenants;  // name, endpoint, replay
  };
  std::optional<Events> events;
  std::optional<std::string> metrics_url;  // set when the metrics endpoint listens
  uint16_t metrics_port = 0;
  DaemonStats stats;  // a copy: the counters' values when the snapshot was taken
};

// The status JSON (docs/operations.md lists its fields).
nlohmann::json StatusJson(const StatusSnapshot& s);

// A histogram as the status JSON carries it: bounds, per-bucket counts,
// count, sum.
nlohmann::json HistogramJson(const Histogram::Snapshot& h);

}  // namespace kvtier

#endif  // KVTIER_DAEMON_STATUS_SNAPSHOT_H_
