// SPDX-License-Identifier: Apache-2.0
// The daemon's side of KV events: per-tenant queues, the encoder thread,
// and the publisher processes it feeds and restarts (kv_events.h).
#include "events/kv_events.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "core/fmt_absl.h"
#include "core/units.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

extern char** environ;

namespace kvtier {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kMaxBackoff = 30 * kSecond;
constexpr size_t kMaxQueued = 256;             // batches waiting for a publisher
constexpr size_t kMaxQueuedBytes = 32u << 20;  // and their bytes

int64_t NowNs() { return static_cast<int64_t>(MonotonicNanos()); }

void PackStr(msgpack::packer<msgpack::sbuffer>& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHash(msgpack::packer<msgpack::sbuffer>& pk, const BlockKey& key, bool bytes_hashes) {
  if (bytes_hashes) {
    pk.pack_bin(32);
    pk.pack_bin_body(reinterpret_cast<const char*>(key.bytes.data()), 32);
    return;
  }
  // vLLM: int.from_bytes(hash, "big") & (2**64 - 1): the last 8 bytes.
  uint64_t v = 0;
  for (size_t i = 24; i < 32; ++i) v = (v << 8) | key.bytes[i];
  pk.pack_uint64(v);
}

// A tcp://HOST:PORT endpoint's listening socket ("*" for every address;
// numeric IPv4 or [IPv6], or localhost).
absl::StatusOr<int> ListenTcp(const std::string& endpoint) {
  const std::string hostport = endpoint.substr(6);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError(absl::StrCat(endpoint, ": no port"));
  std::string host = hostport.substr(0, colon);
  const std::string port = hostport.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "*") host = "0.0.0.0";
  if (host == "localhost") host = "127.0.0.1";
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(endpoint, ": not a numeric address and port"));
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  const bool ok = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                  bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 128) == 0;
  const int err = errno;
  freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) close(fd);
    return absl::FailedPreconditionError(absl::StrCat("cannot bind ", endpoint, ": ", strerror(err)));
  }
  return fd;
}

std::string Expand(const std::string& pattern, const std::string& tenant) {
  return absl::StrReplaceAll(pattern, {{"{tenant}", tenant}});
}

}  // namespace

std::string_view KvMediumName(KvMedium m) {
  switch (m) {
    case KvMedium::kGpu:
      return "GPU";
    case KvMedium::kCpu:
      return "CPU";
    case KvMedium::kDisk:
      return "DISK";
    case KvMedium::kRemote:
      return "REMOTE";
  }
  return "CPU";
}

struct KvEvents::Tenant {
  std::string name;
  bool publish = false;
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  std::string endpoint, replay_endpoint;
  // tcp endpoints: listening sockets kvtierd holds for the tenant's whole
  // life and hands to each publisher it starts, so that while one restarts
  // nobody else can take the port and pose as the tenant's publisher.
  int pub_listen = -1, replay_listen = -1;

  Mutex mu;
  std::vector<Event> pending ABSL_GUARDED_BY(mu);
  bool lost ABSL_GUARDED_BY(mu) = false;  // events dropped since the last batch went out

  // The encoder thread's (and StartPublishers', before it runs).
  int fd = -1;
  pid_t pid = -1;
  int64_t seq = 0;
  int64_t up_since_ns = 0, restart_at_ns = 0, backoff_ns = kSecond;
  bool gap = false;  // skip a sequence number before the next batch
  // Batches the publisher has not taken yet (its socket buffer full): sent
  // as it reads, dropped (with a gap) past kMaxQueued.
  std::deque<std::pair<std::string, size_t>> outq;  // message, events in it
  size_t outq_bytes = 0;
  std::atomic<uint64_t> replays{0}, bad_replays{0}, throttled{0};
  std::atomic<bool> up{false};
  std::atomic<pid_t> pid_seen{-1};  // pid, for other threads
  int64_t heard_ns = 0;  // its last message (stats come every second)
  bool broken = false;   // a send failed for another reason than a full buffer
};

