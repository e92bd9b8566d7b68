// SPDX-License-Identifier: Apache-2.0
// kvtierctl: inspect a running kvtierd over its admin socket, and plan
// capacity without one.
//
// Exit codes: 0 ok, 1 kvtierd unreachable, 2 usage error, 3 kvtierd answered
// with an error or with an answer kvtierctl cannot read, 4 an input file
// (model config, trace, kvtierd config) is missing or wrong.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <iostream>
#include <thread>

#include "core/cli_parse.h"
#include "core/fmt_absl.h"
#include "core/paths.h"
#include "core/units.h"
#include "ipc/admin_commands.h"
#include "ipc/admin_client.h"
#include "tools/common/man_page.h"
#include "tools/common/table.h"
#include "tools/kvtierctl/capacity.h"

namespace {

using nlohmann::json;
using kvtier::tools::Fixed;
using kvtier::tools::Table;

// The daemon's answer is untrusted input: a fake daemon on the socket, or a
// newer or broken one, may send any JSON. nlohmann's get<>() throws on a
// value of another type, and operator[] on a const object asserts on a
// missing key (and throws on a non-object): kvtierctl died of an uncaught
// exception. Everything here reads through these, which never throw: a
// missing or wrong-typed field prints as "-" (or counts as 0), and a string
// goes through Printable() before it reaches the terminal.
const json& kNull = *new json();
const json& At(const json& j, std::string_view key) {
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}
const json& At(const json& j, size_t i) { return j.is_array() && i < j.size() ? j[i] : kNull; }
// The array, or an empty one (iterating a number yields the number itself).
const json& List(const json& j) {
  static const json& empty = *new json(json::array());
  return j.is_array() ? j : empty;
}
uint64_t U64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() < 1.8e19) return uint64_t(v.get<double>());
  return 0;
}
double Dbl(const json& v) { return v.is_number() ? v.get<double>() : 0; }
bool Bool(const json& v) { return v.is_boolean() && v.get<bool>(); }
// A string as it is, made printable; anything else as JSON; "-" when absent.
std::string Str(const json& v) {
  if (v.is_null()) return "-";
  return kvtier::tools::Printable(v.is_string() ? v.get_ref<const std::string&>() : v.dump());
}
std::string Bytes(const json& v) { return v.is_number() ? kvtier::FormatBytes(U64(v)) : "-"; }
std::string Num(const json& v) { return v.is_number_float() ? Fixed(v.get<double>(), 3) : Str(v); }
std::string Num(const json& j, std::string_view key) { return Num(At(j, key)); }
std::string Str(const json& j, std::string_view key) { return Str(At(j, key)); }
std::string Bytes(const json& j, std::string_view key) { return Bytes(At(j, key)); }

void PrintTenants(const json& s) {
  Table tenants({"TENANT", "SESSIONS", "BLOCKS", "PINNED", "HOST USED", "HOST CAPACITY", "STRANDED", "HOST TOKENS",
                 "NVME USED", "EVICTING BY"});
  // Host memory per block size, shown once a tenant holds more than one.
  Table sizes({"TENANT", "SLOT SIZE", "SEGMENTS", "USED", "FREE", "STRANDED"});
  bool mixed = false;
  // "used / quota" where a quota is set.
  auto of = [](const json& used, const json& quota, bool bytes) {
    std::string s = bytes ? Bytes(used) : Num(used);
    if (U64(quota) != 0) s += " / " + (bytes ? Bytes(quota) : Num(quota));
    return s;
  };
  for (const json& t : List(At(s, "tenants"))) {
    // Which expert evicts, per block size the tenant holds ("-": none yet).
    std::string by;
    for (const json& p : List(At(t, "policies"))) {
      if (!by.empty()) by += ", ";
      by += Str(p, "leader") + " (" + Bytes(p, "slot_bytes") + " blocks)";
    }
    const json& q = At(t, "quota");
    std::string nvme = of(At(t, "nvme_bytes"), At(q, "nvme_bytes"), true);
    if (U64(At(q, "nvme_tokens")) != 0) {
      nvme += ", " + of(At(t, "nvme_tokens"), At(q, "nvme_tokens"), false) + " tokens";
    }
    tenants.AddRow({Str(t, "name"), Num(t, "sessions"), Num(t, "blocks"), Num(t, "pinned_blocks"),
                    Bytes(t, "host_used_bytes"), Bytes(t, "host_capacity_bytes"), Bytes(t, "host_stranded_bytes"),
                    of(At(t, "host_tokens"), At(q, "host_tokens"), false), nvme, by.empty() ? "-" : by});
    const json& classes = List(At(t, "host_by_block_size"));
    if (classes.size() > 1) mixed = true;
    for (const json& c : classes) {
      sizes.AddRow({Str(t, "name"), Bytes(c, "slot_bytes"), Num(c, "segments"), Bytes(c, "used_bytes"),
                    Bytes(c, "free_bytes"), Bytes(c, "stranded_bytes")});
    }
  }
  tenants.Print(std::cout);
  if (mixed) {
    std::cout << "\nhost memory by block size (stranded: free slots only that size can use; whole segments of a "
                 "cold size go to a size that needs room)\n";
    sizes.Print(std::cout);
  }
}

