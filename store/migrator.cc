// SPDX-License-Identifier: Apache-2.0
// The migrator's moves between host memory and the first lower tier (host
// eviction: keep, demote or drop; write-through; the landing of those
// writes), lower-tier room and eviction, and dropping a damaged copy.
// Promotion is in migrator_promotion.cc, the drain in migrator_flush.cc,
// the cascade in migrator_cascade.cc.
#include "store/migrator.h"

#include "core/status.h"
#include "spdlog/spdlog.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"

namespace kvtier {

Migrator::Migrator(StoreBooks& books, const Options& opts)
    : books_(books),
      shared_min_block_bytes_(opts.shared_min_block_bytes),
      cascade_(opts.cascade_high, opts.cascade_low, CascadeHooks()) {}

Migrator::~Migrator() { cascade_.Stop(); }

Migrator::EvictResult Migrator::EvictHostCopyLocked(HostResidency& t, BlockRecord* r,
                                                        std::vector<PendingDemotion>* deferred) {
  SlotHandle host_slot;
  uint64_t offset;
  bool keep_on_nvme;
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    if (r->removed || r->pins != 0 || r->io_refs != 0 || r->state != BlockState::kReady) {
      return EvictResult::kSkipped;
    }
    host_slot = r->host_slot;
    offset = r->arena_offset();
    keep_on_nvme = r->lower_state == LowerState::kReady;
    if (keep_on_nvme) {
      // While r surely lives: without a host slot it may be freed (another
      // tenant's eviction on NVMe, the cascade) once the shard lock goes.
      t.LeavePolicyLocked(host_slot);
      r->state = BlockState::kNone;
      r->host_slot = kNoSlot;
    } else {
      r->state = BlockState::kEvicting;  // invisible; nobody pins it now
      ++r->io_refs;
    }
  }
  if (keep_on_nvme) {
    t.FreeSlotLocked(host_slot);
    books_.stats->evictions_kept_on_nvme.Add();
    return EvictResult::kEvicted;
  }
  const BlockMeta meta = books_.MetaOf(r);
  const bool by_cost = DropForCost(r, meta);
  Counter* why_not = nullptr;
  // The first lower tier's admission gate: no evidence of reuse, no write.
  const bool refused = !by_cost && !books_.lanes.empty() && !books_.Admits(*books_.lanes[0], r);
  if (refused) why_not = &books_.stats->dropped_not_admitted;
  if (!by_cost && !refused && DemoteLocked(t, r, host_slot, offset, meta, deferred, &why_not)) {
    return EvictResult::kEvicted;
  }
  // No NVMe tier, no room there, or too large: the block is dropped. It was
  // invisible since the first check, so nobody took a pin or an io_ref.
  bool destroy;
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->state = BlockState::kNone;
    r->host_slot = kNoSlot;
    --r->io_refs;
    books_.UnindexLocked(sh, r);
    destroy = r->pins == 0 && r->io_refs == 0;
  }
  books_.stats->evictions_dropped.Add();
  if (by_cost) {
    books_.stats->evictions_dropped_by_cost.Add();
  } else if (why_not != nullptr) {
    why_not->Add();
    if (why_not != &books_.stats->dropped_no_lower_tier && why_not != &books_.stats->dropped_not_admitted) SayDropped();
  }
  t.FreeSlotLocked(host_slot);
  if (destroy) books_.DestroyDetached(r);
  return EvictResult::kEvicted;
}

