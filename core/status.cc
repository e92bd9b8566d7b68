// SPDX-License-Identifier: Apache-2.0
#include "core/status.h"

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

constexpr absl::string_view kCodePayload = "kvtier.code";

absl::StatusCode CanonicalFor(int code) {
  switch (code) {
    case KVTIER_OK: return absl::StatusCode::kOk;
    case KVTIER_EINVAL: return absl::StatusCode::kInvalidArgument;
    case KVTIER_ENOENT: return absl::StatusCode::kNotFound;
    case KVTIER_ENOSPC: return absl::StatusCode::kResourceExhausted;
    case KVTIER_ENOMEM: return absl::StatusCode::kResourceExhausted;
    case KVTIER_EBUSY: return absl::StatusCode::kResourceExhausted;
    case KVTIER_EACCES: return absl::StatusCode::kPermissionDenied;
    case KVTIER_EEXIST: return absl::StatusCode::kAlreadyExists;
    case KVTIER_ENOTCONN: return absl::StatusCode::kUnavailable;
    case KVTIER_ETIMEDOUT: return absl::StatusCode::kDeadlineExceeded;
    case KVTIER_ECANCELED: return absl::StatusCode::kCancelled;
    case KVTIER_EPROTO: return absl::StatusCode::kDataLoss;
    case KVTIER_EPROTONOSUPPORT: return absl::StatusCode::kFailedPrecondition;
    case KVTIER_EIO: return absl::StatusCode::kInternal;
    default: return absl::StatusCode::kUnknown;
  }
}

}  // namespace

absl::Status ErrnoStatus(int err, absl::string_view what) {
  return CodedStatus(-err, absl::StrCat(what, ": ", std::strerror(err)));
}

absl::Status CodedStatus(int kvtier_code, absl::string_view message) {
  if (kvtier_code == KVTIER_OK) return absl::OkStatus();
  absl::Status s(CanonicalFor(kvtier_code), message);
  if (s.code() == absl::StatusCode::kUnknown) s = absl::UnknownError(message);
  s.SetPayload(kCodePayload, absl::Cord(absl::StrCat(kvtier_code)));
  return s;
}

bool CarriesCode(const absl::Status& status, int kvtier_code) {
  const absl::optional<absl::Cord> p = status.GetPayload(kCodePayload);
  int code = 0;
  return p && absl::SimpleAtoi(std::string(*p), &code) && code == kvtier_code;
}

int ToErrorCode(const absl::Status& status) {
  if (status.ok()) return KVTIER_OK;
  if (absl::optional<absl::Cord> p = status.GetPayload(kCodePayload)) {
    int code = 0;
    if (absl::SimpleAtoi(std::string(*p), &code) && code < 0) return code;
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: return KVTIER_EINVAL;
    case absl::StatusCode::kNotFound: return KVTIER_ENOENT;
    case absl::StatusCode::kResourceExhausted: return KVTIER_ENOSPC;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated: return KVTIER_EACCES;
    case absl::StatusCode::kAlreadyExists: return KVTIER_EEXIST;
    case absl::StatusCode::kUnavailable: return KVTIER_ENOTCONN;
    case absl::StatusCode::kDeadlineExceeded: return KVTIER_ETIMEDOUT;
    case absl::StatusCode::kCancelled: return KVTIER_ECANCELED;
    case absl::StatusCode::kDataLoss: return KVTIER_EPROTO;
    case absl::StatusCode::kFailedPrecondition: return KVTIER_EPROTONOSUPPORT;
    default: return KVTIER_EIO;
  }
}

Status ToPublic(const absl::Status& status) {
  if (status.ok()) return Status();
  return Status(static_cast<ErrorCode>(ToErrorCode(status)), std::string(status.message()));
}

absl::Status FromCode(int kvtier_code, absl::string_view message) {
  return CodedStatus(kvtier_code, message);
}

}  // namespace kvtier
