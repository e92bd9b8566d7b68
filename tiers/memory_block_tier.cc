// SPDX-License-Identifier: Apache-2.0
#include "tiers/memory_block_tier.h"

#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/units.h"

namespace kvtier {

absl::StatusOr<std::unique_ptr<MemoryBlockTier>> MemoryBlockTier::Create(const MemoryBlockTierOptions& opts) {
  if (opts.capacity_bytes == 0) return absl::InvalidArgumentError("a memory block tier needs a capacity above 0");
  if (opts.max_block_bytes == 0) return absl::InvalidArgumentError("a memory block tier needs max_block_bytes above 0");
  return std::unique_ptr<MemoryBlockTier>(new MemoryBlockTier(opts));
}

MemoryBlockTier::MemoryBlockTier(const MemoryBlockTierOptions& opts) : opts_(opts), worker_([this] { Run(); }) {}

MemoryBlockTier::~MemoryBlockTier() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    paused_ = false;
  }
  cv_.notify_all();
  worker_.join();
}

absl::StatusOr<BlockLocator> MemoryBlockTier::Reserve(const BlockMeta& meta) {
  const uint64_t bytes = meta.payload_bytes;
  if (absl::Status s = CheckBlockBytes(opts_.name, bytes, opts_.max_block_bytes); !s.ok()) return s;
  if (opts_.shared) return kKeyAddressed;
  MutexLock l(&mu_);
  if (used_bytes_ + bytes > opts_.capacity_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the ", opts_.name, " tier is full"));
  }
  BlockLocator h;
  if (!free_.empty()) {
    h = free_.back();
    free_.pop_back();
  } else {
    h = static_cast<BlockLocator>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[h];
  s.bytes = bytes;
  s.generation = ++last_generation_;
  s.allocated = true;
  s.written = false;
  used_bytes_ += bytes;
  ++used_slots_;
  return h;
}

absl::Status MemoryBlockTier::Remove(BlockLocator slot, const BlockMeta&) {
  if (opts_.shared) return absl::OkStatus();  // the value is the cluster's
  MutexLock l(&mu_);
  if (!LiveLocked(slot)) return absl::InvalidArgumentError(absl::StrCat(opts_.name, " slot ", slot, " is not allocated"));
  Slot& s = slots_[slot];
  used_bytes_ -= s.bytes;
  --used_slots_;
  s = Slot{};
  free_.push_back(slot);
  return absl::OkStatus();
}

uint64_t MemoryBlockTier::CostOf(BlockLocator slot) const {
  MutexLock l(&mu_);
  return !opts_.shared && LiveLocked(slot) ? slots_[slot].bytes : 0;
}

bool MemoryBlockTier::LiveLocked(BlockLocator slot) const { return slot < slots_.size() && slots_[slot].allocated; }

void MemoryBlockTier::Put(BlockLocator slot, const BlockMeta& meta, std::span<const std::byte> src,
                          const IoOptions& io, IoCallback done) {
  Op op{.write = true, .slot = slot, .meta = meta, .io = io, .done = std::move(done)};
  absl::Status refused;
  if (src.empty() || src.size() > opts_.max_block_bytes || meta.payload_bytes != src.size()) {
    refused = absl::InvalidArgumentError(absl::StrCat("a block of ", src.size(), " bytes (", meta.payload_bytes,
                                                      " in its meta) does not fit the ", opts_.name, " tier"));
  } else if (!opts_.shared) {
    MutexLock l(&mu_);
    if (!LiveLocked(slot)) {
      refused = absl::InvalidArgumentError(absl::StrCat("write to ", opts_.name, " slot ", slot,
                                                        ", which is not allocated"));
    } else if (src.size() > slots_[slot].bytes) {
      refused = absl::InvalidArgumentError(absl::StrCat("a block of ", src.size(), " bytes does not fit ", opts_.name,
                                                        " slot ", slot, " of ", slots_[slot].bytes, " bytes"));
    } else {
      op.generation = slots_[slot].generation;
    }
  }
  // Callbacks never run under the tier's lock: they may call back into it.
  if (!refused.ok()) {
    std::move(op.done)(refused);
    return;
  }
  op.src.assign(src.begin(), src.end());
  Enqueue(std::move(op));
}

void MemoryBlockTier::Get(BlockLocator slot, const BlockMeta& meta, std::span<std::byte> dst, const IoOptions& io,
                          IoCallback done) {
  Op op{.write = false, .slot = slot, .meta = meta, .dst = dst, .io = io, .done = std::move(done)};
  bool live = true;
  if (!opts_.shared) {
    MutexLock l(&mu_);
    live = LiveLocked(slot);
    if (live) op.generation = slots_[slot].generation;
  }
  if (!live) {
    std::move(op.done)(absl::NotFoundError(absl::StrCat(opts_.name, " slot ", slot, " holds no block")));
    return;
  }
  Enqueue(std::move(op));
}

void MemoryBlockTier::Enqueue(Op op) {
  {
    MutexLock l(&mu_);
    if (op.write) {
      op.write_seq = ++last_write_seq_;
      unfinished_writes_.insert(op.write_seq);
    }
    queue_[static_cast<int>(op.io.prio)].push_back(std::move(op));
    ++queued_;
  }
  cv_.notify_all();
}

void MemoryBlockTier::Run() {
  for (;;) {
    Op op;
    {
      MutexLock l(&mu_);
      mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_ || (!paused_ && queued_ > 0); });
      if (queued_ == 0) return;  // stopping, and everything ran
      for (auto& q : queue_) {
        if (!q.empty()) {
          op = std::move(q.front());
          q.pop_front();
          break;
        }
      }
      --queued_;
      running_ = true;
    }
    absl::Status st;
    if (const int32_t abandon = AbandonReason(op.io.deadline_ns, op.io.cancel); abandon != 0) {
      abandoned_.fetch_add(1, std::memory_order_relaxed);
      st = AbandonedStatus(abandon, absl::StrCat(opts_.name, op.write ? " write" : " read"));
    } else {
      in_flight_.fetch_add(1, std::memory_order_relaxed);
      const uint64_t start = MonotonicNanos();
      if (opts_.op_latency_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(opts_.op_latency_ns));
      st = Execute(op);
      in_flight_.fetch_sub(1, std::memory_order_relaxed);
      if (st.ok() && !op.write && read_observer_) read_observer_(op.dst.size(), IoTiming{MonotonicNanos() - start, 1});
    }
    std::move(op.done)(st);
    {
      MutexLock l(&mu_);
      if (op.write) unfinished_writes_.erase(op.write_seq);
      running_ = false;
    }
    cv_.notify_all();
  }
}

