// SPDX-License-Identifier: Apache-2.0
// A block's class when it is asked for: what kvtierd can know of it then.
// The hold optimum (kvtier-replay's model of how far such a policy could
// go) and the "holds" policy (which learns each class's hold time online)
// classify alike.
#ifndef KVTIER_POLICIES_HOLD_CLASS_H_
#define KVTIER_POLICIES_HOLD_CLASS_H_

#include <cstdint>

namespace kvtier {

// Uses count this request (1: asked for the first time); positions are the
// tokens before the block; turn 1 is a prompt that extends no earlier
// prompt beyond its first block.
struct HoldClass {
  static constexpr uint32_t kUseClasses = 7;       // 1, 2, 3-4, 5-8, 9-16, 17-64, 65 or more
  static constexpr uint32_t kPositionClasses = 4;  // < 1K, < 4K, < 12K, >= 12K tokens before it
  static constexpr uint32_t kTurnClasses = 5;      // 1 .. 4, 5 or more
  static constexpr uint32_t kLastGapClasses = 7;   // none; 1-3, 4-15, ..., 1024 or more requests
  static constexpr uint32_t kCount = kUseClasses * kPositionClasses * kTurnClasses * kLastGapClasses;
  // last_gap: requests since the block was last asked for (0: never).
  static uint32_t Of(uint64_t uses, uint64_t position_tokens, uint64_t turn, uint64_t last_gap);
};

}  // namespace kvtier

#endif  // KVTIER_POLICIES_HOLD_CLASS_H_
