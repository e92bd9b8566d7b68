// SPDX-License-Identifier: Apache-2.0
// absl::Status helpers used everywhere inside kvtier, and the bridge to the
// public kvtier::Status / error codes of the C ABI.
#ifndef KVTIER_CORE_STATUS_H_
#define KVTIER_CORE_STATUS_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/types.h"

#define KVTIER_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTIER_STATUS_CONCAT_(a, b) KVTIER_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function when `expr` (an absl::Status) is not ok.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status kvtier_status_ = (expr);            \
    if (!kvtier_status_.ok()) return kvtier_status_;   \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr or returns
// its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_STATUS_CONCAT_(kvtier_statusor_, __LINE__), lhs, expr)
#define KVTIER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

namespace kvtier {

// A status for a failed system call: "what: strerror(err)".
absl::Status ErrnoStatus(int err, absl::string_view what);

// A status carrying an exact kvtier error code (e.g. KVTIER_EPROTO), for codes
// that absl's canonical codes cannot tell apart.
absl::Status CodedStatus(int kvtier_code, absl::string_view message);

// Whether `status` was made by CodedStatus(kvtier_code, ...): not merely of
// the canonical code it maps to (every ResourceExhausted maps to ENOSPC).
bool CarriesCode(const absl::Status& status, int kvtier_code);

// The kvtier error code (<= 0) for an internal status.
int ToErrorCode(const absl::Status& status);

// Public status from internal status and back.
Status ToPublic(const absl::Status& status);
absl::Status FromCode(int kvtier_code, absl::string_view message);

}  // namespace kvtier

#endif  // KVTIER_CORE_STATUS_H_
