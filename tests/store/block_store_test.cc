// SPDX-License-Identifier: Apache-2.0
#include "store/block_store.h"

#include <chrono>
#include <cstring>
#include <set>
#include <vector>
#include <thread>

#include "core/namespace.h"
#include "core/status.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::KeyOf;

class BlockStoreTest : public ::testing::Test {
 protected:
  // A tenant whose host tier holds `blocks` blocks of 4 KiB.
  void SetUpCache(uint64_t blocks, int tenants = 1, std::string policy = "lru", BlockStore::Options o = {},
                  TenantQuota quota = {}) {
    o.policy = std::move(policy);
    store_ = std::move(BlockStore::Create(o, &stats_)).value();
    for (int t = 0; t < tenants; ++t) {
      auto host = HostTier::Create({"t", blocks * 4096, false});
      ASSERT_TRUE(host.ok());
      ASSERT_TRUE(store_->AddTenant("tenant" + std::to_string(t), std::move(*host), quota).ok());
    }
    store_->StartBackgroundReclaim();
  }
  std::unique_ptr<SessionHoldings> Session(uint32_t ns_handle = 0, uint16_t tenant = 0) {
    auto s = std::make_unique<SessionHoldings>();
    s->ns.handle = ns_handle;
    s->ns.tenant = tenant;
    s->ns.block_bytes = 4096;
    s->ns.block_tokens = 16;
    return s;
  }
  std::vector<BlockKey> Keys(uint64_t from, uint64_t n) {
    std::vector<BlockKey> k;
    for (uint64_t i = from; i < from + n; ++i) k.push_back(KeyOf(i));
    return k;
  }
  absl::Status Commit(SessionHoldings& s, uint64_t ticket) {
    absl::Status got = absl::UnknownError("no callback");
    store_->StoreCommit(s, ticket, false, [&](absl::Status st) { got = st; });  // host-only: inline
    return got;
  }
  absl::Status Store(SessionHoldings& s, const std::vector<BlockKey>& keys) {
    std::vector<BlockLocation> out(keys.size());
    uint64_t ticket;
    auto n = store_->StoreBegin(s, keys, &ticket, std::span(out));
    if (!n.ok()) return n.status();
    return ticket ? Commit(s, ticket) : absl::OkStatus();
  }
  // Host-only loads complete at once.
  LoadOutcome LoadNow(SessionHoldings& s, uint64_t lease, const std::vector<BlockKey>& keys) {
    std::optional<LoadOutcome> o = store_->Load(s, lease, keys, [](LoadOutcome) {});
    EXPECT_TRUE(o.has_value());
    return o ? std::move(*o) : LoadOutcome{};
  }
  uint32_t Hit(SessionHoldings& s, const std::vector<BlockKey>& keys, bool lease = false,
               uint64_t* lease_id = nullptr) {
    std::vector<BlockLocation> out(keys.size());
    uint64_t l = 0;
    auto n = store_->Lookup(s, keys, lease, &l, std::span(out));
    EXPECT_TRUE(n.ok()) << n.status();
    if (lease_id) *lease_id = l;
    return n.ok() ? *n : 0;
  }

  DaemonStats stats_;
  std::unique_ptr<DeviceBackend> dev_;  // for a GPU tier; outlives store_
  std::unique_ptr<BlockStore> store_;
};

