// SPDX-License-Identifier: Apache-2.0
// The kinds of lower tier a chain may hold, as the config knows them: each
// kind's name in [[tiers.lower]], the section whose keys are its options
// (one schema, one default per key, in config_schema.cc), whether other
// nodes share it, and whether a file without [[tiers.lower]] turns it on.
// What opens each kind is the daemon's (tier_registry.h).
#ifndef KVTIER_DAEMON_LOWER_KINDS_H_
#define KVTIER_DAEMON_LOWER_KINDS_H_

#include <span>
#include <string_view>

namespace kvtier {

struct Config;

struct LowerTierKind {
  std::string_view kind;     // "nvme", "redis", "fs"
  std::string_view section;  // "tiers.nvme": its keys
  bool shared;               // other nodes read and write it too
  // Without [[tiers.lower]]: whether its section turns it on (the chain is
  // the kinds so configured, in this table's order).
  bool (*configured)(const Config&);
};

// Keys of [tiers.remote] that govern whichever shared tier the chain has
// (probes, write policy, admission); a shared kind's [[tiers.lower]] entry
// takes them too.
bool IsSharedTierKey(std::string_view name);

// In the default chain's order.
std::span<const LowerTierKind> LowerTierKinds();
// nullptr for an unknown kind.
const LowerTierKind* FindLowerTierKind(std::string_view kind);

}  // namespace kvtier

#endif  // KVTIER_DAEMON_LOWER_KINDS_H_
