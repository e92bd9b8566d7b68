// SPDX-License-Identifier: Apache-2.0
// ARC adapts the split between its recency and frequency lists: it must do
// as well as LRU where recency wins and keep a hot set that a scan would
// flush out of LRU, and its ghosts stay bounded by the blocks it tracks.
#include <deque>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

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

// A request through a tier the way kvtierd drives it: its ask (the chain,
// of which the tiers hold the first `held`), then what it computed stored
// leaves first, each block at its position. Keys first .. first + n - 1;
// handle = key.
void AskAndStore(EvictionPolicy& p, uint64_t first, size_t n, size_t held, uint32_t block_tokens,
                 std::set<uint32_t>& resident) {
  std::vector<uint64_t> chain;
  for (size_t j = 0; j < n; ++j) chain.push_back(first + j);
  if (p.ObservesRequests()) p.ObserveRequest(chain, {}, block_tokens, held);
  for (size_t j = n; j-- > 0;) {
    const uint32_t h = static_cast<uint32_t>(chain[j]);
    if (resident.insert(h).second) {
      p.InsertAt(h, chain[j], j * block_tokens);
    } else {
      p.Touch(h);
    }
  }
}

// What goes first after 20 one-block requests (keys 1..20) and one more
// request of n blocks (keys 1001..), of which `held` were held.
std::optional<uint32_t> FirstVictimAfter(const std::string& name, size_t n, size_t held, uint32_t block_tokens) {
  auto p = std::move(MakeEvictionPolicy(name)).value();
  std::set<uint32_t> resident;
  for (uint64_t k = 1; k <= 20; ++k) AskAndStore(*p, k, 1, 0, block_tokens, resident);
  // A held prefix: the request's first `held` blocks were stored before (by
  // a request whose tokens were not known: no cutoff).
  if (held > 0) AskAndStore(*p, 1001, held, 0, 0, resident);
  AskAndStore(*p, 1001, n, held, block_tokens, resident);
  return p->PickVictim([](uint32_t) { return true; });
}

// A request that computes 8K tokens or more (16 blocks of 512) is a scan to
// arc-cutoff: its blocks enter the recency list at the cold end and go
// before the blocks older requests brought. Shorter ones, or long ones
// mostly held, enter at the front as in ARC.
TEST(ArcPolicyTest, ACutoffSendsALongComputedPromptToTheColdEnd) {
  // The request's leaf: its run entered leaves first, each block just warmer
  // than the one before, so the leaf is coldest and the guard a tier keeps
  // need not walk down from the root.
  const auto leaf = [](size_t n) { return std::optional<uint32_t>(static_cast<uint32_t>(1000 + n)); };
  EXPECT_EQ(FirstVictimAfter("arc", 20, 0, 512), std::optional<uint32_t>(1)) << "ARC: the oldest first";
  EXPECT_EQ(FirstVictimAfter("arc-cutoff", 20, 0, 512), leaf(20)) << "20 blocks computed: cold";
  EXPECT_EQ(FirstVictimAfter("arc-cutoff", 16, 0, 512), leaf(16)) << "exactly the cutoff: cold";
  EXPECT_EQ(FirstVictimAfter("arc-cutoff", 15, 0, 512), std::optional<uint32_t>(1)) << "7.5K tokens: not a scan";
  // 30 blocks, 20 of them held: 10 computed, under the cutoff.
  EXPECT_EQ(FirstVictimAfter("arc-cutoff", 30, 20, 512), std::optional<uint32_t>(1));
  // 40 blocks, 20 held: 20 computed.
  EXPECT_EQ(FirstVictimAfter("arc-cutoff", 40, 20, 512), leaf(40));
  // Tokens, not blocks: 20 blocks of 64 tokens are 1,280.
  EXPECT_EQ(FirstVictimAfter("arc-cutoff", 20, 0, 64), std::optional<uint32_t>(1));
  EXPECT_EQ(FirstVictimAfter("arc-cutoff", 20, 0, 0), std::optional<uint32_t>(1)) << "tokens unknown: no cutoff";
  EXPECT_FALSE(MakeArcPolicy()->ObservesRequests());
  EXPECT_TRUE(MakeArcPolicy(kArcCutoffOptions)->ObservesRequests());
  EXPECT_EQ(MakeArcPolicy(kArcCutoffOptions)->name(), "arc-cutoff");
}

// The adaptive policy's shadows pass a sample of the chain with each
// entry's depth: two sampled blocks 20 deep apart stand for 21 computed.
TEST(ArcPolicyTest, ACutoffCountsASampledChainByItsDepths) {
  auto p = MakeArcPolicy(kArcCutoffOptions);
  for (uint32_t h = 1; h <= 5; ++h) p->InsertWithKey(h, h);
  const std::vector<uint64_t> sampled = {1001, 1002};
  const std::vector<uint32_t> depths = {0, 20};
  p->ObserveRequest(sampled, depths, 512, 0);
  p->InsertWithKey(1002, 1002);
  p->InsertWithKey(1001, 1001);
  EXPECT_EQ(p->PickVictim([](uint32_t) { return true; }), std::optional<uint32_t>(1002));
  const std::vector<uint32_t> close = {0, 3};  // 4 blocks: not a scan
  p->ObserveRequest(std::vector<uint64_t>{2001, 2002}, close, 512, 0);
  p->InsertWithKey(2002, 2002);
  p->InsertWithKey(2001, 2001);
  EXPECT_EQ(p->PickVictim([](uint32_t h) { return h > 2000; }), std::optional<uint32_t>(2002)) << "the older first";
}

