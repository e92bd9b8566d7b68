// SPDX-License-Identifier: Apache-2.0
// The remote tier's defaults, stated once: RemoteTierOptions and kvtierd's
// config ([tiers.remote]) both take them from here, and the config does not
// need the tier's header (or hiredis's) for them.
#ifndef KVTIER_TIERS_REMOTE_DEFAULTS_H_
#define KVTIER_TIERS_REMOTE_DEFAULTS_H_

#include <cstdint>

namespace kvtier::remote_defaults {

inline constexpr const char* kKeyPrefix = "kvtier";
inline constexpr uint64_t kCapacityBytes = 1ull << 40;  // what this node may place there (the store's books)
inline constexpr uint32_t kOpTimeoutMs = 200;           // a read or write's deadline when its caller gives none
inline constexpr uint32_t kConnectTimeoutMs = 500;
inline constexpr uint32_t kIoTimeoutMs = 1000;  // a reply slower than this breaks its connection

}  // namespace kvtier::remote_defaults

#endif  // KVTIER_TIERS_REMOTE_DEFAULTS_H_
