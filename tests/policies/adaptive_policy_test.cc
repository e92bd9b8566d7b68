// SPDX-License-Identifier: Apache-2.0
// The adaptive policy follows whichever expert would have served recent
// requests best: on a workload where one expert clearly wins, it must hit
// about as often as that expert alone, and it must change its mind when the
// workload changes.
#include "policies/adaptive_policy.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

using Chain = std::vector<uint64_t>;

// A tier of `capacity` blocks driven the way the daemon drives it: each
// request looks up its chain (prefix hits), is observed as its ask (by the
// policies that learn from asks, with its hit prefix as held), then stores
// what missed, leaves first. Returns the blocks hit.
struct TierSim {
  TierSim(std::unique_ptr<EvictionPolicy> p, uint64_t capacity, uint32_t tokens_per_block = 0)
      : policy(std::move(p)), cap(capacity), block_tokens(tokens_per_block) {
    if (auto* a = dynamic_cast<AdaptivePolicy*>(policy.get())) {
      adaptive = a;
      a->SetCapacityBlocks(capacity);
    }
  }
  uint64_t Serve(const Chain& chain) {
    uint64_t hit = 0;
    while (hit < chain.size() && resident.contains(chain[hit])) ++hit;
    if (policy->ObservesRequests()) policy->ObserveRequest(chain, {}, block_tokens, hit);
    if (adaptive != nullptr) adaptive->Observe(chain, block_tokens);
    for (size_t j = chain.size(); j-- > 0;) {
      const uint32_t h = static_cast<uint32_t>(chain[j]);
      if (resident.insert(h).second) {
        policy->InsertWithKey(h, chain[j]);
      } else {
        policy->Touch(h);
      }
    }
    std::set<uint32_t> mine(chain.begin(), chain.end());
    while (resident.size() > cap) {
      std::optional<uint32_t> v = policy->PickVictim([&](uint32_t h) { return !mine.contains(h); });
      EXPECT_TRUE(v.has_value());
      if (!v) break;
      EXPECT_TRUE(resident.contains(*v));
      policy->Remove(*v);
      resident.erase(*v);
    }
    EXPECT_LE(resident.size(), cap);
    EXPECT_EQ(policy->size(), resident.size());
    return hit;
  }
  std::unique_ptr<EvictionPolicy> policy;
  AdaptivePolicy* adaptive = nullptr;
  uint64_t cap;
  uint32_t block_tokens;
  std::set<uint32_t> resident;
};

// A hot chain of 20 blocks used by every tenth request, between chains of
// blocks used once (270 of them between two uses of the hot chain, more than
// the 200-block tier holds): recency loses the hot chain, frequency keeps it.
std::vector<Chain> HotAndScans(uint64_t first_key, int requests) {
  std::vector<Chain> out;
  uint64_t next = first_key + 100;
  for (int r = 0; r < requests; ++r) {
    if (r % 10 == 0) {
      Chain hot;
      for (uint64_t k = 0; k < 20; ++k) hot.push_back(first_key + k);
      out.push_back(hot);
    } else {
      Chain scan;
      for (int k = 0; k < 30; ++k) scan.push_back(next++);
      out.push_back(scan);
    }
  }
  return out;
}

// Conversations of 4 blocks, each asked twice, the second time after about
// 60% of the tier has been used (30% new blocks, 30% second uses): recency
// keeps them all; a probation queue or a frequency filter lets them go
// before their second use.
std::vector<Chain> ReuseOnceWithinReach(uint64_t first_key, int conversations, uint64_t capacity) {
  std::vector<Chain> out;
  const int gap = static_cast<int>(capacity * 3 / 10 / 4);
  std::vector<Chain> convs;
  for (int c = 0; c < conversations; ++c) {
    Chain ch;
    for (uint64_t k = 0; k < 4; ++k) ch.push_back(first_key + uint64_t(c) * 4 + k);
    convs.push_back(ch);
  }
  for (int i = 0; i < conversations + gap; ++i) {
    if (i < conversations) out.push_back(convs[i]);
    if (i >= gap) out.push_back(convs[i - gap]);
  }
  return out;
}

