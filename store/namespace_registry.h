// SPDX-License-Identifier: Apache-2.0
// Namespaces the daemon has seen: id -> small handle, tenant and block size.
// Namespaces outlive their sessions: blocks stay for the next engine. A
// namespace with no session attached and no block left in any tier is
// freed (its handle is reused), so attach churn with fresh namespaces
// cannot grow the daemon.
#ifndef KVTIER_STORE_NAMESPACE_REGISTRY_H_
#define KVTIER_STORE_NAMESPACE_REGISTRY_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "core/namespace.h"

namespace kvtier {

struct NamespaceInfo {
  uint32_t handle = 0;
  NamespaceId id;
  uint16_t tenant = 0;
  uint32_t block_tokens = 0;
  uint64_t block_bytes = 0;
  std::string model_id;  // for kvtierctl; descriptors hold no secrets but the salt
  uint32_t tp_size = 1;  // the engine's tensor-parallel ranks: a block holds 1/tp_size of the heads
};

class NamespaceRegistry {
 public:
  // Thread-safe. Returns the existing entry for an id, or registers it.
  // A new namespace beyond `max_per_tenant` of its tenant's live ones
  // (recovered ones not counted) is refused (KVTIER_EBUSY,
  // limits.namespaces_per_tenant); FreeUnused first gives back the ones
  // nothing uses.
  absl::StatusOr<NamespaceInfo> Register(const NamespaceId& id, uint16_t tenant,
                                         const NamespaceDescriptor& d, uint32_t max_per_tenant = UINT32_MAX);
  // Thread-safe. A namespace known only from blocks recovered from NVMe (its
  // descriptor arrives when an engine attaches with it).
  NamespaceInfo RegisterRecovered(const NamespaceId& id, uint16_t tenant, uint64_t block_bytes,
                                  uint32_t block_tokens);
  // Thread-safe. A session of the namespace started or ended: a namespace
  // with a session is never freed.
  void SessionStarted(uint32_t handle);
  void SessionEnded(uint32_t handle);
  // Thread-safe. Frees every live namespace (of `tenant` only, when given)
  // with no session for which `release` returns true (the caller's check
  // that no block of it is left, and its chance to drop what it keyed by
  // the handle); returns the freed ones. `release` runs under the
  // registry's lock: it must not call back into the registry. Callers must
  // not start a session of a namespace while this runs (the daemon's
  // control loop does both).
  std::vector<NamespaceInfo> FreeUnused(absl::FunctionRef<bool(const NamespaceInfo&)> release,
                                        std::optional<uint16_t> tenant = std::nullopt);
  // Thread-safe. The live namespaces.
  std::vector<NamespaceInfo> List() const;
  size_t live() const;

 private:
  struct Entry {
    NamespaceInfo info;
    uint32_t sessions = 0;
    bool live = false;
    bool counted = false;  // against its tenant's limit (not recovered)
  };
  uint32_t NewHandleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  absl::flat_hash_map<NamespaceId, uint32_t> by_id_ ABSL_GUARDED_BY(mu_);
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);  // by handle
  std::vector<uint32_t> free_handles_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint16_t, uint32_t> per_tenant_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_STORE_NAMESPACE_REGISTRY_H_
