// Tenants and namespaces; lookups, leases, loads and invalidation. Stores are
// in block_store.cc.
// Per-tenant host residency (allocation, eviction, reclaim, quotas) is in
// block_host.cc; movement between tiers (demotion, lower-tier eviction,
// recovery) in block_movement.cc, promotion in block_promotion.cc, the drain
// in block_flush.cc, the cascade in block_cascade.cc, the read-only reports
// in block_reports.cc.
#include "daemon/block_cache.h"

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

BlockCache::BlockCache(const Options& opts, DaemonStats* stats)
    : opts_(opts),
      adaptive_(opts.policy == "adaptive"),
      stats_(stats),
      cost_(opts.cost),
      cascade_(opts.cascade_high, opts.cascade_low, CascadeHooks()),
      reclaimer_({opts.high_watermark, opts.low_watermark}, [this](Reclaimer::Marks) { ReclaimPass(); }) {}

absl::StatusOr<std::unique_ptr<BlockCache>> BlockCache::Create(const Options& opts, DaemonStats* stats) {
  RETURN_IF_ERROR(MakeEvictionPolicy(opts.policy).status());
  RETURN_IF_ERROR(MakeEvictionPolicy(opts.nvme_policy).status());
  if (opts.nvme_policy == "adaptive") {
    return absl::InvalidArgumentError("the NVMe tier's policy cannot be adaptive (its shadows learn from host lookups)");
  }
  return std::unique_ptr<BlockCache>(new BlockCache(opts, stats));
}

BlockCache::~BlockCache() {
  StopBackgroundReclaim();
  StopCascade();
  // Drain the lower tiers' I/O and journal callbacks while everything they
  // touch lives, every lane included: a failed write's callback frees its
  // slot through its lane. A landed demotion may start a waiting
  // promotion's read in lane 0 from lane 0's own drain: twice round.
  // Then delete the tiers, the last first.
  for (int round = 0; round < 2; ++round) {
    for (auto& lane : lanes_) lane->tier->Drain();
  }
  while (!lanes_.empty()) {
    // Delete the tier before clearing the pointer: ops it gives up in its
    // destructor complete through lane->tier (a failed read drops its slot).
    std::unique_ptr<BlockTier>& tier = lanes_.back()->tier;
    tier.get_deleter()(tier.get());
    (void)tier.release();
    lanes_.pop_back();
  }
}

absl::StatusOr<uint16_t> BlockCache::AddTenant(std::string name, std::unique_ptr<HostTier> host, TenantQuota quota,
                                               std::unique_ptr<GpuCache> gpu) {
  if (tenants_.size() >= UINT16_MAX) return absl::ResourceExhaustedError("too many tenants");
  const uint64_t hash = TenantHash(name);
  auto t = std::make_unique<HostResidency>(std::move(name), hash, std::move(host), std::move(gpu), quota, opts_.policy);
  for (auto& lane : lanes_) {
    MutexLock nl(&lane->mu);
    lane->GrowTenantsLocked(tenants_.size() + 1);
  }
  tenant_by_hash_[t->hash] = static_cast<uint16_t>(tenants_.size());
  tenants_.push_back(std::move(t));
  return static_cast<uint16_t>(tenants_.size() - 1);
}

void BlockCache::RegisterNamespace(const NamespaceInfo& info) {
  bool fresh;
  {
    MutexLock l(&ns_mu_);
    if (ns_info_.size() <= info.handle) {
      ns_info_.resize(info.handle + 1);
      ns_records_.resize(info.handle + 1, 0);
    }
    // Said when an engine first describes the namespace (a namespace
    // recovered from NVMe has no model id until one attaches with it), and
    // once per block shape, not once per namespace: fresh namespaces are a
    // peer's to make. The shapes remembered are bounded too.
    fresh = !info.model_id.empty() && ns_info_[info.handle].model_id.empty();
    ns_info_[info.handle] = info;
    constexpr size_t kMaxShapesLogged = 256;
    if (fresh) {
      fresh = unpriced_logged_.size() < kMaxShapesLogged &&
              unpriced_logged_.insert({info.block_bytes, info.block_tokens, info.tp_size}).second;
    }
  }
  if (fresh && cost_.decide() && !cost_.Prices(info.block_bytes, info.block_tokens, info.tp_size)) {
    spdlog::info(
        "event=cost_model_unpriced namespace={} model_id=\"{}\" bytes_per_token={} profile=\"{}\" "
        "profile_kv_bytes_per_token={} detail=\"blocks of this namespace are always loaded and demoted; set "
        "cost_model.model_config to this model's config.json to price them\"",
        info.id.Hex().substr(0, 16), LogQuoted(info.model_id), info.block_tokens ? info.block_bytes / info.block_tokens : 0,
        LogQuoted(cost_.model().name), cost_.model().KvBytesPerToken());
  }
}

