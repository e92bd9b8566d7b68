// SPDX-License-Identifier: Apache-2.0
// The daemon's data plane without the IPC: lookups, leases (pins), stores,
// loads, invalidation, eviction and movement between each tenant's host tier
// and a chain of shared block tiers below it (NVMe first in kvtierd).
// Sessions call it from their own threads; tier completions call back from
// I/O and journal threads.
//
// A block may have a host copy, a copy in one lower tier, or both. It is
// visible while one of them is ready. Host eviction keeps a block that
// already has a lower copy, demotes one that has none into the first lower
// tier (write-back), or drops it when there is no lower tier or no room.
// The cascade moves cold copies one tier down. Loads of blocks without a
// host copy promote them into host slots first, from whichever tier holds
// them.
//
// The store is several objects over one set of books (store_books.h): this
// class holds the operations (lookups, leases, stores, loads, invalidation);
// HostResidency keeps a tenant's host books, LowerLane a lower tier's, the
// Migrator makes every move between tiers (demotion, promotion,
// write-through, the drain, the cascade) and the room in host tiers that
// stores and promotions take, SharedTiers holds the shared tiers' probe and
// write policy, the Reclaimer runs background host eviction.
//
// Lock order: docs/architecture.md, "Lock order" (tenant tier lock, then the
// lane locks in chain order, then block-index shard locks; the rest are leaves).
#ifndef KVTIER_STORE_BLOCK_STORE_H_
#define KVTIER_STORE_BLOCK_STORE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "store/block_index.h"
#include "store/cost_tracker.h"
#include "store/gpu_cache.h"
#include "store/host_residency.h"
#include "store/lower_lane.h"
#include "store/migrator.h"
#include "store/namespace_registry.h"
#include "store/reclaimer.h"
#include "store/shared_tiers.h"
#include "store/shared_writes.h"
#include "store/stats.h"
#include "store/store_books.h"
#include "policies/chain_guard.h"
#include "policies/eviction_policy.h"
#include "tiers/host_tier.h"
#include "tiers/block_tier.h"