// A long prompt that is reused pays one miss: evicted from the cold end, it
// is a ghost, and when it comes back (long again) it enters the frequency
// list at its front, kept over the blocks used twice before it.
TEST(ArcPolicyTest, ACutoffBlockThatComesBackIsKept) {
  auto p = MakeArcPolicy(kArcCutoffOptions);
  std::set<uint32_t> resident;
  for (int use = 0; use < 2; ++use) {
    for (uint64_t k = 1; k <= 60; ++k) AskAndStore(*p, k, 1, 0, 512, resident);  // twice: frequent
  }
  AskAndStore(*p, 1001, 20, 0, 512, resident);
  auto all = [](uint32_t) { return true; };
  for (int i = 0; i < 20; ++i) {  // the long prompt's blocks go first, all of them, leaves first
    const std::optional<uint32_t> v = p->PickVictim(all);
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(*v, 1020u - i) << "eviction " << i;
    p->Remove(*v);
    resident.erase(*v);
  }
  AskAndStore(*p, 1001, 20, 0, 512, resident);  // back: ghosts, into the frequency list
  for (uint64_t k = 2001; k <= 2010; ++k) AskAndStore(*p, k, 1, 0, 512, resident);  // new, recency list
  for (int i = 0; i < 30; ++i) {
    const std::optional<uint32_t> v = p->PickVictim(all);
    ASSERT_TRUE(v.has_value());
    EXPECT_FALSE(*v > 1000 && *v <= 1020) << "eviction " << i << ": the prompt that came back goes before " << *v;
    p->Remove(*v);
    resident.erase(*v);
  }
}

// Runs leave from their leaves, the latest run first, and a prompt stored
// in two chunks (the engine stores what each step computed) leaves as one
// run: its deeper chunk before the shallower one.
TEST(ArcPolicyTest, ACutoffEvictsTheLatestRunFirstEachFromItsLeaves) {
  auto p = MakeArcPolicy(kArcCutoffOptions);
  for (uint32_t h = 1; h <= 5; ++h) p->InsertWithKey(h, h);
  std::vector<uint64_t> a, b;
  for (uint64_t j = 0; j < 32; ++j) a.push_back(1001 + j);
  for (uint64_t j = 0; j < 16; ++j) b.push_back(2001 + j);
  p->ObserveRequest(a, {}, 512, 0);
  for (size_t j = 16; j-- > 0;) p->InsertAt(static_cast<uint32_t>(a[j]), a[j], j * 512);  // a's first chunk
  p->ObserveRequest(b, {}, 512, 0);
  for (size_t j = 16; j-- > 0;) p->InsertAt(static_cast<uint32_t>(b[j]), b[j], j * 512);
  for (size_t j = 32; j-- > 16;) p->InsertAt(static_cast<uint32_t>(a[j]), a[j], j * 512);  // its second
  std::vector<uint32_t> order;
  for (int i = 0; i < 48; ++i) {
    const std::optional<uint32_t> v = p->PickVictim([](uint32_t) { return true; });
    ASSERT_TRUE(v.has_value());
    order.push_back(*v);
    p->Remove(*v);
  }
  std::vector<uint32_t> want;
  for (uint32_t k = 1032; k >= 1017; --k) want.push_back(k);  // a's second chunk, stored last
  for (uint32_t k = 2016; k >= 2001; --k) want.push_back(k);  // b
  for (uint32_t k = 1016; k >= 1001; --k) want.push_back(k);  // a's first chunk, under its second
  EXPECT_EQ(order, want);
  EXPECT_EQ(p->PickVictim([](uint32_t) { return true; }), std::optional<uint32_t>(1));
}

// A block noted at one ask (past its miss) but not stored, because a lower
// tier held it, is found held by a later ask: the note is forgotten, and
// when a load brings it into the tier it enters at the front.
TEST(ArcPolicyTest, ACutoffForgetsANoteWhenTheBlockIsFoundHeld) {
  auto p = MakeArcPolicy(kArcCutoffOptions);
  for (uint32_t h = 1; h <= 5; ++h) p->InsertWithKey(h, h);
  std::vector<uint64_t> chain;
  for (uint64_t k = 1001; k <= 1020; ++k) chain.push_back(k);
  p->ObserveRequest(chain, {}, 512, 0);   // noted
  p->ObserveRequest(chain, {}, 512, 20);  // all held now
  p->InsertWithKey(1001, 1001);           // promoted by the load
  EXPECT_EQ(p->PickVictim([](uint32_t) { return true; }), std::optional<uint32_t>(1));
  EXPECT_EQ(p->bookkeeping(), p->size()) << "no note left";
}

// Asks whose computed blocks are never stored (the engine gave up) leave
// noted keys behind: at most 65,536 of them, the oldest forgotten first,
// and a forgotten one is stored as any other block.
TEST(ArcPolicyTest, ACutoffsNotedKeysStayBounded) {
  auto p = MakeArcPolicy(kArcCutoffOptions);
  std::vector<uint64_t> chain(1000);
  for (uint64_t r = 0; r < 100; ++r) {
    for (uint64_t j = 0; j < chain.size(); ++j) chain[j] = 1'000'000 + r * 1000 + j;
    p->ObserveRequest(chain, {}, 512, 0);
    ASSERT_LE(p->bookkeeping(), size_t{1} << 16);
  }
  EXPECT_EQ(p->bookkeeping(), size_t{1} << 16);
  for (uint32_t h = 1; h <= 5; ++h) p->InsertWithKey(h, h);
  p->InsertWithKey(6, 1'000'000);  // noted first, forgotten since: the front
  EXPECT_EQ(p->PickVictim([](uint32_t) { return true; }), std::optional<uint32_t>(1));
  p->InsertWithKey(7, 1'099'999);  // noted last: the cold end
  EXPECT_EQ(p->PickVictim([](uint32_t) { return true; }), std::optional<uint32_t>(7));
}

}  // namespace
}  // namespace kvtier
