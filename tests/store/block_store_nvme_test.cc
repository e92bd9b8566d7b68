// SPDX-License-Identifier: Apache-2.0
// The block store with a real NVMe tier: demotion on host eviction, promotion
// on load and prefetch, durable commits, NVMe eviction, recovery, and what a
// bad NVMe copy does (a miss, never wrong bytes).
#include <future>
#include <random>
#include <thread>

#include "core/status.h"
#include "core/units.h"
#include "store/block_store.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"
#include "tiers/fault_injection.h"
#include "tiers/memory_block_tier.h"
#include "tiers/nvme_tier.h"

namespace kvtier {
namespace {

using testing::KeyOf;

constexpr uint64_t kBlock = 16 << 10;

class BlockStoreNvmeTest : public ::testing::Test {
 protected:
  // host_blocks host slots; an NVMe tier of 4 segments of 1 MiB (~200 slots of 16 KiB + header each).
  void Open(uint64_t host_blocks, const std::vector<std::string>& tenants = {"t"}, bool write_through = false,
            const std::vector<TenantQuota>& quotas = {}, double high_watermark = 1.0, double low_watermark = 1.0,
            const std::string& nvme_policy = "lru") {
    store_.reset();
    store_ = std::move(BlockStore::Create({.policy = host_policy_,
                                           .nvme_policy = nvme_policy,
                                           .write_through = write_through,
                                           .cost = cost_,
                                           .high_watermark = high_watermark,
                                           .low_watermark = low_watermark,
                                           .cascade_high = cascade_high_,
                                           .shared_probe_blocks_per_s = shared_probe_blocks_per_s_,
                                           .shared_records_per_tenant = shared_records_per_tenant_,
                                           .shared_min_block_bytes = shared_min_block_bytes_,
                                           .nvme_admission_min_uses = nvme_admit_,
                                           .shared_admission_min_uses = shared_admit_,
                                           .admission_history_uses = 1 << 16},
                                          &stats_))
                 .value();
    for (size_t i = 0; i < tenants.size(); ++i) {
      ASSERT_TRUE(store_
                      ->AddTenant(tenants[i], std::move(*HostTier::Create({"t", host_blocks * kBlock, false})),
                                  i < quotas.size() ? quotas[i] : TenantQuota{})
                      .ok());
    }
    if (lower_ == "memory" || lower_ == "shared") {
      // The same place in the store, taken by another kind of block tier
      // ("shared": one that stands for a tier other nodes write too).
      auto mem = MemoryBlockTier::Create({.capacity_bytes = 4 << 20,
                                          .max_block_bytes = 1 << 20,
                                          .op_latency_ns = memory_latency_ns_,
                                          .shared = lower_ == "shared"});
      ASSERT_TRUE(mem.ok()) << mem.status();
      memory_ = mem->get();
      auto n = store_->AttachLowerTier(std::move(*mem), {}, &namespaces_);
      ASSERT_TRUE(n.ok());
      if (second_shared_) {
        // A second shared tier below the first (a cluster, then a directory).
        auto more = MemoryBlockTier::Create(
            {.capacity_bytes = 4 << 20, .max_block_bytes = 1 << 20, .name = "shared2", .shared = true});
        ASSERT_TRUE(more.ok()) << more.status();
        memory2_ = more->get();
        ASSERT_TRUE(store_->AttachLowerTier(std::move(*more), {}, &namespaces_).ok());
      }
      store_->StartBackgroundReclaim();
      return;
    }
    NvmeTierOptions o;
    o.dirs = {dir_.File("nvme")};
    o.capacity_bytes = 4 << 20;
    o.segment_bytes = 1 << 20;
    o.staging_bytes = staging_bytes_;
    o.wrap_engine = [this](std::unique_ptr<IoEngine> e) { return MakeFaultInjectingEngine(std::move(e), faults_); };
    std::vector<RecoveredBlock> rec;
    auto nvme = NvmeTier::Open(o, &rec);
    ASSERT_TRUE(nvme.ok()) << nvme.status();
    recovered_ = rec.size();
    auto n = store_->AttachLowerTier(std::move(*nvme), rec, &namespaces_);
    ASSERT_TRUE(n.ok());
    indexed_ = *n;
    if (below_) {
      // A tier below NVMe: one more link in the chain, and nothing else.
      auto mem = MemoryBlockTier::Create(
          {.capacity_bytes = 8 << 20, .max_block_bytes = 1 << 20, .op_latency_ns = memory_latency_ns_,
           .shared = below_shared_});
      ASSERT_TRUE(mem.ok()) << mem.status();
      memory_ = mem->get();
      ASSERT_TRUE(store_->AttachLowerTier(std::move(*mem), {}, &namespaces_).ok());
    }
    store_->StartBackgroundReclaim();
  }
  std::unique_ptr<SessionHoldings> Session(uint16_t tenant = 0) {
    auto s = std::make_unique<SessionHoldings>();
    NamespaceDescriptor d = testing::TestNamespace(kBlock);
    s->ns = std::move(namespaces_.Register(ComputeNamespaceId(d, store_->tenant_name(tenant), ""), tenant, d)).value();
    store_->RegisterNamespace(s->ns);
    return s;
  }
  // Another node's values of keys [from, from+n) for s's tenant "t" and
  // namespace, written into a shared tier by key; returns their metas.
  std::vector<BlockMeta> Plant(MemoryBlockTier& tier, const SessionHoldings& s, uint64_t from, uint64_t n) {
    std::vector<BlockMeta> metas;
    for (uint64_t i = from; i < from + n; ++i) {
      const BlockMeta meta{.ns = s.ns.id, .key = KeyOf(i), .payload_bytes = kBlock, .tenant_hash = TenantHash("t"),
                           .block_tokens = s.ns.block_tokens};
      std::vector<std::byte> bytes(kBlock);
      testing::FillFromKey(meta.key, bytes);
      std::promise<absl::Status> wrote;
      tier.Put(kKeyAddressed, meta, bytes, IoPriority::kDemote, [&](absl::Status st) { wrote.set_value(st); });
      EXPECT_TRUE(wrote.get_future().get().ok());
      metas.push_back(meta);
    }
    return metas;
  }
  // Stores keys [from, from+n) with payloads derived from the keys.
  void Store(SessionHoldings& s, uint64_t from, uint64_t n, bool durable = false) {
    std::vector<BlockKey> keys;
    for (uint64_t i = from; i < from + n; ++i) keys.push_back(KeyOf(i));
    std::vector<BlockLocation> out(keys.size());
    uint64_t ticket;
    auto need = store_->StoreBegin(s, keys, &ticket, std::span(out));
    ASSERT_TRUE(need.ok()) << need.status();
    HostTier* host = store_->host_tier(s.ns.tenant);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (out[i].needed) testing::FillFromKey(keys[i], {host->arena_base() + out[i].arena_offset, kBlock});
    }
    std::promise<absl::Status> p;
    store_->StoreCommit(s, ticket, durable, [&](absl::Status st) { p.set_value(st); });
    const absl::Status committed = p.get_future().get();
    ASSERT_TRUE(committed.ok()) << committed;
  }
  // Leased lookup + load; returns how many blocks loaded with the right bytes.
  uint32_t LoadVerified(SessionHoldings& s, uint64_t from, uint64_t n, std::vector<TierKind>* tiers = nullptr,
                        uint32_t* hit_out = nullptr, BlockStore::Ask ask = BlockStore::Ask::kIfLeased) {
    std::vector<BlockKey> keys;
    for (uint64_t i = from; i < from + n; ++i) keys.push_back(KeyOf(i));
    std::vector<BlockLocation> out(keys.size());
    uint64_t lease;
    auto hit = store_->Lookup(s, keys, true, &lease, std::span(out), nullptr, nullptr, ask);
    EXPECT_TRUE(hit.ok());
    if (hit_out) *hit_out = *hit;
    if (tiers) {
      tiers->clear();
      for (uint32_t i = 0; i < *hit; ++i) tiers->push_back(out[i].tier);
    }
    if (*hit == 0) return 0;
    std::promise<LoadOutcome> p;
    std::optional<LoadOutcome> now =
        store_->Load(s, lease, std::span(keys).first(*hit), [&](LoadOutcome o) { p.set_value(std::move(o)); });
    LoadOutcome o = now ? std::move(*now) : p.get_future().get();
    uint32_t good = 0;
    HostTier* host = store_->host_tier(s.ns.tenant);
    for (uint32_t i = 0; i < o.loaded; ++i) {
      good += testing::MatchesKey(keys[i], {host->arena_base() + o.locations[i].arena_offset, kBlock});
    }
    EXPECT_EQ(good, o.loaded) << "a loaded block had wrong bytes";
    EXPECT_TRUE(store_->Release(s, lease).ok());
    return o.loaded;
  }
  NvmeTier* Nvme() const {
    auto* nvme = dynamic_cast<NvmeTier*>(store_->lower_tier());
    EXPECT_NE(nvme, nullptr) << "this test needs the NVMe tier below host memory";
    return nvme;
  }
  void SyncNvme() { ASSERT_TRUE(store_->lower_tier()->Sync().ok()); }
  // How many of keys [from, from+n) have an NVMe copy (probes: change nothing).
  uint32_t OnNvme(SessionHoldings& s, uint64_t from, uint64_t n) {
    uint32_t count = 0;
    for (uint64_t k = from; k < from + n; ++k) {
      std::vector<BlockKey> key{KeyOf(k)};
      std::vector<BlockLocation> out(1);
      uint64_t lease;
      auto hit = store_->Lookup(s, key, false, &lease, std::span(out));
      count += hit.ok() && *hit == 1 && out[0].tier == TierKind::kNvme;
    }
    return count;
  }
  // Pins keys [from, from+n) (all present) with leased lookups of 4 keys each;
  // returns the leases.
  std::vector<uint64_t> Pin(SessionHoldings& s, uint64_t from, uint64_t n) {
    std::vector<uint64_t> leases;
    for (uint64_t k = from; k < from + n; k += 4) {
      std::vector<BlockKey> keys;
      for (uint64_t i = k; i < std::min(k + 4, from + n); ++i) keys.push_back(KeyOf(i));
      std::vector<BlockLocation> out(keys.size());
      uint64_t lease = 0;
      auto hit = store_->Lookup(s, keys, true, &lease, std::span(out));
      EXPECT_TRUE(hit.ok() && *hit == keys.size()) << k;
      if (lease != 0) leases.push_back(lease);
    }
    return leases;
  }
  void Unpin(SessionHoldings& s, const std::vector<uint64_t>& leases) {
    for (uint64_t l : leases) EXPECT_TRUE(store_->Release(s, l).ok());
  }

  // Stores keys [0, n) 4 at a time, letting the cascade keep NVMe at or
  // under its high mark after each store (stores do not wait for it; a tier
  // that fills faster than it drains evicts, which the tests count).
  void FillChain(SessionHoldings& s, uint64_t n) {
    BlockTier* nvme = store_->lower_tier(0);
    for (uint64_t k = 0; k < n; k += 4) {
      Store(s, k, 4);
      ASSERT_TRUE(nvme->Sync().ok());
      ASSERT_TRUE(testing::Eventually([&] {
        const TierUsage u = nvme->Usage();
        return double(u.used_bytes) <= 0.9 * double(u.capacity_bytes) && store_->cascade_settled();
      })) << k;
    }
  }

