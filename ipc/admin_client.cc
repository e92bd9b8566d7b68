// SPDX-License-Identifier: Apache-2.0
#include "ipc/admin_client.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/bounded_json.h"
#include "core/status.h"
#include "ipc/unix_socket.h"

namespace kvtier::ipc {

absl::StatusOr<nlohmann::json> AdminCall(const std::string& socket_path,
                                         const nlohmann::json& request,
                                         std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(UniqueFd fd, ConnectUnix(socket_path, SOCK_STREAM));
  RETURN_IF_ERROR(SetSocketTimeouts(fd.get(), timeout));
  // A daemon that refuses this peer answers at once and closes, possibly
  // before the request is written: read its answer even when the write failed.
  const absl::Status wrote = WriteAll(fd.get(), request.dump() + "\n");
  // The answer is untrusted (whatever listens on the socket may be fake or
  // broken): bounded in length, in time and in nesting, and every way it
  // can be wrong is a status, never an exception.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  size_t newline = std::string::npos;
  char buf[65536];
  while (newline == std::string::npos) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError(
            absl::StrCat("kvtierd did not answer on ", socket_path, " within ", timeout.count(), " ms"));
      }
      return wrote.ok() ? ErrnoStatus(errno, "reading the admin response") : wrote;
    }
    if (n == 0) {
      if (!wrote.ok()) return wrote;
      return absl::UnavailableError(
          absl::StrCat("kvtierd closed the admin connection on ", socket_path, " without answering"));
    }
    // Only the new bytes can hold the newline: searching the whole line
    // each time was quadratic, seconds of CPU for a 16 MiB answer.
    const size_t before = line.size();
    line.append(buf, static_cast<size_t>(n));
    newline = line.find('\n', before);
    if ((newline == std::string::npos ? line.size() : newline) > kMaxAdminLine) {
      return absl::DataLossError(absl::StrCat("kvtierd's admin response is longer than ", kMaxAdminLine >> 20, " MiB"));
    }
    // The socket timeout bounds each read; a peer that trickles a byte at a
    // time must not hold the caller for ever.
    if (newline == std::string::npos && std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("kvtierd did not finish its answer on ", socket_path, " within ", timeout.count(), " ms"));
    }
  }
  line.resize(newline);
  return DecodeAdminResponse(line);
}

absl::StatusOr<nlohmann::json> DecodeAdminResponse(std::string_view line) {
  if (line.size() > kMaxAdminLine) {
    return absl::DataLossError(absl::StrCat("kvtierd's admin response is longer than ", kMaxAdminLine >> 20, " MiB"));
  }
  absl::StatusOr<nlohmann::json> response = ParseBoundedJson(line);
  if (!response.ok()) {
    return absl::DataLossError(absl::StrCat("kvtierd sent an admin response that is ", response.status().message()));
  }
  if (!response->is_object()) return absl::DataLossError("kvtierd sent an admin response that is not a JSON object");
  // value("ok", false) throws when "ok" is there with another type.
  const auto ok = response->find("ok");
  if (ok == response->end() || !ok->is_boolean()) {
    return absl::DataLossError("kvtierd sent an admin response without a boolean \"ok\"");
  }
  if (!ok->get<bool>()) {
    const auto error = response->find("error");
    return absl::FailedPreconditionError(error != response->end() && error->is_string() ? error->get<std::string>()
                                                                                        : std::string("unknown error"));
  }
  return std::move(*response);
}

}  // namespace kvtier::ipc
