// SPDX-License-Identifier: Apache-2.0
// The lower lane's books and its fair-share rule, on an in-memory block tier
// of 8 slots of 1 KiB shared by two configured tenants (a share of 4 each).
#include "store/lower_lane.h"

#include <gtest/gtest.h>

#include <deque>
#include <future>
#include <set>

#include "tiers/memory_block_tier.h"

namespace kvtier {
namespace {

constexpr uint64_t kBlock = 1024;

class LowerLaneTest : public ::testing::Test {
 protected:
  LowerLaneTest() { Make(2); }
  void Make(size_t configured_tenants) {
    records_.clear();
    auto tier = MemoryBlockTier::Create({.capacity_bytes = 8 * kBlock});
    EXPECT_TRUE(tier.ok());
    lane_ = std::make_unique<LowerLane>(0, std::move(*tier), MakeSparseLruPolicy(), /*tenants=*/3,
                                        configured_tenants);
  }

  // A block of `tenant` stored in the lane, newest in the policy.
  SlotHandle Put(uint16_t tenant) {
    MutexLock l(&lane_->mu);
    absl::StatusOr<SlotHandle> slot = lane_->ReserveLocked(BlockMeta{.payload_bytes = kBlock});
    EXPECT_TRUE(slot.ok()) << slot.status();
    BlockRecord& r = records_.emplace_back();
    r.tenant = tenant;
    r.lower_state = LowerState::kReady;
    lane_->owner[*slot] = &r;
    lane_->ChargeLocked(tenant, *slot, kBlock, 16, +1);
    lane_->policy->Insert(*slot);
    return *slot;
  }
  LowerLane::Victim Pick(uint16_t tenant, bool over_quota = false) {
    MutexLock l(&lane_->mu);
    return lane_->PickVictimLocked(tenant, kBlock, over_quota, [&](BlockRecord* r) { return r->pins == 0; });
  }
  void Pin(SlotHandle s) {
    MutexLock l(&lane_->mu);
    lane_->owner.at(s)->pins = 1;
  }

