// SPDX-License-Identifier: Apache-2.0
// kvtierd with an NVMe tier, end to end: blocks that leave host memory come
// back from NVMe with their bytes, durable blocks survive kill -9 of the
// daemon, a corrupted block on disk is a miss, and the fallbacks show.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "gtest/gtest.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;

constexpr uint64_t kBlock = 64 << 10;

// A daemon whose 1 MiB host tier holds 16 blocks, with an NVMe tier in `nvme_dir`.
std::string Config(const std::string& nvme_dir, const std::string& extra = "") {
  return "[tiers.host]\ncapacity = \"1MiB\"\n[tiers.nvme]\ndirs = [\"" + nvme_dir +
         "\"]\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n" + extra;
}

std::unique_ptr<Client> AttachTo(const DaemonProcess& d) {
  return testing::AttachTo(d.socket_path(), testing::TestNamespace(kBlock, "nvme/e2e"));
}

std::vector<BlockKey> Keys(Client& c, uint32_t seed, size_t n) { return testing::SeededKeys(c, seed, n); }

Status StoreAll(Client& c, std::span<const BlockKey> keys, bool durable = false) {
  return testing::StoreFilled(c, keys, durable);
}

// Loads one block at a time; returns how many hit, loaded and matched.
struct Tally {
  int hit = 0, loaded = 0, correct = 0, nvme = 0;
};
Tally LoadEach(Client& c, std::span<const BlockKey> keys) {
  Tally t;
  for (const BlockKey& k : keys) {
    auto r = c.Lookup({&k, 1}, {.lease = true});
    if (!r.ok() || r->hit_blocks == 0) continue;
    ++t.hit;
    t.nvme += r->tiers[0] == TierKind::kNvme;
    // NVMe is the chain's lane 0; a host hit is in no lane.
    EXPECT_EQ(r->lanes.at(0), r->tiers[0] == TierKind::kNvme ? 0 : kNoLane);
    auto v = c.Load(r->lease, {&k, 1});
    if (v.ok() && v->size() == 1) {
      ++t.loaded;
      t.correct += testing::MatchesKey(k, {(*v)[0].data, (*v)[0].size});
    }
    (void)c.Release(r->lease);
  }
  return t;
}

int StatusInt(const DaemonProcess& d, const std::string& tier_or_stats, const std::string& key) {
  auto s = d.Status();
  if (!s.ok()) return -1;
  if (tier_or_stats == "stats") return (*s)["stats"][key].get<int>();
  for (const auto& t : (*s)["tiers"]) {
    if (t["tier"] == tier_or_stats) return t[key].get<int>();
  }
  return -1;
}

TEST(NvmeE2eTest, BlocksEvictedFromHostComeBackFromNvmeWithTheirBytes) {
  testing::TempDir data;
  DaemonProcess d(Config(data.File("nvme")));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = AttachTo(d);
  auto keys = Keys(*c, 1, 48);
  for (size_t i = 0; i < keys.size(); i += 8) ASSERT_TRUE(StoreAll(*c, std::span(keys).subspan(i, 8)).ok());
  EXPECT_TRUE(testing::Eventually([&] { return StatusInt(d, "nvme", "blocks") >= 32; })) << d.Status()->dump();
  Tally t = LoadEach(*c, std::span(keys).first(16));
  EXPECT_EQ(t.hit, 16);
  EXPECT_EQ(t.nvme, 16) << "the first blocks were demoted";
  EXPECT_EQ(t.correct, 16);
  EXPECT_GE(StatusInt(d, "nvme", "promotions"), 16);
  EXPECT_GE(StatusInt(d, "nvme", "promotions_for_load"), 16) << "the loads brought them up, not a prefetch";
  EXPECT_EQ(StatusInt(d, "host", "evictions_dropped"), 0);
  EXPECT_EQ(StatusInt(d, "nvme", "checksum_failures"), 0);
  auto s = d.Status();
  EXPECT_GE((*s)["stats"]["blocks_hit_local"].get<int>(), 16);
  EXPECT_EQ((*s)["tiers"][1]["io_engine"].get<std::string>().rfind("io_uring", 0), 0u);
}

