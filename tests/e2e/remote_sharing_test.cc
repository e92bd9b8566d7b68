// SPDX-License-Identifier: Apache-2.0
// Two kvtierd nodes (separate sockets, data folders and host tiers) over one
// real Redis Cluster, over TLS only (client certificates required): blocks
// node A computed are found and loaded on node B byte-exact, through B's
// lookups asking the cluster past their local hit
// prefix; the same key bytes under another namespace, or as another tenant
// (whose ACL user cannot even read the first tenant's keys), never hit; the
// probe budget and the write policy change on SIGHUP.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <thread>
#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include <httplib.h>
#include "core/units.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tests/support/redis_cluster_process.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using testing::RedisClusterProcess;

constexpr uint64_t kBlock = 64 << 10;

std::string Seeds(const RedisClusterProcess& c) {
  std::string seeds;
  for (const std::string& s : c.seeds()) seeds += (seeds.empty() ? "\"" : ", \"") + s + "\"";
  return seeds;
}

std::string PasswordFile(const testing::TempDir& dir, const std::string& tenant, const std::string& password) {
  const std::string path = dir.File(tenant + ".pass");
  std::ofstream(path) << password << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

// [tiers.remote]'s TLS keys for a cluster started with --tls.
std::string TlsConfig(const RedisClusterProcess& c) {
  if (!c.tls().enabled) return "";
  return absl::StrCat("tls = true\ntls_ca_file = \"", c.tls().ca_file, "\"\ntls_cert_file = \"", c.tls().cert_file,
                      "\"\ntls_key_file = \"", c.tls().key_file, "\"\n");
}

// A node without NVMe: host memory, then the cluster (over TLS, as a
// production cluster should be). Our uid is `tenant`.
std::string NodeConfig(const RedisClusterProcess& c, const testing::TempDir& dir, const std::string& tenant,
                       const std::string& write_policy, uint32_t budget_us = 200000,
                       const std::string& extra = "", const std::string& remote_extra = "") {
  return absl::StrCat(extra, "[tiers.host]\ncapacity = \"8MiB\"\n[tiers.remote]\nseeds = [", Seeds(c),
                      "]\nop_timeout_ms = 2000\nprobe_budget_us = ", budget_us, "\nwrite_policy = \"", write_policy,
                      "\"\n", TlsConfig(c), remote_extra, "[[tenants]]\nname = \"", tenant, "\"\nuids = [", getuid(), "]\nremote_user = \"",
                      c.user(tenant), "\"\nremote_password_file = \"",
                      PasswordFile(dir, tenant, c.password(tenant)), "\"\nremote_key_file = \"", c.key_file(tenant),
                      "\"\n");
}

nlohmann::json Remote(const DaemonProcess& d) {
  auto s = d.Status();
  if (!s.ok()) return {};
  for (const auto& t : (*s)["tiers"]) {
    if (t["tier"] == "remote") return t;
  }
  return {};
}

uint64_t Remote(const DaemonProcess& d, const char* field) {
  const nlohmann::json r = Remote(d);
  return r.contains("remote") ? r["remote"].value(field, uint64_t{0}) : 0;
}

// What a command line prints on stdout.
std::string Output(const std::string& cmd) {
  return testing::RunCommand(cmd).out;
}

// The value of a sample line "name{labels} value" (-1: none).
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// How many of keys a leased lookup hits, and how many of those load with
// their own bytes.
std::pair<uint32_t, uint32_t> HitAndLoad(Client& c, std::span<const BlockKey> keys) {
  auto r = c.Lookup(keys, {.lease = true});
  if (!r.ok() || r->hit_blocks == 0) return {0, 0};
  uint32_t correct = 0;
  auto v = c.Load(r->lease, keys.first(r->hit_blocks));
  if (v.ok()) {
    for (size_t i = 0; i < v->size(); ++i) correct += testing::MatchesKey(keys[i], {(*v)[i].data, (*v)[i].size});
  }
  (void)c.Release(r->lease);
  return {r->hit_blocks, correct};
}

// Two shared tiers side by side in one chain (the cluster, then a shared
// directory): node R, on the cluster alone, computed a conversation's first
// 8 blocks; node F, on the directory alone, its blocks 4 to 15 (the first
// four are in both, the rest in one tier each, as a cascade from the
// cluster to the directory leaves them). Node B, on both, finds the 16 in
// one lookup (both asked at once), the first 8 in the cluster (the first
// shared tier in its chain that holds them) and the next 8 in the
// directory, reports each tier to the engine as what it is, and loads all
// 16 byte-exact.
TEST(RemoteSharingTest, APrefixSpreadOverTheClusterAndASharedDirectoryIsFoundInBoth) {
  auto cluster = RedisClusterProcess::Start({"alice"});
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps installs it)";
  testing::TempDir secrets, shared;
  const std::string fs = absl::StrCat("[tiers.fs]\ndir = \"", shared.path(), "\"\ncapacity = \"256MiB\"\n");
  DaemonProcess r(NodeConfig(*cluster, secrets, "alice", "committed"));
  DaemonProcess f(absl::StrCat("[tiers.host]\ncapacity = \"8MiB\"\n[[tiers.lower]]\nkind = \"fs\"\ndir = \"",
                               shared.path(), "\"\ncapacity = \"256MiB\"\nwrite_policy = \"committed\"\n",
                               "[[tenants]]\nname = \"alice\"\nuids = [", getuid(), "]\n"));
  DaemonProcess b(NodeConfig(*cluster, secrets, "alice", "demoted") + fs);
  ASSERT_TRUE(r.Start().ok()) << r.Log();
  ASSERT_TRUE(f.Start().ok()) << f.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  EXPECT_NE(b.Log().find("chain=\"redis -> fs\""), std::string::npos) << b.Log();

  auto cr = testing::AttachTo(r.socket_path(), testing::TestNamespace(kBlock, "two/shared"));
  auto cf = testing::AttachTo(f.socket_path(), testing::TestNamespace(kBlock, "two/shared"));
  const std::vector<BlockKey> keys = testing::SeededKeys(*cr, 21, 24);
  ASSERT_TRUE(testing::StoreFilled(*cr, std::span<const BlockKey>(keys).first(8)).ok());
  ASSERT_TRUE(testing::StoreFilled(*cf, std::span<const BlockKey>(keys).subspan(4, 12)).ok());
  auto lane = [](const DaemonProcess& d, const std::string& kind) {
    auto s = d.Status();
    if (s.ok()) {
      for (const auto& t : (*s)["tiers"]) {
        if (t.value("kind", "") == kind) return t;
      }
    }
    return nlohmann::json::object();
  };
  auto published = [&](const DaemonProcess& d, const std::string& kind) {
    const nlohmann::json l = lane(d, kind);
    return l.contains("shared") ? l["shared"].value("publishes", uint64_t{0}) : 0;
  };
  ASSERT_TRUE(testing::Eventually([&] { return published(r, "remote") >= 8 && published(f, "fs") >= 12; },
                                  std::chrono::seconds(20)))
      << lane(r, "remote").dump() << "\n" << lane(f, "fs").dump();

  auto cb = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "two/shared"));
  {
    auto found = cb->Lookup(keys);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    ASSERT_EQ(found->hit_blocks, 16u) << "8 in the cluster, 8 more in the directory, none past them";
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(found->tiers[i], TierKind::kRemote) << i;
    for (size_t i = 8; i < 16; ++i) EXPECT_EQ(found->tiers[i], TierKind::kFile) << i;
    // And by lane: the cluster is the chain's first, the directory its second.
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(found->lanes[i], 0) << i;
    for (size_t i = 8; i < 16; ++i) EXPECT_EQ(found->lanes[i], 1) << i;
    for (size_t i = 16; i < keys.size(); ++i) EXPECT_EQ(found->lanes[i], kNoLane) << i;
  }
  const auto [hit, correct] = HitAndLoad(*cb, keys);
  EXPECT_EQ(hit, 16u);
  EXPECT_EQ(correct, 16u) << "every block loads with its own bytes, from whichever tier holds it";
  EXPECT_EQ(lane(b, "remote").value("blocks", uint64_t{0}), 8u) << lane(b, "remote").dump();
  EXPECT_EQ(lane(b, "fs").value("blocks", uint64_t{0}), 8u) << lane(b, "fs").dump();
  EXPECT_EQ(lane(b, "fs").value("chain_position", -1), 1);
  // The leased lookup's hits, by the lane each block was found in.
  EXPECT_EQ(lane(b, "remote").value("hits", uint64_t{0}), 8u) << lane(b, "remote").dump();
  EXPECT_EQ(lane(b, "fs").value("hits", uint64_t{0}), 8u) << lane(b, "fs").dump();
}