bool BlockCache::ForgetNamespace(uint32_t handle) {
  MutexLock l(&ns_mu_);
  if (handle < ns_records_.size() && ns_records_[handle] != 0) return false;
  if (handle < ns_info_.size()) ns_info_[handle] = NamespaceInfo{};
  return true;
}

uint64_t BlockCache::RecordsOf(uint32_t handle) const {
  MutexLock l(&ns_mu_);
  return handle < ns_records_.size() ? ns_records_[handle] : 0;
}

void BlockCache::CountRecords(uint32_t ns, int64_t delta) {
  if (delta == 0) return;
  MutexLock l(&ns_mu_);
  if (ns >= ns_records_.size()) ns_records_.resize(ns + 1, 0);
  ns_records_[ns] += static_cast<uint64_t>(delta);  // wraps back for negative deltas
}

std::vector<BlockRecord*> BlockCache::FindAll(uint32_t ns, std::span<const BlockKey> keys) {
  std::vector<BlockRecord*> out(keys.size(), nullptr);
  for (size_t i = 0; i < keys.size(); ++i) {
    BlockIndex::Shard& sh = index_.ShardFor(ns, keys[i]);
    MutexLock l(&sh.mu);
    out[i] = BlockIndex::Find(sh, ns, keys[i]);
  }
  return out;
}

void BlockCache::ObserveRequest(SessionHoldings& s, std::span<const BlockKey> keys) {
  s.last_chain.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) s.last_chain[i] = PolicyKeyOf(s.ns.handle, keys[i]);
  s.observe_pending = !keys.empty() && adaptive_;
}

void BlockCache::ObservePending(SessionHoldings& s) {
  if (!s.observe_pending) return;
  s.observe_pending = false;
  HostResidency& t = *tenants_[s.ns.tenant];
  AdaptivePolicy* a;
  {
    // Policies live as long as the cache: the pointer outlives the lock.
    MutexLock l(&t.mu);
    a = static_cast<AdaptivePolicy*>(t.PolicyForLocked(t.host->SlotSizeFor(s.ns.block_bytes))->inner());
  }
  a->Observe(s.last_chain, s.ns.block_tokens);  // on the shadows' own lock, not the tier's
}

absl::Status BlockCache::LeaseRoomFor(const SessionHoldings& s, size_t blocks) {
  if (s.leases.size() >= opts_.max_leases_per_session) {
    return CodedStatus(KVTIER_EBUSY, absl::StrCat("this session holds ", s.leases.size(),
                                                  " leases (ipc.max_leases_per_session); release some"));
  }
  if (s.pinned_blocks.load(std::memory_order_relaxed) + blocks > opts_.max_leased_blocks_per_session) {
    stats_->Refused(Refusal::kSessionLeasedBlocks);
    return CodedStatus(KVTIER_EBUSY,
                       absl::StrCat("this session's leases hold ", s.pinned_blocks.load(std::memory_order_relaxed),
                                    " blocks and this lookup asks for ", blocks, " more (",
                                    "limits.leased_blocks_per_session = ", opts_.max_leased_blocks_per_session,
                                    "); release some leases"));
  }
  return absl::OkStatus();
}

