// SPDX-License-Identifier: Apache-2.0
// What a node writes to the shared tier (tiers.remote write_policy) besides
// what the cascade moves down into it (blocks that leave the last local
// tier, always).
#ifndef KVTIER_STORE_SHARED_WRITES_H_
#define KVTIER_STORE_SHARED_WRITES_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvtier {

enum class SharedWrites : uint8_t {
  kDemoted,    // nothing more
  kReused,     // a block's host copy once a leased lookup hits it (reuse evidence)
  kCommitted,  // every committed block
};

inline std::optional<SharedWrites> SharedWritesNamed(std::string_view name) {
  if (name == "demoted") return SharedWrites::kDemoted;
  if (name == "reused") return SharedWrites::kReused;
  if (name == "committed") return SharedWrites::kCommitted;
  return std::nullopt;
}

inline std::string_view SharedWritesName(SharedWrites w) {
  switch (w) {
    case SharedWrites::kReused: return "reused";
    case SharedWrites::kCommitted: return "committed";
    case SharedWrites::kDemoted: break;
  }
  return "demoted";
}

}  // namespace kvtier

#endif  // KVTIER_STORE_SHARED_WRITES_H_
