// SPDX-License-Identifier: Apache-2.0
// What every block tier must do, run against each one (the NVMe tier and the
// in-memory tier): blocks come back byte-exact; a copy that is not the block
// asked for, intact, is DataLoss; a freed or reused slot serves nothing;
// cancelled and late ops fail cleanly without touching the block; a full tier
// refuses; Sync waits for writes. Then what only the in-memory tier offers.
#include <future>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"
#include "tiers/memory_block_tier.h"
#include "tiers/nvme_tier.h"

namespace kvtier {
namespace {

using testing::KeyOf;

constexpr uint64_t kCapacity = 4 << 20;

class BlockTierTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "nvme") {
      NvmeTierOptions o;
      o.dirs = {dir_.File("nvme")};
      o.capacity_bytes = kCapacity;
      o.segment_bytes = 1 << 20;
      o.staging_bytes = 4 << 20;
      std::vector<RecoveredBlock> rec;
      auto t = NvmeTier::Open(o, &rec);
      ASSERT_TRUE(t.ok()) << t.status();
      tier_ = std::move(*t);
    } else {
      auto t = MemoryBlockTier::Create({.capacity_bytes = kCapacity, .max_block_bytes = 1 << 20});
      ASSERT_TRUE(t.ok()) << t.status();
      tier_ = std::move(*t);
    }
  }
  static BlockMeta Meta(uint64_t key, uint64_t bytes, uint64_t ns = 1) {
    return BlockMeta{.ns = KeyOf(1000000 + ns), .key = KeyOf(key), .payload_bytes = bytes, .block_tokens = 16};
  }
  static std::vector<std::byte> Payload(uint64_t key, uint64_t bytes) {
    std::vector<std::byte> v(bytes);
    testing::FillFromKey(KeyOf(key), v);
    return v;
  }
  absl::Status Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, IoOptions io = {}) {
    std::promise<absl::Status> p;
    tier_->Put(slot, meta, src, io, [&](absl::Status s) { p.set_value(s); });
    return p.get_future().get();
  }
  absl::Status Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, IoOptions io = {}) {
    std::promise<absl::Status> p;
    tier_->Get(slot, meta, dst, io, [&](absl::Status s) { p.set_value(s); });
    return p.get_future().get();
  }
  // Allocates a slot and writes block `key` of `bytes` into it.
  SlotHandle Put(uint64_t key, uint64_t bytes) {
    absl::StatusOr<SlotHandle> slot = tier_->Reserve(BlockMeta{.payload_bytes = bytes});
    EXPECT_TRUE(slot.ok()) << slot.status();
    const std::vector<std::byte> data = Payload(key, bytes);
    EXPECT_TRUE(Write(*slot, Meta(key, bytes), data).ok());
    return *slot;
  }

  testing::TempDir dir_;
  std::unique_ptr<BlockTier> tier_;
};

TEST_P(BlockTierTest, BlocksComeBackByteExact) {
  EXPECT_EQ(tier_->name(), GetParam());
  for (uint64_t bytes : {uint64_t{4096}, uint64_t{16384}, uint64_t{12345}}) {
    const SlotHandle slot = Put(bytes, bytes);
    EXPECT_GE(tier_->CostOf(slot), bytes);
    std::vector<std::byte> back(bytes);
    ASSERT_TRUE(Read(slot, Meta(bytes, bytes), back).ok()) << bytes;
    EXPECT_TRUE(testing::MatchesKey(KeyOf(bytes), back)) << bytes;
  }
  const BlockTierStats st = tier_->BlockStats();
  EXPECT_EQ(st.reads, 3u);
  EXPECT_EQ(st.writes, 3u);
  EXPECT_EQ(st.used_slots, 3u);
  EXPECT_EQ(st.io_errors, 0u);
}

