// SPDX-License-Identifier: Apache-2.0
// The handles a shared tier (a Redis Cluster, a shared directory) gives the
// store for what this node wrote there. The value itself is addressed by
// the block's identity and belongs to the shared tier; a handle is only this
// node's claim on it, counted against the capacity this node may hold. A
// transient handle (one write whose value the node does not keep) is not
// counted. Thread-safe.
#ifndef KVTIER_TIERS_HANDLE_TABLE_H_
#define KVTIER_TIERS_HANDLE_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "tiers/tier.h"

namespace kvtier {

class HandleTable {
 public:
  // `name` for messages ("remote", "fs").
  HandleTable(std::string name, uint64_t capacity_bytes, uint64_t max_block_bytes)
      : name_(std::move(name)), capacity_bytes_(capacity_bytes), max_block_bytes_(max_block_bytes) {}

  // A handle on a block of `payload_bytes` costing `cost` bytes:
  // InvalidArgument outside 1..max_block_bytes, ResourceExhausted when a
  // counted handle would pass the capacity.
  absl::StatusOr<SlotHandle> Allocate(uint64_t payload_bytes, uint64_t cost, bool transient);
  // InvalidArgument for a handle not allocated.
  absl::Status Free(SlotHandle slot);
  // What the handle costs; 0 for one not allocated.
  uint64_t SlotBytes(SlotHandle slot) const;
  TierUsage Usage() const;

 private:
  static constexpr uint64_t kTransient = uint64_t{1} << 63;
  const std::string name_;
  const uint64_t capacity_bytes_, max_block_bytes_;
  mutable Mutex mu_;
  std::vector<uint64_t> slot_bytes_ ABSL_GUARDED_BY(mu_);  // 0: free; kTransient set: not counted
  std::vector<SlotHandle> free_slots_ ABSL_GUARDED_BY(mu_);
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_slots_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_HANDLE_TABLE_H_
