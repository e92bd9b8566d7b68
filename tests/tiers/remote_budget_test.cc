// SPDX-License-Identifier: Apache-2.0
// Per-tenant budgets in a shared Redis Cluster (remote_tier.h): a ledger in
// the cluster, kept by one Lua script per write, evicts a tenant's own
// least recently used blocks once it passes its budget, counted across
// every node that writes for it; another tenant's blocks are never touched.
// Against a real cluster (scripts/redis-cluster, one ACL user per tenant).
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <latch>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/support/redis_cluster_process.h"
#include "tests/support/remote_blocks.h"
#include "tests/support/test_support.h"
#include "tiers/remote_tier.h"

namespace kvtier {
namespace {

using testing::RedisClusterProcess;

constexpr uint64_t kBytes = 4096;
// What one block of kBytes costs its tenant's budget.
constexpr uint64_t kEntry = kBytes + sizeof(RemoteValueHeader) + kLedgerEntryBytes;

BlockMeta MetaFor(const std::string& tenant, uint64_t i, uint8_t ns = 9) {
  return testing::RemoteMetaFor(tenant, i, kBytes, ns);
}

using testing::BytesFor;

absl::Status Wait(auto&& start) { return testing::WaitForStatus(start); }

class RemoteBudgetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_ = RedisClusterProcess::Start({"alice", "bob"}).release(); }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (cluster_ == nullptr) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps installs it)";
    admin_ = std::move(RedisCluster::Create({.seeds = cluster_->seeds(), .user = "kvtier-admin",
                                             .password = cluster_->admin_password()})
                           .value());
    ASSERT_TRUE(admin_->WaitForMap(5000));
    // Each test starts from an empty cluster (the ledgers outlive a test).
    for (size_t node = 0; node < cluster_->seeds().size(); ++node) (void)cluster_->Cli("flushall", node);
  }

  static RemoteTierOptions Options(uint64_t alice_budget, uint64_t bob_budget = 0) {
    RemoteTierOptions o;
    o.seeds = cluster_->seeds();
    for (const std::string t : {"alice", "bob"}) {
      o.tenants.push_back({t, cluster_->user(t), cluster_->password(t), cluster_->keys(t), {},
                           t == std::string("alice") ? alice_budget : bob_budget});
    }
    o.op_timeout_ms = 2000;
    return o;
  }
  static std::unique_ptr<RemoteTier> Make(const RemoteTierOptions& o) {
    auto t = RemoteTier::Create(o);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  static absl::Status Put(RemoteTier& t, const BlockMeta& m, SlotHandle* slot_out = nullptr) {
    absl::StatusOr<SlotHandle> slot = t.Reserve(BlockMeta{.payload_bytes = m.payload_bytes});
    if (!slot.ok()) return slot.status();
    if (slot_out != nullptr) *slot_out = *slot;
    const std::vector<std::byte> bytes = BytesFor(m);
    return Wait([&](auto cb) { t.Put(*slot, m, bytes, IoPriority::kDemote, std::move(cb)); });
  }
  static absl::Status Get(RemoteTier& t, SlotHandle slot, const BlockMeta& m) {
    std::vector<std::byte> out(m.payload_bytes);
    absl::Status s = Wait([&](auto cb) { t.Get(slot, m, out, IoPriority::kLoad, std::move(cb)); });
    if (s.ok() && out != BytesFor(m)) return absl::DataLossError("wrong bytes");
    return s;
  }
  // Which of `metas` the cluster holds, asked as the admin (not through a tier).
  std::vector<bool> Present(const RemoteTier& t, const std::string& tenant, const std::vector<BlockMeta>& metas) {
    std::vector<bool> out;
    for (const BlockMeta& m : metas) {
      absl::StatusOr<RedisReply> r = admin_->Call(RedisCommand::Make({{"EXISTS"}, {t.KeyFor(tenant, m)}}, 1), 2000);
      out.push_back(r.ok() && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1);
    }
    return out;
  }
  size_t CountPresent(const RemoteTier& t, const std::string& tenant, const std::vector<BlockMeta>& metas) {
    size_t n = 0;
    for (bool b : Present(t, tenant, metas)) n += b;
    return n;
  }
  // The ledger's count of the tenant's bytes (-1: unreadable).
  int64_t LedgerUsed(const std::string& tenant) {
    absl::StatusOr<RedisReply> r =
        admin_->Call(RedisCommand::Make({{"HGET"}, {LedgerUsedKey("kvtier", tenant)}, {"used"}}, 1), 2000);
    int64_t v = -1;
    if (r.ok() && (*r)->type == REDIS_REPLY_STRING && absl::SimpleAtoi(absl::string_view((*r)->str, (*r)->len), &v)) return v;
    return -1;
  }
  int64_t LedgerEntries(const std::string& tenant) {
    absl::StatusOr<RedisReply> r = admin_->Call(RedisCommand::Make({{"ZCARD"}, {LedgerKey("kvtier", tenant)}}, 1), 2000);
    return r.ok() && (*r)->type == REDIS_REPLY_INTEGER ? (*r)->integer : -1;
  }
  static std::vector<BlockMeta> Metas(const std::string& tenant, uint64_t first, uint64_t n) {
    std::vector<BlockMeta> out;
    for (uint64_t i = first; i < first + n; ++i) out.push_back(MetaFor(tenant, i));
    return out;
  }

  static RedisClusterProcess* cluster_;
  std::unique_ptr<RedisCluster> admin_;
};
RedisClusterProcess* RemoteBudgetTest::cluster_ = nullptr;

