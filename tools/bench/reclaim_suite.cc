// SPDX-License-Identifier: Apache-2.0
// reclaim: what background reclaim buys a store. An engine stores one 2 MiB
// block at a time, with a pause between stores (its prefill), into a host
// tier that is full, with an NVMe tier behind it. Without background
// reclaim (watermarks 1 / 1) every store evicts on its own path, and the
// victim's bytes are copied into NVMe staging before its slot is free; with
// it (0.90 / 0.75) a background thread has already made room. Same daemon
// binary, same workload, in the same run: the baseline is the daemon with
// reclaim off.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kvtier/client.h"
#include "tools/bench/bench.h"
#include "tools/common/daemon_process.h"

namespace kvtier::bench {
namespace {

constexpr uint64_t kBlock = 2ull << 20;

struct Latencies {
  double p50_ms = 0, p99_ms = 0;
  // Host evictions dropped, or whose NVMe write failed or was refused
  // (blocks lost), and background demotions that waited for the device.
  uint64_t lost = 0, waited = 0;
  bool ok = false;
};

double Percentile(std::vector<double> v, double pct) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(pct / 100.0 * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

// Stores `stores` blocks, one per call, `pause` apart, after filling the
// 64 MiB arena once; the latency of each StoreBegin + fill + StoreCommit.
Latencies Run(const Context& ctx, double high, double low, int stores, std::chrono::microseconds pause) {
  const std::string config = absl::StrCat("[tiers.host]\ncapacity = \"64MiB\"\nprefault = true\nhigh_watermark = ",
                                          high, "\nlow_watermark = ", low,
                                          "\n[tiers.nvme]\ncapacity = \"1GiB\"\nallow_buffered = true\n");
  std::optional<SuiteDaemon> sd = StartSuiteDaemon(ctx, config, "bench/reclaim", 512, kBlock);
  if (!sd) return {};
  Client& client = *sd->client;
  uint64_t next = 1;
  auto store_one = [&]() -> bool {
    BlockKey k{};
    std::memcpy(k.bytes.data(), &next, sizeof(next));
    ++next;
    auto t = client.StoreBegin({&k, 1});
    if (!t.ok()) return false;
    if (t->needed) std::memset(t->slots[0].data, static_cast<int>(next & 0xff), kBlock);
    return client.StoreCommit(*t).ok();
  };
  // Fill the arena (32 slots) and then some, so the tier starts full.
  for (int i = 0; i < 40; ++i) {
    if (!store_one()) return {};
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<double> ms;
  ms.reserve(stores);
  for (int i = 0; i < stores; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!store_one()) return {};
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::this_thread::sleep_for(pause);
  }
  Latencies out{Percentile(ms, 50), Percentile(ms, 99)};
  absl::StatusOr<nlohmann::json> st = sd->daemon->Status();
  if (!st.ok()) return {};
  for (const nlohmann::json& tier : (*st)["tiers"]) {
    if (tier.value("tier", "") != "host") continue;
    out.lost = tier.value("demotions_failed", uint64_t{0}) + tier.value("evictions_dropped", uint64_t{0});
    out.waited = tier.value("demotions_waited", uint64_t{0});
  }
  out.ok = true;
  return out;
}

}  // namespace

std::vector<Metric> RunReclaimSuite(const Context& ctx) {
  const int stores = ctx.quick ? 60 : 400;
  const int pairs = ctx.quick ? 1 : 3;
  const auto pause = std::chrono::microseconds(2000);  // ~ a short prefill
  std::vector<double> p50_on, p50_off, p99_on, p99_off;
  for (int i = 0; i < pairs; ++i) {
    const Latencies off = Run(ctx, 1.0, 1.0, stores, pause);
    const Latencies on = Run(ctx, 0.90, 0.75, stores, pause);
    if (!off.ok || !on.ok) {
      std::fprintf(stderr, "kvtier-bench reclaim: a run failed\n");
      return {};
    }
    if (!ctx.json) {
      std::printf("reclaim pair %d: store p50 %.3f ms (off %.3f), p99 %.3f ms (off %.3f); blocks lost %llu "
                  "(off %llu), demotions that waited %llu\n",
                  i + 1, on.p50_ms, off.p50_ms, on.p99_ms, off.p99_ms, static_cast<unsigned long long>(on.lost),
                  static_cast<unsigned long long>(off.lost), static_cast<unsigned long long>(on.waited));
    }
    p50_on.push_back(on.p50_ms);
    p50_off.push_back(off.p50_ms);
    p99_on.push_back(on.p99_ms);
    p99_off.push_back(off.p99_ms);
  }
  const std::string note = absl::StrCat(stores, " stores of one 2 MiB block, 2 ms apart, into a full 64 MiB host tier "
                                        "with NVMe behind; medians of ", pairs, " runs each");
  std::vector<Metric> out;
  out.push_back(Metric{"reclaim", "store_p50_full_tier", Median(p50_on), "reclaim_off", Median(p50_off), "ms",
                       LowerIsBetter(Median(p50_on), Median(p50_off)), std::nullopt, note});
  out.push_back(Metric{"reclaim", "store_p99_full_tier", Median(p99_on), "reclaim_off", Median(p99_off), "ms",
                       LowerIsBetter(Median(p99_on), Median(p99_off)), std::nullopt, note});
  return out;
}

}  // namespace kvtier::bench
