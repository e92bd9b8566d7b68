// SPDX-License-Identifier: Apache-2.0
// The host tier: one tenant's shared-memory arena (a sealed memfd, pinned with
// cudaHostRegister where a GPU exists), mapped into the daemon and into every
// engine of that tenant, cut into fixed-size slots. Engines read and write
// block bytes in place; the daemon hands out slot offsets.
#ifndef KVTIER_TIERS_HOST_TIER_H_
#define KVTIER_TIERS_HOST_TIER_H_

#include <memory>
#include <string>

#include "core/mutex.h"
#include "core/unique_fd.h"
#include "os/shm.h"
#include "tiers/slot_allocator.h"
#include "tiers/tier.h"

namespace kvtier {

struct HostTierOptions {
  std::string name;             // shows in /proc/PID/fd, e.g. "kvtier-host-default"
  uint64_t capacity_bytes = 0;
  bool prefault = false;        // fault every page in at start
};

class HostTier final : public Tier {
 public:
  // Slots start on these pages: an offset in the arena is a 32-bit page
  // number times kPage (what the daemon's block records keep).
  static constexpr uint64_t kPage = 4096;

  static absl::StatusOr<std::unique_ptr<HostTier>> Create(const HostTierOptions& opts);

  TierKind kind() const override { return TierKind::kHost; }
  absl::StatusOr<SlotHandle> Allocate(uint64_t bytes) override;
  absl::Status Free(SlotHandle slot) override;
  uint64_t SlotBytes(SlotHandle slot) const override;
  // Host slots are plain memory: meta and priority play no part; done runs inline.
  void Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, IoPriority prio,
             IoCallback done) override;
  void Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, IoPriority prio,
            IoCallback done) override;
  TierUsage Usage() const override;
  TierHealth Health() const override { return TierHealth::kHealthy; }

  // Thread-safe. The slot size a block of `bytes` gets (its size class).
  uint64_t SlotSizeFor(uint64_t bytes) const { return (bytes + kPage - 1) / kPage * kPage; }
  // Thread-safe. Offset of the slot's bytes in the arena (what engines use).
  uint64_t ArenaOffset(SlotHandle slot) const;
  // Thread-safe. See SlotAllocator.
  std::vector<SlotAllocator::ClassUsage> Classes() const;
  std::vector<std::pair<uint32_t, uint32_t>> LiveSlotsOutsideClass(uint64_t bytes) const;
  uint64_t SlotsPerSegment(uint64_t bytes) const;
  // The memfd engines of this tenant map; owned by the tier.
  int arena_fd() const { return fd_.get(); }
  uint64_t arena_bytes() const { return region_.size(); }
  std::byte* arena_base() const { return region_.data(); }

 private:
  HostTier(UniqueFd fd, os::MappedRegion region, uint64_t capacity);
  // (offset, bytes) of an allocated slot; (0, 0) otherwise.
  std::pair<uint64_t, uint64_t> SlotRange(SlotHandle slot) const;

  UniqueFd fd_;
  os::MappedRegion region_;
  mutable Mutex mu_;
  SlotAllocator slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_HOST_TIER_H_