TEST(RemoteSharingTest, NodeBReusesWhatNodeAComputedByteExactAndNothingElse) {
  auto cluster = RedisClusterProcess::Start({"alice", "bob"}, "--tls");
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps installs it)";
  testing::TempDir secrets;
  DaemonProcess a(NodeConfig(*cluster, secrets, "alice", "committed"));
  DaemonProcess b(NodeConfig(*cluster, secrets, "alice", "demoted", 200000, "[metrics]\nport = 0\n"));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  ASSERT_NE(a.socket_path(), b.socket_path());

  // Node A computes a conversation's first 24 blocks; write_policy
  // "committed" sends each up to the cluster as it is committed.
  auto ca = testing::AttachTo(a.socket_path(), testing::TestNamespace(kBlock, "remote/share"));
  const std::vector<BlockKey> keys = testing::SeededKeys(*ca, 11, 32);
  const std::span<const BlockKey> first(keys.data(), 24);
  ASSERT_TRUE(testing::StoreFilled(*ca, first).ok());
  ASSERT_TRUE(testing::Eventually([&] { return Remote(a, "publishes") >= 24; }, std::chrono::seconds(20)))
      << Remote(a).dump();

  // Node B never saw them: its lookup finds the 24 in the cluster (and not
  // the 8 after them, which nobody computed), and each loads with its bytes.
  auto cb = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "remote/share"));
  {
    // The engine learns where they are: in the shared tier, not on NVMe.
    auto found = cb->Lookup(keys);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    ASSERT_EQ(found->hit_blocks, 24u);
    for (size_t i = 0; i < 24; ++i) EXPECT_EQ(found->tiers[i], TierKind::kRemote) << i;
  }
  EXPECT_EQ(HitAndLoad(*cb, keys), (std::pair<uint32_t, uint32_t>{24, 24}));
  EXPECT_EQ(Remote(b, "probe_found"), 24u);
  EXPECT_EQ(Remote(b, "hits_loaded"), 24u);
  {
    auto st = b.Status();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ((*st)["stats"]["blocks_hit_shared"], 24);
    EXPECT_EQ((*st)["stats"]["blocks_hit_local"], 0) << "B has no NVMe tier: every lower hit was the cluster's";
  }
  const nlohmann::json rb = Remote(b);
  EXPECT_GE(rb.value("reads", 0), 24) << rb.dump();
  EXPECT_EQ(rb.value("checksum_failures", -1), 0);
  // Prometheus shows it, in a form promtool accepts.
  {
    auto st = b.Status();
    ASSERT_TRUE(st.ok());
    httplib::Client http("127.0.0.1", (*st)["metrics"]["port"].get<int>());
    auto res = http.Get("/metrics");
    ASSERT_TRUE(res && res->status == 200);
    const std::string& text = res->body;
    EXPECT_EQ(Sample(text, "kvtier_blocks_hit_total{tier=\"remote\"}"), 24);
    EXPECT_EQ(Sample(text, "kvtier_blocks_hit_total{tier=\"nvme\"}"), -1) << "B has no NVMe tier, so no series for one";
    EXPECT_EQ(Sample(text, "kvtier_remote_probe_blocks_total{result=\"found\"}"), 24);
    EXPECT_EQ(Sample(text, "kvtier_remote_slots_covered"), 16384);
    // No token: the primaries counted, their addresses not shown.
    EXPECT_EQ(Sample(text, "kvtier_remote_nodes{state=\"up\"}"), 3) << text;
    for (const std::string& node : cluster->seeds()) {
      EXPECT_EQ(text.find(node.substr(node.rfind(':'))), std::string::npos) << "no node address without a token";
    }
    EXPECT_EQ(text.find(cluster->password("alice")), std::string::npos);
    if (system("command -v promtool >/dev/null 2>&1") == 0) {
      testing::TempDir scratch;
      const std::string file = scratch.File("metrics.txt");
      std::ofstream(file) << text;
      const std::string checked = Output("promtool check metrics < " + file + " 2>&1");
      EXPECT_EQ(checked.find("error"), std::string::npos) << checked;
    }
  }
  // kvtierctl shows it: the remote tier's probes found the 24, per node.
  const std::string ctl =
      absl::StrCat(std::getenv("KVTIER_BUILD_DIR") ? std::getenv("KVTIER_BUILD_DIR") : ".",
                   "/tools/kvtierctl --socket ", b.admin_socket_path());
  for (const char* command : {" tiers", " status"}) {
    const std::string shown = Output(ctl + command);
    EXPECT_NE(shown.find("remote tier: write policy demoted, probe budget 200000 us, 16384 of 16384 slots covered"),
              std::string::npos)
        << command << "\n" << shown;
    EXPECT_NE(shown.find("found 24, late 0"), std::string::npos) << command << "\n" << shown;
    size_t rows = 0;
    for (const std::string& node : cluster->seeds()) rows += shown.find(node + " ") != std::string::npos;
    EXPECT_GE(rows, 3u) << "a row per primary at least\n" << shown;
  }
  // Now in B's host memory: a second lookup hits locally, asking nothing more.
  const uint64_t probes = Remote(b, "probes");
  EXPECT_EQ(HitAndLoad(*cb, first), (std::pair<uint32_t, uint32_t>{24, 24}));
  EXPECT_EQ(Remote(b, "probes"), probes) << "a full local hit asks the cluster nothing";

  // The same key bytes in another namespace are other blocks.
  auto other = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "remote/other-model"));
  EXPECT_EQ(HitAndLoad(*other, first).first, 0u);

  // Another tenant, on a third node: its keys live under its own prefix,
  // so it never hits alice's blocks, and its ACL user cannot read them.
  DaemonProcess c(NodeConfig(*cluster, secrets, "bob", "demoted"));
  ASSERT_TRUE(c.Start().ok()) << c.Log();
  auto cc = testing::AttachTo(c.socket_path(), testing::TestNamespace(kBlock, "remote/share"));
  EXPECT_EQ(HitAndLoad(*cc, first).first, 0u);
  EXPECT_GE(Remote(c, "probes"), 1u) << "it asked, and the cluster had nothing of bob's";
  std::string alice_key;
  for (size_t node = 0; node < cluster->seeds().size() && alice_key.empty(); ++node) {
    if (cluster->Cli("role", node).rfind("master", 0) != 0) continue;
    for (absl::string_view line : absl::StrSplit(cluster->Cli("--scan --pattern 'kvtier:alice:*'", node), '\n',
                                                 absl::SkipEmpty())) {
      alice_key = std::string(line);
      break;
    }
  }
  ASSERT_FALSE(alice_key.empty());
  const std::string as_bob = cluster->Cli("-c get " + alice_key, 0, "bob");
  EXPECT_NE(as_bob.find("NOPERM"), std::string::npos) << as_bob;
  for (const DaemonProcess* d : {&a, &b, &c}) {
    EXPECT_EQ(d->Log().find(cluster->password("alice")), std::string::npos) << "a password is never logged";
    EXPECT_EQ(d->Log().find(cluster->password("bob")), std::string::npos);
  }
}

