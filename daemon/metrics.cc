#include "daemon/metrics.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier {

nlohmann::json HistogramJson(const Histogram::Snapshot& h) {
  return {{"bounds_s", Histogram::kBounds}, {"counts", h.counts}, {"count", h.count}, {"sum_s", h.sum_s}};
}

namespace {

using nlohmann::json;

std::string Num(double v) {
  if (v == static_cast<double>(static_cast<int64_t>(v)) && v < 9e15 && v > -9e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  return absl::StrFormat("%.9g", v);
}

// Label values: escape backslash, quote and newline.
std::string Esc(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class Writer {
 public:
  // A family's HELP and TYPE, once; then its samples.
  void Family(const std::string& name, const char* type, const char* help) {
    out_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void Sample(const std::string& name, const std::string& labels, double v) {
    out_ << name;
    if (!labels.empty()) out_ << "{" << labels << "}";
    out_ << " " << Num(v) << "\n";
  }
  void Histogram(const std::string& name, const std::string& labels, const json& h) {
    uint64_t cumulative = 0;
    const json& bounds = h["bounds_s"];
    const json& counts = h["counts"];
    const std::string sep = labels.empty() ? "" : labels + ",";
    for (size_t i = 0; i < counts.size(); ++i) {
      cumulative += counts[i].get<uint64_t>();
      const std::string le = i < bounds.size() ? Num(bounds[i].get<double>()) : "+Inf";
      Sample(name + "_bucket", sep + "le=\"" + le + "\"", double(cumulative));
    }
    Sample(name + "_sum", labels, h["sum_s"].get<double>());
    Sample(name + "_count", labels, double(h["count"].get<uint64_t>()));
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

uint64_t U(const json& j, const char* key) { return j.contains(key) ? j[key].get<uint64_t>() : 0; }

}  // namespace

std::string PrometheusText(const json& s) {
  Writer w;
  const json& st = s["stats"];
  w.Family("kvtier_build_info", "gauge", "kvtierd's version (always 1).");
  w.Sample("kvtier_build_info", "version=\"" + Esc(s["version"].get<std::string>()) + "\",device=\"" +
                                    Esc(s["device"].get<std::string>()) + "\"",
           1);
  w.Family("kvtier_uptime_seconds", "gauge", "Seconds since kvtierd started.");
  w.Sample("kvtier_uptime_seconds", "", s["uptime_s"].get<double>());

  // Tiers.
  const std::tuple<const char*, const char*, const char*> tier_gauges[] = {
      {"kvtier_tier_capacity_bytes", "capacity_bytes", "Bytes each tier can hold."},
      {"kvtier_tier_used_bytes", "used_bytes", "Bytes in use in each tier."},
      {"kvtier_tier_blocks", "blocks", "Blocks held in each tier."}};
  for (const auto& [family, key, help] : tier_gauges) {
    w.Family(family, "gauge", help);
    for (const json& t : s["tiers"]) w.Sample(family, "tier=\"" + Esc(t["tier"]) + "\"", double(U(t, key)));
  }
  w.Family("kvtier_tier_healthy", "gauge", "1 when the tier is healthy.");
  for (const json& t : s["tiers"]) {
    w.Sample("kvtier_tier_healthy", "tier=\"" + Esc(t["tier"]) + "\"", t["health"] == "healthy" ? 1 : 0);
  }

  // Hits: per request and per reused token (a 16-token hit and a 16,000-token
  // hit count the same in the first, not in the second).
  w.Family("kvtier_lookups_total", "counter", "Leased lookups (an engine's commitment to a request).");
  w.Sample("kvtier_lookups_total", "", double(U(st, "lookups")));
  w.Family("kvtier_lookup_hits_total", "counter", "Leased lookups that hit at least one block.");
  w.Sample("kvtier_lookup_hits_total", "", double(U(st, "lookup_hits")));
  w.Family("kvtier_blocks_hit_total", "counter", "Blocks found by leased lookups, by the tier they were in.");
  w.Sample("kvtier_blocks_hit_total", "tier=\"host\"", double(U(st, "blocks_hit_host")));
  w.Sample("kvtier_blocks_hit_total", "tier=\"nvme\"", double(U(st, "blocks_hit_nvme")));
  w.Family("kvtier_blocks_missed_total", "counter", "Blocks leased lookups asked for and did not find.");
  w.Sample("kvtier_blocks_missed_total", "", double(U(st, "blocks_missed")));
  w.Family("kvtier_tokens_queried_total", "counter", "Tokens covered by the blocks leased lookups asked for.");
  w.Sample("kvtier_tokens_queried_total", "", double(U(st, "tokens_queried")));
  w.Family("kvtier_tokens_reused_total", "counter", "Tokens covered by the blocks leased lookups found.");
  w.Sample("kvtier_tokens_reused_total", "", double(U(st, "tokens_hit")));
  w.Family("kvtier_hit_rate", "gauge", "Share of leased lookups that hit (per request).");
  w.Sample("kvtier_hit_rate", "", st["hit_rate"].get<double>());
  w.Family("kvtier_reused_token_ratio", "gauge",
           "Share of queried tokens that were found (per token). Tokens count in full blocks only: a prompt's "
           "partial last block is never cached, so it is neither queried nor found.");
  w.Sample("kvtier_reused_token_ratio", "", st["reused_token_ratio"].get<double>());

  // The trust boundary: requests and connections refused by a limit.
  w.Family("kvtier_refused_total", "counter",
           "Requests and connections refused by a per-tenant limit or a rule of the trust boundary, by reason.");
  if (st.contains("refused")) {
    for (const auto& [reason, n] : st["refused"].items()) {
      w.Sample("kvtier_refused_total", "reason=\"" + Esc(reason) + "\"", double(n.get<uint64_t>()));
    }
  }

  w.Family("kvtier_log_lines_suppressed_total", "counter",
           "Log lines peers would have caused beyond limits.log_lines_per_s (dropped).");
  w.Sample("kvtier_log_lines_suppressed_total", "", double(U(st, "log_lines_suppressed")));
  w.Family("kvtier_namespaces_freed_total", "counter",
           "Namespaces freed because no session used them and no block of theirs was left.");
  w.Sample("kvtier_namespaces_freed_total", "", double(U(st, "namespaces_freed")));
  w.Family("kvtier_cascades_total", "counter",
           "Blocks the cascade moved one lower tier down (moved), or tried to and left in place (failed: a read or "
           "write failed, no room below, or the block was used meanwhile).");
  w.Sample("kvtier_cascades_total", "result=\"moved\"", double(U(st, "cascades")));
  w.Sample("kvtier_cascades_total", "result=\"failed\"", double(U(st, "cascades_failed")));

  // Bytes moved, per direction.
  uint64_t nvme_read = 0, nvme_written = 0, checksum = 0, nvme_evictions = 0;
  for (const json& t : s["tiers"]) {
    if (t["tier"] == "nvme") {
      nvme_read = U(t, "bytes_read");
      nvme_written = U(t, "bytes_written");
      checksum = U(t, "checksum_failures");
      nvme_evictions = U(t, "evictions");
    }
  }
  w.Family("kvtier_bytes_moved_total", "counter", "Block bytes moved, by direction.");
  w.Sample("kvtier_bytes_moved_total", "direction=\"engine_to_host\"", double(U(st, "bytes_stored")));
  w.Sample("kvtier_bytes_moved_total", "direction=\"host_to_engine\"", double(U(st, "bytes_loaded")));
  w.Sample("kvtier_bytes_moved_total", "direction=\"host_to_nvme\"", double(nvme_written));
  w.Sample("kvtier_bytes_moved_total", "direction=\"nvme_to_host\"", double(nvme_read));

  // Evictions by reason.
  const json& host = s["tiers"][0];
  w.Family("kvtier_evictions_total", "counter", "Blocks evicted, by tier and what became of them.");
  w.Sample("kvtier_evictions_total", "tier=\"host\",reason=\"demoted\"", double(U(host, "demotions")));
  w.Sample("kvtier_evictions_total", "tier=\"host\",reason=\"kept_on_nvme\"", double(U(host, "evictions_kept_on_nvme")));
  w.Sample("kvtier_evictions_total", "tier=\"host\",reason=\"dropped\"",
           double(U(host, "evictions_dropped") - std::min(U(host, "evictions_dropped"), U(host, "evictions_dropped_by_cost"))));
  w.Sample("kvtier_evictions_total", "tier=\"host\",reason=\"dropped_by_cost\"", double(U(host, "evictions_dropped_by_cost")));
  w.Sample("kvtier_evictions_total", "tier=\"nvme\",reason=\"dropped\"", double(nvme_evictions));
  // Host memory per block size: one size cannot use another's segments
  // until they are empty, so a shifting mix of sizes shows here first.
  w.Family("kvtier_host_block_size_bytes", "gauge",
           "Host arena bytes per tenant and slot size: in live blocks (used), in free slots only that size can use "
           "(stranded), in free slots of empty segments any size may take back (idle).");
  w.Family("kvtier_host_stranded_bytes", "gauge",
           "Free host arena bytes per tenant that only one block size can use (summed over sizes).");
  for (const json& t : s["tenants"]) {
    const std::string tenant = "tenant=\"" + Esc(t["name"].get<std::string>()) + "\"";
    w.Sample("kvtier_host_stranded_bytes", tenant, double(U(t, "host_stranded_bytes")));
    for (const json& c : t["host_by_block_size"]) {
      const std::string labels = tenant + ",slot_bytes=\"" + std::to_string(U(c, "slot_bytes")) + "\"";
      const uint64_t free_bytes = U(c, "free_bytes"), stranded = U(c, "stranded_bytes");
      w.Sample("kvtier_host_block_size_bytes", labels + ",state=\"used\"", double(U(c, "used_bytes")));
      w.Sample("kvtier_host_block_size_bytes", labels + ",state=\"stranded\"", double(stranded));
      w.Sample("kvtier_host_block_size_bytes", labels + ",state=\"idle\"",
               double(free_bytes - std::min(free_bytes, stranded)));
    }
  }
  w.Family("kvtier_host_segments_reclaimed_total", "counter",
           "Host segments of one block size emptied for another under pressure, and the evictions that took.");
  w.Sample("kvtier_host_segments_reclaimed_total", "", double(U(host, "segments_reclaimed")));
  w.Family("kvtier_evictions_for_other_size_total", "counter",
           "Host evictions that emptied a segment of one block size for another (part of kvtier_evictions_total).");
  w.Sample("kvtier_evictions_for_other_size_total", "", double(U(host, "evictions_for_other_size")));
  w.Family("kvtier_checksum_failures_total", "counter", "NVMe blocks whose checksum failed on read (served as misses).");
  w.Sample("kvtier_checksum_failures_total", "", double(checksum));
  w.Family("kvtier_stores_refused_total", "counter", "Stores refused, by reason.");
  w.Sample("kvtier_stores_refused_total", "reason=\"no_space\"", double(U(st, "store_refused_no_space")));
  w.Sample("kvtier_stores_refused_total", "reason=\"draining\"", double(U(st, "store_refused_draining")));

  // Sessions and leases.
  uint64_t leases = 0, pinned = 0;
  for (const json& x : s["sessions"]) {
    leases += U(x, "leases");
    pinned += U(x, "pinned_blocks");
  }
  w.Family("kvtier_sessions", "gauge", "Engine sessions attached.");
  w.Sample("kvtier_sessions", "", double(s["sessions"].size()));
  w.Family("kvtier_leases", "gauge", "Leases held by engines.");
  w.Sample("kvtier_leases", "", double(leases));
  w.Family("kvtier_pinned_blocks", "gauge", "Blocks pinned by leases.");
  w.Sample("kvtier_pinned_blocks", "", double(pinned));
  w.Family("kvtier_sessions_total", "counter", "Session ends and refusals, by outcome.");
  w.Sample("kvtier_sessions_total", "outcome=\"attached\"", double(U(st, "sessions_attached")));
  w.Sample("kvtier_sessions_total", "outcome=\"detached\"", double(U(st, "sessions_detached")));
  w.Sample("kvtier_sessions_total", "outcome=\"died\"", double(U(st, "sessions_closed_dead")));
  w.Sample("kvtier_sessions_total", "outcome=\"refused\"", double(U(st, "attach_refused")));
  w.Family("kvtier_protocol_errors_total", "counter", "Sessions closed for breaking the ring protocol.");
  w.Sample("kvtier_protocol_errors_total", "", double(U(st, "protocol_errors")));
  w.Family("kvtier_reloads_total", "counter", "SIGHUP config reloads, by result.");
  w.Sample("kvtier_reloads_total", "result=\"applied\"", double(U(st, "reloads")));
  w.Sample("kvtier_reloads_total", "result=\"refused\"", double(U(st, "reloads_failed")));

  // Cost model fit.
  const json& cm = s["cost_model"];
  w.Family("kvtier_cost_model_prefill_tflops", "gauge", "Prefill throughput the cost model uses (fitted, or its prior).");
  w.Sample("kvtier_cost_model_prefill_tflops", "", cm["prefill_tflops"].get<double>());
  w.Family("kvtier_cost_model_prefill_fitted", "gauge", "1 once the prefill fit rests on engines' reports.");
  w.Sample("kvtier_cost_model_prefill_fitted", "", cm["prefill_fitted"].get<bool>() ? 1 : 0);
  w.Family("kvtier_cost_model_prefill_r_squared", "gauge", "R squared of the prefill fit.");
  w.Sample("kvtier_cost_model_prefill_r_squared", "", cm["prefill_r_squared"].get<double>());
  w.Family("kvtier_cost_model_prefill_reports_total", "counter", "report_prefill calls the fit used.");
  w.Sample("kvtier_cost_model_prefill_reports_total", "", double(U(cm, "prefill_reports")));
  w.Family("kvtier_cost_model_nvme_read_gbps", "gauge", "NVMe read bandwidth the cost model uses.");
  w.Sample("kvtier_cost_model_nvme_read_gbps", "", cm["nvme_read_gbps"].get<double>());
  w.Family("kvtier_blocks_reported_recompute_total", "counter",
           "Blocks leased lookups found but reported as cheaper to recompute.");
  w.Sample("kvtier_blocks_reported_recompute_total", "", double(U(st, "blocks_recompute")));

  // Latency.
  if (s.contains("latency")) {
    const json& lat = s["latency"];
    w.Family("kvtier_op_latency_seconds", "histogram", "Requests from the session thread taking them to completion.");
    for (const auto& [op, h] : lat["ops"].items()) w.Histogram("kvtier_op_latency_seconds", "op=\"" + Esc(op) + "\"", h);
    w.Family("kvtier_transfer_latency_seconds", "histogram", "NVMe block transfers from submission to completion.");
    w.Histogram("kvtier_transfer_latency_seconds", "direction=\"nvme_to_host\"", lat["nvme_read"]);
    w.Histogram("kvtier_transfer_latency_seconds", "direction=\"host_to_nvme\"", lat["nvme_write"]);
  }
  return w.str();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address, uint16_t port,
                                                                    Snapshot snapshot, std::string bearer_token) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->server_ = std::make_unique<httplib::Server>();
  m->server_->Get("/metrics", [snapshot, token = std::move(bearer_token)](const httplib::Request& req,
                                                                         httplib::Response& res) {
    if (!token.empty()) {
      const std::string want = "Bearer " + token;
      const std::string got = req.get_header_value("Authorization");
      // Compared in time independent of where the first difference is.
      unsigned diff = got.size() != want.size();
      for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(i < got.size() ? got[i] ^ want[i] : 1);
      if (diff != 0) {
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer realm=\"kvtierd\"");
        res.set_content("kvtierd: metrics need the bearer token of metrics.token_file\n", "text/plain");
        return;
      }
    }
    std::optional<json> s = snapshot();
    if (!s) {
      res.status = 503;
      res.set_content("kvtierd is busy (draining or stopping)\n", "text/plain");
      return;
    }
    res.set_content(PrometheusText(*s), "text/plain; version=0.0.4; charset=utf-8");
  });
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a
  // second daemon would share the port instead of being told it is taken.
  m->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  m->server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("kvtierd: metrics at /metrics\n", "text/plain");
  });
  int bound = port == 0 ? m->server_->bind_to_any_port(address) : (m->server_->bind_to_port(address, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ":", port,
                                               " (in use, or not a local address); set metrics.port or "
                                               "metrics.enabled = false"));
  }
  m->port_ = static_cast<uint16_t>(bound);
  m->thread_ = std::thread([srv = m->server_.get()] { srv->listen_after_bind(); });
  return m;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvtier
