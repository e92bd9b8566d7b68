// SPDX-License-Identifier: Apache-2.0
// The kinds of lower tier a chain may hold, as the config knows them. Each
// kind registers, in one LowerTierKind: its name in [[tiers.lower]], the
// section whose keys are its options, those keys' schema rows (each with its
// doc, bounds and whether SIGHUP applies it; the default is the member's
// initialiser in the kind's settings struct), the section's comment lines,
// whether other nodes share it, its tier's default name, whether a chain
// may hold several of it, whether a file without [[tiers.lower]] turns it
// on, its own checks, and how many blocks its tier holds. ConfigSchema()
// and ConfigSections() take the kinds' rows and sections from here.
//
// What opens a kind, shows it in status and applies its reloadable keys to
// the running tier is the daemon's half of the kind (tier_registry.h): the
// config half links into everything that reads kvtierd.toml (kvtierctl
// too), the daemon half only into kvtierd. A kind of its own folder
// (tiers/fs/) defines both halves and its settings struct there and
// registers them from its CMakeLists.txt (kvtier_lower_kind, in
// cmake/KvtierLowerKinds.cmake); the build writes this table's entry, the
// registry's and Config's member for it, and links its libraries.
#ifndef KVTIER_DAEMON_LOWER_KINDS_H_
#define KVTIER_DAEMON_LOWER_KINDS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "daemon/config_schema.h"

namespace kvtier {

struct Config;

// Reports one problem: the key's full name ("tiers.fs.dir"; the message is
// prefixed with where the file set it) and what is wrong.
using ConfigFail = absl::FunctionRef<void(std::string_view key, std::string message)>;

struct LowerTierKind {
  std::string_view kind;      // "nvme", "redis", "fs"
  std::string_view section;   // "tiers.nvme": its keys
  std::string_view preamble;  // "" or whole comment lines, each ending in \n
  bool shared;                // other nodes read and write it too
  // Its tier's name in status, metrics and logs when the entry sets none:
  // "nvme", "remote", "fs".
  std::string_view default_name;
  // Whether a chain may hold several tiers of this kind, each entry with
  // options of its own (Config::LowerEntry::own). A kind whose tier
  // [[tenants]] keys configure (NVMe's quotas, the Redis Cluster's users and
  // seeds) may not: those keys could not say which tier they mean.
  bool repeatable = false;
  // With repeatable: the string key (of its section) naming a directory no
  // two of its entries may share or nest ("dir": two tiers over one
  // directory would each count, and scan away, the other's files).
  std::string_view distinct_dir_key = "";
  std::span<const ConfigKey> keys;  // its section's keys, in file order
  // Without [[tiers.lower]]: whether its section turns it on (the chain is
  // the kinds so configured, in this table's order).
  bool (*configured)(const Config&);
  // Its own checks, when the chain holds it (after every key's type and
  // range); nullptr: none beyond those.
  void (*validate)(const Config&, ConfigFail fail);
  // What its tier as `c` configures it holds of blocks of `block_bytes`
  // (kvtierctl capacity): its capacity, and the blocks that fit with its
  // own headers and rounding counted.
  struct Fit {
    uint64_t capacity_bytes = 0;
    uint64_t blocks = 0;
  };
  Fit (*fit)(const Config& c, uint64_t block_bytes);
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
