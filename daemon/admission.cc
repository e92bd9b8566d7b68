// SPDX-License-Identifier: Apache-2.0
#include "daemon/admission.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/namespace.h"
#include "core/status.h"
#include "core/checked.h"
#include "kvtier/kvtier.h"

namespace kvtier {

absl::StatusOr<ipc::AttachRequest> CheckAttachRequest(std::span<const std::byte> request, DaemonStats& stats) {
  absl::StatusOr<ipc::AttachRequest> req = ipc::DecodeAttachRequest(request);
  if (!req.ok()) return req.status();
  if (absl::Status s = ValidateDescriptor(req->ns); !s.ok()) {
    const NamespaceDescriptor& d = req->ns;
    for (const std::string* f : {&d.model_id, &d.model_revision, &d.tokenizer_revision, &d.adapter_id,
                                 &d.attention_config_hash, &d.kv_dtype, &d.kv_layout}) {
      if (!IsPrintableUtf8(*f)) {
        stats.Refused(Refusal::kBadClientString);
        break;
      }
    }
    return CodedStatus(KVTIER_EINVAL, s.message());
  }
  // The name reaches logs, the status JSON and kvtierctl's tables.
  if (!IsPrintableUtf8(req->client_name)) {
    stats.Refused(Refusal::kBadClientString);
    return CodedStatus(KVTIER_EINVAL, "client name is not printable UTF-8 (control characters or invalid bytes)");
  }
  return req;
}

absl::StatusOr<const TenantConfig*> TenantOfPeer(const Config& config, const ipc::PeerCredentials& peer) {
  const TenantConfig* tenant = nullptr;
  for (const TenantConfig& t : config.tenants) {
    if (std::find(t.uids.begin(), t.uids.end(), peer.uid) != t.uids.end()) tenant = &t;
  }
  for (const TenantConfig& t : config.tenants) {
    if (tenant == nullptr && std::find(t.gids.begin(), t.gids.end(), peer.gid) != t.gids.end()) tenant = &t;
  }
  if (tenant == nullptr) {
    return CodedStatus(KVTIER_EACCES, absl::StrCat("uid ", peer.uid, " (gid ", peer.gid,
                                                   ") belongs to no tenant of kvtierd; an administrator can add it "
                                                   "to a [[tenants]] entry's uids or gids"));
  }
  return tenant;
}

}  // namespace kvtier