namespace kvtier {

// Where a block is, for the engine.
struct BlockLocation {
  TierKind tier = TierKind::kNone;
  uint64_t arena_offset = 0;
  bool needed = false;     // StoreBegin: the engine must fill this slot
  bool recompute = false;  // Lookup: present, but slower to load than to recompute
  uint8_t lane = kNoLane;  // Lookup: the lower tier's position in the chain, when in one
};

// What one session holds. Touched only by that session's thread; the
// atomics are read by the admin endpoint.
struct SessionHoldings {
  NamespaceInfo ns;
  uint64_t next_id = 1;
  absl::flat_hash_map<uint64_t, std::vector<BlockRecord*>> leases;
  // Per lease, the bytes it pins of blocks whose only copy is on a local
  // lower tier (HostResidency::lower_pinned_bytes), given back at Release.
  absl::flat_hash_map<uint64_t, uint64_t> lease_lower_bytes;
  struct Ticket {
    std::vector<BlockRecord*> blocks;
    std::vector<uint64_t> parents;  // each block's parent identity (PolicyKeyOf); 0 unknown
  };
  absl::flat_hash_map<uint64_t, Ticket> tickets;
  std::atomic<uint64_t> lease_count{0};
  std::atomic<uint64_t> pinned_blocks{0};
  std::atomic<uint64_t> ticket_count{0};  // stores begun and not yet committed or aborted
  // The last leased lookup's chain (PolicyKeyOf each key): its blocks were
  // counted as used (AfterReply), so a store after it does not count them
  // again, and it tells the depth of the blocks a store after it brings.
  std::vector<uint64_t> last_chain;
  bool uses_pending = false;  // AfterReply: the admission gates count last_chain
  // The last ask's chain (a leased lookup's, or an unleased ask's), which
  // the policies that learn from requests take at AfterReply.
  std::vector<uint64_t> ask_chain;
  size_t ask_held = 0;  // how many of its first blocks the tiers held (its hits)
  bool observe_pending = false;
  // Blocks to write to the shared tier after the reply (write_policy), each
  // with an io_ref taken for it.
  std::vector<BlockRecord*> publish_pending;
};

// One host policy of a tenant (one per block size it holds).
struct PolicyUsage {
  uint64_t slot_bytes = 0;
  uint64_t blocks = 0;
  uint64_t bookkeeping = 0;  // entries the policy keeps (EvictionPolicy::bookkeeping)
  std::string leader;  // the adaptive policy's current expert; else the policy's name
  uint64_t switches = 0;
  std::vector<std::pair<std::string, double>> scores;  // adaptive only
};

struct TenantUsage {
  std::string name;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t blocks = 0;         // host slots in use (ready, being written or loaded)
  uint64_t pinned_blocks = 0;  // blocks with at least one lease
  uint64_t evictions = 0;
  // Leased lookups and what they found (BlockStore::Lookup), per tenant.
  uint64_t lookups = 0, lookup_hits = 0, blocks_queried = 0, blocks_hit = 0, tokens_queried = 0, tokens_hit = 0;
  // Of blocks_hit, those found in each lower tier (by chain position; the
  // lanes' kinds are the store's LowerTiers()).
  std::array<uint64_t, kMaxLowerTiers> blocks_hit_lane{};
  uint64_t host_tokens = 0;  // resident in the host arena
  uint64_t nvme_bytes = 0, nvme_tokens = 0;
  TenantQuota quota;
  std::vector<PolicyUsage> policies;
  // The arena per block size (slot size), and free space that only one
  // size can use (SlotAllocator::ClassUsage::stranded_bytes).
  std::vector<SlotAllocator::ClassUsage> classes;
  uint64_t stranded_bytes = 0;
};

// The result of a load: locations of the blocks that made it into host
// slots, `loaded` of them as a prefix; the rest failed (message in status)
// and must be recomputed.
struct LoadOutcome {
  std::vector<BlockLocation> locations;
  uint32_t loaded = 0;
  absl::Status status;
};
using LoadCallback = absl::AnyInvocable<void(LoadOutcome) &&>;
using CountCallback = absl::AnyInvocable<void(absl::StatusOr<uint32_t>) &&>;

class BlockStore {
 public:
  struct Options {
    uint32_t max_leases_per_session = 65536;
    std::string policy = "lru";
    // The NVMe tier's policy: any but the host-only ones (IsHostOnlyPolicy).
    std::string nvme_policy = "lru";
    bool write_through = false;  // also write every committed block to NVMe at once
    CostTracker::Options cost;
    // Background reclaim (StartBackgroundReclaim): above high_watermark (a
    // share of a tenant's arena, or of its host_tokens quota) evict the
    // tenant's coldest blocks down to low_watermark. 1 and 1: off (stores
    // evict when the tier is full, on their own path).
    double high_watermark = 1.0;
    double low_watermark = 1.0;
    // Blocks one session's leases may hold at once (limits.leased_blocks_per_session):
    // lease books cost memory per block, so they are bounded in blocks, not leases.
    uint32_t max_leased_blocks_per_session = 262144;
    // The cascade between lower tiers (with two or more): above
    // cascade_high of a tier's capacity, its coldest blocks are copied one
    // tier down until it is at cascade_low. The last tier evicts (drops).
    double cascade_high = 0.9;
    double cascade_low = 0.8;
    // The shared tiers (lower tiers whose shared() is true: the redis and fs
    // kinds). Where the local tiers end a lookup's hit prefix, the lookup asks
    // each
    // which of the next blocks (at most shared_probe_max_blocks) it holds,
    // waiting at most shared_probe_budget_us (0: never asks); the blocks it
    // holds join the prefix as copies there, priced by the cost model at
    // its measured speed. Both reloadable (SetSharedPolicy).
    uint32_t shared_probe_budget_us = 2000;
    uint32_t shared_probe_max_blocks = 256;
    // Fair shares of the shared tier: each tenant's lookups ask about at
    // most shared_probe_blocks_per_s blocks a second (a token bucket, one
    // second deep); each tenant has at most shared_records_per_tenant
    // blocks indexed in the shared lane; blocks under shared_min_block_bytes
    // never go there (a record costs this node memory whatever its size).
    uint32_t shared_probe_blocks_per_s = 50000;
    uint32_t shared_records_per_tenant = 262144;
    uint64_t shared_min_block_bytes = 4096;
    SharedWrites shared_writes = SharedWrites::kDemoted;
    // Admission gates (policies/reuse_gate.h): the first lower tier that is
    // not shared takes a host eviction, and the shared tier any write, only
    // when leased lookups asked for the block this many times (1: all). One
    // sketch counts the uses, with a history of about
    // admission_history_uses uses (4 bytes each).
    uint32_t nvme_admission_min_uses = 1;
    uint32_t shared_admission_min_uses = 1;
    uint64_t admission_history_uses = 1 << 20;
  };
  // InvalidArgument for an unknown policy name or an admission threshold
  // outside 1..15.
  static absl::StatusOr<std::unique_ptr<BlockStore>> Create(const Options& opts, DaemonStats* stats);
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Setup, before sessions start (not thread-safe).
  // `gpu`: the tenant's GPU tier, if it has one. It holds copies of blocks
  // the store has (it includes the host tier and the chain), so the store
  // drops a block's GPU copy whenever the block leaves the index (evicted
  // with no lower copy, invalidated, a failed demotion, a damaged copy):
  // a GPU copy never outlives its block.
  absl::StatusOr<uint16_t> AddTenant(std::string name, std::unique_ptr<HostTier> host, TenantQuota quota = {},
                                     std::unique_ptr<GpuCache> gpu = nullptr);
  // Appends a block tier to the chain below host memory (the first takes
  // demotions: NVMe in the daemon; each next one what the one above it
  // cascades down), with the blocks it recovered: each lands in its
  // tenant's namespace (registered through `namespaces`); blocks of tenants
  // no longer configured, or already held by a tier above, are freed.
  // Returns how many were indexed. At most kMaxLowerTiers.
  absl::StatusOr<uint64_t> AttachLowerTier(std::unique_ptr<BlockTier> lower,
                                           const std::vector<RecoveredBlock>& recovered,
                                           NamespaceRegistry* namespaces);
  // Starts the background reclaim thread when the watermarks are below 1,
  // and the cascade with two lower tiers or more; after every AddTenant and
  // AttachLowerTier (the threads walk the tenants and the chain). Main thread.
  void StartBackgroundReclaim();
  // A config reload: a tenant's quotas (thread-safe) (NotFound for an unknown
  // tenant), and the background reclaim watermarks (starting the reclaimer
  // if it was off; InvalidArgument unless 0.05 <= low <= high <= 1). Blocks
  // already over a lowered quota are evicted as stores need room.
  absl::Status SetQuota(const std::string& tenant, TenantQuota quota);
  absl::Status SetWatermarks(double high, double low);  // main thread (may start the reclaimer)
  // KV events (events/kv_events.h): after every AddTenant, before the lower
  // tiers attach (their recovered blocks are announced) and sessions start.
  void SetEvents(KvEvents* events);
  // A config reload of the shared tier's probe budget and write policy. Thread-safe.
  void SetSharedPolicy(uint32_t probe_budget_us, SharedWrites writes) { shared_.SetPolicy(probe_budget_us, writes); }
  // The first shared lane, if the chain has one: it takes publishes;
  // lookups ask every shared lane (shared_lanes()).
  std::optional<size_t> shared_lane() const {
    return shared_.empty() ? std::nullopt : std::optional<size_t>(shared_.lanes().front());
  }
  const std::vector<uint8_t>& shared_lanes() const { return shared_.lanes(); }
  // Draining (SIGTERM): from now on StoreBegin refuses with EBUSY. Thread-safe.
  void SetDraining() { draining_.store(true, std::memory_order_release); }
  // Writes every committed host block without a lower copy to the first
  // lower tier (NVMe in kvtierd) and makes it durable (the NVMe journal),
  // so a restart serves them again.
  // Thread-safe (blocks moving meanwhile are counted as failed). Waits at
  // most `timeout` for the writes.
  using FlushResult = kvtier::FlushResult;
  FlushResult FlushToFirstLowerTier(std::chrono::nanoseconds timeout) { return migrator_.Flush(timeout); }

