// SPDX-License-Identifier: Apache-2.0
// The store's operations: tenants and the chain's assembly (with the blocks a
// lower tier recovered); lookups, leases, loads, prefetch and invalidation.
// Stores are in block_writes.cc, the reclaimer's pass and the admin changes
// to host residency in block_host.cc, the read-only reports in
// block_reports.cc. Every move between tiers is the Migrator's (migrator.h);
// host slots and the victims that make room for them are each tenant's
// HostResidency's (host_room.cc), which hands each victim to the migrator
// to move. The books they share with this class, and a record's life, are
// StoreBooks'.
#include "store/block_store.h"

#include "core/checked.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "core/fan_in.h"
#include "core/status.h"
#include "core/units.h"
#include "policies/adaptive_policy.h"
#include "spdlog/spdlog.h"

namespace kvtier {

BlockStore::BlockStore(const Options& opts, DaemonStats* stats)
    : opts_(opts),
      adaptive_(opts.policy == "adaptive"),
      observes_(IsHostOnlyPolicy(opts.policy)),
      books_(stats, opts.cost),
      migrator_(books_,
                {.cascade_high = opts.cascade_high,
                 .cascade_low = opts.cascade_low,
                 .shared_min_block_bytes = opts.shared_min_block_bytes}),
      shared_(books_, migrator_,
              {.probe_budget_us = opts.shared_probe_budget_us,
               .writes = opts.shared_writes,
               .probe_max_blocks = opts.shared_probe_max_blocks,
               .probe_blocks_per_s = opts.shared_probe_blocks_per_s,
               .records_per_tenant = opts.shared_records_per_tenant,
               .min_block_bytes = opts.shared_min_block_bytes}),
      reclaimer_({opts.high_watermark, opts.low_watermark}, [this](Reclaimer::Marks) { ReclaimPass(); }) {}

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Create(const Options& opts, DaemonStats* stats) {
  RETURN_IF_ERROR(MakeEvictionPolicy(opts.policy).status());
  RETURN_IF_ERROR(MakeEvictionPolicy(opts.nvme_policy).status());
  if (IsHostOnlyPolicy(opts.nvme_policy)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the NVMe tier's policy cannot be ", opts.nvme_policy, " (it learns from host lookups)"));
  }
  for (uint32_t m : {opts.nvme_admission_min_uses, opts.shared_admission_min_uses}) {
    if (m < 1 || m > 15) {
      return absl::InvalidArgumentError(
          absl::StrCat("an admission threshold of ", m, " uses: give 1 (admit every block) to 15"));
    }
  }
  return std::unique_ptr<BlockStore>(new BlockStore(opts, stats));
}

BlockStore::~BlockStore() {
  StopBackgroundReclaim();
  migrator_.StopCascade();
  // Drain the lower tiers' I/O and journal callbacks while everything they
  // touch lives, every lane included: a failed write's callback frees its
  // slot through its lane. A landed demotion may start a waiting
  // promotion's read in lane 0 from lane 0's own drain: twice round.
  // Then delete the tiers, the last first.
  for (int round = 0; round < 2; ++round) {
    for (auto& lane : books_.lanes) lane->tier->Drain();
  }
  while (!books_.lanes.empty()) {
    // Delete the tier before clearing the pointer: ops it gives up in its
    // destructor complete through lane->tier (a failed read drops its slot).
    std::unique_ptr<BlockTier>& tier = books_.lanes.back()->tier;
    tier.get_deleter()(tier.get());
    (void)tier.release();
    books_.lanes.pop_back();
  }
}

void BlockStore::SetEvents(KvEvents* events) {
  books_.events = events;
  for (size_t i = 0; i < books_.tenants.size(); ++i) {
    HostResidency& t = *books_.tenants[i];
    MutexLock l(&t.mu);
    t.events = events;
    t.index = static_cast<uint16_t>(i);
    if (t.gpu) t.gpu->SetEvents(events, static_cast<uint16_t>(i));
  }
}

absl::StatusOr<uint16_t> BlockStore::AddTenant(std::string name, std::unique_ptr<HostTier> host, TenantQuota quota,
                                               std::unique_ptr<GpuCache> gpu) {
  if (books_.tenants.size() >= UINT16_MAX) return absl::ResourceExhaustedError("too many tenants");
  const uint64_t hash = TenantHash(name);
  auto t = std::make_unique<HostResidency>(std::move(name), hash, std::move(host), std::move(gpu), quota, opts_.policy,
                                           &books_.index,
                                           HostResidency::Room{.evictor = &migrator_, .stats = books_.stats, .reclaimer = &reclaimer_});
  for (auto& lane : books_.lanes) {
    MutexLock nl(&lane->mu);
    lane->GrowTenantsLocked(books_.tenants.size() + 1);
  }
  books_.tenant_by_hash[t->hash] = static_cast<uint16_t>(books_.tenants.size());
  books_.tenants.push_back(std::move(t));
  return static_cast<uint16_t>(books_.tenants.size() - 1);
}

std::vector<BlockRecord*> BlockStore::FindAll(uint32_t ns, std::span<const BlockKey> keys) {
  std::vector<BlockRecord*> out(keys.size(), nullptr);
  for (size_t i = 0; i < keys.size(); ++i) {
    BlockIndex::Shard& sh = books_.index.ShardFor(ns, keys[i]);
    MutexLock l(&sh.mu);
    out[i] = BlockIndex::Find(sh, ns, keys[i]);
  }
  return out;
}

void BlockStore::NoteChain(SessionHoldings& s, std::span<const BlockKey> keys, bool lease, bool ask, size_t held) {
  // A request's uses are what it leased (to load) and what it stored: an
  // unleased ask's blocks may never be loaded, or be loaded after more
  // were stored; the lease that follows it counts what is. An unleased
  // ask leaves the last lease's chain alone (its store skips those).
  if (lease) {
    s.last_chain.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) s.last_chain[i] = PolicyKeyOf(s.ns.handle, keys[i]);
    s.uses_pending = !keys.empty() && books_.reuse != nullptr;
  }
  s.observe_pending = ask && !keys.empty() && observes_;
  if (!s.observe_pending) return;
  s.ask_held = held;
  if (lease) {
    s.ask_chain = s.last_chain;
  } else {
    s.ask_chain.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) s.ask_chain[i] = PolicyKeyOf(s.ns.handle, keys[i]);
  }
}

