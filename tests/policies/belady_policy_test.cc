// SPDX-License-Identifier: Apache-2.0
#include "policies/belady_policy.h"

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(BeladyPolicyTest, EvictsTheBlockUsedFurthestInTheFuture) {
  BeladyPolicy p;
  p.SetNextUse(1, 10, 0);
  p.SetNextUse(2, 50, 0);
  p.SetNextUse(3, BeladyPolicy::kNever, 0);
  for (uint32_t h : {1, 2, 3}) p.Insert(h);
  auto any = [](uint32_t) { return true; };
  EXPECT_EQ(*p.PickVictim(any), 3u);
  p.Remove(3);
  EXPECT_EQ(*p.PickVictim(any), 2u);
  p.SetNextUse(1, 80, 0);  // used now; next use later than block 2's
  EXPECT_EQ(*p.PickVictim(any), 1u);
  EXPECT_EQ(*p.PickVictim([](uint32_t h) { return h != 1; }), 2u);
  EXPECT_FALSE(p.PickVictim([](uint32_t) { return false; }).has_value());
}

TEST(BeladyPolicyTest, OnATieTheDeeperBlockGoesFirst) {
  BeladyPolicy p;
  // A parent and its child are next used by the same request.
  p.SetNextUse(7, 20, 0);
  p.SetNextUse(8, 20, 1);
  p.Insert(8);
  p.Insert(7);
  EXPECT_EQ(*p.PickVictim([](uint32_t) { return true; }), 8u);
  EXPECT_EQ(p.size(), 2u);
  EXPECT_TRUE(p.Contains(7));
  p.Remove(7);
  EXPECT_FALSE(p.Contains(7));
}

}  // namespace
}  // namespace kvtier
