// SPDX-License-Identifier: Apache-2.0
// Invariants every eviction policy keeps, under randomized operations, and
// scan resistance where a policy claims it.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "policies/adaptive_policy.h"
#include "policies/chain_guard.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

class PolicyInvariantsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(PolicyInvariantsTest, VictimsAreTrackedNeverPinnedAndMembershipMatchesAModel) {
  auto p = std::move(MakeEvictionPolicy(GetParam())).value();
  std::set<uint32_t> tracked, pinned;
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t h = rng() % 500;
    switch (rng() % 6) {
      case 0:
      case 1:
        p->InsertWithKey(h, (rng() % 700) + 1);
        tracked.insert(h);
        break;
      case 2:
        p->Touch(h);
        break;
      case 3:
        p->Remove(h);
        tracked.erase(h);
        pinned.erase(h);
        break;
      case 4:
        if (tracked.contains(h)) {
          if (pinned.contains(h)) pinned.erase(h); else pinned.insert(h);
        }
        break;
      case 5: {
        auto v = p->PickVictim([&](uint32_t x) { return !pinned.contains(x); });
        if (v) {
          ASSERT_TRUE(tracked.contains(*v)) << "victim " << *v << " is not tracked";
          ASSERT_FALSE(pinned.contains(*v)) << "victim " << *v << " is pinned";
          p->Remove(*v);
          tracked.erase(*v);
        } else {
          ASSERT_EQ(tracked.size(), pinned.size()) << "no victim although some block is evictable";
        }
        break;
      }
    }
    ASSERT_EQ(p->size(), tracked.size());
    for (int k = 0; k < 3; ++k) {
      const uint32_t x = rng() % 500;
      ASSERT_EQ(p->Contains(x), tracked.contains(x));
    }
  }
}

// Behind a ChainGuard, with chains served as a tier serves them (touch or
// insert leaves first, evict down to capacity, the request's own blocks
// pinned): a victim never has a resident child, is tracked and not pinned,
// and the tier never holds more than its capacity.
TEST_P(PolicyInvariantsTest, BehindAChainGuardLeavesGoBeforeTheirParents) {
  constexpr size_t kCapacity = 60;
  ChainGuard g(std::move(MakeEvictionPolicy(GetParam())).value());
  auto* adaptive = dynamic_cast<AdaptivePolicy*>(g.inner());
  if (adaptive != nullptr) adaptive->SetCapacityBlocks(kCapacity);
  // A forest: block b's parent is parent_of[b] (0: a root). Keys are b + 1.
  std::mt19937 rng(11);
  std::vector<uint32_t> parent_of(2000, 0);
  for (uint32_t b = 2; b < parent_of.size(); ++b) parent_of[b] = rng() % 3 == 0 ? 0 : 1 + rng() % (b - 1);
  std::set<uint32_t> resident;
  uint64_t evictions = 0;
  for (int req = 0; req < 20000; ++req) {
    // A chain: the first 20 blocks of the path from a root to a random block.
    std::vector<uint32_t> chain;
    for (uint32_t b = 1 + rng() % (parent_of.size() - 1); b != 0; b = parent_of[b]) chain.insert(chain.begin(), b);
    if (chain.size() > 20) chain.resize(20);
    if (adaptive != nullptr) {
      std::vector<uint64_t> keys;
      for (uint32_t b : chain) keys.push_back(b + 1);
      adaptive->Observe(keys);
    }
    if (g.ObservesRequests()) {
      std::vector<uint64_t> keys;
      for (uint32_t b : chain) keys.push_back(b + 1);
      size_t held = 0;
      while (held < chain.size() && resident.contains(chain[held])) ++held;
      g.ObserveRequest(keys, {}, 512, held);
    }
    for (size_t j = chain.size(); j-- > 0;) {
      const uint32_t b = chain[j];
      if (resident.insert(b).second) {
        g.InsertInChain(b, b + 1, j > 0 ? uint64_t{chain[j - 1]} + 1 : 0);
      } else {
        g.Touch(b);
      }
    }
    const std::set<uint32_t> pinned(chain.begin(), chain.end());
    while (resident.size() > kCapacity) {
      std::optional<uint32_t> v = g.PickVictim([&](uint32_t h) { return !pinned.contains(h); });
      ASSERT_TRUE(v.has_value()) << "request " << req;
      ASSERT_TRUE(resident.contains(*v));
      ASSERT_FALSE(pinned.contains(*v));
      for (uint32_t c : resident) {
        ASSERT_NE(parent_of[c], *v) << "block " << *v << " evicted before its child " << c;
      }
      ASSERT_EQ(g.children(*v + 1), 0u);
      g.Remove(*v);
      resident.erase(*v);
      ++evictions;
    }
    ASSERT_EQ(g.size(), resident.size());
    // The guard's lists of resident children match the forest.
    for (uint32_t b : {chain.front(), chain.back(), parent_of[chain.back()]}) {
      uint32_t kids = 0;
      for (uint32_t c : resident) kids += parent_of[c] == b && b != 0 ? 1 : 0;
      ASSERT_EQ(g.children(uint64_t{b} + 1), kids) << "block " << b << ", request " << req;
    }
  }
  EXPECT_GT(evictions, 1000u);
}

