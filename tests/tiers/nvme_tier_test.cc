// SPDX-License-Identifier: Apache-2.0
#include "tiers/nvme_tier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <future>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"
#include "tiers/fault_injection.h"
#include "tiers/nvme_format.h"
#include "core/status.h"

namespace kvtier {
namespace {

using testing::KeyOf;

BlockMeta Meta(uint64_t i, uint64_t bytes) {
  BlockMeta m;
  m.ns = KeyOf(777);
  m.key = KeyOf(i);
  m.payload_bytes = bytes;
  m.tenant_hash = TenantHash("default");
  m.block_tokens = 16;
  return m;
}

std::vector<std::byte> Payload(uint64_t i, uint64_t bytes) {
  std::vector<std::byte> p(bytes);
  testing::FillFromKey(KeyOf(i), p);
  return p;
}

// Runs a tier op and waits for its callback.
template <typename F>
absl::Status Await(F start) {
  std::promise<absl::Status> p;
  start([&](absl::Status s) { p.set_value(s); });
  return p.get_future().get();
}

class NvmeTierTest : public ::testing::Test {
 protected:
  NvmeTierOptions Options() {
    NvmeTierOptions o;
    o.dirs = {dir_.File("d0"), dir_.File("d1")};
    o.capacity_bytes = 32 << 20;  // 2 dirs x 4 segments of 4 MiB
    o.segment_bytes = 4 << 20;
    o.queue_depth = 8;
    o.staging_bytes = 8 << 20;
    o.wrap_engine = [this](std::unique_ptr<IoEngine> e) { return MakeFaultInjectingEngine(std::move(e), faults_); };
    return o;
  }
  std::unique_ptr<NvmeTier> Open(std::vector<RecoveredBlock>* recovered = nullptr, NvmeTierOptions o = {}) {
    if (o.dirs.empty()) o = Options();
    std::vector<RecoveredBlock> ignored;
    auto t = NvmeTier::Open(o, recovered ? recovered : &ignored);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  absl::StatusOr<SlotHandle> Put(NvmeTier& t, uint64_t i, uint64_t bytes, IoPriority prio = IoPriority::kLoad) {
    ASSIGN_OR_RETURN(SlotHandle s, t.Reserve(BlockMeta{.payload_bytes = bytes}));
    std::vector<std::byte> p = Payload(i, bytes);
    RETURN_IF_ERROR(Await([&](auto cb) { t.Put(s, Meta(i, bytes), p, prio, std::move(cb)); }));
    return s;
  }
  absl::Status Get(NvmeTier& t, SlotHandle s, uint64_t i, uint64_t bytes) {
    std::vector<std::byte> out(bytes);
    RETURN_IF_ERROR(Await([&](auto cb) { t.Get(s, Meta(i, bytes), out, IoPriority::kLoad, std::move(cb)); }));
    if (!testing::MatchesKey(KeyOf(i), out)) return absl::InternalError("wrong bytes served");
    return absl::OkStatus();
  }
  // Flips one bit of the byte `at` bytes into slot `victim` (of blocks of
  // `payload_bytes`), as the tier lays slots out (2 dirs, 4 MiB segments).
  void DamageSlot(SlotHandle victim, uint64_t payload_bytes, uint64_t at, char bit) {
    const uint32_t seg = victim >> 16, idx = victim & 0xffff;
    const std::string file = dir_.File(seg % 2 == 0 ? "d0" : "d1") + "/kvtier-slab.kvt";
    const off_t off = static_cast<off_t>((seg / 2) * (4 << 20) + idx * SlotBytesFor(payload_bytes) + at);
    const int fd = open(file.c_str(), O_RDWR);
    char c;
    ASSERT_EQ(pread(fd, &c, 1, off), 1);
    c ^= bit;
    ASSERT_EQ(pwrite(fd, &c, 1, off), 1);
    close(fd);
  }

  testing::TempDir dir_;
  std::shared_ptr<IoFaults> faults_ = std::make_shared<IoFaults>();
};

// A capacity the file system cannot hold is refused before anything is
// taken: no slab is left behind to fill the disk (before, the partly
// allocated slab stayed, and a lowered capacity then failed on the journal
// with ENOSPC). The message says how much is missing and what fits.
TEST_F(NvmeTierTest, ACapacityTheDiskCannotHoldIsRefusedAndNothingIsAllocated) {
  NvmeTierOptions o = Options();
  o.capacity_bytes = uint64_t{64} << 40;  // 64 TiB
  o.segment_bytes = uint64_t{4} << 30;
  std::vector<RecoveredBlock> rec;
  auto t = NvmeTier::Open(o, &rec);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(ToErrorCode(t.status()), KVTIER_ENOSPC) << t.status();
  EXPECT_NE(t.status().message().find("Nothing was allocated"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("free"), std::string::npos) << t.status();
  for (const std::string& d : o.dirs) {
    EXPECT_FALSE(std::filesystem::exists(d + "/kvtier-slab.kvt")) << d;
  }
  EXPECT_FALSE(CheckNvmeSpace(o.dirs, o.capacity_bytes, o.segment_bytes).ok());
  EXPECT_TRUE(CheckNvmeSpace(o.dirs, 32 << 20, 4 << 20).ok());
}

// tiers.nvme.capacity lowered, then raised (same directories, same segment
// size): blocks in the segments both layouts have stay, byte for byte; those
// beyond are counted as gone; the slabs shrink and grow with it. Before, any
// change of capacity was refused until the tier's files were removed.
TEST_F(NvmeTierTest, AChangedCapacityKeepsTheBlocksInTheSegmentsThatRemain) {
  std::map<uint64_t, std::pair<SlotHandle, uint64_t>> blocks;  // i -> slot, bytes
  {
    auto t = Open();  // 2 dirs x 4 segments of 4 MiB
    ASSERT_NE(t, nullptr);
    // One block size per segment: segment k holds blocks of (k + 1) x 64 KiB.
    for (uint64_t k = 0; k < 8; ++k) {
      for (uint64_t j = 0; j < 2; ++j) {
        const uint64_t i = k * 10 + j, bytes = (k + 1) * (64 << 10);
        auto slot = Put(*t, i, bytes);
        ASSERT_TRUE(slot.ok()) << slot.status();
        blocks[i] = {*slot, bytes};
      }
    }
    ASSERT_TRUE(t->Sync().ok());
  }
  NvmeTierOptions small = Options();
  small.capacity_bytes = 16 << 20;  // 2 dirs x 2 segments: segments 0..3 remain
  std::vector<RecoveredBlock> rec;
  {
    auto t = Open(&rec, small);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(rec.size(), 8u);
    EXPECT_EQ(t->Stats().recovery.resized_from_segments, 8u);
    EXPECT_EQ(t->Stats().recovery.dropped_by_resize, 8u);
    for (const RecoveredBlock& b : rec) {
      const uint64_t i = b.meta.key.bytes[0];  // KeyOf(i) holds i in its first bytes
      EXPECT_TRUE(Get(*t, b.at, i, b.meta.payload_bytes).ok()) << i;
      EXPECT_LT(i, 40u) << "a block of the segments that remain";
    }
    for (const std::string& d : small.dirs) {
      EXPECT_EQ(std::filesystem::file_size(d + "/kvtier-slab.kvt"), uint64_t{8} << 20) << "shrunk: " << d;
    }
  }
  rec.clear();
  {
    auto t = Open(&rec, small);  // the journal now is the small layout's
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(rec.size(), 8u);
    EXPECT_EQ(t->Stats().recovery.resized_from_segments, 0u);
  }
  rec.clear();
  {
    auto t = Open(&rec);  // raised again
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(rec.size(), 8u);
    EXPECT_EQ(t->Stats().recovery.resized_from_segments, 4u);
    for (const RecoveredBlock& b : rec) EXPECT_TRUE(Get(*t, b.at, b.meta.key.bytes[0], b.meta.payload_bytes).ok());
    EXPECT_TRUE(Put(*t, 500, 64 << 10).ok()) << "and takes new blocks";
  }
}

// Every read that succeeds is reported with the device's time for it; a
// calibration read times durable blocks only (none: nothing to read), walks
// on from where the last one stopped, and never disturbs what it reads.
TEST_F(NvmeTierTest, ReadsAndCalibrationReadsReportTheDevicesTime) {
  auto t = Open();
  ASSERT_NE(t, nullptr);
  std::mutex mu;
  std::vector<std::pair<uint64_t, IoTiming>> seen;
  t->SetReadObserver([&](uint64_t bytes, const IoTiming& timing) {
    std::lock_guard<std::mutex> l(mu);
    seen.emplace_back(bytes, timing);
  });
  EXPECT_EQ(t->CalibrationRead(4), 0u) << "an empty tier has nothing to time";
  std::vector<SlotHandle> slots;
  for (uint64_t i = 0; i < 6; ++i) slots.push_back(*Put(*t, i, 64 << 10));
  ASSERT_TRUE(t->Sync().ok());
  ASSERT_TRUE(Get(*t, slots[0], 0, 64 << 10).ok());
  {
    std::lock_guard<std::mutex> l(mu);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].first, kSectorBytes + (64 << 10)) << "header sector and payload";
    EXPECT_GT(seen[0].second.service_ns, 0u);
    seen.clear();
  }
  faults_->delay_us = 2000;
  EXPECT_EQ(t->CalibrationRead(4), 4u);
  EXPECT_EQ(t->CalibrationRead(4), 4u) << "walks on, and round again";
  testing::Eventually([&] {
    std::lock_guard<std::mutex> l(mu);
    return seen.size() == 8;
  });
  {
    std::lock_guard<std::mutex> l(mu);
    ASSERT_EQ(seen.size(), 8u);
    for (const auto& [bytes, timing] : seen) {
      EXPECT_EQ(bytes, kSectorBytes + (64 << 10));
      EXPECT_GE(timing.service_ns, 2'000'000u) << "the slow device's time is measured";
    }
  }
  faults_->delay_us = 0;
  EXPECT_EQ(t->Stats().calibration_reads, 8u);
  for (uint64_t i = 0; i < 6; ++i) EXPECT_TRUE(Get(*t, slots[i], i, 64 << 10).ok()) << i;
}

TEST_F(NvmeTierTest, ManyBlocksRoundTripWithEveryByteVerified) {
  auto t = Open();
  std::vector<std::pair<SlotHandle, uint64_t>> written;
  const uint64_t sizes[] = {16 << 10, 64 << 10, 256 << 10, 100000};
  for (uint64_t i = 0; i < 60; ++i) {
    const uint64_t bytes = sizes[i % 4];
    auto s = Put(*t, i, bytes);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(t->CostOf(*s), SlotBytesFor(bytes));
    written.emplace_back(*s, bytes);
  }
  for (uint64_t i = 0; i < written.size(); ++i) {
    EXPECT_TRUE(Get(*t, written[i].first, i, written[i].second).ok()) << "block " << i;
  }
  NvmeStats st = t->Stats();
  EXPECT_EQ(st.used_slots, 60u);
  EXPECT_EQ(st.checksum_failures, 0u);
  EXPECT_GE(st.journal_records, 60u);
  EXPECT_GT(st.bytes_written, 0u);
  EXPECT_EQ(st.io_engine.find("io_uring"), 0u) << "io_uring is allowed on this machine: " << st.io_engine;
}

TEST_F(NvmeTierTest, SlotsAreReusedAfterFreeAndTheTierFillsUp) {
  auto t = Open();
  // 8 segments of 4 MiB hold 8 x 3 = 24 blocks of 1 MiB (+ header).
  std::vector<SlotHandle> slots;
  for (uint64_t i = 0;; ++i) {
    auto s = t->Reserve(BlockMeta{.payload_bytes = 1 << 20});
    if (!s.ok()) {
      EXPECT_TRUE(absl::IsResourceExhausted(s.status()));
      break;
    }
    slots.push_back(*s);
  }
  EXPECT_EQ(slots.size(), 24u);
  ASSERT_TRUE(t->Remove(slots[3], BlockMeta{}).ok());
  EXPECT_FALSE(t->Remove(slots[3], BlockMeta{}).ok()) << "double free";
  auto again = t->Reserve(BlockMeta{.payload_bytes = 1 << 20});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, slots[3]);
  EXPECT_TRUE(absl::IsInvalidArgument(t->Reserve(BlockMeta{.payload_bytes = 5 << 20}).status())) << "larger than a segment";
  // Once every slot of every segment is free, segments can be cut for another size.
  for (SlotHandle s : slots) (void)t->Remove(s, BlockMeta{});
  (void)t->Remove(*again, BlockMeta{});
  auto small = t->Reserve(BlockMeta{.payload_bytes = 8 << 10});
  EXPECT_TRUE(small.ok()) << small.status();
}

// The planner (kvtierctl capacity) counts NVMe blocks with the function
// the tier cuts its segments by: for each size, as many as the tier takes.
TEST_F(NvmeTierTest, ThePlannersCountIsWhatTheTierHolds) {
  for (uint64_t bytes : {uint64_t{4096}, uint64_t{64} << 10, uint64_t{1} << 20, uint64_t{2} << 20,
                         (uint64_t{3} << 20) + 17}) {
    NvmeTierOptions o = Options();
    o.capacity_bytes = (36 << 20) + 12345;  // not a whole number of segments
    testing::TempDir fresh;
    o.dirs = {fresh.File("d0"), fresh.File("d1")};
    auto t = Open(nullptr, o);
    ASSERT_NE(t, nullptr);
    uint64_t held = 0;
    while (t->Reserve(BlockMeta{.payload_bytes = bytes}).ok()) ++held;
    EXPECT_EQ(held, NvmeBlocksThatFit(o.capacity_bytes, o.segment_bytes, o.dirs.size(), bytes)) << bytes;
    EXPECT_LT(held, o.capacity_bytes / bytes) << "headers and whole segments cost room";
  }
}

TEST_F(NvmeTierTest, AStaleSlotIsNeverReadAsANewerBlock) {
  auto t = Open();
  auto s = Put(*t, 1, 64 << 10);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(t->Remove(*s, BlockMeta{}).ok());
  auto reused = t->Reserve(BlockMeta{.payload_bytes = 64 << 10});
  ASSERT_TRUE(reused.ok());
  ASSERT_EQ(*reused, *s);
  // Not written yet: the old block's bytes are on disk, with the old generation.
  absl::Status r = Get(*t, *reused, 1, 64 << 10);
  EXPECT_TRUE(absl::IsDataLoss(r)) << r;
  EXPECT_EQ(t->Stats().checksum_failures, 1u);
}

TEST_F(NvmeTierTest, DurableBlocksAreServedAgainAfterARestart) {
  std::vector<std::pair<SlotHandle, uint64_t>> written;
  {
    auto t = Open();
    for (uint64_t i = 0; i < 30; ++i) written.emplace_back(*Put(*t, i, 48 << 10), i);
    ASSERT_TRUE(t->Remove(written[7].first, BlockMeta{}).ok());
    ASSERT_TRUE(t->Sync().ok());
  }
  std::vector<RecoveredBlock> rec;
  auto t = Open(&rec);
  EXPECT_EQ(rec.size(), 29u);
  EXPECT_EQ(t->Stats().recovery.blocks, 29u);
  for (const RecoveredBlock& b : rec) {
    EXPECT_EQ(b.meta.payload_bytes, 48u << 10);
    EXPECT_EQ(b.meta.tenant_hash, TenantHash("default"));
    uint64_t i;
    std::memcpy(&i, b.meta.key.bytes.data(), 8);
    EXPECT_NE(i, 7u);
    EXPECT_TRUE(Get(*t, b.at, i, 48 << 10).ok()) << "block " << i;
  }
  // New blocks do not collide with recovered ones.
  auto s = Put(*t, 100, 48 << 10);
  ASSERT_TRUE(s.ok());
  for (const RecoveredBlock& b : rec) EXPECT_NE(b.at, *s);
}

TEST_F(NvmeTierTest, ADamagedHeaderIsDroppedAtRecovery) {
  SlotHandle victim = 0;
  {
    auto t = Open();
    for (uint64_t i = 0; i < 10; ++i) {
      auto s = Put(*t, i, 48 << 10);
      if (i == 4) victim = *s;
    }
  }
  DamageSlot(victim, 48 << 10, 50, 1);
  std::vector<RecoveredBlock> rec;
  auto t = Open(&rec);
  EXPECT_EQ(rec.size(), 9u);
  EXPECT_EQ(t->Stats().recovery.dropped, 1u);
}

// Small slots are checked a run at a time (one read of neighbouring slots),
// large ones a header sector each: a damaged header costs its own block
// either way, and a restart keeps the rest.
TEST_F(NvmeTierTest, RestartChecksLargeAndSmallSlotsAlike) {
  std::vector<SlotHandle> large, small;
  {
    auto t = Open();
    for (uint64_t i = 0; i < 6; ++i) large.push_back(*Put(*t, 200 + i, 256 << 10));
    for (uint64_t i = 0; i < 40; ++i) small.push_back(*Put(*t, 300 + i, 4 << 10));
    ASSERT_TRUE(t->Remove(small[20], BlockMeta{}).ok());
    ASSERT_TRUE(t->Sync().ok());
  }
  DamageSlot(large[3], 256 << 10, 40, 0x10);
  DamageSlot(small[21], 4 << 10, 40, 0x10);  // just past the gap
  DamageSlot(small[39], 4 << 10, 40, 0x10);  // the last of its run
  std::vector<RecoveredBlock> rec;
  auto t = Open(&rec);
  EXPECT_EQ(rec.size(), 6u + 40u - 1u - 3u);
  EXPECT_EQ(t->Stats().recovery.dropped, 3u);
  for (const RecoveredBlock& b : rec) {
    uint64_t i;
    std::memcpy(&i, b.meta.key.bytes.data(), 8);
    EXPECT_TRUE(i != 203 && i != 320 && i != 321 && i != 339) << "block " << i << " should be gone";
    EXPECT_TRUE(Get(*t, b.at, i, i < 300 ? 256 << 10 : 4 << 10).ok()) << "block " << i;
  }
}

TEST_F(NvmeTierTest, UnsyncedJournalRecordsAreLostCleanlyOnPowerLoss) {
  const std::string journal = dir_.File("d0") + "/kvtier.journal";
  uint64_t synced_size;
  {
    auto t = Open();
    for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(*t, i, 32 << 10).ok());
    ASSERT_TRUE(t->Sync().ok());
    struct stat st;
    stat(journal.c_str(), &st);
    synced_size = static_cast<uint64_t>(st.st_size);
    for (uint64_t i = 20; i < 30; ++i) ASSERT_TRUE(Put(*t, i, 32 << 10).ok());
  }
  // Power loss: only the synced prefix of the journal survives, then garbage.
  ASSERT_EQ(truncate(journal.c_str(), static_cast<off_t>(synced_size)), 0);
  {
    std::ofstream f(journal, std::ios::app | std::ios::binary);
    for (int i = 0; i < 333; ++i) f.put(static_cast<char>(i * 7));
  }
  std::vector<RecoveredBlock> rec;
  auto t = Open(&rec);
  EXPECT_EQ(rec.size(), 20u) << "exactly the synced blocks";
  EXPECT_EQ(t->Stats().recovery.journal_bytes_cut, 333u);
  for (const RecoveredBlock& b : rec) {
    uint64_t i;
    std::memcpy(&i, b.meta.key.bytes.data(), 8);
    EXPECT_LT(i, 20u);
    EXPECT_TRUE(Get(*t, b.at, i, 32 << 10).ok());
  }
}