absl::Status BlockStore::LeaseRoomFor(const SessionHoldings& s, size_t blocks) {
  if (s.leases.size() >= opts_.max_leases_per_session) {
    return CodedStatus(KVTIER_EBUSY, absl::StrCat("this session holds ", s.leases.size(),
                                                  " leases (ipc.max_leases_per_session); release some"));
  }
  if (s.pinned_blocks.load(std::memory_order_relaxed) + blocks > opts_.max_leased_blocks_per_session) {
    books_.stats->Refused(Refusal::kSessionLeasedBlocks);
    return CodedStatus(KVTIER_EBUSY,
                       absl::StrCat("this session's leases hold ", s.pinned_blocks.load(std::memory_order_relaxed),
                                    " blocks and this lookup asks for ", blocks, " more (",
                                    "limits.leased_blocks_per_session = ", opts_.max_leased_blocks_per_session,
                                    "); release some leases"));
  }
  return absl::OkStatus();
}

void BlockStore::ChainHits::Append(ChainHits&& more) {
  hit = more.hit;
  for (size_t i = 0; i < by_lane.size(); ++i) by_lane[i] += more.by_lane[i];
  cut_for_cost = more.cut_for_cost;
  lower_pinned_bytes += more.lower_pinned_bytes;
  pinned.insert(pinned.end(), more.pinned.begin(), more.pinned.end());
  host_touch.insert(host_touch.end(), more.host_touch.begin(), more.host_touch.end());
  lower_touch.insert(lower_touch.end(), more.lower_touch.begin(), more.lower_touch.end());
}

