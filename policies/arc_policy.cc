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
//
// With a sequential cutoff (ArcOptions::cutoff_tokens, "arc-cutoff"), a
// request that computes that many tokens or more past its hit prefix has
// its computed blocks noted when it is asked for (ObserveRequest), and each
// enters T1 at its cold end when it is stored (each just warmer than the
// one before, so a run's leaves go first): a burst of one-off documents
// then evicts itself first instead of T1's recent blocks. A block that
// comes back after its eviction is a ghost and enters T2 as in ARC, so a
// long prompt that is reused pays one miss. Noted keys wait in a FIFO of
// fingerprints (GhostFifo) of at most kMaxNoted (~10 B each: ~0.6 MB at
// most, whatever the tier's size); a later ask that finds one held forgets
// it, one never stored ages out, and a fingerprint shared with another key
// only moves where that key enters.
#include <algorithm>
#include <vector>

#include "policies/eviction_policy.h"
#include "policies/ghost_fifo.h"

namespace kvtier {
namespace {

class ArcPolicy final : public EvictionPolicy {
 public:
  explicit ArcPolicy(const ArcOptions& opts) : opts_(opts) {}

  void Insert(uint32_t h) override { InsertWithKey(h, 0); }

  bool ObservesRequests() const override { return opts_.cutoff_tokens != 0; }
  void ObserveRequest(std::span<const uint64_t> chain, std::span<const uint32_t> depths, uint32_t block_tokens,
                      size_t held) override {
    if (opts_.cutoff_tokens == 0) return;
    held = std::min(held, chain.size());
    // What the tiers held is being reused: a note of it from an earlier ask
    // (a block on a lower tier past that ask's miss, never stored since)
    // must not send it to the cold end when a load brings it back up.
    if (noted_.size() > 0) {
      for (size_t j = 0; j < held; ++j) noted_.Erase(chain[j]);
    }
    if (block_tokens == 0 || held == chain.size()) return;
    const auto depth = [&](size_t j) -> uint64_t { return depths.empty() ? j : depths[j]; };
    // In a sampled chain (the adaptive policy's shadows) the depths say how
    // many blocks lie between the first computed one and the last.
    const uint64_t computed = depth(chain.size() - 1) + 1 - std::min(depth(held), depth(chain.size() - 1));
    if (computed * block_tokens < opts_.cutoff_tokens) return;
    for (size_t j = held; j < chain.size(); ++j) {
      if (chain[j] == 0) continue;
      noted_.Push(chain[j]);
      if (noted_.size() > kMaxNoted) noted_.DropOldest();
    }
  }

  void InsertWithKey(uint32_t h, uint64_t key) override { InsertAt(h, key, 0); }
  void InsertAt(uint32_t h, uint64_t key, uint64_t position) override {
    Grow(h);
    if (list_[h] != kNone) {
      Touch(h);
      return;
    }
    if (shared_keys_ == nullptr) key_[h] = key;
    uint8_t to = kT1;
    const bool cold = key != 0 && noted_.size() > 0 && noted_.Erase(key);
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
    if (cold && to == kT1) {
      // A store commits its blocks leaves first. Each block of a run goes
      // just warmer than the one before (shallower: its child), so a run's
      // leaf is its coldest block and its root its warmest, and the tier
      // evicts it from its leaves without the chain guard walking down from
      // the root on every eviction (O(L^2) for a run of L blocks). A block
      // deeper than the last one (a new run's leaf, or the next chunk of a
      // prompt stored in several) goes to the tail: the latest scan goes
      // first, as a burst of one-off documents should (earlier runs first
      // cost the conversation trace at 10M tokens 0.002, 0.981x the best).
      if (cold_end_ != kNil && position <= cold_end_position_) {
        PushWarmerThan(cold_end_, h);
      } else {
        PushBack(kT1, h);
      }
      cold_end_ = h;
      cold_end_position_ = position;
    } else {
      PushFront(to, h);
    }
  }

  void Touch(uint32_t h) override {
    if (h >= list_.size() || list_[h] == kNone) return;
    if (h == cold_end_) cold_end_ = kNil;
    Unlink(h);
    PushFront(kT2, h);
  }

  void Remove(uint32_t h) override {
    if (h >= list_.size() || list_[h] == kNone) return;
    const uint8_t from = list_[h];
    if (h == cold_end_) cold_end_ = kNil;
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
  size_t bookkeeping() const override { return size() + ghosts_[0].size() + ghosts_[1].size() + noted_.size(); }
  absl::string_view name() const override { return opts_.name; }
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
  void PushBack(uint8_t l, uint32_t h) {  // the cold end
    list_[h] = l;
    next_[h] = kNil;
    prev_[h] = tail_[l];
    if (tail_[l] != kNil) next_[tail_[l]] = h;
    tail_[l] = h;
    if (head_[l] == kNil) head_[l] = h;
    ++size_[l];
  }
  // h goes one place warmer than a (toward the head), in a's list.
  void PushWarmerThan(uint32_t a, uint32_t h) {
    const uint8_t l = list_[a];
    const uint32_t p = prev_[a];
    list_[h] = l;
    prev_[h] = p;
    next_[h] = a;
    prev_[a] = h;
    if (p != kNil) {
      next_[p] = h;
    } else {
      head_[l] = h;
    }
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

  static constexpr size_t kMaxNoted = size_t{1} << 16;

  const ArcOptions opts_;
  const HandleKeys* shared_keys_ = nullptr;  // when set, key_ stays empty
  std::vector<uint64_t> key_;
  std::vector<uint32_t> prev_, next_;
  std::vector<uint8_t> list_;
  uint32_t head_[2] = {kNil, kNil}, tail_[2] = {kNil, kNil};  // head: most recent
  size_t size_[2] = {0, 0};
  double p_ = 0;  // target size of T1
  GhostFifo ghosts_[2];  // B1, B2
  GhostFifo noted_;      // computed blocks of long requests, not stored yet
  // The last block that entered T1 at the cold end, while it is still there
  // (kNil once it is touched or removed: the next goes to T1's tail).
  uint32_t cold_end_ = kNil;
  uint64_t cold_end_position_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeArcPolicy(const ArcOptions& opts) { return std::make_unique<ArcPolicy>(opts); }

}  // namespace kvtier
