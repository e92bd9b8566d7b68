// S3-FIFO (Yang et al., SOSP '23): a small FIFO that filters one-hit
// wonders, a main FIFO with lazy reinsertion (CLOCK-like, 2-bit frequency),
// and a ghost FIFO of keys recently evicted from the small queue. A new
// block enters the small queue unless its key is a ghost (it was evicted
// young and came back), in which case it goes straight to main.
//
// Variant (S3FifoOptions): blocks deep in their chain enter main directly,
// and the small queue's share can be set ("s3fifo-deep" in the config).
//
// Victim choice: from the small queue while it holds at least its share
// (10%) of the tracked blocks; its oldest block moves to main if it was used since
// insertion, else it is the victim (and its key becomes a ghost when it is
// removed). From main: the oldest block with frequency 0; others lose one
// and go round again. Blocks the caller cannot evict (pinned) go round too,
// without losing frequency.
//
// Handles are dense (0..n): per-handle state lives in arrays.
#include <algorithm>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "policies/eviction_policy.h"

namespace kvtier {
namespace {

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(const S3FifoOptions& opts) : opts_(opts) {}

  void Insert(uint32_t h) override { InsertAt(h, 0, 0); }
  void InsertWithKey(uint32_t h, uint64_t key_hash) override { InsertAt(h, key_hash, 0); }

  void InsertAt(uint32_t h, uint64_t key_hash, uint64_t position) override {
    Grow(h);
    if (state_[h].queue != kNone) {
      Touch(h);
      return;
    }
    bool ghost = false;
    if (key_hash != 0) {
      if (auto g = ghosts_.find(key_hash); g != ghosts_.end()) {
        ghost = true;
        ghosts_.erase(g);  // its FIFO entry is skipped when it reaches the end
      }
    }
    const bool deep = opts_.main_from_position != 0 && position >= opts_.main_from_position;
    const bool to_main = ghost || deep;
    state_[h] = State{to_main ? kMain : kSmall, 0, ++stamp_, key_hash};
    (to_main ? main_ : small_).push_back(Entry{h, state_[h].stamp});
    ++(to_main ? main_size_ : small_size_);
  }

  void Touch(uint32_t h) override {
    if (h < state_.size() && state_[h].queue != kNone && state_[h].freq < 3) ++state_[h].freq;
  }

  void Remove(uint32_t h) override {
    if (h >= state_.size() || state_[h].queue == kNone) return;
    State& s = state_[h];
    if (s.queue == kSmall) {
      --small_size_;
      // Evicted young and never used again: remember the key.
      if (s.freq == 0 && s.key != 0) AddGhost(s.key);
    } else {
      --main_size_;
    }
    s.queue = kNone;  // its queue entry goes stale (stamp no longer matches)
    CompactIfStale();
    TrimGhosts();
  }

  std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) override {
    const size_t total = small_size_ + main_size_;
    if (total == 0) return std::nullopt;
    // Every block is looked at a bounded number of times: promotions from
    // small to main once each, main blocks at most 4 times (frequency 3 .. 0
    // then taken); when everything is pinned the budget runs out: nullopt.
    size_t budget = 6 * total + 16;
    while (budget-- > 0) {
      const bool from_small =
          small_size_ > 0 && (double(small_size_) >= opts_.small_share * double(total) || main_size_ == 0);
      std::deque<Entry>& q = from_small ? small_ : main_;
      if (!DropStale(q)) {
        if (from_small) continue;  // cannot happen: small_size_ > 0 means a live entry
        return std::nullopt;
      }
      const Entry e = q.front();
      State& s = state_[e.handle];
      if (from_small) {
        q.pop_front();
        if (s.freq > 0 || !evictable(e.handle)) {
          // Used while young (or pinned): it moves to main.
          --small_size_;
          ++main_size_;
          s.queue = kMain;
          s.freq = 0;
          s.stamp = ++stamp_;
          main_.push_back(Entry{e.handle, s.stamp});
          continue;
        }
        // Keep it at the front of small: Remove() will follow.
        q.push_front(e);
        return e.handle;
      }
      if (!evictable(e.handle)) {
        q.pop_front();
        s.stamp = ++stamp_;
        q.push_back(Entry{e.handle, s.stamp});
        continue;
      }
      if (s.freq > 0) {
        q.pop_front();
        --s.freq;
        s.stamp = ++stamp_;
        q.push_back(Entry{e.handle, s.stamp});
        continue;
      }
      return e.handle;
    }
    return std::nullopt;
  }

