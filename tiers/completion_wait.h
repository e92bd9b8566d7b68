// SPDX-License-Identifier: Apache-2.0
// Whether an I/O worker with one or two ops in flight should poll for their
// completion or sleep until the kernel wakes it, learnt on the machine it runs
// on rather than assumed.
//
// Polling saves the thread wake-up (tens of microseconds on some machines).
// But on others the polling itself slows the device: on a 2-vCPU virtual
// machine a lone O_DIRECT read took ~40 us longer at every size from 4 KiB to
// 256 KiB while its thread polled the ring than while it slept in
// io_uring_enter (p50 67 vs 108 us at 4 KiB, 163 vs 204 us at 256 KiB), as
// if the polling vCPU kept the hypervisor's I/O work off the core. Neither
// choice is right everywhere, so the worker times lone ops both ways, per
// size class, in epochs, and takes the faster, trying again now and then so
// that a change in the machine is followed. Reads and writes are told apart: a
// write's time depends on the device's cache, not on the wait.
#ifndef KVTIER_TIERS_COMPLETION_WAIT_H_
#define KVTIER_TIERS_COMPLETION_WAIT_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace kvtier {

class CompletionWaitChooser {
 public:
  // Size classes by powers of two: up to 4 KiB, 8 KiB, ..., 128 MiB and above.
  static constexpr int kClasses = 16;
  // A trial times kEpoch lone ops one way, then kEpoch the other, and keeps
  // the way with the lower median for kKeep ops before trying again. The
  // first kSettle ops of an epoch are not counted: one way's effect on the
  // machine outlasts the switch (timed op by op, alternately, polling's
  // slowdown leaked into the sleeping samples and polling won here).
  static constexpr uint32_t kEpoch = 64;
  static constexpr uint32_t kSettle = 8;
  static constexpr uint32_t kKeep = 4096;

  static int ClassOf(uint64_t bytes) {
    const int w = bytes <= 4096 ? 12 : std::bit_width(bytes - 1);
    return w - 12 < kClasses ? w - 12 : kClasses - 1;
  }

  // The decision for the next wait on reads or writes of about `bytes` each.
  bool ShouldPoll(bool write, uint64_t bytes) const {
    const Class& c = classes_[write][ClassOf(bytes)];
    switch (c.phase) {
      case Phase::kTrialPoll: return true;
      case Phase::kTrialSleep: return false;
      case Phase::kKeep: return c.poll;
    }
    return false;
  }

  // A lone read or write of `bytes` took service_ns from submission to its
  // completion being reaped, with the worker polling (polled) or sleeping.
  void Record(bool write, uint64_t bytes, bool polled, uint64_t service_ns) {
    Class& c = classes_[write][ClassOf(bytes)];
    if (c.phase == Phase::kKeep) {
      if (++c.ops >= kKeep) c.Start(Phase::kTrialPoll);
      return;
    }
    if (polled != (c.phase == Phase::kTrialPoll)) return;  // waited before the switch
    ++c.ops;
    if (c.ops > kSettle) c.samples[c.n++] = service_ns;
    if (c.ops < kEpoch) return;
    const uint64_t median = c.Median();
    if (c.phase == Phase::kTrialPoll) {
      c.poll_median = median;
      c.Start(Phase::kTrialSleep);
    } else {
      c.sleep_median = median;
      c.poll = c.poll_median < c.sleep_median;
      ++c.trials;
      c.Start(Phase::kKeep);
    }
  }

  // For reports and tests: the medians of the last trial (0 before one),
  // and how many trials ended.
  uint64_t median_ns(bool write, uint64_t bytes, bool polled) const {
    const Class& c = classes_[write][ClassOf(bytes)];
    return polled ? c.poll_median : c.sleep_median;
  }
  uint32_t trials(bool write, uint64_t bytes) const { return classes_[write][ClassOf(bytes)].trials; }

 private:
  enum class Phase : uint8_t { kTrialPoll, kTrialSleep, kKeep };
  struct Class {
    Phase phase = Phase::kTrialPoll;
    bool poll = false;
    uint32_t ops = 0, n = 0, trials = 0;
    uint64_t poll_median = 0, sleep_median = 0;
    std::array<uint64_t, kEpoch - kSettle> samples{};
    void Start(Phase p) {
      phase = p;
      ops = n = 0;
    }
    uint64_t Median() {
      std::nth_element(samples.begin(), samples.begin() + n / 2, samples.begin() + n);
      return samples[n / 2];
    }
  };
  std::array<std::array<Class, kClasses>, 2> classes_{};  // [write][size class]
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_COMPLETION_WAIT_H_