KvEvents::KvEvents(const KvEventOptions& opts) : opts_(opts) {}

absl::StatusOr<std::unique_ptr<KvEvents>> KvEvents::Create(const KvEventOptions& opts,
                                                          const std::vector<KvEventTenant>& tenants,
                                                          const std::string& run_dir) {
  std::unique_ptr<KvEvents> ev(new KvEvents(opts));
  for (const KvEventTenant& kt : tenants) {
    auto t = std::make_unique<Tenant>();
    t->name = kt.name;
    t->publish = kt.publish;
    t->uids = kt.uids;
    t->gids = kt.gids;
    if (kt.publish) {
      t->endpoint = Expand(opts.endpoint.empty() ? absl::StrCat("ipc://", run_dir, "/kvtier-events-{tenant}.sock")
                                                 : opts.endpoint,
                           kt.name);
      if (opts.replay_endpoint != "off") {
        t->replay_endpoint = Expand(opts.replay_endpoint.empty()
                                        ? absl::StrCat("ipc://", run_dir, "/kvtier-replay-{tenant}.sock")
                                        : opts.replay_endpoint,
                                    kt.name);
      }
    }
    ev->publish_.push_back(kt.publish);
    ev->tenants_.push_back(std::move(t));
  }
  // The running binary itself, even after an upgrade replaced the file.
  ev->exe_ = opts.publisher_exe.empty() ? std::string("/proc/self/exe") : opts.publisher_exe;
  return ev;
}