TEST_F(RemoteBudgetTest, ATenantPastItsBudgetLosesItsOwnOldestBlocksNotTheOthers) {
  auto t = Make(Options(10 * kEntry));
  ASSERT_NE(t, nullptr);
  const std::vector<BlockMeta> bob = Metas("bob", 0, 5), alice = Metas("alice", 100, 30);
  for (const BlockMeta& m : bob) ASSERT_TRUE(Put(*t, m).ok());
  for (const BlockMeta& m : alice) ASSERT_TRUE(Put(*t, m).ok());
  // Deleting the evicted is not waited for by the writes.
  ASSERT_TRUE(testing::Eventually([&] { return CountPresent(*t, "alice", alice) == 10; }))
      << CountPresent(*t, "alice", alice) << " of alice's 30 blocks present";
  const std::vector<bool> present = Present(*t, "alice", alice);
  for (size_t i = 0; i < alice.size(); ++i) EXPECT_EQ(present[i], i >= 20) << "block " << i << ": the newest 10 stay";
  EXPECT_EQ(CountPresent(*t, "bob", bob), 5u) << "bob has no budget and loses nothing to alice's";
  EXPECT_EQ(LedgerUsed("alice"), static_cast<int64_t>(10 * kEntry));
  EXPECT_EQ(LedgerEntries("alice"), 10);
  EXPECT_EQ(LedgerEntries("bob"), 0) << "no ledger without a budget";
  const RemoteTier::Budget b = t->budget();
  EXPECT_EQ(b.evictions, 20u);
  EXPECT_EQ(b.updates, 30u);
  EXPECT_EQ(b.failures, 0u);
}

TEST_F(RemoteBudgetTest, AReadMovesABlockToTheYoungEnd) {
  auto t = Make(Options(4 * kEntry));
  ASSERT_NE(t, nullptr);
  const std::vector<BlockMeta> m = Metas("alice", 200, 5);
  SlotHandle first = 0;
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(Put(*t, m[i], i == 0 ? &first : nullptr).ok());
  ASSERT_TRUE(Get(*t, first, m[0]).ok());  // block 0 is used: block 1 is now the oldest
  ASSERT_TRUE(Put(*t, m[4]).ok());
  ASSERT_TRUE(testing::Eventually([&] { return CountPresent(*t, "alice", m) == 4; }));
  const std::vector<bool> present = Present(*t, "alice", m);
  EXPECT_TRUE(present[0]) << "the block just read stays";
  EXPECT_FALSE(present[1]) << "the least recently used goes";
  EXPECT_EQ(t->budget().touches, 1u);
}

TEST_F(RemoteBudgetTest, ABlockPastItsTenantsWholeBudgetIsRefusedNotWritten) {
  auto t = Make(Options(kEntry / 2));
  ASSERT_NE(t, nullptr);
  const BlockMeta m = MetaFor("alice", 300);
  const absl::Status s = Put(*t, m);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("budget"), std::string::npos) << s;
  EXPECT_EQ(CountPresent(*t, "alice", {m}), 0u);
  EXPECT_EQ(t->budget().refused, 1u);
  EXPECT_EQ(LedgerUsed("alice"), 0);
}

