// SPDX-License-Identifier: Apache-2.0
// Byte and count quantities as people write them in configs and on command
// lines: "64MiB", "1.5GiB", "4096", "3M" (tokens).
#ifndef KVTIER_CORE_UNITS_H_
#define KVTIER_CORE_UNITS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvtier {

// Bytes: a number with an optional suffix B, KiB, MiB, GiB, TiB (powers of
// 1024) or KB, MB, GB, TB (powers of 1000). "1.5GiB" is allowed.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// Counts: a number with an optional suffix K, M, G (powers of 1000).
absl::StatusOr<uint64_t> ParseCount(absl::string_view text);

// "1.50 GiB", "512 B".
std::string FormatBytes(uint64_t bytes);

// Nanoseconds on CLOCK_MONOTONIC.
uint64_t MonotonicNanos();

}  // namespace kvtier

#endif  // KVTIER_CORE_UNITS_H_
