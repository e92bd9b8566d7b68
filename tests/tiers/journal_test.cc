// SPDX-License-Identifier: Apache-2.0
#include "tiers/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

JournalRecord Format(uint64_t segment_bytes = 1 << 28, uint32_t segments = 8) {
  JournalRecord f{};
  f.slot_bytes = segment_bytes;
  f.slot = segments;
  f.tenant_hash = 42;  // stands for the directory list
  return f;
}

JournalRecord Assign(uint32_t segment, uint32_t slot, uint64_t gen) {
  JournalRecord r{};
  r.type = static_cast<uint8_t>(JournalType::kAssign);
  r.segment = segment;
  r.slot = slot;
  r.generation = gen;
  r.payload_bytes = 4096 * (slot + 1);
  r.key[0] = static_cast<uint8_t>(slot);
  r.key[31] = static_cast<uint8_t>(gen);
  return r;
}

uint64_t FileSize(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

class JournalTest : public ::testing::Test {
 protected:
  std::unique_ptr<Journal> Open(JournalReplay* replay, JournalRecord format = Format()) {
    auto j = Journal::Open(JournalOptions{path_, format, true}, replay);
    EXPECT_TRUE(j.ok()) << j.status();
    return j.ok() ? std::move(*j) : nullptr;
  }
  testing::TempDir dir_;
  std::string path_ = dir_.File("kvtier.journal");
};

TEST_F(JournalTest, RecordsSurviveAReopenInOrder) {
  JournalReplay replay;
  {
    auto j = Open(&replay);
    EXPECT_TRUE(replay.created);
    std::atomic<int> durable{0};
    for (uint32_t i = 0; i < 100; ++i) {
      j->Append(Assign(i % 4, i, i + 1), [&](absl::Status s, uint64_t) { durable += s.ok(); });
    }
    ASSERT_TRUE(j->Sync().ok());
    EXPECT_EQ(durable.load(), 100);
    EXPECT_EQ(j->Stats().records, 100u);
  }
  auto j = Open(&replay);
  EXPECT_FALSE(replay.created);
  ASSERT_EQ(replay.records.size(), 100u);
  for (uint32_t i = 0; i < 100; ++i) {
    EXPECT_EQ(replay.records[i].slot, i);
    EXPECT_EQ(replay.records[i].generation, i + 1);
    EXPECT_EQ(replay.records[i].key[31], static_cast<uint8_t>(i + 1));
  }
  EXPECT_EQ(replay.bytes_cut, 0u);
  // Appends continue after the replayed ones.
  j->Append(Assign(0, 500, 9));
  ASSERT_TRUE(j->Sync().ok());
  j.reset();
  Open(&replay);
  EXPECT_EQ(replay.records.size(), 101u);
  EXPECT_GT(replay.records[100].seq, replay.records[99].seq);
}

TEST_F(JournalTest, ATornTailIsCutAndCounted) {
  JournalReplay replay;
  {
    auto j = Open(&replay);
    for (uint32_t i = 0; i < 10; ++i) j->Append(Assign(0, i, 1));
    ASSERT_TRUE(j->Sync().ok());
  }
  const uint64_t synced = FileSize(path_);
  // A crash mid-append leaves part of a record.
  {
    std::ofstream f(path_, std::ios::app | std::ios::binary);
    JournalRecord r = Assign(0, 99, 1);
    f.write(reinterpret_cast<const char*>(&r), 70);
  }
  Open(&replay);
  EXPECT_EQ(replay.records.size(), 10u);
  EXPECT_EQ(replay.bytes_cut, 70u);
  EXPECT_EQ(replay.records_cut, 1u);
  EXPECT_EQ(FileSize(path_), synced) << "the tail is removed from the file";
}

TEST_F(JournalTest, UnsyncedGarbageAfterASyncIsDroppedNothingElse) {
  // What power loss leaves: the synced prefix, then whatever the device had.
  JournalReplay replay;
  {
    auto j = Open(&replay);
    for (uint32_t i = 0; i < 50; ++i) j->Append(Assign(1, i, 7));
    ASSERT_TRUE(j->Sync().ok());
  }
  const uint64_t synced = FileSize(path_);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    ASSERT_EQ(truncate(path_.c_str(), static_cast<off_t>(synced)), 0);
    {
      std::ofstream f(path_, std::ios::app | std::ios::binary);
      const size_t n = 1 + rng() % 1000;
      for (size_t i = 0; i < n; ++i) f.put(static_cast<char>(rng()));
    }
    Open(&replay);
    EXPECT_EQ(replay.records.size(), 50u) << "trial " << trial;
    EXPECT_GT(replay.bytes_cut, 0u);
  }
}

