// SPDX-License-Identifier: Apache-2.0
#include "tools/common/daemon_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ipc/admin_client.h"

extern char** environ;

namespace kvtier::tools {

std::string FindKvtierd() {
  if (const char* env = std::getenv("KVTIERD_BIN"); env != nullptr && *env) return env;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const auto& candidate : {self.parent_path() / "kvtierd", self.parent_path().parent_path() / "daemon" / "kvtierd"}) {
      if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  }
  return "kvtierd";
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(base && *base ? base : "/tmp", "/kvtier-XXXXXX");
  char* p = mkdtemp(tmpl.data());
  if (p == nullptr) std::abort();
  path_ = p;
  chmod(path_.c_str(), 0755);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

DaemonProcess::DaemonProcess(std::string extra_config, std::string binary, std::string data_dir)
    : config_(std::move(extra_config)), binary_(std::move(binary)), data_dir_(std::move(data_dir)) {}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::Status DaemonProcess::Start() {
  const std::string binary = binary_.empty() ? FindKvtierd() : binary_;
  const char* bin = binary.c_str();
  std::string cfg = config_;
  // Host tier only unless the caller configures NVMe: a child daemon should
  // not preallocate gigabytes by default. ([[tiers.lower]] states the whole
  // chain: NVMe only when an entry names it.)
  if (cfg.find("[tiers.nvme]") == std::string::npos && cfg.find("[[tiers.lower]]") == std::string::npos) {
    cfg += "\n[tiers.nvme]\ncapacity = 0\n";
  }
  // Many test daemons run at once: no fixed metrics port unless asked for.
  if (cfg.find("[metrics]") == std::string::npos) cfg += "\n[metrics]\nenabled = false\n";
  if (cfg.find("[daemon]") == std::string::npos) {
    cfg = absl::StrCat("[daemon]\nrun_dir = \"", dir_.path(), "\"\ndata_dir = \"",
                       data_dir_.empty() ? dir_.path() + "/data" : data_dir_, "\"\nlog_level = \"debug\"\n", cfg);
  }
  const std::string cfg_path = dir_.File("kvtierd.toml");
  std::ofstream(cfg_path) << cfg;
  const std::string log_path = dir_.File("kvtierd.log");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  std::string c_flag = "--config";
  char* argv[] = {const_cast<char*>(bin), c_flag.data(), const_cast<char*>(cfg_path.c_str()), nullptr};
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  const int rc = posix_spawnp(&pid_, bin, &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return absl::InternalError(absl::StrCat("posix_spawn ", bin, ": ", std::strerror(rc)));
  // A start takes well under a second; 30 s is for a loaded machine or a
  // sanitizer build recovering a large NVMe journal.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("kvtierd exited at start:\n", Log()));
    }
    if (Status().ok()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat("kvtierd did not answer within 30 s:\n", Log()));
}

int DaemonProcess::WaitExit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return st;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

int DaemonProcess::Stop(std::chrono::seconds timeout) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  return WaitExit(timeout);
}

void DaemonProcess::Kill(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

std::string DaemonProcess::Log() const {
  std::ifstream in(dir_.File("kvtierd.log"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<nlohmann::json> DaemonProcess::Status() const {
  return ipc::AdminCall(admin_socket_path(), nlohmann::json{{"cmd", "status"}}, std::chrono::seconds(2));
}

}  // namespace kvtier::tools
