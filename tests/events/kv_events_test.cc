// SPDX-License-Identifier: Apache-2.0
// KvEvents: the msgpack batches vLLM's subscribers decode, producers on many
// threads (the store's) against the publisher thread, drops past the bound,
// and the replay socket fed hostile requests.
#include "events/kv_events.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace kvtier {
namespace {

BlockKey Key(uint32_t i) {
  BlockKey k;
  for (size_t b = 0; b < 32; ++b) k.bytes[b] = static_cast<uint8_t>((i * 131 + b * 7) & 0xff);
  k.bytes[28] = static_cast<uint8_t>(i >> 24);
  k.bytes[29] = static_cast<uint8_t>(i >> 16);
  k.bytes[30] = static_cast<uint8_t>(i >> 8);
  k.bytes[31] = static_cast<uint8_t>(i);
  return k;
}

uint64_t IntHash(const BlockKey& k) {
  uint64_t v = 0;
  for (size_t i = 24; i < 32; ++i) v = (v << 8) | k.bytes[i];
  return v;
}

std::string Str(const msgpack::object& o) { return o.as<std::string>(); }

const msgpack::object* Field(const msgpack::object& map, std::string_view name) {
  if (map.type != msgpack::type::MAP) return nullptr;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR && Str(kv.key) == name) return &kv.val;
  }
  return nullptr;
}

class KvEventsTest : public ::testing::Test {
 protected:
  // Queues, encoder and publisher processes (kvtierd --events-publisher).
  std::unique_ptr<KvEvents> Start(KvEventOptions opts, const std::vector<KvEventTenant>& tenants) {
    opts.publisher_exe = KVTIERD_PATH;
    auto ev = KvEvents::Create(opts, tenants, dir_.string());
    EXPECT_TRUE(ev.ok()) << ev.status();
    if (!ev.ok()) return nullptr;
    absl::Status s = (*ev)->StartPublishers();
    EXPECT_TRUE(s.ok()) << s;
    return s.ok() ? std::move(*ev) : nullptr;
  }
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kvtier-events-" + std::to_string(getpid()) + "-" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(KvEventsTest, EncodesVllmsTaggedMaps) {
  std::vector<KvEvents::Event> evs;
  evs.push_back({Key(1), 16, 0, KvMedium::kCpu});
  evs.push_back({Key(2), 0, 1, KvMedium::kDisk});
  evs.push_back({Key(3), 0, 1, KvMedium::kDisk});  // one BlockRemoved with both
  evs.push_back({Key(4), 0, 1, KvMedium::kCpu});   // another medium: another event
  evs.push_back({BlockKey{}, 0, 2, KvMedium::kCpu});
  const std::string payload = KvEvents::EncodeBatch(1234.5, evs, /*bytes_hashes=*/false);
  msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& batch = oh.get();
  ASSERT_EQ(batch.type, msgpack::type::MAP);
  EXPECT_EQ(batch.via.map.size, 2u) << "ts and events; data_parallel_rank is omitted as vLLM omits defaults";
  EXPECT_DOUBLE_EQ(Field(batch, "ts")->as<double>(), 1234.5);
  const msgpack::object& events = *Field(batch, "events");
  ASSERT_EQ(events.via.array.size, 4u);
  const msgpack::object& st = events.via.array.ptr[0];
  EXPECT_EQ(st.via.map.size, 8u);
  EXPECT_EQ(Str(st.via.map.ptr[0].key), "type") << "the tag comes first";
  EXPECT_EQ(Str(*Field(st, "type")), "BlockStored");
  EXPECT_EQ(Field(st, "block_hashes")->via.array.ptr[0].as<uint64_t>(), IntHash(Key(1)));
  EXPECT_TRUE(Field(st, "parent_block_hash")->is_nil());
  EXPECT_EQ(Field(st, "token_ids")->via.array.size, 0u);
  EXPECT_EQ(Field(st, "block_size")->as<uint32_t>(), 16u);
  EXPECT_TRUE(Field(st, "lora_id")->is_nil());
  EXPECT_EQ(Str(*Field(st, "medium")), "CPU");
  EXPECT_TRUE(Field(st, "lora_name")->is_nil());
  const msgpack::object& rm = events.via.array.ptr[1];
  EXPECT_EQ(Str(*Field(rm, "type")), "BlockRemoved");
  ASSERT_EQ(Field(rm, "block_hashes")->via.array.size, 2u);
  EXPECT_EQ(Field(rm, "block_hashes")->via.array.ptr[1].as<uint64_t>(), IntHash(Key(3)));
  EXPECT_EQ(Str(*Field(rm, "medium")), "DISK");
  EXPECT_EQ(Str(*Field(events.via.array.ptr[2], "medium")), "CPU");
  EXPECT_EQ(Str(*Field(events.via.array.ptr[3], "type")), "AllBlocksCleared");
  EXPECT_EQ(events.via.array.ptr[3].via.map.size, 1u);