// A guard that reads each handle's key from its caller (as a host tier's
// slot table names each slot's block) chooses exactly the victims of one
// that keeps the keys itself. The caller's keys are set before an insert
// and cleared after the Remove, as the slot table's owners are.
TEST_P(PolicyInvariantsTest, AGuardReadingTheCallersKeysChoosesTheSameVictims) {
  constexpr size_t kCapacity = 50;
  struct Keys final : HandleKeys {
    std::vector<uint64_t> key = std::vector<uint64_t>(4000, 0);
    uint64_t KeyOf(uint32_t h) const override { return h < key.size() ? key[h] : 0; }
  } keys;
  ChainGuard own(std::move(MakeEvictionPolicy(GetParam())).value());
  ChainGuard read(std::move(MakeEvictionPolicy(GetParam())).value(), &keys);
  for (ChainGuard* g : {&own, &read}) {
    if (auto* a = dynamic_cast<AdaptivePolicy*>(g->inner())) a->SetCapacityBlocks(kCapacity);
  }
  std::mt19937 rng(23);
  std::vector<uint32_t> parent_of(1500, 0);
  for (uint32_t b = 2; b < parent_of.size(); ++b) parent_of[b] = rng() % 4 == 0 ? 0 : 1 + rng() % (b - 1);
  // Handles are not the blocks: each insert takes a free handle, as slots do.
  std::map<uint32_t, uint32_t> handle_of;  // resident block -> handle
  std::vector<uint32_t> free_handles;
  for (uint32_t h = 0; h < 4000; ++h) free_handles.push_back(3999 - h);
  uint64_t evictions = 0;
  for (int req = 0; req < 6000; ++req) {
    std::vector<uint32_t> chain;
    for (uint32_t b = 1 + rng() % (parent_of.size() - 1); b != 0; b = parent_of[b]) chain.insert(chain.begin(), b);
    if (chain.size() > 16) chain.resize(16);
    std::vector<uint64_t> chain_keys;
    for (uint32_t b : chain) chain_keys.push_back(b + 1);
    for (ChainGuard* g : {&own, &read}) {
      if (auto* a = dynamic_cast<AdaptivePolicy*>(g->inner())) a->Observe(chain_keys);
    }
    std::set<uint32_t> pinned;
    for (size_t j = chain.size(); j-- > 0;) {
      const uint32_t b = chain[j];
      auto it = handle_of.find(b);
      if (it != handle_of.end()) {
        own.Touch(it->second);
        read.Touch(it->second);
        pinned.insert(it->second);
        continue;
      }
      const uint32_t h = free_handles.back();
      free_handles.pop_back();
      handle_of[b] = h;
      keys.key[h] = b + 1;
      const uint64_t parent = j > 0 ? uint64_t{chain[j - 1]} + 1 : 0;
      own.InsertInChain(h, b + 1, parent, j * 16);
      read.InsertInChain(h, b + 1, parent, j * 16);
      pinned.insert(h);
    }
    while (handle_of.size() > kCapacity) {
      auto evictable = [&](uint32_t h) { return !pinned.contains(h); };
      const std::optional<uint32_t> v = own.PickVictim(evictable);
      ASSERT_EQ(read.PickVictim(evictable), v) << "request " << req;
      ASSERT_TRUE(v.has_value());
      own.Remove(*v);
      read.Remove(*v);
      handle_of.erase(static_cast<uint32_t>(keys.key[*v] - 1));
      keys.key[*v] = 0;
      free_handles.push_back(*v);
      ++evictions;
    }
    ASSERT_EQ(read.size(), own.size());
  }
  EXPECT_GT(evictions, 1000u);
}

