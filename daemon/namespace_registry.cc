#include "daemon/namespace_registry.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace kvtier {

absl::StatusOr<NamespaceInfo> NamespaceRegistry::Register(const NamespaceId& id, uint16_t tenant,
                                                          const NamespaceDescriptor& d, uint32_t max_per_tenant) {
  MutexLock l(&mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    NamespaceInfo& known = infos_[it->second];
    if (known.model_id.empty()) {  // first attach after recovery
      known.model_id = d.model_id;
      known.tp_size = std::max<uint32_t>(1, d.tp_size);
    }
    return known;
  }
  if (infos_.size() >= UINT32_MAX) return absl::ResourceExhaustedError("too many namespaces");
  if (per_tenant_[tenant] >= max_per_tenant) {
    return CodedStatus(KVTIER_EBUSY, absl::StrCat("this tenant already has ", per_tenant_[tenant],
                                                  " namespaces (limits.namespaces_per_tenant); reuse a model "
                                                  "revision's descriptor, or ask the administrator to raise the limit"));
  }
  ++per_tenant_[tenant];
  NamespaceInfo info{static_cast<uint32_t>(infos_.size()), id, tenant, d.block_tokens,
                     d.block_bytes, d.model_id, std::max<uint32_t>(1, d.tp_size)};
  by_id_.emplace(id, info.handle);
  infos_.push_back(info);
  return info;
}

NamespaceInfo NamespaceRegistry::RegisterRecovered(const NamespaceId& id, uint16_t tenant, uint64_t block_bytes,
                                                  uint32_t block_tokens) {
  MutexLock l(&mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) return infos_[it->second];
  // Not counted against limits.namespaces_per_tenant: what is on NVMe from
  // before must never keep a tenant from attaching.
  NamespaceInfo info{static_cast<uint32_t>(infos_.size()), id, tenant, block_tokens, block_bytes, ""};
  by_id_.emplace(id, info.handle);
  infos_.push_back(info);
  return info;
}

std::vector<NamespaceInfo> NamespaceRegistry::List() const {
  MutexLock l(&mu_);
  return infos_;
}

}  // namespace kvtier
