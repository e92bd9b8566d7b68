// SPDX-License-Identifier: Apache-2.0
// ARC (Megiddo, Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache",
// FAST '03) over slot handles. T1 holds blocks used once since they entered,
// T2 blocks used at least twice; B1 and B2 remember the keys of blocks
// evicted from each. A block that comes back while its key is in B1 says T1
// was too small: the target share p of T1 grows; one found in B2 shrinks it.
// Victims come from T1 while it holds more than p blocks, else from T2, each
// from its least recently used end.
//
// Differences from the paper, forced by the tier's protocol: the tier
// inserts first and asks for a victim after (so the "incoming key is in B2"
// tie-break of REPLACE is not known at victim time and is left out), blocks
// can be removed without being evicted (their keys still become ghosts, as
// S3-FIFO's do), and the cache size c is the number of tracked blocks, which
// is the tier's capacity once it is full.
//
// Handles are dense (0..n): 9 bytes per handle (links and list) when a
// ChainGuard shares its keys, 17 otherwise; ghosts are at most 2c keys.
// Victim search walks from the cold end past blocks the caller refuses
// without moving them (as LRU does).
#include <algorithm>
#include <vector>

#include "policies/eviction_policy.h"
#include "policies/ghost_fifo.h"

namespace kvtier {
namespace {

class ArcPolicy final : public EvictionPolicy {
 public:
  void Insert(uint32_t h) override { InsertWithKey(h, 0); }

  void InsertWithKey(uint32_t h, uint64_t key) override {
    Grow(h);
    if (list_[h] != kNone) {
      Touch(h);
      return;
    }
    if (shared_keys_ == nullptr) key_[h] = key;
    uint8_t to = kT1;
    if (key != 0) {
      const double c = static_cast<double>(std::max<size_t>(size() + 1, 1));
      const double b1 = static_cast<double>(ghosts_[0].size()), b2 = static_cast<double>(ghosts_[1].size());
      if (ghosts_[0].Erase(key)) {
        p_ = std::min(c, p_ + std::max(1.0, b1 > 0 ? b2 / b1 : 1.0));
        to = kT2;
      } else if (ghosts_[1].Erase(key)) {
        p_ = std::max(0.0, p_ - std::max(1.0, b2 > 0 ? b1 / b2 : 1.0));
        to = kT2;
      }
    }
    PushFront(to, h);
  }

  void Touch(uint32_t h) override {
    if (h >= list_.size() || list_[h] == kNone) return;
    Unlink(h);
    PushFront(kT2, h);
  }

  void Remove(uint32_t h) override {
    if (h >= list_.size() || list_[h] == kNone) return;
    const uint8_t from = list_[h];
    Unlink(h);
    const uint64_t key = shared_keys_ != nullptr ? shared_keys_->KeyOf(h) : key_[h];
    if (key != 0) AddGhost(key, from == kT1 ? 0 : 1);
  }

  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override {
    if (size() == 0) return std::nullopt;
    const bool t1_first = size_[kT1] > 0 && (static_cast<double>(size_[kT1]) > p_ || size_[kT2] == 0);
    uint32_t v = Coldest(t1_first ? kT1 : kT2, evictable);
    if (v == kNil) v = Coldest(t1_first ? kT2 : kT1, evictable);
    return v == kNil ? std::nullopt : std::optional<uint32_t>(v);
  }

  bool Contains(uint32_t h) const override { return h < list_.size() && list_[h] != kNone; }
  size_t size() const override { return size_[kT1] + size_[kT2]; }
  size_t bookkeeping() const override { return size() + ghosts_[0].size() + ghosts_[1].size(); }
  absl::string_view name() const override { return "arc"; }
  void ShareKeys(const HandleKeys* keys) override {
    shared_keys_ = keys;
    std::vector<uint64_t>().swap(key_);
  }

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  static constexpr uint8_t kT1 = 0, kT2 = 1, kNone = 2;
  void Grow(uint32_t h) {
    if (h >= list_.size()) {
      if (shared_keys_ == nullptr) key_.resize(h + 1, 0);
      prev_.resize(h + 1, kNil);
      next_.resize(h + 1, kNil);
      list_.resize(h + 1, kNone);
    }
  }
  void PushFront(uint8_t l, uint32_t h) {
    list_[h] = l;
    prev_[h] = kNil;
    next_[h] = head_[l];
    if (head_[l] != kNil) prev_[head_[l]] = h;
    head_[l] = h;
    if (tail_[l] == kNil) tail_[l] = h;
    ++size_[l];
  }
  void Unlink(uint32_t h) {
    const uint8_t l = list_[h];
    if (prev_[h] != kNil) next_[prev_[h]] = next_[h]; else head_[l] = next_[h];
    if (next_[h] != kNil) prev_[next_[h]] = prev_[h]; else tail_[l] = prev_[h];
    prev_[h] = next_[h] = kNil;
    list_[h] = kNone;
    --size_[l];
  }
  // The least recently used evictable block of list l. Blocks the caller
  // refuses keep their place: a caller may refuse a block for reasons other
  // than its use (another tenant's, not admitted below, a parent), and
  // moving it to the front would let a warmer block go first.
  uint32_t Coldest(uint8_t l, absl::FunctionRef<bool(uint32_t)> evictable) const {
    for (uint32_t h = tail_[l]; h != kNil; h = prev_[h]) {
      if (evictable(h)) return h;
    }
    return kNil;
  }
  void AddGhost(uint64_t key, uint8_t b) {
    ghosts_[1 - b].Erase(key);
    ghosts_[b].Push(key);
    // |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c, c at least 64.
    const size_t c = std::max<size_t>(size(), 64);
    while (size_[kT1] + ghosts_[0].size() > c && ghosts_[0].DropOldest()) {
    }
    while (size() + ghosts_[0].size() + ghosts_[1].size() > 2 * c && ghosts_[1].DropOldest()) {
    }
  }

  const HandleKeys* shared_keys_ = nullptr;  // when set, key_ stays empty
  std::vector<uint64_t> key_;
  std::vector<uint32_t> prev_, next_;
  std::vector<uint8_t> list_;
  uint32_t head_[2] = {kNil, kNil}, tail_[2] = {kNil, kNil};  // head: most recent
  size_t size_[2] = {0, 0};
  double p_ = 0;  // target size of T1
  GhostFifo ghosts_[2];  // B1, B2
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeArcPolicy() { return std::make_unique<ArcPolicy>(); }

}  // namespace kvtier
