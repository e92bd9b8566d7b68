// SPDX-License-Identifier: Apache-2.0
// lookup: throughput of 64-key lookups against an index of 1M blocks, and the
// daemon's resident memory per indexed block, before and after a churn of
// new blocks through the tier. Baselines from the same run: a
// bare absl::flat_hash_map<key, offset> in this process (what an index costs
// with no daemon, no IPC, no eviction state), for both figures.
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "core/units.h"
#include "kvtier/client.h"
#include "tools/bench/bench.h"
#include "tools/common/daemon_process.h"

namespace kvtier::bench {
namespace {

BlockKey KeyOf(uint64_t i) {
  // Spread like real hashes: a cheap mix of the counter in every 8 bytes.
  BlockKey k;
  uint64_t x = i * 0x9e3779b97f4a7c15ull + 1;
  for (int w = 0; w < 4; ++w) {
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    std::memcpy(k.bytes.data() + 8 * w, &x, 8);
  }
  return k;
}

}  // namespace

std::vector<Metric> RunLookupSuite(const Context& ctx) {
  const uint64_t kBlocks = ctx.quick ? 100000 : 1000000;
  constexpr uint64_t kBlockBytes = 4096;
  constexpr size_t kBatch = 64;
  // Room for every block above the reclaimer's high watermark (0.95 by
  // default): with the arena sized to the blocks exactly, background reclaim
  // evicted ~10% of them and lookups missed.
  std::optional<SuiteDaemon> sd = StartSuiteDaemon(
      ctx, "[tiers.host]\ncapacity = \"" + std::to_string(kBlocks * kBlockBytes * 5 / 4) + "\"\n", "bench/lookup", 16,
      kBlockBytes);
  if (!sd) return {};
  tools::DaemonProcess& daemon = *sd->daemon;
  Client& client = *sd->client;

  // Populate: slots are reserved and committed without writing payloads, so
  // the arena's pages stay untouched and RssAnon counts the index alone.
  const uint64_t rss_before = RssAnonBytes(daemon.pid());
  if (!ctx.json) std::fprintf(stderr, "kvtier-bench: indexing %llu blocks...\n", static_cast<unsigned long long>(kBlocks));
  // The blocks as chains of 4096 keys, from key i on.
  std::vector<BlockKey> batch;
  auto chain_from = [&](uint64_t i) {
    batch.clear();
    for (uint64_t j = i; j < std::min(kBlocks, i + 4096); ++j) batch.push_back(KeyOf(j));
  };
  for (uint64_t i = 0; i < kBlocks; i += batch.size()) {
    chain_from(i);
    auto t = client.StoreBegin(batch);
    if (!t.ok() || !client.StoreCommit(*t).ok()) {
      std::fprintf(stderr, "kvtier-bench: populate failed: %s\n", t.status().ToString().c_str());
      return {};
    }
  }
  const uint64_t rss_indexed = RssAnonBytes(daemon.pid());
  // Then look every chain up with a lease, as an engine does before it loads:
  // the default (adaptive) policy's shadows learn from leased lookups, so they
  // are full when a daemon has served a while and count here too.
  for (uint64_t i = 0; i < kBlocks; i += batch.size()) {
    chain_from(i);
    auto r = client.Lookup(batch, {.lease = true});
    if (!r.ok() || r->hit_blocks != batch.size() || !client.Release(r->lease).ok()) {
      std::fprintf(stderr, "kvtier-bench: a leased lookup of stored blocks failed or missed: %s\n",
                   r.ok() ? "missed" : r.status().ToString().c_str());
      return {};
    }
  }
  const uint64_t rss_after = RssAnonBytes(daemon.pid());
  const double daemon_bytes_per_block = static_cast<double>(rss_after - rss_before) / static_cast<double>(kBlocks);
  const double index_bytes_per_block = static_cast<double>(rss_indexed - rss_before) / static_cast<double>(kBlocks);

  const uint64_t map_before = RssAnonBytes(getpid());
  auto* map = new absl::flat_hash_map<BlockKey, uint64_t>();
  for (uint64_t i = 0; i < kBlocks; ++i) map->emplace(KeyOf(i), i * kBlockBytes);
  const uint64_t map_after = RssAnonBytes(getpid());
  const double map_bytes_per_block = static_cast<double>(map_after - map_before) / static_cast<double>(kBlocks);

  const int64_t iters = ctx.quick ? 2000 : 20000;
  const int reps = ctx.quick ? 1 : 5;
  std::vector<std::vector<BlockKey>> batches(1024);
  std::mt19937_64 rng(3);
  // Distinct keys per batch: a request that names a block twice is refused.
  for (auto& b : batches) {
    absl::flat_hash_set<uint64_t> drawn;
    while (b.size() < kBatch) {
      const uint64_t i = rng() % kBlocks;
      if (drawn.insert(i).second) b.push_back(KeyOf(i));
    }
  }
  bool wrong = false;

  auto baseline = [&](benchmark::State& st) {
    uint64_t i = 0, found = 0;
    for (auto _ : st) {
      for (const BlockKey& k : batches[i++ % batches.size()]) found += map->contains(k);
    }
    if (found != static_cast<uint64_t>(st.iterations()) * kBatch) wrong = true;
    st.counters["keys_per_s"] = benchmark::Counter(static_cast<double>(st.iterations()) * kBatch,
                                                   benchmark::Counter::kIsRate);
  };
  auto kvtier_path = [&](benchmark::State& st) {
    uint64_t i = 0;
    for (auto _ : st) {
      auto r = client.Lookup(batches[i++ % batches.size()]);
      if (!r.ok() || r->hit_blocks != kBatch) wrong = true;
    }
    st.counters["keys_per_s"] = benchmark::Counter(static_cast<double>(st.iterations()) * kBatch,
                                                   benchmark::Counter::kIsRate);
  };
  RegisterPairs("lookup/flat_hash_map_64", baseline, "lookup/kvtier_64", kvtier_path, iters, reps);

  Runs runs = RunRegistered(ctx);
  delete map;

  // Last (the lookups above ran on the 1M blocks alone), churn: twice as
  // many new blocks again, in short chains that nobody looks up, so the tier
  // evicts ~1.8M blocks it took on probation. The policies' ghosts (keys of
  // evicted blocks: S3-FIFO keeps 1.5 per block, ARC up to 1) fill only in a
  // tier that evicts, and a daemon that has served a while does; they count
  // in the steady-state figure.
  constexpr uint64_t kChurnRounds = 2;
  if (!ctx.json) std::fprintf(stderr, "kvtier-bench: churning %llu more blocks through the tier...\n",
                              static_cast<unsigned long long>(kChurnRounds * kBlocks));
  constexpr uint64_t kChurnChain = 16;
  bool churned_all = true;
  for (uint64_t i = kBlocks; churned_all && i < (1 + kChurnRounds) * kBlocks; i += kChurnChain) {
    batch.clear();
    for (uint64_t j = i; j < i + kChurnChain; ++j) batch.push_back(KeyOf(j));
    auto t = client.StoreBegin(batch);
    if (!t.ok() || !client.StoreCommit(*t).ok()) {
      std::fprintf(stderr, "kvtier-bench: churn failed: %s\n", t.status().ToString().c_str());
      churned_all = false;
    }
  }
  // The block count and the memory from one moment: the reclaimer may
  // still be evicting, so read the count, then the memory, then the count.
  auto indexed_and_evicted = [&]() -> std::pair<uint64_t, uint64_t> {
    auto st = daemon.Status();
    if (!st.ok() || !st->contains("indexed_blocks") || !(*st)["tiers"].is_array() || (*st)["tiers"].empty()) {
      return {0, 0};
    }
    return {(*st)["indexed_blocks"].get<uint64_t>(), (*st)["tiers"][0].value("evictions", uint64_t{0})};
  };
  uint64_t resident = 0, evicted = 0, rss_churned = 0;
  for (int tries = 0; tries < 20; ++tries) {
    const auto before = indexed_and_evicted();
    rss_churned = RssAnonBytes(daemon.pid());
    std::tie(resident, evicted) = indexed_and_evicted();
    if (resident == before.first) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double churned_bytes_per_block = !churned_all || resident == 0 || rss_churned < rss_before
                                             ? 0
                                             : static_cast<double>(rss_churned - rss_before) / static_cast<double>(resident);

  daemon.Stop(std::chrono::seconds(60));  // cleanly, so a heap profiler around kvtierd can write its report

  Metric tput;
  tput.suite = "lookup";
  tput.metric = "lookup_keys_per_s_64_batch_1M_index";
  tput.value = MedianCounter(runs, "lookup/kvtier_64", "keys_per_s");
  tput.baseline_name = "in_process_flat_hash_map";
  tput.baseline = MedianCounter(runs, "lookup/flat_hash_map_64", "keys_per_s");
  tput.unit = "keys/s";
  tput.speedup = PairedSpeedup(runs, "lookup/kvtier_64", "lookup/flat_hash_map_64", "keys_per_s", true);
  tput.note = wrong ? "FAILED: a lookup missed a present block"
                    : "64 present keys per lookup through the rings; the baseline has no IPC at all";
  if (wrong) tput.speedup = 0;
  Metric mem;
  mem.suite = "lookup";
  mem.metric = "daemon_rss_bytes_per_indexed_block";
  mem.value = daemon_bytes_per_block;
  mem.baseline_name = "flat_hash_map_key_to_offset";
  mem.baseline = map_bytes_per_block;
  mem.unit = "bytes";
  mem.speedup = LowerIsBetter(mem.value, mem.baseline);
  // At most 160 B per block, as a ratio to the bare map of the same run (at
  // 1M blocks: --quick's 100k leave more of the fixed costs per block).
  constexpr double kMaxBytesPerBlock = 160;
  if (!ctx.quick && mem.baseline > 0) mem.target = mem.baseline / kMaxBytesPerBlock;
  mem.note = "RssAnon growth of kvtierd over " + std::to_string(kBlocks) +
             " blocks stored, then looked up with a lease (index, slot tables, policy state and its shadows; " +
             absl::StrFormat("%.1f", index_bytes_per_block) +
             " B after the stores alone) vs a bare key->offset map; target <= " +
             std::to_string(static_cast<int>(kMaxBytesPerBlock)) + " B";
  Metric churned = mem;
  churned.metric = "daemon_rss_bytes_per_indexed_block_after_churn";
  churned.value = churned_bytes_per_block;
  churned.speedup = LowerIsBetter(churned.value, churned.baseline);
  churned.note = absl::StrFormat(
      "RssAnon growth of kvtierd once %llu more blocks went through the tier (%llu evicted), per block still "
      "indexed (%llu): the above plus the policies' ghosts of evicted keys; target <= %d B",
      static_cast<unsigned long long>(kChurnRounds * kBlocks), static_cast<unsigned long long>(evicted),
      static_cast<unsigned long long>(resident), static_cast<int>(kMaxBytesPerBlock));
  if (churned_bytes_per_block == 0) {
    churned.note = "FAILED: the churn ended early, or the daemon's status gave no indexed_blocks";
    churned.speedup = 0;
  }
  return {tput, mem, churned};
}

}  // namespace kvtier::bench
