// SPDX-License-Identifier: Apache-2.0
// The remote tier and its cluster client against a real Redis Cluster (3
// primaries + 3 replicas of Debian's redis-server on loopback, one ACL user
// per tenant): byte-exact blocks, values that must prove themselves,
// tenants kept apart by the server, a primary killed under traffic, the
// cluster down at start and back, slots resharded under traffic.
#include "tiers/remote_tier.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <xxhash.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <latch>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "core/units.h"
#include "tests/support/redis_cluster_process.h"
#include "tests/support/remote_blocks.h"
#include "tests/support/test_support.h"

namespace kvtier {
namespace {

using testing::RedisClusterProcess;

BlockMeta MetaFor(const std::string& tenant, uint64_t i, uint64_t bytes, uint8_t ns = 7) {
  return testing::RemoteMetaFor(tenant, i, bytes, ns);
}

using testing::BytesFor;

// A sealing key made of `seed` (tests only: real keys come from openssl rand).
SealKey TestKey(uint8_t seed) {
  std::string hex;
  for (int i = 0; i < 32; ++i) absl::StrAppend(&hex, absl::Hex(static_cast<uint8_t>(seed * 31 + i * 7), absl::kZeroPad2));
  return *ParseSealKey(hex);
}

absl::Status Wait(auto&& start) { return testing::WaitForStatus(start); }

struct Tier {
  std::unique_ptr<RemoteTier> tier;
  absl::Status Put(const BlockMeta& m, const std::vector<std::byte>& bytes, SlotHandle* slot_out = nullptr) {
    absl::StatusOr<SlotHandle> slot = tier->Reserve(BlockMeta{.payload_bytes = m.payload_bytes});
    if (!slot.ok()) return slot.status();
    if (slot_out) *slot_out = *slot;
    return Wait([&](auto cb) { tier->Put(*slot, m, bytes, IoPriority::kDemote, std::move(cb)); });
  }
  absl::Status Get(SlotHandle slot, const BlockMeta& m, std::vector<std::byte>& out) {
    out.assign(m.payload_bytes, std::byte{0});
    return Wait([&](auto cb) { tier->Get(slot, m, out, IoPriority::kLoad, std::move(cb)); });
  }
};

// Each test runs against a cluster in clear text and one that speaks TLS
// only (scripts/redis-cluster --tls: a throwaway CA, client certificates
// required): the tier must behave the same over both.
class RemoteTierTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    plain_ = RedisClusterProcess::Start({"alice", "bob"}).release();
    tls_ = RedisClusterProcess::Start({"alice", "bob"}, "--tls").release();
  }
  static void TearDownTestSuite() {
    delete plain_;
    delete tls_;
    plain_ = tls_ = nullptr;
  }
  void SetUp() override {
    cluster_ = GetParam() ? tls_ : plain_;
    if (cluster_ == nullptr) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps installs it)";
  }
  bool tls() const { return GetParam(); }
  // A cluster of its own for a test that kills, stops or reshards it.
  std::unique_ptr<RedisClusterProcess> OwnCluster(std::vector<std::string> tenants) const {
    return RedisClusterProcess::Start(tenants, tls() ? "--tls" : "");
  }

  static RemoteTierOptions Options(const RedisClusterProcess& c, std::vector<std::string> tenants = {"alice", "bob"}) {
    RemoteTierOptions o;
    o.seeds = c.seeds();
    for (const std::string& t : tenants) o.tenants.push_back({t, c.user(t), c.password(t), c.keys(t)});
    o.op_timeout_ms = 2000;
    o.tls = c.tls();
    return o;
  }
  static Tier Make(const RemoteTierOptions& o) {
    auto t = RemoteTier::Create(o);
    EXPECT_TRUE(t.ok()) << t.status();
    return Tier{std::move(*t)};
  }
  // The admin's own connection (to write what an attacker would).
  static std::unique_ptr<RedisCluster> Admin(const RedisClusterProcess& c) {
    return std::move(RedisCluster::Create(
                         {.seeds = c.seeds(), .user = "kvtier-admin", .password = c.admin_password(), .tls = c.tls()}))
        .value();
  }

  RedisClusterProcess* cluster_ = nullptr;
  static RedisClusterProcess* plain_;
  static RedisClusterProcess* tls_;
};
RedisClusterProcess* RemoteTierTest::plain_ = nullptr;
RedisClusterProcess* RemoteTierTest::tls_ = nullptr;

