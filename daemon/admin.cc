// SPDX-License-Identifier: Apache-2.0
// The admin endpoint: JSON lines on the admin socket (see ipc/admin_client.h
// for the protocol). Runs on the control-loop thread, so it reads the session table
// without locks.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/block_key.h"
#include "core/bounded_json.h"
#include "core/namespace.h"
#include "core/units.h"
#include "daemon/config_schema.h"
#include "daemon/daemon.h"
#include "daemon/lower_kinds.h"
#include "ipc/admin_commands.h"
#include "ipc/admin_client.h"
#include "ipc/unix_socket.h"
#include "core/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace kvtier {
namespace {

constexpr size_t kMaxAdminConns = 64;
constexpr size_t kMaxAdminRequest = 1u << 20;   // bytes of requests not yet answered
constexpr size_t kMaxAdminOutput = 64u << 20;   // bytes of answers the peer has not read

nlohmann::json Error(absl::string_view message) {
  return nlohmann::json{{"ok", false}, {"error", message}};
}

// An integer field clamped to [lo, hi]: `fallback` when absent, nullopt
// when not a number. value<int64_t>() converted a float such as -9.2e20 to
// int64_t, which is undefined behaviour (UBSan stopped kvtierd), and read
// 2^64-1 as -1.
std::optional<int64_t> ClampedInt(const nlohmann::json& request, const char* key, int64_t fallback, int64_t lo,
                                  int64_t hi) {
  const auto it = request.find(key);
  if (it == request.end()) return fallback;
  if (it->is_number_unsigned()) {
    return it->get<uint64_t>() > static_cast<uint64_t>(hi) ? hi : std::max<int64_t>(lo, it->get<int64_t>());
  }
  if (it->is_number_integer()) return std::clamp<int64_t>(it->get<int64_t>(), lo, hi);
  if (it->is_number_float()) {
    const double d = it->get<double>();  // finite: JSON has no NaN or infinity
    return d <= double(lo) ? lo : d >= double(hi) ? hi : static_cast<int64_t>(d);
  }
  return std::nullopt;
}

}  // namespace