TEST_F(NvmeTierTest, KillNineMidStreamLeavesOnlyCorrectOrAbsentBlocks) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t child = fork();
  if (child == 0) {
    std::vector<RecoveredBlock> ignored;
    NvmeTierOptions o = Options();
    o.wrap_engine = nullptr;
    auto t = std::move(NvmeTier::Open(o, &ignored)).value();
    for (uint64_t i = 0; i < 40; ++i) {
      auto s = t->Reserve(BlockMeta{.payload_bytes = 32 << 10});
      std::vector<std::byte> p = Payload(i, 32 << 10);
      t->Put(*s, Meta(i, 32 << 10), p, IoPriority::kDemote, [](absl::Status) {});
    }
    (void)t->Sync();
    const char ok = 'y';
    (void)!write(pipefd[1], &ok, 1);
    for (uint64_t i = 40;; ++i) {  // keep writing until killed
      auto s = t->Reserve(BlockMeta{.payload_bytes = 32 << 10});
      if (!s.ok()) break;
      std::vector<std::byte> p = Payload(i, 32 << 10);
      t->Put(*s, Meta(i, 32 << 10), p, IoPriority::kDemote, [](absl::Status) {});
    }
    pause();
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::vector<RecoveredBlock> rec;
  auto t = Open(&rec);
  std::set<uint64_t> seen;
  for (const RecoveredBlock& b : rec) {
    uint64_t i;
    std::memcpy(&i, b.meta.key.bytes.data(), 8);
    seen.insert(i);
    EXPECT_TRUE(Get(*t, b.at, i, 32 << 10).ok()) << "recovered block " << i << " must be intact";
  }
  for (uint64_t i = 0; i < 40; ++i) EXPECT_TRUE(seen.contains(i)) << "durable block " << i << " lost";
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST_F(NvmeTierTest, BitFlipsAreDetectedCountedAndNeverServed) {
  auto t = Open();
  auto s = Put(*t, 1, 64 << 10);
  ASSERT_TRUE(s.ok());
  // In the payload, on the way in from the device.
  faults_->flip_read_bit = (kSectorBytes + 1000) * 8 + 3;
  faults_->budget = 1;
  EXPECT_TRUE(absl::IsDataLoss(Get(*t, *s, 1, 64 << 10)));
  // In the header.
  faults_->Clear();
  faults_->flip_read_bit = 40 * 8;
  faults_->budget = 1;
  EXPECT_TRUE(absl::IsDataLoss(Get(*t, *s, 1, 64 << 10)));
  faults_->Clear();
  EXPECT_TRUE(Get(*t, *s, 1, 64 << 10).ok()) << "the data on disk was fine all along";
  // On the way to the device: the stored copy is bad for good.
  faults_->flip_write_bit = (kSectorBytes + 5) * 8;
  faults_->budget = 1;
  auto bad = Put(*t, 2, 64 << 10);
  ASSERT_TRUE(bad.ok());
  faults_->Clear();
  EXPECT_TRUE(absl::IsDataLoss(Get(*t, *bad, 2, 64 << 10)));
  EXPECT_EQ(t->Stats().checksum_failures, 3u);
}

TEST_F(NvmeTierTest, ATornWriteIsCaughtByTheChecksum) {
  auto t = Open();
  faults_->torn_writes = true;
  faults_->budget = 1;
  auto s = Put(*t, 3, 256 << 10);
  ASSERT_TRUE(s.ok()) << "a torn write looks like success to the writer";
  faults_->Clear();
  EXPECT_TRUE(absl::IsDataLoss(Get(*t, *s, 3, 256 << 10)));
}

TEST_F(NvmeTierTest, IoErrorsAreErrorsAndAFullDevicePausesDemotion) {
  auto t = Open();
  auto good = Put(*t, 1, 32 << 10);
  ASSERT_TRUE(good.ok());
  faults_->read_errno = EIO;
  faults_->budget = 1;
  absl::Status r = Get(*t, *good, 1, 32 << 10);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(absl::IsDataLoss(r)) << "an I/O error is not a checksum failure";
  faults_->Clear();
  faults_->write_errno = ENOSPC;
  faults_->budget = 1;
  auto full = Put(*t, 2, 32 << 10, IoPriority::kDemote);
  EXPECT_FALSE(full.ok());
  faults_->Clear();
  EXPECT_EQ(t->Health(), TierHealth::kDegraded);
  EXPECT_TRUE(t->Stats().device_full);
  // Demotion stops at once, without touching the device...
  auto s = t->Reserve(BlockMeta{.payload_bytes = 32 << 10});
  std::vector<std::byte> p = Payload(9, 32 << 10);
  absl::Status w = Await([&](auto cb) { t->Put(*s, Meta(9, 32 << 10), p, IoPriority::kDemote, std::move(cb)); });
  EXPECT_EQ(ToErrorCode(w), KVTIER_ENOSPC);
  EXPECT_GE(t->Stats().writes_refused, 1u);
  // ...and what is stored keeps being served.
  EXPECT_TRUE(Get(*t, *good, 1, 32 << 10).ok());
}

TEST_F(NvmeTierTest, LoadsOvertakeQueuedDemotions) {
  NvmeTierOptions o = Options();
  o.io_engine = "threads";
  o.io_workers = 1;
  o.queue_depth = 1;
  auto t = Open(nullptr, o);
  EXPECT_EQ(t->Stats().io_engine, "threads + faults");
  auto target = Put(*t, 1, 16 << 10);
  ASSERT_TRUE(target.ok());
  // A slow device: 30 ms an op, so that the test thread, queueing ten
  // demotions and then the load, is not outrun on a loaded machine (with
  // 3 ms, a preemption of 6 ms between the Puts let them complete first).
  faults_->delay_us = 30000;
  std::atomic<int> order{0}, load_pos{-1};
  std::vector<SlotHandle> slots;
  std::vector<std::vector<std::byte>> payloads;
  for (uint64_t i = 0; i < 10; ++i) {
    slots.push_back(*t->Reserve(BlockMeta{.payload_bytes = 16 << 10}));
    payloads.push_back(Payload(100 + i, 16 << 10));
  }
  std::atomic<int> demotes{0};
  for (uint64_t i = 0; i < 10; ++i) {
    t->Put(slots[i], Meta(100 + i, 16 << 10), payloads[i], IoPriority::kDemote, [&](absl::Status) {
      ++order;
      ++demotes;
    });
  }
  std::vector<std::byte> out(16 << 10);
  std::promise<void> loaded;
  t->Get(*target, Meta(1, 16 << 10), out, IoPriority::kLoad, [&](absl::Status) {
    load_pos = order++;
    loaded.set_value();
  });
  loaded.get_future().wait();
  EXPECT_LE(load_pos.load(), 2) << "the load waited behind the demotions";
  ASSERT_TRUE(t->Sync().ok());
  faults_->Clear();
}

TEST_F(NvmeTierTest, ReadsLandStraightInAnAlignedDestinationWithBothEngines) {
  for (const char* engine : {"io_uring", "threads"}) {
    SCOPED_TRACE(engine);
    NvmeTierOptions o = Options();
    o.io_engine = engine;
    o.dirs = {dir_.File(std::string("direct-") + engine)};
    auto t = Open(nullptr, o);
    auto s = Put(*t, 5, 64 << 10);
    ASSERT_TRUE(s.ok());
    // Page-aligned and whole sectors, like a host arena slot: the payload is
    // read into it directly.
    std::byte* dst = static_cast<std::byte*>(aligned_alloc(4096, 64 << 10));
    absl::Status r = Await([&](auto cb) { t->Get(*s, Meta(5, 64 << 10), {dst, 64 << 10}, IoPriority::kLoad, std::move(cb)); });
    EXPECT_TRUE(r.ok()) << r;
    EXPECT_TRUE(testing::MatchesKey(KeyOf(5), {dst, 64 << 10}));
    // A flipped payload bit in the direct path is still caught.
    faults_->flip_read_bit = (kSectorBytes + 999) * 8;
    faults_->budget = 1;
    r = Await([&](auto cb) { t->Get(*s, Meta(5, 64 << 10), {dst, 64 << 10}, IoPriority::kLoad, std::move(cb)); });
    EXPECT_TRUE(absl::IsDataLoss(r)) << r;
    faults_->Clear();
    free(dst);
  }
}

TEST_F(NvmeTierTest, UnusableDirectoriesGetAClearError) {
  NvmeTierOptions o = Options();
  std::ofstream(dir_.File("plainfile")) << "x";
  o.dirs = {dir_.File("plainfile") + "/sub"};
  std::vector<RecoveredBlock> rec;
  auto t = NvmeTier::Open(o, &rec);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("not writable"), std::string::npos) << t.status();
  o.dirs = {dir_.File("ok")};
  o.capacity_bytes = 1 << 20;  // below one segment
  EXPECT_TRUE(absl::IsInvalidArgument(NvmeTier::Open(o, &rec).status()));
  o.capacity_bytes = 32 << 20;
  o.io_engine = "spdk";
  EXPECT_TRUE(absl::IsInvalidArgument(NvmeTier::Open(o, &rec).status()));
  // A different layout over existing files is refused, not silently mixed.
  {
    NvmeTierOptions a = Options();
    a.dirs = {dir_.File("layout")};
    ASSERT_TRUE(NvmeTier::Open(a, &rec).ok());
    a.segment_bytes = 2 << 20;
    auto b = NvmeTier::Open(a, &rec);
    ASSERT_FALSE(b.ok());
    EXPECT_NE(std::string(b.status().message()).find("another layout"), std::string::npos);
  }
}

