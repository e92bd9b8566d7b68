// Movement between the host tier and the lower tiers: host eviction (keep
// the lower copy, demote, or drop), lower-tier eviction, write-through and
// durable commits, and the blocks a lower tier recovered at start.
// Promotion is in block_promotion.cc.
//
// An operation that has a tier I/O in flight on a block holds an io_ref on
// its record: such a block is neither evicted nor destroyed until the I/O
// completes, whatever happens to it meanwhile (invalidation, session end).
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/units.h"
#include "core/status.h"
#include "daemon/block_cache.h"
#include "tiers/nvme_format.h"

namespace kvtier {

BlockMeta BlockCache::MetaOf(const BlockRecord* r) const {
  NamespaceInfo ns;
  {
    MutexLock l(&ns_mu_);
    if (r->ns < ns_info_.size()) ns = ns_info_[r->ns];
  }
  BlockMeta m;
  m.ns = ns.id;
  m.key = r->key;
  m.payload_bytes = ns.block_bytes;
  m.tenant_hash = tenants_[r->tenant]->hash;
  m.block_tokens = ns.block_tokens;
  return m;
}

void BlockCache::DestroyRecord(HostResidency& t, BlockRecord* r) {
  if (r->host_slot != kNoSlot) t.FreeSlotLocked(r->host_slot);
  r->host_slot = kNoSlot;
  DestroyDetached(r);
}

void BlockCache::DestroyDetached(BlockRecord* r) {
  if (r->lower_slot != kNoSlot) {
    Lane& lane = LaneOf(r);
    MutexLock l(&lane.mu);
    lane.policy->Remove(r->lower_slot);
    FreeLowerSlotLocked(lane, r, r->lower_slot);
    if (r->lower_state == LowerState::kReady) lane.blocks.fetch_sub(1, std::memory_order_relaxed);
  }
  CountRecords(r->ns, -1);
  index_.FreeRecord(r);
}

void BlockCache::ReleaseIoRef(HostResidency& t, BlockRecord* r) {
  bool destroy, has_host;
  {
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    --r->io_refs;
    destroy = r->removed && r->pins == 0 && r->io_refs == 0;
    has_host = r->host_slot != kNoSlot;
  }
  if (!destroy) return;
  // Removed and unreferenced: only this thread can reach r now.
  if (has_host) {
    MutexLock l(&t.mu);
    DestroyRecord(t, r);
  } else {
    DestroyDetached(r);
  }
}

BlockCache::EvictResult BlockCache::EvictHostCopyLocked(HostResidency& t, BlockRecord* r,
                                                        std::vector<PendingDemotion>* deferred) {
  SlotHandle host_slot;
  uint64_t offset;
  bool keep_on_nvme;
  {
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    if (r->removed || r->pins != 0 || r->io_refs != 0 || r->state != BlockState::kReady) {
      return EvictResult::kSkipped;
    }
    host_slot = r->host_slot;
    offset = r->arena_offset();
    keep_on_nvme = r->lower_state == LowerState::kReady;
    if (keep_on_nvme) {
      r->state = BlockState::kNone;
      r->host_slot = kNoSlot;
    } else {
      r->state = BlockState::kEvicting;  // invisible; nobody pins it now
      ++r->io_refs;
    }
  }
  if (keep_on_nvme) {
    t.FreeSlotLocked(host_slot);
    stats_->evictions_kept_on_nvme.Add();
    return EvictResult::kEvicted;
  }
  const BlockMeta meta = MetaOf(r);
  const bool by_cost = DropForCost(r, meta);
  if (!by_cost && DemoteLocked(t, r, host_slot, offset, meta, deferred)) return EvictResult::kEvicted;
  // No NVMe tier, no room there, or too large: the block is dropped. It was
  // invisible since the first check, so nobody took a pin or an io_ref.
  bool destroy;
  {
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->state = BlockState::kNone;
    r->host_slot = kNoSlot;
    --r->io_refs;
    UnindexLocked(sh, r);
    destroy = r->pins == 0 && r->io_refs == 0;
  }
  stats_->evictions_dropped.Add();
  if (by_cost) stats_->evictions_dropped_by_cost.Add();
  t.FreeSlotLocked(host_slot);
  if (destroy) DestroyDetached(r);
  return EvictResult::kEvicted;
}

bool BlockCache::DropForCost(const BlockRecord* r, const BlockMeta& meta) {
  if (lanes_.empty() || r->depth == kUnknownDepth) return false;  // unknown depth: demote
  uint32_t tp_size = 1;
  {
    MutexLock l(&ns_mu_);
    if (r->ns < ns_info_.size()) tp_size = ns_info_[r->ns].tp_size;
  }
  if (!cost_.RecomputeBeatsNvme(uint64_t{r->depth} * meta.block_tokens, meta.block_tokens, meta.payload_bytes,
                                tp_size)) {
    return false;
  }
  // One in kCalibrationDemotionEvery of those is demoted anyway, so the tier
  // keeps blocks the cost model can measure it on (CalibrateNvme): a tier
  // judged slow once must be able to prove it is fast again.
  if (cost_demotions_.fetch_add(1, std::memory_order_relaxed) % kCalibrationDemotionEvery == 0) {
    stats_->demotions_for_calibration.Add();
    return false;
  }
  return true;
}

bool BlockCache::DemoteLocked(HostResidency& t, BlockRecord* r, SlotHandle host_slot, uint64_t offset,
                              const BlockMeta& meta, std::vector<PendingDemotion>* deferred) {
  Lane* const first = lanes_.empty() ? nullptr : lanes_[0].get();
  if (first == nullptr || meta.payload_bytes > first->tier->max_block_bytes()) return false;
  absl::StatusOr<SlotHandle> nslot;
  {
    MutexLock nl(&first->mu);
    nslot = AllocateLowerSlotLocked(*first, r, meta.payload_bytes);
    if (nslot.ok()) first->owner[*nslot] = r;
  }
  if (!nslot.ok()) {
    stats_->demotions_failed.Add();
    return false;
  }
  {
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->state = BlockState::kNone;
    r->host_slot = kNoSlot;
    r->lower_slot = *nslot;
    r->lower = 0;
    r->lower_state = LowerState::kWriting;  // the io_ref now belongs to the write
  }
  stats_->demotions.Add();
  if (deferred != nullptr) {
    t.PolicyForLocked(t.host->SlotBytes(host_slot))->Remove(host_slot);  // not a victim twice
    deferred->push_back(PendingDemotion{r, host_slot, *nslot, offset, meta});
    return true;
  }
  // Write copies the bytes before it returns: the host slot is freed right
  // after. Its callback takes no tenant lock (r has no host slot), so it may
  // run inline here.
  first->tier->Write(*nslot, meta, {t.host->arena_base() + offset, meta.payload_bytes}, IoPriority::kDemote,
                     [this, &t, r, start = MonotonicNanos()](absl::Status s) {
                       stats_->nvme_write_latency.Record(MonotonicNanos() - start);
                       if (!s.ok()) stats_->demotions_failed.Add();
                       OnNvmeWritten(r, s);
                       ReleaseIoRef(t, r);
                     });
  t.FreeSlotLocked(host_slot);
  return true;
}

void BlockCache::FinishDemotion(HostResidency& t, const PendingDemotion& d) {
  BlockRecord* r = d.r;
  // The slot is still allocated to r: nobody else writes these bytes.
  lanes_[0]->tier->Write(d.lower_slot, d.meta, {t.host->arena_base() + d.offset, d.meta.payload_bytes}, IoPriority::kDemote,
               [this, &t, r, start = MonotonicNanos()](absl::Status s) {
                 stats_->nvme_write_latency.Record(MonotonicNanos() - start);
                 if (!s.ok()) stats_->demotions_failed.Add();
                 OnNvmeWritten(r, s);
                 ReleaseIoRef(t, r);
               });
  MutexLock l(&t.mu);
  t.FreeSlotLocked(d.host_slot);
  if (--t.deferred_in_flight == 0) t.deferred_done.notify_all();
}

void BlockCache::ChargeLocked(Lane& lane, const BlockRecord* r, SlotHandle slot, int sign) {
  const BlockMeta meta = MetaOf(r);
  lane.ChargeLocked(r->tenant, slot, meta.payload_bytes, meta.block_tokens, sign);
}

void BlockCache::FreeLowerSlotLocked(Lane& lane, const BlockRecord* r, SlotHandle slot) {
  const BlockMeta meta = MetaOf(r);
  lane.FreeSlotLocked(r->tenant, slot, meta.payload_bytes, meta.block_tokens);
}

// Room in a lower tier: the tenant's quota (lane 0), then the lane's fair-
// share rule (LowerLane::PickVictimLocked). A demotion that finds no block it
// may evict is refused (the block is dropped) and counted:
// demotions_refused_quota over the quota, demotions_refused_fair_share when
// an evictable block was passed over to keep its tenant's share.
absl::StatusOr<SlotHandle> BlockCache::AllocateLowerSlotLocked(Lane& lane, const BlockRecord* owner, uint64_t bytes) {
  const uint16_t tenant = owner->tenant;
  // The quotas ([[tenants]] nvme_bytes / nvme_tokens) are on the first tier.
  const TenantQuota q = lane.index == 0 ? tenants_[tenant]->Quota() : TenantQuota{};
  const uint64_t tokens = MetaOf(owner).block_tokens;
  if ((q.nvme_bytes != 0 && bytes > q.nvme_bytes) || (q.nvme_tokens != 0 && tokens > q.nvme_tokens)) {
    stats_->demotions_refused_quota.Add();
    return absl::ResourceExhaustedError(absl::StrCat("a block is larger than tenant \"", tenants_[tenant]->name,
                                                     "\"'s NVMe quota ([[tenants]] nvme_bytes / nvme_tokens)"));
  }
  for (;;) {
    const LowerLane::Use u = lane.use(tenant);
    const bool over_quota = (q.nvme_bytes != 0 && u.bytes + bytes > q.nvme_bytes) ||
                            (q.nvme_tokens != 0 && u.tokens + tokens > q.nvme_tokens);
    if (!over_quota) {
      absl::StatusOr<SlotHandle> slot = lane.tier->Allocate(bytes);
      if (slot.ok()) ChargeLocked(lane, owner, *slot, +1);
      if (slot.ok() || !absl::IsResourceExhausted(slot.status())) return slot;
    }
    const LowerLane::Victim pick = lane.PickVictimLocked(tenant, bytes, over_quota, [&](BlockRecord* v) {
      BlockIndex::Shard& sh = index_.ShardFor(v);
      MutexLock sl(&sh.mu);
      return !v->removed && v->pins == 0 && v->io_refs == 0 && v->lower_state == LowerState::kReady;
    });
    if (!pick.slot) {
      if (over_quota) {
        stats_->demotions_refused_quota.Add();
        return absl::ResourceExhaustedError(absl::StrCat("tenant \"", tenants_[tenant]->name,
                                                         "\" is at its NVMe quota and every block of it there is "
                                                         "pinned or busy"));
      }
      if (pick.held_back) {
        if (lane.index == 0) stats_->demotions_refused_fair_share.Add();
        return absl::ResourceExhaustedError(absl::StrCat(
            "the ", std::string(lane.tier->name()), " tier is full and tenant \"", tenants_[tenant]->name,
            "\" may evict nothing there: its own blocks are pinned or busy, the other tenants' are within their "
            "fair shares"));
      }
      return absl::ResourceExhaustedError(
          absl::StrCat("the ", std::string(lane.tier->name()), " tier is full and every block on it is pinned or busy"));
    }
    if (over_quota) stats_->nvme_evictions_for_quota.Add();
    BlockRecord* r = lane.owner.at(*pick.slot);
    bool destroy = false;
    {
      BlockIndex::Shard& sh = index_.ShardFor(r);
      MutexLock sl(&sh.mu);
      if (r->removed || r->pins != 0 || r->io_refs != 0 || r->lower_state != LowerState::kReady) continue;
      r->lower_slot = kNoSlot;
      r->lower_state = LowerState::kNone;
      if (r->state == BlockState::kNone) {
        // Its only copy: the block leaves the cache.
        UnindexLocked(sh, r);
        destroy = true;
      }
    }
    lane.policy->Remove(*pick.slot);
    FreeLowerSlotLocked(lane, r, *pick.slot);
    lane.blocks.fetch_sub(1, std::memory_order_relaxed);
    (lane.index == 0 ? stats_->nvme_evictions : stats_->lower_evictions).Add();
    if (destroy) {  // no host slot, no NVMe slot, unreferenced
      CountRecords(r->ns, -1);
      index_.FreeRecord(r);
    }
  }
}

void BlockCache::OnNvmeWritten(BlockRecord* r, absl::Status s) {
  Lane& first = *lanes_[0];
  std::vector<absl::AnyInvocable<void(bool) &&>> waiters;
  {
    MutexLock nl(&first.mu);
    if (auto w = first.write_waiters.find(r); w != first.write_waiters.end()) {
      waiters = std::move(w->second);
      first.write_waiters.erase(w);
    }
    RecordNvmeWriteLocked(first, r, s);
  }
  for (auto& cb : waiters) std::move(cb)(s.ok());
}

void BlockCache::RecordNvmeWriteLocked(Lane& lane, BlockRecord* r, const absl::Status& s) {
  SlotHandle slot;
  {
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    slot = r->lower_slot;
    if (s.ok()) {
      r->lower_state = LowerState::kReady;
    } else {
      r->lower_state = LowerState::kNone;
      r->lower_slot = kNoSlot;
      if (r->state == BlockState::kNone && !r->removed) {
        // The demotion failed and the host copy is gone: the block is gone.
        UnindexLocked(sh, r);
      }
    }
  }
  if (s.ok()) {
    lane.policy->InsertAt(slot, PolicyKeyOf(*r), PositionOf(*r, MetaOf(r).block_tokens));
    lane.blocks.fetch_add(1, std::memory_order_relaxed);
    cascade_.MaybeWake(lane.index);
  } else {
    FreeLowerSlotLocked(lane, r, slot);
  }
}

void BlockCache::WriteToNvme(HostResidency& t, BlockRecord* r, IoPriority prio, StatusCallback done) {
  Lane& first = *lanes_[0];
  const BlockMeta meta = MetaOf(r);
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
      BlockIndex::Shard& sh = index_.ShardFor(r);
      MutexLock sl(&sh.mu);
      if (r->lower_state == LowerState::kReady) {
        const BlockTier& holder = *LaneOf(r).tier;
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
      if (slot.ok()) first.owner[*slot] = r;
    }
    if (!slot.ok()) {
      {
        BlockIndex::Shard& sh = index_.ShardFor(r);
        MutexLock sl(&sh.mu);
        --r->io_refs;
      }
      std::move(done)(slot.status());
      return;
    }
    nslot = *slot;
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->lower_slot = nslot;
    r->lower = 0;
    r->lower_state = LowerState::kWriting;
  }
  first.tier->Write(nslot, meta, {t.host->arena_base() + offset, meta.payload_bytes}, prio,
                    [this, &t, r, start = MonotonicNanos(), done = std::move(done)](absl::Status s) mutable {
                      // A write the staging memory refused never started (a flush
                      // tries it again): not a write.
                      if (ToErrorCode(s) != KVTIER_EBUSY) stats_->writes_through.Add();
                      stats_->nvme_write_latency.Record(MonotonicNanos() - start);
                      OnNvmeWritten(r, s);
                      ReleaseIoRef(t, r);
                      std::move(done)(s);
                    });
}

