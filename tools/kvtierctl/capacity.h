// SPDX-License-Identifier: Apache-2.0
// kvtierctl capacity: the KV-cache capacity planner. From a model's
// config.json and a set of sequence lengths (or a request trace) it works out
// bytes per token (2 x layers x kv_heads x head_dim x bytes per element), the
// logical cache those sequences need, and how many tokens each tier of a
// kvtierd config holds. Needs no running daemon.
#ifndef KVTIER_TOOLS_KVTIERCTL_CAPACITY_H_
#define KVTIER_TOOLS_KVTIERCTL_CAPACITY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "nlohmann/json.hpp"
#include "policies/cost_model.h"

namespace kvtier::tools {

struct CapacityInput {
  std::string model_path;            // config.json
  std::string dtype;                 // overrides the config's torch_dtype / dtype when set
  std::vector<uint64_t> seqs;        // sequence lengths in tokens
  std::string trace_path;            // or: a Mooncake-format trace (input_length per request)
  uint32_t block_tokens = 16;        // tokens per kvtier block
  std::string config_path;           // kvtierd config; empty: its default path if present, else defaults
};

struct TierPlan {
  std::string tier;  // gpu, host, or a lower tier's name in the chain
  std::string kind;  // gpu, host, nvme, redis, fs
  uint64_t capacity_bytes = 0;
  uint64_t blocks = 0;
  uint64_t tokens = 0;
  double share_of_logical = 0;  // tokens / logical tokens (may exceed 1)
};

struct CapacityPlan {
  ModelProfile model;
  uint64_t bytes_per_token = 0;
  uint64_t block_bytes = 0;
  uint32_t block_tokens = 0;
  uint64_t sequences = 0;
  uint64_t logical_tokens = 0;
  uint64_t logical_bytes = 0;
  uint64_t distinct_trace_blocks = 0;  // a trace: distinct 512-token prefix blocks
  uint64_t trace_working_set_bytes = 0;  // those blocks' KV bytes
  std::string config_source;
  std::vector<TierPlan> tiers;
};

// InvalidArgument / NotFound naming the file and field at fault. Every input
// file is untrusted: a hostile one is an error, never a crash.
absl::StatusOr<CapacityPlan> PlanCapacity(const CapacityInput& in);
void PrintCapacity(const CapacityPlan& plan, std::ostream& out);
nlohmann::json CapacityJson(const CapacityPlan& plan);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_KVTIERCTL_CAPACITY_H_
