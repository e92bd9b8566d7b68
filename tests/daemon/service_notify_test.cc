// ServiceNotifier against a real datagram socket: what it sends and when
// (the watchdog at half its interval, status only when it changed).
#include "daemon/service_notify.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

class NotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/kvtier-notify-unit-" + std::to_string(getpid());
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    path_.copy(a.sun_path, sizeof(a.sun_path) - 1);
    ASSERT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
    setenv("WATCHDOG_USEC", "1000000", 1);  // 1 s
  }
  void TearDown() override {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    close(fd_);
    unlink(path_.c_str());
  }
  std::string Next() {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 100) != 1) return "";
    char buf[1024];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }
  std::string path_;
  int fd_ = -1;
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
