// SPDX-License-Identifier: Apache-2.0
// kvtierd with a remote tier on a real Redis Cluster below NVMe: blocks that
// leave host memory and then NVMe (the cascade) land in the cluster under
// the tenant's keys and come back from it with their bytes; a daemon whose
// cluster is down starts anyway, reports the tier failed, and serves from
// its local tiers; a password file others can read is refused; a wrong
// password is logged and counted; --check-config applies the secret-file
// rules; tenant names hold no glob.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>
#include <tuple>

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
         c.user("alice") + "\"\nremote_password_file = \"" + password_file + "\"\nremote_key_file = \"" +
         c.key_file("alice") + "\"\n";
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

// A wrong password was silent: the tier just said "failed". It is now a
// log line that names the tenant and what to check (never the password),
// and a counter.
TEST(RemoteE2eTest, AWrongPasswordIsLoggedAndCountedNeverQuoted) {
  auto cluster = RedisClusterProcess::Start({"alice"});
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir data;
  const std::string wrong = "not-alices-password-" + cluster->password("alice").substr(0, 6);
  DaemonProcess d(Config(data.File("nvme"), *cluster, PasswordFile(data, wrong)));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_TRUE(testing::Eventually([&] { return d.Log().find("event=remote_auth_failed") != std::string::npos; }))
      << d.Log();
  const std::string log = d.Log();
  EXPECT_NE(log.find("tenant=\"alice\""), std::string::npos) << log;
  EXPECT_NE(log.find("WRONGPASS"), std::string::npos) << log;
  EXPECT_EQ(log.find(wrong), std::string::npos) << "the password is never logged";
  const nlohmann::json t = Tier(d, "remote");
  EXPECT_GT(t["remote"]["cluster"].value("auth_failures", uint64_t{0}), 0u) << t.dump();
  EXPECT_EQ(t["remote"]["cluster"].value("tenants_refused", uint64_t{0}), 1u) << t.dump();
  // Rate-limited: the daemon keeps retrying, the log does not fill.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  size_t lines = 0;
  for (size_t at = 0; (at = d.Log().find("event=remote_auth_failed", at)) != std::string::npos; ++at) ++lines;
  EXPECT_LE(lines, 2u);
}

// --check-config said "config OK" to password files the start refused.
// It applies the start's rules now, to the password and the key files.
TEST(RemoteE2eTest, CheckConfigAppliesTheSecretFileRules) {
  auto cluster = RedisClusterProcess::Start({"alice"});
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir data;
  const std::string kvtierd = tools::FindKvtierd();
  const std::string pass = PasswordFile(data, cluster->password("alice"));
  auto check = [&](const std::string& password_file, const std::string& key_file) {
    std::string config = Config(data.File("nvme"), *cluster, password_file);
    config.replace(config.find(cluster->key_file("alice")), cluster->key_file("alice").size(), key_file);
    std::ofstream(data.File("k.toml")) << config;
    const std::string cmd = kvtierd + " --config " + data.File("k.toml") + " --check-config 2>&1";
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int rc = pclose(p);
    EXPECT_EQ(out.find(cluster->password("alice")), std::string::npos) << "never quoted";
    return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out);
  };
  auto [rc, out] = check(pass, cluster->key_file("alice"));
  EXPECT_EQ(rc, 0) << out;
  // Each bad password file the start refuses.
  const std::string loose = data.File("loose.pass");
  std::ofstream(loose) << "pw\n";
  chmod(loose.c_str(), 0644);
  const std::string link = data.File("link.pass");
  symlink(pass.c_str(), link.c_str());
  const std::string fifo = data.File("fifo.pass");
  mkfifo(fifo.c_str(), 0600);
  const std::string empty = data.File("empty.pass");
  std::ofstream(empty).close();
  chmod(empty.c_str(), 0600);
  const std::string big = data.File("big.pass");
  std::ofstream(big) << std::string(10000, 'p');
  chmod(big.c_str(), 0600);
  for (const std::string& bad : {loose, link, fifo, std::string("/dev/zero"), empty, big, data.File("missing")}) {
    std::tie(rc, out) = check(bad, cluster->key_file("alice"));
    EXPECT_EQ(rc, 2) << bad << ": " << out;
    EXPECT_NE(out.find("remote_password_file"), std::string::npos) << out;
  }
  // Bad key files: not a key, loose, the password itself.
  const std::string notkey = data.File("not.key");
  std::ofstream(notkey) << "hunter2\n";
  chmod(notkey.c_str(), 0600);
  const std::string loose_key = data.File("loose.key");
  std::ofstream(loose_key) << std::string(64, 'a').replace(0, 2, "01") << "\n";
  chmod(loose_key.c_str(), 0644);
  const std::string same = data.File("same.pass");
  const std::string hex_pass = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdee";
  std::ofstream(same) << hex_pass << "\n";
  chmod(same.c_str(), 0600);
  const std::string same_key = data.File("same.key");
  std::ofstream(same_key) << hex_pass << "\n";
  chmod(same_key.c_str(), 0600);
  for (const auto& [p, k] : std::vector<std::pair<std::string, std::string>>{
           {pass, notkey}, {pass, loose_key}, {same, same_key}, {pass, data.File("missing.key")}}) {
    std::tie(rc, out) = check(p, k);
    EXPECT_EQ(rc, 2) << k << ": " << out;
    EXPECT_NE(out.find("remote_key_file"), std::string::npos) << out;
    EXPECT_EQ(out.find(hex_pass), std::string::npos) << "a key is never quoted";
  }
}

// A tenant named "al*" got the ACL pattern ~kvtier:al*:*, which is alice's
// keys too. Tenant names are a safe alphabet now.
TEST(RemoteE2eTest, ATenantNameWithAGlobIsRefused) {
  testing::TempDir data;
  for (const std::string name : {"al*", "a?", "a[b]", "a:b", "a{b}", "a b", "a/b", "a\\\\b"}) {
    std::ofstream(data.File("k.toml")) << "[[tenants]]\nname = \"" << name << "\"\nuids = [" << getuid() << "]\n";
    const std::string cmd = tools::FindKvtierd() + " --config " + data.File("k.toml") + " --check-config 2>&1";
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int rc = pclose(p);
    EXPECT_EQ(WEXITSTATUS(rc), 2) << name << ": " << out;
    EXPECT_NE(out.find("letters, digits"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace kvtier
