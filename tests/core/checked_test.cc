// SPDX-License-Identifier: Apache-2.0
// Property tests of the checked arithmetic every peer number goes through:
// against exact 128-bit arithmetic on random and edge values.
#include "core/checked.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace kvtier {
namespace {

using u128 = unsigned __int128;
constexpr u128 kMax64 = UINT64_MAX;

std::vector<uint64_t> Interesting(std::mt19937_64& rng, size_t random) {
  std::vector<uint64_t> v = {0, 1, 2, 3, 4095, 4096, UINT32_MAX - 1, UINT32_MAX, uint64_t{1} << 32,
                             (uint64_t{1} << 32) + 1, (uint64_t{1} << 62), (uint64_t{1} << 63) - 1,
                             uint64_t{1} << 63, UINT64_MAX - 1, UINT64_MAX};
  for (size_t i = 0; i < random; ++i) {
    const int bits = static_cast<int>(rng() % 64) + 1;
    v.push_back(rng() >> (64 - bits));
  }
  return v;
}

TEST(CheckedTest, AddAndMulMatchExactArithmetic) {
  std::mt19937_64 rng(7);
  const std::vector<uint64_t> vals = Interesting(rng, 200);
  for (uint64_t a : vals) {
    for (uint64_t b : vals) {
      const u128 sum = u128{a} + b, prod = u128{a} * b;
      const std::optional<uint64_t> s = CheckedAdd(a, b), p = CheckedMul(a, b);
      ASSERT_EQ(s.has_value(), sum <= kMax64) << a << " + " << b;
      ASSERT_EQ(p.has_value(), prod <= kMax64) << a << " * " << b;
      if (s) { ASSERT_EQ(u128{*s}, sum); }
      if (p) { ASSERT_EQ(u128{*p}, prod); }
    }
  }
  EXPECT_FALSE(CheckedAdd<uint32_t>(UINT32_MAX, 1u).has_value());
  EXPECT_EQ(CheckedMul<uint32_t>(65535u, 65537u), std::optional<uint32_t>(UINT32_MAX));
}

TEST(CheckedTest, ProductOfManyFactors) {
  // Left to right, refusing at the first partial product that overflows
  // (even when a later factor is 0): the safe answer for a size.
  std::mt19937_64 rng(11);
  for (int i = 0; i < 20000; ++i) {
    uint64_t f[4];
    for (uint64_t& x : f) x = (rng() % 16 == 0) ? 0 : rng() >> (rng() % 64);
    u128 ref = 1;
    bool ref_fits = true;
    for (uint64_t x : f) {
      ref *= x;
      if (ref > kMax64) {
        ref_fits = false;
        break;
      }
    }
    const std::optional<uint64_t> p = CheckedProduct({f[0], f[1], f[2], f[3]});
    ASSERT_EQ(p.has_value(), ref_fits);
    if (p) { ASSERT_EQ(u128{*p}, ref); }
  }
}

TEST(CheckedTest, RangeWithinNeverWraps) {
  std::mt19937_64 rng(13);
  const std::vector<uint64_t> vals = Interesting(rng, 60);
  for (uint64_t off : vals) {
    for (uint64_t len : vals) {
      for (uint64_t size : vals) {
        ASSERT_EQ(RangeWithin(off, len, size), u128{off} + len <= size) << off << "+" << len << " in " << size;
      }
    }
  }
}

TEST(CheckedTest, StridedExtent) {
  std::mt19937_64 rng(17);
  const std::vector<uint64_t> vals = Interesting(rng, 40);
  for (uint64_t count : vals) {
    for (uint64_t stride : vals) {
      for (uint64_t item : vals) {
        const std::optional<uint64_t> e = StridedExtent(count, stride, item);
        if (count == 0) {
          ASSERT_EQ(e, std::optional<uint64_t>(0));
          continue;
        }
        const u128 exact = u128{count - 1} * stride + item;
        ASSERT_EQ(e.has_value(), exact <= kMax64) << count << " x " << stride << " + " << item;
        if (e) { ASSERT_EQ(u128{*e}, exact); }
      }
    }
  }
  // The row-1 attack: 2^32 pages of stride 2^32 wraps 64 bits.
  EXPECT_FALSE(StridedExtent(uint64_t{1} << 32, (uint64_t{1} << 32) + 1, 4096).has_value());
  EXPECT_EQ(StridedExtent(uint64_t{1} << 32, uint64_t{1} << 32, 4096), UINT64_MAX - (uint64_t{1} << 32) + 4097);
  EXPECT_FALSE(StridedExtent(2, uint64_t{1} << 63, uint64_t{1} << 63).has_value());
}

TEST(CheckedTest, Utf8) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("engine-0"));
  EXPECT_TRUE(IsValidUtf8("Llama-3 \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));                  // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));              // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));          // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));      // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8(std::string_view("a\x80", 2)));
  EXPECT_TRUE(IsPrintableUtf8("vllm worker \xc3\xa9"));
  EXPECT_FALSE(IsPrintableUtf8("a\nb"));
  EXPECT_FALSE(IsPrintableUtf8("a\x1b[2Jb"));
  EXPECT_FALSE(IsPrintableUtf8(std::string_view("a\0b", 3)));
  EXPECT_FALSE(IsPrintableUtf8("a\x7f"));
  EXPECT_FALSE(IsPrintableUtf8("\xc2\x9b" "31m"));    // C1 CSI
  EXPECT_FALSE(IsPrintableUtf8("\xe2\x80\xae" "gnp.exe"));  // right-to-left override
  EXPECT_FALSE(IsPrintableUtf8("\xff"));
  // Every valid string is also what a strict decoder accepts: random bytes.
  std::mt19937_64 rng(19);
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 8, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    if (IsPrintableUtf8(s)) { ASSERT_TRUE(IsValidUtf8(s)); }
  }
}

TEST(CheckedTest, Utf8PrefixNeverCutsASequence) {
  const std::string s = "ab\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";  // a b é € 😀
  EXPECT_EQ(Utf8Prefix(s, 100), s);
  EXPECT_EQ(Utf8Prefix(s, 3), "ab");
  EXPECT_EQ(Utf8Prefix(s, 4), "ab\xc3\xa9");
  EXPECT_EQ(Utf8Prefix(s, 6), "ab\xc3\xa9");
  EXPECT_EQ(Utf8Prefix(s, 10), "ab\xc3\xa9\xe2\x82\xac");
  for (size_t n = 0; n <= s.size(); ++n) {
    EXPECT_TRUE(IsValidUtf8(Utf8Prefix(s, n))) << n;
    EXPECT_LE(Utf8Prefix(s, n).size(), n);
  }
  EXPECT_EQ(PrintableOrReplaced("python3"), "python3");
  EXPECT_EQ(PrintableOrReplaced("a\nb\xff\xc3\xa9"), "a?b?\xc3\xa9");
  EXPECT_TRUE(IsPrintableUtf8(PrintableOrReplaced("\x1b[2J\xc2\x9b\xe2\x80\xae")));
}

}  // namespace
}  // namespace kvtier