// The guard files children in lists chosen by a hash of their parent's key;
// two parents whose children share a list still have only their own.
TEST(ChainGuardTest, ParentsWhoseChildrenShareAListKeepTheirOwnChildren) {
  ChainGuard g(MakeLruPolicy());
  // Two keys whose hashes agree in their top 16 bits (one list while the
  // guard has up to 2^16 lists): found by search.
  const uint64_t p1 = 1;
  uint64_t p2 = 2;
  auto top16 = [](uint64_t k) { return (k * 0x9e3779b97f4a7c15ull) >> 48; };
  while (top16(p2) != top16(p1)) ++p2;
  g.InsertInChain(0, p1, 0);
  g.InsertInChain(1, p2, 0);
  g.InsertInChain(2, 100, p1);
  g.InsertInChain(3, 101, p2);
  g.InsertInChain(4, 102, p2);
  EXPECT_EQ(g.children(p1), 1u);
  EXPECT_EQ(g.children(p2), 2u);
  g.Remove(2);
  EXPECT_EQ(g.children(p1), 0u);
  EXPECT_EQ(g.children(p2), 2u);
  // LRU picks handle 0 (p1, now childless): it goes, not a child of p2.
  EXPECT_EQ(g.PickVictim([](uint32_t) { return true; }), 0u);
  g.Remove(0);
  // Then handle 1 (p2): the guard takes its children first (in a shared
  // list, in the order swap-and-pop left them).
  std::set<uint32_t> kids;
  for (int i = 0; i < 2; ++i) {
    const std::optional<uint32_t> v = g.PickVictim([](uint32_t) { return true; });
    ASSERT_TRUE(v == 3u || v == 4u) << (v ? std::to_string(*v) : "none");
    kids.insert(*v);
    g.Remove(*v);
  }
  EXPECT_EQ(kids.size(), 2u);
  EXPECT_EQ(g.children(p2), 0u);
  EXPECT_EQ(g.PickVictim([](uint32_t) { return true; }), 1u);
}

// A block and its ancestor whose children share a list (as above): each
// must not seem to have the other's children. When they did (a 32-bit tag
// of the parent instead of its key, and two tags alike), neither block could
// ever be evicted and every pick walked the loop they made.
TEST(ChainGuardTest, AnAncestorSharingAListDoesNotLockTheChain) {
  ChainGuard g(MakeLruPolicy());
  // x's hash is a's with the lowest bit flipped: they agree in every other bit, so
  // they share a list at every table size (and had one 32-bit tag).
  constexpr uint64_t kMix = 0x9e3779b97f4a7c15ull;
  uint64_t inverse = kMix;  // Newton's iteration for kMix^-1 mod 2^64
  for (int i = 0; i < 6; ++i) inverse *= 2 - kMix * inverse;
  ASSERT_EQ(kMix * inverse, 1u);
  const uint64_t a = 1;
  const uint64_t x = ((a * kMix) ^ 1) * inverse;
  ASSERT_EQ((x * kMix) >> 1, (a * kMix) >> 1);
  // a -> b -> x -> y: x's children are filed where a's are.
  const uint64_t b = 0xb0b, y = 0x7e7;
  g.InsertInChain(0, a, 0);
  g.InsertInChain(1, b, a);
  g.InsertInChain(2, x, b);
  g.InsertInChain(3, y, x);
  EXPECT_EQ(g.children(a), 1u);
  EXPECT_EQ(g.children(x), 1u);
  // Leaves first, all the way up: y, x, b, a.
  for (uint32_t want : {3u, 2u, 1u, 0u}) {
    const std::optional<uint32_t> v = g.PickVictim([](uint32_t) { return true; });
    ASSERT_EQ(v, want);
    g.Remove(*v);
  }
  EXPECT_EQ(g.size(), 0u);
  EXPECT_EQ(g.PickVictim([](uint32_t) { return true; }), std::nullopt);
}

