// SPDX-License-Identifier: Apache-2.0
// The shared file-system tier: byte-exact round trips, two tiers on one
// directory, files damaged by another process never served, a directory
// that vanishes or fills (a loop-mounted ext4) degrading the tier instead of
// crashing it, the capacity scan, folder modes against another uid, and
// readers racing writers of the same block.
#include "tiers/fs/fs_tier.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <chrono>
#include <thread>
#include <fstream>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/units.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::FillFromKey;
using testing::KeyOf;
using testing::MatchesKey;
using testing::RunCommand;
using testing::TempDir;

const uint64_t kTenantA = TenantHash("alpha");
const uint64_t kTenantB = TenantHash("beta");

FsTierOptions Options(const std::string& dir, uint64_t capacity = 64ull << 20) {
  FsTierOptions o;
  o.dir = dir;
  o.tenants = {{"alpha", kTenantA}, {"beta", kTenantB}};
  o.capacity_bytes = capacity;
  o.scan_interval_ms = 0;  // tests scan when they mean to
  return o;
}

BlockMeta Meta(uint64_t i, uint64_t bytes, uint64_t tenant = kTenantA) {
  BlockMeta m;
  m.ns = KeyOf(7);
  m.key = KeyOf(i);
  m.payload_bytes = bytes;
  m.tenant_hash = tenant;
  return m;
}

absl::Status WriteBlock(FsTier& t, const BlockMeta& m, const std::vector<std::byte>& data, IoOptions io = {}) {
  absl::StatusOr<SlotHandle> s = t.Reserve(BlockMeta{.payload_bytes = m.payload_bytes});
  if (!s.ok()) return s.status();
  std::promise<absl::Status> p;
  t.Put(*s, m, data, io, [&](absl::Status st) { p.set_value(std::move(st)); });
  absl::Status r = p.get_future().get();
  (void)t.Remove(*s, BlockMeta{});
  return r;
}

absl::Status WriteKeyed(FsTier& t, const BlockMeta& m) {
  std::vector<std::byte> data(m.payload_bytes);
  FillFromKey(m.key, data);
  return WriteBlock(t, m, data);
}

absl::Status ReadBlock(FsTier& t, const BlockMeta& m, std::vector<std::byte>& out, IoOptions io = {}) {
  out.assign(m.payload_bytes, std::byte{0});
  absl::StatusOr<SlotHandle> s = t.Reserve(BlockMeta{.payload_bytes = m.payload_bytes});
  if (!s.ok()) return s.status();
  std::promise<absl::Status> p;
  t.Get(*s, m, out, io, [&](absl::Status st) { p.set_value(std::move(st)); });
  absl::Status r = p.get_future().get();
  (void)t.Remove(*s, BlockMeta{});
  return r;
}

std::vector<bool> ExistsNow(FsTier& t, std::vector<BlockMeta> metas) {
  std::promise<std::vector<bool>> p;
  t.Exists(metas, [&](std::vector<bool> v) { p.set_value(std::move(v)); }, 0);
  return p.get_future().get();
}

