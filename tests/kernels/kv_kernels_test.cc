// SPDX-License-Identifier: Apache-2.0
// The CPU reference of the KV kernels against naive loops (the same checks
// cuda_kernels_test runs on a GPU), a deliberately wrong-axis quantizer that
// those checks must reject, and bad input.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/status.h"
#include "gtest/gtest.h"
#include "kernels/kv_kernels.h"
#include "kernels/kv_math.h"
#include "tests/kernels/kv_kernels_testlib.h"
#include "tiers/device_backend.h"

namespace kvtier::kernels {
namespace {

using testing::Case;
using testing::Memory;

using testing::HostMemory;

bool Quantizable(KvDtype d) { return d == KvDtype::kF16 || d == KvDtype::kBF16 || d == KvDtype::kF32; }

TEST(KvKernelsTest, LosslessGatherAndScatterMatchNaiveLoops) {
  auto k = MakeReferenceKernels();
  Memory m = HostMemory();
  int n = 0;
  for (const Case& c : testing::Cases(1, 60)) {
    EXPECT_EQ(testing::CheckLosslessRoundTrip(*k, m, c, n++), "") << c.Name();
  }
}

TEST(KvKernelsTest, ScatterByLayerWritesOnlyThatLayer) {
  auto k = MakeReferenceKernels();
  Memory m = HostMemory();
  int n = 0;
  for (const Case& c : testing::Cases(2, 15)) {
    EXPECT_EQ(testing::CheckLayerwiseScatter(*k, m, c, n++), "") << c.Name();
  }
}

TEST(KvKernelsTest, QuantizedBlocksHaveNaiveScalesAndStayWithinTheirBounds) {
  auto k = MakeReferenceKernels();
  Memory m = HostMemory();
  int n = 0;
  for (const Case& c : testing::Cases(3, 45)) {
    if (!Quantizable(c.shape.dtype)) continue;
    for (BlockCodec codec : {BlockCodec::kInt8, BlockCodec::kFp8E4M3}) {
      EXPECT_EQ(testing::CheckQuantized(*k, m, c, codec, n++), "") << c.Name() << " " << CodecName(codec);
    }
  }
}

TEST(KvKernelsTest, ChecksumsAreTheNvmeTiersXxh3) {
  auto k = MakeReferenceKernels();
  Memory m = HostMemory();
  EXPECT_EQ(testing::CheckChecksums(*k, m, 4), "");
}

// The host-simulated device runs the reference on its streams, in order with
// its copies: the same checks, through device memory and a stream.
TEST(KvKernelsTest, SimulatedDeviceRunsTheKernelsOnItsStreams) {
  auto dev = MakeSimDevice();
  const DeviceStream stream = *dev->CreateStream();
  Memory m = testing::DeviceMemory(*dev, stream);
  EXPECT_EQ(dev->kernels().name(), "reference");
  int n = 100;
  for (const Case& c : testing::Cases(6, 10)) {
    EXPECT_EQ(testing::CheckLosslessRoundTrip(dev->kernels(), m, c, n++), "") << c.Name();
    EXPECT_EQ(testing::CheckLayerwiseScatter(dev->kernels(), m, c, n++), "") << c.Name();
    if (Quantizable(c.shape.dtype)) {
      EXPECT_EQ(testing::CheckQuantized(dev->kernels(), m, c, BlockCodec::kFp8E4M3, n++), "") << c.Name();
    }
  }
  EXPECT_EQ(testing::CheckChecksums(dev->kernels(), m, 7), "");
  // Bad arguments fail at the call, not later on the stream.
  KvShape shape{1, 4, 1, 4, KvDtype::kF16};
  PagedCache cache{4, 1, 32, {0x1000}, {0x2000}};
  std::vector<uint32_t> pages = {3};
  std::vector<uint64_t> blocks = {0x3000};
  EXPECT_FALSE(dev->kernels().Gather(shape, BlockCodec::kLossless, cache, BlockIo{pages, blocks}, stream).ok());
  EXPECT_FALSE(dev->kernels().Checksum(blocks, 8, reinterpret_cast<uint64_t*>(0x10), 999).ok());
  ASSERT_TRUE(dev->DestroyStream(stream).ok());
}

// A quantizer that takes K scales per token and V scales per channel — the
// axes swapped. The checks above must catch it.
class WrongAxisKernels final : public KvKernels {
 public:
  absl::string_view name() const override { return "wrong-axis"; }
  absl::Status Gather(const KvShape& shape, BlockCodec codec, const PagedCache& cache, const BlockIo& io,
                      DeviceStream s) override {
    RETURN_IF_ERROR(ref_->Gather(shape, codec, cache, io, s));
    const BlockGeometry g = GeometryOf(shape, codec);
    const uint32_t H = shape.kv_heads, D = shape.head_dim, T = shape.block_tokens;
    const int cc = static_cast<int>(codec);
    for (uint64_t addr : io.blocks) {
      for (uint32_t l = 0; l < shape.layers; ++l) {
        uint8_t* layer = reinterpret_cast<uint8_t*>(addr) + l * g.layer_bytes;
        auto* k_scales = reinterpret_cast<float*>(layer + g.k_scales_off);
        // Decode K with its right scales, then re-encode per token.
        for (uint32_t t = 0; t < T; ++t) {
          std::vector<float> x(uint64_t{H} * D);
          float amax = 0;
          for (uint64_t ch = 0; ch < x.size(); ++ch) {
            x[ch] = math::Dequantize(layer[t * x.size() + ch], k_scales[ch], cc);
            amax = std::max(amax, std::fabs(x[ch]));
          }
          const float scale = math::ScaleFor(amax, cc);
          for (uint64_t ch = 0; ch < x.size(); ++ch) layer[t * x.size() + ch] = math::Quantize(x[ch], scale, cc);
          if (t < H * D) k_scales[t] = scale;  // the layout has one slot per channel
        }
      }
    }
    return absl::OkStatus();
  }
  absl::Status Scatter(const KvShape& shape, BlockCodec codec, const PagedCache& cache, const BlockIo& io,
                       DeviceStream s) override {
    return ref_->Scatter(shape, codec, cache, io, s);
  }
  absl::Status Checksum(absl::Span<const uint64_t> blocks, uint64_t bytes, uint64_t* out,
                        DeviceStream s) override {
    return ref_->Checksum(blocks, bytes, out, s);
  }