  testing::TempDir dir_;
  CostTracker::Options cost_;  // for the next Open
  DaemonStats stats_;
  NamespaceRegistry namespaces_;
  std::shared_ptr<IoFaults> faults_ = std::make_shared<IoFaults>();
  std::unique_ptr<BlockStore> store_;
  uint64_t recovered_ = 0, indexed_ = 0;
  std::string host_policy_ = "lru";       // the host tier's policy at the next Open
  std::string lower_ = "nvme";            // the block tier the next Open attaches: "nvme", "memory" or "shared"
  MemoryBlockTier* memory_ = nullptr;     // when lower_ is "memory", or below_
  bool below_ = false;                    // the next Open attaches a memory tier below NVMe
  bool below_shared_ = false;             // ... standing for a shared tier
  bool second_shared_ = false;            // lower_ "shared" gets a second shared tier below it
  MemoryBlockTier* memory2_ = nullptr;    // ... this one
  uint64_t memory_latency_ns_ = 0;        // the "memory"/"shared" tier's op latency (and below_'s)
  // The shared tier's fair shares (BlockStore::Options).
  uint32_t shared_probe_blocks_per_s_ = 50000;
  uint32_t shared_records_per_tenant_ = 262144;
  uint64_t shared_min_block_bytes_ = 4096;
  double cascade_high_ = 0.9;  // above 1: no cascade
  uint64_t staging_bytes_ = 4 << 20;  // the NVMe tier's staging memory
  // The admission gates (BlockStore::Options): 1, every block.
  uint32_t nvme_admit_ = 1, shared_admit_ = 1;
};

// The NVMe tier is shared; a tenant's nvme_bytes quota bounds its share.
// Over it, the tenant's own coldest NVMe blocks make room, never another
// tenant's; a quota smaller than one block refuses its demotions (dropped).
TEST_F(BlockStoreNvmeTest, NvmeQuotasBoundEachTenantsShare) {
  Open(4, {"a", "b", "c"}, false, {{.nvme_bytes = 8 * kBlock}, {}, {.nvme_bytes = kBlock / 2}});
  auto a = Session(0), b = Session(1), c = Session(2);
  for (uint64_t i = 0; i < 3; ++i) Store(*b, 1000 + 4 * i, 4);  // b: 8 demoted, no quota
  for (uint64_t i = 0; i < 5; ++i) {
    Store(*a, 100 + 4 * i, 4);  // a: 16 demoted through a quota of 8
    SyncNvme();                 // (a block still being written may not be evicted)
  }
  Store(*c, 2000, 4);
  Store(*c, 2004, 4);  // c: 4 evictions, none may be demoted
  SyncNvme();
  const std::vector<TenantUsage> u = store_->Usage();
  EXPECT_EQ(u[0].nvme_bytes, 8 * kBlock);
  EXPECT_EQ(u[0].quota.nvme_bytes, 8 * kBlock);
  EXPECT_EQ(u[1].nvme_bytes, 8 * kBlock);
  EXPECT_EQ(u[2].nvme_bytes, 0u);
  EXPECT_EQ(u[0].nvme_tokens, 8u * a->ns.block_tokens);
  EXPECT_EQ(stats_.nvme_evictions_for_quota.Get(), 8u);
  EXPECT_EQ(stats_.nvme_evictions.Get(), 8u) << "the tier itself had room";
  EXPECT_EQ(stats_.demotions_refused_quota.Get(), 4u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 4u);
  EXPECT_EQ(stats_.dropped_no_room.Get(), 4u) << "each drop counted by its reason";
  // b lost nothing to a's pressure; a keeps its 8 most recent demotions.
  EXPECT_EQ(OnNvme(*a, 100, 8), 0u) << "a's coldest went to keep it within its quota";
  EXPECT_EQ(OnNvme(*a, 108, 8), 8u);
  EXPECT_EQ(OnNvme(*c, 2000, 4), 0u);
  // (Loads promote into 4 host slots: 4 at a time.) b's bytes are intact.
  EXPECT_EQ(LoadVerified(*b, 1000, 4), 4u);
  EXPECT_EQ(LoadVerified(*b, 1004, 4), 4u);
}

// Without NVMe quotas, each tenant's fair share of the shared tier (its
// capacity divided equally among the configured tenants: here 2 MiB, 102.4
// slots of 16 KiB + header) is protected: another tenant may not evict its
// blocks below it. Tenant a floods the tier several times over, with some of
// its blocks pinned; b, well under its share, keeps every block, and a's own
// older blocks are what goes.
TEST_F(BlockStoreNvmeTest, AFloodingTenantCannotEvictAnotherBelowItsFairShare) {
  Open(4, {"a", "b"});
  auto a = Session(0), b = Session(1);
  // b: 40 blocks on NVMe (36 demoted by its own stores, the last 4 written by
  // a durable commit, so reloading them later demotes nothing).
  for (uint64_t i = 0; i < 10; ++i) {
    Store(*b, 1000 + 4 * i, 4, /*durable=*/i == 9);
    SyncNvme();
  }
  ASSERT_EQ(store_->Usage()[1].nvme_bytes, 40 * kBlock);
  // a: 600 blocks through a 4-block host tier (the 204-slot tier three times
  // over), 100..107 pinned on NVMe all along.
  std::vector<uint64_t> pins;
  for (uint64_t i = 0; i < 150; ++i) {
    Store(*a, 100 + 4 * i, 4);
    SyncNvme();  // (a block still being written may not be evicted)
    if (i == 2) pins = Pin(*a, 100, 8);
  }
  EXPECT_GT(stats_.nvme_evictions.Get(), 300u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(stats_.demotions_refused_fair_share.Get(), 0u);
  EXPECT_EQ(OnNvme(*b, 1000, 36), 36u) << "b is under its fair share: a may not evict it";
  EXPECT_EQ(store_->Usage()[1].nvme_bytes, 40 * kBlock);
  EXPECT_EQ(store_->Usage()[0].nvme_bytes, 164 * kBlock) << "a has the rest of the tier";
  EXPECT_EQ(OnNvme(*a, 100, 8), 8u) << "pinned";
  EXPECT_EQ(OnNvme(*a, 108, 400), 0u) << "a's own older blocks made room";
  EXPECT_EQ(OnNvme(*a, 540, 156), 156u) << "a's newest demotions";
  Unpin(*a, pins);
  // b's blocks come back with their own bytes (4 at a time: b's host tier).
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(LoadVerified(*b, 1000 + 4 * i, 4), 4u) << i;
  EXPECT_EQ(LoadVerified(*a, 100, 4), 4u);
}

// A tenant over its fair share is not protected beyond it: b filled most of
// the tier while a was idle; a's demotions then take b's coldest blocks, but
// only down to b's share (2 MiB of slots: 103 blocks of 20 KiB), then a's own.
TEST_F(BlockStoreNvmeTest, ATenantOverItsFairShareIsEvictedDownToIt) {
  Open(4, {"a", "b"});
  auto a = Session(0), b = Session(1);
  for (uint64_t i = 0; i < 45; ++i) {
    Store(*b, 1000 + 4 * i, 4, /*durable=*/i == 44);
    SyncNvme();
  }
  ASSERT_EQ(store_->Usage()[1].nvme_bytes, 180 * kBlock);
  for (uint64_t i = 0; i < 100; ++i) {
    Store(*a, 100 + 4 * i, 4);
    SyncNvme();
  }
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(store_->Usage()[1].nvme_bytes, 103 * kBlock) << "b's fair share, and not a block less";
  // b's 77 coldest went (the four of one store land in any order).
  EXPECT_EQ(OnNvme(*b, 1000, 76), 0u);
  EXPECT_EQ(OnNvme(*b, 1076, 4), 3u);
  EXPECT_EQ(OnNvme(*b, 1080, 96), 96u);  // (1176..1179 are in host memory too)
  EXPECT_EQ(store_->Usage()[0].nvme_bytes, 101 * kBlock);
  for (uint64_t i = 0; i < 25; ++i) EXPECT_EQ(LoadVerified(*b, 1080 + 4 * i, 4), 4u) << i;
}

// Fair shares protect; they reserve nothing: a tenant alone on the tier (b
// stores nothing) may fill all of it.
TEST_F(BlockStoreNvmeTest, ATenantAloneMayUseTheWholeNvmeTier) {
  Open(4, {"a", "b"});
  auto a = Session(0);
  for (uint64_t i = 0; i < 75; ++i) {
    Store(*a, 4 * i, 4);
    SyncNvme();
  }
  EXPECT_EQ(store_->lower_tier()->Usage().used_slots, 204u);
  EXPECT_EQ(store_->Usage()[0].nvme_bytes, 204 * kBlock);
  EXPECT_GT(stats_.nvme_evictions.Get(), 0u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(stats_.demotions_refused_fair_share.Get(), 0u);
  EXPECT_EQ(OnNvme(*a, 92, 204), 204u) << "a's 204 newest demotions";
  EXPECT_EQ(LoadVerified(*a, 92, 4), 4u);
}

// A tenant within its share that needs room on a full tier takes it from a
// tenant over its share before it gives up its own blocks: b flooded the
// tier after a demoted 40 blocks; a's next 40 demotions cost b 40 blocks
// and a none (before, the tier's coldest went: a's own first 40).
TEST_F(BlockStoreNvmeTest, ATenantWithinItsShareTakesRoomFromOneOverItsShareFirst) {
  Open(4, {"a", "b"});
  auto a = Session(0), b = Session(1);
  for (uint64_t i = 0; i < 11; ++i) {
    Store(*a, 100 + 4 * i, 4);  // 40 demoted, 4 left in host memory
    SyncNvme();
  }
  for (uint64_t i = 0; i < 75; ++i) {
    Store(*b, 1000 + 4 * i, 4);
    SyncNvme();
  }
  ASSERT_EQ(store_->lower_tier()->Usage().used_slots, 204u);
  ASSERT_EQ(store_->Usage()[0].nvme_bytes, 40 * kBlock);
  for (uint64_t i = 0; i < 10; ++i) {
    Store(*a, 500 + 4 * i, 4);  // 40 more demoted (the 4 kept in host memory first)
    SyncNvme();
  }
  EXPECT_EQ(store_->Usage()[0].nvme_bytes, 80 * kBlock);
  EXPECT_EQ(OnNvme(*a, 100, 40), 40u) << "a kept its own older blocks";
  EXPECT_EQ(store_->Usage()[1].nvme_bytes, (204 - 80) * kBlock) << "b, over its share, made the room";
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(LoadVerified(*a, 100 + 4 * i, 4), 4u) << i;
}

// The cost model's lock-out, end to end. A slow device (50 ms a read) makes
// NVMe lose every decision: recomputing one of these blocks takes ~21 ms, so
// lookups report NVMe blocks as cheaper to recompute and nothing is read from
// the tier any more. Before, the estimate then never changed again. Now,
// while decisions go against NVMe without reads, calibration reads keep
// timing the device, and once it is fast again its blocks are loaded again.
TEST_F(BlockStoreNvmeTest, ANvmeTierJudgedSlowIsUsedAgainOnceItRecovers) {
  ModelProfile tiny;  // 1 KiB of KV a token: this test's 16-token blocks of 16 KiB
  tiny.name = "tiny";
  tiny.layers = 1;
  tiny.hidden = 256;
  tiny.heads = 2;
  tiny.kv_heads = 2;
  tiny.head_dim = 128;
  tiny.intermediate = 512;
  cost_ = CostTracker::Options{.model = tiny, .prior_flops_per_s = 1e9};  // 21 MFLOP a block: ~21 ms
  Open(4);
  auto s = Session();
  for (uint64_t i = 0; i < 20; i += 4) Store(*s, i, 4);  // 0..15 on NVMe only, 16..19 in host memory
  SyncNvme();
  ASSERT_EQ(OnNvme(*s, 8, 8), 8u) << "the fast prior: NVMe blocks are worth loading";
  faults_->delay_us = 50000;
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(LoadVerified(*s, i, 1), 1u) << i;  // measured: 50 ms a read
  EXPECT_EQ(OnNvme(*s, 8, 8), 0u) << "slow: every NVMe block is cheaper to recompute";
  EXPECT_EQ(LoadVerified(*s, 8, 1), 0u);
  EXPECT_GT(stats_.blocks_recompute.Get(), 0u) << "a leased lookup reports it as recompute";
  // Evictions the model would drop: one in 32 is demoted anyway, so the tier
  // keeps blocks to be measured on. (A store after a leased lookup of its
  // chain knows each block's depth: only those are priced.)
  for (uint64_t c = 0; c < 40; ++c) {
    EXPECT_EQ(LoadVerified(*s, 1000 + 4 * c, 4), 0u);
    Store(*s, 1000 + 4 * c, 4);
  }
  const uint64_t dropped = stats_.evictions_dropped_by_cost.Get(), kept = stats_.demotions_for_calibration.Get();
  EXPECT_GT(dropped, 100u);
  EXPECT_GE(kept, 1u);
  EXPECT_LE(kept, (dropped + kept) / 32 + 1);
  faults_->delay_us = 0;  // the device recovers; nothing reads from it by itself
  int rounds = 0;
  for (; rounds < 40 && OnNvme(*s, 8, 1) == 0; ++rounds) {
    // The daemon's loop, a quiet 2 s later each time.
    store_->CalibrateNvme(MonotonicNanos() + 3'000'000'000ull);
    const uint64_t want = Nvme()->Stats().calibration_reads;
    for (int i = 0; i < 200 && Nvme()->Stats().reads < 8 + want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the observer runs after the engine counts the read
  }
  EXPECT_LT(rounds, 40) << "NVMe never trusted again";
  EXPECT_GT(Nvme()->Stats().calibration_reads, 0u);
  EXPECT_EQ(LoadVerified(*s, 8, 8), 4u) << "loaded from NVMe again (4 at a time: the host tier)";
}

// A tenant's leases pin its NVMe-only blocks up to its fair share of the
// tier, no further: a pinned block cannot be evicted, and a tenant that
// pinned everything it had on NVMe (once: 164 blocks of a 204-slot tier)
// left its own demotions, and any other tenant's, nothing to evict. Past
// its share a leased lookup's hit stops (the engine recomputes the rest),
// and the tenant's own unpinned blocks make room for its demotions.
TEST_F(BlockStoreNvmeTest, ATenantPinsAtMostItsFairShareOfNvme) {
  Open(4, {"a", "b"});
  auto a = Session(0), b = Session(1);
  for (uint64_t i = 0; i < 10; ++i) {
    Store(*b, 1000 + 4 * i, 4, /*durable=*/i == 9);
    SyncNvme();
  }
  for (uint64_t i = 0; i < 42; ++i) {  // 164 demoted: the tier is full
    Store(*a, 100 + 4 * i, 4);
    SyncNvme();
  }
  ASSERT_EQ(store_->lower_tier()->Usage().used_slots, 204u);
  ASSERT_EQ(stats_.nvme_evictions.Get(), 0u);
  std::vector<uint64_t> leases;
  uint64_t pinned = 0;
  for (uint64_t k = 100; k < 264; k += 4) {
    std::vector<BlockKey> keys{KeyOf(k), KeyOf(k + 1), KeyOf(k + 2), KeyOf(k + 3)};
    std::vector<BlockLocation> out(keys.size());
    uint64_t lease = 0;
    auto hit = store_->Lookup(*a, keys, true, &lease, std::span(out));
    ASSERT_TRUE(hit.ok());
    pinned += *hit;
    if (lease != 0) leases.push_back(lease);
  }
  const uint64_t share_blocks = store_->lower_tier()->Usage().capacity_bytes / 2 / SlotBytesFor(kBlock);
  EXPECT_LE(pinned, share_blocks) << "no more than a's fair share pinned";
  EXPECT_GE(pinned, share_blocks - 4);
  EXPECT_GT(stats_.pins_refused_fair_share.Get(), 0u);
  Store(*a, 300, 4);  // evicts a's 4 host blocks: a's own unpinned NVMe blocks make room
  SyncNvme();
  EXPECT_EQ(stats_.demotions_refused_fair_share.Get(), 0u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(OnNvme(*b, 1000, 36), 36u) << "b's blocks, within its share, stay";
  EXPECT_EQ(OnNvme(*a, 264, 4), 4u) << "a's demotions (its 4 host blocks) landed";
  Unpin(*a, leases);
  // Released leases give the pinned bytes back: a pins again.
  std::vector<BlockLocation> out(1);
  uint64_t lease = 0;
  std::vector<BlockKey> one{KeyOf(300)};
  ASSERT_TRUE(store_->Lookup(*a, one, true, &lease, std::span(out)).ok());
  EXPECT_NE(lease, 0u);
  ASSERT_TRUE(store_->Release(*a, lease).ok());
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(LoadVerified(*b, 1000 + 4 * i, 4), 4u) << i;
}

// The case that once dropped 31 of another tenant's 150 new blocks: a
// fills NVMe and pins all it may; b, within its share, then demotes 146
// blocks. Each finds room (a's unpinned blocks over its share, then b's
// own oldest): none is dropped.
TEST_F(BlockStoreNvmeTest, AnotherTenantsPinsCannotMakeATenantWithinItsShareDropBlocks) {
  Open(4, {"a", "b"});
  auto a = Session(0), b = Session(1);
  for (uint64_t i = 0; i < 52; ++i) {  // a alone fills the tier (it may, while alone)
    Store(*a, 100 + 4 * i, 4);
    SyncNvme();
  }
  std::vector<uint64_t> leases;
  for (uint64_t k = 100; k < 308; k += 4) {
    std::vector<BlockKey> keys{KeyOf(k), KeyOf(k + 1), KeyOf(k + 2), KeyOf(k + 3)};
    std::vector<BlockLocation> out(keys.size());
    uint64_t lease = 0;
    ASSERT_TRUE(store_->Lookup(*a, keys, true, &lease, std::span(out)).ok());
    if (lease != 0) leases.push_back(lease);
  }
  const uint64_t dropped_before = stats_.evictions_dropped.Get();
  for (uint64_t i = 0; i < 38; ++i) {  // 152 blocks of b's through its 4-block host tier
    Store(*b, 5000 + 4 * i, 4);
    SyncNvme();
  }
  EXPECT_EQ(stats_.evictions_dropped.Get(), dropped_before) << "none of b's demotions was dropped";
  EXPECT_EQ(stats_.demotions_refused_fair_share.Get(), 0u);
  EXPECT_GE(OnNvme(*b, 5000 + 152 - 40, 36), 36u) << "b's newest demotions are on NVMe";
  Unpin(*a, leases);
}

// The background reclaimer demotes (its copies run outside the tier lock);
// what it demoted loads back with its own bytes, and a store that finds the
// tier full while demotions are in flight waits for them instead of
// evicting something else.
TEST_F(BlockStoreNvmeTest, BackgroundReclaimDemotesAndTheBytesComeBack) {
  Open(10, {"t"}, false, {}, 0.7, 0.4);
  auto s = Session();
  Store(*s, 0, 4);
  Store(*s, 4, 4);  // 80%: the reclaimer takes the 4 coldest down to 40%
  // Victims are counted when chosen; their slots go once their demotion
  // copies are done (outside the lock), so wait for both (a CI run under
  // ASan once looked in between).
  testing::Eventually([&] { return stats_.evictions_background.Get() >= 4 && store_->Usage()[0].blocks <= 4; });
  SyncNvme();
  EXPECT_EQ(stats_.evictions_background.Get(), 4u);
  EXPECT_EQ(stats_.demotions.Get(), 4u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(store_->Usage()[0].blocks, 4u);
  std::vector<TierKind> tiers;
  EXPECT_EQ(LoadVerified(*s, 0, 4, &tiers), 4u);
  EXPECT_EQ(tiers, std::vector<TierKind>(4, TierKind::kNvme));
  // Fill it to the brim in one go, repeatedly: stores and the reclaimer race.
  for (uint64_t i = 0; i < 20; ++i) Store(*s, 100 + 5 * i, 5);
  testing::Eventually([&] { return store_->Usage()[0].blocks <= 7; });
  SyncNvme();
  EXPECT_LE(store_->Usage()[0].blocks, 7u) << "at or below the high mark once stores stop";
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u) << "every eviction was demoted";
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(LoadVerified(*s, 100 + 5 * i, 5), 5u) << i;
}

TEST_F(BlockStoreNvmeTest, HostEvictionDemotesAndLoadsPromoteBack) {
  Open(4);
  auto s = Session();
  Store(*s, 0, 4);
  Store(*s, 4, 4);  // evicts 0..3 from host: demoted, not dropped
  SyncNvme();
  EXPECT_EQ(stats_.demotions.Get(), 4u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(store_->nvme_blocks(), 4u);
  std::vector<TierKind> tiers;
  uint32_t hit = 0;
  EXPECT_EQ(LoadVerified(*s, 0, 4, &tiers, &hit), 4u);
  EXPECT_EQ(hit, 4u);
  EXPECT_EQ(tiers, std::vector<TierKind>(4, TierKind::kNvme));
  EXPECT_EQ(stats_.promotions.Get(), 4u);
  // The promoted blocks are back in host memory (and still on NVMe).
  EXPECT_EQ(LoadVerified(*s, 0, 4, &tiers), 4u);
  EXPECT_EQ(tiers, std::vector<TierKind>(4, TierKind::kHost));
  EXPECT_EQ(stats_.blocks_hit_local.Get(), 4u);
}

// The store reaches its lower tier only through BlockTier: an in-memory tier
// in NVMe's place takes demotions and serves promotions, loads and
// prefetches byte-exact, and a damaged copy there is a miss.
TEST_F(BlockStoreNvmeTest, AnotherKindOfBlockTierTakesTheNvmeTiersPlace) {
  lower_ = "memory";
  Open(4);
  auto s = Session();
  Store(*s, 0, 4);
  Store(*s, 4, 4);  // evicts 0..3 from host into the memory tier
  ASSERT_TRUE(memory_->Sync().ok());
  EXPECT_EQ(stats_.demotions.Get(), 4u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(memory_->BlockStats().writes, 4u);
  std::vector<TierKind> tiers;
  uint32_t hit = 0;
  EXPECT_EQ(LoadVerified(*s, 0, 4, &tiers, &hit), 4u);
  EXPECT_EQ(hit, 4u);
  EXPECT_EQ(tiers, std::vector<TierKind>(4, memory_->kind()));
  EXPECT_EQ(stats_.promotions.Get(), 4u);
  EXPECT_EQ(memory_->BlockStats().reads, 4u);
  EXPECT_EQ(LoadVerified(*s, 0, 4, &tiers), 4u);
  EXPECT_EQ(tiers, std::vector<TierKind>(4, TierKind::kHost));

  // Blocks 4..7 were evicted by the loads above; prefetch brings them back.
  ASSERT_TRUE(memory_->Sync().ok());
  std::vector<BlockKey> keys;
  for (uint64_t i = 4; i < 8; ++i) keys.push_back(KeyOf(i));
  std::promise<absl::StatusOr<uint32_t>> p;
  store_->Prefetch(*s, keys, [&](absl::StatusOr<uint32_t> n) { p.set_value(n); });
  auto n = p.get_future().get();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4u);
  EXPECT_EQ(LoadVerified(*s, 4, 4, &tiers), 4u);
  EXPECT_EQ(tiers, std::vector<TierKind>(4, TierKind::kHost));

  // Every copy in the memory tier damaged: blocks only there are misses.
  Store(*s, 20, 4);  // evicts 4..7 again (their copies below are kept)
  ASSERT_TRUE(memory_->Sync().ok());
  for (SlotHandle slot = 0; slot < 64; ++slot) (void)memory_->CorruptPayload(slot, 100);
  EXPECT_EQ(LoadVerified(*s, 4, 4, nullptr, &hit), 0u);
  EXPECT_GE(memory_->BlockStats().checksum_failures, 1u);
  EXPECT_GE(stats_.load_failures.Get(), 1u);
}

// Where each of keys [from, from+n) has its copy below host memory: the
// lower tier's index, or -1 (none, or only in host memory).
std::vector<int> LowerTiersOf(BlockStore& cache, uint64_t from, uint64_t n) {
  std::vector<int> out;
  for (uint64_t k = from; k < from + n; ++k) {
    const BlockKey key = KeyOf(k);
    auto info = cache.ListBlocks(std::nullopt, 1, &key);
    out.push_back(info.size() == 1 && info[0].on_lower ? info[0].lower : -1);
  }
  return out;
}

// Two shared tiers: a lookup asks both, each block is indexed in the first
// tier in the chain that holds it, and one tier that does not answer (a
// file system hung in a stat) does not hide what the other said.
TEST_F(BlockStoreNvmeTest, TwoSharedTiersBothCountAndALateOneDoesNotHideTheOther) {
  lower_ = "shared";
  second_shared_ = true;
  Open(64);
  ASSERT_EQ(store_->shared_lanes(), (std::vector<uint8_t>{0, 1}));
  auto s = Session();
  Plant(*memory_, *s, 0, 4);   // 0..3 in the first
  Plant(*memory2_, *s, 2, 6);  // 2..7 in the second (2 and 3 in both)
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 10; ++i) keys.push_back(KeyOf(i));
  std::vector<BlockLocation> out(keys.size());
  uint64_t lease;
  auto hit = store_->Lookup(*s, keys, false, &lease, std::span(out));
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(*hit, 8u) << "4 from the first tier, 4 more from the second";
  EXPECT_EQ(LowerTiersOf(*store_, 0, 8), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}))
      << "a block both hold is the first one's";
  EXPECT_EQ(LoadVerified(*s, 0, 8), 8u) << "each loads byte-exact from the tier that holds it";

  // The first tier stops answering; the second still counts.
  Plant(*memory2_, *s, 20, 4);
  memory_->HoldExists(true);
  keys.clear();
  for (uint64_t i = 20; i < 24; ++i) keys.push_back(KeyOf(i));
  std::vector<BlockLocation> late(keys.size());
  hit = store_->Lookup(*s, keys, false, &lease, std::span(late));
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(*hit, 4u) << "the second tier's answer stands while the first has given none";
  EXPECT_GE(stats_.remote_probes_late.Get(), 1u);
  memory_->HoldExists(false);  // the late answer lands in state nobody waits on
  EXPECT_EQ(LoadVerified(*s, 20, 4), 4u);
}

// `kvtierctl blocks` said "nvme (moving)" for every block only on NVMe,
// with nothing in flight. At rest, nothing is moving.
TEST_F(BlockStoreNvmeTest, BlocksAtRestOnNvmeAreNotListedAsMoving) {
  Open(4);
  auto s = Session();
  for (uint64_t i = 0; i < 12; i += 4) Store(*s, i, 4);  // 8 of them demoted
  ASSERT_TRUE(store_->lower_tier(0)->Sync().ok());
  ASSERT_TRUE(testing::Eventually([&] {
    for (const BlockStore::BlockInfo& b : store_->ListBlocks(std::nullopt, 100, nullptr)) {
      if (b.moving) return false;
    }
    return true;
  }));
  size_t only_lower = 0;
  for (const BlockStore::BlockInfo& b : store_->ListBlocks(std::nullopt, 100, nullptr)) {
    only_lower += b.on_lower && !b.on_host;
    EXPECT_FALSE(b.moving);
  }
  EXPECT_GE(only_lower, 8u);
}

// A chain: NVMe, then a memory tier below it. Once NVMe is fuller than
// cascade_high (90%), its coldest blocks are copied one tier down until it is
// at cascade_low (80%); nothing is dropped while the tier below has room, and
// blocks come back from either tier byte-exact.
TEST_F(BlockStoreNvmeTest, BlocksCascadeBelowNvmeAndComeBackByteExact) {
  below_ = true;
  Open(4);
  ASSERT_EQ(store_->lower_tier_count(), 2u);
  auto s = Session();
  BlockTier* nvme = store_->lower_tier(0);
  auto nvme_share = [&] {
    const TierUsage u = nvme->Usage();
    return double(u.used_bytes) / double(u.capacity_bytes);
  };
  // 300 blocks through 4 host slots: 296 demoted into an NVMe tier of 204 slots.
  FillChain(*s, 300);
  ASSERT_TRUE(memory_->Sync().ok());
  EXPECT_EQ(stats_.demotions.Get(), 296u);
  EXPECT_EQ(stats_.nvme_evictions.Get(), 0u) << "the cascade kept room on NVMe";
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(stats_.lower_evictions.Get(), 0u);
  EXPECT_EQ(stats_.cascades_failed.Get(), 0u);
  const uint64_t moved = stats_.cascades.Get();
  EXPECT_GT(moved, 80u);
  EXPECT_EQ(store_->lower_blocks(1), moved);
  EXPECT_EQ(memory_->BlockStats().writes, moved);
  EXPECT_EQ(memory_->Usage().used_slots, moved);
  EXPECT_EQ(store_->lower_blocks(0) + store_->lower_blocks(1), 296u);
  EXPECT_EQ(nvme->Usage().used_slots, store_->lower_blocks(0));
  EXPECT_LE(nvme_share(), 0.9);

  // The coldest went down: the first blocks stored are in the memory tier,
  // the last demoted still on NVMe.
  EXPECT_EQ(LowerTiersOf(*store_, 0, 8), std::vector<int>(8, 1));
  EXPECT_EQ(LowerTiersOf(*store_, 288, 8), std::vector<int>(8, 0));

  // Back from the memory tier, byte-exact, through a leased lookup and load.
  const uint64_t reads_before = memory_->BlockStats().reads;
  uint32_t hit = 0;
  EXPECT_EQ(LoadVerified(*s, 0, 4, nullptr, &hit), 4u);
  EXPECT_EQ(hit, 4u);
  EXPECT_EQ(memory_->BlockStats().reads, reads_before + 4);
  // The memory tier's reads (these loads') price its own copies.
  const CostTracker::Report cost = store_->cost().report();
  ASSERT_FALSE(cost.lower.empty());
  EXPECT_EQ(cost.lower[0].chain_position, 1u);
  EXPECT_EQ(cost.lower[0].reads_measured, memory_->BlockStats().reads);
  // And from NVMe (evicting 0..3 from host again: their copies below stay).
  EXPECT_EQ(LoadVerified(*s, 288, 4), 4u);
  EXPECT_EQ(LowerTiersOf(*store_, 0, 4), std::vector<int>(4, 1));
  // Prefetch promotes from the memory tier as well.
  std::vector<BlockKey> keys;
  for (uint64_t i = 8; i < 12; ++i) keys.push_back(KeyOf(i));
  std::promise<absl::StatusOr<uint32_t>> p;
  store_->Prefetch(*s, keys, [&](absl::StatusOr<uint32_t> n) { p.set_value(n); });
  auto n = p.get_future().get();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 4u);
  EXPECT_EQ(LoadVerified(*s, 8, 4), 4u);

  // Invalidating a block frees its copy wherever it is.
  const uint64_t mem_slots = memory_->Usage().used_slots;
  std::vector<BlockKey> gone{KeyOf(20), KeyOf(21)};
  ASSERT_EQ(LowerTiersOf(*store_, 20, 2), std::vector<int>(2, 1));
  auto removed = store_->Invalidate(*s, gone);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, 2u);
  EXPECT_EQ(memory_->Usage().used_slots, mem_slots - 2);
  EXPECT_EQ(store_->lower_blocks(1), mem_slots - 2);

  // A damaged copy in the memory tier is a miss, and dropped.
  for (SlotHandle slot = 0; slot < 512; ++slot) (void)memory_->CorruptPayload(slot, 100);
  EXPECT_EQ(LoadVerified(*s, 30, 2, nullptr, &hit), 0u);
  EXPECT_GE(memory_->BlockStats().checksum_failures, 1u);
  EXPECT_EQ(LowerTiersOf(*store_, 30, 1), std::vector<int>{-1});
}

// The cascade moves blocks while sessions load them: every load is
// byte-exact or a counted miss, and every copy ends up in exactly one tier.
// tiers.remote.admission_min_uses = 2 under NVMe: the cascade moves down
// the blocks requests used twice (stored, then looked up) and drops the
// rest from NVMe, as NVMe's own eviction would, instead of walking past
// them on every pass.
TEST_F(BlockStoreNvmeTest, TheCascadeMovesDownOnlyWhatTheSharedTiersGateAdmits) {
  below_ = true;
  below_shared_ = true;
  shared_admit_ = 2;
  Open(4);
  auto s = Session();
  BlockTier* nvme = store_->lower_tier(0);
  Store(*s, 0, 4);
  Store(*s, 4, 4);
  for (uint64_t k : {0u, 4u}) {  // a second use of 0..7
    EXPECT_EQ(LoadVerified(*s, k, 4), 4u);
    store_->AfterReply(*s);
  }
  for (uint64_t k = 8; k < 300; k += 4) {  // used once each
    Store(*s, k, 4);
    ASSERT_TRUE(nvme->Sync().ok());
    ASSERT_TRUE(testing::Eventually([&] {
      const TierUsage u = nvme->Usage();
      return double(u.used_bytes) <= 0.9 * double(u.capacity_bytes) && store_->cascade_settled();
    })) << k;
  }
  ASSERT_TRUE(memory_->Sync().ok());
  EXPECT_EQ(LowerTiersOf(*store_, 0, 8), std::vector<int>(8, 1)) << "admitted: moved down";
  EXPECT_EQ(memory_->BlockStats().writes, 8u);
  EXPECT_GT(stats_.cascade_dropped_not_admitted.Get(), 50u);
  EXPECT_EQ(stats_.nvme_evictions.Get(), stats_.cascade_dropped_not_admitted.Get());
  EXPECT_EQ(LoadVerified(*s, 0, 4), 4u) << "and they come back whole";
}

// The cascade asks the shared tier whether it holds a block before moving
// it down. A value that is there but does not read back intact (damaged,
// or put there by whoever can write the cluster's keys) must not make this
// node let go of its good copy: it writes its own copy over it. A value
// that reads back intact spares the write.
TEST_F(BlockStoreNvmeTest, AValueBelowThatDoesNotOpenDoesNotCostTheGoodCopy) {
  below_ = true;
  below_shared_ = true;
  Open(4);
  auto s = Session();
  // Another node's values of blocks 0..15: 0..7 damaged, 8..15 intact.
  const std::vector<BlockMeta> planted = Plant(*memory_, *s, 0, 16);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(memory_->CorruptValue(planted[i], 4096 + i).ok());
  const uint64_t planted_writes = memory_->BlockStats().writes;
  FillChain(*s, 300);  // the coldest, 0..15 among them, go down
  ASSERT_TRUE(memory_->Sync().ok());
  ASSERT_EQ(LowerTiersOf(*store_, 0, 16), std::vector<int>(16, 1));
  EXPECT_EQ(stats_.cascade_found_unproven.Get(), 8u);
  EXPECT_EQ(stats_.remote_writes_avoided.Get(), 8u);
  // Every move but 8..15's wrote its copy (0..7's over the damaged values).
  EXPECT_EQ(memory_->BlockStats().writes - planted_writes, stats_.cascades.Get() - 8);
  // Four at a time: the host tier has four slots.
  for (uint64_t k = 0; k < 16; k += 4) {
    uint32_t hit = 0;
    EXPECT_EQ(LoadVerified(*s, k, 4, nullptr, &hit), 4u)
        << k << (k < 8 ? ": this node's own copies" : ": the intact values it kept instead") << ", byte-exact";
    EXPECT_EQ(hit, 4u) << k;
  }
}

// A burst of host evictions faster than the cascade drains NVMe (here the
// cascade is off, so only the allocating path acts): once NVMe is full,
// host victims are written to the tier below while it has room, and NVMe
// drops nothing. Once the tier below is full too, NVMe evicts its coldest,
// as the last resort it always was. Every block kept comes back byte-exact.
class BurstDownTheChainTest : public BlockStoreNvmeTest {
 protected:
  void Run(bool shared) {
    below_ = true;
    below_shared_ = shared;
    cascade_high_ = 2.0;
    Open(4);
    auto s = Session();
    // A sync every 32 blocks keeps NVMe's staging memory from refusing
    // writes (a refused demotion is a failed one) and the writes in flight
    // below under kMaxPastFullInFlight: the burst here is one the cascade
    // cannot follow, not one the devices cannot.
    for (uint64_t k = 0; k < 400; k += 4) {
      Store(*s, k, 4);
      if (k % 32 == 28) {
        SyncNvme();
        ASSERT_TRUE(memory_->Sync().ok());
      }
    }
    ASSERT_TRUE(store_->lower_tier(0)->Sync().ok());
    ASSERT_TRUE(memory_->Sync().ok());
    EXPECT_EQ(stats_.demotions_failed.Get(), 0u);
    EXPECT_EQ(stats_.demotions.Get(), 396u);
    EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
    EXPECT_EQ(stats_.nvme_evictions.Get(), 0u) << "the tier below had room";
    EXPECT_EQ(stats_.cascades.Get(), 0u);
    EXPECT_GT(stats_.demotions_past_full_tier.Get(), 150u);
    EXPECT_EQ(store_->lower_blocks(1), stats_.demotions_past_full_tier.Get());
    EXPECT_EQ(store_->lower_blocks(0) + store_->lower_blocks(1), 396u);
    EXPECT_EQ(memory_->BlockStats().writes, stats_.demotions_past_full_tier.Get());
    // The oldest stayed on NVMe; the newest went below once it was full.
    EXPECT_EQ(LowerTiersOf(*store_, 0, 4), std::vector<int>(4, 0));
    EXPECT_EQ(LowerTiersOf(*store_, 392, 4), std::vector<int>(4, 1));
    for (uint64_t k = 0; k < 396; k += 4) ASSERT_EQ(LoadVerified(*s, k, 4), 4u) << k;

    // The tier below fills (512 blocks of 16 KiB): NVMe evicts to take
    // the rest, and host evictions are still never dropped.
    for (uint64_t k = 1000; k < 1400; k += 4) {
      Store(*s, k, 4);
      SyncNvme();  // NVMe evicts only blocks whose writes have landed
    }
    ASSERT_TRUE(store_->lower_tier(0)->Sync().ok());
    ASSERT_TRUE(memory_->Sync().ok());
    EXPECT_EQ(store_->lower_blocks(1), 512u);
    EXPECT_GT(stats_.nvme_evictions.Get(), 0u);
    EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
    EXPECT_EQ(stats_.demotions_failed.Get(), 0u);
    for (uint64_t k = 1392; k < 1400; k += 4) EXPECT_EQ(LoadVerified(*s, k, 4), 4u) << k;
  }
};

// A burst of host evictions faster than the cascade drains NVMe (here the
// cascade is off, so only the allocating path acts): once NVMe is full,
// host victims are written to the tier below while it has room, and NVMe
// drops nothing. Once the tier below is full too, NVMe evicts its coldest,
// as the last resort it always was. Every block kept comes back byte-exact.
TEST_F(BurstDownTheChainTest, OverALocalTier) { Run(false); }
TEST_F(BurstDownTheChainTest, OverASharedTier) { Run(true); }

// A store that needs room while every block it could evict is busy with
// I/O for a moment (here: durable commits still writing through to a slow
// NVMe tier; in the field also a move of a block's lower copy down the
// chain) waits for it instead of being refused: the refusal was a passing
// moment's, and on a small host tier it failed an engine's store (and this
// file's cascade test, now and then, under load).
TEST_F(BlockStoreNvmeTest, AStoreWaitsForBlocksBusyAMomentInsteadOfBeingRefused) {
  Open(4);
  auto s = Session();
  faults_->delay_us = 4000;  // every NVMe completion 4 ms late
  std::vector<BlockKey> first;
  for (uint64_t i = 0; i < 4; ++i) first.push_back(KeyOf(i));
  std::vector<BlockLocation> out(4);
  uint64_t ticket;
  ASSERT_TRUE(store_->StoreBegin(*s, first, &ticket, std::span(out)).ok());
  HostTier* host = store_->host_tier(s->ns.tenant);
  for (size_t i = 0; i < 4; ++i) testing::FillFromKey(first[i], {host->arena_base() + out[i].arena_offset, kBlock});
  std::promise<absl::Status> durable;
  store_->StoreCommit(*s, ticket, /*durable=*/true, [&](absl::Status st) { durable.set_value(std::move(st)); });
  // The four are committed and being written through: busy, not pinned.
  std::vector<BlockKey> next;
  for (uint64_t i = 4; i < 8; ++i) next.push_back(KeyOf(i));
  uint64_t second;
  const auto t0 = std::chrono::steady_clock::now();
  auto need = store_->StoreBegin(*s, next, &second, std::span(out));
  ASSERT_TRUE(need.ok()) << need.status() << " waited=" << stats_.stores_waited_for_busy_blocks.Get() << " after "
                         << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s";
  // One wait per slot whose victims were all busy: one to four.
  const uint64_t waits = stats_.stores_waited_for_busy_blocks.Get();
  EXPECT_GE(waits, 1u);
  EXPECT_LE(waits, 4u);
  EXPECT_EQ(stats_.store_refused_no_space.Get(), 0u);
  for (size_t i = 0; i < 4; ++i) testing::FillFromKey(next[i], {host->arena_base() + out[i].arena_offset, kBlock});
  std::promise<absl::Status> done;
  store_->StoreCommit(*s, second, false, [&](absl::Status st) { done.set_value(std::move(st)); });
  ASSERT_TRUE(done.get_future().get().ok());
  ASSERT_TRUE(durable.get_future().get().ok());
  faults_->delay_us = 0;
  // Both stores' blocks load whole: the first four from NVMe.
  EXPECT_EQ(LoadVerified(*s, 0, 4), 4u);
  store_->AfterReply(*s);
  EXPECT_EQ(LoadVerified(*s, 4, 4), 4u);
  store_->AfterReply(*s);
  // Blocks pinned by a lease are not busy for a moment: that store is refused.
  auto lease_keys = std::vector<BlockKey>{KeyOf(4), KeyOf(5), KeyOf(6), KeyOf(7)};
  std::vector<BlockLocation> where(4);
  uint64_t lease = 0;
  auto hit = store_->Lookup(*s, lease_keys, true, &lease, std::span(where));
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(*hit, 4u);
  std::vector<BlockKey> third;
  for (uint64_t i = 100; i < 101; ++i) third.push_back(KeyOf(i));
  auto refused = store_->StoreBegin(*s, third, &second, std::span(out).first(1));
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(stats_.stores_waited_for_busy_blocks.Get(), waits) << "pinned blocks are not waited for";
  EXPECT_EQ(stats_.store_refused_no_space.Get(), 1u);
  EXPECT_TRUE(store_->Release(*s, lease).ok());
}

// A demotion its only tier refuses at once (staging full: the write's
// callback runs inline and frees the record, which has no host slot by
// then) under a policy that reads keys as blocks leave it (S3-FIFO's and
// ARC's ghosts; the adaptive default runs both). The block leaves its
// policy while its record surely lives: before, the policy read the freed
// record (AddressSanitizer: use-after-poison in DemoteLocked's
// FreeSlotLocked; a review found it). Every block is still served
// byte-exact or missed.
TEST_F(BlockStoreNvmeTest, ADemotionRefusedInlineLeavesItsPolicyBeforeItsRecordGoes) {
  uint64_t base = 0;  // each policy's keys are new (a reopened tier recovers the last run's)
  for (const char* policy : {"s3fifo", "adaptive"}) {
    SCOPED_TRACE(policy);
    base += 10000;
    host_policy_ = policy;
    staging_bytes_ = 512 << 10;
    Open(4);
    faults_->delay_us = 3000;
    auto s = Session();
    const uint64_t failed_before = stats_.demotions_failed.Get();
    for (uint64_t k = 0; k < 200; k += 4) Store(*s, base + k, 4);
    faults_->delay_us = 0;
    SyncNvme();
    EXPECT_GT(stats_.demotions_failed.Get(), failed_before) << "staging refused some demotions";
    uint64_t served = 0;
    for (uint64_t k = 0; k < 200; k += 4) served += LoadVerified(*s, base + k, 4);
    EXPECT_GT(served, 0u);
  }
}

// A burst faster than the NVMe device itself: its staging memory refuses
// demotions (KVTIER_EBUSY) before the tier is full. Each refused block
// goes one tier down instead of being lost, and comes back byte-exact.
TEST_F(BlockStoreNvmeTest, DemotionsNvmeStagingRefusesGoDownTheChain) {
  below_ = true;
  cascade_high_ = 2.0;
  // Demotions may take 3/4 of 512 KiB of staging: 19 writes of 20 KiB in
  // flight, while every NVMe completion waits 3 ms; the stores go on far
  // faster than 333 writes a second even under a sanitizer.
  staging_bytes_ = 512 << 10;
  Open(4);
  faults_->delay_us = 3000;
  auto s = Session();
  for (uint64_t k = 0; k < 200; k += 4) {
    Store(*s, k, 4);
    // The writes below stay under kMaxPastFullInFlight however slow the machine.
    if (k % 32 == 28) {
      ASSERT_TRUE(memory_->Sync().ok());
    }
  }
  faults_->delay_us = 0;
  SyncNvme();
  ASSERT_TRUE(memory_->Sync().ok());
  EXPECT_EQ(stats_.demotions.Get(), 196u);
  EXPECT_EQ(stats_.demotions_failed.Get(), 0u) << "no demotion lost to a busy device";
  EXPECT_GT(stats_.demotions_past_full_tier.Get(), 0u) << "the device did refuse some";
  EXPECT_EQ(store_->lower_blocks(1), stats_.demotions_past_full_tier.Get());
  EXPECT_EQ(store_->lower_blocks(0) + store_->lower_blocks(1), 196u);
  EXPECT_EQ(store_->lower_tier(0)->Usage().used_slots, store_->lower_blocks(0));
  EXPECT_EQ(memory_->Usage().used_slots, store_->lower_blocks(1));
  for (uint64_t k = 0; k < 196; k += 4) ASSERT_EQ(LoadVerified(*s, k, 4), 4u) << k;
}

TEST_F(BlockStoreNvmeTest, CascadeUnderConcurrentLoadsServesNoWrongByte) {
  below_ = true;
  Open(16);
  auto s = Session();
  auto reader = Session();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> loaded{0};
  // Keys [0, stored) are in the cache; the reader loads among the first 400.
  std::atomic<uint64_t> stored{0};
  std::thread loads([&] {
    std::mt19937_64 rng(7);
    while (!stop.load()) {
      const uint64_t k = rng() % 400;
      loaded += LoadVerified(*reader, k, 2);  // checks every byte it loads
    }
  });
  // The stores go on until the cascade has moved blocks under the loads:
  // the reader's promotions take copies off NVMe, and a fast reader kept
  // it under the cascade's high mark through 400 blocks (a flaky test).
  for (uint64_t k = 0; k < 4000; k += 4) {
    Store(*s, k, 4);
    stored = k + 4;
    if (k + 4 >= 400 && stats_.cascades.Get() > 0 && loaded.load() > 0) break;
  }
  testing::Eventually([&] { return stats_.cascades.Get() > 0 && loaded.load() > 0; });
  stop = true;
  loads.join();
  SyncNvme();
  ASSERT_TRUE(memory_->Sync().ok());
  EXPECT_GT(stats_.cascades.Get(), 0u);
  EXPECT_GT(loaded.load(), 0u);
  // Every lower copy is counted once, in the tier that holds it, once the
  // cascade has settled (a batch may still be moving when the loads stop).
  uint64_t in_tier[2];
  auto consistent = [&] {
    in_tier[0] = in_tier[1] = 0;
    for (int t : LowerTiersOf(*store_, 0, stored.load())) {
      if (t >= 0) ++in_tier[t];
    }
    return in_tier[0] == store_->lower_blocks(0) && in_tier[1] == store_->lower_blocks(1) &&
           store_->lower_tier(0)->Usage().used_slots == store_->lower_blocks(0) &&
           memory_->Usage().used_slots == store_->lower_blocks(1);
  };
  EXPECT_TRUE(testing::Eventually(consistent))
      << in_tier[0] << " " << store_->lower_blocks(0) << " " << store_->lower_tier(0)->Usage().used_slots << " / "
      << in_tier[1] << " " << store_->lower_blocks(1) << " " << memory_->Usage().used_slots;
}

// Loads of the newest blocks race their demotions into the tier below a
// full NVMe tier (the cascade off): a load that finds a block still being
// written there waits for that write, and every byte loaded is right.
TEST_F(BlockStoreNvmeTest, LoadsRaceDemotionsPastAFullNvmeTier) {
  below_ = true;
  cascade_high_ = 2.0;
  memory_latency_ns_ = 300'000;  // writes below take a while: loads find them in flight
  Open(16);
  auto s = Session();
  auto reader = Session();
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> loaded{0}, stored{0}, lookups{0}, short_hits{0};
  std::thread loads([&] {
    std::mt19937_64 rng(11);
    while (!stop.load()) {
      const uint64_t n = stored.load();
      if (n < 64) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      uint32_t hit = 0;
      loaded += LoadVerified(*reader, n - 48 + rng() % 30, 2, nullptr, &hit);  // checks every byte it loads
      ++lookups;
      short_hits += hit < 2;  // a block stored and never dropped is found, wherever it is
    }
  });
  for (uint64_t k = 0; k < 480; k += 4) {
    Store(*s, k, 4);
    stored = k + 4;
    if (k % 32 == 28) {  // as in BurstDownTheChainTest
      SyncNvme();
      EXPECT_TRUE(memory_->Sync().ok());
    }
  }
  const bool enough = testing::Eventually([&] { return loaded.load() > 20; });
  stop = true;
  loads.join();
  ASSERT_TRUE(enough);
  EXPECT_EQ(short_hits.load(), 0u) << "of " << lookups.load() << " lookups";
  EXPECT_EQ(stats_.demotions_failed.Get(), 0u);
  SyncNvme();
  ASSERT_TRUE(memory_->Sync().ok());
  EXPECT_GT(stats_.demotions_past_full_tier.Get(), 100u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_EQ(stats_.nvme_evictions.Get(), 0u);
  uint64_t in_tier[2] = {0, 0};
  for (int t : LowerTiersOf(*store_, 0, stored.load())) {
    if (t >= 0) ++in_tier[t];
  }
  EXPECT_EQ(in_tier[0], store_->lower_blocks(0));
  EXPECT_EQ(in_tier[1], store_->lower_blocks(1));
  EXPECT_EQ(memory_->Usage().used_slots, store_->lower_blocks(1));
  EXPECT_EQ(store_->lower_tier(0)->Usage().used_slots, store_->lower_blocks(0));
}

// A drain (SIGTERM's flush) leaves no host block with only a copy that a
// restart forgets: one whose lower copy the cascade moved into the memory
// tier gets a copy on NVMe again.
TEST_F(BlockStoreNvmeTest, AFlushRewritesBlocksWhoseCopyIsOnATierThatIsNotDurable) {
  below_ = true;
  Open(4);
  auto s = Session();
  FillChain(*s, 300);
  ASSERT_EQ(LowerTiersOf(*store_, 0, 4), std::vector<int>(4, 1));
  ASSERT_EQ(LoadVerified(*s, 0, 4), 4u);  // in host memory again, their lower copies in the memory tier
  const BlockStore::FlushResult f = store_->FlushToFirstLowerTier(std::chrono::seconds(10));
  EXPECT_EQ(f.written, 4u);
  EXPECT_EQ(f.failed, 0u);
  EXPECT_EQ(f.already_on_nvme, 0u);
  EXPECT_TRUE(f.sync.ok()) << f.sync;
  EXPECT_EQ(LowerTiersOf(*store_, 0, 4), std::vector<int>(4, 0));
  EXPECT_EQ(memory_->Usage().used_slots, store_->lower_blocks(1));
}

// A durable commit is acknowledged only by a durable tier: a memory tier
// first in the chain refuses it (the blocks stay committed in host memory).
TEST_F(BlockStoreNvmeTest, ADurableCommitIsRefusedWhenTheFirstLowerTierIsNotDurable) {
  lower_ = "memory";
  Open(4);
  auto s = Session();
  std::vector<BlockKey> keys{KeyOf(1)};
  std::vector<BlockLocation> out(1);
  uint64_t ticket;
  ASSERT_TRUE(store_->StoreBegin(*s, keys, &ticket, std::span(out)).ok());
  std::promise<absl::Status> p;
  store_->StoreCommit(*s, ticket, /*durable=*/true, [&](absl::Status st) { p.set_value(st); });
  const absl::Status st = p.get_future().get();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not durable"), std::string::npos) << st;
  EXPECT_EQ(memory_->BlockStats().writes, 0u);
}

TEST_F(BlockStoreNvmeTest, ABlockWithADurableCopyKeepsItWhenEvictedFromHost) {
  Open(2);
  auto s = Session();
  Store(*s, 0, 2, /*durable=*/true);
  EXPECT_EQ(store_->nvme_blocks(), 2u) << "durable commit completes after the NVMe write";
  Store(*s, 10, 2);
  EXPECT_EQ(stats_.evictions_kept_on_nvme.Get(), 2u);
  EXPECT_EQ(stats_.demotions.Get(), 0u) << "no second write for a block already on NVMe";
  EXPECT_EQ(LoadVerified(*s, 0, 2), 2u);
}

TEST_F(BlockStoreNvmeTest, WriteThroughPutsEveryCommitOnNvme) {
  Open(8, {"t"}, /*write_through=*/true);
  auto s = Session();
  Store(*s, 0, 5);
  SyncNvme();
  EXPECT_EQ(store_->nvme_blocks(), 5u);
  EXPECT_EQ(stats_.writes_through.Get(), 5u);
}

TEST_F(BlockStoreNvmeTest, ABadNvmeCopyIsAMissNeverWrongBytes) {
  Open(2);
  auto s = Session();
  Store(*s, 0, 2);
  Store(*s, 2, 2);  // 0,1 demoted
  SyncNvme();
  faults_->flip_read_bit = (4096 + 77) * 8;  // in the payload
  faults_->budget = 1;
  uint32_t hit = 0;
  // Block 0 fails its checksum: the loaded prefix is empty.
  EXPECT_EQ(LoadVerified(*s, 0, 2, nullptr, &hit), 0u);
  EXPECT_EQ(hit, 2u);
  EXPECT_EQ(Nvme()->Stats().checksum_failures, 1u);
  EXPECT_GE(stats_.load_failures.Get(), 2u);
  // Block 0 is gone for good; block 1 still loads.
  EXPECT_EQ(LoadVerified(*s, 0, 2, nullptr, &hit), 0u);
  EXPECT_EQ(hit, 0u);
  EXPECT_EQ(LoadVerified(*s, 1, 1), 1u);
}

TEST_F(BlockStoreNvmeTest, PrefetchBringsBlocksBackWithoutALease) {
  Open(4);
  auto s = Session();
  Store(*s, 0, 4);
  Store(*s, 4, 4);
  SyncNvme();
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 4; ++i) keys.push_back(KeyOf(i));
  std::promise<absl::StatusOr<uint32_t>> p;
  store_->Prefetch(*s, keys, [&](absl::StatusOr<uint32_t> n) { p.set_value(n); });
  auto n = p.get_future().get();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4u);
  std::vector<TierKind> tiers;
  EXPECT_EQ(LoadVerified(*s, 0, 4, &tiers), 4u);
  EXPECT_EQ(tiers, std::vector<TierKind>(4, TierKind::kHost));
  EXPECT_EQ(store_->Usage()[0].pinned_blocks, 0u);
}

TEST_F(BlockStoreNvmeTest, AFullNvmeTierEvictsItsLeastRecentlyUsedBlocks) {
  Open(2);
  auto s = Session();
  // 4 segments x 51 slots of 16 KiB + header: push 300 blocks through a
  // 2-block host tier, letting each demotion land before the next store (a
  // burst faster than the journal can sync fills NVMe with writes in flight,
  // which cannot be evicted: then demotions are dropped, and counted).
  for (uint64_t i = 0; i < 300; i += 2) {
    Store(*s, i, 2);
    SyncNvme();
  }
  EXPECT_GT(stats_.nvme_evictions.Get(), 0u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 0u);
  EXPECT_LE(store_->nvme_blocks(), 204u);
  EXPECT_EQ(store_->lower_tier()->Usage().used_slots, store_->nvme_blocks());
  // The oldest are gone, the newer are there with the right bytes (two at a
  // time: a load must fit the 2-block host tier).
  uint32_t hit = 0;
  LoadVerified(*s, 0, 1, nullptr, &hit);
  EXPECT_EQ(hit, 0u);
  for (uint64_t i = 280; i < 296; i += 2) EXPECT_EQ(LoadVerified(*s, i, 2), 2u) << i;
}

// tiers.nvme.policy: every policy but adaptive runs the shared NVMe tier
// (over its sparse segment<<16|slot handles). A block hit on NVMe twice is
// kept by S3-FIFO through a stream of blocks demoted once; LRU lets it go.
TEST_F(BlockStoreNvmeTest, TheNvmeTierEvictsByItsConfiguredPolicy) {
  EXPECT_FALSE(BlockStore::Create({.nvme_policy = "adaptive"}, &stats_).ok());
  EXPECT_FALSE(BlockStore::Create({.nvme_policy = "holds"}, &stats_).ok()) << "holds learns from host lookups";
  EXPECT_FALSE(BlockStore::Create({.nvme_policy = "mru"}, &stats_).ok());
  uint64_t base = 0;  // each run its own keys (the NVMe files outlive a run)
  for (const char* policy : {"lru", "s3fifo", "s3fifo-deep", "tinylfu"}) {
    SCOPED_TRACE(policy);
    base += 100000;
    const uint64_t evictions_before = stats_.nvme_evictions.Get();
    Open(2, {"t"}, false, {}, 1.0, 1.0, policy);
    auto s = Session();
    Store(*s, base, 2);
    Store(*s, base + 2, 2);  // base and base + 1 demoted
    SyncNvme();
    auto probe = [&](bool lease) {
      std::vector<BlockKey> keys{KeyOf(base)};
      std::vector<BlockLocation> out(1);
      uint64_t id = 0;
      const uint32_t hit = *store_->Lookup(*s, keys, lease, &id, std::span(out));
      if (id != 0) {
        EXPECT_TRUE(store_->Release(*s, id).ok());
      }
      return hit;
    };
    ASSERT_EQ(probe(true), 1u);  // a leased hit touches its NVMe copy
    ASSERT_EQ(probe(true), 1u);
    for (uint64_t i = 10; i < 310; i += 2) {
      Store(*s, base + i, 2);
      SyncNvme();
    }
    EXPECT_GT(stats_.nvme_evictions.Get(), evictions_before);
    EXPECT_EQ(store_->lower_tier()->Usage().used_slots, store_->nvme_blocks());
    const uint32_t kept = probe(false);
    if (std::string(policy) == "lru") {
      EXPECT_EQ(kept, 0u) << "LRU: 300 newer demotions pushed it out";
    } else if (std::string(policy) != "tinylfu") {
      EXPECT_EQ(kept, 1u) << "used while young: it went to S3-FIFO's main queue";
    }
    if (std::string(policy) != "tinylfu") {  // (its admission duel may turn away new one-time blocks)
      for (uint64_t i = 290; i < 306; i += 2) EXPECT_EQ(LoadVerified(*s, base + i, 2), 2u) << i;
    }
    s.reset();
  }
}

TEST_F(BlockStoreNvmeTest, InvalidatingANvmeOnlyBlockFreesItsSlot) {
  Open(2);
  auto s = Session();
  Store(*s, 0, 2);
  Store(*s, 2, 2);
  SyncNvme();
  const uint64_t used = store_->lower_tier()->Usage().used_slots;
  const std::vector<BlockKey> gone = {KeyOf(0), KeyOf(1)};
  auto n = store_->Invalidate(*s, gone);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(store_->lower_tier()->Usage().used_slots, used - 2);
  EXPECT_EQ(store_->nvme_blocks(), 0u);
}

TEST_F(BlockStoreNvmeTest, DurableBlocksAreServedAfterARestart) {
  Open(8);
  {
    auto s = Session();
    Store(*s, 0, 6, /*durable=*/true);
  }
  Open(8);  // a new cache over the same NVMe files: a restarted daemon
  EXPECT_EQ(recovered_, 6u);
  EXPECT_EQ(indexed_, 6u);
  auto s = Session();
  std::vector<TierKind> tiers;
  EXPECT_EQ(LoadVerified(*s, 0, 6, &tiers), 6u);
  EXPECT_EQ(tiers, std::vector<TierKind>(6, TierKind::kNvme));
}

TEST_F(BlockStoreNvmeTest, RecoveredBlocksOfAnUnknownTenantAreDropped) {
  Open(8, {"alpha"});
  {
    auto s = Session();
    Store(*s, 0, 3, true);
  }
  Open(8, {"beta"});
  EXPECT_EQ(recovered_, 3u);
  EXPECT_EQ(indexed_, 0u);
  EXPECT_EQ(stats_.recovered_dropped.Get(), 3u);
  EXPECT_EQ(store_->lower_tier()->Usage().used_slots, 0u);
}

TEST_F(BlockStoreNvmeTest, ConcurrentSessionsOverTwoTiersNeverSeeWrongBytes) {
  Open(6);
  constexpr int kThreads = 3;
#ifdef KVTIER_TSAN
  constexpr int kOps = 150;
#else
  constexpr int kOps = 600;
#endif
  std::atomic<uint64_t> loaded{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      auto s = Session();
      std::mt19937_64 rng(t + 7);
      for (int i = 0; i < kOps; ++i) {
        const uint64_t base = rng() % 80;
        if (rng() % 2) {
          std::vector<BlockKey> keys = {KeyOf(base), KeyOf(base + 1)};
          std::vector<BlockLocation> out(2);
          uint64_t ticket;
          auto need = store_->StoreBegin(*s, keys, &ticket, std::span(out));
          if (!need.ok()) continue;
          for (int k = 0; k < 2; ++k) {
            if (out[k].needed) {
              testing::FillFromKey(keys[k], {store_->host_tier(0)->arena_base() + out[k].arena_offset, kBlock});
            }
          }
          std::promise<void> done;
          store_->StoreCommit(*s, ticket, rng() % 4 == 0, [&](absl::Status) { done.set_value(); });
          done.get_future().wait();
        } else {
          loaded += LoadVerified(*s, base, 1 + rng() % 3);
        }
      }
      store_->CloseSession(*s);
    });
  }
  for (auto& th : ts) th.join();
  SyncNvme();
  EXPECT_GT(loaded.load(), 0u);
  EXPECT_GT(stats_.demotions.Get() + stats_.evictions_kept_on_nvme.Get(), 0u);
  EXPECT_EQ(store_->Usage()[0].pinned_blocks, 0u);
}

