// SPDX-License-Identifier: Apache-2.0
#include "policies/adaptive_policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "policies/chain_guard.h"

namespace kvtier {

absl::StatusOr<std::unique_ptr<AdaptivePolicy>> AdaptivePolicy::Create(const Options& opts) {
  if (opts.experts.empty()) return absl::InvalidArgumentError("the adaptive policy needs at least one expert");
  if (!(opts.decay > 0 && opts.decay <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("adaptive policy decay ", opts.decay, " is not in (0, 1]"));
  }
  if (!(opts.switch_z >= 0 && opts.switch_z < 100)) {
    return absl::InvalidArgumentError(absl::StrCat("adaptive policy switch_z ", opts.switch_z, " is not in [0, 100)"));
  }
  std::unique_ptr<AdaptivePolicy> p(new AdaptivePolicy(opts));
  for (const std::string& name : opts.experts) {
    if (name == "adaptive") return absl::InvalidArgumentError("the adaptive policy cannot be its own expert");
    for (const Expert& e : p->experts_) {
      if (e.pol->name() == name) return absl::InvalidArgumentError(absl::StrCat("expert \"", name, "\" given twice"));
    }
    Expert e;
    ASSIGN_OR_RETURN(e.pol, MakeEvictionPolicy(name));
    ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> shadow, MakeEvictionPolicy(name));
    e.shadow.pol = std::make_unique<ChainGuard>(std::move(shadow));
    p->experts_.push_back(std::move(e));
  }
  return p;
}

void AdaptivePolicy::Insert(uint32_t h) {
  for (Expert& e : experts_) e.pol->Insert(h);
}
void AdaptivePolicy::InsertWithKey(uint32_t h, uint64_t key_hash) {
  for (Expert& e : experts_) e.pol->InsertWithKey(h, key_hash);
}
void AdaptivePolicy::InsertAt(uint32_t h, uint64_t key_hash, uint64_t position) {
  for (Expert& e : experts_) e.pol->InsertAt(h, key_hash, position);
}
void AdaptivePolicy::Touch(uint32_t h) {
  for (Expert& e : experts_) e.pol->Touch(h);
}
void AdaptivePolicy::Remove(uint32_t h) {
  for (Expert& e : experts_) e.pol->Remove(h);
}
std::optional<uint32_t> AdaptivePolicy::PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) {
  return experts_[leader_.load(std::memory_order_relaxed)].pol->PickVictim(evictable);
}
size_t AdaptivePolicy::bookkeeping() const {
  size_t n = 0;
  for (const Expert& e : experts_) n += e.pol->bookkeeping();
  MutexLock l(&shadow_mu_);
  for (const Expert& e : experts_) n += e.shadow.pol->bookkeeping() + e.shadow.handle_of.size() + e.shadow.free.size();
  return n;
}

void AdaptivePolicy::SetCapacityBlocks(uint64_t blocks) {
  MutexLock l(&shadow_mu_);
  capacity_ = blocks;
}

std::vector<AdaptivePolicy::ExpertScore> AdaptivePolicy::scores() const {
  MutexLock l(&shadow_mu_);
  std::vector<ExpertScore> out;
  for (const Expert& e : experts_) out.push_back(ExpertScore{std::string(e.pol->name()), e.score});
  return out;
}

double AdaptivePolicy::Serve(Shadow& s, std::span<const uint64_t> chain, uint64_t block_tokens,
                             absl::FunctionRef<double(size_t)> value) {
  double got = 0;
  for (size_t i = 0; i < chain.size() && s.handle_of.contains(chain[i]); ++i) got += value(i);
  // Leaves first, root last, as the tier sees a request: recency policies
  // then evict a chain's leaves before its parents.
  for (size_t j = chain.size(); j-- > 0;) {
    auto [it, fresh] = s.handle_of.try_emplace(chain[j], 0);
    if (!fresh) {
      s.pol->Touch(it->second);
      s.last_request[it->second] = requests_;
      continue;
    }
    uint32_t h;
    if (!s.free.empty()) {
      h = s.free.back();
      s.free.pop_back();
    } else {
      h = static_cast<uint32_t>(s.key_of.size());
      s.key_of.push_back(0);
      s.last_request.push_back(0);
    }
    it->second = h;
    s.key_of[h] = chain[j];
    s.last_request[h] = requests_;
    s.pol->InsertInChain(h, chain[j], j > 0 ? chain[j - 1] : 0, j * block_tokens);
  }
  // The request's own chain stays (it is leased while the engine uses it).
  while (s.handle_of.size() > capacity_) {
    std::optional<uint32_t> v = s.pol->PickVictim([&](uint32_t h) { return s.last_request[h] != requests_; });
    if (!v) break;
    s.pol->Remove(*v);
    s.handle_of.erase(s.key_of[*v]);
    s.free.push_back(*v);
  }
  return got;
}

void AdaptivePolicy::Observe(std::span<const uint64_t> chain, uint32_t block_tokens,
                             absl::FunctionRef<double(size_t)> value) {
  MutexLock l(&shadow_mu_);
  if (capacity_ == 0 || experts_.size() < 2) return;
  ++requests_;
  const size_t leader = leader_.load(std::memory_order_relaxed);
  size_t best = leader;
  const size_t n = experts_.size();
  got_.resize(n);
  spread_.resize(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    Expert& e = experts_[i];
    got_[i] = Serve(e.shadow, chain, block_tokens, value);
    e.score = e.score * decay_ + got_[i];
    if (e.score > experts_[best].score) best = i;
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      const double d = got_[i] - got_[j];
      double& q = spread_[i * n + j];
      q = q * decay_ + d * d;
    }
  }
  // A new leader must lead by more than switch_z standard deviations of the
  // per-request difference between the two (a sum of decayed differences
  // has about that spread when neither is better).
  const double q = spread_[std::min(best, leader) * n + std::max(best, leader)];
  if (best != leader && experts_[best].score - experts_[leader].score > switch_z_ * std::sqrt(q)) {
    leader_.store(best, std::memory_order_relaxed);
    switches_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace kvtier
