// SPDX-License-Identifier: Apache-2.0
// The C++ API and the C ABI against a real kvtierd.
#include "kvtier/client.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/kvtier.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;

class ClientTest : public ::testing::Test {
 protected:
  void StartDaemon(const std::string& config = "") {
    daemon_ = std::make_unique<DaemonProcess>(config);
    ASSERT_TRUE(daemon_->Start().ok());
  }
  std::unique_ptr<Client> Attach(uint64_t block_bytes = 8192) {
    AttachOptions o;
    o.socket_path = daemon_->socket_path();
    o.ns = testing::TestNamespace(block_bytes);
    auto c = Client::Attach(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::vector<BlockKey> Keys(Client& c, uint32_t seed, size_t blocks) {
    std::vector<uint32_t> tokens(blocks * c.block_tokens());
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = seed * 100000 + static_cast<uint32_t>(i);
    return c.ComputeKeys(tokens);
  }
  // Stores keys with payloads derived from each key.
  void StoreAll(Client& c, const std::vector<BlockKey>& keys) {
    std::vector<std::vector<std::byte>> bufs(keys.size(), std::vector<std::byte>(c.block_bytes()));
    std::vector<std::span<const std::byte>> src;
    for (size_t i = 0; i < keys.size(); ++i) {
      testing::FillFromKey(keys[i], bufs[i]);
      src.emplace_back(bufs[i]);
    }
    auto n = c.Store(keys, src);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(ClientTest, StoreLookupLoadRoundTripsEveryByte) {
  StartDaemon();
  auto c = Attach();
  auto keys = Keys(*c, 1, 8);
  ASSERT_EQ(keys.size(), 8u);
  EXPECT_EQ(c->Lookup(keys)->hit_blocks, 0u);
  StoreAll(*c, keys);
  auto hit = c->Lookup(keys, {.lease = true});
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->hit_blocks, 8u);
  EXPECT_NE(hit->lease, 0u);
  EXPECT_EQ(hit->tiers[0], TierKind::kHost);
  auto views = c->Load(hit->lease, keys);
  ASSERT_TRUE(views.ok()) << views.status().ToString();
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ((*views)[i].size, c->block_bytes());
    EXPECT_TRUE(testing::MatchesKey(keys[i], {(*views)[i].data, (*views)[i].size})) << "block " << i;
  }
  EXPECT_TRUE(c->Release(hit->lease).ok());
  EXPECT_EQ(c->Release(hit->lease).code(), ErrorCode::kNotFound);
  // A second store of the same keys writes nothing.
  auto ticket = c->StoreBegin(keys);
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ(ticket->needed, 0u);
  EXPECT_EQ(ticket->id, 0u);
  EXPECT_TRUE(c->Ping().ok());
}

// The daemon evicts by the policy in its config: a hot set used a few times
// survives a scan of blocks used once under s3fifo and is flushed under lru.
TEST_F(ClientTest, TheConfiguredPolicyDecidesWhatAScanEvicts) {
  for (const char* policy : {"s3fifo", "lru"}) {
    SCOPED_TRACE(policy);
    // 16 slots of 64 KiB.
    StartDaemon(std::string("[tiers.host]\ncapacity = \"1MiB\"\npolicy = \"") + policy + "\"\n");
    auto c = Attach(64 << 10);
    ASSERT_NE(c, nullptr);
    std::vector<std::vector<BlockKey>> hot;
    for (uint32_t i = 0; i < 4; ++i) {
      hot.push_back(Keys(*c, 100 + i, 1));
      StoreAll(*c, hot.back());
    }
    for (int round = 0; round < 2; ++round) {
      for (const auto& k : hot) {
        auto hit = c->Lookup(k, {.lease = true});
        ASSERT_TRUE(hit.ok());
        ASSERT_EQ(hit->hit_blocks, 1u);
        ASSERT_TRUE(c->Release(hit->lease).ok());
      }
    }
    for (uint32_t i = 0; i < 40; ++i) StoreAll(*c, Keys(*c, 1000 + i, 1));
    uint32_t hot_left = 0;
    for (const auto& k : hot) hot_left += c->Lookup(k)->hit_blocks;
    auto status = daemon_->Status();
    ASSERT_TRUE(status.ok());
    EXPECT_EQ((*status)["tiers"][0]["policy"], policy) << "kvtierctl shows the active policy";
    if (std::string(policy) == "s3fifo") {
      EXPECT_EQ(hot_left, 4u) << "the scan flushed the hot set";
    } else {
      EXPECT_EQ(hot_left, 0u);
    }
    c.reset();
    daemon_.reset();
  }
}

// The default (adaptive) policy watches the leased lookups: when a hot chain
// keeps coming back between scans longer than the tier, it follows a
// scan-resistant expert and keeps the hot chain, which LRU loses every time.
TEST_F(ClientTest, TheAdaptivePolicyLearnsFromLookupsToKeepAHotChainThroughScans) {
  for (const char* policy : {"adaptive", "lru"}) {
    SCOPED_TRACE(policy);
    // 16 slots of 64 KiB.
    StartDaemon(std::string("[tiers.host]\ncapacity = \"1MiB\"\npolicy = \"") + policy + "\"\n");
    auto c = Attach(64 << 10);
    ASSERT_NE(c, nullptr);
    const std::vector<BlockKey> hot = Keys(*c, 7, 4);
    uint32_t next_scan = 1000, late_hits = 0;
    // As an engine does: look up (leased), store what missed, release.
    auto serve = [&](const std::vector<BlockKey>& keys) {
      auto hit = c->Lookup(keys, {.lease = true});
      EXPECT_TRUE(hit.ok());
      if (!hit.ok()) return 0u;
      if (hit->hit_blocks < keys.size()) {
        StoreAll(*c, std::vector<BlockKey>(keys.begin() + hit->hit_blocks, keys.end()));
      }
      if (hit->lease != 0) {
        EXPECT_TRUE(c->Release(hit->lease).ok());
      }
      return hit->hit_blocks;
    };
    for (int round = 0; round < 60; ++round) {
      const uint32_t h = serve(hot);
      if (round >= 40) late_hits += h;
      for (int s = 0; s < 5; ++s) serve(Keys(*c, next_scan++, 4));  // 20 blocks used once
    }
    auto status = daemon_->Status();
    ASSERT_TRUE(status.ok());
    const nlohmann::json& pol = (*status)["tenants"][0]["policies"][0];
    if (std::string(policy) == "adaptive") {
      EXPECT_NE(pol["leader"], "lru") << pol.dump();
      EXPECT_GE(late_hits, 60u) << "of 80 hot blocks asked in the last 20 rounds";
    } else {
      EXPECT_EQ(pol["leader"], "lru");
      EXPECT_EQ(late_hits, 0u) << "LRU loses the hot chain to every scan";
    }
    c.reset();
    daemon_.reset();
  }
}

TEST_F(ClientTest, LookupWithoutLeaseChangesNothing) {
  // 4 blocks of 256 KiB fit in a 1 MiB arena; no background reclaim (it
  // would evict at 95% of so small an arena: this checks the LRU order).
  StartDaemon("[tiers.host]\ncapacity = \"1MiB\"\nhigh_watermark = 1.0\nlow_watermark = 1.0\n");
  auto c = Attach(256 << 10);
  auto keys = Keys(*c, 2, 5);
  for (int i = 0; i < 4; ++i) StoreAll(*c, {keys[i]});
  // Probing block 0 many times must not make it "recently used".
  for (int i = 0; i < 10; ++i) EXPECT_EQ(c->Lookup(std::span(keys).first(1))->hit_blocks, 1u);
  StoreAll(*c, {keys[4]});
  EXPECT_EQ(c->Lookup(std::span(keys).first(1))->hit_blocks, 0u) << "block 0 stayed the LRU victim";
  auto status = daemon_->Status();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["stats"]["probes"].get<int>(), 11);
  EXPECT_EQ((*status)["stats"]["lookups"].get<int>(), 0);
}

TEST_F(ClientTest, AsyncOperationsPollAndWait) {
  StartDaemon();
  auto c = Attach();
  auto keys = Keys(*c, 3, 4);
  StoreAll(*c, keys);
  std::vector<LookupResult> results(16);
  std::vector<OpId> ops;
  for (auto& r : results) {
    auto op = c->LookupAsync(keys, {}, &r);
    ASSERT_TRUE(op.ok());
    ops.push_back(*op);
  }
  EXPECT_EQ(c->InFlight(), 16u);
  size_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (done < ops.size() && std::chrono::steady_clock::now() < deadline) {
    for (OpId& op : ops) {
      if (op == 0) continue;
      if (auto s = c->Poll(op)) {
        EXPECT_TRUE(s->ok());
        op = 0;
        ++done;
      }
    }
  }
  EXPECT_EQ(done, ops.size());
  for (const auto& r : results) EXPECT_EQ(r.hit_blocks, 4u);
  EXPECT_EQ(c->InFlight(), 0u);
  EXPECT_EQ(c->Wait(12345).code(), ErrorCode::kNotFound);
  EXPECT_EQ(c->Poll(12345)->code(), ErrorCode::kNotFound);
}

TEST_F(ClientTest, TooManyOutstandingOperationsIsBusyNotAHang) {
  StartDaemon("[ipc]\nring_entries = 4\n");
  auto c = Attach();
  auto keys = Keys(*c, 4, 1);
  std::vector<LookupResult> r(5);
  std::vector<OpId> ops;
  for (int i = 0; i < 4; ++i) ops.push_back(*c->LookupAsync(keys, {}, &r[i]));
  auto fifth = c->LookupAsync(keys, {}, &r[4]);
  ASSERT_FALSE(fifth.ok());
  EXPECT_EQ(fifth.status().code(), ErrorCode::kBusy);
  for (OpId op : ops) EXPECT_TRUE(c->Wait(op).ok());
  EXPECT_TRUE(c->LookupAsync(keys, {}, &r[4]).ok());
}

TEST_F(ClientTest, BadArgumentsGetClearErrors) {
  StartDaemon("[ipc]\nmax_keys_per_op = 16\n");
  auto c = Attach();
  auto keys = Keys(*c, 5, 17);
  auto too_many = c->Lookup(keys);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("at most 16"), std::string::npos);
  std::vector<std::byte> small(100);
  std::vector<std::span<const std::byte>> src = {small};
  auto wrong_size = c->Store(std::span(keys).first(1), src);
  ASSERT_FALSE(wrong_size.ok());
  EXPECT_EQ(wrong_size.status().code(), ErrorCode::kInvalidArgument);
  auto no_lease = c->Load(999, std::span(keys).first(1));
  ASSERT_FALSE(no_lease.ok());
  EXPECT_EQ(no_lease.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(no_lease.status().message().find("unknown lease"), std::string::npos);
  auto empty = c->Lookup({});
  EXPECT_EQ(empty.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(c->Release(0).ok());
  EXPECT_TRUE(c->connected()) << "argument errors never close the session";
  EXPECT_TRUE(c->Ping().ok());
}

TEST_F(ClientTest, InvalidateRemovesBlocks) {
  StartDaemon();
  auto c = Attach();
  auto keys = Keys(*c, 6, 4);
  StoreAll(*c, keys);
  auto n = c->Invalidate(std::span(keys).subspan(2));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(c->Lookup(keys)->hit_blocks, 2u);
  auto all = c->InvalidateNamespace();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, 2u);
  EXPECT_EQ(c->Lookup(keys)->hit_blocks, 0u);
}

TEST_F(ClientTest, AttachErrorsSayWhatToDo) {
  testing::TempDir dir;
  AttachOptions o;
  o.socket_path = dir.File("nothing.sock");
  o.ns = testing::TestNamespace();
  auto missing = Client::Attach(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotConnected);
  EXPECT_NE(missing.status().message().find("not running"), std::string::npos);
  o.ns.block_bytes = 0;
  auto bad = Client::Attach(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("block_bytes"), std::string::npos);
}

// The namespace the C ABI tests attach with: every required field set.
kvtier_namespace_desc CNamespace() {
  kvtier_namespace_desc ns{};
  ns.model_id = "c-model";
  ns.kv_dtype = "bf16";
  ns.kv_layout = "layer_major";
  ns.block_tokens = 4;
  ns.block_bytes = 4096;
  ns.tp_size = 1;
  return ns;
}

// A block host memory evicted to NVMe: the C lookup names its tier and the
// lane NVMe has in the chain (0), synchronously and asynchronously; the
// block still in host memory has no lane.
TEST_F(ClientTest, CLookupNamesTheLaneOfABlockOnNvme) {
  StartDaemon(
      "[tiers.host]\ncapacity = \"1MiB\"\n"
      "[tiers.nvme]\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n");
  kvtier_namespace_desc ns = CNamespace();
  kvtier_client* c = nullptr;
  ASSERT_EQ(kvtier_attach(daemon_->socket_path().c_str(), &ns, &c), KVTIER_OK);
  // 512 blocks of 4 KiB through a 1 MiB (256-block) host tier, in chains of 8.
  std::vector<uint32_t> tokens(512 * 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 3);
  std::vector<kvtier_key> keys(512);
  size_t n = 0;
  ASSERT_EQ(kvtier_compute_keys(c, tokens.data(), tokens.size(), nullptr, nullptr, 0, keys.data(), keys.size(), &n),
            KVTIER_OK);
  ASSERT_EQ(n, 512u);
  std::vector<uint8_t> payload(4096, 0x5a);
  const void* src[8];
  for (const void*& p : src) p = payload.data();
  for (size_t i = 0; i < n; i += 8) ASSERT_GE(kvtier_store(c, keys.data() + i, 8, src), 0) << kvtier_last_error(c);
  // The first block went to NVMe (its demotion may still be landing), the
  // last is in host memory.
  kvtier_lookup_result r{};
  uint8_t tier = 0, lane = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    ASSERT_EQ(kvtier_lookup_lanes(c, keys.data(), 1, 0, &r, &tier, &lane), KVTIER_OK) << kvtier_last_error(c);
    if (tier == KVTIER_TIER_NVME) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(r.hit_blocks, 1u);
  EXPECT_EQ(tier, KVTIER_TIER_NVME);
  EXPECT_EQ(lane, 0);
  kvtier_op op;
  uint8_t tiers2[2] = {0, 0}, lanes2[2] = {9, 9};
  kvtier_key two[2] = {keys[0], keys[511]};
  ASSERT_EQ(kvtier_lookup_lanes_async(c, two, 1, 0, &r, tiers2, lanes2, &op), KVTIER_OK);
  ASSERT_EQ(kvtier_wait(c, op, 5000), KVTIER_OK);
  EXPECT_EQ(tiers2[0], KVTIER_TIER_NVME);
  EXPECT_EQ(lanes2[0], 0);
  ASSERT_EQ(kvtier_lookup_lanes_async(c, two + 1, 1, 0, &r, tiers2 + 1, lanes2 + 1, &op), KVTIER_OK);
  ASSERT_EQ(kvtier_wait(c, op, 5000), KVTIER_OK);
  EXPECT_EQ(tiers2[1], KVTIER_TIER_HOST);
  EXPECT_EQ(lanes2[1], KVTIER_NO_LANE);
  kvtier_detach(c);
}

TEST_F(ClientTest, CAbiRoundTrip) {
  StartDaemon();
  kvtier_namespace_desc ns = CNamespace();
  kvtier_client* c = nullptr;
  ASSERT_EQ(kvtier_attach(daemon_->socket_path().c_str(), &ns, &c), KVTIER_OK);
  uint32_t tokens[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  kvtier_key keys[4];
  size_t n = 0;
  ASSERT_EQ(kvtier_compute_keys(c, tokens, 10, nullptr, nullptr, 0, keys, 4, &n), KVTIER_OK);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(kvtier_compute_keys(c, tokens, 10, nullptr, nullptr, 0, keys, 1, &n), KVTIER_EINVAL);
  std::vector<uint8_t> a(4096, 0xaa), b(4096, 0xbb);
  const void* src[2] = {a.data(), b.data()};
  ASSERT_EQ(kvtier_store(c, keys, 2, src), 2) << "a store returns how many blocks it wrote";
  kvtier_lookup_result r{};
  uint8_t tiers[2];
  ASSERT_EQ(kvtier_lookup(c, keys, 2, KVTIER_LOOKUP_LEASE, &r, tiers), KVTIER_OK);
  EXPECT_EQ(r.hit_blocks, 2u);
  EXPECT_EQ(r.recompute_blocks, 0u) << "host hits are always loaded";
  EXPECT_EQ(tiers[1], KVTIER_TIER_HOST);
  kvtier_block blocks[2];
  ASSERT_EQ(kvtier_load(c, r.lease, keys, 2, blocks), 2) << "a load returns the loaded prefix's length";
  EXPECT_EQ(static_cast<uint8_t*>(blocks[1].data)[4095], 0xbb);
  // Host blocks are in no lower tier's lane; past the prefix, none either.
  kvtier_lookup_result r3{};
  uint8_t tiers3[3] = {9, 9, 9}, lanes3[3] = {7, 7, 7};
  kvtier_key three[3] = {keys[0], keys[1], keys[1]};
  three[2].bytes[0] ^= 1;  // a key nobody stored
  ASSERT_EQ(kvtier_lookup_lanes(c, three, 3, 0, &r3, tiers3, lanes3), KVTIER_OK);
  EXPECT_EQ(r3.hit_blocks, 2u);
  EXPECT_EQ(tiers3[0], KVTIER_TIER_HOST);
  EXPECT_EQ(tiers3[2], KVTIER_TIER_NONE);
  for (uint8_t l : lanes3) EXPECT_EQ(l, KVTIER_NO_LANE);
  EXPECT_EQ(kvtier_lookup_lanes(c, three, 3, 0, nullptr, tiers3, lanes3), KVTIER_EINVAL);
  kvtier_op op;
  kvtier_lookup_result r2{};
  ASSERT_EQ(kvtier_lookup_async(c, keys, 2, 0, &r2, nullptr, &op), KVTIER_OK);
  EXPECT_EQ(kvtier_wait(c, op, 5000), KVTIER_OK);
  EXPECT_EQ(r2.hit_blocks, 2u);
  EXPECT_EQ(kvtier_release(c, r.lease), KVTIER_OK);
  EXPECT_EQ(kvtier_release(c, r.lease), KVTIER_ENOENT);
  EXPECT_NE(std::string(kvtier_last_error(c)).find("unknown lease"), std::string::npos);
  EXPECT_STREQ(kvtier_strerror(KVTIER_ENOSPC), "no space");
  EXPECT_EQ(kvtier_block_bytes(c), 4096u);
  // Prefill reports: a real one is taken, a zero-token one refused with a reason.
  EXPECT_EQ(kvtier_report_prefill(c, 0, 1000, 2'000'000), KVTIER_OK);
  EXPECT_EQ(kvtier_report_prefill(c, 0, 0, 2'000'000), KVTIER_EINVAL);
  EXPECT_NE(std::string(kvtier_last_error(c)).find("0 tokens"), std::string::npos) << kvtier_last_error(c);
  EXPECT_EQ(kvtier_report_prefill(c, 0, 10, 0), KVTIER_EINVAL);
  EXPECT_EQ(kvtier_report_prefill(nullptr, 0, 10, 1), KVTIER_EINVAL);
  auto st = daemon_->Status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)["cost_model"]["prefill_reports"], 1);
  kvtier_detach(c);
  EXPECT_EQ(kvtier_attach(nullptr, nullptr, &c), KVTIER_EINVAL);
}

