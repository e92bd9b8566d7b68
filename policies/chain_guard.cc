#include "policies/chain_guard.h"

#include <algorithm>

namespace kvtier {

void ChainGuard::InsertInChain(uint32_t h, uint64_t key, uint64_t parent, uint64_t position) {
  if (inner_->Contains(h)) {
    inner_->Touch(h);
    return;
  }
  if (h >= links_.size()) links_.resize(std::max<size_t>(h + 1, links_.size() * 2));
  Links& l = links_[h];
  l = Links{key, key != 0 ? parent : 0, 0};
  if (l.parent != 0) {
    std::vector<uint32_t>& kids = kids_[l.parent];
    l.index = static_cast<uint32_t>(kids.size());
    kids.push_back(h);
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
      std::vector<uint32_t>& kids = it->second;
      const uint32_t moved = kids.back();
      kids[l.index] = moved;
      links_[moved].index = l.index;
      kids.pop_back();
      if (kids.empty()) kids_.erase(it);
    }
  }
  links_[h] = Links{};
}

const std::vector<uint32_t>* ChainGuard::Kids(uint32_t h) const {
  const uint64_t key = links_[h].key;
  if (key == 0) return nullptr;
  auto it = kids_.find(key);
  return it == kids_.end() ? nullptr : &it->second;
}

std::optional<uint32_t> ChainGuard::PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) {
  auto childless = [&](uint32_t h) { return Kids(h) == nullptr && evictable(h); };
  if (inner_->WantsOnlyEvictableOffers()) return inner_->PickVictim(childless);
  std::optional<uint32_t> v = inner_->PickVictim(evictable);
  if (!v) return v;
  // The policy chose a cold block; if it still has resident children, its
  // subtree is cold too: take one of its leaves instead, so the chain shrinks
  // from its end (the policy will choose the same block again next time).
  uint32_t at = *v;
  for (int depth = 0; depth < 1 << 16; ++depth) {
    const std::vector<uint32_t>* kids = Kids(at);
    if (kids == nullptr) return at;
    std::optional<uint32_t> next;
    for (auto it = kids->rbegin(); it != kids->rend(); ++it) {
      if (evictable(*it)) {
        next = *it;
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
  return it == kids_.end() ? 0 : static_cast<uint32_t>(it->second.size());
}

}  // namespace kvtier
