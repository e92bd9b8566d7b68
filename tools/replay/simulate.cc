// SPDX-License-Identifier: Apache-2.0
#include "tools/replay/simulate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "policies/adaptive_policy.h"
#include "policies/belady_policy.h"
#include "policies/chain_guard.h"
#include "policies/eviction_policy.h"
#include "policies/reuse_gate.h"
#include "tools/replay/hold_optimum.h"
#include "tools/replay/sim_tier.h"

namespace kvtier::tools {

Prepared Prepare(const Workload& w, bool with_next_use) {
  Prepared p;
  absl::flat_hash_map<BlockKey, uint32_t, KeyHash, KeyEq> ids;
  p.ids.resize(w.requests.size());
  for (size_t r = 0; r < w.requests.size(); ++r) {
    for (const BlockKey& k : w.requests[r].keys) {
      auto [it, fresh] = ids.try_emplace(k, p.distinct);
      if (fresh) {
        ++p.distinct;
        p.parent.push_back(p.ids[r].empty() ? UINT32_MAX : p.ids[r].back());
      }
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


double SimRow::TtftPercentile(double pct) const {
  return TtftPercentileOf(ttft_s, pct);
}

nlohmann::json SimRow::ToJson() const {
  const bool unbounded = capacity_blocks == 0 && policy == "infinite";
  nlohmann::json cap{{"host", unbounded ? nlohmann::json("infinite") : nlohmann::json(capacity_tokens)}};
  if (nvme_blocks > 0) cap["nvme"] = nvme_tokens;
  nlohmann::json j{{"policy", policy},
                   {"default", is_default},
                   {"capacity_tokens", cap},
                   {"requests", requests},
                   {"token_hit_rate", token_hit_rate()},
                   {"token_hit_rate_host", blocks_requested ? double(blocks_hit_host) / double(blocks_requested) : 0},
                   {"token_hit_rate_nvme", blocks_requested ? double(blocks_hit_nvme) / double(blocks_requested) : 0},
                   {"request_hit_rate", request_hit_rate()},
                   {"reused_token_ratio", reused_token_ratio()},
                   {"prefill_seconds_saved", prefill_seconds_saved},
                   {"ttft_p50_s", TtftPercentile(50)},
                   {"ttft_p95_s", TtftPercentile(95)},
                   {"requests_slower_than_no_cache", requests_slower_than_no_cache},
                   {"blocks_requested", blocks_requested},
                   {"blocks_hit", blocks_hit},
                   {"nvme_hits_recomputed", nvme_hits_recomputed},
                   {"blocks_inserted", blocks_inserted},
                   {"evictions", evictions},
                   {"demotions", demotions},
                   {"demotions_refused", demotions_refused},
                   {"nvme_write_amplification", bytes_read_nvme ? double(bytes_written_nvme) / double(bytes_read_nvme) : 0.0},
                   {"nvme_evictions", nvme_evictions},
                   {"bytes_written_nvme", bytes_written_nvme},
                   {"nvme_writes_read", nvme_writes_read},
                   {"bytes_read_nvme", bytes_read_nvme},
                   {"bytes_read_host", bytes_read_host},
                   {"seconds", seconds}};
  if (IsCountsOnlyRow(policy)) {  // no times, and none of the tier's own counters
    for (const char* k : {"request_hit_rate", "prefill_seconds_saved", "ttft_p50_s", "ttft_p95_s",
                          "requests_slower_than_no_cache", "nvme_hits_recomputed", "blocks_inserted", "evictions",
                          "demotions", "demotions_refused", "nvme_write_amplification", "nvme_evictions",
                          "bytes_written_nvme", "nvme_writes_read", "bytes_read_nvme", "bytes_read_host"}) {
      j[k] = nullptr;
    }
  }
  return j;
}


namespace {

// The hold optimum's and the hold oracle's rows: hit counts of the host
// tier alone.
absl::StatusOr<SimRow> CountsOnlyRow(const Workload& w, const std::string& policy, const SimOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opts.infinite || opts.capacity_blocks == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(policy, " is for a tier with room; an unbounded one hits everything"));
  }
  if (opts.nvme_blocks > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(policy, " models the host tier alone; drop the NVMe tier or the policy"));
  }
  const Prepared p = Prepare(w, true);
  SimRow row;
  row.policy = policy;
  row.capacity_blocks = opts.capacity_blocks;
  row.capacity_tokens = opts.capacity_blocks * w.block_tokens;
  row.requests = w.requests.size();
  for (const Request& r : w.requests) row.prompt_tokens += r.prompt_tokens;
  if (policy == kHoldOptimumPolicy) {
    ASSIGN_OR_RETURN(HoldOptimum b, ComputeHoldOptimum(w, p, opts.capacity_blocks));
    row.blocks_requested = b.requested;
    // Rounded up: an optimum of a relaxed family.
    row.blocks_hit = static_cast<uint64_t>(std::ceil(b.hits - 1e-9));
  } else {
    ASSIGN_OR_RETURN(HoldOracle h, SimulateHoldOracle(w, p, opts.capacity_blocks));
    row.blocks_requested = h.requested;
    row.blocks_hit = h.hits;
  }
  row.blocks_hit_host = row.blocks_hit;
  row.tokens_reused = row.blocks_hit * w.block_tokens;
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return row;
}

}  // namespace

absl::StatusOr<SimRow> SimulatePolicy(const Workload& w, const std::string& policy, const SimOptions& opts) {
  if (IsCountsOnlyRow(policy)) return CountsOnlyRow(w, policy, opts);
  const auto t0 = std::chrono::steady_clock::now();
  const bool infinite = opts.infinite || policy == "infinite";
  const bool none = policy == "none";
  const bool belady = policy == "belady";
  const bool cached = !infinite && !none;
  if (cached && opts.capacity_blocks == 0) return absl::InvalidArgumentError("the simulated host tier has no capacity");
  const bool with_nvme = cached && opts.nvme_blocks > 0;
  const Prepared p = Prepare(w, belady);
  SimTier host, nvme;
  if (cached) {
    RETURN_IF_ERROR(host.Init(policy, p.distinct, opts.capacity_blocks, p.parent, opts.max_shadow_blocks));
    if (with_nvme) {
      if (IsHostOnlyPolicy(opts.nvme_policy)) {
        return absl::InvalidArgumentError(
            absl::StrCat("the NVMe tier's policy cannot be ", opts.nvme_policy, " (as in the daemon)"));
      }
      RETURN_IF_ERROR(nvme.Init(belady ? "belady" : opts.nvme_policy, p.distinct, opts.nvme_blocks, p.parent));
    }
  } else {
    host.resident.assign(p.distinct, 0);
  }
  const PrefillCalibration cal(opts.prefill_flops_per_s);
  const uint64_t bt = w.block_tokens;
  const uint64_t block_bytes = bt * opts.model.KvBytesPerToken();

  SimRow row;
  row.policy = infinite ? "infinite" : policy;
  row.is_default = cached && policy == opts.default_policy;
  row.capacity_blocks = cached ? opts.capacity_blocks : 0;
  row.capacity_tokens = row.capacity_blocks * bt;
  row.nvme_blocks = with_nvme ? opts.nvme_blocks : 0;
  row.nvme_tokens = row.nvme_blocks * bt;
  row.ttft_s.reserve(w.requests.size());
  std::vector<uint32_t> pinned_mark(p.distinct, UINT32_MAX);  // request index that pins it
  // Per block, whether its NVMe copy was written and not yet read.
  std::vector<uint8_t> nvme_unread(with_nvme ? p.distinct : 0, 0);
  // The NVMe tier's admission gate, as the daemon's (tiers.nvme.admission_min_uses).
  // Its history as kvtierd sizes it for tiers of these bytes.
  ReuseGate gate(with_nvme && !belady ? opts.nvme_admit_uses : 1,
                 8 * ReuseGate::HistoryUsesFor((opts.capacity_blocks + opts.nvme_blocks) * block_bytes));
  std::vector<uint64_t> chain;
  std::vector<size_t> needed;  // a store's blocks not in host memory, by depth
  if (opts.gpus == 0) return absl::InvalidArgumentError("the simulation needs at least one GPU");
  std::priority_queue<double, std::vector<double>, std::greater<double>> gpu_free;
  for (uint32_t g = 0; g < opts.gpus; ++g) gpu_free.push(0);
  for (size_t r = 0; r < w.requests.size(); ++r) {
    const Request& req = w.requests[r];
    const std::vector<uint32_t>& ids = p.ids[r];
    if (cached && ids.size() > opts.capacity_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r + 1, " has ", ids.size(),
                                                     " blocks, more than the simulated tier holds (",
                                                     opts.capacity_blocks, "); give it more capacity"));
    }
    ++row.requests;
    row.prompt_tokens += req.prompt_tokens;
    row.blocks_requested += ids.size();

