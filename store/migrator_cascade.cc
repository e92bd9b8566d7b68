// SPDX-License-Identifier: Apache-2.0
// The cascade between lower tiers: while a tier of the chain is fuller than
// cascade_high of its capacity, a background thread copies its coldest
// blocks one tier down until it is at cascade_low, the way host reclaim
// keeps room in host memory. Stores and demotions never wait for it: when
// the first tier is full, a demotion goes to the second while it has room
// (Migrator::DemotionSlot), and a tier evicts its coldest blocks on the
// allocating path only when the one below has none, as the last tier of the
// chain always does.
//
// One move, for a block of lane i:
//   1. pick: the lane's policy gives its coldest ready, unpinned, idle copy;
//      the move takes an io_ref on the record (nothing else evicts or
//      frees the copy meanwhile);
//   2. read the copy into staging memory (checked like any read: a damaged
//      copy is dropped, not moved);
//   3. allocate a slot in lane i + 1 (evicting there if it is full) and
//      write the staging copy to it (a shared tier that already holds the
//      block, asked with one Exists for the batch and read back to prove
//      it, is not written again);
//   4. swap, under both lane locks and the record's shard lock: if the
//      record still names the same copy and nobody else holds an io_ref
//      on it, it now names the new copy and the old slot is freed; else
//      the new slot is freed and the block stays where it was.
// Lookups see the block all along: in lane i until the swap, in lane i + 1
// after it.
#include "store/migrator.h"

#include <chrono>
#include <cstddef>
#include <latch>
#include <memory>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

// By the lane's books: a tier addressed by key knows nothing of what this
// node placed there.
bool FullerThan(const LowerLane& lane, double share) {
  const TierUsage u = lane.Usage();
  return u.capacity_bytes > 0 && static_cast<double>(u.used_bytes) > share * static_cast<double>(u.capacity_bytes);
}

}  // namespace

Cascade::Hooks Migrator::CascadeHooks() {
  // Lanes are attached before the driver starts and never after.
  return {
      .tiers = [this] { return books_.lanes.size(); },
      .fuller_than = [this](size_t i, double share) { return FullerThan(*books_.lanes[i], share); },
      .move_batch = [this](size_t i, uint32_t max) { return CascadeBatch(i, max); },
  };
}

uint32_t Migrator::CascadeBatch(size_t i, uint32_t max) {
  LowerLane& from = *books_.lanes[i];
  LowerLane& to = *books_.lanes[i + 1];
  std::vector<CascadeMove> moves = PickCascadeMoves(from, to, max);
  if (moves.empty()) return 0;
  CopyCascadeMoves(from, to, moves);
  uint32_t moved = 0;
  for (CascadeMove& m : moves) {
    moved += FinishCascadeMove(from, to, m) ? 1 : 0;
    books_.ReleaseIoRef(*books_.tenants[m.r->tenant], m.r);
  }
  return moved;
}

bool Migrator::DropUnadmittedLocked(LowerLane& from, BlockRecord* r, SlotHandle slot) {
  bool destroy = false;
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    if (r->removed || r->pins != 0 || r->io_refs != 0 || r->lower_state != LowerState::kReady ||
        r->lower != from.index || r->lower_slot != slot) {
      return false;  // the next batch looks again
    }
    r->lower_slot = kNoSlot;
    r->lower_state = LowerState::kNone;
    if (r->state == BlockState::kNone) {
      books_.UnindexLocked(sh, r);  // its only copy: the block leaves the cache
      destroy = true;
    }
  }
  from.UnreadyLocked(slot);
  books_.FreeLowerSlotLocked(from, r, slot);
  (from.index == 0 ? books_.stats->nvme_evictions : books_.stats->lower_evictions).Add();
  books_.stats->cascade_dropped_not_admitted.Add();
  if (destroy) {  // no host slot, no lower slot, unreferenced
    books_.CountRecords(r->ns, -1);
    books_.index.FreeRecord(r);
  }
  return true;
}