TEST(FsTierTest, BlocksRoundTripByteExact) {
  TempDir dir;
  auto t = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(t.ok()) << t.status();
  const uint64_t sizes[] = {1, 4096, 256 << 10, 2 << 20, (2 << 20) + 17};
  for (uint64_t i = 0; i < std::size(sizes); ++i) {
    ASSERT_TRUE(WriteKeyed(**t, Meta(i, sizes[i])).ok()) << sizes[i];
  }
  std::vector<std::byte> out;
  for (uint64_t i = 0; i < std::size(sizes); ++i) {
    ASSERT_TRUE(ReadBlock(**t, Meta(i, sizes[i]), out).ok()) << sizes[i];
    EXPECT_TRUE(MatchesKey(KeyOf(i), out)) << sizes[i];
  }
  EXPECT_EQ(ExistsNow(**t, {Meta(0, 1), Meta(99, 1), Meta(2, 256 << 10, kTenantB)}),
            (std::vector<bool>{true, false, false}))
      << "a block is found under its own tenant only";
  const BlockTierStats st = (*t)->BlockStats();
  EXPECT_EQ(st.writes, std::size(sizes));
  EXPECT_EQ(st.reads, std::size(sizes));
  EXPECT_EQ((*t)->Health(), TierHealth::kHealthy);
  // The tenant's folder and its files are the daemon's alone.
  struct stat fst {};
  ASSERT_EQ(stat((dir.path() + "/alpha").c_str(), &fst), 0);
  EXPECT_EQ(fst.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((*t)->PathFor(Meta(1, 4096)).c_str(), &fst), 0);
  EXPECT_EQ(fst.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<uint64_t>(fst.st_size), 4096 + sizeof(FsBlockHeader));
}

