// SPDX-License-Identifier: Apache-2.0
// The cost model end to end: a block on NVMe that is slower to read than to
// recompute is reported as "recompute" at lookup and dropped rather than
// demoted at eviction; engines' report_prefill calls move that line.
//
// The namespace has the shape of a tiny model (2 layers, 2 KV heads of 16:
// 256 B of KV per token, 16-token blocks of 4 KiB), so the daemon prices its
// blocks. Recomputing a block of it takes ~8 ns at the default 300 TFLOP/s
// (reading it from NVMe never wins) and 2.4 ms at 0.001 TFLOP/s (reading
// always wins).
#include <fstream>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;

constexpr uint64_t kBlock = 4096;

struct TinyModel {
  testing::TempDir dir;
  std::string model;
  int daemons = 0;
  TinyModel() : model(dir.File("config.json")) {
    std::ofstream(model) << R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "torch_dtype": "float16"})";
  }
  // A 1 MiB host tier (256 blocks) in front of a fresh NVMe directory.
  std::string Config(const std::string& cost_extra, bool write_through) {
    const std::string nvme = dir.File("nvme" + std::to_string(++daemons));
    return "[tiers.host]\ncapacity = \"1MiB\"\npolicy = \"lru\"\n[tiers.nvme]\ndirs = [\"" + nvme +
           "\"]\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\nwrite_through = " +
           (write_through ? "true" : "false") + "\n[cost_model]\nmodel_config = \"" + model + "\"\n" + cost_extra;
  }
};

std::unique_ptr<Client> AttachTo(const DaemonProcess& d) {
  return testing::AttachTo(d.socket_path(), testing::TestNamespace(kBlock, "cost/e2e"));
}

std::vector<BlockKey> Keys(Client& c, uint32_t seed, size_t n) { return testing::SeededKeys(c, seed, n); }

// Durable commits wait for the write-through copy: a test that stores faster
// than NVMe writes would otherwise find every host slot busy with I/O.
void StoreAll(Client& c, std::span<const BlockKey> keys, bool durable = false) {
  Status s = testing::StoreFilled(c, keys, durable);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// As an engine serves a prompt: look it up (leased), store what missed,
// release. The lookup tells the daemon where the stored blocks sit.
void Serve(Client& c, const std::vector<BlockKey>& keys, bool durable) {
  auto r = c.Lookup(keys, {.lease = true});
  ASSERT_TRUE(r.ok());
  if (r->hit_blocks < keys.size()) StoreAll(c, std::span(keys).subspan(r->hit_blocks), durable);
  if (r->lease != 0) {
    ASSERT_TRUE(c.Release(r->lease).ok());
  }
}

// Serves an 8-block chain, then 320 blocks more, so the chain leaves host memory.
std::vector<BlockKey> StoreChainThenPushItOut(Client& c, bool durable, uint32_t first_seed = 1) {
  auto chain = Keys(c, first_seed, 8);
  Serve(c, chain, durable);
  for (uint32_t s = 0; s < 40; ++s) Serve(c, Keys(c, first_seed + 1000 + s, 8), durable);
  return chain;
}

nlohmann::json Tier(const nlohmann::json& status, const std::string& name) {
  for (const auto& t : status["tiers"]) {
    if (t["tier"] == name) return t;
  }
  return {};
}

TEST(CostE2eTest, NvmeBlocksSlowerToReadThanToRecomputeAreReportedAsRecompute) {
  TinyModel s;
  for (const bool slow_gpu : {true, false}) {
    SCOPED_TRACE(slow_gpu ? "0.001 TFLOP/s: load" : "300 TFLOP/s: recompute");
    DaemonProcess d(s.Config(slow_gpu ? "prefill_tflops = 0.001\n" : "", /*write_through=*/true));
    ASSERT_TRUE(d.Start().ok()) << d.Log();
    auto c = AttachTo(d);
    ASSERT_NE(c, nullptr);
    const auto chain = StoreChainThenPushItOut(*c, true);
    auto r = c->Lookup(chain, {.lease = true});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->tiers.size(), 8u);
    EXPECT_EQ(r->tiers[0], TierKind::kNvme) << "the chain left host memory; its write-through copy stayed";
    if (slow_gpu) {
      EXPECT_EQ(r->hit_blocks, 8u);
      EXPECT_EQ(r->recompute_blocks, 0u);
      auto v = c->Load(r->lease, chain);
      ASSERT_TRUE(v.ok());
      ASSERT_EQ(v->size(), 8u);
      for (size_t i = 0; i < 8; ++i) EXPECT_TRUE(testing::MatchesKey(chain[i], {(*v)[i].data, (*v)[i].size}));
    } else {
      EXPECT_EQ(r->hit_blocks, 0u) << "a hit slower than recompute is not a hit";
      EXPECT_EQ(r->recompute_blocks, 8u);
      EXPECT_EQ(r->lease, 0u);
    }
    if (r->lease != 0) {
      EXPECT_TRUE(c->Release(r->lease).ok());
    }
    auto st = d.Status();
    ASSERT_TRUE(st.ok()) << st.status() << d.Log();
    EXPECT_EQ((*st)["stats"]["blocks_recompute"], slow_gpu ? 0 : 8);
    EXPECT_EQ(Tier(*st, "nvme")["hits_reported_recompute"], slow_gpu ? 0 : 8);
    EXPECT_EQ(Tier(*st, "nvme")["hits_loaded"], slow_gpu ? 8 : 0);
    EXPECT_EQ((*st)["cost_model"]["model"], s.model);
    EXPECT_EQ((*st)["cost_model"]["kv_bytes_per_token"], 256);
  }
}

