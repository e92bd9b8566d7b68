// SPDX-License-Identifier: Apache-2.0
// The migrator on its own, over a store's books with one tenant (a 64 KiB
// host arena) and one lower lane on an in-memory block tier: host eviction
// demotes or drops, promotion brings a copy back byte-exact into a host
// slot it makes room for, joins a promotion in flight, and treats a copy
// that fails its check (or no host slot) as a miss that leaves nothing
// behind it should not.
#include "store/migrator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <latch>
#include <optional>

#include "tiers/memory_block_tier.h"

namespace kvtier {
namespace {

constexpr uint64_t kBlock = 4096;
constexpr uint32_t kTokens = 16;
constexpr uint32_t kNs = 1;

class MigratorTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(/*with_lane=*/true); }

  void Make(bool with_lane, uint64_t op_latency_ns = 0) {
    migrator_.reset();
    books_ = std::make_unique<StoreBooks>(&stats_, CostTracker::Options{});
    migrator_ = std::make_unique<Migrator>(*books_, Migrator::Options{});
    auto host = HostTier::Create({"migrator-test", 16 * kBlock, false});
    ASSERT_TRUE(host.ok()) << host.status();
    books_->tenants.push_back(
        std::make_unique<HostResidency>("t", TenantHash("t"), std::move(*host), nullptr, TenantQuota{}, "lru",
                                        &books_->index, HostResidency::Room{.evictor = migrator_.get(), .stats = &stats_}));
    books_->tenant_by_hash[books_->tenants[0]->hash] = 0;
    if (with_lane) {
      auto tier = MemoryBlockTier::Create({.capacity_bytes = 8 * kBlock, .op_latency_ns = op_latency_ns});
      ASSERT_TRUE(tier.ok()) << tier.status();
      books_->lanes.push_back(std::make_unique<LowerLane>(0, std::move(*tier), MakeSparseLruPolicy(), 1, 1));
    }
    NamespaceInfo ns;
    ns.handle = kNs;
    ns.id.bytes.fill(0xaa);
    ns.block_bytes = kBlock;
    ns.block_tokens = kTokens;
    books_->RegisterNamespace(ns);
  }
  void TearDown() override {
    for (auto& lane : books_->lanes) lane->tier->Drain();
    migrator_.reset();
  }

  HostResidency& tenant() { return *books_->tenants[0]; }

  // A committed host block whose bytes are `fill`, indexed and in the policy.
  BlockRecord* StoreReady(uint8_t fill) {
    BlockKey key{};
    key.bytes[0] = fill;
    BlockRecord* r = books_->index.NewRecord(kNs, key);
    books_->CountRecords(kNs, +1);
    HostResidency& t = tenant();
    MutexLock l(&t.mu);
    absl::StatusOr<SlotHandle> slot = t.host->Allocate(kBlock);
    EXPECT_TRUE(slot.ok()) << slot.status();
    EXPECT_TRUE(t.slots.Assign(*slot, r, kTokens));
    std::memset(t.host->arena_base() + t.host->ArenaOffset(*slot), fill, kBlock);
    BlockIndex::Shard& sh = books_->index.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->tenant = 0;
    r->host_slot = *slot;
    r->set_arena_offset(t.host->ArenaOffset(*slot));
    r->state = BlockState::kReady;
    books_->index.Insert(sh, r);
    t.PolicyForLocked(kBlock)->InsertWithKey(*slot, PolicyKeyOf(*r));
    return r;
  }

  Migrator::EvictResult Evict(BlockRecord* r) {
    HostResidency& t = tenant();
    MutexLock l(&t.mu);
    return migrator_->EvictHostCopyLocked(t, r, nullptr);
  }

  // Promotes r and waits for the answer.
  bool PromoteAndWait(BlockRecord* r) {
    std::latch done(1);
    bool ok = false;
    migrator_->Promote(tenant(), r, IoPriority::kLoad, [&](bool o) {
      ok = o;
      done.count_down();
    });
    done.wait();
    return ok;
  }

  struct Copy {
    BlockState state;
    LowerState lower_state;
    uint8_t io_refs;
    bool removed;
  };
  Copy Look(const BlockRecord* r) {
    BlockIndex::Shard& sh = books_->index.ShardFor(r);
    MutexLock sl(&sh.mu);
    return {r->state, r->lower_state, r->io_refs, r->removed};
  }
  bool Indexed(uint8_t fill) {
    BlockKey key{};
    key.bytes[0] = fill;
    BlockIndex::Shard& sh = books_->index.ShardFor(kNs, key);
    MutexLock sl(&sh.mu);
    return BlockIndex::Find(sh, kNs, key) != nullptr;
  }
  bool HostBytesAre(const BlockRecord* r, uint8_t fill) {
    const std::byte* p = tenant().host->arena_base() + r->arena_offset();
    for (uint64_t i = 0; i < kBlock; ++i) {
      if (p[i] != std::byte{fill}) return false;
    }
    return true;
  }

