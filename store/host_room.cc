// SPDX-License-Identifier: Apache-2.0
// HostResidency: room in a tenant's host tier. Slot allocation (evicting
// while the arena or the token quota is full, waiting a moment for blocks
// only busy with I/O), victim choice across block sizes and segment
// reclaim. Stores and promotions take their host slots here; moving a
// victim's copy (keep, demote or drop) is the evictor's (the migrator).
#include "store/host_residency.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"
#include "store/block_index.h"
#include "store/reclaimer.h"
#include "store/stats.h"

namespace kvtier {
namespace {

// Not pinned or gone (it may still be busy with I/O, or not committed yet).
bool Unpinned(const BlockRecord& v) { return !v.removed && v.pins == 0; }
// And neither busy nor being written or loaded: it may go now.
bool MayGoNow(const BlockRecord& v) { return Unpinned(v) && v.io_refs == 0 && v.state == BlockState::kReady; }

}  // namespace

bool HostResidency::EvictOneLocked(BlockRecord* r, std::vector<PendingDemotion>* deferred) {
  if (room_.evictor->EvictHostCopyLocked(*this, r, deferred) != HostEvictor::Result::kEvicted) return false;
  evictions.fetch_add(1, std::memory_order_relaxed);
  room_.stats->evictions.Add();
  return true;
}

std::optional<SlotHandle> HostResidency::PickVictimLocked(ChainGuard* policy, bool* saw_busy) {
  return policy->PickVictim([&](SlotHandle h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    BlockRecord* v = slots.owner(h);
    BlockIndex::Shard& sh = index_->ShardFor(v);
    MutexLock sl(&sh.mu);
    const bool may_go = MayGoNow(*v);
    if (!may_go && Unpinned(*v) && saw_busy != nullptr) *saw_busy = true;
    return may_go;
  });
}

bool HostResidency::EvictColdestLocked(std::vector<PendingDemotion>* deferred, bool give_segments) {
  // Largest holder first, then the others, until one has a block that may go.
  for (ChainGuard* policy : PoliciesByBytesLocked()) {
    std::optional<SlotHandle> victim = PickVictimLocked(policy);
    if (!victim) continue;
    if (give_segments) {
      const uint64_t slot_bytes = host->SlotBytes(*victim);
      if (++background_room_evictions >= host->SlotsPerSegment(slot_bytes)) {
        background_room_evictions = 0;
        if (ReclaimSegmentLocked(slot_bytes, slots.age(*victim))) return true;
      }
    }
    EvictOneLocked(slots.owner(*victim), deferred);
    return true;
  }
  return false;
}

bool HostResidency::ReclaimSegmentLocked(uint64_t slot_bytes, std::optional<uint32_t> min_age) {
  // A segment with a pinned or busy block would lose its other blocks and
  // still not come back: a few of the coldest are tried, whole or not at all.
  constexpr size_t kTries = 8;
  for (const Segment& seg : ColdSegmentsLocked(slot_bytes, min_age, kTries)) {
    bool all_may_go = true;
    for (SlotHandle h : seg.slots) {
      BlockRecord* v = slots.owner(h);
      if (v == nullptr) {
        all_may_go = false;
        break;
      }
      BlockIndex::Shard& sh = index_->ShardFor(v);
      MutexLock sl(&sh.mu);
      all_may_go = MayGoNow(*v);
      if (!all_may_go) break;
    }
    if (!all_may_go) continue;
    uint64_t evicted = 0;
    for (SlotHandle h : seg.slots) evicted += EvictOneLocked(slots.owner(h), nullptr) ? 1 : 0;
    room_.stats->evictions_for_other_size.Add(evicted);
    room_.stats->host_segments_reclaimed.Add();
    return evicted > 0;
  }
  return false;
}

absl::StatusOr<SlotHandle> HostResidency::AllocateSlotLocked(uint64_t bytes, uint32_t tokens, BlockRecord* owner,
                                                             uint32_t* busy_wait_ms) {
  bool waited = false;
  std::optional<std::chrono::steady_clock::time_point> reclaim_wait_until;
  for (;;) {
    const uint64_t quota = QuotaHostTokens();
    const bool over_quota = quota != 0 && slots.tokens_held() + tokens > quota;
    absl::StatusOr<SlotHandle> slot =
        over_quota ? absl::ResourceExhaustedError("token quota") : host->Allocate(bytes);
    if (slot.ok()) {
      if (!slots.Assign(*slot, owner, tokens)) {
        // The tier handed out a slot the books say is held: a bug, not a full tier.
        (void)host->Free(*slot);
        return absl::InternalError(absl::StrCat("host slot ", *slot, " of tenant \"", name,
                                                "\" was handed out while still held"));
      }
      if (room_.reclaimer != nullptr && room_.reclaimer->running() && FullerThanLocked(room_.reclaimer->marks().high)) {
        room_.reclaimer->Wake();
      }
      return slot;
    }
    if (!absl::IsResourceExhausted(slot.status())) return slot.status();
    if (deferred_in_flight > 0 && deferred_waiting_for_device.load(std::memory_order_relaxed) == 0) {
      // The reclaimer is freeing slots right now (copies of a few hundred
      // microseconds): wait for the next instead of evicting a hotter
      // block, from the store's wait budget (all its slots together; 50 ms
      // for a promotion). Not while one of its demotions waits for the
      // device (a burst past its staging memory): engines' stores do not
      // wait for the device; this one evicts on its own path and drops its
      // victim.
      const auto now = std::chrono::steady_clock::now();
      if (!reclaim_wait_until) {
        reclaim_wait_until = now + std::chrono::milliseconds(busy_wait_ms != nullptr ? *busy_wait_ms : 50);
      }
      if (now < *reclaim_wait_until) {
        const uint64_t seen = deferred_finished;
        mu.AwaitFor(deferred_done, *reclaim_wait_until - now, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return deferred_finished != seen || deferred_waiting_for_device.load(std::memory_order_relaxed) > 0;
        });
        if (busy_wait_ms != nullptr) {
          const auto spent = std::chrono::ceil<std::chrono::milliseconds>(std::chrono::steady_clock::now() - now);
          *busy_wait_ms -= static_cast<uint32_t>(std::min<int64_t>(*busy_wait_ms, spent.count()));
        }
        continue;
      }
    }
    ChainGuard* policy = PolicyForLocked(host->SlotSizeFor(bytes));
    if (over_quota) {
      if (tokens > quota) {
        room_.stats->store_refused_no_space.Add();
        return CodedStatus(KVTIER_ENOSPC, absl::StrCat("a block of ", tokens, " tokens is over tenant \"", name,
                                                       "\"'s host_tokens quota of ", quota,
                                                       "; raise [[tenants]] host_tokens"));
      }
      // Over the token quota: any block size may give tokens back.
      const uint64_t before = slots.tokens_held();
      if (EvictColdestLocked()) {
        if (slots.tokens_held() < before) room_.stats->evictions_for_quota.Add();
        continue;
      }
      room_.stats->store_refused_no_space.Add();
      return CodedStatus(KVTIER_ENOSPC,
                         absl::StrCat("tenant \"", name, "\" holds ", slots.tokens_held(), " of its host_tokens quota of ",
                                      quota, " and every block it could evict is pinned by leases or "
                                      "busy with I/O; release leases or raise [[tenants]] host_tokens"));
    }
    bool saw_busy = false;
    std::optional<SlotHandle> victim = PickVictimLocked(policy, &saw_busy);
    // Now and then (once per segment's worth of evictions; at once when
    // this size has nothing to evict), a whole segment of another size whose
    // blocks are all colder than this size's coldest goes instead, and comes
    // back to this size. Without it, an arena once filled with one block size
    // serves another only from what the first happens to give back.
    const uint64_t slot_bytes = host->SlotSizeFor(bytes);
    if (!victim || ++room_evictions >= host->SlotsPerSegment(slot_bytes)) {
      room_evictions = 0;
      if (ReclaimSegmentLocked(slot_bytes,
                               victim ? std::optional<uint32_t>(slots.age(*victim)) : std::nullopt)) {
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
      if (!waited) room_.stats->stores_waited_for_busy_blocks.Add();
      waited = true;
      --*busy_wait_ms;
      mu.AwaitFor(deferred_done, std::chrono::milliseconds(1), []() { return false; });
      continue;
    }
    if (!victim) {
      room_.stats->store_refused_no_space.Add();
      const TierUsage u = host->Usage();
      if (policy->size() == 0) {
        return CodedStatus(KVTIER_ENOSPC,
                           absl::StrCat("host tier of tenant \"", name, "\" is full (", FormatBytes(u.used_bytes),
                                        " of ", FormatBytes(u.capacity_bytes), ") and holds no committed block of ",
                                        FormatBytes(bytes),
                                        " to evict (slots are being written or loaded, or carved for other block "
                                        "sizes); retry later or raise tiers.host.capacity"));
      }
      return CodedStatus(KVTIER_ENOSPC,
                         absl::StrCat("host tier of tenant \"", name, "\" is full (", FormatBytes(u.used_bytes),
                                      " of ", FormatBytes(u.capacity_bytes), ") and all ", policy->size(),
                                      " committed blocks of this size are pinned by leases or busy with I/O; "
                                      "release leases or raise tiers.host.capacity"));
    }
    // An engine's store (it has a wait budget; a promotion has none) drops
    // this victim rather than copy it while the reclaim waits on the device
    // (Migrator::DemoteLocked).
    evicting_for_store = busy_wait_ms != nullptr;
    EvictOneLocked(slots.owner(*victim), nullptr);
    evicting_for_store = false;
  }
}

}  // namespace kvtier
