// SPDX-License-Identifier: Apache-2.0
#include "tools/replay/online_bound.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvtier::tools {
namespace {

// One edge of a class's hull: so much more room buys so many more hits.
struct Edge {
  double slope;  // hits per unit of room
  uint64_t room;
  uint64_t hits;
};

// The upper concave hull of (room, hits) over hold times for one class.
// gaps (sorted): its asks that come back, after that many requests; tails
// (sorted): its asks that never do, with the requests left until the
// workload ends (keeping one longer costs nothing more). Hold h: hits =
// #(gap <= h), room = sum(min(gap, h)) + sum(min(tail, h)). Between two
// gaps the hits stay and the room grows, so only hold times equal to some
// gap can be corners.
void AddHullEdges(const std::vector<uint32_t>& gaps, const std::vector<uint32_t>& tails, std::vector<Edge>& out) {
  struct Pt {
    uint64_t room, hits;
  };
  std::vector<Pt> hull = {{0, 0}};
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
    const Pt p{gap_sum + tail_sum + (gaps.size() - k + tails.size() - m) * h, k};
    while (hull.size() >= 2 && under(hull[hull.size() - 2], hull.back(), p)) hull.pop_back();
    hull.push_back(p);
  }
  for (size_t i = 1; i < hull.size(); ++i) {
    const uint64_t room = hull[i].room - hull[i - 1].room, hits = hull[i].hits - hull[i - 1].hits;
    if (room > 0 && hits > 0) out.push_back(Edge{double(hits) / double(room), room, hits});
  }
}

}  // namespace

uint32_t OnlineBoundClass::Of(uint64_t uses, uint64_t position_tokens, uint64_t turn, uint64_t last_gap) {
  const uint32_t u = uses <= 2    ? static_cast<uint32_t>(std::max<uint64_t>(uses, 1) - 1)
                     : uses <= 4  ? 2
                     : uses <= 8  ? 3
                     : uses <= 16 ? 4
                     : uses <= 64 ? 5
                                  : 6;
  const uint32_t pos = position_tokens < 1024 ? 0 : position_tokens < 4096 ? 1 : position_tokens < 12288 ? 2 : 3;
  const uint32_t t = static_cast<uint32_t>(std::clamp<uint64_t>(turn, 1, kTurnClasses) - 1);
  uint32_t g = 0;  // never asked for before
  if (last_gap > 0) {
    g = 1;
    for (uint64_t top = 4; g < kLastGapClasses - 1 && last_gap >= top; top *= 4) ++g;
  }
  return ((u * kPositionClasses + pos) * kTurnClasses + t) * kLastGapClasses + g;
}

absl::StatusOr<OnlineBound> ComputeOnlineBound(const Workload& w, const Prepared& p, uint64_t capacity_blocks) {
  if (capacity_blocks == 0) return absl::InvalidArgumentError("the online bound needs a tier with room");
  if (p.next_use.size() != p.ids.size()) {
    return absl::InvalidArgumentError("the online bound needs the workload prepared with next uses");
  }
  if (p.ids.size() >= std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("the online bound takes fewer than 2^32 requests, not ",
                                                   p.ids.size()));
  }
  const uint64_t bt = w.block_tokens;
  std::vector<uint32_t> uses(p.distinct, 0);
  std::vector<uint32_t> last_asked(p.distinct, 0);  // request index + 1 (0: never)
  // Per block, the highest turn of the prompts that asked for it (0: none yet).
  std::vector<uint32_t> turn_of(p.distinct, 0);
  std::vector<std::vector<uint32_t>> gaps(OnlineBoundClass::kCount), tails(OnlineBoundClass::kCount);
  OnlineBound b;
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
    for (size_t j = 0; j < ids.size(); ++j) {
      const uint32_t id = ids[j];
      if (uses[id] < std::numeric_limits<uint32_t>::max()) ++uses[id];
      turn_of[id] = std::max(turn_of[id], turn);
      const uint64_t last_gap = last_asked[id] == 0 ? 0 : r + 1 - last_asked[id];
      last_asked[id] = static_cast<uint32_t>(r + 1);
      const uint32_t c = OnlineBoundClass::Of(uses[id], j * bt, turn, last_gap);
      ++b.requested;
      const uint64_t next = p.next_use[r][j];
      if (next != BeladyPolicy::kNever) {
        gaps[c].push_back(static_cast<uint32_t>(next - r));
      } else {
        tails[c].push_back(static_cast<uint32_t>(p.ids.size() - r));
      }
    }
  }
  std::vector<Edge> edges;
  for (uint32_t c = 0; c < OnlineBoundClass::kCount; ++c) {
    if (gaps[c].empty() && tails[c].empty()) continue;
    ++b.classes;
    std::sort(gaps[c].begin(), gaps[c].end());
    std::sort(tails[c].begin(), tails[c].end());
    AddHullEdges(gaps[c], tails[c], edges);
  }
  // Each class's edges fall in slope, so taking all edges by falling slope
  // takes each class's in order: the greedy fill is the knapsack's optimum.
  std::stable_sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& c) { return a.slope > c.slope; });
  double budget = double(capacity_blocks) * double(p.ids.size());
  for (const Edge& e : edges) {
    if (budget <= 0) break;
    const double take = std::min(1.0, budget / double(e.room));
    b.hits += take * double(e.hits);
    budget -= take * double(e.room);
  }
  return b;
}

}  // namespace kvtier::tools