    // The loaded prefix: host hits, NVMe hits worth loading.
    size_t hit = 0, from_nvme = 0;
    double load_s = 0;
    for (; hit < ids.size(); ++hit) {
      const uint32_t id = ids[hit];
      if (!none && host.Has(id)) {
        load_s += opts.host.LoadSeconds(block_bytes);
        continue;
      }
      if (with_nvme && nvme.Has(id)) {
        if (opts.cost_aware_loads &&
            DecideHit(opts.model, cal, hit * bt, bt, block_bytes, opts.nvme) == HitDecision::kRecompute) {
          ++row.nvme_hits_recomputed;
          break;
        }
        load_s += opts.nvme.LoadSeconds(block_bytes) + opts.host.LoadSeconds(block_bytes);
        ++from_nvme;
        if (nvme_unread[id]) {
          nvme_unread[id] = 0;
          ++row.nvme_writes_read;
        }
        continue;
      }
      break;
    }
    row.blocks_hit += hit;
    row.blocks_hit_nvme += from_nvme;
    row.blocks_hit_host += hit - from_nvme;
    row.bytes_read_nvme += from_nvme * block_bytes;
    row.bytes_read_host += hit * block_bytes;
    row.tokens_reused += hit * bt;
    if (hit > 0) ++row.requests_hit;