// A background reclaim whose burst of demotions is larger than the NVMe
// tier's staging memory takes (a reclaim from 95% to 90% of a 1 GiB tier
// is ~1,400 blocks of 32 KiB): the writes the device cannot take yet wait
// for room, so the reclaimer evicts at the device's pace and loses nothing.
// Before, each refused write lost its block: the demo with the conversation
// trace lost 2,366 of 9,313 demotions (25%) with NVMe 15% full.
TEST_F(BlockStoreNvmeTest, ABurstOfBackgroundDemotionsWaitsForTheDeviceInsteadOfLosingBlocks) {
  // Waiting writes may take half of 512 KiB of staging: 12 writes of 16 KiB
  // + header in flight, each completion 3 ms late; the pass evicts 48.
  staging_bytes_ = 512 << 10;
  Open(64, {"t"}, false, {}, 0.9, 0.25);
  faults_->delay_us = 3000;
  auto s = Session();
  for (uint64_t k = 0; k < 60; k += 4) Store(*s, k, 4);  // 60 of 64: over the high mark
  EXPECT_TRUE(testing::Eventually(
      [&] { return store_->Usage()[0].blocks <= 16 && stats_.evictions_background.Get() >= 44; }));
  faults_->delay_us = 0;
  SyncNvme();
  const uint64_t evicted = stats_.evictions_background.Get();
  EXPECT_GE(evicted, 44u);
  EXPECT_EQ(stats_.demotions.Get(), evicted);
  EXPECT_EQ(stats_.demotions_failed.Get(), 0u) << "no block lost to the device's pace";
  EXPECT_GT(stats_.demotions_waited.Get(), 0u) << "the burst did outrun staging";
  EXPECT_EQ(store_->nvme_blocks(), evicted);
  EXPECT_EQ(OnNvme(*s, 0, 60), evicted);
  for (uint64_t k = 0; k < 60; k += 4) ASSERT_EQ(LoadVerified(*s, k, 4), 4u) << k;
}

