// SPDX-License-Identifier: Apache-2.0
#include "daemon/daemon.h"
#include "policies/reuse_gate.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/checked.h"
#include "core/namespace.h"
#include "core/status.h"
#include "core/units.h"
#include "ipc/unix_socket.h"
#include "daemon/admission.h"
#include "daemon/assembly.h"
#include "daemon/config_schema.h"
#include "daemon/lower_kinds.h"
#include "daemon/tier_registry.h"
#include "tiers/nvme_tier.h"
#include "core/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace kvtier {
static_assert(kMaxLowerChain == kMaxLowerTiers, "a chain the config accepts must fit the store's lanes");
namespace {

// The admission gates' history (BlockStore::Options::admission_history_uses),
// from what host memory and NVMe hold (ReuseGate::HistoryUsesFor).
uint64_t AdmissionHistoryUses(const Config& c) {
  if (c.nvme.admission_min_uses <= 1 && c.remote.admission_min_uses <= 1) return 0;
  uint64_t bytes = c.ChainHolds("nvme") ? c.nvme.capacity_bytes : 0;
  for (const TenantConfig& t : c.tenants) bytes += t.host_bytes ? t.host_bytes : c.host_capacity;
  return ReuseGate::HistoryUsesFor(bytes);
}

absl::Status MakeDirs(const std::string& dir, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create directory ", dir, ": ",
                                                      ec.message(), "; set daemon.run_dir/data_dir"));
  }
  struct stat st;
  if (stat(dir.c_str(), &st) == 0 && st.st_uid == geteuid()) chmod(dir.c_str(), mode);
  return absl::OkStatus();
}

// The metrics bearer token: the file's first line, which must not be
// readable by every local user (that is whom it keeps out).
absl::StatusOr<std::string> ReadMetricsToken(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("metrics.token_file ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("metrics.token_file ", path));
  if ((st.st_mode & S_IROTH) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("metrics.token_file ", path,
                                                      " is readable by every user; chmod o-r it"));
  }
  char buf[4097];
  const ssize_t n = read(fd.get(), buf, sizeof(buf));
  if (n < 0) return ErrnoStatus(errno, absl::StrCat("reading metrics.token_file ", path));
  std::string token(buf, static_cast<size_t>(n));
  token = token.substr(0, token.find_first_of("\r\n"));
  if (token.empty() || token.size() > 4096 || !IsPrintableUtf8(token) || token.find(' ') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics.token_file ", path, " must hold one token of 1 to 4096 printable characters without spaces"));
  }
  return token;
}

}  // namespace

void Daemon::BlockSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

Daemon::Daemon(const Config& config) : config_(config) {}