TEST(CostE2eTest, EvictionDropsWhatWouldNeverBeWorthReadingBack) {
  TinyModel s;
  for (const bool slow_gpu : {true, false}) {
    SCOPED_TRACE(slow_gpu ? "0.001 TFLOP/s: demote" : "300 TFLOP/s: drop");
    DaemonProcess d(s.Config(slow_gpu ? "prefill_tflops = 0.001\n" : "", /*write_through=*/false));
    ASSERT_TRUE(d.Start().ok()) << d.Log();
    auto c = AttachTo(d);
    ASSERT_NE(c, nullptr);
    const auto chain = StoreChainThenPushItOut(*c, false);
    // Background reclaim may still be evicting: read the counters once they
    // stand still (a status reads the tiers' and the daemon's counters one
    // after the other).
    auto st = d.Status();
    ASSERT_TRUE(st.ok());
    for (int i = 0; i < 100; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      auto again = d.Status();
      ASSERT_TRUE(again.ok());
      const bool still = Tier(*again, "host") == Tier(*st, "host") && Tier(*again, "nvme")["writes"] == Tier(*st, "nvme")["writes"];
      st = std::move(again);
      if (still) break;
    }
    const auto host = Tier(*st, "host");
    ASSERT_GT(host["evictions"].get<int>(), 0);
    if (slow_gpu) {
      EXPECT_GT(host["demotions"].get<int>(), 0);
      EXPECT_EQ(host["evictions_dropped_by_cost"], 0);
      EXPECT_EQ(c->Lookup(chain)->hit_blocks, 8u) << "demoted, then found on NVMe";
    } else {
      // All dropped but one in 32, demoted only so the cost model keeps
      // something to measure the tier on (the first such eviction is one).
      const int calibration = Tier(*st, "nvme")["demotions_for_calibration"].get<int>();
      EXPECT_GE(calibration, 1);
      EXPECT_LE(calibration, host["evictions"].get<int>() / 32 + 1);
      EXPECT_EQ(host["demotions"].get<int>(), calibration);
      EXPECT_EQ(host["evictions_dropped_by_cost"].get<int>() + calibration, host["evictions"].get<int>());
      EXPECT_LE(Tier(*st, "nvme")["writes"].get<int>(), calibration) << "nothing else written that would never be read";
      auto r = c->Lookup(chain);
      EXPECT_LE(r->hit_blocks + r->recompute_blocks, 1u) << "dropped blocks are gone";
      // Blocks stored without a lookup of their chain have no known depth:
      // they are demoted, never dropped on a guess.
      for (uint32_t s2 = 0; s2 < 40; ++s2) StoreAll(*c, Keys(*c, 5000 + s2, 8));
      auto st2 = d.Status();
      ASSERT_TRUE(st2.ok());
      EXPECT_GT(Tier(*st2, "host")["demotions"].get<int>(), 0);
    }
  }
}

TEST(CostE2eTest, EnginePrefillReportsMoveTheLineBetweenLoadAndRecompute) {
  TinyModel s;
  DaemonProcess d(s.Config("prefill_tflops = 0.001\n", /*write_through=*/true));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = AttachTo(d);
  ASSERT_NE(c, nullptr);
  const auto chain = StoreChainThenPushItOut(*c, true);
  EXPECT_EQ(c->Lookup(chain)->hit_blocks, 8u) << "the prior says this GPU is slow: load";

  // Bad reports are refused, counted, and change nothing.
  EXPECT_EQ(c->ReportPrefill(0, 0, std::chrono::milliseconds(1)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(c->ReportPrefill(0, 100, std::chrono::hours(2)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(c->ReportPrefill(0, 100, std::chrono::nanoseconds(0)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(c->Lookup(chain)->hit_blocks, 8u);

  // The engine says: 1000 tokens in 1 us, 3000 in 3 us (~150 TFLOP/s).
  ASSERT_TRUE(c->ReportPrefill(0, 1000, std::chrono::microseconds(1)).ok());
  ASSERT_TRUE(c->ReportPrefill(0, 3000, std::chrono::microseconds(3)).ok());
  auto r = c->Lookup(chain);
  EXPECT_EQ(r->hit_blocks, 0u);
  EXPECT_EQ(r->recompute_blocks, 8u) << "a fast GPU recomputes rather than reading NVMe";

  auto st = d.Status();
  ASSERT_TRUE(st.ok());
  const auto& cm = (*st)["cost_model"];
  EXPECT_EQ(cm["prefill_reports"], 2);
  EXPECT_TRUE(cm["prefill_fitted"].get<bool>());
  EXPECT_GT(cm["prefill_tflops"].get<double>(), 100);
  EXPECT_EQ((*st)["stats"]["prefill_reports"], 2);
  EXPECT_EQ((*st)["stats"]["prefill_reports_refused"], 2) << "the zero-length one never left the client";
}

TEST(CostE2eTest, BlocksOfAnotherModelShapeAreNeverPriced) {
  TinyModel s;
  DaemonProcess d(s.Config("", /*write_through=*/true));  // 300 TFLOP/s: the tiny model always recomputes
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  // 512 B per token: not the tiny model.
  auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(2 * kBlock, "cost/other-model"));
  ASSERT_NE(c, nullptr);
  auto chain = Keys(*c, 1, 8);
  StoreAll(*c, chain, true);
  for (uint32_t s2 = 0; s2 < 20; ++s2) StoreAll(*c, Keys(*c, 1000 + s2, 8), true);
  auto r = c->Lookup(chain);
  EXPECT_EQ(r->tiers[0], TierKind::kNvme);
  EXPECT_EQ(r->hit_blocks, 8u) << "unpriced: always load";
  EXPECT_NE(d.Log().find("event=cost_model_unpriced"), std::string::npos) << d.Log();
}

}  // namespace
}  // namespace kvtier
