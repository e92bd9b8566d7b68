// SPDX-License-Identifier: Apache-2.0
// Prometheus metrics: kvtierd's status snapshot rendered in the text exposition
// format, served over HTTP on a local address (cpp-httplib). See
// docs/operations.md for the families.
#ifndef KVTIER_DAEMON_METRICS_H_
#define KVTIER_DAEMON_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/status_snapshot.h"

namespace httplib {
class Server;
}

namespace kvtier {

// The exposition text for a status snapshot (Daemon::Snapshot()). Never
// contains block contents, keys, prompts or salts: only counts, sizes and
// names of tiers and policies. With `detailed`, also series labelled by
// tenant and the shared tier's node addresses; without, those are summed
// (a local user who may scrape must not watch one tenant's stores, nor
// learn where the cluster is).
std::string PrometheusText(const StatusSnapshot& status, bool detailed = false);

// Serves GET /metrics on address:port from its own thread. `snapshot`
// returns the status (nullopt: the daemon is busy; the scrape gets 503).
class MetricsServer {
 public:
  using Snapshot = std::function<std::optional<StatusSnapshot>()>;
  // port 0 picks a free port. Errors name the address.
  // A non-empty `bearer_token` is required of every scrape
  // ("Authorization: Bearer <token>"; 401 otherwise): the metrics show
  // daemon-wide lookups as they happen, which a local user who is no
  // tenant could otherwise watch (docs/security.md).
  // `detailed` (PrometheusText) when a token is required or the operator
  // set metrics.per_tenant.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address, uint16_t port,
                                                              Snapshot snapshot, std::string bearer_token = "",
                                                              bool detailed = false);
  ~MetricsServer();
  uint16_t port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  uint16_t port_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_METRICS_H_