// A device too slow for the wait (each completion 400 ms late; a demotion
// waits 250 ms for room): what the wait could not place is dropped and
// counted as before, and nothing hangs: stores go on, and what is served
// is byte-exact.
TEST_F(BlockStoreNvmeTest, ADeviceTooSlowForTheWaitDropsAndCountsWithoutHanging) {
  staging_bytes_ = 128 << 10;  // waiting writes: 3 of 16 KiB + header in flight
  Open(64, {"t"}, false, {}, 0.9, 0.25);
  faults_->delay_us = 400'000;
  auto s = Session();
  for (uint64_t k = 0; k < 60; k += 4) Store(*s, k, 4);
  EXPECT_TRUE(testing::Eventually([&] { return stats_.demotions_failed.Get() > 0; }));
  for (uint64_t k = 100; k < 120; k += 4) Store(*s, k, 4);
  faults_->delay_us = 0;
  SyncNvme();
  uint64_t served = 0;
  for (uint64_t k = 0; k < 60; k += 4) served += LoadVerified(*s, k, 4);
  EXPECT_GT(served, 0u);
}

// A flush (kvtierctl flush, and the drain on SIGTERM) writes every block
// that fits, waiting for staging memory when writes in flight hold it all.
// Before, it submitted everything at once and what staging could not take
// failed: the demo's drain wrote 18,038 blocks and failed 9,442 with the
// NVMe tier 20% full.
TEST_F(BlockStoreNvmeTest, AFlushWaitsForStagingInsteadOfFailingBlocks) {
  Open(200);  // 200 blocks of 16 KiB + header: more than the 3 MiB of staging demotions may take
  auto s = Session();
  Store(*s, 0, 200);
  faults_->delay_us = 2000;  // writes stay in flight while the flush submits
  const BlockStore::FlushResult f = store_->FlushToFirstLowerTier(std::chrono::seconds(30));
  faults_->delay_us = 0;
  EXPECT_FALSE(f.timed_out);
  EXPECT_EQ(f.failed, 0u);
  EXPECT_EQ(f.written, 200u);
  EXPECT_TRUE(f.sync.ok()) << f.sync;
  EXPECT_EQ(OnNvme(*s, 0, 200), 0u) << "host copies stay: probes see host";
  EXPECT_EQ(store_->nvme_blocks(), 200u);
  EXPECT_EQ(stats_.writes_through.Get(), 200u) << "a write staging refused, tried again, counts once";
}

