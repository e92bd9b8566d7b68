// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/driver.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "tiers/device_backend.h"
#include "tools/common/daemon_process.h"
#include "tools/common/table.h"

namespace kvtier::bench {
namespace {

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