TEST_P(BlockTierTest, ACopyThatIsNotTheBlockAskedForIsDataLoss) {
  const SlotHandle slot = Put(7, 8192);
  std::vector<std::byte> back(8192, std::byte{0});
  EXPECT_EQ(Read(slot, Meta(8, 8192), back).code(), absl::StatusCode::kDataLoss) << "another key";
  EXPECT_EQ(Read(slot, Meta(7, 8192, /*ns=*/2), back).code(), absl::StatusCode::kDataLoss) << "another namespace";
  std::vector<std::byte> shorter(4096);
  EXPECT_FALSE(Read(slot, Meta(7, 4096), shorter).ok()) << "another length";
  EXPECT_GE(tier_->BlockStats().checksum_failures, 2u);
  EXPECT_TRUE(Read(slot, Meta(7, 8192), back).ok()) << "the block itself still reads";
}

TEST_P(BlockTierTest, AFreedOrReusedSlotServesNothingOld) {
  const SlotHandle slot = Put(1, 8192);
  ASSERT_TRUE(tier_->Remove(slot, BlockMeta{}).ok());
  EXPECT_FALSE(tier_->Remove(slot, BlockMeta{}).ok()) << "a second free is refused";
  std::vector<std::byte> back(8192);
  EXPECT_FALSE(Read(slot, Meta(1, 8192), back).ok());
  // The slot, reused for another block, never serves the first one.
  const SlotHandle again = Put(2, 8192);
  EXPECT_FALSE(Read(again, Meta(1, 8192), back).ok());
  ASSERT_TRUE(Read(again, Meta(2, 8192), back).ok());
  EXPECT_TRUE(testing::MatchesKey(KeyOf(2), back));
}