void PrintSessions(const json& s) {
  if (List(At(s, "sessions")).empty()) {
    std::cout << "no sessions attached\n";
  } else {
    Table sessions(
        {"SESSION", "PID", "UID", "TENANT", "CLIENT", "MODEL", "NAMESPACE", "OPS", "LEASES", "PINNED", "KV CACHES"});
    for (const json& x : List(At(s, "sessions"))) {
      sessions.AddRow({Num(x, "id"), Num(x, "pid"), Num(x, "uid"), Str(x, "tenant"), Str(x, "client"),
                       Str(x, "model"), Str(x, "namespace"), Num(x, "ops"), Num(x, "leases"),
                       Num(x, "pinned_blocks"), Num(x, "kv_caches")});
    }
    sessions.Print(std::cout);
  }
}

// A histogram of the status JSON ({bounds_s, counts, count}): the bound of
// the bucket that holds quantile q, as text ("-" when empty).
std::string HistogramQuantile(const json& h, double q) {
  const uint64_t count = U64(At(h, "count"));
  if (count == 0) return "-";
  const json& bounds = List(At(h, "bounds_s"));
  const json& counts = List(At(h, "counts"));
  if (bounds.empty()) return "-";
  uint64_t seen = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    seen += U64(counts[i]);
    if (double(seen) >= q * double(count)) {
      return i < bounds.size() ? "<= " + Fixed(Dbl(bounds[i]) * 1e3, 3) + " ms" : "> " + Fixed(Dbl(bounds.back()) * 1e3, 3) + " ms";
    }
  }
  return "-";
}