BlockCache::ChainHits BlockCache::ProbeChain(SessionHoldings& s, std::span<const BlockKey> keys, bool lease,
                                             std::span<BlockLocation> out) {
  HostResidency& t = *tenants_[s.ns.tenant];
  ChainHits h;
  // Probes are memory-bound: prefetch a window of keys ahead so their cache
  // misses overlap instead of queueing behind one another.
  constexpr size_t kWindow = 16;
  std::array<BlockIndex::Shard*, kWindow> shard_of{};
  auto prefetch = [&](size_t i) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    BlockIndex::Shard& sh = index_.ShardFor(s.ns.handle, keys[i]);
    shard_of[i % kWindow] = &sh;
    MutexLock l(&sh.mu);
    BlockIndex::Prefetch(sh, s.ns.handle, keys[i]);
  };
  for (size_t i = 0; i < std::min(kWindow, keys.size()); ++i) prefetch(i);
  for (size_t i = 0; i < keys.size(); ++i) {
    BlockIndex::Shard& sh = *shard_of[i % kWindow];
    {
      MutexLock l(&sh.mu);
      BlockRecord* r = BlockIndex::Find(sh, s.ns.handle, keys[i]);
      if (r == nullptr || !r->visible()) break;
      const bool in_host = r->state == BlockState::kReady;
      // A copy below host memory is priced at the speed of the tier it is in.
      if (!in_host && cost_.RecomputeBeats(uint8_t{r->lower}, i * s.ns.block_tokens, s.ns.block_tokens,
                                           s.ns.block_bytes, s.ns.tp_size)) {
        h.cut_for_cost = true;
        break;
      }
      out[i] = in_host ? BlockLocation{TierKind::kHost, r->arena_offset(), false}
                       : BlockLocation{LaneOf(r).tier->kind(), 0, false};
      if (!in_host) ++h.below_host;
      if (lease) {
        if (r->pins++ == 0) t.pinned.fetch_add(1, std::memory_order_relaxed);
        h.pinned.push_back(r);
        if (in_host) h.host_touch.push_back(r->host_slot);
        if (r->lower_state == LowerState::kReady) h.lower_touch.push_back({r->lower, r->lower_slot, r});
      }
    }
    ++h.hit;
    if (i + kWindow < keys.size()) prefetch(i + kWindow);
  }
  for (size_t i = h.hit; i < keys.size(); ++i) out[i] = BlockLocation{};
  return h;
}

uint32_t BlockCache::MarkRecompute(const SessionHoldings& s, std::span<const BlockKey> keys, size_t from,
                                   std::span<BlockLocation> out) {
  // Present, but the engine is better off computing them: say so, so it
  // neither waits for them nor counts them as misses.
  uint32_t n = 0;
  for (size_t i = from; i < keys.size(); ++i) {
    BlockIndex::Shard& sh = index_.ShardFor(s.ns.handle, keys[i]);
    MutexLock l(&sh.mu);
    BlockRecord* r = BlockIndex::Find(sh, s.ns.handle, keys[i]);
    if (r == nullptr || !r->visible()) break;
    out[i] = BlockLocation{r->state == BlockState::kReady ? TierKind::kHost : LaneOf(r).tier->kind(), 0, false, true};
    ++n;
  }
  return n;
}

void BlockCache::TouchHits(HostResidency& t, const ChainHits& hits) {
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
    Lane& lane = *lanes_[h->lane];
    MutexLock l(&lane.mu);
    for (; h != hits.lower_touch.rend() && h->lane == lane.index; ++h) {
      if (auto o = lane.owner.find(h->slot); o != lane.owner.end() && o->second == h->r) lane.policy->Touch(h->slot);
    }
  }
}

