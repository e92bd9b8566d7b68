// SPDX-License-Identifier: Apache-2.0
// The adaptive policy: no single eviction policy wins on every workload and
// capacity. On the Mooncake conversation trace (token hit rate with room for
// 1M / 3M / 10M tokens) S3-FIFO that trusts depth ("s3fifo-deep") gets
// 0.109 / 0.188 / 0.263, plain LRU 0.057 / 0.147 / 0.304: filtering wins
// when room is short and recency when it is not. So the adaptive policy
// runs the candidates ("experts") side by side:
//
// - every expert tracks the tier's real resident set (Insert/Touch/Remove go
//   to all of them), and the tier's victims come from the current leader;
// - each expert also runs a shadow cache of the tier's capacity (or of a
//   sample of it, see below), holding
//   block identities only (no data), fed with every request's chain of keys
//   through Observe(). A shadow counts the prefix it would have hit, weighted
//   by what each hit block is worth (by default 1; the cost model's prefill
//   time at the block's position when the caller has one), then keeps the
//   chain as the engine would store it;
// - the leader is the expert whose shadow scored most, with scores decaying
//   by `decay` per request (0.9995: about the last two thousand requests;
//   0.999 forgot too fast on the Mooncake trace at 1M tokens: 0.098 vs 0.109);
// - a challenger takes the lead only when its lead exceeds `switch_z`
//   standard deviations of the per-request score difference between the two
//   (tracked per pair, decayed alike). Every switch costs: the resident set
//   was chosen by the old leader. Without the test (experts s3fifo-deep and
//   lru) the leader flipped 12 times in the first 1,400 requests at 3M
//   tokens, while both shadows were warming up, and ended at 0.183 against
//   0.186 for s3fifo-deep alone (then, with one S3-FIFO ghost per block).
//
// Shadows hold at most `max_shadow_blocks` identities each. A tier with more
// room than that is modelled on a sample of block identities (a key is in
// the sample when a hash of it falls below the rate, the same for every
// expert and every request, as in SHARDS, Waldspurger et al., FAST '15): the
// shadows are scaled down to the sample's share of the capacity, a sampled
// block's parent is the sampled block before it in its chain, and a request
// scores its sampled blocks up to the first one that misses (divided by the
// rate), so a deep block counts only when the sampled part of its prefix hit.
// Counting every sampled block that hit instead, prefix or not, elected the
// wrong expert on the Mooncake trace. Below the limit (1,953 blocks: the
// workload suite at 1M tokens) the shadows are whole; at 3M (5,859) and 10M
// (19,531) they are samples. A capacity or limit changed while the shadows
// hold identities applies from the next request: the shadows shrink to the
// new size, and identities no longer in the sample age out.
#ifndef KVTIER_POLICIES_ADAPTIVE_POLICY_H_
#define KVTIER_POLICIES_ADAPTIVE_POLICY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/mutex.h"
#include "policies/chain_guard.h"
#include "policies/eviction_policy.h"