// Hits of the requests from the from-th on.
uint64_t HitsOf(const std::string& name, const std::vector<Chain>& w, uint64_t cap, std::string* leader = nullptr,
                size_t from = 0) {
  TierSim t(std::move(MakeEvictionPolicy(name)).value(), cap);
  uint64_t hits = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const uint64_t got = t.Serve(w[i]);
    if (i >= from) hits += got;
  }
  if (leader != nullptr && t.adaptive != nullptr) *leader = std::string(t.adaptive->leader());
  return hits;
}

// An expert that learns from asks (arc-cutoff) is fed them through the
// adaptive policy: alone as its expert, it makes arc-cutoff's decisions,
// not ARC's. HotAndScans in blocks of 300 tokens: each scan computes 9,000
// tokens, past the 8,192-token cutoff, so it enters at the cold end and the
// hot chain (6,000) stays: 7,980 of its 8,000 blocks hit, none under ARC.
TEST(AdaptivePolicyTest, AnExpertThatLearnsFromAsksIsFedThem) {
  const auto w = HotAndScans(1, 4000);
  auto run = [&](std::unique_ptr<EvictionPolicy> p) {
    TierSim t(std::move(p), 200, /*tokens_per_block=*/300);
    uint64_t hits = 0;
    for (const Chain& c : w) hits += t.Serve(c);
    return hits;
  };
  const uint64_t arc = run(std::move(MakeEvictionPolicy("arc")).value());
  const uint64_t cutoff = run(std::move(MakeEvictionPolicy("arc-cutoff")).value());
  ASSERT_GT(cutoff, arc + 4000) << "the workload must separate the two for the test to mean anything";
  AdaptivePolicy::Options o;
  o.experts = {"arc-cutoff"};
  auto a = AdaptivePolicy::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->ObservesRequests());
  EXPECT_EQ(run(std::move(*a)), cutoff) << "arc " << arc;
}

TEST(AdaptivePolicyTest, OnAScanHeavyWorkloadItFollowsAScanResistantExpert) {
  const auto w = HotAndScans(1, 4000);
  const uint64_t lru = HitsOf("lru", w, 200);
  const uint64_t best = std::max(HitsOf("s3fifo", w, 200), HitsOf("tinylfu", w, 200));
  ASSERT_GT(best, lru * 3 / 2) << "the workload must separate the experts for the test to mean anything";
  std::string leader;
  const uint64_t adaptive = HitsOf("adaptive", w, 200, &leader);
  EXPECT_NE(leader, "lru");
  EXPECT_GE(double(adaptive), 0.95 * double(best)) << "lru " << lru << ", best " << best;
}

// Counted after the warm-up (no switch before it: the first expert,
// s3fifo-deep, leads until then).
TEST(AdaptivePolicyTest, WhenRecencyWinsItFollowsLru) {
  const auto w = ReuseOnceWithinReach(1, 3000, 400);
  const size_t from = AdaptivePolicy::Options{}.warmup_requests + 500;
  ASSERT_GT(w.size(), 2 * from);
  const uint64_t lru = HitsOf("lru", w, 400, nullptr, from);
  const uint64_t others = std::max(HitsOf("s3fifo", w, 400, nullptr, from), HitsOf("tinylfu", w, 400, nullptr, from));
  ASSERT_GT(lru, others * 3 / 2) << "the workload must separate the experts for the test to mean anything";
  std::string leader;
  const uint64_t adaptive = HitsOf("adaptive", w, 400, &leader, from);
  EXPECT_EQ(leader, "lru");
  EXPECT_GE(double(adaptive), 0.95 * double(lru)) << "lru " << lru << ", others " << others;
}