  DaemonStats stats_;
  std::unique_ptr<StoreBooks> books_;
  std::unique_ptr<Migrator> migrator_;
};

TEST_F(MigratorTest, AnEvictedBlockIsDemotedAndPromotedBackByteExact) {
  BlockRecord* r = StoreReady(0x5a);
  ASSERT_EQ(Evict(r), Migrator::EvictResult::kEvicted);
  EXPECT_EQ(stats_.demotions.Get(), 1u);
  ASSERT_TRUE(books_->lanes[0]->tier->Sync().ok());
  books_->lanes[0]->tier->Drain();
  Copy c = Look(r);
  EXPECT_EQ(c.state, BlockState::kNone);
  EXPECT_EQ(c.lower_state, LowerState::kReady);
  EXPECT_EQ(c.io_refs, 0u) << "the demotion's reference goes with its write";
  EXPECT_EQ(tenant().host->Usage().used_slots, 0u) << "the host slot is free once the copy is below";
  EXPECT_EQ(books_->lanes[0]->blocks.load(), 1u);

  ASSERT_TRUE(PromoteAndWait(r));
  EXPECT_EQ(tenant().host->Usage().used_slots, 1u) << "the promotion took one host slot";
  c = Look(r);
  EXPECT_EQ(c.state, BlockState::kReady);
  EXPECT_EQ(c.lower_state, LowerState::kReady) << "the lower copy stays: a later eviction only lets go";
  EXPECT_EQ(c.io_refs, 0u);
  EXPECT_TRUE(HostBytesAre(r, 0x5a));
  EXPECT_EQ(stats_.promotions.Get(), 1u);
  {
    MutexLock l(&tenant().mu);
    EXPECT_TRUE(tenant().PolicyForLocked(kBlock)->Contains(r->host_slot)) << "a promoted block is evictable again";
  }
  // With a lower copy, eviction keeps it and frees the host slot at once.
  ASSERT_EQ(Evict(r), Migrator::EvictResult::kEvicted);
  EXPECT_EQ(stats_.evictions_kept_on_nvme.Get(), 1u);
  EXPECT_EQ(stats_.demotions.Get(), 1u) << "not written again";
  ASSERT_TRUE(PromoteAndWait(r));
  EXPECT_TRUE(HostBytesAre(r, 0x5a));
}

TEST_F(MigratorTest, WithoutALowerTierAnEvictedBlockLeavesTheStore) {
  Make(/*with_lane=*/false);
  BlockRecord* r = StoreReady(1);
  ASSERT_EQ(Evict(r), Migrator::EvictResult::kEvicted);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 1u);
  EXPECT_FALSE(Indexed(1));
  EXPECT_EQ(books_->RecordsOf(kNs), 0u) << "an unreferenced dropped record is destroyed";
  EXPECT_EQ(tenant().host->Usage().used_slots, 0u);
}

TEST_F(MigratorTest, APinnedOrBusyBlockIsNotEvicted) {
  BlockRecord* r = StoreReady(2);
  {
    BlockIndex::Shard& sh = books_->index.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->pins = 1;
  }
  EXPECT_EQ(Evict(r), Migrator::EvictResult::kSkipped);
  {
    BlockIndex::Shard& sh = books_->index.ShardFor(r);
    MutexLock sl(&sh.mu);
    r->pins = 0;
    r->io_refs = 1;
  }
  EXPECT_EQ(Evict(r), Migrator::EvictResult::kSkipped);
  EXPECT_EQ(Look(r).state, BlockState::kReady);
  EXPECT_EQ(stats_.demotions.Get(), 0u);
}

