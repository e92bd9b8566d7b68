// SPDX-License-Identifier: Apache-2.0
#include "tiers/staging_pool.h"

#include <sys/mman.h>

#include <cerrno>

#include "core/status.h"

namespace kvtier {

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(uint64_t bytes) {
  bytes = (bytes + kUnit - 1) / kUnit * kUnit;
  if (bytes == 0) return absl::InvalidArgumentError("staging pool of 0 bytes");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, "mmap of the NVMe staging pool");
  return std::unique_ptr<StagingPool>(new StagingPool(static_cast<std::byte*>(p), bytes));
}

StagingPool::StagingPool(std::byte* base, uint64_t size) : base_(base), size_(size) {
  MutexLock l(&mu_);
  free_[0] = size;
}

StagingPool::~StagingPool() { munmap(base_, size_); }

std::byte* StagingPool::TakeLocked(uint64_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const uint64_t off = it->first;
    const uint64_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_[off + bytes] = rest;
    used_[off] = bytes;
    used_bytes_ += bytes;
    return base_ + off;
  }
  return nullptr;
}

std::byte* StagingPool::TryAcquire(uint64_t bytes) {
  bytes = (bytes + kUnit - 1) / kUnit * kUnit;
  MutexLock l(&mu_);
  return TakeLocked(bytes);
}

std::byte* StagingPool::Acquire(uint64_t bytes) {
  bytes = (bytes + kUnit - 1) / kUnit * kUnit;
  if (bytes > size_) return nullptr;
  MutexLock l(&mu_);
  std::byte* p = nullptr;
  mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return (p = TakeLocked(bytes)) != nullptr; });
  return p;
}

void StagingPool::Release(std::byte* p) {
  {
    MutexLock l(&mu_);
    auto u = used_.find(static_cast<uint64_t>(p - base_));
    if (u == used_.end()) return;
    uint64_t off = u->first, len = u->second;
    used_.erase(u);
    used_bytes_ -= len;
    // Coalesce with the free neighbours.
    auto next = free_.lower_bound(off);
    if (next != free_.end() && off + len == next->first) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[off] = len;
    ++releases_;
  }
  cv_.notify_all();
}

uint64_t StagingPool::used() const {
  MutexLock l(&mu_);
  return used_bytes_;
}

uint64_t StagingPool::releases() const {
  MutexLock l(&mu_);
  return releases_;
}

bool StagingPool::AwaitRelease(uint64_t seen, std::chrono::nanoseconds timeout) {
  MutexLock l(&mu_);
  if (releases_ != seen) return true;
  if (used_bytes_ == 0) return false;
  return mu_.AwaitFor(cv_, timeout, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return releases_ != seen; });
}

}  // namespace kvtier
