// SPDX-License-Identifier: Apache-2.0
#include "tiers/slot_allocator.h"

#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(SlotAllocatorTest, ExhaustionThenReuse) {
  SlotAllocator a(16 * 4096);
  std::vector<uint32_t> slots;
  std::set<uint64_t> offsets;
  for (int i = 0; i < 16; ++i) {
    auto s = a.Allocate(4096);
    ASSERT_TRUE(s.ok()) << i;
    slots.push_back(*s);
    EXPECT_TRUE(offsets.insert(a.Offset(*s)).second) << "two slots share an offset";
    EXPECT_LT(a.Offset(*s) + a.Bytes(*s), 16u * 4096 + 1);
  }
  auto full = a.Allocate(4096);
  ASSERT_FALSE(full.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(full.status()));
  EXPECT_EQ(a.used_bytes(), 16u * 4096);
  ASSERT_TRUE(a.Free(slots[5]).ok());
  auto again = a.Allocate(100);  // rounds up to the same class
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, slots[5]) << "a freed slot is reused";
  EXPECT_EQ(a.free_slots(), 0u);
}

TEST(SlotAllocatorTest, SizeClassesNeverShareSlots) {
  SlotAllocator a(10 * 4096);
  auto big = a.Allocate(3 * 4096);
  auto small = a.Allocate(4096);
  ASSERT_TRUE(big.ok() && small.ok());
  EXPECT_EQ(a.Bytes(*big), 3u * 4096);
  EXPECT_EQ(a.Bytes(*small), 4096u);
  ASSERT_TRUE(a.Free(*big).ok());
  // The freed 12 KiB slot serves its class only; small blocks carve new space.
  auto small2 = a.Allocate(4096);
  ASSERT_TRUE(small2.ok());
  EXPECT_NE(*small2, *big);
  auto big2 = a.Allocate(3 * 4096);
  ASSERT_TRUE(big2.ok());
  EXPECT_EQ(*big2, *big);
}