// The GPU tier holds copies of blocks the store has: whenever a block leaves
// the index (invalidated, evicted with no lower copy, its store aborted),
// the store drops its GPU copy, so a later store of the key cannot find a
// stale copy there (GpuCache::Reserve refuses a key that has one).
TEST_F(BlockStoreTest, AGpuCopyLeavesWithItsBlock) {
  dev_ = MakeSimDevice();
  auto gpu_tier = GpuTier::Create(dev_.get(), {16 * 4096});
  ASSERT_TRUE(gpu_tier.ok());
  store_ = std::move(BlockStore::Create({.policy = "lru"}, &stats_)).value();
  ASSERT_TRUE(store_
                  ->AddTenant("t", std::move(*HostTier::Create({"t", 4 * 4096, false})), {},
                              std::make_unique<GpuCache>(std::move(*gpu_tier)))
                  .ok());
  GpuCache* gpu = store_->gpu_cache(0);
  ASSERT_NE(gpu, nullptr);
  auto put_on_gpu = [&](uint64_t i) {
    auto pin = gpu->Reserve(0, KeyOf(i), 4096);
    ASSERT_TRUE(pin.has_value()) << i;
    std::memset(pin->data, static_cast<int>(i), 4096);
    gpu->Publish(0, KeyOf(i));
    gpu->Release(0, KeyOf(i));
  };
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 4)).ok());
  for (uint64_t i = 0; i < 4; ++i) put_on_gpu(i);

  // Invalidated: its GPU copy goes, the others stay.
  const std::vector<BlockKey> one = {KeyOf(1)};
  ASSERT_EQ(store_->Invalidate(*s, one).value(), 1u);
  EXPECT_FALSE(gpu->Contains(0, KeyOf(1)));
  EXPECT_TRUE(gpu->Contains(0, KeyOf(0)));

  // Evicted with nowhere below to go: dropped from the store and the GPU.
  ASSERT_TRUE(Store(*s, Keys(4, 4)).ok());
  EXPECT_EQ(Hit(*s, Keys(0, 1)), 0u);
  for (uint64_t i : {0, 2, 3}) EXPECT_FALSE(gpu->Contains(0, KeyOf(i))) << i;

  // A store aborted after its blocks were copied to the GPU (a device
  // store's order): the copy goes with the aborted blocks.
  std::vector<BlockLocation> out(1);
  uint64_t ticket = 0;
  ASSERT_TRUE(store_->StoreBegin(*s, Keys(10, 1), &ticket, std::span(out)).ok());
  put_on_gpu(10);
  ASSERT_TRUE(store_->StoreAbort(*s, ticket).ok());
  EXPECT_FALSE(gpu->Contains(0, KeyOf(10)));
  EXPECT_TRUE(gpu->Reserve(0, KeyOf(10), 4096).has_value()) << "a new store of the key gets a fresh GPU slot";
  gpu->Release(0, KeyOf(10));
  // Blocks still in the store keep their copies.
  put_on_gpu(5);
  EXPECT_TRUE(gpu->Contains(0, KeyOf(5)));
  EXPECT_EQ(Hit(*s, Keys(5, 1)), 1u);

  // A copy reserved for a block (a load's promotion to the GPU) whose block
  // is invalidated before the copy is published: not published, freed.
  ASSERT_TRUE(gpu->Reserve(0, KeyOf(6), 4096).has_value());
  const std::vector<BlockKey> six = {KeyOf(6)};
  ASSERT_EQ(store_->Invalidate(*s, six).value(), 1u);
  EXPECT_FALSE(store_->PublishGpuCopy(0, 0, KeyOf(6)));
  gpu->Release(0, KeyOf(6));
  EXPECT_FALSE(gpu->Contains(0, KeyOf(6)));
  EXPECT_TRUE(gpu->Reserve(0, KeyOf(6), 4096).has_value()) << "the unpublished copy was freed";
  gpu->Release(0, KeyOf(6));
  // ... and one for a block still there is published.
  ASSERT_TRUE(Store(*s, Keys(20, 1)).ok());
  ASSERT_TRUE(gpu->Reserve(0, KeyOf(20), 4096).has_value());
  EXPECT_TRUE(store_->PublishGpuCopy(0, 0, KeyOf(20)));
  gpu->Release(0, KeyOf(20));
  EXPECT_TRUE(gpu->Contains(0, KeyOf(20)));
}

// Records come from per-shard pools: 64 bytes each, reused after a free,
// and (under AddressSanitizer) unreadable between the free and the reuse.
TEST(RecordPoolTest, RecordsAreDistinctDefaultAndReused) {
  RecordPool pool;
  std::set<BlockRecord*> seen;
  std::vector<BlockRecord*> recs;
  for (int i = 0; i < 2500; ++i) {  // more than two chunks
    BlockRecord* r = pool.New();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r) % alignof(BlockRecord), 0u);
    EXPECT_EQ(r->host_slot, kNoSlot);
    EXPECT_EQ(r->pins, 0u);
    EXPECT_EQ(r->depth, kUnknownDepth);
    r->pins = 7;
    r->key.bytes[0] = static_cast<uint8_t>(i);
    EXPECT_TRUE(seen.insert(r).second) << "record " << i << " handed out twice";
    recs.push_back(r);
  }
  EXPECT_EQ(pool.live(), 2500u);
  BlockRecord* freed = recs[1234];
  pool.Delete(freed);
  EXPECT_EQ(pool.live(), 2499u);
  BlockRecord* again = pool.New();
  EXPECT_EQ(again, freed) << "a freed record is reused first";
  EXPECT_EQ(again->pins, 0u) << "a reused record starts as a default one";
  EXPECT_EQ(recs[1233]->pins, 7u);
  EXPECT_EQ(recs[1235]->key.bytes[0], static_cast<uint8_t>(1235));
  for (BlockRecord* r : recs) pool.Delete(r);
  EXPECT_EQ(pool.live(), 0u);
}

// Each record has a number in its pool (what the index's sets hold): At and
// IdOf agree, numbers are distinct, and a reused record keeps its number.
TEST(RecordPoolTest, NumbersNameRecordsBothWays) {
  RecordPool pool;
  std::vector<BlockRecord*> recs;
  std::set<uint32_t> ids;
  for (int i = 0; i < 5000; ++i) {  // several chunks, in whatever address order malloc gives
    BlockRecord* r = pool.New();
    ASSERT_NE(r, nullptr);
    const uint32_t id = pool.IdOf(r);
    EXPECT_LT(id, RecordPool::kMaxRecords);
    EXPECT_TRUE(ids.insert(id).second) << "number " << id << " given twice";
    EXPECT_EQ(pool.At(id), r);
    recs.push_back(r);
  }
  for (size_t i = 0; i < recs.size(); i += 97) EXPECT_EQ(pool.At(pool.IdOf(recs[i])), recs[i]);
  const uint32_t id = pool.IdOf(recs[4321]);
  pool.Delete(recs[4321]);
  BlockRecord* again = pool.New();
  EXPECT_EQ(again, recs[4321]);
  EXPECT_EQ(pool.IdOf(again), id);
  for (BlockRecord* r : recs) pool.Delete(r);
}