  // Thread-safe (block_reports.cc). Up to `limit` visible blocks (of one
  // tenant, or with one key), for kvtierctl blocks: where each is, its pins and size.
  struct BlockInfo {
    BlockKey key;
    uint32_t ns = 0;
    uint16_t tenant = 0;
    bool on_host = false, moving = false;
    bool on_lower = false;  // a ready copy in lower tier `lower` (lower_tier(lower))
    uint8_t lower = 0;
    uint32_t pins = 0;
    uint16_t depth = kUnknownDepth;
    uint32_t tokens = 0;
    uint64_t bytes = 0;
  };
  std::vector<BlockInfo> ListBlocks(std::optional<uint16_t> tenant, size_t limit, const BlockKey* key = nullptr);
  // Thread-safe. Evicts every unpinned host block of a tenant (demoting
  // those worth keeping to NVMe, as evictions do); returns how many.
  absl::StatusOr<uint64_t> EvictTenant(const std::string& tenant);
  // Stops it after its current batch (whose slots are then free); stores
  // evict on their own path from then on. Main thread.
  void StopBackgroundReclaim();
  // Main thread, now and then. When the cost model has been deciding
  // against the NVMe tier without any read to learn from, reads a few of its
  // blocks only to time the device (so a tier judged slow once is used again
  // when it is fast). Returns the reads submitted.
  uint32_t CalibrateNvme(uint64_t now_ns) { return migrator_.CalibrateFirstTier(now_ns); }
  // Thread-safe. Makes a namespace's id known for NVMe block headers.
  void RegisterNamespace(const NamespaceInfo& info) { books_.RegisterNamespace(info); }
  // Thread-safe. When no block record of the namespace is left (indexed, or
  // unindexed but still referenced by I/O), forgets it and returns true:
  // its handle may then be given to another namespace. The caller ensures
  // no session of it runs (none can create records meanwhile).
  bool ForgetNamespace(uint32_t handle) { return books_.ForgetNamespace(handle); }
  // Thread-safe. Block records of a namespace (for tests and status).
  uint64_t RecordsOf(uint32_t handle) const { return books_.RecordsOf(handle); }

