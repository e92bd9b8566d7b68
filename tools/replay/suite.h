// SPDX-License-Identifier: Apache-2.0
// The workload suite of kvtier-replay --simulate --suite: generated request
// streams with different reuse structure, each seeded and described by its
// parameters, so a policy is judged on more than the trace it was tuned on.
//
// Every generated workload has 512-token blocks and keys that are a pure
// function of (workload, block identity): two requests share a key exactly
// where they share a prefix. Arrival times are in milliseconds; every
// workload covers one hour.
#ifndef KVTIER_TOOLS_REPLAY_SUITE_H_
#define KVTIER_TOOLS_REPLAY_SUITE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/replay/workload.h"

namespace kvtier::tools {

struct SuiteWorkloadInfo {
  std::string name;
  std::string summary;     // one line: the structure it stands for
  std::string parameters;  // the generator's parameters, as text
};

// The generated workloads, in the order the suite runs them:
//   chat     the built-in multi-turn chat, scaled up (shared system prompts,
//            every turn extends its conversation);
//   agent    agent / tool loops: a few long tool-definition prefixes shared
//            by many sessions, many short steps seconds apart;
//   docqa    document QA: popular long documents (Zipf) and many documents
//            read once;
//   scan     chat conversations with bursts of long one-off batch jobs
//            that are never read again;
//   tenants  three tenants interleaved: short reuse gaps, long reuse gaps,
//            and one-shot requests behind a shared prompt.
const std::vector<SuiteWorkloadInfo>& SuiteWorkloads();

// The workload with this name, keys filled; InvalidArgument naming the
// known ones for any other.
absl::StatusOr<Workload> MakeSuiteWorkload(const std::string& name, uint64_t seed = 1);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_SUITE_H_
