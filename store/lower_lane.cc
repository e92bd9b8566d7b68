// SPDX-License-Identifier: Apache-2.0
#include "store/lower_lane.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/units.h"

namespace kvtier {

LowerLane::LowerLane(uint8_t index, std::unique_ptr<BlockTier> tier, std::unique_ptr<EvictionPolicy> policy,
                     size_t tenants, size_t configured_tenants)
    : index(index),
      tier(std::move(tier)),
      fair_share_bytes(this->tier->Usage().capacity_bytes / std::max<size_t>(1, configured_tenants)),
      configured_tenants_(std::max<size_t>(1, configured_tenants)),
      keyed_(this->tier->addressed_by_key()) {
  MutexLock l(&mu);
  this->policy = std::move(policy);
  use_.resize(tenants);
}

void LowerLane::RefreshFairShare() {
  fair_share_bytes.store(tier->Usage().capacity_bytes / configured_tenants_);
}

absl::StatusOr<SlotHandle> LowerLane::NewKeyedHandleLocked(uint64_t cost) {
  const uint64_t capacity = tier->Usage().capacity_bytes;
  const uint64_t used = keyed_used_bytes_.load(std::memory_order_relaxed);
  if (used + cost > capacity) {
    return absl::ResourceExhaustedError(absl::StrCat("this node's share of the ", std::string(tier->name()),
                                                     " tier is full (", FormatBytes(capacity), ")"));
  }
  SlotHandle h;
  if (!keyed_free_.empty()) {
    h = keyed_free_.back();
    keyed_free_.pop_back();
  } else {
    if (keyed_cost_.size() >= kNoSlot) return absl::ResourceExhaustedError("out of handles");
    h = static_cast<SlotHandle>(keyed_cost_.size());
    keyed_cost_.push_back(0);
  }
  keyed_cost_[h] = std::max<uint64_t>(cost, 1);
  keyed_used_bytes_.store(used + keyed_cost_[h], std::memory_order_relaxed);
  keyed_used_.fetch_add(1, std::memory_order_relaxed);
  return h;
}

absl::StatusOr<SlotHandle> LowerLane::ReserveLocked(const BlockMeta& meta) {
  absl::StatusOr<BlockLocator> at = tier->Reserve(meta);
  if (!at.ok() || !keyed_) return at;
  return NewKeyedHandleLocked(tier->CostFor(meta.payload_bytes));
}

absl::StatusOr<SlotHandle> LowerLane::AdoptRecoveredLocked(BlockLocator at, const BlockMeta& meta) {
  if (!keyed_) return at;
  return NewKeyedHandleLocked(tier->CostFor(meta.payload_bytes));
}

uint64_t LowerLane::CostOfLocked(SlotHandle handle) const {
  if (!keyed_) return tier->CostOf(handle);
  return handle < keyed_cost_.size() ? keyed_cost_[handle] : 0;
}

TierUsage LowerLane::Usage() const {
  if (!keyed_) return tier->Usage();
  return TierUsage{.capacity_bytes = tier->Usage().capacity_bytes,
                   .used_bytes = keyed_used_bytes_.load(std::memory_order_relaxed),
                   .used_slots = keyed_used_.load(std::memory_order_relaxed)};
}

void LowerLane::ChargeLocked(uint16_t tenant, SlotHandle slot, uint64_t payload_bytes, uint64_t tokens, int sign) {
  Use& u = use_[tenant];
  const uint64_t slot_bytes = CostOfLocked(slot);
  if (sign > 0) {
    u.bytes += payload_bytes;
    u.tokens += tokens;
    u.slot_bytes += slot_bytes;
    ++u.blocks;
  } else {
    u.bytes -= std::min(u.bytes, payload_bytes);
    u.tokens -= std::min(u.tokens, tokens);
    u.slot_bytes -= std::min(u.slot_bytes, slot_bytes);
    u.blocks -= std::min<uint64_t>(u.blocks, 1);
  }
}

void LowerLane::ReadyLocked(SlotHandle handle, uint64_t key, std::optional<uint64_t> position_tokens) {
  if (position_tokens) {
    policy->InsertAt(handle, key, *position_tokens);
  } else {
    policy->InsertWithKey(handle, key);
  }
  blocks.fetch_add(1, std::memory_order_relaxed);
}

void LowerLane::UnreadyLocked(SlotHandle handle) {
  policy->Remove(handle);
  blocks.fetch_sub(1, std::memory_order_relaxed);
}

void LowerLane::ReleaseLocked(uint16_t tenant, SlotHandle slot, const BlockMeta& meta) {
  ChargeLocked(tenant, slot, meta.payload_bytes, meta.block_tokens, -1);
  owner.erase(slot);
  DropReservedLocked(slot, meta);
}

void LowerLane::DropReservedLocked(SlotHandle slot, const BlockMeta& meta) {
  if (!keyed_) {
    (void)tier->Remove(slot, meta);
    return;
  }
  (void)tier->Remove(kKeyAddressed, meta);
  if (slot < keyed_cost_.size() && keyed_cost_[slot] != 0) {
    keyed_used_bytes_.fetch_sub(keyed_cost_[slot], std::memory_order_relaxed);
    keyed_used_.fetch_sub(1, std::memory_order_relaxed);
    keyed_cost_[slot] = 0;
    keyed_free_.push_back(slot);
  }
}

LowerLane::Victim LowerLane::PickVictimLocked(uint16_t tenant, uint64_t bytes, bool over_quota,
                                              absl::FunctionRef<bool(BlockRecord*)> evictable) {
  // Read once: a reload may change it meanwhile (RefreshFairShare).
  const uint64_t fair_share = fair_share_bytes.load();
  const bool over_share = use_[tenant].slot_bytes + tier->CostFor(bytes) > fair_share;
  Victim out;
  enum class From { kOwn, kOthersOverShare };
  auto pick = [&](From from) {
    return policy->PickVictim([&](SlotHandle h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      BlockRecord* v = owner.at(h);
      if (v->tenant == tenant) return from == From::kOwn && evictable(v);
      if (from == From::kOwn) return false;
      const uint64_t use = use_[v->tenant].slot_bytes;
      if (use < fair_share || use - fair_share < CostOfLocked(h)) {
        if (!out.held_back && evictable(v)) out.held_back = true;
        return false;  // within its fair share: protected
      }
      return evictable(v);
    });
  };
  // Over its quota or share, a tenant pays with its own blocks first;
  // within its share, with those of tenants over theirs first, so a tenant
  // that flooded the tier cannot push one within its share out of its own
  // working set either.
  if (over_quota) {
    out.slot = pick(From::kOwn);
  } else if (over_share) {
    out.slot = pick(From::kOwn);
    if (!out.slot) out.slot = pick(From::kOthersOverShare);
  } else {
    out.slot = pick(From::kOthersOverShare);
    if (!out.slot) out.slot = pick(From::kOwn);
  }
  return out;
}

}  // namespace kvtier