// One damaged record costs only itself: the records after it are intact and
// kept, and the damage is reported (it is not a torn tail). Before, replay
// stopped there and cut the five records after it.
TEST_F(JournalTest, ABitFlipCostsOnlyThatRecord) {
  JournalReplay replay;
  {
    auto j = Open(&replay);
    for (uint32_t i = 0; i < 10; ++i) j->Append(Assign(0, i, 1));
    ASSERT_TRUE(j->Sync().ok());
  }
  // Flip one bit inside record 5 (after the format record).
  ASSERT_TRUE(testing::FlipByteOnDisk(path_, static_cast<off_t>(sizeof(JournalRecord) * 6 + 40)));
  Open(&replay);
  ASSERT_EQ(replay.records.size(), 9u);
  EXPECT_EQ(replay.records_damaged, 1u);
  EXPECT_EQ(replay.records_cut, 0u);
  EXPECT_FALSE(replay.format_damaged);
  for (size_t i = 0; i < replay.records.size(); ++i) EXPECT_EQ(replay.records[i].slot, i < 5 ? i : i + 1);
}

// A damaged format record does not cost the records after it.
TEST_F(JournalTest, ADamagedFormatRecordKeepsTheRecordsAfterIt) {
  JournalReplay replay;
  {
    auto j = Open(&replay);
    for (uint32_t i = 0; i < 10; ++i) j->Append(Assign(0, i, 1));
    ASSERT_TRUE(j->Sync().ok());
  }
  ASSERT_TRUE(testing::FlipByteOnDisk(path_, 20));
  auto j = Open(&replay);
  EXPECT_TRUE(replay.format_damaged);
  EXPECT_EQ(replay.records_damaged, 1u);
  ASSERT_EQ(replay.records.size(), 10u);
  // The owner rewrites it; appends continue after every seq it has seen.
  const uint64_t seq = j->ReserveSeq();
  EXPECT_GT(seq, replay.records.back().seq);
  ASSERT_TRUE(j->Rewrite({replay.records.begin(), replay.records.end()}).ok());
  j->Append(Assign(1, 0, 2));
  ASSERT_TRUE(j->Sync().ok());
  j.reset();
  Open(&replay);
  EXPECT_FALSE(replay.format_damaged);
  EXPECT_EQ(replay.records_damaged, 0u);
  EXPECT_EQ(replay.records.size(), 11u);
}

TEST_F(JournalTest, AnotherLayoutIsRefusedWithAReason) {
  JournalReplay replay;
  Open(&replay);
  auto other = Journal::Open(JournalOptions{path_, Format(1 << 20, 8), true}, &replay);
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(other.status()));
  EXPECT_NE(std::string(other.status().message()).find("another layout"), std::string::npos);
}

TEST_F(JournalTest, RewriteKeepsLiveRecordsAndLaterAppends) {
  JournalReplay replay;
  std::vector<JournalRecord> live;
  {
    auto j = Open(&replay);
    for (uint32_t i = 0; i < 200; ++i) {
      JournalRecord r = Assign(0, i % 20, i + 1);
      r.seq = j->Append(r);
      if (i >= 180) live.push_back(r);  // the last write of each of the 20 slots
    }
    ASSERT_TRUE(j->Sync().ok());
    const uint64_t before = j->Stats().bytes;
    ASSERT_TRUE(j->Rewrite(live).ok());
    EXPECT_LT(j->Stats().bytes, before);
    j->Append(Assign(3, 1, 999));
    ASSERT_TRUE(j->Sync().ok());
  }
  Open(&replay);
  ASSERT_EQ(replay.records.size(), 21u);
  EXPECT_EQ(replay.records[0].generation, 181u);
  EXPECT_EQ(replay.records[20].generation, 999u);
  EXPECT_FALSE(std::filesystem::exists(path_ + ".rewrite"));
}

