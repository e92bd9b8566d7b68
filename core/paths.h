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

namespace kvtier {

std::string DefaultRunDir();
std::string DefaultDataDir();

inline constexpr const char* kDataSocketName = "kvtierd.sock";
inline constexpr const char* kAdminSocketName = "kvtierd-admin.sock";

// $KVTIER_SOCKET, else DefaultRunDir()/kvtierd.sock.
std::string DefaultDataSocketPath();
// $KVTIER_ADMIN_SOCKET, else DefaultRunDir()/kvtierd-admin.sock.
std::string DefaultAdminSocketPath();

}  // namespace kvtier

#endif  // KVTIER_CORE_PATHS_H_
