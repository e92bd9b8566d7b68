// SPDX-License-Identifier: Apache-2.0
// Helpers for tests that drive a daemon through the public client API.
// Header-only: kvtier_testing does not link the client library.
#ifndef KVTIER_TESTS_SUPPORT_CLIENT_HELPERS_H_
#define KVTIER_TESTS_SUPPORT_CLIENT_HELPERS_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/support/test_support.h"

namespace kvtier::testing {

// Attaches to the daemon listening on socket_path with namespace ns;
// nullptr (and a test failure) when that fails.
inline std::unique_ptr<Client> AttachTo(const std::string& socket_path, const NamespaceDescriptor& ns) {
  AttachOptions o;
  o.socket_path = socket_path;
  o.ns = ns;
  auto c = Client::Attach(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// The keys of an n-block prompt whose tokens derive from seed (distinct
// seeds give distinct chains).
inline std::vector<BlockKey> SeededKeys(Client& c, uint32_t seed, size_t n) {
  std::vector<uint32_t> tokens(n * c.block_tokens());
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = seed * 100003 + static_cast<uint32_t>(i);
  return c.ComputeKeys(tokens);
}

// Stores keys with FillFromKey bytes; durable: commit once on NVMe.
inline Status StoreFilled(Client& c, std::span<const BlockKey> keys, bool durable = false) {
  auto t = c.StoreBegin(keys);
  if (!t.ok()) return t.status();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (t->slots[i].needed) FillFromKey(keys[i], {t->slots[i].data, t->slots[i].size});
  }
  return c.StoreCommit(*t, {.durable = durable});
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_CLIENT_HELPERS_H_