INSTANTIATE_TEST_SUITE_P(ClearAndTls, RemoteTierTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tls" : "Clear"; });

TEST(RedisClusterTest, KeySlotsAreTheClusterSpecsCrc16) {
  EXPECT_EQ(RedisCluster::KeySlot("123456789"), 0x31C3 % RedisCluster::kSlots);  // the spec's check value
  EXPECT_EQ(RedisCluster::KeySlot("foo"), 12182);
  EXPECT_EQ(RedisCluster::KeySlot("{user1000}.following"), RedisCluster::KeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisCluster::KeySlot("foo{}{bar}"), RedisCluster::KeySlot("foo{}{bar}")) << "an empty tag hashes the whole key";
  EXPECT_NE(RedisCluster::KeySlot("foo{}{bar}"), RedisCluster::KeySlot("bar"));
  EXPECT_EQ(RedisCluster::KeySlot("foo{{bar}}zap"), RedisCluster::KeySlot("{bar"));
}

TEST(RedisClusterTest, BadSeedsAreRefused) {
  EXPECT_FALSE(RedisCluster::Create({.seeds = {}}).ok());
  EXPECT_FALSE(RedisCluster::Create({.seeds = {"no-port"}}).ok());
  EXPECT_FALSE(RedisCluster::Create({.seeds = {"127.0.0.1:0"}}).ok());
  EXPECT_FALSE(RedisCluster::Create({.seeds = {"127.0.0.1:99999"}}).ok());
  EXPECT_FALSE(RedisCluster::Create({.seeds = {"bad host:80"}}).ok());
}

// A "node" on a loopback port that answers the i-th read of a connection
// with replies[i] (the last one from then on), then closes if `close_after`.
class HostileNode {
 public:
  explicit HostileNode(std::string reply) : HostileNode(std::vector<std::string>{std::move(reply)}) {}
  // drip: send each reply a byte at a time, this far apart.
  explicit HostileNode(std::vector<std::string> replies, bool close_after = false,
                       std::chrono::milliseconds drip = std::chrono::milliseconds(0))
      : replies_(std::move(replies)), close_after_(close_after), drip_(drip) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        ssize_t got;
        for (size_t i = 0; (got = read(c, buf, sizeof buf)) > 0; ++i) {
          {
            std::lock_guard<std::mutex> l(mu_);
            received_.append(buf, static_cast<size_t>(got));
          }
          const std::string& reply = replies_[std::min(i, replies_.size() - 1)];
          if (drip_.count() > 0 && i > 0) {
            for (char ch : reply) {
              if (send(c, &ch, 1, MSG_NOSIGNAL) < 0 || stop_.load()) break;
              std::this_thread::sleep_for(drip_);
            }
          } else if (send(c, reply.data(), reply.size(), MSG_NOSIGNAL) < 0) {
            break;
          }
          if (close_after_ && i + 1 >= replies_.size()) break;
        }
        close(c);
      }
    });
  }
  ~HostileNode() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  // Every byte a client sent it.
  std::string received() const {
    std::lock_guard<std::mutex> l(mu_);
    return received_;
  }

 private:
  mutable std::mutex mu_;
  std::string received_;
  std::vector<std::string> replies_;
  bool close_after_;
  std::chrono::milliseconds drip_;
  std::atomic<bool> stop_{false};
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(RedisClusterTest, AHostileNodeCostsAnErrorNotMemoryOrATrap) {
  const std::string huge_bulk = "$4000000000\r\n" + std::string(1 << 20, 'x');  // more than any block
  for (const std::string& reply : {std::string("*600000000\r\n"), std::string("*-5\r\n"), huge_bulk,
                                   std::string("-MOVED 99999 127.0.0.1:1\r\n"), std::string("-MOVED 1 bad\r\n"),
                                   std::string("-ASK 1 127.0.0.1:0\r\n"), std::string("!garbage\r\n")}) {
    HostileNode node(reply);
    auto c = std::move(RedisCluster::Create({.seeds = {node.address()}, .io_timeout_ms = 500,
                                             .max_reply_bytes = 64 << 10}))
                 .value();
    absl::StatusOr<RedisReply> r = c->Call(RedisCommand::Make({{"GET"}, {"k"}}, 1), 2000);
    EXPECT_FALSE(r.ok()) << reply.substr(0, 20);
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
    EXPECT_NE(c->Health(), TierHealth::kHealthy) << "it never gave a slot map";
  }
}