void Migrator::SayDropped() {
  const uint64_t now = MonotonicNanos();
  uint64_t last = drops_said_ns_.load(std::memory_order_relaxed);
  if (last != 0 && now - last < 10'000'000'000ull) return;
  if (!drops_said_ns_.compare_exchange_strong(last, now)) return;
  const DaemonStats& st = *books_.stats;
  spdlog::warn("event=evictions_dropped dropped={} too_large={} no_room={} tier_unwritable={} detail=\"host "
               "evictions found no place below host memory: those blocks are gone and will be recomputed\" "
               "hint=\"kvtierctl status shows the NVMe tier's use, quotas and pins; a larger tiers.nvme.capacity, "
               "a larger tiers.nvme.segment_bytes (for large blocks) or fewer pins keeps them; with demotions_waited "
               "rising, the device writes slower than engines store\"",
               st.evictions_dropped.Get(), st.dropped_too_large.Get(), st.dropped_no_room.Get(),
               st.dropped_tier_unwritable.Get());
}

bool Migrator::DropForCost(const BlockRecord* r, const BlockMeta& meta) {
  if (books_.lanes.empty() || r->depth == kUnknownDepth) return false;  // unknown depth: demote
  const uint32_t tp_size = books_.TpSizeOf(r->ns);
  if (!books_.cost.RecomputeBeatsNvme(uint64_t{r->depth} * meta.block_tokens, meta.block_tokens, meta.payload_bytes,
                                tp_size)) {
    return false;
  }
  // One in kCalibrationDemotionEvery of those is demoted anyway, so the tier
  // keeps blocks the cost model can measure it on (CalibrateFirstTier): a tier
  // judged slow once must be able to prove it is fast again.
  if (cost_demotions_.fetch_add(1, std::memory_order_relaxed) % kCalibrationDemotionEvery == 0) {
    books_.stats->demotions_for_calibration.Add();
    return false;
  }
  return true;
}

bool Migrator::DemoteLocked(HostResidency& t, BlockRecord* r, SlotHandle host_slot, uint64_t offset,
                              const BlockMeta& meta, std::vector<PendingDemotion>* deferred, Counter** why_not) {
  LowerLane* const first = books_.lanes.empty() ? nullptr : books_.lanes[0].get();
  if (first == nullptr) {
    *why_not = &books_.stats->dropped_no_lower_tier;
    return false;
  }
  if (meta.payload_bytes > first->tier->max_block_bytes()) {
    *why_not = &books_.stats->dropped_too_large;
    return false;
  }
  if (t.evicting_for_store && books_.lanes.size() == 1 &&
      t.deferred_waiting_for_device.load(std::memory_order_relaxed) > 0) {
    // A store's own eviction while the reclaim's writes wait for the
    // device: the device is busy with colder blocks already, and copying
    // this one into what staging is left would only slow the engine's
    // store. Dropped, as a refused write would be. (Only a store's single
    // victim, and only with no tier below NVMe to take it.)
    *why_not = &books_.stats->dropped_no_room;
    return false;
  }
  uint8_t lane = 0;
  const absl::StatusOr<SlotHandle> nslot = DemotionSlot(r, meta, &lane);
  if (!nslot.ok()) {
    books_.stats->demotions_failed.Add();
    // The tier's own ENOSPC (its disk full, or read-only), or no room the
    // books allow (quota, fair share, every block busy).
    *why_not = CarriesCode(nslot.status(), KVTIER_ENOSPC) ? &books_.stats->dropped_tier_unwritable
                                                            : &books_.stats->dropped_no_room;
    return false;
  }
  // Out of its policy while r surely lives (the write may free it, inline
  // when its tier refuses it), and never a victim twice.
  t.LeavePolicyLocked(host_slot);
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->state = BlockState::kNone;
    r->host_slot = kNoSlot;
    r->lower_slot = *nslot;
    r->lower = lane;
    r->lower_state = LowerState::kWriting;  // the io_ref now belongs to the write
  }
  books_.stats->demotions.Add();
  if (lane != 0) books_.stats->demotions_past_full_tier.Add();
  if (deferred != nullptr) {
    deferred->push_back(PendingDemotion{r, lane, host_slot, *nslot, offset, meta});
    return true;
  }
  // Put copies the bytes before it returns: the host slot is freed right
  // after. Its callback takes no tenant lock (r has no host slot), so it may
  // run inline here.
  WriteDemotion(t, r, lane, *nslot, offset, meta);
  t.FreeSlotLocked(host_slot);
  return true;
}