TEST(RemoteSharingTest, SighupChangesTheProbeBudgetAndTheWritePolicy) {
  auto cluster = RedisClusterProcess::Start({"alice"}, "--tls");
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir secrets;
  DaemonProcess a(NodeConfig(*cluster, secrets, "alice", "demoted"));
  DaemonProcess b(NodeConfig(*cluster, secrets, "alice", "demoted", /*budget_us=*/0));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  auto ca = testing::AttachTo(a.socket_path(), testing::TestNamespace(kBlock, "remote/reload"));
  const std::vector<BlockKey> keys = testing::SeededKeys(*ca, 12, 8);
  ASSERT_TRUE(testing::StoreFilled(*ca, keys).ok());
  // "demoted": blocks in A's host memory stay A's.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Remote(a, "publishes"), 0u);

  // "reused" on A: the next hit of each block sends it up.
  const std::string path_a = a.dir() + "/kvtierd.toml";
  std::string conf;
  {
    std::ifstream in(path_a);
    conf.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto replace = [](std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  std::ofstream(path_a) << replace(conf, "write_policy = \"demoted\"", "write_policy = \"reused\"");
  a.Kill(SIGHUP);
  ASSERT_TRUE(testing::Eventually([&] { return Remote(a)["remote"].value("write_policy", "") == "reused"; },
                                  std::chrono::seconds(10)))
      << a.Log();
  EXPECT_EQ(HitAndLoad(*ca, keys), (std::pair<uint32_t, uint32_t>{8, 8}));
  ASSERT_TRUE(testing::Eventually([&] { return Remote(a, "publishes") >= 8; }, std::chrono::seconds(20)))
      << Remote(a).dump();
  // A hit again writes nothing again.
  EXPECT_EQ(HitAndLoad(*ca, keys).first, 8u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Remote(a, "publishes"), 8u);

  // B's budget is 0: it does not ask, so it misses what the cluster holds.
  auto cb = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "remote/reload"));
  EXPECT_EQ(HitAndLoad(*cb, keys).first, 0u);
  EXPECT_EQ(Remote(b, "probes"), 0u);
  const std::string path_b = b.dir() + "/kvtierd.toml";
  {
    std::ifstream in(path_b);
    conf.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(path_b) << replace(conf, "probe_budget_us = 0", "probe_budget_us = 200000");
  b.Kill(SIGHUP);
  ASSERT_TRUE(testing::Eventually([&] { return Remote(b)["remote"].value("probe_budget_us", 0) == 200000; },
                                  std::chrono::seconds(10)))
      << b.Log();
  EXPECT_EQ(HitAndLoad(*cb, keys), (std::pair<uint32_t, uint32_t>{8, 8}));
}

// A primary killed under traffic, seen from a node: while the cluster fails
// over, node B's lookups of what node A computed are misses within the probe
// budget and its loads fail within the op deadline, its own blocks keep
// being served from its host tier at local speed, and no loaded byte is
// wrong; after the failover the cluster's blocks are hits again.
TEST(RemoteSharingTest, APrimaryKilledUnderTrafficCostsMissesNeverWrongBytesAndLocalTiersServe) {
  auto cluster = RedisClusterProcess::Start({"alice"}, "--tls");
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir secrets;
  constexpr uint32_t kBudgetUs = 100000;
  DaemonProcess a(NodeConfig(*cluster, secrets, "alice", "committed"));
  DaemonProcess b(NodeConfig(*cluster, secrets, "alice", "demoted", kBudgetUs));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  auto ca = testing::AttachTo(a.socket_path(), testing::TestNamespace(kBlock, "remote/failover"));
  auto cb = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "remote/failover"));
  // A computes 60 chains of 3 blocks; B its own 16.
  constexpr int kChains = 60;
  std::vector<std::vector<BlockKey>> chains;
  for (int i = 0; i < kChains; ++i) {
    chains.push_back(testing::SeededKeys(*ca, 100 + i, 3));
    ASSERT_TRUE(testing::StoreFilled(*ca, chains.back()).ok());
  }
  ASSERT_TRUE(testing::Eventually([&] { return Remote(a, "publishes") >= 3 * kChains; }, std::chrono::seconds(30)))
      << Remote(a).dump();
  const std::vector<BlockKey> own = testing::SeededKeys(*cb, 99, 16);
  ASSERT_TRUE(testing::StoreFilled(*cb, own).ok());
  ASSERT_TRUE(testing::Eventually([&] { return cluster->ReplicasSynced(); })) << "the replicas copy";

  // Hit, loaded, loaded with their own bytes; the lookup's and the load's times.
  struct Got {
    uint32_t hit = 0, loaded = 0, correct = 0;
    uint64_t lookup_ns = 0, load_ns = 0;
  };
  auto get = [](Client& c, std::span<const BlockKey> keys) {
    Got g;
    uint64_t t0 = MonotonicNanos();
    auto r = c.Lookup(keys, {.lease = true});
    g.lookup_ns = MonotonicNanos() - t0;
    if (!r.ok() || r->hit_blocks == 0) return g;
    g.hit = r->hit_blocks;
    t0 = MonotonicNanos();
    auto v = c.Load(r->lease, keys.first(r->hit_blocks));
    g.load_ns = MonotonicNanos() - t0;
    if (v.ok()) {
      g.loaded = static_cast<uint32_t>(v->size());
      for (size_t i = 0; i < v->size(); ++i) g.correct += testing::MatchesKey(keys[i], {(*v)[i].data, (*v)[i].size});
    }
    (void)c.Release(r->lease);
    return g;
  };

  ASSERT_TRUE(cluster->Kill(0));
  uint32_t missed = 0, fully_hit = 0;
  uint64_t slowest_lookup = 0, slowest_load = 0, slowest_local = 0;
  int next = 0;
  const uint64_t start = MonotonicNanos();
  while (next < kChains - 10 && MonotonicNanos() - start < 8'000'000'000ull) {
    const Got local = get(*cb, own);
    EXPECT_EQ(local.hit, 16u);
    EXPECT_EQ(local.correct, 16u) << "B's own blocks are served from its host tier throughout";
    slowest_local = std::max(slowest_local, local.lookup_ns + local.load_ns);
    const Got g = get(*cb, chains[next++]);
    EXPECT_EQ(g.correct, g.loaded) << "a wrong byte was served";
    (g.loaded == 3 ? fully_hit : missed) += 1;
    slowest_lookup = std::max(slowest_lookup, g.lookup_ns);
    slowest_load = std::max(slowest_load, g.load_ns);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(missed, 0u) << "the dead primary's slots missed while it failed over";
  // A probe waits at most its budget; a load at most the op deadline and one
  // reply timeout (plus scheduling on a busy machine).
  EXPECT_LT(slowest_lookup, uint64_t{kBudgetUs} * 1000 + 400'000'000ull);
  EXPECT_LT(slowest_load, 4'000'000'000ull);
  EXPECT_LT(slowest_local, 200'000'000ull) << "local hits never wait on the cluster";
  // After the failover (however long a loaded machine takes: the same
  // chain is asked again until it loads whole, for up to a minute), the
  // chains not asked for yet are hits again.
  bool healed = false;
  const uint64_t heal_start = MonotonicNanos();
  while (!healed && next < kChains && MonotonicNanos() - heal_start < 60'000'000'000ull) {
    const Got g = get(*cb, chains[next]);
    EXPECT_EQ(g.correct, g.loaded) << "a wrong byte was served";
    healed = g.loaded == 3;
    if (healed) {
      ++next;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }
  ASSERT_TRUE(healed) << Remote(b).dump();
  for (; next < kChains; ++next) {
    const Got g = get(*cb, chains[next]);
    EXPECT_EQ(g.correct, 3u) << "chain " << next << " after the failover\n" << Remote(b).dump();
  }
  std::cerr << "failover on node B: " << fully_hit << " chains hit, " << missed << " missed; slowest lookup "
            << slowest_lookup / 1000000 << " ms, load " << slowest_load / 1000000 << " ms, local "
            << slowest_local / 1000000 << " ms\n";
}

// Every node of the cluster stopped (SIGSTOP: connections open, nothing
// answers), restarted when the test ends however it ends.
class FrozenCluster {
 public:
  explicit FrozenCluster(const RedisClusterProcess& c) : dir_(c.dir()) { ok_ = Signal("STOP"); }
  ~FrozenCluster() { Signal("CONT"); }
  bool ok() const { return ok_; }

 private:
  bool Signal(const char* sig) {
    return testing::RunCommand(absl::StrCat("for f in ", dir_, "/node*/redis.pid; do kill -", sig,
                                            " $(cat $f) || exit 1; done"))
               .exit_code == 0;
  }
  std::string dir_;
  bool ok_ = false;
};

TEST(RemoteSharingTest, ALookupWaitingOnTheClusterDoesNotStallItsSession) {
  auto cluster = RedisClusterProcess::Start({"alice"});
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir secrets;
  constexpr uint32_t kBudgetUs = 900'000;  // the most probe_budget_us allows is 1 s
  DaemonProcess a(NodeConfig(*cluster, secrets, "alice", "committed"));
  DaemonProcess b(NodeConfig(*cluster, secrets, "alice", "demoted", kBudgetUs));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  auto ca = testing::AttachTo(a.socket_path(), testing::TestNamespace(kBlock, "remote/async"));
  auto cb = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "remote/async"));
  const std::vector<BlockKey> shared = testing::SeededKeys(*ca, 21, 8);
  ASSERT_TRUE(testing::StoreFilled(*ca, shared).ok());
  ASSERT_TRUE(testing::Eventually([&] { return Remote(a, "publishes") >= 8; }, std::chrono::seconds(20)));
  // B's own blocks, in its host tier.
  const std::vector<BlockKey> own = testing::SeededKeys(*cb, 22, 4);
  ASSERT_TRUE(testing::StoreFilled(*cb, own).ok());

  FrozenCluster frozen(*cluster);
  ASSERT_TRUE(frozen.ok());
  // B's lookup of A's blocks asks the frozen cluster: it waits up to the
  // budget. Meanwhile the same session answers a ping, a lookup of its own
  // blocks and a load, at once: the session thread is not the one waiting.
  LookupResult waiting;
  const uint64_t t0 = MonotonicNanos();
  auto op = cb->LookupAsync(shared, {.lease = true}, &waiting);
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  ASSERT_TRUE(cb->Ping().ok());
  const auto [hit, correct] = HitAndLoad(*cb, own);
  const uint64_t served_ns = MonotonicNanos() - t0;
  EXPECT_EQ(hit, 4u);
  EXPECT_EQ(correct, 4u);
  EXPECT_FALSE(cb->Poll(*op).has_value()) << "the probe is still waiting on the frozen cluster";
  EXPECT_LT(served_ns, uint64_t{kBudgetUs} * 1000 / 3) << "the session served its other requests while it waited";
  // The waiting lookup ends by its budget with the local answer: a miss.
  ASSERT_TRUE(cb->Wait(*op, std::chrono::seconds(10)).ok());
  const uint64_t waited_ns = MonotonicNanos() - t0;
  EXPECT_EQ(waiting.hit_blocks, 0u);
  EXPECT_GE(waited_ns, uint64_t{kBudgetUs} * 1000 * 9 / 10);
  EXPECT_LT(waited_ns, uint64_t{kBudgetUs} * 1000 + 2'000'000'000ull);
  EXPECT_TRUE(testing::Eventually([&] { return Remote(b, "probes_late") >= 1; })) << Remote(b).dump();

  // A session that goes while its lookup waits: it ends without waiting for
  // the answer, and the daemon serves the next one.
  LookupResult abandoned;
  ASSERT_TRUE(cb->LookupAsync(shared, {.lease = true}, &abandoned).ok());
  cb.reset();
  EXPECT_TRUE(testing::Eventually([&] {
    auto st = b.Status();
    return st.ok() && (*st)["sessions"].empty();
  }, std::chrono::seconds(5)));
  auto again = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "remote/async"));
  EXPECT_EQ(HitAndLoad(*again, own), (std::pair<uint32_t, uint32_t>{4, 4}));
}

