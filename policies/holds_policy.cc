// SPDX-License-Identifier: Apache-2.0
// "holds": learned per-class hold times.
//
// Each time a request asks for a block (ObserveRequest), the block gets a
// class (HoldClass: its uses so far, its position, its prompt's turn, the
// requests since it was last asked for) and a deadline: now plus the hold
// time its class has in the current plan, counted in requests. The tier
// evicts the earliest deadline first; ties go to the block deeper in the
// chain that asked for it, then least recently used (blocks never asked
// for through ObserveRequest: least recently used first).
//
// The plan. Per class the policy keeps decayed counts of its asks and of
// the gaps (in requests) after which they came back, in 80 geometric bins.
// Keeping an ask for h requests costs min(gap, h) of room and wins the next
// ask when gap <= h; every room_share * capacity * requests of room the
// plan may spend goes to the classes' hold times by falling hits per unit of
// room (a fractional knapsack over each class's upper concave hull of
// (room, hits) over h: a class whose share ends inside an edge keeps its
// asks for the edge's longer hold, that edge's share of them spread evenly).
// kvtier-replay's "hold-optimum" is that same plan solved with the whole
// trace's gaps known in advance.
//
// What it remembers: per resident block its deadline and key; per block
// identity asked for recently (at most history_per_block per block of room,
// at least 1,024; see Forget) its uses, last ask, class, turn and deadline.
// An identity forgotten comes back as asked for the first time. The history
// must span the gaps worth learning: on the Mooncake conversation trace at
// 1M tokens of room, 4 per block instead of 16 cut the hit rate by 0.018
// (0.105 to 0.087 in the version measured); 64 gained nothing.
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "policies/eviction_policy.h"
#include "policies/hold_class.h"

namespace kvtier {
namespace {

constexpr int kBins = 80;
constexpr size_t kMinHistory = 1024;

// Bin b holds gaps in (top[b-1], top[b]]: 1, 2, ..., then 15% apart, up to
// ~190,000 requests (the last bin takes anything longer).
struct BinTops {
  uint64_t top[kBins];
  BinTops() {
    double x = 1;
    for (int b = 0; b < kBins; ++b) {
      top[b] = static_cast<uint64_t>(x);
      x = std::max(x * 1.15, x + 1);
    }
  }
  int Of(uint64_t gap) const {
    const int b = static_cast<int>(std::lower_bound(top, top + kBins, gap) - top);
    return std::min(b, kBins - 1);
  }
};
const BinTops& Tops() {
  static const BinTops t;
  return t;
}

class HoldsPolicy final : public EvictionPolicy {
 public:
  explicit HoldsPolicy(const HoldsOptions& o)
      : opts_(o),
        asks_(HoldClass::kCount, 0.0),
        back_(size_t{HoldClass::kCount} * kBins, 0.0),
        back_gaps_(size_t{HoldClass::kCount} * kBins, 0.0),
        hold_lo_(HoldClass::kCount, 0),
        hold_hi_(HoldClass::kCount, 0),
        p_hi_(HoldClass::kCount, 0.0),
        owed_(HoldClass::kCount, 0.0) {
    if (!(opts_.decay > 0 && opts_.decay <= 1)) opts_.decay = 0.9995;
    if (opts_.replan_every == 0) opts_.replan_every = 1;
    if (!(opts_.room_share > 0)) opts_.room_share = 1;
  }

