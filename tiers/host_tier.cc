// SPDX-License-Identifier: Apache-2.0
#include "tiers/host_tier.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "core/units.h"

namespace kvtier {

absl::string_view TierHealthName(TierHealth h) {
  switch (h) {
    case TierHealth::kHealthy: return "healthy";
    case TierHealth::kDegraded: return "degraded";
    case TierHealth::kFailed: return "failed";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Create(const HostTierOptions& opts) {
  constexpr uint64_t kMaxArena = kPage * UINT32_MAX;  // page index fits in 32 bits
  if (opts.capacity_bytes < kPage || opts.capacity_bytes > kMaxArena) {
    return absl::InvalidArgumentError(absl::StrCat("host tier capacity must be 4 KiB..16 TiB, got ",
                                                   FormatBytes(opts.capacity_bytes)));
  }
  const uint64_t bytes = opts.capacity_bytes / kPage * kPage;
  ASSIGN_OR_RETURN(UniqueFd fd, os::CreateSealedMemfd(opts.name, bytes));
  ASSIGN_OR_RETURN(os::MappedRegion region, os::MappedRegion::Map(fd.get(), bytes, opts.prefault));
  return std::unique_ptr<HostTier>(new HostTier(std::move(fd), std::move(region), bytes));
}

HostTier::HostTier(UniqueFd fd, os::MappedRegion region, uint64_t capacity)
    : fd_(std::move(fd)), region_(std::move(region)), slots_(capacity, kPage) {}

absl::StatusOr<SlotHandle> HostTier::Allocate(uint64_t bytes) {
  MutexLock l(&mu_);
  return slots_.Allocate(bytes);
}

absl::Status HostTier::Free(SlotHandle slot) {
  MutexLock l(&mu_);
  return slots_.Free(slot);
}

uint64_t HostTier::SlotBytes(SlotHandle slot) const {
  MutexLock l(&mu_);
  return slots_.IsAllocated(slot) ? slots_.Bytes(slot) : 0;
}

uint64_t HostTier::ArenaOffset(SlotHandle slot) const {
  MutexLock l(&mu_);
  return slots_.Offset(slot);
}

std::pair<uint64_t, uint64_t> HostTier::SlotRange(SlotHandle slot) const {
  MutexLock l(&mu_);
  if (!slots_.IsAllocated(slot)) return {0, 0};
  return {slots_.Offset(slot), slots_.Bytes(slot)};
}

void HostTier::Write(SlotHandle slot, const BlockMeta&, std::span<const std::byte> src, IoPriority,
                     IoCallback done) {
  const auto [off, size] = SlotRange(slot);
  if (size == 0 || src.size() > size) {
    std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("write of ", src.size(), " bytes to host slot ", slot, " of ", size, " bytes")));
    return;
  }
  if (!src.empty()) std::memcpy(region_.data() + off, src.data(), src.size());
  std::move(done)(absl::OkStatus());
}

void HostTier::Read(SlotHandle slot, const BlockMeta&, std::span<std::byte> dst, IoPriority, IoCallback done) {
  const auto [off, size] = SlotRange(slot);
  if (size == 0 || dst.size() > size) {
    std::move(done)(absl::InvalidArgumentError(
        absl::StrCat("read of ", dst.size(), " bytes from host slot ", slot, " of ", size, " bytes")));
    return;
  }
  if (!dst.empty()) std::memcpy(dst.data(), region_.data() + off, dst.size());
  std::move(done)(absl::OkStatus());
}

std::vector<SlotAllocator::ClassUsage> HostTier::Classes() const {
  MutexLock l(&mu_);
  return slots_.Classes();
}

std::vector<std::pair<uint32_t, uint32_t>> HostTier::LiveSlotsOutsideClass(uint64_t bytes) const {
  MutexLock l(&mu_);
  return slots_.LiveSlotsOutsideClass(bytes);
}

uint64_t HostTier::SlotsPerSegment(uint64_t bytes) const {
  MutexLock l(&mu_);
  return slots_.SlotsPerSegment(bytes);
}

TierUsage HostTier::Usage() const {
  MutexLock l(&mu_);
  return TierUsage{slots_.capacity_bytes(), slots_.used_bytes(), slots_.used_slots(),
                   slots_.free_slots()};
}

}  // namespace kvtier
