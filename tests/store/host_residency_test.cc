// SPDX-License-Identifier: Apache-2.0
#include "store/host_residency.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "store/block_index.h"
#include "store/stats.h"

namespace kvtier {
namespace {

constexpr uint64_t kArena = 1 << 20;  // segments of 16 KiB: 4 slots of 4 KiB, 2 of 8 KiB

// The store's index: slots are owned by its records.
BlockIndex& Index() {
  static BlockIndex* index = new BlockIndex;
  return *index;
}

// `n` records of distinct keys.
std::vector<BlockRecord*> Records(size_t n) {
  static uint32_t next = 0;
  std::vector<BlockRecord*> out;
  for (size_t i = 0; i < n; ++i) {
    BlockKey k{};
    const uint32_t id = ++next;
    std::memcpy(k.bytes.data(), &id, sizeof(id));
    out.push_back(Index().NewRecord(1, k));
  }
  return out;
}

// Lets each victim's host copy go, as the migrator does when a lower copy
// is kept, and remembers whom HostResidency chose, in order.
class RecordingEvictor final : public HostEvictor {
 public:
  Result EvictHostCopyLocked(HostResidency& t, BlockRecord* r, std::vector<PendingDemotion>* /*deferred*/) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(t.mu) {
    evicted.push_back(r);
    SlotHandle slot;
    {
      BlockIndex::Shard& sh = Index().ShardFor(r);
      MutexLock l(&sh.mu);
      slot = r->host_slot;
      t.LeavePolicyLocked(slot);
      r->host_slot = kNoSlot;
      r->state = BlockState::kNone;
    }
    t.FreeSlotLocked(slot);
    return Result::kEvicted;
  }
  std::vector<BlockRecord*> evicted;
};

RecordingEvictor& Evictor() {
  static RecordingEvictor* e = new RecordingEvictor;
  return *e;
}
DaemonStats& Stats() {
  static DaemonStats* s = new DaemonStats;
  return *s;
}

std::unique_ptr<HostResidency> MakeResidency(TenantQuota quota = {}, const std::string& policy = "lru",
                                             uint64_t arena = kArena) {
  auto host = HostTier::Create({"residency-test", arena, false});
  EXPECT_TRUE(host.ok()) << host.status();
  return std::make_unique<HostResidency>("t", 1, std::move(*host), nullptr, quota, policy, &Index(),
                                         HostResidency::Room{.evictor = &Evictor(), .stats = &Stats()});
}

// A block of `bytes` and `tokens` stored in a new slot, in its size's policy.
SlotHandle Store(HostResidency& r, BlockRecord* owner, uint64_t bytes, uint32_t tokens)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.mu) {
  absl::StatusOr<SlotHandle> slot = r.host->Allocate(bytes);
  EXPECT_TRUE(slot.ok()) << slot.status();
  EXPECT_TRUE(r.slots.Assign(*slot, owner, tokens));
  r.PolicyForLocked(r.host->SlotSizeFor(bytes))->InsertWithKey(*slot, PolicyKeyOf(*owner));
  return *slot;
}

TEST(HostResidencyTest, FullerThanCountsBytesAndTokensLessWhatIsBeingFreed) {
  auto r = MakeResidency({.host_tokens = 100});
  MutexLock l(&r->mu);
  const std::vector<BlockRecord*> b = Records(4);
  for (BlockRecord* rec : b) Store(*r, rec, 4096, 10);
  // 16 KiB of 1 MiB by bytes; 40 of 100 tokens by the quota.
  EXPECT_FALSE(r->FullerThanLocked(0.5));
  EXPECT_TRUE(r->FullerThanLocked(0.3));                      // tokens: 0.4 > 0.3
  EXPECT_FALSE(r->FullerThanLocked(0.3, 0, 20));              // 20 tokens about to go
  EXPECT_TRUE(r->FullerThanLocked(0.01));                     // bytes: 16 KiB > 10.5 KiB
  EXPECT_FALSE(r->FullerThanLocked(0.01, 8192, 40));          // 8 KiB left: under 10.5 KiB
  EXPECT_FALSE(r->FullerThanLocked(0.0, 1 << 30, 1 << 30));   // freeing more than is held: empty
  r->SetQuota({});                                            // no token quota: bytes alone
  EXPECT_FALSE(r->FullerThanLocked(0.3));
  EXPECT_EQ(r->Quota().host_tokens, 0u);
}

TEST(HostResidencyTest, OnePolicyPerSizeAndFreeingLeavesEveryBook) {
  auto r = MakeResidency();
  MutexLock l(&r->mu);
  ChainGuard* small = r->PolicyForLocked(4096);
  EXPECT_EQ(r->PolicyForLocked(4096), small);
  EXPECT_NE(r->PolicyForLocked(8192), small);
  const std::vector<BlockRecord*> ab = Records(2);
  const SlotHandle sa = Store(*r, ab[0], 4096, 16);
  Store(*r, ab[1], 4096, 16);
  EXPECT_EQ(small->size(), 2u);
  r->FreeSlotLocked(sa);
  EXPECT_EQ(small->size(), 1u);
  EXPECT_FALSE(small->Contains(sa));
  EXPECT_EQ(r->slots.owner(sa), nullptr);
  EXPECT_EQ(r->slots.tokens_held(), 16u);
  EXPECT_EQ(r->host->Usage().used_slots, 1u);
}

TEST(HostResidencyTest, PoliciesComeLargestHolderFirstAndEmptyOnesNot) {
  auto r = MakeResidency();
  MutexLock l(&r->mu);
  const std::vector<BlockRecord*> b = Records(4);
  Store(*r, b[0], 8192, 16);  // 8 KiB in the 8 KiB policy
  for (int i = 1; i < 4; ++i) Store(*r, b[i], 4096, 8);  // 12 KiB in the 4 KiB one
  r->PolicyForLocked(65536);  // made, and empty
  std::vector<ChainGuard*> order = r->PoliciesByBytesLocked();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], r->PolicyForLocked(4096));
  EXPECT_EQ(order[1], r->PolicyForLocked(8192));
}