TEST(RedisClusterTest, AHostileNodeCannotHandTheTierABlock) {
  // Reads that go straight into the caller's buffer: a value of exactly
  // the expected length, cut short, or without its CRLF, or a right-length
  // value of garbage. Each is a miss; nothing is served.
  const BlockMeta m = MetaFor("alice", 1, 4096);
  const std::string len = absl::StrCat("$", sizeof(RemoteValueHeader) + 4096, "\r\n");
  const std::string value(sizeof(RemoteValueHeader) + 4096, 'x');
  for (const auto& [reply, close_after, code] : std::vector<std::tuple<std::string, bool, absl::StatusCode>>{
           {len + std::string(1000, 'x'), true, absl::StatusCode::kUnavailable},      // cut short
           {len + value + "XY", false, absl::StatusCode::kUnavailable},               // no CRLF
           {len + value + "\r\n", false, absl::StatusCode::kDataLoss}}) {             // not a block
    HostileNode node({"+OK\r\n", reply}, close_after);
    RemoteTierOptions o;
    o.seeds = {node.address()};
    o.tenants = {{"alice", "kvtier-alice", "pw", {TestKey(1)}}};
    o.op_timeout_ms = 1000;
    o.io_timeout_ms = 500;
    Tier t{std::move(RemoteTier::Create(o)).value()};
    SlotHandle slot = *t.tier->Reserve(BlockMeta{.payload_bytes = 4096});
    std::vector<std::byte> got;
    const absl::Status s = t.Get(slot, m, got);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.code(), code) << s;
  }
}

