// SPDX-License-Identifier: Apache-2.0
// Namespaces: the hash of everything outside the tokens that changes K/V, plus
// the tenant's trust scope and salt.
#ifndef KVTIER_CORE_NAMESPACE_H_
#define KVTIER_CORE_NAMESPACE_H_

#include <string_view>

#include "absl/status/status.h"
#include "kvtier/types.h"

namespace kvtier {

using NamespaceId = BlockKey;  // 32 bytes of SHA-256

inline constexpr size_t kMaxDescriptorString = 256;
inline constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 30;  // 1 GiB
inline constexpr uint32_t kMaxBlockTokens = 1u << 20;

// Checks that a descriptor can identify blocks: model id, dtype, layout and
// sizes present, strings bounded, tp_rank < tp_size.
absl::Status ValidateDescriptor(const NamespaceDescriptor& d);

// SHA-256 over a length-prefixed, fixed-order encoding of every field, the
// tenant name (trust scope) and the tenant salt. A compatibility contract:
// pinned by a fixed vector in tests/core/namespace_test.cc.
NamespaceId ComputeNamespaceId(const NamespaceDescriptor& d, absl::string_view tenant,
                               absl::string_view tenant_salt);

// The first 12 hex digits: an opaque id safe for logs.
std::string ShortId(const BlockKey& id);

}  // namespace kvtier

#endif  // KVTIER_CORE_NAMESPACE_H_
