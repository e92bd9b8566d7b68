// SPDX-License-Identifier: Apache-2.0
// The publisher process of one tenant's KV events (kv_events.h): kvtierd
// --events-publisher FD. It owns the tenant's ZeroMQ PUB and replay
// sockets, so a peer that exhausts ZeroMQ (descriptors, memory) ends this
// process, not kvtierd. Everything from FD is the daemon's; everything from
// the sockets is hostile.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "events/kv_events.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace kvtier {
namespace {

using Payload = std::shared_ptr<const std::string>;

std::string BigEndian(int64_t v) {
  std::string s(8, '\0');
  const uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((u >> (56 - 8 * i)) & 0xff);
  return s;
}

// A message that shares the payload instead of copying it: every
// subscriber's queue and every replay hold one reference.
zmq::message_t Shared(const Payload& p) {
  auto* hold = new Payload(p);
  return zmq::message_t(const_cast<char*>((*hold)->data()), (*hold)->size(),
                        [](void*, void* hint) { delete static_cast<Payload*>(hint); }, hold);
}

// Something listens there (a publisher, kvtierd's own data socket, any
// service): of whatever socket type.
bool LiveUnixSocket(const std::string& path) {
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET, SOCK_DGRAM}) {
    const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    const int rc = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    const int err = errno;
    close(fd);
    if (rc == 0 || err == EPROTOTYPE || err == EAGAIN) return true;  // another type listens there
  }
  return false;
}

struct Bound {
  std::string path;  // ipc only: the socket file, removed at exit if it is still ours
  dev_t dev = 0;
  ino_t ino = 0;
};

// Binds `sock` to `endpoint`. An ipc socket is bound in a private directory
// next to its path, given to the tenant there (no one else can swap the
// file under the chown), then renamed into place: never a chown or chmod of
// a path another user could have replaced, never a file that is not a
// stale socket replaced.
std::string BindSafely(zmq::socket_t& sock, const std::string& endpoint, int64_t uid, int64_t gid, int listen_fd,
                       Bound* out) {
  if (!absl::StartsWith(endpoint, "ipc://")) {
    try {
      // tcp: the socket kvtierd listens on for this tenant (kv_events.cc).
      if (listen_fd >= 0) sock.set(zmq::sockopt::use_fd, listen_fd);
      sock.bind(endpoint);
    } catch (const zmq::error_t& e) {
      return absl::StrCat("cannot bind ", endpoint, ": ", e.what());
    }
    return "";
  }
  const std::string path = endpoint.substr(6);
  if (path.empty() || path[0] != '/') return absl::StrCat(endpoint, ": an ipc endpoint is an absolute path");
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return absl::StrCat(path, " exists and is not a socket; kvtierd does not replace it");
    if (LiveUnixSocket(path)) {
      return absl::StrCat(path, " is in use (another kvtierd on this run directory?)");
    }
  }
  const std::string dir = path.substr(0, path.rfind('/'));
  std::string tmpl = (dir.empty() ? std::string("") : dir) + "/.kvtier-events-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return absl::StrCat("cannot bind ", endpoint, ": mkdtemp in ", dir, ": ", strerror(errno));
  int dfd = open(tmpl.c_str(), O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  // The directory mkdtemp made: ours and private, whatever the parent lets
  // others rename (one of theirs here would not be ours).
  struct stat dst {};
  if (dfd >= 0 && (fstat(dfd, &dst) != 0 || dst.st_uid != geteuid() || (dst.st_mode & 0777) != 0700)) {
    close(dfd);
    dfd = -1;
    errno = EPERM;
  }
  auto cleanup = [&] {
    if (dfd >= 0) {
      unlinkat(dfd, "s", 0);
      close(dfd);
    }
    rmdir(tmpl.c_str());
  };
  if (dfd < 0) {
    cleanup();
    return absl::StrCat("cannot bind ", endpoint, ": ", strerror(errno));
  }
  const mode_t old_mask = umask(0177);
  try {
    // A relative name, inside the directory verified above (no path an
    // other user could swap; no length added to the endpoint's).
    if (fchdir(dfd) != 0) throw zmq::error_t();
    sock.bind("ipc://s");
  } catch (const zmq::error_t& e) {
    umask(old_mask);
    cleanup();
    return absl::StrCat("cannot bind ", endpoint, ": ", e.what());
  }
  umask(old_mask);
  mode_t mode = 0600;
  if (uid >= 0 || gid >= 0) {
    if (gid >= 0) mode = 0660;
    // Not root: the group alone, when kvtierd's user is in it.
    if (fchownat(dfd, "s", static_cast<uid_t>(uid), static_cast<gid_t>(gid), AT_SYMLINK_NOFOLLOW) != 0 &&
        (gid < 0 || fchownat(dfd, "s", static_cast<uid_t>(-1), static_cast<gid_t>(gid), AT_SYMLINK_NOFOLLOW) != 0)) {
      spdlog::warn("event=kv_events_chown_failed path={} errno={} hint=\"give the tenant a gid kvtierd's user belongs "
                   "to ([[tenants]] gids), or run kvtierd as root, so the tenant's router can open its event socket; "
                   "only kvtierd's user can now\"",
                   path, errno);
      mode = 0600;
    }
  }
  fchmodat(dfd, "s", mode, 0);
  struct stat bound {};
  fstatat(dfd, "s", &bound, AT_SYMLINK_NOFOLLOW);
  if (renameat(dfd, "s", AT_FDCWD, path.c_str()) != 0) {
    const int err = errno;
    cleanup();
    return absl::StrCat("cannot bind ", endpoint, ": rename into place: ", strerror(err));
  }
  close(dfd);
  rmdir(tmpl.c_str());
  out->path = path;
  out->dev = bound.st_dev;
  out->ino = bound.st_ino;
  return "";
}