TEST(RedisClusterTest, ANodeThatDripsItsReplyIsCutOffAtTheReplyTimeout) {
  // A byte every 50 ms never trips a per-read timeout of 300 ms; the reply as
  // a whole must still end by then.
  HostileNode node({"+OK\r\n", "$1000\r\n" + std::string(1000, 'x') + "\r\n"}, false, std::chrono::milliseconds(50));
  auto c = std::move(RedisCluster::Create({.seeds = {node.address()}, .user = "u", .password = "p", .io_timeout_ms = 300}))
               .value();
  const uint64_t t0 = MonotonicNanos();
  absl::StatusOr<RedisReply> r = c->Call(RedisCommand::Make({{"GET"}, {"k"}}, 1), 5000);
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_LT(MonotonicNanos() - t0, 2'000'000'000ull) << "cut off near io_timeout, not after 50 s of drips";
}

TEST_P(RemoteTierTest, BlocksComeBackByteExactFromEveryNode) {
  Tier t = Make(Options(*cluster_));
  for (uint64_t bytes : {uint64_t{4096}, uint64_t{256} << 10, uint64_t{2} << 20}) {
    std::vector<std::pair<SlotHandle, BlockMeta>> put;
    for (uint64_t i = 0; i < 24; ++i) {  // enough keys to land on all three primaries
      const BlockMeta m = MetaFor("alice", bytes * 1000 + i, bytes);
      SlotHandle slot;
      ASSERT_TRUE(t.Put(m, BytesFor(m), &slot).ok());
      put.emplace_back(slot, m);
    }
    for (const auto& [slot, m] : put) {
      std::vector<std::byte> got;
      ASSERT_TRUE(t.Get(slot, m, got).ok());
      EXPECT_EQ(got, BytesFor(m));
    }
  }
  const RedisCluster::Stats s = t.tier->ClusterStats("alice");
  EXPECT_EQ(s.slots_covered, RedisCluster::kSlots);
  size_t serving = 0;
  for (const auto& n : s.nodes) serving += n.slots > 0 && n.commands > 0;
  EXPECT_EQ(serving, 3u) << "every primary served some";
  EXPECT_EQ(t.tier->Health(), TierHealth::kHealthy);
  EXPECT_EQ(t.tier->BlockStats().checksum_failures, 0u);
}

TEST_P(RemoteTierTest, ABlockIsSharedBetweenTwoTiersOfOneTenantOnly) {
  Tier node_a = Make(Options(*cluster_));
  Tier node_b = Make(Options(*cluster_));
  const BlockMeta m = MetaFor("alice", 42, 64 << 10);
  ASSERT_TRUE(node_a.Put(m, BytesFor(m)).ok());
  // Node B never wrote it: it learns it is there and reads it.
  std::vector<bool> there;
  std::latch probed(1);
  const BlockMeta probe[] = {m, MetaFor("alice", 43, 64 << 10), MetaFor("bob", 42, 64 << 10),
                             MetaFor("alice", 42, 64 << 10, /*ns=*/8)};
  node_b.tier->Exists(
      probe,
      [&](std::vector<bool> v) {
        there = std::move(v);
        probed.count_down();
      },
      0);
  probed.wait();
  EXPECT_EQ(there, (std::vector<bool>{true, false, false, false}))
      << "present; another key; another tenant; another namespace";
  SlotHandle slot = *node_b.tier->Reserve(BlockMeta{.payload_bytes = m.payload_bytes});
  std::vector<std::byte> got;
  ASSERT_TRUE(node_b.Get(slot, m, got).ok());
  EXPECT_EQ(got, BytesFor(m));
  // The same key of bob's, or of another namespace, is another key: a miss.
  EXPECT_TRUE(absl::IsNotFound(node_b.Get(slot, MetaFor("bob", 42, 64 << 10), got)));
  EXPECT_TRUE(absl::IsNotFound(node_b.Get(slot, MetaFor("alice", 42, 64 << 10, 8), got)));
  EXPECT_EQ(node_b.tier->misses().not_found, 2u);
}

TEST_P(RemoteTierTest, TheServerKeepsTenantsApart) {
  // Bob's own connection asks for alice's key: the cluster refuses (NOPERM).
  RedisClusterOptions o;
  o.seeds = cluster_->seeds();
  o.user = cluster_->user("bob");
  o.password = cluster_->password("bob");
  o.tls = cluster_->tls();
  auto bob = std::move(RedisCluster::Create(o)).value();
  ASSERT_TRUE(bob->WaitForMap(5000));
  Tier alice_tier = Make(Options(*cluster_, {"alice"}));
  const BlockMeta m = MetaFor("alice", 77, 4096);
  ASSERT_TRUE(alice_tier.Put(m, BytesFor(m)).ok());
  const std::string key = alice_tier.tier->KeyFor("alice", m);
  absl::StatusOr<RedisReply> r = bob->Call(RedisCommand::Make({{"GET"}, {key}}, 1), 2000);
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  r = bob->Call(RedisCommand::Make({{"SET"}, {key}, {"overwritten"}}, 1), 2000);
  EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
  // And as redis-cli would, with bob's password.
  EXPECT_NE(cluster_->Cli("-c get " + key, 0, "bob").find("NOPERM"),
            std::string::npos);
  // A wrong password never connects.
  o.password = "wrong";
  auto intruder = std::move(RedisCluster::Create(o)).value();
  r = intruder->Call(RedisCommand::Make({{"GET"}, {key}}, 1), 2000);
  EXPECT_FALSE(r.ok());
  // A tier without credentials for a block's tenant writes nothing of it.
  Tier bob_only = Make(Options(*cluster_, {"bob"}));
  SlotHandle slot = *bob_only.tier->Reserve(BlockMeta{.payload_bytes = 4096});
  EXPECT_TRUE(absl::IsFailedPrecondition(
      Wait([&](auto cb) { bob_only.tier->Put(slot, m, BytesFor(m), IoPriority::kDemote, std::move(cb)); })));
}

// The port-squat attack: a local process binds the port of a node that
// died and waits for kvtierd to reconnect. In clear text it gets the
// tenant's AUTH, password and all. Over TLS it gets a ClientHello and
// nothing more: it cannot prove it is the node.
TEST_P(RemoteTierTest, APortSquatterGetsNoPasswordOverTls) {
  HostileNode squatter(std::vector<std::string>{"+OK\r\n", "$-1\r\n"});
  RedisClusterOptions o{.seeds = {squatter.address()},
                        .user = cluster_->user("alice"),
                        .password = cluster_->password("alice"),
                        .io_timeout_ms = 500,
                        .tls = cluster_->tls()};
  auto c = std::move(RedisCluster::Create(o)).value();
  absl::StatusOr<RedisReply> r = c->Call(RedisCommand::Make({{"GET"}, {"kvtier:alice:x"}}, 1), 1500);
  ASSERT_TRUE(testing::Eventually([&] { return !squatter.received().empty(); }));
  const std::string got = squatter.received();
  if (!tls()) {
    EXPECT_NE(got.find(cluster_->password("alice")), std::string::npos)
        << "in clear text the squatter reads the password: why production runs TLS";
    return;
  }
  EXPECT_FALSE(r.ok()) << "a node that did not prove itself answers nothing";
  EXPECT_EQ(got.find(cluster_->password("alice")), std::string::npos);
  EXPECT_EQ(got.find("AUTH"), std::string::npos);
  EXPECT_EQ(static_cast<uint8_t>(got[0]), 0x16) << "a TLS handshake record, and nothing after it";
  EXPECT_FALSE(c->WaitForMap(200)) << "no slot map from a node that did not prove itself";
}

// A TLS squatter with a certificate of its own (not from the cluster's CA),
// and the real cluster checked against another name: both fail the
// handshake before any AUTH.
TEST_P(RemoteTierTest, ANodeWhoseCertificateDoesNotProveItGetsNothing) {
  if (!tls()) GTEST_SKIP() << "TLS only";
  testing::TempDir d;
  ASSERT_EQ(std::system(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
                                     "-subj /CN=squatter -addext subjectAltName=IP:127.0.0.1 -keyout ", d.File("k.pem"),
                                     " -out ", d.File("c.pem"), " 2>/dev/null")
                            .c_str()),
            0);
  // A free port, then openssl s_server on it, printing what it receives.
  int port = 0;
  {
    HostileNode probe("");
    port = probe.port();
  }
  const std::string out = d.File("received");
  const std::string cmd = absl::StrCat("exec openssl s_server -accept 127.0.0.1:", port, " -cert ", d.File("c.pem"),
                                       " -key ", d.File("k.pem"), " -quiet >", out, " 2>&1");
  FILE* server = popen(cmd.c_str(), "w");
  ASSERT_NE(server, nullptr);
  RedisClusterOptions o{.seeds = {absl::StrCat("127.0.0.1:", port)},
                        .user = cluster_->user("alice"),
                        .password = cluster_->password("alice"),
                        .io_timeout_ms = 500,
                        .tls = cluster_->tls()};
  auto c = std::move(RedisCluster::Create(o)).value();
  absl::Status s;
  EXPECT_TRUE(testing::Eventually([&] {
    s = c->Call(RedisCommand::Make({{"GET"}, {"kvtier:alice:x"}}, 1), 1000).status();
    return absl::StrContains(s.message(), "certificate");
  })) << s;
  c.reset();
  std::system(absl::StrCat("pkill -f 'openssl s_server -accept 127.0.0.1:", port, "'").c_str());
  pclose(server);
  std::ifstream f(out);
  const std::string heard((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(heard.find("AUTH"), std::string::npos) << heard;
  EXPECT_EQ(heard.find(cluster_->password("alice")), std::string::npos);

  // The real nodes, checked against a name their certificate does not carry.
  o.seeds = cluster_->seeds();
  o.tls.server_name = "redis.example.com";
  auto wrong_name = std::move(RedisCluster::Create(o)).value();
  s = wrong_name->Call(RedisCommand::Make({{"GET"}, {"kvtier:alice:x"}}, 1), 1000).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("does not prove it is"), absl::string_view::npos) << s;
  // And files that do not load are refused at Create, naming the file.
  o.tls.server_name = "";
  o.tls.ca_file = d.File("missing.pem");
  absl::StatusOr<std::unique_ptr<RedisCluster>> bad = RedisCluster::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("missing.pem"), absl::string_view::npos) << bad.status();
}

