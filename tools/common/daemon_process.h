// SPDX-License-Identifier: Apache-2.0
// Runs kvtierd as a child process with a config in a temporary directory:
// kvtier-bench measures a real daemon this way, and the tests drive one.
#ifndef KVTIER_TOOLS_COMMON_DAEMON_PROCESS_H_
#define KVTIER_TOOLS_COMMON_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kvtier::tools {

// A fresh directory under $TMPDIR, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Where the kvtierd binary is: $KVTIERD_BIN, else next to (or in ../daemon/
// of) the running executable, else "kvtierd" on $PATH.
std::string FindKvtierd();

class DaemonProcess {
 public:
  // extra_config is appended to a [daemon] table that points run_dir and
  // data_dir into the temp dir, unless it has its own [daemon] table. The
  // NVMe tier is off unless extra_config has a [tiers.nvme] table.
  // data_dir, when given, replaces the temp dir's data directory (a restarted
  // daemon over the same state).
  explicit DaemonProcess(std::string extra_config = "", std::string binary = "", std::string data_dir = "");
  ~DaemonProcess();  // SIGKILL if still running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts and waits until the admin socket answers (10 s at most).
  absl::Status Start();
  // SIGTERM and wait; returns the wait status (-1 on timeout).
  int Stop(std::chrono::seconds timeout = std::chrono::seconds(10));
  void Kill(int sig);
  // Waits for the process to exit; returns its wait status or -1.
  int WaitExit(std::chrono::milliseconds timeout);
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  std::string socket_path() const { return dir_.File("kvtierd.sock"); }
  std::string admin_socket_path() const { return dir_.File("kvtierd-admin.sock"); }
  const std::string& dir() const { return dir_.path(); }
  std::string Log() const;  // what the daemon wrote to stderr

  absl::StatusOr<nlohmann::json> Status() const;

 private:
  TempDir dir_;
  std::string config_;
  std::string binary_;
  std::string data_dir_;
  pid_t pid_ = -1;
};

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_COMMON_DAEMON_PROCESS_H_