std::vector<Migrator::CascadeMove> Migrator::PickCascadeMoves(LowerLane& from, const LowerLane& to, uint32_t max) {
  std::vector<CascadeMove> moves;
  MutexLock l(&from.mu);
  while (moves.size() < max) {
    std::optional<SlotHandle> v = from.policy->PickVictim([&](SlotHandle h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      BlockRecord* r = from.owner.at(h);
      const uint64_t bytes = books_.MetaOf(r).payload_bytes;
      if (bytes > to.tier->max_block_bytes() || (to.tier->shared() && bytes < shared_min_block_bytes_)) {
        return false;  // stays; evicted in time
      }
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      return !r->removed && r->pins == 0 && r->io_refs == 0 && r->lower_state == LowerState::kReady &&
             r->lower == from.index && r->lower_slot == h;
    });
    if (!v) break;
    BlockRecord* r = from.owner.at(*v);
    if (!books_.Admits(to, r)) {
      // The tier below turns it away (no evidence of reuse): the cascade
      // drops it here, as this tier's own eviction would, rather than
      // walking past it on every pass.
      if (!DropUnadmittedLocked(from, r, *v)) break;
      continue;
    }
    {
      // Look again: the shard lock was let go after the policy's look,
      // and an invalidation may have taken the record meanwhile.
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      if (r->removed || r->pins != 0 || r->io_refs != 0 || r->lower_state != LowerState::kReady ||
          r->lower != from.index || r->lower_slot != *v) {
        break;  // the next batch looks again
      }
      ++r->io_refs;  // the move's, until it ends: the copy stays put
    }
    CascadeMove& m = moves.emplace_back();
    m.r = r;
    m.slot = *v;
    m.meta = books_.MetaOf(r);
  }
  return moves;
}

void Migrator::CopyCascadeMoves(LowerLane& from, LowerLane& to, std::vector<CascadeMove>& moves) {
  // Room below first: a tier that cannot take them costs no reads.
  for (CascadeMove& m : moves) {
    MutexLock l(&to.mu);
    absl::StatusOr<SlotHandle> slot = AllocateLowerSlotLocked(to, m.r, m.meta.payload_bytes);
    if (!slot.ok()) {
      m.wrote = slot.status();
      continue;
    }
    m.to_slot = *slot;
  }

  // A shared tier below may hold some already (another node wrote them, or
  // this one published them): those need no copy, only the swap.
  if (to.tier->shared()) {
    std::vector<BlockMeta> metas;
    std::vector<CascadeMove*> asked;
    for (CascadeMove& m : moves) {
      if (m.to_slot == kNoSlot) continue;
      metas.push_back(m.meta);
      asked.push_back(&m);
    }
    if (!metas.empty()) {
      auto answered = std::make_shared<std::latch>(1);
      auto present = std::make_shared<std::vector<bool>>();
      to.tier->Exists(
          metas,
          [answered, present](std::vector<bool> v) {
            *present = std::move(v);
            answered->count_down();
          },
          0);
      answered->wait();
      for (size_t j = 0; j < asked.size() && j < present->size(); ++j) {
        if ((*present)[j]) asked[j]->already_below = true;
      }
    }
    // EXISTS only says a value is under the key: whoever can write the key
    // in the cluster may have left one that does not open (or it was evicted
    // since). The value is read and checked as a load would before this
    // node lets go of its own copy; one that fails is written over with
    // this node's copy, like a block that was not there.
    ReadIntoStaging(to, moves, [](const CascadeMove& m) { return m.already_below; },
                    [](const CascadeMove& m) { return m.to_slot; });
    for (CascadeMove& m : moves) {
      if (!m.already_below) continue;
      if (m.read.ok()) {
        books_.stats->remote_writes_avoided.Add();
        m.staging.reset();
        continue;
      }
      books_.stats->cascade_found_unproven.Add();
      m.already_below = false;
      m.read = absl::OkStatus();
    }
  }

  // Read every copy that has room below into staging.
  ReadIntoStaging(from, moves, [](const CascadeMove& m) { return m.to_slot != kNoSlot && !m.already_below; },
                  [](const CascadeMove& m) { return m.slot; });

  // Write what was read one lane down.
  size_t writing = 0;
  for (const CascadeMove& m : moves) writing += m.to_slot != kNoSlot && m.read.ok() && !m.already_below;
  auto writes = std::make_shared<std::latch>(static_cast<std::ptrdiff_t>(writing));
  for (CascadeMove& m : moves) {
    if (m.to_slot == kNoSlot || !m.read.ok() || m.already_below) continue;
    to.tier->Put(to.LocatorOf(m.to_slot), m.meta, {m.staging.get(), m.meta.payload_bytes}, IoOptions{IoPriority::kDemote},
                   [&m, writes](absl::Status s) {
                     m.wrote = std::move(s);
                     writes->count_down();
                   });
  }
  writes->wait();
}

