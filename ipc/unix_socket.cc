// SPDX-License-Identifier: Apache-2.0
#include "ipc/unix_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace kvtier::ipc {
namespace {

absl::StatusOr<sockaddr_un> MakeAddr(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path \"", path, "\" must be 1..",
                                                   sizeof(addr.sun_path) - 1, " characters"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, mode_t mode) {
  ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddr(path));
  // Refuse to steal the socket of a live daemon; remove a stale file.
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; remove it or choose another run_dir"));
    }
    if (ConnectUnix(path, type).ok()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "another kvtierd is already listening on ", path, "; stop it or choose another run_dir"));
    }
    unlink(path.c_str());
  }
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)");
  // Create the socket file with the final mode from the start, no window
  // with wider permissions.
  const mode_t old = umask(static_cast<mode_t>(~mode & 0777));
  int rc = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  umask(old);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("bind ", path));
  if (chmod(path.c_str(), mode) != 0) return ErrnoStatus(errno, absl::StrCat("chmod ", path));
  if (listen(fd.get(), 128) != 0) return ErrnoStatus(errno, absl::StrCat("listen ", path));
  return fd;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path, int type) {
  ASSIGN_OR_RETURN(sockaddr_un addr, MakeAddr(path));
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(errno, "socket(AF_UNIX)");
  int rc;
  do {
    rc = connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == ENOENT || err == ECONNREFUSED) {
      return CodedStatus(KVTIER_ENOTCONN,
                         absl::StrCat("kvtierd is not running at ", path, " (", std::strerror(err),
                                      "); start kvtierd, or give the path of its socket"));
    }
    return ErrnoStatus(err, absl::StrCat("connect ", path));
  }
  return fd;
}

absl::Status SendMessage(int fd, std::span<const std::byte> data, std::span<const int> fds, bool nonblocking) {
  iovec iov{const_cast<std::byte*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = sendmsg(fd, &msg, MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    return absl::ResourceExhaustedError("the peer's socket buffer is full (it does not read its replies)");
  }
  if (n < 0) return ErrnoStatus(errno, "sendmsg");
  if (static_cast<size_t>(n) != data.size()) return absl::InternalError("short sendmsg");
  return absl::OkStatus();
}

absl::StatusOr<ReceivedMessage> ReceiveMessage(int fd, size_t max_bytes, size_t max_fds) {
  ReceivedMessage out;
  out.data.resize(max_bytes);
  iovec iov{out.data.data(), out.data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(max_fds, 1)));
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoStatus(errno, "recvmsg");
  // Take ownership of every descriptor that arrived, even unwanted ones, so
  // none leaks.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        out.fds.emplace_back(received);
      }
    }
  }
  out.truncated = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || out.fds.size() > max_fds;
  out.eof = (n == 0);
  out.data.resize(static_cast<size_t>(n));
  return out;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "getsockopt(SO_PEERCRED)");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

absl::StatusOr<std::vector<gid_t>> GetPeerGroups(int fd) {
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) return ErrnoStatus(errno, "getsockopt(SO_PEERGROUPS)");
    // len now says how much room the list needs; NGROUPS_MAX bounds it.
    const size_t need = len / sizeof(gid_t);
    if (need > 65536) return absl::ResourceExhaustedError("the peer has more than 65536 groups");
    groups.resize(need + 1);
  }
  return absl::InternalError("getsockopt(SO_PEERGROUPS) kept changing size");
}

absl::Status SetSocketTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    return ErrnoStatus(errno, "setsockopt(SO_RCVTIMEO/SO_SNDTIMEO)");
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace kvtier::ipc
