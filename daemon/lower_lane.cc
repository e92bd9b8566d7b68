// SPDX-License-Identifier: Apache-2.0
#include "daemon/lower_lane.h"

#include <algorithm>

namespace kvtier {

LowerLane::LowerLane(uint8_t index, std::unique_ptr<BlockTier> tier, std::unique_ptr<EvictionPolicy> policy,
                     size_t tenants, size_t configured_tenants)
    : index(index),
      tier(std::move(tier)),
      fair_share_bytes(this->tier->Usage().capacity_bytes / std::max<size_t>(1, configured_tenants)) {
  MutexLock l(&mu);
  this->policy = std::move(policy);
  use_.resize(tenants);
}

void LowerLane::ChargeLocked(uint16_t tenant, SlotHandle slot, uint64_t payload_bytes, uint64_t tokens, int sign) {
  Use& u = use_[tenant];
  const uint64_t slot_bytes = tier->SlotBytes(slot);
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

void LowerLane::FreeSlotLocked(uint16_t tenant, SlotHandle slot, uint64_t payload_bytes, uint64_t tokens) {
  ChargeLocked(tenant, slot, payload_bytes, tokens, -1);
  owner.erase(slot);
  (void)tier->Free(slot);
}

LowerLane::Victim LowerLane::PickVictimLocked(uint16_t tenant, uint64_t bytes, bool over_quota,
                                              absl::FunctionRef<bool(BlockRecord*)> evictable) {
  const bool over_share = use_[tenant].slot_bytes + tier->SlotBytesFor(bytes) > fair_share_bytes;
  Victim out;
  enum class From { kOwn, kOthersOverShare };
  auto pick = [&](From from) {
    return policy->PickVictim([&](SlotHandle h) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      BlockRecord* v = owner.at(h);
      if (v->tenant == tenant) return from == From::kOwn && evictable(v);
      if (from == From::kOwn) return false;
      const uint64_t use = use_[v->tenant].slot_bytes;
      if (use < fair_share_bytes || use - fair_share_bytes < tier->SlotBytes(h)) {
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