// A tier's life: 48,000 blocks through 1,000 slots (chains of 8, a quarter
// of the requests reusing an earlier chain), evictions through PickVictim
// and invalidations through Remove. What the policy keeps stays a small
// multiple of what it tracks. The adaptive policy's experts other than the
// leader never pick a victim, so S3-FIFO's lazily dropped queue entries
// piled up in them: ~1 entry per stored block, for good.
TEST_P(PolicyInvariantsTest, BookkeepingStaysBoundedByWhatItTracks) {
  constexpr size_t kCapacity = 1000;
  ChainGuard g(std::move(MakeEvictionPolicy(GetParam())).value());
  auto* adaptive = dynamic_cast<AdaptivePolicy*>(g.inner());
  if (adaptive != nullptr) adaptive->SetCapacityBlocks(kCapacity);
  std::mt19937 rng(17);
  std::map<uint64_t, uint32_t> slot_of;  // key -> slot
  std::vector<uint64_t> key_of(kCapacity + 64, 0);
  std::vector<uint32_t> free_slots;
  for (uint32_t h = kCapacity + 64; h-- > 0;) free_slots.push_back(h);
  uint64_t next_chain = 1;
  size_t most = 0;
  for (int req = 0; req < 8000; ++req) {
    const uint64_t chain = (rng() % 4 == 0 && next_chain > 1) ? 1 + rng() % next_chain : next_chain++;
    std::vector<uint64_t> keys;
    for (uint64_t j = 0; j < 8; ++j) keys.push_back(chain * 16 + j);
    // Blocks of 1,024 tokens: a chain that misses from its root computes
    // 8K tokens, arc-cutoff's cutoff, so its noted keys count here too.
    if (adaptive != nullptr) adaptive->Observe(keys, 1024);
    if (g.ObservesRequests()) {
      size_t held = 0;
      while (held < keys.size() && slot_of.contains(keys[held])) ++held;
      g.ObserveRequest(keys, {}, 1024, held);
    }
    for (size_t j = 0; j < keys.size(); ++j) {
      if (auto it = slot_of.find(keys[j]); it != slot_of.end()) {
        g.Touch(it->second);
        continue;
      }
      while (free_slots.empty() || slot_of.size() >= kCapacity) {
        std::optional<uint32_t> v = g.PickVictim([](uint32_t) { return true; });
        ASSERT_TRUE(v.has_value());
        g.Remove(*v);
        slot_of.erase(key_of[*v]);
        free_slots.push_back(*v);
      }
      const uint32_t h = free_slots.back();
      free_slots.pop_back();
      slot_of[keys[j]] = h;
      key_of[h] = keys[j];
      g.InsertInChain(h, keys[j], j > 0 ? keys[j - 1] : 0, j * 1024);
    }
    if (rng() % 10 == 0 && !slot_of.empty()) {  // an invalidation of one of this request's blocks
      auto it = slot_of.find(keys[rng() % keys.size()]);
      if (it == slot_of.end()) continue;
      g.Remove(it->second);
      free_slots.push_back(it->second);
      slot_of.erase(it);
    }
    ASSERT_EQ(g.size(), slot_of.size());
    most = std::max(most, g.bookkeeping());
    ASSERT_LE(g.bookkeeping(), 32 * std::max<size_t>(g.size(), kCapacity) + 4096)
        << "request " << req << ": " << g.bookkeeping() << " entries for " << g.size() << " blocks";
  }
  RecordProperty("most_bookkeeping", static_cast<int>(most));
}