  bool Contains(uint32_t h) const override { return h < state_.size() && state_[h].queue != kNone; }
  size_t size() const override { return small_size_ + main_size_; }
  size_t bookkeeping() const override { return small_.size() + main_.size() + ghosts_.size() + ghost_fifo_.size(); }
  absl::string_view name() const override { return opts_.name; }

 private:
  static constexpr uint8_t kNone = 0, kSmall = 1, kMain = 2;
  static constexpr size_t kStaleMargin = 64;
  const S3FifoOptions opts_;
  struct State {
    uint8_t queue = kNone;
    uint8_t freq = 0;
    uint64_t stamp = 0;  // matches the live queue entry
    uint64_t key = 0;
  };
  struct Entry {
    uint32_t handle;
    uint64_t stamp;
  };

  // Stale entries (removed or moved blocks) leave a queue only when they
  // reach its front in PickVictim, and a policy that never picks (an
  // adaptive policy's experts other than the leader) never drops them: they
  // grew by ~33 bytes per stored block without bound. A queue holding more
  // stale entries than live ones plus a margin is rebuilt without them, so
  // each queue stays within twice its live entries plus the margin
  // (amortized O(1) per operation).
  void CompactIfStale() {
    auto compact = [&](std::deque<Entry>& q, uint8_t which, size_t live) {
      if (q.size() <= 2 * live + kStaleMargin) return;
      std::deque<Entry> kept;
      for (const Entry& e : q) {
        const State& st = state_[e.handle];
        if (st.queue == which && st.stamp == e.stamp) kept.push_back(e);
      }
      q.swap(kept);
    };
    compact(small_, kSmall, small_size_);
    compact(main_, kMain, main_size_);
  }

  void Grow(uint32_t h) {
    if (h >= state_.size()) state_.resize(std::max<size_t>(h + 1, state_.size() * 2));
  }
  // Pops entries whose block was removed or moved; false if q is empty.
  bool DropStale(std::deque<Entry>& q) {
    while (!q.empty()) {
      const Entry& e = q.front();
      const State& s = state_[e.handle];
      if (s.queue != kNone && s.stamp == e.stamp) return true;
      q.pop_front();
    }
    return false;
  }
  void AddGhost(uint64_t key) {
    ghosts_[key] = ++ghost_stamp_;
    ghost_fifo_.push_back({key, ghost_stamp_});
    TrimGhosts();
  }
  void TrimGhosts() {
    // As many ghosts as tracked blocks, at least a few.
    const size_t cap = std::max<size_t>(small_size_ + main_size_, 64);
    while (ghosts_.size() > cap && !ghost_fifo_.empty()) {
      auto [k, st] = ghost_fifo_.front();
      ghost_fifo_.pop_front();
      if (auto g = ghosts_.find(k); g != ghosts_.end() && g->second == st) ghosts_.erase(g);
    }
    // Keep the FIFO from growing with stale entries.
    while (ghost_fifo_.size() > 2 * cap + 64) {
      auto [k, st] = ghost_fifo_.front();
      ghost_fifo_.pop_front();
      if (auto g = ghosts_.find(k); g != ghosts_.end() && g->second == st) ghosts_.erase(g);
    }
  }

  std::vector<State> state_;
  std::deque<Entry> small_, main_;
  size_t small_size_ = 0, main_size_ = 0;
  uint64_t stamp_ = 0;
  absl::flat_hash_map<uint64_t, uint64_t> ghosts_;  // key -> its stamp in ghost_fifo_
  std::deque<std::pair<uint64_t, uint64_t>> ghost_fifo_;
  uint64_t ghost_stamp_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeS3FifoPolicy(const S3FifoOptions& opts) {
  return std::make_unique<S3FifoPolicy>(opts);
}

}  // namespace kvtier
