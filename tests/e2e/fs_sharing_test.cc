// SPDX-License-Identifier: Apache-2.0
// Two kvtierd nodes (separate sockets, data folders and host tiers) over one
// shared directory, the chain written as [[tiers.lower]] (NVMe, then the fs
// tier): blocks node A computed are found and loaded on node B byte-exact,
// reported to the engine as file-tier blocks; a file damaged by another
// process is a counted miss on B, never served; status and metrics show the
// lane as kind "fs"; and the legacy [tiers.fs] section reads as the same
// chain.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ipc/admin_client.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tiers/fs/fs_tier.h"
#include "tests/support/test_support.h"
#include <httplib.h>

namespace kvtier {
namespace {

using testing::DaemonProcess;

constexpr uint64_t kBlock = 64 << 10;

std::string NodeConfig(const std::string& shared_dir, const std::string& extra = "") {
  return absl::StrCat(extra, "[tiers.host]\ncapacity = \"8MiB\"\n",
                      "[[tiers.lower]]\nkind = \"nvme\"\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\n",
                      "[[tiers.lower]]\nkind = \"fs\"\ndir = \"", shared_dir,
                      "\"\ncapacity = \"256MiB\"\nwrite_policy = \"committed\"\nprobe_budget_us = 200000\n",
                      "[[tenants]]\nname = \"alice\"\nuids = [", getuid(), "]\n");
}

// The first lower tier whose `field` ("kind", or "tier": its name) is `value`.
nlohmann::json LaneWhere(const DaemonProcess& d, const char* field, const std::string& value) {
  auto s = d.Status();
  if (!s.ok()) return {};
  for (const auto& t : (*s)["tiers"]) {
    if (t.value(field, "") == value) return t;
  }
  return {};
}

nlohmann::json Lane(const DaemonProcess& d, const std::string& kind) { return LaneWhere(d, "kind", kind); }
nlohmann::json LaneNamed(const DaemonProcess& d, const std::string& name) { return LaneWhere(d, "tier", name); }

std::string ConfigText(const DaemonProcess& d) {
  std::ifstream f(d.dir() + "/kvtierd.toml");
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// `s` with the first `from` replaced by `to` (a failure when `from` is not there).
std::string Replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

// Writes `text` as the daemon's config, sends SIGHUP and waits for its log
// to say `line`.
::testing::AssertionResult ReloadWith(DaemonProcess& d, const std::string& text, const std::string& line) {
  std::ofstream(d.dir() + "/kvtierd.toml") << text;
  d.Kill(SIGHUP);
  if (testing::Eventually([&] { return d.Log().find(line) != std::string::npos; })) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no \"" << line << "\" in the log:\n" << d.Log();
}

// The daemon's Prometheus text (its [metrics] port = 0: any free port).
std::string Scrape(const DaemonProcess& d) {
  auto st = d.Status();
  if (!st.ok()) return "";
  httplib::Client http("127.0.0.1", (*st)["metrics"]["port"].get<int>());
  auto res = http.Get("/metrics");
  return res && res->status == 200 ? res->body : "";
}

uint64_t Shared(const DaemonProcess& d, const char* field) {
  const nlohmann::json l = Lane(d, "fs");
  return l.contains("shared") ? l["shared"].value(field, uint64_t{0}) : 0;
}

TEST(FsSharingTest, NodeBLoadsWhatNodeAWroteThroughOneDirectory) {
  testing::TempDir shared;
  DaemonProcess a(NodeConfig(shared.path()));
  DaemonProcess b(NodeConfig(shared.path(), "[metrics]\nport = 0\n"));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  ASSERT_TRUE(b.Start().ok()) << b.Log();
  EXPECT_NE(a.Log().find("chain=\"nvme -> fs\""), std::string::npos) << a.Log();

  auto ca = testing::AttachTo(a.socket_path(), testing::TestNamespace(kBlock, "fs/share"));
  const std::vector<BlockKey> keys = testing::SeededKeys(*ca, 5, 32);
  const std::span<const BlockKey> first(keys.data(), 24);
  ASSERT_TRUE(testing::StoreFilled(*ca, first).ok());
  ASSERT_TRUE(testing::Eventually([&] { return Shared(a, "publishes") >= 24; }, std::chrono::seconds(20)))
      << Lane(a, "fs").dump();

  auto cb = testing::AttachTo(b.socket_path(), testing::TestNamespace(kBlock, "fs/share"));
  {
    auto found = cb->Lookup(keys);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    ASSERT_EQ(found->hit_blocks, 24u) << "B finds A's 24 blocks, not the 8 nobody computed";
    for (size_t i = 0; i < 24; ++i) EXPECT_EQ(found->tiers[i], TierKind::kFile) << i;
    // In the chain's second lane (NVMe is the first), as status numbers it.
    ASSERT_EQ(found->lanes.size(), keys.size());
    for (size_t i = 0; i < 24; ++i) EXPECT_EQ(found->lanes[i], 1) << i;
    for (size_t i = 24; i < keys.size(); ++i) EXPECT_EQ(found->lanes[i], kNoLane) << i;
  }
  {
    auto r = cb->Lookup(keys, {.lease = true});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->hit_blocks, 24u);
    auto v = cb->Load(r->lease, std::span<const BlockKey>(keys).first(24));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    for (size_t i = 0; i < 24; ++i) EXPECT_TRUE(testing::MatchesKey(keys[i], {(*v)[i].data, (*v)[i].size})) << i;
    (void)cb->Release(r->lease);
  }
  EXPECT_EQ(Shared(b, "hits_loaded"), 24u);
  // Each lane counts the hits found in it: the directory's 24, NVMe's none.
  EXPECT_EQ(Lane(b, "fs").value("hits", -1), 24) << Lane(b, "fs").dump();
  EXPECT_EQ(Lane(b, "nvme").value("hits", -1), 0) << Lane(b, "nvme").dump();
  const nlohmann::json lane = Lane(b, "fs");
  EXPECT_EQ(lane.value("tier", ""), "fs");
  EXPECT_EQ(lane.value("chain_position", -1), 1);
  EXPECT_GE(lane.value("reads", 0), 24) << lane.dump();
  EXPECT_EQ(lane.value("checksum_failures", -1), 0);
  EXPECT_TRUE(lane.contains("counters") && lane["counters"].contains("scans")) << lane.dump();

  // Another process damages one of A's files: B's lookup still finds it
  // (EXISTS sees a file), but the load refuses it, counts it and deletes it.
  const std::vector<BlockKey> more = testing::SeededKeys(*ca, 6, 4);
  ASSERT_TRUE(testing::StoreFilled(*ca, more).ok());
  ASSERT_TRUE(testing::Eventually([&] { return Shared(a, "publishes") >= 28; }, std::chrono::seconds(20)));
  size_t damaged = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(shared.path())) {
    if (!e.is_regular_file() || e.path().extension() != ".kvb") continue;
    // Every file; B has loaded the first 24 into its host tier already, so
    // only the 4 new blocks are read from the directory.
    std::filesystem::resize_file(e.path(), sizeof(FsBlockHeader) + 100);
    ++damaged;
  }
  ASSERT_EQ(damaged, 28u);
  {
    auto r = cb->Lookup(more, {.lease = true});
    ASSERT_TRUE(r.ok());
    if (r->hit_blocks > 0) {
      auto v = cb->Load(r->lease, std::span<const BlockKey>(more).first(r->hit_blocks));
      // A load stops at its first block that fails: nothing from a truncated file is served.
      EXPECT_TRUE(!v.ok() || v->empty()) << "a truncated file must never load: " << v->size() << " views";
      (void)cb->Release(r->lease);
    }
  }
  EXPECT_TRUE(testing::Eventually([&] { return Lane(b, "fs").value("checksum_failures", 0) >= 1; }))
      << Lane(b, "fs").dump();

