#include "daemon/config.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

std::string Message(const absl::StatusOr<Config>& c) { return std::string(c.status().message()); }

TEST(ConfigTest, EmptyFileIsTheEmbeddedDefaults) {
  auto c = ParseConfig("", "test.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "auto");
  EXPECT_EQ(c->hash, HashAlgorithm::kSha256);
  EXPECT_EQ(c->host_capacity, 1ull << 30);
  ASSERT_EQ(c->tenants.size(), 1u);
  EXPECT_EQ(c->tenants[0].name, "default");
  EXPECT_EQ(c->tenants[0].uids, std::vector<uid_t>{geteuid()});
}

TEST(ConfigTest, ReadsEveryKey) {
  auto c = ParseConfig(R"(
[daemon]
run_dir = "/tmp/r"
data_dir = "/tmp/d"
log_level = "debug"
device = "sim"
hash = "sha256"
[ipc]
ring_entries = 64
scratch_bytes = "8MiB"
max_keys_per_op = 1000
spin_us = 5
max_sessions = 9
max_leases_per_session = 77
[tiers.host]
capacity = "2GiB"
prefault = true
policy = "lru"
[sim]
bandwidth = "12GB"
[[tenants]]
name = "a"
uids = [1000, 1001]
salt = "pepper"
host_bytes = "512MiB"
[[tenants]]
name = "b"
gids = [2000]
)", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->run_dir, "/tmp/r");
  EXPECT_EQ(c->DataSocketPath(), "/tmp/r/kvtierd.sock");
  EXPECT_EQ(c->ring_entries, 64u);
  EXPECT_EQ(c->scratch_bytes, 8ull << 20);
  EXPECT_EQ(c->spin_us, 5u);
  EXPECT_EQ(c->host_capacity, 2ull << 30);
  EXPECT_TRUE(c->host_prefault);
  EXPECT_EQ(c->sim_bandwidth, 12000000000ull);
  ASSERT_EQ(c->tenants.size(), 2u);
  EXPECT_EQ(c->tenants[0].uids, (std::vector<uid_t>{1000, 1001}));
  EXPECT_EQ(c->tenants[0].salt, "pepper");
  EXPECT_EQ(c->tenants[0].host_bytes, 512ull << 20);
  EXPECT_EQ(c->tenants[1].gids, std::vector<gid_t>{2000});
}

TEST(ConfigTest, UnknownKeysAreRefusedWithTheirNameAndLine) {
  auto c = ParseConfig("[ipc]\nring_entries = 64\nring_entires = 3\n", "k.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(Message(c).find("ipc.ring_entires"), std::string::npos) << Message(c);
  EXPECT_NE(Message(c).find("k.toml:3"), std::string::npos) << Message(c);
  EXPECT_FALSE(ParseConfig("colour = 1\n", "k.toml").ok());
  EXPECT_FALSE(ParseConfig("[tiers.gpu]\nsize = 1\n", "k.toml").ok());
  EXPECT_FALSE(ParseConfig("[[tenants]]\nname = \"a\"\nuids = [1]\nquota = 3\n", "k.toml").ok());
}

TEST(ConfigTest, WrongTypesAndRangesNameTheKey) {
  auto t = ParseConfig("[ipc]\nspin_us = \"fast\"\n", "k.toml");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(Message(t).find("ipc.spin_us must be an integer"), std::string::npos) << Message(t);
  auto r = ParseConfig("[ipc]\nring_entries = 1\n", "k.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(Message(r).find("outside"), std::string::npos);
  auto b = ParseConfig("[tiers.host]\ncapacity = \"lots\"\n", "k.toml");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(Message(b).find("tiers.host.capacity"), std::string::npos) << Message(b);
  EXPECT_FALSE(ParseConfig("[tiers.host]\ncapacity = \"512KiB\"\n", "k.toml").ok()) << "below 1 MiB";
  EXPECT_FALSE(ParseConfig("[daemon]\ndevice = \"tpu\"\n", "k.toml").ok());
  EXPECT_FALSE(ParseConfig("[daemon]\nlog_level = \"chatty\"\n", "k.toml").ok());
  EXPECT_FALSE(ParseConfig("[tiers.host]\npolicy = \"mru\"\n", "k.toml").ok());
  auto syntax = ParseConfig("[ipc\n", "k.toml");
  ASSERT_FALSE(syntax.ok());
  EXPECT_NE(Message(syntax).find("not valid TOML"), std::string::npos);
}

TEST(ConfigTest, FastHashIsRefusedWithSeveralTenants) {
  auto one = ParseConfig("[daemon]\nhash = \"xxh3-128\"\n", "k.toml");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->hash, HashAlgorithm::kXxh3_128);
  auto two = ParseConfig(
      "[daemon]\nhash = \"xxh3-128\"\n[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"b\"\nuids = [2]\n",
      "k.toml");
  ASSERT_FALSE(two.ok());
  EXPECT_NE(Message(two).find("single trusted tenant"), std::string::npos) << Message(two);
}

TEST(ConfigTest, TenantsMustBeDistinctAndAdmitSomeone) {
  EXPECT_FALSE(ParseConfig("[[tenants]]\nname = \"a\"\n", "k.toml").ok()) << "admits nobody";
  EXPECT_FALSE(ParseConfig("[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"a\"\nuids = [2]\n", "k")
                   .ok());
  auto dup = ParseConfig("[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"b\"\nuids = [1]\n", "k");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(Message(dup).find("uid 1 belongs to two tenants"), std::string::npos);
}

TEST(ConfigTest, DefaultConfigTextParsesToTheDefaults) {
  auto c = ParseConfig(DefaultConfigToml(), "default");
  ASSERT_TRUE(c.ok()) << c.status();
  const Config d = DefaultConfig();
  EXPECT_EQ(c->run_dir, d.run_dir);
  EXPECT_EQ(c->host_capacity, d.host_capacity);
  EXPECT_EQ(c->ring_entries, d.ring_entries);
  EXPECT_EQ(c->tenants[0].uids, d.tenants[0].uids);
  EXPECT_FALSE(LoadConfigFile("/nonexistent/kvtierd.toml").ok());
  EXPECT_TRUE(absl::IsNotFound(LoadConfigFile("/nonexistent/kvtierd.toml").status()));
}

}  // namespace
}  // namespace kvtier