void RemoveIfOurs(const Bound& b) {
  if (b.path.empty()) return;
  struct stat st {};
  if (lstat(b.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == b.dev && st.st_ino == b.ino) {
    unlink(b.path.c_str());
  }
}

}  // namespace

int RunEventsPublisher(int fd) {
  // It ends when its socket to kvtierd closes (kvtierd exited, however).
  prctl(PR_SET_NAME, "kvtier-events");
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);  // kvtierd blocks its signals; this process takes them
  (void)!nice(10);  // below kvtierd's own threads
  if (getppid() == 1) return 1;  // the daemon is gone already
  signal(SIGPIPE, SIG_IGN);
  std::string buf(1 << 20, '\0');
  const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
  if (n <= 1 || buf[0] != 'C') return 2;
  const nlohmann::json cfg = nlohmann::json::parse(std::string_view(buf.data() + 1, static_cast<size_t>(n - 1)),
                                                   nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) return 2;
  auto answer = [&](bool ok, const std::string& error) {
    const std::string msg = "R" + nlohmann::json{{"ok", ok}, {"error", error}}.dump();
    send(fd, msg.data(), msg.size(), MSG_NOSIGNAL);
  };
  // Limits first: a peer that exhausts them ends this process.
  const uint64_t conns = cfg.value("max_connections", uint64_t{256});
  rlimit nofile{conns + 32, conns + 32};
  setrlimit(RLIMIT_NOFILE, &nofile);
  const uint64_t memory = cfg.value("memory", uint64_t{1} << 30);
#ifdef KVTIER_SANITIZER
  (void)memory;  // sanitizers reserve terabytes of shadow address space
#else
  rlimit as{memory, memory};
  setrlimit(RLIMIT_AS, &as);