// The budget is the tenant's across the cluster: two nodes writing for
// alice share one ledger.
TEST_F(RemoteBudgetTest, TwoNodesShareOneTenantsBudget) {
  auto a = Make(Options(8 * kEntry)), b = Make(Options(8 * kEntry));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<BlockMeta> from_a = Metas("alice", 400, 6), from_b = Metas("alice", 500, 6);
  for (const BlockMeta& m : from_a) ASSERT_TRUE(Put(*a, m).ok());
  for (const BlockMeta& m : from_b) ASSERT_TRUE(Put(*b, m).ok());
  ASSERT_TRUE(testing::Eventually(
      [&] { return CountPresent(*a, "alice", from_a) + CountPresent(*a, "alice", from_b) == 8; }));
  EXPECT_EQ(CountPresent(*a, "alice", from_a), 2u) << "node A's 4 oldest went to make room for node B's";
  EXPECT_EQ(CountPresent(*a, "alice", from_b), 6u);
  EXPECT_EQ(b->budget().evictions, 4u) << "evicted by the node whose write passed the budget";
}

// Whoever can write the tenant's ledger (its own password) may fill it with
// anything: entries that name no block of ours are dropped, never turned
// into a DEL outside the tenant's keys; a block the cluster lost on its own
// leaves the count when its entry is popped.
TEST_F(RemoteBudgetTest, AHostileOrStaleLedgerCostsNothingOutsideTheTenant) {
  auto t = Make(Options(3 * kEntry));
  ASSERT_NE(t, nullptr);
  const BlockMeta bobs = MetaFor("bob", 600);
  ASSERT_TRUE(Put(*t, bobs).ok());
  const std::string ledger = LedgerKey("kvtier", "alice");
  const std::string bob_key = t->KeyFor("bob", bobs);
  // Two blocks counted first (the count exists), then gone as if the
  // cluster's LRU had taken them: entries whose blocks are not there.
  const std::vector<BlockMeta> stale = Metas("alice", 610, 2), fresh = Metas("alice", 620, 6);
  for (const BlockMeta& m : stale) ASSERT_TRUE(Put(*t, m).ok());
  for (const BlockMeta& m : stale) ASSERT_TRUE(admin_->Call(RedisCommand::Make({{"DEL"}, {t->KeyFor("alice", m)}}, 1), 2000).ok());
  // Then entries nobody counted, the oldest of all: popped first.
  for (const std::string& bad : {std::string("garbage"), absl::StrCat("4616:", bob_key),
                                 absl::StrCat("99999999999999999999999:", std::string(64, 'a'), ":", std::string(64, 'b')),
                                 absl::StrCat("-5:", std::string(64, 'a'), ":", std::string(64, 'b')),
                                 absl::StrCat("999999999999:", std::string(64, 'c'), ":", std::string(64, 'd'))}) {
    ASSERT_TRUE(admin_->Call(RedisCommand::Make({{"ZADD"}, {ledger}, {"0"}, {bad}}, 1), 2000).ok());
  }
  for (const BlockMeta& m : fresh) ASSERT_TRUE(Put(*t, m).ok()) << "alice's writes go on";
  ASSERT_TRUE(testing::Eventually([&] { return CountPresent(*t, "alice", fresh) == 3; }));
  EXPECT_EQ(CountPresent(*t, "bob", {bobs}), 1u) << "bob's block is untouched";
  EXPECT_EQ(LedgerEntries("alice"), 3);
  EXPECT_EQ(LedgerUsed("alice"), static_cast<int64_t>(3 * kEntry)) << "the hostile and stale entries left the count";
  EXPECT_EQ(t->budget().bad_entries, 4u);
}

// Another tenant cannot change a tenant's ledger: it is under the tenant's
// own key pattern, so bob's ACL user may neither run the script on it nor
// pop it directly (which would make alice's next writes evict her blocks).
TEST_F(RemoteBudgetTest, AnotherTenantCannotTouchATenantsLedger) {
  auto t = Make(Options(10 * kEntry));
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(Put(*t, MetaFor("alice", 800)).ok());
  auto bob = std::move(RedisCluster::Create({.seeds = cluster_->seeds(), .user = cluster_->user("bob"),
                                             .password = cluster_->password("bob")})
                           .value());
  ASSERT_TRUE(bob->WaitForMap(5000));
  const std::string ledger = LedgerKey("kvtier", "alice"), used = LedgerUsedKey("kvtier", "alice");
  const std::vector<absl::string_view> fcall = {"FCALL", kLedgerFunction, "2", ledger, used, "0", "0"};
  absl::StatusOr<RedisReply> r = bob->Call(RedisCommand::MakeList(fcall, 3), 2000);
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  r = bob->Call(RedisCommand::Make({{"ZPOPMIN"}, {ledger}}, 1), 2000);
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  r = bob->Call(RedisCommand::Make({{"HSET"}, {used}, {"used"}, {"999999999"}}, 1), 2000);
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  EXPECT_EQ(LedgerEntries("alice"), 1);
  EXPECT_EQ(LedgerUsed("alice"), static_cast<int64_t>(kEntry));
}

