// SPDX-License-Identifier: Apache-2.0
// One tenant's host residency: its host tier (the arena the engine maps), an
// eviction policy per block size behind a ChainGuard (leaves before
// parents), each slot's owner, tokens and age (HostSlotTable), its quotas,
// and what waits on its slots (deferred demotions, promotions in flight).
// The residency keeps the books and makes room: it hands out host slots
// (AllocateSlotLocked), choosing victims while the arena or a quota is full
// (host_room.cc); moving a victim's copy (keep below, demote, drop) is its
// evictor's, the migrator's.
//
// Everything marked Locked needs `mu`, the tenant's tier lock
// (docs/architecture.md, "Lock order").
#ifndef KVTIER_STORE_HOST_RESIDENCY_H_
#define KVTIER_STORE_HOST_RESIDENCY_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/units.h"
#include "store/gpu_cache.h"
#include "store/host_slots.h"
#include "policies/chain_guard.h"
#include "tiers/host_tier.h"

namespace kvtier {

class KvEvents;
class Reclaimer;
class HostResidency;

struct BlockRecord;
struct DaemonStats;
struct PendingDemotion;
class BlockIndex;
class HostEvictor;

// A tenant's quotas; 0 = none beyond the tier's size. Counted in resident
// blocks (admission in tokens, not requests): a store's blocks from
// StoreBegin, a promoted block from its read, a demoted one from its write.
struct TenantQuota {
  uint64_t host_tokens = 0;  // in the tenant's host arena
  uint64_t nvme_bytes = 0;   // on the shared NVMe tier
  uint64_t nvme_tokens = 0;
};

class HostResidency {
 public:
  // What making room uses: `evictor` moves victims out; `stats` counts
  // evictions and refusals; `reclaimer` (may be null) is woken when an
  // allocation leaves the tenant past its high mark. Each must outlive every
  // call into the residency's room (the store stops its threads before it
  // destroys the migrator and the reclaimer, and the residency's own
  // destruction touches none of them).
  struct Room {
    HostEvictor* evictor = nullptr;
    DaemonStats* stats = nullptr;
    Reclaimer* reclaimer = nullptr;
  };
  // `policy`: the eviction policy's name (checked by the caller), one
  // instance per block size, made on first use. `index`: the store's, whose
  // records own the slots; it outlives the residency.
  HostResidency(std::string name, uint64_t hash, std::unique_ptr<HostTier> host, std::unique_ptr<GpuCache> gpu,
                TenantQuota quota, std::string policy, BlockIndex* index, Room room);

