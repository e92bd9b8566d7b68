// SPDX-License-Identifier: Apache-2.0
#include "policies/ghost_fifo.h"

#include <deque>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

// The reference: a deque of keys, oldest first, and a set of them.
struct ReferenceFifo {
  std::deque<uint64_t> order;
  absl::flat_hash_set<uint64_t> live;
  void Push(uint64_t k) {
    Erase(k);
    order.push_back(k);
    live.insert(k);
  }
  bool Erase(uint64_t k) {
    if (!live.erase(k)) return false;
    order.erase(std::find(order.begin(), order.end(), k));
    return true;
  }
  std::optional<uint64_t> DropOldest() {
    if (order.empty()) return std::nullopt;
    const uint64_t k = order.front();
    order.pop_front();
    live.erase(k);
    return k;
  }
};

// Random pushes (keys repeat), erasures, drops and lookups against the
// reference, through several ring and table layouts (growth, compaction of
// erased entries, shrinking). Every key of the range is checked from time to
// time, and each drop must forget exactly the reference's oldest key.
TEST(GhostFifoTest, MatchesAReferenceFifoUnderRandomOperations) {
  std::mt19937_64 rng(7);
  GhostFifo g;
  ReferenceFifo ref;
  constexpr uint64_t kKeys = 3000;
  for (int step = 0; step < 200000; ++step) {
    const uint64_t k = 1 + rng() % kKeys;
    // Phases: grow, churn, shrink, so layouts change in both directions.
    const int phase = (step / 25000) % 3;
    const int op = static_cast<int>(rng() % 100);
    const int push_below = phase == 0 ? 70 : phase == 1 ? 45 : 20;
    if (op < push_below) {
      g.Push(k);
      ref.Push(k);
    } else if (op < push_below + 20) {
      ASSERT_EQ(g.Erase(k), ref.Erase(k)) << "step " << step;
    } else if (op < push_below + 30) {
      const std::optional<uint64_t> oldest = ref.DropOldest();
      ASSERT_EQ(g.DropOldest(), oldest.has_value()) << "step " << step;
      if (oldest) {
        ASSERT_FALSE(g.Contains(*oldest)) << "step " << step;
      }
    } else {
      ASSERT_EQ(g.Contains(k), ref.live.contains(k)) << "step " << step;
    }
    ASSERT_EQ(g.size(), ref.live.size()) << "step " << step;
    if (step % 5000 == 0) {
      for (uint64_t key = 1; key <= kKeys; ++key) ASSERT_EQ(g.Contains(key), ref.live.contains(key)) << key;
    }
  }
  // Drained, oldest first, to nothing.
  while (std::optional<uint64_t> oldest = ref.DropOldest()) {
    ASSERT_TRUE(g.Contains(*oldest));
    ASSERT_TRUE(g.DropOldest());
    ASSERT_FALSE(g.Contains(*oldest));
  }
  EXPECT_FALSE(g.DropOldest());
  EXPECT_EQ(g.size(), 0u);
}

// A policy keeps its ghosts at a bound by dropping the oldest: memory per
// ghost stays small (what the compact layout is for), whatever share of
// pushes are erased again, and goes back when the ghosts do.
TEST(GhostFifoTest, MemoryPerGhostStaysSmallAndIsGivenBack) {
  constexpr size_t kCap = 200000;
  GhostFifo g;
  std::mt19937_64 rng(11);
  size_t most = 0;
  for (uint64_t k = 1; k <= 5 * kCap; ++k) {
    g.Push(k);
    // A third of the ghosts come back (erased) before they age out.
    if (k > 10 && rng() % 3 == 0) g.Erase(k - 1 - rng() % 10);
    while (g.size() > kCap) ASSERT_TRUE(g.DropOldest());
    if (k > kCap) most = std::max(most, g.memory_bytes());
  }
  EXPECT_EQ(g.size(), kCap);
  // 4 to 4.5 B a ghost in the ring, 4.5 to 5 in the table.
  EXPECT_LE(most, 10 * kCap) << most / double(kCap) << " B a ghost";
  // The oldest are the ones forgotten: the newest kCap pushes that were not
  // erased are all there.
  EXPECT_TRUE(g.Contains(5 * kCap));
  EXPECT_FALSE(g.Contains(1));
  while (g.size() > 100) ASSERT_TRUE(g.DropOldest());
  EXPECT_LE(g.memory_bytes(), 64 * 1024u);
}

// Pushing the same key again moves it to the newest place: it outlives
// ghosts pushed after its first push.
TEST(GhostFifoTest, PushingAGhostAgainMakesItTheNewest) {
  GhostFifo g;
  for (uint64_t k = 1; k <= 100; ++k) g.Push(k);
  g.Push(1);
  for (int i = 0; i < 99; ++i) ASSERT_TRUE(g.DropOldest());
  EXPECT_EQ(g.size(), 1u);
  EXPECT_TRUE(g.Contains(1));
  EXPECT_FALSE(g.Contains(100));
}

}  // namespace
}  // namespace kvtier
