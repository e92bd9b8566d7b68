// SPDX-License-Identifier: Apache-2.0
// host: store + load of 2 MiB blocks through the client API (fill an arena
// slot in place, commit, look up with a lease, load, copy out, release)
// against plain memcpy of the same bytes through a buffer pool of the same
// size as the arena, in the same run.
#include <sys/mman.h>

#include <cstring>

#include "core/units.h"
#include "kvtier/client.h"
#include "tools/bench/bench.h"
#include "tools/common/daemon_process.h"

namespace kvtier::bench {
namespace {

constexpr uint64_t kBlock = 2ull << 20;
constexpr uint64_t kSlots = 128;  // arena of 256 MiB

std::byte* MapPrefaulted(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

}  // namespace

std::vector<Metric> RunHostSuite(const Context& ctx) {
  std::optional<SuiteDaemon> sd =
      StartSuiteDaemon(ctx, "[tiers.host]\ncapacity = \"256MiB\"\nprefault = true\n", "bench/host", 512, kBlock);
  if (!sd) return {};
  Client& client = *sd->client;
  std::byte* src = MapPrefaulted(kBlock);
  std::byte* dst = MapPrefaulted(kBlock);
  std::byte* pool = MapPrefaulted(kBlock * kSlots);
  if (!src || !dst || !pool) return {};
  std::memset(src, 0x5a, kBlock);
  uint64_t next_key = 0;
  auto key_of = [](uint64_t i) {
    BlockKey k;
    std::memcpy(k.bytes.data(), &i, sizeof(i));
    return k;
  };
  // One pass over every slot first, so the client's page tables are warm.
  for (uint64_t i = 0; i < kSlots; ++i) {
    BlockKey k = key_of(next_key++);
    auto t = client.StoreBegin({&k, 1});
    if (t.ok() && t->needed) std::memset(t->slots[0].data, 0, kBlock);
    if (t.ok()) (void)client.StoreCommit(*t);
  }
  const int64_t iters = ctx.quick ? 64 : 1024;
  const int reps = ctx.quick ? 1 : 7;
  bool failed = false;

  auto baseline = [&](benchmark::State& st) {
    uint64_t i = 0;
    for (auto _ : st) {
      std::byte* slot = pool + (i++ % kSlots) * kBlock;
      std::memcpy(slot, src, kBlock);
      std::memcpy(dst, slot, kBlock);
      benchmark::DoNotOptimize(dst);
      benchmark::ClobberMemory();
    }
    st.SetBytesProcessed(st.iterations() * 2 * static_cast<int64_t>(kBlock));
    st.counters["GBps"] = benchmark::Counter(static_cast<double>(st.iterations()) * 2 * kBlock / 1e9,
                                             benchmark::Counter::kIsRate);
  };
  auto kvtier_path = [&](benchmark::State& st) {
    for (auto _ : st) {
      BlockKey k = key_of(next_key++);
      auto t = client.StoreBegin({&k, 1});
      if (!t.ok() || t->needed != 1) {
        failed = true;
        st.SkipWithError("store failed");
        break;
      }
      std::memcpy(t->slots[0].data, src, kBlock);
      (void)client.StoreCommit(*t);
      auto hit = client.Lookup({&k, 1}, {.lease = true});
      auto views = client.Load(hit->lease, {&k, 1});
      if (!views.ok()) {
        failed = true;
        st.SkipWithError("load failed");
        break;
      }
      std::memcpy(dst, (*views)[0].data, kBlock);
      benchmark::DoNotOptimize(dst);
      (void)client.Release(hit->lease);
    }
    st.SetBytesProcessed(st.iterations() * 2 * static_cast<int64_t>(kBlock));
    st.counters["GBps"] = benchmark::Counter(static_cast<double>(st.iterations()) * 2 * kBlock / 1e9,
                                             benchmark::Counter::kIsRate);
  };
  RegisterPairs("host/memcpy_2MiB", baseline, "host/store_load_2MiB", kvtier_path, iters, reps);

  Runs runs = RunRegistered(ctx);
  const bool verified = !failed && std::memcmp(dst, src, kBlock) == 0;
  munmap(src, kBlock);
  munmap(dst, kBlock);
  munmap(pool, kBlock * kSlots);
  Metric m;
  m.suite = "host";
  m.metric = "store_load_bandwidth_2MiB";
  m.value = MedianCounter(runs, "host/store_load_2MiB", "GBps");
  m.baseline_name = "memcpy";
  m.baseline = MedianCounter(runs, "host/memcpy_2MiB", "GBps");
  m.unit = "GB/s";
  m.speedup = PairedSpeedup(runs, "host/store_load_2MiB", "host/memcpy_2MiB", "GBps", true);
  m.target = 0.8;
  m.note = verified ? "store (fill slot in place + commit) + leased lookup + load + copy out + release"
                    : "FAILED: the last loaded block did not match what was stored";
  if (!verified) m.speedup = 0;
  return {m};
}

}  // namespace kvtier::bench
