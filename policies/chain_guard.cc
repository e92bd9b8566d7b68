// SPDX-License-Identifier: Apache-2.0
#include "policies/chain_guard.h"

#include <algorithm>

namespace kvtier {

void ChainGuard::File(uint32_t h, uint64_t parent) {
  if (filed_ + 1 > 4 * heads_.size() && head_bits_ < 31) GrowHeads();  // lists of four on average, at most
  uint32_t& last = heads_[Head(parent)];
  Links& l = links_[h];
  l.parent = parent;
  l.prev = last;
  l.next = kNil;
  if (last != kNil) links_[last].next = h;
  else ++lists_;
  last = h;
  ++filed_;
}

void ChainGuard::Unfile(uint32_t h) {
  uint32_t& last = heads_[Head(links_[h].parent)];
  // Unlink the last child; unless it is h, it takes h's place.
  const uint32_t moved = last;
  last = links_[moved].prev;
  if (last != kNil) links_[last].next = kNil;
  if (moved != h) {
    // h's links as they are now: if h was just before the last, it is the last now.
    const Links& at = links_[h];
    Links& m = links_[moved];
    m.prev = at.prev;
    m.next = at.next;
    if (m.prev != kNil) links_[m.prev].next = moved;
    if (m.next != kNil) links_[m.next].prev = moved;
    else last = moved;
  }
  if (last == kNil) --lists_;
  --filed_;
}

void ChainGuard::GrowHeads() {
  // The filed children, each list first to last, before the lists are redrawn.
  std::vector<uint32_t> filed;
  filed.reserve(filed_);
  for (uint32_t last : heads_) {
    const size_t first = filed.size();
    for (uint32_t k = last; k != kNil; k = links_[k].prev) filed.push_back(k);
    std::reverse(filed.begin() + static_cast<ptrdiff_t>(first), filed.end());
  }
  head_bits_ = head_bits_ == 0 ? 4 : head_bits_ + 1;
  heads_.assign(size_t{1} << head_bits_, kNil);
  filed_ = 0;
  lists_ = 0;
  for (uint32_t k : filed) File(k, links_[k].parent);
}

void ChainGuard::InsertInChain(uint32_t h, uint64_t key, uint64_t parent, uint64_t position) {
  if (inner_->Contains(h)) {
    inner_->Touch(h);
    return;
  }
  if (h >= links_.size()) links_.resize(h + 1);
  if (external_ == nullptr) {
    if (h >= keys_.size()) keys_.resize(h + 1, 0);
    keys_[h] = key;
  }
  assert(KeyOf(h) == key && "a caller that keeps the keys inserts each handle with its own");
  links_[h] = Links{};
  if (key != 0 && parent != 0) File(h, parent);
  inner_->InsertAt(h, key, position);
}

void ChainGuard::Remove(uint32_t h) {
  if (!inner_->Contains(h)) return;
  inner_->Remove(h);
  if (links_[h].parent != 0) Unfile(h);
  links_[h] = Links{};
  if (external_ == nullptr) keys_[h] = 0;
}

// Calls `f` with each child of the block with this key until it returns false.
template <typename F>
void ChainGuard::ForEachChild(uint64_t key, F f) const {
  if (key == 0 || heads_.empty()) return;
  for (uint32_t k = heads_[Head(key)]; k != kNil; k = links_[k].prev) {
    if (links_[k].parent == key && !f(k)) return;
  }
}

bool ChainGuard::HasKids(uint32_t h) const {
  bool any = false;
  ForEachChild(KeyOf(h), [&](uint32_t) { return !(any = true); });
  return any;
}

std::optional<uint32_t> ChainGuard::PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) {
  auto childless = [&](uint32_t h) { return !HasKids(h) && evictable(h); };
  if (inner_->WantsOnlyEvictableOffers()) return inner_->PickVictim(childless);
  std::optional<uint32_t> v = inner_->PickVictim(evictable);
  if (!v) return v;
  // The policy chose a cold block; if it still has resident children, its
  // subtree is cold too: take one of its leaves instead, so the chain shrinks
  // from its end (the policy will choose the same block again next time).
  uint32_t at = *v;
  for (int depth = 0; depth < 1 << 16; ++depth) {
    bool has_kids = false;
    std::optional<uint32_t> next;
    ForEachChild(KeyOf(at), [&](uint32_t k) {
      has_kids = true;
      if (evictable(k)) next = k;
      return !next;
    });
    if (!has_kids) return at;
    if (!next) break;  // every child is pinned
    at = *next;
  }
  // No evictable leaf under the policy's choice: the policy's best block
  // among those without resident children.
  return inner_->PickVictim(childless);
}

uint32_t ChainGuard::children(uint64_t key) const {
  uint32_t n = 0;
  ForEachChild(key, [&](uint32_t) { return ++n != 0; });
  return n;
}

}  // namespace kvtier
