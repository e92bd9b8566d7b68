// SPDX-License-Identifier: Apache-2.0
// gpu: the device paths, each against a bare copy of the same bytes in the
// same run.
//  - pinned host <-> device: per-block copies through the device backend the
//    daemon uses (a memfd mapping registered with the device, as the host
//    arena is), against one bare cudaMemcpyAsync of all the bytes. Target 0.9x.
//  - gather / scatter between a paged engine cache and layer-major blocks
//    (the KV kernels), against a device-to-device copy of the same bytes.
//    Target 0.8x. FP8 gather and the checksum kernel are reported alongside.
//  - layer-wise load: a block copied in and scattered layer by layer; time
//    until layer 0 is in the engine's pages against time until all are.
// `--device sim` runs the same code on the host-simulated device (baseline:
// memcpy), which is how tests exercise the suite on machines without a GPU.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>

#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/str_cat.h"
#include "os/shm.h"
#include "kernels/kv_kernels.h"
#include "tiers/device_backend.h"
#include "tools/bench/bench.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kBlock = 2ull << 20;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A bare copy of `bytes`, start to finish: cudaMemcpyAsync on a stream of its
// own then a synchronize, or memcpy on the simulated device.
class BareCopy {
 public:
  explicit BareCopy(bool cuda) : cuda_(cuda) {
#ifdef KVTIER_HAVE_CUDA
    if (cuda_) cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
#endif
  }
  ~BareCopy() {
#ifdef KVTIER_HAVE_CUDA
    if (cuda_) cudaStreamDestroy(stream_);
#endif
  }
  bool Copy(void* dst, const void* src, uint64_t bytes) {
#ifdef KVTIER_HAVE_CUDA
    if (cuda_) {
      return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_) == cudaSuccess &&
             cudaStreamSynchronize(stream_) == cudaSuccess;
    }
#endif
    std::memcpy(dst, src, bytes);
    return true;
  }

 private:
  bool cuda_;
#ifdef KVTIER_HAVE_CUDA
  cudaStream_t stream_ = nullptr;
#endif
};

struct Pair {
  std::vector<double> ours, base;  // seconds per repetition
};

// Fails loudly: a benchmark that silently measures nothing is worse than none.
#define BENCH_CHECK(expr)                                                            \
  do {                                                                               \
    if (!(expr)) {                                                                   \
      std::fprintf(stderr, "kvtier-bench gpu: %s failed at line %d\n", #expr, __LINE__); \
      return {};                                                                     \
    }                                                                                \
  } while (0)

}  // namespace

