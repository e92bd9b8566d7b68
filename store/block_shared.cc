// SPDX-License-Identifier: Apache-2.0
// The shared tiers' part of the store's operations (tiers.remote, tiers.fs):
// lookups that ask them past their local hit prefix, and the writes a node's write
// policy sends up after a reply. Moves into it (the cascade) and the
// publishing writes themselves are the migrator's.
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>

#include "core/units.h"
#include "store/block_store.h"
#include "policies/adaptive_policy.h"

namespace kvtier {

size_t BlockStore::SharedProbeBlocks(SessionHoldings& s, std::span<const BlockKey> keys, size_t from) {
  const uint32_t budget_us = shared_budget_us_.load(std::memory_order_relaxed);
  if (shared_lanes_.empty() || budget_us == 0 || from >= keys.size()) return 0;
  if (s.ns.block_bytes == 0 || s.ns.block_bytes < opts_.shared_min_block_bytes ||
      std::none_of(shared_lanes_.begin(), shared_lanes_.end(),
                   [&](uint8_t i) { return s.ns.block_bytes <= books_.lanes[i]->tier->max_block_bytes(); })) {
    return 0;
  }
  const size_t n = std::min<size_t>(keys.size() - from, opts_.shared_probe_max_blocks);
  if (n == 0) return 0;
  HostResidency& tenant = *books_.tenants[s.ns.tenant];
  // A flood of probes costs the flooder: past its rate its lookups end at
  // the local prefix, and the cluster every tenant shares never sees them.
  if (!tenant.TakeProbeBlocks(static_cast<uint32_t>(n), opts_.shared_probe_blocks_per_s)) {
    books_.stats->remote_probes_throttled.Add();
    return 0;
  }
  if (tenant.shared_probes.fetch_add(1, std::memory_order_relaxed) >= HostResidency::kMaxSharedProbesPerTenant) {
    tenant.shared_probes.fetch_sub(1, std::memory_order_relaxed);
    books_.stats->remote_probes_busy.Add();
    return 0;  // a miss past the local prefix, as if the cluster were slow
  }
  books_.stats->remote_probes.Add();
  books_.stats->remote_probe_blocks.Add(n);
  return n;
}

std::vector<BlockMeta> BlockStore::SharedProbeMetas(const SessionHoldings& s, std::span<const BlockKey> keys,
                                                    size_t from, size_t n) const {
  const uint64_t tenant_hash = books_.tenants[s.ns.tenant]->hash;
  std::vector<BlockMeta> metas(n);
  for (size_t i = 0; i < n; ++i) {
    metas[i] = BlockMeta{.ns = s.ns.id, .key = keys[from + i], .payload_bytes = s.ns.block_bytes,
                         .tenant_hash = tenant_hash, .block_tokens = s.ns.block_tokens};
  }
  return metas;
}

namespace {

// Where the answers of the shared lanes asked for one probe meet.
struct SharedMeet {
  Mutex mu;
  std::vector<std::vector<bool>> present ABSL_GUARDED_BY(mu);  // by position in `lanes`; empty: not answered
  std::vector<uint8_t> lanes;                                   // chain order
  std::atomic<size_t> remaining{0};
  absl::AnyInvocable<void(std::vector<uint8_t>) &&> answered;
  size_t n = 0;

