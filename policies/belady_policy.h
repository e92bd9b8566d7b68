// SPDX-License-Identifier: Apache-2.0
// Belady's offline-optimal eviction (MIN): evict the block whose next use is
// furthest in the future. It needs the future, so it serves only as the
// bound in simulations (kvtier-replay --simulate), never in the daemon.
#ifndef KVTIER_POLICIES_BELADY_POLICY_H_
#define KVTIER_POLICIES_BELADY_POLICY_H_

#include <cstdint>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "policies/eviction_policy.h"

namespace kvtier {

class BeladyPolicy final : public EvictionPolicy {
 public:
  static constexpr uint64_t kNever = UINT64_MAX;

  // Sets when `handle` is next used (kNever: not again) and its depth in its
  // prefix; ties go to the deeper block, so leaves leave before parents.
  // Call before Insert, and again after each use.
  void SetNextUse(uint32_t handle, uint64_t next_use, uint32_t depth);

  void Insert(uint32_t handle) override;
  void Touch(uint32_t handle) override;
  void Remove(uint32_t handle) override;
  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override;
  bool Contains(uint32_t handle) const override;
  size_t size() const override { return order_.size(); }
  absl::string_view name() const override { return "belady"; }

 private:
  struct Info {
    uint64_t next = kNever;
    uint32_t depth = 0;
    bool in = false;
  };
  using Key = std::tuple<uint64_t, uint32_t, uint32_t>;  // next use, depth, handle
  Info& At(uint32_t h);
  std::vector<Info> info_;
  std::set<Key> order_;
};

}  // namespace kvtier

#endif  // KVTIER_POLICIES_BELADY_POLICY_H_