TEST(FsTierTest, ABlockIsNotAnotherBlockNorAnotherTenants) {
  TempDir dir;
  auto t = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(WriteKeyed(**t, Meta(1, 8192)).ok());
  std::vector<std::byte> out;
  EXPECT_TRUE(absl::IsNotFound(ReadBlock(**t, Meta(1, 8192, kTenantB), out))) << "beta cannot name alpha's block";
  EXPECT_TRUE(absl::IsNotFound(ReadBlock(**t, Meta(2, 8192), out)));
  // Another block's file under this block's name: never served.
  ASSERT_TRUE(WriteKeyed(**t, Meta(2, 8192)).ok());
  std::filesystem::copy_file((*t)->PathFor(Meta(2, 8192)), (*t)->PathFor(Meta(1, 8192)),
                             std::filesystem::copy_options::overwrite_existing);
  const absl::Status s = ReadBlock(**t, Meta(1, 8192), out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("another block"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists((*t)->PathFor(Meta(1, 8192)))) << "a damaged file is deleted";
  // The wrong length asked for.
  EXPECT_TRUE(absl::IsDataLoss(ReadBlock(**t, Meta(2, 4096), out)));
  // Unknown tenants are refused, not written anywhere.
  EXPECT_FALSE(WriteKeyed(**t, Meta(3, 4096, TenantHash("nobody"))).ok());
}

TEST(FsTierTest, TwoTiersOnOneDirectoryShareBlocks) {
  TempDir dir;
  auto a = FsTier::Create(Options(dir.path()));
  auto b = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(a.ok() && b.ok());
  for (uint64_t i = 0; i < 32; ++i) ASSERT_TRUE(WriteKeyed(**a, Meta(i, 64 << 10)).ok());
  std::vector<BlockMeta> metas;
  for (uint64_t i = 0; i < 34; ++i) metas.push_back(Meta(i, 64 << 10));
  const std::vector<bool> found = ExistsNow(**b, metas);
  std::vector<std::byte> out;
  for (uint64_t i = 0; i < 34; ++i) {
    EXPECT_EQ(found[i], i < 32) << i;
    const absl::Status s = ReadBlock(**b, Meta(i, 64 << 10), out);
    if (i < 32) {
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(MatchesKey(KeyOf(i), out)) << i;
    } else {
      EXPECT_TRUE(absl::IsNotFound(s)) << s;
    }
  }
}

TEST(FsTierTest, AFileTruncatedOrRewrittenIsACountedMissNeverServed) {
  TempDir dir;
  auto t = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(t.ok());
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(WriteKeyed(**t, Meta(i, 128 << 10)).ok());
  // 0: cut short; 1: a payload byte flipped; 2: a header byte flipped; 3: empty.
  ASSERT_EQ(truncate((*t)->PathFor(Meta(0, 128 << 10)).c_str(), 64 << 10), 0);
  ASSERT_TRUE(testing::FlipByteOnDisk((*t)->PathFor(Meta(1, 128 << 10)), sizeof(FsBlockHeader) + 1000));
  ASSERT_TRUE(testing::FlipByteOnDisk((*t)->PathFor(Meta(2, 128 << 10)), 60));
  ASSERT_EQ(truncate((*t)->PathFor(Meta(3, 128 << 10)).c_str(), 0), 0);
  std::vector<std::byte> out;
  for (uint64_t i = 0; i < 4; ++i) {
    const absl::Status s = ReadBlock(**t, Meta(i, 128 << 10), out);
    EXPECT_TRUE(absl::IsDataLoss(s)) << i << ": " << s;
    EXPECT_FALSE(std::filesystem::exists((*t)->PathFor(Meta(i, 128 << 10)))) << i;
  }
  EXPECT_EQ((*t)->BlockStats().checksum_failures, 4u);
  EXPECT_EQ((*t)->misses().bad_file, 4u);
  EXPECT_EQ((*t)->BlockStats().reads, 0u) << "no damaged file counts as a read";
  // Written again, it loads.
  ASSERT_TRUE(WriteKeyed(**t, Meta(1, 128 << 10)).ok());
  ASSERT_TRUE(ReadBlock(**t, Meta(1, 128 << 10), out).ok());
  EXPECT_TRUE(MatchesKey(KeyOf(1), out));
}

TEST(FsTierTest, AVanishedDirectoryDegradesTheTierUntilItIsBack) {
  TempDir top;
  const std::string dir = top.path() + "/mnt";
  ASSERT_TRUE(std::filesystem::create_directory(dir));
  std::atomic<int> reported{0};
  FsTierOptions o = Options(dir);
  o.on_failure = [&](const std::string&) { reported.fetch_add(1); };
  auto t = FsTier::Create(o);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(WriteKeyed(**t, Meta(1, 4096)).ok());
  std::filesystem::remove_all(dir);
  std::vector<std::byte> out;
  const absl::Status r = ReadBlock(**t, Meta(1, 4096), out);
  EXPECT_FALSE(r.ok());
  const absl::Status w = WriteKeyed(**t, Meta(2, 4096));
  EXPECT_FALSE(w.ok()) << "a vanished mount must not become a local folder";
  EXPECT_FALSE(std::filesystem::exists(dir)) << "the tier does not create the directory itself";
  EXPECT_EQ((*t)->Health(), TierHealth::kDegraded);
  EXPECT_GE(reported.load(), 1);
  EXPECT_GE((*t)->BlockStats().io_errors, 1u);
  EXPECT_EQ(ExistsNow(**t, {Meta(1, 4096)}), std::vector<bool>{false});
  (*t)->ScanNow();
  EXPECT_GE((*t)->scan_stats().failures, 1u);
  // The mount comes back: the tier makes its tenant folder again and heals.
  ASSERT_TRUE(std::filesystem::create_directory(dir));
  ASSERT_TRUE(WriteKeyed(**t, Meta(2, 4096)).ok());
  EXPECT_EQ((*t)->Health(), TierHealth::kHealthy);
  ASSERT_TRUE(ReadBlock(**t, Meta(2, 4096), out).ok());
  EXPECT_TRUE(MatchesKey(KeyOf(2), out));
}

// A small ext4 file system on a loop device, unmounted at the end.
class LoopFs {
 public:
  explicit LoopFs(const std::string& top, const char* size) : image_(top + "/fs.img"), mnt_(top + "/mnt") {
    std::filesystem::create_directory(mnt_);
    ok_ = geteuid() == 0 &&
          RunCommand(absl::StrCat("truncate -s ", size, " ", image_, " && mkfs.ext4 -q -F ", image_,
                                  " >/dev/null 2>&1 && mount -o loop ", image_, " ", mnt_, " 2>/dev/null"))
                  .exit_code == 0;
  }
  ~LoopFs() {
    if (ok_) RunCommand("umount " + mnt_);
  }
  bool ok() const { return ok_; }
  const std::string& path() const { return mnt_; }

 private:
  std::string image_, mnt_;
  bool ok_ = false;
};

TEST(FsTierTest, AFullFileSystemRefusesWritesAndKeepsServingWhatItHolds) {
  TempDir top;
  LoopFs fs(top.path(), "8M");
  if (!fs.ok()) GTEST_SKIP() << "needs root and a loop device to mount a small ext4 (CI has both)";
  // The tier believes it may take far more than the file system has.
  auto t = FsTier::Create(Options(fs.path(), 1ull << 30));
  ASSERT_TRUE(t.ok()) << t.status();
  uint64_t written = 0;
  absl::Status last;
  for (uint64_t i = 0; i < 64; ++i) {
    last = WriteKeyed(**t, Meta(i, 256 << 10));
    if (!last.ok()) break;
    ++written;
  }
  ASSERT_FALSE(last.ok()) << "8 MiB of ext4 cannot hold 16 MiB of blocks";
  EXPECT_TRUE(absl::IsResourceExhausted(last)) << last;
  EXPECT_GT(written, 4u);
  EXPECT_EQ((*t)->Health(), TierHealth::kDegraded);
  EXPECT_GE((*t)->BlockStats().writes_refused, 1u);
  // No half-written temporary file is left behind.
  for (const auto& e : std::filesystem::recursive_directory_iterator(fs.path())) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
  }
  std::vector<std::byte> out;
  for (uint64_t i = 0; i < written; ++i) {
    ASSERT_TRUE(ReadBlock(**t, Meta(i, 256 << 10), out).ok()) << i;
    EXPECT_TRUE(MatchesKey(KeyOf(i), out)) << i;
  }
  EXPECT_EQ((*t)->Health(), TierHealth::kHealthy) << "a read that succeeds heals the tier";
}

