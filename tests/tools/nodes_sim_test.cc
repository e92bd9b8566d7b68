// SPDX-License-Identifier: Apache-2.0
// kvtier-replay --simulate --nodes on hand-made workloads whose answers are
// worked out by hand below.
#include "tools/replay/nodes_sim.h"

#include "gtest/gtest.h"
#include "tests/tools/sim_keys.h"

namespace kvtier::tools {
namespace {

BlockKey K(uint32_t id) { return SimKey(id, 0xa5); }

// One request per chain (block_tokens 1; ids name the blocks).
Workload Chains(std::initializer_list<std::initializer_list<uint32_t>> chains) {
  Workload w;
  w.block_tokens = 1;
  uint64_t t = 0;
  for (const auto& chain : chains) {
    Request r;
    r.arrival_ms = t++;
    r.prompt_tokens = chain.size();
    for (uint32_t id : chain) r.keys.push_back(K(id));
    r.stream = static_cast<uint32_t>(w.requests.size());  // as a trace has it: no conversations
    w.requests.push_back(r);
  }
  return w;
}

NodesSimOptions Opts(uint32_t nodes, const std::string& routing, uint64_t host_blocks, uint64_t remote_blocks,
                     const std::string& write_policy = "demoted") {
  NodesSimOptions o;
  o.nodes = nodes;
  o.routing = routing;
  o.node.capacity_blocks = host_blocks;
  o.node.policies = {"lru"};
  o.node.cost_aware_loads = false;  // hits alone (ARemoteHitSlowerThanRecomputingIsRecomputed prices them)
  o.remote_blocks = remote_blocks;
  o.write_policy = write_policy;
  return o;
}

NodesSimRow Sim(const Workload& w, const NodesSimOptions& o) {
  auto r = SimulateNodes(w, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : NodesSimRow{};
}

TEST(NodesSimTest, RoundRobinSendsTheRepeatElsewhereAndOnlyThePoolFindsIt) {
  // The same 3-block chain twice on 2 nodes. Round-robin: request 2 goes to
  // node 1, which never saw it: 0 local hits. "committed" put the 3 blocks
  // in the remote tier after request 1: pooled, request 2 loads all 3.
  const Workload w = Chains({{1, 2, 3}, {1, 2, 3}});
  const NodesSimRow local = Sim(w, Opts(2, "round-robin", 8, 0));
  EXPECT_EQ(local.blocks_hit, 0u);
  EXPECT_EQ(local.requests_per_node, (std::vector<uint64_t>{1, 1}));
  const NodesSimRow pooled = Sim(w, Opts(2, "round-robin", 8, 8, "committed"));
  EXPECT_EQ(pooled.blocks_hit, 3u);
  EXPECT_EQ(pooled.blocks_hit_remote, 3u);
  EXPECT_EQ(pooled.remote_writes, 3u) << "written once, by request 1";
  EXPECT_DOUBLE_EQ(pooled.token_hit_rate(), 0.5);
  // "demoted" writes only what leaves the local tiers: nothing left here.
  EXPECT_EQ(Sim(w, Opts(2, "round-robin", 8, 8, "demoted")).blocks_hit, 0u);
  // Prefix-aware routing sends the repeat where its blocks are.
  const NodesSimRow prefix = Sim(w, Opts(2, "prefix", 8, 0));
  EXPECT_EQ(prefix.blocks_hit, 3u);
  EXPECT_EQ(prefix.blocks_hit_host, 3u);
  EXPECT_EQ(prefix.requests_per_node, (std::vector<uint64_t>{2, 0}));
}

TEST(NodesSimTest, AffinityKeepsAConversationOnOneNode) {
  // Two conversations of two turns; each second turn extends its first
  // turn's whole chain (the trace has no conversation ids: the chains say
  // it). In this order round-robin on 2 nodes puts every second turn on the
  // other node: 0 hits. Affinity keeps turns together: 2 + 2 hits, in
  // either order.
  const Workload apart = Chains({{1, 2}, {1, 2, 3}, {7, 8}, {7, 8, 9}});
  const Workload w = Chains({{1, 2}, {7, 8}, {1, 2, 3}, {7, 8, 9}});
  EXPECT_EQ(Sim(apart, Opts(2, "round-robin", 8, 0)).blocks_hit, 0u);
  const NodesSimRow affinity = Sim(apart, Opts(2, "affinity", 8, 0));
  EXPECT_EQ(affinity.blocks_hit, 4u);
  EXPECT_EQ(Sim(w, Opts(2, "affinity", 8, 0)).blocks_hit, 4u);
}

TEST(NodesSimTest, DemotedBlocksComeBackFromThePoolUntilItEvictsThem) {
  // One node holding 1 block, no NVMe: [a], [b], [a]. Local only: b evicts
  // a, so 0 hits. Pooled ("demoted"): a leaves host memory for the remote
  // tier at request 2, and request 3 loads it from there; b goes up when a
  // comes back. 2 remote writes, 1 remote hit.
  const Workload w = Chains({{1}, {2}, {1}});
  EXPECT_EQ(Sim(w, Opts(1, "round-robin", 1, 0)).blocks_hit, 0u);
  const NodesSimRow pooled = Sim(w, Opts(1, "round-robin", 1, 4));
  EXPECT_EQ(pooled.blocks_hit_remote, 1u);
  EXPECT_EQ(pooled.remote_writes, 2u);
  EXPECT_EQ(pooled.remote_evictions, 0u);
  // With room for 1 block remotely: [a] [b] [c] [a]: a goes up at request 2,
  // b at request 3 evicts it there (LRU), so request 4 misses.
  const NodesSimRow small = Sim(Chains({{1}, {2}, {3}, {1}}), Opts(1, "round-robin", 1, 1));
  EXPECT_EQ(small.blocks_hit, 0u);
  EXPECT_EQ(small.remote_evictions, 2u) << "a by b, b by c";
}

TEST(NodesSimTest, ARemoteHitSlowerThanRecomputingIsRecomputed) {
  const Workload w = Chains({{1, 2, 3}, {1, 2, 3}});
  NodesSimOptions o = Opts(2, "round-robin", 8, 8, "committed");
  o.node.cost_aware_loads = true;
  o.remote = TierSpeed{1e3, 0.5};  // 1 kB/s and half a second a round trip
  const NodesSimRow slow = Sim(w, o);
  EXPECT_EQ(slow.blocks_hit, 0u);
  EXPECT_EQ(slow.remote_hits_recomputed, 1u) << "the first remote block ends the prefix";
  // The same blocks at a fast link are loaded, and request 2 waits less.
  o.remote = TierSpeed{1e12, 1e-6};
  o.node.cost_aware_loads = false;
  const NodesSimRow fast = Sim(w, o);
  EXPECT_EQ(fast.blocks_hit_remote, 3u);
  NodesSimOptions none = Opts(2, "round-robin", 8, 0);
  EXPECT_LT(fast.ttft_s[1], Sim(w, none).ttft_s[1]);
}

TEST(NodesSimTest, BadOptionsAreRefusedPlainly) {
  const Workload w = Chains({{1, 2}});
  EXPECT_FALSE(SimulateNodes(w, Opts(0, "prefix", 8, 8)).ok());
  auto routing = SimulateNodes(w, Opts(2, "random", 8, 8));
  ASSERT_FALSE(routing.ok());
  EXPECT_NE(routing.status().message().find("unknown routing"), std::string::npos);
  EXPECT_FALSE(SimulateNodes(w, Opts(2, "prefix", 8, 8, "always")).ok());
  EXPECT_FALSE(SimulateNodes(w, Opts(2, "prefix", 0, 8)).ok()) << "no host capacity";
  auto big = SimulateNodes(w, Opts(2, "prefix", 1, 8));
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("more than a simulated node's host tier holds"), std::string::npos);
}

}  // namespace
}  // namespace kvtier::tools
