// SPDX-License-Identifier: Apache-2.0
// FanIn: the last of N parts finishes, once, with every part's update, from
// whichever thread arrives last.
#include "core/fan_in.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

TEST(FanInTest, TheLastArrivalFinishesOnceWithEveryUpdate) {
  int finished = 0;
  uint32_t seen = 0;
  auto fan = FanIn<uint32_t>::Make(3, 10, [&](uint32_t n) {
    ++finished;
    seen = n;
  });
  for (int i = 0; i < 3; ++i) {
    fan->With([](uint32_t& n) { ++n; });
    EXPECT_EQ(finished, 0) << "finished before the last part";
    fan->Arrive();
  }
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(seen, 13u);
}

TEST(FanInTest, TheResultMayBeMoveOnlyAndOutlivesTheCaller) {
  std::unique_ptr<int> got;
  std::function<void()> part;
  {
    auto fan = FanIn<std::unique_ptr<int>>::Make(1, std::make_unique<int>(7),
                                                 [&](std::unique_ptr<int> r) { got = std::move(r); });
    part = [fan] { fan->Arrive(); };
  }  // the parts keep it alive
  part();
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(*got, 7);
}

// Stress (and a TSan target): parts arrive from many threads at once.
TEST(FanInTest, PartsFromManyThreadsFinishExactlyOnce) {
  constexpr int kThreads = 8, kPerThread = 5000;
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> finished{0};
    std::atomic<uint64_t> sum{0};
    auto fan = FanIn<uint64_t>::Make(kThreads * kPerThread, 0, [&](uint64_t s) {
      finished.fetch_add(1);
      sum = s;
    });
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([fan, t] {
        for (int i = 0; i < kPerThread; ++i) {
          fan->With([&](uint64_t& s) { s += static_cast<uint64_t>(t + 1); });
          fan->Arrive();
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(finished.load(), 1);
    EXPECT_EQ(sum.load(), uint64_t{kPerThread} * (kThreads * (kThreads + 1) / 2));
  }
}

}  // namespace
}  // namespace kvtier