  // Metrics name the lane's kind.
  const std::string metrics = Scrape(b);
  ASSERT_FALSE(metrics.empty());
  EXPECT_NE(metrics.find("kvtier_lower_tier_counter{lane=\"1\",tier=\"fs\",kind=\"fs\",name=\"scans\"}"),
            std::string::npos);
  EXPECT_NE(metrics.find("kvtier_tier_healthy{tier=\"fs\"} 1"), std::string::npos);
  // 24, or up to 28 with the damaged blocks' lookup.
  const std::string series = "kvtier_lower_blocks_hit_total{lane=\"1\",tier=\"fs\",kind=\"fs\"} ";
  const size_t at = metrics.find(series);
  ASSERT_NE(at, std::string::npos) << metrics;
  const double fs_hits = std::strtod(metrics.c_str() + at + series.size(), nullptr);
  EXPECT_GE(fs_hits, 24);
  EXPECT_LE(fs_hits, 28);
  EXPECT_NE(metrics.find("kvtier_lower_blocks_hit_total{lane=\"0\",tier=\"nvme\",kind=\"nvme\"} 0\n"),
            std::string::npos);
}

TEST(FsSharingTest, TheFsSectionReadsAsTheSameChain) {
  testing::TempDir shared;
  DaemonProcess a(absl::StrCat("[tiers.host]\ncapacity = \"8MiB\"\n[tiers.nvme]\ncapacity = \"64MiB\"\n"
                               "segment_bytes = \"16MiB\"\n[tiers.fs]\ndir = \"",
                               shared.path(), "\"\n[[tenants]]\nname = \"alice\"\nuids = [", getuid(), "]\n"));
  ASSERT_TRUE(a.Start().ok()) << a.Log();
  EXPECT_NE(a.Log().find("chain=\"nvme -> fs\""), std::string::npos) << a.Log();
  EXPECT_NE(a.Log().find("event=lower_chain_from_sections"), std::string::npos) << a.Log();
  EXPECT_EQ(Lane(a, "fs").value("chain_position", -1), 1);
  EXPECT_TRUE(std::filesystem::is_directory(shared.path() + "/alice"));
  // The same chain rewritten as entries is the same chain to a reload.
  const std::string entries =
      Replaced(Replaced(ConfigText(a), "[tiers.nvme]\n", "[[tiers.lower]]\nkind = \"nvme\"\n"), "[tiers.fs]\n",
               "[[tiers.lower]]\nkind = \"fs\"\ncapacity = \"32MiB\"\n");
  ASSERT_TRUE(ReloadWith(a, entries, "event=reload applied=\"tiers.fs.capacity\""));
  EXPECT_EQ(Lane(a, "fs").value("capacity_bytes", uint64_t{0}), 32ull << 20);
}

TEST(FsSharingTest, AChainWrittenBothWaysOrWithALocalTierBelowASharedOneIsRefused) {
  testing::TempDir shared;
  const std::string both = absl::StrCat("[tiers.nvme]\ncapacity = \"64MiB\"\n[[tiers.lower]]\nkind = \"fs\"\ndir = \"",
                                        shared.path(), "\"\n");
  DaemonProcess d1(both);
  EXPECT_FALSE(d1.Start().ok());
  EXPECT_NE(d1.Log().find("[tiers.nvme] and [[tiers.lower]] in one file"), std::string::npos) << d1.Log();
  DaemonProcess d2(absl::StrCat("[[tiers.lower]]\nkind = \"fs\"\ndir = \"", shared.path(),
                                "\"\n[[tiers.lower]]\nkind = \"nvme\"\ncapacity = \"64MiB\"\n"));
  EXPECT_FALSE(d2.Start().ok());
  EXPECT_NE(d2.Log().find("comes after the shared tier"), std::string::npos) << d2.Log();
  DaemonProcess d3("[[tiers.lower]]\nkind = \"tape\"\n");
  EXPECT_FALSE(d3.Start().ok());
  EXPECT_NE(d3.Log().find("kind must be one of nvme, redis, fs"), std::string::npos) << d3.Log();
  DaemonProcess d4(absl::StrCat("[[tiers.lower]]\nkind = \"fs\"\ndir = \"", shared.path(), "/not-mounted\"\n"));
  EXPECT_FALSE(d4.Start().ok());
  EXPECT_NE(d4.Log().find("does not exist"), std::string::npos) << d4.Log();
}

TEST(FsSharingTest, AChainChangedOnSighupIsNamedAsNeedingARestart) {
  testing::TempDir shared;
  DaemonProcess d(absl::StrCat("[[tiers.lower]]\nkind = \"fs\"\ndir = \"", shared.path(), "\"\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string nvme = "[[tiers.lower]]\nkind = \"nvme\"\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\n";
  // TOML: the array's entries may sit anywhere in the file; the nvme entry comes first.
  EXPECT_TRUE(ReloadWith(d, nvme + ConfigText(d), "tiers.lower (the chain fs becomes nvme -> fs)"));
  EXPECT_EQ(Lane(d, "fs").value("chain_position", -1), 0) << "the running chain stays until a restart";
}

TEST(FsSharingTest, TheFsTiersSettingsChangeOnSighupAndItsDirectoryWaitsForARestart) {
  testing::TempDir shared, other;
  DaemonProcess d(NodeConfig(shared.path()));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_EQ(Lane(d, "fs").value("capacity_bytes", uint64_t{0}), 256ull << 20);
  // The fs tier's hook applies its capacity and timeout in place.
  const std::string next =
      Replaced(ConfigText(d), "capacity = \"256MiB\"\n", "capacity = \"128MiB\"\nop_timeout_ms = 2500\n");
  ASSERT_TRUE(ReloadWith(d, next, "event=reload applied=\"tiers.fs.capacity, tiers.fs.op_timeout_ms\""));
  EXPECT_EQ(Lane(d, "fs").value("capacity_bytes", uint64_t{0}), 128ull << 20);
  // A new directory in the same file as a new capacity: the capacity
  // applies, the directory is named as waiting for a restart.
  ASSERT_TRUE(ReloadWith(
      d, Replaced(Replaced(next, "capacity = \"128MiB\"", "capacity = \"96MiB\""), shared.path(), other.path()),
      "applied=\"tiers.fs.capacity\" needs_restart=\"tiers.fs.dir\""));
  EXPECT_EQ(Lane(d, "fs").value("capacity_bytes", uint64_t{0}), 96ull << 20);
  // The running config (kvtierctl config show) has what applies.
  auto shown = ipc::AdminCall(d.admin_socket_path(), nlohmann::json{{"cmd", "config"}}, std::chrono::seconds(2));
  ASSERT_TRUE(shown.ok()) << shown.status();
  EXPECT_EQ((*shown)["config"]["tiers"]["fs"]["dir"], shared.path()) << shown->dump();
  EXPECT_EQ((*shown)["config"]["tiers"]["fs"]["capacity"], 96ull << 20) << shown->dump();
}

size_t BlockFiles(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    n += e.is_regular_file() && e.path().extension() == ".kvb";
  }
  return n;
}

// Two tiers of one kind in one chain: a small fast directory, then a large
// one named "archive", each with options of its own. Host evictions fill the
// first and spill to the second; every block a load hands back is
// byte-exact, some from the second; status, metrics and kvtierctl config show each tier by
// its name; SIGHUP applies the second's own reloadable keys through its own
// hook and names its directory as waiting for a restart.
TEST(FsSharingTest, TwoFsTiersChainEachWithItsOwnDirectoryAndSettings) {
  testing::TempDir fast, big, elsewhere;
  DaemonProcess d(absl::StrCat("[metrics]\nport = 0\n[tiers.host]\ncapacity = \"8MiB\"\n",
                               "[[tiers.lower]]\nkind = \"fs\"\ndir = \"", fast.path(),
                               "\"\ncapacity = \"1MiB\"\nprobe_budget_us = 200000\n",
                               "[[tiers.lower]]\nkind = \"fs\"\nname = \"archive\"\ndir = \"", big.path(),
                               "\"\ncapacity = \"256MiB\"\n",
                               "[[tenants]]\nname = \"alice\"\nuids = [", getuid(), "]\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_NE(d.Log().find("chain=\"fs -> archive (fs)\" lanes=2"), std::string::npos) << d.Log();
  EXPECT_EQ(LaneNamed(d, "fs").value("chain_position", -1), 0);
  EXPECT_EQ(LaneNamed(d, "archive").value("chain_position", -1), 1);
  EXPECT_EQ(LaneNamed(d, "archive").value("kind", ""), "fs");
  EXPECT_EQ(LaneNamed(d, "fs").value("capacity_bytes", uint64_t{0}), 1ull << 20);
  EXPECT_EQ(LaneNamed(d, "archive").value("capacity_bytes", uint64_t{0}), 256ull << 20);

  // 192 blocks of 64 KiB through an 8 MiB host tier: at least 64 go down.
  auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(kBlock, "fs/two"));
  std::vector<std::vector<BlockKey>> chains;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    chains.push_back(testing::SeededKeys(*c, 40 + seed, 32));
    ASSERT_TRUE(testing::StoreFilled(*c, chains.back()).ok()) << seed;
  }
  // The cascade may move every block of the small tier on down, so the
  // first tier shows what it wrote rather than what it holds.
  ASSERT_TRUE(testing::Eventually([&] {
    return LaneNamed(d, "fs").value("writes", 0) > 0 && LaneNamed(d, "archive").value("blocks", 0) > 0;
  }, std::chrono::seconds(20))) << LaneNamed(d, "fs").dump() << LaneNamed(d, "archive").dump();
  EXPECT_GT(BlockFiles(fast.path()), 0u);
  EXPECT_GT(BlockFiles(big.path()), 0u) << "the first tier full, demotions go to the second";
  EXPECT_LE(LaneNamed(d, "fs").value("used_bytes", uint64_t{0}), 1ull << 20) << "each tier keeps its own capacity";

