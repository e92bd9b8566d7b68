// SPDX-License-Identifier: Apache-2.0
// Cancellation for asynchronous work: the side that may give up holds a
// CancelSource; work it started holds CancelTokens and checks them before it
// starts anything costly. A default token is never cancelled.
#ifndef KVTIER_CORE_CANCEL_H_
#define KVTIER_CORE_CANCEL_H_

#include <atomic>
#include <memory>

namespace kvtier {

class CancelToken {
 public:
  CancelToken() = default;
  // Thread-safe.
  bool cancelled() const { return flag_ != nullptr && flag_->load(std::memory_order_acquire); }

 private:
  friend class CancelSource;
  explicit CancelToken(std::shared_ptr<const std::atomic<bool>> flag) : flag_(std::move(flag)) {}
  std::shared_ptr<const std::atomic<bool>> flag_;  // null: never cancelled
};

class CancelSource {
 public:
  CancelSource() : flag_(std::make_shared<std::atomic<bool>>(false)) {}
  // Thread-safe. Every token from this source reports cancelled from now on.
  void Cancel() { flag_->store(true, std::memory_order_release); }
  CancelToken token() const { return CancelToken(flag_); }

 private:
  std::shared_ptr<std::atomic<bool>> flag_;
};

}  // namespace kvtier

#endif  // KVTIER_CORE_CANCEL_H_