TEST_P(RemoteTierTest, AValueThatDoesNotProveItselfIsNeverServedAndIsDeleted) {
  Tier t = Make(Options(*cluster_));
  const BlockMeta m = MetaFor("alice", 900, 8192);
  SlotHandle slot;
  ASSERT_TRUE(t.Put(m, BytesFor(m), &slot).ok());
  const std::string key = t.tier->KeyFor("alice", m);
  const std::string value_len = absl::StrCat(sizeof(RemoteValueHeader) + 8192);
  // One payload byte changed in place.
  EXPECT_NE(cluster_->Cli("-c setrange " + key + " 500 X").find(value_len), std::string::npos);
  std::vector<std::byte> got;
  EXPECT_TRUE(absl::IsDataLoss(t.Get(slot, m, got)));
  EXPECT_EQ(t.tier->BlockStats().checksum_failures, 1u);
  EXPECT_TRUE(testing::Eventually([&] { return cluster_->Cli("-c exists " + key).find('0') != std::string::npos; }))
      << "the bad value is deleted";
  EXPECT_TRUE(absl::IsNotFound(t.Get(slot, m, got))) << "then it is simply absent";
  // A value of the wrong length (the header's payload is longer than what follows).
  ASSERT_TRUE(t.Put(m, BytesFor(m)).ok());
  EXPECT_NE(cluster_->Cli(absl::StrCat("-c setrange ", key, " ", sizeof(RemoteValueHeader) + 8194, " tail"))
                .find(absl::StrCat(sizeof(RemoteValueHeader) + 8198)),
            std::string::npos);
  EXPECT_TRUE(absl::IsDataLoss(t.Get(slot, m, got)));
  // A value that is not kvtier's at all.
  EXPECT_NE(cluster_->Cli("-c set " + key + " hello").find("OK"), std::string::npos);
  EXPECT_TRUE(absl::IsDataLoss(t.Get(slot, m, got)));
  // Another block's value under this key, header and all.
  const BlockMeta other = MetaFor("alice", 901, 8192);
  ASSERT_TRUE(t.Put(other, BytesFor(other)).ok());
  auto admin = Admin(*cluster_);
  absl::StatusOr<RedisReply> v = admin->Call(RedisCommand::Make({{"GET"}, {t.tier->KeyFor("alice", other)}}, 1), 2000);
  ASSERT_TRUE(v.ok() && (*v)->type == REDIS_REPLY_STRING) << v.status();
  ASSERT_TRUE(admin->Call(RedisCommand::Make({{"SET"}, {key}, {absl::string_view((*v)->str, (*v)->len)}}, 1), 2000).ok());
  EXPECT_TRUE(absl::IsDataLoss(t.Get(slot, m, got)));
  std::vector<std::byte> other_got;
  ASSERT_TRUE(t.Get(slot, other, other_got).ok()) << "the other block itself is intact";
  EXPECT_EQ(other_got, BytesFor(other));
  EXPECT_EQ(t.tier->BlockStats().checksum_failures, 4u);
  EXPECT_EQ(t.tier->misses().bad_value, 4u);
  EXPECT_EQ(t.tier->misses().forged, 0u) << "each of those failed its checksum or shape first";
}