// A full pool makes no record (the callers then take no block) and never
// hands out its last number, so no number across the index is kNoRecord;
// a freed record makes room again.
TEST(RecordPoolTest, AFullPoolMakesNoRecordAndKeepsItsLastNumber) {
  RecordPool pool(2500);  // numbers 0..2498: three chunks, the last partly carved
  std::vector<BlockRecord*> recs;
  while (BlockRecord* r = pool.New()) {
    recs.push_back(r);
    ASSERT_LE(recs.size(), 2499u);
  }
  ASSERT_EQ(recs.size(), 2499u);
  EXPECT_EQ(pool.IdOf(recs.back()), 2498u);
  EXPECT_EQ(pool.New(), nullptr) << "still full";
  pool.Delete(recs[7]);
  BlockRecord* again = pool.New();
  EXPECT_EQ(again, recs[7]);
  EXPECT_EQ(pool.New(), nullptr);
  for (BlockRecord* r : recs) pool.Delete(r);
}

// The index holds records by number: a record is found by its key, erasing
// a record takes out that record only (not another of the same key indexed
// since), and the count follows.
TEST(BlockIndexTest, EraseTakesOutThatRecordOnly) {
  BlockIndex index;
  BlockKey k{};
  k.bytes[0] = 42;
  BlockRecord* old_r = index.NewRecord(3, k);
  BlockIndex::Shard& sh = index.ShardFor(old_r);
  {
    MutexLock l(&sh.mu);
    index.Insert(sh, old_r);
    EXPECT_EQ(BlockIndex::Find(sh, 3, k), old_r);
    EXPECT_EQ(BlockIndex::Find(sh, 4, k), nullptr) << "another namespace";
    index.Erase(sh, old_r);
    EXPECT_EQ(BlockIndex::Find(sh, 3, k), nullptr);
  }
  BlockRecord* new_r = index.NewRecord(3, k);
  ASSERT_NE(new_r, old_r);
  {
    MutexLock l(&sh.mu);
    index.Insert(sh, new_r);
    index.Erase(sh, old_r);  // stale: erased already
    EXPECT_EQ(BlockIndex::Find(sh, 3, k), new_r);
    EXPECT_EQ(index.size(), 1u);
    size_t seen = 0;
    BlockIndex::ForEach(sh, [&](BlockRecord* r) {
      EXPECT_EQ(r, new_r);
      return ++seen != 0;
    });
    EXPECT_EQ(seen, 1u);
    index.Erase(sh, new_r);
    EXPECT_EQ(index.size(), 0u);
  }
  index.FreeRecord(old_r);
  index.FreeRecord(new_r);
}

#if defined(__SANITIZE_ADDRESS__)
TEST(RecordPoolTest, AFreedRecordIsPoisonedUnderAddressSanitizer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        RecordPool pool;
        BlockRecord* r = pool.New();
        pool.Delete(r);
        volatile uint32_t pins = r->pins;
        (void)pins;
      },
      "use-after-poison");
}
#endif

TEST_F(BlockStoreTest, LookupFindsTheLongestPresentPrefix) {
  SetUpCache(64);
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 3)).ok());
  ASSERT_TRUE(Store(*s, Keys(4, 2)).ok());  // key 3 missing: a hole
  EXPECT_EQ(Hit(*s, Keys(0, 6)), 3u);
  EXPECT_EQ(Hit(*s, Keys(4, 2)), 2u);
  EXPECT_EQ(Hit(*s, Keys(10, 2)), 0u);
  EXPECT_EQ(stats_.probes.Get(), 3u);
  EXPECT_EQ(stats_.lookups.Get(), 0u) << "lookups without lease are probes, not stats";
}

TEST_F(BlockStoreTest, StoreOfCachedKeysIsNotNeeded) {
  SetUpCache(64);
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 2)).ok());
  std::vector<BlockLocation> out(3);
  uint64_t ticket;
  auto n = store_->StoreBegin(*s, Keys(0, 3), &ticket, std::span(out));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_FALSE(out[0].needed);
  EXPECT_FALSE(out[1].needed);
  EXPECT_TRUE(out[2].needed);
  // Until commit the block is invisible.
  EXPECT_EQ(Hit(*s, Keys(0, 3)), 2u);
  ASSERT_TRUE(Commit(*s, ticket).ok());
  EXPECT_EQ(Hit(*s, Keys(0, 3)), 3u);
  EXPECT_EQ(ToErrorCode(Commit(*s, ticket)), KVTIER_ENOENT) << "a ticket commits once";
}

TEST_F(BlockStoreTest, AbortGivesSlotsBack) {
  SetUpCache(4);
  auto s = Session();
  std::vector<BlockLocation> out(4);
  uint64_t ticket;
  ASSERT_TRUE(store_->StoreBegin(*s, Keys(0, 4), &ticket, std::span(out)).ok());
  EXPECT_EQ(store_->Usage()[0].blocks, 4u);
  ASSERT_TRUE(store_->StoreAbort(*s, ticket).ok());
  EXPECT_EQ(store_->Usage()[0].blocks, 0u);
  EXPECT_EQ(Hit(*s, Keys(0, 4)), 0u);
  EXPECT_TRUE(Store(*s, Keys(10, 4)).ok());
}

