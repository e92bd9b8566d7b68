// SPDX-License-Identifier: Apache-2.0
// kvtier-replay: drives a running kvtierd with a trace or a synthetic chat
// workload, verifying every loaded byte, and reports hit rates and latencies.
//
// Exit codes: 0 ok, 1 a session failed or a loaded byte was wrong, 2 usage,
// 4 an input file (the trace, --model-config) is unreadable or wrong.
#include <algorithm>
#include <cctype>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/block_key.h"
#include "core/cli_parse.h"
#include "core/units.h"
#include "tools/common/man_page.h"
#include "tools/common/table.h"
#include "tools/common/trace.h"
#include "tools/replay/nodes_sim.h"
#include "tools/replay/replayer.h"
#include "tools/replay/simulate.h"
#include "tools/replay/suite.h"
#include "tools/replay/workload.h"

using kvtier::tools::Fixed;

namespace {

// "3M" tokens (K, M, G: powers of 1000) or "1.5GiB" bytes (any byte unit of
// --block-bytes), as blocks.
absl::StatusOr<uint64_t> ParseCapacityBlocks(const std::string& text, uint32_t block_tokens, uint64_t block_bytes) {
  if (text.empty()) return absl::InvalidArgumentError("empty capacity");
  const char last = text.back();
  if (last == 'K' || last == 'M' || last == 'G' || std::isdigit(static_cast<unsigned char>(last))) {
    double v;
    const double scale = last == 'K' ? 1e3 : last == 'M' ? 1e6 : last == 'G' ? 1e9 : 1;
    const std::string num = std::isdigit(static_cast<unsigned char>(last)) ? text : text.substr(0, text.size() - 1);
    if (!absl::SimpleAtod(num, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not a token count such as 3M or 500K"));
    }
    return static_cast<uint64_t>(v * scale) / block_tokens;
  }
  auto bytes = kvtier::ParseBytes(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is neither tokens (3M) nor bytes (4GiB)"));
  }
  return *bytes / block_bytes;
}

struct SimFlags {
  std::vector<std::string> tiers, policies;
  bool infinite = false, drop = false, always_load = false;
  std::string model_config;
  std::string nvme_policy = "lru";
  double prefill_tflops = 300, host_gbps = 25, nvme_gbps = 3, nvme_latency_us = 100;
  uint32_t gpus = 4;
  uint32_t nvme_admit_uses = 1;
  uint64_t shadow_blocks = kvtier::AdaptivePolicy::kDefaultMaxShadowBlocks;
  // --nodes: N nodes, each as above, over a shared remote tier.
  std::vector<uint32_t> nodes;
  std::vector<std::string> routings;
  std::string write_policy = "demoted";
  double remote_gbps = 3.1, remote_latency_us = 200;
  // --suite
  bool suite = false, has_trace = false, quiet = false;
  std::vector<std::string> workloads;
  uint64_t seed = 1;
};

// --simulate --nodes: for each node count and routing, the local tiers alone
// and pooled over the remote tier, side by side.
int RunNodes(const kvtier::tools::Workload& workload, const SimFlags& f, const kvtier::tools::SimOptions& base,
             uint64_t remote_blocks, bool as_json) {
  const std::vector<std::string> routings =
      f.routings.empty() ? std::vector<std::string>(std::begin(kvtier::tools::kRoutings),
                                                    std::end(kvtier::tools::kRoutings))
                         : f.routings;
  const uint64_t bt = workload.block_tokens;
  kvtier::tools::Table t({"NODES", "ROUTING", "TOKEN HIT LOCAL", "POOLED", "FROM REMOTE", "TTFT P50 LOCAL", "POOLED",
                          "TTFT P95 LOCAL", "POOLED", "REMOTE WRITTEN"});
  for (uint32_t n : f.nodes) {
    for (const std::string& routing : routings) {
      kvtier::tools::NodesSimOptions o;
      o.node = base;
      o.nodes = n;
      o.routing = routing;
      o.write_policy = f.write_policy;
      o.remote = kvtier::TierSpeed{f.remote_gbps * 1e9, f.remote_latency_us * 1e-6};
      if (!as_json) std::cerr << "kvtier-replay: simulating " << n << " nodes, " << routing << " routing\n";
      auto local = kvtier::tools::SimulateNodes(workload, o);
      o.remote_blocks = remote_blocks;
      auto pooled = local.ok() ? kvtier::tools::SimulateNodes(workload, o) : local;
      if (!pooled.ok()) {
        std::cerr << "kvtier-replay: " << pooled.status().message() << "\n";
        return 2;
      }
      if (as_json) {
        std::cout << nlohmann::json{{"nodes", n}, {"routing", routing}, {"write_policy", f.write_policy},
                                    {"host_tokens", base.capacity_blocks * bt}, {"nvme_tokens", base.nvme_blocks * bt},
                                    {"remote_tokens", remote_blocks * bt}, {"local", local->ToJson()},
                                    {"pooled", pooled->ToJson()}}
                         .dump()
                  << "\n";
        continue;
      }
      const double req = pooled->blocks_requested ? double(pooled->blocks_requested) : 1;
      t.AddRow({std::to_string(n), routing, Fixed(local->token_hit_rate(), 3), Fixed(pooled->token_hit_rate(), 3),
                Fixed(double(pooled->blocks_hit_remote) / req, 3), kvtier::tools::Duration(local->TtftPercentile(50)),
                kvtier::tools::Duration(pooled->TtftPercentile(50)), kvtier::tools::Duration(local->TtftPercentile(95)),
                kvtier::tools::Duration(pooled->TtftPercentile(95)), kvtier::FormatBytes(pooled->bytes_written_remote)});
    }
  }
  if (as_json) return 0;
  std::cout << "kvtier-replay --simulate --nodes: " << workload.description << "\n"
            << "per node: host " << base.capacity_blocks * bt << " tokens"
            << (base.nvme_blocks ? ", NVMe " + std::to_string(base.nvme_blocks * bt) + " tokens" : std::string())
            << ", " << base.gpus << " GPU(s) at " << f.prefill_tflops << " TFLOP/s; shared remote tier "
            << remote_blocks * bt << " tokens at " << f.remote_gbps << " GB/s + " << f.remote_latency_us
            << " us, write policy " << f.write_policy << "\n";
  t.Print(std::cout);
  std::cout << "token hit = hit blocks / requested full blocks (prefix hits only); LOCAL: each node's own tiers;\n"
               "POOLED: the same nodes over the shared remote tier (FROM REMOTE: the share it served); TTFT\n"
               "on the simulated GPUs, queueing included\n";
  return 0;
}

// --simulate --suite: every policy on every workload of the suite (and the
// --trace, when given, as "conversation") at each host capacity; one row per
// workload and capacity.
int RunSuite(const kvtier::tools::Workload& trace, const SimFlags& f, const kvtier::tools::SimOptions& base,
             const std::vector<uint64_t>& capacities_512, bool as_json) {
  std::vector<std::pair<std::string, kvtier::tools::Workload>> workloads;
  const std::vector<std::string> names = f.workloads.empty() ? [] {
    std::vector<std::string> all;
    for (const auto& w : kvtier::tools::SuiteWorkloads()) all.push_back(w.name);
    return all;
  }() : f.workloads;
  const bool with_trace =
      f.has_trace && (f.workloads.empty() || std::find(f.workloads.begin(), f.workloads.end(), "conversation") !=
                                                 f.workloads.end());
  if (with_trace) workloads.emplace_back("conversation", trace);
  for (const std::string& name : names) {
    if (name == "conversation") {
      if (!f.has_trace) {
        std::cerr << "kvtier-replay: --workloads conversation needs --trace (the Mooncake conversation trace)\n";
        return 2;
      }
      continue;
    }
    if (!f.quiet) std::cerr << "kvtier-replay: generating " << name << " (seed " << f.seed << ")\n";
    auto w = kvtier::tools::MakeSuiteWorkload(name, f.seed);
    if (!w.ok()) {
      std::cerr << "kvtier-replay: --workloads: " << w.status().message() << "\n";
      return 2;
    }
    workloads.emplace_back(name, std::move(*w));
  }
  // Capacities were parsed in the trace's blocks; every suite workload has
  // 512-token blocks too, so tokens = blocks * 512 throughout.
  const std::vector<std::string> policies = base.policies;
  std::vector<std::string> header = {"WORKLOAD", "HOST TOKENS"};
  for (const auto& p : policies) header.push_back(p == base.default_policy ? p + "*" : p);
  const bool with_bound = std::find(policies.begin(), policies.end(), kvtier::tools::kHoldOptimumPolicy) != policies.end();
  header.insert(header.end(), {"BEST ONLINE", "DEFAULT / BEST", "DEFAULT / BELADY"});
  if (with_bound) header.push_back("DEFAULT / HOLD OPTIMUM");
  kvtier::tools::Table t(header);
  double worst = 1e9;
  std::string worst_at;
  // Policies above the hold optimum: they decide on more than its fixed
  // per-class holds can (holds that follow later requests, information
  // outside the classes).
  std::vector<std::string> above_bound;
  for (const auto& [name, w] : workloads) {
    for (uint64_t cap512 : capacities_512) {
      const uint64_t tokens = cap512 * trace.block_tokens;
      kvtier::tools::SimOptions o = base;
      o.capacity_blocks = tokens / w.block_tokens;
      if (!f.quiet && !as_json) {
        std::cerr << "kvtier-replay: " << name << " at " << tokens << " host tokens: " << policies.size()
                  << " policies\n";
      }
      auto rows = kvtier::tools::Simulate(w, o);
      if (!rows.ok()) {
        std::cerr << "kvtier-replay: " << name << ": " << rows.status().message() << "\n";
        return 2;
      }
      double def = -1, best = -1, belady = -1, bound = -1;
      std::string best_name = "-";
      std::vector<std::string> cells = {name, std::to_string(o.capacity_blocks * w.block_tokens)};
      for (const auto& row : *rows) {
        cells.push_back(Fixed(row.token_hit_rate(), 3));
        if (row.policy == "belady") {
          belady = row.token_hit_rate();
        } else if (row.policy == kvtier::tools::kHoldOptimumPolicy) {
          bound = row.token_hit_rate();
        } else if (row.is_default) {
          def = row.token_hit_rate();
        } else if (kvtier::tools::IsOnlinePolicyRow(row.policy) && row.token_hit_rate() > best) {
          best = row.token_hit_rate();
          best_name = row.policy;
        }
        if (as_json) {
          nlohmann::json j = row.ToJson();
          j["workload"] = name;
          std::cout << j.dump() << "\n";
        }
      }
      if (bound >= 0) {
        for (const auto& row : *rows) {
          if (!kvtier::tools::IsBoundRow(row.policy) && row.policy != "none" && row.token_hit_rate() > bound) {
            above_bound.push_back(row.policy + " on " + name + " at " +
                                  std::to_string(o.capacity_blocks * w.block_tokens) + " tokens");
          }
        }
      }
      const double vs_best = def >= 0 && best > 0 ? def / best : -1;
      if (vs_best >= 0 && vs_best < worst) {
        worst = vs_best;
        worst_at = name + " at " + std::to_string(o.capacity_blocks * w.block_tokens) + " tokens";
      }
      cells.push_back(best_name);
      cells.push_back(vs_best >= 0 ? Fixed(vs_best, 3) : "-");
      cells.push_back(def >= 0 && belady > 0 ? Fixed(def / belady, 2) : "-");
      if (with_bound) cells.push_back(def >= 0 && bound > 0 ? Fixed(def / bound, 2) : "-");
      t.AddRow(cells);
    }
  }
  if (as_json) return 0;
  std::cout << "kvtier-replay --simulate --suite: token hit rate of each policy (* the default, "
            << base.default_policy << ")\n";
  t.Print(std::cout);
  std::cout << "BEST ONLINE: the best policy other than the default (not Belady, offline, nor the hold optimum\n"
               "or oracle); DEFAULT / BEST: the default's token hit rate over it";
  if (!worst_at.empty()) std::cout << " (lowest: " << Fixed(worst, 3) << ", " << worst_at << ")";
  if (with_bound) {
    std::cout << "\nHOLD OPTIMUM: the most a policy could hit that keeps each block for a time set by its uses,\n"
                 "position, turn and last gap, knowing their statistics in advance (not a bound on every policy)";
  }
  std::cout << "\nworkloads:\n";
  for (const auto& [name, w] : workloads) std::cout << "  " << name << ": " << w.description << "\n";
  for (const std::string& a : above_bound) {
    std::cerr << "kvtier-replay: " << a << " hits more than the hold optimum: it may keep blocks for times\n"
                 "  that follow later requests, or know more than their classes tell\n";
  }
  return 0;
}

int RunSimulation(const kvtier::tools::Workload& workload, const SimFlags& f, uint64_t block_bytes, bool as_json) {
  kvtier::tools::SimOptions base;
  if (!f.model_config.empty()) {
    auto m = kvtier::ModelProfile::FromHfConfigFile(f.model_config);
    if (!m.ok()) {
      std::cerr << "kvtier-replay: --model-config: " << m.status().message() << "\n";
      return 4;
    }
    base.model = *m;
  }
  if (f.prefill_tflops <= 0 || f.host_gbps <= 0 || f.nvme_gbps <= 0 || f.nvme_latency_us < 0) {
    std::cerr << "kvtier-replay: --prefill-tflops, --host-gbps and --nvme-gbps must be positive\n";
    return 2;
  }
  base.prefill_flops_per_s = f.prefill_tflops * 1e12;
  if (f.gpus == 0) {
    std::cerr << "kvtier-replay: --gpus must be at least 1\n";
    return 2;
  }
  base.gpus = f.gpus;
  base.host = kvtier::TierSpeed{f.host_gbps * 1e9, 10e-6};
  base.nvme = kvtier::TierSpeed{f.nvme_gbps * 1e9, f.nvme_latency_us * 1e-6};
  base.demote = !f.drop;
  base.cost_aware_loads = !f.always_load;
  if (!f.policies.empty()) base.policies = f.policies;
  base.nvme_policy = f.nvme_policy;
  base.nvme_admit_uses = f.nvme_admit_uses;
  base.max_shadow_blocks = f.shadow_blocks;
  std::vector<uint64_t> capacities;
  uint64_t remote_blocks = 0;
  for (const std::string& t : f.tiers) {
    const size_t eq = t.find('=');
    const std::string name = eq == std::string::npos ? "" : t.substr(0, eq);
    if (name != "host" && name != "nvme" && name != "remote") {
      std::cerr << "kvtier-replay: --tier " << t << ": expected host=CAPACITY, nvme=CAPACITY or remote=CAPACITY\n";
      return 2;
    }
    std::vector<uint64_t> caps;
    for (absl::string_view c : absl::StrSplit(t.substr(eq + 1), ',')) {
      auto blocks = ParseCapacityBlocks(std::string(c), workload.block_tokens, block_bytes);
      if (!blocks.ok() || *blocks == 0) {
        std::cerr << "kvtier-replay: --tier " << t << ": "
                  << (blocks.ok() ? "less than one block" : std::string(blocks.status().message())) << "\n";
        return 2;
      }
      caps.push_back(*blocks);
    }
    if (name == "host") {
      capacities.insert(capacities.end(), caps.begin(), caps.end());
    } else if (caps.size() != 1) {
      std::cerr << "kvtier-replay: --tier " << t << ": one " << name << " capacity per run\n";
      return 2;
    } else if (name == "nvme") {
      base.nvme_blocks = caps[0];
    } else {
      remote_blocks = caps[0];
    }
  }
  if (!f.nodes.empty()) {
    if (capacities.size() != 1 || f.infinite || remote_blocks == 0) {
      std::cerr << "kvtier-replay: --nodes needs one --tier host=CAPACITY (per node) and --tier remote=CAPACITY "
                   "(the shared tier), and no --infinite\n";
      return 2;
    }
    if (f.remote_gbps <= 0 || f.remote_latency_us < 0) {
      std::cerr << "kvtier-replay: --remote-gbps must be positive and --remote-latency-us not negative\n";
      return 2;
    }
    if (!f.policies.empty() && kvtier::tools::IsCountsOnlyRow(f.policies.front())) {
      std::cerr << "kvtier-replay: --nodes runs an eviction policy on each node; " << f.policies.front()
                << " is not one\n";
      return 2;
    }
    base.capacity_blocks = capacities[0];
    return RunNodes(workload, f, base, remote_blocks, as_json);
  }
  if (remote_blocks != 0) {
    std::cerr << "kvtier-replay: --tier remote=CAPACITY is for --nodes (a shared tier under several nodes)\n";
    return 2;
  }
  if (f.nvme_admit_uses > 1 && base.nvme_blocks == 0) {
    std::cerr << "kvtier-replay: --nvme-admit-uses gates writes to NVMe: give --tier nvme=CAPACITY too\n";
    return 2;
  }
  // With the host tier alone, the default rows include the hold optimum
  // (how far a policy keeping each block for a time set by its class could
  // go), before Belady.
  if (f.policies.empty() && base.nvme_blocks == 0) {
    auto at = std::find(base.policies.begin(), base.policies.end(), "belady");
    base.policies.insert(at, std::string(kvtier::tools::kHoldOptimumPolicy));
  }
  if (f.suite) {
    if (f.infinite) {
      std::cerr << "kvtier-replay: --suite compares bounded tiers; drop --infinite\n";
      return 2;
    }
    if (capacities.empty()) capacities = {1000000 / workload.block_tokens, 3000000 / workload.block_tokens,
                                          10000000 / workload.block_tokens};
    return RunSuite(workload, f, base, capacities, as_json);
  }
  if (capacities.empty() && !f.infinite) {
    std::cerr << "kvtier-replay: --simulate needs --tier host=CAPACITY (e.g. host=3M) or --infinite\n";
    return 2;
  }
  // One set of rows per host capacity (0 here: the unbounded row).
  std::vector<uint64_t> runs = capacities;
  if (f.infinite) runs.push_back(0);
  std::vector<kvtier::tools::SimRow> rows;
  for (uint64_t cap : runs) {
    kvtier::tools::SimOptions o = base;
    o.capacity_blocks = cap;
    o.infinite = cap == 0;
    auto r = kvtier::tools::Simulate(workload, o);
    if (!r.ok()) {
      std::cerr << "kvtier-replay: " << r.status().message() << "\n";
      return 2;
    }
    rows.insert(rows.end(), r->begin(), r->end());
  }
  if (as_json) {
    for (const auto& row : rows) std::cout << row.ToJson().dump() << "\n";
    return 0;
  }
  std::cout << "kvtier-replay --simulate: " << workload.description << "\n"
            << "model " << base.model.name << " (" << kvtier::FormatBytes(base.model.KvBytesPerToken())
            << " of KV per token), " << f.gpus << " GPU(s) at " << f.prefill_tflops << " TFLOP/s prefill, host->GPU " << f.host_gbps
            << " GB/s, NVMe " << f.nvme_gbps << " GB/s + " << f.nvme_latency_us << " us"
            << (base.nvme_blocks ? (base.demote ? ", host evictions demoted" : ", host evictions dropped") : "")
            << "\n";
  kvtier::tools::Table t({"POLICY", "HOST TOKENS", "NVME TOKENS", "TOKEN HIT", "HOST", "NVME", "VS BELADY",
                          "REQUEST HIT", "REUSED TOKENS", "PREFILL SAVED", "TTFT P50", "TTFT P95"});
  for (const auto& row : rows) {
    double belady = 0;
    for (const auto& b : rows) {
      if (b.policy == "belady" && b.capacity_blocks == row.capacity_blocks) belady = b.token_hit_rate();
    }
    const double req = row.blocks_requested ? double(row.blocks_requested) : 1;
    if (kvtier::tools::IsCountsOnlyRow(row.policy)) {
      t.AddRow({row.policy, std::to_string(row.capacity_tokens), "-", Fixed(row.token_hit_rate(), 3),
                Fixed(double(row.blocks_hit_host) / req, 3), "-",
                belady > 0 ? Fixed(row.token_hit_rate() / belady, 2) : "-", "-", Fixed(row.reused_token_ratio(), 3),
                "-", "-", "-"});
      continue;
    }
    t.AddRow({row.policy + (row.is_default ? " (default)" : ""),
              row.policy == "infinite" ? "infinite" : std::to_string(row.capacity_tokens),
              row.nvme_blocks ? std::to_string(row.nvme_tokens) : "-", Fixed(row.token_hit_rate(), 3),
              Fixed(double(row.blocks_hit_host) / req, 3), Fixed(double(row.blocks_hit_nvme) / req, 3),
              belady > 0 ? Fixed(row.token_hit_rate() / belady, 2) : "-", Fixed(row.request_hit_rate(), 3),
              Fixed(row.reused_token_ratio(), 3), kvtier::tools::Duration(row.prefill_seconds_saved),
              kvtier::tools::Duration(row.TtftPercentile(50)), kvtier::tools::Duration(row.TtftPercentile(95))});
  }
  t.Print(std::cout);
  std::cout << "token hit = hit blocks / requested full blocks (prefix hits only); VS BELADY = that / the\n"
               "offline-optimal bound at the same capacity; TTFT on the simulated GPUs, queueing included\n";
  auto has_row = [&](absl::string_view policy) {
    return std::any_of(rows.begin(), rows.end(), [&](const auto& r) { return r.policy == policy; });
  };
  if (has_row(kvtier::tools::kHoldOptimumPolicy)) {
    std::cout << "hold-optimum: the most a policy could hit that keeps each block for a time set by its\n"
                 "uses, position, turn and last gap, knowing their statistics in advance, with prefix hits\n"
                 "and room at every moment relaxed (not a bound on every policy); hit counts only\n";
  }
  if (has_row(kvtier::tools::kHoldOraclePolicy)) {
    std::cout << "hold-oracle: the hold optimum's plan (how long to keep each class of block) run as a tier,\n"
                 "its statistics known in advance, so no policy kvtierd could run; hit counts only\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvtier-replay: replay a request trace (Mooncake JSONL) or a built-in multi-turn chat\n"
               "through a running kvtierd, storing real payloads and verifying every loaded byte."};
  app.set_version_flag("--version", KVTIER_VERSION);
  std::vector<std::string> sockets;
  std::string trace, model = "kvtier-replay/synthetic", block_bytes_text = "64KiB";
  uint32_t block_tokens = 0, sessions = 1;
  size_t limit = 0;
  double speed = 0;
  bool as_json = false, quiet = false, simulate = false;
  SimFlags sim;
  kvtier::tools::ChatOptions chat;
  app.add_option("-s,--socket", sockets,
                 "kvtierd's socket (default: $KVTIER_SOCKET or the default run dir); repeat it to drive several "
                 "daemons, e.g. nodes sharing a remote tier: session i uses the (i mod N)-th, so conversations "
                 "are spread round-robin");
  app.add_option("-t,--trace", trace,
                 std::string("Mooncake-format JSONL trace (") + kvtier::tools::kTraceLimitsText +
                     "); without it, the synthetic chat workload")
      ->check(CLI::ExistingFile);
  app.add_option("-n,--requests", limit, "replay at most this many requests (0: all)");
  app.add_option("--block-tokens", block_tokens, "tokens per block (default 512 for traces, 64 for the chat)");
  app.add_option("--block-bytes", block_bytes_text, "payload bytes per block, e.g. 64KiB")->capture_default_str();
  app.add_option("--sessions", sessions, "engine sessions (threads), each with its own client")->capture_default_str();
  app.add_option("--speed", speed, "replay arrival times at this speed-up (0: as fast as possible)");
  app.add_option("--model", model, "model id of the namespace to replay in")->capture_default_str();
  app.add_option("--conversations", chat.conversations, "chat: conversations")->capture_default_str();
  app.add_option("--turns", chat.turns, "chat: turns per conversation")->capture_default_str();
  app.add_option("--seed", chat.seed, "chat and --suite workloads: random seed")->capture_default_str();
  app.add_flag("--simulate", simulate,
               "no daemon: replay through the eviction policies on a simulated tier, side by side");
  app.add_option("--tier", sim.tiers,
                 "simulate: host=CAPACITY (a comma list gives one set of rows each) and nvme=CAPACITY, in "
                 "tokens (500K, 3M) or bytes (4GiB, with --block-bytes)");
  app.add_option("--policies", sim.policies,
                 "simulate: policies to compare (default lru, s3fifo, s3fifo-deep, tinylfu, arc, arc-cutoff, adaptive, holds, then hold-optimum "
                 "with the host tier alone, then belady; also none, and hold-oracle: the hold optimum's plan, its "
                 "statistics known in advance, run as a tier)")
      ->delimiter(',');
  app.add_flag("--infinite", sim.infinite, "simulate: add a row with unbounded capacity");
  app.add_option("--nvme-policy", sim.nvme_policy,
                 "simulate: the NVMe tier's policy (default lru; s3fifo, s3fifo-deep, tinylfu, arc), as tiers.nvme.policy; "
                 "the belady row uses belady on both tiers");
  app.add_option("--nvme-admit-uses", sim.nvme_admit_uses,
                 "simulate: write a host eviction to NVMe only when requests asked for the block this many times, "
                 "as tiers.nvme.admission_min_uses (1: every block; at most 15)")
      ->check(CLI::Range(1u, 15u))
      ->capture_default_str();
  app.add_option("--shadow-blocks", sim.shadow_blocks,
                 "simulate: most block identities each of the adaptive policy's shadows holds (as kvtierd); a host "
                 "tier with more room is modelled on a sample of its blocks")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32))
      ->capture_default_str();
  app.add_option("--model-config", sim.model_config,
                 "simulate: a Hugging Face config.json for the cost model (default: the Llama-3.1-8B shape)")
      ->check(CLI::ExistingFile);
  app.add_option("--prefill-tflops", sim.prefill_tflops, "simulate: GPU prefill throughput")->capture_default_str();
  app.add_option("--gpus", sim.gpus, "simulate: GPUs serving the requests, each one at a time")
      ->capture_default_str();
  app.add_option("--host-gbps", sim.host_gbps, "simulate: host -> GPU bandwidth, GB/s")->capture_default_str();
  app.add_option("--nvme-gbps", sim.nvme_gbps, "simulate: NVMe read bandwidth, GB/s")->capture_default_str();
  app.add_option("--nvme-latency-us", sim.nvme_latency_us, "simulate: NVMe read latency")->capture_default_str();
  app.add_option("--nodes", sim.nodes,
                 "simulate: N kvtierd nodes (a comma list: one set of rows each), each with the --tier host= and "
                 "nvme= capacities and --gpus GPUs, local-only and pooled over --tier remote=CAPACITY")
      ->delimiter(',')
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--routing", sim.routings,
                 "simulate --nodes: round-robin, affinity (a conversation to one node), prefix (the node holding the "
                 "longest prefix); a comma list (default all three)")
      ->delimiter(',')
      ->check(CLI::IsMember({"round-robin", "affinity", "prefix"}));
  app.add_option("--write-policy", sim.write_policy,
                 "simulate --nodes: what goes to the remote tier: demoted (what leaves the last local tier) or "
                 "committed (every computed block)")
      ->check(CLI::IsMember({"demoted", "committed"}))
      ->capture_default_str();
  app.add_option("--remote-gbps", sim.remote_gbps, "simulate --nodes: remote tier -> host bandwidth, GB/s")
      ->capture_default_str();
  app.add_option("--remote-latency-us", sim.remote_latency_us, "simulate --nodes: a remote round trip")
      ->capture_default_str();
  app.add_flag("--suite", sim.suite,
               "simulate: run the policies on every workload of the suite (chat, agent, docqa, scan, tenants; and "
               "the --trace as \"conversation\") at each --tier host= capacity (default 1M,3M,10M), one table");
  app.add_option("--workloads", sim.workloads,
                 "simulate --suite: only these workloads (a comma list of chat, agent, docqa, scan, tenants, and "
                 "conversation: the --trace)")
      ->delimiter(',');
  app.add_flag("--drop", sim.drop, "simulate: drop host evictions instead of demoting them to NVMe");
  app.add_flag("--always-load", sim.always_load,
               "simulate: load every NVMe hit, even when recomputing it would be faster");
  app.add_flag("--json", as_json, "print one JSON object with the results (with --simulate: one per row)");
  app.add_flag("-q,--quiet", quiet, "no progress output");
  app.footer("Examples:\n  kvtier-replay                                   # synthetic multi-turn chat\n"
             "  kvtier-replay --trace conversation_trace.jsonl --block-bytes 32KiB\n"
             "  kvtier-replay --sessions 2 --json | jq .token_hit_rate\n"
             "  kvtier-replay --simulate --trace conversation_trace.jsonl --tier host=1M,3M,10M --infinite\n"
             "  kvtier-replay --simulate --trace conversation_trace.jsonl --tier host=3M --tier nvme=10M "
             "--tier remote=100M --nodes 2,4,8,16\n"
             "Exit codes: 0 ok, 1 a session failed or a loaded byte was wrong, 2 usage error, 4 the trace or "
             "--model-config is unreadable or wrong");
  if (kvtier::tools::PrintDocsIfAsked(
          argc, argv, app, "kvtier-replay", 1, "replay request traces through kvtierd, or simulate policies",
          {{"See also", "kvtierd(8), kvtierctl(1), kvtier-bench(1)"}})) {
    return 0;
  }
  KVTIER_CLI_PARSE(app, argc, argv);

  if (sockets.size() > 1) {
    if (app.count("--sessions") == 0) sessions = static_cast<uint32_t>(sockets.size());
    if (sessions % sockets.size() != 0) {
      std::cerr << "kvtier-replay: --sessions " << sessions << " does not spread evenly over " << sockets.size()
                << " daemons (--socket): give a multiple of " << sockets.size() << "\n";
      return 2;
    }
  }
  auto block_bytes = kvtier::ParseBytes(block_bytes_text);
  if (!block_bytes.ok() || *block_bytes == 0) {
    std::cerr << "kvtier-replay: --block-bytes: " << block_bytes.status().message() << "\n";
    return 2;
  }
  kvtier::tools::Workload workload;
  if (!trace.empty()) {
    auto w = kvtier::tools::LoadMooncakeTrace(trace, block_tokens ? block_tokens : 512, limit);
    if (!w.ok()) {
      std::cerr << "kvtier-replay: " << w.status().message() << "\n";
      return 4;
    }
    workload = std::move(*w);
  } else {
    chat.block_tokens = block_tokens ? block_tokens : 64;
    workload = kvtier::tools::SyntheticChat(chat);
    if (limit > 0 && workload.requests.size() > limit) workload.requests.resize(limit);
  }
  if (!simulate && (sim.suite || !sim.workloads.empty())) {
    std::cerr << "kvtier-replay: --suite and --workloads go with --simulate\n";
    return 2;
  }
  if (!sim.suite && !sim.workloads.empty()) {
    std::cerr << "kvtier-replay: --workloads picks workloads of --suite; add --suite\n";
    return 2;
  }
  if (sim.suite && !sim.nodes.empty()) {
    std::cerr << "kvtier-replay: --suite runs one node's tiers; drop --nodes (or --suite)\n";
    return 2;
  }
  if (sim.nvme_admit_uses > 1 && !sim.nodes.empty()) {
    std::cerr << "kvtier-replay: --nvme-admit-uses is not simulated with --nodes\n";
    return 2;
  }
  if (simulate) {
    sim.has_trace = !trace.empty();
    sim.quiet = quiet || as_json;
    sim.seed = chat.seed;
    if (sim.suite && trace.empty()) workload.block_tokens = 512;  // capacities are parsed in 512-token blocks
    for (auto& r : workload.requests) {
      if (r.keys.empty() && !r.tokens.empty()) {
        r.keys = kvtier::ChainBlockKeys(kvtier::HashAlgorithm::kSha256, r.tokens, workload.block_tokens);
      }
    }
    return RunSimulation(workload, sim, *block_bytes, as_json);
  }

  kvtier::tools::ReplayOptions opts;
  opts.socket_paths = sockets;
  opts.sessions = sessions;
  opts.speed = speed;
  opts.progress = !quiet && !as_json;
  opts.ns.model_id = model;
  opts.ns.model_revision = "replay";
  opts.ns.kv_dtype = "fp16";
  opts.ns.kv_layout = "layer_major";
  opts.ns.block_tokens = workload.block_tokens;
  opts.ns.block_bytes = *block_bytes;
  if (opts.progress) {
    std::cerr << "kvtier-replay: " << workload.description << ", " << kvtier::FormatBytes(*block_bytes)
              << " per block, " << sessions << " session(s)";
    if (sockets.size() > 1) std::cerr << " over " << sockets.size() << " daemons";
    std::cerr << "\n";
  }
  kvtier::tools::ReplayResult r = kvtier::tools::Replay(workload, opts);

  if (as_json) {
    std::cout << r.ToJson().dump() << "\n";
  } else {
    std::cout << "\nkvtier-replay summary (" << r.requests << " requests in " << kvtier::tools::Duration(r.elapsed_s)
              << ")\n";
    kvtier::tools::Table t({"METRIC", "VALUE", "MEANING"});
    t.AddRow({"token hit rate", Fixed(r.token_hit_rate(), 3), "hit blocks / requested full blocks"});
    t.AddRow({"request hit rate", Fixed(r.request_hit_rate(), 3), "requests that reused at least one block"});
    t.AddRow({"reused-token ratio", Fixed(r.reused_token_ratio(), 3), "reused tokens / prompt tokens"});
    t.AddRow({"hits from host", std::to_string(r.blocks_hit_host), "blocks found in host memory"});
    t.AddRow({"hits from lower tiers", std::to_string(r.blocks_hit_lower),
              "blocks promoted from NVMe or a shared tier by the load"});
    t.AddRow({"load failures", std::to_string(r.load_failures), "hits that failed to come back: recomputed"});
    t.AddRow({"prompt tokens", std::to_string(r.prompt_tokens), ""});
    t.AddRow({"stored", kvtier::FormatBytes(r.bytes_stored), std::to_string(r.blocks_stored) + " blocks"});
    t.AddRow({"loaded", kvtier::FormatBytes(r.bytes_loaded), std::to_string(r.blocks_loaded) + " blocks, every byte checked"});
    t.AddRow({"verification failures", std::to_string(r.verify_failures), "loaded bytes that were not the block's own"});
    t.AddRow({"stores refused", std::to_string(r.store_refused),
              r.store_refused == 0 ? "no room (none)" : "no room; the first: " + kvtier::tools::Printable(r.store_refused_reason)});
    t.AddRow({"lookup p50 / p99", Fixed(r.lookup.PercentileUs(50), 1) + " / " + Fixed(r.lookup.PercentileUs(99), 1) + " us", "leased lookup round trip"});
    t.AddRow({"load p50 / p99", Fixed(r.load.PercentileUs(50), 1) + " / " + Fixed(r.load.PercentileUs(99), 1) + " us", "load + reading every byte"});
    t.AddRow({"store p50 / p99", Fixed(r.store.PercentileUs(50), 1) + " / " + Fixed(r.store.PercentileUs(99), 1) + " us", "reserve + fill + commit"});
    t.Print(std::cout);
    if (r.per_socket.size() > 1) {
      std::cout << "\nper daemon\n";
      kvtier::tools::Table d({"SOCKET", "REQUESTS", "BLOCKS REQUESTED", "BLOCKS HIT", "TOKEN HIT RATE"});
      for (const auto& p : r.per_socket) {
        d.AddRow({kvtier::tools::Printable(p.socket), std::to_string(p.requests), std::to_string(p.blocks_requested),
                  std::to_string(p.blocks_hit),
                  Fixed(p.blocks_requested ? double(p.blocks_hit) / double(p.blocks_requested) : 0.0, 3)});
      }
      d.Print(std::cout);
    }
  }
  if (!r.error.empty()) {
    std::cerr << "kvtier-replay: a session stopped: " << r.error << "\n";
    return 1;
  }
  if (r.verify_failures > 0) {
    std::cerr << "kvtier-replay: " << r.verify_failures << " loaded blocks had wrong bytes\n";
    return 1;
  }
  return 0;
}
