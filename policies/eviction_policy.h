// SPDX-License-Identifier: Apache-2.0
// Eviction policies order a tier's resident blocks by who goes first. Blocks
// are named by the tier's dense slot handles (uint32), so a policy's memory is
// a few words per slot and no pointers. Per-handle tables grow with
// resize(handle + 1): the vector's own growth keeps that amortized, and only
// the handles in use are written, so only they cost resident memory (growing
// the size itself by doubling wrote, and kept resident, up to twice as much).
#ifndef KVTIER_POLICIES_EVICTION_POLICY_H_
#define KVTIER_POLICIES_EVICTION_POLICY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace kvtier {

// Each tracked handle's identity (the key_hash it was inserted with; 0 when
// none was given), kept by whoever wraps a policy, for as long as the handle
// is tracked, including during the policy's Remove of it.
class HandleKeys {
 public:
  virtual uint64_t KeyOf(uint32_t handle) const = 0;

 protected:
  ~HandleKeys() = default;
};

class EvictionPolicy {
 public:
  EvictionPolicy() = default;
  virtual ~EvictionPolicy() = default;
  EvictionPolicy(const EvictionPolicy&) = delete;
  EvictionPolicy& operator=(const EvictionPolicy&) = delete;

  // All methods: the caller serializes calls (the owning tier's lock).
  // Starts tracking `handle` as just used. Inserting a tracked handle touches it.
  virtual void Insert(uint32_t handle) = 0;
  // As Insert, naming the block's identity (a hash of namespace and key,
  // never 0) so a policy can recognise a block that comes back after being
  // evicted (S3-FIFO's ghosts). Policies that do not care ignore it.
  virtual void InsertWithKey(uint32_t handle, uint64_t key_hash) {
    (void)key_hash;
    Insert(handle);
  }
  // As InsertWithKey, with the block's position in its chain: the tokens
  // before it (0: a root, or not known). Deep blocks belong to long
  // conversations, which come back more often than short ones (on the
  // Mooncake conversation trace the chance of another turn grows from 0.31
  // after the first to 0.75), and a hit on them saves more prefill (the
  // attention term grows with position). Policies that do not care ignore it.
  virtual void InsertAt(uint32_t handle, uint64_t key_hash, uint64_t position_tokens) {
    (void)position_tokens;
    InsertWithKey(handle, key_hash);
  }
  // Records a use of a tracked handle; untracked handles are ignored.
  virtual void Touch(uint32_t handle) = 0;
  // Stops tracking handle; untracked handles are ignored.
  virtual void Remove(uint32_t handle) = 0;
  // The handle to evict first among those for which evictable(handle) holds
  // (e.g. "not pinned"), or nullopt. Does not remove it.
  virtual std::optional<uint32_t> PickVictim(absl::FunctionRef<bool(uint32_t)> evictable) = 0;
  // How a tier that keeps chains leaf-first (ChainGuard) should ask: true
  // when choosing a victim changes the policy's state (an admission duel),
  // so the tier must only offer blocks it may really evict; false when the
  // tier may take a leaf under the block the policy chose instead.
  virtual bool WantsOnlyEvictableOffers() const { return false; }
  virtual bool Contains(uint32_t handle) const = 0;
  virtual size_t size() const = 0;
  // Entries the policy keeps beyond its per-handle arrays (queue entries,
  // ghosts, frequency counts, maps), for tests and kvtierctl: a small
  // multiple of size() plus a constant, whatever the history of inserts and
  // removes. Policies without such structures keep size() of them.
  virtual size_t bookkeeping() const { return size(); }
  virtual absl::string_view name() const = 0;
  // A wrapper that keeps every handle's key (ChainGuard) offers it here,
  // before the first insert and for the policy's lifetime, over the same
  // handles: a policy that needs keys later (S3-FIFO's ghosts) then keeps no
  // copy of its own. Policies that keep no keys, or name handles differently
  // (the sparse-handle adapter), ignore it.
  virtual void ShareKeys(const HandleKeys* keys) { (void)keys; }
  // Policies that learn from every request, its misses included ("holds",
  // "arc-cutoff", and the adaptive policy with either as an expert): true,
  // and they are fed
  // each looked-up chain of block identities (root first, never 0) through
  // ObserveRequest, under the caller's lock, once per request, after the
  // lookup touched its hits and before the blocks it missed are inserted.
  // depths: each identity's place in the engine's chain when `chain` is a
  // sample of it (empty: its place in `chain`); a block's position is its
  // depth times block_tokens (0: not known). held: how many of `chain`'s
  // first entries the tiers held when it was asked for (its hit prefix);
  // the rest the request computes, and stores. The adaptive policy's
  // shadows observe through its own thread-safe Observe.
  virtual bool ObservesRequests() const { return false; }
  virtual void ObserveRequest(std::span<const uint64_t> chain, std::span<const uint32_t> depths,
                              uint32_t block_tokens, size_t held) {
    (void)chain;
    (void)depths;
    (void)block_tokens;
    (void)held;
  }
};

