// SPDX-License-Identifier: Apache-2.0
// Drives a running kvtierd with a workload the way an engine would: for each
// request a scheduling probe, a leased lookup, a load of the hit prefix with
// every byte verified, a release, and a store of the blocks it computed.
#ifndef KVTIER_TOOLS_REPLAY_REPLAYER_H_
#define KVTIER_TOOLS_REPLAY_REPLAYER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/types.h"
#include "nlohmann/json.hpp"
#include "tools/common/latency.h"
#include "tools/replay/workload.h"

namespace kvtier::tools {

struct ReplayOptions {
  // The daemons to drive: session i attaches to socket_paths[i % size]
  // (requests go to sessions by stream, so streams are spread round-robin
  // over the daemons). Empty: the default socket.
  std::vector<std::string> socket_paths;
  NamespaceDescriptor ns;   // block_tokens must match the workload's
  uint32_t sessions = 1;    // engine sessions (threads), each with its own client
  double speed = 0;         // 0: as fast as possible; else arrival times / speed
  bool progress = true;     // a progress bar on stderr
};

struct ReplayResult {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t blocks_requested = 0;
  uint64_t blocks_hit = 0;
  uint64_t blocks_hit_host = 0;  // found in host memory
  uint64_t blocks_hit_lower = 0;  // found below host memory (NVMe or a shared tier; promoted by the load)
  uint64_t load_failures = 0;    // hit, but failed to come back: recomputed
  uint64_t requests_with_hit = 0;
  uint64_t blocks_stored = 0;
  uint64_t bytes_stored = 0;
  uint64_t blocks_loaded = 0;
  uint64_t bytes_loaded = 0;
  uint64_t verify_failures = 0;
  uint64_t store_refused = 0;  // refused for room (KVTIER_ENOSPC): see store_refused_reason
  std::string store_refused_reason;  // the daemon's words for the first one
  uint64_t block_tokens = 0;
  double elapsed_s = 0;
  std::string error;  // the first failure that stopped a session
  Latencies lookup, load, store, request;
  struct PerSocket {
    std::string socket;
    uint64_t requests = 0, blocks_requested = 0, blocks_hit = 0;
  };
  std::vector<PerSocket> per_socket;  // one per daemon, in socket_paths' order

  double token_hit_rate() const;      // hit blocks / requested full blocks
  double request_hit_rate() const;    // requests reusing at least one block
  double reused_token_ratio() const;  // reused tokens / prompt tokens
  nlohmann::json ToJson();
};

ReplayResult Replay(Workload& workload, const ReplayOptions& opts);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_REPLAYER_H_