#endif
  const uint64_t buffer_batches = cfg.value("buffer_batches", uint64_t{10000});
  const uint64_t buffer_bytes = cfg.value("buffer_bytes", uint64_t{64} << 20);
  const double replays_per_s = static_cast<double>(cfg.value("replays_per_s", uint64_t{10}));
  const uint64_t replay_max = cfg.value("replay_max_batches", uint64_t{1000});
  const std::string topic = cfg.value("topic", std::string());
  const int64_t uid = cfg.value("uid", int64_t{-1}), gid = cfg.value("gid", int64_t{-1});

  zmq::context_t ctx{1};
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.set(zmq::sockopt::sndhwm, 1000);
  pub.set(zmq::sockopt::maxmsgsize, int64_t{256});  // subscriptions: short prefixes only
  std::unique_ptr<zmq::socket_t> replay;
  Bound pub_bound, replay_bound;
  std::string err =
      BindSafely(pub, cfg.value("endpoint", std::string()), uid, gid, cfg.value("endpoint_fd", -1), &pub_bound);
  const std::string replay_endpoint = cfg.value("replay_endpoint", std::string());
  if (err.empty() && !replay_endpoint.empty()) {
    replay = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
    replay->set(zmq::sockopt::linger, 0);
    replay->set(zmq::sockopt::maxmsgsize, int64_t{64});  // a request is three short frames
    replay->set(zmq::sockopt::rcvhwm, 1000);
    replay->set(zmq::sockopt::sndhwm, static_cast<int>(std::min<uint64_t>(replay_max + 16, 1 << 20)));
    err = BindSafely(*replay, replay_endpoint, uid, gid, cfg.value("replay_fd", -1), &replay_bound);
  }
  if (!err.empty()) {
    RemoveIfOurs(pub_bound);
    answer(false, err);
    return 3;
  }
  answer(true, "");

  std::deque<std::pair<int64_t, Payload>> kept;
  uint64_t kept_bytes = 0;
  uint64_t replays = 0, bad_replays = 0, throttled = 0, reported = 0;
  double tokens = replays_per_s * 2;
  auto last_refill = std::chrono::steady_clock::now();
  auto next_stats = last_refill;
  std::vector<zmq::pollitem_t> items{{nullptr, fd, ZMQ_POLLIN, 0}};
  if (replay) items.push_back({replay->handle(), 0, ZMQ_POLLIN, 0});
  // Work a peer can cause is bounded: at most this many replay requests
  // (well-formed or not) are read a second; the rest wait in ZeroMQ's
  // queue (its high-water mark drops beyond) while the replay socket is
  // not polled, so a flood costs this process little CPU, and kvtierd none.
  const uint64_t reads_per_s = static_cast<uint64_t>(replays_per_s) * 4 + 256;
  uint64_t reads_this_second = 0;
  auto second_started = std::chrono::steady_clock::now();
  for (;;) {
    const auto tick = std::chrono::steady_clock::now();
    if (tick - second_started >= std::chrono::seconds(1)) {
      second_started = tick;
      reads_this_second = 0;
    }
    const size_t polled = (replay && reads_this_second < reads_per_s) ? items.size() : 1;
    if (replay) items[1].revents = 0;
    try {
      zmq::poll(items.data(), polled, std::chrono::milliseconds(100));
    } catch (const zmq::error_t&) {
    }
    if (items[0].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) {
      bool parent_gone = false;
      for (int k = 0; k < 64; ++k) {
        const ssize_t m = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (m == 0 || (m < 0 && errno != EAGAIN && errno != EINTR)) {
          parent_gone = true;
          break;
        }
        if (m < 0) break;
        if (m < 9 || buf[0] != 'B') continue;
        int64_t seq = 0;
        for (int i = 1; i <= 8; ++i) seq = static_cast<int64_t>((static_cast<uint64_t>(seq) << 8) | uint8_t(buf[i]));
        auto payload = std::make_shared<const std::string>(buf.data() + 9, static_cast<size_t>(m - 9));
        try {
          pub.send(zmq::buffer(topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          pub.send(zmq::buffer(BigEndian(seq)), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          zmq::message_t body = Shared(payload);
          pub.send(body, zmq::send_flags::dontwait);
        } catch (const zmq::error_t&) {
        }
        if (replay) {
          kept_bytes += payload->size();
          kept.emplace_back(seq, std::move(payload));
          while (!kept.empty() && (kept.size() > buffer_batches || kept_bytes > buffer_bytes)) {
            kept_bytes -= kept.front().second->size();
            kept.pop_front();
          }
        }
      }
      if (parent_gone) break;
    }
    if (replay && (items[1].revents & ZMQ_POLLIN)) {
      const auto now = std::chrono::steady_clock::now();
      tokens = std::min(replays_per_s * 2,
                        tokens + replays_per_s * std::chrono::duration<double>(now - last_refill).count());
      last_refill = now;
      for (int served = 0; served < 64 && reads_this_second < reads_per_s; ++served) {
        ++reads_this_second;
        std::vector<zmq::message_t> frames;
        try {
          if (!zmq::recv_multipart(*replay, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
        } catch (const zmq::error_t&) {
          break;
        }
        if (frames.size() != 3 || frames[1].size() != 0 || frames[2].size() != 8) {
          ++bad_replays;
          continue;
        }
        if (tokens < 1) {
          ++throttled;  // answered by nothing: the peer asks again later
          continue;
        }
        tokens -= 1;
        ++replays;
        int64_t start = 0;
        const auto* p = static_cast<const uint8_t*>(frames[2].data());
        for (int i = 0; i < 8; ++i) start = static_cast<int64_t>((static_cast<uint64_t>(start) << 8) | p[i]);
        const std::string id(static_cast<const char*>(frames[0].data()), frames[0].size());
        try {
          uint64_t sent = 0;
          for (const auto& [seq, payload] : kept) {
            if (seq < start) continue;
            if (sent++ == replay_max) break;  // the rest: ask again from there
            replay->send(zmq::buffer(id), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
            replay->send(zmq::const_buffer(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
            replay->send(zmq::buffer(BigEndian(seq)), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
            zmq::message_t body = Shared(payload);
            replay->send(body, zmq::send_flags::dontwait);
          }
          replay->send(zmq::buffer(id), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          replay->send(zmq::const_buffer(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          replay->send(zmq::buffer(BigEndian(-1)), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          replay->send(zmq::const_buffer(), zmq::send_flags::dontwait);
        } catch (const zmq::error_t&) {
        }
      }
    }
    const auto now = std::chrono::steady_clock::now();
    const uint64_t activity = replays + bad_replays + throttled;
    if (now >= next_stats || (activity != reported && now + std::chrono::milliseconds(900) >= next_stats)) {
      next_stats = now + std::chrono::seconds(1);
      reported = activity;
      const std::string msg =
          "S" + nlohmann::json{{"replays", replays}, {"bad_replays", bad_replays}, {"throttled", throttled}}.dump();
      send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
  }
  // Last figures, then the socket files that are still ours go.
  const std::string msg =
      "S" + nlohmann::json{{"replays", replays}, {"bad_replays", bad_replays}, {"throttled", throttled}}.dump();
  send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  RemoveIfOurs(pub_bound);
  RemoveIfOurs(replay_bound);
  return 0;
}

}  // namespace kvtier
