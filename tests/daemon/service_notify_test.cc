// SPDX-License-Identifier: Apache-2.0
// ServiceNotifier against a real datagram socket: what it sends and when
// (the watchdog at half its interval, status only when it changed).
#include "daemon/service_notify.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/notify_socket.h"

namespace kvtier {
namespace {

class NotifyTest : public ::testing::Test {
 protected:
  void SetUp() override { setenv("WATCHDOG_USEC", "1000000", 1); }  // 1 s; the socket unsets it
  std::string Next() { return socket_.Next(std::chrono::milliseconds(100)); }
  testing::NotifySocket socket_;
};

TEST_F(NotifyTest, PingsAtHalfTheIntervalAndSendsStatusOnlyWhenItChanges) {
  ServiceNotifier n;
  ASSERT_TRUE(n.enabled());
  EXPECT_EQ(n.watchdog_interval_ns(), 1'000'000'000u);
  EXPECT_EQ(n.loop_timeout_ms(1000), 250) << "the loop wakes at a quarter of the interval";
  n.Ready("starting");
  EXPECT_EQ(Next(), "READY=1\nSTATUS=starting");
  const uint64_t t0 = 10'000'000'000;
  n.Tick(t0, "starting");
  EXPECT_EQ(Next(), "WATCHDOG=1");
  EXPECT_EQ(Next(), "") << "same status: nothing more";
  n.Tick(t0 + 400'000'000, "starting");
  EXPECT_EQ(Next(), "") << "not yet half the interval";
  n.Tick(t0 + 500'000'000, "2 sessions");
  EXPECT_EQ(Next(), "WATCHDOG=1");
  EXPECT_EQ(Next(), "STATUS=2 sessions");
  n.Tick(t0 + 600'000'000, "3 sessions");
  EXPECT_EQ(Next(), "") << "status at most once a second";
  n.Tick(t0 + 1'600'000'000, "3 sessions");
  EXPECT_EQ(Next(), "WATCHDOG=1");
  EXPECT_EQ(Next(), "STATUS=3 sessions");
  n.Stopping("draining");
  EXPECT_EQ(Next(), "STOPPING=1\nSTATUS=draining");
}

TEST(NotifyOffTest, WithoutNotifySocketItIsSilentAndNeverAsksForWakeUps) {
  unsetenv("NOTIFY_SOCKET");
  setenv("WATCHDOG_USEC", "1000000", 1);
  ServiceNotifier n;
  EXPECT_FALSE(n.enabled());
  EXPECT_EQ(n.watchdog_interval_ns(), 0u);
  EXPECT_EQ(n.loop_timeout_ms(1000), 1000);
  n.Ready("x");  // no socket: nothing to fail
  n.Tick(1, "y");
  unsetenv("WATCHDOG_USEC");
}

}  // namespace
}  // namespace kvtier