TEST(HostResidencyTest, ColdSegmentsOfOtherSizesComeColdestFirst) {
  auto r = MakeResidency();
  MutexLock l(&r->mu);
  const std::vector<BlockRecord*> b = Records(5);
  // Two segments of 8 KiB slots (two slots each), then one 4 KiB block.
  SlotHandle s[4];
  for (int i = 0; i < 4; ++i) s[i] = Store(*r, b[i], 8192, 16);
  const SlotHandle small = Store(*r, b[4], 4096, 8);
  r->slots.Touch(s[0]);  // the first segment now holds the youngest block
  const std::vector<HostResidency::Segment> segs = r->ColdSegmentsLocked(4096, std::nullopt, 8);
  ASSERT_EQ(segs.size(), 2u);
  std::vector<SlotHandle> first = segs[0].slots, second = segs[1].slots;
  std::sort(first.begin(), first.end());
  std::sort(second.begin(), second.end());
  EXPECT_EQ(first, (std::vector<SlotHandle>{s[2], s[3]}));
  EXPECT_EQ(second, (std::vector<SlotHandle>{s[0], s[1]}));
  EXPECT_GT(segs[0].youngest, segs[1].youngest);
  // At most `max`, and only segments older than min_age.
  EXPECT_EQ(r->ColdSegmentsLocked(4096, std::nullopt, 1).size(), 1u);
  const std::vector<HostResidency::Segment> old = r->ColdSegmentsLocked(4096, segs[1].youngest, 8);
  ASSERT_EQ(old.size(), 1u);
  EXPECT_EQ(old[0].youngest, segs[0].youngest);
  EXPECT_TRUE(r->ColdSegmentsLocked(4096, segs[0].youngest, 8).empty());
  // Seen from the 8 KiB size, only the 4 KiB block's segment.
  const std::vector<HostResidency::Segment> others = r->ColdSegmentsLocked(8192, std::nullopt, 8);
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].slots, (std::vector<SlotHandle>{small}));
}

