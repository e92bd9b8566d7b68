// SPDX-License-Identifier: Apache-2.0
// What the simulations (--simulate, --simulate --nodes) share: a workload's
// blocks as dense ids, and one simulated tier over them.
#ifndef KVTIER_TOOLS_REPLAY_SIM_TIER_H_
#define KVTIER_TOOLS_REPLAY_SIM_TIER_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/status.h"
#include "policies/adaptive_policy.h"
#include "policies/belady_policy.h"
#include "policies/chain_guard.h"
#include "policies/eviction_policy.h"
#include "tools/replay/workload.h"

namespace kvtier::tools {

// The pct-th percentile of a simulation's TTFTs (0 for none).
inline double TtftPercentileOf(std::vector<double> v, double pct) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(pct / 100.0 * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

struct Prepared {
  // Per request, the dense id of each of its blocks.
  std::vector<std::vector<uint32_t>> ids;
  // Per request and block, the index of the next request that uses the block
  // (BeladyPolicy::kNever: none).
  std::vector<std::vector<uint64_t>> next_use;
  uint32_t distinct = 0;
  // Per block, its parent's id (UINT32_MAX: the first block of a prompt).
  std::vector<uint32_t> parent;
};

struct KeyHash {
  size_t operator()(const BlockKey& k) const {
    uint64_t h;
    std::memcpy(&h, k.bytes.data(), sizeof(h));
    return h;
  }
};
struct KeyEq {
  bool operator()(const BlockKey& a, const BlockKey& b) const { return a.bytes == b.bytes; }
};

// with_next_use: fill next_use (for Belady).
Prepared Prepare(const Workload& w, bool with_next_use);

// One simulated tier: a policy over dense block ids and who is resident.
struct SimTier {
  std::unique_ptr<EvictionPolicy> owned;
  EvictionPolicy* pol = nullptr;
  BeladyPolicy* bel = nullptr;
  AdaptivePolicy* adaptive = nullptr;
  ChainGuard* guard = nullptr;  // every online policy: leaves before parents
  const std::vector<uint32_t>* parent = nullptr;
  std::vector<uint8_t> resident;
  uint64_t count = 0;
  uint64_t capacity = 0;

  // max_shadow_blocks: the adaptive policy's shadow size (as kvtierd's by default).
  absl::Status Init(const std::string& policy, uint32_t distinct, uint64_t cap, const std::vector<uint32_t>& parents,
                    uint64_t max_shadow_blocks = AdaptivePolicy::kDefaultMaxShadowBlocks) {
    parent = &parents;
    if (policy == "belady") {
      // No guard: a parent is used whenever its child is, so it is never
      // needed later than the child, and ties go to the deeper block.
      auto b = std::make_unique<BeladyPolicy>();
      bel = b.get();
      owned = std::move(b);
    } else {
      ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> inner, MakeEvictionPolicy(policy));
      adaptive = dynamic_cast<AdaptivePolicy*>(inner.get());
      if (adaptive != nullptr) {
        adaptive->SetCapacityBlocks(cap);
        adaptive->SetMaxShadowBlocks(max_shadow_blocks);
      }
      auto g = std::make_unique<ChainGuard>(std::move(inner));
      guard = g.get();
      owned = std::move(g);
    }
    pol = owned.get();
    resident.assign(distinct, 0);
    capacity = cap;
    return absl::OkStatus();
  }
  bool Has(uint32_t id) const { return resident[id] != 0; }
  // Whether the policy learns from requests (Observe), as kvtierd feeds it
  // each lookup's chain.
  bool Observes() const { return adaptive != nullptr || (pol != nullptr && pol->ObservesRequests()); }
  // One request's chain of block ids, root first, in blocks of block_tokens,
  // of which the tiers held the first `held` (its hit prefix).
  void Observe(const std::vector<uint32_t>& ids, uint64_t block_tokens, size_t held, std::vector<uint64_t>& chain) {
    chain.clear();
    for (uint32_t id : ids) chain.push_back(uint64_t{id} + 1);
    if (pol->ObservesRequests()) pol->ObserveRequest(chain, {}, static_cast<uint32_t>(block_tokens), held);
    if (adaptive != nullptr) adaptive->Observe(chain, static_cast<uint32_t>(block_tokens));
  }
  // position: tokens before the block in the chain it is stored with.
  void Access(uint32_t id, uint64_t position) {
    if (resident[id]) {
      pol->Touch(id);
      return;
    }
    if (guard != nullptr) {
      const uint32_t par = (*parent)[id];
      guard->InsertInChain(id, uint64_t{id} + 1, par == UINT32_MAX ? 0 : uint64_t{par} + 1, position);
    } else {
      pol->InsertAt(id, uint64_t{id} + 1, position);
    }
    resident[id] = 1;
    ++count;
  }
  void Drop(uint32_t id) {
    pol->Remove(id);
    resident[id] = 0;
    --count;
  }
};

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_SIM_TIER_H_