// The attack that once served a wrong block: someone who can write alice's
// key (the cluster's admin here; a port squatter or a stolen password
// alike) changes the payload and recomputes the XXH3 in the header. The
// seal, under a key the cluster never sees, refuses it.
TEST_P(RemoteTierTest, AValueForgedWithARecomputedChecksumIsAMissNeverServed) {
  Tier t = Make(Options(*cluster_));
  const BlockMeta m = MetaFor("alice", 950, 8192);
  SlotHandle slot;
  ASSERT_TRUE(t.Put(m, BytesFor(m), &slot).ok());
  const std::string key = t.tier->KeyFor("alice", m);
  auto admin = Admin(*cluster_);
  absl::StatusOr<RedisReply> v = admin->Call(RedisCommand::Make({{"GET"}, {key}}, 1), 2000);
  ASSERT_TRUE(v.ok() && (*v)->type == REDIS_REPLY_STRING) << v.status();
  std::string forged((*v)->str, (*v)->len);
  ASSERT_TRUE(CheckRemoteValue(forged, m).ok());
  for (size_t i = sizeof(RemoteValueHeader); i < forged.size(); i += 64) forged[i] = 'F';
  RemoteValueHeader h;
  std::memcpy(&h, forged.data(), sizeof(h));
  h.checksum = XXH3_64bits(forged.data() + sizeof(h), 8192);
  std::memcpy(forged.data(), &h, sizeof(h));
  ASSERT_TRUE(CheckRemoteValue(forged, m).ok()) << "shape and checksum hold: only the seal can tell";
  ASSERT_TRUE(admin->Call(RedisCommand::Make({{"SET"}, {key}, {forged}}, 1), 2000).ok());
  std::vector<std::byte> got;
  const absl::Status s = t.Get(slot, m, got);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(t.tier->misses().forged, 1u);
  EXPECT_TRUE(testing::Eventually([&] { return cluster_->Cli("-c exists " + key).find('0') != std::string::npos; }))
      << "the forgery is deleted";
  // A tier that names the same tenant with another key cannot pass its
  // values off as alice's either.
  RemoteTierOptions other = Options(*cluster_, {"alice"});
  other.tenants[0].keys = {TestKey(9)};
  Tier impostor = Make(other);
  ASSERT_TRUE(impostor.Put(m, BytesFor(m)).ok());
  EXPECT_TRUE(absl::IsDataLoss(t.Get(slot, m, got)));
  EXPECT_EQ(t.tier->misses().forged, 2u);
}

// A value larger than any block under a tenant's key (once: 70 MiB, never
// deleted, and it broke that tenant's connection to the node on every
// read): a bad value, deleted, and the connection serves the next read.
TEST_P(RemoteTierTest, AnOversizedValueIsDeletedNotReadOverAndOver) {
  RemoteTierOptions o = Options(*cluster_, {"alice"});
  o.max_block_bytes = 1 << 20;
  Tier t = Make(o);
  const BlockMeta m = MetaFor("alice", 970, 8192), next = MetaFor("alice", 971, 8192);
  SlotHandle slot, next_slot;
  ASSERT_TRUE(t.Put(m, BytesFor(m), &slot).ok());
  ASSERT_TRUE(t.Put(next, BytesFor(next), &next_slot).ok());
  const std::string key = t.tier->KeyFor("alice", m);
  auto admin = Admin(*cluster_);
  ASSERT_TRUE(admin->Call(RedisCommand::Make({{"SET"}, {key}, {std::string(3 << 20, 'z')}}, 1), 5000).ok());
  std::vector<std::byte> got;
  const absl::Status s = t.Get(slot, m, got);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_TRUE(testing::Eventually([&] { return cluster_->Cli("-c exists " + key).find('0') != std::string::npos; }))
      << "the oversized value is deleted";
  EXPECT_TRUE(absl::IsNotFound(t.Get(slot, m, got)));
  ASSERT_TRUE(t.Get(next_slot, next, got).ok()) << "and the tenant's reads go on";
  EXPECT_EQ(got, BytesFor(next));
}

