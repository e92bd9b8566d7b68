// SPDX-License-Identifier: Apache-2.0
// The workload suite: each generated workload is a pure function of its seed,
// shares prefixes the way its description says, and the default policy holds
// its targets on every workload and capacity (kvtier-replay --simulate
// --suite prints the same figures).
#include "tools/replay/suite.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "policies/eviction_policy.h"
#include "tools/replay/simulate.h"

namespace kvtier::tools {
namespace {

TEST(SuiteTest, EveryWorkloadIsItsSeedsAndNothingElse) {
  for (const SuiteWorkloadInfo& info : SuiteWorkloads()) {
    SCOPED_TRACE(info.name);
    auto a = MakeSuiteWorkload(info.name, 7);
    auto b = MakeSuiteWorkload(info.name, 7);
    auto c = MakeSuiteWorkload(info.name, 8);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    ASSERT_GT(a->requests.size(), 5000u);
    EXPECT_EQ(a->block_tokens, 512u);
    ASSERT_EQ(a->requests.size(), b->requests.size());
    size_t differ = 0;
    for (size_t i = 0; i < a->requests.size(); ++i) {
      ASSERT_EQ(a->requests[i].keys, b->requests[i].keys) << "request " << i;
      ASSERT_EQ(a->requests[i].arrival_ms, b->requests[i].arrival_ms);
      if (i < c->requests.size() && a->requests[i].keys != c->requests[i].keys) ++differ;
      // Arrivals in order; full blocks only.
      if (i > 0) {
        ASSERT_GE(a->requests[i].arrival_ms, a->requests[i - 1].arrival_ms);
      }
      ASSERT_EQ(a->requests[i].keys.size(), a->requests[i].prompt_tokens / 512);
    }
    EXPECT_GT(differ, a->requests.size() / 2) << "another seed must give another workload";
    EXPECT_NE(a->description.find(info.parameters), std::string::npos) << "the description names the parameters";
  }
  EXPECT_FALSE(MakeSuiteWorkload("nosuch").ok());
  EXPECT_NE(MakeSuiteWorkload("nosuch").status().message().find("chat, agent, docqa, scan, tenants"),
            std::string::npos);
}

// A key at depth i identifies the whole prefix: the same key never appears
// with two different parents, and the workloads do reuse (blocks asked for
// again) as well as not (blocks asked for once), in the shares their
// structure implies.
TEST(SuiteTest, KeysArePrefixesAndReuseHasTheDescribedShape) {
  for (const SuiteWorkloadInfo& info : SuiteWorkloads()) {
    SCOPED_TRACE(info.name);
    auto w = MakeSuiteWorkload(info.name, 1);
    ASSERT_TRUE(w.ok());
    absl::flat_hash_map<BlockKey, BlockKey> parent;
    absl::flat_hash_map<BlockKey, uint32_t> uses;
    uint64_t blocks = 0;
    for (const Request& r : w->requests) {
      for (size_t i = 0; i < r.keys.size(); ++i) {
        const BlockKey p = i == 0 ? BlockKey{} : r.keys[i - 1];
        auto [it, fresh] = parent.try_emplace(r.keys[i], p);
        ASSERT_TRUE(fresh || it->second == p) << "a key with two parents";
        ++uses[r.keys[i]];
        ++blocks;
      }
    }
    uint64_t once = 0;
    for (const auto& [k, n] : uses) once += n == 1;
    const double reuse = 1.0 - double(uses.size()) / double(blocks);  // what an unbounded cache would hit
    EXPECT_GT(reuse, 0.3);
    EXPECT_LT(reuse, 0.97);
    if (info.name == "docqa" || info.name == "scan") {
      EXPECT_GT(double(once) / double(uses.size()), 0.5) << "most blocks are read once";
    }
  }
}

// The default against every other online policy, on every workload of the
// suite at 1M / 3M / 10M tokens: at least 0.98x the best of them. "holds"
// (learned per-class hold times) is not one of its experts (its history
// would take the default past its 160 bytes per block); where it led by
// most, on "scan" at 3M tokens (0.492 against 0.475, 0.965x, with ARC as the
// expert), arc-cutoff brings the default to 0.487.
// The 15 simulations run on every core (each reads its workload and builds
// its own policies): ~4 minutes in the debug build on one.
TEST(SuiteTest, TheDefaultIsNeverTheWrongChoice) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "figures are checked in the plain builds (minutes under sanitizers)";
#endif
  struct Cell {
    std::string name;
    const Workload* workload;
    uint64_t tokens;
    absl::StatusOr<std::vector<SimRow>> rows = absl::UnknownError("not run");
  };
  std::vector<Workload> workloads;
  workloads.reserve(SuiteWorkloads().size());
  std::vector<Cell> cells;
  for (const SuiteWorkloadInfo& info : SuiteWorkloads()) {
    auto w = MakeSuiteWorkload(info.name, 1);
    ASSERT_TRUE(w.ok());
    workloads.push_back(std::move(*w));
  }
  for (size_t i = 0; i < workloads.size(); ++i) {
    for (uint64_t tokens : {1'000'000u, 3'000'000u, 10'000'000u}) {
      cells.push_back(Cell{SuiteWorkloads()[i].name, &workloads[i], tokens});
    }
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t c; (c = next.fetch_add(1)) < cells.size();) {
      SimOptions o;
      o.capacity_blocks = cells[c].tokens / 512;
      o.policies = {"lru", "s3fifo", "s3fifo-deep", "tinylfu", "arc", "arc-cutoff", "holds",
                    std::string(kDefaultHostPolicy)};
      cells[c].rows = Simulate(*cells[c].workload, o);
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(1u, std::thread::hardware_concurrency()); ++t) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  for (const Cell& cell : cells) {
    SCOPED_TRACE(cell.name + " at " + std::to_string(cell.tokens));
    const auto& rows = cell.rows;
    ASSERT_TRUE(rows.ok()) << rows.status();
    double def = 0, best = 0;
    std::string best_name;
    for (const SimRow& r : *rows) {
      if (r.is_default) {
        def = r.token_hit_rate();
      } else if (r.token_hit_rate() > best) {
        best = r.token_hit_rate();
        best_name = r.policy;
      }
    }
    EXPECT_GE(def, 0.98 * best) << "best " << best_name << " " << best << ", default " << def;
  }
}

}  // namespace
}  // namespace kvtier::tools
