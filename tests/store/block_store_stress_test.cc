// SPDX-License-Identifier: Apache-2.0
// Sessions on several threads store, look up with leases, load, release and
// invalidate over a small host tier that is always evicting. Afterwards every
// slot must be accounted for and every load must have pointed at a slot that
// held the block's own bytes. Run under --tsan for the locking.
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "store/block_store.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

// `opts` and `quota` choose what evicts besides a full arena: the background
// reclaimer, a token quota.
void Stress(const BlockStore::Options& opts, TenantQuota quota, DaemonStats& stats) {
  auto cache = std::move(BlockStore::Create(opts, &stats)).value();
  auto host = std::move(HostTier::Create({"stress", 64 * 4096, false})).value();
  HostTier* tier = host.get();
  ASSERT_TRUE(cache->AddTenant("t", std::move(host), quota).ok());
  cache->StartBackgroundReclaim();
  constexpr int kThreads = 4;
#ifdef KVTIER_TSAN
  constexpr int kOps = 3000;
#else
  constexpr int kOps = 20000;
#endif
  std::atomic<uint64_t> bad_bytes{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      SessionHoldings s;
      s.ns.handle = 0;
      s.ns.tenant = 0;
      s.ns.block_bytes = 4096;
      s.ns.block_tokens = 16;
      std::mt19937_64 rng(t + 1);
      for (int i = 0; i < kOps; ++i) {
        std::vector<BlockKey> keys;
        const uint64_t base = rng() % 200;
        for (uint64_t k = 0; k < 1 + rng() % 4; ++k) keys.push_back(testing::KeyOf(base + k));
        std::vector<BlockLocation> out(keys.size());
        switch (rng() % 4) {
          case 0:
          case 1: {
            uint64_t ticket;
            auto n = cache->StoreBegin(s, keys, &ticket, std::span(out));
            if (!n.ok()) break;  // all pinned by other threads right now
            for (size_t k = 0; k < keys.size(); ++k) {
              if (out[k].needed) {
                testing::FillFromKey(keys[k], {tier->arena_base() + out[k].arena_offset, 4096});
              }
            }
            if (ticket) {
              if (rng() % 10 == 0) {
                (void)cache->StoreAbort(s, ticket);
              } else {
                cache->StoreCommit(s, ticket, false, [](absl::Status) {});
              }
            }
            break;
          }
          case 2: {
            uint64_t lease;
            auto n = cache->Lookup(s, keys, true, &lease, std::span(out));
            ASSERT_TRUE(n.ok());
            if (*n == 0) break;
            hits += *n;
            std::optional<LoadOutcome> lo = cache->Load(s, lease, std::span(keys).first(*n), [](LoadOutcome) {});
            ASSERT_TRUE(lo.has_value() && lo->status.ok());
            for (uint32_t k = 0; k < *n; ++k) {
              if (!testing::MatchesKey(keys[k], {tier->arena_base() + lo->locations[k].arena_offset, 4096})) ++bad_bytes;
            }
            ASSERT_TRUE(cache->Release(s, lease).ok());
            break;
          }
          case 3:
            if (rng() % 8 == 0) (void)cache->Invalidate(s, keys);
            break;
        }
      }
      cache->CloseSession(s);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad_bytes.load(), 0u) << "a leased block pointed at another block's bytes";
  EXPECT_GT(hits.load(), 0u);
  EXPECT_GT(stats.evictions.Get(), 0u) << "the tier was meant to be under pressure";
  // The reclaimer frees a batch's slots after it takes the victims out of the
  // index: stop it so that the books below are read between batches.
  cache->StopBackgroundReclaim();
  const TenantUsage u = cache->Usage()[0];
  EXPECT_EQ(u.pinned_blocks, 0u);
  EXPECT_EQ(u.blocks, cache->indexed_blocks()) << "every used slot belongs to an indexed block";
  EXPECT_LE(u.used_bytes, u.capacity_bytes);
  EXPECT_EQ(u.host_tokens, u.blocks * 16) << "token accounting drifted";
  if (quota.host_tokens != 0) {
    EXPECT_LE(u.host_tokens, quota.host_tokens);
  }
}

TEST(BlockStoreStressTest, ConcurrentSessionsKeepTheCacheConsistent) {
  DaemonStats stats;
  Stress({}, {}, stats);
}

// The same with the background reclaimer evicting beside the sessions and a
// token quota below the arena.
TEST(BlockStoreStressTest, WithBackgroundReclaimAndATokenQuota) {
  DaemonStats stats;
  Stress({.high_watermark = 0.6, .low_watermark = 0.4}, {.host_tokens = 48 * 16}, stats);
  EXPECT_GT(stats.evictions_background.Get(), 0u);
  EXPECT_GT(stats.evictions_for_quota.Get() + stats.evictions_background.Get(), 0u);
}

}  // namespace
}  // namespace kvtier
