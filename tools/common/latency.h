// SPDX-License-Identifier: Apache-2.0
// Latency samples and their percentiles (nearest rank).
#ifndef KVTIER_TOOLS_COMMON_LATENCY_H_
#define KVTIER_TOOLS_COMMON_LATENCY_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kvtier::tools {

class Latencies {
 public:
  void Add(uint64_t ns) {
    ns_.push_back(ns);
    sorted_ = false;
  }
  void Merge(const Latencies& o) { ns_.insert(ns_.end(), o.ns_.begin(), o.ns_.end()); }
  size_t count() const { return ns_.size(); }
  // p in [0, 100]; 0 when empty. Sorts lazily.
  double PercentileUs(double p) {
    if (ns_.empty()) return 0;
    if (!sorted_) {
      std::sort(ns_.begin(), ns_.end());
      sorted_ = true;
    }
    size_t rank = static_cast<size_t>(p / 100.0 * static_cast<double>(ns_.size()));
    rank = std::min(rank, ns_.size() - 1);
    return static_cast<double>(ns_[rank]) / 1000.0;
  }
  void Reserve(size_t n) { ns_.reserve(n); }

 private:
  std::vector<uint64_t> ns_;
  bool sorted_ = false;
};

}  // namespace kvtier::tools

#endif  // KVTIER_TOOLS_COMMON_LATENCY_H_