 private:
  std::unique_ptr<KvKernels> ref_ = MakeReferenceKernels();
};

TEST(KvKernelsTest, ScalesOnTheWrongAxisAreCaught) {
  WrongAxisKernels wrong;
  Memory m = HostMemory();
  Case c;
  c.shape = KvShape{2, 16, 4, 32, KvDtype::kF16};
  c.page_tokens = 16;
  c.blocks = 2;
  for (BlockCodec codec : {BlockCodec::kInt8, BlockCodec::kFp8E4M3}) {
    const std::string why = testing::CheckQuantized(wrong, m, c, codec, 5);
    EXPECT_NE(why, "") << CodecName(codec);
    m.free_all();
  }
}

TEST(KvKernelsTest, BadInputIsRefusedWithTheReason) {
  auto k = MakeReferenceKernels();
  std::vector<uint8_t> mem(1 << 16);
  const uint64_t base = reinterpret_cast<uint64_t>(mem.data());
  KvShape shape{2, 4, 2, 8, KvDtype::kF16};
  PagedCache cache{2, 4, 64, {base, base + 4096}, {base + 1024, base + 5120}};
  std::vector<uint32_t> pages = {0, 1};
  std::vector<uint64_t> blocks = {base + 8192};
  EXPECT_TRUE(k->Gather(shape, BlockCodec::kLossless, cache, BlockIo{pages, blocks}, 0).ok());
  auto fails_with = [&](const KvShape& sh, BlockCodec codec, const PagedCache& pc, const BlockIo& io,
                        const char* needle) {
    absl::Status st = k->Gather(sh, codec, pc, io, 0);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), absl::string_view::npos) << st.message();
  };
  std::vector<uint32_t> far = {0, 4};
  fails_with(shape, BlockCodec::kLossless, cache, BlockIo{far, blocks}, "past the cache");
  std::vector<uint32_t> three = {0, 1, 2};
  fails_with(shape, BlockCodec::kLossless, cache, BlockIo{three, blocks}, "page ids for");
  std::vector<uint64_t> null_block = {0};
  fails_with(shape, BlockCodec::kLossless, cache, BlockIo{pages, null_block}, "null");
  fails_with(shape, BlockCodec::kLossless, cache, BlockIo{pages, blocks, 1, 2}, "layers");
  KvShape fp8 = shape;
  fp8.dtype = KvDtype::kFp8E4M3;
  fails_with(fp8, BlockCodec::kInt8, cache, BlockIo{pages, blocks}, "quantizes");
  PagedCache odd = cache;
  odd.page_tokens = 3;
  fails_with(shape, BlockCodec::kLossless, odd, BlockIo{pages, blocks}, "whole number");
  PagedCache one_layer = cache;
  one_layer.v_base.pop_back();
  fails_with(shape, BlockCodec::kLossless, one_layer, BlockIo{pages, blocks}, "layer bases");
  PagedCache tight = cache;
  tight.page_stride = 8;
  fails_with(shape, BlockCodec::kLossless, tight, BlockIo{pages, blocks}, "stride");
  KvShape empty = shape;
  empty.head_dim = 0;
  fails_with(empty, BlockCodec::kLossless, cache, BlockIo{pages, blocks}, "head_dim");
  KvDtype d;
  EXPECT_FALSE(ParseDtype("fp4", &d).ok());
  EXPECT_TRUE(ParseDtype("bfloat16", &d).ok());
  EXPECT_EQ(d, KvDtype::kBF16);
}

}  // namespace
}  // namespace kvtier::kernels