TEST(AdaptivePolicyTest, ItChangesItsMindWhenTheWorkloadChanges) {
  // W-TinyLFU as an expert: after the first phase only its long frequency
  // memory keeps the hot chain (S3-FIFO's ghosts are shorter than its gap).
  TierSim t(std::move(AdaptivePolicy::Create(
                          {.capacity_blocks = 200, .decay = 0.99, .experts = {"lru", "s3fifo", "tinylfu"}}))
                .value(),
            200);
  for (const Chain& c : ReuseOnceWithinReach(1, 3000, 200)) t.Serve(c);
  EXPECT_EQ(t.adaptive->leader(), "lru");
  for (const Chain& c : HotAndScans(1'000'000, 4000)) t.Serve(c);
  EXPECT_NE(t.adaptive->leader(), "lru");
  EXPECT_GE(t.adaptive->switches(), 1u);
  const auto scores = t.adaptive->scores();
  ASSERT_EQ(scores.size(), 3u);
  EXPECT_EQ(scores[0].name, "lru");
}

TEST(AdaptivePolicyTest, WithoutACapacityTheShadowsIdleAndTheFirstExpertLeads) {
  auto p = std::move(AdaptivePolicy::Create({})).value();
  for (const Chain& c : HotAndScans(1, 200)) p->Observe(c);
  EXPECT_EQ(p->leader(), "s3fifo-deep");
  for (const auto& s : p->scores()) EXPECT_EQ(s.score, 0) << s.name;
}

