// Namespaces the daemon has seen: id -> small handle, tenant and block size.
// Namespaces outlive their sessions: blocks stay for the next engine.
#ifndef KVTIER_DAEMON_NAMESPACE_REGISTRY_H_
#define KVTIER_DAEMON_NAMESPACE_REGISTRY_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
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
  // A new namespace beyond `max_per_tenant` of its tenant's (recovered ones
  // not counted) is refused
  // (KVTIER_EBUSY, limits.namespaces_per_tenant): namespaces are never
  // freed while the daemon runs, so fresh ones per attach must not grow
  // it without bound.
  absl::StatusOr<NamespaceInfo> Register(const NamespaceId& id, uint16_t tenant,
                                         const NamespaceDescriptor& d, uint32_t max_per_tenant = UINT32_MAX);
  // Thread-safe. A namespace known only from blocks recovered from NVMe (its
  // descriptor arrives when an engine attaches with it).
  NamespaceInfo RegisterRecovered(const NamespaceId& id, uint16_t tenant, uint64_t block_bytes,
                                  uint32_t block_tokens);
  // Thread-safe.
  std::vector<NamespaceInfo> List() const;

 private:
  mutable Mutex mu_;
  absl::flat_hash_map<NamespaceId, uint32_t> by_id_ ABSL_GUARDED_BY(mu_);
  std::vector<NamespaceInfo> infos_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint16_t, uint32_t> per_tenant_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_NAMESPACE_REGISTRY_H_
