// SPDX-License-Identifier: Apache-2.0
// The interface every tier implements: fixed-size
// slots, asynchronous block reads and writes through a staging buffer,
// capacity and usage, and a health state. Decorate with TierWrapper for
// tests (fault injection, slow devices).
#ifndef KVTIER_TIERS_TIER_H_
#define KVTIER_TIERS_TIER_H_

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/types.h"

namespace kvtier {

using SlotHandle = uint32_t;
using IoCallback = absl::AnyInvocable<void(absl::Status) &&>;

// Loads an engine waits for come first, then prefetches, then demotions.
enum class IoPriority : uint8_t { kLoad = 0, kPrefetch = 1, kDemote = 2 };
inline constexpr int kIoPriorities = 3;

// What a block is: a durable tier stores it with the bytes and checks it on
// every read, so a slot can never be served as another block.
struct BlockMeta {
  BlockKey ns;  // namespace id
  BlockKey key;
  uint64_t payload_bytes = 0;
  uint64_t tenant_hash = 0;   // which tenant's block (for recovery)
  uint32_t block_tokens = 0;
};

struct TierUsage {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;   // bytes in allocated slots
  uint64_t used_slots = 0;
  uint64_t free_slots = 0;   // carved but free, ready for reuse
};

enum class TierHealth { kHealthy, kDegraded, kFailed };
absl::string_view TierHealthName(TierHealth h);

class Tier {
 public:
  Tier() = default;
  virtual ~Tier() = default;
  Tier(const Tier&) = delete;
  Tier& operator=(const Tier&) = delete;

  // Thread-safe.
  virtual TierKind kind() const = 0;
  // Thread-safe. A slot of at least `bytes`; ResourceExhausted when the tier
  // has no room (the caller evicts and retries).
  virtual absl::StatusOr<SlotHandle> Allocate(uint64_t bytes) = 0;
  // Thread-safe. Returns the slot to the tier; InvalidArgument for a slot
  // that is not allocated.
  virtual absl::Status Free(SlotHandle slot) = 0;
  // Thread-safe. Bytes the slot holds (0 for an unknown slot).
  virtual uint64_t SlotBytes(SlotHandle slot) const = 0;
  // Thread-safe. Stores src (the block `meta` describes) in the slot; src may
  // be reused once Write returns. `done` runs exactly once, on a tier thread
  // or inline: OK once the block is durable where the tier is durable.
  virtual void Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, IoPriority prio,
                     IoCallback done) = 0;
  // Thread-safe. Copies the block `meta` describes from the slot into dst;
  // `done` as for Write. DataLoss when the slot does not hold exactly that
  // block intact (checksum, key, generation): such a block is never served.
  // On failure dst's contents are unspecified.
  virtual void Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, IoPriority prio,
                    IoCallback done) = 0;
  // Thread-safe.
  virtual TierUsage Usage() const = 0;
  // Thread-safe.
  virtual TierHealth Health() const = 0;
};

// Forwards everything to a wrapped tier; override what a test decorates.
class TierWrapper : public Tier {
 public:
  explicit TierWrapper(Tier* target) : target_(target) {}
  TierKind kind() const override { return target_->kind(); }
  absl::StatusOr<SlotHandle> Allocate(uint64_t bytes) override { return target_->Allocate(bytes); }
  absl::Status Free(SlotHandle slot) override { return target_->Free(slot); }
  uint64_t SlotBytes(SlotHandle slot) const override { return target_->SlotBytes(slot); }
  void Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, IoPriority prio,
             IoCallback done) override {
    target_->Write(slot, meta, src, prio, std::move(done));
  }
  void Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, IoPriority prio,
            IoCallback done) override {
    target_->Read(slot, meta, dst, prio, std::move(done));
  }
  TierUsage Usage() const override { return target_->Usage(); }
  TierHealth Health() const override { return target_->Health(); }
  Tier* target() const { return target_; }

 private:
  Tier* const target_;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_TIER_H_