TEST_P(BlockTierTest, CancelledAndLateOpsFailWithoutTouchingTheBlock) {
  const SlotHandle slot = Put(3, 8192);
  CancelSource cancel;
  cancel.Cancel();
  const std::vector<std::byte> other = Payload(4, 8192);
  EXPECT_EQ(Write(slot, Meta(4, 8192), other, IoOptions{.prio = IoPriority::kDemote, .cancel = cancel.token()}).code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(Write(slot, Meta(4, 8192), other, IoOptions{.deadline_ns = MonotonicNanos() - 1}).code(),
            absl::StatusCode::kDeadlineExceeded);
  std::vector<std::byte> back(8192);
  EXPECT_EQ(Read(slot, Meta(3, 8192), back, IoOptions{.cancel = cancel.token()}).code(),
            absl::StatusCode::kCancelled);
  ASSERT_TRUE(Read(slot, Meta(3, 8192), back, IoOptions{.deadline_ns = MonotonicNanos() + 60'000'000'000ull}).ok());
  EXPECT_TRUE(testing::MatchesKey(KeyOf(3), back)) << "the abandoned writes changed nothing";
  const BlockTierStats st = tier_->BlockStats();
  EXPECT_EQ(st.abandoned, 3u);
  EXPECT_EQ(st.io_errors, 0u);
  EXPECT_EQ(st.writes, 1u);
}

TEST_P(BlockTierTest, AFullTierRefusesAndTakesBlocksAgainOnceFreed) {
  std::vector<SlotHandle> slots;
  absl::StatusOr<SlotHandle> s;
  while ((s = tier_->Reserve(BlockMeta{.payload_bytes = 64 << 10})).ok()) {
    slots.push_back(*s);
    ASSERT_LT(slots.size(), 1000u) << "the tier never filled";
  }
  EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GE(slots.size(), 40u) << "4 MiB holds about 60 blocks of 64 KiB";
  EXPECT_LE(tier_->Usage().used_bytes, kCapacity);
  ASSERT_TRUE(tier_->Remove(slots.back(), BlockMeta{}).ok());
  EXPECT_TRUE(tier_->Reserve(BlockMeta{.payload_bytes = 64 << 10}).ok());
  EXPECT_EQ(tier_->Reserve(BlockMeta{.payload_bytes = tier_->max_block_bytes() + 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(BlockTierTest, SyncReturnsOnceEveryWriteHasLanded) {
  constexpr int kBlocks = 24;
  std::atomic<int> done{0}, ok{0};
  std::vector<std::vector<std::byte>> data;
  std::vector<SlotHandle> slots;
  for (int i = 0; i < kBlocks; ++i) {
    data.push_back(Payload(100 + i, 16384));
    slots.push_back(*tier_->Reserve(BlockMeta{.payload_bytes = 16384}));
  }
  for (int i = 0; i < kBlocks; ++i) {
    tier_->Put(slots[i], Meta(100 + i, 16384), data[i], IoOptions{.prio = IoPriority::kPrefetch},
                 [&](absl::Status s) {
                   ok += s.ok();
                   ++done;
                 });
  }
  ASSERT_TRUE(tier_->Sync().ok());
  EXPECT_EQ(done.load(), kBlocks);
  EXPECT_EQ(ok.load(), kBlocks);
  for (int i = 0; i < kBlocks; ++i) {
    std::vector<std::byte> back(16384);
    ASSERT_TRUE(Read(slots[i], Meta(100 + i, 16384), back).ok());
    EXPECT_TRUE(testing::MatchesKey(KeyOf(100 + i), back));
  }
}

TEST_P(BlockTierTest, DrainReturnsOnceEveryOpReadsIncludedHasCompleted) {
  constexpr int kBlocks = 24;
  std::vector<SlotHandle> slots;
  for (int i = 0; i < kBlocks; ++i) slots.push_back(Put(200 + i, 16384));
  std::vector<std::vector<std::byte>> back(kBlocks, std::vector<std::byte>(16384));
  std::atomic<int> done{0}, ok{0};
  for (int i = 0; i < kBlocks; ++i) {
    tier_->Get(slots[i], Meta(200 + i, 16384), back[i], IoOptions{.prio = IoPriority::kPrefetch},
                [&](absl::Status s) {
                  // Slow callbacks: Drain must wait for them to return.
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
                  ok += s.ok();
                  ++done;
                });
  }
  tier_->Drain();
  EXPECT_EQ(done.load(), kBlocks);
  EXPECT_EQ(ok.load(), kBlocks);
  for (int i = 0; i < kBlocks; ++i) EXPECT_TRUE(testing::MatchesKey(KeyOf(200 + i), back[i])) << i;
}

INSTANTIATE_TEST_SUITE_P(Tiers, BlockTierTest, ::testing::Values("nvme", "memory"),
                         [](const auto& info) { return info.param; });

TEST(MemoryBlockTierTest, AQueuedReadPastItsDeadlineIsAbandonedAndADamagedCopyIsNeverServed) {
  auto tier = std::move(MemoryBlockTier::Create({.capacity_bytes = 1 << 20, .op_latency_ns = 1'000'000})).value();
  std::atomic<uint64_t> observed_ns{0};
  tier->SetReadObserver([&](uint64_t, const IoTiming& t) { observed_ns = t.service_ns; });
  const SlotHandle slot = *tier->Reserve(BlockMeta{.payload_bytes = 4096});
  std::vector<std::byte> data(4096);
  testing::FillFromKey(KeyOf(5), data);
  const BlockMeta meta{.ns = KeyOf(9), .key = KeyOf(5), .payload_bytes = 4096};
  std::promise<absl::Status> w;
  tier->Put(slot, meta, data, IoOptions{}, [&](absl::Status s) { w.set_value(s); });
  ASSERT_TRUE(w.get_future().get().ok());

  // Queued behind a pause, the read's deadline passes before it can start.
  tier->Pause();
  std::vector<std::byte> back(4096);
  std::promise<absl::Status> r;
  tier->Get(slot, meta, back, IoOptions{.deadline_ns = MonotonicNanos() + 5'000'000},
             [&](absl::Status s) { r.set_value(s); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(tier->BlockStats().queued, 1u);
  tier->Resume();
  EXPECT_EQ(r.get_future().get().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(tier->BlockStats().abandoned, 1u);

  // A read that runs is timed by the observer: at least the op latency.
  std::promise<absl::Status> r2;
  tier->Get(slot, meta, back, IoOptions{}, [&](absl::Status s) { r2.set_value(s); });
  ASSERT_TRUE(r2.get_future().get().ok());
  EXPECT_TRUE(testing::MatchesKey(KeyOf(5), back));
  EXPECT_GE(observed_ns.load(), 1'000'000u);

  // One flipped payload byte: DataLoss, and dst is not reported as the block.
  ASSERT_TRUE(tier->CorruptPayload(slot, 777).ok());
  std::promise<absl::Status> r3;
  tier->Get(slot, meta, back, IoOptions{}, [&](absl::Status s) { r3.set_value(s); });
  EXPECT_EQ(r3.get_future().get().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(tier->BlockStats().checksum_failures, 1u);
}

TEST(MemoryBlockTierTest, CallbacksMayCallBackIntoTheTier) {
  auto tier = std::move(MemoryBlockTier::Create({.capacity_bytes = 1 << 20})).value();
  const SlotHandle slot = *tier->Reserve(BlockMeta{.payload_bytes = 4096});
  std::vector<std::byte> data(4096);
  std::promise<absl::Status> w, r;
  // Refused at once (a slot never allocated): the callback frees a slot.
  tier->Put(999, BlockMeta{.payload_bytes = 4096}, data, IoOptions{}, [&](absl::Status s) {
    EXPECT_TRUE(tier->Remove(slot, BlockMeta{}).ok());
    w.set_value(s);
  });
  EXPECT_EQ(w.get_future().get().code(), absl::StatusCode::kInvalidArgument);
  tier->Get(slot, BlockMeta{.payload_bytes = 4096}, data, IoOptions{}, [&](absl::Status s) {
    EXPECT_TRUE(tier->Reserve(BlockMeta{.payload_bytes = 4096}).ok());
    r.set_value(s);
  });
  EXPECT_EQ(r.get_future().get().code(), absl::StatusCode::kNotFound);
}

TEST(MemoryBlockTierTest, SyncWaitsForEarlierWritesOnly) {
  auto tier = std::move(MemoryBlockTier::Create({.capacity_bytes = 1 << 20})).value();
  const SlotHandle a = *tier->Reserve(BlockMeta{.payload_bytes = 4096}), b = *tier->Reserve(BlockMeta{.payload_bytes = 4096});
  std::vector<std::byte> data(4096, std::byte{1});
  const BlockMeta meta{.payload_bytes = 4096};
  std::atomic<bool> synced{false}, b_saw_sync{false};
  tier->Pause();
  tier->Put(a, meta, data, IoOptions{.prio = IoPriority::kLoad}, [](absl::Status) {});
  std::atomic<pid_t> syncer_tid{0};
  std::thread syncer([&] {
    syncer_tid = gettid();
    EXPECT_TRUE(tier->Sync().ok());
    synced = true;
  });
  // The syncer asleep: in Sync's wait for `a` (the tier is paused).
  ASSERT_TRUE(testing::Eventually([&] { return syncer_tid != 0 && testing::ThreadIsSleeping(syncer_tid); }));
  // Queued after Sync was called; its callback holds the tier's thread until
  // Sync has returned (or 5 s): a Sync that waited for it would never return.
  std::promise<void> b_done;
  tier->Put(b, meta, data, IoOptions{.prio = IoPriority::kDemote}, [&](absl::Status) {
    b_saw_sync = testing::Eventually([&] { return synced.load(); });
    b_done.set_value();
  });
  tier->Resume();
  syncer.join();
  b_done.get_future().get();
  EXPECT_TRUE(b_saw_sync.load());
}

TEST(MemoryBlockTierTest, BadOptionsAreRefused) {
  EXPECT_EQ(MemoryBlockTier::Create({.capacity_bytes = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MemoryBlockTier::Create({.capacity_bytes = 1, .max_block_bytes = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