  // Every block a load hands back is the block, from whichever tier held
  // it. Not every block is found: the small tier is shared, so a block the
  // cascade moved on leaves its file there for other nodes, those files
  // count against its capacity, and its scan may delete one this node
  // still indexes there (a counted miss, misses_not_found).
  size_t from_archive = 0;
  for (const std::vector<BlockKey>& keys : chains) {
    auto r = c->Lookup(keys, {.lease = true});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (r->hit_blocks == 0) continue;
    const std::span<const BlockKey> hit = std::span<const BlockKey>(keys).first(r->hit_blocks);
    auto v = c->Load(r->lease, hit);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_LE(v->size(), hit.size());
    for (size_t i = 0; i < v->size(); ++i) {
      EXPECT_TRUE(testing::MatchesKey(keys[i], {(*v)[i].data, (*v)[i].size})) << i;
      from_archive += r->lanes[i] == 1;
    }
    (void)c->Release(r->lease);
  }
  EXPECT_GT(from_archive, 0u) << "blocks were loaded from the second tier";
  EXPECT_GT(LaneNamed(d, "archive").value("hits", 0), 0) << LaneNamed(d, "archive").dump();

  const std::string metrics = Scrape(d);
  EXPECT_NE(metrics.find("kvtier_lower_blocks_hit_total{lane=\"1\",tier=\"archive\",kind=\"fs\"} "), std::string::npos)
      << metrics;