BlockStore::ChainHits BlockStore::ProbeChain(SessionHoldings& s, std::span<const BlockKey> keys, bool lease,
                                             std::span<BlockLocation> out, size_t from) {
  HostResidency& t = *books_.tenants[s.ns.tenant];
  ChainHits h;
  h.hit = static_cast<uint32_t>(from);
  // Hits in host memory go up to the shared tier too on write_policy "reused".
  const bool publish_hits =
      lease && shared_.Publishes(SharedWrites::kReused);
  // Probes are memory-bound: prefetch a window of keys ahead so their cache
  // misses overlap instead of queueing behind one another.
  constexpr size_t kWindow = 16;
  std::array<BlockIndex::Shard*, kWindow> shard_of{};
  auto prefetch = [&](size_t i) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    BlockIndex::Shard& sh = books_.index.ShardFor(s.ns.handle, keys[i]);
    shard_of[i % kWindow] = &sh;
    MutexLock l(&sh.mu);
    BlockIndex::Prefetch(sh, s.ns.handle, keys[i]);
  };
  for (size_t i = from; i < std::min(from + kWindow, keys.size()); ++i) prefetch(i);
  for (size_t i = from; i < keys.size(); ++i) {
    BlockIndex::Shard& sh = *shard_of[i % kWindow];
    {
      MutexLock l(&sh.mu);
      BlockRecord* r = BlockIndex::Find(sh, s.ns.handle, keys[i]);
      if (r == nullptr || !r->visible()) break;
      const bool in_host = r->state == BlockState::kReady;
      // A copy below host memory is priced at the speed of the tier it is in.
      if (!in_host && books_.cost.RecomputeBeats(uint8_t{r->lower}, i * s.ns.block_tokens, s.ns.block_tokens,
                                           s.ns.block_bytes, s.ns.tp_size)) {
        h.cut_for_cost = true;
        break;
      }
      // A pin on a block only NVMe holds keeps it there: within the
      // tenant's fair share of NVMe, so its pins cannot leave another
      // tenant within its own share nothing to evict.
      uint64_t lower_cost = 0;
      if (lease && !in_host && r->lower == 0 && !books_.lanes.empty()) {
        const LowerLane& lane = *books_.lanes[0];
        if (!lane.tier->shared()) {
          lower_cost = lane.tier->CostFor(s.ns.block_bytes);
          if (t.lower_pinned_bytes.load(std::memory_order_relaxed) + h.lower_pinned_bytes + lower_cost >
              lane.fair_share_bytes) {
            books_.stats->pins_refused_fair_share.Add();
            break;
          }
        }
      }
      out[i] = in_host ? BlockLocation{TierKind::kHost, r->arena_offset(), false}
                       : BlockLocation{books_.LaneOf(r).tier->kind(), 0, false, false, r->lower};
      h.lower_pinned_bytes += lower_cost;
      if (!in_host) ++h.by_lane[r->lower];
      if (lease) {
        if (r->pins++ == 0) t.pinned.fetch_add(1, std::memory_order_relaxed);
        h.pinned.push_back(r);
        if (in_host) h.host_touch.push_back(r->host_slot);
        if (in_host && publish_hits) shared_.QueuePublishLocked(s, r);
        if (r->lower_state == LowerState::kReady) h.lower_touch.push_back({r->lower, r->lower_slot, r});
      }
    }
    ++h.hit;
    if (i + kWindow < keys.size()) prefetch(i + kWindow);
  }
  for (size_t i = h.hit; i < keys.size(); ++i) out[i] = BlockLocation{};
  return h;
}

uint32_t BlockStore::MarkRecompute(const SessionHoldings& s, std::span<const BlockKey> keys, size_t from,
                                   std::span<BlockLocation> out) {
  // Present, but the engine is better off computing them: say so, so it
  // neither waits for them nor counts them as misses.
  uint32_t n = 0;
  for (size_t i = from; i < keys.size(); ++i) {
    BlockIndex::Shard& sh = books_.index.ShardFor(s.ns.handle, keys[i]);
    MutexLock l(&sh.mu);
    BlockRecord* r = BlockIndex::Find(sh, s.ns.handle, keys[i]);
    if (r == nullptr || !r->visible()) break;
    const bool in_host = r->state == BlockState::kReady;
    out[i] = BlockLocation{in_host ? TierKind::kHost : books_.LaneOf(r).tier->kind(), 0, false, true,
                           in_host ? kNoLane : static_cast<uint8_t>(r->lower)};
    ++n;
  }
  return n;
}

void BlockStore::TouchHits(HostResidency& t, const ChainHits& hits) {
  if (!hits.host_touch.empty()) {
    // Pinned blocks keep their host slots, so these handles are stable.
    MutexLock l(&t.mu);
    // Leaves first, the root last: a parent is then always more recent than
    // its children, and recency-ordered policies evict leaves first (a block
    // whose parent is gone can never be hit).
    for (auto h = hits.host_touch.rbegin(); h != hits.host_touch.rend(); ++h) {
      t.PolicyForLocked(t.host->SlotBytes(*h))->Touch(*h);
      t.slots.Touch(*h);
    }
  }
  // Leaves first, as above; a copy that moved down a tier since (the
  // cascade) is no longer that slot's owner and is left alone.
  for (auto h = hits.lower_touch.rbegin(); h != hits.lower_touch.rend();) {
    LowerLane& lane = *books_.lanes[h->lane];
    MutexLock l(&lane.mu);
    for (; h != hits.lower_touch.rend() && h->lane == lane.index; ++h) {
      if (auto o = lane.owner.find(h->slot); o != lane.owner.end() && o->second == h->r) lane.policy->Touch(h->slot);
    }
  }
}

