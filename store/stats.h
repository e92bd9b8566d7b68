// SPDX-License-Identifier: Apache-2.0
// Daemon-wide counters. Relaxed atomics: each is an independent tally read
// for reporting, never used to order other memory. A copy of a counter, a
// histogram or a whole DaemonStats is a snapshot of its values (what the
// status snapshot carries); counters are read one by one, so a snapshot
// taken under traffic is not one instant.
#ifndef KVTIER_STORE_STATS_H_
#define KVTIER_STORE_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <iterator>

#include "ipc/abi.h"

namespace kvtier {

struct Counter {
  Counter() = default;
  Counter(const Counter& o) : v(o.Get()) {}
  Counter& operator=(const Counter& o) {
    v.store(o.Get(), std::memory_order_relaxed);
    return *this;
  }
  std::atomic<uint64_t> v{0};
  void Add(uint64_t n = 1) { v.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Get() const { return v.load(std::memory_order_relaxed); }
};

// A latency histogram with fixed bounds (seconds, Prometheus style: a
// bucket counts observations <= its bound; the last is +Inf).
class Histogram {
 public:
  Histogram() = default;
  Histogram(const Histogram& o) { *this = o; }
  Histogram& operator=(const Histogram& o) {
    for (size_t i = 0; i < kBuckets; ++i) buckets_[i].store(o.buckets_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
    sum_ns_.store(o.sum_ns_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
  static constexpr std::array<double, 15> kBounds = {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4,
                                                     5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 1e-1, 1.0};
  static constexpr size_t kBuckets = kBounds.size() + 1;
  void Record(uint64_t ns) {
    const double s = double(ns) * 1e-9;
    size_t i = 0;
    while (i < kBounds.size() && s > kBounds[i]) ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  }
  struct Snapshot {
    std::array<uint64_t, kBuckets> counts{};  // per bucket, not cumulative
    uint64_t count = 0;
    double sum_s = 0;
  };
  Snapshot Get() const {
    Snapshot s;
    for (size_t i = 0; i < kBuckets; ++i) {
      s.counts[i] = buckets_[i].load(std::memory_order_relaxed);
      s.count += s.counts[i];
    }
    s.sum_s = double(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
    return s;
  }

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

// Why a peer's request or connection was refused by a limit or a rule of
// the trust boundary (docs/security.md). Each reason is a counter in the
// status JSON (stats.refused) and a kvtier_refused_total{reason} series.
enum class Refusal : uint8_t {
  kDuplicateKeys,          // a request named one block twice
  kTenantSessions,         // the tenant's sessions are at limits.sessions_per_tenant
  kTenantKvCaches,         // the tenant's registered KV caches at limits.kv_caches_per_tenant
  kTenantMappedBytes,      // ... or their bytes at limits.kv_cache_bytes_per_tenant
  kSessionLeasedBlocks,    // a session's leases at limits.leased_blocks_per_session
  kBadClientString,        // a client name or namespace string that is not printable UTF-8
  kPendingConnections,     // unauthenticated connections over the per-uid or total bound
  kSlowPeer,               // a peer that did not read its replies was disconnected
  kAdminBadRequest,        // admin JSON with a wrong type or shape
  kTenantNamespaces,       // a new namespace past limits.namespaces_per_tenant
  kCount
};
inline constexpr const char* kRefusalNames[] = {
    "duplicate_keys",  "tenant_sessions",     "tenant_kv_caches", "tenant_mapped_bytes", "session_leased_blocks",
    "bad_client_string", "pending_connections", "slow_peer",        "admin_bad_request", "tenant_namespaces"};
static_assert(std::size(kRefusalNames) == static_cast<size_t>(Refusal::kCount));

struct DaemonStats {
  std::array<Counter, static_cast<size_t>(Refusal::kCount)> refused;
  void Refused(Refusal r) { refused[static_cast<size_t>(r)].Add(); }
  // Lines a peer would have made kvtierd log beyond limits.log_lines_per_s.
  Counter log_lines_suppressed;
  // Namespaces freed: no session and no block left (their handles are reused).
  Counter namespaces_freed;
  // Times kvtierd gave the heap's free pages back to the kernel after its
  // tiers churned (daemon/heap_trim.h), and the time that took in all.
  Counter heap_trims, heap_trim_ns;

  // Lookups that take a lease are the engine's commitment to a request; they
  // feed hit statistics. Lookups without a lease (scheduler probes that may
  // repeat) are counted apart and change nothing.
  Counter lookups, lookup_hits, probes;
  Counter blocks_queried, blocks_hit, tokens_queried, tokens_hit;
  // Of blocks_hit, those whose copy was below host memory: in a lower tier
  // of this node's own (NVMe) or in a tier other nodes share (a Redis
  // Cluster, a shared directory). Each lane's own are its `hits`.
  Counter blocks_hit_local, blocks_hit_shared;
  Counter stores, blocks_stored, bytes_stored, store_aborts, blocks_already_present;
  Counter loads, blocks_loaded, bytes_loaded, load_failures;
  Counter evictions, invalidations, store_refused_no_space;
  // Stores that found every block they could evict busy with I/O for a
  // moment, and waited for it (HostResidency::AllocateSlotLocked).
  Counter stores_waited_for_busy_blocks;
  // Movement between tiers. Host evictions end as kept (an NVMe copy already
  // existed), demoted (written to NVMe) or dropped.
  Counter evictions_kept_on_nvme, demotions, demotions_failed, evictions_dropped;
  // Background demotions that waited for the first lower tier's device
  // (its staging memory was busy) before their write went.
  Counter demotions_waited;
  // Why host evictions were dropped rather than demoted (with
  // evictions_dropped_by_cost, they sum to evictions_dropped): no tier below
  // host memory; a block larger than that tier takes; no room there (its
  // quota, a fair share, every block busy); the tier refused writes (its
  // disk full or read-only).
  Counter dropped_no_lower_tier, dropped_too_large, dropped_no_room, dropped_tier_unwritable;
  // ... and the first lower tier's admission gate turned the block away
  // (tiers.nvme.admission_min_uses: not asked for often enough).
  Counter dropped_not_admitted;
  // Publishes (write_policy reused / committed) the shared tier's admission
  // gate turned away (tiers.remote.admission_min_uses; not in
  // remote_publishes_skipped). Blocks the gate keeps from the cascade are
  // dropped from NVMe by it (cascade_dropped_not_admitted).
  Counter remote_publishes_not_admitted;
  // Blocks the cascade dropped from a lower tier instead of moving them down,
  // because the tier below turned them away (also in nvme_evictions).
  Counter cascade_dropped_not_admitted;
  // Why host evictions happened, besides a full arena: the background
  // reclaimer (above the high watermark), a tenant's host_tokens quota.
  Counter evictions_background, evictions_for_quota;
  // Whole segments of one block size emptied for another (their blocks
  // were all colder than the other size's coldest), and the evictions that
  // took.
  Counter host_segments_reclaimed, evictions_for_other_size;
  // NVMe evictions of a tenant's own blocks to stay within its NVMe quota
  // (a subset of nvme_evictions); demotions refused because its quota holds
  // only pinned or busy blocks.
  Counter nvme_evictions_for_quota, demotions_refused_quota;
  // Demotions refused because the only NVMe blocks that could make room
  // belong to other tenants at or under their fair share of the tier
  // (Migrator::AllocateLowerSlotLocked).
  Counter demotions_refused_fair_share;
  // Leased lookups whose hit stopped at a block on NVMe because the tenant
  // pinned its fair share of the tier already (its leases hold that much).
  Counter pins_refused_fair_share;
  // Cost-model decisions: evictions dropped because an NVMe reload would be
  // slower than recomputing the block (a subset of evictions_dropped); blocks
  // a leased lookup found but reported as "recompute" for the same reason.
  Counter evictions_dropped_by_cost, blocks_recompute;
  // Evictions the cost model would have dropped, demoted anyway (one in 32)
  // so the NVMe tier keeps blocks to measure it on.
  Counter demotions_for_calibration;
  Counter prefill_reports, prefill_reports_refused;
  Counter nvme_evictions, writes_through;
  // Host evictions written one tier below the first because the first was
  // full, or its staging memory refused the write, and the next had room
  // (also in demotions): nothing dropped for it.
  Counter demotions_past_full_tier;
  // The chain below NVMe: blocks the cascade copied one tier down; moves
  // that did not happen (a read or write failed, no room below, or the block
  // was used or removed meanwhile); evictions from tiers below the first.
  Counter cascades, cascades_failed, lower_evictions;
  Counter promotions, promotions_failed, promotions_for_load, prefetches;
  Counter recovered_dropped;
  // The shared tier (tiers.remote): lookups that asked it past their local
  // hit prefix, the blocks asked and found (adopted: loads read them from
  // it), probes not answered within the latency budget; blocks this node
  // wrote there on its write policy (published), writes skipped (already
  // published, or too many in flight) and failed; cascade moves into it
  // that found the block already there and wrote nothing.
  Counter remote_probes, remote_probe_blocks, remote_probe_found, remote_probes_late;
  Counter remote_probes_busy;  // not asked: the tenant had kMaxSharedProbesPerTenant waiting
  Counter remote_probes_throttled;  // not asked: the tenant's probe_blocks_per_s was spent
  Counter remote_adoptions_refused;  // found there, not indexed: the tenant's records_per_tenant were full
  Counter remote_publishes, remote_publishes_skipped, remote_publishes_failed, remote_writes_avoided;
  // Cascade moves into the shared tier whose EXISTS found the block there
  // but whose value did not read back intact (gone since, damaged, or
  // forged): this node wrote its own copy instead of trusting it.
  Counter cascade_found_unproven;
  // Engine KV caches: registrations (and refusals), daemon-driven gathers
  // (stores) and scatters (loads) with them, and device work that failed.
  Counter kv_registrations, kv_registrations_refused, device_stores, device_blocks_stored, device_loads,
      device_blocks_loaded, device_errors;
  Counter sessions_attached, sessions_detached, attach_refused, protocol_errors, sessions_closed_dead;
  // SIGHUP: config reloads applied, and refused (the file did not parse or validate).
  Counter reloads, reloads_failed;
  // SIGTERM: stores refused while draining.
  Counter store_refused_draining;
  // Latency: each request from the session thread taking it to its
  // completion, by opcode (index = ipc::Opcode, 0 unused); NVMe transfers
  // from submission to callback.
  std::array<Histogram, ipc::kMaxOpcode + 1> op_latency;
  Histogram nvme_read_latency, nvme_write_latency;
  Histogram lower_read_latency;  // promotions' reads from tiers below the first
  Histogram remote_probe_latency;  // a lookup's wait for the shared tier's answer
};

}  // namespace kvtier

#endif  // KVTIER_STORE_STATS_H_