  HostTier* host_tier(uint16_t tenant) const { return books_.tenants[tenant]->host.get(); }
  // The tenant's GPU tier (nullptr without one). Thread-safe.
  GpuCache* gpu_cache(uint16_t tenant) const { return books_.tenants[tenant]->gpu.get(); }
  // Thread-safe. Publishes the tenant's reserved GPU copy of a block only
  // while the block is in the index, under its shard lock: a block leaving
  // the index meanwhile either drops the published copy or leaves it
  // unpublished (false; GpuCache::Release then frees it). So a load under a
  // lease whose blocks were invalidated meanwhile cannot leave a copy behind.
  bool PublishGpuCopy(uint16_t tenant, uint32_t ns, const BlockKey& key);
  // The first lower tier (nullptr without one), and the chain.
  BlockTier* lower_tier() const { return books_.lanes.empty() ? nullptr : books_.lanes[0]->tier.get(); }
  size_t lower_tier_count() const { return books_.lanes.size(); }
  BlockTier* lower_tier(size_t i) const { return books_.lanes[i]->tier.get(); }
  // Whether the cascade has nothing left to do: no tier between its marks
  // (for tests and drains that want a settled chain).
  bool cascade_settled() const { return migrator_.cascade_settled(); }
  // Blocks with a ready copy in lower tier i.
  uint64_t lower_blocks(size_t i) const { return books_.lanes[i]->blocks.load(std::memory_order_relaxed); }
  // Blocks of leased lookups' hit prefixes whose copy was in lower tier i.
  uint64_t lower_hits(size_t i) const { return books_.lanes[i]->hits.load(std::memory_order_relaxed); }
  // Thread-safe. Lower tier i's capacity and what this node's copies there
  // hold (LowerLane::Usage: for a tier addressed by key, the lane's books,
  // not the tier's).
  TierUsage lower_usage(size_t i) const { return books_.lanes[i]->Usage(); }
  // Lane i's tier changed its capacity (a reload): each tenant's fair share
  // of it follows.
  void LowerCapacityChanged(size_t i) { books_.lanes[i]->RefreshFairShare(); }
  const std::string& tenant_name(uint16_t tenant) const { return books_.tenants[tenant]->name; }
  size_t tenant_count() const { return books_.tenants.size(); }

