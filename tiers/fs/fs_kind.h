// SPDX-License-Identifier: Apache-2.0
// The fs tier as a kind of lower tier (kind = "fs"), its daemon half: the
// tier kvtierd runs as Config::fs configures it, with its log line and its
// reload hook (kvtier_tier_fs_kind, linked into kvtierd only);
// tiers/fs/CMakeLists.txt registers it. The config half is fs_kind_config.h.
#ifndef KVTIER_TIERS_FS_FS_KIND_H_
#define KVTIER_TIERS_FS_FS_KIND_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "daemon/tier_registry.h"

namespace kvtier {

// `name`: the tier's, in status, metrics and logs (Config::LowerEntry).
absl::StatusOr<OpenedLowerTier> OpenFsTier(const Config& c, std::string_view name);

}  // namespace kvtier

#endif  // KVTIER_TIERS_FS_FS_KIND_H_