  const std::string bytes = KvEvents::EncodeBatch(1, {evs[0]}, /*bytes_hashes=*/true);
  msgpack::object_handle ob = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& h = Field(Field(ob.get(), "events")->via.array.ptr[0], "block_hashes")->via.array.ptr[0];
  ASSERT_EQ(h.type, msgpack::type::BIN);
  ASSERT_EQ(h.via.bin.size, 32u);
  EXPECT_EQ(std::memcmp(h.via.bin.ptr, Key(1).bytes.data(), 32), 0);
}

// Producers on several threads while the publisher sends: every event
// arrives once, in order per producer; nothing is lost below the bound.
TEST_F(KvEventsTest, ManyProducersOneSubscriber) {
  KvEventOptions opts;
  opts.batch_ms = 2;
  auto ev = Start(opts, {{"t0", true, {}, {}}, {"t1", false, {}, {}}});
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->EndpointOf(1), "") << "a tenant that does not publish has no socket";
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.connect(ev->EndpointOf(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  constexpr uint32_t kThreads = 4, kEach = 2000;
  std::vector<std::thread> producers;
  for (uint32_t t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (uint32_t i = 0; i < kEach; ++i) {
        ev->Stored(0, Key(t * kEach + i), 16, KvMedium::kCpu);
        ev->Stored(1, Key(t * kEach + i), 16, KvMedium::kCpu);  // not published
      }
    });
  }
  for (std::thread& p : producers) p.join();
  std::set<uint64_t> seen;
  std::vector<uint64_t> last(kThreads, 0);
  int64_t expect_seq = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (seen.size() < kThreads * kEach && std::chrono::steady_clock::now() < deadline) {
    std::vector<zmq::message_t> frames;
    sub.set(zmq::sockopt::rcvtimeo, 200);
    if (!zmq::recv_multipart(sub, std::back_inserter(frames))) continue;
    ASSERT_EQ(frames.size(), 3u);
    ASSERT_EQ(frames[1].size(), 8u);
    int64_t seq = 0;
    for (size_t i = 0; i < 8; ++i) seq = (seq << 8) | static_cast<const uint8_t*>(frames[1].data())[i];
    if (expect_seq >= 0) {
      EXPECT_EQ(seq, expect_seq) << "sequence numbers without gaps";
    }
    expect_seq = seq + 1;
    msgpack::object_handle oh = msgpack::unpack(static_cast<const char*>(frames[2].data()), frames[2].size());
    const msgpack::object& events = *Field(oh.get(), "events");
    for (uint32_t i = 0; i < events.via.array.size; ++i) {
      const uint64_t h = Field(events.via.array.ptr[i], "block_hashes")->via.array.ptr[0].as<uint64_t>();
      EXPECT_TRUE(seen.insert(h).second) << "an event arrived twice";
    }
  }
  EXPECT_EQ(seen.size(), size_t{kThreads} * kEach);
  // The publisher counts a batch after sending it: the subscriber may be first.
  const auto counted = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (ev->stats().events < uint64_t{kThreads} * kEach && std::chrono::steady_clock::now() < counted) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const KvEventStats s = ev->stats();
  EXPECT_EQ(s.events, uint64_t{kThreads} * kEach);
  EXPECT_EQ(s.dropped, 0u);
}

