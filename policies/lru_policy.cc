// SPDX-License-Identifier: Apache-2.0
// LRU as an intrusive doubly linked list over slot handles: two uint32 links
// per slot, O(1) insert/touch/remove, victims from the cold end.
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  void Insert(uint32_t h) override {
    Grow(h);
    if (in_[h]) Unlink(h);
    PushFront(h);
  }
  void Touch(uint32_t h) override {
    if (h < in_.size() && in_[h]) {
      Unlink(h);
      PushFront(h);
    }
  }
  void Remove(uint32_t h) override {
    if (h < in_.size() && in_[h]) Unlink(h);
  }
  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override {
    for (uint32_t h = tail_; h != kNil; h = prev_[h]) {
      if (evictable(h)) return h;
    }
    return std::nullopt;
  }
  bool Contains(uint32_t h) const override { return h < in_.size() && in_[h]; }
  size_t size() const override { return size_; }
  absl::string_view name() const override { return "lru"; }

 private:
  static constexpr uint32_t kNil = UINT32_MAX;

  void Grow(uint32_t h) {
    if (h >= in_.size()) {
      const size_t n = h + 1;
      prev_.resize(n, kNil);
      next_.resize(n, kNil);
      in_.resize(n, 0);
    }
  }
  void PushFront(uint32_t h) {
    prev_[h] = kNil;
    next_[h] = head_;
    if (head_ != kNil) prev_[head_] = h;
    head_ = h;
    if (tail_ == kNil) tail_ = h;
    in_[h] = 1;
    ++size_;
  }
  void Unlink(uint32_t h) {
    if (prev_[h] != kNil) next_[prev_[h]] = next_[h]; else head_ = next_[h];
    if (next_[h] != kNil) prev_[next_[h]] = prev_[h]; else tail_ = prev_[h];
    prev_[h] = next_[h] = kNil;
    in_[h] = 0;
    --size_;
  }

  std::vector<uint32_t> prev_, next_;
  std::vector<uint8_t> in_;
  uint32_t head_ = kNil;  // most recent
  uint32_t tail_ = kNil;  // least recent
  size_t size_ = 0;
};

class SparseLruPolicy final : public EvictionPolicy {
 public:
  void Insert(uint32_t h) override {
    if (links_.contains(h)) Unlink(h);
    PushFront(h);
  }
  void Touch(uint32_t h) override {
    if (links_.contains(h)) {
      Unlink(h);
      PushFront(h);
    }
  }
  void Remove(uint32_t h) override {
    if (links_.contains(h)) Unlink(h);
  }
  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override {
    for (uint32_t h = tail_; h != kNil; h = links_.at(h).prev) {
      if (evictable(h)) return h;
    }
    return std::nullopt;
  }
  bool Contains(uint32_t h) const override { return links_.contains(h); }
  size_t size() const override { return links_.size(); }
  absl::string_view name() const override { return "lru"; }

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  struct Links {
    uint32_t prev = kNil, next = kNil;
  };
  void PushFront(uint32_t h) {
    links_[h] = Links{kNil, head_};
    if (head_ != kNil) links_[head_].prev = h;
    head_ = h;
    if (tail_ == kNil) tail_ = h;
  }
  void Unlink(uint32_t h) {
    const Links l = links_[h];
    if (l.prev != kNil) links_[l.prev].next = l.next; else head_ = l.next;
    if (l.next != kNil) links_[l.next].prev = l.prev; else tail_ = l.prev;
    links_.erase(h);
  }
  absl::flat_hash_map<uint32_t, Links> links_;
  uint32_t head_ = kNil, tail_ = kNil;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }
std::unique_ptr<EvictionPolicy> MakeSparseLruPolicy() { return std::make_unique<SparseLruPolicy>(); }

}  // namespace kvtier