// A flush stops starting writes at its deadline: the drain on SIGTERM
// must end within daemon.drain_timeout_ms, not when the device has written
// everything. (Before, once past the deadline a refused write found room
// freed since and went on: the demo's drain ran 24-50 s on an 8 s budget.)
TEST_F(BlockStoreNvmeTest, AFlushStartsNoWriteAfterItsDeadline) {
  staging_bytes_ = 512 << 10;  // a flush's writes: 12 of 16 KiB + header in flight
  Open(200);
  auto s = Session();
  Store(*s, 0, 200);
  faults_->delay_us = 20000;  // 50 writes a second: all 200 would take 4 s
  const auto start = std::chrono::steady_clock::now();
  const BlockStore::FlushResult f = store_->FlushToFirstLowerTier(std::chrono::milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - start;
  faults_->delay_us = 0;
  EXPECT_TRUE(f.timed_out);
  EXPECT_GT(f.failed, 100u) << "what was not started by the deadline";
  EXPECT_LT(took, std::chrono::milliseconds(2500)) << "only the writes in flight at the deadline were waited for";
  SyncNvme();
  for (uint64_t k = 0; k < 200; k += 4) ASSERT_EQ(LoadVerified(*s, k, 4), 4u) << "host copies stay";
}

// The budget bounds the whole flush, not only the last write started: the
// writes in flight at the deadline (12 here, 40 ms each on a device that
// completes one at a time: ~480 ms) would land after it, and the final
// sync waits for them. So the flush starts no write while those in flight
// need the rest of the budget at the pace it has seen, and ends within it
// (one journal round over at most). Every block is accounted for: written,
// or failed.
TEST_F(BlockStoreNvmeTest, AFlushEndsWithinItsBudgetTheLandingOfItsLastWritesIncluded) {
  staging_bytes_ = 512 << 10;
  Open(200);
  auto s = Session();
  Store(*s, 0, 200);
  faults_->delay_us = 40000;
  const auto start = std::chrono::steady_clock::now();
  const BlockStore::FlushResult f = store_->FlushToFirstLowerTier(std::chrono::milliseconds(600));
  const auto took = std::chrono::steady_clock::now() - start;
  faults_->delay_us = 0;
  EXPECT_LT(took, std::chrono::milliseconds(850)) << "without the reserve: ~1,080 ms";
  EXPECT_TRUE(f.timed_out) << "blocks were left for lack of time";
  EXPECT_EQ(f.written + f.failed, 200u);
  EXPECT_GE(f.written, 10u) << "it wrote at the device's pace until then";
  EXPECT_GT(f.failed, 100u);
  EXPECT_TRUE(f.sync.ok()) << f.sync;
  SyncNvme();
  for (uint64_t k = 0; k < 200; k += 4) ASSERT_EQ(LoadVerified(*s, k, 4), 4u) << "host copies stay";
}

// The same bound where the first lower tier has no staging memory to pace
// the flush (a file-system or remote tier: here a memory tier whose one
// thread takes 20 ms a write). It takes every write at once; the pace comes
// from the writes' own landings, and those still queued at the deadline are
// abandoned by the tier instead of being waited for (all 100 would take
// 2 s).
TEST_F(BlockStoreNvmeTest, AFlushToATierWithoutStagingEndsWithinItsBudgetToo) {
  lower_ = "memory";
  memory_latency_ns_ = 20'000'000;
  Open(200);
  auto s = Session();
  Store(*s, 0, 100);
  const auto start = std::chrono::steady_clock::now();
  const BlockStore::FlushResult f = store_->FlushToFirstLowerTier(std::chrono::milliseconds(400));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::milliseconds(800)) << "without the deadline on the writes: ~2 s";
  EXPECT_LE(f.landed_late, 1u) << "the write under way at the deadline; those abandoned then failed, not late";
  EXPECT_TRUE(f.timed_out);
  EXPECT_EQ(f.written + f.failed, 100u);
  EXPECT_GE(f.written, 8u) << "it wrote at the tier's pace until then";
  EXPECT_GT(f.failed, 50u);
  EXPECT_EQ(memory_->Usage().used_slots, f.written) << "what failed is not below";
  for (uint64_t k = 0; k < 100; k += 4) ASSERT_EQ(LoadVerified(*s, k, 4), 4u) << "host copies stay";
}

