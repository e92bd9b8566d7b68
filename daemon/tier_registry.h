// SPDX-License-Identifier: Apache-2.0
// What opens each kind of lower tier (lower_kinds.h lists the kinds the
// config knows): one row per kind, from the config to a BlockTier ready to
// attach, named as its entry says, with the blocks it kept across a restart
// and the log line it ends with. Daemon::Open walks Config::LowerChain()
// through here.
#ifndef KVTIER_DAEMON_TIER_REGISTRY_H_
#define KVTIER_DAEMON_TIER_REGISTRY_H_

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "daemon/status_snapshot.h"
#include "tiers/block_tier.h"

namespace kvtier {

struct OpenedLowerTier {
  std::unique_ptr<BlockTier> tier;  // null: its config leaves it off (a default that found no room)
  std::vector<RecoveredBlock> recovered;
  // Once attached, with how many recovered blocks the store indexed.
  std::function<void(uint64_t indexed)> attached;
  // What only this kind shows in status (NVMe: its engine, journal and
  // recovery; redis: its cluster), filled in for each snapshot; unset: the
  // kind shows the common figures and its counters only. Set by the kind's
  // opener, which knows the tier's type, so nothing else casts a tier. Valid
  // while the tier lives.
  std::function<void(StatusSnapshot::Lower&)> describe;
  // SIGHUP's hook for the reloadable keys of the kind's section
  // (LowerTierKind::section): applies them from `next` to the running tier,
  // or says why it cannot (the keys then wait for a restart). Unset: the
  // kind has no reloadable keys. Valid while the tier lives.
  std::function<absl::Status(const Config& next)> reload;
};

// The chain's tier `e` as `c` configures it (c: the daemon's config for the
// first entry of a kind, the entry's own options, Config::OptionsOf, for a
// later one; the returned hooks may keep a reference to it); InvalidArgument
// for a kind no row opens.
absl::StatusOr<OpenedLowerTier> OpenLowerTier(const Config::LowerEntry& e, const Config& c);

}  // namespace kvtier

#endif  // KVTIER_DAEMON_TIER_REGISTRY_H_
