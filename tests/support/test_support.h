// SPDX-License-Identifier: Apache-2.0
// Test helpers: temporary directories, a real kvtierd process, namespaces.
#ifndef KVTIER_TESTS_SUPPORT_TEST_SUPPORT_H_
#define KVTIER_TESTS_SUPPORT_TEST_SUPPORT_H_

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "kvtier/types.h"
#include "nlohmann/json.hpp"
#include "tools/common/daemon_process.h"

namespace kvtier::testing {

using tools::DaemonProcess;
using tools::TempDir;

// A valid namespace descriptor for tests.
NamespaceDescriptor TestNamespace(uint64_t block_bytes = 4096, std::string model = "test/model");

// Deterministic bytes derived from a key (what kvtier-replay stores too).
void FillFromKey(const BlockKey& key, std::span<std::byte> out);
bool MatchesKey(const BlockKey& key, std::span<const std::byte> data);

// A key that is just the counter i in its first 8 bytes.
BlockKey KeyOf(uint64_t i);

// Flips one bit of the byte at `offset` in `path` and syncs it: corruption
// on disk, for tests that a damaged block is never served.
inline bool FlipByteOnDisk(const std::string& path, off_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  char b;
  if (!f.seekg(offset) || !f.get(b)) return false;
  b ^= 0x20;
  if (!f.seekp(offset) || !f.put(b) || !f.flush()) return false;
  f.close();
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  const bool synced = fdatasync(fd) == 0;
  close(fd);
  return synced;
}

// True once every thread of process `pid` is stopped (state T in /proc):
// kill(SIGSTOP) returns before they all have.
inline bool IsStopped(pid_t pid) {
  std::error_code ec;
  bool any = false;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream f(task.path() / "stat");
    std::string line;
    std::getline(f, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'T') return false;
    any = true;
  }
  return any;
}

// How long a test waits for background work (demotions, reclaim, the
// cascade, journal commits, reaping, a daemon's start) before it calls the
// work lost. Tests wait on the condition, never on a fixed sleep, so a
// passing test returns as soon as the work is done; the deadline only
// bounds a failing one, and is long so that a machine under load (CI on a
// busy host, sanitizers, scripts/test --under-load) is not a failure.
inline constexpr std::chrono::seconds kPatience{30};

// True while thread `tid` of this process sleeps in the kernel (state S in
// /proc: a futex wait, a blocking read): how a test knows that a thread it
// started has reached the wait it is about to test, without guessing a time.
inline bool ThreadIsSleeping(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(f, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'S';
}

// A command line run through the shell: its stdout (stderr goes to the
// test log) and exit code (-1 when it did not exit).
struct CommandOutput {
  int exit_code = -1;
  std::string out;
};
CommandOutput RunCommand(const std::string& cmd);

// Polls cond every 5 ms until true or timeout; returns cond().
template <typename F>
bool Eventually(F cond, std::chrono::milliseconds timeout = kPatience) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SUPPORT_TEST_SUPPORT_H_
