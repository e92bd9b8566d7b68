// SPDX-License-Identifier: Apache-2.0
// The GPU tier on the host-simulated device (cuda_device_test runs it on a
// GPU): slots, round trips, a slot read as another block is DataLoss,
// concurrent writers and readers, and the arena exported to another mapping.
#include "tiers/gpu_tier.h"

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

BlockMeta Meta(uint64_t i) {
  BlockMeta m;
  std::memcpy(m.key.bytes.data(), &i, sizeof(i));
  m.ns.bytes[0] = 7;
  return m;
}

std::vector<std::byte> Pattern(uint64_t seed, size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

absl::Status WriteSync(GpuTier& t, SlotHandle s, const BlockMeta& m, std::span<const std::byte> src) {
  absl::Status out = absl::UnknownError("callback did not run");
  t.Write(s, m, src, IoPriority::kDemote, [&](absl::Status st) { out = st; });
  return out;
}
absl::Status ReadSync(GpuTier& t, SlotHandle s, const BlockMeta& m, std::span<std::byte> dst) {
  absl::Status out = absl::UnknownError("callback did not run");
  t.Read(s, m, dst, IoPriority::kLoad, [&](absl::Status st) { out = st; });
  return out;
}

TEST(GpuTierTest, BlocksRoundTripAndAWrongBlockIsNeverServed) {
  auto dev = MakeSimDevice();
  auto tier = GpuTier::Create(dev.get(), {1 << 20});
  ASSERT_TRUE(tier.ok()) << tier.status();
  GpuTier& t = **tier;
  EXPECT_EQ(t.kind(), TierKind::kGpu);
  auto a = t.Allocate(100000);
  ASSERT_TRUE(a.ok());
  EXPECT_GE(t.SlotBytes(*a), 100000u);
  const auto data = Pattern(1, 100000);
  ASSERT_TRUE(WriteSync(t, *a, Meta(1), data).ok());
  std::vector<std::byte> back(data.size());
  ASSERT_TRUE(ReadSync(t, *a, Meta(1), back).ok());
  EXPECT_EQ(back, data);
  // The device bytes are what was written, at the slot's address.
  EXPECT_EQ(std::memcmp(t.SlotData(*a), data.data(), data.size()), 0);
  // Another key, or another length, in the same slot: DataLoss.
  EXPECT_TRUE(absl::IsDataLoss(ReadSync(t, *a, Meta(2), back)));
  std::vector<std::byte> shorter(5000);
  EXPECT_TRUE(absl::IsDataLoss(ReadSync(t, *a, Meta(1), shorter)));
  // Freed and reused: the old block is gone.
  ASSERT_TRUE(t.Free(*a).ok());
  EXPECT_FALSE(t.Free(*a).ok());
  auto b = t.Allocate(100000);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(absl::IsDataLoss(ReadSync(t, *b, Meta(1), back)));
  // Too big for its slot, or a free slot: refused.
  const auto big = Pattern(2, t.SlotBytes(*b) + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(WriteSync(t, *b, Meta(3), big)));
  EXPECT_TRUE(absl::IsInvalidArgument(WriteSync(t, 999, Meta(3), data)));
  EXPECT_EQ(t.Health(), TierHealth::kHealthy);
}

TEST(GpuTierTest, FillsToCapacityAndReportsUsage) {
  auto dev = MakeSimDevice();
  auto t = *GpuTier::Create(dev.get(), {64 << 10});
  std::vector<SlotHandle> slots;
  for (;;) {
    auto s = t->Allocate(8192);
    if (!s.ok()) {
      EXPECT_TRUE(absl::IsResourceExhausted(s.status()));
      break;
    }
    slots.push_back(*s);
  }
  EXPECT_EQ(slots.size(), 8u);
  const TierUsage u = t->Usage();
  EXPECT_EQ(u.capacity_bytes, 64u << 10);
  EXPECT_EQ(u.used_slots, 8u);
  EXPECT_EQ(u.used_bytes, 64u << 10);
  EXPECT_FALSE(GpuTier::Create(dev.get(), {0}).ok());
}

TEST(GpuTierTest, ConcurrentWritersAndReadersKeepTheirBlocks) {
  auto dev = MakeSimDevice();
  auto t = *GpuTier::Create(dev.get(), {4 << 20});
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int r = 0; r < kRounds; ++r) {
        const uint64_t id = uint64_t(th) * 100000 + r;
        auto s = t->Allocate(16384);
        if (!s.ok()) {
          ++bad;
          continue;
        }
        const auto data = Pattern(id, 16384);
        std::vector<std::byte> back(16384);
        if (!WriteSync(*t, *s, Meta(id), data).ok() || !ReadSync(*t, *s, Meta(id), back).ok() || back != data) ++bad;
        if (!t->Free(*s).ok()) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(t->Usage().used_slots, 0u);
}

TEST(GpuTierTest, TheArenaIsExportedWhole) {
  auto dev = MakeSimDevice();
  auto t = *GpuTier::Create(dev.get(), {256 << 10});
  auto s = *t->Allocate(4096);
  const auto data = Pattern(9, 4096);
  ASSERT_TRUE(WriteSync(*t, s, Meta(9), data).ok());
  auto h = t->ExportArena();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->bytes, 256u << 10);
  // Another "process" (a second simulated device) maps it and finds the block.
  auto other = MakeSimDevice();
  auto p = other->ImportMemory(*h);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(std::memcmp(static_cast<std::byte*>(*p) + t->ArenaOffset(s), data.data(), data.size()), 0);
  ASSERT_TRUE(other->CloseImported(*p).ok());
}

}  // namespace
}  // namespace kvtier
