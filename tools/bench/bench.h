// SPDX-License-Identifier: Apache-2.0
// kvtier-bench: Google Benchmark suites that each measure kvtier and a
// baseline in the same run and report the ratio.
#ifndef KVTIER_TOOLS_BENCH_BENCH_H_
#define KVTIER_TOOLS_BENCH_BENCH_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kvtier/client.h"
#include "nlohmann/json.hpp"
#include "tools/common/daemon_process.h"

namespace kvtier::bench {

// One reported figure: kvtier's value, the baseline's, and how many times
// better kvtier is (> 1 is better, whatever the unit's direction).
struct Metric {
  std::string suite, metric;
  double value = 0;
  std::string baseline_name;
  double baseline = 0;
  std::string unit;
  double speedup = 0;
  std::optional<double> target;  // minimum speedup the issue asks for
  std::string note;
  nlohmann::json ToJson() const;
};

// speedup for "lower is better" units (latency, bytes per block).
inline double LowerIsBetter(double value, double baseline) { return value > 0 ? baseline / value : 0; }
// speedup for "higher is better" units (bandwidth, throughput).
inline double HigherIsBetter(double value, double baseline) { return baseline > 0 ? value / baseline : 0; }

struct Context {
  std::string kvtierd;  // binary path
  bool json = false;
  bool quick = false;   // fewer iterations (smoke runs in tests)
  std::string dir;      // nvme suite: where files go (default: a temp dir)
  int pairs = 0;        // nvme suite: ours/fio pairs per point; engine suite: repetitions (0: the default)
  std::string only;     // nvme suite: run only points whose label contains this
  std::string device = "cuda";  // gpu suite: "cuda", or "sim" for the host-simulated device
  std::string cluster;  // remote suite: a folder scripts/redis-cluster started a cluster in
};

// Registers benchmarks, runs them (echoing Google Benchmark's console lines
// unless json), and returns every run's counters by benchmark name, one map
// per repetition.
using Runs = std::map<std::string, std::vector<std::map<std::string, double>>>;
Runs RunRegistered(const Context& ctx);

double Median(std::vector<double> v);
// What a shell command line prints on stdout, parsed as JSON (discarded
// when it is not): the baselines' reports (fio --output-format=json).
nlohmann::json CommandJson(const std::string& cmd);
// Median across repetitions of one counter.
double MedianCounter(const Runs& runs, const std::string& bench, const std::string& counter);

// Registers kvtier's benchmark and its baseline as `pairs` alternating single
// repetitions (baseline, kvtier, baseline, ...), so that a machine whose speed
// drifts affects both sides of each pair alike.
void RegisterPairs(const std::string& baseline_name, std::function<void(benchmark::State&)> baseline,
                   const std::string& kvtier_name, std::function<void(benchmark::State&)> kvtier,
                   int64_t iterations, int pairs);
// The median over pairs of each pair's speedup for `counter`.
double PairedSpeedup(const Runs& runs, const std::string& kvtier_name, const std::string& baseline_name,
                     const std::string& counter, bool higher_is_better);

// A kvtierd started for one suite, and one client attached to it.
struct SuiteDaemon {
  std::unique_ptr<tools::DaemonProcess> daemon;
  std::unique_ptr<Client> client;
};
// Starts kvtierd with `config` and attaches a client to namespace `model`;
// nullopt (with the reason on stderr) on failure.
std::optional<SuiteDaemon> StartSuiteDaemon(const Context& ctx, const std::string& config,
                                            const std::string& model, uint32_t block_tokens,
                                            uint64_t block_bytes);

// Anonymous resident memory of a process (RssAnon), in bytes.
uint64_t RssAnonBytes(int pid);

std::vector<Metric> RunIpcSuite(const Context& ctx);
std::vector<Metric> RunHostSuite(const Context& ctx);
std::vector<Metric> RunLookupSuite(const Context& ctx);
std::vector<Metric> RunNvmeSuite(const Context& ctx);
std::vector<Metric> RunReclaimSuite(const Context& ctx);
std::vector<Metric> RunGpuSuite(const Context& ctx);
std::vector<Metric> RunRemoteSuite(const Context& ctx);
std::vector<Metric> RunFsSuite(const Context& ctx);

}  // namespace kvtier::bench

#endif  // KVTIER_TOOLS_BENCH_BENCH_H_