// A namespace may be forgotten (its handle given to another) only when no
// record of it is left: stores add them; aborts, evictions and
// invalidations take them away; another namespace's blocks do not count.
TEST_F(BlockStoreTest, ANamespaceIsForgottenOnlyWhenNoRecordOfItIsLeft) {
  SetUpCache(4);
  auto s = Session(/*ns_handle=*/1), other = Session(/*ns_handle=*/2);
  EXPECT_EQ(store_->RecordsOf(1), 0u);
  std::vector<BlockLocation> out(3);
  uint64_t ticket;
  ASSERT_TRUE(store_->StoreBegin(*s, Keys(0, 3), &ticket, std::span(out)).ok());
  EXPECT_EQ(store_->RecordsOf(1), 3u) << "blocks being written count";
  EXPECT_FALSE(store_->ForgetNamespace(1));
  ASSERT_TRUE(store_->StoreAbort(*s, ticket).ok());
  EXPECT_EQ(store_->RecordsOf(1), 0u);
  ASSERT_TRUE(Store(*s, Keys(0, 4)).ok());
  ASSERT_TRUE(Store(*other, Keys(0, 2)).ok());  // evicts two of ns 1's four (host only: dropped)
  EXPECT_EQ(store_->RecordsOf(1), 2u);
  EXPECT_EQ(store_->RecordsOf(2), 2u);
  EXPECT_FALSE(store_->ForgetNamespace(1));
  auto n = store_->Invalidate(*s, Keys(0, 4));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(store_->RecordsOf(1), 0u);
  EXPECT_TRUE(store_->ForgetNamespace(1));
  EXPECT_FALSE(store_->ForgetNamespace(2));
  EXPECT_EQ(Hit(*other, Keys(0, 2)), 2u);
}

TEST_F(BlockStoreTest, FullTierEvictsLeastRecentlyUsedUnpinnedBlocks) {
  SetUpCache(4);
  auto s = Session();
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(Store(*s, {KeyOf(i)}).ok());
  // Use block 0 (a leased lookup counts as use), so block 1 is now the oldest.
  uint64_t lease;
  EXPECT_EQ(Hit(*s, {KeyOf(0)}, true, &lease), 1u);
  ASSERT_TRUE(store_->Release(*s, lease).ok());
  ASSERT_TRUE(Store(*s, {KeyOf(100)}).ok());
  EXPECT_EQ(Hit(*s, {KeyOf(1)}), 0u) << "block 1 was least recently used";
  EXPECT_EQ(Hit(*s, {KeyOf(0)}), 1u);
  EXPECT_EQ(Hit(*s, {KeyOf(2)}), 1u);
  EXPECT_EQ(Hit(*s, {KeyOf(100)}), 1u);
  EXPECT_EQ(stats_.evictions.Get(), 1u);
}

// Block sizes share a tenant's arena by segments. A size that needs room
// takes whole segments from a size whose blocks are all colder than its own
// coldest: an arena filled with one size serves another in full, not from
// what the first gives back by chance (before: the second size was refused
// outright, "carved for other block sizes").
TEST_F(BlockStoreTest, ASizeThatNeedsRoomTakesWholeSegmentsFromAColdSize) {
  SetUpCache(512);  // 2 MiB
  auto big = Session(1);
  big->ns.block_bytes = 8192;
  auto small = Session(2);
  for (uint64_t i = 0; i < 256; ++i) ASSERT_TRUE(Store(*big, {KeyOf(i)}).ok()) << i;
  const uint64_t capacity = store_->Usage()[0].capacity_bytes;
  ASSERT_EQ(store_->Usage()[0].used_bytes, capacity) << "the 8 KiB blocks fill the arena";
  for (uint64_t i = 0; i < 2000; ++i) ASSERT_TRUE(Store(*small, {KeyOf(10000 + i)}).ok()) << i;
  const TenantUsage u = store_->Usage()[0];
  EXPECT_GE(u.used_bytes, capacity * 95 / 100);
  uint64_t small_bytes = 0;
  for (const SlotAllocator::ClassUsage& c : u.classes) {
    if (c.slot_bytes == 4096) small_bytes = c.used_bytes;
  }
  EXPECT_GE(small_bytes, capacity * 9 / 10) << "the cold 8 KiB blocks gave their segments to the 4 KiB ones";
  EXPECT_EQ(Hit(*small, Keys(10000 + 2000 - 400, 400)), 400u);
  EXPECT_GT(stats_.host_segments_reclaimed.Get(), 0u);
  EXPECT_GE(stats_.evictions_for_other_size.Get(), 240u);
  EXPECT_EQ(stats_.store_refused_no_space.Get(), 0u);
}

