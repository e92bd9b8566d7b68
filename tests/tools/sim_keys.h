// SPDX-License-Identifier: Apache-2.0
// Block keys for hand-made simulator workloads: id names the block; the
// last byte keeps one test file's keys apart from another's.
#ifndef KVTIER_TESTS_TOOLS_SIM_KEYS_H_
#define KVTIER_TESTS_TOOLS_SIM_KEYS_H_

#include <cstdint>

#include "kvtier/types.h"

namespace kvtier::tools {

inline BlockKey SimKey(uint32_t id, uint8_t tag) {
  BlockKey k{};
  k.bytes[0] = static_cast<uint8_t>(id);
  k.bytes[1] = static_cast<uint8_t>(id >> 8);
  k.bytes[31] = tag;
  return k;
}

}  // namespace kvtier::tools

#endif  // KVTIER_TESTS_TOOLS_SIM_KEYS_H_