void Daemon::OnAdminListen() {
  const int fd = accept4(admin_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  UniqueFd conn(fd);
  absl::StatusOr<ipc::PeerCredentials> peer = ipc::GetPeerCredentials(fd);
  // Owner and group only, as the socket's mode says; checked again here so a
  // loosened mode cannot widen access. The group counts as the peer's
  // primary group or any of its supplementary groups, as for the file mode.
  bool allowed = peer.ok() && (peer->uid == 0 || peer->uid == geteuid() || peer->gid == getegid());
  if (peer.ok() && !allowed) {
    absl::StatusOr<std::vector<gid_t>> groups = ipc::GetPeerGroups(fd);
    allowed = groups.ok() && std::find(groups->begin(), groups->end(), getegid()) != groups->end();
  }
  if (!allowed || admin_conns_.size() >= kMaxAdminConns) {
    const std::string msg =
        (allowed ? Error(absl::StrCat("kvtierd already serves ", kMaxAdminConns, " admin connections; retry later"))
                 : Error(absl::StrCat("permission denied: uid ", peer.ok() ? peer->uid : -1,
                                      " is neither root nor kvtierd's user, nor in its group")))
            .dump() + "\n";
    // Logged before the answer goes: whoever reads the refusal can find its
    // log line (tools_test read the log between the two and missed it).
    spdlog::warn("event=admin_refused uid={} reason={}", peer.ok() ? static_cast<int64_t>(peer->uid) : -1,
                 allowed ? "too_many_connections" : "credentials");
    (void)!send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return;
  }
  admin_conns_[fd] = AdminConn{std::move(conn), {}, {}, false, MonotonicNanos()};
  Watch(fd, FdKind::kAdminConn, 0, EPOLLIN | EPOLLRDHUP);
}

bool Daemon::FlushAdmin(int fd, AdminConn& c) {
  while (!c.out.empty()) {
    const ssize_t n = send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return false;
  }
  if (c.out.size() > kMaxAdminOutput) {
    // A peer that asks and never reads: it goes, the loop never waits on it.
    stats_.Refused(Refusal::kSlowPeer);
    spdlog::warn("event=admin_conn_closed reason=\"{} bytes of answers unread\"", c.out.size());
    return false;
  }
  epoll_event ev{};
  // A peer that hung up is only written to (its EOF would wake us forever).
  ev.events = (c.closing ? 0u : static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP)) |
              (c.out.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
  ev.data.fd = fd;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
  return !(c.closing && c.out.empty());
}

void Daemon::OnAdminConn(int fd, uint32_t events) {
  auto it = admin_conns_.find(fd);
  if (it == admin_conns_.end()) return;
  AdminConn& c = it->second;
  c.active_ns = MonotonicNanos();
  char buf[4096];
  bool close_conn = false;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) {
        c.buffer.append(buf, static_cast<size_t>(n));
        if (c.buffer.size() > kMaxAdminRequest) close_conn = true;
        if (close_conn) break;
        continue;
      }
      if (n == 0) {
        c.closing = true;  // answer what was asked, then close
      } else if (errno != EAGAIN && errno != EINTR) {
        close_conn = true;
      }
      break;
    }
  }
  size_t nl;
  // Answers queue in c.out; while the peer has not taken them, its next
  // requests wait in c.buffer (bounded as above).
  while (!close_conn && c.out.size() <= kMaxAdminOutput && (nl = c.buffer.find('\n')) != std::string::npos) {
    const std::string line = c.buffer.substr(0, nl);
    c.buffer.erase(0, nl + 1);
    c.out += AnswerAdminLine(line);
    c.out += '\n';
  }
  if (!close_conn && !FlushAdmin(fd, c)) close_conn = true;
  if (c.closing && c.out.empty()) close_conn = true;
  if (close_conn) {
    Unwatch(fd);
    admin_conns_.erase(it);
  }
}