namespace kvtier {

class AdaptivePolicy final : public EvictionPolicy {
 public:
  struct Options {
    // Room in the shadows, in blocks (the tier's capacity in blocks of the
    // size it holds). 0: unknown yet (SetCapacityBlocks); until then the
    // shadows are idle and the first expert leads.
    uint64_t capacity_blocks = 0;
    double decay = 0.9995;
    // How sure a switch must be (see above). On the workload suite
    // (kvtier-replay --simulate --suite: the Mooncake conversation trace and
    // five generated workloads at 1M / 3M / 10M tokens) the lowest ratio of
    // the default to the best single policy is 0.978 at 1 (the conversation
    // trace at 3M: ARC's shadow leads by noise for a while and its resident
    // set costs s3fifo-deep's) and 0.992 at 2; at 3 the leader is too slow
    // to follow LRU at 10M (0.977). The price: a short workload may end
    // before a real lead is sure (the 288-request built-in chat at 20K
    // tokens stays with s3fifo-deep: 0.534 against LRU's 0.563; at 1.5 it
    // switches, but the conversation trace at 3M drops to 0.964). A
    // relative margin on top of z (1-3%) helped neither.
    double switch_z = 2.0;
    // No switch before this many requests. A score is a decayed sum that
    // remembers about 1 / (1 - decay) requests (2,000); before that it is
    // made of the warm-up, while each shadow fills, which says how a policy
    // fills a cache, not how it keeps one. On the conversation trace at 1M
    // tokens arc-cutoff warms up faster than s3fifo-deep (0.077 against
    // 0.053 over the first 600 requests) and runs worse after (0.088
    // against 0.109 over the trace): without this rule the default followed
    // it from request 181 to 2,351 and ended at 0.103 against 0.109; with
    // it, it never switches there. Waiting until 1,000 requests did the
    // same on the suite. The price: a switch a workload needs from its
    // start (LRU's at 10M tokens) comes 2,000 requests later; the suite's
    // lowest ratio did not move (0.989, the conversation trace at 10M).
    uint64_t warmup_requests = 2000;
    // The first leads until another proves better. s3fifo-deep (probation
    // for shallow blocks) wins where room is short, LRU where it is not, ARC
    // on scans mixed with chat and on interleaved tenants (its ghosts learn
    // which list to grow): on the suite's "scan" workload at 1M tokens ARC
    // gets 0.427 against 0.401 for s3fifo-deep. ARC replaced plain S3-FIFO,
    // which never led on the suite and costs the same 9 bytes per block in
    // the tier. W-TinyLFU ("tinylfu") is not a default expert: it never
    // leads on the suite, its shadow costs ~170 us per request at 10M tokens,
    // and with it the leader flips between it and s3fifo-deep (the suite's
    // docqa at 3M: 0.949 of the best). Its long frequency memory is what
    // keeps a hot chain whose reuse gap exceeds the tier after warm-up
    // (adaptive_policy_test); give it as an expert for such workloads.
    // arc-cutoff (ARC whose long computed prompts enter at the cold end)
    // replaced ARC: on "scan" at 3M tokens, chat beside bursts of one-off
    // documents, ARC got 0.476 and the default 0.475 against 0.492 for
    // "holds", which is too large to be an expert (docs/decisions.md);
    // arc-cutoff gets 0.490 and the default 0.487, at the same 9 bytes per
    // block in the tier.
    std::vector<std::string> experts = {"s3fifo-deep", "lru", "arc-cutoff"};
    // Most identities a shadow holds (see above): memory per shadow is
    // bounded (~90 B an identity), whatever the tier's capacity.
    uint64_t max_shadow_blocks = kDefaultMaxShadowBlocks;
  };
  static constexpr uint64_t kDefaultMaxShadowBlocks = 4096;
  static constexpr uint64_t kMaxShadowLimit = uint64_t{1} << 32;
  struct ExpertScore {
    std::string name;
    double score = 0;
  };

  // InvalidArgument for an unknown or repeated expert, no expert, a decay
  // outside (0, 1], a switch_z outside [0, 100) or max_shadow_blocks
  // outside [1, 2^32].
  static absl::StatusOr<std::unique_ptr<AdaptivePolicy>> Create(const Options& opts);

  // Observe, SetCapacityBlocks, SetMaxShadowBlocks, sample_rate,
  // InShadowSample, shadow_blocks, leader, scores and switches are thread-safe
  // (the shadows have their own lock, so a daemon can feed them outside its
  // tier lock); the EvictionPolicy methods need the caller's lock as usual.

  // A request's chain of block identities, root first (never 0), as the
  // engine looks it up, in blocks of block_tokens tokens (0: not known; the
  // shadows then see every block at position 0). value(i): what a hit at
  // depth i is worth.
  void Observe(std::span<const uint64_t> chain, uint32_t block_tokens, absl::FunctionRef<double(size_t)> value);
  void Observe(std::span<const uint64_t> chain, uint32_t block_tokens = 0) {
    Observe(chain, block_tokens, [](size_t) { return 1.0; });
  }
  void SetCapacityBlocks(uint64_t blocks);
  // Clamped to [1, 2^32]. Shadows already fuller than the new size shrink
  // at the next request.
  void SetMaxShadowBlocks(uint64_t blocks);
  // Identities the fullest shadow holds now.
  size_t shadow_blocks() const;
  // The share of block identities the shadows model (1: all), and whether
  // one identity is in the sample.
  double sample_rate() const;
  bool InShadowSample(uint64_t key) const;

  absl::string_view leader() const { return experts_[leader_.load(std::memory_order_relaxed)].pol->name(); }
  std::vector<ExpertScore> scores() const;
  // How many times the leader changed.
  uint64_t switches() const { return switches_.load(std::memory_order_relaxed); }