// 100 slots. A hot set of 50 blocks used three times, then 1000 blocks used
// once each. Returns how many hot blocks are left.
size_t HotLeftAfterScan(const char* name) {
  auto p = std::move(MakeEvictionPolicy(name)).value();
  std::set<uint32_t> resident;
  auto access = [&](uint32_t h) {
    if (resident.contains(h)) {
      p->Touch(h);
      return;
    }
    p->InsertWithKey(h, h + 1);
    resident.insert(h);
    while (resident.size() > 100) {
      const uint32_t v = *p->PickVictim([](uint32_t) { return true; });
      p->Remove(v);
      resident.erase(v);
    }
  };
  for (int round = 0; round < 3; ++round) {
    for (uint32_t h = 0; h < 50; ++h) access(h);
  }
  for (uint32_t h = 1000; h < 2000; ++h) access(h);
  size_t hot_left = 0;
  for (uint32_t h = 0; h < 50; ++h) hot_left += resident.contains(h);
  return hot_left;
}

TEST_P(PolicyInvariantsTest, ScanResistanceIsWhatThePolicyClaims) {
  const std::string name = GetParam();
  if (name == "adaptive") {
    GTEST_SKIP() << "without requests to observe the adaptive policy is its first expert (LRU); "
                    "adaptive_policy_test covers scans";
  }
  if (name == "holds") {
    GTEST_SKIP() << "without requests to observe the holds policy is LRU; holds_policy_test covers what it learns";
  }
  if (name == "lru") {
    EXPECT_EQ(HotLeftAfterScan("lru"), 0u) << "LRU keeps nothing through a scan; the check is meaningless otherwise";
  } else {
    EXPECT_EQ(HotLeftAfterScan(GetParam()), 50u) << "the scan flushed the hot set";
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, PolicyInvariantsTest,
                         ::testing::Values("lru", "s3fifo", "s3fifo-deep", "tinylfu", "arc", "arc-cutoff", "adaptive", "holds"),
                         [](const auto& info) {
                           std::string n(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(TinyLfuPolicyTest, ABlockUsedOftenLongAgoWinsItsPlaceBackOverOneTimers) {
  // 20 slots. Block A (key 7) is used 5 times, then leaves; the history
  // outlives it, so when A comes back it is admitted to main while the
  // one-time blocks around it are not (with its count forgotten it would
  // tie with them and be evicted when it reached the window's end).
  auto p = MakeTinyLfuPolicy(0.1);
  std::set<uint32_t> resident;
  uint32_t next_slot = 0;
  std::map<uint64_t, uint32_t> slot_of;
  auto access = [&](uint64_t key) {
    if (auto it = slot_of.find(key); it != slot_of.end() && resident.contains(it->second)) {
      p->Touch(it->second);
      return;
    }
    const uint32_t h = next_slot++;
    slot_of[key] = h;
    p->InsertWithKey(h, key);
    resident.insert(h);
    while (resident.size() > 20) {
      const uint32_t v = *p->PickVictim([](uint32_t) { return true; });
      p->Remove(v);
      resident.erase(v);
    }
  };
  for (int i = 0; i < 5; ++i) access(7);
  // A leaves the tier (evicted elsewhere, or invalidated), one-time blocks fill it.
  p->Remove(slot_of[7]);
  resident.erase(slot_of[7]);
  for (uint64_t k = 100; k < 140; ++k) access(k);
  access(7);  // back, with a long history
  for (uint64_t k = 200; k < 260; ++k) access(k);
  EXPECT_TRUE(resident.contains(slot_of[7])) << "A lost its place to blocks used once";
}

}  // namespace
}  // namespace kvtier
