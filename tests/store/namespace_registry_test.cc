// SPDX-License-Identifier: Apache-2.0
#include "store/namespace_registry.h"

#include "core/status.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

NamespaceId IdOf(uint8_t n) {
  NamespaceId id{};
  id.bytes[0] = n;
  id.bytes[1] = 0x5a;
  return id;
}

NamespaceDescriptor Desc(uint64_t block_bytes = 4096) {
  NamespaceDescriptor d;
  d.model_id = "m";
  d.block_tokens = 16;
  d.block_bytes = block_bytes;
  return d;
}

// Attach churn with fresh namespaces: each one no session uses and no block
// is left of goes back, its handle is reused, and the tenant's limit counts
// only what is in use.
TEST(NamespaceRegistryTest, UnusedNamespacesAreFreedAndTheirHandlesReused) {
  NamespaceRegistry r;
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<NamespaceInfo> ns = r.Register(IdOf(static_cast<uint8_t>(i)), 0, Desc(), 3);
    if (!ns.ok()) {
      // At the limit: what nothing uses goes, then there is room.
      EXPECT_EQ(ToErrorCode(ns.status()), KVTIER_EBUSY) << i;
      EXPECT_EQ(r.FreeUnused([](const NamespaceInfo&) { return true; }).size(), 3u) << i;
      ns = r.Register(IdOf(static_cast<uint8_t>(i)), 0, Desc(), 3);
    }
    ASSERT_TRUE(ns.ok()) << i << ": " << ns.status();
    EXPECT_LT(ns->handle, 3u) << "freed handles are reused";
    r.SessionStarted(ns->handle);
    r.SessionEnded(ns->handle);
  }
  EXPECT_LE(r.live(), 3u);
  EXPECT_EQ(r.List().size(), r.live());
}

TEST(NamespaceRegistryTest, ANamespaceWithASessionOrBlocksIsKept) {
  NamespaceRegistry r;
  const NamespaceInfo a = *r.Register(IdOf(1), 0, Desc(), 2);
  const NamespaceInfo b = *r.Register(IdOf(2), 0, Desc(), 2);
  r.SessionStarted(a.handle);
  // b has blocks left: the caller's check says no.
  std::vector<uint32_t> asked;
  auto freed = r.FreeUnused([&](const NamespaceInfo& n) {
    asked.push_back(n.handle);
    return n.handle != b.handle;
  });
  EXPECT_TRUE(freed.empty());
  EXPECT_EQ(asked, std::vector<uint32_t>{b.handle}) << "a namespace with a session is never offered";
  EXPECT_EQ(ToErrorCode(r.Register(IdOf(3), 0, Desc(), 2).status()), KVTIER_EBUSY);
  // Another tenant's limit is its own.
  EXPECT_TRUE(r.Register(IdOf(4), 1, Desc(), 2).ok());
  // The same id again is the same namespace, not a new one.
  EXPECT_EQ(r.Register(IdOf(1), 0, Desc(), 2)->handle, a.handle);
  r.SessionEnded(a.handle);
  freed = r.FreeUnused([](const NamespaceInfo&) { return true; }, /*tenant=*/uint16_t{0});
  ASSERT_EQ(freed.size(), 2u);
  EXPECT_EQ(r.live(), 1u) << "tenant 1's namespace was not offered";
  // A freed id registers afresh (its descriptor may differ now).
  absl::StatusOr<NamespaceInfo> again = r.Register(IdOf(1), 0, Desc(8192), 2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->block_bytes, 8192u);
}

TEST(NamespaceRegistryTest, RecoveredNamespacesDoNotCountAgainstTheLimitAndAreFreedToo) {
  NamespaceRegistry r;
  for (uint8_t i = 0; i < 5; ++i) r.RegisterRecovered(IdOf(100 + i), 0, 4096, 16);
  absl::StatusOr<NamespaceInfo> own = r.Register(IdOf(1), 0, Desc(), 1);
  EXPECT_TRUE(own.ok()) << "recovered namespaces are not the tenant's doing";
  // An engine attaching with a recovered namespace gets it, with its model.
  absl::StatusOr<NamespaceInfo> rec = r.Register(IdOf(100), 0, Desc(), 1);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->model_id, "m");
  EXPECT_EQ(r.FreeUnused([&](const NamespaceInfo& n) { return n.handle != own->handle; }).size(), 5u);
  EXPECT_EQ(r.live(), 1u);
  EXPECT_EQ(ToErrorCode(r.Register(IdOf(2), 0, Desc(), 1).status()), KVTIER_EBUSY)
      << "freeing recovered namespaces gives the tenant no extra room";
}

}  // namespace
}  // namespace kvtier