TEST(NvmeE2eTest, PrefetchPromotesBeforeTheLookup) {
  testing::TempDir data;
  DaemonProcess d(Config(data.File("nvme")));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = AttachTo(d);
  auto keys = Keys(*c, 2, 32);
  ASSERT_TRUE(StoreAll(*c, std::span(keys).first(16)).ok());
  ASSERT_TRUE(StoreAll(*c, std::span(keys).subspan(16)).ok());
  ASSERT_TRUE(testing::Eventually([&] { return StatusInt(d, "nvme", "blocks") >= 16; }));
  auto n = c->Prefetch(std::span(keys).first(4));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 4u);
  EXPECT_EQ(StatusInt(d, "nvme", "promotions_for_load"), 0) << "a prefetch is not a load";
  auto r = c->Lookup(std::span(keys).first(4));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hit_blocks, 4u);
  for (TierKind t : r->tiers) EXPECT_EQ(t, TierKind::kHost);
}

TEST(NvmeE2eTest, DurableBlocksSurviveKillNineOfTheDaemon) {
  testing::TempDir data;
  auto d = std::make_unique<DaemonProcess>(Config(data.File("nvme")), "", data.File("state"));
  ASSERT_TRUE(d->Start().ok()) << d->Log();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t engine = fork();
  if (engine == 0) {
    auto c = AttachTo(*d);
    if (!c) _exit(2);
    auto durable = Keys(*c, 3, 24);
    for (size_t i = 0; i < durable.size(); i += 4) {
      if (!StoreAll(*c, std::span(durable).subspan(i, 4), true).ok()) _exit(3);
    }
    (void)!write(ready[1], "y", 1);
    // Keep the daemon busy with more writes, durable and not, until it dies.
    for (uint32_t seed = 100;; ++seed) {
      auto more = Keys(*c, seed, 4);
      if (!StoreAll(*c, more, seed % 2 == 0).ok()) break;
    }
    _exit(0);
  }
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  d->Kill(SIGKILL);
  d->WaitExit(std::chrono::seconds(5));
  int st;
  waitpid(engine, &st, 0);
  // A new daemon over the same NVMe directory.
  DaemonProcess d2(Config(data.File("nvme")), "", data.File("state"));
  ASSERT_TRUE(d2.Start().ok()) << d2.Log();
  auto c = AttachTo(d2);
  auto durable = Keys(*c, 3, 24);
  Tally t = LoadEach(*c, durable);
  EXPECT_EQ(t.hit, 24) << "every durable block is served again";
  EXPECT_EQ(t.correct, 24);
  // Blocks written after that point: each is either correct or absent.
  int extra_hit = 0;
  for (uint32_t seed = 100; seed < 160; ++seed) {
    auto more = Keys(*c, seed, 4);
    Tally m = LoadEach(*c, more);
    EXPECT_EQ(m.correct, m.loaded) << "seed " << seed;
    EXPECT_EQ(m.loaded, m.hit) << "seed " << seed;
    extra_hit += m.hit;
  }
  EXPECT_GE(StatusInt(d2, "nvme", "blocks"), 24);
  EXPECT_EQ(StatusInt(d2, "nvme", "checksum_failures"), 0);
  EXPECT_NE(d2.Log().find("event=nvme_tier state=on"), std::string::npos);
  // A namespace known only from its recovered blocks is not logged as
  // namespace=0 model_id="" (the model id arrives with the engine).
  EXPECT_EQ(d2.Log().find("model_id=\"\""), std::string::npos) << d2.Log();
  EXPECT_NE(d2.Log().find("event=cost_model_unpriced namespace=" + c->namespace_id().Hex().substr(0, 16) +
                          " model_id=\"nvme/e2e\""),
            std::string::npos)
      << d2.Log();
  close(ready[0]);
  close(ready[1]);
}