absl::Status MemoryBlockTier::Execute(Op& op) {
  MutexLock l(&mu_);
  const bool same = opts_.shared || (LiveLocked(op.slot) && slots_[op.slot].generation == op.generation);
  if (op.write) {
    if (!same) return absl::CancelledError(absl::StrCat(opts_.name, " slot was freed during the write"));
    const uint64_t only = fail_writes_tenant_.load(std::memory_order_relaxed);
    if (fail_writes_.load(std::memory_order_relaxed) && (only == 0 || only == op.meta.tenant_hash)) {
      return absl::UnavailableError(absl::StrCat(opts_.name, " refuses writes (a test's FailWrites)"));
    }
    Slot& s = opts_.shared ? values_[KeyOf(op.meta)] : slots_[op.slot];
    s.data = std::move(op.src);
    s.meta = op.meta;
    s.xxh3 = XXH3_64bits(s.data.data(), s.data.size());
    s.written = true;
    writes_.fetch_add(1, std::memory_order_relaxed);
    bytes_written_.fetch_add(s.data.size(), std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (!same) return absl::NotFoundError(absl::StrCat(opts_.name, " slot ", op.slot, " was freed before the read"));
  const Slot* found = nullptr;
  if (opts_.shared) {
    auto it = values_.find(KeyOf(op.meta));
    if (it == values_.end()) return absl::NotFoundError(absl::StrCat("the block is not in the ", opts_.name, " tier"));
    found = &it->second;
  } else {
    found = &slots_[op.slot];
  }
  const Slot& s = *found;
  const bool ok = s.written && s.meta.ns == op.meta.ns && s.meta.key == op.meta.key &&
                  s.data.size() == op.dst.size() && op.meta.payload_bytes == op.dst.size() &&
                  XXH3_64bits(s.data.data(), s.data.size()) == s.xxh3;
  if (!ok) {
    checksum_failures_.fetch_add(1, std::memory_order_relaxed);
    return absl::DataLossError(
        absl::StrCat("the ", opts_.name, " tier does not hold that block intact; the block is not served"));
  }
  std::memcpy(op.dst.data(), s.data.data(), s.data.size());
  reads_.fetch_add(1, std::memory_order_relaxed);
  bytes_read_.fetch_add(s.data.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status MemoryBlockTier::Sync() {
  MutexLock l(&mu_);
  // The writes queued so far, not those queued while we wait: under steady
  // traffic the tier is never idle.
  const uint64_t target = last_write_seq_;
  mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return unfinished_writes_.empty() || *unfinished_writes_.begin() > target;
  });
  return absl::OkStatus();
}

void MemoryBlockTier::Drain() {
  MutexLock l(&mu_);
  mu_.Await(cv_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return queued_ == 0 && !running_; });
}

TierUsage MemoryBlockTier::Usage() const {
  MutexLock l(&mu_);
  return TierUsage{opts_.capacity_bytes, used_bytes_, used_slots_, free_.size()};
}

BlockTierStats MemoryBlockTier::BlockStats() const {
  const TierUsage u = Usage();
  uint64_t queued;
  {
    MutexLock l(&mu_);
    queued = queued_;
  }
  return BlockTierStats{.capacity_bytes = u.capacity_bytes,
                        .used_bytes = u.used_bytes,
                        .used_slots = u.used_slots,
                        .reads = reads_.load(std::memory_order_relaxed),
                        .writes = writes_.load(std::memory_order_relaxed),
                        .bytes_read = bytes_read_.load(std::memory_order_relaxed),
                        .bytes_written = bytes_written_.load(std::memory_order_relaxed),
                        .in_flight = in_flight_.load(std::memory_order_relaxed),
                        .queued = queued,
                        .checksum_failures = checksum_failures_.load(std::memory_order_relaxed),
                        .abandoned = abandoned_.load(std::memory_order_relaxed)};
}

absl::Status MemoryBlockTier::CorruptValue(const BlockMeta& meta, uint64_t offset) {
  MutexLock l(&mu_);
  auto it = values_.find(KeyOf(meta));
  if (it == values_.end() || offset >= it->second.data.size()) {
    return absl::InvalidArgumentError("no written value byte there");
  }
  it->second.data[offset] ^= std::byte{0x5a};
  return absl::OkStatus();
}

absl::Status MemoryBlockTier::CorruptPayload(BlockLocator slot, uint64_t offset) {
  MutexLock l(&mu_);
  if (!LiveLocked(slot) || !slots_[slot].written || offset >= slots_[slot].data.size()) {
    return absl::InvalidArgumentError("no written payload byte there");
  }
  slots_[slot].data[offset] ^= std::byte{0x5a};
  return absl::OkStatus();
}

void MemoryBlockTier::Exists(std::span<const BlockMeta> metas, absl::AnyInvocable<void(std::vector<bool>) &&> done,
                             uint64_t deadline_ns) {
  (void)deadline_ns;
  // A round trip of op_latency_ns, taken on the caller's thread.
  if (opts_.op_latency_ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(opts_.op_latency_ns));
  std::vector<bool> present(metas.size(), false);
  {
    MutexLock l(&mu_);
    if (opts_.shared) {
      for (size_t i = 0; i < metas.size(); ++i) {
        auto it = values_.find(KeyOf(metas[i]));
        present[i] = it != values_.end() && it->second.meta.payload_bytes == metas[i].payload_bytes;
      }
    }
    if (hold_exists_) {
      held_exists_.emplace_back(std::move(done), std::move(present));
      return;
    }
  }
  std::move(done)(std::move(present));
}

void MemoryBlockTier::HoldExists(bool hold) {
  std::vector<std::pair<absl::AnyInvocable<void(std::vector<bool>) &&>, std::vector<bool>>> release;
  {
    MutexLock l(&mu_);
    hold_exists_ = hold;
    if (!hold) release.swap(held_exists_);
  }
  for (auto& [done, present] : release) std::move(done)(std::move(present));
}

void MemoryBlockTier::Pause() {
  MutexLock l(&mu_);
  paused_ = true;
}

void MemoryBlockTier::Resume() {
  {
    MutexLock l(&mu_);
    paused_ = false;
  }
  cv_.notify_all();
}

}  // namespace kvtier
