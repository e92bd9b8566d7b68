// Test helpers: temporary directories, a real kvtierd process, namespaces.
#ifndef KVTIER_TESTS_SUPPORT_TEST_SUPPORT_H_
#define KVTIER_TESTS_SUPPORT_TEST_SUPPORT_H_

#include <sys/types.h>

#include <chrono>
#include <span>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "kvtier/types.h"
#include "nlohmann/json.hpp"

namespace kvtier::testing {

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

// kvtierd started from $KVTIERD_BIN with a config written into a temp dir.
// The config text gets [daemon] run_dir/data_dir and log settings prepended
// unless it has its own [daemon] table.
class DaemonProcess {
 public:
  explicit DaemonProcess(std::string extra_config = "");
  ~DaemonProcess();  // SIGKILL if still running
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Starts and waits until the admin socket answers (10 s at most).
  absl::Status Start();
  // SIGTERM and wait; returns the exit status (-1 on timeout).
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
  pid_t pid_ = -1;
};

// A valid namespace descriptor for tests.
NamespaceDescriptor TestNamespace(uint64_t block_bytes = 4096, std::string model = "test/model");

// Deterministic bytes derived from a key (what kvtier-replay stores too).
void FillFromKey(const BlockKey& key, std::span<std::byte> out);
bool MatchesKey(const BlockKey& key, std::span<const std::byte> data);

// A key that is just the counter i in its first 8 bytes.
BlockKey KeyOf(uint64_t i);

// Polls cond every 5 ms until true or timeout; returns cond().
template <typename F>
bool Eventually(F cond, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_TEST_SUPPORT_H_
