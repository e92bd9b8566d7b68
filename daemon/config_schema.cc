// SPDX-License-Identifier: Apache-2.0
#include "daemon/config_schema.h"

#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/block_key.h"
#include "daemon/lower_kinds.h"

namespace kvtier {
namespace {

using T = ConfigType;
constexpr double kU32 = 4294967295.0;

// One row per key, the lower tiers' kinds' apart (each kind registers its
// own, lower_kinds.h). Defaults live in Config's member initialisers.
const ConfigKey kKeys[] = {
    // [daemon]
    {"daemon", "run_dir", T::kString, Field<&Config::run_dir>(), 0, 0, false, "sockets: kvtierd.sock, kvtierd-admin.sock"},
    {"daemon", "data_dir", T::kString, Field<&Config::data_dir>(), 0, 0, false, "persistent data (the NVMe tier's default folder)"},
    {"daemon", "log_level", T::kString, Field<&Config::log_level>(), 0, 0, true,
     "trace, debug, info, warn, error, critical, off"},
    {"daemon", "device", T::kString, Field<&Config::device>(), 0, 0, false, "auto (CUDA when a device answers), cuda, sim"},
    {"daemon", "hash", T::kHash, Field<&Config::hash>(), 0, 0, false, "block-key hash; xxh3-128 only with a single tenant"},
    {"daemon", "drain_timeout_ms", T::kInt, Field<&Config::drain_timeout_ms>(), 0, 600000, true,
     "SIGTERM: finish open stores, write host blocks to NVMe, within this"},
    // [metrics]
    {"metrics", "enabled", T::kBool, Field<&Config::metrics_enabled>(), 0, 0, false,
     "Prometheus text at http://address:port/metrics"},
    {"metrics", "address", T::kString, Field<&Config::metrics_address>(), 0, 0, false, "where to listen; keep it local"},
    {"metrics", "port", T::kInt, Field<&Config::metrics_port>(), 0, 65535, false, "0: any free port (kvtierctl status shows it)"},
    {"metrics", "token_file", T::kString, Field<&Config::metrics_token_file>(), 0, 0, false,
     "a file with a bearer token scrapes must send; empty: any local user may scrape"},
    {"metrics", "per_tenant", T::kBool, Field<&Config::metrics_per_tenant>(), 0, 0, false,
     "per-tenant series and cluster node addresses even without token_file (every local user sees them)"},
    // [ipc]
    {"ipc", "ring_entries", T::kInt, Field<&Config::ring_entries>(), 2, 65536, false,
     "request/completion ring records per session"},
    {"ipc", "scratch_bytes", T::kBytes, Field<&Config::scratch_bytes>(), 0, 0, false,
     "per-session shared space for keys and results"},
    {"ipc", "max_keys_per_op", T::kInt, Field<&Config::max_keys_per_op>(), 1, 1 << 24, false, "larger batches are refused"},
    {"ipc", "spin_us", T::kInt, Field<&Config::spin_us>(), 0, 1000000, false,
     "busy-poll this long after a request before sleeping"},
    {"ipc", "max_sessions", T::kInt, Field<&Config::max_sessions>(), 1, 65536, false, "attaches beyond this are refused"},
    {"ipc", "max_leases_per_session", T::kInt, Field<&Config::max_leases_per_session>(), 1, 1 << 24, false,
     "leased lookups beyond this fail until some are released"},
    // [limits]
    {"limits", "sessions_per_tenant", T::kInt, Field<&Config::limit_sessions_per_tenant>(), 0, 65536, false,
     "0: an equal share, ipc.max_sessions / tenants"},
    {"limits", "kv_caches_per_tenant", T::kInt, Field<&Config::limit_kv_caches_per_tenant>(), 1, 65536, false,
     "registered engine KV caches, all sessions together"},
    {"limits", "kv_cache_bytes_per_tenant", T::kBytes, Field<&Config::limit_kv_cache_bytes_per_tenant>(), 0, 0, false,
     "their memory mapped into kvtierd"},
    {"limits", "leased_blocks_per_session", T::kInt, Field<&Config::limit_leased_blocks_per_session>(), 1, 1 << 26, false,
     "blocks held by a session's leases at once"},
    {"limits", "pending_connections", T::kInt, Field<&Config::limit_pending_connections>(), 1, 65536, false,
     "connections that have not attached yet, in all"},
    {"limits", "pending_connections_per_uid", T::kInt, Field<&Config::limit_pending_connections_per_uid>(), 1, 65536, false,
     "... from one local user"},
    {"limits", "namespaces_per_tenant", T::kInt, Field<&Config::limit_namespaces_per_tenant>(), 1, 1 << 24, false,
     "distinct namespaces (model revisions, adapters) per tenant"},
    {"limits", "log_lines_per_s", T::kInt, Field<&Config::limit_log_lines_per_s>(), 0, 1000000, false,
     "attach/detach/refusal log lines per tenant or uid; 0: no limit"},
    // [tiers.host]
    {"tiers.host", "capacity", T::kBytes, Field<&Config::host_capacity>(), 0, 0, false, "per-tenant shared host arena"},
    {"tiers.host", "prefault", T::kBool, Field<&Config::host_prefault>(), 0, 0, false, "fault the arena in at start"},
    {"tiers.host", "policy", T::kString, Field<&Config::host_policy>(), 0, 0, false,
     "adaptive (follows the best of the others), arc, arc-cutoff, holds, lru, s3fifo, s3fifo-deep, tinylfu"},
    {"tiers.host", "high_watermark", T::kDouble, Field<&Config::host_high_watermark>(), 0.05, 1, true,
     "above this share of the arena, evict in the background"},
    {"tiers.host", "low_watermark", T::kDouble, Field<&Config::host_low_watermark>(), 0.05, 1, true,
     "... down to this share (1 and 1: only when full)"},
    // [tiers.gpu]
    {"tiers.gpu", "capacity", T::kBytes, Field<&Config::gpu_capacity>(), 0, 0, false,
     "per-tenant device memory holding copies of its blocks; 0: off"},
    // [cost_model]
    {"cost_model", "model_config", T::kString, Field<&Config::cost_model_config>(), 0, 0, false,
     "a Hugging Face config.json; empty: the Llama-3.1-8B shape"},
    {"cost_model", "prefill_tflops", T::kDouble, Field<&Config::cost_prefill_tflops>(), 0.001, 1e6, false,
     "prefill throughput until engines report their own"},
    {"cost_model", "nvme_read_gbps", T::kDouble, Field<&Config::cost_nvme_read_gbps>(), 0.001, 1e4, false,
     "NVMe read speed until the daemon has measured its own"},
    {"cost_model", "nvme_read_latency_us", T::kDouble, Field<&Config::cost_nvme_read_latency_us>(), 0, 1e7, false,
     "NVMe read latency, likewise"},
    {"cost_model", "decide", T::kBool, Field<&Config::cost_decide>(), 0, 0, true,
     "report NVMe hits slower than recompute as recompute; drop such evictions"},
    // [events]
    {"events", "enabled", T::kBool, Field<&Config::events_enabled>(), 0, 0, false,
     "publish which blocks each tenant holds, in vLLM's KV-event format (ZeroMQ + msgpack)"},
    {"events", "endpoint", T::kString, Field<&Config::events_endpoint>(), 0, 0, false,
     "PUB endpoint per tenant, {tenant} expands; empty: ipc://<run_dir>/kvtier-events-{tenant}.sock"},
    {"events", "replay_endpoint", T::kString, Field<&Config::events_replay_endpoint>(), 0, 0, false,
     "ROUTER endpoint for missed batches; empty: ipc://<run_dir>/kvtier-replay-{tenant}.sock; off: none"},
    {"events", "tenants", T::kStringList, Field<&Config::events_tenants>(), 0, 0, false, "tenants that publish; []: all"},
    {"events", "topic", T::kString, Field<&Config::events_topic>(), 0, 0, false, "first frame of every message (vLLM's topic)"},
    {"events", "block_hash", T::kString, Field<&Config::events_block_hash>(), 0, 0, false,
     "int64 (a key's low 64 bits, as vLLM sends by default) or bytes (all 32)"},
    {"events", "batch_ms", T::kInt, Field<&Config::events_batch_ms>(), 1, 10000, false, "events gathered this long form a batch"},
    {"events", "buffer_batches", T::kInt, Field<&Config::events_buffer_batches>(), 1, 1000000, false,
     "batches kept per tenant for replay"},
    {"events", "buffer_bytes", T::kBytes, Field<&Config::events_buffer_bytes>(), 0, 0, false,
     "and at most this many bytes of them"},
    {"events", "max_pending", T::kInt, Field<&Config::events_max_pending>(), 1, 100000000, false,
     "a tenant's events waiting to be sent; past it they are dropped, counted, and its sequence skips one"},
    {"events", "max_connections", T::kInt, Field<&Config::events_max_connections>(), 1, 65536, false,
     "peers on one tenant's event sockets (its publisher process's descriptor limit)"},
    {"events", "publisher_memory", T::kBytes, Field<&Config::events_publisher_memory>(), 0, 0, false,
     "address space of one tenant's publisher process; past it the process ends and restarts"},
    {"events", "replays_per_s", T::kInt, Field<&Config::events_replays_per_s>(), 1, 100000, false,
     "replay requests one tenant's publisher serves a second; more are dropped and counted"},
    {"events", "replay_max_batches", T::kInt, Field<&Config::events_replay_max_batches>(), 1, 1000000, false,
     "batches one replay request gets; ask again from the next for more"},
    // [sim]
    {"sim", "bandwidth", T::kBytes, Field<&Config::sim_bandwidth>(), 0, 0, false,
     "simulated device copy bandwidth, bytes/s (0: unlimited)"},
};

// {"", ""}: where the lower tiers' kinds' sections go.
const ConfigSection kSections[] = {
    {"daemon",
     "# run_dir default: $RUNTIME_DIRECTORY, /run/kvtier for root, else $XDG_RUNTIME_DIR/kvtier\n"
     "# or /tmp/kvtier-$UID. data_dir default: $STATE_DIRECTORY, /var/lib/kvtier for root, else\n"
     "# $XDG_STATE_HOME/kvtier or ~/.local/state/kvtier.\n"},
    {"metrics", ""},
    {"ipc", ""},
    {"limits",
     "# Per-tenant and per-peer bounds (docs/security.md); refusals count in\n"
     "# stats.refused and kvtier_refused_total.\n"},
    {"tiers.host", ""},
    {"tiers.gpu", ""},
    {"", ""},  // the lower tiers' kinds, each with its section (lower_kinds.h)
    {"cost_model",
     "# What a block is worth: prefill time of its tokens at its position, for this\n"
     "# model shape, at a throughput fitted to the engines' report_prefill calls.\n"},
    {"events",
     "# KV events for cache-aware routers (vLLM's format): off by default. Each tenant's\n"
     "# events go to its own endpoint; an ipc socket only the tenant's uid/gid may open.\n"},
    {"sim", ""},
};

const TenantKey kTenantKeys[] = {
    {"name", T::kString, &TenantConfig::name, "", false, "1..64 characters, unique"},
    {"uids", T::kIntList, &TenantConfig::uids, "[]", false, "peers with one of these uids belong here"},
    {"gids", T::kIntList, &TenantConfig::gids, "[]", false, "or with one of these primary gids"},
    {"salt", T::kString, &TenantConfig::salt, "\"\"", false, "secret mixed into namespace ids; never logged"},
    {"host_bytes", T::kBytes, &TenantConfig::host_bytes, "0", false, "0: tiers.host.capacity"},
    {"host_tokens", T::kInt, &TenantConfig::host_tokens, "0", true, "quota: tokens resident in its arena (0: none)"},
    {"nvme_bytes", T::kBytes, &TenantConfig::nvme_bytes, "0", true, "quota: bytes on the shared NVMe tier (0: none)"},
    {"nvme_tokens", T::kInt, &TenantConfig::nvme_tokens, "0", true, "quota: tokens on the shared NVMe tier (0: none)"},
    {"remote_user", T::kString, &TenantConfig::remote_user, "\"\"", false, "its ACL user on the remote tier's cluster"},
    {"remote_password_file", T::kString, &TenantConfig::remote_password_file, "\"\"", false,
     "a file (mode 0600) holding that user's password; never logged"},
    {"remote_seeds", T::kStringList, &TenantConfig::remote_seeds, "[]", false,
     "its own cluster (host:port), isolated from the others' memory; empty: tiers.remote.seeds"},
    {"remote_budget", T::kBytes, &TenantConfig::remote_budget, "0", false,
     "bytes its blocks may take in the shared cluster, all nodes together; 0: tiers.remote.tenant_budget"},
    {"remote_key_file", T::kString, &TenantConfig::remote_key_file, "\"\"", false,
     "a file (mode 0600) of keys sealing its remote values: openssl rand -hex 32, current first; never logged"},
};

std::string Quoted(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

std::string TomlBytes(uint64_t b) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  if (b == 0) return "0";
  for (const auto& [unit, name] : kUnits) {
    if (b % unit == 0) return absl::StrCat("\"", b / unit, name, "\"");
  }
  return absl::StrCat(b);
}

std::string TomlDouble(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::span<const ConfigSection> ConfigSections() {
  static const std::vector<ConfigSection> sections = [] {
    std::vector<ConfigSection> out;
    for (const ConfigSection& s : kSections) {
      if (!s.name.empty()) {
        out.push_back(s);
        continue;
      }
      for (const LowerTierKind& k : LowerTierKinds()) out.push_back({k.section, k.preamble});
    }
    return out;
  }();
  return sections;
}

std::span<const ConfigKey> ConfigSchema() {
  // Section by section, in file order: the kinds' rows where their sections are.
  static const std::vector<ConfigKey> keys = [] {
    std::vector<ConfigKey> out;
    for (const ConfigSection& s : ConfigSections()) {
      for (const ConfigKey& k : kKeys) {
        if (k.section == s.name) out.push_back(k);
      }
      for (const LowerTierKind& kind : LowerTierKinds()) {
        if (kind.section != s.name) continue;
        for (const ConfigKey& k : kind.keys) {
          if (k.section == s.name) out.push_back(k);
        }
      }
    }
    // A row whose section is not a section of the file would be lost
    // silently: it is a bug in a table, caught by every test that reads the schema.
    size_t rows = std::size(kKeys);
    for (const LowerTierKind& kind : LowerTierKinds()) rows += kind.keys.size();
    if (out.size() != rows) {
      std::fprintf(stderr, "kvtier: %zu config rows have no section of their own\n", rows - out.size());
      std::abort();
    }
    return out;
  }();
  return keys;
}
std::span<const TenantKey> TenantSchema() { return kTenantKeys; }

std::string ConfigValueToml(const ConfigKey& k, const Config& c) {
  return VisitConfigValue(k, c, [&](const auto& v) -> std::string {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::string>) {
      return Quoted(v);
    } else if constexpr (std::is_same_v<V, bool>) {
      return v ? "true" : "false";
    } else if constexpr (std::is_same_v<V, double>) {
      return TomlDouble(v);
    } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
      std::vector<std::string> q;
      for (const std::string& s : v) q.push_back(Quoted(s));
      return absl::StrCat("[", absl::StrJoin(q, ", "), "]");
    } else if constexpr (std::is_same_v<V, HashAlgorithm>) {
      return Quoted(HashAlgorithmName(v));
    } else {
      return k.type == ConfigType::kBytes ? TomlBytes(v) : absl::StrCat(v);
    }
  });
}

bool ConfigValuesDiffer(const ConfigKey& k, const Config& a, const Config& b) {
  return std::visit(
      [&](auto ref) { return !(ref.at(const_cast<Config&>(a)) == ref.at(const_cast<Config&>(b))); }, k.field);
}

void CopyConfigValue(const ConfigKey& k, const Config& from, Config* to) {
  std::visit([&](auto ref) { ref.at(*to) = ref.at(const_cast<Config&>(from)); }, k.field);
}

}  // namespace kvtier
