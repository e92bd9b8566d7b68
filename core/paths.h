// SPDX-License-Identifier: Apache-2.0
// Where kvtierd puts its sockets and data when the config does not say, and
// where clients look for it. One rule for both sides:
//   run dir:  $KVTIER_RUN_DIR, else $RUNTIME_DIRECTORY (systemd), else
//             /run/kvtier for root, else $XDG_RUNTIME_DIR/kvtier, else
//             /tmp/kvtier-$UID
//   data dir: $STATE_DIRECTORY (systemd), else /var/lib/kvtier for root, else
//             $XDG_STATE_HOME/kvtier, else ~/.local/state/kvtier
#ifndef KVTIER_CORE_PATHS_H_
#define KVTIER_CORE_PATHS_H_

#include <string>
#include <vector>

namespace kvtier {

std::string DefaultRunDir();
std::string DefaultDataDir();

inline constexpr const char* kDataSocketName = "kvtierd.sock";
inline constexpr const char* kAdminSocketName = "kvtierd-admin.sock";

// Where clients look for the daemon's sockets: $KVTIER_SOCKET /
// $KVTIER_ADMIN_SOCKET; else DefaultRunDir()'s socket when it exists; else
// the systemd service's (kServiceRunDir) when that exists, so engines and
// operators of another uid (members of the service's group) find a daemon
// run by the shipped unit; else DefaultRunDir()'s path (for the error).
inline constexpr const char* kServiceRunDir = "/run/kvtier";
std::string DefaultDataSocketPath();
std::string DefaultAdminSocketPath();
// The same search over given directories (tests): the first directory whose
// `name` exists, else the first directory's.
std::string FindSocket(const std::string& name, const std::vector<std::string>& dirs);

}  // namespace kvtier

#endif  // KVTIER_CORE_PATHS_H_
