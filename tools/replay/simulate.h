// SPDX-License-Identifier: Apache-2.0
// kvtier-replay --simulate: the daemon's eviction policies on simulated
// tiers, no daemon, no payloads, a simulated clock. Each request looks up its
// prefix (host hits, then NVMe hits; the hit prefix is pinned while it runs),
// the first free of N GPUs serves it, in arrival order (so TTFT includes
// queueing),
// loading hit blocks and recomputing the rest, then the request stores every
// block it computed. Host evictions are demoted to the NVMe tier (when there
// is one) or dropped; NVMe evictions are dropped. Offline Belady (evict the
// block used again furthest in the future) is the bound.
//
// Times come from the cost model (policies/cost_model.h): prefill of the
// missed tokens at the calibrated throughput; loads at each tier's bandwidth
// and latency. With cost-aware loads, an NVMe hit slower to load than to
// recompute is recomputed (and ends the loaded prefix).
#ifndef KVTIER_TOOLS_REPLAY_SIMULATE_H_
#define KVTIER_TOOLS_REPLAY_SIMULATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "policies/adaptive_policy.h"
#include "policies/cost_model.h"
#include "policies/eviction_policy.h"
#include "tools/replay/workload.h"

namespace kvtier::tools {

// The row that is no policy but the hold optimum (hold_optimum.h): the most
// a policy could hit that keeps each ask for a time fixed by the block's
// uses, position, turn and last gap, knowing their statistics in advance,
// with two rules of a real tier relaxed. It models the host tier alone.
inline constexpr absl::string_view kHoldOptimumPolicy = "hold-optimum";
// The row that runs the hold optimum's plan as a tier (hold_optimum.h,
// HoldOracle): what knowing each class's statistics in advance would hit.
inline constexpr absl::string_view kHoldOraclePolicy = "hold-oracle";
// Rows that are not tiers under the tier's rules: Belady and the hold optimum.
inline bool IsBoundRow(absl::string_view policy) { return policy == "belady" || policy == kHoldOptimumPolicy; }
// Rows with hit counts only (no times): the hold optimum and the oracle.
inline bool IsCountsOnlyRow(absl::string_view policy) {
  return policy == kHoldOptimumPolicy || policy == kHoldOraclePolicy;
}
// Rows of policies kvtierd can run (not a bound, an oracle, or no cache).
inline bool IsOnlinePolicyRow(absl::string_view policy) {
  return !IsBoundRow(policy) && policy != kHoldOraclePolicy && policy != "none" && policy != "infinite";
}

struct SimOptions {
  uint64_t capacity_blocks = 0;  // the host tier; 0 with infinite
  uint64_t nvme_blocks = 0;      // 0: no NVMe tier
  bool infinite = false;         // one row with unbounded capacity instead
  std::vector<std::string> policies = {"lru", "s3fifo", "s3fifo-deep", "tinylfu", "arc", "arc-cutoff", "adaptive", "holds", "belady"};
  std::string default_policy{kDefaultHostPolicy};  // the daemon's default, marked in the output
  std::string nvme_policy = "lru";     // as tiers.nvme.policy (belady rows: belady)
  bool demote = true;                  // host evictions go to NVMe (else dropped)
  // NVMe admission (tiers.nvme.admission_min_uses): a host eviction is
  // written to NVMe only when requests asked for it this many times (<= 1: all).
  uint32_t nvme_admit_uses = 1;
  bool cost_aware_loads = true;        // recompute NVMe hits that load slower
  // The adaptive policy's shadow size (AdaptivePolicy::Options); a tier with
  // more room is modelled on a sample of its blocks.
  uint64_t max_shadow_blocks = AdaptivePolicy::kDefaultMaxShadowBlocks;

  ModelProfile model = ModelProfile::Default();
  double prefill_flops_per_s = 300e12;
  double prefill_overhead_s = 0.002;  // per request
  uint32_t gpus = 4;                  // engines serving the trace, each one request at a time
  TierSpeed host{25e9, 10e-6};        // host -> GPU (PCIe)
  TierSpeed nvme{3e9, 100e-6};        // NVMe -> host, then as host
};

struct SimRow {
  std::string policy;
  bool is_default = false;
  uint64_t capacity_blocks = 0;  // 0: infinite (or no cache for "none")
  uint64_t capacity_tokens = 0;
  uint64_t nvme_blocks = 0, nvme_tokens = 0;
  uint64_t requests = 0, requests_hit = 0;
  uint64_t blocks_requested = 0, blocks_hit = 0, blocks_hit_host = 0, blocks_hit_nvme = 0;
  uint64_t nvme_hits_recomputed = 0;  // NVMe hits slower to load than to recompute
  uint64_t prompt_tokens = 0, tokens_reused = 0;
  uint64_t blocks_inserted = 0, evictions = 0, demotions = 0, nvme_evictions = 0;
  uint64_t demotions_refused = 0;  // host evictions the NVMe admission gate turned away
  uint64_t bytes_written_nvme = 0, bytes_read_nvme = 0, bytes_read_host = 0;
  // Demotions whose NVMe copy a request read at least once before NVMe
  // evicted it: demotions - this is what an oracle admission gate saves.
  uint64_t nvme_writes_read = 0;
  double prefill_seconds_saved = 0;
  std::vector<double> ttft_s;  // per request, in trace order
  // Requests whose TTFT is worse than with no cache at all (Simulate fills it).
  uint64_t requests_slower_than_no_cache = 0;
  double seconds = 0;          // wall time of this row's simulation

  double token_hit_rate() const { return blocks_requested ? double(blocks_hit) / double(blocks_requested) : 0; }
  double request_hit_rate() const { return requests ? double(requests_hit) / double(requests) : 0; }
  double reused_token_ratio() const { return prompt_tokens ? double(tokens_reused) / double(prompt_tokens) : 0; }
  double TtftPercentile(double p) const;
  nlohmann::json ToJson() const;
};

// Keys must be filled (a synthetic chat's are computed by the caller).
// Policies: the eviction policy names, "belady", "hold-optimum" and
// "hold-oracle" (host tier alone: their rows have hit counts only, no
// times), "infinite" (unbounded host, no NVMe) and "none" (no cache: every
// token recomputed). Errors: an unknown policy name, a request with more
// blocks than the host tier holds, the hold optimum or the hold oracle with
// an NVMe tier.
absl::StatusOr<SimRow> SimulatePolicy(const Workload& w, const std::string& policy, const SimOptions& opts);
// Every policy in opts.policies (or the infinite row), in order.
absl::StatusOr<std::vector<SimRow>> Simulate(const Workload& w, const SimOptions& opts);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_SIMULATE_H_
