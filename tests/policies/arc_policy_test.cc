// SPDX-License-Identifier: Apache-2.0
// ARC adapts the split between its recency and frequency lists: it must do
// as well as LRU where recency wins and keep a hot set that a scan would
// flush out of LRU, and its ghosts stay bounded by the blocks it tracks.
#include <deque>
#include <optional>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

// Single-block requests through a tier of `cap` blocks; returns the hits.
uint64_t HitsOf(const std::string& name, const std::vector<uint64_t>& keys, size_t cap) {
  auto p = std::move(MakeEvictionPolicy(name)).value();
  std::set<uint32_t> resident;
  uint64_t hits = 0;
  for (uint64_t k : keys) {
    const uint32_t h = static_cast<uint32_t>(k);
    if (resident.contains(h)) {
      ++hits;
      p->Touch(h);
      continue;
    }
    p->InsertWithKey(h, k);
    resident.insert(h);
    while (resident.size() > cap) {
      auto v = p->PickVictim([&](uint32_t x) { return x != h; });
      EXPECT_TRUE(v.has_value());
      if (!v) break;
      p->Remove(*v);
      resident.erase(*v);
    }
  }
  return hits;
}

TEST(ArcPolicyTest, KeepsAHotSetThatScansFlushOutOfLru) {
  // 50 hot blocks asked round-robin (used twice, they are frequent), then
  // one every other request between blocks asked once: the hot set comes
  // back after 100 requests, 50 of them new, in a tier of 80.
  std::vector<uint64_t> keys;
  for (int i = 0; i < 1000; ++i) keys.push_back(1 + i % 50);
  uint64_t next = 1000;
  for (int i = 0; i < 40000; ++i) keys.push_back(i % 2 == 0 ? 1 + (i / 2) % 50 : next++);
  const uint64_t lru = HitsOf("lru", keys, 80);
  const uint64_t arc = HitsOf("arc", keys, 80);
  EXPECT_LT(lru, 2000u) << "LRU loses the hot set to the scan";
  EXPECT_GT(arc, 15000u) << "ARC keeps it (lru " << lru << ")";
}

TEST(ArcPolicyTest, WhereRecencyWinsItDoesAsWellAsLru) {
  // Each block asked twice, the second time 60 requests later (119 distinct
  // blocks in between), in a tier of 150: recency hits every second use.
  std::vector<uint64_t> keys;
  for (int i = 0; i < 20000; ++i) {
    keys.push_back(100000 + i);
    if (i >= 60) keys.push_back(100000 + i - 60);
  }
  const uint64_t lru = HitsOf("lru", keys, 150);
  const uint64_t arc = HitsOf("arc", keys, 150);
  EXPECT_GT(lru, 19000u);
  EXPECT_GE(double(arc), 0.95 * double(lru));
}

// Ghosts outlive churn: one block evicted and brought back again and again
// leaves stale entries in the ghost FIFOs, and trimming them must not take
// the live ghosts with them (it did: a trim measured against the live
// ghosts' count removed live ones until the list was empty). A block whose
// key is still a ghost comes back into the frequency list, so a new block
// in the recency list goes before it.
TEST(ArcPolicyTest, ChurnDoesNotEraseLiveGhosts) {
  auto p = MakeArcPolicy();
  for (uint32_t h = 0; h < 100; ++h) {
    p->InsertWithKey(h, h + 1);
    p->Touch(h);  // frequent
  }
  for (uint32_t h = 0; h < 30; ++h) p->Remove(h);  // keys 1..30: ghosts of the frequency list
  for (int i = 0; i < 500; ++i) {
    p->InsertWithKey(200, 5000);
    p->Remove(200);
  }
  p->InsertWithKey(0, 1);      // back while a ghost: frequency list
  p->InsertWithKey(300, 777);  // new: recency list
  auto all = [](uint32_t) { return true; };
  EXPECT_EQ(p->PickVictim(all), std::optional<uint32_t>(300)) << "key 1's ghost was forgotten";
}

TEST(ArcPolicyTest, GhostsStayBoundedByTheTrackedBlocks) {
  auto p = MakeArcPolicy();
  std::mt19937_64 rng(3);
  std::set<uint32_t> tracked;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t h = rng() % 300;
    if (tracked.contains(h)) {
      if (rng() % 2) {
        p->Remove(h);
        tracked.erase(h);
      } else {
        p->Touch(h);
      }
    } else {
      p->InsertWithKey(h, rng() % 100000 + 1);  // keys come and go
      tracked.insert(h);
    }
    ASSERT_LE(p->bookkeeping(), 6 * p->size() + 6 * 64 + 64) << "at step " << i;
  }
}

}  // namespace
}  // namespace kvtier