// Where tenants must not share a cluster's memory (allkeys-lru evicts
// across every tenant's keys), a tenant gets a cluster of its own: its
// blocks go there and only there; the others' stay on the shared one.
TEST_P(RemoteTierTest, ATenantWithAClusterOfItsOwnSharesNoMemory) {
  if (tls()) GTEST_SKIP() << "one transport is enough: the seeds are what differs";
  auto own = OwnCluster({"alice", "bob"});
  ASSERT_NE(own, nullptr);
  RemoteTierOptions o = Options(*cluster_);
  o.tenants[1].seeds = own->seeds();  // bob
  o.tenants[1].password = own->password("bob");
  Tier t = Make(o);
  const BlockMeta a = MetaFor("alice", 980, 4096), b = MetaFor("bob", 981, 4096);
  SlotHandle sa, sb;
  ASSERT_TRUE(t.Put(a, BytesFor(a), &sa).ok());
  ASSERT_TRUE(t.Put(b, BytesFor(b), &sb).ok());
  EXPECT_NE(cluster_->Cli("-c exists " + t.tier->KeyFor("alice", a)).find('1'), std::string::npos);
  EXPECT_NE(cluster_->Cli("-c exists " + t.tier->KeyFor("bob", b)).find('0'), std::string::npos)
      << "bob's block is not in the shared cluster";
  EXPECT_NE(own->Cli("-c exists " + t.tier->KeyFor("bob", b)).find('1'), std::string::npos) << "but in his own";
  std::vector<std::byte> got;
  ASSERT_TRUE(t.Get(sb, b, got).ok());
  EXPECT_EQ(got, BytesFor(b));
}

// Keys rotate: a node with the new key first and the old one after reads
// what the old key sealed; a node that dropped the old key does not.
// Encrypted values hold no plaintext in the cluster and read back exact.
TEST_P(RemoteTierTest, KeysRotateAndEncryptedValuesHoldNoPlaintext) {
  RemoteTierOptions old_opts = Options(*cluster_, {"alice"});
  old_opts.tenants[0].keys = {TestKey(1)};
  old_opts.encrypt = true;
  RemoteTierOptions rotated = old_opts;
  rotated.tenants[0].keys = {TestKey(2), TestKey(1)};
  RemoteTierOptions dropped = old_opts;
  dropped.tenants[0].keys = {TestKey(2)};
  Tier a = Make(old_opts), b = Make(rotated), c = Make(dropped);
  const BlockMeta m = MetaFor("alice", 960, 16384);
  std::vector<std::byte> payload(16384, std::byte{'P'});
  SlotHandle slot;
  ASSERT_TRUE(a.Put(m, payload, &slot).ok());
  const std::string stored = cluster_->Cli("-c get " + a.tier->KeyFor("alice", m));
  EXPECT_EQ(stored.find(std::string(32, 'P')), std::string::npos) << "no run of the plaintext in the cluster";
  std::vector<std::byte> got;
  SlotHandle bslot = *b.tier->Reserve(BlockMeta{.payload_bytes = 16384}), cslot = *c.tier->Reserve(BlockMeta{.payload_bytes = 16384});
  ASSERT_TRUE(b.Get(bslot, m, got).ok());
  EXPECT_EQ(got, payload);
  EXPECT_TRUE(absl::IsDataLoss(c.Get(cslot, m, got)));
  EXPECT_EQ(c.tier->misses().forged, 1u);
}

