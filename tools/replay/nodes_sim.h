// SPDX-License-Identifier: Apache-2.0
// kvtier-replay --simulate --nodes N: the trace served by N kvtierd nodes,
// each with its own host and NVMe tiers and GPUs, with and without a shared
// remote tier (a Redis Cluster) under them, no daemon, a simulated clock.
//
// A router sends each request to one node:
//   round-robin  request i to node i mod N;
//   affinity     every request of one conversation to the same node (a
//                conversation: a request whose chain extends an earlier
//                request's whole chain is that one's next turn, and a turn
//                has one next turn; the conversation's id is hashed to a
//                node);
//   prefix       the node where the request would finish its prefill
//                first: the wait for a free GPU there plus the prefill of
//                what its local tiers lack (a KV-aware router's estimate).
// On its node a request loads its prefix as the daemon does: host hits, NVMe
// hits worth loading, then (pooled) blocks the remote tier holds, each
// priced by the cost model against recomputing it; the first free GPU of
// the node serves it (TTFT includes queueing); the node then holds every
// block of the request in host memory (remote and NVMe hits promoted).
// Host evictions go to NVMe, NVMe evictions to the remote tier (write
// policy "demoted"), or every block a request computed goes to the remote
// tier at once ("committed"). The remote tier evicts by LRU at its capacity,
// as a cluster with maxmemory-policy allkeys-lru; a remote hit touches it.
#ifndef KVTIER_TOOLS_REPLAY_NODES_SIM_H_
#define KVTIER_TOOLS_REPLAY_NODES_SIM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/replay/simulate.h"
#include "tools/replay/workload.h"

namespace kvtier::tools {

struct NodesSimOptions {
  // Per node: capacity_blocks (host), nvme_blocks (0: none), gpus, the
  // model and the speeds; policies[0] is the host policy (default the
  // daemon's), nvme_policy NVMe's.
  SimOptions node;
  uint32_t nodes = 2;
  std::string routing = "prefix";  // round-robin, affinity, prefix
  uint64_t remote_blocks = 0;      // the shared tier; 0: local tiers only
  std::string write_policy = "demoted";  // demoted or committed
  TierSpeed remote{3.1e9, 200e-6};  // cluster -> host: 25 Gb/s, a round trip
};

struct NodesSimRow {
  uint32_t nodes = 0;
  std::string routing;
  bool pooled = false;  // with the remote tier
  uint64_t remote_blocks = 0;
  uint64_t requests = 0, prompt_tokens = 0;
  uint64_t blocks_requested = 0, blocks_hit = 0, blocks_hit_host = 0, blocks_hit_nvme = 0, blocks_hit_remote = 0;
  uint64_t remote_hits_recomputed = 0;  // slower to load than to recompute
  uint64_t remote_writes = 0, remote_evictions = 0;
  uint64_t bytes_read_remote = 0, bytes_written_remote = 0;
  std::vector<double> ttft_s;  // per request, in trace order
  std::vector<uint64_t> requests_per_node;
  double seconds = 0;

  double token_hit_rate() const { return blocks_requested ? double(blocks_hit) / double(blocks_requested) : 0; }
  double TtftPercentile(double p) const;
  nlohmann::json ToJson() const;
};

inline constexpr const char* kRoutings[] = {"round-robin", "affinity", "prefix"};

// Errors: an unknown routing, policy or write policy, no nodes, no host
// capacity, a request with more blocks than a node's host tier holds.
absl::StatusOr<NodesSimRow> SimulateNodes(const Workload& w, const NodesSimOptions& opts);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_NODES_SIM_H_