TEST(FsTierTest, TheScanKeepsTheDirectoryWithinCapacityDroppingTheColdest) {
  TempDir dir;
  const uint64_t block = 64 << 10, file = block + sizeof(FsBlockHeader);
  auto t = FsTier::Create(Options(dir.path(), 16 * file));
  ASSERT_TRUE(t.ok());
  // Another node's tier on the same directory writes half of them.
  auto other = FsTier::Create(Options(dir.path(), 16 * file));
  ASSERT_TRUE(other.ok());
  std::vector<std::byte> out;
  for (uint64_t i = 0; i < 32; ++i) {
    ASSERT_TRUE(WriteKeyed(i % 2 ? **other : **t, Meta(i, block)).ok());
    // mtimes must order the writes even on a coarse clock.
    timespec ts[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(1'000'000 + i), 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, (*t)->PathFor(Meta(i, block)).c_str(), ts, 0), 0);
  }
  // Block 0, the oldest, is read: it becomes the most recent.
  ASSERT_TRUE(ReadBlock(**t, Meta(0, block), out).ok());
  // A temporary file of a writer that died long ago.
  const std::string stale = dir.path() + "/alpha/.tmp-dead";
  { std::ofstream(stale) << "half a block"; }
  ASSERT_EQ(rename(stale.c_str(), (dir.path() + "/alpha/00/.tmp-dead").c_str()), 0);
  timespec old[2] = {{0, UTIME_OMIT}, {1000, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, (dir.path() + "/alpha/00/.tmp-dead").c_str(), old, 0), 0);

  (*t)->ScanNow();
  const FsTier::ScanStats s = (*t)->scan_stats();
  EXPECT_LE(s.bytes, 16 * file);
  EXPECT_GE(s.bytes, 14 * file) << "down to the low watermark, not further";
  EXPECT_EQ(s.evicted + s.files, 32u);
  EXPECT_EQ(s.stale_temps, 1u);
  EXPECT_TRUE(ReadBlock(**t, Meta(0, block), out).ok()) << "the block read last stays";
  EXPECT_TRUE(absl::IsNotFound(ReadBlock(**t, Meta(1, block), out))) << "the coldest goes";
  EXPECT_TRUE(ReadBlock(**t, Meta(31, block), out).ok()) << "the newest stays";
  // The other node's scan finds the directory within capacity and deletes nothing.
  (*other)->ScanNow();
  EXPECT_EQ((*other)->scan_stats().evicted, 0u);
  EXPECT_EQ((*other)->scan_stats().files, s.files);
}

