// SPDX-License-Identifier: Apache-2.0
// The element arithmetic both kernel implementations share: conversions
// against the compiler's own types and the format definitions, and the split
// XXH3 the CUDA checksum runs against libxxhash itself.
#include "kernels/kv_math.h"

#include <xxhash.h>

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::kernels::math {
namespace {

TEST(KvMathTest, HalfMatchesTheCompilersFloat16BothWays) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 ref;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, 2);
    const float f = HalfToFloat(bits);
    if (std::isnan(static_cast<float>(ref))) {
      EXPECT_TRUE(std::isnan(f)) << h;
      continue;
    }
    ASSERT_EQ(FloatBits(f), FloatBits(static_cast<float>(ref))) << h;
    ASSERT_EQ(FloatToHalf(f), bits) << h;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2'000'000; ++i) {
    const float f = BitsFloat(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(FloatToHalf(f), want) << f;
  }
}

// bfloat16 by its definition: the float nearest to f whose low 16 bits are 0,
// ties to even, computed in double.
uint16_t Bf16ByDefinition(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t lo = u & 0xffff0000u;
  const double down = BitsFloat(lo);
  // Past the largest finite bf16 the next step is 2^128, which rounds to inf.
  const double up = (lo & 0x7fffffffu) == 0x7f7f0000u ? std::ldexp(1.0, 128) : double{BitsFloat(lo + 0x10000u)};
  const double x = f;
  const double dd = std::fabs(x - down), du = std::fabs(up - x);
  if (dd < du || (dd == du && ((lo >> 16) & 1) == 0)) return static_cast<uint16_t>(lo >> 16);
  return static_cast<uint16_t>((lo + 0x10000u) >> 16);
}

TEST(KvMathTest, Bf16RoundsToNearestEven) {
  std::mt19937 rng(8);
  for (int i = 0; i < 1'000'000; ++i) {
    const float f = BitsFloat(static_cast<uint32_t>(rng()) & 0x7f7fffffu);  // finite
    ASSERT_EQ(FloatToBf16(f), Bf16ByDefinition(f)) << f;
    ASSERT_EQ(Bf16ToFloat(FloatToBf16(f)), static_cast<float>(Bf16ToFloat(Bf16ByDefinition(f))));
  }
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

// E4M3 from the OCP FP8 definition: 1 sign, 4 exponent (bias 7), 3 mantissa
// bits, subnormals at exponent 0, no infinities, S.1111.111 is NaN.
double Fp8ByDefinition(uint8_t v) {
  const int e = (v >> 3) & 0xf, m = v & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7);
  return (v & 0x80) ? -mag : mag;
}

TEST(KvMathTest, Fp8DecodesEveryCodeAndEncodesToTheNearest) {
  std::vector<double> values;  // non-negative finite codes 0x00..0x7e, ascending
  for (int v = 0; v < 256; ++v) {
    const float f = Fp8ToFloat(static_cast<uint8_t>(v));
    if ((v & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << v;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), Fp8ByDefinition(static_cast<uint8_t>(v))) << v;
    if (v != 0x80) {
      ASSERT_EQ(FloatToFp8(f), v) << v;  // -0 encodes as 0x80 too, checked below
    }
    if (v < 0x7f) values.push_back(f);
  }
  EXPECT_EQ(FloatToFp8(-0.0f), 0x80);
  EXPECT_EQ(Fp8ToFloat(0x7e), 448.0f);
  // Every float between two codes rounds to the nearer; ties go to the even code.
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const double lo = values[i], hi = values[i + 1];
    const float mid = static_cast<float>((lo + hi) / 2);
    EXPECT_EQ(FloatToFp8(mid), (i % 2 == 0) ? i : i + 1) << mid;
    EXPECT_EQ(FloatToFp8(-mid), 0x80 | ((i % 2 == 0) ? i : i + 1)) << -mid;
    for (int k = 0; k < 20; ++k) {
      const float x = static_cast<float>(lo + (hi - lo) * u(rng));
      if (x == mid) continue;
      const size_t want = (x - lo < hi - x) ? i : i + 1;
      ASSERT_EQ(FloatToFp8(x), want) << x;
    }
  }
  EXPECT_EQ(FloatToFp8(449.0f), 0x7e);
  EXPECT_EQ(FloatToFp8(1e30f), 0x7e);
  EXPECT_EQ(FloatToFp8(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToFp8(NAN), 0x7f);
}

TEST(KvMathTest, QuantizerSaturatesAndIgnoresNonFiniteValuesForScales) {
  EXPECT_EQ(ScaleFor(0.0f, 1), 1.0f);
  EXPECT_EQ(ScaleFor(254.0f, 1), 2.0f);
  EXPECT_EQ(ScaleFor(448.0f, 2), 1.0f);
  EXPECT_EQ(AbsForScale(-INFINITY), 0.0f);
  EXPECT_EQ(AbsForScale(NAN), 0.0f);
  EXPECT_EQ(AbsForScale(-3.0f), 3.0f);
  EXPECT_EQ(static_cast<int8_t>(Quantize(INFINITY, 1.0f, 1)), 127);
  EXPECT_EQ(static_cast<int8_t>(Quantize(-1000.0f, 1.0f, 1)), -127);
  EXPECT_EQ(Quantize(NAN, 1.0f, 1), 0);
  EXPECT_EQ(Quantize(NAN, 1.0f, 2), 0);
  EXPECT_EQ(static_cast<int8_t>(Quantize(2.5f, 1.0f, 1)), 2);  // rint: ties to even
  EXPECT_EQ(Dequantize(Quantize(-3.0f, 0.5f, 1), 0.5f, 1), -3.0f);
}

TEST(KvMathTest, SplitXxh3MatchesLibxxhashAtEveryLengthAndAlignment) {
  std::mt19937_64 rng(10);
  std::vector<uint8_t> buf(70000 + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  auto split = [](const uint8_t* in, uint64_t len) -> uint64_t {
    if (len <= 240) return xxh3::HashShort(in, len);
    uint64_t acc[8];
    for (int lane = 0; lane < 8; ++lane) acc[lane] = xxh3::InitAcc(lane);
    for (uint64_t blk = 0; blk < xxh3::FullBlocks(len); ++blk) {
      for (int lane = 0; lane < 8; ++lane) {
        acc[lane] = xxh3::Scramble(acc[lane] + xxh3::BlockLane(in + blk * xxh3::kBlockBytes, lane), lane);
      }
    }
    for (int lane = 0; lane < 8; ++lane) acc[lane] = xxh3::TailLane(in, len, acc[lane], lane);
    return xxh3::Merge(acc, len);
  };
  for (uint64_t len = 0; len <= 4200; ++len) {
    ASSERT_EQ(split(buf.data() + (len % 7), len), XXH3_64bits(buf.data() + (len % 7), len)) << len;
  }
  for (uint64_t len : {8191ull, 8192ull, 8193ull, 65536ull, 70000ull}) {
    ASSERT_EQ(split(buf.data() + 3, len), XXH3_64bits(buf.data() + 3, len)) << len;
  }
}

}  // namespace
}  // namespace kvtier::kernels::math