absl::StatusOr<SlotHandle> Migrator::DemotionSlot(BlockRecord* r, const BlockMeta& meta, uint8_t* lane) {
  LowerLane& first = *books_.lanes[0];
  LowerLane* const next = books_.lanes.size() > 1 ? books_.lanes[1].get() : nullptr;
  *lane = 0;
  // With a tier below, the first tier's room comes first; when the tier
  // itself is full (not the tenant's quota there: that evicts the tenant's
  // own blocks, as always), the next tier's room now, and only then an
  // eviction in the first.
  bool first_full = false;
  {
    MutexLock nl(&first.mu);
    absl::StatusOr<SlotHandle> slot =
        AllocateLowerSlotLocked(first, r, meta.payload_bytes, next != nullptr ? &first_full : nullptr);
    if (!first_full) return slot;
  }
  // The block goes one tier down if that tier is healthy, would take it
  // from the cascade (admission gate, size bounds), has room now, and not
  // too many such writes are in flight (each holds the block's bytes; a
  // tier that stops answering must not take a burst of blocks with it).
  // The first tier's coldest blocks stay; the cascade moves them down in
  // its own time, and promotions bring back what is used.
  if (meta.payload_bytes <= next->tier->max_block_bytes() &&
      (!next->tier->shared() || meta.payload_bytes >= shared_min_block_bytes_) &&
      NextTierHealthy(*next) && books_.Admits(*next, r)) {
    if (past_full_in_flight_.fetch_add(1, std::memory_order_relaxed) < kMaxPastFullInFlight) {
      MutexLock bl(&next->mu);
      bool next_full = false;
      absl::StatusOr<SlotHandle> below = AllocateLowerSlotLocked(*next, r, meta.payload_bytes, &next_full);
      if (below.ok()) {
        *lane = next->index;
        return below;  // the write's completion gives the in-flight count back
      }
    }
    past_full_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  }
  MutexLock nl(&first.mu);
  absl::StatusOr<SlotHandle> slot = AllocateLowerSlotLocked(first, r, meta.payload_bytes);
  return slot;
}

bool Migrator::NextTierHealthy(const LowerLane& next) {
  // A tier's health can cost a walk of its cluster's slot map: asked at
  // most every 100 ms (a race between two askers only asks twice).
  const uint64_t now = MonotonicNanos();
  // The answer is stored before its time (release), and read after it
  // (acquire): whoever sees the new time sees the new answer.
  if (now - next_health_at_ns_.load(std::memory_order_acquire) > 100'000'000) {
    next_healthy_.store(next.tier->Health() == TierHealth::kHealthy, std::memory_order_release);
    next_health_at_ns_.store(now, std::memory_order_release);
  }
  return next_healthy_.load(std::memory_order_acquire);
}