TEST(FsTierTest, AWriteBurstWakesTheScanOnItsOwn) {
  TempDir dir;
  const uint64_t block = 32 << 10, file = block + sizeof(FsBlockHeader);
  FsTierOptions o = Options(dir.path(), 32 * file);
  o.scan_interval_ms = 3'600'000;  // only the written bytes wake it
  auto t = FsTier::Create(o);
  ASSERT_TRUE(t.ok());
  for (uint64_t i = 0; i < 128; ++i) ASSERT_TRUE(WriteKeyed(**t, Meta(i, block)).ok());
  ASSERT_TRUE(testing::Eventually([&] { return (*t)->scan_stats().evicted > 0; }));
  ASSERT_TRUE(testing::Eventually([&] {
    (*t)->ScanNow();
    return (*t)->scan_stats().bytes <= 32 * file;
  }));
}

TEST(FsTierTest, RetuneAppliesTheNewSettingsAndRefusesWhatNeedsANewTier) {
  TempDir dir;
  const uint64_t block = 32 << 10, file = block + sizeof(FsBlockHeader);
  FsTierOptions o = Options(dir.path(), 64 * file);
  o.scan_interval_ms = 3'600'000;  // only a retune or a write burst wakes it
  auto t = FsTier::Create(o);
  ASSERT_TRUE(t.ok());
  for (uint64_t i = 0; i < 40; ++i) ASSERT_TRUE(WriteKeyed(**t, Meta(i, block)).ok());
  (*t)->ScanNow();
  EXPECT_EQ((*t)->scan_stats().evicted, 0u) << "40 files fit in 64";
  FsTierSettings next = (*t)->settings();
  next.capacity_bytes = 16 * file;
  next.low_watermark = 0.5;
  next.op_timeout_ms = 4321;
  next.fsync = false;
  ASSERT_TRUE((*t)->Retune(next).ok());
  EXPECT_EQ((*t)->settings(), next);
  EXPECT_EQ((*t)->Usage().capacity_bytes, 16 * file);
  EXPECT_EQ((*t)->BlockStats().capacity_bytes, 16 * file);
  // The smaller capacity wakes the scan, which deletes down to half of it.
  ASSERT_TRUE(testing::Eventually([&] { return (*t)->scan_stats().evicted > 0; }));
  (*t)->ScanNow();
  EXPECT_LE((*t)->scan_stats().bytes, 8 * file);
  std::vector<std::byte> out(block);
  EXPECT_TRUE(ReadBlock(**t, Meta(39, block), out).ok()) << "the newest stays";
  EXPECT_TRUE(absl::IsNotFound(ReadBlock(**t, Meta(0, block), out))) << "the oldest goes";
  // What the tier is built around, and values Create refuses: nothing changes.
  for (auto change : std::vector<std::function<void(FsTierSettings&)>>{
           [](FsTierSettings& s) { s.dir += "/elsewhere"; },
           [](FsTierSettings& s) { s.io_threads += 1; },
           [](FsTierSettings& s) { s.capacity_bytes = 0; },
           [](FsTierSettings& s) { s.low_watermark = 1.5; },
           [](FsTierSettings& s) { s.op_timeout_ms = 0; },
           [](FsTierSettings& s) { s.scan_interval_ms = 0; },
       }) {
    FsTierSettings bad = next;
    bad.capacity_bytes = 99 * file;
    change(bad);
    EXPECT_TRUE(absl::IsInvalidArgument((*t)->Retune(bad)));
    EXPECT_EQ((*t)->settings(), next);
  }
}

