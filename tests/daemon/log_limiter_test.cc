// SPDX-License-Identifier: Apache-2.0
// The per-peer log limiter holds its rate when many threads log for one key
// at once (the control loop and session threads do).
#include "daemon/log_limiter.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(LogLimiterTest, ConcurrentCallersGetNoMoreThanTheBurstAndTheRate) {
  DaemonStats stats;
  LogLimiter limiter(/*per_second=*/5, /*burst=*/50, &stats);
  std::atomic<uint64_t> allowed{0}, calls{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(300)) {
        allowed += limiter.Allow("tenant") ? 1 : 0;
        ++calls;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(calls.load(), 1000u);
  EXPECT_GE(allowed.load(), 50u);
  EXPECT_LE(double(allowed.load()), 50 + 5 * seconds + 1) << calls.load() << " calls";
  EXPECT_EQ(stats.log_lines_suppressed.Get(), calls.load() - allowed.load());
}

TEST(LogLimiterTest, KeysHaveTheirOwnBuckets) {
  LogLimiter limiter(1, 2, nullptr);
  EXPECT_TRUE(limiter.Allow("a"));
  EXPECT_TRUE(limiter.Allow("a"));
  EXPECT_FALSE(limiter.Allow("a"));
  EXPECT_TRUE(limiter.Allow("b"));
}

}  // namespace
}  // namespace kvtier
