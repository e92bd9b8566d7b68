// SPDX-License-Identifier: Apache-2.0
// The online bound: the most any eviction policy could hit on a workload
// when all it can tell of a block, each time the block is asked for, is what
// kvtierd could know then: how many requests have asked for it (its uses),
// its position in its chain, its request's turn (how many earlier prompts
// this one extends), and from then on its age. Belady knows when each block
// comes back; such a policy does not, so Belady is no bound for it, and the
// gap between the two is what nothing a block shows can buy.
//
// The model. Each time a block is asked for, a policy that cannot tell the
// blocks of one class (uses, position, turn) apart, and whose other
// knowledge (other blocks, clocks, chance) says nothing about when this one
// is asked for again, in effect chooses how many requests it keeps the block
// for: h, perhaps at random. Keeping it costs min(g, h) slots-between-
// requests (g: the requests until it is next asked for) and wins the next
// ask iff g <= h. The tier holds at most C blocks between any two requests,
// so over R requests the room all keeps pay for is at most C * R. The best
// such choice, even knowing every class's distribution of g in advance, is
// a fractional knapsack over each class's upper concave hull of (room paid,
// asks won) — randomizing between two hold times fills the hull. Prefix
// hits are not required (a block may hit with its parent gone), which only
// raises it. The figure is an upper bound for policies that decide on these
// features and age; a policy that beat it would know something else about
// when a block returns (kvtier-replay --simulate --suite checks that none
// of the implemented ones does).
#ifndef KVTIER_TOOLS_REPLAY_ONLINE_BOUND_H_
#define KVTIER_TOOLS_REPLAY_ONLINE_BOUND_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "tools/replay/sim_tier.h"
#include "tools/replay/workload.h"

namespace kvtier::tools {

// A block's class when it is asked for. Uses count this request (1: asked
// for the first time); positions are the tokens before the block; turn 1
// is a prompt that extends no earlier prompt beyond its first block.
struct OnlineBoundClass {
  static constexpr uint32_t kUseClasses = 7;       // 1, 2, 3-4, 5-8, 9-16, 17-64, 65 or more
  static constexpr uint32_t kPositionClasses = 4;  // < 1K, < 4K, < 12K, >= 12K tokens before it
  static constexpr uint32_t kTurnClasses = 5;      // 1 .. 4, 5 or more
  static constexpr uint32_t kLastGapClasses = 7;   // none; 1-3, 4-15, ..., 1024 or more requests
  static constexpr uint32_t kCount = kUseClasses * kPositionClasses * kTurnClasses * kLastGapClasses;
  // last_gap: requests since the block was last asked for (0: never).
  static uint32_t Of(uint64_t uses, uint64_t position_tokens, uint64_t turn, uint64_t last_gap);
};

struct OnlineBound {
  double hits = 0;         // block hits at the optimum (fractional)
  uint64_t requested = 0;  // blocks asked for (the simulator's blocks_requested)
  uint32_t classes = 0;    // classes that occur in the workload
  double token_hit_rate() const { return requested ? hits / double(requested) : 0; }
};

// p must hold next uses (Prepare(w, true)). Errors: no capacity, a
// workload prepared without next uses.
absl::StatusOr<OnlineBound> ComputeOnlineBound(const Workload& w, const Prepared& p, uint64_t capacity_blocks);

// The hold oracle: the bound's own answer (how long to keep each class's
// asks, its statistics known in advance) run as a real tier, whose room is
// counted at every moment and whose hits are prefix hits: a block's
// deadline is when it was last asked for plus its class's hold, and the
// tier evicts the earliest deadline first, leaves before parents. No
// online policy knows the statistics in advance, so this is not a policy
// kvtierd could run; it says how much of the bound such knowledge turns
// into hits, which the bound's relaxations do not. The plan is solved for
// several shares of the room (the relaxation spends room on average, a
// tier at every moment) and the best is kept.
struct HoldOracle {
  static constexpr double kRoomShares[] = {0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  uint64_t hits = 0;
  uint64_t requested = 0;
  double room_share = 0;  // the share of the room the best plan was solved for
  double token_hit_rate() const { return requested ? double(hits) / double(requested) : 0; }
};
absl::StatusOr<HoldOracle> SimulateHoldOracle(const Workload& w, const Prepared& p, uint64_t capacity_blocks);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_REPLAY_ONLINE_BOUND_H_