TEST(FsTierTest, ARetunedScanIntervalTakesEffectAtOnce) {
  TempDir dir;
  FsTierOptions o = Options(dir.path());
  o.scan_interval_ms = 3'600'000;  // an hour: no scan in this test without the retune
  auto t = FsTier::Create(o);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(WriteKeyed(**t, Meta(1, 4096)).ok());
  FsTierSettings next = (*t)->settings();
  next.scan_interval_ms = 50;
  ASSERT_TRUE((*t)->Retune(next).ok());
  // The scanner was asleep for the hour; it now scans every 50 ms.
  ASSERT_TRUE(testing::Eventually([&] { return (*t)->scan_stats().scans >= 3; }, std::chrono::seconds(5)));
  EXPECT_EQ((*t)->scan_stats().files, 1u);
}

TEST(FsTierTest, TenantFoldersAreClosedToOtherUsers) {
  TempDir dir;
  auto t = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(WriteKeyed(**t, Meta(1, 4096)).ok());
  if (geteuid() == 0) {
    // As uid nobody, with the directory itself open to all (a shared mount).
    ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
    for (std::string p = dir.path(); p != "/" && !p.empty(); p = std::filesystem::path(p).parent_path().string()) {
      struct stat st {};
      if (stat(p.c_str(), &st) == 0 && (st.st_mode & 0001) == 0) {
        GTEST_SKIP() << p << " is closed to others already";
      }
    }
    const auto r = RunCommand(absl::StrCat("setpriv --reuid=nobody --regid=nogroup --clear-groups cat ",
                                           (*t)->PathFor(Meta(1, 4096)), " >/dev/null 2>&1; echo $?"));
    EXPECT_NE(r.out, "0\n") << "uid nobody read a tenant's block file";
    const auto l = RunCommand(absl::StrCat("setpriv --reuid=nobody --regid=nogroup --clear-groups ls ", dir.path(),
                                           "/alpha >/dev/null 2>&1; echo $?"));
    EXPECT_NE(l.out, "0\n") << "uid nobody listed a tenant's folder";
  }
  // A tenant folder others may open is refused at start.
  ASSERT_EQ(chmod((dir.path() + "/beta").c_str(), 0755), 0);
  auto again = FsTier::Create(Options(dir.path()));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("chmod 700"), std::string::npos) << again.status();
  // A missing directory is refused, not created.
  auto missing = FsTier::Create(Options(dir.path() + "/not-mounted"));
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/not-mounted"));
}

TEST(FsTierTest, AnOpPastItsDeadlineIsAbandonedNotRun) {
  TempDir dir;
  auto t = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(t.ok());
  std::vector<std::byte> data(4096);
  const absl::Status s = WriteBlock(**t, Meta(1, 4096), data, IoOptions{.deadline_ns = 1});
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_FALSE(std::filesystem::exists((*t)->PathFor(Meta(1, 4096))));
  EXPECT_EQ((*t)->BlockStats().abandoned, 1u);
  CancelSource cancel;
  cancel.Cancel();
  EXPECT_TRUE(absl::IsCancelled(WriteBlock(**t, Meta(1, 4096), data, IoOptions{.cancel = cancel.token()})));
}

// Round r of block i: its first 8 bytes say r, the rest are the bytes of
// key i * 1000 + r, so a file mixing two rounds fails the check.
std::vector<std::byte> Version(uint64_t i, uint64_t round, uint64_t bytes) {
  std::vector<std::byte> data(bytes);
  FillFromKey(KeyOf(i * 1000 + round), data);
  std::memcpy(data.data(), &round, sizeof(round));
  return data;
}