absl::StatusOr<uint32_t> BlockCache::Lookup(SessionHoldings& s, std::span<const BlockKey> keys, bool lease,
                                            uint64_t* lease_id, std::span<BlockLocation> out, uint32_t* recompute) {
  *lease_id = 0;
  if (recompute != nullptr) *recompute = 0;
  if (lease) RETURN_IF_ERROR(LeaseRoomFor(s, keys.size()));
  ChainHits h = ProbeChain(s, keys, lease, out);
  if (h.cut_for_cost) {
    const uint32_t n = MarkRecompute(s, keys, h.hit, out);
    if (lease) stats_->blocks_recompute.Add(n);
    if (recompute != nullptr) *recompute = n;
  }
  if (!lease) {
    stats_->probes.Add();
    return h.hit;
  }
  stats_->lookups.Add();
  stats_->blocks_queried.Add(keys.size());
  stats_->tokens_queried.Add(keys.size() * s.ns.block_tokens);
  ObserveRequest(s, keys);
  if (h.hit == 0) return 0u;
  stats_->lookup_hits.Add();
  stats_->blocks_hit.Add(h.hit);
  stats_->blocks_hit_nvme.Add(h.below_host);
  stats_->tokens_hit.Add(uint64_t{h.hit} * s.ns.block_tokens);
  TouchHits(*tenants_[s.ns.tenant], h);
  *lease_id = s.next_id++;
  s.leases.emplace(*lease_id, std::move(h.pinned));
  s.lease_count.fetch_add(1, std::memory_order_relaxed);
  s.pinned_blocks.fetch_add(h.hit, std::memory_order_relaxed);
  return h.hit;
}