  // Each block's holder: the first lane in the chain that answered it holds
  // it (kNoLane: none so far).
  std::vector<uint8_t> Holders() {
    std::vector<uint8_t> holder(n, BlockStore::kNoLane);
    MutexLock l(&mu);
    for (size_t k = 0; k < n; ++k) {
      for (size_t q = 0; q < lanes.size() && holder[k] == BlockStore::kNoLane; ++q) {
        if (k < present[q].size() && present[q][k]) holder[k] = lanes[q];
      }
    }
    return holder;
  }
};

}  // namespace

std::function<std::vector<uint8_t>()> BlockStore::AskSharedLanes(
    const SessionHoldings& s, std::span<const BlockKey> keys, size_t from, size_t n, uint64_t deadline_ns,
    absl::AnyInvocable<void(std::vector<uint8_t>) &&> answered) {
  // Every shared lane that takes blocks of this size is asked at once; the
  // answers meet here, and the first lane in the chain that holds a block
  // is its holder (the nearer tier, as a load would want).
  auto meet = std::make_shared<SharedMeet>();
  for (uint8_t i : shared_lanes_) {
    if (s.ns.block_bytes <= books_.lanes[i]->tier->max_block_bytes()) meet->lanes.push_back(i);
  }
  meet->n = n;
  meet->answered = std::move(answered);
  {
    MutexLock l(&meet->mu);
    meet->present.resize(meet->lanes.size());
  }
  std::function<std::vector<uint8_t>()> so_far = [meet] { return meet->Holders(); };
  if (meet->lanes.empty()) {
    std::move(meet->answered)(std::vector<uint8_t>(n, kNoLane));
    return so_far;
  }
  meet->remaining.store(meet->lanes.size(), std::memory_order_relaxed);
  const std::vector<BlockMeta> metas = SharedProbeMetas(s, keys, from, n);
  for (size_t j = 0; j < meet->lanes.size(); ++j) {
    books_.lanes[meet->lanes[j]]->tier->Exists(
        metas,
        [meet, j](std::vector<bool> v) {
          {
            MutexLock l(&meet->mu);
            meet->present[j] = std::move(v);
          }
          if (meet->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
          std::move(meet->answered)(meet->Holders());
        },
        deadline_ns);
  }
  return so_far;
}

bool BlockStore::StartSharedProbe(SessionHoldings& s, std::span<const BlockKey> keys,
                                  absl::AnyInvocable<void(SharedAnswer) &&> answered,
                                  std::function<SharedAnswer()>* so_far) {
  if (shared_lanes_.empty() || shared_budget_us_.load(std::memory_order_relaxed) == 0) return false;
  // Where the local tiers end the prefix, without pinning anything: the
  // lookup that follows the answer probes (and pins) again.
  std::vector<BlockLocation> scratch(keys.size());
  const ChainHits h = ProbeChain(s, keys, /*lease=*/false, scratch);
  if (h.cut_for_cost || h.hit >= keys.size()) return false;
  const size_t from = h.hit;
  const size_t n = SharedProbeBlocks(s, keys, from);
  if (n == 0) return false;
  const uint32_t budget_us = shared_budget_us_.load(std::memory_order_relaxed);
  const uint64_t start = MonotonicNanos();
  std::atomic<uint32_t>* busy = &books_.tenants[s.ns.tenant]->shared_probes;
  DaemonStats* stats = books_.stats;
  std::function<std::vector<uint8_t>()> holders = AskSharedLanes(
      s, keys, from, n, start + uint64_t{budget_us} * 1000,
                 [busy, stats, start, budget_us, from, answered = std::move(answered)](std::vector<uint8_t> holder) mutable {
                   busy->fetch_sub(1, std::memory_order_relaxed);
                   const uint64_t took = MonotonicNanos() - start;
                   stats->remote_probe_latency.Record(took);
                   // Past the budget it counts as late; what it did confirm
                   // is still true (a tier answers "absent" for what it
                   // could not check in time).
                   if (took > uint64_t{budget_us} * 1000) stats->remote_probes_late.Add();
                   std::move(answered)(SharedAnswer{.from = from, .holder = std::move(holder)});
                 });
  if (so_far != nullptr) {
    *so_far = [holders = std::move(holders), from] { return SharedAnswer{.from = from, .holder = holders()}; };
  }
  return true;
}

uint32_t BlockStore::ProbeShared(SessionHoldings& s, std::span<const BlockKey> keys, size_t from) {
  const size_t n = SharedProbeBlocks(s, keys, from);
  if (n == 0) return 0;
  struct Done {
    std::atomic<uint32_t>& n;
    ~Done() { n.fetch_sub(1, std::memory_order_relaxed); }
  } done_probing{books_.tenants[s.ns.tenant]->shared_probes};
  const uint32_t budget_us = shared_budget_us_.load(std::memory_order_relaxed);
  // The answer may come after the budget: it then lands in state nobody
  // waits on any more.
  struct Answer {
    Mutex mu;
    std::condition_variable_any cv;
    bool done ABSL_GUARDED_BY(mu) = false;
    std::vector<uint8_t> holder ABSL_GUARDED_BY(mu);
  };
  auto answer = std::make_shared<Answer>();
  const uint64_t start = MonotonicNanos();
  std::function<std::vector<uint8_t>()> so_far =
      AskSharedLanes(s, keys, from, n, start + uint64_t{budget_us} * 1000, [answer](std::vector<uint8_t> holder) {
        {
          MutexLock l(&answer->mu);
          answer->holder = std::move(holder);
          answer->done = true;
        }
        answer->cv.notify_all();
      });
  std::vector<uint8_t> holder;
  {
    MutexLock l(&answer->mu);
    if (!answer->mu.AwaitFor(answer->cv, std::chrono::microseconds(budget_us),
                             [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return answer->done; })) {
      books_.stats->remote_probes_late.Add();
      books_.stats->remote_probe_latency.Record(MonotonicNanos() - start);
      // What the tiers that answered in time say still counts; with none,
      // a miss: the local tiers' answer stands.
      holder = so_far();
    } else {
      holder = std::move(answer->holder);
      books_.stats->remote_probe_latency.Record(MonotonicNanos() - start);
    }
  }
  return AdoptShared(s, keys, from, holder);
}

uint32_t BlockStore::AdoptShared(SessionHoldings& s, std::span<const BlockKey> keys, size_t from,
                                 const std::vector<uint8_t>& holder) {
  if (shared_lanes_.empty()) return 0;
  const size_t n = std::min(holder.size(), keys.size() - std::min(from, keys.size()));
  size_t run = 0;
  while (run < n && IsSharedLane(holder[run])) ++run;
  if (run == 0) return 0;
  books_.stats->remote_probe_found.Add(run);

  // Index the run as copies in the lanes that hold them. A key indexed
  // meanwhile (a store of another session) is left to its record: the
  // probe after this one sees whichever copy it has.
  // No more in one lane than it holds: a run longer than that would evict
  // its own first blocks to make room for its last, and a prefix needs the
  // first.
  std::array<size_t, kMaxLowerTiers> taken{};
  // Each record costs this node memory: a tenant indexes at most its bound,
  // over every shared lane together.
  uint64_t records = 0;
  for (uint8_t i : shared_lanes_) {
    const LowerLane& lane = *books_.lanes[i];
    MutexLock ll(&lane.mu);
    records += lane.use(s.ns.tenant).blocks;
  }
  uint32_t adopted = 0;
  for (size_t i = 0; i < run; ++i) {
    LowerLane& lane = *books_.lanes[holder[i]];
    const uint64_t slot_bytes = std::max<uint64_t>(lane.tier->CostFor(s.ns.block_bytes), 1);
    if (++taken[lane.index] > lane.tier->Usage().capacity_bytes / slot_bytes) break;
    if (records + adopted >= opts_.shared_records_per_tenant) {
      books_.stats->remote_adoptions_refused.Add(run - i);
      break;
    }
    MutexLock ll(&lane.mu);
    const BlockKey& key = keys[from + i];
    BlockRecord* r = books_.index.NewRecord(s.ns.handle, key);
    r->tenant = s.ns.tenant;
    r->state = BlockState::kNone;
    r->lower = lane.index;
    r->lower_state = LowerState::kReady;
    r->depth = static_cast<uint16_t>(std::min<size_t>(from + i, kUnknownDepth - 1));
    absl::StatusOr<SlotHandle> slot = migrator_.AllocateLowerSlotLocked(lane, r, s.ns.block_bytes);
    if (!slot.ok()) {
      books_.index.FreeRecord(r);
      break;
    }
    r->lower_slot = *slot;
    bool indexed = false, other_visible = false;
    {
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      if (const BlockRecord* other = BlockIndex::Find(sh, r->ns, r->key); other == nullptr) {
        books_.index.Insert(sh, r);
        indexed = true;
      } else {
        other_visible = other->visible();
      }
    }
    if (!indexed) {
      books_.FreeLowerSlotLocked(lane, r, *slot);
      books_.index.FreeRecord(r);
      // A store still being written ends the prefix a lookup can see:
      // blocks past it would be handles no lookup reaches.
      if (!other_visible) break;
      continue;
    }
    books_.CountRecords(r->ns, +1);
    lane.ReadyLocked(*slot, PolicyKeyOf(*r), PositionOf(*r, s.ns.block_tokens));
    ++adopted;
  }
  return adopted;
}

void BlockStore::QueuePublishLocked(SessionHoldings& s, BlockRecord* r) {
  // A copy in a shared lane is there already.
  if (r->published || r->publishing || (r->lower_state != LowerState::kNone && IsSharedLane(r->lower))) return;
  if (r->io_refs >= kMaxClientIoRefs || s.publish_pending.size() >= opts_.shared_probe_max_blocks ||
      s.ns.block_bytes < opts_.shared_min_block_bytes || Migrator::PublishPaused(*books_.tenants[s.ns.tenant])) {
    books_.stats->remote_publishes_skipped.Add();
    return;
  }
  ++r->io_refs;  // Publish takes it over
  r->publishing = true;
  s.publish_pending.push_back(r);
}

void BlockStore::StartPublishes(SessionHoldings& s) {
  if (s.publish_pending.empty()) return;
  HostResidency& t = *books_.tenants[s.ns.tenant];
  // The first shared tier takes publishes; the next ones get what the
  // cascade moves down to them.
  LowerLane& lane = *books_.lanes[shared_lanes_.front()];
  for (BlockRecord* r : s.publish_pending) migrator_.Publish(t, r, lane);
  s.publish_pending.clear();
}

void BlockStore::AfterReply(SessionHoldings& s) {
  // The lookup's uses count before its publishes ask the shared tier's gate.
  const bool observe = s.observe_pending;
  s.observe_pending = false;
  if (observe && books_.reuse != nullptr) {
    for (uint64_t k : s.last_chain) books_.reuse->Record(k);
  }
  StartPublishes(s);
  if (!observe || !adaptive_) return;
  HostResidency& t = *books_.tenants[s.ns.tenant];
  AdaptivePolicy* a;
  {
    // Policies live as long as the cache: the pointer outlives the lock.
    MutexLock l(&t.mu);
    a = static_cast<AdaptivePolicy*>(t.PolicyForLocked(t.host->SlotSizeFor(s.ns.block_bytes))->inner());
  }
  a->Observe(s.last_chain, s.ns.block_tokens);  // on the shadows' own lock, not the tier's
}

}  // namespace kvtier
