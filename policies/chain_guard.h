// SPDX-License-Identifier: Apache-2.0
// Leaves before parents, whatever the policy. A block is only ever hit as
// part of a prefix, so a block whose parent is gone is worth nothing while it
// takes room: a tier wraps its policy in a ChainGuard and tells it each
// block's parent. When the policy picks a block that still has resident
// children, the guard takes a leaf of that block's subtree instead: the
// policy judged the subtree cold, and it goes from its leaves up.
//
// A policy whose victim choice changes its own state (W-TinyLFU's admission
// duel) is instead offered only childless blocks. Each way was measured on
// the Mooncake trace (token hit rate at 1M / 3M / 10M tokens): offering only
// childless blocks costs S3-FIFO a fifth of its hits at 3M (0.169 -> 0.139:
// it promotes the parents it may not evict), and taking a leaf under
// TinyLFU's choice costs it at 1M (0.109 -> 0.089: its duel already moved
// the window's block into main).
//
// Recency-ordered policies already evict leaves first when the tier touches a
// chain leaves first (a parent is then always more recent than its
// children); admission filters do not (W-TinyLFU can admit a child to its
// main part and evict the parent from its window). The guard makes it a
// property of every tier instead of a habit of some policies.
//
// Memory: 24 bytes per handle (its key, its parent's key, and its place in
// the list its parent's children are filed in), 16 when the caller keeps
// the keys (a host tier's slots know their blocks), and, at the most
// children filed so far, 1 to 2 per child (a power-of-two table of the
// lists' ends).
// Children as a vector per parent cost ~75 bytes per block on chains; the
// same links with a hash map from parent to list, ~43. A 32-bit tag of the
// parent instead of its key (20 bytes) was tried: two blocks of one chain
// whose tags agreed (a chance of 2^-31 a pair, and a long chain has many
// pairs) each seemed to have the other's children, and neither could ever
// be evicted.
#ifndef KVTIER_POLICIES_CHAIN_GUARD_H_
#define KVTIER_POLICIES_CHAIN_GUARD_H_

#include <cassert>
#include <cstdint>
#include <memory>
#include <vector>

#include "policies/eviction_policy.h"

namespace kvtier {

class ChainGuard final : public EvictionPolicy, private HandleKeys {
 public:
  // Shares its keys with the inner policy (EvictionPolicy::ShareKeys).
  // `keys`: where the tracked handles' identities are kept when the caller
  // keeps them already (a host tier's slot table names each slot's block);
  // it must outlive the guard, and every insert's key_hash must be
  // keys->KeyOf(handle) from that insert until after the handle's Remove.
  // nullptr: the guard keeps them, 8 bytes a handle.
  explicit ChainGuard(std::unique_ptr<EvictionPolicy> inner, const HandleKeys* keys = nullptr)
      : inner_(std::move(inner)), external_(keys) {
    inner_->ShareKeys(this);
  }

  // As InsertWithKey, naming the parent's identity (0: a root, or not known;
  // such a block constrains nothing).
  // position_tokens: as EvictionPolicy::InsertAt.
  void InsertInChain(uint32_t handle, uint64_t key_hash, uint64_t parent_key_hash, uint64_t position_tokens = 0);

  void Insert(uint32_t handle) override { InsertInChain(handle, 0, 0); }
  void InsertWithKey(uint32_t handle, uint64_t key_hash) override { InsertInChain(handle, key_hash, 0); }
  void InsertAt(uint32_t handle, uint64_t key_hash, uint64_t position_tokens) override {
    InsertInChain(handle, key_hash, 0, position_tokens);
  }
  void Touch(uint32_t handle) override { inner_->Touch(handle); }
  void Remove(uint32_t handle) override;
  // The inner policy's choice, or a leaf under it; never a block with a
  // resident child.
  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override;
  bool Contains(uint32_t handle) const override { return inner_->Contains(handle); }
  size_t size() const override { return inner_->size(); }
  size_t bookkeeping() const override { return inner_->bookkeeping() + lists_; }
  absl::string_view name() const override { return inner_->name(); }
  bool ObservesRequests() const override { return inner_->ObservesRequests(); }
  void ObserveRequest(std::span<const uint64_t> chain, std::span<const uint32_t> depths, uint32_t block_tokens,
                      size_t held) override {
    inner_->ObserveRequest(chain, depths, block_tokens, held);
  }

  EvictionPolicy* inner() const { return inner_.get(); }
  // Resident children of the block with this identity.
  uint32_t children(uint64_t key_hash) const;

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  static constexpr uint64_t kMix = 0x9e3779b97f4a7c15ull;
  struct Links {
    uint64_t parent = 0;                // the parent's key; 0: none
    uint32_t prev = kNil, next = kNil;  // in the list it is filed in
  };
  // A child is filed in the list at heads_[Head(parent)], the top bits of a
  // multiplicative hash of its parent's key; the table has a list per two to
  // four children, so lists stay short, and when it doubles every child is
  // filed again. Parents that share a list are told apart by their keys.
  // Lists keep the order a vector with swap-and-pop removal would have,
  // except that in a shared list a child of one parent may take the place of
  // a removed child of another (which leaf of a subtree goes first may then
  // differ; a parent still never goes before its children).
  uint32_t Head(uint64_t parent) const {
    return head_bits_ == 0 ? 0 : static_cast<uint32_t>((parent * kMix) >> (64 - head_bits_));
  }
  void File(uint32_t h, uint64_t parent);  // as the last of its list
  void Unfile(uint32_t h);
  void GrowHeads();  // twice the lists; every child filed again
  template <typename F>
  void ForEachChild(uint64_t key, F f) const;
  bool HasKids(uint32_t h) const;
  uint64_t KeyOf(uint32_t h) const override {
    if (external_ != nullptr) return external_->KeyOf(h);
    return h < keys_.size() ? keys_[h] : 0;
  }

  std::unique_ptr<EvictionPolicy> inner_;
  const HandleKeys* const external_;  // or nullptr: keys_
  std::vector<uint64_t> keys_;    // by handle, unless external_
  std::vector<Links> links_;      // by handle
  std::vector<uint32_t> heads_;   // 2^head_bits_ lists' last child (kNil: empty)
  uint32_t head_bits_ = 0;     // at most 31
  size_t filed_ = 0;              // children filed
  size_t lists_ = 0;              // non-empty lists
};

}  // namespace kvtier

#endif  // KVTIER_POLICIES_CHAIN_GUARD_H_
