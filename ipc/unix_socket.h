// SPDX-License-Identifier: Apache-2.0
// Unix-domain sockets: listening, connecting, passing descriptors
// (SCM_RIGHTS) and reading the peer's credentials (SO_PEERCRED).
#ifndef KVTIER_IPC_UNIX_SOCKET_H_
#define KVTIER_IPC_UNIX_SOCKET_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/unique_fd.h"

namespace kvtier::ipc {

// Binds and listens on `path` with file mode `mode`. A stale socket file (no
// one listening) is replaced; a live one is an error naming the path.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, int type, mode_t mode);

// Connects to `path`; errors say whether the daemon is not running.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path, int type);

// Sends one message with optional descriptors. The daemon's control loop
// sends with `nonblocking` (MSG_DONTWAIT): a peer whose socket buffer is
// full gets ResourceExhausted instead of stalling the loop.
absl::Status SendMessage(int fd, std::span<const std::byte> data, std::span<const int> fds = {},
                         bool nonblocking = false);

struct ReceivedMessage {
  std::vector<std::byte> data;  // empty with eof=true when the peer hung up
  std::vector<UniqueFd> fds;
  bool eof = false;
  bool truncated = false;  // the message (or its descriptors) did not fit
};
// Receives one message of at most max_bytes and up to max_fds descriptors.
absl::StatusOr<ReceivedMessage> ReceiveMessage(int fd, size_t max_bytes, size_t max_fds);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd);
// The peer's supplementary groups when it connected (SO_PEERGROUPS).
absl::StatusOr<std::vector<gid_t>> GetPeerGroups(int fd);

// Sets SO_RCVTIMEO and SO_SNDTIMEO.
absl::Status SetSocketTimeouts(int fd, std::chrono::milliseconds timeout);

// Writes all of data to a stream socket or pipe (retrying on EINTR and short
// writes).
absl::Status WriteAll(int fd, absl::string_view data);

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_UNIX_SOCKET_H_
