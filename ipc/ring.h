// SPDX-License-Identifier: Apache-2.0
// Single-producer/single-consumer rings of fixed-size records in shared
// memory. Indices are free-running uint32 counters; slot = index & (entries-1).
// The producer owns tail, the consumer owns head; each keeps its own copy and
// only publishes it, so a peer that scribbles over an index it does not own
// cannot steer this side out of bounds.
#ifndef KVTIER_IPC_RING_H_
#define KVTIER_IPC_RING_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kvtier::ipc {

template <typename Record>
class RingProducer {
  static_assert(std::is_trivially_copyable_v<Record>);

 public:
  RingProducer() = default;
  // `slots` holds `entries` records (a power of two). Thread contract: one
  // producing thread.
  RingProducer(Record* slots, uint32_t entries, std::atomic<uint32_t>* head,
               std::atomic<uint32_t>* tail)
      : slots_(slots), mask_(entries - 1), entries_(entries), head_(head), tail_(tail),
        local_tail_(tail->load(std::memory_order_relaxed)) {}

  // Copies r into the ring and publishes it; false when full.
  bool TryPush(const Record& r) {
    if (local_tail_ - cached_head_ >= entries_) {
      cached_head_ = head_->load(std::memory_order_acquire);
      // A head that claims to be ahead of our tail is a corrupt peer: treat
      // the ring as full rather than overwrite unread records.
      if (local_tail_ - cached_head_ >= entries_) return false;
    }
    std::memcpy(&slots_[local_tail_ & mask_], &r, sizeof(Record));
    ++local_tail_;
    // seq_cst, not just release: the doorbell handshake (publish tail, then
    // read the peer's "sleeping" flag; the peer sets its flag, then reads the
    // tail) needs both sides' store-then-load in one total order, or a wake-up
    // can be lost. An xchg costs nanoseconds here.
    tail_->store(local_tail_, std::memory_order_seq_cst);
    return true;
  }

  // Records pushed but not yet consumed, as far as this side knows.
  uint32_t InFlight() {
    cached_head_ = head_->load(std::memory_order_acquire);
    return local_tail_ - cached_head_;
  }
  uint32_t tail() const { return local_tail_; }
  std::atomic<uint32_t>* tail_word() const { return tail_; }
  uint32_t entries() const { return entries_; }

 private:
  Record* slots_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t entries_ = 0;
  std::atomic<uint32_t>* head_ = nullptr;
  std::atomic<uint32_t>* tail_ = nullptr;
  uint32_t local_tail_ = 0;
  uint32_t cached_head_ = 0;
};

enum class PopResult { kOk, kEmpty, kCorrupt };

template <typename Record>
class RingConsumer {
  static_assert(std::is_trivially_copyable_v<Record>);

 public:
  RingConsumer() = default;
  // Thread contract: one consuming thread.
  RingConsumer(Record* slots, uint32_t entries, std::atomic<uint32_t>* head,
               std::atomic<uint32_t>* tail)
      : slots_(slots), mask_(entries - 1), entries_(entries), head_(head), tail_(tail),
        local_head_(head->load(std::memory_order_relaxed)) {}

  // Copies the oldest record out. kCorrupt when the producer's tail is more
  // than `entries` ahead of head (it can only be, if the peer is broken).
  PopResult TryPop(Record* out) {
    const uint32_t tail = tail_->load(std::memory_order_acquire);
    const uint32_t avail = tail - local_head_;
    if (avail == 0) return PopResult::kEmpty;
    if (avail > entries_) return PopResult::kCorrupt;
    std::memcpy(out, &slots_[local_head_ & mask_], sizeof(Record));
    ++local_head_;
    head_->store(local_head_, std::memory_order_release);
    return PopResult::kOk;
  }

  // True when a record is (or appears to be) waiting. seq_cst: the sleeping
  // side's re-check in the doorbell handshake (see RingProducer::TryPush).
  bool HasPending() const { return tail_->load(std::memory_order_seq_cst) != local_head_; }
  uint32_t head() const { return local_head_; }
  uint32_t entries() const { return entries_; }

 private:
  Record* slots_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t entries_ = 0;
  std::atomic<uint32_t>* head_ = nullptr;
  std::atomic<uint32_t>* tail_ = nullptr;
  uint32_t local_head_ = 0;
};

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_RING_H_