TEST_F(NvmeTierTest, TmpfsWithoutODirectNeedsAllowBuffered) {
  NvmeTierOptions o = Options();
  o.dirs = {"/dev/shm/kvtier-test-" + std::to_string(getpid())};
  o.wrap_engine = nullptr;
  std::vector<RecoveredBlock> rec;
  auto t = NvmeTier::Open(o, &rec);
  std::error_code ec;
  if (t.ok()) {
    const bool buffered = (*t)->Stats().buffered;
    t->reset();
    std::filesystem::remove_all(o.dirs[0], ec);
    if (!buffered) GTEST_SKIP() << "this kernel's tmpfs supports O_DIRECT";
  }
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("O_DIRECT"), std::string::npos);
  o.allow_buffered = true;
  auto b = NvmeTier::Open(o, &rec);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*b)->Stats().buffered);
  b->reset();
  std::filesystem::remove_all(o.dirs[0], ec);
}

TEST_F(NvmeTierTest, TheThreadPoolFallbackServesTheSameData) {
  NvmeTierOptions o = Options();
  o.io_engine = "threads";
  o.wrap_engine = nullptr;
  std::vector<std::pair<SlotHandle, uint64_t>> w;
  {
    auto t = Open(nullptr, o);
    EXPECT_EQ(t->Stats().io_engine, "threads");
    EXPECT_NE(t->Stats().io_engine_reason.find("threads"), std::string::npos);
    for (uint64_t i = 0; i < 10; ++i) w.emplace_back(*Put(*t, i, 64 << 10), i);
  }
  o.io_engine = "auto";  // written by one engine, read by the other
  std::vector<RecoveredBlock> rec;
  auto t = Open(&rec, o);
  EXPECT_EQ(rec.size(), 10u);
  for (auto [s, i] : w) EXPECT_TRUE(Get(*t, s, i, 64 << 10).ok());
}