  void Insert(uint32_t h) override { InsertAt(h, 0, 0); }
  void InsertWithKey(uint32_t h, uint64_t key) override { InsertAt(h, key, 0); }
  void InsertAt(uint32_t h, uint64_t key, uint64_t position) override {
    Grow(h);
    if (in_[h]) {
      Touch(h);
      return;
    }
    in_[h] = 1;
    ++size_;
    capacity_ = std::max<uint64_t>(capacity_, size_);
    (void)position;  // depths come from the asks: callers often do not know positions
    key_[h] = key;
    depth_[h] = 0;
    uint64_t deadline = clock_;
    if (key != 0) {
      handle_of_[key] = h;
      // Stored after the lookup that asked for it: the deadline its ask set.
      if (const Seen* s = Recall(key)) {
        deadline = s->deadline;
        depth_[h] = s->depth;
      }
    }
    SetDeadline(h, deadline);
  }
  void Touch(uint32_t h) override {
    if (h < in_.size() && in_[h]) SetDeadline(h, std::max(deadline_[h], clock_));
  }
  void Remove(uint32_t h) override {
    if (h >= in_.size() || !in_[h]) return;
    in_[h] = 0;
    --size_;
    if (key_[h] != 0) {
      if (auto it = handle_of_.find(key_[h]); it != handle_of_.end() && it->second == h) handle_of_.erase(it);
    }
  }
  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override {
    std::optional<uint32_t> found;
    aside_.clear();
    while (!heap_.empty()) {
      const Entry e = heap_.front();
      if (!Live(e)) {
        std::pop_heap(heap_.begin(), heap_.end(), Later);
        heap_.pop_back();
        continue;
      }
      if (evictable(e.handle)) {
        found = e.handle;
        break;
      }
      std::pop_heap(heap_.begin(), heap_.end(), Later);
      heap_.pop_back();
      aside_.push_back(e);
    }
    for (const Entry& e : aside_) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), Later);
    }
    return found;
  }
  // Behind a ChainGuard, asks to be offered only leaves: a parent whose
  // hold ended before its child's is passed over (kept for the child's
  // chain) rather than traded for a leaf under it, which may be the block
  // the plan would keep longest.
  bool WantsOnlyEvictableOffers() const override { return true; }
  bool Contains(uint32_t h) const override { return h < in_.size() && in_[h]; }
  size_t size() const override { return size_; }
  size_t bookkeeping() const override { return heap_.size() + handle_of_.size() + seen_.size() + older_.size(); }
  absl::string_view name() const override { return "holds"; }

  bool ObservesRequests() const override { return true; }
  void ObserveRequest(std::span<const uint64_t> chain, std::span<const uint32_t> depths, uint32_t block_tokens,
                      size_t held) override {
    (void)held;  // it learns from every ask, hit or not
    const auto depth = [&](size_t j) -> uint64_t { return depths.empty() ? j : depths[j]; };
    ++clock_;
    Decay();
    // The prompt's turn: one more than that of the deepest block past the
    // root asked for before.
    uint32_t turn = 1;
    for (size_t j = chain.size(); j-- > 0 && depth(j) > 0;) {
      if (const Seen* s = Recall(chain[j])) {
        turn = std::min<uint32_t>(s->turn, 60000) + 1;
        break;
      }
    }
    const double w = 1.0 / scale_;
    for (size_t j = 0; j < chain.size(); ++j) {
      const uint64_t key = chain[j];
      if (key == 0) continue;
      bool fresh = false;
      Seen& s = Remember(key, &fresh);
      if (!fresh && s.last == clock_) continue;  // named twice in one request: one ask
      uint64_t gap = 0;
      if (!fresh) {
        gap = clock_ - s.last;
        if (gap > 0) {
          const size_t at = size_t{s.cls} * kBins + static_cast<size_t>(Tops().Of(gap));
          back_[at] += w;
          back_gaps_[at] += double(gap) * w;
        }
      }
      if (s.uses < UINT16_MAX) ++s.uses;
      s.depth = static_cast<uint16_t>(std::min<uint64_t>(depth(j), UINT16_MAX));
      s.turn = static_cast<uint16_t>(std::max<uint32_t>(s.turn, std::min<uint32_t>(turn, 60000)));
      const uint32_t cls = HoldClass::Of(s.uses, uint64_t{block_tokens} * depth(j), turn, gap);
      asks_[cls] += w;
      s.cls = static_cast<uint16_t>(cls);
      s.last = clock_;
      s.deadline = clock_ + HoldFor(cls);
      asked_.push_back(key);
    }
    // A block is kept at least as long as the rest of the chain under it,
    // and ties go deeper first (Later), so within the chain one request
    // asked for the policy alone picks leaves first: a parent due first
    // would be passed over by the tier's leaves-first rule on every
    // eviction until its children went. It still can be due first when a
    // later request asks for only a prefix of a resident chain, or a shared
    // root with a shorter hold than another chain's blocks under it; the
    // guard passes it over then. Keeping a resident block's deadline from ever coming
    // earlier avoids that, but keeps roots for children long gone: on the
    // suite it cost 0.09 of agent at 3M tokens and 0.15 of tenants at 1M.
    uint64_t later = 0;
    for (size_t j = asked_.size(); j-- > 0;) {
      Seen& s = seen_.find(asked_[j])->second;  // asked for this request: in seen_
      later = std::max(later, s.deadline);
      s.deadline = later;
      if (auto r = handle_of_.find(asked_[j]); r != handle_of_.end() && in_[r->second]) {
        depth_[r->second] = s.depth;
        SetDeadline(r->second, later);
      }
    }
    asked_.clear();
    if (clock_ % opts_.replan_every == 0) Replan();
    Forget();
  }

 private:
  struct Entry {
    uint64_t deadline;
    uint64_t depth;  // its place in the chain that last asked for it
    uint64_t seq;
    uint32_t handle;
  };
  struct Seen {
    uint64_t last = 0;      // the request that last asked for it
    uint64_t deadline = 0;  // when that ask's hold ends
    uint16_t uses = 0;   // saturating: the classes end at 65 or more
    uint16_t depth = 0;  // its place in the chain that asked (saturating)
    uint16_t cls = 0;
    uint16_t turn = 0;
  };
  // A max-heap comparator that puts the earliest deadline on top, then the
  // deepest block as asked for (a chain's blocks share deadlines: leaves go
  // first; depths come from the asks, so blocks never asked for tie at 0),
  // then the oldest entry.
  static bool Later(const Entry& a, const Entry& b) {
    if (a.deadline != b.deadline) return a.deadline > b.deadline;
    if (a.depth != b.depth) return a.depth < b.depth;
    return a.seq > b.seq;
  }
  bool Live(const Entry& e) const { return in_[e.handle] && seq_[e.handle] == e.seq; }

  void Grow(uint32_t h) {
    if (h >= in_.size()) {
      in_.resize(size_t{h} + 1, 0);
      key_.resize(size_t{h} + 1, 0);
      deadline_.resize(size_t{h} + 1, 0);
      depth_.resize(size_t{h} + 1, 0);
      seq_.resize(size_t{h} + 1, 0);
    }
  }
  void SetDeadline(uint32_t h, uint64_t deadline) {
    deadline_[h] = deadline;
    seq_[h] = ++next_seq_;
    if (heap_.size() > 2 * size_ + 64) {
      // Keep only the live entries: stale ones (touched since, removed)
      // would otherwise pile up. Each handle has one live entry.
      std::erase_if(heap_, [&](const Entry& e) { return !Live(e); });
      std::make_heap(heap_.begin(), heap_.end(), Later);
    }
    heap_.push_back(Entry{deadline, depth_[h], seq_[h], h});
    std::push_heap(heap_.begin(), heap_.end(), Later);
  }

  // The class's longer hold for a p_hi share of its asks, spread evenly
  // (not drawn at random: the same requests get the same holds whatever
  // the keys are, in kvtierd and in the simulator alike).
  uint64_t HoldFor(uint32_t cls) {
    if (p_hi_[cls] > 0) {
      owed_[cls] += p_hi_[cls];
      if (owed_[cls] >= 1) {
        owed_[cls] -= 1;
        return hold_hi_[cls];
      }
    }
    return hold_lo_[cls];
  }

  // Counts are kept divided by scale_, which shrinks by decay per request;
  // they are renormalized before scale_ underflows.
  void Decay() {
    scale_ *= opts_.decay;
    if (scale_ < 1e-100) {
      for (double& x : asks_) x *= scale_;
      for (double& x : back_) x *= scale_;
      for (double& x : back_gaps_) x *= scale_;
      requests_ *= scale_;
      scale_ = 1;
    }
    requests_ += 1.0 / scale_;
  }

  void Replan() {
    struct Edge {
      double slope, room;
      uint32_t cls;
      uint64_t hold;
    };
    struct Pt {
      double room, hits;
      uint64_t hold;
    };
    std::vector<Edge> edges;
    std::vector<Pt> hull;
    const BinTops& tops = Tops();
    for (uint32_t c = 0; c < HoldClass::kCount; ++c) {
      const double n = asks_[c] * scale_;
      if (n <= 0) continue;
      hull.assign(1, Pt{0, 0, 0});
      double hits = 0, gaps = 0;
      for (int b = 0; b < kBins; ++b) {
        const double k = back_[size_t{c} * kBins + b] * scale_;
        if (k <= 0) continue;
        hits += k;
        gaps += back_gaps_[size_t{c} * kBins + b] * scale_;
        const Pt p{gaps + std::max(0.0, n - hits) * double(tops.top[b]), hits, tops.top[b]};
        while (hull.size() >= 2) {
          const Pt& a = hull[hull.size() - 2];
          const Pt& m = hull.back();
          if ((m.hits - a.hits) * (p.room - a.room) <= (p.hits - a.hits) * (m.room - a.room)) {
            hull.pop_back();
          } else {
            break;
          }
        }
        hull.push_back(p);
      }
      for (size_t i = 1; i < hull.size(); ++i) {
        const double room = hull[i].room - hull[i - 1].room, won = hull[i].hits - hull[i - 1].hits;
        if (room > 0 && won > 0) edges.push_back(Edge{won / room, room, c, hull[i].hold});
      }
    }
    std::stable_sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.slope > b.slope; });
    std::fill(hold_lo_.begin(), hold_lo_.end(), 0);
    std::fill(hold_hi_.begin(), hold_hi_.end(), 0);
    std::fill(p_hi_.begin(), p_hi_.end(), 0.0);
    double budget = opts_.room_share * double(capacity_) * requests_ * scale_;
    for (const Edge& e : edges) {
      if (budget <= 0) break;
      if (e.room <= budget) {
        hold_lo_[e.cls] = e.hold;
        budget -= e.room;
      } else {
        hold_hi_[e.cls] = e.hold;
        p_hi_[e.cls] = budget / e.room;
        break;  // the room ends inside this edge
      }
    }
  }

  // Identities live in two generations: asked for since the last turnover
  // (seen_), and before it (older_). Once seen_ holds half the history
  // (history_per_block per block of room, at least kMinHistory), it becomes
  // older_ and what older_ held is forgotten: an identity is remembered for
  // at least half the history's asks since its last.
  const Seen* Recall(uint64_t key) const {
    if (auto it = seen_.find(key); it != seen_.end()) return &it->second;
    if (auto it = older_.find(key); it != older_.end()) return &it->second;
    return nullptr;
  }
  Seen& Remember(uint64_t key, bool* fresh) {
    if (auto it = seen_.find(key); it != seen_.end()) return it->second;
    Seen s;
    *fresh = true;
    if (auto it = older_.find(key); it != older_.end()) {
      s = it->second;
      older_.erase(it);
      *fresh = false;
    }
    return seen_.emplace(key, s).first->second;
  }
  void Forget() {
    const size_t most = std::max<size_t>(kMinHistory, size_t{opts_.history_per_block} * capacity_);
    if (seen_.size() >= most / 2) {
      older_ = std::move(seen_);
      seen_ = {};
    }
  }

  HoldsOptions opts_;
  // Per handle.
  std::vector<uint8_t> in_;
  std::vector<uint64_t> key_, deadline_, seq_;
  std::vector<uint16_t> depth_;
  size_t size_ = 0;
  uint64_t capacity_ = 0;  // the most blocks tracked at once: the tier's room
  uint64_t next_seq_ = 0;
  std::vector<Entry> heap_, aside_;
  std::vector<uint64_t> asked_;  // this request's keys, root first
  absl::flat_hash_map<uint64_t, uint32_t> handle_of_;  // tracked keys
  // Per identity asked for recently (see Forget).
  absl::flat_hash_map<uint64_t, Seen> seen_, older_;
  // What was learned (divided by scale_), and the plan.
  uint64_t clock_ = 0;  // requests observed
  double scale_ = 1, requests_ = 0;
  std::vector<double> asks_, back_, back_gaps_;
  std::vector<uint64_t> hold_lo_, hold_hi_;
  std::vector<double> p_hi_, owed_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeHoldsPolicy(const HoldsOptions& opts) {
  return std::make_unique<HoldsPolicy>(opts);
}

}  // namespace kvtier