TEST_P(RemoteTierTest, APrimaryKilledUnderTrafficCostsMissesNeverWrongBytes) {
  auto c = OwnCluster({"alice"});
  ASSERT_NE(c, nullptr);
  RemoteTierOptions o = Options(*c, {"alice"});
  o.op_timeout_ms = 300;
  o.io_timeout_ms = 300;
  Tier t = Make(o);
  std::vector<std::pair<SlotHandle, BlockMeta>> blocks;
  for (uint64_t i = 0; i < 60; ++i) {
    const BlockMeta m = MetaFor("alice", 5000 + i, 16 << 10);
    SlotHandle slot;
    ASSERT_TRUE(t.Put(m, BytesFor(m), &slot).ok());
    blocks.emplace_back(slot, m);
  }
  // Replicas have it before the primary goes.
  ASSERT_TRUE(testing::Eventually([&] { return c->ReplicasSynced(); }));
  ASSERT_TRUE(c->Kill(0));
  const uint64_t start = MonotonicNanos();
  uint64_t ok = 0, missed = 0, slowest_ns = 0, ok_in_last_pass = 0;
  // Until a whole pass is served again after the misses of the failover
  // (however long a loaded machine takes to fail over), or a minute.
  while (!(missed > 0 && ok_in_last_pass == blocks.size()) && MonotonicNanos() - start < 60'000'000'000ull) {
    ok_in_last_pass = 0;
    for (const auto& [slot, m] : blocks) {
      std::vector<std::byte> got;
      const uint64_t t0 = MonotonicNanos();
      const absl::Status s = t.Get(slot, m, got);
      slowest_ns = std::max(slowest_ns, MonotonicNanos() - t0);
      if (s.ok()) {
        ASSERT_EQ(got, BytesFor(m)) << "a wrong byte was served";
        ++ok;
        ++ok_in_last_pass;
      } else {
        ++missed;
        if (getenv("KVTIER_DEBUG_FAILOVER")) std::cerr << (MonotonicNanos() - start) / 1000000 << " ms: " << s << "\n";
      }
    }
  }
  EXPECT_GT(missed, 0u) << "the dead primary's slots missed for a while";
  EXPECT_GT(ok, 0u);
  // After the failover the promoted replica serves the dead primary's slots
  // (a write it had not yet copied would be a miss: none here).
  EXPECT_EQ(ok_in_last_pass, blocks.size()) << "after the failover, every block is served again";
  // A miss costs at most the deadline and one reply timeout (plus scheduling).
  EXPECT_LT(slowest_ns, 1'500'000'000ull);
  const RedisCluster::Stats s = t.tier->ClusterStats("alice");
  EXPECT_GT(s.refreshes, 1u);
  std::cerr << "failover: " << ok << " hits, " << missed << " misses, slowest op " << slowest_ns / 1'000'000
            << " ms\n";
}

TEST_P(RemoteTierTest, AClusterDownAtStartIsDegradedAndHealsWhenItComesBack) {
  auto c = OwnCluster({"alice"});
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Stop());
  RemoteTierOptions o = Options(*c, {"alice"});
  o.op_timeout_ms = 200;
  Tier t = Make(o);  // starts with nothing answering
  EXPECT_EQ(t.tier->Health(), TierHealth::kFailed);
  const BlockMeta m = MetaFor("alice", 1, 4096);
  const uint64_t t0 = MonotonicNanos();
  EXPECT_FALSE(t.Put(m, BytesFor(m)).ok());
  EXPECT_LT(MonotonicNanos() - t0, 1'500'000'000ull) << "a write to a dead cluster fails within its deadline";
  ASSERT_TRUE(c->Restart());
  EXPECT_TRUE(testing::Eventually([&] { return t.tier->Health() == TierHealth::kHealthy; }, std::chrono::seconds(20)));
  SlotHandle slot;
  EXPECT_TRUE(testing::Eventually([&] { return t.Put(m, BytesFor(m), &slot).ok(); }, std::chrono::seconds(10)));
  std::vector<std::byte> got;
  ASSERT_TRUE(t.Get(slot, m, got).ok());
  EXPECT_EQ(got, BytesFor(m));
}

TEST_P(RemoteTierTest, SlotsReshardedUnderTrafficAreFollowed) {
  auto c = OwnCluster({"alice"});
  ASSERT_NE(c, nullptr);
  Tier t = Make(Options(*c, {"alice"}));
  std::vector<std::pair<SlotHandle, BlockMeta>> blocks;
  for (uint64_t i = 0; i < 200; ++i) {
    const BlockMeta m = MetaFor("alice", 7000 + i, 4096);
    SlotHandle slot;
    ASSERT_TRUE(t.Put(m, BytesFor(m), &slot).ok());
    blocks.emplace_back(slot, m);
  }
  // Node ids of two primaries.
  std::vector<std::string> primaries;
  for (absl::string_view line : absl::StrSplit(c->Cli("cluster nodes"), '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() > 2 && f[2].find("master") != std::string::npos && f[2].find("fail") == std::string::npos) {
      primaries.push_back(f[0]);
    }
  }
  ASSERT_GE(primaries.size(), 2u);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> wrong{0}, hits{0}, misses{0};
  std::thread traffic([&] {
    while (!stop.load()) {
      for (const auto& [slot, m] : blocks) {
        std::vector<std::byte> got;
        if (t.Get(slot, m, got).ok()) {
          ++hits;
          if (got != BytesFor(m)) ++wrong;
        } else {
          ++misses;
        }
      }
    }
  });
  const std::string reshard = c->Cli(absl::StrCat("--cluster reshard ", c->seeds()[0], " --cluster-from ", primaries[0],
                                                  " --cluster-to ", primaries[1],
                                                  " --cluster-slots 2000 --cluster-yes"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  traffic.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  const RedisCluster::Stats s = t.tier->ClusterStats("alice");
  EXPECT_GT(s.moved + s.ask, 0u) << reshard.substr(0, 2000);
  // Every block is still there, each read now goes to its new owner.
  for (const auto& [slot, m] : blocks) {
    std::vector<std::byte> got;
    ASSERT_TRUE(t.Get(slot, m, got).ok());
    EXPECT_EQ(got, BytesFor(m));
  }
  std::cerr << "reshard: " << hits.load() << " hits, " << misses.load() << " misses, " << s.moved << " MOVED, "
            << s.ask << " ASK\n";
}

}  // namespace
}  // namespace kvtier