absl::StatusOr<uint32_t> BlockStore::Lookup(SessionHoldings& s, std::span<const BlockKey> keys, bool lease,
                                            uint64_t* lease_id, std::span<BlockLocation> out, uint32_t* recompute,
                                            const SharedAnswer* shared, Ask ask) {
  *lease_id = 0;
  if (recompute != nullptr) *recompute = 0;
  if (lease) RETURN_IF_ERROR(LeaseRoomFor(s, keys.size()));
  ChainHits h = ProbeChain(s, keys, lease, out);
  // Where the local tiers end the prefix, the shared tier may go on: with
  // the answer the session asked for, or asked now. An answer for a prefix
  // that has moved since still indexes what the tier holds; the chain then
  // reaches those blocks or not as the local prefix allows; an answer for
  // keys past a prefix that shrank since is dropped (no lookup reaches them).
  if (!h.cut_for_cost && h.hit < keys.size() &&
      (shared != nullptr ? (shared->from <= h.hit && shared_.Adopt(s, keys, shared->from, shared->holder) > 0)
                         : shared_.ProbeAndAdopt(s, keys, h.hit) > 0)) {
    h.Append(ProbeChain(s, keys, lease, out, h.hit));
  }
  const bool asks = ask == Ask::kYes || (ask == Ask::kIfLeased && lease);
  if (h.cut_for_cost) {
    const uint32_t n = MarkRecompute(s, keys, h.hit, out);
    if (asks) books_.stats->blocks_recompute.Add(n);
    if (recompute != nullptr) *recompute = n;
  }
  if (!asks) {
    if (!lease) {
      books_.stats->probes.Add();
      return h.hit;
    }
    // Its request's ask came before: the policies and counters learned
    // from that; this lease counts its blocks' uses and pins them.
    NoteChain(s, keys, /*lease=*/true, /*ask=*/false, /*held=*/h.hit);
    return LeaseHits(s, h, lease_id);
  }
  books_.stats->lookups.Add();
  books_.stats->blocks_queried.Add(keys.size());
  books_.stats->tokens_queried.Add(keys.size() * s.ns.block_tokens);
  HostResidency::Hits& th = books_.tenants[s.ns.tenant]->hits;
  constexpr auto kRelaxed = std::memory_order_relaxed;
  th.lookups.fetch_add(1, kRelaxed);
  th.blocks_queried.fetch_add(keys.size(), kRelaxed);
  th.tokens_queried.fetch_add(keys.size() * s.ns.block_tokens, kRelaxed);
  NoteChain(s, keys, lease, /*ask=*/true, h.hit);
  if (h.hit == 0) return 0u;
  books_.stats->lookup_hits.Add();
  books_.stats->blocks_hit.Add(h.hit);
  // Hits below host memory: each lane's own, and the local and shared sums.
  uint32_t in_local = 0, in_shared = 0;
  for (size_t i = 0; i < books_.lanes.size(); ++i) {
    if (h.by_lane[i] == 0) continue;
    books_.lanes[i]->hits.fetch_add(h.by_lane[i], kRelaxed);
    th.blocks_hit_lane[i].fetch_add(h.by_lane[i], kRelaxed);
    (shared_.IsShared(static_cast<uint8_t>(i)) ? in_shared : in_local) += h.by_lane[i];
  }
  books_.stats->blocks_hit_local.Add(in_local);
  books_.stats->blocks_hit_shared.Add(in_shared);
  books_.stats->tokens_hit.Add(uint64_t{h.hit} * s.ns.block_tokens);
  th.lookup_hits.fetch_add(1, kRelaxed);
  th.blocks_hit.fetch_add(h.hit, kRelaxed);
  th.tokens_hit.fetch_add(uint64_t{h.hit} * s.ns.block_tokens, kRelaxed);
  return lease ? LeaseHits(s, h, lease_id) : h.hit;
}

