// SPDX-License-Identifier: Apache-2.0
// What the store knows about each slot of one tenant's host tier: the block
// that owns it, the tokens it holds (summed for the tenant's token quota),
// and when it was last stored or hit on the tenant's own clock (to compare
// blocks of different sizes, whose policies are separate). Guarded by the
// tenant's tier lock, as the tier's allocations are.
//
// 10 bytes per slot: a table per field, grown to the highest slot handed out
// (the allocator reuses low handles first). An owner is its record's number
// in the block index (BlockIndex::NumberOf: 4 bytes, not a pointer's 8).
// Tokens take 16 bits; a block of 65,535 tokens or more keeps its count in a
// side map.
#ifndef KVTIER_STORE_HOST_SLOTS_H_
#define KVTIER_STORE_HOST_SLOTS_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "store/block_index.h"
#include "tiers/tier.h"

namespace kvtier {

class HostSlotTable {
 public:
  // Owners are records of `index`, which outlives the table.
  explicit HostSlotTable(BlockIndex* index) : index_(index) {}

  // `slot`, free until now, holds `owner`'s block of `tokens` tokens,
  // stored just now. False (and nothing changes) when the slot has an owner,
  // or for no owner.
  bool Assign(SlotHandle slot, BlockRecord* owner, uint32_t tokens) {
    if (owner == nullptr) return false;
    if (owner_.size() <= slot) {
      owner_.resize(size_t{slot} + 1, BlockIndex::kNoRecord);
      tokens_.resize(owner_.size(), 0);
      tick_.resize(owner_.size(), 0);
    }
    if (owner_[slot] != BlockIndex::kNoRecord) return false;
    owner_[slot] = index_->NumberOf(owner);
    if (announced_.size() > slot) announced_[slot] = false;
    if (tokens >= kBigTokens) {
      tokens_[slot] = kBigTokens;
      big_tokens_[slot] = tokens;
    } else {
      tokens_[slot] = static_cast<uint16_t>(tokens);
    }
    tick_[slot] = ++clock_;
    tokens_held_ += tokens;
    return true;
  }
  // `slot` was freed: it holds nothing and its tokens leave the sum.
  void Release(SlotHandle slot) {
    if (slot >= owner_.size() || owner_[slot] == BlockIndex::kNoRecord) return;
    owner_[slot] = BlockIndex::kNoRecord;
    if (announced_.size() > slot) announced_[slot] = false;
    tokens_held_ -= tokens(slot);
    if (tokens_[slot] == kBigTokens) big_tokens_.erase(slot);
    tokens_[slot] = 0;
  }
  // KV events (events/kv_events.h): `slot`'s block was announced as held in
  // host memory. True the first time, so each copy is announced once.
  bool MarkAnnounced(SlotHandle slot) {
    if (slot >= owner_.size() || owner_[slot] == BlockIndex::kNoRecord) return false;
    if (announced_.size() <= slot) announced_.resize(owner_.size(), false);
    if (announced_[slot]) return false;
    announced_[slot] = true;
    return true;
  }
  bool announced(SlotHandle slot) const { return slot < announced_.size() && announced_[slot]; }
  // `slot`'s copy was announced as removed (before its slot is freed).
  void Unannounce(SlotHandle slot) {
    if (slot < announced_.size()) announced_[slot] = false;
  }
  // `slot`'s block was hit.
  void Touch(SlotHandle slot) {
    if (slot < tick_.size()) tick_[slot] = ++clock_;
  }

  // The block holding `slot`, or nullptr.
  BlockRecord* owner(SlotHandle slot) const {
    return slot < owner_.size() && owner_[slot] != BlockIndex::kNoRecord ? index_->Numbered(owner_[slot]) : nullptr;
  }
  // The tokens of `slot`'s block (0: none).
  uint32_t tokens(SlotHandle slot) const {
    if (slot >= tokens_.size()) return 0;
    if (tokens_[slot] != kBigTokens) return tokens_[slot];
    auto it = big_tokens_.find(slot);
    return it == big_tokens_.end() ? 0 : it->second;
  }
  // Stores and hits since `slot`'s block was last stored or hit. Ticks are
  // 32 bits and ages are taken modulo 2^32: right while a block is under 4
  // billion stores and hits old.
  uint32_t age(SlotHandle slot) const { return slot < tick_.size() ? clock_ - tick_[slot] : 0; }
  // Tokens of every block held (the tenant's host_tokens).
  uint64_t tokens_held() const { return tokens_held_; }

  // Calls f(BlockRecord*) for each slot's owner.
  template <typename F>
  void ForEachOwner(F f) const {
    for (uint32_t n : owner_) {
      if (n != BlockIndex::kNoRecord) f(index_->Numbered(n));
    }
  }

 private:
  BlockIndex* const index_;
  std::vector<uint32_t> owner_;      // by slot: a record's number, or kNoRecord
  static constexpr uint16_t kBigTokens = UINT16_MAX;
  std::vector<uint16_t> tokens_;     // by slot; kBigTokens: in big_tokens_
  absl::flat_hash_map<SlotHandle, uint32_t> big_tokens_;
  std::vector<uint32_t> tick_;       // by slot
  std::vector<bool> announced_;      // by slot, only while KV events are on
  uint32_t clock_ = 0;
  uint64_t tokens_held_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_STORE_HOST_SLOTS_H_
