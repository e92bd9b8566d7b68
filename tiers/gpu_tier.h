// SPDX-License-Identifier: Apache-2.0
// The GPU tier: a daemon-owned device-memory arena (one per GPU and tenant),
// cut into fixed-size slots like the host arena, moved with copies on the
// device backend's streams. Exported whole to engines by IPC handle, so an
// engine can copy a block out with its own stream.
//
// Blocks in device memory are not checksummed (nothing but the daemon and
// the tenant's engines write there); a slot remembers which block it holds,
// and a read for another block is DataLoss, never served.
#ifndef KVTIER_TIERS_GPU_TIER_H_
#define KVTIER_TIERS_GPU_TIER_H_

#include <memory>
#include <vector>

#include "core/mutex.h"
#include "tiers/device_backend.h"
#include "tiers/slot_allocator.h"
#include "tiers/tier.h"

namespace kvtier {

struct GpuTierOptions {
  uint64_t capacity_bytes = 0;
};

class GpuTier final : public Tier {
 public:
  // Allocates the arena on `device` (which must outlive the tier).
  static absl::StatusOr<std::unique_ptr<GpuTier>> Create(DeviceBackend* device, const GpuTierOptions& opts);
  ~GpuTier() override;

  TierKind kind() const override { return TierKind::kGpu; }
  absl::StatusOr<SlotHandle> Allocate(uint64_t bytes) override;
  absl::Status Free(SlotHandle slot) override;
  uint64_t SlotBytes(SlotHandle slot) const override;
  // Host <-> device copies on the tier's stream; `done` runs inline once the
  // copy completed (src may be reused when Write returns, as the contract says).
  void Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, IoPriority prio,
             IoCallback done) override;
  void Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, IoPriority prio,
            IoCallback done) override;
  TierUsage Usage() const override;
  TierHealth Health() const override;

  // Thread-safe. Device address of an allocated slot's bytes (nullptr otherwise).
  std::byte* SlotData(SlotHandle slot) const;
  // Thread-safe. Offset of the slot in the arena (what engines use with the handle).
  uint64_t ArenaOffset(SlotHandle slot) const;
  // Thread-safe. A handle an engine imports to reach the arena.
  absl::StatusOr<IpcMemHandle> ExportArena() const;
  uint64_t arena_bytes() const { return capacity_; }

 private:
  GpuTier(DeviceBackend* device, std::byte* arena, uint64_t capacity, DeviceStream stream, DeviceEvent event);
  absl::Status Copy(void* dst, const void* src, uint64_t bytes);

  DeviceBackend* const device_;
  std::byte* const arena_;
  const uint64_t capacity_;
  mutable Mutex mu_;
  SlotAllocator slots_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockMeta> held_ ABSL_GUARDED_BY(mu_);  // per slot: the block written there
  std::vector<bool> written_ ABSL_GUARDED_BY(mu_);
  uint64_t copy_errors_ ABSL_GUARDED_BY(mu_) = 0;
  Mutex copy_mu_;  // one copy at a time on the stream and its event
  const DeviceStream stream_;
  const DeviceEvent event_;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_GPU_TIER_H_