std::string Daemon::AnswerAdminLine(std::string_view line) {
  // Requests are flat; the bound keeps a deeply nested line from being built
  // (what touches a value recurses once per level).
  absl::StatusOr<nlohmann::json> req = ParseBoundedJson(line, /*max_depth=*/16);
  nlohmann::json resp;
  if (!req.ok() || !req->is_object()) {
    stats_.Refused(Refusal::kAdminBadRequest);
    resp = Error(absl::StrCat("request is not a JSON object", req.ok() ? "" : absl::StrCat(" (", req.status().message(), ")"),
                              "; send {\"cmd\": \"status\"}"));
  } else {
    try {
      resp = HandleAdmin(*req);
    } catch (const nlohmann::json::exception& e) {
      // A field of the wrong type (e.g. "limit": "ten"): the request is
      // refused, the daemon carries on.
      stats_.Refused(Refusal::kAdminBadRequest);
      resp = Error(absl::StrCat("bad request: ", e.what()));
    }
  }
  // Strings in answers came from peers (client names, model ids): never
  // let one make dump() throw.
  return resp.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One handler per row of ipc::kAdminCommands, in its order (to_array: a
// row without a handler does not compile).
const std::array<Daemon::AdminHandler, ipc::kAdminCommands.size()> Daemon::kAdminHandlers =
    std::to_array<Daemon::AdminHandler>({&Daemon::AdminStatus, &Daemon::AdminPing, &Daemon::AdminConfig,
                                          &Daemon::AdminBlocks, &Daemon::AdminEvict, &Daemon::AdminFlush,
                                          &Daemon::AdminDrain});

nlohmann::json Daemon::HandleAdmin(const nlohmann::json& request) {
  const std::string cmd = request.value("cmd", std::string());
  for (size_t i = 0; i < ipc::kAdminCommands.size(); ++i) {
    if (ipc::kAdminCommands[i].name == cmd) return (this->*kAdminHandlers[i])(request);
  }
  return Error(absl::StrCat("unknown command \"", cmd, "\"; known: ", ipc::AdminCommandNames()));
}

nlohmann::json Daemon::AdminStatus(const nlohmann::json&) { return StatusJson(Snapshot()); }

nlohmann::json Daemon::AdminPing(const nlohmann::json&) { return nlohmann::json{{"ok", true}}; }

nlohmann::json Daemon::AdminConfig(const nlohmann::json&) {
  return nlohmann::json{{"ok", true}, {"config", ConfigJson()}};
}

nlohmann::json Daemon::AdminDrain(const nlohmann::json&) {
  // Answered first; the loop drains (as on SIGTERM) and exits after.
  drain_requested_ = true;
  spdlog::info("event=admin_drain");
  return nlohmann::json{{"ok", true}, {"draining", true}, {"timeout_ms", config_.drain_timeout_ms}};
}

nlohmann::json Daemon::AdminFlush(const nlohmann::json& request) {
  using nlohmann::json;
  if (store_->lower_tier() == nullptr) return Error("kvtierd has no NVMe tier to flush to ([tiers.nvme] capacity = 0)");
  // Bounded: the loop (and the watchdog's pings) waits for it.
  const std::optional<int64_t> ms = ClampedInt(request, "timeout_ms", 10000, 1, 10000);
  if (!ms) {
    stats_.Refused(Refusal::kAdminBadRequest);
    return Error("bad request: timeout_ms must be a number of milliseconds");
  }
  const BlockStore::FlushResult f = store_->FlushToFirstLowerTier(std::chrono::milliseconds(*ms));
  const double sync_ms = std::chrono::duration<double, std::milli>(f.sync_time).count();
  spdlog::info("event=admin_flush written={} already_on_nvme={} failed={} timed_out={} landed_late={} sync_ms={:.1f}",
               f.written, f.already_on_nvme, f.failed, f.timed_out, f.landed_late, sync_ms);
  return json{{"ok", true},
              {"written", f.written},
              {"already_on_nvme", f.already_on_nvme},
              {"failed", f.failed},
              {"timed_out", f.timed_out},
              {"landed_late", f.landed_late},
              {"sync_ms", sync_ms},
              {"journal", f.sync.ok() ? std::string("durable") : std::string(f.sync.message())}};
}

nlohmann::json Daemon::AdminEvict(const nlohmann::json& request) {
  using nlohmann::json;
  const std::string tenant = request.value("tenant", std::string());
  if (tenant.empty()) return Error("evict needs a tenant (kvtierctl evict --tenant NAME)");
  absl::StatusOr<uint64_t> n = store_->EvictTenant(tenant);
  if (!n.ok()) return Error(std::string(n.status().message()));
  spdlog::info("event=admin_evict tenant={} evicted={}", tenant, *n);
  return json{{"ok", true}, {"tenant", tenant}, {"evicted", *n}};
}

nlohmann::json Daemon::AdminBlocks(const nlohmann::json& request) {
  using nlohmann::json;
  std::optional<uint16_t> tenant;
  if (request.contains("tenant")) {
    auto it = tenant_index_.find(request.value("tenant", std::string()));
    if (it == tenant_index_.end()) return Error(absl::StrCat("no tenant \"", request.value("tenant", std::string()), "\""));
    tenant = it->second;
  }
  std::optional<BlockKey> key;
  if (request.contains("key")) {
    absl::StatusOr<BlockKey> k = ParseBlockKeyHex(request.value("key", std::string()));
    if (!k.ok()) return Error(absl::StrCat("key: ", k.status().message()));
    key = *k;
  }
  const std::optional<int64_t> limit_field = ClampedInt(request, "limit", 100, 1, 100000);
  if (!limit_field) {
    stats_.Refused(Refusal::kAdminBadRequest);
    return Error("bad request: limit must be a number from 1 to 100000");
  }
  const size_t limit = static_cast<size_t>(*limit_field);
  absl::flat_hash_map<uint32_t, NamespaceInfo> ns;
  for (const NamespaceInfo& n : namespaces_.List()) ns[n.handle] = n;
  json blocks = json::array();
  for (const BlockStore::BlockInfo& b : store_->ListBlocks(tenant, limit, key ? &*key : nullptr)) {
    const auto it = ns.find(b.ns);
    json tiers = json::array();
    if (b.on_host) tiers.push_back("host");
    if (b.on_lower) tiers.push_back(std::string(store_->lower_tier(b.lower)->name()));
    blocks.push_back({{"key", b.key.Hex()},
                      {"namespace", it == ns.end() ? std::string("?") : it->second.id.Hex()},
                      {"model", it == ns.end() ? std::string() : it->second.model_id},
                      {"tenant", store_->tenant_name(b.tenant)},
                      {"tiers", tiers},
                      {"moving", b.moving},
                      {"pins", b.pins},
                      {"depth", b.depth == kUnknownDepth ? json(nullptr) : json(b.depth)},
                      {"tokens", b.tokens},
                      {"bytes", b.bytes}});
  }
  return json{{"ok", true}, {"blocks", blocks}, {"limit", limit}, {"indexed_blocks", store_->indexed_blocks()}};
}

nlohmann::json Daemon::ConfigJson() const {
  using nlohmann::json;
  const Config& c = config_;
  json tenants = json::array();
  for (const TenantConfig& t : c.tenants) {
    tenants.push_back({{"name", t.name},
                       {"uids", t.uids},
                       {"gids", t.gids},
                       {"salt", t.salt.empty() ? "" : "<set>"},  // a secret: never shown
                       {"host_bytes", t.host_bytes},
                       {"host_tokens", t.host_tokens},
                       {"nvme_bytes", t.nvme_bytes},
                       {"nvme_tokens", t.nvme_tokens}});
  }
  auto value_of = [](const ConfigKey& k, const Config& from) {
    return VisitConfigValue(k, from, [](const auto& v) -> json {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, HashAlgorithm>) {
        return std::string(HashAlgorithmName(v));
      } else {
        return v;
      }
    });
  };
  json out = json::object();
  for (const ConfigKey& k : ConfigSchema()) {
    json value = value_of(k, c);
    json* at = &out;
    for (absl::string_view part : absl::StrSplit(absl::string_view(k.section.data(), k.section.size()), '.')) {
      at = &(*at)[std::string(part)];
    }
    (*at)[std::string(k.name)] = std::move(value);
  }
  out["tiers"]["nvme"]["dirs"] = c.NvmeDirs();  // the directories in effect
  // The chain, each tier by its name with its kind and options (a later
  // entry of a kind has its own, which no section shows).
  for (const Config::LowerEntry& e : c.LowerChain()) {
    json& tier = out["tiers"]["lower"][e.name];
    tier["kind"] = e.kind;
    if (const LowerTierKind* k = FindLowerTierKind(e.kind)) {
      const Config options = c.OptionsOf(e);
      for (const ConfigKey& key : k->keys) tier[std::string(key.name)] = value_of(key, options);
    }
    if (e.kind == "nvme") tier["dirs"] = c.NvmeDirs();
  }
  out["tenants"] = std::move(tenants);
  return out;
}

StatusSnapshot Daemon::Snapshot() const {
  StatusSnapshot out;
  out.version = KVTIER_VERSION;
  out.pid = getpid();
  out.uptime_s = static_cast<double>(MonotonicNanos() - started_ns_) / 1e9;
  out.device = std::string(device_->name());
  out.hash = std::string(HashAlgorithmName(config_.hash));
  out.socket = config_.DataSocketPath();
  out.namespaces = namespaces_.live();
  out.indexed_blocks = store_->indexed_blocks();
  absl::flat_hash_map<std::string, uint64_t> sessions_per_tenant;
  for (const auto& [id, ls] : sessions_) {
    out.sessions.push_back({id, ls.session->Info()});
    ++sessions_per_tenant[out.sessions.back().info.tenant];
  }
  StatusSnapshot::Host& host = out.host;
  host.policy = config_.host_policy;
  host.high_watermark = config_.host_high_watermark;
  host.low_watermark = config_.host_low_watermark;
  for (TenantUsage& u : store_->Usage()) {
    host.capacity_bytes += u.capacity_bytes;
    host.used_bytes += u.used_bytes;
    host.blocks += u.blocks;
    host.pinned_blocks += u.pinned_blocks;
    host.evictions += u.evictions;
    host.stranded_bytes += u.stranded_bytes;
    StatusSnapshot::Tenant t{.sessions = sessions_per_tenant[u.name]};
    if (auto kv = kv_budgets_.find(u.name); kv != kv_budgets_.end()) {
      t.kv_caches = kv->second->caches();
      t.kv_cache_bytes = kv->second->bytes();
    }
    if (auto g = gpu_.find(u.name); g != gpu_.end()) t.gpu = g->second->usage();
    t.usage = std::move(u);
    out.tenants.push_back(std::move(t));
  }
  for (size_t i = 0; i < store_->lower_tier_count(); ++i) {
    const BlockTier* tier = store_->lower_tier(i);
    StatusSnapshot::Lower& l = out.lower.emplace_back();
    l.name = std::string(tier->name());
    l.kind = std::string(TierName(tier->kind()));
    l.shared = tier->shared();
    tier->VisitCounters([&l](std::string_view name, uint64_t v) { l.counters.emplace_back(std::string(name), v); });
    l.chain_position = i;
    l.policy = config_.nvme.policy;
    l.durable = tier->durable();
    l.io = tier->BlockStats();
    const TierUsage usage = store_->lower_usage(i);
    l.io.capacity_bytes = usage.capacity_bytes;
    l.io.used_bytes = usage.used_bytes;
    l.io.used_slots = usage.used_slots;
    l.blocks = store_->lower_blocks(i);
    l.hits = store_->lower_hits(i);
    l.health = tier->Health();
    if (i < lower_describe_.size() && lower_describe_[i]) lower_describe_[i](l);  // what only its kind shows
  }
  if (!gpu_.empty()) {
    // One GPU arena per tenant; summed here, per tenant under `tenants`.
    StatusSnapshot::Gpu& g = out.gpu.emplace(StatusSnapshot::Gpu{.device = std::string(device_->name())});
    for (const auto& [name, cache] : gpu_) {
      if (cache->health() != TierHealth::kHealthy) g.health = cache->health();
      const GpuCache::Usage u = cache->usage();
      g.usage.capacity_bytes += u.capacity_bytes;
      g.usage.used_bytes += u.used_bytes;
      g.usage.blocks += u.blocks;
      g.usage.pinned += u.pinned;
      g.usage.hits += u.hits;
      g.usage.promotions += u.promotions;
      g.usage.demotions += u.demotions;
      g.usage.evictions += u.evictions;
    }
  }
  out.cost_model = store_->cost().report();
  if (events_) {
    StatusSnapshot::Events e;
    e.stats = events_->stats();
    for (size_t i = 0; i < config_.tenants.size(); ++i) {
      const auto t = static_cast<uint16_t>(i);
      if (events_->Publishes(t)) {
        e.tenants.emplace_back(config_.tenants[i].name, events_->EndpointOf(t), events_->ReplayEndpointOf(t));
      }
    }
    out.events = std::move(e);
  }
  if (metrics_) {
    out.metrics_url = absl::StrCat("http://", config_.metrics_address, ":", metrics_->port(), "/metrics");
    out.metrics_port = metrics_->port();
  }
  out.stats = stats_;
  return out;
}

}  // namespace kvtier
