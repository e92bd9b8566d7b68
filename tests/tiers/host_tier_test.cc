// SPDX-License-Identifier: Apache-2.0
#include "tiers/host_tier.h"

#include <sys/mman.h>

#include "gtest/gtest.h"
#include "os/shm.h"

namespace kvtier {
namespace {

std::unique_ptr<HostTier> Make(uint64_t bytes) {
  auto t = HostTier::Create({"test-host", bytes, false});
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

TEST(HostTierTest, WriteReadRoundTripThroughTheArena) {
  auto tier = Make(1 << 20);
  auto slot = tier->Allocate(8192);
  ASSERT_TRUE(slot.ok());
  std::vector<std::byte> src(8192), dst(8192);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 31);
  absl::Status ws, rs;
  tier->Write(*slot, {}, src, IoPriority::kLoad, [&](absl::Status s) { ws = s; });
  tier->Read(*slot, {}, dst, IoPriority::kLoad, [&](absl::Status s) { rs = s; });
  ASSERT_TRUE(ws.ok() && rs.ok());
  EXPECT_EQ(src, dst);
  // Another mapping of the arena fd sees the same bytes at the slot's offset.
  auto other = os::MappedRegion::Map(tier->arena_fd(), tier->arena_bytes());
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(std::memcmp(other->data() + tier->ArenaOffset(*slot), src.data(), src.size()), 0);
}

TEST(HostTierTest, OutOfBoundsIoIsAnError) {
  auto tier = Make(1 << 20);
  auto slot = tier->Allocate(4096);
  ASSERT_TRUE(slot.ok());
  std::vector<std::byte> big(8192);
  absl::Status s;
  tier->Write(*slot, {}, big, IoPriority::kLoad, [&](absl::Status r) { s = r; });
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  tier->Read(*slot + 100, {}, std::span(big).first(16), IoPriority::kLoad, [&](absl::Status r) { s = r; });
  EXPECT_TRUE(absl::IsInvalidArgument(s));
}

TEST(HostTierTest, UsageAndCapacity) {
  auto tier = Make(16 * 4096);
  EXPECT_EQ(tier->Usage().capacity_bytes, 16u * 4096);
  std::vector<SlotHandle> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(*tier->Allocate(8192));
  EXPECT_EQ(tier->Usage().used_bytes, 16u * 4096);
  EXPECT_EQ(tier->Usage().used_slots, 8u);
  EXPECT_TRUE(absl::IsResourceExhausted(tier->Allocate(4096).status()));
  ASSERT_TRUE(tier->Free(slots[0]).ok());
  EXPECT_EQ(tier->Usage().free_slots, 1u);
  EXPECT_FALSE(HostTier::Create({"x", 100, false}).ok()) << "below one page";
  EXPECT_TRUE(os::IsSealedAgainstShrink(tier->arena_fd()));
}

}  // namespace
}  // namespace kvtier