    // One GPU, requests in arrival order.
    const uint64_t reused = std::min<uint64_t>(hit * bt, req.prompt_tokens);
    const double compute_s = opts.model.PrefillFlops(reused, req.prompt_tokens - reused) / cal.flops_per_second();
    const double full_s = opts.model.PrefillFlops(0, req.prompt_tokens) / cal.flops_per_second();
    row.prefill_seconds_saved += full_s - compute_s;
    const double arrival = double(req.arrival_ms) / 1000.0;
    const double start = std::max(arrival, gpu_free.top());
    gpu_free.pop();
    const double done = start + load_s + compute_s + opts.prefill_overhead_s;
    gpu_free.push(done);
    row.ttft_s.push_back(done - arrival);

    if (none) continue;
    if (infinite) {
      for (uint32_t id : ids) {
        if (!host.resident[id]) ++row.blocks_inserted;
        host.resident[id] = 1;
      }
      continue;
    }
    if (gate.enabled()) {
      for (uint32_t id : ids) gate.Record(uint64_t{id} + 1);
    }
    if (host.Observes()) host.Observe(ids, bt, hit, chain);
    // One host eviction (the victim demoted to NVMe, or dropped).
    auto evict_one = [&](absl::FunctionRef<bool(uint32_t)> evictable) {
      std::optional<uint32_t> v = host.pol->PickVictim(evictable);
      if (!v) return false;
      host.Drop(*v);
      ++row.evictions;
      if (with_nvme && opts.demote && !nvme.Has(*v) && !gate.Admit(uint64_t{*v} + 1)) {
        ++row.demotions_refused;
      } else if (with_nvme && opts.demote && !nvme.Has(*v)) {
        nvme.Access(*v, 0);  // NVMe's LRU ignores positions
        ++row.demotions;
        row.bytes_written_nvme += block_bytes;
        nvme_unread[*v] = 1;
        while (nvme.count > nvme.capacity) {
          std::optional<uint32_t> nv = nvme.pol->PickVictim([](uint32_t) { return true; });
          if (!nv) break;
          nvme.Drop(*nv);
          nvme_unread[*nv] = 0;
          ++row.nvme_evictions;
        }
      }
      return true;
    };
    if (belady) {
      // The bound: the hit prefix is pinned while the request runs; every
      // block is touched or inserted leaves first, then the tier evicts down
      // to capacity (a new block may be its own victim: MIN with bypass).
      for (size_t j = 0; j < hit; ++j) pinned_mark[ids[j]] = static_cast<uint32_t>(r);
      for (size_t j = ids.size(); j-- > 0;) {
        const uint32_t id = ids[j];
        host.bel->SetNextUse(id, p.next_use[r][j], static_cast<uint32_t>(j));
        if (with_nvme) nvme.bel->SetNextUse(id, p.next_use[r][j], static_cast<uint32_t>(j));
        if (!host.Has(id)) ++row.blocks_inserted;
        host.Access(id, j * bt);  // NVMe hits are promoted; NVMe keeps its copy
        if (with_nvme && nvme.Has(id)) nvme.Access(id, j * bt);
      }
      while (host.count > host.capacity && evict_one([&](uint32_t h) { return pinned_mark[h] != r; })) {
      }
    } else {
      // Online policies decide as in kvtierd, step by step (daemon/
      // block_store.cc, block_writes.cc), so the simulator measures what the
      // daemon does: the lookup touches the host hits, leaves first; the
      // load promotes the NVMe hits, each taking a host slot while the hit
      // prefix is leased; the engine releases the lease and stores what
      // missed: the store takes a slot per block, root first, evicting when
      // the tier is full (its own new blocks are not in the policy yet), and
      // its commit inserts them, leaves first.
      for (size_t j = hit; j-- > 0;) {
        if (host.Has(ids[j])) host.Access(ids[j], j * bt);
        if (with_nvme && nvme.Has(ids[j])) nvme.Access(ids[j], j * bt);
      }
      for (size_t j = 0; j < hit; ++j) pinned_mark[ids[j]] = static_cast<uint32_t>(r);
      for (size_t j = 0; j < hit; ++j) {
        if (host.Has(ids[j])) continue;
        while (host.count + 1 > host.capacity && evict_one([&](uint32_t h) { return pinned_mark[h] != r; })) {
        }
        host.Access(ids[j], j * bt);
        ++row.blocks_inserted;
      }
      for (size_t j = 0; j < hit; ++j) pinned_mark[ids[j]] = UINT32_MAX;  // released
      needed.clear();
      for (size_t j = hit; j < ids.size(); ++j) {
        if (!host.Has(ids[j])) needed.push_back(j);
      }
      for (size_t k = 0; k < needed.size(); ++k) {
        while (host.count + k + 1 > host.capacity && evict_one([](uint32_t) { return true; })) {
        }
      }
      for (size_t k = needed.size(); k-- > 0;) {
        const size_t j = needed[k];
        if (host.Has(ids[j])) continue;
        host.Access(ids[j], j * bt);
        ++row.blocks_inserted;
      }
    }
    if (host.count > host.capacity) {
      return absl::InternalError(absl::StrCat("policy ", policy, " found no victim at request ", r + 1));
    }
  }
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return row;
}

absl::StatusOr<std::vector<SimRow>> Simulate(const Workload& w, const SimOptions& opts) {
  ASSIGN_OR_RETURN(SimRow no_cache, SimulatePolicy(w, "none", opts));
  auto compare = [&](SimRow& row) {
    for (size_t i = 0; i < row.ttft_s.size() && i < no_cache.ttft_s.size(); ++i) {
      if (row.ttft_s[i] > no_cache.ttft_s[i] + 1e-9) ++row.requests_slower_than_no_cache;
    }
  };
  std::vector<SimRow> rows;
  if (opts.infinite) {
    ASSIGN_OR_RETURN(SimRow row, SimulatePolicy(w, "infinite", opts));
    compare(row);
    rows.push_back(std::move(row));
    return rows;
  }
  for (const std::string& pol : opts.policies) {
    ASSIGN_OR_RETURN(SimRow row, SimulatePolicy(w, pol, opts));
    compare(row);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace kvtier::tools
