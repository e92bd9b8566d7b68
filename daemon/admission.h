// SPDX-License-Identifier: Apache-2.0
// Admission: whether a peer may attach, and as what. An attach is checked in
// order: the request itself (it decodes, its namespace descriptor is valid,
// its strings are printable), the peer's tenant (by uid, then by primary
// gid), the daemon's and the tenant's session limits, then the namespace
// (registered, within the tenant's namespace limit). The stateless checks
// live here; Daemon::Admit applies the limits and registers the namespace.
// A refusal is a status carrying the client-visible code (CodedStatus) and
// a message that says what to do.
#ifndef KVTIER_DAEMON_ADMISSION_H_
#define KVTIER_DAEMON_ADMISSION_H_

#include <cstddef>
#include <span>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "store/stats.h"
#include "ipc/attach.h"
#include "ipc/unix_socket.h"

namespace kvtier {

// The request decodes and names a valid namespace with printable strings;
// counts Refusal::kBadClientString for strings that are not.
absl::StatusOr<ipc::AttachRequest> CheckAttachRequest(std::span<const std::byte> request, DaemonStats& stats);

// The tenant the peer belongs to: the last whose uids hold its uid, else the
// first whose gids hold its primary gid; EACCES when none.
absl::StatusOr<const TenantConfig*> TenantOfPeer(const Config& config, const ipc::PeerCredentials& peer);

}  // namespace kvtier

#endif  // KVTIER_DAEMON_ADMISSION_H_
