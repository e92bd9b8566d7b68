// SPDX-License-Identifier: Apache-2.0
#include "os/futex.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace kvtier::ipc {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(DoorbellTest, WaitReturnsAtOnceWhenTheValueDiffers) {
  std::atomic<uint32_t> w{5};
  const auto t0 = Clock::now();
  os::FutexWait(&w, 4, std::chrono::seconds(5));
  EXPECT_LT(Clock::now() - t0, milliseconds(500));
}

TEST(DoorbellTest, WaitTimesOut) {
  std::atomic<uint32_t> w{0};
  const auto t0 = Clock::now();
  os::FutexWait(&w, 0, milliseconds(50));
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, milliseconds(45));
  EXPECT_LT(waited, milliseconds(2000));
}

TEST(DoorbellTest, WakeReachesAWaitingThread) {
  std::atomic<uint32_t> w{0};
  std::atomic<bool> woke{false};
  std::thread t([&] {
    while (w.load() == 0) os::FutexWait(&w, 0, std::chrono::seconds(10));
    woke = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  const auto t0 = Clock::now();
  w.store(1);
  os::FutexWakeAll(&w);
  t.join();
  EXPECT_TRUE(woke);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2)) << "the 10 s timeout was not what woke it";
}

TEST(DoorbellTest, WakeCrossesProcessesThroughSharedMemory) {
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* w = new (mem) std::atomic<uint32_t>(0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const auto t0 = Clock::now();
    while (w->load() == 0) os::FutexWait(w, 0, std::chrono::seconds(10));
    _exit(Clock::now() - t0 < std::chrono::seconds(5) ? 0 : 1);
  }
  std::this_thread::sleep_for(milliseconds(50));
  w->store(1);
  os::FutexWakeAll(w);
  int st = 0;
  waitpid(child, &st, 0);
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  munmap(mem, 4096);
}

}  // namespace
}  // namespace kvtier::ipc
