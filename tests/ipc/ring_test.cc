// SPDX-License-Identifier: Apache-2.0
#include "ipc/ring.h"

#include <vector>

#include "gtest/gtest.h"
#include "ipc/abi.h"

namespace kvtier::ipc {
namespace {

struct Ring {
  explicit Ring(uint32_t entries) : slots(entries) {}
  std::vector<RequestRecord> slots;
  std::atomic<uint32_t> head{0}, tail{0};
  RingProducer<RequestRecord> Producer() { return {slots.data(), static_cast<uint32_t>(slots.size()), &head, &tail}; }
  RingConsumer<RequestRecord> Consumer() { return {slots.data(), static_cast<uint32_t>(slots.size()), &head, &tail}; }
};

RequestRecord Rec(uint64_t id) {
  RequestRecord r{};
  r.op_id = id;
  r.count = static_cast<uint32_t>(id * 3);
  return r;
}

TEST(RingTest, EmptyThenFullThenEmpty) {
  Ring ring(8);
  auto p = ring.Producer();
  auto c = ring.Consumer();
  RequestRecord out;
  EXPECT_EQ(c.TryPop(&out), PopResult::kEmpty);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(p.TryPush(Rec(i)));
  EXPECT_FALSE(p.TryPush(Rec(99))) << "a full ring must refuse";
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_EQ(c.TryPop(&out), PopResult::kOk);
    EXPECT_EQ(out.op_id, i);
    EXPECT_EQ(out.count, i * 3);
  }
  EXPECT_EQ(c.TryPop(&out), PopResult::kEmpty);
  EXPECT_TRUE(p.TryPush(Rec(100)));
}

TEST(RingTest, WrapsAroundManyTimesInOrder) {
  Ring ring(4);
  auto p = ring.Producer();
  auto c = ring.Consumer();
  uint64_t next_in = 0, next_out = 0;
  RequestRecord out;
  for (int round = 0; round < 1000; ++round) {
    const int burst = 1 + round % 4;
    for (int i = 0; i < burst; ++i) ASSERT_TRUE(p.TryPush(Rec(next_in++)));
    for (int i = 0; i < burst; ++i) {
      ASSERT_EQ(c.TryPop(&out), PopResult::kOk);
      ASSERT_EQ(out.op_id, next_out++);
    }
  }
  EXPECT_EQ(c.TryPop(&out), PopResult::kEmpty);
}

TEST(RingTest, IndicesWrapAroundUint32) {
  Ring ring(4);
  ring.head = ring.tail = UINT32_MAX - 1;  // counters about to overflow
  auto p = ring.Producer();
  auto c = ring.Consumer();
  RequestRecord out;
  for (uint64_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(p.TryPush(Rec(i)));
    ASSERT_EQ(c.TryPop(&out), PopResult::kOk);
    EXPECT_EQ(out.op_id, i);
  }
}

TEST(RingTest, ConsumerDetectsACorruptTail) {
  Ring ring(8);
  auto c = ring.Consumer();
  ring.tail = 9;  // more than `entries` ahead of head: only a broken peer does this
  RequestRecord out;
  EXPECT_EQ(c.TryPop(&out), PopResult::kCorrupt);
}

TEST(RingTest, ProducerDoesNotTrustAHeadAheadOfItsTail) {
  Ring ring(8);
  auto p = ring.Producer();
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(p.TryPush(Rec(i)));
  ring.head = 1000;  // a peer scribbling over head
  EXPECT_FALSE(p.TryPush(Rec(8))) << "unread records must not be overwritten";
}

}  // namespace
}  // namespace kvtier::ipc
