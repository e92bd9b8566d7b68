// SPDX-License-Identifier: Apache-2.0
// When kvtierd gives its heap's free pages back (daemon/heap_trim.h), and
// that doing so does lower its resident memory.
#include "daemon/heap_trim.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

constexpr uint64_t kSecond = 1'000'000'000;

TEST(HeapTrimTest, DueOncePerEighthOfTheIndexAndNeverBelowTheFloor) {
  EXPECT_FALSE(HeapTrimmer::Due(0, 0));
  EXPECT_FALSE(HeapTrimmer::Due(HeapTrimmer::kMinFreed - 1, 0)) << "a small tier waits for the floor";
  EXPECT_TRUE(HeapTrimmer::Due(HeapTrimmer::kMinFreed, 1000));
  EXPECT_FALSE(HeapTrimmer::Due(12'499, 100'000)) << "a large one for an eighth of its blocks";
  EXPECT_TRUE(HeapTrimmer::Due(12'500, 100'000));
}

TEST(HeapTrimTest, TrimsWhenDueAndAtMostOncePerInterval) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "no malloc_trim in this C library";
#endif
  HeapTrimmer t;
  EXPECT_FALSE(t.MaybeTrim(10 * kSecond, 0, 0)) << "nothing freed";
  EXPECT_FALSE(t.MaybeTrim(10 * kSecond, 4000, 0));
  EXPECT_TRUE(t.MaybeTrim(10 * kSecond, 5000, 0));
  EXPECT_FALSE(t.MaybeTrim(10 * kSecond + kSecond / 2, 20'000, 0)) << "within the interval";
  EXPECT_TRUE(t.MaybeTrim(11 * kSecond + 1, 20'000, 0)) << "counted from the last trim, not lost";
  EXPECT_FALSE(t.MaybeTrim(20 * kSecond, 20'000, 0)) << "nothing freed since";
  EXPECT_FALSE(t.MaybeTrim(20 * kSecond, 20'000 + HeapTrimmer::kMinFreed, 1'000'000)) << "an eighth of 1M is more";
  EXPECT_TRUE(t.MaybeTrim(20 * kSecond, 20'000 + 125'000, 1'000'000));
}

uint64_t RssAnonKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::strtoull(line.c_str() + 8, nullptr, 10);
  }
  return 0;
}

// What the daemon's churn leaves: small allocations freed between live
// ones, so glibc cannot shrink its heap's top and keeps the holes resident.
TEST(HeapTrimTest, ATrimReturnsTheHolesBetweenLiveAllocations) {
#if !defined(__GLIBC__) || defined(KVTIER_SANITIZER)
  GTEST_SKIP() << "the sanitizers' allocator is not glibc's heap";
#endif
  constexpr size_t kCount = 64 * 1024, kSize = 2048;  // 128 MiB
  std::vector<char*> blocks(kCount);
  for (char*& b : blocks) {
    b = static_cast<char*>(std::malloc(kSize));
    ASSERT_NE(b, nullptr);
    for (size_t i = 0; i < kSize; i += 512) b[i] = 1;  // resident
  }
  for (size_t i = 0; i < kCount; ++i) {
    if (i % 64 != 63) {
      std::free(blocks[i]);
      blocks[i] = nullptr;
    }
  }
  const uint64_t before = RssAnonKiB();
  HeapTrimmer t;
  ASSERT_TRUE(t.MaybeTrim(kSecond, kCount, 0));
  const uint64_t after = RssAnonKiB();
  for (char* b : blocks) std::free(b);
  // 63 of every 64 blocks were freed: ~124 MiB of holes, whole pages most.
  EXPECT_LT(after + 64 * 1024, before) << "RssAnon " << before << " KiB before the trim, " << after << " after";
}

}  // namespace
}  // namespace kvtier