  // All below: thread-safe across sessions; one thread per SessionHoldings.

  // Longest present prefix of keys (in any tier) worth loading. With
  // `lease`, pins that prefix and returns a lease id in *lease_id (0 when
  // nothing hit). out gets one entry per key; entries past the prefix are
  // TierKind::kNone, except the present blocks right after it that the cost
  // model says to recompute (an NVMe read slower than their prefill): their
  // tier, `recompute` set, and their number in *recompute (when given).
  //
  // Where the local tiers end the prefix, the shared tiers may hold the
  // next blocks. Without `shared`, Lookup asks them and waits up to the
  // probe budget (tests, tools). A session asks first (StartSharedProbe),
  // keeps serving its other requests, and looks up with the answer.
  static constexpr uint8_t kNoLane = SharedTiers::kNoLane;
  struct SharedAnswer {
    size_t from = 0;  // the key the probe asked from
    // Of keys[from..]: the shared lane that holds each (the first in the
    // chain that said so), kNoLane where none did. Empty: no answer (late,
    // or not asked).
    std::vector<uint8_t> holder;
  };
  //
  // `ask`: whether this lookup is its request's ask (ipc::kFlagAsk), the
  // one the policies and the hit counters learn from.
  // kIfLeased: a leased lookup is, an unleased one is a probe. kYes: also
  // unleased (an engine that probes the whole chain once, then leases only
  // what it loads, maybe from another session). kNo: a lease whose request
  // asked before. Uses (admission_min_uses) are counted by leases, asks or
  // not, and by stores, never by an unleased ask: what a request loads
  // and stores is what it used.
  enum class Ask : uint8_t { kIfLeased, kYes, kNo };
  absl::StatusOr<uint32_t> Lookup(SessionHoldings& s, std::span<const BlockKey> keys, bool lease,
                                  uint64_t* lease_id, std::span<BlockLocation> out, uint32_t* recompute = nullptr,
                                  const SharedAnswer* shared = nullptr, Ask ask = Ask::kIfLeased);
  // Whether a lookup of keys would ask the shared tiers (its local prefix
  // ends before the keys do, nothing cut it for cost, the tenant is within
  // its probe rate and busy bound); if so, asks it now and returns true, and
  // `answered` runs exactly once, on a tier thread or inline, with the
  // answer (holder empty when no tier gave one). The session then calls
  // Lookup with it. False: Lookup answers from the local tiers alone.
  // `so_far`, when given, is set to what the tiers that answered so far
  // say (thread-safe; for a lookup whose budget passed while one tier has
  // not answered: the others' blocks still count).
  bool StartSharedProbe(SessionHoldings& s, std::span<const BlockKey> keys,
                        absl::AnyInvocable<void(SharedAnswer) &&> answered,
                        std::function<SharedAnswer()>* so_far = nullptr);
  // The probe budget now (tiers.remote.probe_budget_us), in microseconds.
  uint32_t shared_probe_budget_us() const { return shared_.budget_us(); }
  // Host locations of keys the lease pins (every key must be in it),
  // promoting NVMe-only blocks first. Returns the outcome at once when every
  // block is already in host memory; otherwise nullopt, and `done` runs later
  // on another thread. Errors in arguments come back as an outcome status.
  std::optional<LoadOutcome> Load(SessionHoldings& s, uint64_t lease_id, std::span<const BlockKey> keys,
                                  LoadCallback done);
  // Promotes the present prefix of keys from NVMe into host memory, ahead of
  // need; `done` gets how many blocks were promoted.
  void Prefetch(SessionHoldings& s, std::span<const BlockKey> keys, CountCallback done);
  // Reserves slots for keys not already cached (all or nothing: when the tier
  // cannot hold them all, even after evicting, nothing is reserved). Returns
  // how many the engine must fill; *ticket is 0 when none.
  absl::StatusOr<uint32_t> StoreBegin(SessionHoldings& s, std::span<const BlockKey> keys, uint64_t* ticket,
                                      std::span<BlockLocation> out);
  // Makes the ticket's blocks visible. With `durable`, `done` runs once they
  // are also on the first lower tier (NVMe) with their journal records
  // synced; refused when that tier is not durable. As a cache, the store
  // may later let such a block go (NVMe evicts it, or the cascade moves it
  // to a tier below that is not durable): durable means it survives a
  // restart while it is on the durable tier.
  void StoreCommit(SessionHoldings& s, uint64_t ticket, bool durable, StatusCallback done);
  // Gives the ticket's slots back.
  absl::Status StoreAbort(SessionHoldings& s, uint64_t ticket);
  absl::Status Release(SessionHoldings& s, uint64_t lease_id);
  // Removes committed blocks of the session's namespace from every tier;
  // pinned ones go when their leases do. Returns how many were removed.
  absl::StatusOr<uint32_t> Invalidate(SessionHoldings& s, std::span<const BlockKey> keys);
  absl::StatusOr<uint32_t> InvalidateNamespace(SessionHoldings& s);
  // What a request leaves for after its reply: shows the adaptive policy
  // the chain of the session's last leased lookup, and starts the writes to
  // the shared tier its write policy asks for. The session calls it after
  // posting each completion: the shadows' bookkeeping (~0.3-0.7 us per
  // block) and the copies into write commands stay off the engine's wait.
  void AfterReply(SessionHoldings& s);
  // Aborts every ticket and releases every lease (a session ended).
  void CloseSession(SessionHoldings& s);