  void Insert(uint32_t handle) override;
  void InsertWithKey(uint32_t handle, uint64_t key_hash) override;
  void InsertAt(uint32_t handle, uint64_t key_hash, uint64_t position_tokens) override;
  void Touch(uint32_t handle) override;
  void Remove(uint32_t handle) override;
  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override;
  bool WantsOnlyEvictableOffers() const override {
    return experts_[leader_.load(std::memory_order_relaxed)].pol->WantsOnlyEvictableOffers();
  }
  bool Contains(uint32_t handle) const override { return experts_[0].pol->Contains(handle); }
  size_t size() const override { return experts_[0].pol->size(); }
  // Every expert's, plus the shadows' (each bounded by max_shadow_blocks).
  size_t bookkeeping() const override;
  absl::string_view name() const override { return "adaptive"; }
  // When an expert learns from requests (holds, arc-cutoff: the default's
  // does): the experts over the tier's handles, under the caller's lock
  // (Observe feeds the shadows).
  bool ObservesRequests() const override { return observes_; }
  void ObserveRequest(std::span<const uint64_t> chain, std::span<const uint32_t> depths, uint32_t block_tokens,
                      size_t held) override;
  // To every expert over the tier's handles (each shadow has its own guard).
  void ShareKeys(const HandleKeys* keys) override {
    for (Expert& e : experts_) e.pol->ShareKeys(keys);
  }

 private:
  // A cache of block identities run by one expert's policy over dense
  // shadow handles.
  struct Shadow {
    std::unique_ptr<ChainGuard> pol;  // leaves first, as the tier
    absl::flat_hash_map<uint64_t, uint32_t> handle_of;
    std::vector<uint64_t> key_of;
    std::vector<uint64_t> last_request;  // which request last used a handle
    std::vector<uint32_t> free;
  };
  struct Expert {
    std::unique_ptr<EvictionPolicy> pol;  // over the tier's real handles (caller's lock)
    Shadow shadow;                        // shadow_mu_
    double score = 0;                     // shadow_mu_
  };

  explicit AdaptivePolicy(const Options& opts)
      : capacity_(opts.capacity_blocks),
        max_shadow_(opts.max_shadow_blocks),
        decay_(opts.decay),
        switch_z_(opts.switch_z),
        warmup_(opts.warmup_requests) {
    Resample();
  }
  // Sets the sample from capacity_ and max_shadow_.
  void Resample() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shadow_mu_);
  bool Sampled(uint64_t key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(shadow_mu_);
  // Serves the sampled blocks of one chain (their positions in it, root
  // first); returns the score of their hit prefix.
  double Serve(Shadow& s, std::span<const uint64_t> chain, std::span<const uint32_t> at, uint64_t block_tokens,
               absl::FunctionRef<double(size_t)> value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shadow_mu_);

  std::vector<Expert> experts_;  // fixed after Create
  bool observes_ = false;        // some expert ObservesRequests
  std::vector<uint64_t> sampled_ ABSL_GUARDED_BY(shadow_mu_);  // this request's sampled keys
  mutable Mutex shadow_mu_;
  uint64_t capacity_ ABSL_GUARDED_BY(shadow_mu_);
  uint64_t max_shadow_ ABSL_GUARDED_BY(shadow_mu_);
  uint64_t shadow_capacity_ ABSL_GUARDED_BY(shadow_mu_) = 0;  // min(capacity_, max_shadow_)
  double rate_ ABSL_GUARDED_BY(shadow_mu_) = 1;                // shadow_capacity_ / capacity_
  uint64_t sample_below_ ABSL_GUARDED_BY(shadow_mu_) = ~0ull;  // a key is sampled when its mix is <= this
  std::vector<uint32_t> at_ ABSL_GUARDED_BY(shadow_mu_);       // this request's sampled positions
  const double decay_;
  const double switch_z_;
  const uint64_t warmup_;
  uint64_t requests_ ABSL_GUARDED_BY(shadow_mu_) = 0;
  std::vector<double> got_ ABSL_GUARDED_BY(shadow_mu_);     // this request's score per expert
  std::vector<double> spread_ ABSL_GUARDED_BY(shadow_mu_);  // [i*n+j], i<j: decayed sum of squared differences
  std::atomic<size_t> leader_{0};
  std::atomic<uint64_t> switches_{0};
};

}  // namespace kvtier

#endif  // KVTIER_POLICIES_ADAPTIVE_POLICY_H_
