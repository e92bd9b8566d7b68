// kvtierd as systemd runs it: the notify protocol on a real datagram socket
// set as $NOTIFY_SOCKET (READY=1 with a STATUS= line once the tiers are open,
// watchdog pings from the main loop, STOPPING=1 on SIGTERM).
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;

// The receiving end of $NOTIFY_SOCKET, set for the daemons this test starts.
class NotifySocket {
 public:
  NotifySocket() {
    path_ = ::testing::TempDir() + "/kvtier-notify-" + std::to_string(getpid());
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    path_.copy(a.sun_path, sizeof(a.sun_path) - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    close(fd_);
    unlink(path_.c_str());
  }
  // The next datagram, or "" after `timeout`.
  std::string Next(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return "";
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }
  // Messages until one contains `what` (returned), or "" after `timeout`.
  std::string WaitFor(const std::string& what, std::chrono::milliseconds timeout,
                      std::vector<std::string>* seen = nullptr) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      std::string m = Next(std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()));
      if (seen != nullptr && !m.empty()) seen->push_back(m);
      if (m.find(what) != std::string::npos) return m;
    }
    return "";
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(ServiceE2eTest, NotifiesReadyWithStatusPingsTheWatchdogAndStopping) {
  NotifySocket notify;
  setenv("WATCHDOG_USEC", "400000", 1);  // a ping at least every 200 ms
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  const std::string ready = notify.WaitFor("READY=1", std::chrono::seconds(10));
  ASSERT_FALSE(ready.empty()) << d.Log();
  EXPECT_NE(ready.find("STATUS=0 sessions; host "), std::string::npos) << ready;
  // Ready means serving: the tiers answer.
  auto status = d.Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["tiers"][0]["tier"], "host");

  // Pings keep coming while the loop turns: at least 4 in 1.5 s.
  int pings = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < end) {
    if (notify.Next(std::chrono::milliseconds(100)).find("WATCHDOG=1") != std::string::npos) ++pings;
  }
  EXPECT_GE(pings, 4) << d.Log();

  // A session shows in the status line.
  auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(4096, "notify"));
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(notify.WaitFor("STATUS=1 sessions", std::chrono::seconds(5)).empty());
  c.reset();

  const int st = d.Stop();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  std::vector<std::string> seen;
  EXPECT_FALSE(notify.WaitFor("STOPPING=1", std::chrono::seconds(1), &seen).empty());
}

TEST(ServiceE2eTest, WithoutNotifySocketNothingIsSentAndTheDaemonRuns) {
  unsetenv("NOTIFY_SOCKET");
  DaemonProcess d;
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_TRUE(d.Status().ok());
  EXPECT_EQ(d.Log().find("sd_notify_failed"), std::string::npos);
  const int st = d.Stop();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

}  // namespace
}  // namespace kvtier