// scripts/bench-remote-replay on a hand-made trace whose second turns go to
// the other node ten requests after their first: two nodes with local
// tiers only never reuse a first turn, one node alone and two sharing the
// cluster ("committed") do, and no loaded byte is wrong in any run.
TEST(RemoteSharingTest, TheEndToEndBenchmarkShowsTwoNodesReusingThroughTheCluster) {
  if (system("command -v redis-server >/dev/null 2>&1") != 0) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir dir;
  const std::string trace = dir.File("trace.jsonl");
  {
    std::ofstream f(trace);
    constexpr int kConversations = 40, kLag = 10;
    for (int i = 0; i < 2 * (kConversations + kLag); ++i) {
      std::vector<int> ids;
      if (i % 2 == 0 && i / 2 < kConversations) {
        for (int b = 0; b < 4; ++b) ids.push_back(1000 * (i / 2 + 1) + b);  // turn 1
      } else if (i % 2 == 1 && (i - 1) / 2 >= kLag) {
        for (int b = 0; b < 6; ++b) ids.push_back(1000 * ((i - 1) / 2 - kLag + 1) + b);  // its turn 2
      } else {
        ids = {900000 + i};  // a request nothing else shares
      }
      f << "{\"timestamp\": " << i << ", \"input_length\": " << ids.size() * 512
        << ", \"output_length\": 1, \"hash_ids\": [" << absl::StrJoin(ids, ", ") << "]}\n";
    }
  }
  const char* build = std::getenv("KVTIER_BUILD_DIR");
  const std::string out = Output(absl::StrCat("KVTIER_BIN_DIR=", build ? build : ".", " ", KVTIER_SOURCE_DIR,
                                              "/scripts/bench-remote-replay --trace ", trace,
                                              " --block-bytes 16KiB --json 2>", dir.File("err")));
  std::map<std::string, nlohmann::json> runs;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) runs[j.value("run", "")] = j;
  }
  std::string err;
  {
    std::ifstream in(dir.File("err"));
    err.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_EQ(runs.size(), 4u) << out << err;
  for (const auto& [name, r] : runs) {
    EXPECT_EQ(r["verify_failures"], 0) << name;
    EXPECT_EQ(r["blocks_requested"], 40 * 4 + 40 * 6 + 20) << name;
  }
  EXPECT_EQ(runs["alone"]["blocks_hit"], 40 * 4) << "one node reuses every first turn";
  EXPECT_EQ(runs["two local"]["blocks_hit"], 0) << "the other node never saw the first turn";
  EXPECT_GT(runs["two committed"]["blocks_hit_shared"].get<int>(), 0) << runs["two committed"].dump();
  EXPECT_GT(runs["two committed"]["blocks_hit"].get<int>(), 40) << runs["two committed"].dump();
}