  // --- room (host_room.cc)
  // A host slot for a block of `bytes` holding `tokens` tokens, owned by
  // `owner`, evicting while the arena is full or the token quota would be
  // exceeded. With `busy_wait_ms` (a store's, on its session thread): when
  // every block that could go is only busy with I/O for a moment (a
  // write-through, a move of its lower copy down the chain), not pinned,
  // wait for it in 1 ms steps (mu let go) while *busy_wait_ms lasts,
  // spending it; one budget for all of a store's slots. Without it
  // (promotions, which may run on a tier's completion thread): refused at
  // once. Wakes the reclaimer past its high mark.
  absl::StatusOr<SlotHandle> AllocateSlotLocked(uint64_t bytes, uint32_t tokens, BlockRecord* owner,
                                                uint32_t* busy_wait_ms = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What a store may wait in all for blocks busy a moment (AllocateSlotLocked).
  static constexpr uint32_t kStoreBusyWaitMs = 50;
  // Evicts one block, from the block size that holds the most bytes; false
  // when nothing can go. With `give_segments` (the background reclaimer),
  // once per segment's worth of evictions of a size, a whole segment of
  // another size whose blocks are all colder than that size's coldest goes
  // instead (ReclaimSegmentLocked), as stores that need room do: else the
  // reclaimer keeps a new size's own slots free, its stores never need
  // room, and a cold size's segments are never given back.
  bool EvictColdestLocked(std::vector<PendingDemotion>* deferred = nullptr, bool give_segments = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  HostResidency(const HostResidency&) = delete;
  HostResidency& operator=(const HostResidency&) = delete;

  // The policy of blocks of `slot_bytes` (made on first use).
  ChainGuard* PolicyForLocked(uint64_t slot_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A slot's block leaves its policy (and, with KV events, is announced as
  // gone from host memory); nothing more when it has left already. Reads
  // the slot's owner record (its key): call it while that record surely
  // lives, before the record's host_slot is cleared under its shard lock,
  // since a record without a host slot may be freed without this lock.
  void LeavePolicyLocked(SlotHandle slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Frees a slot: out of its policy (LeavePolicyLocked, unless done
  // already), back to the tier, out of the slot table.
  void FreeSlotLocked(SlotHandle slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Fuller than `share` of the arena, or of the token quota, not counting
  // the bytes and tokens of slots about to be freed.
  bool FullerThanLocked(double share, uint64_t freeing_bytes = 0, uint64_t freeing_tokens = 0) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The policies that hold blocks, the one holding the most bytes first.
  std::vector<ChainGuard*> PoliciesByBytesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Segments carved for other block sizes than `slot_bytes`, coldest first
  // (by the age of their most recently used block), at most `max`, and only
  // those whose blocks are all older than `min_age` ticks (any age without
  // one). Each lists its live slots.
  struct Segment {
    uint32_t youngest = 0;
    std::vector<SlotHandle> slots;
  };
  std::vector<Segment> ColdSegmentsLocked(uint64_t slot_bytes, std::optional<uint32_t> min_age, size_t max) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  uint64_t QuotaHostTokens() const { return quota_host_tokens.load(std::memory_order_relaxed); }
  TenantQuota Quota() const {
    return {quota_host_tokens.load(std::memory_order_relaxed), quota_nvme_bytes.load(std::memory_order_relaxed),
            quota_nvme_tokens.load(std::memory_order_relaxed)};
  }
  // A config reload; thread-safe. Blocks already over a lowered quota are
  // evicted as stores need room.
  void SetQuota(const TenantQuota& q) {
    quota_host_tokens.store(q.host_tokens, std::memory_order_relaxed);
    quota_nvme_bytes.store(q.nvme_bytes, std::memory_order_relaxed);
    quota_nvme_tokens.store(q.nvme_tokens, std::memory_order_relaxed);
  }

  // KV events (events/kv_events.h), set before sessions start; the tenant's
  // index in the store. Announces a host copy that became visible (a commit,
  // a promotion); FreeSlotLocked announces its removal.
  KvEvents* events = nullptr;
  uint16_t index = 0;
  void AnnounceLocked(SlotHandle slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  const std::string name;
  const uint64_t hash;
  const std::unique_ptr<HostTier> host;
  const std::unique_ptr<GpuCache> gpu;  // or nullptr; see BlockStore::AddTenant
  // The tenant's tier lock: allocation, eviction and policy updates.
  Mutex mu;
  HostSlotTable slots ABSL_GUARDED_BY(mu);  // each host slot's owner, tokens and age
  // The configured policy per slot size, behind a ChainGuard that reads each
  // slot's key from its owner (8 bytes a block less than keeping it).
  absl::flat_hash_map<uint64_t, std::unique_ptr<ChainGuard>> policy_by_size ABSL_GUARDED_BY(mu);
  // Evictions for room since the last look at other sizes' segments.
  uint64_t room_evictions ABSL_GUARDED_BY(mu) = 0;
  // The same, for the background reclaimer's evictions.
  uint64_t background_room_evictions ABSL_GUARDED_BY(mu) = 0;
  // Background demotions chosen but not yet copied out (their slots are
  // still allocated); a store that finds the tier full waits for them
  // rather than evicting a hotter block.
  uint32_t deferred_in_flight ABSL_GUARDED_BY(mu) = 0;
  // How many of them have freed their slots so far: a store waits for the
  // next one (a slot), not for all (the reclaimer may wait for the device,
  // up to 250 ms a block).
  uint64_t deferred_finished ABSL_GUARDED_BY(mu) = 0;
  // How many of them wait for the device to take their write (a burst past
  // its staging memory): a store does not wait for those, it evicts on its
  // own path (written under mu, read with or without it).
  std::atomic<uint32_t> deferred_waiting_for_device{0};
  // An engine's store is evicting one victim for its slot (not a segment
  // reclaim, a promotion or an operator's evict): while the reclaim waits
  // on the device, that victim is dropped rather than copied.
  bool evicting_for_store ABSL_GUARDED_BY(mu) = false;
  std::condition_variable_any deferred_done;
  // Promotions in flight and who else waits for them.
  absl::flat_hash_map<BlockRecord*, std::vector<absl::AnyInvocable<void(bool) &&>>> loading ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> pinned{0};
  // Slot bytes of this tenant's blocks pinned by leases while their only
  // copy is on the first lower tier (NVMe). At most the tenant's fair share
  // there: a pinned block cannot be evicted, so a tenant that could pin
  // more would make another tenant within its share drop new blocks.
  std::atomic<uint64_t> lower_pinned_bytes{0};
  std::atomic<uint64_t> evictions{0};
  // This tenant's leased lookups and what they found ([metrics] per_tenant).
  struct Hits {
    std::atomic<uint64_t> lookups{0}, lookup_hits{0}, blocks_queried{0}, blocks_hit{0}, tokens_queried{0},
        tokens_hit{0};
    // Of blocks_hit, those found in each lower tier (by chain position).
    std::array<std::atomic<uint64_t>, kMaxLowerTiers> blocks_hit_lane{};
  } hits;
  // Lookups of this tenant waiting on the shared tier now
  // (SharedTiers::ProbeBlocks): at most kMaxSharedProbesPerTenant, so one
  // tenant's sessions cannot flood the cluster every node shares.
  std::atomic<uint32_t> shared_probes{0};
  static constexpr uint32_t kMaxSharedProbesPerTenant = 8;
  // And the blocks they may ask about: a token bucket of `per_s` blocks a
  // second, one second deep. True (and taken) when `n` fit now.
  bool TakeProbeBlocks(uint32_t n, uint32_t per_s) {
    MutexLock l(&probe_mu_);
    const uint64_t now = MonotonicNanos();
    if (probe_refill_ns_ == 0) probe_tokens_ = per_s;
    probe_tokens_ = std::min<double>(per_s, probe_tokens_ + double(now - std::min(now, probe_refill_ns_)) * 1e-9 * per_s);
    probe_refill_ns_ = now;
    if (probe_tokens_ < n) return false;
    probe_tokens_ -= n;
    return true;
  }
  // This tenant's writes to the shared tier failed (a wrong password, a
  // revoked user, its keys refused): its publishes pause, nobody else's.
  std::atomic<uint64_t> publish_paused_until_ns{0};

 private:
  // Each slot's identity for its policy: its owner's PolicyKeyOf. Read by
  // the policies under `mu`; a slot's owner is set before its block enters
  // a policy and cleared after it leaves (FreeSlotLocked).
  class OwnerKeys final : public HandleKeys {
   public:
    explicit OwnerKeys(const HostSlotTable* slots) : slots_(slots) {}
    uint64_t KeyOf(uint32_t slot) const override;

   private:
    const HostSlotTable* const slots_;
  };
  OwnerKeys owner_keys_{&slots};
  const std::string policy_;
  BlockIndex* const index_;
  const Room room_;

  // The policy's coldest block that may go now (not pinned, not moving);
  // *saw_busy (if given) is set when the policy offered one that is not
  // pinned but busy (moving, or held by I/O): room that comes back soon.
  std::optional<SlotHandle> PickVictimLocked(ChainGuard* policy, bool* saw_busy = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Empties the coldest segment of another block size than `slot_bytes`
  // whose blocks are all older than `min_age` ticks (any age without one)
  // and may all go now; false when there is none.
  bool ReclaimSegmentLocked(uint64_t slot_bytes, std::optional<uint32_t> min_age) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // One victim out through the evictor; counts it when it went (true).
  bool EvictOneLocked(BlockRecord* r, std::vector<PendingDemotion>* deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  Mutex probe_mu_;
  double probe_tokens_ ABSL_GUARDED_BY(probe_mu_) = 0;
  uint64_t probe_refill_ns_ ABSL_GUARDED_BY(probe_mu_) = 0;
  // Quotas: SetQuota (a config reload) may change them while sessions run.
  std::atomic<uint64_t> quota_host_tokens{0}, quota_nvme_bytes{0}, quota_nvme_tokens{0};
};

// What moves a host victim's copy out (the migrator: kept below, demoted,
// or dropped). HostResidency chooses the victims; this only moves them.
class HostEvictor {
 public:
  enum class Result { kSkipped, kEvicted };
  // Takes r's host copy away; kSkipped when it may not go now (pinned,
  // busy, not ready). With `deferred`, a demotion's write is left to the
  // caller (appended there) instead of copying under t.mu.
  virtual Result EvictHostCopyLocked(HostResidency& t, BlockRecord* r, std::vector<PendingDemotion>* deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) = 0;

 protected:
  ~HostEvictor() = default;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_HOST_RESIDENCY_H_
