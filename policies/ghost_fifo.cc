// SPDX-License-Identifier: Apache-2.0
#include "policies/ghost_fifo.h"

#include <algorithm>

namespace kvtier {

uint32_t GhostFifo::Fingerprint(uint64_t key) {
  // splitmix64's finalizer: keys in tests are small counters, in the daemon
  // hashes of block keys.
  key ^= key >> 30;
  key *= 0xbf58476d1ce4e5b9ull;
  key ^= key >> 27;
  key *= 0x94d049bb133111ebull;
  key ^= key >> 31;
  const auto fp = static_cast<uint32_t>(key >> 32);
  return fp == 0 ? 1 : fp;
}

size_t GhostFifo::Find(uint32_t fp) const {
  if (table_.empty()) return kNpos;
  const uint32_t tag = Tag(fp);
  for (size_t i = Home(fp);; i = Next(i)) {  // ends: the table is never full
    const uint32_t v = table_[i];
    if (v == 0) return kNpos;
    if (v >> kIndexBits == tag && ring_[(v & kIndexMask) - 1] == fp) return i;
  }
}

bool GhostFifo::Contains(uint64_t key) const { return Find(Fingerprint(key)) != kNpos; }

bool GhostFifo::Erase(uint64_t key) {
  const size_t t = Find(Fingerprint(key));
  if (t == kNpos) return false;
  EraseAt(t);
  ShrinkIfSparse();
  return true;
}

void GhostFifo::EraseAt(size_t t) {
  ring_[(table_[t] & kIndexMask) - 1] = 0;
  --live_;
  // Backward shift: an entry after the hole moves into it unless its home
  // lies cyclically in (hole, entry].
  size_t hole = t;
  for (size_t j = Next(t); table_[j] != 0; j = Next(j)) {
    const size_t home = Home(ring_[(table_[j] & kIndexMask) - 1]);
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    table_[hole] = table_[j];
    hole = j;
  }
  table_[hole] = 0;
}

void GhostFifo::Insert(size_t ring_index) {
  const uint32_t fp = ring_[ring_index];
  size_t i = Home(fp);
  while (table_[i] != 0) i = Next(i);
  table_[i] = (Tag(fp) << kIndexBits) | static_cast<uint32_t>(ring_index + 1);
}

void GhostFifo::Push(uint64_t key) {
  const uint32_t fp = Fingerprint(key);
  if (const size_t t = Find(fp); t != kNpos) EraseAt(t);
  if (live_ >= kMaxGhosts) DropOldest();
  Reserve();
  size_t at = head_ + used_;
  if (at >= ring_.size()) at -= ring_.size();
  ring_[at] = fp;
  ++used_;
  ++live_;
  Insert(at);
}

bool GhostFifo::DropOldest() {
  while (used_ > 0) {
    const size_t at = head_;
    head_ = RingNext(head_);
    --used_;
    const uint32_t fp = ring_[at];
    if (fp == 0) continue;  // erased earlier
    size_t i = Home(fp);
    while ((table_[i] & kIndexMask) != at + 1) i = Next(i);  // it is there: the ring entry is live
    EraseAt(i);
    ShrinkIfSparse();
    return true;
  }
  return false;
}

void GhostFifo::Reserve() {
  while (used_ > 0 && ring_[head_] == 0) {
    head_ = RingNext(head_);
    --used_;
  }
  // A full ring (live and erased entries) is laid out anew with room for an
  // eighth more live ghosts: amortized, at most 9 entries moved per push.
  // So is a table more than 88% full (the tags keep probes past other
  // ghosts off the ring). A quarter and 70-85% cost ~1 B a ghost more (the
  // lookup bench after churn: 159-162 B a block, then 158-159).
  if (used_ == ring_.size() || (live_ + 1) * 25 > table_.size() * 22) Relayout();
}

void GhostFifo::Relayout() {
  const size_t n = live_;
  // Both vectors are built anew, so their capacity is what they hold.
  std::vector<uint32_t> ring(std::min(kMaxRing, std::max(kMinRing, n + n / 8 + 1)), 0);
  size_t k = 0;
  for (size_t s = 0, at = head_; s < used_; ++s, at = RingNext(at)) {
    if (const uint32_t fp = ring_[at]; fp != 0) ring[k++] = fp;
  }
  ring_.swap(ring);
  head_ = 0;
  used_ = k;
  std::vector<uint32_t>(std::max<size_t>(2 * kMinRing, (n + 1) * 5 / 4 + 1), 0).swap(table_);
  for (size_t i = 0; i < k; ++i) Insert(i);
}

}  // namespace kvtier
