// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/driver.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "tiers/device_backend.h"
#include "tools/common/man_page.h"
#include "tools/common/daemon_process.h"
#include "tools/common/table.h"

namespace kvtier::bench {
namespace {

// The options BenchMain parses (its usage line and the manual page).
const std::vector<tools::ManOption>& Options() {
  static const auto* options = new std::vector<tools::ManOption>{
      {"--json", "", "print one JSON object per metric instead of the table"},
      {"--quick", "", "fewer and shorter points (a smoke run; figures are not for quoting)"},
      {"--kvtierd", "PATH", "the kvtierd binary the suites start (default: the one beside this program, else PATH)"},
      {"--dir", "PATH", "nvme, fs: put its files there (default: a temporary folder)"},
      {"--pairs", "N", "nvme, fs, remote: runs of ours and of the baseline per point (default 5)"},
      {"--only", "TEXT", "nvme: only points whose name contains TEXT (e.g. 256KiB_qd1, journal, restart)"},
      {"--device", "cuda|sim", "gpu: the device backend (sim runs the suite on the simulated device)"},
      {"--cluster", "DIR", "remote: a Redis Cluster scripts/redis-cluster started there (--tenant bench)"},
      {"--benchmark_*", "", "passed to Google Benchmark (e.g. --benchmark_min_time=0.5)"},
      {"-h, --help", "", "print the usage and exit"}};
  return *options;
}

std::string ManOf(const std::string& program, const std::vector<Suite>& suites) {
  tools::ManPage p;
  p.name = program;
  p.section = 1;
  p.summary = "kvtier's microbenchmarks, each against a baseline measured in the same run";
  std::string names;
  for (const auto& s : suites) names += s.name + "|";
  p.synopsis = program + " " + names + "all [OPTIONS]";
  p.description =
      "Runs one suite (or all) and prints, per metric, kvtier's figure, the baseline's (memcpy, a Unix-socket round "
      "trip, fio, a hiredis loop, cudaMemcpyAsync), the speedup and the target where there is one. Suites that "
      "need a CUDA device or a Redis Cluster are skipped in all without one, and exit 77 when asked for alone. "
      "Build with the release preset for figures worth quoting.";
  p.options = Options();
  p.commands_title = "Suites";
  for (const auto& s : suites) {
    std::string help;
    for (absl::string_view line : absl::StrSplit(s.help, '\n')) {
      help += (help.empty() ? "" : " ") + std::string(absl::StripLeadingAsciiWhitespace(line));
    }
    p.commands.push_back({s.name, help, {}});
  }
  p.commands.push_back({"all", "every suite (CUDA-only ones where a CUDA device answers)", {}});
  p.sections.push_back({"Exit status", "0: done, every target met. 1: a target was missed or a suite failed. "
                                       "2: a usage error. 77: the suite asked for needs a CUDA device or a cluster."});
  p.sections.push_back({"See also", "kvtierd(8), kvtier-replay(1)"});
  return tools::RenderMan(p);
}

void Usage(const std::string& program, const std::vector<Suite>& suites) {
  std::string names;
  for (const auto& s : suites) names += s.name + "|";
  std::fprintf(stderr, "usage: %s %sall [--json] [--quick] [--kvtierd PATH] [--dir PATH] [benchmark flags]\nsuites:",
               program.c_str(), names.c_str());
  const char* indent = " ";
  for (const auto& s : suites) {
    std::fprintf(stderr, "%s%-7s %s\n", indent, s.name.c_str(), s.help.c_str());
    indent = "        ";
  }
  std::fprintf(stderr, "        all     every suite%s\n"
                       "--json prints one JSON object per metric; exit code 1 when a target is missed.\n",
               suites.size() > 1 ? " (CUDA-only ones where a CUDA device answers)" : "");
  std::fprintf(stderr, "options:\n");
  for (const tools::ManOption& o : Options()) {
    const std::string flag = o.names + (o.arg.empty() ? "" : " " + o.arg);
    std::fprintf(stderr, "  %-18s %s\n", flag.c_str(), o.doc.c_str());
  }
}

void Print(const std::vector<Metric>& metrics, bool json) {
  if (json) {
    for (const auto& m : metrics) std::cout << m.ToJson().dump() << "\n";
    return;
  }
  std::cout << "\n";
  tools::Table t({"SUITE", "METRIC", "KVTIER", "BASELINE", "", "UNIT", "SPEEDUP", "TARGET"});
  for (const auto& m : metrics) {
    t.AddRow({m.suite, m.metric, tools::Fixed(m.value, 3), m.baseline_name, tools::Fixed(m.baseline, 3), m.unit,
              tools::Fixed(m.speedup, 2) + "x",
              m.target ? ">= " + tools::Fixed(*m.target, 2) + "x " + (m.speedup >= *m.target ? "ok" : "MISSED")
                       : "-"});
  }
  t.Print(std::cout);
  std::cout << "(speedup > 1 means kvtier is better than the baseline measured in the same run)\n";
}

}  // namespace

int BenchMain(int argc, char** argv, const std::string& program, const std::vector<Suite>& suites) {
  if (argc == 2 && std::string(argv[1]) == "--man") {
    std::cout << ManOf(program, suites);
    return 0;
  }
  Context ctx;
  std::string suite;
  std::vector<char*> bench_args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      ctx.json = true;
    } else if (a == "--quick") {
      ctx.quick = true;
    } else if (a == "--kvtierd" && i + 1 < argc) {
      ctx.kvtierd = argv[++i];
    } else if (a == "--dir" && i + 1 < argc) {
      ctx.dir = argv[++i];
    } else if (a == "--pairs" && i + 1 < argc) {
      ctx.pairs = std::atoi(argv[++i]);
      if (ctx.pairs < 1) {
        std::fprintf(stderr, "%s: --pairs wants a positive count\n", program.c_str());
        return 2;
      }
    } else if (a == "--device" && i + 1 < argc) {
      ctx.device = argv[++i];
      if (ctx.device != "cuda" && ctx.device != "sim") {
        std::fprintf(stderr, "%s: --device is cuda or sim\n", program.c_str());
        return 2;
      }
    } else if (a == "--cluster" && i + 1 < argc) {
      ctx.cluster = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      ctx.only = argv[++i];
    } else if (a == "-h" || a == "--help") {
      Usage(program, suites);
      return 0;
    } else if (a.rfind("--benchmark_", 0) == 0) {
      bench_args.push_back(argv[i]);
    } else if (suite.empty() && a[0] != '-') {
      suite = a;
    } else {
      std::fprintf(stderr, "%s: unknown argument %s\n", program.c_str(), a.c_str());
      Usage(program, suites);
      return 2;
    }
  }
  if (suite.empty()) {
    Usage(program, suites);
    return 2;
  }
  if (ctx.kvtierd.empty()) ctx.kvtierd = tools::FindKvtierd();
  int bargc = static_cast<int>(bench_args.size());
  benchmark::Initialize(&bargc, bench_args.data());

  std::vector<Metric> metrics;
  bool any = false;
  for (const auto& s : suites) {
    if (suite != s.name && suite != "all") continue;
    any = true;
    std::string why;
    if (s.needs_cuda && ctx.device == "cuda" && ProbeCudaDevices(&why) == 0) {
      std::fprintf(stderr, "%s: %s suite skipped: no CUDA device answers (%s); --device sim runs it on the "
                           "host-simulated device\n", program.c_str(), s.name.c_str(), why.c_str());
      if (suite == s.name) return 77;
      continue;
    }
    if (s.needs_cluster && ctx.cluster.empty()) {
      std::fprintf(stderr, "%s: %s suite skipped: it needs a Redis Cluster (scripts/redis-cluster start DIR --tenant "
                           "bench, then --cluster DIR)\n", program.c_str(), s.name.c_str());
      if (suite == s.name) return 77;
      continue;
    }
    auto m = s.run(ctx);
    if (m.empty()) std::fprintf(stderr, "%s: suite %s produced no figures\n", program.c_str(), s.name.c_str());
    metrics.insert(metrics.end(), m.begin(), m.end());
  }
  if (!any) {
    std::fprintf(stderr, "%s: unknown suite \"%s\"\n", program.c_str(), suite.c_str());
    Usage(program, suites);
    return 2;
  }
  bool missed = metrics.empty();
  for (const auto& m : metrics) missed |= m.target && m.speedup < *m.target;
  Print(metrics, ctx.json);
  return missed ? 1 : 0;
}

}  // namespace kvtier::bench
