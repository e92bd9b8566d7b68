// SPDX-License-Identifier: Apache-2.0
// The admin protocol: one JSON request and one
// JSON response per line on the daemon's admin socket (SOCK_STREAM, owner and
// group only). Requests are {"cmd": "status", ...}; responses are
// {"ok": true, ...} or {"ok": false, "error": "..."}.
#ifndef KVTIER_IPC_ADMIN_CLIENT_H_
#define KVTIER_IPC_ADMIN_CLIENT_H_

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvtier::ipc {

inline constexpr size_t kMaxAdminLine = 16u << 20;

// Sends one request and returns the response object. A response with
// "ok": false becomes FailedPrecondition carrying its message; one that is
// not a JSON object with a boolean "ok", is longer than kMaxAdminLine or
// nested deeper than kMaxJsonDepth is DataLoss. `timeout` bounds the whole
// answer. The object's fields are still the peer's: read them without
// assuming their types.
absl::StatusOr<nlohmann::json> AdminCall(const std::string& socket_path,
                                         const nlohmann::json& request,
                                         std::chrono::milliseconds timeout = std::chrono::seconds(10));

// The part of AdminCall that reads the answer: one line (without its
// newline) as the peer sent it, decoded and checked as described above.
// Exposed for tests/fuzz/admin_response_fuzz.cc.
absl::StatusOr<nlohmann::json> DecodeAdminResponse(std::string_view line);

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_ADMIN_CLIENT_H_