std::vector<Metric> RunGpuSuite(const Context& ctx) {
  const bool cuda = ctx.device != "sim";
  absl::StatusOr<std::unique_ptr<DeviceBackend>> opened =
      cuda ? MakeCudaDevice(0) : absl::StatusOr<std::unique_ptr<DeviceBackend>>(MakeSimDevice());
  if (!opened.ok()) {
    std::fprintf(stderr, "kvtier-bench gpu: %s\n", std::string(opened.status().message()).c_str());
    return {};
  }
  DeviceBackend& dev = **opened;
  BareCopy bare(cuda);
  const int reps = ctx.quick ? 3 : 15;
  const DeviceStream stream = *dev.CreateStream();
  const DeviceEvent done = *dev.CreateEvent();
  std::vector<Metric> out;
  const std::string where = cuda ? "CUDA device 0" : "the host-simulated device";

  // ---- pinned host <-> device --------------------------------------------
  {
    const uint64_t blocks = ctx.quick ? 8 : 64;
    const uint64_t bytes = blocks * kBlock;
    auto fd = os::CreateSealedMemfd("kvtier-bench-host", bytes);
    BENCH_CHECK(fd.ok());
    auto host = os::MappedRegion::Map(fd->get(), bytes, /*populate=*/true);
    BENCH_CHECK(host.ok());
    std::memset(host->data(), 0x5a, bytes);
    BENCH_CHECK(dev.RegisterHost(host->data(), bytes).ok());
    void* d = *dev.Allocate(bytes);
    auto* h = reinterpret_cast<uint8_t*>(host->data());
    auto* g = static_cast<uint8_t*>(d);
    for (int dir = 0; dir < 2; ++dir) {
      Pair p;
      for (int r = 0; r < reps + 1; ++r) {  // the first round warms up
        auto t0 = Clock::now();
        for (uint64_t i = 0; i < blocks; ++i) {
          void* dst = dir == 0 ? static_cast<void*>(g + i * kBlock) : static_cast<void*>(h + i * kBlock);
          const void* src = dir == 0 ? static_cast<const void*>(h + i * kBlock) : static_cast<const void*>(g + i * kBlock);
          BENCH_CHECK(dev.CopyAsync(dst, src, kBlock, stream).ok());
        }
        BENCH_CHECK(dev.RecordEvent(done, stream).ok());
        BENCH_CHECK(dev.WaitEvent(done, std::chrono::seconds(60)).ok());
        auto t1 = Clock::now();
        BENCH_CHECK(dir == 0 ? bare.Copy(g, h, bytes) : bare.Copy(h, g, bytes));
        auto t2 = Clock::now();
        if (r == 0) continue;
        p.ours.push_back(Seconds(t0, t1));
        p.base.push_back(Seconds(t1, t2));
      }
      const double ours = bytes / Median(p.ours) / 1e9, base = bytes / Median(p.base) / 1e9;
      out.push_back(Metric{"gpu", dir == 0 ? "host_to_device_GBps" : "device_to_host_GBps", ours,
                           cuda ? "cudaMemcpyAsync" : "memcpy", base, "GB/s", HigherIsBetter(ours, base),
                           cuda ? std::optional<double>(0.9) : std::nullopt,
                           absl::StrCat(blocks, " copies of 2 MiB through the device backend from a registered memfd "
                                        "mapping, vs one bare copy of all ", bytes >> 20, " MiB; ", where,
                                        "; medians of ", reps)});
    }
    BENCH_CHECK(dev.UnregisterHost(host->data()).ok());
    BENCH_CHECK(dev.Free(d).ok());
  }

  // ---- gather / scatter ----------------------------------------------------
  // A Llama-3-8B-like cache: 32 layers, 8 KV heads of 128, f16, 16-token
  // pages; 256-token blocks (16 pages, 32 MiB each).
  kernels::KvShape shape{ctx.quick ? 4u : 32u, 256, 8, 128, kernels::KvDtype::kF16};
  kernels::PagedCache cache;
  cache.page_tokens = 16;
  const uint32_t nblocks = ctx.quick ? 2 : 8;
  const uint32_t ppb = shape.block_tokens / cache.page_tokens;
  cache.num_pages = uint64_t{nblocks} * ppb * 2;
  const uint64_t page_bytes = kernels::PageBytes(shape, cache);
  cache.page_stride = page_bytes;
  const uint64_t tensor = cache.num_pages * page_bytes;
  void* cache_mem = *dev.Allocate(tensor * 2 * shape.layers);
  for (uint32_t l = 0; l < shape.layers; ++l) {
    cache.k_base.push_back(reinterpret_cast<uint64_t>(cache_mem) + (2ull * l) * tensor);
    cache.v_base.push_back(reinterpret_cast<uint64_t>(cache_mem) + (2ull * l + 1) * tensor);
  }
  std::vector<uint32_t> pages(cache.num_pages);
  std::iota(pages.begin(), pages.end(), 0u);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(1));
  pages.resize(uint64_t{nblocks} * ppb);
  const kernels::BlockGeometry geo = kernels::GeometryOf(shape, kernels::BlockCodec::kLossless);
  const uint64_t moved = geo.block_bytes * nblocks;
  void* block_mem = *dev.Allocate(moved);
  void* copy_mem = *dev.Allocate(moved);
  std::vector<uint64_t> blocks;
  for (uint32_t b = 0; b < nblocks; ++b) blocks.push_back(reinterpret_cast<uint64_t>(block_mem) + b * geo.block_bytes);
  const kernels::BlockIo io{pages, blocks};
  kernels::KvKernels& k = dev.kernels();
  auto time_kernel = [&](auto&& enqueue, double* seconds) -> bool {
    std::vector<double> s;
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = Clock::now();
      if (!enqueue().ok()) return false;
      if (!dev.RecordEvent(done, stream).ok() || !dev.WaitEvent(done, std::chrono::seconds(60)).ok()) return false;
      if (r > 0) s.push_back(Seconds(t0, Clock::now()));
    }
    *seconds = Median(s);
    return true;
  };
  std::vector<double> d2d;
  for (int r = 0; r < reps + 1; ++r) {
    auto t0 = Clock::now();
    BENCH_CHECK(bare.Copy(copy_mem, block_mem, moved));
    if (r > 0) d2d.push_back(Seconds(t0, Clock::now()));
  }
  const double d2d_gbps = moved / Median(d2d) / 1e9;
  const std::string kv_note = absl::StrCat(nblocks, " blocks of ", shape.layers, " layers x 8 KV heads x 128 x ",
                                           shape.block_tokens, " tokens f16 from 16-token pages (",
                                           moved >> 20, " MiB); ", where, "; medians of ", reps);
  double gather_s = 0, scatter_s = 0, fp8_s = 0, sum_s = 0;
  BENCH_CHECK(time_kernel([&] { return k.Gather(shape, kernels::BlockCodec::kLossless, cache, io, stream); }, &gather_s));
  BENCH_CHECK(time_kernel([&] { return k.Scatter(shape, kernels::BlockCodec::kLossless, cache, io, stream); }, &scatter_s));
  const kernels::BlockGeometry q = kernels::GeometryOf(shape, kernels::BlockCodec::kFp8E4M3);
  std::vector<uint64_t> qblocks;
  for (uint32_t b = 0; b < nblocks; ++b) qblocks.push_back(reinterpret_cast<uint64_t>(copy_mem) + b * q.block_bytes);
  BENCH_CHECK(time_kernel([&] {
    return k.Gather(shape, kernels::BlockCodec::kFp8E4M3, cache, kernels::BlockIo{pages, qblocks}, stream);
  }, &fp8_s));
  uint64_t* sums = static_cast<uint64_t*>(*dev.Allocate(8 * nblocks));
  BENCH_CHECK(time_kernel([&] { return k.Checksum(blocks, geo.block_bytes, sums, stream); }, &sum_s));
  const std::string bare_name = cuda ? "cudaMemcpy_d2d" : "memcpy";
  const std::optional<double> kv_target = cuda ? std::optional<double>(0.8) : std::nullopt;
  out.push_back(Metric{"gpu", "gather_GBps", moved / gather_s / 1e9, bare_name, d2d_gbps, "GB/s",
                       HigherIsBetter(moved / gather_s / 1e9, d2d_gbps), kv_target, kv_note});
  out.push_back(Metric{"gpu", "scatter_GBps", moved / scatter_s / 1e9, bare_name, d2d_gbps, "GB/s",
                       HigherIsBetter(moved / scatter_s / 1e9, d2d_gbps), kv_target, kv_note});
  out.push_back(Metric{"gpu", "gather_fp8_GBps_read", moved / fp8_s / 1e9, bare_name, d2d_gbps, "GB/s",
                       HigherIsBetter(moved / fp8_s / 1e9, d2d_gbps), std::nullopt,
                       "f16 bytes read per second while quantizing to FP8 E4M3; " + kv_note});
  out.push_back(Metric{"gpu", "checksum_GBps", moved / sum_s / 1e9, bare_name, d2d_gbps, "GB/s",
                       HigherIsBetter(moved / sum_s / 1e9, d2d_gbps), std::nullopt,
                       "XXH3-64 of each block (the NVMe tier's payload checksum); " + kv_note});

  // ---- layer-wise load ------------------------------------------------------
  {
    const uint64_t bytes = geo.block_bytes;
    auto fd = os::CreateSealedMemfd("kvtier-bench-layer", bytes);
    BENCH_CHECK(fd.ok());
    auto host = os::MappedRegion::Map(fd->get(), bytes, /*populate=*/true);
    BENCH_CHECK(host.ok());
    BENCH_CHECK(dev.RegisterHost(host->data(), bytes).ok());
    std::vector<DeviceEvent> layer_done;
    for (uint32_t l = 0; l < shape.layers; ++l) layer_done.push_back(*dev.CreateEvent());
    const std::vector<uint32_t> one_pages(pages.begin(), pages.begin() + ppb);
    const std::vector<uint64_t> one_block = {blocks[0]};
    std::vector<double> first, all;
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = Clock::now();
      for (uint32_t l = 0; l < shape.layers; ++l) {
        BENCH_CHECK(dev.CopyAsync(reinterpret_cast<uint8_t*>(blocks[0]) + l * geo.layer_bytes,
                                  reinterpret_cast<uint8_t*>(host->data()) + l * geo.layer_bytes, geo.layer_bytes, stream)
                        .ok());
        BENCH_CHECK(k.Scatter(shape, kernels::BlockCodec::kLossless, cache, kernels::BlockIo{one_pages, one_block, l, 1},
                              stream)
                        .ok());
        BENCH_CHECK(dev.RecordEvent(layer_done[l], stream).ok());
      }
      BENCH_CHECK(dev.WaitEvent(layer_done[0], std::chrono::seconds(60)).ok());
      auto t1 = Clock::now();
      BENCH_CHECK(dev.WaitEvent(layer_done.back(), std::chrono::seconds(60)).ok());
      auto t2 = Clock::now();
      if (r == 0) continue;
      first.push_back(Seconds(t0, t1) * 1e3);
      all.push_back(Seconds(t0, t2) * 1e3);
    }
    out.push_back(Metric{"gpu", "layerwise_first_layer_ms", Median(first), "whole_block", Median(all), "ms",
                         LowerIsBetter(Median(first), Median(all)), std::nullopt,
                         absl::StrCat("one ", bytes >> 20, " MiB block copied in from registered host memory and "
                                      "scattered into 16-token pages layer by layer; time until layer 0 is in place "
                                      "vs until all ", shape.layers, " are; ", where, "; medians of ", reps)});
    for (DeviceEvent e : layer_done) (void)dev.DestroyEvent(e);
    BENCH_CHECK(dev.UnregisterHost(host->data()).ok());
  }
  (void)dev.Free(sums);
  (void)dev.Free(block_mem);
  (void)dev.Free(copy_mem);
  (void)dev.Free(cache_mem);
  (void)dev.DestroyEvent(done);
  (void)dev.DestroyStream(stream);
  return out;
}

}  // namespace kvtier::bench