// The C ABI says why and counts as the C++ API does: a refused attach
// leaves its message in kvtier_last_error(NULL) (per thread), the last error
// is that of the last call (a success clears it, a later failure replaces
// it), poll and wait refuse an operation that is not outstanding, and store,
// load and invalidate return their counts.
TEST_F(ClientTest, CAbiSaysWhyAndCounts) {
  StartDaemon();
  kvtier_namespace_desc ns = CNamespace();
  ns.kv_dtype = nullptr;  // required
  kvtier_client* c = nullptr;
  EXPECT_EQ(kvtier_attach(daemon_->socket_path().c_str(), &ns, &c), KVTIER_EINVAL);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(kvtier_last_error(nullptr)).find("kv_dtype is required"), std::string::npos)
      << kvtier_last_error(nullptr);
  ns.kv_dtype = "bf16";
  const std::string nowhere = ::testing::TempDir() + "/no-such-kvtierd.sock";
  EXPECT_EQ(kvtier_attach(nowhere.c_str(), &ns, &c), KVTIER_ENOTCONN);
  EXPECT_NE(std::string(kvtier_last_error(nullptr)).find("not running"), std::string::npos)
      << kvtier_last_error(nullptr);
  // Per thread: another thread's failure leaves this thread's message alone.
  std::string other;
  std::thread([&] {
    kvtier_client* unused = nullptr;
    EXPECT_EQ(kvtier_attach(nowhere.c_str(), nullptr, &unused), KVTIER_EINVAL);
    other = kvtier_last_error(nullptr);
  }).join();
  EXPECT_NE(other.find("namespace descriptor is NULL"), std::string::npos) << other;
  EXPECT_NE(std::string(kvtier_last_error(nullptr)).find("not running"), std::string::npos);
  ASSERT_EQ(kvtier_attach(daemon_->socket_path().c_str(), &ns, &c), KVTIER_OK);
  EXPECT_STREQ(kvtier_last_error(nullptr), "") << "a successful attach clears it";

  uint32_t tokens[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  kvtier_key keys[3];
  size_t n = 0;
  ASSERT_EQ(kvtier_compute_keys(c, tokens, 12, nullptr, nullptr, 0, keys, 3, &n), KVTIER_OK);
  ASSERT_EQ(n, 3u);
  std::vector<uint8_t> a(4096, 1), b(4096, 2), d(4096, 3);
  const void* src[3] = {a.data(), b.data(), d.data()};
  EXPECT_EQ(kvtier_store(c, keys, 2, src), 2);
  EXPECT_EQ(kvtier_store(c, keys, 3, src), 1) << "two of the three were cached already";

  // The last error is the last call's.
  EXPECT_EQ(kvtier_release(c, 987654), KVTIER_ENOENT);
  EXPECT_NE(std::string(kvtier_last_error(c)).find("unknown lease"), std::string::npos);
  EXPECT_EQ(kvtier_store(c, keys, 1, nullptr), KVTIER_EINVAL);
  EXPECT_NE(std::string(kvtier_last_error(c)).find("src is NULL"), std::string::npos) << kvtier_last_error(c);
  kvtier_lookup_result r{};
  ASSERT_EQ(kvtier_lookup(c, keys, 3, KVTIER_LOOKUP_LEASE, &r, nullptr), KVTIER_OK);
  EXPECT_STREQ(kvtier_last_error(c), "") << "a successful call clears it";
  EXPECT_EQ(r.hit_blocks, 3u);
  kvtier_block blocks[3];
  EXPECT_EQ(kvtier_load(c, r.lease, keys, 3, blocks), 3);
  EXPECT_EQ(static_cast<uint8_t*>(blocks[2].data)[0], 3);
  ASSERT_EQ(kvtier_release(c, r.lease), KVTIER_OK);
  // Lookup flags: LEASE, and at most one of ASK and NOT_ASK; nothing else.
  for (uint32_t bad : {KVTIER_LOOKUP_ASK | KVTIER_LOOKUP_NOT_ASK, KVTIER_LOOKUP_LEASE | 8u, 1u << 31}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(kvtier_lookup(c, keys, 3, bad, &r, nullptr), KVTIER_EINVAL);
    EXPECT_NE(std::string(kvtier_last_error(c)).find("at most one of ASK and NOT_ASK"), std::string::npos)
        << kvtier_last_error(c);
  }
  EXPECT_EQ(kvtier_lookup(c, keys, 3, KVTIER_LOOKUP_NOT_ASK, &r, nullptr), KVTIER_EINVAL);
  EXPECT_NE(std::string(kvtier_last_error(c)).find("needs a lease"), std::string::npos) << kvtier_last_error(c);
  ASSERT_EQ(kvtier_lookup(c, keys, 3, KVTIER_LOOKUP_ASK, &r, nullptr), KVTIER_OK);
  EXPECT_EQ(r.hit_blocks, 3u);
  EXPECT_EQ(r.lease, 0u) << "an ask without LEASE pins nothing";
  ASSERT_EQ(kvtier_lookup(c, keys, 3, KVTIER_LOOKUP_LEASE | KVTIER_LOOKUP_NOT_ASK, &r, nullptr), KVTIER_OK);
  EXPECT_NE(r.lease, 0u);
  ASSERT_EQ(kvtier_release(c, r.lease), KVTIER_OK);

  // Operations that are not outstanding.
  int status = 12345;
  EXPECT_EQ(kvtier_poll(c, 777777, &status), KVTIER_ENOENT);
  EXPECT_EQ(status, 12345) << "no status for an unknown operation";
  EXPECT_NE(std::string(kvtier_last_error(c)).find("not outstanding"), std::string::npos);
  EXPECT_EQ(kvtier_wait(c, 777777, 100), KVTIER_ENOENT);
  kvtier_op op = 0;
  kvtier_lookup_result r2{};
  ASSERT_EQ(kvtier_lookup_async(c, keys, 3, 0, &r2, nullptr, &op), KVTIER_OK);
  int done = 0;
  for (int i = 0; i < 5000 && done == 0; ++i) {
    done = kvtier_poll(c, op, &status);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(done, 1);
  EXPECT_EQ(status, KVTIER_OK);
  EXPECT_EQ(r2.hit_blocks, 3u);
  EXPECT_EQ(kvtier_poll(c, op, &status), KVTIER_ENOENT) << "a consumed operation is not done twice";
  EXPECT_EQ(kvtier_wait(c, op, 100), KVTIER_ENOENT);

  EXPECT_EQ(kvtier_invalidate(c, keys + 2, 1), 1);
  EXPECT_EQ(kvtier_invalidate(c, keys + 2, 1), 0);
  EXPECT_EQ(kvtier_invalidate_namespace(c), 2);
  EXPECT_EQ(kvtier_release(nullptr, 1), KVTIER_EINVAL);
  EXPECT_NE(std::string(kvtier_last_error(nullptr)).find("client is NULL"), std::string::npos);
  kvtier_detach(c);
}

}  // namespace
}  // namespace kvtier