// The shared tier's own figures (a tier object with a "remote" member):
// its cluster as this daemon sees it, per node; probes, publishes and
// misses by cause.
void PrintRemote(const json& t, bool nodes = true) {
  const json& r = At(t, "remote");
  if (!r.is_object()) return;
  const json& c = At(r, "cluster");
  const json& m = At(r, "misses");
  std::cout << "remote tier: write policy " << Str(r, "write_policy") << ", probe budget "
            << Num(r, "probe_budget_us") << " us, " << Num(c, "slots_covered") << " of 16384 slots covered, "
            << Str(t, "health") << "\n"
            << "  probes " << Num(r, "probes") << " (blocks asked " << Num(r, "probe_blocks") << ", found "
            << Num(r, "probe_found") << ", late " << Num(r, "probes_late") << ", busy " << Num(r, "probes_busy")
            << ", throttled " << Num(r, "probes_throttled") << ", median "
            << HistogramQuantile(At(r, "probe_latency"), 0.5) << ")  hits loaded " << Num(r, "hits_loaded")
            << ", reads " << Num(t, "reads") << " (median "
            << HistogramQuantile(At(r, "read_latency"), 0.5) << ")\n"
            << "  published " << Num(r, "publishes") << " (skipped " << Num(r, "publishes_skipped") << ", failed "
            << Num(r, "publishes_failed") << "), writes avoided (already there) " << Num(r, "writes_avoided")
            << ", adoptions refused (records_per_tenant) " << Num(r, "adoptions_refused") << "\n"
            << "  misses: not found " << Num(m, "not_found") << ", bad value " << Num(m, "bad_value") << " (forged "
            << Num(m, "forged") << ")"
            << ", unavailable " << Num(m, "unavailable") << ", past deadline " << Num(m, "deadline") << ", other "
            << Num(m, "other") << "\n"
            << "  budgets: evicted " << Num(At(r, "budget"), "evictions") << " (tenants' own, least recently used), "
            << "refused " << Num(At(r, "budget"), "refused") << ", ledger failures " << Num(At(r, "budget"), "failures")
            << "\n"
            << "  redirections: MOVED " << Num(c, "moved") << ", ASK " << Num(c, "ask") << ", TRYAGAIN "
            << Num(c, "tryagain") << ", CLUSTERDOWN " << Num(c, "clusterdown") << "; slot map refreshes "
            << Num(c, "refreshes") << " (failed " << Num(c, "refresh_failures") << "); AUTH refused "
            << Num(c, "auth_failures") << " (tenants refused now: " << Num(c, "tenants_refused") << ")\n";
  if (!nodes) return;
  Table n({"NODE", "UP", "SLOTS", "COMMANDS", "ERRORS", "CONNECTS"});
  for (const json& x : List(At(r, "nodes"))) {
    // "-": it serves no slots (a replica, or out of the map), so nothing goes to it.
    const bool idle = U64(At(x, "slots")) == 0 && !Bool(At(x, "connected"));
    n.AddRow({Str(x, "address"), idle ? "-" : Bool(At(x, "connected")) ? "yes" : "no", Num(x, "slots"), Num(x, "commands"),
              Num(x, "errors"), Num(x, "connects")});
  }
  n.Print(std::cout);
}

void PrintRemotes(const json& s, bool nodes = true) {
  for (const json& t : List(At(s, "tiers"))) {
    if (!At(t, "remote").is_object()) continue;
    std::cout << "\n";
    PrintRemote(t, nodes);
  }
}

