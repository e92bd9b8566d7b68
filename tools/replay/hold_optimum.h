// SPDX-License-Identifier: Apache-2.0
// The hold optimum: a model of how far a policy could go that decides from
// what kvtierd can know of a block when the block is asked for: its class
// (how many requests have asked for it, its position in its chain, its
// prompt's turn, how long ago it was last asked for) and from then on its
// age. Belady bounds every policy under the tier's rules, but it knows when
// each block comes back, so where room is short its figure is far above any
// online policy's and says little about how far one could still go.
//
// The model. Each time a block is asked for, a policy that cannot tell the
// blocks of one class apart keeps it for a number of requests h chosen from
// the class alone (perhaps at random). Keeping it costs min(g, h) slots-
// between-requests (g: the requests until it is next asked for; an ask that
// never returns pays at most the requests left) and wins the next ask iff
// g <= h. The tier holds at most C blocks between requests, so the room all
// holds pay for is at most C * R over R requests. The best such choice, even
// knowing every class's distribution of g in advance, is a fractional
// knapsack over each class's upper concave hull of (room paid, asks won):
// randomizing between two hold times fills the hull. It is the optimum of
// that family with two rules of a real tier relaxed (prefix hits: a block
// may hit with its parent gone; room paid on average, not at every
// moment). It is not a bound on every online policy: a policy whose holds
// stretch and shrink with what later requests bring (LRU's do) is outside
// the family, and a trace built for it lets LRU beat it. On the workload
// suite and the Mooncake conversation trace no implemented policy does.
//
// The hold oracle runs the optimum's plan as a real tier (below).
#ifndef KVTIER_TOOLS_REPLAY_HOLD_OPTIMUM_H_
#define KVTIER_TOOLS_REPLAY_HOLD_OPTIMUM_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "policies/hold_class.h"
#include "tools/replay/sim_tier.h"
#include "tools/replay/workload.h"

namespace kvtier::tools {

struct HoldOptimum {
  double hits = 0;         // block hits at the optimum (fractional)
  uint64_t requested = 0;  // blocks asked for (the simulator's blocks_requested)
  uint32_t classes = 0;    // classes that occur in the workload
  double token_hit_rate() const { return requested ? hits / double(requested) : 0; }
};

// p must hold next uses (Prepare(w, true)). Errors: no capacity, a
// workload prepared without next uses.
absl::StatusOr<HoldOptimum> ComputeHoldOptimum(const Workload& w, const Prepared& p, uint64_t capacity_blocks);

// The hold oracle: the optimum's plan (how long to keep each class's asks,
// its statistics known in advance) run as a real tier, whose room is
// counted at every moment and whose hits are prefix hits: a block's
// deadline is when it was last asked for plus its class's hold, and the
// tier evicts the earliest deadline first, leaves before parents, never a
// block of the request it serves; a block past its deadline stays while
// there is room (so the oracle is not bounded by the optimum). No online
// policy knows the statistics in advance, so this is not a policy kvtierd
// could run; it is one way of turning that knowledge into hits under the
// tier's rules, not the best one. The plan is solved for
// several shares of the room (the optimum spends room on average, a tier
// at every moment) and the best is kept. Errors: no room, a request with
// more blocks than the tier holds.
struct HoldOracle {
  static constexpr double kRoomShares[] = {0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  uint64_t hits = 0;
  uint64_t requested = 0;
  double room_share = 0;  // the share of the room the best plan was solved for
  double token_hit_rate() const { return requested ? double(hits) / double(requested) : 0; }
};
absl::StatusOr<HoldOracle> SimulateHoldOracle(const Workload& w, const Prepared& p, uint64_t capacity_blocks);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_HOLD_OPTIMUM_H_