uint32_t BlockStore::LeaseHits(SessionHoldings& s, ChainHits& h, uint64_t* lease_id) {
  if (h.hit == 0) return 0u;
  TouchHits(*books_.tenants[s.ns.tenant], h);
  *lease_id = s.next_id++;
  if (h.lower_pinned_bytes != 0) {
    books_.tenants[s.ns.tenant]->lower_pinned_bytes.fetch_add(h.lower_pinned_bytes, std::memory_order_relaxed);
    s.lease_lower_bytes[*lease_id] = h.lower_pinned_bytes;
  }
  s.leases.emplace(*lease_id, std::move(h.pinned));
  s.lease_count.fetch_add(1, std::memory_order_relaxed);
  s.pinned_blocks.fetch_add(h.hit, std::memory_order_relaxed);
  return h.hit;
}

absl::StatusOr<std::vector<BlockRecord*>> BlockStore::LeasedRecords(const SessionHoldings& s, uint64_t lease_id,
                                                                     std::span<const BlockKey> keys) {
  auto it = s.leases.find(lease_id);
  if (it == s.leases.end()) {
    return CodedStatus(KVTIER_ENOENT,
                       absl::StrCat("unknown lease ", lease_id, ": released already, or not taken by this session"));
  }
  const std::vector<BlockRecord*>& held = it->second;
  std::vector<BlockRecord*> recs(keys.size());
  absl::flat_hash_map<BlockKey, BlockRecord*> by_key;  // built only when keys are not the lease's order
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i < held.size() && held[i]->key == keys[i]) {
      recs[i] = held[i];
      continue;
    }
    if (by_key.empty()) {
      for (BlockRecord* h : held) by_key.emplace(h->key, h);
    }
    auto f = by_key.find(keys[i]);
    if (f == by_key.end()) {
      return CodedStatus(KVTIER_EINVAL, absl::StrCat("key ", i, " of the load is not pinned by lease ", lease_id,
                                                     "; load only what lookup returned"));
    }
    recs[i] = f->second;
  }
  return recs;
}

void BlockStore::FinishLoad(LoadOutcome& o, const std::vector<uint8_t>& ok, uint64_t block_bytes) {
  o.loaded = static_cast<uint32_t>(o.locations.size());
  for (size_t i = 0; i < ok.size(); ++i) {
    if (!ok[i]) {
      o.loaded = static_cast<uint32_t>(i);
      break;
    }
  }
  for (size_t i = o.loaded; i < o.locations.size(); ++i) o.locations[i] = BlockLocation{};
  if (o.loaded < o.locations.size()) {
    books_.stats->load_failures.Add(o.locations.size() - o.loaded);
    o.status = CodedStatus(KVTIER_EIO, absl::StrCat("block ", o.loaded,
                                                    " could not be brought back from NVMe (a failed checksum or "
                                                    "I/O error drops it; or the host tier had no room); recompute "
                                                    "it and what follows"));
  }
  books_.stats->loads.Add();
  books_.stats->blocks_loaded.Add(o.loaded);
  books_.stats->bytes_loaded.Add(uint64_t{o.loaded} * block_bytes);
}

