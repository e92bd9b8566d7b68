// SPDX-License-Identifier: Apache-2.0
#include "daemon/service_notify.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdlib>

#include "core/checked.h"
#include "spdlog/spdlog.h"

namespace kvtier {

ServiceNotifier::ServiceNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  enabled_ = socket != nullptr && socket[0] != '\0';
  uint64_t usec = 0;
  if (enabled_ && sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0) watchdog_ns_ = usec * 1000;
}

int ServiceNotifier::loop_timeout_ms(int wanted) const {
  if (watchdog_ns_ == 0) return wanted;
  // Wake at a quarter of the interval: a ping is due at half of it.
  return std::max(1, std::min<int>(wanted, static_cast<int>(watchdog_ns_ / 4'000'000)));
}

void ServiceNotifier::Send(const std::string& text) {
  if (!enabled_) return;
  const int r = sd_notify(/*unset_environment=*/0, text.c_str());
  if (r < 0) spdlog::warn("event=sd_notify_failed errno={} detail=\"{}\"", -r, LogQuoted(text.substr(0, text.find('\n'))));
}

void ServiceNotifier::Ready(const std::string& status) {
  last_status_ = status;
  Send("READY=1\nSTATUS=" + status);
}

void ServiceNotifier::Status(const std::string& status) {
  last_status_ = status;
  Send("STATUS=" + status);
}

void ServiceNotifier::Reloading(const std::string& status) { Send("RELOADING=1\nSTATUS=" + status); }

void ServiceNotifier::Stopping(const std::string& status) { Send("STOPPING=1\nSTATUS=" + status); }

void ServiceNotifier::Tick(uint64_t now_ns, const std::string& status) {
  if (!enabled_) return;
  if (watchdog_ns_ != 0 && now_ns - last_ping_ns_ >= watchdog_ns_ / 2) {
    last_ping_ns_ = now_ns;
    Send("WATCHDOG=1");
  }
  if (status != last_status_ && now_ns - last_status_ns_ >= 1'000'000'000) {
    last_status_ns_ = now_ns;
    Status(status);
  }
}

}  // namespace kvtier
