// SPDX-License-Identifier: Apache-2.0
// The store's background reclaimer: a thread and its two marks. Above the
// high mark (a share of a tenant's arena, or of its host_tokens quota) a
// pass evicts the tenant's coldest blocks down to the low mark; between
// them, nothing (the gap is what stores use without evicting). A high mark
// of 1 means off: stores evict on their own path when the tier is full.
//
// The pass itself is the store's (BlockStore::ReclaimPass): the reclaimer
// owns when it runs and which marks it sees. The marks are one atomic
// word, so a pass, or a store asking whether to wake it, never sees a
// reload's new high mark with the old low one.
#ifndef KVTIER_STORE_RECLAIMER_H_
#define KVTIER_STORE_RECLAIMER_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/background_loop.h"

namespace kvtier {

class Reclaimer {
 public:
  struct Marks {
    double high = 1.0, low = 1.0;
  };
  using Pass = absl::AnyInvocable<void(Marks)>;

  // `pass` runs on the reclaimer's thread, every 100 ms and when woken.
  Reclaimer(Marks marks, Pass pass) : marks_(Pack(marks)), pass_(std::move(pass)) {}
  Reclaimer(const Reclaimer&) = delete;
  Reclaimer& operator=(const Reclaimer&) = delete;

  // InvalidArgument unless 0.05 <= low <= high <= 1.
  static absl::Status Check(Marks m) {
    if (!(m.low >= 0.05 && m.low <= m.high && m.high <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("watermarks ", m.high, " / ", m.low, " are not 0.05 <= low <= high <= 1"));
    }
    return absl::OkStatus();
  }

  // Any thread.
  Marks marks() const { return Unpack(marks_.load(std::memory_order_relaxed)); }
  // A reload (the owner's thread): new marks, the thread started if it was
  // off and is now wanted, and a pass soon with the new marks.
  absl::Status SetMarks(Marks m) {
    if (absl::Status s = Check(m); !s.ok()) return s;
    marks_.store(Pack(m), std::memory_order_relaxed);
    Start();
    loop_.Wake();
    return absl::OkStatus();
  }
  // The owner's thread: starts the thread when the high mark is below 1.
  void Start() {
    if (marks().high >= 1.0) return;
    // The poll is a backstop: stores wake the reclaimer when they cross the mark.
    loop_.Start(std::chrono::milliseconds(100), [this] { pass_(marks()); });
  }
  // The owner's thread: after the current pass.
  void Stop() { loop_.Stop(); }
  // Any thread: a store that left its tenant above the high mark.
  void Wake() { loop_.Wake(); }
  // Any thread: between Start and Stop (a pass checks it to end early).
  bool running() const { return loop_.running(); }

 private:
  // Each mark in millionths (1.0 = 1,000,000), high in the upper half:
  // marks configured with up to six decimals come back exactly; others move
  // by at most half a millionth, except that a mark below 1 stays below 1
  // (a high mark of 0.9999999 keeps the reclaimer on). Not a number: 1.
  static uint64_t Pack(Marks m) {
    auto ppm = [](double v) -> uint64_t {
      if (std::isnan(v) || v >= 1.0) return 1'000'000;
      return std::min<uint64_t>(999'999, static_cast<uint64_t>(std::llround(std::max(v, 0.0) * 1e6)));
    };
    return ppm(m.high) << 32 | ppm(m.low);
  }
  static Marks Unpack(uint64_t w) {
    return {static_cast<double>(w >> 32) / 1e6, static_cast<double>(w & 0xffffffffu) / 1e6};
  }

  static_assert(std::atomic<uint64_t>::is_always_lock_free, "the marks must be one lock-free word");
  std::atomic<uint64_t> marks_;
  Pass pass_;
  // Last: the destructor stops the thread before the pass and marks go.
  BackgroundLoop loop_;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_RECLAIMER_H_