absl::StatusOr<std::vector<BlockRecord*>> BlockCache::LeasedRecords(const SessionHoldings& s, uint64_t lease_id,
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

void BlockCache::FinishLoad(LoadOutcome& o, const std::vector<uint8_t>& ok, uint64_t block_bytes) {
  o.loaded = static_cast<uint32_t>(o.locations.size());
  for (size_t i = 0; i < ok.size(); ++i) {
    if (!ok[i]) {
      o.loaded = static_cast<uint32_t>(i);
      break;
    }
  }
  for (size_t i = o.loaded; i < o.locations.size(); ++i) o.locations[i] = BlockLocation{};
  if (o.loaded < o.locations.size()) {
    stats_->load_failures.Add(o.locations.size() - o.loaded);
    o.status = CodedStatus(KVTIER_EIO, absl::StrCat("block ", o.loaded,
                                                    " could not be brought back from NVMe (a failed checksum or "
                                                    "I/O error drops it; or the host tier had no room); recompute "
                                                    "it and what follows"));
  }
  stats_->loads.Add();
  stats_->blocks_loaded.Add(o.loaded);
  stats_->bytes_loaded.Add(uint64_t{o.loaded} * block_bytes);
}

std::optional<LoadOutcome> BlockCache::Load(SessionHoldings& s, uint64_t lease_id, std::span<const BlockKey> keys,
                                            LoadCallback done) {
  absl::StatusOr<std::vector<BlockRecord*>> leased = LeasedRecords(s, lease_id, keys);
  if (!leased.ok()) return LoadOutcome{{}, 0, leased.status()};
  const std::vector<BlockRecord*>& recs = *leased;
  // Fast path: every block already in host memory (pinned: it stays there).
  LoadOutcome outcome;
  outcome.locations.resize(keys.size());
  std::vector<size_t> to_promote;
  for (size_t i = 0; i < recs.size(); ++i) {
    BlockIndex::Shard& sh = index_.ShardFor(recs[i]);
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
  HostResidency& t = *tenants_[s.ns.tenant];
  for (size_t i : to_promote) {
    BlockRecord* r = recs[i];
    const uint64_t parent = i > 0 ? PolicyKeyOf(s.ns.handle, keys[i - 1]) : 0;
    Promote(t, r, IoPriority::kLoad, [this, fan, i, r](bool ok) {
      fan->With([&](Promoted& p) {
        p.ok[i] = ok;
        if (ok) {
          BlockIndex::Shard& sh = index_.ShardFor(r);
          MutexLock sl(&sh.mu);
          p.outcome.locations[i] = BlockLocation{TierKind::kHost, r->arena_offset(), false};
        }
      });
      fan->Arrive();
    }, parent);
  }
  stats_->promotions_for_load.Add(to_promote.size());
  fan->Arrive();  // the +1
  return std::nullopt;
}

void BlockCache::Unpin(SessionHoldings& s, const std::vector<BlockRecord*>& blocks) {
  HostResidency& t = *tenants_[s.ns.tenant];
  std::vector<BlockRecord*> to_destroy;
  for (BlockRecord* r : blocks) {
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    if (--r->pins == 0) {
      t.pinned.fetch_sub(1, std::memory_order_relaxed);
      if (r->removed && r->io_refs == 0) to_destroy.push_back(r);
    }
  }
  if (!to_destroy.empty()) {
    // Out of the index and unreferenced: nobody else can reach these records.
    MutexLock l(&t.mu);
    for (BlockRecord* r : to_destroy) DestroyRecord(t, r);
  }
}

absl::Status BlockCache::Release(SessionHoldings& s, uint64_t lease_id) {
  auto it = s.leases.find(lease_id);
  if (it == s.leases.end()) {
    return CodedStatus(KVTIER_ENOENT, absl::StrCat("unknown lease ", lease_id,
                                                   ": released already, or not taken by this session"));
  }
  Unpin(s, it->second);
  s.lease_count.fetch_sub(1, std::memory_order_relaxed);
  s.pinned_blocks.fetch_sub(it->second.size(), std::memory_order_relaxed);
  s.leases.erase(it);
  return absl::OkStatus();
}

void BlockCache::UnindexLocked(BlockIndex::Shard& sh, BlockRecord* r) {
  // Once: a later record of the same key may be indexed (and on the GPU) by now.
  if (r->removed) return;
  index_.Erase(sh, r);
  r->removed = true;
  if (GpuCache* gpu = tenants_[r->tenant]->gpu.get()) gpu->Drop(r->ns, r->key);
}

bool BlockCache::PublishGpuCopy(uint16_t tenant, uint32_t ns, const BlockKey& key) {
  GpuCache* gpu = tenants_[tenant]->gpu.get();
  if (gpu == nullptr) return false;
  BlockIndex::Shard& sh = index_.ShardFor(ns, key);
  MutexLock l(&sh.mu);
  const BlockRecord* r = BlockIndex::Find(sh, ns, key);
  if (r == nullptr || r->tenant != tenant) return false;
  gpu->Publish(ns, key);
  return true;
}

uint32_t BlockCache::RemoveFromIndex(HostResidency& t, BlockRecord* r, BlockIndex::Shard& sh) {
  UnindexLocked(sh, r);
  // Removed blocks are never eviction candidates; keep the policies clean.
  if (r->state == BlockState::kReady) t.PolicyForLocked(t.host->SlotBytes(r->host_slot))->Remove(r->host_slot);
  stats_->invalidations.Add();
  return 1;
}

absl::StatusOr<uint32_t> BlockCache::Invalidate(SessionHoldings& s, std::span<const BlockKey> keys) {
  HostResidency& t = *tenants_[s.ns.tenant];
  uint32_t removed = 0;
  MutexLock l(&t.mu);
  for (const BlockKey& key : keys) {
    BlockIndex::Shard& sh = index_.ShardFor(s.ns.handle, key);
    BlockRecord* r;
    bool destroy;
    {
      MutexLock sl(&sh.mu);
      r = BlockIndex::Find(sh, s.ns.handle, key);
      if (r == nullptr || !r->visible()) continue;  // writes in flight stay
      removed += RemoveFromIndex(t, r, sh);
      destroy = r->pins == 0 && r->io_refs == 0;
    }
    if (destroy) DestroyRecord(t, r);  // else the last unpin or I/O does
  }
  return removed;
}

absl::StatusOr<uint32_t> BlockCache::InvalidateNamespace(SessionHoldings& s) {
  HostResidency& t = *tenants_[s.ns.tenant];
  uint32_t removed = 0;
  MutexLock l(&t.mu);
  for (BlockIndex::Shard& sh : index_.shards()) {
    std::vector<BlockRecord*> victims, destroy;
    {
      MutexLock sl(&sh.mu);
      for (BlockRecord* r : sh.set) {
        if (r->ns == s.ns.handle && r->visible()) victims.push_back(r);
      }
      for (BlockRecord* r : victims) {
        removed += RemoveFromIndex(t, r, sh);
        if (r->pins == 0 && r->io_refs == 0) destroy.push_back(r);
      }
    }
    for (BlockRecord* r : destroy) DestroyRecord(t, r);
  }
  return removed;
}

void BlockCache::CloseSession(SessionHoldings& s) {
  while (!s.tickets.empty()) (void)StoreAbort(s, s.tickets.begin()->first);
  while (!s.leases.empty()) (void)Release(s, s.leases.begin()->first);
}

}  // namespace kvtier
