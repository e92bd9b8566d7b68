// SPDX-License-Identifier: Apache-2.0
// kvtierd's control plane: one epoll loop that accepts attaches (checking
// SO_PEERCRED against the tenants), watches every session's socket and pidfd
// for a dead client, serves the admin socket, handles signals, and reaps
// sessions whose threads ended. The data plane runs on the session threads.
#ifndef KVTIER_DAEMON_DAEMON_H_
#define KVTIER_DAEMON_DAEMON_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <optional>
#include <future>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/unique_fd.h"
#include "store/block_store.h"
#include "events/kv_events.h"
#include "daemon/config.h"
#include "daemon/heap_trim.h"
#include "store/gpu_cache.h"
#include "daemon/log_limiter.h"
#include "daemon/metrics.h"
#include "store/namespace_registry.h"
#include "daemon/service_notify.h"
#include "daemon/session.h"
#include "ipc/admin_commands.h"
#include "ipc/attach.h"
#include "store/stats.h"
#include "daemon/status_snapshot.h"
#include "nlohmann/json.hpp"
#include "tiers/device_backend.h"

namespace kvtier {

class Daemon {
 public:
  // Opens tiers and sockets; logs what it chose. Errors say what to fix.
  static absl::StatusOr<std::unique_ptr<Daemon>> Create(const Config& config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves until SIGTERM/SIGINT or Stop(); then closes every session and
  // removes its sockets. The calling thread must have SIGTERM, SIGINT and
  // SIGHUP blocked (BlockSignals) so the loop's signalfd receives them.
  absl::Status Run();
  // Where SIGHUP reads the new config from (the file kvtierd started with,
  // with the command line's overrides); unset: SIGHUP logs that there is no
  // file to reload. Before Run.
  using ConfigLoader = std::function<absl::StatusOr<Config>()>;
  void SetConfigLoader(ConfigLoader loader) { loader_ = std::move(loader); }
  // Thread-safe, async-signal-safe: makes Run return.
  void Stop();

  // Blocks the signals Run handles, for the calling thread and the threads
  // it creates afterwards. Call first thing in main().
  static void BlockSignals();

  // Builds the response to one admin request (exposed for tests).
  nlohmann::json HandleAdmin(const nlohmann::json& request);
  // The admin commands (ipc::kAdminCommands), one handler each.
  using AdminHandler = nlohmann::json (Daemon::*)(const nlohmann::json& request);
  static const std::array<AdminHandler, ipc::kAdminCommands.size()> kAdminHandlers;
  nlohmann::json AdminStatus(const nlohmann::json& request);
  nlohmann::json AdminPing(const nlohmann::json& request);
  nlohmann::json AdminConfig(const nlohmann::json& request);
  nlohmann::json AdminBlocks(const nlohmann::json& request);
  nlohmann::json AdminEvict(const nlohmann::json& request);
  nlohmann::json AdminFlush(const nlohmann::json& request);
  nlohmann::json AdminDrain(const nlohmann::json& request);
  // The answer line (without its newline) to one request line from the
  // admin socket, whatever its bytes: what OnAdminConn sends (exposed for
  // tests/fuzz/admin_request_fuzz.cc). Control-loop thread only.
  std::string AnswerAdminLine(std::string_view line);

 private:
  explicit Daemon(const Config& config);
  absl::Status Open();
  // Config::LowerChain(), in order, each kind opened through the registry
  // (tier_registry.h) and attached as the next lane.
  absl::Status OpenLowerTiers();
  // Open()'s parts: one tenant's host tier (pinned for the device), its GPU
  // tier where configured, and its place in the store; the sockets, signals
  // and the epoll set; the metrics endpoint (an endpoint that cannot start
  // is logged, not fatal: serving engines matters more than being scraped;
  // an unreadable token file is fatal).
  absl::Status OpenTenant(const TenantConfig& t);
  absl::Status OpenEvents();
  absl::Status OpenSockets();
  absl::Status StartMetrics();

  enum class FdKind : uint8_t { kDataListen, kAdminListen, kSignal, kWake, kPendingAttach,
                                kSessionSocket, kSessionPid, kAdminConn };
  void Watch(int fd, FdKind kind, uint64_t id, uint32_t events);
  void Unwatch(int fd);
  void OnDataListen();
  void OnPendingAttach(int fd);
  void OnAdminListen();
  void OnAdminConn(int fd, uint32_t events);
  void OnSessionSocket(int fd, uint64_t session_id, uint32_t events);
  void OnSessionGone(uint64_t session_id, absl::string_view why);
  void ReapSessions();
  // Gives the heap's free pages back once the tiers have churned
  // (daemon/heap_trim.h). Control loop.
  void TrimHeap();
  // Frees the namespaces (of `tenant` only, when given) that no session
  // uses and no block is left of; drops their GPU copies. Control loop.
  void FreeUnusedNamespaces(std::optional<uint16_t> tenant = std::nullopt);
  void ExpirePendingAttaches();
  void Attach(UniqueFd fd, std::span<const std::byte> request);
  // Admission (daemon/admission.h): the peer's tenant, the session limits,
  // the namespace. A refusal carries the client's code (CodedStatus).
  struct Admitted {
    const TenantConfig* tenant;
    uint16_t tenant_idx;
    NamespaceId ns_id;
    NamespaceInfo ns;
  };
  absl::StatusOr<Admitted> Admit(const ipc::PeerCredentials& peer, const ipc::AttachRequest& req);
  // The session segment, the reply with its memfds, and the session thread.
  void OpenSession(UniqueFd fd, const ipc::PeerCredentials& peer, const ipc::AttachRequest& req,
                   const Admitted& admitted);
  void RefuseAttach(int fd, int code, const std::string& message, const ipc::PeerCredentials& peer);
  // The status as one typed value (control loop); StatusJson and
  // PrometheusText write it.
  StatusSnapshot Snapshot() const;
  // One line for systemd's STATUS= (no block contents, keys or salts).
  std::string StatusLine() const;
  void CloseAll();
  // Sessions of the tenant named `tenant` (not yet reaped).
  uint32_t SessionsOf(const std::string& tenant) const;
  // SIGHUP: validates the new config, applies what can change at run time
  // (log level, tenant quotas, reclaim watermarks, cost_model.decide) and
  // logs what needs a restart; an invalid file changes nothing.
  void Reload();
  // SIGTERM: refuse new engines and stores, give open stores and in-flight
  // operations half of drain_timeout_ms to finish, end the sessions, write
  // committed host blocks that have no NVMe copy to the NVMe tier and make
  // its journal durable, all within drain_timeout_ms.
  void Drain();
  // Any thread (the metrics server's): the status snapshot, taken on the
  // main loop; nullopt when the loop does not answer within 2 s (draining)
  // or is stopping.
  std::optional<StatusSnapshot> StatusFromLoop();
  void AnswerStatusRequests();
  // The running config for kvtierctl config show (salts redacted).
  nlohmann::json ConfigJson() const;

  Config config_;
  DaemonStats stats_;
  HeapTrimmer heap_trimmer_;
  ServiceNotifier notifier_;
  ConfigLoader loader_;
  std::unique_ptr<MetricsServer> metrics_;
  Mutex status_mu_;
  std::vector<std::shared_ptr<std::promise<std::optional<StatusSnapshot>>>> status_requests_
      ABSL_GUARDED_BY(status_mu_);
  bool status_closed_ ABSL_GUARDED_BY(status_mu_) = false;
  bool closed_ = false;  // CloseAll ran
  bool drain_requested_ = false;  // kvtierctl drain: the loop drains after answering
  std::unique_ptr<DeviceBackend> device_;
  std::string device_reason_;
  absl::flat_hash_set<std::string> arena_registered_;  // tenants whose host arena the device can reach
  // Tenants with a GPU tier; the store owns each (BlockStore::AddTenant).
  absl::flat_hash_map<std::string, GpuCache*> gpu_;
  // KV events for routers ([events]); declared before store_, which calls
  // it from its threads, so that it outlives the store.
  std::unique_ptr<KvEvents> events_;
  // The options each later entry of a kind opened with
  // (Config::LowerEntry::own), kept while its tier's hooks may read them.
  std::vector<std::shared_ptr<const Config>> lower_options_;
  std::unique_ptr<BlockStore> store_;
  // Per lower lane, what only its kind shows in status (OpenedLowerTier::describe).
  std::vector<std::function<void(StatusSnapshot::Lower&)>> lower_describe_;
  // SIGHUP: per config section, the hook that applies its reloadable keys
  // (the schema says which) to what runs; a section without one takes them
  // into the running config as they are (nothing reads them once started,
  // or its tier is not in the chain). Set up by Open (AddReloadHooks, and
  // each lower tier's OpenedLowerTier::reload).
  using ReloadHook = std::function<absl::Status(const Config& next)>;
  absl::flat_hash_map<std::string, ReloadHook> reload_hooks_;
  // Per later entry of a kind, by its name: the hook that applies its
  // reloadable keys, given that entry's options in the next config.
  absl::flat_hash_map<std::string, ReloadHook> entry_reload_hooks_;
  void AddReloadHooks();
  // SIGHUP for the later entries of a kind (their keys are not the
  // sections'): each changed key applied through its entry's hook or named
  // in *restart.
  void ReloadLowerEntries(const Config& next, std::vector<std::string>* applied, std::vector<std::string>* restart);
  // Per tenant: its registered KV caches, across sessions. Declared before
  // sessions_, so it outlives them.
  absl::flat_hash_map<std::string, std::unique_ptr<KvCacheBudget>> kv_budgets_;
  std::unique_ptr<LogLimiter> log_limiter_;  // outlives the sessions, which use it
  NamespaceRegistry namespaces_;
  absl::flat_hash_map<std::string, uint16_t> tenant_index_;

  UniqueFd epoll_, data_listen_, admin_listen_, signal_fd_, wake_fd_;
  uint64_t next_session_id_ = 1;
  struct PendingAttach {
    UniqueFd fd;
    uint64_t deadline_ns;
    uid_t uid;
  };
  absl::flat_hash_map<uid_t, uint32_t> pending_per_uid_;
  void DropPending(absl::flat_hash_map<int, PendingAttach>::iterator it);
  absl::flat_hash_map<int, PendingAttach> pending_;
  struct LiveSession {
    std::unique_ptr<Session> session;
    UniqueFd pidfd;
  };
  std::map<uint64_t, LiveSession> sessions_;
  struct AdminConn {
    UniqueFd fd;
    std::string buffer;  // requests read, not yet answered
    std::string out;     // answers not yet taken by the peer
    bool closing = false;  // the peer hung up: close once `out` is sent
    uint64_t active_ns = 0;  // last read or write; idle connections are closed
  };
  // Sends what the socket takes of c.out now; false when the connection
  // must close (an error, or more unread answers than kMaxAdminOutput).
  bool FlushAdmin(int fd, AdminConn& c);
  absl::flat_hash_map<int, AdminConn> admin_conns_;
  absl::flat_hash_map<int, std::pair<FdKind, uint64_t>> watched_;
  std::atomic<bool> stop_{false};
  uint64_t started_ns_ = 0;
  uint64_t last_namespace_sweep_ns_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_DAEMON_H_
