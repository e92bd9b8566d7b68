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
    Kids& kids = kids_[l.parent];
    l.prev = kids.last;
    if (kids.last != kNil) links_[kids.last].next = h;
    else kids.first = h;
    kids.last = h;
  }
  inner_->InsertAt(h, key, position);
}

void ChainGuard::Remove(uint32_t h) {
  if (!inner_->Contains(h)) return;
  inner_->Remove(h);
  const Links l = links_[h];
  if (l.parent != 0) {
    auto it = kids_.find(l.parent);
    if (it != kids_.end()) {
      Kids& kids = it->second;
      // Unlink the last child; unless it is h, it takes h's place.
      const uint32_t moved = kids.last;
      kids.last = links_[moved].prev;
      if (kids.last != kNil) links_[kids.last].next = kNil;
      else kids.first = kNil;
      if (moved != h) {
        // h's links as they are now: if h was just before the last, it is the last now.
        const Links& at = links_[h];
        Links& m = links_[moved];
        m.prev = at.prev;
        m.next = at.next;
        if (m.prev != kNil) links_[m.prev].next = moved;
        else kids.first = moved;
        if (m.next != kNil) links_[m.next].prev = moved;
        else kids.last = moved;
      }
      if (kids.first == kNil) kids_.erase(it);
    }
  }
  links_[h] = Links{};
}

const ChainGuard::Kids* ChainGuard::KidsOf(uint32_t h) const {
  const uint64_t key = links_[h].key;
  if (key == 0) return nullptr;
  auto it = kids_.find(key);
  return it == kids_.end() ? nullptr : &it->second;
}

std::optional<uint32_t> ChainGuard::PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) {
  auto childless = [&](uint32_t h) { return KidsOf(h) == nullptr && evictable(h); };
  if (inner_->WantsOnlyEvictableOffers()) return inner_->PickVictim(childless);
  std::optional<uint32_t> v = inner_->PickVictim(evictable);
  if (!v) return v;
  // The policy chose a cold block; if it still has resident children, its
  // subtree is cold too: take one of its leaves instead, so the chain shrinks
  // from its end (the policy will choose the same block again next time).
  uint32_t at = *v;
  for (int depth = 0; depth < 1 << 16; ++depth) {
    const Kids* kids = KidsOf(at);
    if (kids == nullptr) return at;
    std::optional<uint32_t> next;
    for (uint32_t k = kids->last; k != kNil; k = links_[k].prev) {
      if (evictable(k)) {
        next = k;
        break;
      }
    }
    if (!next) break;  // every child is pinned
    at = *next;
  }
  // No evictable leaf under the policy's choice: the policy's best block
  // among those without resident children.
  return inner_->PickVictim(childless);
}

uint32_t ChainGuard::children(uint64_t key) const {
  auto it = kids_.find(key);
  if (it == kids_.end()) return 0;
  uint32_t n = 0;
  for (uint32_t k = it->second.first; k != kNil; k = links_[k].next) ++n;
  return n;
}

}  // namespace kvtier
