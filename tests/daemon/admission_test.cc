// SPDX-License-Identifier: Apache-2.0
// Admission's stateless checks: which tenant a peer belongs to, and which
// attach requests are refused before any state is touched.
#include "daemon/admission.h"

#include "core/status.h"
#include "gtest/gtest.h"
#include "kvtier/kvtier.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

Config TwoTenants() {
  Config c;
  c.tenants = {TenantConfig{.name = "a", .uids = {1000, 1001}, .gids = {50}},
               TenantConfig{.name = "b", .uids = {2000}, .gids = {60, 50}}};
  return c;
}

TEST(AdmissionTest, APeerBelongsToTheTenantOfItsUidBeforeItsGid) {
  const Config c = TwoTenants();
  auto by_uid = TenantOfPeer(c, {.pid = 1, .uid = 1001, .gid = 60});
  ASSERT_TRUE(by_uid.ok()) << by_uid.status();
  EXPECT_EQ((*by_uid)->name, "a") << "uid 1001 is a's, though gid 60 is b's";
  auto by_gid = TenantOfPeer(c, {.pid = 1, .uid = 3000, .gid = 60});
  ASSERT_TRUE(by_gid.ok());
  EXPECT_EQ((*by_gid)->name, "b");
  auto last_gid = TenantOfPeer(c, {.pid = 1, .uid = 3000, .gid = 50});
  ASSERT_TRUE(last_gid.ok());
  EXPECT_EQ((*last_gid)->name, "a") << "the first tenant whose gids hold the peer's gid";
}

TEST(AdmissionTest, APeerOfNoTenantIsRefusedWithEaccesAndToldWhatToDo) {
  const Config c = TwoTenants();
  auto none = TenantOfPeer(c, {.pid = 1, .uid = 4000, .gid = 70});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(ToErrorCode(none.status()), KVTIER_EACCES);
  EXPECT_NE(none.status().message().find("uid 4000"), std::string::npos) << none.status();
  EXPECT_NE(none.status().message().find("[[tenants]]"), std::string::npos) << none.status();
}

TEST(AdmissionTest, RequestsAreCheckedBeforeAnyStateIsTouched) {
  DaemonStats stats;
  ipc::AttachRequest good;
  good.ns = testing::TestNamespace(16 << 10);
  good.client_name = "engine-0";
  auto ok = CheckAttachRequest(ipc::EncodeAttachRequest(good), stats);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->client_name, "engine-0");

  // Garbage: the decoder's own error, passed on.
  const std::vector<std::byte> junk(7, std::byte{0x5a});
  EXPECT_FALSE(CheckAttachRequest(junk, stats).ok());

  // A model id with a control character: EINVAL, counted as a bad client string.
  ipc::AttachRequest bad_model = good;
  bad_model.ns.model_id = "model\x01";
  auto r1 = CheckAttachRequest(ipc::EncodeAttachRequest(bad_model), stats);
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(ToErrorCode(r1.status()), KVTIER_EINVAL);
  EXPECT_EQ(stats.refused[static_cast<size_t>(Refusal::kBadClientString)].Get(), 1u);

  // A client name that is not UTF-8: the same.
  ipc::AttachRequest bad_name = good;
  bad_name.client_name = "\xff\xfe";
  auto r2 = CheckAttachRequest(ipc::EncodeAttachRequest(bad_name), stats);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(ToErrorCode(r2.status()), KVTIER_EINVAL);
  EXPECT_NE(r2.status().message().find("client name"), std::string::npos);
  EXPECT_EQ(stats.refused[static_cast<size_t>(Refusal::kBadClientString)].Get(), 2u);
}

}  // namespace
}  // namespace kvtier