TEST_F(KvEventsTest, PastTheBoundEventsAreDroppedAndCounted) {
  KvEventOptions opts;
  opts.batch_ms = 10000;  // the thread does not drain while the test pushes
  opts.max_pending = 100;
  auto ev = Start(opts, {{"t0", true, {}, {}}});
  ASSERT_NE(ev, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (uint32_t i = 0; i < 250; ++i) ev->Removed(0, Key(i), KvMedium::kDisk);
  EXPECT_EQ(ev->stats().dropped, 150u);
}

TEST_F(KvEventsTest, HostileReplayRequestsAreCountedAndAGoodOneIsServed) {
  KvEventOptions opts;
  opts.batch_ms = 2;
  opts.buffer_batches = 3;
  auto ev = Start(opts, {{"t0", true, {}, {}}});
  ASSERT_NE(ev, nullptr);
  struct stat st {};
  ASSERT_EQ(stat(ev->ReplayEndpointOf(0).substr(6).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "a tenant without uids or gids: kvtierd's own user only";
  for (uint32_t i = 0; i < 5; ++i) {  // five batches; three kept
    ev->Stored(0, Key(i), 16, KvMedium::kCpu);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  // Only a bound on a failure: the publisher (a TSan-built kvtierd, on a
  // CI machine also building the fuzz targets) once took over 3 s to answer.
  dealer.set(zmq::sockopt::rcvtimeo, 20000);
  dealer.connect(ev->ReplayEndpointOf(0));
  const std::string junk[] = {std::string("\x01\x02", 2), std::string(9, 'x')};
  for (const std::string& j : junk) {
    std::array<zmq::const_buffer, 2> m{zmq::const_buffer(), zmq::buffer(j)};
    zmq::send_multipart(dealer, m);
  }
  const std::string start(8, '\0');  // from 0: only what is kept comes back
  std::array<zmq::const_buffer, 2> req{zmq::const_buffer(), zmq::buffer(start)};
  zmq::send_multipart(dealer, req);
  std::vector<int64_t> seqs;
  for (;;) {
    std::vector<zmq::message_t> frames;
    ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(frames))) << "no end marker";
    ASSERT_EQ(frames.size(), 3u);
    int64_t seq = 0;
    for (size_t i = 0; i < 8; ++i) seq = (seq << 8) | static_cast<const uint8_t*>(frames[1].data())[i];
    if (seq == -1) {
      EXPECT_EQ(frames[2].size(), 0u);
      break;
    }
    seqs.push_back(seq);
  }
  EXPECT_EQ(seqs, (std::vector<int64_t>{2, 3, 4}));
  // The publisher reports its counters to the daemon within a second.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((ev->stats().bad_replays < 2 || ev->stats().replays < 1) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(ev->stats().bad_replays, 2u);
  EXPECT_EQ(ev->stats().replays, 1u);
}

TEST_F(KvEventsTest, AnEndpointThatCannotBindIsAClearError) {
  KvEventOptions opts;
  opts.publisher_exe = KVTIERD_PATH;
  opts.endpoint = "ipc://" + (dir_ / "no-such-dir" / "x.sock").string();
  auto ev = KvEvents::Create(opts, {{"t0", true, {}, {}}}, dir_.string());
  ASSERT_TRUE(ev.ok());
  absl::Status s = (*ev)->StartPublishers();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot bind"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[events] endpoint"), std::string::npos) << s;
}

