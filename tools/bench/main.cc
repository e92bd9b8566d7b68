// kvtier-bench: microbenchmarks with a baseline measured in the same run.
//
//   kvtier-bench ipc|host|lookup|nvme|reclaim|gpu|engine|all [--json] [--quick] [--kvtierd PATH]
//                [Google Benchmark flags, e.g. --benchmark_min_time=...]
//
// Build with the release preset for meaningful figures.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "tiers/device_backend.h"
#include "tools/bench/bench.h"
#include "tools/common/daemon_process.h"
#include "tools/common/table.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: kvtier-bench SUITE [--json] [--quick] [--kvtierd PATH] [--dir PATH] [benchmark flags]\n"
               "suites: ipc     1-key lookup round trip through the rings vs a Unix socket\n"
               "        host    store+load of 2 MiB blocks through the client API vs memcpy\n"
               "        lookup  64-key lookups against 1M indexed blocks; daemon memory per block\n"
               "        nvme    NVMe tier writes/reads vs fio, journal group commit, restart time\n"
               "                (--dir PATH: put its files there, default a temp dir; --pairs N: runs\n"
               "                of ours and fio per point, default 5; --only TEXT: points whose name\n"
               "                contains TEXT, e.g. 256KiB_qd1, journal, restart)\n"
               "        reclaim store latency into a full host tier, background reclaim on vs off\n"
               "        gpu     pinned host<->device copies vs cudaMemcpyAsync, gather/scatter kernels vs a\n"
               "                device-to-device copy, layer-wise load (--device sim: on the simulated device;\n"
               "                exit 77 when no CUDA device answers)\n"
               "        engine  time to first token of the tiny engine, 4096-token prompt with 3584 cached, per tier\n"
               "                (host, NVMe, GPU tier on the simulated device) vs no cache (--pairs N: repetitions)\n"
               "        all     every suite (gpu only where a CUDA device answers)\n"
               "--json prints one JSON object per metric; exit code 1 when a target is missed.\n");
}

}  // namespace

int main(int argc, char** argv) {
  kvtier::bench::Context ctx;
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
        std::fprintf(stderr, "kvtier-bench: --pairs wants a positive count\n");
        return 2;
      }
    } else if (a == "--device" && i + 1 < argc) {
      ctx.device = argv[++i];
      if (ctx.device != "cuda" && ctx.device != "sim") {
        std::fprintf(stderr, "kvtier-bench: --device is cuda or sim\n");
        return 2;
      }
    } else if (a == "--only" && i + 1 < argc) {
      ctx.only = argv[++i];
    } else if (a == "-h" || a == "--help") {
      Usage();
      return 0;
    } else if (a.rfind("--benchmark_", 0) == 0) {
      bench_args.push_back(argv[i]);
    } else if (suite.empty() && a[0] != '-') {
      suite = a;
    } else {
      std::fprintf(stderr, "kvtier-bench: unknown argument %s\n", a.c_str());
      Usage();
      return 2;
    }
  }
  if (suite.empty()) {
    Usage();
    return 2;
  }
  if (ctx.kvtierd.empty()) ctx.kvtierd = kvtier::tools::FindKvtierd();
  int bargc = static_cast<int>(bench_args.size());
  benchmark::Initialize(&bargc, bench_args.data());

  std::vector<kvtier::bench::Metric> metrics;
  auto run = [&](const std::string& name, auto fn) {
    if (suite == name || suite == "all") {
      auto m = fn(ctx);
      if (m.empty()) std::fprintf(stderr, "kvtier-bench: suite %s produced no figures\n", name.c_str());
      metrics.insert(metrics.end(), m.begin(), m.end());
      return true;
    }
    return false;
  };
  bool any = false;
  any |= run("ipc", kvtier::bench::RunIpcSuite);
  any |= run("host", kvtier::bench::RunHostSuite);
  any |= run("lookup", kvtier::bench::RunLookupSuite);
  any |= run("nvme", kvtier::bench::RunNvmeSuite);
  any |= run("reclaim", kvtier::bench::RunReclaimSuite);
  any |= run("engine", kvtier::bench::RunEngineSuite);
  std::string why;
  if ((suite == "gpu" || suite == "all") && ctx.device == "cuda" && kvtier::ProbeCudaDevices(&why) == 0) {
    std::fprintf(stderr, "kvtier-bench: gpu suite skipped: no CUDA device answers (%s); --device sim runs it on "
                         "the host-simulated device\n", why.c_str());
    if (suite == "gpu") return 77;
    any = true;
  } else {
    any |= run("gpu", kvtier::bench::RunGpuSuite);
  }
  if (!any) {
    std::fprintf(stderr, "kvtier-bench: unknown suite \"%s\"\n", suite.c_str());
    Usage();
    return 2;
  }
  bool missed = metrics.empty();
  for (const auto& m : metrics) missed |= m.target && m.speedup < *m.target;
  if (ctx.json) {
    for (const auto& m : metrics) std::cout << m.ToJson().dump() << "\n";
  } else {
    std::cout << "\n";
    kvtier::tools::Table t({"SUITE", "METRIC", "KVTIER", "BASELINE", "", "UNIT", "SPEEDUP", "TARGET"});
    for (const auto& m : metrics) {
      t.AddRow({m.suite, m.metric, kvtier::tools::Fixed(m.value, 3), m.baseline_name,
                kvtier::tools::Fixed(m.baseline, 3), m.unit, kvtier::tools::Fixed(m.speedup, 2) + "x",
                m.target ? ">= " + kvtier::tools::Fixed(*m.target, 2) + "x " + (m.speedup >= *m.target ? "ok" : "MISSED")
                         : "-"});
    }
    t.Print(std::cout);
    std::cout << "(speedup > 1 means kvtier is better than the baseline measured in the same run)\n";
  }
  return missed ? 1 : 0;
}
