// SPDX-License-Identifier: Apache-2.0
// The fs tier as a kind of lower tier (kind = "fs"), its config half: what
// kvtierd.toml says of it (its [tiers.fs] keys, whose values land in
// Config::fs, an FsTierSettings; its checks). Linked into everything that
// reads the config (kvtier_tier_fs_config); tiers/fs/CMakeLists.txt
// registers it.
// The daemon half is fs_kind.h.
#ifndef KVTIER_TIERS_FS_FS_KIND_CONFIG_H_
#define KVTIER_TIERS_FS_FS_KIND_CONFIG_H_

#include "daemon/lower_kinds.h"

namespace kvtier {

LowerTierKind FsTierKind();

}  // namespace kvtier

#endif  // KVTIER_TIERS_FS_FS_KIND_CONFIG_H_
