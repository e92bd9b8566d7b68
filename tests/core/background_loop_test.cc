// SPDX-License-Identifier: Apache-2.0
// BackgroundLoop: a pass per wake, a pass per period without one, a stop
// that ends a long pass early and joins, and a restart after a stop.
#include "core/background_loop.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;

using testing::Eventually;

TEST(BackgroundLoopTest, AWakeRunsAPassLongBeforeThePeriod) {
  BackgroundLoop loop;
  std::atomic<int> passes{0};
  loop.Start(milliseconds(60'000), [&] { passes.fetch_add(1); });
  EXPECT_TRUE(loop.running());
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(passes.load(), 0) << "no pass before a wake or the period";
  loop.Wake();
  EXPECT_TRUE(Eventually([&] { return passes.load() == 1; }));
  loop.Wake();
  EXPECT_TRUE(Eventually([&] { return passes.load() == 2; }));
  loop.Stop();
  EXPECT_FALSE(loop.running());
}

TEST(BackgroundLoopTest, WithoutWakesThePeriodRunsPasses) {
  BackgroundLoop loop;
  std::atomic<int> passes{0};
  loop.Start(milliseconds(5), [&] { passes.fetch_add(1); });
  EXPECT_TRUE(Eventually([&] { return passes.load() >= 3; }));
  loop.Stop();  // before `passes` goes
}

TEST(BackgroundLoopTest, StopEndsALongPassThatWatchesRunningAndJoins) {
  BackgroundLoop loop;
  std::atomic<bool> in_pass{false}, saw_stop{false};
  loop.Start(milliseconds(60'000), [&] {
    in_pass = true;
    while (loop.running()) std::this_thread::sleep_for(milliseconds(1));
    saw_stop = true;
  });
  loop.Wake();
  ASSERT_TRUE(Eventually([&] { return in_pass.load(); }));
  loop.Stop();  // returns only once the pass has ended
  EXPECT_TRUE(saw_stop.load());
  loop.Stop();  // a second stop is nothing
}

TEST(BackgroundLoopTest, StartTwiceKeepsOneThreadAndARestartWorks) {
  BackgroundLoop loop;
  std::atomic<int> first{0}, second{0};
  loop.Start(milliseconds(60'000), [&] { first.fetch_add(1); });
  loop.Start(milliseconds(60'000), [&] { second.fetch_add(1); });  // running: ignored
  loop.Wake();
  ASSERT_TRUE(Eventually([&] { return first.load() == 1; }));
  EXPECT_EQ(second.load(), 0);
  loop.Stop();
  loop.Start(milliseconds(60'000), [&] { second.fetch_add(1); });
  loop.Wake();
  EXPECT_TRUE(Eventually([&] { return second.load() == 1; }));
  EXPECT_EQ(first.load(), 1);
}

}  // namespace
}  // namespace kvtier