// A tenant's user calls the administrator's function; it can run no Lua of
// its own (a script runs outside maxmemory and can keep a node busy for
// every tenant) and cannot replace the function.
TEST_F(RemoteBudgetTest, ATenantRunsNoScriptOfItsOwn) {
  auto bob = std::move(RedisCluster::Create({.seeds = cluster_->seeds(), .user = cluster_->user("bob"),
                                             .password = cluster_->password("bob")})
                           .value());
  ASSERT_TRUE(bob->WaitForMap(5000));
  const std::string mine = "kvtier:bob:x";
  absl::StatusOr<RedisReply> r =
      bob->Call(RedisCommand::Make({{"EVAL"}, {"while true do end"}, {"1"}, {mine}}, 3), 2000);
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  r = bob->Call(RedisCommand::Keyless({"FUNCTION", "LOAD", "REPLACE", "#!lua name=kvtier\nredis.register_function('kvtier_ledger_v1', function() return {} end)"}), 2000);
  EXPECT_FALSE(r.ok()) << "a tenant cannot replace the ledger";
  r = bob->Call(RedisCommand::Keyless({"SCRIPT", "LOAD", "return 1"}), 2000);
  EXPECT_FALSE(r.ok());
  // The real function still answers (as alice, on her own ledger).
  auto t = Make(Options(4 * kEntry));
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(Put(*t, MetaFor("alice", 850)).ok());
  EXPECT_EQ(LedgerEntries("alice"), 1);
}

// A cluster without the ledger library (a node added later, a library
// flushed): budgeted writes fail, counted and reported, never written
// uncounted.
TEST_F(RemoteBudgetTest, ACLusterWithoutTheLedgerLibraryFailsBudgetedWritesLoudly) {
  auto own = RedisClusterProcess::Start({"alice"});
  ASSERT_NE(own, nullptr);
  for (size_t node = 0; node < own->seeds().size(); ++node) (void)own->Cli("function flush", node);
  RemoteTierOptions o;
  o.seeds = own->seeds();
  o.tenants.push_back({"alice", own->user("alice"), own->password("alice"), own->keys("alice"), {}, 4 * kEntry});
  o.op_timeout_ms = 2000;
  std::string why;
  o.on_ledger_failure = [&](const std::string&, const std::string& w) { why = w; };
  auto t = Make(o);
  ASSERT_NE(t, nullptr);
  const BlockMeta m = MetaFor("alice", 860);
  EXPECT_FALSE(Put(*t, m).ok());
  EXPECT_EQ(t->budget().failures, 1u);
  EXPECT_NE(why.find("unction"), std::string::npos) << why;
  EXPECT_NE(own->Cli("-c exists " + t->KeyFor("alice", m)).find('0'), std::string::npos) << "not written uncounted";
}

// A count that is not a number (someone with alice's password wrote it)
// drains alice's ledger and starts again from 0 instead of turning the
// budget off; a call with more entries than kvtierd ever sends is refused.
TEST_F(RemoteBudgetTest, ALedgerCountThatIsNotANumberDrainsAndStartsAgain) {
  auto t = Make(Options(2 * kEntry));
  ASSERT_NE(t, nullptr);
  uint64_t next = 870;
  for (const char* bad : {"nan", "inf", "-inf", "1e300", "x"}) {
    ASSERT_TRUE(Put(*t, MetaFor("alice", next++)).ok());
    ASSERT_TRUE(Put(*t, MetaFor("alice", next++)).ok());
    ASSERT_TRUE(admin_->Call(RedisCommand::Make({{"HSET"}, {LedgerUsedKey("kvtier", "alice")}, {"used"}, {bad}}, 1), 2000).ok());
    ASSERT_TRUE(Put(*t, MetaFor("alice", next++)).ok()) << bad;
    EXPECT_EQ(LedgerEntries("alice"), 1) << bad << ": the untrusted entries went";
    EXPECT_EQ(LedgerUsed("alice"), static_cast<int64_t>(kEntry)) << bad;
  }
  const std::vector<BlockMeta> more = Metas("alice", 880, 4);
  for (const BlockMeta& m : more) ASSERT_TRUE(Put(*t, m).ok());
  EXPECT_EQ(LedgerEntries("alice"), 2) << "the budget holds again";
  EXPECT_EQ(LedgerUsed("alice"), static_cast<int64_t>(2 * kEntry));
  ASSERT_TRUE(testing::Eventually([&] { return CountPresent(*t, "alice", more) == 2; }));
  // 9,000 entries in one call: refused before it touches anything.
  std::vector<std::string> many;
  for (int i = 0; i < 9000; ++i) {
    many.push_back(absl::StrCat(kEntry, ":", std::string(64, 'a'), ":", std::string(56, 'b'), absl::Hex(i, absl::kZeroPad8)));
  }
  const std::string ledger = LedgerKey("kvtier", "alice"), used = LedgerUsedKey("kvtier", "alice");
  std::vector<absl::string_view> args = {"FCALL", kLedgerFunction, "2", ledger, used, "1000000000", "9000"};
  for (const std::string& m : many) args.push_back(m);
  absl::StatusOr<RedisReply> r = admin_->Call(RedisCommand::MakeList(args, 3), 5000);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("too many"), std::string::npos) << r.status();
  EXPECT_EQ(LedgerEntries("alice"), 2);
}