bool Migrator::WriteDemotion(HostResidency& t, BlockRecord* r, uint8_t lane, SlotHandle lower_slot, uint64_t offset,
                             const BlockMeta& meta, std::chrono::nanoseconds wait) {
  // The first tier refuses a demotion it has no staging memory for (a
  // burst faster than the device) inside Put, while the host copy is
  // still there. With a `wait` (only the background reclaim's demotions
  // have one) the write takes the tier's smaller share (IoOptions::
  // may_wait), waits up to `wait` for room and goes again: the reclaim then
  // evicts no faster than the device writes. Otherwise, or when the wait
  // runs out, the block goes one tier down instead of being lost, if there
  // is one.
  // `refusal` tells a refusal inside Put (handled below) from a completion
  // after it (finished as any other).
  struct Refusal {
    std::atomic<int> state{0};  // 0: in Put; 1: Put returned; 2: refused inside Put
    absl::Status status;
  };
  BlockTier& tier = *books_.lanes[lane]->tier;
  const bool may_redirect = lane == 0 && books_.lanes.size() > 1;
  const bool may_wait = wait.count() > 0;
  const uint64_t wait_until = MonotonicNanos() + static_cast<uint64_t>(std::max<int64_t>(0, wait.count()));
  bool waited = false;
  absl::Status refused;
  for (;;) {
    auto refusal = std::make_shared<Refusal>();
    const uint64_t epoch = tier.WriteRoomEpoch();
    tier.Put(books_.lanes[lane]->LocatorOf(lower_slot), meta, {t.host->arena_base() + offset, meta.payload_bytes},
             IoOptions{.prio = IoPriority::kDemote, .may_wait = may_wait},
             [this, &t, r, lane, intercept = may_redirect || may_wait, refusal, start = MonotonicNanos()](absl::Status s) {
               if (intercept && ToErrorCode(s) == KVTIER_EBUSY) {
                 refusal->status = s;
                 int in_write = 0;
                 if (refusal->state.compare_exchange_strong(in_write, 2)) return;  // WriteDemotion goes on
               }
               if (lane == 0) books_.stats->nvme_write_latency.Record(MonotonicNanos() - start);
               if (!s.ok()) books_.stats->demotions_failed.Add();
               if (lane != 0) past_full_in_flight_.fetch_sub(1, std::memory_order_relaxed);
               OnLowerWritten(lane, r, s);
               books_.ReleaseIoRef(t, r);
             });
    int in_write = 0;
    if (refusal->state.compare_exchange_strong(in_write, 1)) return true;
    refused = refusal->status;
    if (!may_wait) break;
    const uint64_t now = MonotonicNanos();
    if (now >= wait_until) break;
    // Stores that wait for the reclaimer's slots stop waiting: the device,
    // not a copy, holds this one (only the reclaim waits: t.mu is not held).
    {
      MutexLock l(&t.mu);
      t.deferred_waiting_for_device.fetch_add(1, std::memory_order_relaxed);
    }
    t.deferred_done.notify_all();
    const bool room = tier.AwaitWriteRoom(epoch, std::chrono::nanoseconds(wait_until - now));
    {
      MutexLock l(&t.mu);
      t.deferred_waiting_for_device.fetch_sub(1, std::memory_order_relaxed);
    }
    if (!room) break;
    if (!waited) books_.stats->demotions_waited.Add();
    waited = true;
  }
  if (may_redirect && RedirectRefusedDemotion(t, r, lower_slot, offset, meta)) return !may_wait;
  books_.stats->demotions_failed.Add();
  if (lane != 0) past_full_in_flight_.fetch_sub(1, std::memory_order_relaxed);  // as the callback does
  OnLowerWritten(lane, r, refused);
  books_.ReleaseIoRef(t, r);
  return false;
}

