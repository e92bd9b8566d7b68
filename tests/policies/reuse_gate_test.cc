// SPDX-License-Identifier: Apache-2.0
// The admission gate: a block asked for twice is admitted at min_uses 2, a
// block asked for once is not; estimates are never below the true count
// (until aging halves them); off (min_uses 1) admits everything and keeps
// nothing; concurrent use is safe.
#include "policies/reuse_gate.h"

#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(ReuseGateTest, ABlockReadTwiceIsAdmittedAndOneReadOnceIsNot) {
  ReuseGate g(2, 1 << 16);  // halved every 8192 uses: 6000 come before the first
  ASSERT_TRUE(g.enabled());
  std::mt19937_64 rng(1);
  std::vector<uint64_t> twice, once;
  for (int i = 0; i < 2000; ++i) twice.push_back(rng() | 1);
  for (int i = 0; i < 2000; ++i) once.push_back(rng() | 1);
  for (uint64_t k : twice) g.Record(k);
  for (uint64_t k : once) g.Record(k);
  for (uint64_t k : twice) g.Record(k);
  int once_admitted = 0;
  for (uint64_t k : twice) ASSERT_TRUE(g.Admit(k)) << "a block asked for twice";
  for (uint64_t k : once) once_admitted += g.Admit(k);
  // 6000 uses, four counters each, in 65536 counters: two collisions on all four are rare.
  EXPECT_LE(once_admitted, 20) << "blocks asked for once, admitted through collisions";
  for (uint64_t k = 1; k < 100; ++k) g.Record(k * 0x9e3779b97f4a7c15ull);
  EXPECT_FALSE(g.Admit(0x1234567)) << "never asked for";
}

TEST(ReuseGateTest, EstimatesAreNeverTooLowAndSaturate) {
  ReuseGate g(3, 1 << 16);  // 3000 uses on average: before the first halving
  std::mt19937_64 rng(2);
  std::vector<std::pair<uint64_t, uint32_t>> truth;
  for (int i = 0; i < 300; ++i) truth.push_back({rng() | 1, static_cast<uint32_t>(rng() % 20)});
  for (auto [k, n] : truth) {
    for (uint32_t j = 0; j < n; ++j) g.Record(k);
  }
  for (auto [k, n] : truth) {
    EXPECT_GE(g.Estimate(k), std::min<uint32_t>(n, 15));
    EXPECT_LE(g.Estimate(k), 15u);
    EXPECT_EQ(g.Admit(k), g.Estimate(k) >= 3);
  }
}

TEST(ReuseGateTest, OldUsesAgeAway) {
  // 1024 counters: halved after 128 uses.
  ReuseGate g(2, 1024);
  const uint64_t old = 42;
  g.Record(old);
  g.Record(old);
  ASSERT_TRUE(g.Admit(old));
  std::mt19937_64 rng(3);
  for (int i = 0; i < 2 * 128; ++i) g.Record(rng() | 1);
  EXPECT_FALSE(g.Admit(old)) << "two uses long ago are no longer evidence (estimate " << g.Estimate(old) << ")";
}

TEST(ReuseGateTest, OffAdmitsEverythingAndKeepsNothing) {
  ReuseGate g(1, 1 << 20);
  EXPECT_FALSE(g.enabled());
  EXPECT_EQ(g.bytes(), 0u);
  g.Record(7);
  EXPECT_TRUE(g.Admit(7));
  EXPECT_TRUE(g.Admit(8));
  ReuseGate zero(0, 1 << 20);
  EXPECT_TRUE(zero.Admit(9));
}

TEST(ReuseGateTest, ConcurrentRecordsAndReadsAreSafe) {
  ReuseGate g(2, 1 << 12);  // halved every 512 uses: many halvings race the increments
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&g, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 50000; ++i) {
        const uint64_t k = 1 + rng() % 5000;
        g.Record(k);
        (void)g.Admit(k);
      }
    });
  }
  for (auto& t : ts) t.join();
  // A key recorded by every thread many times since the last halving is in.
  for (int i = 0; i < 8; ++i) g.Record(77);
  EXPECT_TRUE(g.Admit(77));
}

}  // namespace
}  // namespace kvtier