// A committed block of 4 KiB in a slot AllocateSlotLocked gave, in its policy.
SlotHandle Commit(HostResidency& r, BlockRecord* owner, uint32_t tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r.mu) {
  absl::StatusOr<SlotHandle> slot = r.AllocateSlotLocked(4096, tokens, owner);
  EXPECT_TRUE(slot.ok()) << slot.status();
  if (!slot.ok()) return kNoSlot;
  {
    BlockIndex::Shard& sh = Index().ShardFor(owner);
    MutexLock l(&sh.mu);
    owner->host_slot = *slot;
    owner->state = BlockState::kReady;
  }
  r.PolicyForLocked(4096)->InsertWithKey(*slot, PolicyKeyOf(*owner));
  return *slot;
}

void Pin(BlockRecord* r, uint32_t pins) {
  BlockIndex::Shard& sh = Index().ShardFor(r);
  MutexLock l(&sh.mu);
  r->pins = pins;
}

// Room is the residency's: a full arena gives a slot by choosing the
// policy's coldest block that may go (not a pinned one) and handing it to
// its evictor, and counts the eviction.
TEST(HostResidencyTest, AFullArenaMakesRoomByEvictingItsColdestUnpinnedBlock) {
  constexpr uint64_t kSmall = 64 << 10;  // 16 slots of 4 KiB
  auto r = MakeResidency({}, "lru", kSmall);
  Evictor().evicted.clear();
  const uint64_t evictions_before = Stats().evictions.Get();
  MutexLock l(&r->mu);
  const std::vector<BlockRecord*> b = Records(18);
  for (size_t i = 0; i < 16; ++i) Commit(*r, b[i], 16);
  EXPECT_TRUE(Evictor().evicted.empty()) << "room was there";
  Commit(*r, b[16], 16);
  ASSERT_EQ(Evictor().evicted.size(), 1u);
  EXPECT_EQ(Evictor().evicted[0], b[0]) << "LRU: the first committed goes first";
  Pin(b[1], 1);
  Commit(*r, b[17], 16);
  ASSERT_EQ(Evictor().evicted.size(), 2u);
  EXPECT_EQ(Evictor().evicted[1], b[2]) << "a pinned block is passed over";
  EXPECT_EQ(Stats().evictions.Get() - evictions_before, 2u);
  EXPECT_EQ(r->evictions.load(), 2u);
  Pin(b[1], 0);
}

// Over the token quota it evicts until the block fits; a block larger than
// the quota, or one with every block pinned, is refused with ENOSPC and
// counted, and nothing is evicted for it.
TEST(HostResidencyTest, TheTokenQuotaEvictsAndAFullyPinnedTenantIsRefused) {
  auto r = MakeResidency({.host_tokens = 64});
  Evictor().evicted.clear();
  MutexLock l(&r->mu);
  const std::vector<BlockRecord*> b = Records(6);
  for (size_t i = 0; i < 4; ++i) Commit(*r, b[i], 16);  // 64 of 64 tokens
  Commit(*r, b[4], 32);                                 // two must go
  ASSERT_EQ(Evictor().evicted.size(), 2u);
  EXPECT_EQ(Evictor().evicted[0], b[0]);
  EXPECT_EQ(Evictor().evicted[1], b[1]);
  const uint64_t refused_before = Stats().store_refused_no_space.Get();
  absl::StatusOr<SlotHandle> too_big = r->AllocateSlotLocked(4096, 65, b[5]);
  EXPECT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("host_tokens quota"), std::string::npos) << too_big.status();
  for (size_t i = 2; i < 5; ++i) Pin(b[i], 1);
  absl::StatusOr<SlotHandle> pinned = r->AllocateSlotLocked(4096, 16, b[5]);
  EXPECT_FALSE(pinned.ok());
  EXPECT_NE(pinned.status().message().find("pinned by leases"), std::string::npos) << pinned.status();
  EXPECT_EQ(Evictor().evicted.size(), 2u) << "nothing pinned was evicted";
  EXPECT_EQ(Stats().store_refused_no_space.Get() - refused_before, 2u);
  for (size_t i = 2; i < 5; ++i) Pin(b[i], 0);
}

}  // namespace
}  // namespace kvtier