Daemon::~Daemon() { CloseAll(); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Create(const Config& config) {
  RETURN_IF_ERROR(ValidateConfig(config));
  std::unique_ptr<Daemon> d(new Daemon(config));
  RETURN_IF_ERROR(d->Open());
  return d;
}

absl::Status Daemon::Open() {
  started_ns_ = MonotonicNanos();
  log_limiter_ = std::make_unique<LogLimiter>(config_.limit_log_lines_per_s, config_.limit_log_lines_per_s * 10, &stats_);
  ASSIGN_OR_RETURN(DeviceChoice choice,
                   OpenDeviceBackend(config_.device, SimDeviceOptions{config_.sim_bandwidth}));
  device_ = std::move(choice.backend);
  device_reason_ = choice.reason;
  spdlog::info("event=device backend={} detail=\"{}\"", device_->name(), LogQuoted(device_reason_));

  ASSIGN_OR_RETURN(CostTracker::Options cost, CostOptionsFrom(config_));
  spdlog::info("event=cost_model model=\"{}\" kv_bytes_per_token={} prefill_tflops_prior={} decide={}",
               LogQuoted(cost.model.name), cost.model.KvBytesPerToken(), config_.cost_prefill_tflops, cost.decide);
  ASSIGN_OR_RETURN(store_, BlockStore::Create({.max_leases_per_session = config_.max_leases_per_session,
                                               .policy = config_.host_policy,
                                               .nvme_policy = config_.nvme.policy,
                                               .write_through = config_.nvme.write_through,
                                               .cost = std::move(cost),
                                               .high_watermark = config_.host_high_watermark,
                                               .low_watermark = config_.host_low_watermark,
                                               .max_leased_blocks_per_session =
                                                   config_.limit_leased_blocks_per_session,
                                               .shared_probe_budget_us = config_.remote.probe_budget_us,
                                               .shared_probe_max_blocks = config_.remote.probe_max_blocks,
                                               .shared_probe_blocks_per_s = config_.remote.probe_blocks_per_s,
                                               .shared_records_per_tenant = config_.remote.records_per_tenant,
                                               .shared_min_block_bytes = config_.remote.min_block_bytes,
                                               .shared_writes = config_.RemoteWritePolicy(),
                                               .nvme_admission_min_uses = config_.nvme.admission_min_uses,
                                               .shared_admission_min_uses = config_.remote.admission_min_uses,
                                               .admission_history_uses = AdmissionHistoryUses(config_)},
                                              &stats_));
  for (const TenantConfig& t : config_.tenants) RETURN_IF_ERROR(OpenTenant(t));
  RETURN_IF_ERROR(OpenEvents());

  AddReloadHooks();
  RETURN_IF_ERROR(OpenLowerTiers());
  store_->StartBackgroundReclaim();

  RETURN_IF_ERROR(OpenSockets());
  // The event sockets once this daemon owns the run directory: a second
  // kvtierd on it stops at OpenSockets before touching them.
  if (events_) RETURN_IF_ERROR(events_->StartPublishers());
  return StartMetrics();
}

absl::Status Daemon::OpenEvents() {
  if (!config_.events_enabled) return absl::OkStatus();
  std::vector<KvEventTenant> tenants;
  for (const TenantConfig& t : config_.tenants) {
    const bool publish = config_.events_tenants.empty() ||
                         std::find(config_.events_tenants.begin(), config_.events_tenants.end(), t.name) !=
                             config_.events_tenants.end();
    tenants.push_back(KvEventTenant{t.name, publish, t.uids, t.gids});
  }
  ASSIGN_OR_RETURN(events_, KvEvents::Create({.endpoint = config_.events_endpoint,
                                              .replay_endpoint = config_.events_replay_endpoint,
                                              .topic = config_.events_topic,
                                              .bytes_hashes = config_.events_block_hash == "bytes",
                                              .batch_ms = config_.events_batch_ms,
                                              .buffer_batches = config_.events_buffer_batches,
                                              .buffer_bytes = config_.events_buffer_bytes,
                                              .max_pending = config_.events_max_pending,
                                              .max_connections = config_.events_max_connections,
                                              .publisher_memory = config_.events_publisher_memory,
                                              .replays_per_s = config_.events_replays_per_s,
                                              .replay_max_batches = config_.events_replay_max_batches},
                                             tenants, config_.run_dir));
  store_->SetEvents(events_.get());
  return absl::OkStatus();
}

absl::Status Daemon::OpenTenant(const TenantConfig& t) {
  const uint64_t bytes = t.host_bytes ? t.host_bytes : config_.host_capacity;
  auto host = HostTier::Create({absl::StrCat("kvtier-host-", t.name), bytes, config_.host_prefault});
  if (!host.ok()) {
    return absl::Status(host.status().code(), absl::StrCat("opening the host tier of tenant \"", t.name,
                                                           "\": ", host.status().message()));
  }
  // Pinned for the device, so daemon-driven copies with engine caches can
  // read and write blocks in place (cudaHostRegister on a GPU).
  if (absl::Status r = device_->RegisterHost((*host)->arena_base(), (*host)->arena_bytes()); r.ok()) {
    arena_registered_.insert(t.name);
  } else {
    spdlog::warn("event=host_register_failed tenant={} reason=\"{}\" hint=\"engines of this tenant cannot "
                 "register KV caches; raise LimitMEMLOCK (ulimit -l)\"",
                 t.name, LogQuoted(r.message()));
  }
  std::unique_ptr<GpuCache> gpu_cache;
  if (config_.gpu_capacity > 0) {
    if (!arena_registered_.contains(t.name)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tiers.gpu.capacity is set but tenant \"", t.name,
          "\"'s host arena could not be registered with the device (see the warning above)"));
    }
    absl::StatusOr<std::unique_ptr<GpuTier>> gpu = GpuTier::Create(device_.get(), {config_.gpu_capacity});
    if (!gpu.ok()) {
      return absl::Status(gpu.status().code(),
                          absl::StrCat("tiers.gpu.capacity = ", FormatBytes(config_.gpu_capacity), " for tenant \"",
                                       t.name, "\" on the ", device_->name(), " device: ", gpu.status().message()));
    }
    gpu_cache = std::make_unique<GpuCache>(std::move(*gpu));
    spdlog::info("event=gpu_tier tenant={} capacity=\"{}\" device={}", t.name, FormatBytes(config_.gpu_capacity),
                 device_->name());
  }
  ASSIGN_OR_RETURN(uint16_t idx,
                   store_->AddTenant(t.name, std::move(*host), {t.host_tokens, t.nvme_bytes, t.nvme_tokens},
                                     std::move(gpu_cache)));
  if (GpuCache* g = store_->gpu_cache(idx)) gpu_[t.name] = g;
  tenant_index_[t.name] = idx;
  kv_budgets_[t.name] = std::make_unique<KvCacheBudget>(config_.limit_kv_caches_per_tenant,
                                                        config_.limit_kv_cache_bytes_per_tenant, &stats_);
  spdlog::info(
      "event=tenant name={} host_capacity=\"{}\" policy={} uids={} gids={} host_tokens_quota={} "
      "nvme_bytes_quota=\"{}\" nvme_tokens_quota={}",
      t.name, FormatBytes(bytes), config_.host_policy, t.uids.size(), t.gids.size(), t.host_tokens,
      FormatBytes(t.nvme_bytes), t.nvme_tokens);
  return absl::OkStatus();
}