// Never a file that is not a stale socket replaced; never a live socket
// taken from another publisher.
TEST_F(KvEventsTest, AFileOrALiveSocketAtThePathIsNotReplaced) {
  const std::filesystem::path file = dir_ / "taken.sock";
  { std::ofstream(file) << "not a socket"; }
  KvEventOptions opts;
  opts.publisher_exe = KVTIERD_PATH;
  opts.endpoint = "ipc://" + file.string();
  opts.replay_endpoint = "off";
  auto ev = KvEvents::Create(opts, {{"t0", true, {}, {}}}, dir_.string());
  ASSERT_TRUE(ev.ok());
  absl::Status s = (*ev)->StartPublishers();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is not a socket"), std::string::npos) << s;
  std::ifstream in(file);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "not a socket");

  KvEventOptions live;
  auto first = Start(live, {{"t0", true, {}, {}}});
  ASSERT_NE(first, nullptr);
  live.publisher_exe = KVTIERD_PATH;
  auto second = KvEvents::Create(live, {{"t0", true, {}, {}}}, dir_.string());
  ASSERT_TRUE(second.ok());
  s = (*second)->StartPublishers();
  ASSERT_FALSE(s.ok()) << "a second publisher took the first one's socket";
  EXPECT_NE(s.message().find("in use"), std::string::npos) << s;
}

// A publisher that dies (here killed; in life a peer that exhausted its
// descriptors or memory) is restarted; subscribers see a sequence gap for
// what went missing, and the daemon side never blocks.
TEST_F(KvEventsTest, ADeadPublisherIsRestartedAndTheLossIsAGap) {
  KvEventOptions opts;
  opts.batch_ms = 2;
  auto ev = Start(opts, {{"t0", true, {}, {}}});
  ASSERT_NE(ev, nullptr);
  const pid_t pid = ev->PublisherPidOf(0);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint32_t i = 0;
  while ((ev->stats().publisher_restarts == 0 || ev->stats().publishers_up == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    ev->Stored(0, Key(i++), 16, KvMedium::kCpu);  // some are lost while it is down
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(ev->stats().publisher_restarts, 1u);
  EXPECT_NE(ev->PublisherPidOf(0), pid);
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 200);
  sub.connect(ev->EndpointOf(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<int64_t> seqs;
  for (int round = 0; round < 50 && seqs.size() < 3; ++round) {
    ev->Stored(0, Key(100000 + round), 16, KvMedium::kCpu);
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(sub, std::back_inserter(frames))) continue;
    int64_t seq = 0;
    for (size_t b = 0; b < 8; ++b) seq = (seq << 8) | static_cast<const uint8_t*>(frames[1].data())[b];
    seqs.push_back(seq);
  }
  ASSERT_GE(seqs.size(), 2u) << "the restarted publisher serves the same endpoint";
  EXPECT_GT(ev->stats().dropped, 0u) << "events sent while it was down were lost, and counted";
  EXPECT_GT(seqs.front(), 0) << "the sequence went on past the loss";
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A tcp endpoint is held by kvtierd itself: while a publisher restarts, no
// one else can bind the port and pose as the tenant's publisher.
TEST_F(KvEventsTest, ATcpPortStaysKvtierdsWhileItsPublisherRestarts) {
  const int port = FreeTcpPort();
  KvEventOptions opts;
  opts.batch_ms = 2;
  opts.endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  opts.replay_endpoint = "off";
  auto ev = Start(opts, {{"t0", true, {}, {}}});
  ASSERT_NE(ev, nullptr);
  const pid_t pid = ev->PublisherPidOf(0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ev->PublisherPidOf(0) > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Down: try to take the port.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_NE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "the port was free for anyone to take";
  close(fd);
  while ((ev->stats().publisher_restarts == 0 || ev->stats().publishers_up == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 200);
  sub.connect(opts.endpoint);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  bool got = false;
  for (int round = 0; round < 50 && !got; ++round) {
    ev->Stored(0, Key(200000 + round), 16, KvMedium::kCpu);
    std::vector<zmq::message_t> frames;
    got = zmq::recv_multipart(sub, std::back_inserter(frames)).has_value();
  }
  EXPECT_TRUE(got) << "the restarted publisher serves the same port";
}

}  // namespace
}  // namespace kvtier
