// SPDX-License-Identifier: Apache-2.0
// Out-of-line members of the public value types (include/kvtier/types.h).
#include "kvtier/types.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvtier {

std::string Status::ToString() const {
  if (ok()) return "OK";
  return absl::StrCat(kvtier_strerror(raw_code()), ": ", message_);
}

std::string_view TierName(TierKind tier) {
  switch (tier) {
    case TierKind::kGpu: return "gpu";
    case TierKind::kHost: return "host";
    case TierKind::kNvme: return "nvme";
    case TierKind::kRemote: return "remote";
    case TierKind::kFile: return "fs";
    case TierKind::kNone: break;
  }
  return "none";
}

std::string BlockKey::Hex() const {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

std::string_view HashAlgorithmName(HashAlgorithm algo) {
  return algo == HashAlgorithm::kXxh3_128 ? "xxh3-128" : "sha256";
}

}  // namespace kvtier

extern "C" const char* kvtier_strerror(int code) {
  switch (code) {
    case KVTIER_OK: return "ok";
    case KVTIER_EIO: return "I/O error";
    case KVTIER_ENOENT: return "not found";
    case KVTIER_ENOMEM: return "out of memory";
    case KVTIER_EACCES: return "permission denied";
    case KVTIER_EBUSY: return "busy";
    case KVTIER_EEXIST: return "already exists";
    case KVTIER_EINVAL: return "invalid argument";
    case KVTIER_ENOSPC: return "no space";
    case KVTIER_EPROTO: return "protocol error";
    case KVTIER_EPROTONOSUPPORT: return "ABI version mismatch";
    case KVTIER_ENOTCONN: return "not connected";
    case KVTIER_ETIMEDOUT: return "timed out";
    case KVTIER_ECANCELED: return "cancelled";
    default: return "unknown error";
  }
}
