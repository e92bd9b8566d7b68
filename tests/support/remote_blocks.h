// SPDX-License-Identifier: Apache-2.0
// Blocks for the remote-tier tests: a block's identity for a tenant, bytes
// made from its key, and waiting for a tier's callback.
#ifndef KVTIER_TESTS_SUPPORT_REMOTE_BLOCKS_H_
#define KVTIER_TESTS_SUPPORT_REMOTE_BLOCKS_H_

#include <latch>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/support/test_support.h"
#include "tiers/block_tier.h"

namespace kvtier::testing {

inline BlockMeta RemoteMetaFor(const std::string& tenant, uint64_t i, uint64_t bytes, uint8_t ns) {
  BlockMeta m;
  m.ns.bytes.fill(ns);
  m.key = KeyOf(i);
  m.payload_bytes = bytes;
  m.tenant_hash = TenantHash(tenant);
  m.block_tokens = 16;
  return m;
}

inline std::vector<std::byte> BytesFor(const BlockMeta& m) {
  std::vector<std::byte> b(m.payload_bytes);
  FillFromKey(m.key, b);
  return b;
}

// Runs start(callback) and waits for the callback's status.
inline absl::Status WaitForStatus(auto&& start) {
  std::latch done(1);
  absl::Status out;
  start([&](absl::Status s) {
    out = std::move(s);
    done.count_down();
  });
  done.wait();
  return out;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_REMOTE_BLOCKS_H_
