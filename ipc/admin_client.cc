#include "ipc/admin_client.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
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
  std::string line;
  char buf[65536];
  while (line.find('\n') == std::string::npos) {
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
    line.append(buf, static_cast<size_t>(n));
    if (line.size() > kMaxAdminLine) return absl::DataLossError("admin response too long");
  }
  line.resize(line.find('\n'));
  nlohmann::json response = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (response.is_discarded() || !response.is_object()) {
    return absl::DataLossError("kvtierd sent an admin response that is not a JSON object");
  }
  if (!response.value("ok", false)) {
    return absl::FailedPreconditionError(response.value("error", std::string("unknown error")));
  }
  return response;
}

}  // namespace kvtier::ipc