bool IsAVersion(uint64_t i, const std::vector<std::byte>& data) {
  uint64_t round = 0;
  std::memcpy(&round, data.data(), sizeof(round));
  return round < 1000 && data == Version(i, round, data.size());
}

TEST(FsTierTest, ReadersRacingRewritesSeeAWholeVersionOrAMissNeverHalf) {
  TempDir dir;
  auto w = FsTier::Create(Options(dir.path()));
  auto r = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(w.ok() && r.ok());
  constexpr uint64_t kBlocks = 8, kBytes = 512 << 10;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> good{0}, bad{0}, missing{0};
  std::vector<std::thread> readers;
  for (int k = 0; k < 3; ++k) {
    readers.emplace_back([&, k] {
      std::vector<std::byte> out;
      for (uint64_t n = 0; !stop.load(); ++n) {
        const uint64_t i = (n + k) % kBlocks;
        const absl::Status s = ReadBlock(**r, Meta(i, kBytes), out);
        if (s.ok()) {
          (IsAVersion(i, out) ? good : bad).fetch_add(1);
        } else {
          missing.fetch_add(1);  // not there yet; never an OK with mixed bytes
        }
      }
    });
  }
  bool written = true;
  for (uint64_t round = 0; round < 20 && written; ++round) {
    for (uint64_t i = 0; i < kBlocks && written; ++i) written = WriteBlock(**w, Meta(i, kBytes), Version(i, round, kBytes)).ok();
  }
  stop = true;
  for (std::thread& th : readers) th.join();
  EXPECT_TRUE(written);
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(good.load(), 0u);
  EXPECT_EQ((*r)->BlockStats().checksum_failures, 0u) << "rename makes every file whole";
}

TEST(FsTierTest, ATenantFolderSwappedForALinkIsNeitherFollowedNorEmptied) {
  TempDir dir, outside;
  const uint64_t block = 16 << 10;
  auto t = FsTier::Create(Options(dir.path(), 4 * (block + sizeof(FsBlockHeader))));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(WriteKeyed(**t, Meta(1, block)).ok());
  // Somebody else's files, named as blocks are, in a folder shaped as a tenant's.
  const std::string victim = outside.path() + "/" + std::filesystem::path((*t)->PathFor(Meta(1, block))).parent_path().filename().string();
  ASSERT_TRUE(std::filesystem::create_directories(victim));
  ASSERT_EQ(chmod(outside.path().c_str(), 0700), 0);
  ASSERT_EQ(chmod(victim.c_str(), 0700), 0);
  for (uint64_t i = 0; i < 16; ++i) {
    std::ofstream(victim + "/" + std::filesystem::path((*t)->PathFor(Meta(1000 + i, block))).filename().string())
        << std::string(block, 'x');
  }
  std::filesystem::rename(dir.path() + "/alpha", dir.path() + "/alpha.old");
  std::filesystem::create_directory_symlink(outside.path(), dir.path() + "/alpha");
  const absl::Status w = WriteKeyed(**t, Meta(2, block));
  EXPECT_FALSE(w.ok()) << "a write must not follow the link";
  EXPECT_NE(w.message().find("link"), std::string::npos) << w;
  std::vector<std::byte> out;
  EXPECT_FALSE(ReadBlock(**t, Meta(1000, block), out).ok());
  (*t)->ScanNow();
  EXPECT_EQ((*t)->scan_stats().evicted, 0u);
  size_t left = 0;
  for (const auto& e : std::filesystem::directory_iterator(victim)) left += e.is_regular_file();
  EXPECT_EQ(left, 16u) << "the scan deleted files outside the directory";
  EXPECT_FALSE(std::filesystem::exists(victim + "/" + std::filesystem::path((*t)->PathFor(Meta(2, block))).filename().string()));
}