  std::deque<BlockRecord> records_;  // stable addresses
  std::unique_ptr<LowerLane> lane_;
};

TEST_F(LowerLaneTest, KeepsEachTenantsUseAndGivesSlotsBack) {
  EXPECT_EQ(lane_->fair_share_bytes, 4 * kBlock);
  const SlotHandle a = Put(0);
  Put(0);
  const SlotHandle c = Put(1);
  MutexLock l(&lane_->mu);
  EXPECT_EQ(lane_->use(0).bytes, 2 * kBlock);
  EXPECT_EQ(lane_->use(0).tokens, 32u);
  EXPECT_EQ(lane_->use(0).slot_bytes, 2 * kBlock);
  EXPECT_EQ(lane_->use(1).bytes, kBlock);
  EXPECT_EQ(lane_->use(7).bytes, 0u) << "a tenant the lane has not seen uses nothing";
  lane_->policy->Remove(a);
  lane_->ReleaseLocked(0, a, BlockMeta{.payload_bytes = kBlock, .block_tokens = 16});
  EXPECT_EQ(lane_->use(0).bytes, kBlock);
  EXPECT_EQ(lane_->use(0).tokens, 16u);
  EXPECT_FALSE(lane_->owner.contains(a));
  EXPECT_EQ(lane_->tier->Usage().used_bytes, 2 * kBlock);
  lane_->GrowTenantsLocked(8);
  lane_->ChargeLocked(7, c, 1, 1, +1);
  EXPECT_EQ(lane_->use(7).bytes, 1u);
}

TEST_F(LowerLaneTest, ATenantOverItsSharePaysWithItsOwnBlocksFirst) {
  Make(3);  // shares of 8/3 KiB
  std::vector<SlotHandle> one;
  for (int i = 0; i < 5; ++i) one.push_back(Put(1));  // 5 KiB: over its share, its blocks fair game
  std::vector<SlotHandle> own;
  for (int i = 0; i < 3; ++i) own.push_back(Put(0));  // 3 KiB: over its share too
  const LowerLane::Victim v = Pick(0);
  ASSERT_TRUE(v.slot.has_value());
  EXPECT_EQ(*v.slot, own[0]) << "its own coldest, not tenant 1's colder block " << one[0];
  // With none of its own to give, a tenant over its share takes from others over theirs.
  for (SlotHandle s : own) Pin(s);
  const LowerLane::Victim w = Pick(0);
  ASSERT_TRUE(w.slot.has_value());
  EXPECT_EQ(*w.slot, one[0]);
}

TEST_F(LowerLaneTest, ATenantWithinItsShareTakesFromOneOverItsShareFirst) {
  const SlotHandle mine = Put(1);  // tenant 1's: the coldest
  std::vector<SlotHandle> theirs;
  for (int i = 0; i < 7; ++i) theirs.push_back(Put(0));  // tenant 0 holds 7, over its share
  const LowerLane::Victim v = Pick(1);
  ASSERT_TRUE(v.slot.has_value());
  EXPECT_EQ(*v.slot, theirs[0]) << "not its own coldest " << mine;
  // With nothing of the other tenant's to take, its own goes.
  for (SlotHandle s : theirs) Pin(s);
  const LowerLane::Victim w = Pick(1);
  ASSERT_TRUE(w.slot.has_value());
  EXPECT_EQ(*w.slot, mine);
}

TEST_F(LowerLaneTest, ATenantWithinItsShareIsProtected) {
  std::vector<SlotHandle> one, zero;
  for (int i = 0; i < 4; ++i) one.push_back(Put(1));   // exactly its share
  for (int i = 0; i < 4; ++i) zero.push_back(Put(0));  // at its share, wants more
  for (SlotHandle s : zero) Pin(s);
  const LowerLane::Victim v = Pick(0);
  EXPECT_FALSE(v.slot.has_value()) << "tenant 1's blocks are within its share";
  EXPECT_TRUE(v.held_back) << "an evictable block was passed over";
  // Pinned blocks are never offered, and passing over them is not holding back.
  for (SlotHandle s : one) Pin(s);
  EXPECT_FALSE(Pick(0).held_back);
}

TEST_F(LowerLaneTest, OverItsQuotaATenantPaysOnlyWithItsOwn) {
  std::vector<SlotHandle> one;
  for (int i = 0; i < 6; ++i) one.push_back(Put(1));  // over its share: fair game otherwise
  const SlotHandle own = Put(0);
  Pin(own);
  const LowerLane::Victim v = Pick(0, /*over_quota=*/true);
  EXPECT_FALSE(v.slot.has_value()) << "over its quota only its own blocks may go, and its one is pinned";
  const LowerLane::Victim w = Pick(0);
  ASSERT_TRUE(w.slot.has_value());
  EXPECT_EQ(*w.slot, one[0]);
}

// A tier addressed by key alone (a shared tier): the lane numbers the
// blocks itself, bounds what this node places there by the tier's
// capacity, and letting a block go leaves its value to the other nodes.
TEST(KeyedLowerLaneTest, TheLaneKeepsTheBooksAndTheValuesStay) {
  auto made = MemoryBlockTier::Create({.capacity_bytes = 3 * kBlock, .name = "shared", .shared = true});
  ASSERT_TRUE(made.ok());
  MemoryBlockTier* tier = made->get();
  LowerLane lane(0, std::move(*made), MakeSparseLruPolicy(), /*tenants=*/1, /*configured_tenants=*/1);
  ASSERT_TRUE(lane.keyed());
  auto meta = [](uint8_t k) {
    BlockMeta m{.payload_bytes = kBlock, .tenant_hash = 7, .block_tokens = 16};
    m.key.bytes[0] = k;
    return m;
  };
  MutexLock l(&lane.mu);
  std::vector<SlotHandle> handles;
  for (uint8_t k = 0; k < 3; ++k) {
    absl::StatusOr<SlotHandle> h = lane.ReserveLocked(meta(k));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(lane.LocatorOf(*h), kKeyAddressed) << "the tier is handed no locator of the lane's";
    lane.ChargeLocked(0, *h, kBlock, 16, +1);
    handles.push_back(*h);
  }
  EXPECT_EQ(std::set<SlotHandle>(handles.begin(), handles.end()).size(), 3u) << "each block its own handle";
  const TierUsage full = lane.Usage();
  EXPECT_EQ(full.used_slots, 3u);
  EXPECT_EQ(full.used_bytes, 3 * kBlock);
  EXPECT_EQ(lane.use(0).slot_bytes, 3 * kBlock);
  absl::StatusOr<SlotHandle> over = lane.ReserveLocked(meta(3));
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << "past this node's share of the tier";
  EXPECT_TRUE(absl::IsInvalidArgument(lane.ReserveLocked(BlockMeta{}).status())) << "an empty block";

  // A value written under block 1's identity outlives this node's handle.
  std::vector<std::byte> bytes(kBlock, std::byte{0x42});
  std::promise<absl::Status> wrote;
  tier->Put(lane.LocatorOf(handles[1]), meta(1), bytes, IoPriority::kDemote,
            [&](absl::Status s) { wrote.set_value(s); });
  ASSERT_TRUE(wrote.get_future().get().ok());
  lane.ReleaseLocked(0, handles[1], meta(1));
  EXPECT_EQ(lane.Usage().used_bytes, 2 * kBlock);
  EXPECT_EQ(lane.use(0).blocks, 2u);
  EXPECT_EQ(lane.CostOfLocked(handles[1]), 0u) << "a handle let go costs nothing";
  std::vector<std::byte> got(kBlock);
  std::promise<absl::Status> read;
  tier->Get(kKeyAddressed, meta(1), got, IoPriority::kLoad, [&](absl::Status s) { read.set_value(s); });
  ASSERT_TRUE(read.get_future().get().ok()) << "the value is the cluster's, not this node's";
  EXPECT_EQ(got, bytes);
  absl::StatusOr<SlotHandle> again = lane.ReserveLocked(meta(4));
  ASSERT_TRUE(again.ok()) << "room again once a handle is let go";
  EXPECT_EQ(*again, handles[1]) << "handles are reused";
}

}  // namespace
}  // namespace kvtier