// One tenant's lookups wait on the shared tier 8 at a time at most: the
// rest answer from the local tiers at once (a counted "busy"), so a tenant's
// sessions cannot flood the cluster all nodes share.
TEST_F(BlockStoreNvmeTest, ATenantHasAtMostEightLookupsWaitingOnTheSharedTier) {
  lower_ = "shared";
  memory_latency_ns_ = 400'000'000;  // each probe's round trip
  Open(8);
  store_->SetSharedPolicy(2'000'000, SharedWrites::kDemoted);
  constexpr int kSessions = 12;
  std::vector<std::unique_ptr<SessionHoldings>> sessions;
  for (int i = 0; i < kSessions; ++i) sessions.push_back(Session());
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kSessions) std::this_thread::yield();
      std::vector<BlockKey> keys{KeyOf(1000 + i), KeyOf(2000 + i)};
      std::vector<BlockLocation> out(keys.size());
      uint64_t lease;
      auto hit = store_->Lookup(*sessions[i], keys, false, &lease, std::span(out));
      EXPECT_TRUE(hit.ok() && *hit == 0);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(stats_.remote_probes.Get(), 8u);
  EXPECT_EQ(stats_.remote_probes_busy.Get(), uint64_t{kSessions - 8});
  // Once they are answered, the next lookup asks again.
  std::vector<BlockKey> keys{KeyOf(3000)};
  std::vector<BlockLocation> out(1);
  uint64_t lease;
  ASSERT_TRUE(store_->Lookup(*sessions[0], keys, false, &lease, std::span(out)).ok());
  EXPECT_EQ(stats_.remote_probes.Get(), 9u);
}

