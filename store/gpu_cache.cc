// SPDX-License-Identifier: Apache-2.0
#include "store/gpu_cache.h"

#include <vector>

#include "events/kv_events.h"

namespace kvtier {

std::optional<GpuCache::Pin> GpuCache::Acquire(uint32_t ns, const BlockKey& key, bool count_hit) {
  MutexLock l(&mu_);
  auto it = index_.find(Id{ns, key});
  if (it == index_.end() || !it->second->visible || it->second->dropped) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  ++it->second->pins;
  if (count_hit) hits_.Add();
  return Pin{it->second->slot, tier_->SlotData(it->second->slot)};
}

std::optional<GpuCache::Pin> GpuCache::Reserve(uint32_t ns, const BlockKey& key, uint64_t bytes, uint32_t tokens) {
  MutexLock l(&mu_);
  if (index_.contains(Id{ns, key})) return std::nullopt;
  absl::StatusOr<SlotHandle> slot = tier_->Allocate(bytes);
  // Evict from the cold end, skipping pinned copies, until the block fits.
  auto victim = lru_.end();
  while (!slot.ok() && victim != lru_.begin()) {
    --victim;
    if (victim->pins > 0) continue;
    auto doomed = victim++;
    EraseLocked(doomed);
    evictions_.Add();
    slot = tier_->Allocate(bytes);
  }
  if (!slot.ok()) return std::nullopt;
  lru_.push_front(Entry{Id{ns, key}, *slot, 1, false, false, false, tokens});
  index_[Id{ns, key}] = lru_.begin();
  return Pin{*slot, tier_->SlotData(*slot)};
}

void GpuCache::Publish(uint32_t ns, const BlockKey& key) {
  MutexLock l(&mu_);
  auto it = index_.find(Id{ns, key});
  if (it == index_.end()) return;
  Entry& e = *it->second;
  e.visible = true;
  if (events_ != nullptr && !e.dropped && !e.announced) {
    e.announced = true;
    events_->Stored(tenant_, key, e.tokens, KvMedium::kGpu);
  }
}

void GpuCache::WithdrawLocked(Entry& e) {
  if (!e.announced) return;
  e.announced = false;
  if (events_ != nullptr) events_->Removed(tenant_, e.id.key, KvMedium::kGpu);
}

void GpuCache::Release(uint32_t ns, const BlockKey& key) {
  MutexLock l(&mu_);
  auto it = index_.find(Id{ns, key});
  if (it == index_.end()) return;
  Entry& e = *it->second;
  if (e.pins > 0) --e.pins;
  if (e.pins == 0 && (!e.visible || e.dropped)) EraseLocked(it->second);
}

bool GpuCache::Contains(uint32_t ns, const BlockKey& key) const {
  MutexLock l(&mu_);
  auto it = index_.find(Id{ns, key});
  return it != index_.end() && it->second->visible && !it->second->dropped;
}

void GpuCache::Drop(uint32_t ns, const BlockKey& key) {
  MutexLock l(&mu_);
  auto it = index_.find(Id{ns, key});
  if (it == index_.end()) return;
  if (it->second->pins == 0) {
    EraseLocked(it->second);
  } else {
    it->second->dropped = true;
    WithdrawLocked(*it->second);
  }
}

void GpuCache::DropNamespace(uint32_t ns) {
  MutexLock l(&mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto cur = it++;
    if (cur->id.ns != ns) continue;
    if (cur->pins == 0) {
      EraseLocked(cur);
    } else {
      cur->dropped = true;
      WithdrawLocked(*cur);
    }
  }
}

void GpuCache::EraseLocked(List::iterator it) {
  WithdrawLocked(*it);
  (void)tier_->Free(it->slot);
  index_.erase(it->id);
  lru_.erase(it);
}

GpuCache::Usage GpuCache::usage() const {
  Usage u;
  const TierUsage t = tier_->Usage();
  u.capacity_bytes = t.capacity_bytes;
  u.used_bytes = t.used_bytes;
  {
    MutexLock l(&mu_);
    for (const Entry& e : lru_) {
      u.blocks += e.visible && !e.dropped;
      u.pinned += e.pins > 0;
    }
  }
  u.hits = hits_.Get();
  u.promotions = promotions_.Get();
  u.demotions = demotions_.Get();
  u.evictions = evictions_.Get();
  return u;
}

}  // namespace kvtier