  // Thread-safe (block_reports.cc): each tenant's use of every tier.
  std::vector<TenantUsage> Usage() const;
  uint64_t indexed_blocks() const { return books_.index.size(); }
  CostTracker& cost() { return books_.cost; }
  const CostTracker& cost() const { return books_.cost; }
  // Blocks with a ready copy in the first lower tier (NVMe in the daemon).
  uint64_t nvme_blocks() const { return books_.lanes.empty() ? 0 : lower_blocks(0); }

 private:
  using PendingDemotion = Migrator::PendingDemotion;
  using EvictResult = Migrator::EvictResult;

  BlockStore(const Options& opts, DaemonStats* stats);

  // --- host tier (block_host.cc); its slots and victims are each tenant's HostResidency's (host_room.cc)
  // One pass of the reclaimer: every tenant above the high mark, down to the low.
  void ReclaimPass();

  // --- lookups, loads, invalidation (block_store.cc); stores (block_writes.cc)
  void Unpin(SessionHoldings& s, const std::vector<BlockRecord*>& blocks);
  // Keeps a leased lookup's chain (last_chain), its blocks queued as uses
  // for the admission gates, and an ask's (ask_chain) for the policies
  // (AfterReply), with how many of its first blocks the tiers held.
  void NoteChain(SessionHoldings& s, std::span<const BlockKey> keys, bool lease, bool ask, size_t held);
  // Counts a store's blocks as used for the admission gates, except those
  // the session's last lease counted (last_chain).
  void CountStoreUses(const SessionHoldings& s, std::span<const BlockKey> keys);
  // Lookup's parts. The session's lease limits (KVTIER_EBUSY past them).
  absl::Status LeaseRoomFor(const SessionHoldings& s, size_t blocks);
  // The hit prefix of `keys`, each block's location in `out`; with `lease`,
  // each hit is pinned and listed for TouchHits.
  struct ChainHits {
    uint32_t hit = 0;
    std::array<uint32_t, kMaxLowerTiers> by_lane{};  // hits below host memory, by the lane the copy is in
    bool cut_for_cost = false;  // the prefix ends at a block cheaper to recompute than to load
    uint64_t lower_pinned_bytes = 0;  // slot bytes pinned on the first lower tier (NVMe), for its fair share
    std::vector<BlockRecord*> pinned;
    std::vector<SlotHandle> host_touch;
    struct LowerTouch {
      uint8_t lane;
      SlotHandle slot;
      BlockRecord* r;  // pinned by the lookup: stays alive
    };
    std::vector<LowerTouch> lower_touch;
    void Append(ChainHits&& more);  // `more` probed on from this one's end
  };
  // From key `from` on (the keys before it hit already).
  ChainHits ProbeChain(SessionHoldings& s, std::span<const BlockKey> keys, bool lease, std::span<BlockLocation> out,
                       size_t from = 0);
  // Marks the present blocks after a prefix cut for cost (out[from..]) as to
  // recompute; returns how many.
  uint32_t MarkRecompute(const SessionHoldings& s, std::span<const BlockKey> keys, size_t from,
                         std::span<BlockLocation> out);
  // A leased hit's blocks are touched in their policies, leaves first.
  void TouchHits(HostResidency& t, const ChainHits& h);
  // A leased lookup's hits: touched, and pinned under a new lease
  // (*lease_id; none when nothing hit). Returns the hit count.
  uint32_t LeaseHits(SessionHoldings& s, ChainHits& h, uint64_t* lease_id);
  // Load's parts. The records `keys` name among those lease `lease_id`
  // pinned (ENOENT: no such lease; EINVAL: a key it does not pin).
  absl::StatusOr<std::vector<BlockRecord*>> LeasedRecords(const SessionHoldings& s, uint64_t lease_id,
                                                          std::span<const BlockKey> keys);
  // The outcome of a load whose blocks came back where ok[i]: the loaded
  // prefix, an error naming the first block that did not, and the counters.
  void FinishLoad(LoadOutcome& o, const std::vector<uint8_t>& ok, uint64_t block_bytes);
  // StoreBegin's parts. Where `keys` start in the chain the session looked
  // up last (engines store the part of a prompt that missed), if there.
  static std::optional<size_t> ChainDepthOf(const SessionHoldings& s, std::span<const BlockKey> keys);
  // A record in kWriting for each key not indexed yet, and where it is in keys.
  struct NewBlocks {
    std::vector<BlockRecord*> records;
    std::vector<size_t> at;
  };
  NewBlocks IndexNewBlocks(const SessionHoldings& s, std::span<const BlockKey> keys, std::optional<size_t> depth);
  // Why `blocks` new blocks could never fit the tenant's host tier, or "".
  static std::string StoreNeverFits(const HostResidency& t, const NamespaceInfo& ns, size_t blocks);
  // Each new block's parent identity: the key before it, or for the first
  // key the block before it in the chain the session looked up (0: unknown).
  static std::vector<uint64_t> ParentsOf(const SessionHoldings& s, std::span<const BlockKey> keys,
                                         const std::vector<size_t>& at, std::optional<size_t> depth);
  uint32_t RemoveFromIndex(HostResidency& t, BlockRecord* r, BlockIndex::Shard& sh)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu, sh.mu);
  std::vector<BlockRecord*> FindAll(uint32_t ns, std::span<const BlockKey> keys);

  const Options opts_;
  std::atomic<bool> draining_{false};  // read by stores
  // opts_.policy learns from lookups (IsHostOnlyPolicy): requests' asks feed
  // the adaptive policy's shadows, or the holds policy's plan.
  const bool adaptive_;
  const bool observes_;
  StoreBooks books_;
  // The destructor stops both before anything their passes touch goes.
  Migrator migrator_;
  // The probe past the local prefix and the write policy (shared_tiers.h);
  // its lanes are set by AttachLowerTier.
  SharedTiers shared_;
  Reclaimer reclaimer_;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_BLOCK_STORE_H_