// Write policy "reused" queues a write to the shared tier for each host hit
// of a leased lookup, holding the block until the write starts after the
// reply. A session that ends before that (its reply could not be posted)
// gives the blocks back: they can be evicted again.
TEST_F(BlockStoreNvmeTest, ASessionClosedWithPublishesQueuedGivesTheirBlocksBack) {
  lower_ = "shared";
  Open(8);
  store_->SetSharedPolicy(2000, SharedWrites::kReused);
  auto s = Session();
  Store(*s, 0, 8);
  EXPECT_EQ(LoadVerified(*s, 0, 8), 8u);
  store_->CloseSession(*s);  // no AfterReply: nothing went up
  EXPECT_EQ(stats_.remote_publishes.Get() + stats_.remote_publishes_failed.Get(), 0u);
  // The 8 blocks fill host memory; a store of 8 more must evict them all.
  auto s2 = Session();
  Store(*s2, 100, 8);
  EXPECT_EQ(LoadVerified(*s2, 100, 8), 8u);
}

// tiers.nvme.admission_min_uses = 2: host memory's evictions of blocks that
// requests used twice (stored, then looked up) are demoted; of blocks used
// once, dropped and counted. Off, both would be demoted.
TEST_F(BlockStoreNvmeTest, TheAdmissionGateDemotesBlocksUsedTwiceAndDropsTheRest) {
  nvme_admit_ = 2;
  Open(8);
  auto s = Session();
  Store(*s, 0, 8);  // a first use of each (its request stored it)
  EXPECT_EQ(LoadVerified(*s, 0, 2), 2u);  // 0, 1: a second use
  store_->AfterReply(*s);
  Store(*s, 100, 8);  // evicts 0..7
  SyncNvme();
  EXPECT_EQ(OnNvme(*s, 0, 2), 2u);
  EXPECT_EQ(OnNvme(*s, 2, 6), 0u);
  EXPECT_EQ(stats_.demotions.Get(), 2u);
  EXPECT_EQ(stats_.dropped_not_admitted.Get(), 6u);
  EXPECT_EQ(stats_.evictions_dropped.Get(), 6u);
  EXPECT_EQ(LoadVerified(*s, 0, 2), 2u) << "the admitted blocks come back whole";
}

