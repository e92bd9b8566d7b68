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
#include "ipc/admin_commands.h"
#include "ipc/admin_client.h"
#include "ipc/unix_socket.h"
#include "tiers/nvme_tier.h"
#include "core/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace kvtier {
namespace {

constexpr size_t kMaxAdminConns = 64;
constexpr size_t kMaxAdminRequest = 1u << 20;   // bytes of requests not yet answered
constexpr size_t kMaxAdminOutput = 64u << 20;   // bytes of answers the peer has not read

double Ratio(uint64_t a, uint64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b); }

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
    (void)!send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    spdlog::warn("event=admin_refused uid={} reason={}", peer.ok() ? static_cast<int64_t>(peer->uid) : -1,
                 allowed ? "too_many_connections" : "credentials");
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

nlohmann::json Daemon::AdminStatus(const nlohmann::json&) { return Status(); }

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
  if (cache_->lower_tier() == nullptr) return Error("kvtierd has no NVMe tier to flush to ([tiers.nvme] capacity = 0)");
  // Bounded: the loop (and the watchdog's pings) waits for it.
  const std::optional<int64_t> ms = ClampedInt(request, "timeout_ms", 10000, 1, 10000);
  if (!ms) {
    stats_.Refused(Refusal::kAdminBadRequest);
    return Error("bad request: timeout_ms must be a number of milliseconds");
  }
  const BlockCache::FlushResult f = cache_->FlushToNvme(std::chrono::milliseconds(*ms));
  spdlog::info("event=admin_flush written={} already_on_nvme={} failed={} timed_out={}", f.written,
               f.already_on_nvme, f.failed, f.timed_out);
  return json{{"ok", true},          {"written", f.written}, {"already_on_nvme", f.already_on_nvme},
              {"failed", f.failed},  {"timed_out", f.timed_out},
              {"journal", f.sync.ok() ? std::string("durable") : std::string(f.sync.message())}};
}

nlohmann::json Daemon::AdminEvict(const nlohmann::json& request) {
  using nlohmann::json;
  const std::string tenant = request.value("tenant", std::string());
  if (tenant.empty()) return Error("evict needs a tenant (kvtierctl evict --tenant NAME)");
  absl::StatusOr<uint64_t> n = cache_->EvictTenant(tenant);
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
  for (const BlockCache::BlockInfo& b : cache_->ListBlocks(tenant, limit, key ? &*key : nullptr)) {
    const auto it = ns.find(b.ns);
    json tiers = json::array();
    if (b.on_host) tiers.push_back("host");
    if (b.on_lower) tiers.push_back(std::string(cache_->lower_tier(b.lower)->name()));
    blocks.push_back({{"key", b.key.Hex()},
                      {"namespace", it == ns.end() ? std::string("?") : it->second.id.Hex()},
                      {"model", it == ns.end() ? std::string() : it->second.model_id},
                      {"tenant", cache_->tenant_name(b.tenant)},
                      {"tiers", tiers},
                      {"moving", b.moving},
                      {"pins", b.pins},
                      {"depth", b.depth == kUnknownDepth ? json(nullptr) : json(b.depth)},
                      {"tokens", b.tokens},
                      {"bytes", b.bytes}});
  }
  return json{{"ok", true}, {"blocks", blocks}, {"limit", limit}, {"indexed_blocks", cache_->indexed_blocks()}};
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
  json out = json::object();
  for (const ConfigKey& k : ConfigSchema()) {
    json value = VisitConfigValue(k, c, [](const auto& v) -> json {
      if constexpr (std::is_same_v<std::decay_t<decltype(v)>, HashAlgorithm>) {
        return std::string(HashAlgorithmName(v));
      } else {
        return v;
      }
    });
    json* at = &out;
    for (absl::string_view part : absl::StrSplit(absl::string_view(k.section.data(), k.section.size()), '.')) {
      at = &(*at)[std::string(part)];
    }
    (*at)[std::string(k.name)] = std::move(value);
  }
  out["tiers"]["nvme"]["dirs"] = c.NvmeDirs();  // the directories in effect
  out["tenants"] = std::move(tenants);
  return out;
}