// A tier larger than the shadows' limit is modelled on a sample of block
// identities: the shadows stay within the limit however many blocks go by,
// where whole shadows grow with the tier.
TEST(AdaptivePolicyTest, ATierLargerThanTheShadowsIsModelledOnABoundedSample) {
  auto run = [](uint64_t max_shadow) {
    auto p = std::move(AdaptivePolicy::Create({.capacity_blocks = 1'000'000, .max_shadow_blocks = max_shadow})).value();
    uint64_t key = 1;
    for (int r = 0; r < 400; ++r) {
      Chain c;
      for (int i = 0; i < 500; ++i) c.push_back(key++);
      p->Observe(c);
    }
    return std::pair(p->sample_rate(), p->bookkeeping());
  };
  const auto [rate, sampled] = run(1000);
  const auto [whole_rate, whole] = run(AdaptivePolicy::kMaxShadowLimit);
  EXPECT_DOUBLE_EQ(rate, 0.001);
  EXPECT_EQ(whole_rate, 1.0);
  // 200K distinct blocks went by: whole shadows hold them all (3 experts),
  // the sampled ones about 200 each, and never more than 1000.
  EXPECT_GE(whole, 3u * 200'000u);
  EXPECT_LE(sampled, 3u * 4u * 1000u);
  EXPECT_GT(sampled, 0u);
  // Full shadows: 10,000 blocks sampled at 0.1 over 200K distinct keys, so
  // every shadow evicts; none ever holds more than its 1,000.
  auto full = std::move(AdaptivePolicy::Create({.capacity_blocks = 10'000, .max_shadow_blocks = 1000})).value();
  ASSERT_DOUBLE_EQ(full->sample_rate(), 0.1);
  uint64_t key = 1;
  for (int r = 0; r < 400; ++r) {
    Chain c;
    for (int i = 0; i < 500; ++i) c.push_back(key++);
    full->Observe(c);
    ASSERT_LE(full->shadow_blocks(), 1000u) << "request " << r;
  }
  EXPECT_GE(full->shadow_blocks(), 950u) << "shadows fill to their size";
  // A smaller limit takes effect at the next request, and so does a
  // capacity at or below it (every identity then sampled).
  full->SetMaxShadowBlocks(300);
  EXPECT_DOUBLE_EQ(full->sample_rate(), 0.03);
  full->Observe(Chain{key, key + 1});
  EXPECT_LE(full->shadow_blocks(), 300u);
  full->SetCapacityBlocks(200);
  EXPECT_EQ(full->sample_rate(), 1.0);
  full->Observe(Chain{key + 2});
  EXPECT_LE(full->shadow_blocks(), 200u);
  EXPECT_FALSE(AdaptivePolicy::Create({.max_shadow_blocks = (uint64_t{1} << 32) + 1}).ok());
  // Below the limit every identity is in the sample.
  auto small = std::move(AdaptivePolicy::Create({.capacity_blocks = 1000, .max_shadow_blocks = 1000})).value();
  EXPECT_EQ(small->sample_rate(), 1.0);
  for (uint64_t k = 1; k < 5000; ++k) ASSERT_TRUE(small->InShadowSample(k)) << k;
}

// A sampled shadow scores a request's sampled blocks up to the first sampled
// one that misses, scaled by the rate: a chain whose sampled root missed
// scores nothing however much of the rest is present, as in the tier (a
// block is worth nothing when its prefix missed).
TEST(AdaptivePolicyTest, ASampledBlockScoresOnlyWhenTheSampledPartOfItsPrefixHit) {
  auto p = std::move(AdaptivePolicy::Create(
                         {.capacity_blocks = 10'000, .decay = 1, .experts = {"lru", "s3fifo"}, .max_shadow_blocks = 1000}))
               .value();
  ASSERT_DOUBLE_EQ(p->sample_rate(), 0.1);
  Chain a;
  for (uint64_t k = 1; k <= 400; ++k) a.push_back(k);
  const auto in_sample = [&](const Chain& c) {
    return std::count_if(c.begin(), c.end(), [&](uint64_t k) { return p->InShadowSample(k); });
  };
  const int64_t n = in_sample(a);
  ASSERT_GT(n, 10);  // about 40
  ASSERT_LT(n, 100);
  p->Observe(a);  // cold: nothing scores
  for (const auto& s : p->scores()) EXPECT_EQ(s.score, 0) << s.name;
  p->Observe(a);  // every sampled block hits: n of them, each worth 1 / rate
  for (const auto& s : p->scores()) EXPECT_NEAR(s.score, 10.0 * static_cast<double>(n), 1e-6) << s.name;

  // A fresh root (one that is in the sample) ahead of all of `a`.
  Chain b;
  for (uint64_t k = 100'001; b.empty() || !p->InShadowSample(b.back()); ++k) b.push_back(k);
  b.insert(b.end(), a.begin(), a.end());
  p->Observe(b);
  for (const auto& s : p->scores()) EXPECT_NEAR(s.score, 10.0 * static_cast<double>(n), 1e-6) << s.name;
  // The same chain with fresh blocks after it scores its prefix again.
  Chain c = a;
  for (uint64_t k = 200'001; k <= 200'100; ++k) c.push_back(k);
  p->Observe(c);
  for (const auto& s : p->scores()) EXPECT_NEAR(s.score, 20.0 * static_cast<double>(n), 1e-6) << s.name;
}

// A challenger must lead by more than switch_z standard deviations of the
// per-request difference: one lucky request (lead d, spread d) is not enough
// at z = 1, two in a row (lead 2d, spread d*sqrt(2)) are.
TEST(AdaptivePolicyTest, OneLuckyRequestDoesNotChangeTheLeader) {
  const auto w = HotAndScans(1, 400);
  auto make = [](double z) {
    return std::move(AdaptivePolicy::Create(
                         {.capacity_blocks = 200, .switch_z = z, .warmup_requests = 0, .experts = {"lru", "s3fifo"}}))
        .value();
  };
  auto eager = make(0);
  auto sure = make(1);
  size_t first_switch = w.size();
  for (size_t i = 0; i < w.size(); ++i) {
    eager->Observe(w[i]);
    sure->Observe(w[i]);
    if (eager->switches() > 0 && first_switch == w.size()) {
      first_switch = i;
      EXPECT_EQ(sure->leader(), "lru") << "switched on the first request that told the experts apart";
    }
  }
  ASSERT_LT(first_switch, w.size()) << "the workload must tell the experts apart";
  EXPECT_EQ(eager->leader(), "s3fifo");
  EXPECT_EQ(sure->leader(), "s3fifo") << "a lead that keeps growing is evidence";
  EXPECT_EQ(sure->switches(), 1u);
}

// Requests for one block each, uniformly at random: every policy hits
// capacity / keys of them in expectation, so whatever separates two experts'
// shadows is noise. The default switch rule must not chase it; switching on
// any lead (z = 0) does, many times.
TEST(AdaptivePolicyTest, ItDoesNotFlipOnNoise) {
  std::mt19937_64 rng(9);
  std::vector<Chain> w;
  for (int i = 0; i < 30000; ++i) w.push_back(Chain{1 + rng() % 1000});
  auto make = [](double z) {
    AdaptivePolicy::Options o;
    o.capacity_blocks = 200;
    o.switch_z = z;
    return std::move(AdaptivePolicy::Create(o)).value();
  };
  auto eager = make(0);
  auto fixed = make(AdaptivePolicy::Options{}.switch_z);
  for (const Chain& c : w) {
    eager->Observe(c);
    fixed->Observe(c);
  }
  ASSERT_GE(eager->switches(), 20u) << "the experts' shadows must differ by noise for the test to mean anything";
  EXPECT_LE(fixed->switches(), eager->switches() / 10) << "eager: " << eager->switches();
}

// Before its scores span what they remember, a lead says how an expert
// fills a cache, not how it keeps one: no switch during the warm-up, however
// clear the lead, and the same lead switches right after it.
TEST(AdaptivePolicyTest, NoSwitchDuringTheWarmUp) {
  const auto w = HotAndScans(1, 400);
  auto make = [](uint64_t warmup) {
    return std::move(AdaptivePolicy::Create({.capacity_blocks = 200,
                                             .switch_z = 1,
                                             .warmup_requests = warmup,
                                             .experts = {"lru", "s3fifo"}}))
        .value();
  };
  auto eager = make(0);
  auto waits = make(300);
  size_t first_switch = w.size(), waited_switch = w.size();
  for (size_t i = 0; i < w.size(); ++i) {
    eager->Observe(w[i]);
    waits->Observe(w[i]);
    if (eager->switches() > 0 && first_switch == w.size()) first_switch = i;
    if (waits->switches() > 0 && waited_switch == w.size()) waited_switch = i;
  }
  ASSERT_LT(first_switch, 250u) << "the lead must be clear early for the test to mean anything";
  EXPECT_EQ(waited_switch, 300u) << "requests are counted from 1: the 301st may switch";
  EXPECT_EQ(waits->leader(), "s3fifo");
  EXPECT_EQ(waits->switches(), 1u);
  EXPECT_EQ(AdaptivePolicy::Options{}.warmup_requests, 2000u) << "the scores' memory at the default decay";
}

// kvtierd feeds a policy the asks (ObserveRequest) only when it asks for
// them: the default must, or its arc-cutoff expert would never see a
// request and run as plain ARC while its shadow runs with the cutoff.
TEST(AdaptivePolicyTest, TheDefaultLearnsFromAsks) {
  auto d = std::move(MakeEvictionPolicy(kDefaultHostPolicy)).value();
  EXPECT_TRUE(d->ObservesRequests());
  EXPECT_TRUE(IsHostOnlyPolicy(kDefaultHostPolicy));
}

TEST(AdaptivePolicyTest, RefusesBadExpertLists) {
  EXPECT_FALSE(AdaptivePolicy::Create({.experts = {}}).ok());
  EXPECT_FALSE(AdaptivePolicy::Create({.experts = {"lru", "lru"}}).ok());
  EXPECT_FALSE(AdaptivePolicy::Create({.experts = {"lru", "clock"}}).ok());
  EXPECT_FALSE(AdaptivePolicy::Create({.experts = {"lru", "adaptive"}}).ok());
  EXPECT_FALSE(AdaptivePolicy::Create({.decay = 0}).ok());
  EXPECT_FALSE(AdaptivePolicy::Create({.decay = 1.5}).ok());
  EXPECT_FALSE(AdaptivePolicy::Create({.switch_z = -1}).ok());
  EXPECT_FALSE(AdaptivePolicy::Create({.switch_z = std::nan("")}).ok());
  EXPECT_FALSE(AdaptivePolicy::Create({.max_shadow_blocks = 0}).ok());
  EXPECT_TRUE(AdaptivePolicy::Create({.experts = {"s3fifo", "lru"}}).ok());
}

}  // namespace
}  // namespace kvtier