// The same with the daemon's default watermarks: the background reclaimer
// kept the new size's own slots free, so its stores never needed room and
// the cold size's segments stayed (45% of a tier, never read, segments
// reclaimed 0). The reclaimer now gives a cold size's whole segments to
// the size it evicts for.
TEST_F(BlockStoreTest, TheBackgroundReclaimerGivesAColdSizesSegmentsBack) {
  SetUpCache(512, 1, "lru", {.high_watermark = 0.95, .low_watermark = 0.9});
  auto big = Session(1);
  big->ns.block_bytes = 8192;
  auto small = Session(2);
  for (uint64_t i = 0; i < 256; ++i) ASSERT_TRUE(Store(*big, {KeyOf(i)}).ok()) << i;
  auto class_bytes = [&](uint64_t slot_bytes) {
    uint64_t used = 0;
    const TenantUsage u = store_->Usage()[0];  // a copy: the loop must not outlive the vector
    for (const SlotAllocator::ClassUsage& c : u.classes) {
      if (c.slot_bytes == slot_bytes) used += c.used_bytes;
    }
    return used;
  };
  const uint64_t cold = class_bytes(8192);
  ASSERT_GE(cold, store_->Usage()[0].capacity_bytes * 85 / 100);
  for (uint64_t i = 0; i < 3000; ++i) {
    ASSERT_TRUE(Store(*small, {KeyOf(10000 + i)}).ok()) << i;
    if (i % 64 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the reclaimer runs between
  }
  ASSERT_TRUE(testing::Eventually([&] { return class_bytes(8192) <= cold / 10; }))
      << class_bytes(8192) << " of " << cold << " bytes of never-read 8 KiB blocks are still held";
  EXPECT_GT(stats_.host_segments_reclaimed.Get(), 0u);
  EXPECT_EQ(stats_.store_refused_no_space.Get(), 0u);
}

// ... but a size in use keeps its segments: its blocks are hotter than the
// other size's coldest, so the other size evicts its own.
TEST_F(BlockStoreTest, ASizeInUseKeepsItsSegments) {
  SetUpCache(512);
  auto big = Session(1);
  big->ns.block_bytes = 8192;
  auto small = Session(2);
  const std::vector<BlockKey> hot = Keys(0, 128);  // half the arena
  for (const BlockKey& k : hot) ASSERT_TRUE(Store(*big, {k}).ok());
  for (uint64_t round = 0; round < 100; ++round) {
    for (uint64_t i = 0; i < 16; ++i) ASSERT_TRUE(Store(*small, {KeyOf(10000 + round * 16 + i)}).ok());
    uint64_t lease;
    ASSERT_EQ(Hit(*big, hot, true, &lease), 128u) << "round " << round;
    ASSERT_TRUE(store_->Release(*big, lease).ok());
  }
  EXPECT_EQ(stats_.evictions_for_other_size.Get(), 0u);
  EXPECT_GT(stats_.evictions.Get(), 1000u) << "the 4 KiB blocks churned within their own segments";
}

// A block whose parent is gone can never be hit: whatever the policy, what
// is left of a chain after evictions is a prefix of it. (The cache touches
// and inserts a chain's blocks leaves first.)
TEST_F(BlockStoreTest, EvictionsLeaveEveryChainAPrefix) {
  for (const char* policy : {"lru", "s3fifo", "s3fifo-deep", "tinylfu", "arc", "adaptive", "holds"}) {
    SCOPED_TRACE(policy);
    SetUpCache(12, 1, policy);
    auto s = Session();
    // As engines do: look the chain up (leased), store what missed, release.
    auto serve = [&](const std::vector<BlockKey>& chain) {
      uint64_t lease = 0;
      const uint32_t hit = Hit(*s, chain, true, &lease);
      if (hit < chain.size()) {
        ASSERT_TRUE(Store(*s, std::vector<BlockKey>(chain.begin() + hit, chain.end())).ok());
      }
      if (lease != 0) {
        ASSERT_TRUE(store_->Release(*s, lease).ok());
      }
    };
    std::vector<std::vector<BlockKey>> chains;
    for (uint64_t c = 0; c < 12; ++c) chains.push_back(Keys(100 * c, 3 + c % 5));
    for (int round = 0; round < 30; ++round) {
      serve(chains[(round * 7) % chains.size()]);
      for (const auto& chain : chains) {
        bool gone = false;
        for (size_t i = 0; i < chain.size(); ++i) {
          const bool present = Hit(*s, {chain[i]}) == 1;
          ASSERT_FALSE(gone && present) << "round " << round << ": block " << i << " of chain " << chain[0].bytes[0]
                                        << " outlived its parent";
          gone = gone || !present;
        }
      }
    }
    EXPECT_GT(stats_.evictions.Get(), 0u);
    s.reset();
    store_.reset();
  }
}

// The cache tells the policy where a block sits in its chain (from the
// session's last lookup): with s3fifo-deep a block 12,288 tokens deep skips
// probation and outlives a stream of one-off shallow blocks; plain S3-FIFO
// lets it go first. Without positions both would behave alike.
TEST_F(BlockStoreTest, ThePolicyLearnsHowDeepAStoredBlockIs) {
  for (const char* policy : {"s3fifo", "s3fifo-deep"}) {
    SCOPED_TRACE(policy);
    SetUpCache(50, 1, policy);
    auto s = Session();
    s->ns.block_tokens = 4096;  // depth 3 = 12,288 tokens in
    auto lookup = [&](const std::vector<BlockKey>& chain) {
      uint64_t lease = 0;
      const uint32_t hit = Hit(*s, chain, true, &lease);
      if (lease != 0) {
        EXPECT_TRUE(store_->Release(*s, lease).ok());
      }
      return hit;
    };
    const auto chain = Keys(1000, 4);
    ASSERT_EQ(lookup(chain), 0u);
    ASSERT_TRUE(Store(*s, {chain[3]}).ok());  // the engine stores its last block only
    for (uint64_t i = 0; i < 100; ++i) {
      const std::vector<BlockKey> one = {KeyOf(i)};
      ASSERT_EQ(lookup(one), 0u);
      ASSERT_TRUE(Store(*s, one).ok());
    }
    EXPECT_GE(stats_.evictions.Get(), 50u);
    EXPECT_EQ(Hit(*s, {chain[3]}), std::string(policy) == "s3fifo-deep" ? 1u : 0u);
    s.reset();
    store_.reset();
  }
}

// Above the high watermark a background thread evicts the coldest blocks
// down to the low one; between the two nothing happens (that room is what
// stores use without evicting on their own path).
TEST_F(BlockStoreTest, BackgroundReclaimKeepsRoomBetweenTheWatermarks) {
  SetUpCache(20, 1, "lru", {.high_watermark = 0.8, .low_watermark = 0.5});
  auto s = Session();
  for (uint64_t i = 0; i < 15; ++i) ASSERT_TRUE(Store(*s, {KeyOf(i)}).ok());  // 75%: below the high mark
  std::this_thread::sleep_for(std::chrono::milliseconds(250));                  // two polls of the thread
  EXPECT_EQ(stats_.evictions.Get(), 0u);
  ASSERT_TRUE(Store(*s, Keys(15, 2)).ok());  // 85%
  ASSERT_TRUE(testing::Eventually([&] { return store_->Usage()[0].blocks <= 10; })) << store_->Usage()[0].blocks;
  EXPECT_EQ(store_->Usage()[0].blocks, 10u) << "down to the low mark, not further";
  EXPECT_EQ(stats_.evictions_background.Get(), 7u);
  EXPECT_EQ(stats_.evictions.Get(), 7u);
  for (uint64_t i = 0; i < 7; ++i) EXPECT_EQ(Hit(*s, {KeyOf(i)}), 0u) << "the coldest went: " << i;
  for (uint64_t i = 7; i < 17; ++i) EXPECT_EQ(Hit(*s, {KeyOf(i)}), 1u) << i;
  // Back between the marks: no more background evictions.
  ASSERT_TRUE(Store(*s, Keys(100, 5)).ok());  // 75%
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(stats_.evictions.Get(), 7u);
}

// Pinned blocks stop the reclaimer, not the daemon: it evicts what it may
// and leaves the rest.
TEST_F(BlockStoreTest, BackgroundReclaimSkipsPinnedBlocks) {
  SetUpCache(10, 1, "lru", {.high_watermark = 0.5, .low_watermark = 0.2});
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 4)).ok());
  uint64_t lease;
  ASSERT_EQ(Hit(*s, Keys(0, 4), true, &lease), 4u);
  ASSERT_TRUE(Store(*s, Keys(10, 4)).ok());  // 80%
  ASSERT_TRUE(testing::Eventually([&] { return stats_.evictions_background.Get() == 4; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(stats_.evictions_background.Get(), 4u) << "only the unpinned blocks could go";
  EXPECT_EQ(Hit(*s, Keys(0, 4)), 4u);
  ASSERT_TRUE(store_->Release(*s, lease).ok());
}

// Admission in resident tokens: a tenant over its host_tokens quota evicts
// its own coldest blocks, even with free room in its arena.
TEST_F(BlockStoreTest, AHostTokensQuotaEvictsTheTenantsColdestBlocks) {
  SetUpCache(64, 1, "lru", {}, {.host_tokens = 10 * 16});  // 16-token blocks: 10 of them
  auto s = Session();
  for (uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(Store(*s, {KeyOf(i)}).ok());
  const TenantUsage u = store_->Usage()[0];
  EXPECT_EQ(u.host_tokens, 160u);
  EXPECT_EQ(u.blocks, 10u) << "the arena holds 64; the quota 10";
  EXPECT_EQ(u.quota.host_tokens, 160u);
  EXPECT_EQ(stats_.evictions_for_quota.Get(), 2u);
  EXPECT_EQ(Hit(*s, Keys(0, 2)), 0u);
  EXPECT_EQ(Hit(*s, Keys(2, 10)), 10u);
  // A store larger than the quota is refused, clearly, and nothing is lost.
  absl::Status big = Store(*s, Keys(100, 11));
  EXPECT_EQ(ToErrorCode(big), KVTIER_ENOSPC) << big;
  // Everything pinned: a clear error naming the quota.
  uint64_t lease;
  ASSERT_EQ(Hit(*s, Keys(2, 10), true, &lease), 10u);
  absl::Status pinned = Store(*s, {KeyOf(200)});
  EXPECT_EQ(ToErrorCode(pinned), KVTIER_ENOSPC);
  EXPECT_NE(std::string(pinned.message()).find("host_tokens"), std::string::npos) << pinned.message();
  ASSERT_TRUE(store_->Release(*s, lease).ok());
  // Blocks of more tokens than the whole quota can never be admitted.
  auto wide = Session();
  wide->ns.block_tokens = 200;
  absl::Status over = Store(*wide, {KeyOf(300)});
  EXPECT_EQ(ToErrorCode(over), KVTIER_ENOSPC);
  EXPECT_NE(std::string(over.message()).find("over tenant"), std::string::npos) << over.message();
  EXPECT_EQ(store_->Usage()[0].host_tokens, 160u);
}

// A config reload: new watermarks start the reclaimer that was off, and a
// lowered quota makes the next store evict down to it.
TEST_F(BlockStoreTest, ReloadedWatermarksAndQuotasTakeEffectWhileRunning) {
  SetUpCache(20);  // reclaim off (1 and 1), no quota
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 16)).ok());  // 80%
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_EQ(stats_.evictions_background.Get(), 0u);
  EXPECT_FALSE(store_->SetWatermarks(0.5, 0.6).ok()) << "low above high";
  EXPECT_FALSE(store_->SetWatermarks(1.5, 0.6).ok());
  ASSERT_TRUE(store_->SetWatermarks(0.7, 0.5).ok());
  ASSERT_TRUE(testing::Eventually([&] { return store_->Usage()[0].blocks <= 10; })) << store_->Usage()[0].blocks;
  EXPECT_EQ(stats_.evictions_background.Get(), 6u);
  // Watermarks apply to a token quota too: off again, so that the quota
  // below is what evicts.
  ASSERT_TRUE(store_->SetWatermarks(1.0, 1.0).ok());

  EXPECT_TRUE(absl::IsNotFound(store_->SetQuota("nobody", {})));
  const uint64_t background = stats_.evictions_background.Get();
  ASSERT_TRUE(store_->SetQuota("tenant0", {.host_tokens = 4 * 16}).ok());
  EXPECT_EQ(store_->Usage()[0].quota.host_tokens, 64u);
  ASSERT_TRUE(Store(*s, {KeyOf(100)}).ok());
  EXPECT_EQ(store_->Usage()[0].blocks, 4u) << "the store evicted down to the new quota";
  // The reclaimer (watermarks 1 and 1 apply to the quota too) may take some
  // of those 7 evictions before the store does: together they are 7.
  EXPECT_EQ(stats_.evictions_for_quota.Get() + stats_.evictions_background.Get() - background, 7u);
  ASSERT_TRUE(store_->SetQuota("tenant0", {}).ok());  // lifted
  ASSERT_TRUE(Store(*s, Keys(200, 5)).ok());
  EXPECT_EQ(store_->Usage()[0].blocks, 9u);
}

