#include "daemon/block_cache.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"

namespace kvtier {

BlockCache::BlockCache(const Options& opts, DaemonStats* stats) : opts_(opts), stats_(stats) {}

absl::StatusOr<std::unique_ptr<BlockCache>> BlockCache::Create(const Options& opts, DaemonStats* stats) {
  RETURN_IF_ERROR(MakeEvictionPolicy(opts.policy).status());
  return std::unique_ptr<BlockCache>(new BlockCache(opts, stats));
}

BlockCache::~BlockCache() = default;

absl::StatusOr<uint16_t> BlockCache::AddTenant(std::string name, std::unique_ptr<HostTier> host) {
  if (tenants_.size() >= UINT16_MAX) return absl::ResourceExhaustedError("too many tenants");
  auto t = std::make_unique<TenantState>();
  t->name = std::move(name);
  t->host = std::move(host);
  tenants_.push_back(std::move(t));
  return static_cast<uint16_t>(tenants_.size() - 1);
}

EvictionPolicy* BlockCache::PolicyFor(TenantState& t, uint64_t slot_bytes) {
  auto it = t.policy_by_size.find(slot_bytes);
  if (it != t.policy_by_size.end()) return it->second.get();
  auto p = MakeEvictionPolicy(opts_.policy);  // the name was checked by the constructor
  return t.policy_by_size.emplace(slot_bytes, std::move(p).value()).first->second.get();
}

void BlockCache::FreeRecord(TenantState& t, BlockRecord* r) {
  if (r->host_slot != kNoSlot) {
    // Cannot fail: the slot was allocated for this record and freed only here.
    (void)t.host->Free(r->host_slot);
    t.slot_owner[r->host_slot] = nullptr;
  }
  delete r;
}

absl::StatusOr<SlotHandle> BlockCache::AllocateSlot(TenantState& t, uint64_t bytes, BlockRecord* owner) {
  MutexLock l(&t.mu);
  for (;;) {
    absl::StatusOr<SlotHandle> slot = t.host->Allocate(bytes);
    if (slot.ok()) {
      if (t.slot_owner.size() <= *slot) {
        t.slot_owner.resize(std::max<size_t>(*slot + 1, t.slot_owner.size() * 2));
      }
      t.slot_owner[*slot] = owner;
      return slot;
    }
    if (!absl::IsResourceExhausted(slot.status())) return slot.status();
    EvictionPolicy* policy = PolicyFor(t, t.host->SlotSizeFor(bytes));
    // Take the first unpinned block in policy order out of the index, under
    // its shard lock, so no lookup can pin it after the check.
    std::optional<SlotHandle> victim =
        policy->PickVictim([&](SlotHandle h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          BlockRecord* v = t.slot_owner[h];
          BlockIndex::Shard& sh = index_.ShardFor(v);
          MutexLock sl(&sh.mu);
          if (v->pins > 0) return false;
          index_.Erase(sh, v);
          v->removed = true;
          return true;
        });
    if (!victim) {
      stats_->store_refused_no_space.Add();
      const TierUsage u = t.host->Usage();
      if (policy->size() == 0) {
        return CodedStatus(KVTIER_ENOSPC,
                           absl::StrCat("host tier of tenant \"", t.name, "\" is full (",
                                        FormatBytes(u.used_bytes), " of ", FormatBytes(u.capacity_bytes),
                                        ") and holds no committed block of ", FormatBytes(bytes),
                                        " to evict (slots are being written, or carved for other "
                                        "block sizes); retry later or raise tiers.host.capacity"));
      }
      return CodedStatus(KVTIER_ENOSPC,
                         absl::StrCat("host tier of tenant \"", t.name, "\" is full (",
                                      FormatBytes(u.used_bytes), " of ", FormatBytes(u.capacity_bytes),
                                      ") and all ", policy->size(),
                                      " committed blocks of this size are pinned by leases; release "
                                      "leases or raise tiers.host.capacity"));
    }
    policy->Remove(*victim);
    FreeRecord(t, t.slot_owner[*victim]);
    t.evictions.fetch_add(1, std::memory_order_relaxed);
    stats_->evictions.Add();
  }
}

absl::StatusOr<uint32_t> BlockCache::Lookup(SessionHoldings& s, std::span<const BlockKey> keys,
                                            bool lease, uint64_t* lease_id,
                                            std::span<BlockLocation> out) {
  *lease_id = 0;
  if (lease && s.leases.size() >= opts_.max_leases_per_session) {
    return CodedStatus(KVTIER_EBUSY, absl::StrCat("this session holds ", s.leases.size(),
                                                  " leases (ipc.max_leases_per_session); release some"));
  }
  TenantState& t = *tenants_[s.ns.tenant];
  std::vector<BlockRecord*> pinned;
  uint32_t hit = 0;
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
    BlockRecord* r;
    {
      MutexLock l(&sh.mu);
      r = BlockIndex::Find(sh, s.ns.handle, keys[i]);
      if (r == nullptr || r->state != BlockState::kReady) break;
      out[i] = BlockLocation{TierKind::kHost, r->arena_offset, false};
      if (lease) {
        if (r->pins++ == 0) t.pinned.fetch_add(1, std::memory_order_relaxed);
        pinned.push_back(r);
      }
    }
    ++hit;
    if (i + kWindow < keys.size()) prefetch(i + kWindow);
  }
  for (size_t i = hit; i < keys.size(); ++i) out[i] = BlockLocation{};