TEST(SlotAllocatorTest, BadRequestsAreErrors) {
  SlotAllocator a(8 * 4096);
  EXPECT_TRUE(absl::IsInvalidArgument(a.Allocate(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(a.Allocate(9 * 4096).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(a.Free(3)));
  auto s = a.Allocate(4096);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(a.Free(*s).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(a.Free(*s))) << "double free must be refused";
}

// Fills the arena with one block size, frees everything: every other block
// size must now get the whole arena. Before segments, the first size kept
// what it had carved and every other size was refused until restart.
TEST(SlotAllocatorTest, AnotherSizeGetsTheArenaBackAfterOneSizeLeaves) {
  constexpr uint64_t kCapacity = 8ull << 20;
  SlotAllocator a(kCapacity);
  std::vector<uint32_t> small;
  for (;;) {
    auto s = a.Allocate(4096);
    if (!s.ok()) break;
    small.push_back(*s);
  }
  ASSERT_EQ(small.size(), kCapacity / 4096);
  for (uint32_t s : small) ASSERT_TRUE(a.Free(s).ok());
  for (uint64_t bytes : {uint64_t{12288}, uint64_t{1} << 20, uint64_t{3} << 20}) {
    std::vector<uint32_t> big;
    for (;;) {
      auto s = a.Allocate(bytes);
      if (!s.ok()) {
        EXPECT_TRUE(absl::IsResourceExhausted(s.status())) << s.status();
        break;
      }
      big.push_back(*s);
    }
    EXPECT_EQ(big.size(), kCapacity / bytes) << "blocks of " << bytes << " bytes";
    for (uint32_t s : big) ASSERT_TRUE(a.Free(s).ok());
  }
}

// One live block pins only its own segment: the rest of the arena goes to
// another size once the first size's other blocks are freed.
TEST(SlotAllocatorTest, EmptySegmentsGoToAnotherSize) {
  constexpr uint64_t kCapacity = 8ull << 20;
  SlotAllocator a(kCapacity);
  std::vector<uint32_t> small;
  for (;;) {
    auto s = a.Allocate(4096);
    if (!s.ok()) break;
    small.push_back(*s);
  }
  const uint32_t keep = small[small.size() / 2];
  const uint64_t keep_offset = a.Offset(keep);
  for (uint32_t s : small) {
    if (s != keep) {
      ASSERT_TRUE(a.Free(s).ok());
    }
  }
  EXPECT_EQ(a.FreeBytesInClass(4096) + a.used_bytes() + a.uncarved_bytes(), kCapacity);
  constexpr uint64_t kBig = 12288;
  uint64_t got = 0;
  for (;;) {
    auto s = a.Allocate(kBig);
    if (!s.ok()) break;
    got += a.Bytes(*s);
    EXPECT_TRUE(a.Offset(*s) + kBig <= keep_offset || a.Offset(*s) >= keep_offset + 4096);
  }
  EXPECT_GE(got, kCapacity - a.SegmentTarget() - 2 * kBig);
  EXPECT_TRUE(a.IsAllocated(keep));
  EXPECT_EQ(a.Offset(keep), keep_offset) << "a live slot never moves";
  // The pinned segment still serves its own size.
  EXPECT_TRUE(a.Allocate(4096).ok());
}

// What each size holds is reported, and free slots in segments that still
// hold live ones are stranded (no other size can use them); an empty segment
// is not, and the live slots of other sizes are listed by segment.
TEST(SlotAllocatorTest, ClassesReportUsedFreeAndStrandedBytes) {
  constexpr uint64_t kCapacity = 8ull << 20;
  SlotAllocator a(kCapacity);
  const uint64_t per_segment = a.SlotsPerSegment(8192);
  ASSERT_GE(per_segment, 4u);
  std::vector<uint32_t> big;
  for (uint64_t i = 0; i < 3 * per_segment; ++i) big.push_back(*a.Allocate(8192));  // three full segments
  std::vector<uint32_t> small;
  for (int i = 0; i < 3; ++i) small.push_back(*a.Allocate(4096));
  // Segment 1: one live slot left; segment 2: none.
  for (uint64_t i = 0; i + 1 < per_segment; ++i) ASSERT_TRUE(a.Free(big[i]).ok());
  for (uint64_t i = per_segment; i < 2 * per_segment; ++i) ASSERT_TRUE(a.Free(big[i]).ok());
  const std::vector<SlotAllocator::ClassUsage> classes = a.Classes();
  ASSERT_EQ(classes.size(), 2u);
  EXPECT_EQ(classes[0].slot_bytes, 4096u);
  EXPECT_EQ(classes[0].segments, 1u);
  EXPECT_EQ(classes[0].used_bytes, 3u * 4096);
  EXPECT_EQ(classes[0].stranded_bytes, classes[0].carved_bytes - 3 * 4096);
  EXPECT_EQ(classes[1].slot_bytes, 8192u);
  EXPECT_EQ(classes[1].segments, 3u);
  EXPECT_EQ(classes[1].used_bytes, (per_segment + 1) * 8192);
  EXPECT_EQ(classes[1].free_bytes(), (2 * per_segment - 1) * 8192);
  EXPECT_EQ(classes[1].stranded_bytes, (per_segment - 1) * 8192) << "the empty segment is not stranded";
  EXPECT_EQ(classes[0].used_bytes + classes[1].used_bytes, a.used_bytes());
  EXPECT_EQ(classes[0].carved_bytes + classes[1].carved_bytes, a.carved_bytes());

  const auto outside = a.LiveSlotsOutsideClass(4096);
  ASSERT_EQ(outside.size(), per_segment + 1);
  std::set<uint32_t> segments;
  for (const auto& [segment, slot] : outside) {
    EXPECT_EQ(a.Bytes(slot), 8192u);
    segments.insert(segment);
  }
  EXPECT_EQ(segments.size(), 2u) << "the live 8 KiB slots lie in two segments";
  EXPECT_EQ(a.LiveSlotsOutsideClass(8192).size(), 3u);
}

// Random allocations and frees of mixed sizes against a model of the live
// slots: no two live slots overlap, every slot lies inside the capacity and
// keeps its offset while live, a refusal means there really is no room, and
// once everything is freed any size can carve the whole capacity.
TEST(SlotAllocatorTest, RandomMixedSizesMatchTheModel) {
  const std::vector<uint64_t> sizes = {4096, 8192, 12288, 5000, 65536, 300000, 1 << 20};
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    const uint64_t capacity = (4ull << 20) + 4096 * (rng() % 64);
    SlotAllocator a(capacity);
    struct Live {
      uint64_t offset, bytes;
    };
    std::map<uint32_t, Live> live;        // by handle
    std::map<uint64_t, uint64_t> extent;  // offset -> end
    uint64_t used = 0;
    auto check_all = [&] {
      ASSERT_EQ(a.used_bytes(), used);
      ASSERT_EQ(a.used_slots(), live.size());
      ASSERT_EQ(a.carved_bytes() + a.uncarved_bytes(), a.capacity_bytes());
      for (const auto& [h, l] : live) {
        ASSERT_TRUE(a.IsAllocated(h));
        ASSERT_EQ(a.Offset(h), l.offset) << "a live slot moved";
        ASSERT_EQ(a.Bytes(h), l.bytes);
      }
    };
    for (int step = 0; step < 4000; ++step) {
      const bool alloc = live.empty() || rng() % 100 < (step % 1000 < 600 ? 70 : 30);
      if (alloc) {
        const uint64_t want = sizes[rng() % sizes.size()];
        const uint64_t rounded = a.RoundUp(want);
        auto s = a.Allocate(want);
        if (!s.ok()) {
          ASSERT_TRUE(absl::IsResourceExhausted(s.status())) << s.status();
          ASSERT_EQ(a.FreeBytesInClass(want), 0u) << "refused with free slots of its size";
          ASSERT_LT(a.largest_uncarved_bytes(), rounded) << "refused with room to carve";
          continue;
        }
        const uint64_t off = a.Offset(*s), bytes = a.Bytes(*s);
        ASSERT_FALSE(live.contains(*s)) << "handle handed out twice";
        ASSERT_EQ(bytes, rounded);
        ASSERT_EQ(off % 4096, 0u);
        ASSERT_LE(off + bytes, capacity);
        auto next = extent.lower_bound(off);
        if (next != extent.end()) {
          ASSERT_LE(off + bytes, next->first) << "overlaps the next live slot";
        }
        if (next != extent.begin()) {
          ASSERT_LE(std::prev(next)->second, off) << "overlaps the previous live slot";
        }
        extent[off] = off + bytes;
        live[*s] = {off, bytes};
        used += bytes;
      } else {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        ASSERT_TRUE(a.Free(it->first).ok());
        extent.erase(it->second.offset);
        used -= it->second.bytes;
        live.erase(it);
      }
      if (step % 97 == 0) check_all();
    }
    check_all();
    for (const auto& [h, l] : live) ASSERT_TRUE(a.Free(h).ok());
    EXPECT_EQ(a.used_bytes(), 0u);
    for (int round = 0; round < 3; ++round) {
      const uint64_t want = sizes[rng() % sizes.size()];
      std::vector<uint32_t> got;
      for (;;) {
        auto s = a.Allocate(want);
        if (!s.ok()) break;
        got.push_back(*s);
      }
      EXPECT_EQ(got.size(), capacity / a.RoundUp(want)) << "seed " << seed << ", blocks of " << want;
      for (uint32_t h : got) ASSERT_TRUE(a.Free(h).ok());
    }
  }
}

}  // namespace
}  // namespace kvtier
