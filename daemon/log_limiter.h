// SPDX-License-Identifier: Apache-2.0
// Per-peer log rate limiting: the lines a tenant (or a local user who is
// no tenant) can make kvtierd write — attaches, detaches, sessions ending,
// KV-cache registrations, refusals — are a token bucket per key, so attach
// churn cannot fill the disk or bury other tenants' lines. What is dropped
// is counted, and said in one line when the key may log again.
#ifndef KVTIER_DAEMON_LOG_LIMITER_H_
#define KVTIER_DAEMON_LOG_LIMITER_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "core/mutex.h"
#include "core/units.h"
#include "store/stats.h"
#include "spdlog/spdlog.h"

namespace kvtier {

class LogLimiter {
 public:
  // `per_second` lines a key may write on average, in bursts of `burst`; 0: no limit.
  LogLimiter(uint32_t per_second, uint32_t burst, DaemonStats* stats)
      : per_second_(per_second), burst_(std::max(burst, per_second)), stats_(stats) {}

  // Thread-safe. True when a line for `key` may be written now. When lines
  // were dropped before this one, says how many first.
  bool Allow(const std::string& key) {
    if (per_second_ == 0) return true;
    uint64_t dropped = 0;
    {
      MutexLock l(&mu_);
      // Read under the lock: a time read before it could be older than the
      // bucket's (another thread got the lock first), and the unsigned
      // difference would refill the bucket at once.
      const uint64_t now = MonotonicNanos();
      if (buckets_.size() > kMaxKeys && !buckets_.contains(key)) buckets_.clear();  // bounded too
      Bucket& b = buckets_[key];
      if (b.last_ns == 0) b = Bucket{double(burst_), now, 0};
      if (now > b.last_ns) {
        b.tokens = std::min<double>(burst_, b.tokens + double(now - b.last_ns) * 1e-9 * per_second_);
        b.last_ns = now;
      }
      if (b.tokens < 1) {
        ++b.dropped;
        if (stats_ != nullptr) stats_->log_lines_suppressed.Add();
        return false;
      }
      b.tokens -= 1;
      dropped = b.dropped;
      b.dropped = 0;
    }
    if (dropped > 0) {
      spdlog::warn("event=log_suppressed key={} lines={} detail=\"this peer logged faster than "
                   "limits.log_lines_per_s; lines were dropped\"",
                   key, dropped);
    }
    return true;
  }

 private:
  static constexpr size_t kMaxKeys = 4096;
  struct Bucket {
    double tokens = 0;
    uint64_t last_ns = 0;
    uint64_t dropped = 0;
  };
  const uint32_t per_second_;
  const uint32_t burst_;
  DaemonStats* const stats_;
  Mutex mu_;
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_DAEMON_LOG_LIMITER_H_
