// SPDX-License-Identifier: Apache-2.0
#include "store/cascade.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace kvtier {
namespace {

// A chain of tiers whose fullness the test sets; a batch moves `per_block`
// of tier i's capacity to tier i + 1 per block, up to `movable` blocks.
struct FakeChain {
  Mutex mu;
  std::vector<double> full ABSL_GUARDED_BY(mu);
  uint32_t movable ABSL_GUARDED_BY(mu) = 1000;
  double per_block = 0.001;
  std::vector<uint32_t> batches ABSL_GUARDED_BY(mu);  // blocks moved, per batch

  explicit FakeChain(std::vector<double> f) : full(std::move(f)) {}
  Cascade::Hooks Hooks() {
    return {
        .tiers = [this] { return Tiers(); },
        .fuller_than = [this](size_t i, double share) { return Full(i) > share; },
        .move_batch =
            [this](size_t i, uint32_t max) {
              MutexLock l(&mu);
              uint32_t n = 0;
              while (n < max && movable > 0 && full[i] > 0) {
                full[i] -= per_block;
                full[i + 1] += per_block;
                --movable;
                ++n;
              }
              batches.push_back(n);
              return n;
            },
    };
  }
  size_t Tiers() {
    MutexLock l(&mu);
    return full.size();
  }
  double Full(size_t i) {
    MutexLock l(&mu);
    return full[i];
  }
  void Set(size_t i, double v) {
    MutexLock l(&mu);
    full[i] = v;
  }
  void SetMovable(uint32_t n) {
    MutexLock l(&mu);
    movable = n;
  }
};

TEST(CascadeTest, ATierAboveHighIsMovedDownToLowAndNotBelow) {
  FakeChain chain({0.95, 0.1});
  Cascade c(0.9, 0.8, chain.Hooks());
  c.Prepare();
  c.Pass();
  // Batches of kBatch blocks until the tier is at the low mark: at most one
  // batch past it, never emptied.
  EXPECT_LE(chain.Full(0), 0.8 + 1e-9);
  EXPECT_GT(chain.Full(0), 0.8 - Cascade::kBatch * chain.per_block - 1e-9);
  EXPECT_NEAR(chain.Full(0) + chain.Full(1), 1.05, 1e-9);
  EXPECT_TRUE(c.settled());
}

TEST(CascadeTest, BetweenTheMarksATierIsLeftAloneUntilItCrossesHighAgain) {
  FakeChain chain({0.85, 0.1});
  Cascade c(0.9, 0.8, chain.Hooks());
  c.Prepare();
  c.Pass();
  EXPECT_DOUBLE_EQ(chain.Full(0), 0.85);  // never crossed high: nothing moves
  EXPECT_TRUE(c.settled());
  chain.Set(0, 0.91);
  c.Pass();
  EXPECT_LE(chain.Full(0), 0.8 + 1e-9);  // once over high, down to low
}

TEST(CascadeTest, ATierThatCannotMoveNowStaysDrainingAndGoesOnLater) {
  FakeChain chain({0.95, 0.1});
  Cascade c(0.9, 0.8, chain.Hooks());
  c.Prepare();
  chain.SetMovable(3);  // three blocks, then everything is pinned
  c.Pass();
  EXPECT_NEAR(chain.Full(0), 0.947, 1e-9);
  EXPECT_FALSE(c.settled());  // still between its marks, still to do
  // Below high now, but it was draining: the next pass goes on to low.
  chain.Set(0, 0.88);
  chain.SetMovable(1000);
  c.Pass();
  EXPECT_LE(chain.Full(0), 0.8 + 1e-9);
  EXPECT_TRUE(c.settled());
}

TEST(CascadeTest, TheLastTierNeverCascadesAndTiersCascadeInOrder) {
  FakeChain chain({0.95, 0.85, 0.99});
  Cascade c(0.9, 0.8, chain.Hooks());
  c.Prepare();
  c.Pass();
  // Tier 0 drained into tier 1, which went over high and drained into tier 2.
  EXPECT_LE(chain.Full(0), 0.8 + 1e-9);
  EXPECT_LE(chain.Full(1), 0.8 + 1e-9);
  EXPECT_GT(chain.Full(2), 0.99);  // the last tier takes it all: it evicts on its own path
}

TEST(CascadeTest, OneTierHasNoThreadAndAWakeMovesBlocksOnTheThread) {
  {
    FakeChain one({0.99});
    Cascade c(0.9, 0.8, one.Hooks());
    c.Start();
    c.MaybeWake(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    EXPECT_DOUBLE_EQ(one.Full(0), 0.99);  // nothing below it: no driver
  }
  FakeChain chain({0.5, 0.1});
  Cascade c(0.9, 0.8, chain.Hooks());
  c.Start();
  chain.Set(0, 0.95);
  c.MaybeWake(0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(chain.Full(0) <= 0.8 + 1e-9 && c.settled()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LE(chain.Full(0), 0.8 + 1e-9);
  EXPECT_TRUE(c.settled());
  c.Stop();
  chain.Set(0, 0.99);
  c.MaybeWake(0);  // stopped: no pass
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  EXPECT_DOUBLE_EQ(chain.Full(0), 0.99);
}

}  // namespace
}  // namespace kvtier