// Demotions whose caller waits for room when refused (IoOptions::may_wait:
// the background reclaim, a flush) take staging only while half of it is
// free, so a burst of them leaves room to the demotions of stores, which
// cannot wait; a refused one learns from AwaitWriteRoom when a write gave
// its staging back (at its I/O's completion) and then goes.
TEST_F(NvmeTierTest, WritesThatMayWaitLeaveStagingToThoseThatCannot) {
  auto t = Open();  // 8 MiB of staging
  ASSERT_NE(t, nullptr);
  constexpr uint64_t kBytes = 1 << 20;  // + a header sector each
  faults_->delay_us = 500'000;          // writes stay in flight: a write refused is told so inline, long before
  std::vector<std::byte> p = Payload(1, kBytes);
  std::vector<std::promise<absl::Status>> done(16);
  size_t next = 0;
  auto put = [&](bool may_wait) {
    absl::StatusOr<BlockLocator> at = t->Reserve(Meta(next, kBytes));
    EXPECT_TRUE(at.ok()) << at.status();
    std::promise<absl::Status>& d = done.at(next++);
    t->Put(*at, Meta(next - 1, kBytes), p, IoOptions{.prio = IoPriority::kDemote, .may_wait = may_wait},
           [&d](absl::Status s) { d.set_value(s); });
    return &d;
  };
  auto refused_inline = [](std::promise<absl::Status>* d) {
    auto f = d->get_future();
    if (f.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    const absl::Status s = f.get();
    EXPECT_EQ(ToErrorCode(s), KVTIER_EBUSY) << s;
    return true;
  };
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(refused_inline(put(true))) << "3 fit in half of staging";
  const uint64_t epoch = t->WriteRoomEpoch();
  EXPECT_TRUE(refused_inline(put(true))) << "a 4th would pass half";
  EXPECT_FALSE(refused_inline(put(false))) << "a store's demotion still has its share";
  EXPECT_TRUE(t->AwaitWriteRoom(epoch, std::chrono::seconds(60))) << "a write in flight gives its staging back";
  // One release may not be room enough: the caller tries again after each.
  for (int tries = 0;; ++tries) {
    if (tries == 4) {
      ADD_FAILURE() << "4 writes in flight, each gives back what the waiting one needs";
      break;
    }
    const uint64_t e = t->WriteRoomEpoch();
    if (!refused_inline(put(true))) break;
    if (!t->AwaitWriteRoom(e, std::chrono::seconds(60))) {
      ADD_FAILURE() << "writes in flight give staging back";
      break;
    }
  }
  faults_->delay_us = 0;
  t->Drain();  // before the promises go, whatever failed above
  EXPECT_TRUE(t->Sync().ok());
  EXPECT_EQ(t->BlockStats().writes, 5u);
  EXPECT_EQ(t->BlockStats().writes_refused, 0u) << "refusals of writes that wait for room are not counted";
}

TEST_F(NvmeTierTest, TheJournalIsCompactedAndStillRecoversTheLiveSet) {
  NvmeTierOptions o = Options();
  o.journal_compact_bytes = 16 << 10;  // ~110 records
  std::map<SlotHandle, uint64_t> live;
  {
    auto t = Open(nullptr, o);
    for (uint64_t i = 0; i < 1000; ++i) {
      auto s = Put(*t, i, 16 << 10);
      ASSERT_TRUE(s.ok());
      live[*s] = i;
      if (i % 10 != 0) {
        ASSERT_TRUE(t->Remove(*s, BlockMeta{}).ok());
        live.erase(*s);
      }
    }
    ASSERT_TRUE(t->Sync().ok());
    EXPECT_GT(t->Stats().journal_rewrites, 0u);
  }
  std::vector<RecoveredBlock> rec;
  auto t = Open(&rec, o);
  EXPECT_EQ(rec.size(), live.size());
  for (const RecoveredBlock& b : rec) {
    ASSERT_TRUE(live.contains(b.at));
    EXPECT_TRUE(Get(*t, b.at, live[b.at], 16 << 10).ok());
  }
}

// One damaged byte in the journal's first records (the format record, the
// first segment cut, the first block's record) used to cost the whole journal:
// every durable block was discarded. Now a damaged record costs at most the
// block it describes: the slab's checksummed headers and payloads prove the
// rest, and a block whose payload is damaged too is never indexed.
TEST_F(NvmeTierTest, ADamagedJournalRecordCostsAtMostItsOwnBlock) {
  constexpr uint64_t kBlocks = 300, kBytes = 32 << 10;
  struct Case {
    uint64_t record;       // journal record to damage (0: the format record)
    int64_t bad_payload;   // block whose payload is damaged on the slab too, or -1
    uint64_t expect;       // blocks served again
  };
  const Case cases[] = {{0, -1, kBlocks}, {1, -1, kBlocks}, {2, -1, kBlocks - 1}, {0, 7, kBlocks - 1},
                        {150, 140, kBlocks - 2}};
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "record " << c.record << ", bad payload " << c.bad_payload);
    NvmeTierOptions o = Options();
    const std::string root = dir_.File("case" + std::to_string(n++));
    o.dirs = {root + "/d0", root + "/d1"};
    std::map<uint64_t, SlotHandle> written;
    {
      auto t = Open(nullptr, o);
      for (uint64_t i = 0; i < kBlocks; ++i) {
        auto s = Put(*t, i, kBytes);
        ASSERT_TRUE(s.ok()) << s.status();
        written[i] = *s;
      }
      ASSERT_TRUE(t->Sync().ok());
    }
    const std::string journal = root + "/d0/kvtier.journal";
    ASSERT_TRUE(testing::FlipByteOnDisk(journal, static_cast<off_t>(c.record * sizeof(JournalRecord) + 60)));
    if (c.bad_payload >= 0) {
      const SlotHandle h = written[c.bad_payload];
      const uint32_t seg = h >> 16, idx = h & 0xffff;
      const std::string file = (seg % 2 == 0 ? o.dirs[0] : o.dirs[1]) + "/kvtier-slab.kvt";
      ASSERT_TRUE(testing::FlipByteOnDisk(
          file, static_cast<off_t>((seg / 2) * o.segment_bytes + idx * SlotBytesFor(kBytes) + kSectorBytes + 1000)));
    }
    for (int reopen = 0; reopen < 2; ++reopen) {
      std::vector<RecoveredBlock> rec;
      auto t = Open(&rec, o);
      ASSERT_NE(t, nullptr);
      const NvmeRecovery r = t->Stats().recovery;
      if (reopen == 0) {
        EXPECT_EQ(r.journal_records_damaged, 1u);
        EXPECT_EQ(r.journal_format_damaged, c.record == 0);
        EXPECT_TRUE(r.scanned);
        EXPECT_EQ(r.scan_recovered, rec.size());
      } else {
        EXPECT_EQ(r.journal_records_damaged, 0u) << "the journal was rewritten";
        EXPECT_FALSE(r.scanned);
      }
      EXPECT_EQ(rec.size(), c.expect);
      std::set<uint64_t> seen;
      for (const RecoveredBlock& b : rec) {
        uint64_t i;
        std::memcpy(&i, b.meta.key.bytes.data(), 8);
        EXPECT_TRUE(seen.insert(i).second);
        EXPECT_NE(static_cast<int64_t>(i), c.bad_payload) << "a damaged payload was indexed";
        EXPECT_EQ(b.at, written[i]);
        EXPECT_EQ(b.meta.tenant_hash, TenantHash("default"));
        EXPECT_EQ(b.meta.block_tokens, 16u);
        EXPECT_TRUE(Get(*t, b.at, i, kBytes).ok()) << "block " << i;
      }
      // New blocks never land on a recovered one.
      auto s = Put(*t, 100000 + reopen, kBytes);
      ASSERT_TRUE(s.ok());
      for (const RecoveredBlock& b : rec) EXPECT_NE(b.at, *s);
      ASSERT_TRUE(t->Remove(*s, BlockMeta{}).ok());
      ASSERT_TRUE(t->Sync().ok());
    }
  }
}