std::optional<LoadOutcome> BlockStore::Load(SessionHoldings& s, uint64_t lease_id, std::span<const BlockKey> keys,
                                            LoadCallback done) {
  absl::StatusOr<std::vector<BlockRecord*>> leased = LeasedRecords(s, lease_id, keys);
  if (!leased.ok()) return LoadOutcome{{}, 0, leased.status()};
  const std::vector<BlockRecord*>& recs = *leased;
  // Fast path: every block already in host memory (pinned: it stays there).
  LoadOutcome outcome;
  outcome.locations.resize(keys.size());
  std::vector<size_t> to_promote;
  for (size_t i = 0; i < recs.size(); ++i) {
    BlockIndex::Shard& sh = books_.index.ShardFor(recs[i]);
    MutexLock l(&sh.mu);
    if (recs[i]->state == BlockState::kReady) {
      outcome.locations[i] = BlockLocation{TierKind::kHost, recs[i]->arena_offset(), false};
    } else {
      to_promote.push_back(i);
    }
  }
  const uint64_t block_bytes = s.ns.block_bytes;
  if (to_promote.empty()) {
    FinishLoad(outcome, std::vector<uint8_t>(keys.size(), 1), block_bytes);
    return outcome;
  }
  // Slow path: promote the NVMe-only blocks; the last one to land finishes.
  struct Promoted {
    LoadOutcome outcome;
    std::vector<uint8_t> ok;
  };
  auto fan = FanIn<Promoted>::Make(
      to_promote.size() + 1,  // +1 until every promotion is started
      Promoted{std::move(outcome), std::vector<uint8_t>(keys.size(), 1)},
      [this, block_bytes, done = std::move(done)](Promoted p) mutable {
        FinishLoad(p.outcome, p.ok, block_bytes);
        std::move(done)(std::move(p.outcome));
      });
  HostResidency& t = *books_.tenants[s.ns.tenant];
  for (size_t i : to_promote) {
    BlockRecord* r = recs[i];
    const uint64_t parent = i > 0 ? PolicyKeyOf(s.ns.handle, keys[i - 1]) : 0;
    migrator_.Promote(t, r, IoPriority::kLoad, [this, fan, i, r](bool ok) {
      fan->With([&](Promoted& p) {
        p.ok[i] = ok;
        if (ok) {
          BlockIndex::Shard& sh = books_.index.ShardFor(r);
          MutexLock sl(&sh.mu);
          p.outcome.locations[i] = BlockLocation{TierKind::kHost, r->arena_offset(), false};
        }
      });
      fan->Arrive();
    }, parent);
  }
  books_.stats->promotions_for_load.Add(to_promote.size());
  fan->Arrive();  // the +1
  return std::nullopt;
}

void BlockStore::Unpin(SessionHoldings& s, const std::vector<BlockRecord*>& blocks) {
  HostResidency& t = *books_.tenants[s.ns.tenant];
  std::vector<BlockRecord*> to_destroy;
  for (BlockRecord* r : blocks) {
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    MutexLock sl(&sh.mu);
    if (--r->pins == 0) {
      t.pinned.fetch_sub(1, std::memory_order_relaxed);
      if (r->removed && r->io_refs == 0) to_destroy.push_back(r);
    }
  }
  if (!to_destroy.empty()) {
    // Out of the index and unreferenced: nobody else can reach these records.
    MutexLock l(&t.mu);
    for (BlockRecord* r : to_destroy) books_.DestroyRecord(t, r);
  }
}

absl::Status BlockStore::Release(SessionHoldings& s, uint64_t lease_id) {
  auto it = s.leases.find(lease_id);
  if (it == s.leases.end()) {
    return CodedStatus(KVTIER_ENOENT, absl::StrCat("unknown lease ", lease_id,
                                                   ": released already, or not taken by this session"));
  }
  Unpin(s, it->second);
  if (auto lower = s.lease_lower_bytes.find(lease_id); lower != s.lease_lower_bytes.end()) {
    books_.tenants[s.ns.tenant]->lower_pinned_bytes.fetch_sub(lower->second, std::memory_order_relaxed);
    s.lease_lower_bytes.erase(lower);
  }
  s.lease_count.fetch_sub(1, std::memory_order_relaxed);
  s.pinned_blocks.fetch_sub(it->second.size(), std::memory_order_relaxed);
  s.leases.erase(it);
  return absl::OkStatus();
}

bool BlockStore::PublishGpuCopy(uint16_t tenant, uint32_t ns, const BlockKey& key) {
  GpuCache* gpu = books_.tenants[tenant]->gpu.get();
  if (gpu == nullptr) return false;
  BlockIndex::Shard& sh = books_.index.ShardFor(ns, key);
  MutexLock l(&sh.mu);
  const BlockRecord* r = BlockIndex::Find(sh, ns, key);
  if (r == nullptr || r->tenant != tenant) return false;
  gpu->Publish(ns, key);
  return true;
}

uint32_t BlockStore::RemoveFromIndex(HostResidency& t, BlockRecord* r, BlockIndex::Shard& sh) {
  books_.UnindexLocked(sh, r);
  // Removed blocks are never eviction candidates; keep the policies clean.
  if (r->state == BlockState::kReady) t.PolicyForLocked(t.host->SlotBytes(r->host_slot))->Remove(r->host_slot);
  books_.stats->invalidations.Add();
  return 1;
}