TEST_F(BlockStoreTest, PinnedBlocksAreNeverEvictedAndAllPinnedIsAClearError) {
  SetUpCache(4);
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 4)).ok());
  uint64_t lease;
  ASSERT_EQ(Hit(*s, Keys(0, 4), true, &lease), 4u);
  EXPECT_EQ(store_->Usage()[0].pinned_blocks, 4u);
  absl::Status full = Store(*s, {KeyOf(50)});
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(ToErrorCode(full), KVTIER_ENOSPC);
  EXPECT_NE(std::string(full.message()).find("pinned by leases"), std::string::npos) << full.message();
  EXPECT_EQ(Hit(*s, Keys(0, 4)), 4u) << "nothing pinned was lost";
  ASSERT_TRUE(store_->Release(*s, lease).ok());
  EXPECT_TRUE(Store(*s, {KeyOf(50)}).ok());
  EXPECT_EQ(stats_.store_refused_no_space.Get(), 1u);
}

TEST_F(BlockStoreTest, StoreIsAllOrNothing) {
  SetUpCache(4);
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 2)).ok());
  uint64_t lease;
  ASSERT_EQ(Hit(*s, Keys(0, 2), true, &lease), 2u);
  // 3 new blocks but only 2 free slots and 2 pinned: refused, nothing kept.
  absl::Status st = Store(*s, Keys(10, 3));
  EXPECT_EQ(ToErrorCode(st), KVTIER_ENOSPC);
  EXPECT_EQ(Hit(*s, Keys(10, 3)), 0u);
  EXPECT_EQ(store_->Usage()[0].blocks, 2u);
}

