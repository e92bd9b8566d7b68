// SPDX-License-Identifier: Apache-2.0
// kvtier-replay --simulate on hand-made workloads whose answers are worked
// out by hand below.
#include "tools/replay/simulate.h"

#include "core/block_key.h"
#include "gtest/gtest.h"
#include "tests/tools/sim_keys.h"

namespace kvtier::tools {
namespace {

BlockKey K(uint32_t id) { return SimKey(id, 0x5a); }

// Requests of single blocks (block_tokens 1): a, b, c, a, b, c, ...
Workload Single(std::initializer_list<uint32_t> ids) {
  Workload w;
  w.block_tokens = 1;
  for (uint32_t id : ids) {
    Request r;
    r.prompt_tokens = 1;
    r.keys = {K(id)};
    w.requests.push_back(r);
  }
  return w;
}

SimRow Sim(const Workload& w, const std::string& policy, uint64_t blocks) {
  SimOptions o;
  o.capacity_blocks = blocks;
  auto r = SimulatePolicy(w, policy, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SimRow{};
}

TEST(SimulateTest, ACyclicPatternOneLargerThanTheTierDefeatsLruNotBelady) {
  // 1 2 3 1 2 3 1 2 3 with room for 2. LRU always evicts the block needed
  // next: 0 hits. Belady, by hand (a new block may be dropped at once when
  // its next use is the furthest): 3 is dropped at positions 2 and 5, so 1
  // and 2 hit at positions 3, 4, 6, 7: 4 hits.
  const Workload w = Single({1, 2, 3, 1, 2, 3, 1, 2, 3});
  EXPECT_EQ(Sim(w, "lru", 2).blocks_hit, 0u);
  EXPECT_EQ(Sim(w, "belady", 2).blocks_hit, 4u);
  const SimRow inf = [&] {
    SimOptions o;
    o.infinite = true;
    return *SimulatePolicy(w, "lru", o);
  }();
  EXPECT_EQ(inf.policy, "infinite");
  EXPECT_EQ(inf.blocks_hit, 6u);  // everything after the first pass
}

TEST(SimulateTest, HitsArePrefixesAndRatesAreCountedAsDocumented) {
  // Block size 2 tokens. Request 1: [10 11 12] (7 tokens: 3 full blocks).
  // Request 2: [10 11 99] -> prefix hit 2. Request 3: [20 11] -> 11 is
  // resident but the prefix misses at 20: 0 hits.
  Workload w;
  w.block_tokens = 2;
  auto add = [&](std::vector<uint32_t> ids, uint64_t tokens) {
    Request r;
    r.prompt_tokens = tokens;
    for (uint32_t id : ids) r.keys.push_back(K(id));
    w.requests.push_back(r);
  };
  add({10, 11, 12}, 7);
  add({10, 11, 99}, 6);
  add({20, 11}, 4);
  const SimRow r = Sim(w, "lru", 100);
  EXPECT_EQ(r.blocks_requested, 8u);
  EXPECT_EQ(r.blocks_hit, 2u);
  EXPECT_EQ(r.requests_hit, 1u);
  EXPECT_DOUBLE_EQ(r.token_hit_rate(), 2.0 / 8.0);
  EXPECT_DOUBLE_EQ(r.request_hit_rate(), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(r.reused_token_ratio(), 4.0 / 17.0);
  EXPECT_EQ(r.blocks_inserted, 5u);  // 10 11 12, 99, 20 (11 was resident)
}

TEST(SimulateTest, LeavesLeaveBeforeTheirParents) {
  // Room for 3. Request [1 2 3] then [4]: one block must go. Parents are
  // more recent than their children, so LRU drops 3 (the leaf) and [1 2]
  // still hits.
  Workload w;
  w.block_tokens = 1;
  for (auto ids : {std::vector<uint32_t>{1, 2, 3}, {4}, {1, 2}}) {
    Request r;
    r.prompt_tokens = ids.size();
    for (uint32_t id : ids) r.keys.push_back(K(id));
    w.requests.push_back(r);
  }
  for (const char* pol : {"lru", "s3fifo", "tinylfu", "belady"}) {
    EXPECT_EQ(Sim(w, pol, 3).blocks_hit, 2u) << pol;
  }
}

TEST(SimulateTest, TheTierNeverHoldsMoreThanItsCapacity) {
  Workload w;
  w.block_tokens = 1;
  for (uint32_t i = 0; i < 300; ++i) {
    Request r;
    r.prompt_tokens = 5;
    for (uint32_t j = 0; j < 5; ++j) r.keys.push_back(K((i * 7 + j * 13) % 97));
    w.requests.push_back(r);
  }
  for (const char* pol : {"lru", "s3fifo", "tinylfu", "belady"}) {
    const SimRow r = Sim(w, pol, 10);
    // Whatever was inserted and not evicted is resident.
    EXPECT_LE(r.blocks_inserted - r.evictions, 10u) << pol;
    EXPECT_GT(r.evictions, 0u) << pol;
  }
  // Belady is the bound.
  EXPECT_GE(Sim(w, "belady", 10).blocks_hit, Sim(w, "lru", 10).blocks_hit);
  EXPECT_GE(Sim(w, "belady", 10).blocks_hit, Sim(w, "s3fifo", 10).blocks_hit);
}

TEST(SimulateTest, BadInputIsAClearError) {
  const Workload w = Single({1, 2});
  SimOptions o;
  o.capacity_blocks = 4;
  auto bad = SimulatePolicy(w, "mru", o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown eviction policy"), std::string::npos);
  Workload big;
  big.block_tokens = 1;
  Request r;
  for (uint32_t i = 0; i < 5; ++i) r.keys.push_back(K(i));
  big.requests.push_back(r);
  auto too_big = SimulatePolicy(big, "lru", o);
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("more than the simulated tier holds"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::tools

namespace kvtier::tools {
namespace {

// Conversations: each turn extends the last; turns of 40 conversations
// interleave, 50 ms apart. Block size 512 tokens.
Workload Conversations(uint32_t conversations, uint32_t turns) {
  Workload w;
  w.block_tokens = 512;
  uint32_t next_id = 1;
  std::vector<std::vector<uint32_t>> history(conversations);
  uint64_t t = 0;
  for (uint32_t turn = 0; turn < turns; ++turn) {
    for (uint32_t c = 0; c < conversations; ++c) {
      for (int b = 0; b < 3; ++b) history[c].push_back(next_id++);
      Request r;
      r.arrival_ms = t;
      t += 50;
      r.prompt_tokens = history[c].size() * 512 + 100;
      for (uint32_t id : history[c]) r.keys.push_back(K(id));
      w.requests.push_back(r);
    }
  }
  return w;
}

TEST(SimulateTest, BlocksEvictedFromHostAreFoundOnNvme) {
  const Workload w = Conversations(40, 5);
  SimOptions o;
  o.capacity_blocks = 60;
  auto host_only = SimulatePolicy(w, "lru", o);
  o.nvme_blocks = 2000;
  auto with_nvme = SimulatePolicy(w, "lru", o);
  ASSERT_TRUE(host_only.ok() && with_nvme.ok());
  EXPECT_EQ(host_only->blocks_hit_nvme, 0u);
  EXPECT_GT(with_nvme->blocks_hit_nvme, 0u);
  EXPECT_GT(with_nvme->blocks_hit, host_only->blocks_hit);
  EXPECT_EQ(with_nvme->blocks_hit, with_nvme->blocks_hit_host + with_nvme->blocks_hit_nvme);
  EXPECT_GT(with_nvme->demotions, 0u);
  EXPECT_EQ(with_nvme->bytes_written_nvme, with_nvme->demotions * 512 * o.model.KvBytesPerToken());
  // Everything fits in 60 + 2000 blocks: every reuse hits, as with no limit.
  SimOptions inf;
  inf.infinite = true;
  EXPECT_EQ(with_nvme->blocks_hit, SimulatePolicy(w, "lru", inf)->blocks_hit);
}

TEST(SimulateTest, NvmeWritesReadCountsEachCopyReadOnceAndNotTheDeadOnes) {
  SimOptions o;
  o.capacity_blocks = 60;
  o.nvme_blocks = 2000;
  // One turn: nothing comes back, so no NVMe copy is ever read.
  auto once = SimulatePolicy(Conversations(40, 1), "lru", o);
  ASSERT_TRUE(once.ok());
  EXPECT_GT(once->demotions, 0u);
  EXPECT_EQ(once->nvme_writes_read, 0u);
  // Two turns: every NVMe hit is the first read of its copy; the second
  // turn's demotions are never read.
  auto twice = SimulatePolicy(Conversations(40, 2), "lru", o);
  ASSERT_TRUE(twice.ok());
  EXPECT_GT(twice->blocks_hit_nvme, 0u);
  EXPECT_EQ(twice->nvme_writes_read, twice->blocks_hit_nvme);
  EXPECT_LT(twice->nvme_writes_read, twice->demotions);
  // Five turns through a small host tier: copies are read again (NVMe keeps
  // them), and a second read of a copy does not count.
  auto five = SimulatePolicy(Conversations(40, 5), "lru", o);
  ASSERT_TRUE(five.ok());
  EXPECT_GT(five->nvme_writes_read, 0u);
  EXPECT_LT(five->nvme_writes_read, five->blocks_hit_nvme);
  EXPECT_LE(five->nvme_writes_read, five->demotions);
  // A copy NVMe evicted before its read is not a read write.
  o.nvme_blocks = 8;
  auto tiny = SimulatePolicy(Conversations(40, 2), "lru", o);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->nvme_writes_read, tiny->blocks_hit_nvme);
  EXPECT_LT(tiny->nvme_writes_read, twice->nvme_writes_read);
}

TEST(SimulateTest, ASlowNvmeTierNeverMakesARequestSlowerThanNoCache) {
  const Workload w = Conversations(40, 5);
  SimOptions o;
  o.capacity_blocks = 60;
  o.nvme_blocks = 2000;
  o.gpus = 1;
  o.nvme = TierSpeed{0.2e9, 2e-3};  // a 64 MiB block takes 0.34 s; recomputing it ~25-60 ms
  auto none = SimulatePolicy(w, "none", o);
  auto aware = SimulatePolicy(w, "lru", o);
  o.cost_aware_loads = false;
  auto always_load = SimulatePolicy(w, "lru", o);
  o.cost_aware_loads = true;
  o.demote = false;
  auto drop = SimulatePolicy(w, "lru", o);
  ASSERT_TRUE(none.ok() && aware.ok() && always_load.ok() && drop.ok());
  EXPECT_EQ(none->blocks_hit, 0u);
  EXPECT_GT(aware->nvme_hits_recomputed, 0u);
  for (size_t i = 0; i < w.requests.size(); ++i) {
    ASSERT_LE(aware->ttft_s[i], none->ttft_s[i] + 1e-9) << "request " << i;
  }
  EXPECT_LE(aware->TtftPercentile(95), always_load->TtftPercentile(95));
  EXPECT_LE(aware->TtftPercentile(95), drop->TtftPercentile(95) + 1e-9);
  EXPECT_GT(always_load->TtftPercentile(95), none->TtftPercentile(95)) << "the trap the cost model avoids";
}

}  // namespace
}  // namespace kvtier::tools