// A user that may not run the ledger script: the tenant's writes fail (a
// budget is never skipped silently), counted and reported once, and its
// reads go on.
TEST_F(RemoteBudgetTest, ATenantWhoseUserMayNotKeepTheLedgerFailsItsWritesAndSaysWhy) {
  auto own = RedisClusterProcess::Start({"alice"});
  ASSERT_NE(own, nullptr);
  RemoteTierOptions o;
  o.seeds = own->seeds();
  o.tenants.push_back({"alice", own->user("alice"), own->password("alice"), own->keys("alice"), {}, 0});
  o.op_timeout_ms = 2000;
  // Written first without a budget: readable later.
  auto plain = Make(o);
  ASSERT_NE(plain, nullptr);
  const BlockMeta old = MetaFor("alice", 700);
  SlotHandle old_slot = 0;
  ASSERT_TRUE(Put(*plain, old, &old_slot).ok());
  for (size_t node = 0; node < own->seeds().size(); ++node) {
    ASSERT_NE(own->Cli("acl setuser kvtier-alice -fcall", node).find("OK"), std::string::npos);
  }
  std::atomic<int> reported{0};
  std::string why;
  o.tenants[0].budget_bytes = 4 * kEntry;
  o.on_ledger_failure = [&](const std::string& tenant, const std::string& w) {
    if (tenant == "alice") why = w;
    ++reported;
  };
  auto t = Make(o);
  ASSERT_NE(t, nullptr);
  for (uint64_t i = 0; i < 3; ++i) {
    const absl::Status s = Put(*t, MetaFor("alice", 710 + i));
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  }
  EXPECT_EQ(t->budget().failures, 3u);
  EXPECT_EQ(reported.load(), 1) << "reported once, not per write";
  EXPECT_NE(why.find("fcall"), std::string::npos) << why;
  const SlotHandle slot = *t->Reserve(BlockMeta{.payload_bytes = kBytes});
  EXPECT_TRUE(Get(*t, slot, old).ok()) << "reads need no ledger";
}

// Many writers at once: the ledger stays the tenant's whole truth, within
// what was in flight when the last write landed.
TEST_F(RemoteBudgetTest, ConcurrentWritersKeepTheTenantWithinItsBudget) {
  constexpr uint64_t kKeep = 50;
  auto a = Make(Options(kKeep * kEntry)), b = Make(Options(kKeep * kEntry));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::thread> writers;
  std::atomic<uint64_t> failed{0};
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      RemoteTier& t = w % 2 == 0 ? *a : *b;
      for (uint64_t i = 0; i < 150; ++i) {
        if (!Put(t, MetaFor("alice", 1000 + w * 1000 + i)).ok()) ++failed;
      }
    });
  }
  for (std::thread& w : writers) w.join();
  EXPECT_EQ(failed.load(), 0u);
  std::vector<BlockMeta> all;
  for (int w = 0; w < 4; ++w) {
    for (uint64_t i = 0; i < 150; ++i) all.push_back(MetaFor("alice", 1000 + w * 1000 + i));
  }
  ASSERT_TRUE(testing::Eventually([&] { return CountPresent(*a, "alice", all) <= kKeep + 4; }))
      << CountPresent(*a, "alice", all) << " of alice's blocks present, budget " << kKeep;
  EXPECT_EQ(LedgerEntries("alice"), static_cast<int64_t>(kKeep));
  EXPECT_LE(LedgerUsed("alice"), static_cast<int64_t>(kKeep * kEntry));
  EXPECT_GE(CountPresent(*a, "alice", all), kKeep - 4) << "what the ledger holds is there";
  EXPECT_EQ(a->budget().evictions + b->budget().evictions, 600 - kKeep);
}

}  // namespace
}  // namespace kvtier
