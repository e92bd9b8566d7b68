// SPDX-License-Identifier: Apache-2.0
// BlockStore: each tenant's host residency. Slot allocation (evicting while
// the arena or the token quota is full), victim choice across block sizes,
// segment reclaim, the background reclaimer's pass, and the admin changes to
// it (evict a tenant, quotas, watermarks).
#include "store/block_store.h"

#include "core/checked.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "core/fan_in.h"
#include "core/status.h"
#include "core/units.h"
#include "spdlog/spdlog.h"

namespace kvtier {

std::optional<SlotHandle> BlockStore::PickHostVictimLocked(HostResidency& t, ChainGuard* policy, bool* saw_busy) {
  return policy->PickVictim([&](SlotHandle h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    BlockRecord* v = t.slots.owner(h);
    BlockIndex::Shard& sh = books_.index.ShardFor(v);
    MutexLock sl(&sh.mu);
    const bool free_to_go = !v->removed && v->pins == 0;
    if (free_to_go && (v->io_refs != 0 || v->state != BlockState::kReady) && saw_busy != nullptr) *saw_busy = true;
    return free_to_go && v->io_refs == 0 && v->state == BlockState::kReady;
  });
}

bool BlockStore::EvictColdestLocked(HostResidency& t, std::vector<PendingDemotion>* deferred, bool give_segments) {
  // Largest holder first, then the others, until one has a block that may go.
  for (ChainGuard* policy : t.PoliciesByBytesLocked()) {
    std::optional<SlotHandle> victim = PickHostVictimLocked(t, policy);
    if (!victim) continue;
    if (give_segments) {
      const uint64_t slot_bytes = t.host->SlotBytes(*victim);
      if (++t.background_room_evictions >= t.host->SlotsPerSegment(slot_bytes)) {
        t.background_room_evictions = 0;
        if (ReclaimSegmentLocked(t, slot_bytes, t.slots.age(*victim))) return true;
      }
    }
    if (migrator_.EvictHostCopyLocked(t, t.slots.owner(*victim), deferred) == EvictResult::kEvicted) {
      t.evictions.fetch_add(1, std::memory_order_relaxed);
      books_.stats->evictions.Add();
    }
    return true;
  }
  return false;
}

bool BlockStore::ReclaimSegmentLocked(HostResidency& t, uint64_t slot_bytes, std::optional<uint32_t> min_age) {
  // A segment with a pinned or busy block would lose its other blocks and
  // still not come back: a few of the coldest are tried, whole or not at all.
  constexpr size_t kTries = 8;
  for (const HostResidency::Segment& seg : t.ColdSegmentsLocked(slot_bytes, min_age, kTries)) {
    bool all_may_go = true;
    for (SlotHandle h : seg.slots) {
      BlockRecord* v = t.slots.owner(h);
      if (v == nullptr) {
        all_may_go = false;
        break;
      }
      BlockIndex::Shard& sh = books_.index.ShardFor(v);
      MutexLock sl(&sh.mu);
      all_may_go = !v->removed && v->pins == 0 && v->io_refs == 0 && v->state == BlockState::kReady;
      if (!all_may_go) break;
    }
    if (!all_may_go) continue;
    uint64_t evicted = 0;
    for (SlotHandle h : seg.slots) {
      if (migrator_.EvictHostCopyLocked(t, t.slots.owner(h)) == EvictResult::kEvicted) ++evicted;
    }
    t.evictions.fetch_add(evicted, std::memory_order_relaxed);
    books_.stats->evictions.Add(evicted);
    books_.stats->evictions_for_other_size.Add(evicted);
    books_.stats->host_segments_reclaimed.Add();
    return evicted > 0;
  }
  return false;
}

void BlockStore::StartBackgroundReclaim() {
  migrator_.StartCascade();
  reclaimer_.Start();
}

void BlockStore::StopBackgroundReclaim() { reclaimer_.Stop(); }

absl::StatusOr<uint64_t> BlockStore::EvictTenant(const std::string& tenant) {
  for (const auto& tp : books_.tenants) {
    HostResidency& t = *tp;
    if (t.name != tenant) continue;
    uint64_t evicted = 0;
    MutexLock l(&t.mu);
    // Bounded: a victim that turns out busy is skipped, not retried forever.
    const uint64_t slots = t.host->Usage().used_slots;
    for (uint64_t i = 0; i < slots; ++i) {
      const uint64_t before = t.host->Usage().used_slots;
      if (!EvictColdestLocked(t)) break;  // counts its evictions
      if (t.host->Usage().used_slots < before) ++evicted;
    }
    return evicted;
  }
  return absl::NotFoundError(absl::StrCat("no tenant \"", tenant, "\""));
}

absl::Status BlockStore::SetQuota(const std::string& tenant, TenantQuota quota) {
  for (const auto& t : books_.tenants) {
    if (t->name != tenant) continue;
    t->SetQuota(quota);
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("no tenant \"", tenant, "\""));
}

absl::Status BlockStore::SetWatermarks(double high, double low) {
  RETURN_IF_ERROR(reclaimer_.SetMarks({high, low}));  // starts it when it was off
  migrator_.StartCascade();
  return absl::OkStatus();
}

void BlockStore::ReclaimPass() {
  for (const auto& tp : books_.tenants) {
    HostResidency& t = *tp;
    // Above the high mark, down to the low mark (between them, nothing:
    // the gap is what stores use without evicting). In batches of 16
    // victims, chosen under the tier lock; their demotions copy into NVMe
    // staging after it is released (a copy, and sometimes a wait on the
    // NVMe tier's own locks, under it made stores' p99 latency three times
    // worse: kvtier-bench reclaim, 11 ms against 3.6 ms without reclaim).
    bool started = false;
    std::vector<PendingDemotion> pending;
    for (;;) {
      bool more = false;
      // The marks as a pair, per batch: a reload during a long pass counts
      // from its next batch.
      const Reclaimer::Marks marks = reclaimer_.marks();
      {
        MutexLock l(&t.mu);
        if (!started) {
          if (!t.FullerThanLocked(marks.high)) break;
          started = true;
        }
        // Slots of deferred demotions still count as used: aim past them.
        // (Kept and dropped blocks free theirs at once.)
        uint64_t freeing_bytes = 0, freeing_tokens = 0;
        for (int evicted = 0; t.FullerThanLocked(marks.low, freeing_bytes, freeing_tokens); ++evicted) {
          if (evicted == 16) {
            more = true;
            break;
          }
          const size_t before = pending.size();
          if (!EvictColdestLocked(t, &pending, /*give_segments=*/true)) break;  // everything left is pinned or moving
          for (size_t i = before; i < pending.size(); ++i) {
            freeing_bytes += t.host->SlotBytes(pending[i].host_slot);
            freeing_tokens += t.slots.tokens(pending[i].host_slot);
          }
          t.deferred_in_flight += static_cast<uint32_t>(pending.size() - before);
          books_.stats->evictions_background.Add();
        }
      }
      for (const PendingDemotion& d : pending) migrator_.FinishDemotion(t, d);
      pending.clear();
      if (!more) break;
    }
  }
}

absl::StatusOr<SlotHandle> BlockStore::AllocateSlotLocked(HostResidency& t, uint64_t bytes, uint32_t tokens,
                                                          BlockRecord* owner, uint32_t* busy_wait_ms) {
  bool waited = false;
  for (;;) {
    const uint64_t quota = t.QuotaHostTokens();
    const bool over_quota = quota != 0 && t.slots.tokens_held() + tokens > quota;
    absl::StatusOr<SlotHandle> slot =
        over_quota ? absl::ResourceExhaustedError("token quota") : t.host->Allocate(bytes);
    if (slot.ok()) {
      if (!t.slots.Assign(*slot, owner, tokens)) {
        // The tier handed out a slot the books say is held: a bug, not a full tier.
        (void)t.host->Free(*slot);
        return absl::InternalError(absl::StrCat("host slot ", *slot, " of tenant \"", t.name,
                                                "\" was handed out while still held"));
      }
      if (reclaimer_.running() && t.FullerThanLocked(reclaimer_.marks().high)) {
        reclaimer_.Wake();
      }
      return slot;
    }
    if (!absl::IsResourceExhausted(slot.status())) return slot.status();
    if (t.deferred_in_flight > 0) {
      // The reclaimer is freeing slots right now (copies of a few hundred
      // microseconds): wait for them instead of evicting a hotter block.
      t.mu.Await(t.deferred_done, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return t.deferred_in_flight == 0; });
      continue;
    }
    ChainGuard* policy = t.PolicyForLocked(t.host->SlotSizeFor(bytes));
    if (over_quota) {
      if (tokens > quota) {
        books_.stats->store_refused_no_space.Add();
        return CodedStatus(KVTIER_ENOSPC, absl::StrCat("a block of ", tokens, " tokens is over tenant \"", t.name,
                                                       "\"'s host_tokens quota of ", quota,
                                                       "; raise [[tenants]] host_tokens"));
      }
      // Over the token quota: any block size may give tokens back.
      const uint64_t before = t.slots.tokens_held();
      if (EvictColdestLocked(t)) {
        if (t.slots.tokens_held() < before) books_.stats->evictions_for_quota.Add();
        continue;
      }
      books_.stats->store_refused_no_space.Add();
      return CodedStatus(KVTIER_ENOSPC,
                         absl::StrCat("tenant \"", t.name, "\" holds ", t.slots.tokens_held(), " of its host_tokens quota of ",
                                      quota, " and every block it could evict is pinned by leases or "
                                      "busy with I/O; release leases or raise [[tenants]] host_tokens"));
    }
    bool saw_busy = false;
    std::optional<SlotHandle> victim = PickHostVictimLocked(t, policy, &saw_busy);
    // Now and then (once per segment's worth of evictions; at once when
    // this size has nothing to evict), a whole segment of another size whose
    // blocks are all colder than this size's coldest goes instead, and comes
    // back to this size. Without it, an arena once filled with one block size
    // serves another only from what the first happens to give back.
    const uint64_t slot_bytes = t.host->SlotSizeFor(bytes);
    if (!victim || ++t.room_evictions >= t.host->SlotsPerSegment(slot_bytes)) {
      t.room_evictions = 0;
      if (ReclaimSegmentLocked(t, slot_bytes,
                               victim ? std::optional<uint32_t>(t.slots.age(*victim)) : std::nullopt)) {
        continue;
      }
    }
    if (!victim && saw_busy && busy_wait_ms != nullptr && *busy_wait_ms > 0) {
      // No committed block of this size may go now, but some are only busy
      // with I/O (a write-through, a move of the block's lower copy down
      // the chain, a read of it for another tier), not pinned by leases.
      // That mostly ends within milliseconds: the store waits for it (the
      // lock let go), from its budget, rather than being refused for a
      // passing moment.
      if (!waited) books_.stats->stores_waited_for_busy_blocks.Add();
      waited = true;
      --*busy_wait_ms;
      t.mu.AwaitFor(t.deferred_done, std::chrono::milliseconds(1), []() { return false; });
      continue;
    }
    if (!victim) {
      books_.stats->store_refused_no_space.Add();
      const TierUsage u = t.host->Usage();
      if (policy->size() == 0) {
        return CodedStatus(KVTIER_ENOSPC,
                           absl::StrCat("host tier of tenant \"", t.name, "\" is full (", FormatBytes(u.used_bytes),
                                        " of ", FormatBytes(u.capacity_bytes), ") and holds no committed block of ",
                                        FormatBytes(bytes),
                                        " to evict (slots are being written or loaded, or carved for other block "
                                        "sizes); retry later or raise tiers.host.capacity"));
      }
      return CodedStatus(KVTIER_ENOSPC,
                         absl::StrCat("host tier of tenant \"", t.name, "\" is full (", FormatBytes(u.used_bytes),
                                      " of ", FormatBytes(u.capacity_bytes), ") and all ", policy->size(),
                                      " committed blocks of this size are pinned by leases or busy with I/O; "
                                      "release leases or raise tiers.host.capacity"));
    }
    if (migrator_.EvictHostCopyLocked(t, t.slots.owner(*victim)) == EvictResult::kEvicted) {
      t.evictions.fetch_add(1, std::memory_order_relaxed);
      books_.stats->evictions.Add();
    }
  }
}

}  // namespace kvtier