absl::Status Daemon::OpenSockets() {
  RETURN_IF_ERROR(MakeDirs(config_.run_dir, 0755));
  epoll_ = UniqueFd(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return ErrnoStatus(errno, "epoll_create1");
  // The data socket is open to all local users: admission is by SO_PEERCRED
  // against the tenants. The admin socket is owner and group only.
  ASSIGN_OR_RETURN(data_listen_, ipc::ListenUnix(config_.DataSocketPath(), SOCK_SEQPACKET, 0666));
  ASSIGN_OR_RETURN(admin_listen_, ipc::ListenUnix(config_.AdminSocketPath(), SOCK_STREAM, 0660));
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  signal_fd_ = UniqueFd(signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_.valid()) return ErrnoStatus(errno, "signalfd");
  wake_fd_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoStatus(errno, "eventfd");
  Watch(data_listen_.get(), FdKind::kDataListen, 0, EPOLLIN);
  Watch(admin_listen_.get(), FdKind::kAdminListen, 0, EPOLLIN);
  Watch(signal_fd_.get(), FdKind::kSignal, 0, EPOLLIN);
  Watch(wake_fd_.get(), FdKind::kWake, 0, EPOLLIN);
  spdlog::info("event=listening socket={} admin_socket={} hash={}", config_.DataSocketPath(),
               config_.AdminSocketPath(), HashAlgorithmName(config_.hash));
  return absl::OkStatus();
}

absl::Status Daemon::StartMetrics() {
  if (config_.metrics_enabled) {
    std::string token;
    if (!config_.metrics_token_file.empty()) {
      ASSIGN_OR_RETURN(token, ReadMetricsToken(config_.metrics_token_file));
    }
    // Per-tenant series and the cluster's addresses only for scrapers that
    // prove themselves, or where the operator chose to show them to all.
    const bool detailed = !token.empty() || config_.metrics_per_tenant;
    absl::StatusOr<std::unique_ptr<MetricsServer>> m =
        MetricsServer::Start(config_.metrics_address, static_cast<uint16_t>(config_.metrics_port),
                             [this] { return StatusFromLoop(); }, std::move(token), detailed);
    if (m.ok()) {
      metrics_ = std::move(*m);
      spdlog::info("event=metrics url=http://{}:{}/metrics", config_.metrics_address, metrics_->port());
    } else {
      // Serving engines matters more than being scraped.
      spdlog::error("event=metrics_unavailable detail=\"{}\"", LogQuoted(m.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Daemon::OpenLowerTiers() {
  const std::vector<Config::LowerEntry> chain = config_.LowerChain();
  if (config_.lower_chain.empty()) {
    std::vector<std::string> sections;
    for (const LowerTierKind& k : LowerTierKinds()) {
      const std::string prefix = std::string(k.section) + ".";
      if (std::any_of(config_.key_source.begin(), config_.key_source.end(),
                      [&](const auto& e) { return e.first.rfind(prefix, 0) == 0; })) {
        sections.push_back("[" + std::string(k.section) + "]");
      }
    }
    if (!sections.empty()) {
      spdlog::info("event=lower_chain_from_sections sections=\"{}\" detail=\"read as the chain nvme, then the "
                   "shared tier; [[tiers.lower]] entries state a chain in order (docs/configuration.md)\"",
                   absl::StrJoin(sections, ", "));
    }
  }
  std::vector<std::string> names;
  for (const Config::LowerEntry& e : chain) {
    // A later entry of a kind opens with options of its own, kept here
    // while its hooks may read them; the first, with the daemon's config.
    if (e.own) lower_options_.push_back(std::make_shared<const Config>(config_.OptionsOf(e)));
    ASSIGN_OR_RETURN(OpenedLowerTier opened, OpenLowerTier(e, e.own ? *lower_options_.back() : config_));
    if (opened.tier == nullptr) continue;
    // By its kind, as the log said before tiers had names, unless the
    // entry's name is not its kind's default.
    names.push_back(e.name == FindLowerTierKind(e.kind)->default_name ? e.kind
                                                                      : absl::StrCat(e.name, " (", e.kind, ")"));
    ASSIGN_OR_RETURN(uint64_t indexed,
                     store_->AttachLowerTier(std::move(opened.tier), opened.recovered, &namespaces_));
    if (opened.attached) opened.attached(indexed);
    lower_describe_.push_back(std::move(opened.describe));
    if (opened.reload) {
      // A section's hook runs after the section's own, if it has one
      // (AddReloadHooks ran first); a later entry's, on its own.
      const size_t lane = store_->lower_tier_count() - 1;
      ReloadHook& at =
          e.own ? entry_reload_hooks_[e.name] : reload_hooks_[std::string(FindLowerTierKind(e.kind)->section)];
      at = [this, lane, before = std::move(at), hook = std::move(opened.reload)](const Config& next) -> absl::Status {
        if (before) RETURN_IF_ERROR(before(next));
        RETURN_IF_ERROR(hook(next));
        store_->LowerCapacityChanged(lane);
        return absl::OkStatus();
      };
    }
  }
  spdlog::info("event=lower_chain chain=\"{}\" lanes={}", names.empty() ? "none" : absl::StrJoin(names, " -> "),
               store_->lower_tier_count());
  return absl::OkStatus();
}

void Daemon::Watch(int fd, FdKind kind, uint64_t id, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) == 0) watched_[fd] = {kind, id};
}

void Daemon::Unwatch(int fd) {
  if (watched_.erase(fd) > 0) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

void Daemon::Stop() {
  stop_.store(true, std::memory_order_release);
  if (wake_fd_.valid()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof(one));
  }
}

void Daemon::TrimHeap() {
  // Blocks freed anywhere: host evictions (demoted or dropped), evictions
  // from the tiers below, invalidations.
  const uint64_t freed = stats_.evictions.Get() + stats_.nvme_evictions.Get() + stats_.lower_evictions.Get() +
                         stats_.invalidations.Get();
  const uint64_t indexed = store_->indexed_blocks();
  if (const std::optional<uint64_t> took = heap_trimmer_.MaybeTrim(MonotonicNanos(), freed, indexed)) {
    stats_.heap_trims.Add();
    stats_.heap_trim_ns.Add(*took);
    spdlog::debug("event=heap_trim took_us={} indexed_blocks={}", *took / 1000, indexed);
  }
}

std::string Daemon::StatusLine() const {
  uint64_t used = 0, capacity = 0, blocks = 0;
  for (const TenantUsage& u : store_->Usage()) {
    used += u.used_bytes;
    capacity += u.capacity_bytes;
    blocks += u.blocks;
  }
  const uint64_t queried = stats_.tokens_queried.Get();
  const double reused = queried == 0 ? 0.0 : double(stats_.tokens_hit.Get()) / double(queried);
  return absl::StrFormat("%d sessions; host %s of %s (%d blocks); reused-token ratio %.3f", sessions_.size(),
                         FormatBytes(used), FormatBytes(capacity), blocks, reused);
}

absl::Status Daemon::Run() {
  epoll_event events[64];
  // Open() has opened every tier and recovered the NVMe tier's blocks.
  notifier_.Ready(StatusLine());
  if (notifier_.watchdog_interval_ns() != 0) {
    spdlog::info("event=watchdog interval_ms={}", notifier_.watchdog_interval_ns() / 1'000'000);
  }
  while (!stop_.load(std::memory_order_acquire)) {
    // The watchdog is pinged from here only: a loop that stops turning
    // stops pinging, and systemd restarts the daemon.
    notifier_.Tick(MonotonicNanos(), StatusLine());
    const int n = epoll_wait(epoll_.get(), events, 64, notifier_.loop_timeout_ms(1000));
    if (n < 0 && errno != EINTR) return ErrnoStatus(errno, "epoll_wait");
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      auto it = watched_.find(fd);
      if (it == watched_.end()) continue;
      const auto [kind, id] = it->second;
      switch (kind) {
        case FdKind::kDataListen: OnDataListen(); break;
        case FdKind::kAdminListen: OnAdminListen(); break;
        case FdKind::kPendingAttach: OnPendingAttach(fd); break;
        case FdKind::kAdminConn: OnAdminConn(fd, events[i].events); break;
        case FdKind::kSessionSocket: OnSessionSocket(fd, id, events[i].events); break;
        case FdKind::kSessionPid: OnSessionGone(id, "process exited"); break;
        case FdKind::kWake: {
          uint64_t v;
          (void)!read(wake_fd_.get(), &v, sizeof(v));
          AnswerStatusRequests();
          ReapSessions();
          break;
        }
        case FdKind::kSignal: {
          signalfd_siginfo si;
          while (read(signal_fd_.get(), &si, sizeof(si)) == sizeof(si)) {
            if (si.ssi_signo == SIGHUP) {
              Reload();
            } else if (!stop_.load(std::memory_order_acquire)) {
              spdlog::info("event=signal signal={} action=drain", strsignal(si.ssi_signo));
              Drain();
              stop_.store(true, std::memory_order_release);
            }
          }
          break;
        }
      }
    }
    ExpirePendingAttaches();
    ReapSessions();
    store_->CalibrateNvme(MonotonicNanos());
    TrimHeap();
    if (drain_requested_ && !stop_.load(std::memory_order_acquire)) {
      Drain();
      stop_.store(true, std::memory_order_release);
    }
  }
  notifier_.Stopping("stopping: closing sessions");
  CloseAll();
  return absl::OkStatus();
}

void Daemon::AddReloadHooks() {
  reload_hooks_["daemon"] = [](const Config& next) {  // drain_timeout_ms is read where it is used
    spdlog::set_level(spdlog::level::from_str(next.log_level));
    return absl::OkStatus();
  };
  reload_hooks_["tiers.host"] = [this](const Config& next) {
    return store_->SetWatermarks(next.host_high_watermark, next.host_low_watermark);
  };
  // The shared-tier keys govern every shared tier of the chain.
  reload_hooks_["tiers.remote"] = [this](const Config& next) {
    store_->SetSharedPolicy(next.remote.probe_budget_us, next.RemoteWritePolicy());
    return absl::OkStatus();
  };
  reload_hooks_["cost_model"] = [this](const Config& next) {
    store_->cost().set_decide(next.cost_decide);
    return absl::OkStatus();
  };
}

void Daemon::Reload() {
  if (!loader_) {
    spdlog::warn("event=reload_skipped detail=\"kvtierd runs on its embedded defaults: no config file to reload\" "
                 "hint=\"start it with --config FILE\"");
    return;
  }
  notifier_.Reloading("reloading the config");
  absl::StatusOr<Config> next = loader_();
  if (next.ok()) {
    if (absl::Status v = ValidateConfig(*next); !v.ok()) next = v;
  }
  if (!next.ok()) {
    stats_.reloads_failed.Add();
    spdlog::error("event=reload_failed detail=\"{}\" hint=\"the running config is unchanged; fix the file and "
                  "send SIGHUP again\"",
                  LogQuoted(next.status().message()));
    notifier_.Ready(StatusLine());
    return;
  }
  const Config& n = *next;
  std::vector<std::string> applied, restart;
  // The schema's keys: a reloadable one goes through its section's hook,
  // the rest keep their running values until a restart.
  std::vector<std::pair<std::string_view, std::vector<const ConfigKey*>>> changed;  // by section, in file order
  for (const ConfigKey& k : ConfigSchema()) {
    if (!ConfigValuesDiffer(k, n, config_)) continue;
    if (!k.reloadable) {
      restart.push_back(k.full_name());
      continue;
    }
    if (changed.empty() || changed.back().first != k.section) changed.push_back({k.section, {}});
    changed.back().second.push_back(&k);
  }
  for (const auto& [section, keys] : changed) {
    std::vector<std::string> names;
    for (const ConfigKey* k : keys) names.push_back(k->full_name());
    auto hook = reload_hooks_.find(std::string(section));
    const absl::Status s = hook == reload_hooks_.end() ? absl::OkStatus() : hook->second(n);
    if (!s.ok()) {
      restart.push_back(absl::StrCat(absl::StrJoin(names, ", "), " (", s.message(), ")"));
      continue;
    }
    for (const ConfigKey* k : keys) CopyConfigValue(*k, n, &config_);
    applied.insert(applied.end(), names.begin(), names.end());
  }
  // Tenants: quotas change in place; a tenant added, removed or with other
  // credentials or salt needs a restart (its arena and namespaces are fixed).
  bool same_tenants = n.tenants.size() == config_.tenants.size();
  for (size_t i = 0; same_tenants && i < n.tenants.size(); ++i) {
    const TenantConfig &a = n.tenants[i], &b = config_.tenants[i];
    same_tenants = a.name == b.name && a.uids == b.uids && a.gids == b.gids && a.salt == b.salt &&
                   a.host_bytes == b.host_bytes;
  }
  if (!same_tenants) restart.push_back("tenants (added, removed, credentials, salt or host_bytes)");
  if (n.LowerChain() != config_.LowerChain()) {
    auto names = [](const Config& c) {
      std::vector<std::string> out;
      for (const Config::LowerEntry& e : c.LowerChain()) out.push_back(e.name);
      return out.empty() ? std::string("none") : absl::StrJoin(out, " -> ");
    };
    restart.push_back(absl::StrCat("tiers.lower (the chain ", names(config_), " becomes ", names(n), ")"));
  } else {
    ReloadLowerEntries(n, &applied, &restart);
  }
  for (const TenantConfig& t : n.tenants) {
    for (TenantConfig& cur : config_.tenants) {
      if (cur.name != t.name) continue;
      if (cur.host_tokens == t.host_tokens && cur.nvme_bytes == t.nvme_bytes && cur.nvme_tokens == t.nvme_tokens) break;
      if (store_->SetQuota(t.name, {t.host_tokens, t.nvme_bytes, t.nvme_tokens}).ok()) {
        cur.host_tokens = t.host_tokens;
        cur.nvme_bytes = t.nvme_bytes;
        cur.nvme_tokens = t.nvme_tokens;
        applied.push_back(absl::StrCat("tenants.", t.name, ".quotas"));
      }
      break;
    }
  }
  stats_.reloads.Add();
  if (restart.empty()) {
    spdlog::info("event=reload applied=\"{}\"", LogQuoted(applied.empty() ? "nothing changed" : absl::StrJoin(applied, ", ")));
  } else {
    spdlog::warn("event=reload applied=\"{}\" needs_restart=\"{}\" hint=\"restart kvtierd to apply these; they "
                 "keep their running values until then\"",
                 LogQuoted(applied.empty() ? "nothing" : absl::StrJoin(applied, ", ")), LogQuoted(absl::StrJoin(restart, "; ")));
  }
  notifier_.Ready(StatusLine());
}

void Daemon::ReloadLowerEntries(const Config& next, std::vector<std::string>* applied,
                                std::vector<std::string>* restart) {
  // The same chain (the caller checked): its kinds and names. A chain from
  // sections has no later entries.
  for (size_t i = 0; i < std::min(next.lower_chain.size(), config_.lower_chain.size()); ++i) {
    const Config::LowerEntry& ne = next.lower_chain[i];
    Config::LowerEntry& cur = config_.lower_chain[i];
    if (!ne.own || !cur.own) continue;
    const LowerTierKind* k = FindLowerTierKind(ne.kind);
    std::vector<const ConfigKey*> changed;
    for (const ConfigKey& key : k->keys) {
      if (!ConfigValuesDiffer(key, *ne.own, *cur.own)) continue;
      if (key.reloadable) {
        changed.push_back(&key);
      } else {
        restart->push_back(absl::StrCat("tiers.lower[", i, "].", std::string(key.name), " (", ne.name, ")"));
      }
    }
    if (changed.empty()) continue;
    std::vector<std::string> names;
    for (const ConfigKey* key : changed) names.push_back(absl::StrCat("tiers.lower[", i, "].", std::string(key->name)));
    auto hook = entry_reload_hooks_.find(ne.name);
    const absl::Status s = hook == entry_reload_hooks_.end() ? absl::OkStatus() : hook->second(next.OptionsOf(ne));
    if (!s.ok()) {
      restart->push_back(absl::StrCat(absl::StrJoin(names, ", "), " (", ne.name, ": ", s.message(), ")"));
      continue;
    }
    // The running entry with these keys applied.
    auto updated = std::make_shared<Config>(*cur.own);
    for (const ConfigKey* key : changed) CopyConfigValue(*key, *ne.own, updated.get());
    cur.own = std::move(updated);
    applied->insert(applied->end(), names.begin(), names.end());
  }
}

std::optional<StatusSnapshot> Daemon::StatusFromLoop() {
  auto request = std::make_shared<std::promise<std::optional<StatusSnapshot>>>();
  std::future<std::optional<StatusSnapshot>> answer = request->get_future();
  {
    MutexLock l(&status_mu_);
    if (status_closed_) return std::nullopt;
    status_requests_.push_back(request);
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
  if (answer.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return std::nullopt;
  return answer.get();
}

void Daemon::AnswerStatusRequests() {
  std::vector<std::shared_ptr<std::promise<std::optional<StatusSnapshot>>>> requests;
  {
    MutexLock l(&status_mu_);
    requests.swap(status_requests_);
  }
  if (requests.empty()) return;
  const StatusSnapshot s = Snapshot();
  for (auto& r : requests) r->set_value(s);
}

void Daemon::Drain() {
  const uint64_t start = MonotonicNanos();
  const uint64_t budget = uint64_t{config_.drain_timeout_ms} * 1'000'000;
  notifier_.Stopping("draining: stores refused, open stores finishing");
  spdlog::info("event=drain_start sessions={} timeout_ms={}", sessions_.size(), config_.drain_timeout_ms);
  // No new engines: the data socket goes (its path too, so a client sees
  // "no kvtierd" rather than a socket nobody accepts on).
  if (data_listen_.valid()) {
    Unwatch(data_listen_.get());
    unlink(config_.DataSocketPath().c_str());
    data_listen_.Reset();
  }
  store_->SetDraining();
  // Stores already begun may still commit, and operations in flight (NVMe
  // reads, durable commits) complete, for half the budget.
  size_t busy = 0;
  for (;;) {
    busy = 0;
    for (const auto& [id, ls] : sessions_) busy += ls.session->Idle() ? 0 : 1;
    if (busy == 0 || MonotonicNanos() - start >= budget / 2) break;
    notifier_.Tick(MonotonicNanos(), absl::StrCat("draining: ", busy, " sessions finishing"));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (busy > 0) {
    spdlog::warn("event=drain_sessions_busy sessions={} detail=\"stores still open after {} ms are aborted (they were "
                 "never acknowledged)\" hint=\"raise daemon.drain_timeout_ms\"",
                 busy, (MonotonicNanos() - start) / 1'000'000);
  }
  // Sessions end: nothing moves blocks any more but the flush below.
  for (auto& [id, ls] : sessions_) ls.session->Stop(ipc::CloseReason::kShutdown);
  for (auto& [id, ls] : sessions_) ls.session->Join();
  store_->StopBackgroundReclaim();
  if (store_->lower_tier() == nullptr) {
    spdlog::info("event=drained seconds={:.3f} detail=\"no NVMe tier: host blocks do not outlive the process\"",
                 double(MonotonicNanos() - start) / 1e9);
    return;
  }
  notifier_.Tick(MonotonicNanos(), "draining: writing host blocks to NVMe");
  const uint64_t spent = MonotonicNanos() - start;
  const BlockStore::FlushResult f =
      store_->FlushToFirstLowerTier(std::chrono::nanoseconds(budget > spent ? budget - spent : 0));
  const double seconds = double(MonotonicNanos() - start) / 1e9;
  const double sync_seconds = std::chrono::duration<double>(f.sync_time).count();
  if (f.failed > 0 || !f.sync.ok()) {
    spdlog::warn("event=drained written={} already_on_nvme={} failed={} timed_out={} landed_late={} journal=\"{}\" "
                 "seconds={:.3f} sync_seconds={:.3f} hint=\"blocks not written are lost with this process; raise "
                 "daemon.drain_timeout_ms or tiers.nvme.capacity\"",
                 f.written, f.already_on_nvme, f.failed, f.timed_out, f.landed_late,
                 LogQuoted(f.sync.ok() ? "durable" : f.sync.message()), seconds, sync_seconds);
  } else if (f.timed_out) {
    spdlog::warn("event=drained written={} already_on_nvme={} failed=0 timed_out=true landed_late={} journal=durable "
                 "seconds={:.3f} sync_seconds={:.3f} detail=\"every block was written, the last ones after the "
                 "budget\" hint=\"the device was slower than the budget allows; raise daemon.drain_timeout_ms "
                 "(TimeoutStopSec must stay above it)\"",
                 f.written, f.already_on_nvme, f.landed_late, seconds, sync_seconds);
  } else {
    spdlog::info("event=drained written={} already_on_nvme={} failed=0 journal=durable seconds={:.3f} "
                 "sync_seconds={:.3f}",
                 f.written, f.already_on_nvme, seconds, sync_seconds);
  }
}

void Daemon::CloseAll() {
  {
    // Scrapes waiting on the loop get "busy" now, and no new ones wait.
    MutexLock l(&status_mu_);
    status_closed_ = true;
    for (auto& r : status_requests_) r->set_value(std::nullopt);
    status_requests_.clear();
  }
  metrics_.reset();
  for (auto& [id, ls] : sessions_) ls.session->Stop(ipc::CloseReason::kShutdown);
  for (auto& [id, ls] : sessions_) ls.session->Join();
  const bool had = !closed_;  // once, whether Run or the destructor gets here first
  closed_ = true;
  sessions_.clear();
  pending_.clear();
  admin_conns_.clear();
  watched_.clear();
  if (data_listen_.valid()) {
    unlink(config_.DataSocketPath().c_str());
    data_listen_.Reset();
  }
  if (admin_listen_.valid()) {
    unlink(config_.AdminSocketPath().c_str());
    admin_listen_.Reset();
  }
  if (had) spdlog::info("event=stopped detail=\"sessions closed, sockets removed\"");
}

}  // namespace kvtier
