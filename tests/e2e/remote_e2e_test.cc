// kvtierd with a remote tier on a real Redis Cluster below NVMe: blocks that
// leave host memory and then NVMe (the cascade) land in the cluster under
// the tenant's keys and come back from it with their bytes; a daemon whose
// cluster is down starts anyway, reports the tier failed, and serves from
// its local tiers; a password file others can read is refused.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_split.h"

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tests/support/redis_cluster_process.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::RedisClusterProcess;

constexpr uint64_t kBlock = 64 << 10;

// 16 blocks in host memory, about 60 on NVMe, the rest in the cluster.
std::string Config(const std::string& nvme_dir, const RedisClusterProcess& c, const std::string& password_file) {
  std::string seeds;
  for (const std::string& s : c.seeds()) seeds += (seeds.empty() ? "\"" : ", \"") + s + "\"";
  return "[tiers.host]\ncapacity = \"1MiB\"\n[tiers.nvme]\ndirs = [\"" + nvme_dir +
         "\"]\ncapacity = \"4MiB\"\nsegment_bytes = \"1MiB\"\nstaging_bytes = \"4MiB\"\n"
         "[tiers.remote]\nseeds = [" + seeds + "]\nop_timeout_ms = 2000\n"
         "[[tenants]]\nname = \"alice\"\nuids = [" + std::to_string(getuid()) + "]\nremote_user = \"" +
         c.user("alice") + "\"\nremote_password_file = \"" + password_file + "\"\n";
}

std::string PasswordFile(const testing::TempDir& dir, const std::string& password, mode_t mode = 0600) {
  const std::string path = dir.File("alice.pass");
  std::ofstream(path) << password << "\n";
  chmod(path.c_str(), mode);
  return path;
}

nlohmann::json Tier(const DaemonProcess& d, const std::string& name) {
  auto s = d.Status();
  if (!s.ok()) return {};
  for (const auto& t : (*s)["tiers"]) {
    if (t["tier"] == name) return t;
  }
  return {};
}

TEST(RemoteE2eTest, BlocksCascadeIntoTheClusterAndComeBackByteExact) {
  auto cluster = RedisClusterProcess::Start({"alice"});
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps installs it)";
  testing::TempDir data;
  DaemonProcess d(Config(data.File("nvme"), *cluster, PasswordFile(data, cluster->password("alice"))));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(kBlock, "remote/e2e"));
  auto keys = testing::SeededKeys(*c, 7, 160);
  auto settled = [&] {
    return testing::Eventually([&] {
      const nlohmann::json n = Tier(d, "nvme"), r = Tier(d, "remote");
      return n.value("in_flight", 1) == 0 && n.value("queued", 1) == 0 && r.value("in_flight", 1) == 0 &&
             n.value("used_bytes", 0) <= 0.9 * n.value("capacity_bytes", 0);
    }, std::chrono::seconds(20));
  };
  // At the pace of this machine's disk and of the cascade: a demotion that
  // finds NVMe's staging memory busy is dropped by design, and one that finds
  // NVMe full evicts there (the cascade moves blocks down only in the
  // background, above 90%), so each batch waits for both before the next.
  for (size_t i = 0; i < keys.size(); i += 8) {
    ASSERT_TRUE(testing::StoreFilled(*c, std::span(keys).subspan(i, 8)).ok());
    EXPECT_TRUE(settled());
  }
  // The cascade moves NVMe's coldest blocks down as NVMe passes 90%.
  EXPECT_TRUE(testing::Eventually([&] { return Tier(d, "remote").value("blocks", 0) >= 40; }, std::chrono::seconds(20)))
      << d.Status()->dump();
  EXPECT_EQ(Tier(d, "host").value("evictions_dropped", -1), 0) << d.Status()->dump();
  EXPECT_EQ(Tier(d, "remote")["health"], "healthy");
  // In the cluster under alice's prefix, and nowhere else.
  size_t in_cluster = 0;
  for (size_t node = 0; node < cluster->seeds().size(); ++node) {
    const std::string role = cluster->Cli("role", node);
    if (role.rfind("master", 0) != 0) continue;
    const std::string keys_there = cluster->Cli("--scan --pattern '*'", node);
    for (absl::string_view line : absl::StrSplit(keys_there, '\n', absl::SkipEmpty())) {
      EXPECT_EQ(line.rfind("kvtier:alice:", 0), 0u) << line;
      ++in_cluster;
    }
  }
  EXPECT_GE(in_cluster, 40u);
  // Every block comes back with its bytes, wherever it is.
  int hit = 0, correct = 0;
  for (const BlockKey& k : keys) {
    auto r = c->Lookup({&k, 1}, {.lease = true});
    if (!r.ok() || r->hit_blocks == 0) continue;
    ++hit;
    auto v = c->Load(r->lease, {&k, 1});
    if (v.ok() && v->size() == 1) correct += testing::MatchesKey(k, {(*v)[0].data, (*v)[0].size});
    (void)c->Release(r->lease);
    // Each promotion evicts a host block, which may be demoted: as above.
    EXPECT_TRUE(settled());
  }
  EXPECT_EQ(hit, static_cast<int>(keys.size()));
  EXPECT_EQ(correct, static_cast<int>(keys.size()));
  const nlohmann::json remote = Tier(d, "remote");
  EXPECT_GT(remote.value("reads", 0), 0) << "some came back from the cluster";
  EXPECT_EQ(remote.value("checksum_failures", -1), 0);
  EXPECT_EQ(d.Log().find(cluster->password("alice")), std::string::npos) << "the password is never logged";
}

TEST(RemoteE2eTest, ADaemonWhoseClusterIsDownStartsAndServesLocally) {
  auto cluster = RedisClusterProcess::Start({"alice"});
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  ASSERT_TRUE(cluster->Stop());
  testing::TempDir data;
  DaemonProcess d(Config(data.File("nvme"), *cluster, PasswordFile(data, cluster->password("alice"))));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_EQ(Tier(d, "remote")["health"], "failed");
  auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(kBlock, "remote/e2e"));
  auto keys = testing::SeededKeys(*c, 8, 8);
  ASSERT_TRUE(testing::StoreFilled(*c, keys).ok());
  auto r = c->Lookup(keys, {.lease = true});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hit_blocks, keys.size());
  ASSERT_TRUE(cluster->Restart());
  EXPECT_TRUE(testing::Eventually([&] { return Tier(d, "remote")["health"] == "healthy"; }, std::chrono::seconds(20)));
}

TEST(RemoteE2eTest, APasswordFileOthersCanReadIsRefused) {
  auto cluster = RedisClusterProcess::Start({"alice"});
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir data;
  DaemonProcess d(Config(data.File("nvme"), *cluster, PasswordFile(data, cluster->password("alice"), 0644)));
  EXPECT_FALSE(d.Start().ok());
  EXPECT_NE(d.Log().find("mode 0600"), std::string::npos) << d.Log();
  EXPECT_EQ(d.Log().find(cluster->password("alice")), std::string::npos);
}

}  // namespace
}  // namespace kvtier
