// SPDX-License-Identifier: Apache-2.0
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policies/chain_guard.h"
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

// Bare, and behind a ChainGuard that shares its keys (the policy then keeps
// none of its own and must ask the guard for the key of a block it removes).
class S3FifoGhostTest : public testing::TestWithParam<bool> {};

TEST_P(S3FifoGhostTest, ABlockEvictedYoungThatComesBackGoesStraightToMain) {
  std::unique_ptr<EvictionPolicy> p = MakeS3FifoPolicy();
  if (GetParam()) p = std::make_unique<ChainGuard>(std::move(p));
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
INSTANTIATE_TEST_SUITE_P(BareAndGuarded, S3FifoGhostTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& i) { return i.param ? "Guarded" : "Bare"; });

TEST(S3FifoPolicyTest, TheDeepVariantSendsDeepBlocksStraightToMain) {
  for (const char* name : {"s3fifo", "s3fifo-deep"}) {
    SCOPED_TRACE(name);
    auto p = std::move(MakeEvictionPolicy(name)).value();
    EXPECT_EQ(p->name(), name);
    // Block 0 is 12,288 tokens into its chain, 1..49 are roots; nothing is
    // used again. Plain S3-FIFO evicts in insertion order (0 first); the
    // deep variant puts 0 in main and drains the probation queue first.
    p->InsertAt(0, 1, kDeepS3FifoOptions.main_from_position);
    for (uint32_t h = 1; h < 50; ++h) p->InsertAt(h, h + 1, 0);
    std::vector<uint32_t> order;
    while (p->size() > 0) {
      const uint32_t v = *p->PickVictim(Any());
      order.push_back(v);
      p->Remove(v);
    }
    ASSERT_EQ(order.size(), 50u);
    if (std::string(name) == "s3fifo") {
      EXPECT_EQ(order.front(), 0u);
    } else {
      EXPECT_EQ(order.back(), 0u);
    }
  }
  // Just short of the threshold is a probation block like any other.
  auto p = std::move(MakeEvictionPolicy("s3fifo-deep")).value();
  p->InsertAt(0, 1, kDeepS3FifoOptions.main_from_position - 1);
  for (uint32_t h = 1; h < 50; ++h) p->InsertAt(h, h + 1, 0);
  EXPECT_EQ(*p->PickVictim(Any()), 0u);
}

TEST(S3FifoPolicyTest, IsAvailableByConfigName) {
  auto p = MakeEvictionPolicy("s3fifo");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->name(), "s3fifo");
  auto bad = MakeEvictionPolicy("lfu");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("arc, arc-cutoff, holds, lru, s3fifo, s3fifo-deep, tinylfu"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
