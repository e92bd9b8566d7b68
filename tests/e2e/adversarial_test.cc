// SPDX-License-Identifier: Apache-2.0
// The trust boundary, attacked as a hostile tenant would: kvtierd serves a
// victim tenant (this test's uid, root) and an attacker tenant (uid 65534,
// "nobody"), and the attacker runs in a forked child that switched to its
// uid, using only the public API or the documented protocol. Each test is
// one attack; each checks that the victim's bytes are intact, that the
// daemon still answers (a fresh attach and a status call within a
// deadline), and that the refusal was counted. Without root (no second uid)
// every test skips.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

#include <httplib.h>

#include "gtest/gtest.h"
#include "ipc/admin_client.h"
#include "ipc/admin_commands.h"
#include "ipc/attach.h"
#include "ipc/kv_registration.h"
#include "ipc/unix_socket.h"
#include "kvtier/client.h"
#include "tests/support/client_helpers.h"
#include "tests/support/test_support.h"
#include "tiers/nvme_format.h"

namespace kvtier {
namespace {

using testing::DaemonProcess;
using Clock = std::chrono::steady_clock;

constexpr uid_t kAttacker = 65534;
constexpr uint64_t kBlockBytes = 8192;

// Runs fn in a forked child under the attacker's uid (and groups `groups`);
// returns its exit code, or 128 + signal.
template <typename F>
int AsAttacker(F fn, std::vector<gid_t> groups = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(groups.size(), groups.data()) != 0) _exit(90);
    if (setresgid(kAttacker, kAttacker, kAttacker) != 0 || setresuid(kAttacker, kAttacker, kAttacker) != 0) _exit(91);
    _exit(fn());
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

class AdversarialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run the attacker under another uid";
  }
  // Starts the daemon with the two tenants (and `extra` config), attaches
  // the victim and stores its blocks.
  void Start(const std::string& extra = "", const std::string& attacker_host = "8MiB") {
    d_ = std::make_unique<DaemonProcess>(
        extra + "\n[[tenants]]\nname = \"victim\"\nuids = [0]\nsalt = \"v\"\n"
                "[[tenants]]\nname = \"attacker\"\nuids = [65534]\nhost_bytes = \"" + attacker_host + "\"\n");
    ASSERT_TRUE(d_->Start().ok()) << d_->Log();
    victim_ = testing::AttachTo(d_->socket_path(), testing::TestNamespace(kBlockBytes));
    ASSERT_NE(victim_, nullptr);
    keys_ = testing::SeededKeys(*victim_, 1, 8);
    ASSERT_TRUE(testing::StoreFilled(*victim_, keys_).ok());
  }
  // The victim's blocks are all there, byte for byte.
  void ExpectVictimIntact() {
    auto hit = victim_->Lookup(keys_, {.lease = true});
    ASSERT_TRUE(hit.ok()) << hit.status().ToString();
    ASSERT_EQ(hit->hit_blocks, keys_.size());
    auto views = victim_->Load(hit->lease, keys_);
    ASSERT_TRUE(views.ok()) << views.status().ToString();
    for (size_t i = 0; i < keys_.size(); ++i) {
      EXPECT_TRUE(testing::MatchesKey(keys_[i], {(*views)[i].data, (*views)[i].size})) << "block " << i;
    }
    EXPECT_TRUE(victim_->Release(hit->lease).ok());
  }
  // The daemon serves: a new engine attaches and the admin socket answers,
  // each within two seconds.
  void ExpectAlive() {
    const auto t0 = Clock::now();
    AttachOptions o;
    o.socket_path = d_->socket_path();
    o.ns = testing::TestNamespace(kBlockBytes);
    auto c = Client::Attach(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto s = ipc::AdminCall(d_->admin_socket_path(), {{"cmd", "status"}}, std::chrono::seconds(2));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
    EXPECT_EQ(d_->WaitExit(std::chrono::milliseconds(0)), -1) << "kvtierd exited: " << d_->Log();
  }
  uint64_t Refused(const std::string& reason) {
    auto s = d_->Status();
    if (!s.ok() || !(*s)["stats"].contains("refused")) return 0;
    return (*s)["stats"]["refused"].value(reason, uint64_t{0});
  }

  std::unique_ptr<DaemonProcess> d_;
  std::unique_ptr<Client> victim_;
  std::vector<BlockKey> keys_;
};

// Looks each key up alone (with a lease) and loads it: how many came back
// with their own bytes.
int LoadEachIntact(Client& c, std::span<const BlockKey> keys) {
  int correct = 0;
  for (const BlockKey& k : keys) {
    auto r = c.Lookup({&k, 1}, {.lease = true});
    if (!r.ok() || r->hit_blocks == 0) continue;
    auto v = c.Load(r->lease, {&k, 1});
    if (v.ok() && v->size() == 1) correct += testing::MatchesKey(k, {(*v)[0].data, (*v)[0].size});
    (void)c.Release(r->lease);
  }
  return correct;
}

// A tier's entry in kvtierctl status, or null.
nlohmann::json TierStatus(const DaemonProcess& d, const std::string& tier) {
  auto s = d.Status();
  if (!s.ok()) return nullptr;
  for (const auto& t : (*s)["tiers"]) {
    if (t["tier"] == tier) return t;
  }
  return nullptr;
}

uint64_t TenantNvmeBytes(const DaemonProcess& d, const std::string& tenant) {
  auto s = d.Status();
  if (!s.ok()) return 0;
  for (const auto& t : (*s)["tenants"]) {
    if (t["name"] == tenant) return t["nvme_bytes"].get<uint64_t>();
  }
  return 0;
}

// The NVMe tier has nothing left to write: no write queued or in flight,
// and every block charged to a tenant there has landed (a block whose write
// or journal commit is pending is busy: nobody may evict it yet).
bool NvmeSettled(const DaemonProcess& d) {
  auto s = d.Status();
  if (!s.ok()) return false;
  uint64_t charged = 0;
  for (const auto& t : (*s)["tenants"]) charged += t["nvme_bytes"].get<uint64_t>();
  for (const auto& t : (*s)["tiers"]) {
    if (t["tier"] != "nvme") continue;
    return t["queued"] == 0 && t["in_flight"] == 0 && t["blocks"].get<uint64_t>() * kBlockBytes >= charged;
  }
  return false;
}

// A raw attach on the documented protocol, bypassing libkvtier's checks:
// the session socket, or -1.
int RawAttach(const std::string& socket, const NamespaceDescriptor& ns, const std::string& name = "raw") {
  absl::StatusOr<UniqueFd> fd = ipc::ConnectUnix(socket, SOCK_SEQPACKET);
  if (!fd.ok()) return -1;
  ipc::AttachRequest req;
  req.ns = ns;
  req.client_name = name;
  if (!ipc::SendMessage(fd->get(), ipc::EncodeAttachRequest(req)).ok()) return -1;
  absl::StatusOr<ipc::ReceivedMessage> m = ipc::ReceiveMessage(fd->get(), ipc::kMaxAttachMessage, 4);
  if (!m.ok() || m->eof) return -1;
  absl::StatusOr<ipc::AttachReply> reply = ipc::DecodeAttachReply(m->data);
  if (!reply.ok() || reply->status != 0) return -1;
  return fd->Release();
}

// A KV-cache registration on the documented protocol, bypassing libkvtier's
// checks: 2 layers of 16-token pages x 8 heads x 8 dims (f16: 8 KiB blocks)
// over a 1 MiB memfd said to lie at 0x100000000, K of layer l at
// base + l * layer_stride, V `v_offset` after it.
struct RawRegistration {
  int rc = 0;  // 0, or where it failed: 3 memfd, 4 send, 5 receive, 6 decode
  ipc::KvRegisterReply reply;
  std::vector<UniqueFd> fds;
};
RawRegistration RawRegister(int sock, uint64_t num_pages, uint64_t page_stride, uint64_t layer_stride,
                            uint64_t v_offset) {
  RawRegistration out;
  const int memfd = memfd_create("kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0 || ftruncate(memfd, 1 << 20) != 0 || fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    out.rc = 3;
    return out;
  }
  ipc::KvRegisterRequest r;
  r.layers = 2;
  r.page_tokens = 16;
  r.kv_heads = 8;
  r.head_dim = 8;
  r.dtype = 0;  // f16
  r.num_pages = num_pages;
  r.page_stride = page_stride;
  ipc::KvRegion g;
  g.base = 0x100000000;
  g.bytes = 1 << 20;
  r.regions.push_back(g);
  r.k_layers = {g.base, g.base + layer_stride};
  r.v_layers = {g.base + v_offset, g.base + layer_stride + v_offset};
  const int fds[] = {memfd};
  const bool sent = ipc::SendMessage(sock, ipc::EncodeKvRegister(r), fds).ok();
  close(memfd);
  if (!sent) {
    out.rc = 4;
    return out;
  }
  absl::StatusOr<ipc::ReceivedMessage> m = ipc::ReceiveMessage(sock, ipc::kMaxKvMessage, ipc::kMaxKvRegions);
  if (!m.ok() || m->eof) {
    out.rc = 5;
    return out;
  }
  absl::StatusOr<ipc::KvRegisterReply> reply = ipc::DecodeKvReply(m->data, m->fds.size());
  if (!reply.ok()) {
    out.rc = 6;
    return out;
  }
  out.reply = std::move(*reply);
  out.fds = std::move(m->fds);
  return out;
}

// Row 1: a KV registration whose geometry wraps 64 bits (2^32 - 1 pages of
// stride 2^32 + 2: the page extent wraps to a few bytes) over a sparse memfd.
TEST_F(AdversarialTest, Row01_RegistrationGeometryThatWrapsIsRefused) {
  Start("device = \"sim\"\n");
  const int rc = AsAttacker([&] {
    const int sock = RawAttach(d_->socket_path(), testing::TestNamespace(kBlockBytes));
    if (sock < 0) return 2;
    RawRegistration reg = RawRegister(sock, (uint64_t{1} << 32) - 1, (uint64_t{1} << 32) + 2, 8192, 4096);
    if (reg.rc != 0) return reg.rc;
    return reg.reply.status != 0 && reg.reply.message.find("2^64") != std::string::npos ? 0 : 7;
  });
  EXPECT_EQ(rc, 0) << "the registration was accepted; the attacker can address any page of the daemon";
  ExpectAlive();
  ExpectVictimIntact();
  auto s = d_->Status();
  EXPECT_EQ((*s)["stats"]["kv_registrations_refused"].get<int>(), 1);
}

// Row 2: the layer-event pages a registration gets are its own and
// read-only: a tenant cannot complete (or hold back) another tenant's
// layer events by writing into them.
TEST_F(AdversarialTest, Row02_EventPagesAreReadOnlyAndPerRegistration) {
  Start("device = \"sim\"\n");
  // Registers a small valid cache over the documented protocol; writes the
  // inode of its first event page to `out` (a pipe), or exits non-zero.
  auto register_and_probe = [&](int out) {
    const int sock = RawAttach(d_->socket_path(), testing::TestNamespace(kBlockBytes));
    if (sock < 0) return 2;
    RawRegistration reg = RawRegister(sock, 8, 2048, 65536, 32768);
    if (reg.rc != 0) return reg.rc;
    if (reg.reply.status != 0 || reg.fds.empty()) return 6;
    for (const UniqueFd& fd : reg.fds) {
      void* w = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (w != MAP_FAILED) return 7;  // writable: the attack works
    }
    struct stat st;
    if (fstat(reg.fds[0].get(), &st) != 0) return 8;
    const uint64_t ino = st.st_ino;
    (void)!write(out, &ino, sizeof(ino));
    char x;
    (void)!read(sock, &x, 1);  // hold the registration until the test ends (EOF)
    return 0;
  };
  int victim_pipe[2], attacker_pipe[2];
  ASSERT_EQ(pipe(victim_pipe), 0);
  ASSERT_EQ(pipe(attacker_pipe), 0);
  const pid_t victim = fork();
  if (victim == 0) _exit(register_and_probe(victim_pipe[1]));
  close(victim_pipe[1]);  // a child that exits without writing is EOF
  uint64_t victim_ino = 0, attacker_ino = 0;
  ASSERT_EQ(read(victim_pipe[0], &victim_ino, sizeof(victim_ino)), 8);
  const pid_t attacker = fork();
  if (attacker == 0) {
    if (setresgid(kAttacker, kAttacker, kAttacker) != 0 || setresuid(kAttacker, kAttacker, kAttacker) != 0) _exit(91);
    _exit(register_and_probe(attacker_pipe[1]));
  }
  close(attacker_pipe[1]);
  ASSERT_EQ(read(attacker_pipe[0], &attacker_ino, sizeof(attacker_ino)), 8)
      << "the attacker could map its event pages writable";
  EXPECT_NE(victim_ino, attacker_ino) << "two tenants' registrations share an event page";
  ExpectAlive();
  d_->Kill(SIGKILL);  // ends both children's sessions
  int st = 0;
  waitpid(victim, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  waitpid(attacker, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  for (int fd : {victim_pipe[0], attacker_pipe[0]}) close(fd);
}

// Row 3: one PREFETCH naming an NVMe-resident key 257 times, then
// INVALIDATE: 257 I/O references on an 8-bit counter, a double free.
TEST_F(AdversarialTest, Row03_DuplicateKeysInOneRequestAreRefused) {
  testing::TempDir nvme;
  Start("[tiers.host]\ncapacity = \"1MiB\"\n[tiers.nvme]\ndirs = [\"" + nvme.path() +
        "\"]\ncapacity = \"64MiB\"\nsegment_bytes = \"16MiB\"\nstaging_bytes = \"8MiB\"\n");
  const int rc = AsAttacker([&] {
    auto c = testing::AttachTo(d_->socket_path(), testing::TestNamespace(kBlockBytes));
    if (!c) return 2;
    auto keys = testing::SeededKeys(*c, 7, 2);
    if (!testing::StoreFilled(*c, keys, /*durable=*/true).ok()) return 3;
    // Prefetches and invalidations fold repeated keys (one reference per
    // block); requests with results per key or pins refuse them.
    std::vector<BlockKey> dup(257, keys[0]);
    auto p = c->Prefetch(dup);
    if (!p.ok() || *p > 1) return 4;
    auto l = c->Lookup(dup, {.lease = true});
    if (l.ok() || l.status().code() != ErrorCode::kInvalidArgument) return 5;
    auto t = c->StoreBegin(std::vector<BlockKey>{keys[1], keys[0], keys[1]});
    if (t.ok()) return 6;
    std::vector<BlockKey> twice = {keys[0], keys[1], keys[0], keys[1]};
    auto inv = c->Invalidate(twice);
    if (!inv.ok() || *inv != 2) return 7;
    return 0;
  });
  EXPECT_EQ(rc, 0);
  ExpectAlive();
  ExpectVictimIntact();
  EXPECT_EQ(Refused("duplicate_keys"), 2u);
}

// Row 4: a client sends KV-registration messages and never reads the
// replies; the control loop must not block in sendmsg.
TEST_F(AdversarialTest, Row04_APeerThatDoesNotReadIsDisconnected) {
  Start("device = \"sim\"\n");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    if (setresgid(kAttacker, kAttacker, kAttacker) != 0 || setresuid(kAttacker, kAttacker, kAttacker) != 0) _exit(91);
    const int sock = RawAttach(d_->socket_path(), testing::TestNamespace(kBlockBytes));
    if (sock < 0) _exit(2);
    const std::vector<std::byte> msg = ipc::EncodeKvUnregister(12345);
    // Flood for at most 20 s, never reading, until the daemon hangs up.
    const auto end = Clock::now() + std::chrono::seconds(20);
    int sent = 0;
    while (Clock::now() < end) {
      const ssize_t n = send(sock, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        if (++sent == 200) (void)!write(ready[1], "x", 1);
        continue;
      }
      if (errno == EAGAIN) {
        pollfd p{sock, POLLOUT, 0};
        poll(&p, 1, 10);
        continue;
      }
      _exit(0);  // EPIPE / ECONNRESET: the daemon closed the session
    }
    _exit(3);
  }
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  // While the attacker floods, the daemon keeps serving everyone else.
  for (int i = 0; i < 3; ++i) ExpectAlive();
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the daemon never closed the flooding session";
  ExpectVictimIntact();
  EXPECT_GE(Refused("slow_peer"), 1u);
  close(ready[0]);
  close(ready[1]);
}

// Rows 5 and 13: client names and model ids that are not printable UTF-8
// (invalid bytes, a newline that forges a log line, terminal escapes).
TEST_F(AdversarialTest, Row05_Row13_NamesThatAreNotPrintableUtf8AreRefused) {
  Start();
  const int rc = AsAttacker([&] {
    int refused = 0;
    for (const std::string& name : {std::string("\xff\xfe"), std::string("x\nevent=forged tenant=victim"),
                                   std::string("\x1b]0;owned\x07\x1b[2J"), std::string("ok\xc2\x9b" "31m")}) {
      AttachOptions o;
      o.socket_path = d_->socket_path();
      o.ns = testing::TestNamespace(kBlockBytes);
      o.client_name = name;
      auto c = Client::Attach(o);
      refused += !c.ok() && c.status().code() == ErrorCode::kInvalidArgument;
    }
    NamespaceDescriptor ns = testing::TestNamespace(kBlockBytes, "model\xc3(");
    if (RawAttach(d_->socket_path(), ns) < 0) ++refused;
    return refused == 5 ? 0 : 10 + refused;
  });
  EXPECT_EQ(rc, 0);
  ExpectAlive();
  auto s = d_->Status();
  ASSERT_TRUE(s.ok());  // the status JSON still dumps (it used to throw on the bytes)
  EXPECT_EQ(Refused("bad_client_string"), 5u);
  const std::string log = d_->Log();
  EXPECT_EQ(log.find("\nevent=forged"), std::string::npos) << "a forged log line";
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << "a terminal escape reached the log";
  ExpectVictimIntact();
}

// A KV-cache layout of kBlockBytes blocks over a memfd of `bytes` (sparse:
// costs nothing), at a made-up engine address.
KvCacheLayout LayoutOver(int memfd, uint64_t bytes) {
  KvCacheLayout l;
  l.layers = 2;
  l.page_tokens = 16;
  l.kv_heads = 8;
  l.head_dim = 8;  // 2 x K,V x 16 tokens x 8 x 8 x f16 = 8 KiB blocks
  l.dtype = "f16";
  l.num_pages = 8;
  const auto* base = reinterpret_cast<const std::byte*>(uintptr_t{0x100000000});
  for (uint32_t i = 0; i < 2; ++i) {
    l.k_layers.push_back(base + i * 65536);
    l.v_layers.push_back(base + i * 65536 + 32768);
  }
  l.regions.push_back({base, bytes, memfd});
  return l;
}

int SealedMemfd(uint64_t bytes) {
  const int fd = memfd_create("kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) return -1;
  return fd;
}

// Row 6: registered (sparse) memory is bounded per tenant, in caches and
// in bytes mapped into kvtierd; another tenant registers as before.
TEST_F(AdversarialTest, Row06_RegisteredMemoryIsBoundedPerTenant) {
  Start("device = \"sim\"\n[limits]\nkv_cache_bytes_per_tenant = \"1GiB\"\nkv_caches_per_tenant = 3\n");
  const int rc = AsAttacker([&] {
    auto c = testing::AttachTo(d_->socket_path(), testing::TestNamespace(kBlockBytes));
    if (!c) return 2;
    if (!c->RegisterKvCache(LayoutOver(SealedMemfd(768ull << 20), 768ull << 20)).ok()) return 3;
    auto big = c->RegisterKvCache(LayoutOver(SealedMemfd(512ull << 20), 512ull << 20));
    if (big.ok() || big.status().code() != ErrorCode::kBusy) return 4;
    // A second session of the same tenant shares the budget.
    auto c2 = testing::AttachTo(d_->socket_path(), testing::TestNamespace(kBlockBytes));
    if (!c2) return 5;
    if (!c2->RegisterKvCache(LayoutOver(SealedMemfd(1 << 20), 1 << 20)).ok()) return 6;
    if (!c->RegisterKvCache(LayoutOver(SealedMemfd(1 << 20), 1 << 20)).ok()) return 7;
    auto fourth = c2->RegisterKvCache(LayoutOver(SealedMemfd(1 << 20), 1 << 20));
    if (fourth.ok() || fourth.status().code() != ErrorCode::kBusy) return 8;
    return 0;
  });
  EXPECT_EQ(rc, 0);
  auto mine = victim_->RegisterKvCache(LayoutOver(SealedMemfd(768ull << 20), 768ull << 20));
  EXPECT_TRUE(mine.ok()) << "the victim's budget is its own: " << mine.status().ToString();
  EXPECT_EQ(Refused("tenant_mapped_bytes"), 1u);
  EXPECT_EQ(Refused("tenant_kv_caches"), 1u);
  // The attacker's sessions ended: its registrations are refunded.
  EXPECT_TRUE(testing::Eventually([&] {
    auto s = d_->Status();
    return s.ok() && (*s)["tenants"][1]["kv_caches"].get<int>() == 0 && (*s)["tenants"][0]["kv_caches"] == 1;
  }));
  ExpectAlive();
  ExpectVictimIntact();
}

// Row 8: lease books are bounded in blocks per session, not in leases.
TEST_F(AdversarialTest, Row08_LeasedBlocksAreBoundedPerSession) {
  Start("[limits]\nleased_blocks_per_session = 64\n");
  const int rc = AsAttacker([&] {
    auto c = testing::AttachTo(d_->socket_path(), testing::TestNamespace(kBlockBytes));
    if (!c) return 2;
    auto keys = testing::SeededKeys(*c, 3, 32);
    if (!testing::StoreFilled(*c, keys).ok()) return 3;
    auto a = c->Lookup(keys, {.lease = true});
    auto b = c->Lookup(keys, {.lease = true});
    if (!a.ok() || !b.ok() || a->hit_blocks != 32) return 4;
    auto third = c->Lookup(keys, {.lease = true});
    if (third.ok() || third.status().code() != ErrorCode::kBusy) return 5;
    if (!c->Release(a->lease).ok()) return 6;
    return c->Lookup(keys, {.lease = true}).ok() ? 0 : 7;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(Refused("session_leased_blocks"), 1u);
  ExpectAlive();
  ExpectVictimIntact();
}

// Row 7: one tenant opens sessions until refused; the other still attaches.
TEST_F(AdversarialTest, Row07_SessionsAreBoundedPerTenant) {
  Start("[ipc]\nmax_sessions = 8\n");  // two tenants: 4 each by default
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    if (setresgid(kAttacker, kAttacker, kAttacker) != 0 || setresuid(kAttacker, kAttacker, kAttacker) != 0) _exit(91);
    std::vector<std::unique_ptr<Client>> held;
    ErrorCode last = ErrorCode::kOk;
    for (int i = 0; i < 8; ++i) {
      AttachOptions o;
      o.socket_path = d_->socket_path();
      o.ns = testing::TestNamespace(kBlockBytes);
      auto c = Client::Attach(o);
      if (c.ok()) {
        held.push_back(std::move(*c));
      } else {
        last = c.status().code();
      }
    }
    const char report = static_cast<char>(held.size() * 16 + (last == ErrorCode::kBusy ? 1 : 0));
    (void)!write(ready[1], &report, 1);
    char x;
    (void)!read(done[0], &x, 1);  // hold them while the victim attaches
    _exit(0);
  }
  char report = 0;
  ASSERT_EQ(read(ready[0], &report, 1), 1);
  EXPECT_EQ(report / 16, 4) << "the attacker held more than its share";
  EXPECT_EQ(report % 16, 1) << "refusals are EBUSY";
  ExpectAlive();
  auto more = testing::AttachTo(d_->socket_path(), testing::TestNamespace(kBlockBytes));
  EXPECT_NE(more, nullptr);
  EXPECT_EQ(Refused("tenant_sessions"), 4u);
  (void)!write(done[1], "x", 1);
  waitpid(pid, nullptr, 0);
  ExpectVictimIntact();
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

// Row 12: attach/detach churn with fresh namespaces. A namespace no session
// uses and no block is left of is freed, so churn never grows the daemon
// and never runs into the limit; namespaces that hold blocks are bounded
// per tenant. The lines churn makes kvtierd log are rate-limited per
// tenant, with what was dropped counted.
TEST_F(AdversarialTest, Row12_AttachChurnIsBoundedInNamespacesAndLogLines) {
  Start("[limits]\nnamespaces_per_tenant = 50\nlog_lines_per_s = 5\n");
  const size_t log_before = d_->Log().size();
  const auto t0 = Clock::now();
  const int rc = AsAttacker([&] {
    // 400 fresh namespaces, one session each, nothing stored: all attach (a
    // session that hung up an instant ago may not be reaped yet: retry).
    for (int i = 0; i < 400; ++i) {
      AttachOptions o;
      o.socket_path = d_->socket_path();
      o.ns = testing::TestNamespace(kBlockBytes, "churn/model-" + std::to_string(i));
      auto c = Client::Attach(o);
      for (int retry = 0; retry < 50 && !c.ok() && c.status().code() == ErrorCode::kBusy; ++retry) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        c = Client::Attach(o);
      }
      if (!c.ok()) return 10;
    }
    // 60 more, each leaving a block behind: the 51st on are refused.
    int refused = 0;
    for (int i = 0; i < 60; ++i) {
      AttachOptions o;
      o.socket_path = d_->socket_path();
      o.ns = testing::TestNamespace(kBlockBytes, "kept/model-" + std::to_string(i));
      auto c = Client::Attach(o);
      if (!c.ok()) {
        refused += c.status().code() == ErrorCode::kBusy;
        continue;
      }
      if (!testing::StoreFilled(**c, testing::SeededKeys(**c, 7, 1)).ok()) return 11;
    }
    return refused == 10 ? 0 : 12;
  });
  EXPECT_EQ(rc, 0) << "10: churn was refused; 11: a store failed; 12: not exactly 10 namespaces refused";
  EXPECT_EQ(Refused("tenant_namespaces"), 10u);
  auto s = d_->Status();
  ASSERT_TRUE(s.ok());
  EXPECT_GE((*s)["stats"]["namespaces_freed"].get<uint64_t>(), 400u - 50u);
  // The victim's, the attacker's 50 that hold blocks, and the churn's not yet swept.
  EXPECT_LE((*s)["namespaces"].get<uint64_t>(), 1u + 50u + 50u) << s->dump();
  EXPECT_GT((*s)["stats"]["log_lines_suppressed"].get<uint64_t>(), 0u);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string log = d_->Log().substr(log_before);
  size_t lines = 0;
  for (size_t at = 0; (at = log.find("event=", at)) != std::string::npos; ++at) ++lines;
  // 1,380 attach-related lines (attach or refusal, detach, session end): at
  // most 50 in a burst plus 5/s, and one event=log_suppressed line each time
  // the peer may log again (as many at most).
  EXPECT_LT(double(lines), 2 * (50 + 5 * seconds) + 10) << seconds << " s: " << log;
  ExpectAlive();
  ExpectVictimIntact();
}

// Row 9: the attacker fills the shared NVMe tier several times over and
// pins its blocks there. Without NVMe quotas (the default), the victim's
// fair share (half the tier: two tenants) is protected: the attacker's
// demotions evict its own blocks, and once those are pinned they are
// refused and counted, never paid for with the victim's blocks.
TEST_F(AdversarialTest, Row09_AFloodingTenantCannotEvictAnotherBelowItsFairShare) {
  testing::TempDir data;
  Start("[tiers.host]\ncapacity = \"1MiB\"\n[tiers.nvme]\ndirs = [\"" + data.File("nvme") +
            "\"]\ncapacity = \"8MiB\"\nsegment_bytes = \"1MiB\"\nstaging_bytes = \"4MiB\"\n",
        /*attacker_host=*/"1MiB");
  // The victim: 8 + 200 blocks through a 128-block host tier, so about 80
  // are on NVMe (a quarter of its share of ~340 slots of 12 KiB).
  const std::vector<BlockKey> more = testing::SeededKeys(*victim_, 2, 200);
  for (size_t i = 0; i < more.size(); i += 20) {
    ASSERT_TRUE(testing::StoreFilled(*victim_, std::span(more).subspan(i, 20)).ok());
  }
  ASSERT_TRUE(testing::Eventually([&] { return TenantNvmeBytes(*d_, "victim") >= 80 * kBlockBytes; }))
      << d_->Status()->dump();
  const uint64_t victim_nvme = TenantNvmeBytes(*d_, "victim");
  // Its demotions durable: a block still being written (its journal record
  // waiting for a group commit, which batches up to a second when flushes
  // are slow) is busy, not evictable, so it would not make the flood's
  // refusals count against its fair share.
  ASSERT_TRUE(testing::Eventually([&] { return NvmeSettled(*d_); })) << d_->Status()->dump();
  // The attacker's demotions run in the daemon's background; on a loaded
  // machine they land later than its stores return. So after each batch
  // the attacker asks the test (a byte up a pipe) to wait until the NVMe
  // tier has settled (NvmeSettled), and goes on when it answers: the
  // test waits on the condition, not on the clock.
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  const auto settle = [&] {
    char c = 'w';
    return write(up[1], &c, 1) == 1 && read(down[0], &c, 1) == 1;
  };
  auto attacker = std::async(std::launch::async, [&] {
    return AsAttacker([&] {
      const int result = [&] {
        AttachOptions o;
        o.socket_path = d_->socket_path();
        o.ns = testing::TestNamespace(kBlockBytes, "flood");
        auto c = Client::Attach(o);
        if (!c.ok()) return 10;
        // 1,500 blocks: the whole tier twice over.
        const std::vector<BlockKey> flood = testing::SeededKeys(**c, 50, 1500);
        for (size_t i = 0; i < flood.size(); i += 50) {
          if (!testing::StoreFilled(**c, std::span(flood).subspan(i, 50)).ok()) return 11;
          if (!settle()) return 14;
        }
        // Pin everything of it that is on NVMe, then store as much again.
        std::vector<uint64_t> leases;
        for (const BlockKey& k : flood) {
          auto r = (*c)->Lookup({&k, 1}, {.lease = true});
          if (!r.ok() || r->hit_blocks != 1) continue;
          if (r->tiers[0] == TierKind::kNvme) {
            leases.push_back(r->lease);
          } else {
            (void)(*c)->Release(r->lease);
          }
        }
        if (leases.size() < 300) return 12;
        const std::vector<BlockKey> again = testing::SeededKeys(**c, 51, 600);
        for (size_t i = 0; i < again.size(); i += 50) {
          if (!testing::StoreFilled(**c, std::span(again).subspan(i, 50)).ok()) return 13;
          // Its demotions land (or are refused) while the pins hold.
          if (!settle()) return 14;
        }
        return 0;
      }();
      const char done = 'e';
      (void)!write(up[1], &done, 1);
      return result;
    });
  });
  // Answers each 'w' once the NVMe tier has settled, until the attacker is done
  // (or silent for far longer than any wait: it died).
  for (char what = 0;;) {
    pollfd p{.fd = up[0], .events = POLLIN, .revents = 0};
    if (poll(&p, 1, 4 * 1000 * testing::kPatience.count()) != 1 || read(up[0], &what, 1) != 1 || what != 'w') break;
    EXPECT_TRUE(testing::Eventually([&] { return NvmeSettled(*d_); })) << d_->Status()->dump();
    if (write(down[1], &what, 1) != 1) break;
  }
  const int rc = attacker.get();
  for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
  EXPECT_EQ(rc, 0) << "10: attach, 11/13: store, 12: too few blocks to pin, 14: the test stopped answering";
  EXPECT_EQ(TenantNvmeBytes(*d_, "victim"), victim_nvme) << "not one of the victim's NVMe blocks was evicted";
  const nlohmann::json nvme = TierStatus(*d_, "nvme");
  ASSERT_FALSE(nvme.is_null());
  // The wall it hit: its pins stop at its fair share (its leased lookups
  // end there), and a demotion that would need the victim's share is
  // refused. Either way, the victim keeps every block.
  EXPECT_GT(nvme["pins_refused_fair_share"].get<uint64_t>() + nvme["demotions_refused_fair_share"].get<uint64_t>(), 0u)
      << nvme.dump();
  EXPECT_GT(nvme["pins_refused_fair_share"].get<uint64_t>(), 0u) << "the attacker tried to pin past its share";
  // Its own loads need room too: that comes from the attacker, who is over its share.
  EXPECT_EQ(LoadEachIntact(*victim_, more), 200);
  ExpectAlive();
  ExpectVictimIntact();
}

// Row 10 (an operator's fault, not a tenant's: no second uid needed): one
// damaged byte in the journal's first record, and one in a record in the
// middle. Each damaged record costs at most the block it describes: the
// blocks are proven against their self-describing slot headers instead, and
// what was cut is said at warn level with counts. Before, replay stopped at
// the first damaged record and every durable block was discarded.
TEST(AdversarialRowTest, Row10_ADamagedJournalRecordCostsAtMostItsOwnBlock) {
  testing::TempDir data;
  const std::string config = "[tiers.nvme]\ndirs = [\"" + data.File("nvme") +
                             "\"]\ncapacity = \"16MiB\"\nsegment_bytes = \"1MiB\"\nstaging_bytes = \"4MiB\"\n";
  std::vector<BlockKey> keys;
  {
    DaemonProcess d(config);
    ASSERT_TRUE(d.Start().ok()) << d.Log();
    auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(kBlockBytes));
    ASSERT_NE(c, nullptr);
    keys = testing::SeededKeys(*c, 70, 60);
    for (size_t i = 0; i < keys.size(); i += 10) {
      ASSERT_TRUE(testing::StoreFilled(*c, std::span(keys).subspan(i, 10), /*durable=*/true).ok());
    }
    c.reset();
    ASSERT_EQ(d.Stop(), 0) << d.Log();
  }
  const std::string journal = data.File("nvme") + "/kvtier.journal";
  ASSERT_TRUE(testing::FlipByteOnDisk(journal, 8));                                // record 0: the format record
  ASSERT_TRUE(testing::FlipByteOnDisk(journal, 30 * sizeof(JournalRecord) + 40));  // record 30
  DaemonProcess d(config);
  ASSERT_TRUE(d.Start().ok()) << d.Log();
  auto c = testing::AttachTo(d.socket_path(), testing::TestNamespace(kBlockBytes));
  ASSERT_NE(c, nullptr);
  EXPECT_GE(LoadEachIntact(*c, keys), 59) << "a damaged record costs at most its own block";
  // Nothing served is wrong: every hit loads its own bytes.
  int hits = 0;
  for (const BlockKey& k : keys) {
    auto r = c->Lookup({&k, 1});
    hits += r.ok() ? static_cast<int>(r->hit_blocks) : 0;
  }
  EXPECT_EQ(LoadEachIntact(*c, keys), hits);
  const std::string log = d.Log();
  EXPECT_NE(log.find("event=nvme_journal_damaged"), std::string::npos) << log;
  EXPECT_NE(log.find("records_damaged=2"), std::string::npos) << log;
  const nlohmann::json nvme = TierStatus(d, "nvme");
  ASSERT_FALSE(nvme.is_null());
  EXPECT_GE(nvme["recovery"]["blocks"].get<uint64_t>(), 59u) << nvme.dump();
}

// Row 18: a tenant stores one block size until its whole arena is cut into
// slots of that size, then frees them all: the empty segments go back, and
// its blocks of another size fit again (before, they were refused until a
// restart).
TEST_F(AdversarialTest, Row18_FreedSegmentsServeOtherBlockSizes) {
  Start();
  const int rc = AsAttacker([&] {
    AttachOptions o;
    o.socket_path = d_->socket_path();
    o.ns = testing::TestNamespace(kBlockBytes, "small");
    auto small = Client::Attach(o);
    if (!small.ok()) return 10;
    // 8 MiB of 8 KiB blocks: the whole arena, carved.
    const std::vector<BlockKey> keys = testing::SeededKeys(**small, 60, 1024);
    for (size_t i = 0; i < keys.size(); i += 64) {
      if (!testing::StoreFilled(**small, std::span(keys).subspan(i, 64)).ok()) return 11;
    }
    auto gone = (*small)->Invalidate(keys);
    if (!gone.ok() || *gone == 0) return 12;
    o.ns = testing::TestNamespace(3 * kBlockBytes, "large");
    auto large = Client::Attach(o);
    if (!large.ok()) return 13;
    const std::vector<BlockKey> big = testing::SeededKeys(**large, 61, 64);
    for (size_t i = 0; i < big.size(); i += 16) {
      if (!testing::StoreFilled(**large, std::span(big).subspan(i, 16)).ok()) return 14;
    }
    return LoadEachIntact(**large, big) == 64 ? 0 : 15;
  });
  EXPECT_EQ(rc, 0) << "14: blocks of the other size were refused; 15: they came back wrong";
  ExpectAlive();
  ExpectVictimIntact();
}

// Row 11: any local user opens connections and never says hello.
TEST_F(AdversarialTest, Row11_UnauthenticatedConnectionsAreBounded) {
  Start();
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    // Not even a tenant: uid 65533.
    if (setresgid(65533, 65533, 65533) != 0 || setresuid(65533, 65533, 65533) != 0) _exit(91);
    std::vector<UniqueFd> held;
    for (int i = 0; i < 300; ++i) {
      absl::StatusOr<UniqueFd> fd = ipc::ConnectUnix(d_->socket_path(), SOCK_SEQPACKET);
      if (fd.ok()) held.push_back(std::move(*fd));
    }
    (void)!write(ready[1], "x", 1);
    char x;
    (void)!read(done[0], &x, 1);
    _exit(0);
  }
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  ExpectAlive();
  EXPECT_TRUE(testing::Eventually([&] { return Refused("pending_connections") >= 300 - 16; }))
      << Refused("pending_connections");
  (void)!write(done[1], "x", 1);
  waitpid(pid, nullptr, 0);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);
}

// Row 14: the metrics show daemon-wide lookups as they happen; with
// metrics.token_file set, a scrape without the token gets 401. Series by
// tenant appear only then (or with metrics.per_tenant).
TEST_F(AdversarialTest, Row14_MetricsCanRequireABearerToken) {
  testing::TempDir secrets;
  const std::string token_file = secrets.File("metrics.token");
  {
    std::ofstream f(token_file);
    f << "s3cret-token-1234\n";
  }
  chmod(token_file.c_str(), 0600);
  Start("[metrics]\nenabled = true\nport = 0\ntoken_file = \"" + token_file + "\"\n");
  auto s = d_->Status();
  ASSERT_TRUE(s.ok());
  const int port = (*s)["metrics"]["port"].get<int>();
  const int rc = AsAttacker([&] {
    httplib::Client http("127.0.0.1", port);
    auto anon = http.Get("/metrics");
    if (!anon || anon->status != 401) return 2;
    if (anon->body.find("kvtier_lookups_total") != std::string::npos) return 3;
    auto wrong = http.Get("/metrics", {{"Authorization", "Bearer s3cret-token-1235"}});
    if (!wrong || wrong->status != 401) return 4;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "a local user without the token could scrape";
  httplib::Client http("127.0.0.1", port);
  auto ok = http.Get("/metrics", {{"Authorization", "Bearer s3cret-token-1234"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_NE(ok->body.find("kvtier_lookups_total"), std::string::npos);
  EXPECT_NE(ok->body.find("tenant=\""), std::string::npos) << "with the token, per-tenant series";
  ExpectAlive();
  // A token file every user can read keeps nobody out: refused at start.
  chmod(token_file.c_str(), 0644);
  DaemonProcess loose("[metrics]\nenabled = true\nport = 0\ntoken_file = \"" + token_file + "\"\n");
  EXPECT_FALSE(loose.Start().ok());
  EXPECT_NE(loose.Log().find("readable by every user"), std::string::npos) << loose.Log();
}

// Every command of the admin table is dispatched (drain last: it stops the
// daemon), and an unknown one is refused naming every known command.
TEST_F(AdversarialTest, EveryAdminCommandOfTheTableIsAnswered) {
  Start();
  for (const ipc::AdminCommand& c : ipc::kAdminCommands) {
    if (c.name == "drain") continue;
    nlohmann::json req{{"cmd", std::string(c.name)}};
    if (c.name == "evict") req["tenant"] = "victim";
    auto r = ipc::AdminCall(d_->admin_socket_path(), req, std::chrono::seconds(5));
    // Answered by its handler: ok, or its own error (flush: this daemon has no NVMe tier).
    if (!r.ok()) {
      EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << c.name << ": " << r.status();
      EXPECT_EQ(r.status().message().find("unknown command"), std::string::npos) << c.name;
    }
  }
  auto unknown = ipc::AdminCall(d_->admin_socket_path(), {{"cmd", "reboot"}}, std::chrono::seconds(2));
  ASSERT_FALSE(unknown.ok());
  for (const ipc::AdminCommand& c : ipc::kAdminCommands) {
    EXPECT_NE(unknown.status().message().find(std::string(c.name)), std::string::npos) << unknown.status();
  }
  auto drain = ipc::AdminCall(d_->admin_socket_path(), {{"cmd", "drain"}}, std::chrono::seconds(5));
  ASSERT_TRUE(drain.ok()) << drain.status();
  EXPECT_TRUE((*drain)["draining"].get<bool>());
}

// Row 15 (admin): JSON with the wrong value types gets an error answer.
TEST_F(AdversarialTest, Row15_AdminRequestsWithWrongTypesAreAnswered) {
  Start();
  for (const char* bad : {R"({"cmd": "blocks", "limit": "ten"})", R"({"cmd": 5})",
                          R"({"cmd": "evict", "tenant": ["victim"]})", R"({"cmd": "blocks", "tenant": 7})"}) {
    // AdminCall turns an {"ok": false, "error": ...} answer into FailedPrecondition.
    auto r = ipc::AdminCall(d_->admin_socket_path(), nlohmann::json::parse(bad), std::chrono::seconds(2));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << bad << ": " << r.status();
    EXPECT_NE(r.status().message().find("bad request"), std::string::npos) << r.status();
  }
  // A line nested 300,000 levels deep (under the 1 MiB request bound) is
  // refused before it is built.
  {
    absl::StatusOr<UniqueFd> fd = ipc::ConnectUnix(d_->admin_socket_path(), SOCK_STREAM);
    ASSERT_TRUE(fd.ok()) << fd.status();
    const std::string deep = std::string(300000, '[') + std::string(300000, ']') + "\n";
    for (size_t at = 0; at < deep.size();) {
      const ssize_t n = write(fd->get(), deep.data() + at, deep.size() - at);
      ASSERT_GT(n, 0);
      at += static_cast<size_t>(n);
    }
    std::string answer;
    char buf[4096];
    pollfd p{fd->get(), POLLIN, 0};
    while (answer.find('\n') == std::string::npos && poll(&p, 1, 5000) == 1) {
      const ssize_t n = read(fd->get(), buf, sizeof(buf));
      if (n <= 0) break;
      answer.append(buf, static_cast<size_t>(n));
    }
    EXPECT_NE(answer.find("nested deeper than"), std::string::npos) << answer;
  }
  ExpectAlive();
  EXPECT_EQ(Refused("admin_bad_request"), 5u);
  ExpectVictimIntact();
}

// Row 17: an operator in kvtierd's group only as a supplementary group is
// admitted, as docs/operations.md says; without the group, refused.
TEST_F(AdversarialTest, Row17_SupplementaryGroupMembersAreAdmitted) {
  Start();
  const std::string admin = d_->admin_socket_path();
  auto call = [&] {
    auto r = ipc::AdminCall(admin, {{"cmd", "ping"}}, std::chrono::seconds(2));
    if (!r.ok()) return 2;
    return (*r)["ok"].get<bool>() ? 0 : 3;
  };
  EXPECT_EQ(AsAttacker(call, {getegid()}), 0) << "a member of the daemon's group by a supplementary group";
  EXPECT_NE(AsAttacker(call, {}), 0) << "no group in common";
}

}  // namespace
}  // namespace kvtier