absl::Status KvEvents::Spawn(Tenant& t, bool wait_ready) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("events: socketpair: ", strerror(errno)));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  // The child gets them as 3, 4 and 5 (dup2 clears close-on-exec); from
  // copies above those, so that no dup2 overwrites a source still to come.
  const int src[3] = {fcntl(sv[1], F_DUPFD_CLOEXEC, 10),
                      t.pub_listen >= 0 ? fcntl(t.pub_listen, F_DUPFD_CLOEXEC, 10) : -1,
                      t.replay_listen >= 0 ? fcntl(t.replay_listen, F_DUPFD_CLOEXEC, 10) : -1};
  for (int i = 0; i < 3; ++i) {
    if (src[i] >= 0) posix_spawn_file_actions_adddup2(&fa, src[i], 3 + i);
  }
  std::string name = absl::StrCat("tenant=", t.name);
  char arg0[] = "kvtierd-events";
  char arg1[] = "--events-publisher";
  char arg2[] = "3";
  char* argv[] = {arg0, arg1, arg2, name.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe_.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  for (int fd : src) {
    if (fd >= 0) close(fd);
  }
  close(sv[1]);
  if (rc != 0) {
    close(sv[0]);
    return absl::InternalError(absl::StrCat("events: cannot start the publisher of tenant \"", t.name, "\" (", exe_,
                                            "): ", strerror(rc)));
  }
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  if (!t.uids.empty()) uid = t.uids.front();
  if (!t.gids.empty()) gid = t.gids.front();
  const nlohmann::json cfg{{"tenant", t.name},
                           {"endpoint", t.endpoint},
                           {"replay_endpoint", t.replay_endpoint},
                           {"topic", opts_.topic},
                           {"endpoint_fd", t.pub_listen >= 0 ? 4 : -1},
                           {"replay_fd", t.replay_listen >= 0 ? 5 : -1},
                           {"uid", t.uids.empty() ? -1 : int64_t{uid}},
                           {"gid", t.gids.empty() ? -1 : int64_t{gid}},
                           {"buffer_batches", opts_.buffer_batches},
                           {"buffer_bytes", opts_.buffer_bytes},
                           {"max_connections", opts_.max_connections},
                           {"memory", opts_.publisher_memory},
                           {"replays_per_s", opts_.replays_per_s},
                           {"replay_max_batches", opts_.replay_max_batches}};
  const std::string msg = "C" + cfg.dump();
  if (send(sv[0], msg.data(), msg.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size())) {
    close(sv[0]);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return absl::InternalError(absl::StrCat("events: the publisher of tenant \"", t.name, "\" did not take its config"));
  }
  t.fd = sv[0];
  t.pid = pid;
  t.heard_ns = NowNs();
  t.broken = false;
  t.pid_seen.store(pid, std::memory_order_relaxed);
  t.up_since_ns = NowNs();
  if (!wait_ready) return absl::OkStatus();
  // Its sockets are bound (or why not) within 10 s.
  pollfd p{t.fd, POLLIN, 0};
  char buf[4096];
  ssize_t n = -1;
  if (poll(&p, 1, 10000) == 1) n = recv(t.fd, buf, sizeof(buf), 0);
  std::string error = "it did not answer in 10 s";
  if (n > 1 && buf[0] == 'R') {
    nlohmann::json r = nlohmann::json::parse(std::string_view(buf + 1, static_cast<size_t>(n - 1)), nullptr, false);
    if (!r.is_discarded() && r.value("ok", false)) {
      t.up.store(true, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (!r.is_discarded()) error = r.value("error", std::string("unknown"));
  }
  close(t.fd);
  t.fd = -1;
  kill(t.pid, SIGKILL);
  waitpid(t.pid, nullptr, 0);
  t.pid = -1;
  t.pid_seen.store(-1, std::memory_order_relaxed);
  return absl::FailedPreconditionError(absl::StrCat("events: tenant \"", t.name, "\": ", error,
                                                    "; check [events] endpoint and replay_endpoint"));
}

absl::Status KvEvents::StartPublishers() {
  for (auto& t : tenants_) {
    if (!t->publish) continue;
    for (auto [endpoint, fd] : {std::pair{&t->endpoint, &t->pub_listen}, {&t->replay_endpoint, &t->replay_listen}}) {
      if (!absl::StartsWith(*endpoint, "tcp://")) continue;
      absl::StatusOr<int> l = ListenTcp(*endpoint);
      if (!l.ok()) {
        return absl::FailedPreconditionError(absl::StrCat("events: tenant \"", t->name, "\": ", l.status().message(),
                                                          "; check [events] endpoint and replay_endpoint"));
      }
      *fd = *l;
    }
    if (absl::Status s = Spawn(*t, /*wait_ready=*/true); !s.ok()) {
      for (auto& u : tenants_) {
        if (u->pid > 0) {
          close(u->fd);
          kill(u->pid, SIGKILL);
          waitpid(u->pid, nullptr, 0);
          u->pid = -1;
          u->pid_seen.store(-1, std::memory_order_relaxed);
          u->fd = -1;
        }
      }
      return s;
    }
    spdlog::info("event=kv_events_publishing tenant={} endpoint={} replay={} pid={}", t->name, t->endpoint,
                 t->replay_endpoint.empty() ? "off" : t->replay_endpoint, t->pid);
    if (!absl::StartsWith(t->endpoint, "ipc://")) {
      spdlog::warn("event=kv_events_unprotected tenant={} endpoint={} hint=\"whoever reaches this endpoint sees which "
                   "prefixes the tenant holds; prefer an ipc:// endpoint (docs/security.md)\"",
                   t->name, t->endpoint);
    }
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

KvEvents::~KvEvents() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  // A publisher ends when its socket to the daemon closes; it removes its
  // socket files. One that does not within a second is killed.
  for (auto& t : tenants_) {
    if (t->fd >= 0) close(t->fd);
    t->fd = -1;
  }
  const int64_t deadline = NowNs() + kSecond;
  for (auto& t : tenants_) {
    for (int* fd : {&t->pub_listen, &t->replay_listen}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }
  for (auto& t : tenants_) {
    if (t->pid <= 0) continue;
    while (waitpid(t->pid, nullptr, WNOHANG) == 0) {
      if (NowNs() > deadline) {
        kill(t->pid, SIGKILL);
        waitpid(t->pid, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    t->pid = -1;
    t->pid_seen.store(-1, std::memory_order_relaxed);
  }
}

void KvEvents::Push(uint16_t tenant, const Event& e) {
  Tenant& t = *tenants_[tenant];
  MutexLock l(&t.mu);
  if (t.pending.size() >= opts_.max_pending) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    t.lost = true;
    return;
  }
  t.pending.push_back(e);
}

void KvEvents::Stored(uint16_t tenant, const BlockKey& key, uint32_t block_tokens, KvMedium medium) {
  if (!Publishes(tenant)) return;
  Push(tenant, Event{key, block_tokens, 0, medium});
}

void KvEvents::Removed(uint16_t tenant, const BlockKey& key, KvMedium medium) {
  if (!Publishes(tenant)) return;
  Push(tenant, Event{key, 0, 1, medium});
}

void KvEvents::Cleared(uint16_t tenant) {
  if (!Publishes(tenant)) return;
  Push(tenant, Event{BlockKey{}, 0, 2, KvMedium::kCpu});
}

std::string KvEvents::EncodeBatch(double ts, const std::vector<Event>& events, bool bytes_hashes) {
  // One BlockStored per block (kvtierd knows no parent), consecutive
  // removals of one medium in one BlockRemoved.
  struct Out {
    uint8_t kind;
    KvMedium medium;
    uint32_t block_tokens;
    size_t first, count;
  };
  std::vector<Out> out;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind == 1 && !out.empty() && out.back().kind == 1 && out.back().medium == e.medium &&
        out.back().first + out.back().count == i) {
      ++out.back().count;
      continue;
    }
    out.push_back(Out{e.kind, e.medium, e.block_tokens, i, 1});
  }
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(&buf);
  pk.pack_map(2);
  PackStr(pk, "ts");
  pk.pack_double(ts);
  PackStr(pk, "events");
  pk.pack_array(static_cast<uint32_t>(out.size()));
  for (const Out& o : out) {
    if (o.kind == 0) {
      pk.pack_map(8);
      PackStr(pk, "type");
      PackStr(pk, "BlockStored");
      PackStr(pk, "block_hashes");
      pk.pack_array(1);
      PackHash(pk, events[o.first].key, bytes_hashes);
      PackStr(pk, "parent_block_hash");
      pk.pack_nil();
      PackStr(pk, "token_ids");
      pk.pack_array(0);
      PackStr(pk, "block_size");
      pk.pack_uint32(o.block_tokens);
      PackStr(pk, "lora_id");
      pk.pack_nil();
      PackStr(pk, "medium");
      PackStr(pk, KvMediumName(o.medium));
      PackStr(pk, "lora_name");
      pk.pack_nil();
    } else if (o.kind == 1) {
      pk.pack_map(3);
      PackStr(pk, "type");
      PackStr(pk, "BlockRemoved");
      PackStr(pk, "block_hashes");
      pk.pack_array(static_cast<uint32_t>(o.count));
      for (size_t i = o.first; i < o.first + o.count; ++i) PackHash(pk, events[i].key, bytes_hashes);
      PackStr(pk, "medium");
      PackStr(pk, KvMediumName(o.medium));
    } else {
      pk.pack_map(1);
      PackStr(pk, "type");
      PackStr(pk, "AllBlocksCleared");
    }
  }
  return std::string(buf.data(), buf.size());
}

void KvEvents::Supervise(Tenant& t, int64_t now_ns) {
  if (t.pid > 0) {
    int status = 0;
    const pid_t r = waitpid(t.pid, &status, WNOHANG);
    const bool hung = now_ns - t.heard_ns > 10 * kSecond;  // stopped, or stuck: no stats for 10 s
    if (r == 0 && t.fd >= 0 && !hung && !t.broken) {
      if (now_ns - t.up_since_ns > 60 * kSecond) t.backoff_ns = kSecond;
      return;
    }
    if (r == 0) {  // hung, or its socket broke, and it lives on: end it
      kill(t.pid, SIGKILL);
      waitpid(t.pid, &status, 0);
    }
    spdlog::warn("event=kv_events_publisher_exited tenant={} status={} restart_in_s={} hint=\"a publisher ends when "
                 "a peer on the tenant's event sockets exhausts its limits ([events] max_connections, "
                 "publisher_memory); the tenant's subscribers reconnect and see a sequence gap\"",
                 t.name, WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                                             : absl::StrCat("exit ", WEXITSTATUS(status)),
                 t.backoff_ns / kSecond);
    if (t.fd >= 0) close(t.fd);
    t.fd = -1;
    t.pid = -1;
    t.pid_seen.store(-1, std::memory_order_relaxed);
    t.up.store(false, std::memory_order_relaxed);
    t.gap = true;
    for (const auto& [msg, events] : t.outq) dropped_.fetch_add(events, std::memory_order_relaxed);
    t.outq.clear();
    t.outq_bytes = 0;
    t.restart_at_ns = now_ns + t.backoff_ns;
    t.backoff_ns = std::min(kMaxBackoff, t.backoff_ns * 2);
    return;
  }
  if (now_ns < t.restart_at_ns) return;
  if (absl::Status s = Spawn(t, /*wait_ready=*/false); !s.ok()) {
    spdlog::warn("event=kv_events_publisher_restart_failed tenant={} detail=\"{}\"", t.name, s.message());
    t.restart_at_ns = now_ns + t.backoff_ns;
    t.backoff_ns = std::min(kMaxBackoff, t.backoff_ns * 2);
    return;
  }
  restarts_.fetch_add(1, std::memory_order_relaxed);
  spdlog::info("event=kv_events_publisher_restarted tenant={} pid={}", t.name, t.pid);
}

void KvEvents::Send(Tenant& t, std::vector<Event>& events, double ts) {
  for (size_t first = 0; first < events.size(); first += kMaxEventsPerBatch) {
    const size_t n = std::min(events.size() - first, kMaxEventsPerBatch);
    if (t.fd < 0) {
      dropped_.fetch_add(n, std::memory_order_relaxed);
      t.gap = true;
      continue;
    }
    const std::vector<Event> part(events.begin() + static_cast<ptrdiff_t>(first),
                                  events.begin() + static_cast<ptrdiff_t>(first + n));
    if (t.gap) {
      ++t.seq;  // subscribers see the loss as a missing sequence number
      t.gap = false;
    }
    std::string msg(9, '\0');
    msg[0] = 'B';
    const uint64_t seq = static_cast<uint64_t>(t.seq);
    for (int i = 0; i < 8; ++i) msg[static_cast<size_t>(1 + i)] = static_cast<char>((seq >> (56 - 8 * i)) & 0xff);
    msg += EncodeBatch(ts, part, opts_.bytes_hashes);
    if (t.outq.size() >= kMaxQueued || t.outq_bytes + msg.size() > kMaxQueuedBytes) {
      // The publisher is far behind: the batch is lost, never waited for.
      dropped_.fetch_add(n, std::memory_order_relaxed);
      t.gap = true;
      continue;
    }
    ++t.seq;
    t.outq_bytes += msg.size();
    t.outq.emplace_back(std::move(msg), n);
  }
  Flush(t);
}

void KvEvents::Flush(Tenant& t) {
  while (!t.outq.empty() && t.fd >= 0) {
    const std::string& msg = t.outq.front().first;
    if (send(t.fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size())) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;  // it reads, then more
      t.broken = true;  // gone, or a message it cannot take: Supervise ends and restarts it
      return;
    }
    batches_.fetch_add(1, std::memory_order_relaxed);
    events_.fetch_add(t.outq.front().second, std::memory_order_relaxed);
    t.outq_bytes -= msg.size();
    t.outq.pop_front();
  }
}

void KvEvents::Run() {
  std::vector<Event> batch;
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    const bool stopping = stop_.load(std::memory_order_acquire);
    // Stats and readiness from the publishers while the batch gathers.
    std::vector<pollfd> fds;
    std::vector<Tenant*> who;
    for (auto& t : tenants_) {
      if (t->fd >= 0) {
        fds.push_back(pollfd{t->fd, static_cast<short>(POLLIN | (t->outq.empty() ? 0 : POLLOUT)), 0});
        who.push_back(t.get());
      }
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now());
    const int timeout = stopping ? 0 : static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 100));
    if (fds.empty()) {
      if (timeout > 0) std::this_thread::sleep_for(std::chrono::milliseconds(timeout));
    } else if (poll(fds.data(), fds.size(), timeout) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents & POLLOUT) Flush(*who[i]);
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[1024];
        for (int k = 0; k < 8; ++k) {
          const ssize_t n = recv(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
          if (n <= 0) break;
          who[i]->heard_ns = NowNs();
          if (buf[0] == 'R') {
            nlohmann::json r = nlohmann::json::parse(std::string_view(buf + 1, static_cast<size_t>(n - 1)), nullptr,
                                                     false);
            const bool ok = !r.is_discarded() && r.value("ok", false);
            who[i]->up.store(ok, std::memory_order_relaxed);
            if (!ok) {
              spdlog::warn("event=kv_events_publisher_failed tenant={} detail=\"{}\"", who[i]->name,
                           r.is_discarded() ? std::string("bad answer") : r.value("error", std::string("unknown")));
            }
          } else if (buf[0] == 'S') {
            nlohmann::json s = nlohmann::json::parse(std::string_view(buf + 1, static_cast<size_t>(n - 1)), nullptr,
                                                     false);
            if (s.is_discarded() || !s.is_object()) continue;
            who[i]->replays.store(s.value("replays", uint64_t{0}), std::memory_order_relaxed);
            who[i]->bad_replays.store(s.value("bad_replays", uint64_t{0}), std::memory_order_relaxed);
            who[i]->throttled.store(s.value("throttled", uint64_t{0}), std::memory_order_relaxed);
          }
        }
      }
    }
    const int64_t now_ns = NowNs();
    if (!stopping) {
      for (auto& t : tenants_) {
        if (t->publish) Supervise(*t, now_ns);
      }
    }
    if (!stopping && std::chrono::steady_clock::now() < next) continue;
    next = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.batch_ms);
    const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    bool left = false;
    for (auto& t : tenants_) {
      if (!t->publish) continue;
      {
        MutexLock l(&t->mu);
        batch.swap(t->pending);
        if (t->lost) t->gap = true;
        t->lost = false;
      }
      if (!batch.empty()) Send(*t, batch, ts);
      batch.clear();
      MutexLock l(&t->mu);
      left = left || !t->pending.empty();
    }
    if (stopping) {
      // What is queued for the publishers goes before the sockets close.
      const int64_t until = NowNs() + kSecond;
      for (auto& t : tenants_) {
        while (!t->outq.empty() && t->fd >= 0 && NowNs() < until) {
          Flush(*t);
          if (!t->outq.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      if (!left) return;
    }
  }
}

KvEventStats KvEvents::stats() const {
  KvEventStats s;
  s.events = events_.load(std::memory_order_relaxed);
  s.batches = batches_.load(std::memory_order_relaxed);
  s.dropped = dropped_.load(std::memory_order_relaxed);
  s.publisher_restarts = restarts_.load(std::memory_order_relaxed);
  for (const auto& t : tenants_) {
    s.replays += t->replays.load(std::memory_order_relaxed);
    s.bad_replays += t->bad_replays.load(std::memory_order_relaxed);
    s.replays_throttled += t->throttled.load(std::memory_order_relaxed);
    s.publishers_up += t->up.load(std::memory_order_relaxed) ? 1 : 0;
  }
  return s;
}

std::string KvEvents::EndpointOf(uint16_t t) const { return t < tenants_.size() ? tenants_[t]->endpoint : ""; }

pid_t KvEvents::PublisherPidOf(uint16_t t) const {
  return t < tenants_.size() ? tenants_[t]->pid_seen.load(std::memory_order_relaxed) : -1;
}

std::string KvEvents::ReplayEndpointOf(uint16_t t) const {
  return t < tenants_.size() ? tenants_[t]->replay_endpoint : "";
}

}  // namespace kvtier
