// SPDX-License-Identifier: Apache-2.0
// The hold optimum (tools/replay/hold_optimum.h): its knapsack worked out by
// hand on a loop and on a bent curve, its relation to an unbounded tier on a
// generated chat, and the hold oracle running its plan as a tier.
#include "tools/replay/hold_optimum.h"

#include <string>
#include <vector>

#include "core/block_key.h"
#include "gtest/gtest.h"
#include "tests/tools/sim_keys.h"
#include "tools/replay/simulate.h"
#include "tools/replay/suite.h"

namespace kvtier::tools {
namespace {

BlockKey K(uint32_t id) { return SimKey(id, 0x3c); }

// Single-block requests asking for blocks 0..n-1 in turn, `loops` times.
Workload Loop(uint32_t n, uint32_t loops) {
  Workload w;
  w.block_tokens = 1;
  for (uint32_t l = 0; l < loops; ++l) {
    for (uint32_t i = 0; i < n; ++i) {
      Request r;
      r.prompt_tokens = 1;
      r.keys = {K(i)};
      w.requests.push_back(r);
    }
  }
  return w;
}

double OptimumHits(const Workload& w, uint64_t capacity) {
  auto b = ComputeHoldOptimum(w, Prepare(w, true), capacity);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? b->hits : -1;
}

// Ten blocks asked for in turn, eight times (80 requests). Every ask that
// comes back does so 10 requests later, so a hit costs 10 slots-between-
// requests of room, and C blocks of room pay for C * 80 of them. The asks
// fall in four classes by uses: 1 (10 asks), 2 (10), 3-4 (20), all coming
// back (0.1 hits per slot); 5-8 (40 asks: 30 come back, and the last loop's
// 10 never do, with 10, 9, ..., 1 requests left to pay for: 30 hits for
// 300 + 55 of room).
TEST(HoldOptimumTest, ALoopLargerThanTheTierBuysTheHitsItsRoomPaysFor) {
  const Workload w = Loop(10, 8);
  // 240 of room: 24 of the 0.1-a-slot hits.
  EXPECT_NEAR(OptimumHits(w, 3), 24.0, 1e-9);
  // 480: all 40 of them (400), then 80 of the last class's 355 (30 hits).
  // Charging the never-again asks the whole hold (400) gives 46, charging
  // them nothing 48.
  EXPECT_NEAR(OptimumHits(w, 6), 40.0 + 80.0 * 30.0 / 355.0, 1e-9);
  // Room for every hold: all 70 asks that come back.
  EXPECT_NEAR(OptimumHits(w, 10), 70.0, 1e-9);
  // LRU gets nothing from a loop longer than the tier, while a policy that
  // keeps some blocks for a whole loop gets what the optimum says it can.
  SimOptions o;
  o.capacity_blocks = 6;
  auto lru = SimulatePolicy(w, "lru", o);
  auto optimum = SimulatePolicy(w, std::string(kHoldOptimumPolicy), o);
  ASSERT_TRUE(lru.ok() && optimum.ok());
  EXPECT_EQ(lru->blocks_hit, 0u);
  EXPECT_EQ(optimum->blocks_hit, 47u) << "46.76, rounded up";
  EXPECT_EQ(optimum->blocks_requested, 80u);
  EXPECT_EQ(optimum->policy, "hold-optimum");
}

// Blocks x0..x9 asked for at requests 0..9 and again at 10..19 (10 later),
// then y at 20 and 21 (1 later). The first asks share a class: keeping them
// 1 request wins y's (1 hit for 1 + 10 of room), 10 requests wins all 11
// (101 of room). The second step is steeper than the first, so no hold
// time is worth its room alone: the best is to keep the class 10 requests
// some of the time, 11 / 101 hits a slot. 1 block of room pays for 22:
// 2.396 hits. Taking the steeper step on its own would claim 22 * 10 / 90
// = 2.444.
TEST(HoldOptimumTest, ACurveThatBendsUpIsFilledByMixingItsEnds) {
  Workload w;
  w.block_tokens = 1;
  auto ask = [&](uint32_t id) {
    Request r;
    r.prompt_tokens = 1;
    r.keys = {K(id)};
    w.requests.push_back(r);
  };
  for (uint32_t round = 0; round < 2; ++round) {
    for (uint32_t i = 0; i < 10; ++i) ask(i);
  }
  ask(100);
  ask(100);
  EXPECT_NEAR(OptimumHits(w, 1), 22.0 * 11.0 / 101.0, 1e-9);
}

// The hold oracle runs the optimum's plan as a tier. On the loop LRU keeps
// the last 6 blocks and every ask misses; the plan keeps the classes worth
// their room longest, so some blocks outlive a loop and hit (no more than
// the optimum here, whose room is the same on average).
TEST(HoldOptimumTest, TheHoldOracleRunsThePlanAsATier) {
  const Workload w = Loop(10, 8);
  const Prepared p = Prepare(w, true);
  auto six = SimulateHoldOracle(w, p, 6);
  ASSERT_TRUE(six.ok()) << six.status();
  EXPECT_EQ(six->requested, 80u);
  EXPECT_GT(six->hits, 10u);
  EXPECT_LE(double(six->hits), OptimumHits(w, 6));
  EXPECT_GT(six->room_share, 0);
  auto again = SimulateHoldOracle(w, p, 6);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->hits, six->hits) << "its coin is seeded";
  EXPECT_FALSE(SimulateHoldOracle(w, p, 0).ok());
}

// A tier keeps every block of the request it serves. With room for one
// block and requests o, o, n1, o, n2, o, n3, o, each n pushes o out (o hits
// only at the second request), although the plan keeps o longer than the
// n's (it comes back; they never do): a tier that evicted the n it is
// serving would hit o at every return.
TEST(HoldOptimumTest, TheHoldOracleNeverEvictsTheRequestItServes) {
  Workload w;
  w.block_tokens = 1;
  for (uint32_t id : {0u, 0u, 1u, 0u, 2u, 0u, 3u, 0u}) {
    Request r;
    r.prompt_tokens = 1;
    r.keys = {K(id)};
    w.requests.push_back(r);
  }
  auto o = SimulateHoldOracle(w, Prepare(w, true), 1);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->hits, 1u);
}