absl::StatusOr<uint32_t> BlockStore::Invalidate(SessionHoldings& s, std::span<const BlockKey> keys) {
  HostResidency& t = *books_.tenants[s.ns.tenant];
  uint32_t removed = 0;
  MutexLock l(&t.mu);
  for (const BlockKey& key : keys) {
    BlockIndex::Shard& sh = books_.index.ShardFor(s.ns.handle, key);
    BlockRecord* r;
    bool destroy;
    {
      MutexLock sl(&sh.mu);
      r = BlockIndex::Find(sh, s.ns.handle, key);
      if (r == nullptr || !r->visible()) continue;  // writes in flight stay
      removed += RemoveFromIndex(t, r, sh);
      destroy = r->pins == 0 && r->io_refs == 0;
    }
    if (destroy) books_.DestroyRecord(t, r);  // else the last unpin or I/O does
  }
  return removed;
}

absl::StatusOr<uint32_t> BlockStore::InvalidateNamespace(SessionHoldings& s) {
  HostResidency& t = *books_.tenants[s.ns.tenant];
  uint32_t removed = 0;
  MutexLock l(&t.mu);
  for (BlockIndex::Shard& sh : books_.index.shards()) {
    std::vector<BlockRecord*> victims, destroy;
    {
      MutexLock sl(&sh.mu);
      BlockIndex::ForEach(sh, [&](BlockRecord* r) {
        if (r->ns == s.ns.handle && r->visible()) victims.push_back(r);
        return true;
      });
      for (BlockRecord* r : victims) {
        removed += RemoveFromIndex(t, r, sh);
        if (r->pins == 0 && r->io_refs == 0) destroy.push_back(r);
      }
    }
    for (BlockRecord* r : destroy) books_.DestroyRecord(t, r);
  }
  return removed;
}

void BlockStore::CloseSession(SessionHoldings& s) {
  while (!s.tickets.empty()) (void)StoreAbort(s, s.tickets.begin()->first);
  while (!s.leases.empty()) (void)Release(s, s.leases.begin()->first);
  // Publishes queued by the session's last reply that never went out (its
  // completion could not be posted): their io_refs go back, or the blocks
  // could never be evicted or freed.
  if (!s.publish_pending.empty()) {
    HostResidency& t = *books_.tenants[s.ns.tenant];
    for (BlockRecord* r : s.publish_pending) {
      {
        BlockIndex::Shard& sh = books_.index.ShardFor(r);
        MutexLock sl(&sh.mu);
        r->publishing = false;
      }
      books_.ReleaseIoRef(t, r);
    }
    s.publish_pending.clear();
  }
}

void BlockStore::Prefetch(SessionHoldings& s, std::span<const BlockKey> keys, CountCallback done) {
  if (books_.lanes.empty()) {
    std::move(done)(0u);
    return;
  }
  HostResidency& t = *books_.tenants[s.ns.tenant];
  std::vector<BlockRecord*> todo;
  std::vector<uint64_t> parents;
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    BlockIndex::Shard& sh = books_.index.ShardFor(s.ns.handle, key);
    MutexLock sl(&sh.mu);
    BlockRecord* r = BlockIndex::Find(sh, s.ns.handle, key);
    if (r == nullptr || !r->visible()) break;  // the present prefix only
    if (r->state == BlockState::kNone && r->lower_state == LowerState::kReady && r->io_refs < kMaxClientIoRefs) {
      ++r->io_refs;  // holds the NVMe copy until the promotion has started
      todo.push_back(r);
      parents.push_back(i > 0 ? PolicyKeyOf(s.ns.handle, keys[i - 1]) : 0);
    }
  }
  books_.stats->prefetches.Add();
  if (todo.empty()) {
    std::move(done)(0u);
    return;
  }
  auto fan = FanIn<uint32_t>::Make(todo.size(), 0, std::move(done));
  for (size_t j = 0; j < todo.size(); ++j) {
    BlockRecord* r = todo[j];
    migrator_.Promote(
        t, r, IoPriority::kPrefetch,
        [this, &t, r, fan](bool ok) {
          books_.ReleaseIoRef(t, r);
          if (ok) fan->With([](uint32_t& promoted) { ++promoted; });
          fan->Arrive();
        },
        parents[j]);
  }
}

