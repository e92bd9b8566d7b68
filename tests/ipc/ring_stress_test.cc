// SPDX-License-Identifier: Apache-2.0
// Producer and consumer threads hammer one ring; every record must arrive
// once, in order, intact. Run under --tsan for the memory-order check.
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "ipc/abi.h"
#include "os/futex.h"
#include "ipc/ring.h"

namespace kvtier::ipc {
namespace {

TEST(RingStressTest, TwoThreadsInOrderNoLoss) {
#ifdef KVTIER_TSAN
  constexpr uint64_t kRecords = 200000;
#else
  constexpr uint64_t kRecords = 2000000;
#endif
  std::vector<RequestRecord> slots(64);
  std::atomic<uint32_t> head{0}, tail{0};
  RingProducer<RequestRecord> p(slots.data(), 64, &head, &tail);
  RingConsumer<RequestRecord> c(slots.data(), 64, &head, &tail);
  std::thread producer([&] {
    for (uint64_t i = 0; i < kRecords;) {
      RequestRecord r{};
      r.op_id = i;
      r.keys_offset = i * 7;
      r.out_offset = ~i;
      if (p.TryPush(r)) {
        ++i;
      } else {
        os::CpuRelax();
      }
    }
  });
  uint64_t expected = 0, bad = 0;
  while (expected < kRecords) {
    RequestRecord r;
    PopResult res = c.TryPop(&r);
    ASSERT_NE(res, PopResult::kCorrupt);
    if (res == PopResult::kEmpty) {
      os::CpuRelax();
      continue;
    }
    if (r.op_id != expected || r.keys_offset != expected * 7 || r.out_offset != ~expected) ++bad;
    ++expected;
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
  RequestRecord r;
  EXPECT_EQ(c.TryPop(&r), PopResult::kEmpty);
}

}  // namespace
}  // namespace kvtier::ipc
