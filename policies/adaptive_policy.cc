// SPDX-License-Identifier: Apache-2.0
#include "policies/adaptive_policy.h"

#include <algorithm>
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
  if (opts.max_shadow_blocks == 0 || opts.max_shadow_blocks > kMaxShadowLimit) {
    return absl::InvalidArgumentError(absl::StrCat("adaptive policy max_shadow_blocks ", opts.max_shadow_blocks,
                                                   " is not in [1, 2^32]"));
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
    p->observes_ = p->observes_ || e.pol->ObservesRequests();
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
void AdaptivePolicy::ObserveRequest(std::span<const uint64_t> chain, std::span<const uint32_t> depths,
                                    uint32_t block_tokens, size_t held) {
  for (Expert& e : experts_) {
    if (e.pol->ObservesRequests()) e.pol->ObserveRequest(chain, depths, block_tokens, held);
  }
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
  Resample();
}

void AdaptivePolicy::SetMaxShadowBlocks(uint64_t blocks) {
  MutexLock l(&shadow_mu_);
  max_shadow_ = std::clamp<uint64_t>(blocks, 1, kMaxShadowLimit);
  Resample();
}

size_t AdaptivePolicy::shadow_blocks() const {
  MutexLock l(&shadow_mu_);
  size_t most = 0;
  for (const Expert& e : experts_) most = std::max(most, e.shadow.handle_of.size());
  return most;
}

double AdaptivePolicy::sample_rate() const {
  MutexLock l(&shadow_mu_);
  return rate_;
}

bool AdaptivePolicy::InShadowSample(uint64_t key) const {
  MutexLock l(&shadow_mu_);
  return Sampled(key);
}

void AdaptivePolicy::Resample() {
  shadow_capacity_ = std::min(capacity_, max_shadow_);
  if (capacity_ <= max_shadow_) {
    rate_ = 1;
    sample_below_ = ~0ull;
    return;
  }
  // max_shadow_ <= 2^32 < capacity_: the rate is below 1 - 2^-32, so the
  // threshold is below 2^64 (a double holds it exactly enough).
  rate_ = static_cast<double>(max_shadow_) / static_cast<double>(capacity_);
  sample_below_ = static_cast<uint64_t>(std::ldexp(rate_, 64));
}

bool AdaptivePolicy::Sampled(uint64_t key) const {
  if (sample_below_ == ~0ull) return true;
  // splitmix64's finalizer: the simulator's keys are small dense ids.
  uint64_t x = key + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return (x ^ (x >> 31)) <= sample_below_;
}

std::vector<AdaptivePolicy::ExpertScore> AdaptivePolicy::scores() const {
  MutexLock l(&shadow_mu_);
  std::vector<ExpertScore> out;
  for (const Expert& e : experts_) out.push_back(ExpertScore{std::string(e.pol->name()), e.score});
  return out;
}

double AdaptivePolicy::Serve(Shadow& s, std::span<const uint64_t> chain, std::span<const uint32_t> at,
                             uint64_t block_tokens, absl::FunctionRef<double(size_t)> value) {
  double got = 0;
  size_t held = 0;
  for (; held < at.size() && s.handle_of.contains(chain[at[held]]); ++held) got += value(at[held]);
  if (s.pol->ObservesRequests()) {
    sampled_.clear();
    for (uint32_t j : at) sampled_.push_back(chain[j]);
    s.pol->ObserveRequest(sampled_, at, static_cast<uint32_t>(block_tokens), held);
  }
  // Leaves first, root last, as the tier sees a request: recency policies
  // then evict a chain's leaves before its parents.
  for (size_t k = at.size(); k-- > 0;) {
    const size_t j = at[k];
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
    s.pol->InsertInChain(h, chain[j], k > 0 ? chain[at[k - 1]] : 0, j * block_tokens);
  }
  // The request's own chain stays (it is leased while the engine uses it).
  while (s.handle_of.size() > shadow_capacity_) {
    std::optional<uint32_t> v = s.pol->PickVictim([&](uint32_t h) { return s.last_request[h] != requests_; });
    if (!v) break;
    s.pol->Remove(*v);
    s.handle_of.erase(s.key_of[*v]);
    s.free.push_back(*v);
  }
  return got / rate_;
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
  at_.clear();
  for (size_t i = 0; i < chain.size(); ++i) {
    if (Sampled(chain[i])) at_.push_back(static_cast<uint32_t>(i));
  }
  for (size_t i = 0; i < n; ++i) {
    Expert& e = experts_[i];
    got_[i] = Serve(e.shadow, chain, at_, block_tokens, value);
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
  if (requests_ <= warmup_) return;
  const double q = spread_[std::min(best, leader) * n + std::max(best, leader)];
  if (best != leader && experts_[best].score - experts_[leader].score > switch_z_ * std::sqrt(q)) {
    leader_.store(best, std::memory_order_relaxed);
    switches_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace kvtier
