// SPDX-License-Identifier: Apache-2.0
#include "store/host_residency.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "store/block_index.h"
#include "events/kv_events.h"
#include "policies/adaptive_policy.h"

namespace kvtier {

HostResidency::HostResidency(std::string name, uint64_t hash, std::unique_ptr<HostTier> host,
                             std::unique_ptr<GpuCache> gpu, TenantQuota quota, std::string policy, BlockIndex* index,
                             Room room)
    : name(std::move(name)),
      hash(hash),
      host(std::move(host)),
      gpu(std::move(gpu)),
      slots(index),
      policy_(std::move(policy)),
      index_(index),
      room_(room) {
  SetQuota(quota);
}

ChainGuard* HostResidency::PolicyForLocked(uint64_t slot_bytes) {
  auto it = policy_by_size.find(slot_bytes);
  if (it != policy_by_size.end()) return it->second.get();
  auto p = MakeEvictionPolicy(policy_);  // the name was checked by the caller
  if (auto* a = dynamic_cast<AdaptivePolicy*>(p->get())) {
    // The shadows hold as many blocks of this size as the arena does.
    a->SetCapacityBlocks(std::max<uint64_t>(1, host->arena_bytes() / slot_bytes));
  }
  auto guard = std::make_unique<ChainGuard>(std::move(p).value(), &owner_keys_);
  return policy_by_size.emplace(slot_bytes, std::move(guard)).first->second.get();
}

uint64_t HostResidency::OwnerKeys::KeyOf(uint32_t slot) const {
  const BlockRecord* r = slots_->owner(slot);
  return r == nullptr ? 0 : PolicyKeyOf(*r);
}

void HostResidency::AnnounceLocked(SlotHandle slot) {
  if (events == nullptr || !events->Publishes(index) || !slots.MarkAnnounced(slot)) return;
  if (const BlockRecord* r = slots.owner(slot)) events->Stored(index, r->key, slots.tokens(slot), KvMedium::kCpu);
}

void HostResidency::LeavePolicyLocked(SlotHandle slot) {
  if (events != nullptr && slots.announced(slot)) {
    if (const BlockRecord* r = slots.owner(slot)) events->Removed(index, r->key, KvMedium::kCpu);
    slots.Unannounce(slot);
  }
  PolicyForLocked(host->SlotBytes(slot))->Remove(slot);
}

void HostResidency::FreeSlotLocked(SlotHandle slot) {
  LeavePolicyLocked(slot);
  // Cannot fail: the slot was allocated for one record and is freed once.
  (void)host->Free(slot);
  slots.Release(slot);
}

bool HostResidency::FullerThanLocked(double share, uint64_t freeing_bytes, uint64_t freeing_tokens) const {
  const TierUsage u = host->Usage();
  if (double(u.used_bytes - std::min(freeing_bytes, u.used_bytes)) > share * double(u.capacity_bytes)) return true;
  const uint64_t quota = QuotaHostTokens();
  const uint64_t held = slots.tokens_held();
  return quota != 0 && double(held - std::min(freeing_tokens, held)) > share * double(quota);
}

std::vector<ChainGuard*> HostResidency::PoliciesByBytesLocked() const {
  std::vector<std::pair<uint64_t, ChainGuard*>> by_bytes;
  for (const auto& [slot_bytes, policy] : policy_by_size) {
    if (policy->size() > 0) by_bytes.emplace_back(slot_bytes * policy->size(), policy.get());
  }
  std::stable_sort(by_bytes.begin(), by_bytes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<ChainGuard*> out;
  out.reserve(by_bytes.size());
  for (const auto& [bytes, policy] : by_bytes) out.push_back(policy);
  return out;
}

std::vector<HostResidency::Segment> HostResidency::ColdSegmentsLocked(uint64_t slot_bytes,
                                                                     std::optional<uint32_t> min_age,
                                                                     size_t max) const {
  // (segment, slot) pairs: grouped by segment once sorted.
  std::vector<std::pair<uint32_t, uint32_t>> live = host->LiveSlotsOutsideClass(slot_bytes);
  std::sort(live.begin(), live.end());
  std::vector<Segment> out;
  for (size_t i = 0; i < live.size();) {
    size_t j = i;
    uint32_t youngest = UINT32_MAX;
    for (; j < live.size() && live[j].first == live[i].first; ++j) {
      youngest = std::min(youngest, slots.age(live[j].second));
    }
    if (!min_age || youngest > *min_age) {
      Segment& s = out.emplace_back();
      s.youngest = youngest;
      for (size_t k = i; k < j; ++k) s.slots.push_back(live[k].second);
    }
    i = j;
  }
  std::stable_sort(out.begin(), out.end(), [](const Segment& a, const Segment& b) { return a.youngest > b.youngest; });
  if (out.size() > max) out.resize(max);
  return out;
}

}  // namespace kvtier