  // SIGHUP: the archive's capacity through its own hook, the first tier's
  // untouched; then its directory waits for a restart.
  const std::string next = Replaced(ConfigText(d), "capacity = \"256MiB\"", "capacity = \"128MiB\"");
  ASSERT_TRUE(ReloadWith(d, next, "event=reload applied=\"tiers.lower[1].capacity\""));
  EXPECT_EQ(LaneNamed(d, "archive").value("capacity_bytes", uint64_t{0}), 128ull << 20);
  EXPECT_EQ(LaneNamed(d, "fs").value("capacity_bytes", uint64_t{0}), 1ull << 20);
  ASSERT_TRUE(ReloadWith(d, Replaced(next, big.path(), elsewhere.path()),
                         "needs_restart=\"tiers.lower[1].dir (archive)\""));
  // The running config shows each tier of the chain by its name.
  auto shown = ipc::AdminCall(d.admin_socket_path(), nlohmann::json{{"cmd", "config"}}, std::chrono::seconds(2));
  ASSERT_TRUE(shown.ok()) << shown.status();
  const nlohmann::json& lower = (*shown)["config"]["tiers"]["lower"];
  EXPECT_EQ(lower["archive"]["kind"], "fs") << shown->dump();
  EXPECT_EQ(lower["archive"]["dir"], big.path()) << "the running directory until a restart";
  EXPECT_EQ(lower["archive"]["capacity"], 128ull << 20);
  EXPECT_EQ(lower["fs"]["dir"], fast.path());
  EXPECT_EQ((*shown)["config"]["tiers"]["fs"]["dir"], fast.path());
}

}  // namespace
}  // namespace kvtier