// After kill -9, the disk filled up (another program's files): the daemon
// refused to start until space was freed. It starts now with its NVMe tier
// read-only: it serves the blocks it holds, stores new ones in host memory
// only, and says so.
TEST(NvmeE2eTest, AFullDiskAfterKillNineStartsWithTheNvmeTierReadOnly) {
  testing::TempDir data;
  const std::string mnt = data.File("small-fs");
  std::filesystem::create_directories(mnt);
  if (geteuid() != 0 || std::system(("mount -t tmpfs -o size=40m tmpfs " + mnt + " 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "needs root to mount a small tmpfs to fill";
  }
  struct Unmount {
    std::string at;
    ~Unmount() { (void)!std::system(("umount -l " + at).c_str()); }
  } unmount{mnt};
  const std::string config = "[tiers.host]\ncapacity = \"1MiB\"\n[tiers.nvme]\ndirs = [\"" + mnt +
                             "/nvme\"]\ncapacity = \"32MiB\"\nsegment_bytes = \"1MiB\"\nstaging_bytes = \"4MiB\"\n"
                             "allow_buffered = true\n";
  {
    DaemonProcess d(config, "", data.File("state"));
    ASSERT_TRUE(d.Start().ok()) << d.Log();
    auto c = AttachTo(d);
    auto keys = Keys(*c, 5, 48);
    for (size_t i = 0; i < keys.size(); i += 4) ASSERT_TRUE(StoreAll(*c, std::span(keys).subspan(i, 4), true).ok());
    ASSERT_TRUE(testing::Eventually([&] { return StatusInt(d, "nvme", "blocks") >= 32; })) << d.Log();
    d.Kill(SIGKILL);
    d.WaitExit(std::chrono::seconds(5));
  }
  // Another program fills the file system.
  (void)!std::system(("dd if=/dev/zero of=" + mnt + "/filler bs=1M 2>/dev/null").c_str());
  DaemonProcess d(config, "", data.File("state"));
  ASSERT_TRUE(d.Start().ok()) << "the daemon must start on a full disk\n" << d.Log();
  EXPECT_NE(d.Log().find("event=nvme_read_only"), std::string::npos) << d.Log();
  auto c = AttachTo(d);
  auto keys = Keys(*c, 5, 48);
  Tally t = LoadEach(*c, keys);
  EXPECT_GE(t.nvme, 32) << "what NVMe held is served";
  EXPECT_EQ(t.correct, t.loaded);
  EXPECT_EQ(t.loaded, t.hit);
  // New blocks go to host memory; none is lost to a failed NVMe write.
  auto fresh = Keys(*c, 6, 8);
  ASSERT_TRUE(StoreAll(*c, fresh).ok());
  Tally f = LoadEach(*c, fresh);
  EXPECT_EQ(f.hit, 8);
  EXPECT_EQ(f.correct, 8);
  // More than host memory holds: what it evicts is dropped, counted by
  // reason, and said (once, rate-limited) in the log.
  auto more = Keys(*c, 7, 32);
  for (size_t i = 0; i < more.size(); i += 4) ASSERT_TRUE(StoreAll(*c, std::span(more).subspan(i, 4)).ok());
  auto s = d.Status();
  ASSERT_TRUE(s.ok());
  for (const auto& tier : (*s)["tiers"]) {
    if (tier["tier"] == "nvme") {
      EXPECT_EQ(tier["health"], "degraded") << tier.dump();
      EXPECT_EQ(tier["device_full"], true) << tier.dump();
    }
    if (tier["tier"] == "host") {
      EXPECT_GT(tier["evictions_dropped_by_reason"]["tier_unwritable"].get<int>(), 0) << tier.dump();
    }
  }
  EXPECT_TRUE(testing::Eventually([&] { return d.Log().find("event=evictions_dropped") != std::string::npos; }))
      << d.Log();
}

TEST(NvmeE2eTest, WriteThroughBlocksSurviveAnOrderlyRestart) {
  testing::TempDir data;
  const std::string base = Config(data.File("nvme"), "write_through = true\n");
  std::vector<BlockKey> keys;
  {
    DaemonProcess d(base);
    ASSERT_TRUE(d.Start().ok()) << d.Log();
    auto c = AttachTo(d);
    keys = Keys(*c, 4, 12);
    ASSERT_TRUE(StoreAll(*c, keys).ok());
    ASSERT_TRUE(testing::Eventually([&] { return StatusInt(d, "nvme", "blocks") == 12; }));
    c.reset();
    ASSERT_EQ(d.Stop(), 0) << d.Log();
  }
  DaemonProcess d(base);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = AttachTo(d);
  Tally t = LoadEach(*c, keys);
  EXPECT_EQ(t.correct, 12);
  EXPECT_EQ(t.nvme, 12);
  auto s = d.Status();
  EXPECT_EQ((*s)["tiers"][1]["recovery"]["blocks"].get<int>(), 12);
}

TEST(NvmeE2eTest, ACorruptedBlockOnDiskIsAMissNeverServed) {
  testing::TempDir data;
  DaemonProcess d(Config(data.File("nvme"), "write_through = true\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = AttachTo(d);
  auto keys = Keys(*c, 5, 8);
  ASSERT_TRUE(StoreAll(*c, keys).ok());
  ASSERT_TRUE(testing::Eventually([&] { return StatusInt(d, "nvme", "blocks") == 8; }));
  // Push them out of host memory so loads read NVMe, and let those writes
  // finish: a host copy being written through cannot make room for a load.
  ASSERT_TRUE(StoreAll(*c, Keys(*c, 6, 16)).ok());
  ASSERT_TRUE(testing::Eventually([&] { return StatusInt(d, "nvme", "blocks") == 24; }));
  // Flip a byte in the payload of the slab's first slot.
  ASSERT_TRUE(testing::FlipByteOnDisk(data.File("nvme") + "/kvtier-slab.kvt", 4096 + 1234));
  // The daemon's reads are O_DIRECT: they see the device, not a cache.
  Tally t = LoadEach(*c, keys);
  EXPECT_EQ(t.hit, 8);
  EXPECT_EQ(t.loaded, 7) << "the corrupted block is not served";
  EXPECT_EQ(t.correct, 7);
  EXPECT_EQ(StatusInt(d, "nvme", "checksum_failures"), 1);
  Tally again = LoadEach(*c, keys);
  EXPECT_EQ(again.hit, 7) << "and it is gone afterwards";
}

TEST(NvmeE2eTest, TheThreadPoolFallbackIsVisibleAndWorks) {
  testing::TempDir data;
  DaemonProcess d(Config(data.File("nvme"), "io_engine = \"threads\"\n"));
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto s = d.Status();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)["tiers"][1]["io_engine"], "threads");
  EXPECT_NE((*s)["tiers"][1]["io_engine_reason"].get<std::string>().find("threads"), std::string::npos);
  auto c = AttachTo(d);
  auto keys = Keys(*c, 7, 32);
  ASSERT_TRUE(StoreAll(*c, std::span(keys).first(16)).ok());
  ASSERT_TRUE(StoreAll(*c, std::span(keys).subspan(16)).ok());
  ASSERT_TRUE(testing::Eventually([&] { return StatusInt(d, "nvme", "blocks") >= 16; }));
  EXPECT_EQ(LoadEach(*c, std::span(keys).first(8)).correct, 8);
}

TEST(NvmeE2eTest, AnUnusableNvmeDirectoryStopsTheStartWithAReason) {
  testing::TempDir data;
  DaemonProcess d(Config("/proc/kvtier-cannot-exist"));
  absl::Status s = d.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(d.Log().find("not writable"), std::string::npos) << d.Log();
  EXPECT_NE(d.Log().find("tiers.nvme.dirs"), std::string::npos) << "the message says what to change";
}

// The tier is whole segments per directory: a capacity between two is
// rounded down, and the log says so and gives the real size (before: it
// logged the configured figure). A directory in RAM gets a warning.
TEST(NvmeE2eTest, RoundedCapacityAndARamDirectoryAreSaid) {
  testing::TempDir data;
  DaemonProcess d("[tiers.host]\ncapacity = \"1MiB\"\n[tiers.nvme]\ndirs = [\"" + data.path() +
                  "\"]\ncapacity = \"40MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n");
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  EXPECT_NE(d.Log().find("event=nvme_capacity_rounded configured=\"40.00 MiB\" capacity=\"32.00 MiB\""),
            std::string::npos)
      << d.Log();
  EXPECT_NE(d.Log().find("event=nvme_tier state=on dirs=1 capacity=\"32.00 MiB\""), std::string::npos) << d.Log();
  EXPECT_EQ(StatusInt(d, "nvme", "capacity_bytes"), 32 << 20);
  EXPECT_EQ(d.Log().find("event=nvme_on_tmpfs"), std::string::npos) << "the test folder is not in RAM";
  d.Stop();

  struct statfs fs {};
  if (statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "no tmpfs at /dev/shm";
  char tmpl[] = "/dev/shm/kvtier-nvme-e2e-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string shm = tmpl;
  DaemonProcess r("[tiers.host]\ncapacity = \"1MiB\"\n[tiers.nvme]\ndirs = [\"" + shm +
                  "\"]\ncapacity = \"16MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n");
  const absl::Status started = r.Start();
  const std::string log = r.Log();
  r.Stop();
  std::filesystem::remove_all(shm);
  if (!started.ok()) GTEST_SKIP() << "this kernel's tmpfs refuses the NVMe tier: " << log;
  EXPECT_NE(log.find("event=nvme_on_tmpfs"), std::string::npos) << log;
  EXPECT_EQ(log.find("event=nvme_capacity_rounded"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
