// SPDX-License-Identifier: Apache-2.0
// Page-aligned staging memory for direct I/O: the NVMe tier copies a block
// and its header into a staging run, writes it with O_DIRECT, and reads into
// one before checking and copying out. One region, registered with io_uring
// as a fixed buffer; runs are handed out first-fit in 4 KiB units.
#ifndef KVTIER_TIERS_STAGING_POOL_H_
#define KVTIER_TIERS_STAGING_POOL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "core/mutex.h"

namespace kvtier {

class StagingPool {
 public:
  static constexpr uint64_t kUnit = 4096;

  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(uint64_t bytes);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  std::byte* base() const { return base_; }
  uint64_t size() const { return size_; }

  // Thread-safe. A run of at least `bytes`, or nullptr when none is free now.
  std::byte* TryAcquire(uint64_t bytes);
  // Thread-safe. Waits for a run; nullptr only when `bytes` exceeds the pool.
  std::byte* Acquire(uint64_t bytes);
  // Thread-safe. Returns a run from TryAcquire/Acquire.
  void Release(std::byte* p);
  // Thread-safe. Bytes handed out now.
  uint64_t used() const;
  // Thread-safe. How many runs were released so far: read it before a
  // TryAcquire, and if that fails, AwaitRelease(seen) waits for the next.
  uint64_t releases() const;
  // Thread-safe. Waits until a run was released since `seen` (true), or
  // until `timeout` passes (false). False at once when nothing is handed
  // out: no release is coming.
  bool AwaitRelease(uint64_t seen, std::chrono::nanoseconds timeout);

 private:
  StagingPool(std::byte* base, uint64_t size);
  std::byte* TakeLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::byte* const base_;
  const uint64_t size_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> length
  std::map<uint64_t, uint64_t> used_ ABSL_GUARDED_BY(mu_);
  uint64_t releases_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_STAGING_POOL_H_
