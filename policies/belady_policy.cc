// SPDX-License-Identifier: Apache-2.0
#include "policies/belady_policy.h"

#include <algorithm>

namespace kvtier {

BeladyPolicy::Info& BeladyPolicy::At(uint32_t h) {
  if (h >= info_.size()) info_.resize(std::max<size_t>(h + 1, info_.size() * 2));
  return info_[h];
}

void BeladyPolicy::SetNextUse(uint32_t h, uint64_t next_use, uint32_t depth) {
  Info& i = At(h);
  if (i.in) order_.erase(Key{i.next, i.depth, h});
  i.next = next_use;
  i.depth = depth;
  if (i.in) order_.insert(Key{i.next, i.depth, h});
}

void BeladyPolicy::Insert(uint32_t h) {
  Info& i = At(h);
  if (i.in) return;
  i.in = true;
  order_.insert(Key{i.next, i.depth, h});
}

void BeladyPolicy::Touch(uint32_t) {}  // the next use is what counts: SetNextUse

void BeladyPolicy::Remove(uint32_t h) {
  if (h >= info_.size() || !info_[h].in) return;
  order_.erase(Key{info_[h].next, info_[h].depth, h});
  info_[h].in = false;
}

std::optional<uint32_t> BeladyPolicy::PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) {
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    if (evictable(std::get<2>(*it))) return std::get<2>(*it);
  }
  return std::nullopt;
}

bool BeladyPolicy::Contains(uint32_t h) const { return h < info_.size() && info_[h].in; }

}  // namespace kvtier