void BlockCache::DropLowerCopy(BlockRecord* r, uint8_t lane_index, SlotHandle slot, bool sole_holder) {
  Lane& lane = *lanes_[lane_index];
  MutexLock nl(&lane.mu);
  {
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    // Moved down (or dropped) since the read that failed: nothing to drop.
    if (r->lower_state != LowerState::kReady || r->lower != lane_index || r->lower_slot != slot) return;
    if (sole_holder && r->io_refs != 1) return;
    r->lower_slot = kNoSlot;
    r->lower_state = LowerState::kNone;
    if (r->state != BlockState::kReady && !r->removed) {
      UnindexLocked(sh, r);
    }
  }
  lane.policy->Remove(slot);
  FreeLowerSlotLocked(lane, r, slot);
  lane.blocks.fetch_sub(1, std::memory_order_relaxed);
}

uint32_t BlockCache::CalibrateNvme(uint64_t now_ns) {
  if (lanes_.empty() || !cost_.WantsNvmeCalibration(now_ns)) return 0;
  // CostTracker's estimate gives each read 1% of its weight: 32 reads every
  // quiet 2 s replace 28% of it, so a device measured 40 times slower than
  // recomputation allows that recovered is trusted again within about 20 s
  // (cost_tracker_test). Each read is at most 1 MiB: 16 MB/s at most, and
  // only while the model keeps deciding against NVMe without reads.
  return lanes_[0]->tier->CalibrationRead(32);
}

