#include "tools/replay/simulate.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "policies/belady_policy.h"
#include "policies/eviction_policy.h"

namespace kvtier::tools {
namespace {

struct Prepared {
  // Per request, the dense id of each of its blocks.
  std::vector<std::vector<uint32_t>> ids;
  // Per request and block, the index of the next request that uses the block
  // (BeladyPolicy::kNever: none).
  std::vector<std::vector<uint64_t>> next_use;
  uint32_t distinct = 0;
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

Prepared Prepare(const Workload& w, bool with_next_use) {
  Prepared p;
  absl::flat_hash_map<BlockKey, uint32_t, KeyHash, KeyEq> ids;
  p.ids.resize(w.requests.size());
  for (size_t r = 0; r < w.requests.size(); ++r) {
    for (const BlockKey& k : w.requests[r].keys) {
      auto [it, fresh] = ids.try_emplace(k, p.distinct);
      if (fresh) ++p.distinct;
      p.ids[r].push_back(it->second);
    }
  }
  if (with_next_use) {
    p.next_use.resize(w.requests.size());
    std::vector<uint64_t> next(p.distinct, BeladyPolicy::kNever);
    for (size_t r = w.requests.size(); r-- > 0;) {
      p.next_use[r].resize(p.ids[r].size());
      for (size_t j = 0; j < p.ids[r].size(); ++j) p.next_use[r][j] = next[p.ids[r][j]];
      for (uint32_t id : p.ids[r]) next[id] = r;
    }
  }
  return p;
}

}  // namespace

nlohmann::json SimRow::ToJson() const {
  return nlohmann::json{{"policy", policy},
                        {"default", is_default},
                        {"capacity_tokens", nlohmann::json{{"host", capacity_blocks ? nlohmann::json(capacity_tokens)
                                                                                    : nlohmann::json("infinite")}}},
                        {"capacity_blocks", nlohmann::json{{"host", capacity_blocks}}},
                        {"requests", requests},
                        {"token_hit_rate", token_hit_rate()},
                        {"request_hit_rate", request_hit_rate()},
                        {"reused_token_ratio", reused_token_ratio()},
                        {"blocks_requested", blocks_requested},
                        {"blocks_hit", blocks_hit},
                        {"blocks_inserted", blocks_inserted},
                        {"evictions", evictions},
                        {"seconds", seconds}};
}

absl::StatusOr<SimRow> SimulatePolicy(const Workload& w, const std::string& policy, const SimOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool belady = policy == "belady";
  const bool infinite = opts.infinite || policy == "infinite";
  std::unique_ptr<EvictionPolicy> owned;
  BeladyPolicy* bel = nullptr;
  if (belady) {
    auto b = std::make_unique<BeladyPolicy>();
    bel = b.get();
    owned = std::move(b);
  } else if (!infinite) {
    ASSIGN_OR_RETURN(owned, MakeEvictionPolicy(policy));
  }
  if (!infinite && opts.capacity_blocks == 0) return absl::InvalidArgumentError("the simulated tier has no capacity");
  EvictionPolicy* pol = owned.get();
  const Prepared p = Prepare(w, belady);

  SimRow row;
  row.policy = infinite ? "infinite" : policy;
  row.is_default = !infinite && policy == opts.default_policy;
  row.capacity_blocks = infinite ? 0 : opts.capacity_blocks;
  row.capacity_tokens = row.capacity_blocks * w.block_tokens;
  std::vector<uint8_t> resident(p.distinct, 0);
  std::vector<uint32_t> pinned_mark(p.distinct, UINT32_MAX);  // request index that pins it
  uint64_t resident_count = 0;
  for (size_t r = 0; r < w.requests.size(); ++r) {
    const std::vector<uint32_t>& ids = p.ids[r];
    if (!infinite && ids.size() > opts.capacity_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r + 1, " has ", ids.size(),
                                                     " blocks, more than the simulated tier holds (",
                                                     opts.capacity_blocks, "); give it more capacity"));
    }
    ++row.requests;
    row.prompt_tokens += w.requests[r].prompt_tokens;
    row.blocks_requested += ids.size();
    size_t hit = 0;
    while (hit < ids.size() && resident[ids[hit]]) ++hit;
    row.blocks_hit += hit;
    row.tokens_reused += hit * w.block_tokens;
    if (hit > 0) ++row.requests_hit;
    if (infinite) {
      for (uint32_t id : ids) {
        if (!resident[id]) ++row.blocks_inserted;
        resident[id] = 1;
      }
      continue;
    }
    // The hit prefix is pinned (leased) while the request runs.
    for (size_t j = 0; j < hit; ++j) pinned_mark[ids[j]] = static_cast<uint32_t>(r);
    // Leaves first, parents last: a parent is always more recent than its
    // children, so recency-based policies evict leaves before parents.
    for (size_t j = ids.size(); j-- > 0;) {
      const uint32_t id = ids[j];
      if (bel) bel->SetNextUse(id, p.next_use[r][j], static_cast<uint32_t>(j));
      if (resident[id]) {
        pol->Touch(id);
        continue;
      }
      pol->InsertWithKey(id, uint64_t{id} + 1);
      resident[id] = 1;
      ++resident_count;
      ++row.blocks_inserted;
    }
    while (resident_count > opts.capacity_blocks) {
      std::optional<uint32_t> v = pol->PickVictim([&](uint32_t h) { return pinned_mark[h] != r; });
      if (!v) break;  // cannot happen: the request fits and only its prefix is pinned
      pol->Remove(*v);
      resident[*v] = 0;
      --resident_count;
      ++row.evictions;
    }
    if (resident_count > opts.capacity_blocks) {
      return absl::InternalError(absl::StrCat("policy ", policy, " found no victim at request ", r + 1));
    }
  }
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return row;
}

absl::StatusOr<std::vector<SimRow>> Simulate(const Workload& w, const SimOptions& opts) {
  std::vector<SimRow> rows;
  if (opts.infinite) {
    ASSIGN_OR_RETURN(SimRow row, SimulatePolicy(w, "infinite", opts));
    rows.push_back(std::move(row));
    return rows;
  }
  for (const std::string& pol : opts.policies) {
    ASSIGN_OR_RETURN(SimRow row, SimulatePolicy(w, pol, opts));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace kvtier::tools
