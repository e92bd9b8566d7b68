// SPDX-License-Identifier: Apache-2.0
// The receiving end of systemd's notify protocol: a datagram socket bound
// in the test's temp folder and set as $NOTIFY_SOCKET (and unset again) for
// the code under test and the daemons the test starts.
#ifndef KVTIER_TESTS_SUPPORT_NOTIFY_SOCKET_H_
#define KVTIER_TESTS_SUPPORT_NOTIFY_SOCKET_H_

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::testing {

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

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_NOTIFY_SOCKET_H_