TEST_F(MigratorTest, NoHostSlotIsAMissThatKeepsTheLowerCopy) {
  BlockRecord* r = StoreReady(3);
  ASSERT_EQ(Evict(r), Migrator::EvictResult::kEvicted);
  ASSERT_TRUE(books_->lanes[0]->tier->Sync().ok());
  books_->lanes[0]->tier->Drain();
  // Every host slot held by a block pinned by a lease: a promotion finds no
  // room and no victim.
  std::vector<BlockRecord*> held;
  for (uint8_t i = 0; i < 16; ++i) {
    held.push_back(StoreReady(static_cast<uint8_t>(0x80 + i)));
    BlockIndex::Shard& sh = books_->index.ShardFor(held.back());
    MutexLock sl(&sh.mu);
    held.back()->pins = 1;
  }
  ASSERT_EQ(tenant().host->Usage().used_slots, 16u);
  EXPECT_FALSE(PromoteAndWait(r));
  const Copy c = Look(r);
  EXPECT_EQ(c.state, BlockState::kNone);
  EXPECT_EQ(c.lower_state, LowerState::kReady);
  EXPECT_EQ(c.io_refs, 0u) << "the promotion's reference is given back";
  EXPECT_EQ(stats_.promotions_failed.Get(), 1u);
  for (BlockRecord* h : held) EXPECT_EQ(Look(h).state, BlockState::kReady) << "a pinned block stays";
  // One lease let go: its block is evicted for the promotion.
  {
    BlockIndex::Shard& sh = books_->index.ShardFor(held[0]);
    MutexLock sl(&sh.mu);
    held[0]->pins = 0;
  }
  const uint64_t demotions = stats_.demotions.Get();
  ASSERT_TRUE(PromoteAndWait(r));
  EXPECT_TRUE(HostBytesAre(r, 3));
  // The lane has room: the victim is demoted (its record stays), not dropped.
  ASSERT_EQ(stats_.demotions.Get(), demotions + 1) << "the unpinned block made the room";
  EXPECT_NE(Look(held[0]).state, BlockState::kReady);
  EXPECT_EQ(tenant().host->Usage().used_slots, 16u);
  for (BlockRecord* h : held) {
    BlockIndex::Shard& sh = books_->index.ShardFor(h);
    MutexLock sl(&sh.mu);
    h->pins = 0;
  }
}

TEST_F(MigratorTest, ACopyThatFailsItsCheckIsNeverServedAndIsDropped) {
  BlockRecord* r = StoreReady(4);
  ASSERT_EQ(Evict(r), Migrator::EvictResult::kEvicted);
  ASSERT_TRUE(books_->lanes[0]->tier->Sync().ok());
  books_->lanes[0]->tier->Drain();
  // The namespace now says another id: the copy below is stale.
  NamespaceInfo ns = books_->InfoOf(kNs);
  ns.id.bytes.fill(0xbb);
  books_->RegisterNamespace(ns);
  EXPECT_FALSE(PromoteAndWait(r));
  EXPECT_EQ(stats_.promotions_failed.Get(), 1u);
  EXPECT_FALSE(Indexed(4)) << "its only copy failed: the block leaves the store";
  EXPECT_EQ(books_->lanes[0]->blocks.load(), 0u);
  EXPECT_EQ(books_->lanes[0]->tier->Usage().used_slots, 0u) << "the bad copy's slot is freed";
  EXPECT_EQ(tenant().host->Usage().used_slots, 0u) << "and so is the host slot it was read into";
  EXPECT_EQ(books_->RecordsOf(kNs), 0u);
}

TEST_F(MigratorTest, ASecondPromotionOfABlockJoinsTheFirst) {
  Make(/*with_lane=*/true, /*op_latency_ns=*/50'000'000);  // reads take 50 ms
  BlockRecord* r = StoreReady(5);
  ASSERT_EQ(Evict(r), Migrator::EvictResult::kEvicted);
  ASSERT_TRUE(books_->lanes[0]->tier->Sync().ok());
  books_->lanes[0]->tier->Drain();
  std::latch done(2);
  std::atomic<int> ok{0};
  // Held until both are asked: on a loaded machine the second could else
  // come after the first's 50 ms read.
  auto* lower = static_cast<MemoryBlockTier*>(books_->lanes[0]->tier.get());
  lower->Pause();
  for (int i = 0; i < 2; ++i) {
    migrator_->Promote(tenant(), r, IoPriority::kLoad, [&](bool o) {
      ok += o ? 1 : 0;
      done.count_down();
    });
  }
  lower->Resume();
  done.wait();
  EXPECT_EQ(ok.load(), 2);
  EXPECT_EQ(tenant().host->Usage().used_slots, 1u) << "one read, one slot";
  EXPECT_EQ(books_->lanes[0]->tier->BlockStats().reads, 1u);
  EXPECT_TRUE(HostBytesAre(r, 5));
}

}  // namespace
}  // namespace kvtier
