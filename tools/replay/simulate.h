// kvtier-replay --simulate: the daemon's eviction policies on a simulated
// tier, no daemon, no payloads. Each request looks up its prefix (the hit
// blocks are pinned while it runs), then stores every block it had to
// compute; the tier evicts by the policy under test. Offline Belady (evict
// the block used again furthest in the future) is the bound.
//
// This first version simulates the host tier alone, counts hits, and has
// no clock: multi-tier runs, the cost model and TTFT come with the rest of
// the policy work.
#ifndef KVTIER_TOOLS_REPLAY_SIMULATE_H_
#define KVTIER_TOOLS_REPLAY_SIMULATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/replay/workload.h"

namespace kvtier::tools {

struct SimOptions {
  uint64_t capacity_blocks = 0;  // the host tier; 0 with infinite
  bool infinite = false;         // one row with unbounded capacity instead
  std::vector<std::string> policies = {"lru", "s3fifo", "tinylfu", "belady"};
  std::string default_policy = "lru";  // the daemon's default, marked in the output
};

struct SimRow {
  std::string policy;
  bool is_default = false;
  uint64_t capacity_blocks = 0;  // 0: infinite
  uint64_t capacity_tokens = 0;
  uint64_t requests = 0, requests_hit = 0;
  uint64_t blocks_requested = 0, blocks_hit = 0;
  uint64_t prompt_tokens = 0, tokens_reused = 0;
  uint64_t blocks_inserted = 0, evictions = 0;
  double seconds = 0;  // wall time of this row's simulation

  double token_hit_rate() const { return blocks_requested ? double(blocks_hit) / double(blocks_requested) : 0; }
  double request_hit_rate() const { return requests ? double(requests_hit) / double(requests) : 0; }
  double reused_token_ratio() const { return prompt_tokens ? double(tokens_reused) / double(prompt_tokens) : 0; }
  nlohmann::json ToJson() const;
};

// Keys must be filled (a synthetic chat's are computed by the caller).
// Errors: an unknown policy name, a request with more blocks than the tier
// holds.
absl::StatusOr<SimRow> SimulatePolicy(const Workload& w, const std::string& policy, const SimOptions& opts);
// Every policy in opts.policies (or the infinite row), in order.
absl::StatusOr<std::vector<SimRow>> Simulate(const Workload& w, const SimOptions& opts);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_SIMULATE_H_
