// SPDX-License-Identifier: Apache-2.0
// The KV kernels on a real GPU, through the CUDA device backend: the same
// naive-loop checks the CPU reference passes (kv_kernels_test), so lossless
// results are bit-exact and quantized codes and scales bit-identical to the
// reference. Skips (77) where no GPU answers.
#include "gtest/gtest.h"
#include "kernels/kv_kernels.h"
#include "tests/kernels/kv_kernels_testlib.h"
#include "tiers/device_backend.h"

namespace kvtier::kernels {
namespace {

using testing::Case;
using testing::Memory;

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dev = MakeCudaDevice(0);
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    stream_ = *dev_->CreateStream();
    mem_ = testing::DeviceMemory(*dev_, stream_);
  }
  void TearDown() override {
    if (dev_) {
      mem_.free_all();
      EXPECT_TRUE(dev_->DestroyStream(stream_).ok());
    }
  }
  KvKernels& k() { return dev_->kernels(); }
  std::unique_ptr<DeviceBackend> dev_;
  DeviceStream stream_ = 0;
  Memory mem_;
};

bool Quantizable(KvDtype d) { return d == KvDtype::kF16 || d == KvDtype::kBF16 || d == KvDtype::kF32; }

TEST_F(CudaKernelsTest, IsTheCudaImplementation) { EXPECT_EQ(k().name(), "cuda"); }

TEST_F(CudaKernelsTest, LosslessGatherAndScatterMatchNaiveLoops) {
  int n = 0;
  for (const Case& c : testing::Cases(1, 60)) {
    EXPECT_EQ(testing::CheckLosslessRoundTrip(k(), mem_, c, n++), "") << c.Name();
  }
}

TEST_F(CudaKernelsTest, ScatterByLayerWritesOnlyThatLayer) {
  int n = 0;
  for (const Case& c : testing::Cases(2, 15)) {
    EXPECT_EQ(testing::CheckLayerwiseScatter(k(), mem_, c, n++), "") << c.Name();
  }
}

TEST_F(CudaKernelsTest, QuantizedBlocksAreBitIdenticalToTheReference) {
  int n = 0;
  for (const Case& c : testing::Cases(3, 45)) {
    if (!Quantizable(c.shape.dtype)) continue;
    for (BlockCodec codec : {BlockCodec::kInt8, BlockCodec::kFp8E4M3}) {
      EXPECT_EQ(testing::CheckQuantized(k(), mem_, c, codec, n++), "") << c.Name() << " " << CodecName(codec);
    }
  }
}

TEST_F(CudaKernelsTest, ChecksumsAreTheNvmeTiersXxh3) { EXPECT_EQ(testing::CheckChecksums(k(), mem_, 4), ""); }

// More layers and blocks than one launch takes: the call is split.
TEST_F(CudaKernelsTest, CallsLargerThanOneLaunchAreSplit) {
  Case c;
  c.shape = KvShape{130, 16, 1, 8, KvDtype::kF16};
  c.page_tokens = 2;
  c.blocks = 300;
  EXPECT_EQ(testing::CheckLosslessRoundTrip(k(), mem_, c, 11), "");
  c.shape.layers = 3;
  EXPECT_EQ(testing::CheckQuantized(k(), mem_, c, BlockCodec::kInt8, 12), "");
}

}  // namespace
}  // namespace kvtier::kernels