// The handles a node keeps on the cluster's blocks (tiers.remote.capacity)
// fill with what its lookups found there and are evicted only on demand;
// writes for other nodes must not wait for them. Node B's handles hold 4
// blocks; it finds A's 12 in the cluster, then commits 10 of its own with
// "committed": all 10 go up, once each, and A loads them.
TEST(RemoteSharingTest, PublishesDoNotWaitForTheNodesOwnHandles) {
  auto cluster = RedisClusterProcess::Start({"alice"}, "--tls");
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir secrets;
  DaemonProcess a(NodeConfig(*cluster, secrets, "alice", "committed"));
  DaemonProcess b(NodeConfig(*cluster, secrets, "alice", "committed", 200000, "", "capacity = \"300KiB\"\n"));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  auto ca = testing::AttachTo(a.socket_path(), testing::TestNamespace(kBlock, "remote/handles"));
  auto cb = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "remote/handles"));
  const std::vector<BlockKey> from_a = testing::SeededKeys(*ca, 21, 12);
  ASSERT_TRUE(testing::StoreFilled(*ca, from_a).ok());
  ASSERT_TRUE(testing::Eventually([&] { return Remote(a, "publishes") >= 12; }, std::chrono::seconds(20)))
      << Remote(a).dump();
  // B probes A's chain: its handles fill with what it found.
  auto found = cb->Lookup(from_a);
  ASSERT_TRUE(found.ok());
  EXPECT_GE(found->hit_blocks, 3u);
  const nlohmann::json before = Remote(b);
  EXPECT_GE(before.value("used_bytes", uint64_t{0}) * 4 / 3, before.value("capacity_bytes", uint64_t{1}))
      << "B's handles are (nearly) full: " << before.dump();

  const std::vector<BlockKey> from_b = testing::SeededKeys(*cb, 22, 10);
  ASSERT_TRUE(testing::StoreFilled(*cb, from_b).ok());
  ASSERT_TRUE(testing::Eventually([&] { return Remote(b, "publishes") >= 10; }, std::chrono::seconds(20)))
      << Remote(b).dump();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(Remote(b, "publishes"), 10u) << "once each";
  EXPECT_EQ(Remote(b, "publishes_failed"), 0u) << Remote(b).dump();
  EXPECT_EQ(HitAndLoad(*ca, from_b), (std::pair<uint32_t, uint32_t>{10, 10}));
}

