// SPDX-License-Identifier: Apache-2.0
#include "policies/hold_class.h"

#include <algorithm>

namespace kvtier {

uint32_t HoldClass::Of(uint64_t uses, uint64_t position_tokens, uint64_t turn, uint64_t last_gap) {
  const uint32_t u = uses <= 2    ? static_cast<uint32_t>(std::max<uint64_t>(uses, 1) - 1)
                     : uses <= 4  ? 2
                     : uses <= 8  ? 3
                     : uses <= 16 ? 4
                     : uses <= 64 ? 5
                                  : 6;
  const uint32_t pos = position_tokens < 1024 ? 0 : position_tokens < 4096 ? 1 : position_tokens < 12288 ? 2 : 3;
  const uint32_t t = static_cast<uint32_t>(std::clamp<uint64_t>(turn, 1, kTurnClasses) - 1);
  uint32_t g = 0;  // never asked for before
  if (last_gap > 0) {
    g = 1;
    for (uint64_t top = 4; g < kLastGapClasses - 1 && last_gap >= top; top *= 4) ++g;
  }
  return ((u * kPositionClasses + pos) * kTurnClasses + t) * kLastGapClasses + g;
}

}  // namespace kvtier
