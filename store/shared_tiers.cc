// SPDX-License-Identifier: Apache-2.0
// The shared tiers' side of the store (shared_tiers.h): the probe past a
// lookup's local prefix, adopting what it found, and the write policy's
// publishes.
#include "store/shared_tiers.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <chrono>
#include <condition_variable>

#include "core/mutex.h"
#include "store/block_store.h"
#include "store/migrator.h"

namespace kvtier {

SharedTiers::SharedTiers(StoreBooks& books, Migrator& migrator, const Options& opts)
    : books_(books), migrator_(migrator), opts_(opts), budget_us_(opts.probe_budget_us), writes_(opts.writes) {}

size_t SharedTiers::ProbeBlocks(SessionHoldings& s, std::span<const BlockKey> keys, size_t from) {
  const uint32_t budget_us = budget_us_.load(std::memory_order_relaxed);
  if (lanes_.empty() || budget_us == 0 || from >= keys.size()) return 0;
  if (s.ns.block_bytes == 0 || s.ns.block_bytes < opts_.min_block_bytes ||
      std::none_of(lanes_.begin(), lanes_.end(),
                   [&](uint8_t i) { return s.ns.block_bytes <= books_.lanes[i]->tier->max_block_bytes(); })) {
    return 0;
  }
  const size_t n = std::min<size_t>(keys.size() - from, opts_.probe_max_blocks);
  if (n == 0) return 0;
  HostResidency& tenant = *books_.tenants[s.ns.tenant];
  // A flood of probes costs the flooder: past its rate its lookups end at
  // the local prefix, and the cluster every tenant shares never sees them.
  if (!tenant.TakeProbeBlocks(static_cast<uint32_t>(n), opts_.probe_blocks_per_s)) {
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

std::vector<BlockMeta> SharedTiers::ProbeMetas(const SessionHoldings& s, std::span<const BlockKey> keys, size_t from,
                                               size_t n) const {
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
    std::vector<uint8_t> holder(n, SharedTiers::kNoLane);
    MutexLock l(&mu);
    for (size_t k = 0; k < n; ++k) {
      for (size_t q = 0; q < lanes.size() && holder[k] == SharedTiers::kNoLane; ++q) {
        if (k < present[q].size() && present[q][k]) holder[k] = lanes[q];
      }
    }
    return holder;
  }
};

}  // namespace

std::function<std::vector<uint8_t>()> SharedTiers::Ask(
    const SessionHoldings& s, std::span<const BlockKey> keys, size_t from, size_t n, uint64_t deadline_ns,
    absl::AnyInvocable<void(std::vector<uint8_t>) &&> answered) {
  // Every shared lane that takes blocks of this size is asked at once; the
  // answers meet here, and the first lane in the chain that holds a block
  // is its holder (the nearer tier, as a load would want).
  auto meet = std::make_shared<SharedMeet>();
  for (uint8_t i : lanes_) {
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
  const std::vector<BlockMeta> metas = ProbeMetas(s, keys, from, n);
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

uint32_t SharedTiers::ProbeAndAdopt(SessionHoldings& s, std::span<const BlockKey> keys, size_t from) {
  const size_t n = ProbeBlocks(s, keys, from);
  if (n == 0) return 0;
  struct Done {
    std::atomic<uint32_t>& n;
    ~Done() { n.fetch_sub(1, std::memory_order_relaxed); }
  } done_probing{books_.tenants[s.ns.tenant]->shared_probes};
  const uint32_t budget_us = budget_us_.load(std::memory_order_relaxed);
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
      Ask(s, keys, from, n, start + uint64_t{budget_us} * 1000, [answer](std::vector<uint8_t> holder) {
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
  return Adopt(s, keys, from, holder);
}

uint32_t SharedTiers::Adopt(SessionHoldings& s, std::span<const BlockKey> keys, size_t from,
                           const std::vector<uint8_t>& holder) {
  if (lanes_.empty()) return 0;
  const size_t n = std::min(holder.size(), keys.size() - std::min(from, keys.size()));
  size_t run = 0;
  while (run < n && IsShared(holder[run])) ++run;
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
  for (uint8_t i : lanes_) {
    const LowerLane& lane = *books_.lanes[i];
    MutexLock ll(&lane.mu);
    records += lane.use(s.ns.tenant).blocks;
  }
  uint32_t adopted = 0;
  for (size_t i = 0; i < run; ++i) {
    LowerLane& lane = *books_.lanes[holder[i]];
    const uint64_t slot_bytes = std::max<uint64_t>(lane.tier->CostFor(s.ns.block_bytes), 1);
    if (++taken[lane.index] > lane.tier->Usage().capacity_bytes / slot_bytes) break;
    if (records + adopted >= opts_.records_per_tenant) {
      books_.stats->remote_adoptions_refused.Add(run - i);
      break;
    }
    MutexLock ll(&lane.mu);
    const BlockKey& key = keys[from + i];
    BlockRecord* r = books_.index.NewRecord(s.ns.handle, key);
    if (r == nullptr) break;  // the index is full: not adopted, as when the lane has no room
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

void SharedTiers::QueuePublishLocked(SessionHoldings& s, BlockRecord* r) {
  // A copy in a shared lane is there already.
  if (r->published || r->publishing || (r->lower_state != LowerState::kNone && IsShared(r->lower))) return;
  if (r->io_refs >= kMaxClientIoRefs || s.publish_pending.size() >= opts_.probe_max_blocks ||
      s.ns.block_bytes < opts_.min_block_bytes || PublishPaused(*books_.tenants[s.ns.tenant])) {
    books_.stats->remote_publishes_skipped.Add();
    return;
  }
  ++r->io_refs;  // Publish takes it over
  r->publishing = true;
  s.publish_pending.push_back(r);
}

void SharedTiers::StartPublishes(SessionHoldings& s) {
  if (s.publish_pending.empty()) return;
  HostResidency& t = *books_.tenants[s.ns.tenant];
  // The first shared tier takes publishes; the next ones get what the
  // cascade moves down to them.
  LowerLane& lane = *books_.lanes[lanes_.front()];
  for (BlockRecord* r : s.publish_pending) Publish(t, r, lane);
  s.publish_pending.clear();
}

void SharedTiers::Publish(HostResidency& t, BlockRecord* r, LowerLane& lane) {
  uint64_t offset = 0;
  bool go;
  {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    go = !r->removed && r->state == BlockState::kReady && !r->published;
    offset = r->arena_offset();
    if (!go) r->publishing = false;
  }
  // Clears r->publishing after a write that did not start or ended.
  auto done_with = [this](BlockRecord* r, bool published) {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->publishing = false;
    if (published) r->published = true;
  };
  const BlockMeta meta = books_.MetaOf(r);
  if (go && (meta.payload_bytes > lane.tier->max_block_bytes() || meta.payload_bytes < opts_.min_block_bytes)) go = false;
  const bool admitted = !go || books_.Admits(lane, r);
  if (!admitted) go = false;
  if (go && publishing_.fetch_add(1, std::memory_order_relaxed) >= kMaxPublishing) {
    publishing_.fetch_sub(1, std::memory_order_relaxed);
    go = false;
  }
  if (!go) {
    done_with(r, false);
    // Each refusal counted once, by why (the metric sums them).
    (admitted ? books_.stats->remote_publishes_skipped : books_.stats->remote_publishes_not_admitted).Add();
    books_.ReleaseIoRef(t, r);
    return;
  }
  // Put by key alone, not counted against the lane's capacity (which this
  // node's own copies fill, evicting only on demand): the value stays in
  // the cluster, and the lane keeps no handle on it.
  assert(lane.keyed());  // AttachLowerTier takes a shared tier only addressed by key
  if (absl::StatusOr<BlockLocator> at = lane.tier->Reserve(meta); !at.ok()) {
    publishing_.fetch_sub(1, std::memory_order_relaxed);
    done_with(r, false);
    PausePublishes(t);
    books_.stats->remote_publishes_failed.Add();
    books_.ReleaseIoRef(t, r);
    return;
  }
  // The io_ref keeps the host slot (and so the bytes at offset) until the
  // write has copied them; a tier copies them before Put returns.
  lane.tier->Put(kKeyAddressed, meta, {t.host->arena_base() + offset, meta.payload_bytes}, IoOptions{IoPriority::kDemote},
                 [this, &t, r, done_with](absl::Status s) {
                     done_with(r, s.ok());
                     if (!s.ok()) PausePublishes(t);
                     (s.ok() ? books_.stats->remote_publishes : books_.stats->remote_publishes_failed).Add();
                     publishing_.fetch_sub(1, std::memory_order_relaxed);
                     books_.ReleaseIoRef(t, r);
                   });
}

void SharedTiers::PausePublishes(HostResidency& t) {
  t.publish_paused_until_ns.store(MonotonicNanos() + kPublishPauseNs, std::memory_order_relaxed);
}

}  // namespace kvtier
