#include "tiers/slot_allocator.h"

#include <set>

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

}  // namespace
}  // namespace kvtier
