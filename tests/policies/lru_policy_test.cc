// SPDX-License-Identifier: Apache-2.0
#include <list>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

TEST(LruPolicyTest, EvictsLeastRecentlyUsedFirst) {
  auto lru = MakeLruPolicy();
  for (uint32_t h : {1, 2, 3, 4}) lru->Insert(h);
  lru->Touch(1);
  auto any = [](uint32_t) { return true; };
  EXPECT_EQ(*lru->PickVictim(any), 2u);
  lru->Remove(2);
  EXPECT_EQ(*lru->PickVictim(any), 3u);
  lru->Insert(3);  // re-insert counts as a use
  EXPECT_EQ(*lru->PickVictim(any), 4u);
  EXPECT_EQ(lru->size(), 3u);
}

TEST(LruPolicyTest, SkipsWhatIsNotEvictable) {
  auto lru = MakeLruPolicy();
  for (uint32_t h = 0; h < 10; ++h) lru->Insert(h);
  std::set<uint32_t> pinned = {0, 1, 2};
  auto v = lru->PickVictim([&](uint32_t h) { return !pinned.contains(h); });
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, 3u);
  EXPECT_FALSE(lru->PickVictim([](uint32_t) { return false; }).has_value());
  EXPECT_FALSE(MakeLruPolicy()->PickVictim([](uint32_t) { return true; }).has_value());
}

class LruModelTest : public ::testing::TestWithParam<bool> {};

TEST_P(LruModelTest, MatchesAReferenceModelOnRandomOperations) {
  auto lru = GetParam() ? MakeSparseLruPolicy() : MakeLruPolicy();
  std::list<uint32_t> model;  // front = most recent
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    // Sparse handles look like the NVMe tier's segment<<16|slot.
    const uint32_t h = GetParam() ? (rng() % 20) << 16 | (rng() % 15) : rng() % 300;
    const bool tracked = std::find(model.begin(), model.end(), h) != model.end();
    switch (rng() % 4) {
      case 0:
        lru->Insert(h);
        model.remove(h);
        model.push_front(h);
        break;
      case 1:
        lru->Touch(h);
        if (tracked) {
          model.remove(h);
          model.push_front(h);
        }
        break;
      case 2:
        lru->Remove(h);
        model.remove(h);
        break;
      case 3: {
        const uint32_t skip = GetParam() ? (rng() % 20) << 16 | (rng() % 15) : rng() % 300;
        auto v = lru->PickVictim([&](uint32_t x) { return x != skip; });
        std::optional<uint32_t> want;
        for (auto it = model.rbegin(); it != model.rend(); ++it) {
          if (*it != skip) {
            want = *it;
            break;
          }
        }
        ASSERT_EQ(v, want) << "step " << i;
        break;
      }
    }
    ASSERT_EQ(lru->size(), model.size());
    ASSERT_EQ(lru->Contains(h), std::find(model.begin(), model.end(), h) != model.end());
  }
}

INSTANTIATE_TEST_SUITE_P(DenseAndSparse, LruModelTest, ::testing::Bool());

TEST(EvictionPolicyTest, FactoryKnowsLruAndRefusesUnknownNames) {
  EXPECT_EQ((*MakeEvictionPolicy("lru"))->name(), "lru");
  auto bad = MakeEvictionPolicy("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("lru"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
