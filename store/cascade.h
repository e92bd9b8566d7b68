// SPDX-License-Identifier: Apache-2.0
// The cascade's driver: a thread that, while a tier of the chain is fuller
// than `high` of its capacity, has the store move that tier's coldest
// blocks one tier down until it is at `low` (hysteresis: a tier between
// its marks is left alone until it crosses `high` again). The last tier
// never cascades; it evicts. The moves themselves are the store's
// migrator's (Migrator::CascadeBatch, migrator_cascade.cc): the driver owns when they
// run and for which tier.
#ifndef KVTIER_STORE_CASCADE_H_
#define KVTIER_STORE_CASCADE_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "core/background_loop.h"

namespace kvtier {

class Cascade {
 public:
  struct Hooks {
    // Tiers in the chain (fixed once Start is called).
    absl::AnyInvocable<size_t() const> tiers;
    // Whether tier i holds more than `share` of its capacity.
    absl::AnyInvocable<bool(size_t i, double share) const> fuller_than;
    // Moves up to `max` of tier i's coldest blocks into tier i + 1; how many moved.
    absl::AnyInvocable<uint32_t(size_t i, uint32_t max)> move_batch;
  };
  static constexpr uint32_t kBatch = 16;

  Cascade(double high, double low, Hooks hooks) : high_(high), low_(low), hooks_(std::move(hooks)) {}
  Cascade(const Cascade&) = delete;
  Cascade& operator=(const Cascade&) = delete;

  // The owner's thread: starts the thread with two tiers or more (every
  // 50 ms, and when woken); nothing when it runs already.
  void Start() {
    if (hooks_.tiers() < 2 || loop_.running()) return;
    draining_.assign(hooks_.tiers(), false);
    loop_.Start(std::chrono::milliseconds(50), [this] { Pass(); });
  }
  // The owner's thread: after the current batch.
  void Stop() { loop_.Stop(); }
  // Any thread, after a copy landed in tier i: wakes the driver when tier
  // i has one below it and is above the high mark.
  void MaybeWake(size_t i) {
    if (!loop_.running() || i + 1 >= hooks_.tiers()) return;
    if (!hooks_.fuller_than(i, high_)) return;
    loop_.Wake();
  }
  // Nothing left to do: no tier between its marks, no batch moving (for
  // tests and drains that want a settled chain). Any thread.
  bool settled() const { return !busy_.load(); }

  // One pass: every tier above `high` moved down to `low`, as far as
  // blocks can move now. The driver's thread runs it; a test may call it
  // directly (after Prepare, without Start).
  void Pass() {
    bool any_draining = false;
    for (size_t i = 0; i + 1 < draining_.size(); ++i) {
      if (!draining_[i]) draining_[i] = hooks_.fuller_than(i, high_);
      if (draining_[i]) busy_.store(true);
      while (draining_[i] && (loop_.running() || manual_)) {
        if (!hooks_.fuller_than(i, low_)) {
          draining_[i] = false;
          break;
        }
        // Nothing movable now (all pinned, busy, or no room below): look
        // again on the next wake.
        if (hooks_.move_batch(i, kBatch) == 0) break;
      }
      any_draining = any_draining || draining_[i];
    }
    busy_.store(any_draining);
  }
  // For tests: passes run on the caller's thread, with no driver thread.
  void Prepare() {
    manual_ = true;
    draining_.assign(hooks_.tiers(), false);
  }

 private:
  const double high_, low_;
  Hooks hooks_;
  bool manual_ = false;
  std::vector<bool> draining_;  // tier i is between its marks; the pass's thread only
  std::atomic<bool> busy_{false};
  // Last: the destructor stops the thread before what its passes touch goes.
  BackgroundLoop loop_;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_CASCADE_H_
