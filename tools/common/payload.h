// SPDX-License-Identifier: Apache-2.0
// Block payloads derived from their key, so whoever loads a block can check
// every byte without keeping a copy: kvtier-replay, kvtier-bench and tests.
#ifndef KVTIER_TOOLS_COMMON_PAYLOAD_H_
#define KVTIER_TOOLS_COMMON_PAYLOAD_H_

#include <cstddef>
#include <span>

#include "kvtier/types.h"

namespace kvtier::tools {

// Fills out with a stream seeded by the key (xxh3 of the key, then
// splitmix64, 8 bytes per step).
void FillPayload(const BlockKey& key, std::span<std::byte> out);
// True when data is exactly what FillPayload writes for key.
bool VerifyPayload(const BlockKey& key, std::span<const std::byte> data);

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_COMMON_PAYLOAD_H_
