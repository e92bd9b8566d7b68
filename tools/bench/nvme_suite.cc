// SPDX-License-Identifier: Apache-2.0
// nvme: the NVMe tier against fio on the same file system, in the same run.
//
//  - sequential-slot write and random-slot read of 2 MiB and 256 KiB blocks at
//    device queue depths 1, 8 and 32, against fio (ioengine=io_uring,
//    direct=1, same block size and depth). The tier's writes include what fio
//    does not do: a header, a checksum, a copy into staging and the journal
//    (group commit, fdatasync) before a block counts as written.
//  - journal: blocks made durable per second with group commit, against one
//    fdatasync per block.
//  - restart: time to reopen a tier holding N blocks (journal replay and a
//    header check per block), against fio reading N 4 KiB headers at random.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/units.h"
#include "nlohmann/json.hpp"
#include "tiers/nvme_format.h"
#include "tiers/nvme_tier.h"
#include "tools/bench/bench.h"
#include "tools/common/daemon_process.h"

namespace kvtier::bench {
namespace {

BlockMeta MetaFor(uint64_t i, uint64_t bytes) {
  BlockMeta m;
  std::memcpy(m.key.bytes.data(), &i, 8);
  m.ns.bytes[0] = 1;
  m.payload_bytes = bytes;
  return m;
}

struct FioResult {
  double bytes_per_s = 0;  // 0 on failure
  double lat_p50_us = 0;   // submission to completion, per I/O
};

// Runs fio. end_fsync: fio fsyncs the file at the end, inside its measured time.
FioResult RunFio(const std::string& file, const std::string& rw, uint64_t bs, uint32_t qd, uint64_t size,
                 bool end_fsync = false) {
  const std::string cmd = absl::StrCat("fio --name=kvtier --filename=", file, " --rw=", rw, " --bs=", bs,
                                       " --iodepth=", qd, " --ioengine=io_uring --direct=1 --size=", size,
                                       end_fsync ? " --end_fsync=1" : "",
                                       " --lat_percentiles=1 --output-format=json 2>/dev/null");
  nlohmann::json j = CommandJson(cmd);
  if (j.is_discarded() || !j.contains("jobs")) return {};
  const auto& job = j["jobs"][0][rw == "write" ? "write" : "read"];
  FioResult r;
  r.bytes_per_s = job.value("bw_bytes", 0.0);
  if (job.contains("lat_ns") && job["lat_ns"].contains("percentile")) {
    r.lat_p50_us = job["lat_ns"]["percentile"].value("50.000000", 0.0) / 1e3;
  }
  return r;
}

double Fio(const std::string& file, const std::string& rw, uint64_t bs, uint32_t qd, uint64_t size,
           bool end_fsync = false) {
  return RunFio(file, rw, bs, qd, size, end_fsync).bytes_per_s;
}

struct Tier {
  std::unique_ptr<NvmeTier> tier;
  std::vector<SlotHandle> slots;
  // The device's time for the last read (the tier's read observer): how much
  // of a lone read's latency is the device's, how much the path around it.
  std::shared_ptr<std::atomic<uint64_t>> last_service_ns = std::make_shared<std::atomic<uint64_t>>(0);
};

std::optional<Tier> OpenTier(const std::string& dir, uint64_t capacity, uint32_t qd, uint64_t block, bool group) {
  NvmeTierOptions o;
  o.dirs = {dir};
  o.capacity_bytes = capacity;
  o.segment_bytes = 64ull << 20;
  o.queue_depth = qd;
  o.staging_bytes = std::max<uint64_t>(64ull << 20, 4ull * qd * SlotBytesFor(block));
  o.group_commit = group;
  std::vector<RecoveredBlock> rec;
  auto t = NvmeTier::Open(o, &rec);
  if (!t.ok()) {
    std::fprintf(stderr, "kvtier-bench: NVMe tier in %s: %s\n", dir.c_str(), std::string(t.status().message()).c_str());
    return std::nullopt;
  }
  Tier tier{std::move(*t), {}};
  tier.tier->SetReadObserver([last = tier.last_service_ns](uint64_t, const IoTiming& timing) {
    last->store(timing.service_ns, std::memory_order_relaxed);
  });
  return tier;
}

// Writes n blocks to consecutive slots the way the daemon demotes: at
// demotion priority (write-back journaling), retrying while staging is full;
// the device sees at most the tier's queue depth. Returns bytes/s until the
// last block is durable (a Sync() at the end).
double WriteAll(Tier& t, uint64_t n, uint64_t block, const std::vector<std::byte>& payload) {
  std::atomic<uint64_t> done{0}, failed{0};
  t.slots.clear();
  const uint64_t start = MonotonicNanos();
  for (uint64_t i = 0; i < n; ++i) {
    auto s = t.tier->Reserve(BlockMeta{.payload_bytes = block});
    if (!s.ok()) break;
    t.slots.push_back(*s);
    for (;;) {
      // A refusal (staging busy) comes back inline, before Write returns.
      auto refused = std::make_shared<std::atomic<bool>>(false);
      auto returned = std::make_shared<std::atomic<bool>>(false);
      t.tier->Put(*s, MetaFor(i, block), payload, IoPriority::kDemote, [&, refused, returned](absl::Status st) {
        if (absl::IsResourceExhausted(st) && !returned->load()) {
          refused->store(true);
          return;
        }
        if (!st.ok()) failed.fetch_add(1);
        done.fetch_add(1);
      });
      returned->store(true);
      if (!refused->load()) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  if (!t.tier->Sync().ok()) return 0;
  while (done.load() < t.slots.size()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  const double secs = static_cast<double>(MonotonicNanos() - start) / 1e9;
  if (failed.load() > 0) return 0;
  return static_cast<double>(t.slots.size() * block) / secs;
}

// Reads every written slot once in random order into page-aligned buffers
// (as the daemon reads into host arena slots). The tier runs at most its
// queue depth on the device; the caller keeps `window` reads outstanding so
// the tier always has the next one, as the daemon does when it loads a
// prefix of many blocks.
double ReadRandom(Tier& t, uint64_t block, uint32_t window) {
  std::vector<size_t> order(t.slots.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(42));
  struct Free {
    void operator()(std::byte* p) const { free(p); }
  };
  std::vector<std::unique_ptr<std::byte, Free>> owned;
  std::vector<std::span<std::byte>> bufs;
  for (uint32_t b = 0; b < window; ++b) {
    owned.emplace_back(static_cast<std::byte*>(aligned_alloc(4096, block)));
    bufs.emplace_back(owned.back().get(), block);
  }
  std::vector<std::atomic<bool>> busy(window);
  std::atomic<uint64_t> done{0}, failed{0};
  const uint64_t start = MonotonicNanos();
  size_t next = 0;
  while (next < order.size()) {
    const uint64_t seen = done.load(std::memory_order_acquire);
    bool issued = false;
    for (uint32_t b = 0; b < window && next < order.size(); ++b) {
      if (busy[b].load(std::memory_order_acquire)) continue;
      busy[b].store(true);
      issued = true;
      const size_t i = order[next++];
      t.tier->Get(t.slots[i], MetaFor(i, block), bufs[b], IoPriority::kLoad, [&, b](absl::Status st) {
        if (!st.ok()) failed.fetch_add(1);
        busy[b].store(false, std::memory_order_release);
        done.fetch_add(1, std::memory_order_release);
        done.notify_one();
      });
    }
    // Sleep until a read completes rather than spin: on a small machine a
    // spinning caller takes the core the I/O thread and interrupts need.
    if (!issued) done.wait(seen, std::memory_order_acquire);
  }
  for (uint64_t d = done.load(); d < order.size(); d = done.load()) done.wait(d);
  const double secs = static_cast<double>(MonotonicNanos() - start) / 1e9;
  if (failed.load() > 0) return 0;
  return static_cast<double>(order.size() * block) / secs;
}

struct LoneReads {
  double p50_us = 0;          // Read() to its callback, the payload verified
  double service_p50_us = 0;  // the device's part of it (IoTiming::service_ns)
  double woken_p50_us = 0;    // Read() to a caller asleep on the callback running again
};

// Median microseconds of one read at a time (nothing else outstanding):
// the latency one lone load sees, the I/O thread's hand-off and the checks
// included. A daemon's consumer runs in the callback; a caller that sleeps
// until then also pays its own wake-up (woken_p50_us).
LoneReads ReadLatencyP50(Tier& t, uint64_t block, size_t samples) {
  std::byte* buf = static_cast<std::byte*>(aligned_alloc(4096, block));
  std::mt19937_64 rng(7);
  std::vector<double> us, service_us, woken_us;
  for (size_t k = 0; k < samples && !t.slots.empty(); ++k) {
    const size_t i = rng() % t.slots.size();
    // Shared with the callback, which may still be notifying when the
    // reader has woken and moved on.
    struct Done {
      std::atomic<bool> fin{false};
      bool ok = false;          // written before fin, read after
      uint64_t t_done = 0;      // likewise
    };
    auto done = std::make_shared<Done>();
    const uint64_t t0 = MonotonicNanos();
    t.tier->Get(t.slots[i], MetaFor(i, block), {buf, block}, IoPriority::kLoad, [done](absl::Status st) {
      done->t_done = MonotonicNanos();
      done->ok = st.ok();
      done->fin.store(true, std::memory_order_release);
      done->fin.notify_one();
    });
    // Sleep until the callback (a futex wait), as fio sleeps in
    // io_uring_enter: a caller that polls keeps a CPU busy, and on a small
    // VM a busy vCPU slows the device's completions by tens of microseconds
    // (docs/benchmarks.md).
    done->fin.wait(false, std::memory_order_acquire);
    const uint64_t t_done = done->t_done;
    const bool ok = done->ok;
    if (!ok) {
      free(buf);
      return {};
    }
    woken_us.push_back(static_cast<double>(MonotonicNanos() - t0) / 1e3);
    us.push_back(static_cast<double>(t_done - t0) / 1e3);
    service_us.push_back(static_cast<double>(t.last_service_ns->load(std::memory_order_relaxed)) / 1e3);
  }
  free(buf);
  return LoneReads{Median(us), Median(service_us), Median(woken_us)};
}

}  // namespace

std::vector<Metric> RunNvmeSuite(const Context& ctx) {
  if (system("fio --version >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "kvtier-bench: fio is not installed (apt-get install fio); the nvme suite needs it as its baseline\n");
    return {};
  }
  tools::TempDir dir;
  const std::string base = ctx.dir.empty() ? dir.path() : ctx.dir;
  const uint64_t total = ctx.quick ? (64ull << 20) : (512ull << 20);
  const int pairs = ctx.pairs > 0 ? ctx.pairs : (ctx.quick ? 1 : 5);
  auto wanted = [&](const std::string& label) { return ctx.only.empty() || label.find(ctx.only) != std::string::npos; };
  std::vector<Metric> out;
  for (uint64_t block : {uint64_t{2} << 20, uint64_t{256} << 10}) {
    for (uint32_t qd : {1u, 8u, 32u}) {
      const std::string label = absl::StrCat(block == (2u << 20) ? "2MiB" : "256KiB", "_qd", qd);
      if (!wanted(label)) continue;
      const uint64_t n = total / block;
      std::vector<std::byte> payload(block);
      for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 31);
      std::vector<double> ours_w, fio_w, fio_w_nosync, ours_r, fio_r, ratio_w, ratio_w_nosync, ratio_r, ours_lat,
          ours_service, ours_woken, ratio_lat, fio_lat;
      for (int p = 0; p < pairs; ++p) {
        const std::string tdir = absl::StrCat(base, "/tier-", label, "-", p);
        const std::string fio_file = absl::StrCat(base, "/fio-", label);
        std::error_code ec;
        std::filesystem::create_directories(tdir, ec);
        // Alternate which goes first, pair by pair.
        double fw = 0, fw_nosync = 0, fr = 0, ow = 0, orr = 0, flat = 0;
        LoneReads olat;
        auto run_fio = [&] {
          fw_nosync = Fio(fio_file, "write", block, qd, n * block);
          fw = Fio(fio_file, "write", block, qd, n * block, /*end_fsync=*/true);
          const FioResult r = RunFio(fio_file, "randread", block, qd, n * block);
          fr = r.bytes_per_s;
          flat = r.lat_p50_us;
          std::filesystem::remove(fio_file, ec);
        };
        auto run_ours = [&] {
          auto t = OpenTier(tdir, n * SlotBytesFor(block) + (64ull << 20), qd, block, true);
          if (!t) return;
          // Steady state: a cache overwrites its slots. The first pass also
          // turns the preallocated (unwritten) extents into written ones, as
          // fio lays out its file before it measures.
          (void)WriteAll(*t, n, block, payload);
          for (auto it = t->slots.rbegin(); it != t->slots.rend(); ++it) (void)t->tier->Remove(*it, BlockMeta{});
          ow = WriteAll(*t, n, block, payload);
          orr = ReadRandom(*t, block, 2 * qd);
          if (qd == 1) olat = ReadLatencyP50(*t, block, std::min<size_t>(t->slots.size(), 500));
        };
        if (p % 2 == 0) {
          run_fio();
          run_ours();
        } else {
          run_ours();
          run_fio();
        }
        std::filesystem::remove_all(tdir, ec);
        ours_w.push_back(ow / 1e9);
        fio_w.push_back(fw / 1e9);
        fio_w_nosync.push_back(fw_nosync / 1e9);
        ratio_w_nosync.push_back(HigherIsBetter(ow, fw_nosync));
        ours_r.push_back(orr / 1e9);
        fio_r.push_back(fr / 1e9);
        ratio_w.push_back(HigherIsBetter(ow, fw));
        ratio_r.push_back(HigherIsBetter(orr, fr));
        ours_lat.push_back(olat.p50_us);
        ours_woken.push_back(olat.woken_p50_us);
        ratio_lat.push_back(LowerIsBetter(olat.p50_us, flat));
        ours_service.push_back(olat.service_p50_us);
        fio_lat.push_back(flat);
        if (!ctx.json) {
          std::fprintf(stderr,
                       "  nvme %s pair %d: write %.2f vs fio %.2f GB/s (%.2f without its final fsync), "
                       "random read %.2f vs fio %.2f GB/s",
                       label.c_str(), p, ow / 1e9, fw / 1e9, fw_nosync / 1e9, orr / 1e9, fr / 1e9);
          if (qd == 1) {
            std::fprintf(stderr, ", one read at a time p50 %.0f (device %.0f, to a sleeping caller %.0f) vs fio %.0f us",
                         olat.p50_us, olat.service_p50_us, olat.woken_p50_us, flat);
          }
          std::fprintf(stderr, "\n");
        }
      }
      // Our writes count once durable (data and journal synced), so the
      // baseline is fio with the same contract: --end_fsync=1. The ratio
      // against fio without any flush is reported beside it.
      out.push_back(Metric{"nvme", "seq_write_" + label, Median(ours_w), "fio_end_fsync", Median(fio_w), "GB/s",
                           Median(ratio_w), 0.9,
                           "until durable: slot header + xxh3 + staging copy + journal (group commit)"});
      out.push_back(Metric{"nvme", "seq_write_" + label + "_vs_unsynced_fio", Median(ours_w), "fio_no_fsync",
                           Median(fio_w_nosync), "GB/s", Median(ratio_w_nosync), std::nullopt,
                           "fio's writes may still sit in a volatile cache when it stops the clock"});
      out.push_back(Metric{"nvme", "rand_read_" + label, Median(ours_r), "fio", Median(fio_r), "GB/s",
                           Median(ratio_r), 0.9,
                           absl::StrCat("tier queue depth ", qd, ", ", 2 * qd,
                                        " reads outstanding; header and payload checksum verified")});
      if (qd == 1) {
        // The bar for 256 KiB: a lone read within 1.15x of fio's (median of
        // the pairs' ratios, as the machine's speed drifts between pairs).
        // At 2 MiB the payload's checksum alone is ~8% of fio's time.
        out.push_back(Metric{"nvme", "read_latency_p50_" + label, Median(ours_lat), "fio_qd1", Median(fio_lat), "us",
                             Median(ratio_lat), block == (256u << 10) ? std::optional<double>(1 / 1.15) : std::nullopt,
                             "one read at a time, Read() to its callback: I/O thread hand-off, header and payload "
                             "checksum"});
        out.push_back(Metric{"nvme", "read_latency_p50_" + label + "_to_sleeping_caller", Median(ours_woken), "fio_qd1",
                             Median(fio_lat), "us", LowerIsBetter(Median(ours_woken), Median(fio_lat)), std::nullopt,
                             "the lone read above plus the wake-up of a caller asleep on its callback"});
        out.push_back(Metric{"nvme", "read_service_p50_" + label, Median(ours_service), "fio_qd1", Median(fio_lat),
                             "us", LowerIsBetter(Median(ours_service), Median(fio_lat)), std::nullopt,
                             "the device's part of the lone read above (hand-over to completion, IoTiming)"});
      }
    }
  }

  // Journal: durable blocks/s, group commit vs one fdatasync per block.
  if (wanted("journal")) {
    const uint64_t block = 16 << 10;
    const uint64_t n = ctx.quick ? 500 : 4000;
    std::vector<std::byte> payload(block, std::byte{7});
    double rates[2] = {0, 0};
    for (int g = 0; g < 2; ++g) {
      const std::string tdir = absl::StrCat(base, "/journal-", g);
      std::error_code ec;
      std::filesystem::create_directories(tdir, ec);
      auto t = OpenTier(tdir, 256ull << 20, 32, block, g == 0);
      if (t) {
        const double bps = WriteAll(*t, n, block, payload);
        rates[g] = bps / block;
      }
      t.reset();
      std::filesystem::remove_all(tdir, ec);
    }
    out.push_back(Metric{"nvme", "journal_durable_blocks_per_s", rates[0], "fdatasync_per_block", rates[1],
                         "blocks/s", HigherIsBetter(rates[0], rates[1]), std::nullopt,
                         "16 KiB blocks, 32 in flight; a block counts once its journal record is synced"});
  }

  // Restart: reopen a tier holding N blocks.
  if (wanted("restart")) {
    const uint64_t n = ctx.quick ? 10000 : 100000;
    const uint64_t block = 4096;
    const std::string tdir = base + "/restart";
    std::error_code ec;
    std::filesystem::create_directories(tdir, ec);
    std::vector<std::byte> payload(block, std::byte{9});
    const uint64_t capacity = (n * SlotBytesFor(block) / (64ull << 20) + 2) * (64ull << 20);
    double reopen_s = 0;
    {
      auto t = OpenTier(tdir, capacity, 32, block, true);
      if (t) WriteAll(*t, n, block, payload);
    }
    if (!ctx.json) std::fprintf(stderr, "  nvme restart: reopening a tier of %llu blocks\n", static_cast<unsigned long long>(n));
    {
      const uint64_t t0 = MonotonicNanos();
      auto t = OpenTier(tdir, capacity, 32, block, true);
      reopen_s = static_cast<double>(MonotonicNanos() - t0) / 1e9;
      if (t && t->tier->Stats().recovery.blocks != n) {
        std::fprintf(stderr, "kvtier-bench: recovered %llu of %llu blocks\n",
                     static_cast<unsigned long long>(t->tier->Stats().recovery.blocks),
                     static_cast<unsigned long long>(n));
        reopen_s = 0;
      }
    }
    std::filesystem::remove_all(tdir, ec);
    const std::string fio_file = base + "/fio-headers";
    const double bw = Fio(fio_file, "randread", 4096, 32, n * 4096);
    std::filesystem::remove(fio_file, ec);
    const double fio_s = bw > 0 ? static_cast<double>(n * 4096) / bw : 0;
    out.push_back(Metric{"nvme", absl::StrCat("restart_seconds_", n, "_blocks"), reopen_s,
                         "fio_randread_4KiB_headers", fio_s, "s", LowerIsBetter(reopen_s, fio_s), std::nullopt,
                         "journal replay + one header read and check per block"});
  }
  return out;
}

}  // namespace kvtier::bench
