// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/bench.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kvtier::bench {
namespace {

// Keeps every run's counters; echoes to the console reporter when asked.
class Collector : public benchmark::BenchmarkReporter {
 public:
  explicit Collector(bool echo) : echo_(echo) {}
  bool ReportContext(const Context& c) override { return echo_ ? console_.ReportContext(c) : true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    if (echo_) console_.ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration) continue;
      std::map<std::string, double> c;
      for (const auto& [k, v] : r.counters) c[k] = v.value;
      c["real_time_s"] = r.real_accumulated_time;
      c["iterations"] = static_cast<double>(r.iterations);
      runs_[r.run_name.function_name].push_back(std::move(c));
    }
  }
  void Finalize() override {
    if (echo_) console_.Finalize();
  }
  Runs& runs() { return runs_; }

 private:
  bool echo_;
  benchmark::ConsoleReporter console_;
  Runs runs_;
};

}  // namespace

nlohmann::json Metric::ToJson() const {
  nlohmann::json j{{"suite", suite},   {"metric", metric}, {"value", value},     {"baseline_name", baseline_name},
                   {"baseline", baseline}, {"unit", unit},     {"speedup", speedup}};
  if (target) {
    j["target"] = *target;
    j["pass"] = speedup >= *target;
  }
  if (!note.empty()) j["note"] = note;
  return j;
}

Runs RunRegistered(const Context& ctx) {
  Collector collector(!ctx.json);
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::ClearRegisteredBenchmarks();
  return std::move(collector.runs());
}

nlohmann::json CommandJson(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return nlohmann::json(nlohmann::json::value_t::discarded);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return nlohmann::json::parse(out, nullptr, false);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double MedianCounter(const Runs& runs, const std::string& bench, const std::string& counter) {
  std::vector<double> v;
  auto it = runs.find(bench);
  if (it == runs.end()) return 0;
  for (const auto& rep : it->second) {
    auto c = rep.find(counter);
    if (c != rep.end()) v.push_back(c->second);
  }
  return Median(v);
}

void RegisterPairs(const std::string& baseline_name, std::function<void(benchmark::State&)> baseline,
                   const std::string& kvtier_name, std::function<void(benchmark::State&)> kvtier,
                   int64_t iterations, int pairs) {
  for (int p = 0; p < pairs; ++p) {
    benchmark::RegisterBenchmark(baseline_name.c_str(), baseline)
        ->Iterations(iterations)->UseRealTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(kvtier_name.c_str(), kvtier)
        ->Iterations(iterations)->UseRealTime()->Unit(benchmark::kMicrosecond);
  }
}

double PairedSpeedup(const Runs& runs, const std::string& kvtier_name, const std::string& baseline_name,
                     const std::string& counter, bool higher_is_better) {
  auto a = runs.find(kvtier_name);
  auto b = runs.find(baseline_name);
  if (a == runs.end() || b == runs.end()) return 0;
  std::vector<double> ratios;
  for (size_t i = 0; i < a->second.size() && i < b->second.size(); ++i) {
    auto va = a->second[i].find(counter);
    auto vb = b->second[i].find(counter);
    if (va == a->second[i].end() || vb == b->second[i].end()) continue;
    ratios.push_back(higher_is_better ? HigherIsBetter(va->second, vb->second) : LowerIsBetter(va->second, vb->second));
  }
  return Median(ratios);
}

std::optional<SuiteDaemon> StartSuiteDaemon(const Context& ctx, const std::string& config,
                                            const std::string& model, uint32_t block_tokens,
                                            uint64_t block_bytes) {
  SuiteDaemon sd;
  sd.daemon = std::make_unique<tools::DaemonProcess>(config, ctx.kvtierd);
  if (absl::Status s = sd.daemon->Start(); !s.ok()) {
    std::fprintf(stderr, "kvtier-bench: cannot start kvtierd (%s): %s\n", ctx.kvtierd.c_str(),
                 std::string(s.message()).c_str());
    return std::nullopt;
  }
  AttachOptions ao;
  ao.socket_path = sd.daemon->socket_path();
  ao.client_name = "kvtier-bench";
  ao.ns.model_id = model;
  ao.ns.kv_dtype = "fp16";
  ao.ns.kv_layout = "layer_major";
  ao.ns.block_tokens = block_tokens;
  ao.ns.block_bytes = block_bytes;
  auto client = Client::Attach(ao);
  if (!client.ok()) {
    std::fprintf(stderr, "kvtier-bench: attach: %s\n", client.status().ToString().c_str());
    return std::nullopt;
  }
  sd.client = std::move(*client);
  return sd;
}

uint64_t RssAnonBytes(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) {
      std::istringstream ss(line.substr(8));
      uint64_t kb = 0;
      ss >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

}  // namespace kvtier::bench
