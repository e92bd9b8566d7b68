// SPDX-License-Identifier: Apache-2.0
#include "daemon/config.h"
#include "daemon/lower_kinds.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

std::string Message(const absl::StatusOr<Config>& c) { return std::string(c.status().message()); }

std::vector<std::string> Kinds(const Config& c) {
  std::vector<std::string> out;
  for (const Config::LowerEntry& e : c.LowerChain()) out.push_back(e.kind);
  return out;
}

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
policy = "s3fifo-deep"
high_watermark = 0.9
low_watermark = 0.8
[cost_model]
prefill_tflops = 150
nvme_read_gbps = 6.5
nvme_read_latency_us = 80
decide = false
[sim]
bandwidth = "12GB"
[[tenants]]
name = "a"
uids = [1000, 1001]
salt = "pepper"
host_bytes = "512MiB"
host_tokens = 2000000
nvme_bytes = "100GiB"
nvme_tokens = 30000000
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
  EXPECT_EQ(c->tenants[0].host_tokens, 2000000u);
  EXPECT_EQ(c->tenants[0].nvme_bytes, 100ull << 30);
  EXPECT_EQ(c->tenants[0].nvme_tokens, 30000000u);
  EXPECT_EQ(c->tenants[1].host_tokens, 0u) << "no quota unless given";
  EXPECT_EQ(c->host_policy, "s3fifo-deep");
  EXPECT_DOUBLE_EQ(c->host_high_watermark, 0.9);
  EXPECT_DOUBLE_EQ(c->host_low_watermark, 0.8);
  EXPECT_DOUBLE_EQ(c->cost_prefill_tflops, 150);
  EXPECT_DOUBLE_EQ(c->cost_nvme_read_gbps, 6.5);
  EXPECT_DOUBLE_EQ(c->cost_nvme_read_latency_us, 80);
  EXPECT_FALSE(c->cost_decide);
  EXPECT_EQ(c->tenants[1].gids, std::vector<gid_t>{2000});
}