void PrintStatus(const json& s) {
  std::cout << "kvtierd " << Str(s, "version") << "  pid " << Num(s, "pid") << "  up "
            << kvtier::tools::Duration(Dbl(At(s, "uptime_s"))) << "  device " << Str(s, "device") << "  hash "
            << Str(s, "hash") << "\n"
            << "socket " << Str(s, "socket") << "\n\n";
  Table tiers({"TIER", "CAPACITY", "USED", "BLOCKS", "PINNED", "EVICTIONS", "HEALTH"});
  for (const json& t : List(At(s, "tiers"))) {
    tiers.AddRow({Str(t, "tier"), Bytes(t, "capacity_bytes"), Bytes(t, "used_bytes"), Num(t, "blocks"),
                  Num(t, "pinned_blocks"), Num(t, "evictions"), Str(t, "health")});
  }
  tiers.Print(std::cout);
  PrintRemotes(s);
  std::cout << "\n";
  PrintTenants(s);
  std::cout << "\n";
  PrintSessions(s);
  const json& cm = At(s, "cost_model");
  std::cout << "\ncost model " << Str(cm, "model") << ": prefill " << Fixed(Dbl(At(cm, "prefill_tflops")), 1)
            << " TFLOP/s";
  if (Bool(At(cm, "prefill_fitted"))) {
    std::cout << " + " << Fixed(Dbl(At(cm, "prefill_overhead_s")) * 1e3, 2) << " ms (fitted to "
              << Num(cm, "prefill_reports") << " reports, r^2 " << Fixed(Dbl(At(cm, "prefill_r_squared")), 3) << ")";
  } else {
    std::cout << " (prior: " << Num(cm, "prefill_reports") << " report_prefill calls so far, 2 needed)";
  }
  std::cout << "; NVMe read " << Fixed(Dbl(At(cm, "nvme_read_gbps")), 2) << " GB/s + "
            << Fixed(Dbl(At(cm, "nvme_read_latency_us")), 0) << " us ("
            << (Bool(At(cm, "nvme_measured")) ? "measured over " + Num(cm, "nvme_reads_measured") + " reads"
                                              : std::string("prior"))
            << ")" << (Bool(At(cm, "decide")) ? "" : "; decisions off (always load, always demote)") << "\n";
  const json& st = At(s, "stats");
  const json& t0 = At(At(s, "tiers"), 0);
  auto n = [&](std::string_view key) { return Num(st, key); };
  std::cout << "\nlookups " << n("lookups") << " (hit rate " << Fixed(Dbl(At(st, "hit_rate")), 3)
            << ", reused-token ratio " << Fixed(Dbl(At(st, "reused_token_ratio")), 3)
            << " of the tokens in full blocks, block hit rate "
            << Fixed(Dbl(At(st, "block_hit_rate")), 3) << ")  probes " << n("probes") << "\n"
            << "blocks hit " << n("blocks_hit") << " (host " << n("blocks_hit_host") << ", local lower tiers "
            << n("blocks_hit_local") << ", shared tiers " << n("blocks_hit_shared") << ")  missed " << n("blocks_missed")
            << "  tokens reused " << n("tokens_hit") << " of " << n("tokens_queried") << "\n"
            << "stored " << n("blocks_stored") << " blocks (" << Bytes(st, "bytes_stored") << ")  loaded "
            << n("blocks_loaded") << " blocks (" << Bytes(st, "bytes_loaded") << ")  evictions " << n("evictions")
            << "  refused (no space) " << n("store_refused_no_space") << "\n"
            << "decisions: hits loaded from local lower tiers " << n("blocks_hit_local") << ", reported recompute "
            << n("blocks_recompute") << "; evictions demoted " << Num(t0, "demotions") << ", dropped "
            << Num(t0, "evictions_dropped") << " (by cost " << Num(t0, "evictions_dropped_by_cost")
            << "); in the background " << Num(t0, "evictions_background") << " (watermarks "
            << Fixed(Dbl(At(t0, "high_watermark")), 2) << " / "
            << Fixed(Dbl(At(t0, "low_watermark")), 2) << "), for token quotas "
            << Num(t0, "evictions_for_quota") << "\n"
            << "sessions attached " << n("sessions_attached") << "  detached " << n("sessions_detached")
            << "  died " << n("sessions_closed_dead") << "  refused " << n("attach_refused") << "  protocol errors " << n("protocol_errors") << "\n"
            << "config reloads " << n("reloads") << "  failed " << n("reloads_failed") << "\n";
  if (st.is_object() && st.contains("kv_registrations")) {
    std::cout << "engine KV caches registered " << n("kv_registrations") << " (refused "
              << n("kv_registrations_refused") << ")  device stores " << n("device_stores") << " ("
              << n("device_blocks_stored") << " blocks)  device loads " << n("device_loads") << " ("
              << n("device_blocks_loaded") << " blocks)  device errors " << n("device_errors") << "\n";
  }
}

void PrintTiers(const json& s) {
  for (const json& t : List(At(s, "tiers"))) {
    if (!t.is_object()) continue;
    // A lower tier says where it sits in the chain: lookups name it by that lane.
    const std::string lane = At(t, "chain_position").is_number()
                                 ? " (lane " + Num(t, "chain_position") + ", kind " + Str(t, "kind") + ")"
                                 : "";
    std::cout << Str(t, "tier") << " tier" << lane << ": " << Bytes(t, "used_bytes") << " of " << Bytes(t, "capacity_bytes")
              << " used, " << Num(t, "blocks") << " blocks, " << Str(t, "health") << "\n";
    Table d({"FIGURE", "VALUE"});
    for (const auto& [k, v] : t.items()) {
      if (k == "tier" || k == "health" || v.is_object()) continue;
      d.AddRow({k, k.find("bytes") != std::string::npos && v.is_number() ? Bytes(v) : Num(v)});
    }
    for (const auto& [k, v] : t.items()) {
      if (!v.is_object() || k == "remote") continue;
      for (const auto& [k2, v2] : v.items()) {
        d.AddRow({k + "." + k2, k2.find("bytes") != std::string::npos && v2.is_number_unsigned() ? Bytes(v2) : Num(v2)});
      }
    }
    d.Print(std::cout);
    if (At(t, "remote").is_object()) {
      std::cout << "\n";
      PrintRemote(t);
    }
    std::cout << "\n";
  }
}

