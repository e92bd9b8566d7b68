// SPDX-License-Identifier: Apache-2.0
// The store's read-only reports for admin commands and status: blocks by
// tenant or key (`kvtierctl blocks`), and each tenant's use of every tier.
// They take each lock briefly, one at a time, so a report is a consistent
// view of each block and each tenant, not of the whole store at one instant.
#include <algorithm>

#include "store/block_store.h"
#include "policies/adaptive_policy.h"

namespace kvtier {

std::vector<BlockStore::BlockInfo> BlockStore::ListBlocks(std::optional<uint16_t> tenant, size_t limit,
                                                          const BlockKey* key) {
  std::vector<BlockInfo> out;
  for (BlockIndex::Shard& sh : books_.index.shards()) {
    MutexLock sl(&sh.mu);
    BlockIndex::ForEach(sh, [&](const BlockRecord* r) {
      if (out.size() >= limit) return false;
      if (tenant && r->tenant != *tenant) return true;
      if (key != nullptr && r->key != *key) return true;
      if (!r->visible()) return true;
      BlockInfo b;
      b.key = r->key;
      b.ns = r->ns;
      b.tenant = r->tenant;
      b.on_host = r->state == BlockState::kReady;
      b.on_lower = r->lower_state == LowerState::kReady;
      b.lower = r->lower;
      // In flight only: a demotion or write-through being written, a
      // promotion being read. A block that is only on a lower tier (state
      // kNone) is at rest there.
      b.moving = r->lower_state == LowerState::kWriting || r->state == BlockState::kLoading ||
                 r->state == BlockState::kEvicting;
      b.pins = r->pins;
      b.depth = r->depth;
      out.push_back(b);
      return true;
    });
  }
  for (BlockInfo& b : out) {
    const NamespaceInfo ns = books_.InfoOf(b.ns);
    b.tokens = ns.block_tokens;
    b.bytes = ns.block_bytes;
  }
  return out;
}

std::vector<TenantUsage> BlockStore::Usage() const {
  std::vector<TenantUsage> out;
  size_t tenant = 0;
  for (const auto& t : books_.tenants) {
    const TierUsage u = t->host->Usage();
    TenantUsage& tu = out.emplace_back();
    tu.name = t->name;
    tu.capacity_bytes = u.capacity_bytes;
    tu.used_bytes = u.used_bytes;
    tu.blocks = u.used_slots;
    tu.pinned_blocks = t->pinned.load(std::memory_order_relaxed);
    tu.evictions = t->evictions.load(std::memory_order_relaxed);
    const HostResidency::Hits& h = t->hits;
    tu.lookups = h.lookups.load(std::memory_order_relaxed);
    tu.lookup_hits = h.lookup_hits.load(std::memory_order_relaxed);
    tu.blocks_queried = h.blocks_queried.load(std::memory_order_relaxed);
    tu.blocks_hit = h.blocks_hit.load(std::memory_order_relaxed);
    for (size_t i = 0; i < kMaxLowerTiers; ++i) tu.blocks_hit_lane[i] = h.blocks_hit_lane[i].load(std::memory_order_relaxed);
    tu.tokens_queried = h.tokens_queried.load(std::memory_order_relaxed);
    tu.tokens_hit = h.tokens_hit.load(std::memory_order_relaxed);
    tu.quota = t->Quota();
    tu.classes = t->host->Classes();
    for (const SlotAllocator::ClassUsage& c : tu.classes) tu.stranded_bytes += c.stranded_bytes;
    {
      if (!books_.lanes.empty()) {
        LowerLane& first = *books_.lanes[0];
        MutexLock nl(&first.mu);
        const LowerLane::Use nu = first.use(tenant);
        tu.nvme_bytes = nu.bytes;
        tu.nvme_tokens = nu.tokens;
      }
    }
    ++tenant;
    MutexLock l(&t->mu);
    tu.host_tokens = t->slots.tokens_held();
    for (const auto& [slot_bytes, policy] : t->policy_by_size) {
      PolicyUsage& pu = tu.policies.emplace_back();
      pu.slot_bytes = slot_bytes;
      pu.blocks = policy->size();
      pu.bookkeeping = policy->bookkeeping();
      pu.leader = std::string(policy->name());
      if (const auto* a = dynamic_cast<const AdaptivePolicy*>(policy->inner())) {
        pu.leader = std::string(a->leader());
        pu.switches = a->switches();
        for (const AdaptivePolicy::ExpertScore& e : a->scores()) pu.scores.emplace_back(e.name, e.score);
      }
    }
    std::sort(tu.policies.begin(), tu.policies.end(),
              [](const PolicyUsage& a, const PolicyUsage& b) { return a.slot_bytes < b.slot_bytes; });
  }
  return out;
}

}  // namespace kvtier
