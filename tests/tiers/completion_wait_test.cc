// SPDX-License-Identifier: Apache-2.0
#include "tiers/completion_wait.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

using C = CompletionWaitChooser;

// Feeds one trial: kEpoch lone ops each way, at the given times, as the
// worker would (asking before each op which way to wait).
void Trial(C& c, bool write, uint64_t bytes, uint64_t poll_ns, uint64_t sleep_ns) {
  for (uint32_t i = 0; i < C::kEpoch; ++i) {
    ASSERT_TRUE(c.ShouldPoll(write, bytes)) << "the poll epoch, op " << i;
    c.Record(write, bytes, true, poll_ns);
  }
  for (uint32_t i = 0; i < C::kEpoch; ++i) {
    ASSERT_FALSE(c.ShouldPoll(write, bytes)) << "the sleep epoch, op " << i;
    c.Record(write, bytes, false, sleep_ns);
  }
}

TEST(CompletionWaitChooserTest, KeepsTheFasterWayAfterATrial) {
  C c;
  Trial(c, false, 256 << 10, 204'000, 163'000);  // polling slows the device
  EXPECT_EQ(c.trials(false, 256 << 10), 1u);
  EXPECT_EQ(c.median_ns(false, 256 << 10, true), 204'000u);
  EXPECT_EQ(c.median_ns(false, 256 << 10, false), 163'000u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(c.ShouldPoll(false, 256 << 10));
    c.Record(false, 256 << 10, false, 163'000);
  }
  C d;
  Trial(d, false, 4096, 12'000, 40'000);  // a wake-up dominates
  EXPECT_TRUE(d.ShouldPoll(false, 4096));
}

TEST(CompletionWaitChooserTest, ReadsWritesAndSizesAreJudgedApart) {
  C c;
  Trial(c, false, 256 << 10, 200'000, 150'000);
  EXPECT_FALSE(c.ShouldPoll(false, 256 << 10));
  // Writes of that size, and reads of another class, start their own trial.
  EXPECT_TRUE(c.ShouldPoll(true, 256 << 10));
  EXPECT_TRUE(c.ShouldPoll(false, 2 << 20));
  EXPECT_EQ(c.trials(true, 256 << 10), 0u);
  Trial(c, true, 256 << 10, 90'000, 120'000);
  EXPECT_TRUE(c.ShouldPoll(true, 256 << 10));
  EXPECT_FALSE(c.ShouldPoll(false, 256 << 10));
  // Sizes in one power-of-two class share a decision.
  EXPECT_FALSE(c.ShouldPoll(false, (256 << 10) - 4096));
  EXPECT_FALSE(c.ShouldPoll(false, (128 << 10) + 1));
  EXPECT_TRUE(c.ShouldPoll(false, 128 << 10));
  EXPECT_EQ(C::ClassOf(1), 0);
  EXPECT_EQ(C::ClassOf(4096), 0);
  EXPECT_EQ(C::ClassOf(4097), 1);
  EXPECT_EQ(C::ClassOf(uint64_t{1} << 40), C::kClasses - 1);
}

TEST(CompletionWaitChooserTest, SettlingOpsAndOpsWaitedTheOtherWayDoNotCount) {
  C c;
  const uint64_t b = 64 << 10;
  // Op i of each epoch takes i us (plus a base): the median of ops 8..63 is
  // op 36's, of all 64 op 32's. An op reaped after a sleep arrives in the
  // poll epoch too, and does not count.
  for (uint32_t i = 0; i < C::kEpoch; ++i) {
    c.Record(false, b, false, 1);  // waited before the switch: ignored
    c.Record(false, b, true, 50'000 + i * 1'000);
  }
  ASSERT_FALSE(c.ShouldPoll(false, b));
  for (uint32_t i = 0; i < C::kEpoch; ++i) c.Record(false, b, false, 70'000 + i * 1'000);
  EXPECT_EQ(c.median_ns(false, b, true), 50'000u + (C::kSettle + (C::kEpoch - C::kSettle) / 2) * 1'000);
  EXPECT_EQ(c.median_ns(false, b, false), 70'000u + (C::kSettle + (C::kEpoch - C::kSettle) / 2) * 1'000);
  EXPECT_TRUE(c.ShouldPoll(false, b));
}

TEST(CompletionWaitChooserTest, TriesAgainAndFollowsAChange) {
  C c;
  const uint64_t b = 256 << 10;
  Trial(c, false, b, 100'000, 150'000);
  EXPECT_TRUE(c.ShouldPoll(false, b));
  for (uint32_t i = 0; i < C::kKeep - 1; ++i) c.Record(false, b, true, 100'000);
  EXPECT_TRUE(c.ShouldPoll(false, b)) << "still kept";
  c.Record(false, b, true, 100'000);
  // A new trial; the machine changed and polling now loses.
  Trial(c, false, b, 300'000, 150'000);
  EXPECT_EQ(c.trials(false, b), 2u);
  EXPECT_FALSE(c.ShouldPoll(false, b));
}

}  // namespace
}  // namespace kvtier
