// SPDX-License-Identifier: Apache-2.0
// kvtierd under systemd (Type=notify): READY=1 once the tiers are open and
// recovery is done, STATUS= with a one-line summary, watchdog pings from the
// main loop (so a loop that stops turning stops pinging and systemd restarts
// the daemon), STOPPING=1 when it drains. Everything is a no-op when
// $NOTIFY_SOCKET is unset (not started by systemd).
#ifndef KVTIER_DAEMON_SERVICE_NOTIFY_H_
#define KVTIER_DAEMON_SERVICE_NOTIFY_H_

#include <cstdint>
#include <string>

namespace kvtier {

class ServiceNotifier {
 public:
  // Reads $NOTIFY_SOCKET and $WATCHDOG_USEC (through libsystemd).
  ServiceNotifier();

  bool enabled() const { return enabled_; }
  // 0 when systemd asked for no watchdog.
  uint64_t watchdog_interval_ns() const { return watchdog_ns_; }
  // How long the main loop may sleep before it must come back to Tick.
  int loop_timeout_ms(int wanted) const;

  void Ready(const std::string& status);
  void Status(const std::string& status);
  void Reloading(const std::string& status);
  void Stopping(const std::string& status);
  // From the main loop, every iteration: pings the watchdog at half its
  // interval and sends `status` when it changed (at most once a second).
  void Tick(uint64_t now_ns, const std::string& status);

 private:
  void Send(const std::string& text);

  bool enabled_ = false;
  uint64_t watchdog_ns_ = 0;
  uint64_t last_ping_ns_ = 0;
  uint64_t last_status_ns_ = 0;
  std::string last_status_;
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_SERVICE_NOTIFY_H_
