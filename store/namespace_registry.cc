// SPDX-License-Identifier: Apache-2.0
#include "store/namespace_registry.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace kvtier {

uint32_t NamespaceRegistry::NewHandleLocked() {
  if (!free_handles_.empty()) {
    const uint32_t h = free_handles_.back();
    free_handles_.pop_back();
    return h;
  }
  entries_.emplace_back();
  return static_cast<uint32_t>(entries_.size() - 1);
}

absl::StatusOr<NamespaceInfo> NamespaceRegistry::Register(const NamespaceId& id, uint16_t tenant,
                                                          const NamespaceDescriptor& d, uint32_t max_per_tenant) {
  MutexLock l(&mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    NamespaceInfo& known = entries_[it->second].info;
    if (known.model_id.empty()) {  // first attach after recovery
      known.model_id = d.model_id;
      known.tp_size = std::max<uint32_t>(1, d.tp_size);
    }
    return known;
  }
  if (free_handles_.empty() && entries_.size() >= UINT32_MAX) {
    return absl::ResourceExhaustedError("too many namespaces");
  }
  if (per_tenant_[tenant] >= max_per_tenant) {
    return CodedStatus(KVTIER_EBUSY, absl::StrCat("this tenant already has ", per_tenant_[tenant],
                                                  " namespaces in use (limits.namespaces_per_tenant); reuse a model "
                                                  "revision's descriptor, or ask the administrator to raise the limit"));
  }
  ++per_tenant_[tenant];
  const uint32_t h = NewHandleLocked();
  Entry& e = entries_[h];
  e.info = NamespaceInfo{h, id, tenant, d.block_tokens, d.block_bytes, d.model_id, std::max<uint32_t>(1, d.tp_size)};
  e.sessions = 0;
  e.live = true;
  e.counted = true;
  by_id_.emplace(id, h);
  return e.info;
}

NamespaceInfo NamespaceRegistry::RegisterRecovered(const NamespaceId& id, uint16_t tenant, uint64_t block_bytes,
                                                  uint32_t block_tokens) {
  MutexLock l(&mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) return entries_[it->second].info;
  // Not counted against limits.namespaces_per_tenant: what is on NVMe from
  // before must never keep a tenant from attaching.
  const uint32_t h = NewHandleLocked();
  Entry& e = entries_[h];
  e.info = NamespaceInfo{h, id, tenant, block_tokens, block_bytes, ""};
  e.sessions = 0;
  e.live = true;
  e.counted = false;
  by_id_.emplace(id, h);
  return e.info;
}

void NamespaceRegistry::SessionStarted(uint32_t handle) {
  MutexLock l(&mu_);
  if (handle < entries_.size() && entries_[handle].live) ++entries_[handle].sessions;
}

void NamespaceRegistry::SessionEnded(uint32_t handle) {
  MutexLock l(&mu_);
  if (handle < entries_.size() && entries_[handle].live && entries_[handle].sessions > 0) {
    --entries_[handle].sessions;
  }
}

std::vector<NamespaceInfo> NamespaceRegistry::FreeUnused(absl::FunctionRef<bool(const NamespaceInfo&)> release,
                                                         std::optional<uint16_t> tenant) {
  MutexLock l(&mu_);
  std::vector<NamespaceInfo> freed;
  for (uint32_t h = 0; h < entries_.size(); ++h) {
    Entry& e = entries_[h];
    if (!e.live || e.sessions != 0 || (tenant && e.info.tenant != *tenant)) continue;
    if (!release(e.info)) continue;
    by_id_.erase(e.info.id);
    if (e.counted) --per_tenant_[e.info.tenant];
    freed.push_back(std::move(e.info));
    e = Entry{};
    free_handles_.push_back(h);
  }
  return freed;
}

std::vector<NamespaceInfo> NamespaceRegistry::List() const {
  MutexLock l(&mu_);
  std::vector<NamespaceInfo> out;
  for (const Entry& e : entries_) {
    if (e.live) out.push_back(e.info);
  }
  return out;
}

size_t NamespaceRegistry::live() const {
  MutexLock l(&mu_);
  return by_id_.size();
}

}  // namespace kvtier
