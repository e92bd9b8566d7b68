// SPDX-License-Identifier: Apache-2.0
#include "tools/replay/hold_optimum.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace kvtier::tools {
namespace {

// One edge of a class's hull: so much more room buys so many more hits.
struct Edge {
  double slope;  // hits per unit of room
  uint64_t room;
  uint64_t hits;
  uint32_t cls;
  uint64_t hold;  // the hold time at its end
};

// The upper concave hull of (room, hits) over hold times for one class.
// gaps (sorted): its asks that come back, after that many requests; tails
// (sorted): its asks that never do, with the requests left until the
// workload ends (keeping one longer costs nothing more). Hold h: hits =
// #(gap <= h), room = sum(min(gap, h)) + sum(min(tail, h)). Between two
// gaps the hits stay and the room grows, so only hold times equal to some
// gap can be corners.
void AddHullEdges(uint32_t cls, const std::vector<uint32_t>& gaps, const std::vector<uint32_t>& tails,
                  std::vector<Edge>& out) {
  struct Pt {
    uint64_t room, hits, hold;
  };
  std::vector<Pt> hull = {{0, 0, 0}};
  // (b - a) x (c - a) >= 0: b lies on or under the chord a-c, so it goes.
  auto under = [](const Pt& a, const Pt& b, const Pt& c) {
    const __int128 bx = __int128(b.room) - a.room, by = __int128(b.hits) - a.hits;
    const __int128 cx = __int128(c.room) - a.room, cy = __int128(c.hits) - a.hits;
    return by * cx <= cy * bx;
  };
  uint64_t gap_sum = 0, tail_sum = 0;
  size_t k = 0, m = 0;
  while (k < gaps.size()) {
    const uint64_t h = gaps[k];
    while (k < gaps.size() && gaps[k] == h) gap_sum += gaps[k++];
    while (m < tails.size() && tails[m] <= h) tail_sum += tails[m++];
    const Pt p{gap_sum + tail_sum + (gaps.size() - k + tails.size() - m) * h, k, h};
    while (hull.size() >= 2 && under(hull[hull.size() - 2], hull.back(), p)) hull.pop_back();
    hull.push_back(p);
  }
  for (size_t i = 1; i < hull.size(); ++i) {
    const uint64_t room = hull[i].room - hull[i - 1].room, hits = hull[i].hits - hull[i - 1].hits;
    if (room > 0 && hits > 0) out.push_back(Edge{double(hits) / double(room), room, hits, cls, hull[i].hold});
  }
}

}  // namespace

namespace {

// Every ask of a workload, classified, with when its block is asked for
// again.
struct Classified {
  std::vector<std::vector<uint32_t>> cls_of;  // per request and block
  std::vector<std::vector<uint32_t>> gaps, tails;  // per class
  uint64_t requested = 0;
  uint32_t classes = 0;
};

absl::StatusOr<Classified> Classify(const Workload& w, const Prepared& p) {
  if (p.next_use.size() != p.ids.size()) {
    return absl::InvalidArgumentError("the hold optimum needs the workload prepared with next uses");
  }
  if (p.ids.size() >= std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("the hold optimum takes fewer than 2^32 requests, not ",
                                                   p.ids.size()));
  }
  const uint64_t bt = w.block_tokens;
  std::vector<uint32_t> uses(p.distinct, 0);
  std::vector<uint32_t> last_asked(p.distinct, 0);  // request index + 1 (0: never)
  // Per block, the highest turn of the prompts that asked for it (0: none yet).
  std::vector<uint32_t> turn_of(p.distinct, 0);
  Classified k;
  k.cls_of.resize(p.ids.size());
  k.gaps.resize(HoldClass::kCount);
  k.tails.resize(HoldClass::kCount);
  for (size_t r = 0; r < p.ids.size(); ++r) {
    const std::vector<uint32_t>& ids = p.ids[r];
    // The turn: one more than that of the deepest block past the root an
    // earlier prompt already asked for.
    uint32_t turn = 1;
    for (size_t j = ids.size(); j-- > 1;) {
      if (turn_of[ids[j]] > 0) {
        turn = turn_of[ids[j]] + 1;
        break;
      }
    }
    k.cls_of[r].resize(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      const uint32_t id = ids[j];
      if (uses[id] < std::numeric_limits<uint32_t>::max()) ++uses[id];
      turn_of[id] = std::max(turn_of[id], turn);
      const uint64_t last_gap = last_asked[id] == 0 ? 0 : r + 1 - last_asked[id];
      last_asked[id] = static_cast<uint32_t>(r + 1);
      const uint32_t c = HoldClass::Of(uses[id], j * bt, turn, last_gap);
      k.cls_of[r][j] = c;
      ++k.requested;
      const uint64_t next = p.next_use[r][j];
      if (next != BeladyPolicy::kNever) {
        k.gaps[c].push_back(static_cast<uint32_t>(next - r));
      } else {
        k.tails[c].push_back(static_cast<uint32_t>(p.ids.size() - r));
      }
    }
  }
  for (uint32_t c = 0; c < HoldClass::kCount; ++c) {
    if (k.gaps[c].empty() && k.tails[c].empty()) continue;
    ++k.classes;
    std::sort(k.gaps[c].begin(), k.gaps[c].end());
    std::sort(k.tails[c].begin(), k.tails[c].end());
  }
  return k;
}

// How long the optimum keeps each class's asks: h_lo, or h_hi with
// probability p_hi (the one class whose edge the room ends in).
struct HoldPlan {
  std::vector<uint64_t> h_lo, h_hi;
  std::vector<double> p_hi;
};