void Migrator::ReadIntoStaging(const LowerLane& lane, std::vector<CascadeMove>& moves,
                               absl::FunctionRef<bool(const CascadeMove&)> which,
                               absl::FunctionRef<SlotHandle(const CascadeMove&)> slot_of) {
  size_t reading = 0;
  for (const CascadeMove& m : moves) reading += which(m);
  // Held by shared_ptr: a callback may still be counting down after the
  // waiter woke.
  auto reads = std::make_shared<std::latch>(static_cast<std::ptrdiff_t>(reading));
  for (CascadeMove& m : moves) {
    if (!which(m)) continue;
    m.staging = std::make_unique_for_overwrite<std::byte[]>(m.meta.payload_bytes);
    lane.tier->Get(lane.LocatorOf(slot_of(m)), m.meta, {m.staging.get(), m.meta.payload_bytes}, IoOptions{IoPriority::kDemote},
              [&m, reads](absl::Status s) {
                m.read = std::move(s);
                reads->count_down();
              });
  }
  reads->wait();
}

bool Migrator::FinishCascadeMove(LowerLane& from, LowerLane& to, CascadeMove& m) {
  if (m.to_slot == kNoSlot) {
    books_.stats->cascades_failed.Add();  // no room below
    return false;
  }
  if (!m.read.ok()) {
    books_.stats->cascades_failed.Add();
    {
      MutexLock l(&to.mu);
      books_.FreeLowerSlotLocked(to, m.r, m.to_slot);
    }
    // A copy that fails its check is never served (nor moved), and a shared
    // tier's value its cluster evicted is gone: either leaves the books (or
    // the cascade would pick it again every pass); one that another reader
    // holds is left to that reader.
    if (absl::IsDataLoss(m.read) || (absl::IsNotFound(m.read) && from.tier->shared())) {
      DropLowerCopy(m.r, from.index, m.slot, /*sole_holder=*/true);
    }
    return false;
  }
  bool swapped = false;
  {
    MutexLock a(&from.mu);
    MutexLock b(&to.mu);
    if (m.wrote.ok()) {
      BlockIndex::Shard& sh = books_.index.ShardFor(m.r);
      MutexLock sl(&sh.mu);
      // Only the move's io_ref: no promotion or prefetch is reading the old copy.
      swapped = !m.r->removed && m.r->lower_state == LowerState::kReady && m.r->lower == from.index &&
                m.r->lower_slot == m.slot && m.r->io_refs == 1;
      if (swapped) {
        m.r->lower = to.index;
        m.r->lower_slot = m.to_slot;
      }
    }
    if (swapped) {
      from.UnreadyLocked(m.slot);
      books_.FreeLowerSlotLocked(from, m.r, m.slot);
      to.ReadyLocked(m.to_slot, PolicyKeyOf(*m.r), PositionOf(*m.r, m.meta.block_tokens));
    } else {
      books_.FreeLowerSlotLocked(to, m.r, m.to_slot);
    }
  }
  if (swapped) {
    books_.stats->cascades.Add();
  } else {
    books_.stats->cascades_failed.Add();
  }
  return swapped;
}

}  // namespace kvtier