TEST_F(JournalTest, GroupCommitBatchesConcurrentAppends) {
  JournalReplay replay;
  auto j = Open(&replay);
  constexpr int kThreads = 4, kEach = 300;
  std::atomic<int> durable{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) j->Append(Assign(t, i, 1), [&](absl::Status s, uint64_t) { durable += s.ok(); });
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_TRUE(j->Sync().ok());
  EXPECT_EQ(durable.load(), kThreads * kEach);
  EXPECT_LT(j->Stats().commits, static_cast<uint64_t>(kThreads * kEach)) << "appends share fdatasyncs";
}

TEST_F(JournalTest, WithoutGroupCommitEveryRecordIsItsOwnSync) {
  JournalReplay replay;
  auto j = std::move(Journal::Open(JournalOptions{path_, Format(), false}, &replay)).value();
  for (uint32_t i = 0; i < 20; ++i) j->Append(Assign(0, i, 1));
  ASSERT_TRUE(j->Sync().ok());
  EXPECT_EQ(j->Stats().commits, 20u);
}

// A round that takes 100 ms sets the batching delay to 3 s: a background
// record waits for the batch, an urgent one or CommitSoon() does not.
TEST_F(JournalTest, BackgroundRecordsWaitForTheBatchUrgentOnesDoNot) {
  JournalReplay replay;
  auto j = Open(&replay);
  j->SetPreCommitHook([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return absl::OkStatus();
  });
  EXPECT_EQ(j->Stats().last_round_ns, 0u);
  j->Append(Assign(0, 0, 1));
  ASSERT_TRUE(j->Sync().ok());  // one slow round measured
  // What a flush keeps of its budget for its final sync: the hook included.
  EXPECT_GE(j->Stats().last_round_ns, 100'000'000u);
  const auto wait_for = [](std::atomic<bool>& flag, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!flag.load() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return flag.load();
  };
  std::atomic<bool> background{false}, urgent{false};
  j->Append(Assign(0, 1, 1), [&](absl::Status s, uint64_t) { background = s.ok(); });
  EXPECT_FALSE(wait_for(background, std::chrono::milliseconds(500))) << "committed before its batch was due";
  j->Append(Assign(0, 2, 1), [&](absl::Status s, uint64_t) { urgent = s.ok(); }, /*urgent=*/true);
  EXPECT_TRUE(wait_for(urgent, std::chrono::milliseconds(2000))) << "an urgent record waited for the batch";
  EXPECT_TRUE(background.load()) << "the pending record rides along with the urgent one";

  std::atomic<bool> soon{false};
  j->Append(Assign(0, 3, 1), [&](absl::Status s, uint64_t) { soon = s.ok(); });
  j->CommitSoon();
  EXPECT_TRUE(wait_for(soon, std::chrono::milliseconds(2000))) << "CommitSoon did not cut the delay short";
}

TEST_F(JournalTest, AFailedPreCommitFailsTheRound) {
  JournalReplay replay;
  auto j = Open(&replay);
  j->SetPreCommitHook([] { return absl::DataLossError("slab fdatasync failed"); });
  absl::Status got;
  j->Append(Assign(0, 1, 1), [&](absl::Status s, uint64_t) { got = s; });
  absl::Status s = j->Sync();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_TRUE(absl::IsDataLoss(got));
  j.reset();
  Open(&replay);
  EXPECT_TRUE(replay.records.empty()) << "a record whose data is not durable is not written";
}

}  // namespace
}  // namespace kvtier