nlohmann::json Daemon::Status() const {
  using nlohmann::json;
  json sessions = json::array();
  absl::flat_hash_map<std::string, uint64_t> sessions_per_tenant;
  for (const auto& [id, ls] : sessions_) {
    const SessionInfo info = ls.session->Info();
    ++sessions_per_tenant[info.tenant];
    sessions.push_back(json{{"id", id},
                            {"pid", info.identity.peer.pid},
                            {"uid", info.identity.peer.uid},
                            {"tenant", info.tenant},
                            {"client", info.identity.client_name},
                            {"namespace", ShortId(info.ns.id)},
                            {"model", info.ns.model_id},
                            {"block_bytes", info.ns.block_bytes},
                            {"block_tokens", info.ns.block_tokens},
                            {"ops", info.ops},
                            {"leases", info.leases},
                            {"pinned_blocks", info.pinned_blocks},
                            {"kv_caches", info.kv_caches},
                            {"attached_unix_s", info.identity.attached_unix_s}});
  }
  json tenants = json::array();
  uint64_t cap = 0, used = 0, blocks = 0, pinned = 0, evictions = 0, stranded = 0;
  for (const TenantUsage& u : cache_->Usage()) {
    json policies = json::array();
    for (const PolicyUsage& p : u.policies) {
      json scores = json::object();
      for (const auto& [name, score] : p.scores) scores[name] = score;
      policies.push_back(json{{"slot_bytes", p.slot_bytes},
                              {"blocks", p.blocks},
                              {"bookkeeping", p.bookkeeping},
                              {"leader", p.leader},
                              {"switches", p.switches},
                              {"scores", scores}});
    }
    json classes = json::array();
    for (const SlotAllocator::ClassUsage& c : u.classes) {
      classes.push_back(json{{"slot_bytes", c.slot_bytes},
                             {"segments", c.segments},
                             {"carved_bytes", c.carved_bytes},
                             {"used_bytes", c.used_bytes},
                             {"free_bytes", c.free_bytes()},
                             {"stranded_bytes", c.stranded_bytes}});
    }
    stranded += u.stranded_bytes;
    tenants.push_back(json{{"name", u.name},
                           {"policies", policies},
                           {"host_by_block_size", classes},
                           {"host_stranded_bytes", u.stranded_bytes},
                           {"sessions", sessions_per_tenant[u.name]},
                           {"host_capacity_bytes", u.capacity_bytes},
                           {"host_used_bytes", u.used_bytes},
                           {"blocks", u.blocks},
                           {"pinned_blocks", u.pinned_blocks},
                           {"evictions", u.evictions},
                           {"host_tokens", u.host_tokens},
                           {"kv_caches", kv_budgets_.contains(u.name) ? kv_budgets_.at(u.name)->caches() : 0},
                           {"kv_cache_bytes", kv_budgets_.contains(u.name) ? kv_budgets_.at(u.name)->bytes() : 0},
                           {"nvme_bytes", u.nvme_bytes},
                           {"nvme_tokens", u.nvme_tokens},
                           {"quota", json{{"host_tokens", u.quota.host_tokens},
                                          {"nvme_bytes", u.quota.nvme_bytes},
                                          {"nvme_tokens", u.quota.nvme_tokens}}}});
    cap += u.capacity_bytes;
    used += u.used_bytes;
    blocks += u.blocks;
    pinned += u.pinned_blocks;
    evictions += u.evictions;
  }
  const DaemonStats& s = stats_;
  json tiers = json::array();
  tiers.push_back(json{{"tier", "host"},
                       {"policy", config_.host_policy},
                       {"capacity_bytes", cap},
                       {"used_bytes", used},
                       {"blocks", blocks},
                       {"pinned_blocks", pinned},
                       {"evictions", evictions},
                       {"evictions_kept_on_nvme", s.evictions_kept_on_nvme.Get()},
                       {"demotions", s.demotions.Get()},
                       {"demotions_failed", s.demotions_failed.Get()},
                       {"evictions_dropped", s.evictions_dropped.Get()},
                       {"evictions_dropped_by_cost", s.evictions_dropped_by_cost.Get()},
                       {"evictions_background", s.evictions_background.Get()},
                       {"evictions_for_quota", s.evictions_for_quota.Get()},
                       {"stranded_bytes", stranded},
                       {"segments_reclaimed", s.host_segments_reclaimed.Get()},
                       {"evictions_for_other_size", s.evictions_for_other_size.Get()},
                       {"high_watermark", config_.host_high_watermark},
                       {"low_watermark", config_.host_low_watermark},
                       {"health", "healthy"}});
  // What every lower tier reports; the first adds what only it does.
  auto lower_tier_json = [&](size_t i) {
    const BlockTier* lower = cache_->lower_tier(i);
    const BlockTierStats b = lower->BlockStats();
    return json{{"tier", std::string(lower->name())},
                {"chain_position", i},
                {"policy", config_.nvme_policy},
                {"durable", lower->durable()},
                {"capacity_bytes", b.capacity_bytes},
                {"used_bytes", b.used_bytes},
                {"blocks", cache_->lower_blocks(i)},
                {"slots_used", b.used_slots},
                {"in_flight", b.in_flight},
                {"queued", b.queued},
                {"reads", b.reads},
                {"writes", b.writes},
                {"bytes_read", b.bytes_read},
                {"bytes_written", b.bytes_written},
                {"checksum_failures", b.checksum_failures},
                {"io_errors", b.io_errors},
                {"abandoned", b.abandoned},
                {"writes_refused", b.writes_refused},
                {"health", std::string(TierHealthName(lower->Health()))}};
  };
  if (BlockTier* lower = cache_->lower_tier()) {
    json tier = lower_tier_json(0);
    tier.update(json{{"hits_loaded", s.blocks_hit_nvme.Get()},
                     {"hits_reported_recompute", s.blocks_recompute.Get()},
                     {"evictions", s.nvme_evictions.Get()},
                     {"evictions_for_quota", s.nvme_evictions_for_quota.Get()},
                     {"demotions_refused_quota", s.demotions_refused_quota.Get()},
                     {"demotions_refused_fair_share", s.demotions_refused_fair_share.Get()},
                     {"promotions", s.promotions.Get()},
                     {"promotions_for_load", s.promotions_for_load.Get()},
                     {"promotions_failed", s.promotions_failed.Get()},
                     {"writes_through", s.writes_through.Get()},
                     {"demotions_for_calibration", s.demotions_for_calibration.Get()}});
    // What only the NVMe tier has: its engine, journal and recovery.
    if (const auto* nvme = dynamic_cast<const NvmeTier*>(lower)) {
      const NvmeStats n = nvme->Stats();
      tier.update(json{{"io_engine", n.io_engine},
                       {"io_engine_reason", n.io_engine_reason},
                       {"buffered_io", n.buffered},
                       {"queue_depth", n.queue_depth},
                       {"device_full", n.device_full},
                       {"calibration_reads", n.calibration_reads},
                       {"journal", json{{"records", n.journal_records},
                                        {"commits", n.journal_commits},
                                        {"bytes", n.journal_bytes},
                                        {"rewrites", n.journal_rewrites}}},
                       {"recovery", json{{"blocks", n.recovery.blocks},
                                         {"dropped", n.recovery.dropped + s.recovered_dropped.Get()},
                                         {"journal_bytes_cut", n.recovery.journal_bytes_cut},
                                         {"journal_records_cut", n.recovery.journal_records_cut},
                                         {"resized_from_segments", n.recovery.resized_from_segments},
                                         {"dropped_by_resize", n.recovery.dropped_by_resize},
                                         {"seconds", n.recovery.seconds}}}});
    }
    tiers.push_back(std::move(tier));
  }
  // Tiers below the first: what the cascade moved into them.
  for (size_t i = 1; i < cache_->lower_tier_count(); ++i) tiers.push_back(lower_tier_json(i));
  if (!gpu_.empty()) {
    // One GPU arena per tenant; summed here, per tenant under "tenants".
    GpuCache::Usage sum;
    TierHealth health = TierHealth::kHealthy;
    for (const auto& [name, g] : gpu_) {
      if (g->health() != TierHealth::kHealthy) health = g->health();
      const GpuCache::Usage u = g->usage();
      sum.capacity_bytes += u.capacity_bytes;
      sum.used_bytes += u.used_bytes;
      sum.blocks += u.blocks;
      sum.pinned += u.pinned;
      sum.hits += u.hits;
      sum.promotions += u.promotions;
      sum.demotions += u.demotions;
      sum.evictions += u.evictions;
      for (json& t : tenants) {
        if (t["name"] == name) t["gpu"] = json{{"capacity_bytes", u.capacity_bytes}, {"used_bytes", u.used_bytes},
                                               {"blocks", u.blocks}};
      }
    }
    tiers.push_back(json{{"tier", "gpu"},
                         {"device", std::string(device_->name())},
                         {"capacity_bytes", sum.capacity_bytes},
                         {"used_bytes", sum.used_bytes},
                         {"blocks", sum.blocks},
                         {"pinned_blocks", sum.pinned},
                         {"hits", sum.hits},
                         {"promotions", sum.promotions},
                         {"demotions", sum.demotions},
                         {"evictions", sum.evictions},
                         {"health", std::string(TierHealthName(health))}});
  }
  json stats{{"lookups", s.lookups.Get()},
             {"lookup_hits", s.lookup_hits.Get()},
             {"hit_rate", Ratio(s.lookup_hits.Get(), s.lookups.Get())},
             {"probes", s.probes.Get()},
             {"blocks_queried", s.blocks_queried.Get()},
             {"blocks_hit", s.blocks_hit.Get()},
             {"blocks_hit_host", s.blocks_hit.Get() - s.blocks_hit_nvme.Get()},
             {"blocks_hit_nvme", s.blocks_hit_nvme.Get()},
             {"blocks_missed", s.blocks_queried.Get() - s.blocks_hit.Get()},
             {"block_hit_rate", Ratio(s.blocks_hit.Get(), s.blocks_queried.Get())},
             {"tokens_queried", s.tokens_queried.Get()},
             {"tokens_hit", s.tokens_hit.Get()},
             {"reused_token_ratio", Ratio(s.tokens_hit.Get(), s.tokens_queried.Get())},
             {"stores", s.stores.Get()},
             {"blocks_stored", s.blocks_stored.Get()},
             {"bytes_stored", s.bytes_stored.Get()},
             {"blocks_already_present", s.blocks_already_present.Get()},
             {"store_aborts", s.store_aborts.Get()},
             {"store_refused_no_space", s.store_refused_no_space.Get()},
             {"loads", s.loads.Get()},
             {"blocks_loaded", s.blocks_loaded.Get()},
             {"bytes_loaded", s.bytes_loaded.Get()},
             {"load_failures", s.load_failures.Get()},
             {"prefetches", s.prefetches.Get()},
             {"blocks_recompute", s.blocks_recompute.Get()},
             {"prefill_reports", s.prefill_reports.Get()},
             {"prefill_reports_refused", s.prefill_reports_refused.Get()},
             {"evictions", s.evictions.Get()},
             {"invalidations", s.invalidations.Get()},
             {"kv_registrations", s.kv_registrations.Get()},
             {"kv_registrations_refused", s.kv_registrations_refused.Get()},
             {"device_stores", s.device_stores.Get()},
             {"device_blocks_stored", s.device_blocks_stored.Get()},
             {"device_loads", s.device_loads.Get()},
             {"device_blocks_loaded", s.device_blocks_loaded.Get()},
             {"device_errors", s.device_errors.Get()},
             {"reloads", s.reloads.Get()},
             {"reloads_failed", s.reloads_failed.Get()},
             {"store_refused_draining", s.store_refused_draining.Get()},
             {"sessions_attached", s.sessions_attached.Get()},
             {"sessions_detached", s.sessions_detached.Get()},
             {"attach_refused", s.attach_refused.Get()},
             {"sessions_closed_dead", s.sessions_closed_dead.Get()},
             {"protocol_errors", s.protocol_errors.Get()}};
  stats["log_lines_suppressed"] = s.log_lines_suppressed.Get();
  stats["namespaces_freed"] = s.namespaces_freed.Get();
  stats["cascades"] = s.cascades.Get();
  stats["cascades_failed"] = s.cascades_failed.Get();
  stats["lower_evictions"] = s.lower_evictions.Get();  // from tiers below the first
  json refused = json::object();
  for (size_t i = 0; i < s.refused.size(); ++i) refused[kRefusalNames[i]] = s.refused[i].Get();
  stats["refused"] = refused;
  json ops = json::object();
  for (size_t op = 1; op < stats_.op_latency.size(); ++op) ops[ipc::kOpcodes[op].name] = HistogramJson(stats_.op_latency[op].Get());
  const json latency = {{"ops", ops},
                        {"nvme_read", HistogramJson(stats_.nvme_read_latency.Get())},
                        {"nvme_write", HistogramJson(stats_.nvme_write_latency.Get())},
                        {"lower_read", HistogramJson(stats_.lower_read_latency.Get())}};
  return json{{"ok", true},
              {"version", KVTIER_VERSION},
              {"pid", getpid()},
              {"uptime_s", static_cast<double>(MonotonicNanos() - started_ns_) / 1e9},
              {"device", std::string(device_->name())},
              {"hash", std::string(HashAlgorithmName(config_.hash))},
              {"socket", config_.DataSocketPath()},
              {"namespaces", namespaces_.live()},
              {"indexed_blocks", cache_->indexed_blocks()},
              {"sessions", sessions},
              {"tenants", tenants},
              {"tiers", tiers},
              {"cost_model", cache_->cost().ToJson()},
              {"metrics", metrics_ ? json{{"enabled", true},
                                          {"url", absl::StrCat("http://", config_.metrics_address, ":",
                                                               metrics_->port(), "/metrics")},
                                          {"port", metrics_->port()}}
                                   : json{{"enabled", false}}},
              {"latency", latency},
              {"stats", stats}};
}

}  // namespace kvtier
