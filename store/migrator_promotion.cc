// SPDX-License-Identifier: Apache-2.0
// Promotion: a block without a host copy is brought into a host slot from
// whichever lower tier holds it, for a load or ahead of need (the store's
// Load and Prefetch). The plan is decided under the tenant lock and acted on
// after it; an io_ref keeps the record alive while its read is in flight.
#include "store/migrator.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"

namespace kvtier {
// A promotion, as a state machine (docs/architecture.md, "As a state
// machine"). Decided under the tenant lock, acted on after it: callbacks
// never run under a tier lock.
//   kAlreadyReady  the block has a host copy: done(true).
//   kWaiting       another promotion of it is in flight: done joins its waiters.
//   kAfterWrite    its demotion's write is in flight: decide again once it landed.
//   kFail          no copy to read, or no host slot: done(false).
//   kRead          host slot taken, block kLoading, io_ref held: read the lower
//                  copy; FinishPromotion completes it.
Migrator::PromotionPlan Migrator::PlanPromotionLocked(HostResidency& t, BlockRecord* r, const BlockMeta& meta) {
  PromotionPlan p;
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    if (r->state == BlockState::kReady) {
      p.next = PromotionPlan::kAlreadyReady;
    } else if (r->state == BlockState::kLoading) {
      p.next = PromotionPlan::kWaiting;
    } else if (r->lower_state == LowerState::kWriting && r->state == BlockState::kNone) {
      p.next = PromotionPlan::kAfterWrite;
    } else if (r->lower_state != LowerState::kReady || r->state != BlockState::kNone) {
      p.next = PromotionPlan::kFail;
    } else {
      p.next = PromotionPlan::kRead;
      ++r->io_refs;  // from here on r is neither evicted nor destroyed
      r->state = BlockState::kLoading;
      p.lower_slot = r->lower_slot;
      p.lane = r->lower;
    }
  }
  if (p.next != PromotionPlan::kRead) return p;
  absl::StatusOr<SlotHandle> slot = t.AllocateSlotLocked(meta.payload_bytes, meta.block_tokens, r);
  BlockIndex::Shard& sh = books_.index.ShardFor(r);
  if (!slot.ok()) {
    MutexLock sl(&sh.mu);
    r->state = BlockState::kNone;
    p.next = PromotionPlan::kFail;
    p.drop_ref = true;
    return p;
  }
  p.host_slot = *slot;
  p.offset = t.host->ArenaOffset(p.host_slot);
  t.loading.try_emplace(r);  // others wait here from now on
  MutexLock sl(&sh.mu);
  r->host_slot = p.host_slot;
  r->set_arena_offset(p.offset);
  return p;
}

bool Migrator::AwaitDemotionLocked(HostResidency& t, BlockRecord* r, IoPriority prio,
                                     absl::AnyInvocable<void(bool) &&>& done, uint64_t parent_key) {
  // Only demotions and writes-through write from host memory: into lane 0,
  // or the lane below it when lane 0 was full. (Tenant lock, then the lane
  // lock: the write's completion takes the lane lock only.)
  uint8_t lane_index;
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    if (r->lower_state != LowerState::kWriting) return false;  // landed (or failed) between the looks
    lane_index = r->lower;
  }
  LowerLane& lane = *books_.lanes[lane_index];
  MutexLock nl(&lane.mu);
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    // Its write lands under this lane's lock: still writing here, it is not
    // done before the waiter below is in place.
    if (r->lower_state != LowerState::kWriting || r->lower != lane_index) return false;
  }
  lane.tier->CommitSoon();  // a demotion's record waits for the next batch otherwise
  lane.write_waiters[r].push_back([this, &t, r, prio, parent_key, done = std::move(done)](bool written) mutable {
    if (!written) {
      std::move(done)(false);
      return;
    }
    Promote(t, r, prio, std::move(done), parent_key);
  });
  return true;
}

void Migrator::Promote(HostResidency& t, BlockRecord* r, IoPriority prio, absl::AnyInvocable<void(bool) &&> done,
                         uint64_t parent_key) {
  const BlockMeta meta = books_.MetaOf(r);
  PromotionPlan p;
  {
    MutexLock l(&t.mu);
    p = PlanPromotionLocked(t, r, meta);
    if (p.next == PromotionPlan::kWaiting) {
      t.loading[r].push_back(std::move(done));
      return;
    }
    if (p.next == PromotionPlan::kAfterWrite && AwaitDemotionLocked(t, r, prio, done, parent_key)) return;
  }
  switch (p.next) {
    case PromotionPlan::kAfterWrite:  // the write landed between the looks: decide again
      Promote(t, r, prio, std::move(done), parent_key);
      return;
    case PromotionPlan::kAlreadyReady:
      std::move(done)(true);
      return;
    case PromotionPlan::kFail:
      books_.stats->promotions_failed.Add();
      if (p.drop_ref) books_.ReleaseIoRef(t, r);
      std::move(done)(false);
      return;
    case PromotionPlan::kWaiting:
    case PromotionPlan::kRead:
      break;
  }
  const uint64_t start = MonotonicNanos();
  const LowerLane& lane = *books_.lanes[p.lane];
  lane.tier->Get(lane.LocatorOf(p.lower_slot), meta, {t.host->arena_base() + p.offset, meta.payload_bytes}, prio,
                             [this, &t, r, p, start, parent_key, block_tokens = meta.block_tokens,
                              done = std::move(done)](absl::Status s) mutable {
                               (p.lane == 0 ? books_.stats->nvme_read_latency : books_.stats->lower_read_latency)
                                   .Record(MonotonicNanos() - start);
                               FinishPromotion(t, r, p, s, parent_key, block_tokens, std::move(done));
                             });
}

void Migrator::FinishPromotion(HostResidency& t, BlockRecord* r, const PromotionPlan& p, const absl::Status& s,
                                 uint64_t parent_key, uint32_t block_tokens, absl::AnyInvocable<void(bool) &&> done) {
  const bool ok = s.ok();
  std::vector<absl::AnyInvocable<void(bool) &&>> waiters;
  {
    MutexLock l(&t.mu);
    {
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      r->state = ok ? BlockState::kReady : BlockState::kNone;
      if (!ok) r->host_slot = kNoSlot;
    }
    if (ok) {
      t.PolicyForLocked(t.host->SlotBytes(p.host_slot))
          ->InsertInChain(p.host_slot, PolicyKeyOf(*r), parent_key, PositionOf(*r, block_tokens));
      t.AnnounceLocked(p.host_slot);
    } else {
      t.FreeSlotLocked(p.host_slot);
    }
    if (auto w = t.loading.find(r); w != t.loading.end()) {
      waiters = std::move(w->second);
      t.loading.erase(w);
    }
  }
  if (ok) {
    books_.stats->promotions.Add();
  } else {
    books_.stats->promotions_failed.Add();
    // A copy that fails its checksum is never served again; one a shared
    // tier says it no longer holds (its own eviction) is not there to serve.
    if (absl::IsDataLoss(s) || absl::IsNotFound(s)) DropLowerCopy(r, p.lane, p.lower_slot);
  }
  books_.ReleaseIoRef(t, r);
  std::move(done)(ok);
  for (auto& cb : waiters) std::move(cb)(ok);
}

}  // namespace kvtier