// Blocks a-b-c (one request), then d alone, then a-b-c again, with room for
// 3. Every first ask is one class that comes back 2 requests later (d never
// does, with 2 requests left): the plan keeps it 2 requests. When d comes,
// the tier is one over and all deadlines but d's are equal: it must evict
// c, the leaf, so that a and b hit. Evicting a (the earliest key) would
// leave no hit at all. A request larger than the tier is refused.
TEST(HoldOptimumTest, TheHoldOracleEvictsLeavesBeforeParentsAndKeepsItsRoom) {
  Workload w;
  w.block_tokens = 1;
  auto ask = [&](std::initializer_list<uint32_t> ids) {
    Request r;
    for (uint32_t id : ids) r.keys.push_back(K(id));
    r.prompt_tokens = r.keys.size();
    w.requests.push_back(r);
  };
  ask({1, 2, 3});
  ask({4});
  ask({1, 2, 3});
  const Prepared p = Prepare(w, true);
  auto o = SimulateHoldOracle(w, p, 3);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->hits, 2u);
  EXPECT_NEAR(OptimumHits(w, 3), 3.0, 1e-9) << "room 9 pays for all three holds (8)";
  auto small = SimulateHoldOracle(w, p, 2);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("request 1 has 3 blocks"), std::string::npos) << small.status();
}

// What an unbounded tier hits on w.
SimRow Unbounded(const Workload& w) {
  SimOptions inf;
  inf.infinite = true;
  auto all = SimulatePolicy(w, "infinite", inf);
  EXPECT_TRUE(all.ok()) << all.status();
  return all.ok() ? *all : SimRow{};
}

Workload Chat() {
  auto w = MakeSuiteWorkload("chat", 3);
  EXPECT_TRUE(w.ok()) << w.status();
  // The first 1500 requests: seconds in a debug build.
  if (w->requests.size() > 1500) w->requests.resize(1500);
  return *w;
}

