// kvtierctl: inspect a running kvtierd over its admin socket, and plan
// capacity without one.
//
// Exit codes: 0 ok, 1 kvtierd unreachable, 2 usage error, 3 kvtierd answered
// with an error, 4 an input file (model config, trace, kvtierd config) is
// missing or wrong.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include "core/cli_parse.h"
#include "core/fmt_absl.h"
#include "core/paths.h"
#include "core/units.h"
#include "ipc/admin_client.h"
#include "tools/common/table.h"
#include "tools/kvtierctl/capacity.h"

namespace {

using nlohmann::json;
using kvtier::tools::Fixed;
using kvtier::tools::Table;

std::string Bytes(const json& v) { return kvtier::FormatBytes(v.get<uint64_t>()); }
std::string Num(const json& v) { return v.is_number_float() ? Fixed(v.get<double>(), 3) : v.dump(); }

void PrintTenants(const json& s) {
  Table tenants({"TENANT", "SESSIONS", "BLOCKS", "PINNED", "HOST USED", "HOST CAPACITY", "HOST TOKENS", "NVME USED",
                 "EVICTING BY"});
  // "used / quota" where a quota is set.
  auto of = [](const json& used, const json& quota, bool bytes) {
    std::string s = bytes ? Bytes(used) : Num(used);
    if (quota.get<uint64_t>() != 0) s += " / " + (bytes ? Bytes(quota) : Num(quota));
    return s;
  };
  for (const json& t : s["tenants"]) {
    // Which expert evicts, per block size the tenant holds ("-": none yet).
    std::string by;
    for (const json& p : t["policies"]) {
      if (!by.empty()) by += ", ";
      by += p["leader"].get<std::string>() + " (" + Bytes(p["slot_bytes"]) + " blocks)";
    }
    const json& q = t["quota"];
    std::string nvme = of(t["nvme_bytes"], q["nvme_bytes"], true);
    if (q["nvme_tokens"].get<uint64_t>() != 0) nvme += ", " + of(t["nvme_tokens"], q["nvme_tokens"], false) + " tokens";
    tenants.AddRow({t["name"], Num(t["sessions"]), Num(t["blocks"]), Num(t["pinned_blocks"]),
                    Bytes(t["host_used_bytes"]), Bytes(t["host_capacity_bytes"]),
                    of(t["host_tokens"], q["host_tokens"], false), nvme, by.empty() ? "-" : by});
  }
  tenants.Print(std::cout);
}

void PrintSessions(const json& s) {
  if (s["sessions"].empty()) {
    std::cout << "no sessions attached\n";
  } else {
    Table sessions(
        {"SESSION", "PID", "UID", "TENANT", "CLIENT", "MODEL", "NAMESPACE", "OPS", "LEASES", "PINNED", "KV CACHES"});
    for (const json& x : s["sessions"]) {
      sessions.AddRow({Num(x["id"]), Num(x["pid"]), Num(x["uid"]), x["tenant"], x["client"], x["model"],
                       x["namespace"], Num(x["ops"]), Num(x["leases"]), Num(x["pinned_blocks"]),
                       x.contains("kv_caches") ? Num(x["kv_caches"]) : "-"});
    }
    sessions.Print(std::cout);
  }
}

void PrintStatus(const json& s) {
  std::cout << "kvtierd " << s["version"].get<std::string>() << "  pid " << s["pid"] << "  up "
            << kvtier::tools::Duration(s["uptime_s"].get<double>()) << "  device " << s["device"].get<std::string>()
            << "  hash " << s["hash"].get<std::string>() << "\n"
            << "socket " << s["socket"].get<std::string>() << "\n\n";
  Table tiers({"TIER", "CAPACITY", "USED", "BLOCKS", "PINNED", "EVICTIONS", "HEALTH"});
  for (const json& t : s["tiers"]) {
    tiers.AddRow({t["tier"], Bytes(t["capacity_bytes"]), Bytes(t["used_bytes"]), Num(t["blocks"]),
                  t.contains("pinned_blocks") ? Num(t["pinned_blocks"]) : "-", Num(t["evictions"]), t["health"]});
  }
  tiers.Print(std::cout);
  std::cout << "\n";
  PrintTenants(s);
  std::cout << "\n";
  PrintSessions(s);
  const json& cm = s["cost_model"];
  std::cout << "\ncost model " << cm["model"].get<std::string>() << ": prefill "
            << Fixed(cm["prefill_tflops"].get<double>(), 1) << " TFLOP/s";
  if (cm["prefill_fitted"].get<bool>()) {
    std::cout << " + " << Fixed(cm["prefill_overhead_s"].get<double>() * 1e3, 2) << " ms (fitted to "
              << cm["prefill_reports"] << " reports, r^2 " << Fixed(cm["prefill_r_squared"].get<double>(), 3) << ")";
  } else {
    std::cout << " (prior: " << cm["prefill_reports"] << " report_prefill calls so far, 2 needed)";
  }
  std::cout << "; NVMe read " << Fixed(cm["nvme_read_gbps"].get<double>(), 2) << " GB/s + "
            << Fixed(cm["nvme_read_latency_us"].get<double>(), 0) << " us ("
            << (cm["nvme_measured"].get<bool>() ? "measured over " + cm["nvme_reads_measured"].dump() + " reads"
                                                : std::string("prior"))
            << ")" << (cm["decide"].get<bool>() ? "" : "; decisions off (always load, always demote)") << "\n";
  const json& st = s["stats"];
  std::cout << "\nlookups " << st["lookups"] << " (hit rate " << Fixed(st["hit_rate"].get<double>(), 3)
            << ", reused-token ratio " << Fixed(st["reused_token_ratio"].get<double>(), 3) << ", block hit rate "
            << Fixed(st["block_hit_rate"].get<double>(), 3) << ")  probes " << st["probes"] << "\n"
            << "blocks hit " << st["blocks_hit"] << " (host " << st["blocks_hit_host"] << ", nvme "
            << st["blocks_hit_nvme"] << ")  missed " << st["blocks_missed"] << "  tokens reused "
            << st["tokens_hit"] << " of " << st["tokens_queried"] << "\n"
            << "stored " << st["blocks_stored"] << " blocks (" << Bytes(st["bytes_stored"]) << ")  loaded "
            << st["blocks_loaded"] << " blocks (" << Bytes(st["bytes_loaded"]) << ")  evictions " << st["evictions"]
            << "  refused (no space) " << st["store_refused_no_space"] << "\n"
            << "decisions: NVMe hits loaded " << st["blocks_hit_nvme"] << ", reported recompute "
            << st["blocks_recompute"] << "; evictions demoted " << s["tiers"][0]["demotions"] << ", dropped "
            << s["tiers"][0]["evictions_dropped"] << " (by cost " << s["tiers"][0]["evictions_dropped_by_cost"]
            << "); in the background " << s["tiers"][0]["evictions_background"] << " (watermarks "
            << Fixed(s["tiers"][0]["high_watermark"].get<double>(), 2) << " / "
            << Fixed(s["tiers"][0]["low_watermark"].get<double>(), 2) << "), for token quotas "
            << s["tiers"][0]["evictions_for_quota"] << "\n"
            << "sessions attached " << st["sessions_attached"] << "  detached " << st["sessions_detached"]
            << "  died " << st["sessions_closed_dead"] << "  refused " << st["attach_refused"] << "  protocol errors " << st["protocol_errors"] << "\n";
  if (st.contains("kv_registrations")) {
    std::cout << "engine KV caches registered " << st["kv_registrations"] << " (refused "
              << st["kv_registrations_refused"] << ")  device stores " << st["device_stores"] << " ("
              << st["device_blocks_stored"] << " blocks)  device loads " << st["device_loads"] << " ("
              << st["device_blocks_loaded"] << " blocks)  device errors " << st["device_errors"] << "\n";
  }
}

void PrintTiers(const json& s) {
  for (const json& t : s["tiers"]) {
    const std::string name = t["tier"];
    std::cout << name << " tier: " << Bytes(t["used_bytes"]) << " of " << Bytes(t["capacity_bytes"]) << " used, "
              << t["blocks"] << " blocks, " << t["health"].get<std::string>() << "\n";
    Table d({"FIGURE", "VALUE"});
    for (const auto& [k, v] : t.items()) {
      if (k == "tier" || k == "health" || v.is_object()) continue;
      d.AddRow({k, k.find("bytes") != std::string::npos && v.is_number() ? Bytes(v) : (v.is_string() ? v.get<std::string>() : Num(v))});
    }
    for (const auto& [k, v] : t.items()) {
      if (!v.is_object()) continue;
      for (const auto& [k2, v2] : v.items()) {
        d.AddRow({k + "." + k2, k2.find("bytes") != std::string::npos && v2.is_number_unsigned() ? Bytes(v2) : Num(v2)});
      }
    }
    d.Print(std::cout);
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
  const json& st = s["stats"];
  std::cout << "kvtierd " << s["version"].get<std::string>() << "  pid " << s["pid"] << "  up "
            << kvtier::tools::Duration(s["uptime_s"].get<double>()) << "  sessions " << s["sessions"].size()
            << "  device " << s["device"].get<std::string>() << "\n\n";
  Table tiers({"TIER", "USED", "", "BLOCKS", "HEALTH"});
  for (const json& t : s["tiers"]) {
    const double cap = double(t["capacity_bytes"].get<uint64_t>());
    tiers.AddRow({t["tier"], Bytes(t["used_bytes"]) + " / " + Bytes(t["capacity_bytes"]),
                  Bar(cap > 0 ? double(t["used_bytes"].get<uint64_t>()) / cap : 0), Num(t["blocks"]), t["health"]});
  }
  tiers.Print(std::cout);
  std::cout << "\n";
  auto rate = [&](const char* key) {
    if (prev == nullptr || interval_s <= 0) return std::string("-");
    const double d = double(st[key].get<uint64_t>()) - double((*prev)["stats"][key].get<uint64_t>());
    return Fixed(d / interval_s, 1) + "/s";
  };
  Table rates({"FIGURE", "TOTAL", "RATE"});
  rates.AddRow({"lookups", Num(st["lookups"]), rate("lookups")});
  rates.AddRow({"blocks stored", Num(st["blocks_stored"]), rate("blocks_stored")});
  rates.AddRow({"blocks loaded", Num(st["blocks_loaded"]), rate("blocks_loaded")});
  rates.AddRow({"evictions", Num(st["evictions"]), rate("evictions")});
  rates.Print(std::cout);
  std::cout << "\nhit rate " << Bar(st["hit_rate"].get<double>()) << "   reused tokens "
            << Bar(st["reused_token_ratio"].get<double>()) << "\n\n";
  PrintTenants(s);
}

void PrintBlocks(const json& r) {
  Table t({"KEY", "TENANT", "MODEL", "TIERS", "PINS", "TOKENS", "DEPTH", "BYTES"});
  for (const json& b : r["blocks"]) {
    std::string tiers;
    for (const json& x : b["tiers"]) tiers += (tiers.empty() ? "" : ",") + x.get<std::string>();
    if (b["moving"].get<bool>()) tiers += tiers.empty() ? "moving" : " (moving)";
    t.AddRow({b["key"].get<std::string>().substr(0, 16) + "...", b["tenant"], b["model"], tiers, Num(b["pins"]),
              Num(b["tokens"]), b["depth"].is_null() ? "-" : Num(b["depth"]), Bytes(b["bytes"])});
  }
  if (t.empty()) {
    std::cout << "no blocks\n";
  } else {
    t.Print(std::cout);
  }
  std::cout << r["blocks"].size() << " of " << r["indexed_blocks"] << " indexed blocks shown (--limit "
            << r["limit"] << ")\n";
}

void PrintBlock(const json& b) {
  Table t({"FIELD", "VALUE"});
  for (const auto& [k, v] : b.items()) {
    t.AddRow({k, v.is_string() ? v.get<std::string>() : v.is_array() || v.is_null() ? v.dump() : Num(v)});
  }
  t.Print(std::cout);
}

void PrintConfig(const json& c, const std::string& prefix = "") {
  for (const auto& [k, v] : c.items()) {
    if (v.is_object()) {
      PrintConfig(v, prefix + k + ".");
    } else {
      std::cout << prefix << k << " = " << v.dump() << "\n";
    }
  }
}

// Exit codes: see the file comment.
int Fail(const absl::Status& s) {
  std::cerr << "kvtierctl: " << s.message() << "\n";
  return absl::IsFailedPrecondition(s) ? 3 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvtierctl: inspect and steer a running kvtierd"};
  app.set_version_flag("--version", KVTIER_VERSION);
  std::string socket = kvtier::DefaultAdminSocketPath();
  bool as_json = false;
  app.add_option("-s,--socket", socket, "kvtierd's admin socket ($KVTIER_ADMIN_SOCKET)")->capture_default_str();
  app.add_flag("--json", as_json, "print the daemon's answer as one JSON object");
  app.require_subcommand(1);
  CLI::App* status = app.add_subcommand("status", "sessions, tenants, tiers, hits and misses");
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
             "Exit codes: 0 ok, 1 kvtierd unreachable, 2 usage error, 3 kvtierd answered with an error, 4 an input "
             "file is missing or wrong");
  CLI::App* sessions = app.add_subcommand("sessions", "engine sessions: pid, uid, tenant, namespace, ops, leases");
  CLI::App* tenants = app.add_subcommand("tenants", "tenants: sessions, blocks, host and NVMe use against quotas");
  CLI::App* blocks = app.add_subcommand("blocks", "blocks the daemon holds");
  blocks->require_subcommand(1);
  CLI::App* blocks_ls = blocks->add_subcommand("ls", "list blocks: key, tenant, model, tiers, pins, tokens");
  std::string blocks_tenant;
  int64_t blocks_limit = 100;
  blocks_ls->add_option("--tenant", blocks_tenant, "only this tenant's blocks");
  blocks_ls->add_option("--limit", blocks_limit, "at most this many")->capture_default_str()->check(CLI::Range(1, 100000));
  CLI::App* blocks_inspect = blocks->add_subcommand("inspect", "one block by its key (64 hex digits)");
  std::string inspect_key;
  blocks_inspect->add_option("key", inspect_key, "the block key")->required();
  CLI::App* evict = app.add_subcommand("evict", "evict every unpinned host block of a tenant (demoting to NVMe)");
  std::string evict_tenant;
  evict->add_option("--tenant", evict_tenant, "the tenant")->required();
  CLI::App* flush = app.add_subcommand("flush", "write host blocks without an NVMe copy to NVMe, journal durable");
  CLI::App* drain = app.add_subcommand("drain", "drain and stop kvtierd, as SIGTERM does");
  CLI::App* config = app.add_subcommand("config", "the running configuration");
  config->require_subcommand(1);
  CLI::App* config_show = config->add_subcommand("show", "print the running config (salts redacted)");
  CLI::App* top = app.add_subcommand("top", "a live view: tiers with usage bars, rates, hit figures, tenants");
  double top_interval = 1.0;
  int top_iterations = 0;
  top->add_option("-i,--interval", top_interval, "seconds between refreshes")->capture_default_str()->check(CLI::Range(0.05, 3600.0));
  top->add_option("-n,--iterations", top_iterations, "stop after this many refreshes (0: until Ctrl-C)")
      ->capture_default_str();
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
    if ((*r)["blocks"].empty()) {
      std::cerr << "kvtierctl: no block with key " << inspect_key << "\n";
      return 3;
    }
    return emit((*r)["blocks"][0], PrintBlock);
  }
  if (evict->parsed()) {
    absl::StatusOr<json> r = call({{"cmd", "evict"}, {"tenant", evict_tenant}});
    if (!r.ok()) return Fail(r.status());
    return emit(*r, [](const json& j) {
      std::cout << "evicted " << j["evicted"] << " blocks of tenant " << j["tenant"].get<std::string>() << "\n";
    });
  }
  if (flush->parsed()) {
    absl::StatusOr<json> r = call({{"cmd", "flush"}});
    if (!r.ok()) return Fail(r.status());
    emit(*r, [](const json& j) {
      std::cout << "wrote " << j["written"] << " blocks to NVMe (" << j["already_on_nvme"] << " were there already, "
                << j["failed"] << " failed" << (j["timed_out"].get<bool>() ? ", timed out" : "") << "); journal "
                << j["journal"].get<std::string>() << "\n";
    });
    return (*r)["failed"].get<uint64_t>() == 0 && !(*r)["timed_out"].get<bool>() ? 0 : 3;
  }
  if (drain->parsed()) {
    absl::StatusOr<json> r = call({{"cmd", "drain"}});
    if (!r.ok()) return Fail(r.status());
    return emit(*r, [](const json& j) {
      std::cout << "kvtierd is draining (at most " << j["timeout_ms"] << " ms) and will exit\n";
    });
  }
  if (config->parsed()) {
    absl::StatusOr<json> r = call({{"cmd", "config"}});
    if (!r.ok()) return Fail(r.status());
    return emit((*r)["config"], [](const json& j) { PrintConfig(j); });
  }
  if (top->parsed()) {
    json prev;
    for (int i = 0; top_iterations == 0 || i < top_iterations; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(top_interval));
      absl::StatusOr<json> r = call({{"cmd", "status"}});
      if (!r.ok()) return Fail(r.status());
      if (as_json) {
        std::cout << r->dump() << "\n" << std::flush;  // one object per refresh
      } else {
        std::cout << "\033[H\033[2J";  // refresh in place
        PrintTop(*r, i > 0 ? &prev : nullptr, top_interval);
        std::cout << std::flush;
      }
      prev = std::move(*r);
    }
    return 0;
  }

  absl::StatusOr<json> s = call(json{{"cmd", "status"}});
  if (!s.ok()) return Fail(s.status());
  if (sessions->parsed()) return emit(json{{"sessions", (*s)["sessions"]}}, PrintSessions);
  if (tenants->parsed()) return emit(json{{"tenants", (*s)["tenants"]}}, PrintTenants);
  if (status->parsed()) {
    if (as_json) {
      std::cout << s->dump() << "\n";
    } else {
      PrintStatus(*s);
    }
  } else if (tiers->parsed()) {
    if (as_json) {
      std::cout << json{{"tiers", (*s)["tiers"]}}.dump() << "\n";
    } else {
      PrintTiers(*s);
    }
  }
  return 0;
}