// Least recently used first. Handles should be dense (0..n): the links live
// in arrays indexed by handle.
std::unique_ptr<EvictionPolicy> MakeLruPolicy();
// LRU for sparse handles (the NVMe tier's segment<<16|slot): links in a hash map.
std::unique_ptr<EvictionPolicy> MakeSparseLruPolicy();
// Any dense-handle policy over sparse handles: tracked handles are mapped to
// dense ones (reused after Remove).
std::unique_ptr<EvictionPolicy> MakeSparseHandlePolicy(std::unique_ptr<EvictionPolicy> dense);

// S3-FIFO: scan resistant (a small probation FIFO, a main FIFO with lazy
// reinsertion, ghosts of keys evicted young). Dense handles.
struct S3FifoOptions {
  absl::string_view name = "s3fifo";
  // The probation queue's share of the tracked blocks.
  double small_share = 0.1;
  // Blocks at this position (tokens before them) or deeper skip probation
  // and enter main (0: none do).
  uint64_t main_from_position = 0;
};
std::unique_ptr<EvictionPolicy> MakeS3FifoPolicy(const S3FifoOptions& opts = {});
// "s3fifo-deep": S3-FIFO that trusts depth. On the Mooncake conversation
// trace (512-token blocks) a 2% probation queue with blocks from 12K tokens
// on entering main directly gets 0.109 / 0.188 / 0.263 of tokens at 1M / 3M
// / 10M tokens of room, against 0.093 / 0.179 / 0.267 for plain S3-FIFO.
// The threshold was chosen with one ghost per block (0.103 / 0.186 then): it
// is flat from 8K to 16K tokens (0.184 .. 0.186 at 3M).
inline constexpr S3FifoOptions kDeepS3FifoOptions{"s3fifo-deep", 0.02, 12288};

// W-TinyLFU: a small LRU window (window_share of the tracked blocks) and a
// main LRU that admits a block from the window only if its long-run use
// count beats main's victim's. Dense handles.
std::unique_ptr<EvictionPolicy> MakeTinyLfuPolicy(double window_share = 0.01);

// ARC: a recency list and a frequency list whose split adapts to ghosts of
// the blocks each evicted (vLLM's KV offloading has one too, in its
// vllm/v1/kv_offload/arc_manager.py: read from its sources, not run here). Dense
// handles.
struct ArcOptions {
  absl::string_view name = "arc";
  // A sequential cutoff, as caches of disks have for long sequential reads
  // (bcache's sequential_cutoff): the blocks of a request that computes at
  // least this many tokens past its hit prefix (a long one-off document, a
  // batch job's input) enter the recency list at its cold end, so a burst
  // of them cannot flush what is being reused. One that comes back after
  // its eviction is a ghost and enters the frequency list as any other.
  // 0: off. Needs ObserveRequest (the host tier's asks); without it, ARC.
  uint64_t cutoff_tokens = 0;
};
std::unique_ptr<EvictionPolicy> MakeArcPolicy(const ArcOptions& opts = {});
// "arc-cutoff": ARC with a sequential cutoff of 8K tokens (16 blocks of 512),
// an expert of the adaptive default. On the workload suite's "scan" (chat
// beside bursts of one-off 16K-64K-token documents) at 3M tokens of room it
// gets 0.490 against ARC's 0.476 (Belady: 0.493); a cutoff of 4K or 16K
// tokens gets 0.489-0.490. Alone it loses to ARC where long prompts come
// back (the conversation trace at 10M: 0.257 against 0.304), so "arc" stays
// as it was.
inline constexpr ArcOptions kArcCutoffOptions{"arc-cutoff", 8192};

// "holds": learned per-class hold times (see holds_policy.cc). Each time a
// block is asked for it gets a class (policies/hold_class.h) and a deadline
// (now + that class's hold, in requests); the tier evicts the earliest
// deadline first. Hold times are re-planned every replan_every requests
// from decayed per-class histograms of the gaps after which asks came
// back: the room-constrained choice that wins most asks (a fractional
// knapsack over each class's upper concave hull). Needs ObserveRequest;
// without it, it is LRU. Dense handles.
struct HoldsOptions {
  double decay = 0.9995;         // per request, of the learned statistics
  uint32_t replan_every = 200;   // requests
  // The share of the room the plan spends: holds are planned on average,
  // and the room they take at one moment runs above it.
  double room_share = 0.8;
  uint32_t history_per_block = 16;  // identities remembered per block of room (at least 1,024)
};
std::unique_ptr<EvictionPolicy> MakeHoldsPolicy(const HoldsOptions& opts = {});


// Policies that learn from the host tier's lookups (the adaptive policy's
// shadows, the holds policy's plan, arc-cutoff's cutoff), so only the host
// tier can run them.
inline bool IsHostOnlyPolicy(absl::string_view name) {
  return name == "adaptive" || name == "holds" || name == "arc-cutoff";
}

// The host tier's policy unless the config names another.
inline constexpr absl::string_view kDefaultHostPolicy = "adaptive";

// By config name: "lru", "s3fifo", "s3fifo-deep", "tinylfu", "arc", "arc-cutoff", "holds", or "adaptive" (an
// AdaptivePolicy over all three with its shadows idle until the caller
// sets a capacity: see adaptive_policy.h).
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(absl::string_view name);

}  // namespace kvtier

#endif  // KVTIER_POLICIES_EVICTION_POLICY_H_