TEST(FsTierTest, AFifoOrAForeignVersionAtABlockPathIsAMissThatDoesNotHang) {
  TempDir dir;
  auto t = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(WriteKeyed(**t, Meta(1, 4096)).ok());
  ASSERT_TRUE(WriteKeyed(**t, Meta(2, 4096)).ok());
  const std::string fifo = (*t)->PathFor(Meta(1, 4096));
  ASSERT_EQ(unlink(fifo.c_str()), 0);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::vector<std::byte> out;
  EXPECT_TRUE(absl::IsDataLoss(ReadBlock(**t, Meta(1, 4096), out)));
  EXPECT_FALSE(std::filesystem::exists(fifo));
  // A newer node's format: a miss here, left in place for it.
  const std::string other = (*t)->PathFor(Meta(2, 4096));
  {
    std::fstream f(other, std::ios::in | std::ios::out | std::ios::binary);
    const uint16_t version = FsBlockHeader::kVersion + 1;
    f.seekp(4);
    f.write(reinterpret_cast<const char*>(&version), sizeof(version));
  }
  const absl::Status s = ReadBlock(**t, Meta(2, 4096), out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("another version"), std::string::npos) << s;
  EXPECT_TRUE(std::filesystem::exists(other));
  // Tenant names that would leave the directory are refused.
  FsTierOptions o = Options(dir.path());
  o.tenants.push_back({"..", TenantHash("..")});
  EXPECT_FALSE(FsTier::Create(o).ok());
}

TEST(FsTierTest, QueuedOpsFailByTheirDeadlineWhenEveryThreadIsBusy) {
  TempDir dir;
  FsTierOptions o = Options(dir.path());
  o.io_threads = 1;
  auto t = FsTier::Create(o);
  ASSERT_TRUE(t.ok());
  // The only thread is held in a callback (as it would be in a hung call).
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<absl::Status> first, second;
  std::vector<std::byte> data(4096);
  auto slot = (*t)->Reserve(BlockMeta{.payload_bytes = 4096});
  ASSERT_TRUE(slot.ok());
  (*t)->Put(*slot, Meta(1, 4096), data, IoOptions{}, [&](absl::Status s) {
    released.wait();
    first.set_value(std::move(s));
  });
  const uint64_t t0 = MonotonicNanos();
  (*t)->Put(*slot, Meta(2, 4096), data, IoOptions{.deadline_ns = MonotonicNanos() + 50'000'000},
              [&](absl::Status s) { second.set_value(std::move(s)); });
  auto f = second.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "the queued op waited for the thread";
  EXPECT_TRUE(absl::IsDeadlineExceeded(f.get()));
  EXPECT_LT(MonotonicNanos() - t0, 2'000'000'000u);
  release.set_value();
  EXPECT_TRUE(first.get_future().get().ok());
  (void)(*t)->Remove(*slot, BlockMeta{});
}

TEST(FsTierTest, ExistsAnswersForEveryBlockAndGarbageOfTheWrongSizeGoes) {
  TempDir dir;
  auto t = FsTier::Create(Options(dir.path()));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(WriteKeyed(**t, Meta(2, 4096)).ok());
  ASSERT_TRUE(WriteKeyed(**t, Meta(3, 4096)).ok());
  EXPECT_EQ(ExistsNow(**t, {Meta(1, 4096), Meta(2, 4096)}), (std::vector<bool>{false, true}))
      << "past an absent block: another shared tier may hold the blocks before it";
  EXPECT_EQ(ExistsNow(**t, {Meta(2, 4096), Meta(3, 4096), Meta(4, 4096)}), (std::vector<bool>{true, true, false}));
  // Zeros of the wrong length (a crash without fsync): deleted, not kept as
  // "another version".
  const std::string path = (*t)->PathFor(Meta(3, 4096));
  { std::ofstream(path, std::ios::trunc) << std::string(300, '\0'); }
  std::vector<std::byte> out;
  const absl::Status s = ReadBlock(**t, Meta(3, 4096), out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(s.message().find("another version"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace kvtier
