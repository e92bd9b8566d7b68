// SPDX-License-Identifier: Apache-2.0
// The fs tier as a kind of lower tier (kind = "fs"), both halves:
//  - FsTierKind(): what kvtierd.toml says of it (its [tiers.fs] keys, whose
//    values land in Config::fs, an FsTierSettings; its checks). Linked into
//    everything that reads the config (kvtier_tier_fs_config).
//  - OpenFsTier(): the tier kvtierd runs, with its log line and its reload
//    hook (kvtier_tier_fs_kind, linked into kvtierd only).
// daemon/lower_kinds.cc and daemon/tier_registry.cc list them, a line each.
#ifndef KVTIER_TIERS_FS_FS_KIND_H_
#define KVTIER_TIERS_FS_FS_KIND_H_

#include "absl/status/statusor.h"
#include "daemon/lower_kinds.h"
#include "daemon/tier_registry.h"

namespace kvtier {

LowerTierKind FsTierKind();
absl::StatusOr<OpenedLowerTier> OpenFsTier(const Config& c);

}  // namespace kvtier

#endif  // KVTIER_TIERS_FS_FS_KIND_H_