TEST_F(BlockStoreTest, LoadOnlyWhatTheLeasePins) {
  SetUpCache(16);
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 4)).ok());
  uint64_t lease;
  ASSERT_EQ(Hit(*s, Keys(0, 2), true, &lease), 2u);
  LoadOutcome out = LoadNow(*s, lease, Keys(0, 2));
  ASSERT_TRUE(out.status.ok());
  EXPECT_EQ(out.loaded, 2u);
  EXPECT_EQ(out.locations[0].tier, TierKind::kHost);
  EXPECT_NE(out.locations[0].arena_offset, out.locations[1].arena_offset);
  std::vector<BlockKey> reversed = {KeyOf(1), KeyOf(0)};
  LoadOutcome out2 = LoadNow(*s, lease, reversed);
  EXPECT_EQ(out2.locations[0].arena_offset, out.locations[1].arena_offset);
  EXPECT_EQ(ToErrorCode(LoadNow(*s, lease, Keys(3, 1)).status), KVTIER_EINVAL)
      << "block 3 is cached but not in this lease";
  EXPECT_EQ(ToErrorCode(LoadNow(*s, lease + 100, Keys(0, 1)).status), KVTIER_ENOENT);
  auto other = Session();
  EXPECT_EQ(ToErrorCode(LoadNow(*other, lease, Keys(0, 1)).status), KVTIER_ENOENT)
      << "leases belong to their session";
}

