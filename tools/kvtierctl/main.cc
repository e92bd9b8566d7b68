// kvtierctl: inspect a running kvtierd over its admin socket, and plan
// capacity without one.
//
// Exit codes: 0 ok, 1 kvtierd unreachable, 2 usage error, 3 kvtierd answered
// with an error, 4 an input file (model config, trace, kvtierd config) is
// missing or wrong.
#include <iostream>

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
  std::cout << "\n";
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
             "  kvtierctl capacity --model config.json --seq 4096 --seq 2048\n"
             "Exit codes: 0 ok, 1 kvtierd unreachable, 2 usage error, 3 kvtierd answered with an error, 4 an input "
             "file is missing or wrong");
  KVTIER_CLI_PARSE(app, argc, argv);

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

  absl::StatusOr<json> s = kvtier::ipc::AdminCall(socket, json{{"cmd", "status"}});
  if (!s.ok()) {
    std::cerr << "kvtierctl: " << s.status().message() << "\n";
    return absl::IsFailedPrecondition(s.status()) ? 3 : 1;
  }
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