// With room to keep every block until its next ask, the optimum hits every
// ask but a block's first: what an unbounded tier hits.
TEST(HoldOptimumTest, WithRoomForEveryHoldItHitsWhatAnUnboundedTierHits) {
  const Workload w = Chat();
  const SimRow all = Unbounded(w);
  const Prepared p = Prepare(w, true);
  auto b = ComputeHoldOptimum(w, p, all.blocks_requested);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->requested, all.blocks_requested);
  EXPECT_NEAR(b->hits, double(all.blocks_requested - p.distinct), 1e-6);
  EXPECT_NEAR(b->hits, double(all.blocks_hit), 1e-6);
  EXPECT_GT(b->classes, 10u) << "the chat's asks fall in many classes";
}

// More room never lowers it and it never passes an unbounded tier.
TEST(HoldOptimumTest, ItGrowsWithRoomAndNeverPassesAnUnboundedTier) {
  const Workload w = Chat();
  const SimRow all = Unbounded(w);
  double last = 0;
  for (uint64_t cap : {64u, 256u, 1024u, 4096u}) {
    SCOPED_TRACE(cap);
    SimOptions o;
    o.capacity_blocks = cap;
    o.policies = {std::string(kHoldOptimumPolicy), std::string(kHoldOraclePolicy)};
    auto rows = Simulate(w, o);
    ASSERT_TRUE(rows.ok()) << rows.status();
    const SimRow& optimum = (*rows)[0];
    ASSERT_EQ(optimum.policy, kHoldOptimumPolicy);
    ASSERT_EQ(rows->back().policy, kHoldOraclePolicy);
    EXPECT_GT(rows->back().blocks_hit, 0u);
    EXPECT_GE(optimum.token_hit_rate(), last);
    EXPECT_LE(optimum.blocks_hit, all.blocks_hit);
    last = optimum.token_hit_rate();
  }
  EXPECT_GT(last, 0.3);
}

// What the optimum does not model: holds that stretch and shrink with what
// later requests bring. First, 100 rounds of X, Z, X (fresh 64-block
// prompts: X comes back 2 requests later, Z never); then 10 rounds of 200
// fresh one-block prompts, each asked again 200 requests later. Every
// first ask is one class, so the optimum picks one hold (in requests) for
// both kinds; LRU keeps X for 2 big requests and a one-block prompt for 200
// small ones, because it keeps the last blocks, not the last requests. The
// optimum is a model of fixed per-class holds, not a bound on every policy.
TEST(HoldOptimumTest, LruBeatsItWhereHoldsShouldFollowTheRequestsSizes) {
  Workload w;
  w.block_tokens = 1;
  uint32_t next = 0;
  auto fresh = [&](uint32_t n) {
    std::vector<BlockKey> keys;
    for (uint32_t i = 0; i < n; ++i) keys.push_back(K(next++));
    return keys;
  };
  auto ask = [&](const std::vector<BlockKey>& keys) {
    Request r;
    r.keys = keys;
    r.prompt_tokens = keys.size();
    w.requests.push_back(r);
  };
  for (int i = 0; i < 100; ++i) {
    const auto x = fresh(64), z = fresh(64);
    ask(x);
    ask(z);
    ask(x);
  }
  for (int round = 0; round < 10; ++round) {
    std::vector<std::vector<BlockKey>> ys;
    for (int i = 0; i < 200; ++i) ys.push_back(fresh(1));
    for (const auto& y : ys) ask(y);
    for (const auto& y : ys) ask(y);
  }
  SimOptions o;
  o.capacity_blocks = 210;
  auto lru = SimulatePolicy(w, "lru", o);
  auto optimum = SimulatePolicy(w, std::string(kHoldOptimumPolicy), o);
  ASSERT_TRUE(lru.ok() && optimum.ok());
  EXPECT_GT(lru->token_hit_rate(), optimum->token_hit_rate() + 0.02)
      << "lru " << lru->token_hit_rate() << ", optimum " << optimum->token_hit_rate();
}