TEST_F(BlockStoreTest, InvalidatedPinnedBlockIsFreedWhenItsLeaseGoes) {
  SetUpCache(8);
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 2)).ok());
  uint64_t lease;
  ASSERT_EQ(Hit(*s, Keys(0, 2), true, &lease), 2u);
  auto n = store_->Invalidate(*s, Keys(0, 2));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(Hit(*s, Keys(0, 2)), 0u) << "invalidated blocks are gone for lookups";
  EXPECT_EQ(store_->Usage()[0].blocks, 2u) << "but their slots stay while pinned";
  EXPECT_EQ(LoadNow(*s, lease, Keys(0, 2)).loaded, 2u) << "the lease still reads them";
  ASSERT_TRUE(store_->Release(*s, lease).ok());
  EXPECT_EQ(store_->Usage()[0].blocks, 0u);
}

TEST_F(BlockStoreTest, InvalidateNamespaceTouchesOnlyThatNamespace) {
  SetUpCache(16);
  auto a = Session(0), b = Session(1);
  ASSERT_TRUE(Store(*a, Keys(0, 3)).ok());
  ASSERT_TRUE(Store(*b, Keys(0, 3)).ok());
  auto n = store_->InvalidateNamespace(*a);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 3u);
  EXPECT_EQ(Hit(*a, Keys(0, 3)), 0u);
  EXPECT_EQ(Hit(*b, Keys(0, 3)), 3u);
}

TEST_F(BlockStoreTest, NamespacesAndTenantsAreIsolated) {
  SetUpCache(16, 2);
  auto a = Session(0, 0), other_ns = Session(1, 0), other_tenant = Session(2, 1);
  ASSERT_TRUE(Store(*a, Keys(0, 4)).ok());
  EXPECT_EQ(Hit(*other_ns, Keys(0, 4)), 0u);
  EXPECT_EQ(Hit(*other_tenant, Keys(0, 4)), 0u);
  auto usage = store_->Usage();
  EXPECT_EQ(usage[0].blocks, 4u);
  EXPECT_EQ(usage[1].blocks, 0u) << "tenant 0's blocks live in tenant 0's arena only";
}

TEST_F(BlockStoreTest, ClosingASessionReleasesItsPinsAndAbortsItsStores) {
  SetUpCache(8);
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 4)).ok());
  uint64_t lease;
  ASSERT_EQ(Hit(*s, Keys(0, 4), true, &lease), 4u);
  std::vector<BlockLocation> out(2);
  uint64_t ticket;
  ASSERT_TRUE(store_->StoreBegin(*s, Keys(20, 2), &ticket, std::span(out)).ok());
  EXPECT_EQ(store_->Usage()[0].pinned_blocks, 4u);
  EXPECT_EQ(store_->Usage()[0].blocks, 6u);
  store_->CloseSession(*s);
  EXPECT_EQ(store_->Usage()[0].pinned_blocks, 0u);
  EXPECT_EQ(store_->Usage()[0].blocks, 4u);
  EXPECT_EQ(s->lease_count.load(), 0u);
  EXPECT_EQ(Hit(*s, Keys(20, 2)), 0u);
  // Everything is evictable again.
  auto t = Session();
  EXPECT_TRUE(Store(*t, Keys(40, 8)).ok());
}

TEST_F(BlockStoreTest, LeaseLimitPerSession) {
  store_ = std::move(BlockStore::Create({.max_leases_per_session = 2}, &stats_)).value();
  ASSERT_TRUE(store_->AddTenant("t", std::move(*HostTier::Create({"t", 1 << 20, false}))).ok());
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 1)).ok());
  uint64_t l1, l2;
  Hit(*s, Keys(0, 1), true, &l1);
  Hit(*s, Keys(0, 1), true, &l2);
  std::vector<BlockLocation> out(1);
  uint64_t l3;
  auto r = store_->Lookup(*s, Keys(0, 1), true, &l3, std::span(out));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ToErrorCode(r.status()), KVTIER_EBUSY);
  EXPECT_FALSE(BlockStore::Create({.policy = "fifo"}, &stats_).ok());
}

TEST_F(BlockStoreTest, HitStatisticsCountTokens) {
  SetUpCache(16);
  auto s = Session();
  ASSERT_TRUE(Store(*s, Keys(0, 2)).ok());
  uint64_t lease;
  Hit(*s, Keys(0, 4), true, &lease);  // 2 of 4 hit
  Hit(*s, Keys(100, 1), true, &lease);
  EXPECT_EQ(stats_.lookups.Get(), 2u);
  EXPECT_EQ(stats_.lookup_hits.Get(), 1u);
  EXPECT_EQ(stats_.blocks_queried.Get(), 5u);
  EXPECT_EQ(stats_.blocks_hit.Get(), 2u);
  EXPECT_EQ(stats_.tokens_hit.Get(), 32u);
  EXPECT_EQ(stats_.tokens_queried.Get(), 80u);
}

}  // namespace
}  // namespace kvtier
