// SPDX-License-Identifier: Apache-2.0
// The eviction targets of the policies issue, checked on the production
// trace (Mooncake conversation trace, 512-token blocks) when it is next to
// the checkout (../shared/data/traces) or named by KVTIER_TRACE; skipped
// otherwise. The simulator is deterministic: these are exact figures, and a
// change to a policy that loses them fails here.
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <string>

#include "gtest/gtest.h"
#include "tools/replay/simulate.h"
#include "tools/replay/workload.h"

namespace kvtier::tools {
namespace {

std::string TracePath() {
  if (const char* p = std::getenv("KVTIER_TRACE")) return p;
  return KVTIER_SOURCE_DIR "/../shared/data/traces/conversation_trace.jsonl";
}

class PolicyTargetsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return;
#endif
    if (!std::filesystem::exists(TracePath())) return;
    auto w = LoadMooncakeTrace(TracePath(), 512, 0);
    ASSERT_TRUE(w.ok()) << w.status();
    workload_ = new Workload(std::move(*w));
  }
  static void TearDownTestSuite() {
    delete workload_;
    workload_ = nullptr;
  }
  void SetUp() override {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "figures are checked in the plain builds (minutes under sanitizers; the policies' "
                    "memory and threading are covered by their own tests)";
#endif
    if (workload_ == nullptr) GTEST_SKIP() << "no trace at " << TracePath();
  }
  static double HitRate(const std::string& policy, uint64_t host_tokens, uint64_t nvme_tokens = 0) {
    SimOptions o;
    o.capacity_blocks = host_tokens / 512;
    o.nvme_blocks = nvme_tokens / 512;
    o.infinite = policy == "infinite";
    auto row = SimulatePolicy(*workload_, policy, o);
    EXPECT_TRUE(row.ok()) << row.status();
    return row.ok() ? row->token_hit_rate() : 0;
  }
  static Workload* workload_;
};
Workload* PolicyTargetsTest::workload_ = nullptr;

TEST_F(PolicyTargetsTest, TheDefaultBeatsLruWhereRoomIsShortAndAdaptsEverywhere) {
  ASSERT_EQ(std::string(kDefaultHostPolicy), "adaptive");
  for (uint64_t tokens : {1'000'000u, 3'000'000u, 10'000'000u}) {
    SCOPED_TRACE(tokens);
    const double lru = HitRate("lru", tokens);
    const double s3fifo = HitRate("s3fifo", tokens);
    const double def = HitRate("adaptive", tokens);
    if (tokens <= 3'000'000u) {
      EXPECT_GE(def, 1.25 * lru);
    }
    EXPECT_GE(def, 0.98 * std::max(lru, s3fifo));
  }
}

// The online bound (what a policy deciding on a block's uses, position,
// turn and last gap could hit at most) lies above every policy and below
// Belady. The hold oracle (the bound's plan run as a tier, its statistics
// known in advance) lies under the bound and, on this trace, above every
// policy: knowing how long each class comes back after is worth hits here.
TEST_F(PolicyTargetsTest, TheOnlineBoundLiesBetweenThePoliciesAndBelady) {
  for (uint64_t tokens : {1'000'000u, 3'000'000u, 10'000'000u}) {
    SCOPED_TRACE(tokens);
    const double bound = HitRate(std::string(kOnlineBoundPolicy), tokens);
    const double oracle = HitRate(std::string(kHoldOraclePolicy), tokens);
    const double belady = HitRate("belady", tokens);
    for (const char* p : {"lru", "s3fifo", "s3fifo-deep", "tinylfu", "arc", "adaptive"}) {
      const double hit = HitRate(p, tokens);
      EXPECT_LE(hit, bound) << p;
      EXPECT_LT(hit, oracle) << p;
    }
    EXPECT_LE(oracle, bound);
    EXPECT_LT(bound, belady);
  }
}

TEST_F(PolicyTargetsTest, HostAndNvmeComeCloseToUnboundedRoom) {
  const double tiered = HitRate("adaptive", 3'000'000, 30'000'000);
  const double unbounded = HitRate("infinite", 0);
  EXPECT_GE(tiered, 0.95 * unbounded);
}

}  // namespace
}  // namespace kvtier::tools