std::string Bar(double share, int width = 20) {
  share = std::clamp(share, 0.0, 1.0);
  const int full = static_cast<int>(share * width + 0.5);
  return "[" + std::string(full, '#') + std::string(width - full, '.') + "] " + Fixed(100 * share, 1) + "%";
}

// One frame of `kvtierctl top`; rates from the previous frame.
void PrintTop(const json& s, const json* prev, double interval_s) {
  const json& st = At(s, "stats");
  std::cout << "kvtierd " << Str(s, "version") << "  pid " << Num(s, "pid") << "  up "
            << kvtier::tools::Duration(Dbl(At(s, "uptime_s"))) << "  sessions " << List(At(s, "sessions")).size()
            << "  device " << Str(s, "device") << "\n\n";
  Table tiers({"TIER", "USED", "", "BLOCKS", "HEALTH"});
  for (const json& t : List(At(s, "tiers"))) {
    const double cap = double(U64(At(t, "capacity_bytes")));
    tiers.AddRow({Str(t, "tier"), Bytes(t, "used_bytes") + " / " + Bytes(t, "capacity_bytes"),
                  Bar(cap > 0 ? double(U64(At(t, "used_bytes"))) / cap : 0), Num(t, "blocks"), Str(t, "health")});
  }
  tiers.Print(std::cout);
  PrintRemotes(s, /*nodes=*/false);
  std::cout << "\n";
  auto rate = [&](const char* key) {
    if (prev == nullptr || interval_s <= 0) return std::string("-");
    const double d = double(U64(At(st, key))) - double(U64(At(At(*prev, "stats"), key)));
    return Fixed(d / interval_s, 1) + "/s";
  };
  Table rates({"FIGURE", "TOTAL", "RATE"});
  rates.AddRow({"lookups", Num(st, "lookups"), rate("lookups")});
  rates.AddRow({"blocks stored", Num(st, "blocks_stored"), rate("blocks_stored")});
  rates.AddRow({"blocks loaded", Num(st, "blocks_loaded"), rate("blocks_loaded")});
  rates.AddRow({"evictions", Num(st, "evictions"), rate("evictions")});
  rates.Print(std::cout);
  std::cout << "\nhit rate " << Bar(Dbl(At(st, "hit_rate"))) << "   reused tokens "
            << Bar(Dbl(At(st, "reused_token_ratio"))) << "\n\n";
  PrintTenants(s);
}

void PrintBlocks(const json& r) {
  Table t({"KEY", "TENANT", "MODEL", "TIERS", "PINS", "TOKENS", "DEPTH", "BYTES"});
  for (const json& b : List(At(r, "blocks"))) {
    std::string tiers;
    for (const json& x : List(At(b, "tiers"))) tiers += (tiers.empty() ? "" : ",") + Str(x);
    if (Bool(At(b, "moving"))) tiers += tiers.empty() ? "moving" : " (moving)";
    t.AddRow({Str(b, "key"), Str(b, "tenant"), Str(b, "model"), tiers, Num(b, "pins"),
              Num(b, "tokens"), Num(b, "depth"), Bytes(b, "bytes")});
  }
  if (t.empty()) {
    std::cout << "no blocks\n";
  } else {
    t.Print(std::cout);
  }
  std::cout << List(At(r, "blocks")).size() << " of " << Num(r, "indexed_blocks") << " indexed blocks shown (--limit "
            << Num(r, "limit") << ")\n";
}

void PrintBlock(const json& b) {
  Table t({"FIELD", "VALUE"});
  if (b.is_object()) {
    for (const auto& [k, v] : b.items()) t.AddRow({k, v.is_array() ? Str(v.dump()) : Num(v)});
  }
  t.Print(std::cout);
}

// Nesting is bounded by AdminCall (kMaxJsonDepth), so is this recursion.
void PrintConfig(const json& c, const std::string& prefix = "") {
  if (!c.is_object()) return;
  for (const auto& [k, v] : c.items()) {
    if (v.is_object()) {
      PrintConfig(v, prefix + k + ".");
    } else {
      std::cout << kvtier::tools::Printable(prefix + k) << " = " << kvtier::tools::Printable(v.dump()) << "\n";
    }
  }
}