// A block's class: uses (1, 2, 3-4, 5-8, 9-16, 17-64, 65+), tokens before
// it (< 1K, < 4K, < 12K, more), its prompt's turn (1..4, 5+) and how long
// ago it was asked for before (never, 1-3, 4-15, ..., 1024+ requests).
TEST(HoldOptimumTest, AClassIsUsesPositionTurnAndLastGap) {
  using C = HoldClass;
  const uint32_t base = C::Of(1, 0, 1, 0);
  EXPECT_EQ(C::Of(0, 0, 0, 0), base) << "no uses or turn yet counts as the first";
  EXPECT_NE(C::Of(2, 0, 1, 0), base);
  EXPECT_EQ(C::Of(3, 0, 1, 0), C::Of(4, 0, 1, 0));
  EXPECT_NE(C::Of(4, 0, 1, 0), C::Of(5, 0, 1, 0));
  EXPECT_EQ(C::Of(65, 0, 1, 0), C::Of(1'000'000, 0, 1, 0));
  EXPECT_NE(C::Of(64, 0, 1, 0), C::Of(65, 0, 1, 0));
  EXPECT_EQ(C::Of(1, 1023, 1, 0), base);
  EXPECT_NE(C::Of(1, 1024, 1, 0), base);
  EXPECT_NE(C::Of(1, 12287, 1, 0), C::Of(1, 12288, 1, 0));
  EXPECT_EQ(C::Of(1, 12288, 1, 0), C::Of(1, 1 << 30, 1, 0));
  EXPECT_NE(C::Of(1, 0, 4, 0), C::Of(1, 0, 5, 0));
  EXPECT_EQ(C::Of(1, 0, 5, 0), C::Of(1, 0, 99, 0));
  EXPECT_NE(C::Of(2, 0, 1, 1), C::Of(2, 0, 1, 0));
  EXPECT_EQ(C::Of(2, 0, 1, 1), C::Of(2, 0, 1, 3));
  EXPECT_NE(C::Of(2, 0, 1, 3), C::Of(2, 0, 1, 4));
  EXPECT_NE(C::Of(2, 0, 1, 1023), C::Of(2, 0, 1, 1024));
  EXPECT_EQ(C::Of(2, 0, 1, 1024), C::Of(2, 0, 1, uint64_t{1} << 40));
  // Every class has its own number below kCount.
  std::vector<bool> seen(C::kCount, false);
  for (uint64_t u : {1, 2, 3, 5, 9, 17, 65}) {
    for (uint64_t pos : {0, 1024, 4096, 12288}) {
      for (uint64_t t : {1, 2, 3, 4, 5}) {
        for (uint64_t g : {0, 1, 4, 16, 64, 256, 1024}) {
          const uint32_t c = C::Of(u, pos, t, g);
          ASSERT_LT(c, C::kCount);
          EXPECT_FALSE(seen[c]) << u << " " << pos << " " << t << " " << g;
          seen[c] = true;
        }
      }
    }
  }
}

TEST(HoldOptimumTest, ItNeedsRoomNextUsesAndTheHostTierAlone) {
  const Workload w = Loop(4, 2);
  EXPECT_FALSE(ComputeHoldOptimum(w, Prepare(w, true), 0).ok());
  EXPECT_FALSE(ComputeHoldOptimum(w, Prepare(w, false), 2).ok());
  SimOptions o;
  o.capacity_blocks = 2;
  o.nvme_blocks = 4;
  auto with_nvme = SimulatePolicy(w, std::string(kHoldOptimumPolicy), o);
  ASSERT_FALSE(with_nvme.ok());
  EXPECT_NE(with_nvme.status().message().find("host tier alone"), std::string::npos);
  SimOptions inf;
  inf.infinite = true;
  EXPECT_FALSE(SimulatePolicy(w, std::string(kHoldOptimumPolicy), inf).ok());
  EXPECT_FALSE(SimulatePolicy(w, std::string(kHoldOraclePolicy), o).ok()) << "host tier alone";
}

}  // namespace
}  // namespace kvtier::tools