// The knapsack: edges by falling slope while room lasts. Each class's edges
// fall in slope, so this takes each class's in order, and it is the optimum.
double Solve(const Classified& k, double budget, HoldPlan* plan) {
  std::vector<Edge> edges;
  for (uint32_t c = 0; c < HoldClass::kCount; ++c) AddHullEdges(c, k.gaps[c], k.tails[c], edges);
  std::stable_sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& c) { return a.slope > c.slope; });
  if (plan != nullptr) {
    plan->h_lo.assign(HoldClass::kCount, 0);
    plan->h_hi.assign(HoldClass::kCount, 0);
    plan->p_hi.assign(HoldClass::kCount, 0);
  }
  double hits = 0;
  for (const Edge& e : edges) {
    if (budget <= 0) break;
    const double take = std::min(1.0, budget / double(e.room));
    hits += take * double(e.hits);
    budget -= take * double(e.room);
    if (take < 1.0) {
      // The room ends in this edge (what rounding leaves of it must not
      // reach later edges and overwrite their classes' plans).
      if (plan != nullptr) {
        plan->h_hi[e.cls] = e.hold;
        plan->p_hi[e.cls] = take;
      }
      break;
    }
    if (plan != nullptr) plan->h_lo[e.cls] = e.hold;
  }
  return hits;
}

// A tier of `capacity` blocks that keeps each ask as the plan says: a
// block's deadline is the request it was last asked for plus its hold, and
// the tier evicts the earliest deadline first, leaves before parents, never
// the blocks of the request it serves. Returns the prefix hits.
absl::StatusOr<uint64_t> RunHoldPlan(const Prepared& p, const Classified& k, const HoldPlan& plan,
                                     uint64_t capacity) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> coin(0, 1);
  std::vector<uint64_t> deadline(p.distinct, 0);
  std::vector<uint8_t> resident(p.distinct, 0);
  std::vector<uint32_t> children(p.distinct, 0), serving(p.distinct, UINT32_MAX);
  using Entry = std::pair<uint64_t, uint32_t>;  // deadline, block
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> order;
  std::vector<Entry> serving_now;
  std::vector<uint8_t> waiting(p.distinct, 0);
  uint64_t count = 0, hits = 0;
  for (size_t r = 0; r < p.ids.size(); ++r) {
    const std::vector<uint32_t>& ids = p.ids[r];
    size_t hit = 0;
    while (hit < ids.size() && resident[ids[hit]]) ++hit;
    hits += hit;
    for (size_t j = 0; j < ids.size(); ++j) {
      const uint32_t id = ids[j], c = k.cls_of[r][j];
      const uint64_t hold = plan.p_hi[c] > 0 && coin(rng) < plan.p_hi[c] ? plan.h_hi[c] : plan.h_lo[c];
      if (!resident[id]) {
        resident[id] = 1;
        ++count;
        if (p.parent[id] != UINT32_MAX) ++children[p.parent[id]];
      }
      deadline[id] = r + hold;
      order.push({deadline[id], id});
      waiting[id] = 0;  // this entry offers it
      serving[id] = static_cast<uint32_t>(r);
    }
    while (count > capacity && !order.empty()) {
      const auto [d, id] = order.top();
      order.pop();
      if (!resident[id] || deadline[id] != d) continue;  // stale
      if (serving[id] == r) {
        serving_now.push_back({d, id});
        continue;
      }
      if (children[id] > 0) {
        waiting[id] = 1;  // offered again when its last child goes
        continue;
      }
      resident[id] = 0;
      --count;
      const uint32_t parent = p.parent[id];
      if (parent != UINT32_MAX && --children[parent] == 0 && waiting[parent]) {
        waiting[parent] = 0;
        order.push({deadline[parent], parent});
      }
    }
    for (const Entry& e : serving_now) order.push(e);
    serving_now.clear();
    if (count > capacity) {
      // Only a parent whose recorded child is this request's, while it is
      // not (a trace whose ids are not chained), can be left: no tier could
      // keep that prefix.
      return absl::InvalidArgumentError(absl::StrCat("the hold oracle cannot bring the tier back to ", capacity,
                                                     " blocks after request ", r + 1,
                                                     ": its blocks' chains are not prefixes"));
    }
  }
  return hits;
}

}  // namespace

absl::StatusOr<HoldOptimum> ComputeHoldOptimum(const Workload& w, const Prepared& p, uint64_t capacity_blocks) {
  if (capacity_blocks == 0) return absl::InvalidArgumentError("the hold optimum needs a tier with room");
  ASSIGN_OR_RETURN(Classified k, Classify(w, p));
  HoldOptimum b;
  b.requested = k.requested;
  b.classes = k.classes;
  b.hits = Solve(k, double(capacity_blocks) * double(p.ids.size()), nullptr);
  return b;
}

absl::StatusOr<HoldOracle> SimulateHoldOracle(const Workload& w, const Prepared& p, uint64_t capacity_blocks) {
  if (capacity_blocks == 0) return absl::InvalidArgumentError("the hold oracle needs a tier with room");
  for (size_t r = 0; r < p.ids.size(); ++r) {
    if (p.ids[r].size() > capacity_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("request ", r + 1, " has ", p.ids[r].size(),
                                                     " blocks, more than the simulated tier holds (",
                                                     capacity_blocks, "); give it more capacity"));
    }
  }
  ASSIGN_OR_RETURN(Classified k, Classify(w, p));
  HoldOracle best;
  best.requested = k.requested;
  for (double share : HoldOracle::kRoomShares) {
    HoldPlan plan;
    Solve(k, share * double(capacity_blocks) * double(p.ids.size()), &plan);
    ASSIGN_OR_RETURN(const uint64_t hits, RunHoldPlan(p, k, plan, capacity_blocks));
    if (hits > best.hits || best.room_share == 0) {
      best.hits = hits;
      best.room_share = share;
    }
  }
  return best;
}

}  // namespace kvtier::tools