bool Migrator::RedirectRefusedDemotion(HostResidency& t, BlockRecord* r, SlotHandle first_slot, uint64_t offset,
                                       const BlockMeta& meta) {
  LowerLane& first = *books_.lanes[0];
  LowerLane& next = *books_.lanes[1];
  if (meta.payload_bytes > next.tier->max_block_bytes() ||
      (next.tier->shared() && meta.payload_bytes < shared_min_block_bytes_) || !NextTierHealthy(next) ||
      !books_.Admits(next, r)) {
    return false;
  }
  if (past_full_in_flight_.fetch_add(1, std::memory_order_relaxed) >= kMaxPastFullInFlight) {
    past_full_in_flight_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  absl::StatusOr<SlotHandle> below;
  {
    MutexLock bl(&next.mu);
    bool full = false;
    below = AllocateLowerSlotLocked(next, r, meta.payload_bytes, &full);
  }
  if (!below.ok()) {
    past_full_in_flight_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  // The record moves to the next lane, still kWriting; loads that began
  // waiting for the first lane's write wait for this one instead.
  std::vector<absl::AnyInvocable<void(bool) &&>> waiters;
  {
    MutexLock nl(&first.mu);
    if (auto w = first.write_waiters.find(r); w != first.write_waiters.end()) {
      waiters = std::move(w->second);
      first.write_waiters.erase(w);
    }
    {
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      r->lower = next.index;
      r->lower_slot = *below;
    }
    books_.FreeLowerSlotLocked(first, r, first_slot);
  }
  if (!waiters.empty()) {
    MutexLock bl(&next.mu);
    std::vector<absl::AnyInvocable<void(bool) &&>>& to = next.write_waiters[r];
    for (auto& w : waiters) to.push_back(std::move(w));
    next.tier->CommitSoon();  // as AwaitDemotionLocked asks of the lane it waits on
  }
  books_.stats->demotions_past_full_tier.Add();
  WriteDemotion(t, r, next.index, *below, offset, meta);
  return true;
}

bool Migrator::FinishDemotion(HostResidency& t, const PendingDemotion& d, std::chrono::nanoseconds wait) {
  // The slot is still allocated to d.r: nobody else writes these bytes.
  const bool written = WriteDemotion(t, d.r, d.lane, d.lower_slot, d.offset, d.meta, wait);
  MutexLock l(&t.mu);
  t.FreeSlotLocked(d.host_slot);
  --t.deferred_in_flight;
  ++t.deferred_finished;
  t.deferred_done.notify_all();
  return written;
}

// Room in a lower tier: the tenant's quota (lane 0), then the lane's fair-
// share rule (LowerLane::PickVictimLocked). A demotion that finds no block it
// may evict is refused (the block is dropped) and counted:
// demotions_refused_quota over the quota, demotions_refused_fair_share when
// an evictable block was passed over to keep its tenant's share. A block
// whose write (or its journal commit) is still pending is busy, not
// evictable: a burst of demotions faster than the tier's writes finds the
// tier full of busy blocks and drops what it cannot place.
absl::StatusOr<SlotHandle> Migrator::AllocateLowerSlotLocked(LowerLane& lane, BlockRecord* owner, uint64_t bytes,
                                                             bool* full) {
  const uint16_t tenant = owner->tenant;
  // The quotas ([[tenants]] nvme_bytes / nvme_tokens) are on the first tier.
  const TenantQuota q = lane.index == 0 ? books_.tenants[tenant]->Quota() : TenantQuota{};
  const BlockMeta meta = books_.MetaOf(owner);
  const uint64_t tokens = meta.block_tokens;
  if ((q.nvme_bytes != 0 && bytes > q.nvme_bytes) || (q.nvme_tokens != 0 && tokens > q.nvme_tokens)) {
    books_.stats->demotions_refused_quota.Add();
    return absl::ResourceExhaustedError(absl::StrCat("a block is larger than tenant \"", books_.tenants[tenant]->name,
                                                     "\"'s NVMe quota ([[tenants]] nvme_bytes / nvme_tokens)"));
  }
  for (;;) {
    const LowerLane::Use u = lane.use(tenant);
    const bool over_quota = (q.nvme_bytes != 0 && u.bytes + bytes > q.nvme_bytes) ||
                            (q.nvme_tokens != 0 && u.tokens + tokens > q.nvme_tokens);
    if (!over_quota) {
      absl::StatusOr<SlotHandle> slot = lane.ReserveLocked(meta);
      if (slot.ok()) {
        books_.ChargeLocked(lane, owner, *slot, +1);
        lane.owner[*slot] = owner;
      }
      // A tier that cannot write at all (its disk full, read-only) gets no
      // eviction for room: nothing would land in it.
      if (slot.ok() || !absl::IsResourceExhausted(slot.status()) || CarriesCode(slot.status(), KVTIER_ENOSPC)) {
        return slot;
      }
    }
    if (full != nullptr && !over_quota) {
      *full = true;  // the caller looks elsewhere before anything here is evicted
      return absl::ResourceExhaustedError(absl::StrCat("the ", std::string(lane.tier->name()), " tier is full"));
    }
    const LowerLane::Victim pick = lane.PickVictimLocked(tenant, bytes, over_quota, [&](BlockRecord* v) {
      BlockIndex::Shard& sh = books_.index.ShardFor(v);
      MutexLock sl(&sh.mu);
      return !v->removed && v->pins == 0 && v->io_refs == 0 && v->lower_state == LowerState::kReady;
    });
    if (!pick.slot) {
      if (over_quota) {
        books_.stats->demotions_refused_quota.Add();
        return absl::ResourceExhaustedError(absl::StrCat("tenant \"", books_.tenants[tenant]->name,
                                                         "\" is at its NVMe quota and every block of it there is "
                                                         "pinned or busy"));
      }
      if (pick.held_back) {
        if (lane.index == 0) books_.stats->demotions_refused_fair_share.Add();
        return absl::ResourceExhaustedError(absl::StrCat(
            "the ", std::string(lane.tier->name()), " tier is full and tenant \"", books_.tenants[tenant]->name,
            "\" may evict nothing there: its own blocks are pinned or busy, the other tenants' are within their "
            "fair shares"));
      }
      return absl::ResourceExhaustedError(
          absl::StrCat("the ", std::string(lane.tier->name()), " tier is full and every block on it is pinned or busy"));
    }
    if (over_quota) books_.stats->nvme_evictions_for_quota.Add();
    BlockRecord* r = lane.owner.at(*pick.slot);
    bool destroy = false;
    {
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      if (r->removed || r->pins != 0 || r->io_refs != 0 || r->lower_state != LowerState::kReady) continue;
      r->lower_slot = kNoSlot;
      r->lower_state = LowerState::kNone;
      if (r->state == BlockState::kNone) {
        // Its only copy: the block leaves the cache.
        books_.UnindexLocked(sh, r);
        destroy = true;
      }
    }
    lane.UnreadyLocked(*pick.slot);
    books_.FreeLowerSlotLocked(lane, r, *pick.slot);
    (lane.index == 0 ? books_.stats->nvme_evictions : books_.stats->lower_evictions).Add();
    if (destroy) {  // no host slot, no NVMe slot, unreferenced
      books_.CountRecords(r->ns, -1);
      books_.index.FreeRecord(r);
    }
  }
}

void Migrator::OnLowerWritten(uint8_t lane_index, BlockRecord* r, absl::Status s) {
  LowerLane& lane = *books_.lanes[lane_index];
  std::vector<absl::AnyInvocable<void(bool) &&>> waiters;
  {
    MutexLock nl(&lane.mu);
    if (auto w = lane.write_waiters.find(r); w != lane.write_waiters.end()) {
      waiters = std::move(w->second);
      lane.write_waiters.erase(w);
    }
    RecordWriteLocked(lane, r, s);
  }
  for (auto& cb : waiters) std::move(cb)(s.ok());
}

void Migrator::RecordWriteLocked(LowerLane& lane, BlockRecord* r, const absl::Status& s) {
  SlotHandle slot;
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    slot = r->lower_slot;
    if (s.ok()) {
      r->lower_state = LowerState::kReady;
    } else {
      r->lower_state = LowerState::kNone;
      r->lower_slot = kNoSlot;
      if (r->state == BlockState::kNone && !r->removed) {
        // The demotion failed and the host copy is gone: the block is gone.
        books_.UnindexLocked(sh, r);
      }
    }
  }
  if (s.ok()) {
    lane.ReadyLocked(slot, PolicyKeyOf(*r), PositionOf(*r, books_.MetaOf(r).block_tokens));
    cascade_.MaybeWake(lane.index);
  } else {
    books_.FreeLowerSlotLocked(lane, r, slot);
  }
}

void Migrator::WriteThrough(HostResidency& t, BlockRecord* r, const IoOptions& io, StatusCallback done) {
  LowerLane& first = *books_.lanes[0];
  const BlockMeta meta = books_.MetaOf(r);
  if (meta.payload_bytes > first.tier->max_block_bytes()) {
    std::move(done)(absl::InvalidArgumentError(absl::StrCat("blocks of ", meta.payload_bytes, " bytes do not fit the ",
                                                            std::string(first.tier->name()), " tier (at most ",
                                                            first.tier->max_block_bytes(), " bytes)")));
    return;
  }
  uint64_t offset;
  SlotHandle nslot;
  {
    MutexLock l(&t.mu);
    {
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      if (r->lower_state == LowerState::kReady) {
        const BlockTier& holder = *books_.LaneOf(r).tier;
        // Already below; a caller that needs durability learns where it is not.
        std::move(done)(holder.durable() ? absl::OkStatus()
                                         : absl::FailedPreconditionError(absl::StrCat(
                                               "the block is kept on the ", std::string(holder.name()),
                                               " tier, which is not durable")));
        return;
      }
      if (r->lower_state == LowerState::kWriting || r->state != BlockState::kReady) {
        std::move(done)(absl::UnavailableError("the block is moving between tiers; not written through"));
        return;
      }
      ++r->io_refs;  // keeps the host copy in place while it is copied
      offset = r->arena_offset();
    }
    absl::StatusOr<SlotHandle> slot;
    {
      MutexLock nl(&first.mu);
      slot = AllocateLowerSlotLocked(first, r, meta.payload_bytes);
      }
    if (!slot.ok()) {
      {
        BlockIndex::Shard& sh = books_.index.ShardFor(r);
        MutexLock sl(&sh.mu);
        --r->io_refs;
      }
      std::move(done)(slot.status());
      return;
    }
    nslot = *slot;
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->lower_slot = nslot;
    r->lower = 0;
    r->lower_state = LowerState::kWriting;
  }
  first.tier->Put(first.LocatorOf(nslot), meta, {t.host->arena_base() + offset, meta.payload_bytes}, io,
                    [this, &t, r, start = MonotonicNanos(), done = std::move(done)](absl::Status s) mutable {
                      // A write the staging memory refused never started (a flush
                      // tries it again): not a write.
                      if (ToErrorCode(s) != KVTIER_EBUSY) books_.stats->writes_through.Add();
                      books_.stats->nvme_write_latency.Record(MonotonicNanos() - start);
                      OnLowerWritten(0, r, s);
                      books_.ReleaseIoRef(t, r);
                      std::move(done)(s);
                    });
}

void Migrator::DropLowerCopy(BlockRecord* r, uint8_t lane_index, SlotHandle slot, bool sole_holder) {
  LowerLane& lane = *books_.lanes[lane_index];
  MutexLock nl(&lane.mu);
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    // Moved down (or dropped) since the read that failed: nothing to drop.
    if (r->lower_state != LowerState::kReady || r->lower != lane_index || r->lower_slot != slot) return;
    if (sole_holder && r->io_refs != 1) return;
    r->lower_slot = kNoSlot;
    r->lower_state = LowerState::kNone;
    if (r->state != BlockState::kReady && !r->removed) {
      books_.UnindexLocked(sh, r);
    }
  }
  lane.UnreadyLocked(slot);
  books_.FreeLowerSlotLocked(lane, r, slot);
}

uint32_t Migrator::CalibrateFirstTier(uint64_t now_ns) {
  if (books_.lanes.empty() || !books_.cost.WantsNvmeCalibration(now_ns)) return 0;
  // CostTracker's estimate gives each read 1% of its weight: 32 reads every
  // quiet 2 s replace 28% of it, so a device measured 40 times slower than
  // recomputation allows that recovered is trusted again within about 20 s
  // (cost_tracker_test). Each read is at most 1 MiB: 16 MB/s at most, and
  // only while the model keeps deciding against NVMe without reads.
  return books_.lanes[0]->tier->CalibrationRead(32);
}

}  // namespace kvtier