// Damage anywhere in a journal that has seen frees, reuse and segments cut
// again for another size: whatever comes back reads back byte-exact.
TEST_F(NvmeTierTest, RandomJournalDamageNeverServesAWrongBlock) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 4; ++round) {
    NvmeTierOptions o = Options();
    const std::string root = dir_.File("round" + std::to_string(round));
    o.dirs = {root + "/d0", root + "/d1"};
    std::map<uint64_t, std::pair<SlotHandle, uint64_t>> live;  // block -> (slot, bytes)
    {
      auto t = Open(nullptr, o);
      uint64_t next = 0;
      for (int phase = 0; phase < 3; ++phase) {
        const uint64_t bytes = phase == 1 ? (100 << 10) : (20 << 10);
        for (int i = 0; i < 150; ++i) {
          auto s = Put(*t, next, bytes);
          if (!s.ok()) break;
          live[next++] = {*s, bytes};
        }
        // Free most blocks, so segments empty out and get cut for the next size.
        for (auto it = live.begin(); it != live.end();) {
          if (rng() % 4 != 0) {
            ASSERT_TRUE(t->Remove(it->second.first, BlockMeta{}).ok());
            it = live.erase(it);
          } else {
            ++it;
          }
        }
      }
      ASSERT_TRUE(t->Sync().ok());
    }
    const std::string journal = root + "/d0/kvtier.journal";
    struct stat st;
    ASSERT_EQ(stat(journal.c_str(), &st), 0);
    const uint64_t records = static_cast<uint64_t>(st.st_size) / sizeof(JournalRecord);
    for (int flips = 0; flips < 3; ++flips) {
      const uint64_t at = (1 + rng() % (records - 2)) * sizeof(JournalRecord) + rng() % sizeof(JournalRecord);
      ASSERT_TRUE(testing::FlipByteOnDisk(journal, static_cast<off_t>(at)));
    }
    std::vector<RecoveredBlock> rec;
    auto t = Open(&rec, o);
    ASSERT_NE(t, nullptr);
    EXPECT_GE(rec.size() + 3, live.size());
    for (const RecoveredBlock& b : rec) {
      uint64_t i;
      std::memcpy(&i, b.meta.key.bytes.data(), 8);
      EXPECT_TRUE(Get(*t, b.at, i, b.meta.payload_bytes).ok()) << "block " << i;
    }
  }
}

}  // namespace
}  // namespace kvtier
