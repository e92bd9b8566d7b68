// SPDX-License-Identifier: Apache-2.0
// Fan-in of asynchronous parts: a request that starts N tier operations
// (promotions, NVMe writes) and answers once all of them completed, in any
// order, on any thread. Each part may fold its outcome into a shared result
// under the fan-in's lock (With); each part's completion calls Arrive, and the
// last to arrive runs `finish` with the result, once, outside the lock, on
// its own thread. Held by shared_ptr: every part's callback keeps a copy.
//
//   auto fan = FanIn<uint32_t>::Make(parts, 0, [done](uint32_t promoted) { ... });
//   for (...) Start([fan](bool ok) {
//     if (ok) fan->With([](uint32_t& n) { ++n; });
//     fan->Arrive();
//   });
//
// A caller that must not finish before every part has been started (a part
// may complete inline) makes it with parts + 1 and arrives once itself after
// the last start.
#ifndef KVTIER_CORE_FAN_IN_H_
#define KVTIER_CORE_FAN_IN_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "core/mutex.h"

namespace kvtier {

template <typename Result>
class FanIn {
 public:
  using Finish = absl::AnyInvocable<void(Result) &&>;

  // parts > 0 (with none, there is no last arrival: finish at once instead).
  static std::shared_ptr<FanIn> Make(size_t parts, Result initial, Finish finish) {
    return std::shared_ptr<FanIn>(new FanIn(parts, std::move(initial), std::move(finish)));
  }

  // Runs f(result) under the lock.
  template <typename F>
  void With(F&& f) {
    MutexLock l(&mu_);
    std::forward<F>(f)(result_);
  }

  // One part done; the last runs finish.
  void Arrive() {
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    Result r;
    {
      MutexLock l(&mu_);
      r = std::move(result_);
    }
    std::move(finish_)(std::move(r));
  }

 private:
  FanIn(size_t parts, Result initial, Finish finish)
      : result_(std::move(initial)), remaining_(parts), finish_(std::move(finish)) {}

  Mutex mu_;
  Result result_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> remaining_;
  Finish finish_;  // run once, by the last arrival
};

}  // namespace kvtier

#endif  // KVTIER_CORE_FAN_IN_H_