// Exit codes: see the file comment. An answer kvtierctl cannot read (not
// JSON, too long, too deep) is kvtierd's fault, as a refusal is: 3, not the
// 1 of a daemon that is not there.
int Fail(const absl::Status& s) {
  std::cerr << "kvtierctl: " << kvtier::tools::Printable(std::string(s.message())) << "\n";
  return absl::IsFailedPrecondition(s) || absl::IsDataLoss(s) ? 3 : 1;
}

}  // namespace

static int Main(int argc, char** argv) {
  CLI::App app{"kvtierctl: inspect and steer a running kvtierd"};
  app.set_version_flag("--version", KVTIER_VERSION);
  std::string socket = kvtier::DefaultAdminSocketPath();
  bool as_json = false;
  app.add_option("-s,--socket", socket, "kvtierd's admin socket ($KVTIER_ADMIN_SOCKET)")->capture_default_str();
  app.add_flag("--json", as_json, "print the daemon's answer as one JSON object");
  app.require_subcommand(1);
  // --json and --socket also after the subcommand (kvtierctl status --json):
  // a subcommand hands options it does not know to its parent. Subcommands
  // take this setting from the app when they are made, so it comes first.
  app.fallthrough();
  CLI::App* status = app.add_subcommand("status", std::string(kvtier::ipc::AdminHelp("status")));
  CLI::App* tiers = app.add_subcommand("tiers", "every tier in detail: capacity, I/O, checksums, journal, recovery");
  CLI::App* capacity = app.add_subcommand(
      "capacity", "plan capacity: a model's KV bytes per token, the cache some sequences need, what each tier holds");
  kvtier::tools::CapacityInput plan;
  capacity->add_option("-m,--model", plan.model_path, "the model's Hugging Face config.json")->required();
  CLI::Option* seq = capacity->add_option("--seq", plan.seqs, "a sequence length in tokens (repeat for several)");
  CLI::Option* trace =
      capacity->add_option("--trace", plan.trace_path, "or a request trace (Mooncake JSONL: input_length per request)");
  seq->excludes(trace);
  capacity->add_option("--dtype", plan.dtype, "KV dtype when the config has none, or to override it (float16, "
                                              "bfloat16, float32, float8_e4m3fn, int8)");
  capacity->add_option("--block-tokens", plan.block_tokens, "tokens per kvtier block")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  capacity->add_option("-c,--config", plan.config_path,
                       "kvtierd config whose tiers to fill (default /etc/kvtier/kvtierd.toml if it exists, else "
                       "kvtierd's embedded defaults)");
  capacity->footer("Examples:\n  kvtierctl capacity --model config.json --seq 4096 --seq 2048\n"
                   "  kvtierctl capacity -m config.json --trace conversation_trace.jsonl -c /etc/kvtier/kvtierd.toml\n"
                   "  kvtierctl --json capacity -m config.json --seq 32768 --dtype float8_e4m3fn");
  app.footer("Examples:\n  kvtierctl status\n  kvtierctl tiers\n  kvtierctl --json status | jq .stats.hit_rate\n"
             "  kvtierctl --socket /tmp/kv/kvtierd-admin.sock status\n"
             "  kvtierctl sessions\n  kvtierctl tenants\n  kvtierctl blocks ls --tenant default --limit 20\n"
             "  kvtierctl blocks inspect 3f2a...(64 hex digits)\n  kvtierctl evict --tenant default\n"
             "  kvtierctl flush\n  kvtierctl drain\n  kvtierctl config show\n  kvtierctl top -i 2\n"
             "  kvtierctl capacity --model config.json --seq 4096 --seq 2048\n"
             "Exit codes: 0 ok, 1 kvtierd unreachable, 2 usage error, 3 kvtierd answered with an error (or an answer "
             "kvtierctl cannot read), 4 an input file is missing or wrong");
  CLI::App* sessions = app.add_subcommand("sessions", "engine sessions: pid, uid, tenant, namespace, ops, leases");
  CLI::App* tenants = app.add_subcommand("tenants", "tenants: sessions, blocks, host and NVMe use against quotas");
  CLI::App* blocks = app.add_subcommand("blocks", std::string(kvtier::ipc::AdminHelp("blocks")));
  blocks->require_subcommand(1);
  CLI::App* blocks_ls = blocks->add_subcommand("ls", "list blocks: key, tenant, model, tiers, pins, tokens");
  std::string blocks_tenant;
  int64_t blocks_limit = 100;
  blocks_ls->add_option("--tenant", blocks_tenant, "only this tenant's blocks");
  blocks_ls->add_option("--limit", blocks_limit, "at most this many")->capture_default_str()->check(CLI::Range(1, 100000));
  CLI::App* blocks_inspect = blocks->add_subcommand("inspect", "one block by its key (64 hex digits)");
  std::string inspect_key;
  blocks_inspect->add_option("key", inspect_key, "the block key, as blocks ls prints it (64 hex digits)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& k) -> std::string {
            if (k.size() == 64 && std::all_of(k.begin(), k.end(), [](char ch) { return std::isxdigit(uint8_t(ch)); })) {
              return "";
            }
            return "a block key is 64 hex digits (blocks ls prints them), got " + std::to_string(k.size()) +
                   " characters";
          },
          "KEY"));
  CLI::App* evict = app.add_subcommand("evict", std::string(kvtier::ipc::AdminHelp("evict")));
  std::string evict_tenant;
  evict->add_option("--tenant", evict_tenant, "the tenant")->required();
  CLI::App* flush = app.add_subcommand("flush", std::string(kvtier::ipc::AdminHelp("flush")));
  CLI::App* drain = app.add_subcommand("drain", std::string(kvtier::ipc::AdminHelp("drain")));
  CLI::App* config = app.add_subcommand("config", std::string(kvtier::ipc::AdminHelp("config")));
  config->require_subcommand(1);
  CLI::App* config_show = config->add_subcommand("show", "print the running config (salts redacted)");
  CLI::App* top = app.add_subcommand("top", "a live view: tiers with usage bars, rates, hit figures, tenants");
  double top_interval = 1.0;
  int top_iterations = 0;
  top->add_option("-i,--interval", top_interval, "seconds between refreshes")->capture_default_str()->check(CLI::Range(0.05, 3600.0));
  top->add_option("-n,--iterations", top_iterations, "stop after this many refreshes (0: until Ctrl-C)")
      ->capture_default_str();
  if (kvtier::tools::PrintDocsIfAsked(
          argc, argv, app, "kvtierctl", 1, "inspect and steer a running kvtierd",
          {{"Environment", "KVTIER_ADMIN_SOCKET: the admin socket when --socket is not given."},
           {"See also", "kvtierd(8), kvtierd.toml(5), kvtier-replay(1), kvtier-bench(1)"}})) {
    return 0;
  }
  KVTIER_CLI_PARSE(app, argc, argv);
  (void)config_show;

  if (capacity->parsed()) {
    // No daemon needed.
    if (seq->count() == 0 && trace->count() == 0) {
      std::cerr << "kvtierctl capacity: give the sequence lengths with --seq (one or more), or a trace with --trace\n";
      return 2;
    }
    absl::StatusOr<kvtier::tools::CapacityPlan> p = kvtier::tools::PlanCapacity(plan);
    if (!p.ok()) {
      std::cerr << "kvtierctl capacity: " << p.status().message() << "\n";
      return 4;
    }
    if (as_json) {
      std::cout << kvtier::tools::CapacityJson(*p).dump() << "\n";
    } else {
      kvtier::tools::PrintCapacity(*p, std::cout);
    }
    return 0;
  }

  auto call = [&](const json& request) { return kvtier::ipc::AdminCall(socket, request, std::chrono::seconds(30)); };
  auto emit = [&](const json& j, auto print) {
    if (as_json) {
      std::cout << j.dump() << "\n";
    } else {
      print(j);
    }
    return 0;
  };
  if (blocks_ls->parsed() || blocks_inspect->parsed()) {
    json req = {{"cmd", "blocks"}, {"limit", blocks_limit}};
    if (!blocks_tenant.empty()) req["tenant"] = blocks_tenant;
    if (blocks_inspect->parsed()) req["key"] = inspect_key;
    absl::StatusOr<json> r = call(req);
    if (!r.ok()) return Fail(r.status());
    if (blocks_ls->parsed()) return emit(*r, PrintBlocks);
    if (List(At(*r, "blocks")).empty()) {
      std::cerr << "kvtierctl: no block with key " << inspect_key << "\n";
      return 3;
    }
    return emit(At(At(*r, "blocks"), 0), PrintBlock);
  }
  if (evict->parsed()) {
    absl::StatusOr<json> r = call({{"cmd", "evict"}, {"tenant", evict_tenant}});
    if (!r.ok()) return Fail(r.status());
    return emit(*r, [](const json& j) {
      std::cout << "evicted " << Num(j, "evicted") << " blocks of tenant " << Str(j, "tenant") << "\n";
    });
  }
  if (flush->parsed()) {
    absl::StatusOr<json> r = call({{"cmd", "flush"}});
    if (!r.ok()) return Fail(r.status());
    emit(*r, [](const json& j) {
      std::cout << "wrote " << Num(j, "written") << " blocks to NVMe (" << Num(j, "already_on_nvme")
                << " were there already, " << Num(j, "failed") << " failed"
                << (Bool(At(j, "timed_out")) ? ", timed out" : "");
      if (U64(At(j, "landed_late")) > 0) std::cout << ", " << Num(j, "landed_late") << " landed after the budget";
      std::cout << "); journal " << Str(j, "journal") << "\n";
    });
    // Blocks left unwritten (failed) or a journal not durable; writes that
    // landed late were written.
    return U64(At(*r, "failed")) == 0 && Str(*r, "journal") == "durable" ? 0 : 3;
  }
  if (drain->parsed()) {
    absl::StatusOr<json> r = call({{"cmd", "drain"}});
    if (!r.ok()) return Fail(r.status());
    return emit(*r, [](const json& j) {
      std::cout << "kvtierd is draining (at most " << Num(j, "timeout_ms") << " ms) and will exit\n";
    });
  }
  if (config->parsed()) {
    absl::StatusOr<json> r = call({{"cmd", "config"}});
    if (!r.ok()) return Fail(r.status());
    return emit(At(*r, "config"), [](const json& j) { PrintConfig(j); });
  }
  if (top->parsed()) {
    const bool to_terminal = isatty(STDOUT_FILENO) == 1;
    json prev;
    for (int i = 0; top_iterations == 0 || i < top_iterations; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(top_interval));
      absl::StatusOr<json> r = call({{"cmd", "status"}});
      if (!r.ok()) return Fail(r.status());
      if (as_json) {
        std::cout << r->dump() << "\n" << std::flush;  // one object per refresh
      } else {
        if (to_terminal) {
          std::cout << "\033[H\033[2J";  // refresh in place
        } else if (i > 0) {
          std::cout << "\n";  // a pipe or file gets plain frames, one after the other
        }
        PrintTop(*r, i > 0 ? &prev : nullptr, top_interval);
        std::cout << std::flush;
      }
      prev = std::move(*r);
    }
    return 0;
  }

  absl::StatusOr<json> s = call(json{{"cmd", "status"}});
  if (!s.ok()) return Fail(s.status());
  if (sessions->parsed()) return emit(json{{"sessions", At(*s, "sessions")}}, PrintSessions);
  if (tenants->parsed()) return emit(json{{"tenants", At(*s, "tenants")}}, PrintTenants);
  if (status->parsed()) {
    if (as_json) {
      std::cout << s->dump() << "\n";
    } else {
      PrintStatus(*s);
    }
  } else if (tiers->parsed()) {
    if (as_json) {
      std::cout << json{{"tiers", At(*s, "tiers")}}.dump() << "\n";
    } else {
      PrintTiers(*s);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  // The printers read the daemon's answer without throwing; this is the
  // last line of defence, so that a mistake there is an error message and
  // exit 3 rather than std::terminate.
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kvtierctl: cannot read kvtierd's answer: " << kvtier::tools::Printable(e.what()) << "\n";
    return 3;
  }
}
