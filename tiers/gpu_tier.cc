// SPDX-License-Identifier: Apache-2.0
#include "tiers/gpu_tier.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace kvtier {
namespace {

constexpr auto kCopyTimeout = std::chrono::seconds(30);

bool SameBlock(const BlockMeta& a, const BlockMeta& b) {
  return a.ns == b.ns && a.key == b.key && a.payload_bytes == b.payload_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuTier>> GpuTier::Create(DeviceBackend* device, const GpuTierOptions& opts) {
  if (opts.capacity_bytes == 0) return absl::InvalidArgumentError("a GPU tier of 0 bytes");
  ASSIGN_OR_RETURN(void* arena, device->Allocate(opts.capacity_bytes));
  absl::StatusOr<DeviceStream> stream = device->CreateStream();
  if (!stream.ok()) {
    (void)device->Free(arena);
    return stream.status();
  }
  absl::StatusOr<DeviceEvent> event = device->CreateEvent();
  if (!event.ok()) {
    (void)device->DestroyStream(*stream);
    (void)device->Free(arena);
    return event.status();
  }
  return std::unique_ptr<GpuTier>(
      new GpuTier(device, static_cast<std::byte*>(arena), opts.capacity_bytes, *stream, *event));
}

GpuTier::GpuTier(DeviceBackend* device, std::byte* arena, uint64_t capacity, DeviceStream stream, DeviceEvent event)
    : device_(device), arena_(arena), capacity_(capacity), slots_(capacity), stream_(stream), event_(event) {}

GpuTier::~GpuTier() {
  (void)device_->DestroyEvent(event_);
  (void)device_->DestroyStream(stream_);
  (void)device_->Free(arena_);
}

absl::StatusOr<SlotHandle> GpuTier::Allocate(uint64_t bytes) {
  MutexLock l(&mu_);
  absl::StatusOr<uint32_t> slot = slots_.Allocate(bytes);
  if (!slot.ok()) return slot.status();
  if (held_.size() <= *slot) {
    held_.resize(*slot + 1);
    written_.resize(*slot + 1);
  }
  written_[*slot] = false;
  return *slot;
}

absl::Status GpuTier::Free(SlotHandle slot) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(slots_.Free(slot));
  written_[slot] = false;
  return absl::OkStatus();
}

uint64_t GpuTier::SlotBytes(SlotHandle slot) const {
  MutexLock l(&mu_);
  return slots_.IsAllocated(slot) ? slots_.Bytes(slot) : 0;
}

std::byte* GpuTier::SlotData(SlotHandle slot) const {
  MutexLock l(&mu_);
  return slots_.IsAllocated(slot) ? arena_ + slots_.Offset(slot) : nullptr;
}

uint64_t GpuTier::ArenaOffset(SlotHandle slot) const {
  MutexLock l(&mu_);
  return slots_.IsAllocated(slot) ? slots_.Offset(slot) : 0;
}

absl::StatusOr<IpcMemHandle> GpuTier::ExportArena() const { return device_->ExportMemory(arena_); }

absl::Status GpuTier::Copy(void* dst, const void* src, uint64_t bytes) {
  MutexLock l(&copy_mu_);
  RETURN_IF_ERROR(device_->CopyAsync(dst, src, bytes, stream_));
  RETURN_IF_ERROR(device_->RecordEvent(event_, stream_));
  return device_->WaitEvent(event_, kCopyTimeout);
}

void GpuTier::Write(SlotHandle slot, const BlockMeta& meta, std::span<const std::byte> src, IoPriority,
                    IoCallback done) {
  std::byte* dst;
  {
    MutexLock l(&mu_);
    if (!slots_.IsAllocated(slot)) {
      std::move(done)(absl::InvalidArgumentError(absl::StrCat("GPU tier write to free slot ", slot)));
      return;
    }
    if (src.size() > slots_.Bytes(slot)) {
      std::move(done)(absl::InvalidArgumentError(
          absl::StrCat("a ", src.size(), "-byte block does not fit a ", slots_.Bytes(slot), "-byte GPU slot")));
      return;
    }
    dst = arena_ + slots_.Offset(slot);
    written_[slot] = false;  // unreadable until the copy lands
  }
  absl::Status st = Copy(dst, src.data(), src.size());
  {
    MutexLock l(&mu_);
    if (st.ok() && slots_.IsAllocated(slot)) {
      held_[slot] = meta;
      held_[slot].payload_bytes = src.size();
      written_[slot] = true;
    }
    if (!st.ok()) ++copy_errors_;
  }
  std::move(done)(st);
}

void GpuTier::Read(SlotHandle slot, const BlockMeta& meta, std::span<std::byte> dst, IoPriority, IoCallback done) {
  const std::byte* src;
  {
    MutexLock l(&mu_);
    BlockMeta want = meta;
    want.payload_bytes = dst.size();
    if (!slots_.IsAllocated(slot) || !written_[slot] || !SameBlock(held_[slot], want)) {
      std::move(done)(absl::DataLossError(absl::StrCat("GPU slot ", slot, " does not hold the block asked for")));
      return;
    }
    src = arena_ + slots_.Offset(slot);
  }
  absl::Status st = Copy(dst.data(), src, dst.size());
  if (!st.ok()) {
    MutexLock l(&mu_);
    ++copy_errors_;
  }
  std::move(done)(st);
}

TierUsage GpuTier::Usage() const {
  MutexLock l(&mu_);
  return TierUsage{capacity_, slots_.used_bytes(), slots_.used_slots(), slots_.free_slots()};
}

TierHealth GpuTier::Health() const {
  MutexLock l(&mu_);
  return copy_errors_ == 0 ? TierHealth::kHealthy : TierHealth::kDegraded;
}

}  // namespace kvtier