absl::StatusOr<uint64_t> BlockCache::AttachLowerTier(std::unique_ptr<BlockTier> lower,
                                                     const std::vector<RecoveredBlock>& recovered,
                                                     NamespaceRegistry* namespaces) {
  if (lanes_.size() >= kMaxLowerTiers) {
    return absl::ResourceExhaustedError(absl::StrCat("at most ", kMaxLowerTiers, " tiers below host memory"));
  }
  // The name was checked by Create.
  auto lane_ptr = std::make_unique<Lane>(
      static_cast<uint8_t>(lanes_.size()), std::move(lower),
      opts_.nvme_policy == "lru" ? MakeSparseLruPolicy() : MakeSparseHandlePolicy(*MakeEvictionPolicy(opts_.nvme_policy)),
      tenants_.size() + 1, tenants_.size());
  Lane& lane = *lane_ptr;
  // The cost model prices loads from each tier at that tier's speed: the
  // device's own time for each of its reads, not the queue wait before it.
  static_assert(kMaxLowerTiers <= CostTracker::kMaxTiers);
  lane.tier->SetReadObserver([this, i = size_t{lane.index}](uint64_t bytes, const IoTiming& t) {
    cost_.RecordRead(i, bytes, t.share_s());
  });
  lanes_.push_back(std::move(lane_ptr));
  MutexLock nl(&lane.mu);
  uint64_t indexed = 0;
  for (const RecoveredBlock& b : recovered) {
    auto tenant = tenant_by_hash_.find(b.meta.tenant_hash);
    if (tenant == tenant_by_hash_.end()) {
      (void)lane.tier->Free(b.slot);  // its tenant is no longer configured
      stats_->recovered_dropped.Add();
      continue;
    }
    const NamespaceInfo ns =
        namespaces->RegisterRecovered(b.meta.ns, tenant->second, b.meta.payload_bytes, b.meta.block_tokens);
    RegisterNamespace(ns);
    BlockRecord* r = index_.NewRecord(ns.handle, b.meta.key);
    r->tenant = tenant->second;
    r->state = BlockState::kNone;
    r->lower_slot = b.slot;
    r->lower = lane.index;
    r->lower_state = LowerState::kReady;
    BlockIndex::Shard& sh = index_.ShardFor(r);
    {
      MutexLock sl(&sh.mu);
      // The same block twice (written again before a restart), or already
      // held by a tier above: one copy is enough.
      if (BlockIndex::Find(sh, r->ns, r->key) != nullptr) {
        index_.FreeRecord(r);
        (void)lane.tier->Free(b.slot);
        continue;
      }
      index_.Insert(sh, r);
    }
    CountRecords(r->ns, +1);
    lane.owner[b.slot] = r;
    ChargeLocked(lane, r, b.slot, +1);
    lane.policy->InsertWithKey(b.slot, PolicyKeyOf(*r));  // depth is not kept across restarts
    lane.blocks.fetch_add(1, std::memory_order_relaxed);
    ++indexed;
  }
  return indexed;
}

}  // namespace kvtier
