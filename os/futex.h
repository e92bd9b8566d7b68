// SPDX-License-Identifier: Apache-2.0
// Futex doorbells on 32-bit words in shared memory (process-shared futexes:
// no FUTEX_PRIVATE_FLAG).
#ifndef KVTIER_OS_FUTEX_H_
#define KVTIER_OS_FUTEX_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvtier::os {

// Sleeps while *word == expected, at most `timeout`. Returns on a wake-up, a
// changed value, a signal or the timeout; callers re-check their condition.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);

// Wakes every waiter on word.
void FutexWakeAll(std::atomic<uint32_t>* word);

// One step of a polling loop that has waited `waited_ns` so far: a pause
// instruction for the first microseconds, then sched_yield(), so a poller
// never keeps a runnable thread (often the very peer it waits for) off a
// busy core. On an idle core yield returns at once and polling goes on.
void PollPause(uint64_t waited_ns);

// A CPU hint for spin loops.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace kvtier::os

#endif  // KVTIER_OS_FUTEX_H_
