#include <random>
#include <set>

#include "gtest/gtest.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

auto Any() {
  return [](uint32_t) { return true; };
}

TEST(S3FifoPolicyTest, ANewBlockUnusedSinceInsertionGoesFirst) {
  auto p = MakeS3FifoPolicy();
  for (uint32_t h = 0; h < 10; ++h) p->InsertWithKey(h, h + 1);
  p->Touch(0);
  // The oldest in the small queue was used: it moves to main; the next goes.
  EXPECT_EQ(*p->PickVictim(Any()), 1u);
  EXPECT_EQ(p->name(), "s3fifo");
}

TEST(S3FifoPolicyTest, AHotSetSurvivesAOneTimeScanThatFlushesLru) {
  // 100 slots. A hot set of 50 blocks used repeatedly, then a scan of 1000
  // blocks each used once. LRU loses the whole hot set; S3-FIFO keeps it.
  for (bool s3 : {true, false}) {
    auto p = s3 ? MakeS3FifoPolicy() : MakeLruPolicy();
    std::set<uint32_t> resident;
    auto access = [&](uint32_t h) {
      if (resident.contains(h)) {
        p->Touch(h);
        return;
      }
      p->InsertWithKey(h, h + 1);
      resident.insert(h);
      while (resident.size() > 100) {
        const uint32_t v = *p->PickVictim(Any());
        p->Remove(v);
        resident.erase(v);
      }
    };
    for (int round = 0; round < 3; ++round) {
      for (uint32_t h = 0; h < 50; ++h) access(h);
    }
    for (uint32_t h = 1000; h < 2000; ++h) access(h);
    size_t hot_left = 0;
    for (uint32_t h = 0; h < 50; ++h) hot_left += resident.contains(h);
    if (s3) {
      EXPECT_EQ(hot_left, 50u) << "the scan flushed the hot set";
    } else {
      EXPECT_EQ(hot_left, 0u) << "LRU is not scan resistant; the comparison is meaningless otherwise";
    }
  }
}

TEST(S3FifoPolicyTest, ABlockEvictedYoungThatComesBackGoesStraightToMain) {
  auto p = MakeS3FifoPolicy();
  for (uint32_t h = 0; h < 20; ++h) p->InsertWithKey(h, 1000 + h);
  const uint32_t v = *p->PickVictim(Any());
  EXPECT_EQ(v, 0u);
  p->Remove(v);  // key 1000 becomes a ghost
  p->InsertWithKey(50, 1000);  // the same block back, in another slot
  for (uint32_t h = 60; h < 70; ++h) p->InsertWithKey(h, 2000 + h);
  // Without the ghost, 50 would sit in the small queue behind 1..19 and be
  // the 20th victim; as a returning block it is in main, and the 29 blocks
  // of the small queue go first.
  for (int i = 0; i < 29; ++i) {
    const uint32_t w = *p->PickVictim(Any());
    EXPECT_NE(w, 50u) << "a returning block was treated as new at eviction " << i;
    p->Remove(w);
  }
  EXPECT_EQ(p->size(), 1u);
  EXPECT_TRUE(p->Contains(50));
}

TEST(S3FifoPolicyTest, InvariantsUnderRandomOperations) {
  auto p = MakeS3FifoPolicy();
  std::set<uint32_t> tracked, pinned;
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t h = rng() % 500;
    switch (rng() % 6) {
      case 0:
      case 1:
        p->InsertWithKey(h, (rng() % 700) + 1);
        tracked.insert(h);
        break;
      case 2:
        p->Touch(h);
        break;
      case 3:
        p->Remove(h);
        tracked.erase(h);
        pinned.erase(h);
        break;
      case 4:
        if (tracked.contains(h)) {
          if (pinned.contains(h)) pinned.erase(h); else pinned.insert(h);
        }
        break;
      case 5: {
        auto v = p->PickVictim([&](uint32_t x) { return !pinned.contains(x); });
        if (v) {
          ASSERT_TRUE(tracked.contains(*v)) << "victim " << *v << " is not tracked";
          ASSERT_FALSE(pinned.contains(*v)) << "victim " << *v << " is pinned";
          p->Remove(*v);
          tracked.erase(*v);
        } else {
          ASSERT_EQ(tracked.size(), pinned.size()) << "no victim although some block is evictable";
        }
        break;
      }
    }
    ASSERT_EQ(p->size(), tracked.size());
    for (int k = 0; k < 3; ++k) {
      const uint32_t x = rng() % 500;
      ASSERT_EQ(p->Contains(x), tracked.contains(x));
    }
  }
}

TEST(S3FifoPolicyTest, IsAvailableByConfigName) {
  auto p = MakeEvictionPolicy("s3fifo");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->name(), "s3fifo");
  auto bad = MakeEvictionPolicy("lfu");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("lru, s3fifo"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
