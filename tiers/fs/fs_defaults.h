// SPDX-License-Identifier: Apache-2.0
// The fs tier's defaults, stated once: FsTierOptions and kvtierd's config
// ([tiers.fs]) both take them from here, and the config does not need the
// tier's header for them.
#ifndef KVTIER_TIERS_FS_FS_DEFAULTS_H_
#define KVTIER_TIERS_FS_FS_DEFAULTS_H_

#include <cstdint>

namespace kvtier::fs_defaults {

inline constexpr uint64_t kCapacityBytes = 64ull << 30;
inline constexpr double kLowWatermark = 0.9;
inline constexpr uint32_t kIoThreads = 4;
inline constexpr uint32_t kOpTimeoutMs = 1000;
inline constexpr uint32_t kScanIntervalMs = 5000;
inline constexpr bool kFsync = true;

}  // namespace kvtier::fs_defaults

#endif  // KVTIER_TIERS_FS_FS_DEFAULTS_H_
