// SPDX-License-Identifier: Apache-2.0
#include "store/host_residency.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "store/block_index.h"

namespace kvtier {
namespace {

constexpr uint64_t kArena = 1 << 20;  // segments of 16 KiB: 4 slots of 4 KiB, 2 of 8 KiB

// The store's index: slots are owned by its records.
BlockIndex& Index() {
  static BlockIndex* index = new BlockIndex;
  return *index;
}

// `n` records of distinct keys.
std::vector<BlockRecord*> Records(size_t n) {
  static uint32_t next = 0;
  std::vector<BlockRecord*> out;
  for (size_t i = 0; i < n; ++i) {
    BlockKey k{};
    const uint32_t id = ++next;
    std::memcpy(k.bytes.data(), &id, sizeof(id));
    out.push_back(Index().NewRecord(1, k));
  }
  return out;
}

std::unique_ptr<HostResidency> MakeResidency(TenantQuota quota = {}, const std::string& policy = "lru") {
  auto host = HostTier::Create({"residency-test", kArena, false});
  EXPECT_TRUE(host.ok()) << host.status();
  return std::make_unique<HostResidency>("t", 1, std::move(*host), nullptr, quota, policy, &Index());
}

// A block of `bytes` and `tokens` stored in a new slot, in its size's policy.
SlotHandle Store(HostResidency& r, BlockRecord* owner, uint64_t bytes, uint32_t tokens)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.mu) {
  absl::StatusOr<SlotHandle> slot = r.host->Allocate(bytes);
  EXPECT_TRUE(slot.ok()) << slot.status();
  EXPECT_TRUE(r.slots.Assign(*slot, owner, tokens));
  r.PolicyForLocked(r.host->SlotSizeFor(bytes))->InsertWithKey(*slot, PolicyKeyOf(*owner));
  return *slot;
}

TEST(HostResidencyTest, FullerThanCountsBytesAndTokensLessWhatIsBeingFreed) {
  auto r = MakeResidency({.host_tokens = 100});
  MutexLock l(&r->mu);
  const std::vector<BlockRecord*> b = Records(4);
  for (BlockRecord* rec : b) Store(*r, rec, 4096, 10);
  // 16 KiB of 1 MiB by bytes; 40 of 100 tokens by the quota.
  EXPECT_FALSE(r->FullerThanLocked(0.5));
  EXPECT_TRUE(r->FullerThanLocked(0.3));                      // tokens: 0.4 > 0.3
  EXPECT_FALSE(r->FullerThanLocked(0.3, 0, 20));              // 20 tokens about to go
  EXPECT_TRUE(r->FullerThanLocked(0.01));                     // bytes: 16 KiB > 10.5 KiB
  EXPECT_FALSE(r->FullerThanLocked(0.01, 8192, 40));          // 8 KiB left: under 10.5 KiB
  EXPECT_FALSE(r->FullerThanLocked(0.0, 1 << 30, 1 << 30));   // freeing more than is held: empty
  r->SetQuota({});                                            // no token quota: bytes alone
  EXPECT_FALSE(r->FullerThanLocked(0.3));
  EXPECT_EQ(r->Quota().host_tokens, 0u);
}

TEST(HostResidencyTest, OnePolicyPerSizeAndFreeingLeavesEveryBook) {
  auto r = MakeResidency();
  MutexLock l(&r->mu);
  ChainGuard* small = r->PolicyForLocked(4096);
  EXPECT_EQ(r->PolicyForLocked(4096), small);
  EXPECT_NE(r->PolicyForLocked(8192), small);
  const std::vector<BlockRecord*> ab = Records(2);
  const SlotHandle sa = Store(*r, ab[0], 4096, 16);
  Store(*r, ab[1], 4096, 16);
  EXPECT_EQ(small->size(), 2u);
  r->FreeSlotLocked(sa);
  EXPECT_EQ(small->size(), 1u);
  EXPECT_FALSE(small->Contains(sa));
  EXPECT_EQ(r->slots.owner(sa), nullptr);
  EXPECT_EQ(r->slots.tokens_held(), 16u);
  EXPECT_EQ(r->host->Usage().used_slots, 1u);
}

TEST(HostResidencyTest, PoliciesComeLargestHolderFirstAndEmptyOnesNot) {
  auto r = MakeResidency();
  MutexLock l(&r->mu);
  const std::vector<BlockRecord*> b = Records(4);
  Store(*r, b[0], 8192, 16);  // 8 KiB in the 8 KiB policy
  for (int i = 1; i < 4; ++i) Store(*r, b[i], 4096, 8);  // 12 KiB in the 4 KiB one
  r->PolicyForLocked(65536);  // made, and empty
  std::vector<ChainGuard*> order = r->PoliciesByBytesLocked();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], r->PolicyForLocked(4096));
  EXPECT_EQ(order[1], r->PolicyForLocked(8192));
}

TEST(HostResidencyTest, ColdSegmentsOfOtherSizesComeColdestFirst) {
  auto r = MakeResidency();
  MutexLock l(&r->mu);
  const std::vector<BlockRecord*> b = Records(5);
  // Two segments of 8 KiB slots (two slots each), then one 4 KiB block.
  SlotHandle s[4];
  for (int i = 0; i < 4; ++i) s[i] = Store(*r, b[i], 8192, 16);
  const SlotHandle small = Store(*r, b[4], 4096, 8);
  r->slots.Touch(s[0]);  // the first segment now holds the youngest block
  const std::vector<HostResidency::Segment> segs = r->ColdSegmentsLocked(4096, std::nullopt, 8);
  ASSERT_EQ(segs.size(), 2u);
  std::vector<SlotHandle> first = segs[0].slots, second = segs[1].slots;
  std::sort(first.begin(), first.end());
  std::sort(second.begin(), second.end());
  EXPECT_EQ(first, (std::vector<SlotHandle>{s[2], s[3]}));
  EXPECT_EQ(second, (std::vector<SlotHandle>{s[0], s[1]}));
  EXPECT_GT(segs[0].youngest, segs[1].youngest);
  // At most `max`, and only segments older than min_age.
  EXPECT_EQ(r->ColdSegmentsLocked(4096, std::nullopt, 1).size(), 1u);
  const std::vector<HostResidency::Segment> old = r->ColdSegmentsLocked(4096, segs[1].youngest, 8);
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0].youngest, segs[0].youngest);
  EXPECT_TRUE(r->ColdSegmentsLocked(4096, segs[0].youngest, 8).empty());
  // Seen from the 8 KiB size, only the 4 KiB block's segment.
  const std::vector<HostResidency::Segment> others = r->ColdSegmentsLocked(8192, std::nullopt, 8);
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].slots, (std::vector<SlotHandle>{small}));
}

}  // namespace
}  // namespace kvtier
