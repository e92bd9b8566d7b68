#include "policies/chain_guard.h"

#include <algorithm>

namespace kvtier {

void ChainGuard::InsertInChain(uint32_t h, uint64_t key, uint64_t parent, uint64_t position) {
  if (inner_->Contains(h)) {
    inner_->Touch(h);
    return;
  }
  if (h >= links_.size()) links_.resize(h + 1);
  Links& l = links_[h];
  l = Links{key, key != 0 ? parent : 0};
  if (l.parent != 0) {
    auto [it, added] = kids_.try_emplace(Bucket(l.parent), kNil);
    l.prev = it->second;
    if (l.prev != kNil) links_[l.prev].next = h;
    it->second = h;
  }
  inner_->InsertAt(h, key, position);
}

void ChainGuard::Remove(uint32_t h) {
  if (!inner_->Contains(h)) return;
  inner_->Remove(h);
  const uint64_t parent = links_[h].parent;
  if (parent != 0) {
    auto it = kids_.find(Bucket(parent));
    if (it != kids_.end()) {
      uint32_t& last = it->second;
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
      if (last == kNil) kids_.erase(it);
    }
  }
  links_[h] = Links{};
}

bool ChainGuard::HasKids(uint32_t h) const {
  const uint64_t key = links_[h].key;
  if (key == 0) return false;
  auto it = kids_.find(Bucket(key));
  if (it == kids_.end()) return false;
  for (uint32_t k = it->second; k != kNil; k = links_[k].prev) {
    if (links_[k].parent == key) return true;
  }
  return false;
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
    const uint64_t key = links_[at].key;
    auto list = key != 0 ? kids_.find(Bucket(key)) : kids_.end();
    bool has_kids = false;
    std::optional<uint32_t> next;
    for (uint32_t k = list != kids_.end() ? list->second : kNil; k != kNil; k = links_[k].prev) {
      if (links_[k].parent != key) continue;  // another parent's child in the same bucket
      has_kids = true;
      if (evictable(k)) {
        next = k;
        break;
      }
    }
    if (!has_kids) return at;
    if (!next) break;  // every child is pinned
    at = *next;
  }
  // No evictable leaf under the policy's choice: the policy's best block
  // among those without resident children.
  return inner_->PickVictim(childless);
}

uint32_t ChainGuard::children(uint64_t key) const {
  if (key == 0) return 0;
  auto it = kids_.find(Bucket(key));
  if (it == kids_.end()) return 0;
  uint32_t n = 0;
  for (uint32_t k = it->second; k != kNil; k = links_[k].prev) n += links_[k].parent == key ? 1 : 0;
  return n;
}

}  // namespace kvtier