// The shared tier's fair shares, against the floods that once took it
// from other tenants: bob's node floods the cluster with 256-block probes
// from 8 sessions while alice, on another node, looks up 300 blocks her
// first node published. Bob's probes are throttled and his adopted records
// bounded on his own node; alice keeps >= 90% of her remote hits, her
// lookups' 90th percentile stays within twice the probe budget and her
// slowest within four times (80% and three / six times under ASan, five /
// ten under TSan, whose slower probes run into the budget on a loaded
// machine). Of 30 lookups the slowest is one scheduling hiccup away from
// the bound on a machine building beside the suite (40.008 ms against 40
// in .ci/run's debug suite beside the ASan build), so the budget is held by
// the 90th percentile and the slowest only proves no lookup waits unbounded.
TEST(RemoteSharingTest, AFloodingTenantCostsItselfNotTheOthers) {
  auto cluster = RedisClusterProcess::Start({"alice", "bob"}, "--tls");
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir secrets;
  constexpr uint32_t kBudgetUs = 20000;
  DaemonProcess a(NodeConfig(*cluster, secrets, "alice", "committed"));
  DaemonProcess b(NodeConfig(*cluster, secrets, "bob", "committed", kBudgetUs, "",
                             "probe_blocks_per_s = 5000\nrecords_per_tenant = 1000\n"));
  DaemonProcess c(NodeConfig(*cluster, secrets, "alice", "demoted", kBudgetUs));
  for (DaemonProcess* d : {&a, &b, &c}) ASSERT_TRUE(d->Start().ok()) << d->Log();
  const NamespaceDescriptor ns = testing::TestNamespace(kBlock, "remote/fair");
  // Alice's 300 blocks, as 30 prompts of 10, published from node A.
  std::vector<std::vector<BlockKey>> prompts;
  {
    auto ca = testing::AttachTo(a.socket_path(), ns);
    for (uint32_t p = 0; p < 30; ++p) {
      prompts.push_back(testing::SeededKeys(*ca, 100 + p, 10));
      // Host memory held by publishes in flight: a store that finds it all
      // held is tried again (as bob's below).
      ASSERT_TRUE(testing::Eventually([&] { return testing::StoreFilled(*ca, prompts.back()).ok(); }));
    }
    ASSERT_TRUE(testing::Eventually([&] { return Remote(a, "publishes") >= 300; })) << Remote(a).dump();
    // Bob's own 2,000 blocks there too (what his probes find).
    auto cb = testing::AttachTo(b.socket_path(), ns);
    for (uint32_t p = 0; p < 8; ++p) {
      const std::vector<BlockKey> keys = testing::SeededKeys(*cb, 900 + p, 250);
      // Host memory is held by publishes in flight until they land: a store
      // that finds it all held is tried again.
      for (size_t i = 0; i < keys.size(); i += 25) {
        ASSERT_TRUE(testing::Eventually([&] { return testing::StoreFilled(*cb, std::span(keys).subspan(i, 25)).ok(); }));
      }
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bob_lookups{0};
  std::vector<std::thread> flood;
  for (int t = 0; t < 8; ++t) {
    flood.emplace_back([&, t] {
      auto cb = testing::AttachTo(b.socket_path(), ns);
      if (!cb) return;
      // Windows of 256 over bob's published blocks and over keys nobody has.
      std::vector<BlockKey> mine = testing::SeededKeys(*cb, 900 + t, 250);
      for (uint32_t i = 0; !stop.load(); ++i) {
        std::vector<BlockKey> keys = i % 2 == 0 ? mine : testing::SeededKeys(*cb, 5000 + t * 100000 + i, 256);
        (void)cb->Lookup(keys, {.lease = false});
        bob_lookups.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the flood is on
  auto cc = testing::AttachTo(c.socket_path(), ns);
  ASSERT_NE(cc, nullptr);
  uint32_t hits = 0;
  std::vector<double> ms;
  for (const std::vector<BlockKey>& keys : prompts) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = cc->Lookup(keys, {.lease = false});
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (r.ok()) hits += r->hit_blocks;
  }
  stop = true;
  for (std::thread& t : flood) t.join();
  std::sort(ms.begin(), ms.end());
  const double p90 = ms[ms.size() * 9 / 10];
  const double slowest = ms.back();
#if defined(KVTIER_TSAN)
  // TSan slows every lookup of bob's eight flooding sessions too, on the
  // same cores, while .ci/run builds the fuzz targets beside the suite: slowest lookup
  // 69.3 ms was seen there with bob throttled as meant. The budget itself is
  // held to 2x by the plain build; TSan's run is for races.
  constexpr double kSlack = 5;
  constexpr uint32_t kHitsFloor = 240;
#elif defined(KVTIER_SANITIZER)
  constexpr double kSlack = 3;  // instrumented, and .ci/run builds the next suite beside it (slowest 40.8 ms seen)
  // A probe that the loaded machine keeps past its budget is a miss: 260 of
  // 300 were seen under ASan with the TSan tree building beside it (slowest
  // 44.8 ms, bob throttled as meant).
  constexpr uint32_t kHitsFloor = 240;
#else
  constexpr double kSlack = 2;
  constexpr uint32_t kHitsFloor = 270;
#endif
  EXPECT_GE(hits, kHitsFloor) << "alice keeps " << kHitsFloor * 100 / 300 << "% of her remote hits while bob floods";
  EXPECT_LE(p90, kSlack * kBudgetUs / 1000.0) << "alice's lookups' p90 within " << kSlack << "x the probe budget";
  EXPECT_LE(slowest, 2 * kSlack * kBudgetUs / 1000.0)
      << "alice's slowest lookup within " << 2 * kSlack << "x the probe budget";
  const nlohmann::json rb = Remote(b)["remote"];
  EXPECT_GT(rb.value("probes_throttled", 0), 0) << rb.dump();
  EXPECT_GT(bob_lookups.load(), 100u);
  std::printf("flood: bob %llu lookups (%llu probes asked, %llu throttled); alice %u of 300 hits, "
              "p50 %.1f p90 %.1f slowest %.1f ms\n",
              static_cast<unsigned long long>(bob_lookups.load()),
              static_cast<unsigned long long>(rb.value("probes", uint64_t{0})),
              static_cast<unsigned long long>(rb.value("probes_throttled", uint64_t{0})), hits, ms[ms.size() / 2], p90,
              slowest);
}

// Bytes, not probes: bob writes 100 MiB into a cluster of 3 x 32 MiB
// primaries (allkeys-lru) that alice's 300 blocks share. With a budget of
// 24 MiB each (tiers.remote.tenant_budget), bob's writes evict bob's own
// oldest blocks through the ledger, and alice, on another node, still finds
// >= 90% of hers. (Without budgets the cluster's LRU takes alice's: 22 of
// 300 were left when this was written.)
TEST(RemoteSharingTest, ABudgetKeepsAFloodingTenantsBytesOffTheOthersBlocks) {
  auto cluster = RedisClusterProcess::Start({"alice", "bob"}, "--tls --maxmemory 32mb");
  if (cluster == nullptr) GTEST_SKIP() << "redis-server is not installed";
  testing::TempDir secrets;
  const std::string budget = "tenant_budget = \"24MiB\"\n";
  DaemonProcess a(NodeConfig(*cluster, secrets, "alice", "committed", 200000, "", budget));
  DaemonProcess b(NodeConfig(*cluster, secrets, "bob", "committed", 200000, "", budget));
  DaemonProcess c(NodeConfig(*cluster, secrets, "alice", "demoted", 200000, "", budget));
  for (DaemonProcess* d : {&a, &b, &c}) ASSERT_TRUE(d->Start().ok()) << d->Log();
  const NamespaceDescriptor ns = testing::TestNamespace(kBlock, "remote/budget");
  std::vector<std::vector<BlockKey>> prompts;
  {
    auto ca = testing::AttachTo(a.socket_path(), ns);
    ASSERT_NE(ca, nullptr);
    for (uint32_t p = 0; p < 30; ++p) {
      prompts.push_back(testing::SeededKeys(*ca, 100 + p, 10));
      ASSERT_TRUE(testing::Eventually([&] { return testing::StoreFilled(*ca, prompts.back()).ok(); }));
    }
    ASSERT_TRUE(testing::Eventually([&] { return Remote(a, "publishes") >= 300; })) << Remote(a).dump();
  }
  {
    auto cb = testing::AttachTo(b.socket_path(), ns);
    ASSERT_NE(cb, nullptr);
    for (uint32_t p = 0; p < 16; ++p) {
      const std::vector<BlockKey> keys = testing::SeededKeys(*cb, 900 + p, 100);
      for (size_t i = 0; i < keys.size(); i += 25) {
        ASSERT_TRUE(testing::Eventually([&] { return testing::StoreFilled(*cb, std::span(keys).subspan(i, 25)).ok(); }));
      }
    }
    ASSERT_TRUE(testing::Eventually([&] { return Remote(b, "publishes") >= 1600; }, std::chrono::seconds(60)))
        << Remote(b).dump();
  }
  auto cc = testing::AttachTo(c.socket_path(), ns);
  ASSERT_NE(cc, nullptr);
  uint32_t hits = 0;
  for (const std::vector<BlockKey>& keys : prompts) hits += HitAndLoad(*cc, keys).second;
  const nlohmann::json rb = Remote(b)["remote"];
  EXPECT_GE(hits, 270u) << "alice keeps 90% of her remote hits after bob's 100 MiB";
  EXPECT_GT(rb["budget"].value("evictions", 0), 1000) << rb.dump();
  EXPECT_EQ(rb["budget"].value("failures", 1), 0) << rb.dump();
  std::printf("budget: bob published %llu blocks, %llu evicted by his budget; alice %u of 300 hits, byte-exact\n",
              static_cast<unsigned long long>(rb.value("publishes", uint64_t{0})),
              static_cast<unsigned long long>(rb["budget"].value("evictions", uint64_t{0})), hits);
}

}  // namespace
}  // namespace kvtier
