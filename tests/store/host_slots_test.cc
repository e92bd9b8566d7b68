// SPDX-License-Identifier: Apache-2.0
#include "store/host_slots.h"

#include <gtest/gtest.h>

#include <set>

#include "store/block_index.h"

namespace kvtier {
namespace {

// Owners are records of an index (the table keeps their numbers).
BlockRecord* NewRecord(BlockIndex& index, uint8_t key) {
  BlockKey k{};
  k.bytes[0] = key;
  return index.NewRecord(1, k);
}

TEST(HostSlotTableTest, OwnersAndTokensFollowAssignAndRelease) {
  BlockIndex index;
  HostSlotTable t(&index);
  BlockRecord& a = *NewRecord(index, 1);
  BlockRecord& b = *NewRecord(index, 2);
  ASSERT_NE(&a, &b);
  EXPECT_EQ(t.owner(0), nullptr);
  EXPECT_TRUE(t.Assign(5, &a, 16));
  EXPECT_TRUE(t.Assign(2, &b, 32));
  EXPECT_EQ(t.owner(5), &a);
  EXPECT_EQ(t.owner(2), &b);
  EXPECT_EQ(t.owner(3), nullptr);
  EXPECT_EQ(t.owner(100), nullptr);  // past the table
  EXPECT_EQ(t.tokens_held(), 48u);
  // No owner: nothing is held, nothing counted.
  EXPECT_FALSE(t.Assign(7, nullptr, 5));
  EXPECT_EQ(t.tokens_held(), 48u);
  // A held slot is not assigned again: nothing changes.
  EXPECT_FALSE(t.Assign(2, &a, 8));
  EXPECT_EQ(t.owner(2), &b);
  EXPECT_EQ(t.tokens(2), 32u);
  EXPECT_EQ(t.tokens_held(), 48u);
  t.Release(5);
  EXPECT_EQ(t.owner(5), nullptr);
  EXPECT_EQ(t.tokens(5), 0u);
  EXPECT_EQ(t.tokens_held(), 32u);
  t.Release(5);  // twice, or a slot never held: nothing more leaves
  t.Release(900);
  EXPECT_EQ(t.tokens_held(), 32u);
  // A slot taken again holds only its new block's tokens.
  t.Release(2);
  EXPECT_TRUE(t.Assign(2, &a, 8));
  EXPECT_EQ(t.owner(2), &a);
  EXPECT_EQ(t.tokens_held(), 8u);
  std::set<BlockRecord*> seen;
  int n = 0;
  t.ForEachOwner([&](BlockRecord* r) {
    seen.insert(r);
    ++n;
  });
  EXPECT_EQ(n, 1);
  EXPECT_EQ(seen, std::set<BlockRecord*>{&a});
}

// Tokens take 16 bits per slot; larger blocks keep theirs elsewhere, and
// every count comes back whole.
TEST(HostSlotTableTest, BlocksOfManyTokensCountWhole) {
  BlockIndex index;
  HostSlotTable t(&index);
  BlockRecord& r = *NewRecord(index, 1);
  ASSERT_TRUE(t.Assign(0, &r, 65534));
  ASSERT_TRUE(t.Assign(1, &r, 65535));
  ASSERT_TRUE(t.Assign(2, &r, 1u << 20));
  EXPECT_EQ(t.tokens(0), 65534u);
  EXPECT_EQ(t.tokens(1), 65535u);
  EXPECT_EQ(t.tokens(2), 1u << 20);
  EXPECT_EQ(t.tokens_held(), 65534u + 65535u + (1u << 20));
  t.Release(2);
  EXPECT_EQ(t.tokens(2), 0u);
  EXPECT_EQ(t.tokens_held(), 65534u + 65535u);
  ASSERT_TRUE(t.Assign(2, &r, 3));  // the slot again, small this time
  EXPECT_EQ(t.tokens(2), 3u);
  t.Release(1);
  t.Release(0);
  t.Release(2);
  EXPECT_EQ(t.tokens_held(), 0u);
}

TEST(HostSlotTableTest, AgeCountsStoresAndHitsSinceTheLast) {
  BlockIndex index;
  HostSlotTable t(&index);
  BlockRecord& r = *NewRecord(index, 1);
  t.Assign(0, &r, 1);
  t.Assign(1, &r, 1);
  t.Assign(2, &r, 1);
  EXPECT_EQ(t.age(0), 2u);
  EXPECT_EQ(t.age(1), 1u);
  EXPECT_EQ(t.age(2), 0u);
  t.Touch(0);  // a hit makes it the youngest
  EXPECT_EQ(t.age(0), 0u);
  EXPECT_EQ(t.age(2), 1u);
  t.Touch(50);  // not a slot it holds: no tick, nothing grows
  EXPECT_EQ(t.age(0), 0u);
  EXPECT_EQ(t.owner(50), nullptr);
}

}  // namespace
}  // namespace kvtier