TEST(ConfigTest, RemoteBudgetsAreReadAndNeedACluster) {
  auto c = ParseConfig(R"(
[tiers.remote]
seeds = ["127.0.0.1:7000"]
tenant_budget = "64GiB"
[[tenants]]
name = "a"
uids = [1000]
remote_user = "kvtier-a"
remote_password_file = "/etc/kvtier/a.pass"
remote_key_file = "/etc/kvtier/a.key"
remote_budget = "2GiB"
[[tenants]]
name = "b"
uids = [1001]
remote_user = "kvtier-b"
remote_password_file = "/etc/kvtier/b.pass"
remote_key_file = "/etc/kvtier/b.key"
)", "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->remote.tenant_budget, 64ull << 30);
  EXPECT_EQ(c->tenants[0].remote_budget, 2ull << 30);
  EXPECT_EQ(c->tenants[1].remote_budget, 0u) << "0: tiers.remote.tenant_budget applies";
  auto no_cluster = ParseConfig(R"(
[[tenants]]
name = "a"
uids = [1000]
remote_budget = "2GiB"
)", "t.toml");
  ASSERT_FALSE(no_cluster.ok());
  EXPECT_NE(no_cluster.status().message().find("tiers.remote.seeds is empty"), std::string::npos) << no_cluster.status();
  auto tiny = ParseConfig(R"(
[tiers.remote]
seeds = ["127.0.0.1:7000"]
tenant_budget = "1KiB"
)", "t.toml");
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("smaller than one block"), std::string::npos) << tiny.status();
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
  // The NVMe tier's policy: any but the host-only ones.
  EXPECT_TRUE(ParseConfig("[tiers.nvme]\npolicy = \"s3fifo\"\n", "k.toml").ok());
  EXPECT_FALSE(ParseConfig("[tiers.nvme]\npolicy = \"mru\"\n", "k.toml").ok());
  auto na = ParseConfig("[tiers.nvme]\npolicy = \"adaptive\"\n", "k.toml");
  ASSERT_FALSE(na.ok());
  EXPECT_NE(Message(na).find("host-only"), std::string::npos) << Message(na);
  auto nc = ParseConfig("[tiers.nvme]\npolicy = \"arc-cutoff\"\n", "k.toml");
  ASSERT_FALSE(nc.ok()) << "its cutoff needs the host tier's asks";
  EXPECT_NE(Message(nc).find("host-only"), std::string::npos) << Message(nc);
  EXPECT_TRUE(ParseConfig("[tiers.host]\npolicy = \"arc-cutoff\"\n", "k.toml").ok());
  // Watermarks: fractions, the low one not above the high one.
  auto w = ParseConfig("[tiers.host]\nhigh_watermark = 0.5\nlow_watermark = 0.7\n", "k.toml");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(Message(w).find("tiers.host.low_watermark"), std::string::npos) << Message(w);
  EXPECT_FALSE(ParseConfig("[tiers.host]\nhigh_watermark = 1.5\n", "k.toml").ok());
  EXPECT_FALSE(ParseConfig("[tiers.host]\nlow_watermark = 0\n", "k.toml").ok());
  // Quotas and the cost model: named keys, sane ranges.
  auto q = ParseConfig("[[tenants]]\nname = \"a\"\nuids = [1]\nhost_tokens = -5\n", "k.toml");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(Message(q).find("tenants[0].host_tokens"), std::string::npos) << Message(q);
  EXPECT_FALSE(ParseConfig("[[tenants]]\nname = \"a\"\nuids = [1]\nnvme_bytes = \"lots\"\n", "k.toml").ok());
  auto cm = ParseConfig("[cost_model]\nprefill_tflops = 0\n", "k.toml");
  ASSERT_FALSE(cm.ok());
  EXPECT_NE(Message(cm).find("cost_model.prefill_tflops"), std::string::npos) << Message(cm);
  EXPECT_FALSE(ParseConfig("[cost_model]\nnvme_read_gbps = -1\n", "k.toml").ok());
  EXPECT_FALSE(ParseConfig("[cost_model]\ndecide = \"yes\"\n", "k.toml").ok());
  auto unknown = ParseConfig("[cost_model]\nprefill_tflop = 100\n", "k.toml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(Message(unknown).find("cost_model.prefill_tflop"), std::string::npos) << Message(unknown);
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

// Shared tiers end the chain, in any number; the shared-tier keys govern
// them all, so each is set in one entry: set in two, which one held would
// depend on the entries' order.
TEST(ConfigTest, TwoSharedTiersChainAndSetTheirSharedKeysOnce) {
  const std::string redis = "[[tiers.lower]]\nkind = \"redis\"\nseeds = [\"127.0.0.1:7000\"]\nprobe_budget_us = 5000\n";
  const std::string tenant = "[[tenants]]\nname = \"a\"\nuids = [1]\nremote_user = \"a\"\n";
  auto once = ParseConfig(redis + "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/kv\"\n" + tenant, "k.toml");
  EXPECT_EQ(Message(once).find("two shared entries"), std::string::npos) << Message(once);
  EXPECT_EQ(Message(once).find("comes after the shared tier"), std::string::npos) << Message(once);
  if (once.ok()) {
    EXPECT_EQ(Kinds(*once), (std::vector<std::string>{"redis", "fs"}));
    EXPECT_EQ(once->remote.probe_budget_us, 5000u);
  }
  auto twice = ParseConfig(
      redis + "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/kv\"\nprobe_budget_us = 9000\n" + tenant, "k.toml");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(Message(twice).find("tiers.lower[1].probe_budget_us is set in two shared entries"), std::string::npos)
      << Message(twice);
  auto local_last = ParseConfig("[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/kv\"\n[[tiers.lower]]\nkind = "
                                "\"nvme\"\ncapacity = \"1GiB\"\n",
                                "k.toml");
  ASSERT_FALSE(local_last.ok());
  EXPECT_NE(Message(local_last).find("the local tier \"nvme\" comes after the shared tier \"fs\""),
            std::string::npos)
      << Message(local_last);
}

// A kind that may repeat (fs) takes several entries, each with options of
// its own: the first fills [tiers.fs] as before, a later one keeps its own
// (the rest of the file as read, its section from the entry), and each has
// a name of its own.
TEST(ConfigTest, TwoFsTiersEachKeepTheirOwnOptionsAndNames) {
  const std::string text =
      "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/fast\"\ncapacity = \"1TiB\"\nwrite_policy = \"reused\"\n"
      "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/big\"\nio_threads = 16\n"
      "[[tiers.lower]]\nkind = \"fs\"\nname = \"archive\"\ndir = \"/srv/archive\"\nfsync = false\n"
      "[ipc]\nspin_us = 7\n";
  auto c = ParseConfig(text, "k.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<Config::LowerEntry> chain = c->LowerChain();
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[0].name, "fs");
  EXPECT_EQ(chain[1].name, "fs-2") << "the n-th entry of a kind, unnamed";
  EXPECT_EQ(chain[2].name, "archive");
  EXPECT_EQ(Kinds(*c), (std::vector<std::string>{"fs", "fs", "fs"}));
  // The first entry is the section; its keys do not leak into the others.
  EXPECT_EQ(chain[0].own, nullptr);
  EXPECT_EQ(c->fs.dir, "/srv/fast");
  EXPECT_EQ(c->fs.capacity_bytes, 1ull << 40);
  EXPECT_EQ(c->fs.io_threads, FsTierSettings{}.io_threads);
  ASSERT_NE(chain[1].own, nullptr);
  const Config& big = c->OptionsOf(chain[1]);
  EXPECT_EQ(big.fs.dir, "/srv/big");
  EXPECT_EQ(big.fs.io_threads, 16u);
  EXPECT_EQ(big.fs.capacity_bytes, FsTierSettings{}.capacity_bytes) << "a key the entry leaves out has its default";
  const Config& archive = c->OptionsOf(chain[2]);
  EXPECT_EQ(archive.fs.dir, "/srv/archive");
  EXPECT_FALSE(archive.fs.fsync);
  EXPECT_TRUE(big.fs.fsync);
  // The rest of the file, read after the entries, is in each entry's options.
  EXPECT_EQ(big.spin_us, 7u);
  EXPECT_EQ(archive.remote.write_policy, "reused") << "the shared-tier keys are the whole chain's";
  // Where each entry set its keys, for messages about them.
  EXPECT_EQ(c->key_source.at("tiers.fs.dir"), "k.toml:3");
  EXPECT_EQ(big.key_source.at("tiers.fs.dir"), "k.toml:8");
  EXPECT_EQ(archive.key_source.at("tiers.fs.dir"), "k.toml:13");
  EXPECT_FALSE(archive.key_source.contains("tiers.fs.capacity")) << "the first entry's line is not the archive's";
}

TEST(ConfigTest, RepeatedLowerTiersNeedTheirOwnNamesAndPlacesAndARepeatableKind) {
  const std::string fs = "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/a\"\n";
  auto same_dir = ParseConfig(fs + fs, "k.toml");
  ASSERT_FALSE(same_dir.ok());
  EXPECT_NE(Message(same_dir).find("the tiers \"fs\" and \"fs-2\" have one dir (\"/srv/a\", \"/srv/a\""),
            std::string::npos)
      << Message(same_dir);
  // Spelt differently, or one inside the other, is still one directory.
  for (const char* other : {"/srv/a/", "/srv//a", "/srv/b/../a", "/srv/a/deeper", "/srv"}) {
    auto overlap = ParseConfig(fs + "[[tiers.lower]]\nkind = \"fs\"\ndir = \"" + other + "\"\n", "k.toml");
    ASSERT_FALSE(overlap.ok()) << other;
    EXPECT_NE(Message(overlap).find("needs a directory of its own"), std::string::npos) << Message(overlap);
  }
  EXPECT_TRUE(ParseConfig(fs + "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/ab\"\n", "k.toml").ok())
      << "a sibling whose name starts the same is another directory";
  auto same_name = ParseConfig(
      fs + "[[tiers.lower]]\nkind = \"fs\"\nname = \"fs\"\ndir = \"/srv/b\"\n", "k.toml");
  ASSERT_FALSE(same_name.ok());
  EXPECT_NE(Message(same_name).find("k.toml:4: tiers.lower[1].name \"fs\" is taken by an earlier entry"),
            std::string::npos)
      << Message(same_name);
  auto bad_name = ParseConfig("[[tiers.lower]]\nkind = \"fs\"\nname = \"a b\"\ndir = \"/srv/a\"\n", "k.toml");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_NE(Message(bad_name).find("tiers.lower[0].name must be 1 to 64"), std::string::npos) << Message(bad_name);
  // Names share the tier rows with host memory, the GPU and the kinds' own.
  for (const char* reserved : {"host", "gpu", "nvme", "remote"}) {
    auto r = ParseConfig(fs + "[[tiers.lower]]\nkind = \"fs\"\nname = \"" + reserved + "\"\ndir = \"/srv/b\"\n",
                         "k.toml");
    ASSERT_FALSE(r.ok()) << reserved;
    EXPECT_NE(Message(r).find("is reserved"), std::string::npos) << Message(r);
  }
  // An unnamed entry whose default name an earlier one took is told to take a name.
  auto taken = ParseConfig("[[tiers.lower]]\nkind = \"fs\"\nname = \"fs-2\"\ndir = \"/srv/a\"\n"
                           "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/b\"\n",
                           "k.toml");
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(Message(taken).find("tiers.lower[1]'s default name \"fs-2\" is taken by an earlier entry: each tier of "
                                "the chain needs a name of its own; give this entry a name"),
            std::string::npos)
      << Message(taken);
  // A later entry's own checks run on its own options, at its own line.
  auto relative = ParseConfig(fs + "[[tiers.lower]]\nkind = \"fs\"\ndir = \"relative\"\n", "k.toml");
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(Message(relative).find("k.toml:6: the tier \"fs-2\": tiers.fs.dir must be an absolute path"),
            std::string::npos)
      << Message(relative);
  EXPECT_EQ(Message(relative).find("k.toml:3"), std::string::npos) << "the first entry is fine: " << Message(relative);
  // A key the later entry leaves out: the message points at the entry.
  auto no_dir = ParseConfig(fs + "\n[[tiers.lower]]\nkind = \"fs\"\nname = \"b\"\n", "k.toml");
  ASSERT_FALSE(no_dir.ok());
  EXPECT_NE(Message(no_dir).find("k.toml:6: the tier \"b\": tiers.fs.dir must be an absolute path"), std::string::npos)
      << Message(no_dir);
  // Each later entry copies the config: a file may not list more tiers than
  // the store has lanes.
  std::string many;
  for (int i = 0; i < 9; ++i) many += "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/" + std::to_string(i) + "\"\n";
  auto nine = ParseConfig(many, "k.toml");
  ASSERT_FALSE(nine.ok());
  EXPECT_NE(Message(nine).find("[[tiers.lower]] has 9 entries; a chain holds at most 8"), std::string::npos)
      << Message(nine);
  EXPECT_TRUE(ParseConfig(many.substr(0, many.rfind("[[tiers.lower]]")), "k.toml").ok()) << "8 fit";
  // NVMe's and the Redis Cluster's tiers are what [[tenants]] keys configure.
  const std::string nvme = "[[tiers.lower]]\nkind = \"nvme\"\ncapacity = \"1GiB\"\n";
  auto two_nvme = ParseConfig(nvme + nvme, "k.toml");
  ASSERT_FALSE(two_nvme.ok());
  EXPECT_NE(Message(two_nvme).find("k.toml:4: a second [[tiers.lower]] of kind \"nvme\""), std::string::npos)
      << Message(two_nvme);
  const std::string redis = "[[tiers.lower]]\nkind = \"redis\"\nseeds = [\"127.0.0.1:7000\"]\n";
  auto two_redis = ParseConfig(redis + redis, "k.toml");
  ASSERT_FALSE(two_redis.ok());
  EXPECT_NE(Message(two_redis).find("a second [[tiers.lower]] of kind \"redis\""), std::string::npos)
      << Message(two_redis);
  // The chain compares by kinds and names (what a reload must restart for).
  auto a = ParseConfig(fs + "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/b\"\n", "k.toml");
  auto b = ParseConfig(fs + "[[tiers.lower]]\nkind = \"fs\"\ndir = \"/srv/c\"\n", "k.toml");
  auto named = ParseConfig(fs + "[[tiers.lower]]\nkind = \"fs\"\nname = \"x\"\ndir = \"/srv/b\"\n", "k.toml");
  ASSERT_TRUE(a.ok() && b.ok() && named.ok()) << a.status() << b.status() << named.status();
  EXPECT_EQ(a->LowerChain(), b->LowerChain());
  EXPECT_NE(a->LowerChain(), named->LowerChain());
}

// What each kind's tier holds (kvtierctl capacity), its headers counted,
// and never a count from a sum that wrapped.
TEST(ConfigTest, EachKindCountsTheBlocksItsTierHolds) {
  Config c = DefaultConfig();
  c.fs.capacity_bytes = 150ull << 20;
  const LowerTierKind* fs = FindLowerTierKind("fs");
  ASSERT_NE(fs, nullptr);
  EXPECT_EQ(fs->fit(c, 2ull << 20).blocks, 74u) << "a 104-byte header a file";
  EXPECT_EQ(fs->fit(c, 150ull << 20).blocks, 0u) << "the header does not fit beside it";
  EXPECT_EQ(fs->fit(c, UINT64_MAX).blocks, 0u);
  c.fs.capacity_bytes = UINT64_MAX;
  EXPECT_EQ(fs->fit(c, UINT64_MAX - 50).blocks, 0u);
  EXPECT_EQ(fs->fit(c, 0).blocks, 0u);
  c.nvme.capacity_bytes = 150ull << 20;
  c.nvme.segment_bytes = 16ull << 20;
  c.nvme.dirs = {"/a", "/b"};
  const LowerTierKind* nvme = FindLowerTierKind("nvme");
  EXPECT_EQ(nvme->fit(c, 2ull << 20).blocks, 56u) << "8 segments of 7 slots";
  EXPECT_EQ(nvme->fit(c, UINT64_MAX).blocks, 0u) << "larger than a segment";
  c.remote.capacity_bytes = 10ull << 20;
  EXPECT_EQ(FindLowerTierKind("redis")->fit(c, 2ull << 20).blocks, 5u);
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

// toml++ recurses once per level of a dotted key: 100000 levels overflowed
// the stack, at start or on SIGHUP. The file's size and nesting are bounded
// before the text reaches toml++, with the line at fault named.
TEST(ConfigTest, DeepNestingAndHugeFilesAreRefusedBeforeToml) {
  std::string dotted = "a";
  for (int i = 0; i < 100000; ++i) dotted += ".a";
  for (const std::string& text : {"[ipc]\n" + dotted + " = 1\n", "[ipc]\n[" + dotted + "]\n",
                                  "[ipc]\n[[" + dotted + "]]\n", "[ipc]\nx = { " + dotted + " = 1 }\n"}) {
    auto c = ParseConfig(text, "deep.toml");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(Message(c).find("deep.toml:2: "), std::string::npos) << Message(c);
    EXPECT_NE(Message(c).find("nested deeper than 32"), std::string::npos) << Message(c);
  }
  // Arrays and inline tables count with the dotted keys within them (toml++
  // bounds only the former, at 256).
  std::string mixed = "x = ";
  for (int i = 0; i < 20; ++i) mixed += "{ a.b = ";
  mixed += "1" + std::string(20, '}') + "\n";
  auto m = ParseConfig("[ipc]\n\n" + mixed, "deep.toml");
  EXPECT_NE(Message(m).find("deep.toml:3: "), std::string::npos) << Message(m);
  // A multi-line array: the line where the bound is passed.
  auto a = ParseConfig("x = [\n" + std::string(40, '[') + "\n" + std::string(40, ']') + "\n]\n", "deep.toml");
  EXPECT_NE(Message(a).find("deep.toml:2: keys, arrays and inline tables nested deeper than 32"), std::string::npos)
      << Message(a);

  // Over 1 MiB, even of comments.
  std::string big;
  while (big.size() <= (1u << 20)) big += "# a comment that says nothing at all, many times over\n";
  auto b = ParseConfig(big, "big.toml");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(Message(b).find("at most 1 MiB"), std::string::npos) << Message(b);
  char tmpl[] = "/tmp/config_test_XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, big.data(), big.size()), static_cast<ssize_t>(big.size()));
  close(fd);
  auto f = LoadConfigFile(tmpl);
  unlink(tmpl);
  EXPECT_NE(Message(f).find("at most 1 MiB"), std::string::npos) << Message(f);

  // Dots and brackets in strings and comments are not nesting; a real
  // config, a multi-line array of uids and all, passes.
  const std::string dots(200, '.');
  const std::string text = "# " + dots + std::string(100, '[') + "\n[daemon] # [[[" + dots + "\nrun_dir = \"/tmp/" +
                           dots + "[[[[\\\"\" # {{{{\ndata_dir = '''\n" + dots + "\n[[[[[[\n'''\n[[tenants]]\n" +
                           "name = \"a" + dots.substr(0, 40) + "\"\nuids = [\n  1, # " + dots + "\n  2,\n]\n";
  auto ok = ParseConfig(text, "ok.toml");
  EXPECT_TRUE(ok.ok()) << ok.status() << "\n" << text;
  EXPECT_TRUE(ParseConfig(DefaultConfigToml(), "default.toml").ok());
}

// Every error in a file is reported at once, each with its file and line:
// value errors found by the cross-field checks too (before: only the first,
// and those without a line).
TEST(ConfigTest, EveryErrorIsReportedWithItsFileAndLine) {
  const char* text =
      "[daemon]\n"                               // 1
      "log_level = \"loud\"\n"                 // 2
      "device = \"tpu\"\n"                     // 3
      "[tiers.host]\n"                           // 4
      "capacity = \"512KiB\"\n"                // 5
      "low_watermark = 0.9\n"                    // 6
      "high_watermark = 0.5\n"                   // 7
      "colour = \"blue\"\n"                    // 8
      "[tiers.nvme]\n"                           // 9
      "io_engine = \"magic\"\n"                // 10
      "queue_depth = 0\n"                        // 11
      "[[tenants]]\n"                            // 12
      "name = \"a\"\n"                         // 13
      "uids = [1]\n"                             // 14
      "[[tenants]]\n"                            // 15
      "name = \"a\"\n"                         // 16
      "uids = [1]\n";                            // 17
  auto c = ParseConfig(text, "k.toml");
  ASSERT_FALSE(c.ok());
  const std::string m(c.status().message());
  for (const char* want : {"k.toml:2: daemon.log_level = \"loud\"", "k.toml:3: daemon.device = \"tpu\"",
                           "k.toml:5: tiers.host.capacity = 512.00 KiB is below", "k.toml:6: tiers.host.low_watermark",
                           "k.toml:8: unknown key tiers.host.colour", "k.toml:10: tiers.nvme.io_engine = \"magic\"",
                           "k.toml:11: tiers.nvme.queue_depth", "k.toml:16: tenant \"a\" is defined twice",
                           "k.toml:17: uid 1 belongs to two tenants"}) {
    EXPECT_NE(m.find(want), std::string::npos) << "missing \"" << want << "\" in: " << m;
  }
}

}  // namespace
}  // namespace kvtier
