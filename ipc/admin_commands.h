// SPDX-License-Identifier: Apache-2.0
// The admin protocol's commands, stated once: kvtierd dispatches on this
// table (Daemon::kAdminHandlers, in the same order) and kvtierctl takes its
// subcommands' help from it. A request is {"cmd": NAME, ...fields}.
#ifndef KVTIER_IPC_ADMIN_COMMANDS_H_
#define KVTIER_IPC_ADMIN_COMMANDS_H_

#include <array>
#include <string>
#include <string_view>

namespace kvtier::ipc {

struct AdminCommand {
  std::string_view name;
  std::string_view fields;  // the request's fields besides "cmd"
  std::string_view help;    // one line, for kvtierctl's help
};

inline constexpr std::array<AdminCommand, 7> kAdminCommands = {{
    {"status", "", "sessions, tenants, tiers, hits and misses"},
    {"ping", "", "whether kvtierd answers"},
    {"config", "", "the running configuration (salts redacted)"},
    {"blocks", "tenant, key, limit (1-100000)", "blocks the daemon holds"},
    {"evict", "tenant", "evict every unpinned host block of a tenant (demoting to NVMe)"},
    {"flush", "timeout_ms (1-10000)", "write host blocks without a durable copy to NVMe, journal durable"},
    {"drain", "", "drain and stop kvtierd, as SIGTERM does"},
}};

// The help line of a command in the table ("" for an unknown name).
constexpr std::string_view AdminHelp(std::string_view name) {
  for (const AdminCommand& c : kAdminCommands) {
    if (c.name == name) return c.help;
  }
  return {};
}

// "status, ping, ...": the names, for an unknown command's error.
inline std::string AdminCommandNames() {
  std::string out;
  for (const AdminCommand& c : kAdminCommands) {
    if (!out.empty()) out += ", ";
    out += c.name;
  }
  return out;
}

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_ADMIN_COMMANDS_H_
