// SPDX-License-Identifier: Apache-2.0
// Value types of the kvtier C++ client API: keys, namespace descriptors,
// status and result. Part of the public surface (include/kvtier/).
#ifndef KVTIER_TYPES_H_
#define KVTIER_TYPES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "kvtier/kvtier.h"

namespace kvtier {

// Error codes are the C ABI's negative errno values.
enum class ErrorCode : int {
  kOk = KVTIER_OK,
  kIo = KVTIER_EIO,
  kNotFound = KVTIER_ENOENT,
  kNoMemory = KVTIER_ENOMEM,
  kPermissionDenied = KVTIER_EACCES,
  kBusy = KVTIER_EBUSY,
  kAlreadyExists = KVTIER_EEXIST,
  kInvalidArgument = KVTIER_EINVAL,
  kNoSpace = KVTIER_ENOSPC,
  kProtocol = KVTIER_EPROTO,
  kVersionMismatch = KVTIER_EPROTONOSUPPORT,
  kNotConnected = KVTIER_ENOTCONN,
  kTimedOut = KVTIER_ETIMEDOUT,
  kCancelled = KVTIER_ECANCELED,
};

// The outcome of a client call: a code and, on failure, a message that says
// what failed and what to do.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  int raw_code() const { return static_cast<int>(code_); }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// A value or the Status that says why there is none.
//
//   kvtier::Result<LookupResult> r = client->Lookup(keys, {.lease = true});
//   if (!r.ok()) { log(r.status().ToString()); return; }
//   use(r->hit_blocks);
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}           // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}    // NOLINT: implicit by design
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

enum class TierKind : uint8_t {
  kNone = KVTIER_TIER_NONE,
  kGpu = KVTIER_TIER_GPU,
  kHost = KVTIER_TIER_HOST,
  kNvme = KVTIER_TIER_NVME,
  kRemote = KVTIER_TIER_REMOTE,
  kFile = KVTIER_TIER_FILE,
};
std::string_view TierName(TierKind tier);
// LookupResult::lanes for a block in no lower tier (host memory, the GPU
// tier, a miss).
inline constexpr uint8_t kNoLane = KVTIER_NO_LANE;

// A block key: the full 256-bit chained hash standing for a whole prefix.
struct BlockKey {
  std::array<uint8_t, 32> bytes{};
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  std::string Hex() const;
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    return H::combine_contiguous(std::move(h), k.bytes.data(), k.bytes.size());
  }
};
static_assert(sizeof(BlockKey) == 32);

// Everything outside the tokens that changes K/V.
// The daemon adds the tenant's trust scope and salt, so equal descriptors of
// different tenants never share blocks.
struct NamespaceDescriptor {
  std::string model_id;
  std::string model_revision;
  std::string tokenizer_revision;
  std::string adapter_id;             // empty: no adapter
  std::string attention_config_hash;  // hash of RoPE/attention settings
  std::string kv_dtype;               // e.g. "fp16", "bf16", "fp8_e4m3"
  std::string kv_layout;              // e.g. "layer_major"
  std::string cache_salt;             // per-deployment salt; never logged
  uint32_t block_tokens = 0;
  uint64_t block_bytes = 0;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
};

enum class HashAlgorithm : uint8_t {
  kSha256 = 1,     // default: full 256 bits, safe across tenants
  kXxh3_128 = 2,   // fast, single trusted tenant only
};
std::string_view HashAlgorithmName(HashAlgorithm algo);

}  // namespace kvtier

#endif  // KVTIER_TYPES_H_