// Engines that probe a request's whole chain on one session and lease only
// what they load on another (kvtier.vllm's scheduler and worker) flag the
// probe as the request's ask and the lease as not one. The ask teaches the
// policies and the hit counters; uses are what requests loaded and stored
// (an ask may find blocks the engine then does not load). Blocks 0, 1:
// stored, then asked for and leased (two uses: demoted). 2, 3: stored, then
// asked for and found but not loaded (one use). 4..7: asked for while
// missing, then stored (one use: dropped).
TEST_F(BlockStoreNvmeTest, AnAskTeachesAndWhatIsLoadedAndStoredCountsAsUsed) {
  nvme_admit_ = 2;
  Open(8);
  auto sched = Session();
  auto worker = Session();
  auto ask = [&](uint64_t from, uint64_t n) -> uint32_t {
    std::vector<BlockKey> keys;
    for (uint64_t i = from; i < from + n; ++i) keys.push_back(KeyOf(i));
    std::vector<BlockLocation> out(keys.size());
    uint64_t lease = 7;
    auto hit = store_->Lookup(*sched, keys, false, &lease, std::span(out), nullptr, nullptr, BlockStore::Ask::kYes);
    EXPECT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(lease, 0u) << "an ask without a lease pins nothing";
    store_->AfterReply(*sched);
    return hit.ok() ? *hit : 0u;
  };
  const uint64_t lookups = stats_.lookups.Get(), queried = stats_.blocks_queried.Get();
  const uint64_t hits = stats_.blocks_hit.Get(), probes = stats_.probes.Get();
  EXPECT_EQ(ask(0, 8), 0u);  // a first request: nothing there
  Store(*worker, 0, 8);      // its worker stores the blocks: a first use of each
  store_->AfterReply(*worker);
  EXPECT_EQ(ask(0, 4), 4u);  // a second request finds 0..3 and loads 0, 1
  EXPECT_EQ(LoadVerified(*worker, 0, 2, nullptr, nullptr, BlockStore::Ask::kNo), 2u);
  store_->AfterReply(*worker);
  EXPECT_EQ(stats_.lookups.Get() - lookups, 2u) << "the asks count, the lease does not";
  EXPECT_EQ(stats_.blocks_queried.Get() - queried, 12u);
  EXPECT_EQ(stats_.blocks_hit.Get() - hits, 4u) << "what the asks found";
  EXPECT_EQ(stats_.probes.Get(), probes) << "an ask is not a probe";
  Store(*worker, 100, 8);  // evicts 0..7
  SyncNvme();
  EXPECT_EQ(OnNvme(*worker, 0, 2), 2u) << "stored, then loaded: two uses";
  EXPECT_EQ(OnNvme(*worker, 2, 6), 0u) << "an ask that found or missed them is no use of its own";
  EXPECT_EQ(stats_.demotions.Get(), 2u);
  EXPECT_EQ(stats_.dropped_not_admitted.Get(), 6u);
}

// tiers.nvme.admission_min_uses = 3, one session. A lease counts its
// blocks' uses, a store skips what the session's last lease counted, and
// an unleased ask counts nothing and leaves that lease's blocks skipped:
// 0..3 stored (1), leased (2), stored again after an ask of 4..7 (still 2);
// 0, 1 leased again (3: demoted). 4..7 stored, then asked for twice (1).
TEST_F(BlockStoreNvmeTest, UsesAreLeasesAndStoresAndAStoreSkipsWhatItsSessionsLeaseCounted) {
  nvme_admit_ = 3;
  Open(8);
  auto s = Session();
  Store(*s, 0, 8);
  EXPECT_EQ(LoadVerified(*s, 0, 4, nullptr, nullptr, BlockStore::Ask::kNo), 4u);
  store_->AfterReply(*s);
  for (int twice = 0; twice < 2; ++twice) {
    std::vector<BlockKey> keys;
    for (uint64_t i = 4; i < 8; ++i) keys.push_back(KeyOf(i));
    std::vector<BlockLocation> out(keys.size());
    uint64_t lease = 0;
    ASSERT_EQ(*store_->Lookup(*s, keys, false, &lease, std::span(out), nullptr, nullptr, BlockStore::Ask::kYes), 4u);
    store_->AfterReply(*s);
  }
  // The request stores 0..3 although they are there (it computed them).
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 4; ++i) keys.push_back(KeyOf(i));
  std::vector<BlockLocation> out(keys.size());
  uint64_t ticket = 1;
  auto need = store_->StoreBegin(*s, keys, &ticket, std::span(out));
  ASSERT_TRUE(need.ok()) << need.status();
  EXPECT_EQ(*need, 0u);
  EXPECT_EQ(ticket, 0u);
  EXPECT_EQ(LoadVerified(*s, 0, 2, nullptr, nullptr, BlockStore::Ask::kNo), 2u);
  store_->AfterReply(*s);
  Store(*s, 100, 8);  // evicts 0..7
  SyncNvme();
  EXPECT_EQ(OnNvme(*s, 0, 2), 2u) << "stored and leased twice: three uses";
  EXPECT_EQ(OnNvme(*s, 2, 2), 0u) << "the store after their lease (and an ask) counted them again";
  EXPECT_EQ(OnNvme(*s, 4, 4), 0u) << "unleased asks counted uses";
}

// tiers.remote.admission_min_uses = 2 with write_policy "committed": a block
// committed after one lookup is not published; one committed after two
// (asked for again after it was gone) is.
TEST_F(BlockStoreNvmeTest, TheSharedTiersGateHoldsBackPublishesWithoutReuse) {
  lower_ = "shared";
  shared_admit_ = 2;
  Open(16);
  store_->SetSharedPolicy(2000, SharedWrites::kCommitted);
  auto s = Session();
  auto miss = [&](uint64_t from) {
    uint32_t hit = 99;
    EXPECT_EQ(LoadVerified(*s, from, 4, nullptr, &hit), 0u);
    EXPECT_EQ(hit, 0u);
    store_->AfterReply(*s);
  };
  miss(0);
  Store(*s, 0, 4);  // asked for once
  store_->AfterReply(*s);
  miss(10);
  miss(10);
  Store(*s, 10, 4);  // twice
  store_->AfterReply(*s);
  ASSERT_TRUE(testing::Eventually([&] { return stats_.remote_publishes.Get() >= 4; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(stats_.remote_publishes.Get(), 4u);
  EXPECT_EQ(stats_.remote_publishes_not_admitted.Get(), 4u);
  EXPECT_EQ(memory_->BlockStats().writes, 4u) << "the tier got the blocks asked for twice, and only those";
}

// Writes to the shared tier that fail (a cluster down or full) pause the
// policy's writes for a second instead of being queued again on every hit,
// and a block is queued once however often it is hit before its write.
TEST_F(BlockStoreNvmeTest, FailedPublishesPauseAndABlockIsQueuedOnce) {
  lower_ = "shared";
  Open(8);
  store_->SetSharedPolicy(2000, SharedWrites::kReused);
  memory_->FailWrites(true);
  auto s = Session();
  Store(*s, 0, 4);
  EXPECT_EQ(LoadVerified(*s, 0, 4), 4u);
  EXPECT_EQ(LoadVerified(*s, 0, 4), 4u);  // hit again before the reply
  store_->AfterReply(*s);
  ASSERT_TRUE(testing::Eventually([&] { return stats_.remote_publishes_failed.Get() >= 4; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(stats_.remote_publishes_failed.Get(), 4u) << "each block once";
  // Paused: hits now queue nothing.
  const uint64_t skipped = stats_.remote_publishes_skipped.Get();
  EXPECT_EQ(LoadVerified(*s, 0, 4), 4u);
  store_->AfterReply(*s);
  EXPECT_EQ(stats_.remote_publishes_skipped.Get(), skipped + 4);
  EXPECT_EQ(stats_.remote_publishes_failed.Get(), 4u);
  // A second later, with the tier back, the next hits write them.
  memory_->FailWrites(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(LoadVerified(*s, 0, 4), 4u);
  store_->AfterReply(*s);
  ASSERT_TRUE(testing::Eventually([&] { return stats_.remote_publishes.Get() >= 4; }));
  EXPECT_EQ(LoadVerified(*s, 0, 4), 4u);
  store_->AfterReply(*s);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(stats_.remote_publishes.Get(), 4u) << "published blocks are not written again";
  EXPECT_EQ(stats_.remote_publishes_failed.Get(), 4u);
}

// A tenant whose writes to the shared tier fail (its user revoked, a wrong
// password) pauses its own publishes, nobody else's: they paused every
// tenant's (alice published 16 of 128 while bob's writes failed).
TEST_F(BlockStoreNvmeTest, OneTenantsFailingPublishesPauseOnlyItsOwn) {
  lower_ = "shared";
  Open(32, {"alice", "bob"});  // room for all of alice's blocks while their publishes hold them
  store_->SetSharedPolicy(2000, SharedWrites::kCommitted);
  memory_->FailWrites(true, TenantHash("bob"));
  auto alice = Session(0), bob = Session(1);
  for (int round = 0; round < 4; ++round) {
    Store(*bob, 1000 + round * 4, 4);
    store_->AfterReply(*bob);
    ASSERT_TRUE(testing::Eventually([&] { return stats_.remote_publishes_failed.Get() >= 1; }));
    Store(*alice, round * 4, 4);
    store_->AfterReply(*alice);
  }
  ASSERT_TRUE(testing::Eventually([&] { return stats_.remote_publishes.Get() >= 16; }))
      << stats_.remote_publishes.Get() << " of alice's 16 published";
  EXPECT_EQ(stats_.remote_publishes.Get(), 16u);
  EXPECT_LE(stats_.remote_publishes_failed.Get(), 8u) << "bob's paused after its first failures";
}

// A tenant's lookups ask the shared tier about at most probe_blocks_per_s
// blocks a second: past that they answer from the local tiers (throttled),
// and another tenant's lookups still ask.
TEST_F(BlockStoreNvmeTest, AFloodOfProbesIsThrottledForTheFlooderOnly) {
  lower_ = "shared";
  shared_probe_blocks_per_s_ = 40;
  Open(8, {"alice", "bob"});
  store_->SetSharedPolicy(2'000'000, SharedWrites::kDemoted);
  auto alice = Session(0), bob = Session(1);
  auto lookup = [&](SessionHoldings& s, uint64_t first) {
    std::vector<BlockKey> keys{KeyOf(first), KeyOf(first + 1), KeyOf(first + 2), KeyOf(first + 3)};
    std::vector<BlockLocation> out(keys.size());
    uint64_t lease;
    ASSERT_TRUE(store_->Lookup(s, keys, false, &lease, std::span(out)).ok());
  };
  for (int i = 0; i < 100; ++i) lookup(*bob, 10000 + i * 4);
  const uint64_t asked = stats_.remote_probes.Get();
  EXPECT_LE(asked, 12u) << "about a second's worth of bob's (40 blocks, 4 a lookup), not 100";
  EXPECT_GE(stats_.remote_probes_throttled.Get(), 88u);
  for (int i = 0; i < 5; ++i) lookup(*alice, 50000 + i * 4);
  EXPECT_EQ(stats_.remote_probes.Get(), asked + 5) << "alice's lookups still ask";
  // The bucket refills.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  lookup(*bob, 90000);
  EXPECT_EQ(stats_.remote_probes.Get(), asked + 6);
}

// Blocks the shared tier holds join a lookup's hit as records this node
// keeps; a tenant has at most records_per_tenant of them, and blocks under
// min_block_bytes never go there at all (1-byte blocks once made a node
// index 164,672 records).
TEST_F(BlockStoreNvmeTest, ATenantIndexesAtMostItsRecordsFromTheSharedTier) {
  lower_ = "shared";
  shared_records_per_tenant_ = 6;
  Open(8, {"alice"});
  store_->SetSharedPolicy(2'000'000, SharedWrites::kDemoted);
  auto s = Session(0);
  // Another node's blocks: 16 of alice's in the shared tier.
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 16; ++i) {
    keys.push_back(KeyOf(700 + i));
    const BlockMeta meta{.ns = s->ns.id, .key = keys.back(), .payload_bytes = kBlock,
                         .tenant_hash = TenantHash("alice"), .block_tokens = s->ns.block_tokens};
    std::vector<std::byte> bytes(kBlock);
    testing::FillFromKey(keys.back(), bytes);
    std::promise<absl::Status> wrote;
    memory_->Put(kKeyAddressed, meta, bytes, IoPriority::kDemote, [&](absl::Status st) { wrote.set_value(st); });
    ASSERT_TRUE(wrote.get_future().get().ok());
  }
  std::vector<BlockLocation> out(keys.size());
  uint64_t lease;
  auto hit = store_->Lookup(*s, keys, false, &lease, std::span(out));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(stats_.remote_probe_found.Get(), 16u);
  EXPECT_EQ(*hit, 6u) << "the hit stops where the tenant's records end";
  EXPECT_EQ(stats_.remote_adoptions_refused.Get(), 10u);

  // A namespace of blocks under min_block_bytes never asks.
  auto tiny = std::make_unique<SessionHoldings>();
  NamespaceDescriptor d = testing::TestNamespace(1024);
  tiny->ns = std::move(namespaces_.Register(ComputeNamespaceId(d, "alice", ""), 0, d)).value();
  store_->RegisterNamespace(tiny->ns);
  const uint64_t probes = stats_.remote_probes.Get();
  std::vector<BlockLocation> out2(2);
  std::vector<BlockKey> two{KeyOf(1), KeyOf(2)};
  ASSERT_TRUE(store_->Lookup(*tiny, two, false, &lease, std::span(out2)).ok());
  EXPECT_EQ(stats_.remote_probes.Get(), probes) << "1 KiB blocks are below min_block_bytes";
}

}  // namespace
}  // namespace kvtier
