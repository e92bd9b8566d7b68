// SPDX-License-Identifier: Apache-2.0
// The daemon's sessions: connections on the data socket, the hello that
// attaches one (admission: peer -> tenant -> namespace -> session, in
// daemon/admission.h), a session's socket events, its end, and the reaping
// of what it left (sessions, then unused namespaces).
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checked.h"
#include "core/namespace.h"
#include "core/status.h"
#include "core/units.h"
#include "daemon/admission.h"
#include "daemon/daemon.h"
#include "ipc/attach.h"
#include "ipc/kv_registration.h"
#include "ipc/unix_socket.h"
#include "core/fmt_absl.h"
#include "spdlog/spdlog.h"

namespace kvtier {
namespace {

constexpr uint64_t kAttachTimeoutNs = 5'000'000'000;  // a connection must say hello within 5 s
constexpr uint64_t kAdminIdleNs = 60'000'000'000;     // an admin connection idle this long is closed

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// True when a read on fd would not block (a message, EOF or an error).
bool ReadyToRead(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

}  // namespace

void Daemon::OnDataListen() {
  // One connection per wake-up: the listening socket is blocking, and epoll
  // reports it again while more are queued.
  // Non-blocking: the loop never waits on a peer's socket.
  const int fd = accept4(data_listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  UniqueFd conn(fd);
  // Anyone on the machine may connect, and says who they are only by their
  // credentials: until they attach, connections are bounded per uid and in
  // all, and each has kAttachTimeoutNs to say hello.
  absl::StatusOr<ipc::PeerCredentials> peer = ipc::GetPeerCredentials(fd);
  if (!peer.ok()) return;
  if (pending_.size() >= config_.limit_pending_connections ||
      pending_per_uid_[peer->uid] >= config_.limit_pending_connections_per_uid) {
    stats_.Refused(Refusal::kPendingConnections);
    if (pending_per_uid_[peer->uid] == 0) pending_per_uid_.erase(peer->uid);
    // One non-blocking answer, so an engine that starts many ranks at once
    // learns why; nothing is logged for a flood.
    ipc::AttachReply reply;
    reply.status = KVTIER_EBUSY;
    reply.message = "too many connections waiting to attach (limits.pending_connections[_per_uid]); retry";
    (void)ipc::SendMessage(fd, ipc::EncodeAttachReply(reply), {}, /*nonblocking=*/true);
    return;
  }
  ++pending_per_uid_[peer->uid];
  pending_[fd] = PendingAttach{std::move(conn), MonotonicNanos() + kAttachTimeoutNs, peer->uid};
  Watch(fd, FdKind::kPendingAttach, 0, EPOLLIN | EPOLLRDHUP);
}

void Daemon::DropPending(absl::flat_hash_map<int, PendingAttach>::iterator it) {
  auto u = pending_per_uid_.find(it->second.uid);
  if (u != pending_per_uid_.end() && --u->second == 0) pending_per_uid_.erase(u);
  Unwatch(it->first);
  pending_.erase(it);
}

void Daemon::ExpirePendingAttaches() {
  const uint64_t now = MonotonicNanos();
  std::vector<int> expired;
  for (const auto& [fd, p] : pending_) {
    if (p.deadline_ns < now) expired.push_back(fd);
  }
  for (int fd : expired) DropPending(pending_.find(fd));
  // Admin connections too: one that neither asks nor reads for a minute goes.
  std::vector<int> idle;
  for (const auto& [fd, c] : admin_conns_) {
    if (now - c.active_ns > kAdminIdleNs) idle.push_back(fd);
  }
  for (int fd : idle) {
    Unwatch(fd);
    admin_conns_.erase(fd);
  }
}

void Daemon::OnPendingAttach(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  // An event may be stale (reported for a closed fd whose number a new
  // connection took in the same batch): nothing to read yet is no hello.
  if (!ReadyToRead(fd)) return;
  UniqueFd conn = std::move(it->second.fd);
  DropPending(it);
  absl::StatusOr<ipc::ReceivedMessage> msg = ipc::ReceiveMessage(conn.get(), ipc::kMaxAttachMessage, 0);
  if (!msg.ok() || msg->eof) return;  // gone before saying hello
  if (msg->truncated || !msg->fds.empty()) {
    absl::StatusOr<ipc::PeerCredentials> peer = ipc::GetPeerCredentials(conn.get());
    RefuseAttach(conn.get(), KVTIER_EPROTO, "attach request too long, or carrying descriptors",
                 peer.ok() ? *peer : ipc::PeerCredentials{});
    return;
  }
  Attach(std::move(conn), msg->data);
}

void Daemon::RefuseAttach(int fd, int code, const std::string& message, const ipc::PeerCredentials& peer) {
  stats_.attach_refused.Add();
  if (log_limiter_->Allow(absl::StrCat("uid:", peer.uid))) {
    spdlog::warn("event=attach_refused pid={} uid={} gid={} code={} reason=\"{}\"", peer.pid, peer.uid,
                 peer.gid, kvtier_strerror(code), LogQuoted(message));
  }
  ipc::AttachReply reply;
  reply.status = code;
  reply.message = message;
  (void)ipc::SendMessage(fd, ipc::EncodeAttachReply(reply), {}, /*nonblocking=*/true);
}

void Daemon::Attach(UniqueFd fd, std::span<const std::byte> request) {
  absl::StatusOr<ipc::PeerCredentials> peer = ipc::GetPeerCredentials(fd.get());
  if (!peer.ok()) return;
  absl::StatusOr<ipc::AttachRequest> req = CheckAttachRequest(request, stats_);
  absl::StatusOr<Admitted> admitted = req.ok() ? Admit(*peer, *req) : req.status();
  if (!admitted.ok()) {
    RefuseAttach(fd.get(), ToErrorCode(admitted.status()), std::string(admitted.status().message()), *peer);
    return;
  }
  OpenSession(std::move(fd), *peer, *req, *admitted);
}

absl::StatusOr<Daemon::Admitted> Daemon::Admit(const ipc::PeerCredentials& peer, const ipc::AttachRequest& req) {
  ASSIGN_OR_RETURN(const TenantConfig* tenant, TenantOfPeer(config_, peer));
  if (sessions_.size() >= config_.max_sessions) {
    return CodedStatus(KVTIER_EBUSY, absl::StrCat("kvtierd already serves ", sessions_.size(),
                                                  " sessions (ipc.max_sessions); detach idle clients or raise the "
                                                  "limit"));
  }
  if (const uint32_t mine = SessionsOf(tenant->name); mine >= config_.SessionsPerTenant()) {
    stats_.Refused(Refusal::kTenantSessions);
    return CodedStatus(KVTIER_EBUSY, absl::StrCat("tenant \"", tenant->name, "\" already holds ", mine,
                                                  " sessions (limits.sessions_per_tenant); detach idle clients or "
                                                  "ask the administrator to raise the limit"));
  }
  const uint16_t tenant_idx = tenant_index_.at(tenant->name);
  const NamespaceId ns_id = ComputeNamespaceId(req.ns, tenant->name, tenant->salt);
  absl::StatusOr<NamespaceInfo> ns =
      namespaces_.Register(ns_id, tenant_idx, req.ns, config_.limit_namespaces_per_tenant);
  if (!ns.ok() && ToErrorCode(ns.status()) == KVTIER_EBUSY) {
    // At the limit: give back the tenant's namespaces nothing uses, then try again.
    FreeUnusedNamespaces(tenant_idx);
    ns = namespaces_.Register(ns_id, tenant_idx, req.ns, config_.limit_namespaces_per_tenant);
  }
  if (!ns.ok()) {
    if (ToErrorCode(ns.status()) == KVTIER_EBUSY) stats_.Refused(Refusal::kTenantNamespaces);
    return CodedStatus(ToErrorCode(ns.status()), ns.status().message());
  }
  store_->RegisterNamespace(*ns);
  return Admitted{tenant, tenant_idx, ns_id, *ns};
}

void Daemon::OpenSession(UniqueFd fd, const ipc::PeerCredentials& peer, const ipc::AttachRequest& req,
                         const Admitted& admitted) {
  const std::string& tenant = admitted.tenant->name;
  const NamespaceInfo& ns = admitted.ns;
  const uint64_t id = next_session_id_++;
  absl::StatusOr<ipc::SessionSegment> seg = ipc::SessionSegment::Create(
      id, ipc::SegmentOptions{config_.ring_entries, config_.ring_entries, config_.scratch_bytes,
                              config_.max_keys_per_op});
  if (!seg.ok()) {
    RefuseAttach(fd.get(), KVTIER_ENOMEM, std::string(seg.status().message()), peer);
    return;
  }
  HostTier* host = store_->host_tier(admitted.tenant_idx);
  ipc::AttachReply reply;
  reply.session_id = id;
  reply.namespace_id = admitted.ns_id;
  reply.hash = config_.hash;
  reply.block_tokens = ns.block_tokens;
  reply.block_bytes = ns.block_bytes;
  reply.arena_bytes = host->arena_bytes();
  reply.tenant = tenant;
  const int fds[2] = {seg->fd(), host->arena_fd()};
  if (absl::Status s = ipc::SendMessage(fd.get(), ipc::EncodeAttachReply(reply), fds, /*nonblocking=*/true);
      !s.ok()) {
    if (log_limiter_->Allow(tenant)) {
      spdlog::warn("event=attach_failed pid={} reason=\"{}\"", peer.pid, LogQuoted(s.message()));
    }
    return;
  }
  UniqueFd pidfd(peer.pid > 0 ? PidfdOpen(peer.pid) : -1);
  const int sock = fd.get();
  SessionIdentity identity{id, peer, req.client_name, static_cast<uint64_t>(time(nullptr))};
  auto session = std::make_unique<Session>(
      identity, ns, tenant, std::move(*seg), std::move(fd), store_.get(), &stats_,
      SessionOptions{config_.spin_us, log_limiter_.get()}, [this] {
        const uint64_t one = 1;
        (void)!write(wake_fd_.get(), &one, sizeof(one));
      },
      device_.get(), arena_registered_.contains(tenant) ? host->arena_base() : nullptr,
      gpu_.contains(tenant) ? gpu_.at(tenant) : nullptr, kv_budgets_.at(tenant).get());
  Watch(sock, FdKind::kSessionSocket, id, EPOLLIN | EPOLLRDHUP);
  if (pidfd.valid()) Watch(pidfd.get(), FdKind::kSessionPid, id, EPOLLIN);
  session->Start();
  stats_.sessions_attached.Add();
  if (log_limiter_->Allow(tenant)) {
    // Peers' strings are quoted and escaped: a value cannot end early and
    // add keys of its own.
    spdlog::info("event=attach session={} pid={} uid={} tenant={} namespace={} model=\"{}\" block_bytes={} "
                 "client=\"{}\"",
                 id, peer.pid, peer.uid, tenant, ShortId(admitted.ns_id), LogQuoted(ns.model_id), ns.block_bytes,
                 LogQuoted(req.client_name));
  }
  namespaces_.SessionStarted(ns.handle);
  sessions_.emplace(id, LiveSession{std::move(session), std::move(pidfd)});
}

uint32_t Daemon::SessionsOf(const std::string& tenant) const {
  uint32_t n = 0;
  for (const auto& [id, ls] : sessions_) n += ls.session->tenant() == tenant ? 1 : 0;
  return n;
}

void Daemon::OnSessionSocket(int fd, uint64_t session_id, uint32_t events) {
  // After attach a client sends only KV-cache registrations (with their
  // memfds); EOF or an error is a hang-up.
  if (events & EPOLLIN) {
    if (!ReadyToRead(fd)) return;  // a stale event: see OnPendingAttach
    absl::StatusOr<ipc::ReceivedMessage> m = ipc::ReceiveMessage(fd, ipc::kMaxKvMessage, ipc::kMaxKvRegions);
    if (!m.ok() || m->eof) {
      OnSessionGone(session_id, "socket hang-up");
      return;
    }
    auto it = sessions_.find(session_id);
    if (it != sessions_.end() && !m->data.empty()) {
      ipc::KvRegisterReply reply;
      std::vector<UniqueFd> reply_fds;
      if (m->truncated) {
        reply.status = KVTIER_EPROTO;
        reply.message = absl::StrCat("KV-cache registration larger than ", ipc::kMaxKvMessage, " bytes or ",
                                     ipc::kMaxKvRegions, " descriptors");
        stats_.kv_registrations_refused.Add();
      } else {
        reply = it->second.session->OnKvMessage(m->data, std::move(m->fds), &reply_fds);
      }
      std::vector<int> raw;
      for (const UniqueFd& f : reply_fds) raw.push_back(f.get());
      // Never blocks the loop: a client that leaves its replies unread
      // until its socket buffer is full loses its session.
      if (absl::Status s = ipc::SendMessage(fd, ipc::EncodeKvReply(reply), raw, /*nonblocking=*/true); !s.ok()) {
        if (absl::IsResourceExhausted(s)) stats_.Refused(Refusal::kSlowPeer);
        spdlog::warn("event=kv_reply_failed session={} reason=\"{}\" action=close_session", session_id,
                     LogQuoted(s.message()));
        OnSessionGone(session_id, "does not read its replies");
      }
    }
    return;
  }
  if (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)) OnSessionGone(session_id, "socket hang-up");
}

void Daemon::OnSessionGone(uint64_t session_id, absl::string_view why) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  LiveSession& ls = it->second;
  Unwatch(ls.session->socket_fd());
  if (ls.pidfd.valid()) Unwatch(ls.pidfd.get());
  if (!ls.session->finished()) {
    if (ls.session->client_detached()) {
      stats_.sessions_detached.Add();
      if (log_limiter_->Allow(ls.session->tenant())) {
        spdlog::info("event=detach session={} pid={}", session_id, ls.session->identity().peer.pid);
      }
    } else {
      stats_.sessions_closed_dead.Add();
      if (log_limiter_->Allow(ls.session->tenant())) spdlog::info("event=client_gone session={} pid={} detail=\"{}\" action=release_pins", session_id,
                   ls.session->identity().peer.pid, LogQuoted(why));
    }
  }
  ls.session->Stop(ipc::CloseReason::kShutdown);
}

void Daemon::ReapSessions() {
  bool ended = false;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.session->finished()) {
      Unwatch(it->second.session->socket_fd());
      if (it->second.pidfd.valid()) Unwatch(it->second.pidfd.get());
      it->second.session->Join();
      namespaces_.SessionEnded(it->second.session->ns_handle());
      it = sessions_.erase(it);
      ended = true;
    } else {
      ++it;
    }
  }
  // A namespace whose last session ended and whose blocks are gone goes
  // now; one whose blocks are evicted later goes on the periodic sweep or
  // when its tenant reaches limits.namespaces_per_tenant.
  const uint64_t now = MonotonicNanos();
  if (ended || now - last_namespace_sweep_ns_ > 10'000'000'000ull) {
    last_namespace_sweep_ns_ = now;
    FreeUnusedNamespaces();
  }
}

void Daemon::FreeUnusedNamespaces(std::optional<uint16_t> tenant) {
  const std::vector<NamespaceInfo> freed =
      namespaces_.FreeUnused([&](const NamespaceInfo& n) { return store_->ForgetNamespace(n.handle); }, tenant);
  for (const NamespaceInfo& n : freed) {
    // GPU copies are keyed by handle: the next namespace to get it must not see them.
    auto g = gpu_.find(store_->tenant_name(n.tenant));
    if (g != gpu_.end()) g->second->DropNamespace(n.handle);
  }
  if (!freed.empty()) stats_.namespaces_freed.Add(freed.size());
}

}  // namespace kvtier