absl::StatusOr<uint64_t> BlockStore::AttachLowerTier(std::unique_ptr<BlockTier> lower,
                                                     const std::vector<RecoveredBlock>& recovered,
                                                     NamespaceRegistry* namespaces) {
  if (books_.lanes.size() >= kMaxLowerTiers) {
    return absl::ResourceExhaustedError(absl::StrCat("at most ", kMaxLowerTiers, " tiers below host memory"));
  }
  if (lower->shared() && !lower->addressed_by_key()) {
    // A shared tier's values belong to every node: the store keeps only its
    // own books of them, which needs the tier addressed by key.
    return absl::InvalidArgumentError(absl::StrCat("the ", std::string(lower->name()),
                                                   " tier is shared but not addressed by key alone"));
  }
  // The name was checked by Create.
  auto lane_ptr = std::make_unique<LowerLane>(
      static_cast<uint8_t>(books_.lanes.size()), std::move(lower),
      opts_.nvme_policy == "lru" ? MakeSparseLruPolicy() : MakeSparseHandlePolicy(*MakeEvictionPolicy(opts_.nvme_policy)),
      books_.tenants.size() + 1, books_.tenants.size());
  LowerLane& lane = *lane_ptr;
  // The cost model prices loads from each tier at that tier's speed: the
  // device's own time for each of its reads, not the queue wait before it.
  static_assert(kMaxLowerTiers <= CostTracker::kMaxTiers);
  lane.tier->SetReadObserver([this, i = size_t{lane.index}](uint64_t bytes, const IoTiming& t) {
    books_.cost.RecordRead(i, bytes, t.share_s());
  });
  if (lane.tier->shared()) shared_.AddLane(lane.index);  // lookups ask it past their local prefix
  // The first local tier takes host evictions through its gate; the shared
  // tier every write. Further local tiers (none in the daemon) have none.
  const bool first_local = !lane.tier->shared() && std::none_of(books_.lanes.begin(), books_.lanes.end(),
                                                                [](const auto& l) { return !l->tier->shared(); });
  lane.admit_min_uses =
      lane.tier->shared() ? opts_.shared_admission_min_uses : first_local ? opts_.nvme_admission_min_uses : 1;
  if (lane.admit_min_uses > 1 && books_.reuse == nullptr) {
    books_.reuse = std::make_unique<ReuseGate>(2, 8 * std::max<uint64_t>(opts_.admission_history_uses, 1024));
  }
  books_.lanes.push_back(std::move(lane_ptr));
  MutexLock nl(&lane.mu);
  uint64_t indexed = 0;
  for (const RecoveredBlock& b : recovered) {
    auto tenant = books_.tenant_by_hash.find(b.meta.tenant_hash);
    if (tenant == books_.tenant_by_hash.end()) {
      (void)lane.tier->Remove(b.at, b.meta);  // its tenant is no longer configured
      books_.stats->recovered_dropped.Add();
      continue;
    }
    const NamespaceInfo ns =
        namespaces->RegisterRecovered(b.meta.ns, tenant->second, b.meta.payload_bytes, b.meta.block_tokens);
    books_.RegisterNamespace(ns);
    BlockRecord* r = books_.index.NewRecord(ns.handle, b.meta.key);
    if (r == nullptr) {  // the index is full
      (void)lane.tier->Remove(b.at, b.meta);
      books_.stats->recovered_dropped.Add();
      continue;
    }
    r->tenant = tenant->second;
    r->state = BlockState::kNone;
    absl::StatusOr<SlotHandle> handle = lane.AdoptRecoveredLocked(b.at, b.meta);
    if (!handle.ok()) {
      books_.index.FreeRecord(r);
      (void)lane.tier->Remove(b.at, b.meta);
      books_.stats->recovered_dropped.Add();
      continue;
    }
    r->lower_slot = *handle;
    r->lower = lane.index;
    r->lower_state = LowerState::kReady;
    BlockIndex::Shard& sh = books_.index.ShardFor(r);
    {
      MutexLock sl(&sh.mu);
      // The same block twice (written again before a restart), or already
      // held by a tier above: one copy is enough.
      if (BlockIndex::Find(sh, r->ns, r->key) != nullptr) {
        books_.index.FreeRecord(r);
        lane.DropReservedLocked(*handle, b.meta);  // not charged yet
        continue;
      }
      books_.index.Insert(sh, r);
    }
    books_.CountRecords(r->ns, +1);
    lane.owner[*handle] = r;
    books_.ChargeLocked(lane, r, *handle, +1);
    lane.ReadyLocked(*handle, PolicyKeyOf(*r), std::nullopt);  // depth is not kept across restarts
    ++indexed;
  }
  return indexed;
}

}  // namespace kvtier