  if (!lease) {
    stats_->probes.Add();
    return hit;
  }
  stats_->lookups.Add();
  stats_->blocks_queried.Add(keys.size());
  stats_->tokens_queried.Add(keys.size() * s.ns.block_tokens);
  if (hit == 0) return hit;
  stats_->lookup_hits.Add();
  stats_->blocks_hit.Add(hit);
  stats_->tokens_hit.Add(uint64_t{hit} * s.ns.block_tokens);
  {
    // Pinned blocks cannot be evicted or freed, so their slots are stable.
    MutexLock l(&t.mu);
    for (BlockRecord* r : pinned) PolicyFor(t, t.host->SlotBytes(r->host_slot))->Touch(r->host_slot);
  }
  *lease_id = s.next_id++;
  s.leases.emplace(*lease_id, std::move(pinned));
  s.lease_count.fetch_add(1, std::memory_order_relaxed);
  s.pinned_blocks.fetch_add(hit, std::memory_order_relaxed);
  return hit;
}

absl::Status BlockCache::Load(SessionHoldings& s, uint64_t lease_id, std::span<const BlockKey> keys,
                              std::span<BlockLocation> out) {
  auto it = s.leases.find(lease_id);
  if (it == s.leases.end()) {
    return CodedStatus(KVTIER_ENOENT, absl::StrCat("unknown lease ", lease_id,
                                                   ": released already, or not taken by this session"));
  }
  const std::vector<BlockRecord*>& held = it->second;
  absl::flat_hash_map<BlockKey, BlockRecord*> by_key;  // built only when keys are not the lease's order
  for (size_t i = 0; i < keys.size(); ++i) {
    BlockRecord* r = nullptr;
    if (i < held.size() && held[i]->key == keys[i]) {
      r = held[i];
    } else {
      if (by_key.empty()) {
        for (BlockRecord* h : held) by_key.emplace(h->key, h);
      }
      auto f = by_key.find(keys[i]);
      if (f == by_key.end()) {
        return CodedStatus(KVTIER_EINVAL, absl::StrCat("key ", i, " of the load is not pinned by lease ",
                                                       lease_id, "; load only what lookup returned"));
      }
      r = f->second;
    }
    // A pinned record's slot never changes.
    out[i] = BlockLocation{TierKind::kHost, r->arena_offset, false};
  }
  stats_->loads.Add();
  stats_->blocks_loaded.Add(keys.size());
  stats_->bytes_loaded.Add(keys.size() * s.ns.block_bytes);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> BlockCache::StoreBegin(SessionHoldings& s, std::span<const BlockKey> keys,
                                                uint64_t* ticket, std::span<BlockLocation> out) {
  *ticket = 0;
  TenantState& t = *tenants_[s.ns.tenant];
  std::vector<BlockRecord*> created;
  std::vector<size_t> created_at;
  for (size_t i = 0; i < keys.size(); ++i) {
    out[i] = BlockLocation{};
    BlockIndex::Shard& sh = index_.ShardFor(s.ns.handle, keys[i]);
    MutexLock l(&sh.mu);
    if (BlockIndex::Find(sh, s.ns.handle, keys[i]) != nullptr) continue;  // cached or being written
    auto* r = new BlockRecord{keys[i], s.ns.handle, 0, kNoSlot, s.ns.tenant, BlockState::kWriting, false, 0};
    index_.Insert(sh, r);
    created.push_back(r);
    created_at.push_back(i);
  }
  stats_->stores.Add();
  stats_->blocks_already_present.Add(keys.size() - created.size());
  for (size_t j = 0; j < created.size(); ++j) {
    BlockRecord* r = created[j];
    absl::StatusOr<SlotHandle> slot = AllocateSlot(t, s.ns.block_bytes, r);
    if (!slot.ok()) {
      // All or nothing: give back what this request took.
      MutexLock l(&t.mu);
      for (BlockRecord* r : created) {
        BlockIndex::Shard& sh = index_.ShardFor(r);
        {
          MutexLock sl(&sh.mu);
          index_.Erase(sh, r);
        }
        FreeRecord(t, r);
      }
      return slot.status();
    }
    const uint64_t offset = t.host->ArenaOffset(*slot);
    {
      BlockIndex::Shard& sh = index_.ShardFor(r);
      MutexLock sl(&sh.mu);
      r->host_slot = *slot;
      r->arena_offset = offset;
    }
    out[created_at[j]] = BlockLocation{TierKind::kHost, offset, true};
  }
  if (created.empty()) return 0u;
  *ticket = s.next_id++;
  const uint32_t needed = static_cast<uint32_t>(created.size());
  s.tickets.emplace(*ticket, std::move(created));
  return needed;
}

absl::Status BlockCache::StoreCommit(SessionHoldings& s, uint64_t ticket) {
  auto it = s.tickets.find(ticket);
  if (it == s.tickets.end()) {
    return CodedStatus(KVTIER_ENOENT, absl::StrCat("unknown store ticket ", ticket,
                                                   ": committed or aborted already, or not this session's"));
  }
  TenantState& t = *tenants_[s.ns.tenant];
  {
    MutexLock l(&t.mu);
    for (BlockRecord* r : it->second) {
      {
        BlockIndex::Shard& sh = index_.ShardFor(r);
        MutexLock sl(&sh.mu);
        r->state = BlockState::kReady;
      }
      PolicyFor(t, t.host->SlotBytes(r->host_slot))->Insert(r->host_slot);
    }
  }
  stats_->blocks_stored.Add(it->second.size());
  stats_->bytes_stored.Add(it->second.size() * s.ns.block_bytes);
  s.tickets.erase(it);
  return absl::OkStatus();
}

absl::Status BlockCache::StoreAbort(SessionHoldings& s, uint64_t ticket) {
  auto it = s.tickets.find(ticket);
  if (it == s.tickets.end()) {
    return CodedStatus(KVTIER_ENOENT, absl::StrCat("unknown store ticket ", ticket));
  }
  TenantState& t = *tenants_[s.ns.tenant];
  {
    MutexLock l(&t.mu);
    for (BlockRecord* r : it->second) {
      {
        BlockIndex::Shard& sh = index_.ShardFor(r);
        MutexLock sl(&sh.mu);
        index_.Erase(sh, r);
      }
      FreeRecord(t, r);
    }
  }
  stats_->store_aborts.Add();
  s.tickets.erase(it);
  return absl::OkStatus();
}

void BlockCache::Unpin(SessionHoldings& s, const std::vector<BlockRecord*>& blocks) {
  TenantState& t = *tenants_[s.ns.tenant];
  std::vector<BlockRecord*> to_free;
  for (BlockRecord* r : blocks) {
    BlockIndex::Shard& sh = index_.ShardFor(r);
    MutexLock sl(&sh.mu);
    if (--r->pins == 0) {
      t.pinned.fetch_sub(1, std::memory_order_relaxed);
      if (r->removed) to_free.push_back(r);
    }
  }
  if (!to_free.empty()) {
    // Out of the index and unpinned: nobody else can reach these records.
    MutexLock l(&t.mu);
    for (BlockRecord* r : to_free) FreeRecord(t, r);
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

uint32_t BlockCache::RemoveLocked(TenantState& t, BlockRecord* r) {
  // r was just erased from the index with removed = true, under its shard
  // lock, and its pin count read there; see callers.
  PolicyFor(t, t.host->SlotBytes(r->host_slot))->Remove(r->host_slot);
  stats_->invalidations.Add();
  return 1;
}

absl::StatusOr<uint32_t> BlockCache::Invalidate(SessionHoldings& s, std::span<const BlockKey> keys) {
  TenantState& t = *tenants_[s.ns.tenant];
  uint32_t removed = 0;
  MutexLock l(&t.mu);
  for (const BlockKey& key : keys) {
    BlockIndex::Shard& sh = index_.ShardFor(s.ns.handle, key);
    BlockRecord* r;
    uint32_t pins;
    {
      MutexLock sl(&sh.mu);
      r = BlockIndex::Find(sh, s.ns.handle, key);
      if (r == nullptr || r->state != BlockState::kReady) continue;  // writes in flight stay
      index_.Erase(sh, r);
      r->removed = true;
      pins = r->pins;
    }
    removed += RemoveLocked(t, r);
    if (pins == 0) FreeRecord(t, r);  // else the last Unpin frees it
  }
  return removed;
}

absl::StatusOr<uint32_t> BlockCache::InvalidateNamespace(SessionHoldings& s) {
  TenantState& t = *tenants_[s.ns.tenant];
  uint32_t removed = 0;
  MutexLock l(&t.mu);
  for (BlockIndex::Shard& sh : index_.shards()) {
    std::vector<std::pair<BlockRecord*, uint32_t>> victims;
    {
      MutexLock sl(&sh.mu);
      for (BlockRecord* r : sh.set) {
        if (r->ns == s.ns.handle && r->state == BlockState::kReady) victims.emplace_back(r, r->pins);
      }
      for (auto& [r, pins] : victims) {
        index_.Erase(sh, r);
        r->removed = true;
      }
    }
    for (auto& [r, pins] : victims) {
      removed += RemoveLocked(t, r);
      if (pins == 0) FreeRecord(t, r);
    }
  }
  return removed;
}

void BlockCache::CloseSession(SessionHoldings& s) {
  while (!s.tickets.empty()) (void)StoreAbort(s, s.tickets.begin()->first);
  while (!s.leases.empty()) (void)Release(s, s.leases.begin()->first);
}

std::vector<TenantUsage> BlockCache::Usage() const {
  std::vector<TenantUsage> out;
  for (const auto& t : tenants_) {
    const TierUsage u = t->host->Usage();
    out.push_back(TenantUsage{t->name, u.capacity_bytes, u.used_bytes, u.used_slots,
                              t->pinned.load(std::memory_order_relaxed),
                              t->evictions.load(std::memory_order_relaxed)});
  }
  return out;
}

}  // namespace kvtier
