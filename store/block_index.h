// SPDX-License-Identifier: Apache-2.0
// The block index: every block the daemon knows, sharded by key so sessions
// rarely contend. A record's mutable fields are guarded by its shard's mutex.
//
// Lock order: docs/architecture.md, "Lock order" (a shard mutex comes after a
// tenant's tier lock and the lane locks).
#ifndef KVTIER_STORE_BLOCK_INDEX_H_
#define KVTIER_STORE_BLOCK_INDEX_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "core/mutex.h"
#include "kvtier/types.h"
#include "tiers/host_tier.h"
#include "tiers/tier.h"

namespace kvtier {

inline constexpr SlotHandle kNoSlot = UINT32_MAX;
inline constexpr uint16_t kUnknownDepth = UINT16_MAX;

// The host copy of a block.
enum class BlockState : uint8_t {
  kNone,      // no host copy
  kWriting,   // slot handed to a storing engine; invisible to lookups
  kReady,     // committed; visible
  kLoading,   // being promoted from NVMe into host_slot
  kEvicting,  // being taken away (demotion or drop); invisible
};

// The copy of a block in a block tier below host memory (the record's
// `lower` names which one).
enum class LowerState : uint8_t {
  kNone,
  kWriting,  // demotion or write-through in flight
  kReady,    // written (and journaled where the tier is durable)
};

// Block tiers below host memory, in a chain: 0 (NVMe in the daemon) first.
inline constexpr size_t kMaxLowerTiers = 8;  // BlockRecord::lower has 4 bits

// The most I/O references client requests (prefetches) may hold on one
// block at once; more prefetches of it while these are in flight skip it.
inline constexpr uint8_t kMaxClientIoRefs = 128;

struct BlockRecord {
  BlockKey key;
  uint32_t ns = 0;                 // namespace handle
  uint32_t pins = 0;               // leases holding it
  SlotHandle host_slot = kNoSlot;  // in the tenant's host tier
  SlotHandle lower_slot = kNoSlot;  // in lower tier `lower`
  // Of host_slot, in HostTier::kPage pages (32 bits keep the record at 60
  // bytes), kept here so lookups touch no tier state.
  uint32_t arena_page = 0;
  uint16_t tenant = 0;
  BlockState state = BlockState::kWriting;
  LowerState lower_state = LowerState::kNone;
  // Tier I/O in flight on this block: not evictable, not freed. Eight bits
  // keep the record at 60 bytes, so the count is bounded where a
  // client can multiply it (kMaxClientIoRefs for prefetches); the daemon's
  // own paths (eviction, write-through, promotion, flush) take one each.
  uint8_t io_refs = 0;
  // Erased from the index; destroyed when unreferenced.
  bool removed : 1 = false;
  // Which lower tier holds lower_slot (an index into the store's chain);
  // meaningful while lower_state is not kNone. Shares a byte with `removed`
  // to keep the record at 60 bytes.
  uint8_t lower : 4 = 0;
  // This node has written the block's bytes to the shared tier once
  // (write_policy "reused" or "committed"): it is not written there again.
  // Not a promise that the tier still holds it (its own eviction decides).
  bool published : 1 = false;
  // A write of the block to the shared tier is queued or in flight: no
  // second one is queued meanwhile (another hit, another session).
  bool publishing : 1 = false;
  // Blocks before this one in its chain, when known (a store that follows a
  // lookup of the chain), saturating at kUnknownDepth - 1. Prices recomputation.
  uint16_t depth = kUnknownDepth;

  uint64_t arena_offset() const { return uint64_t{arena_page} * HostTier::kPage; }
  // `offset` comes from HostTier::ArenaOffset: a whole page below 2^32 pages.
  void set_arena_offset(uint64_t offset) { arena_page = static_cast<uint32_t>(offset / HostTier::kPage); }

  // A block being demoted stays visible: a load waits for its write to land.
  bool visible() const { return state == BlockState::kReady || lower_state != LowerState::kNone; }
};

// Tokens before the block in its chain, for the eviction policy
// (EvictionPolicy::InsertAt): 0 when its depth is unknown.
inline uint64_t PositionOf(const BlockRecord& r, uint32_t block_tokens) {
  return r.depth == kUnknownDepth ? 0 : uint64_t{r.depth} * block_tokens;
}
static_assert(sizeof(BlockRecord) <= 60, "the record's size is most of the daemon's memory per block");
static_assert(kMaxLowerTiers <= 16, "BlockRecord::lower has 4 bits");

// A block's identity for eviction policies that remember evicted blocks
// (EvictionPolicy::InsertWithKey): never 0.
inline uint64_t PolicyKeyOf(uint32_t ns, const BlockKey& key) {
  uint64_t h;
  std::memcpy(&h, key.bytes.data(), sizeof(h));
  h ^= (uint64_t{ns} + 1) * 0x9e3779b97f4a7c15ull;
  return h == 0 ? 1 : h;
}
inline uint64_t PolicyKeyOf(const BlockRecord& r) { return PolicyKeyOf(r.ns, r.key); }

// Names a block for lookup without building a record.
struct BlockRef {
  uint32_t ns;
  const BlockKey* key;
};

struct BlockHash {
  using is_transparent = void;
  size_t operator()(const BlockRecord* r) const { return absl::HashOf(r->ns, r->key); }
  size_t operator()(const BlockRef& r) const { return absl::HashOf(r.ns, *r.key); }
};
struct BlockEq {
  using is_transparent = void;
  static bool Same(uint32_t ns1, const BlockKey& k1, uint32_t ns2, const BlockKey& k2) {
    return ns1 == ns2 && k1 == k2;
  }
  bool operator()(const BlockRecord* a, const BlockRecord* b) const {
    return Same(a->ns, a->key, b->ns, b->key);
  }
  bool operator()(const BlockRecord* a, const BlockRef& b) const { return Same(a->ns, a->key, b.ns, *b.key); }
  bool operator()(const BlockRef& a, const BlockRecord* b) const { return Same(a.ns, *a.key, b->ns, b->key); }
};

// Records of one index shard, carved from chunks: a record costs its 60
// bytes (from malloc a 64-byte record cost 80 with the allocator's header, the largest
// share of the daemon's memory per block). Each record has a number in its
// pool (26 bits), which the shard's hash set holds instead of a pointer: 4
// bytes a slot of the set instead of 8 (about 7 bytes a block at the set's
// usual load). Freed records are reused, last freed first; under
// AddressSanitizer a freed record is poisoned until then. Chunks stay until
// the index goes: memory freed by a mass invalidation is reused by later
// records of the shard, not given back to the system.
// New, Delete and IdOf are not thread-safe (BlockIndex guards each pool with
// a leaf mutex); At is, for the number of a record made before (a number
// learned through the shard's lock, which the record's maker took after
// making it): the chunks' directory only ever grows in place.
class RecordPool {
 public:
  static constexpr uint32_t kMaxRecords = uint32_t{1} << 26;

  RecordPool() = default;
  // At most `limit` - 1 live records (numbers below limit - 1): a smaller
  // bound than kMaxRecords lets a test fill a pool.
  explicit RecordPool(uint32_t limit) : limit_(std::min(limit, kMaxRecords)) {}
  RecordPool(const RecordPool&) = delete;
  RecordPool& operator=(const RecordPool&) = delete;

  // A default record, or nullptr when the pool holds kMaxRecords - 1 (or
  // limit - 1) already (67M records in one shard: beyond any memory the daemon is
  // given; the last number stays unused, so no record's number across the
  // index is BlockIndex::kNoRecord).
  BlockRecord* New();
  void Delete(BlockRecord* r);
  // The number of a record New made and Delete has not taken back.
  uint32_t IdOf(const BlockRecord* r) const;
  BlockRecord* At(uint32_t id) const { return std::launder(reinterpret_cast<BlockRecord*>(CellAt(id))); }
  size_t live() const { return live_; }

 private:
  struct alignas(BlockRecord) Cell {
    unsigned char bytes[sizeof(BlockRecord)];
  };
  static constexpr uint32_t kChunkBits = 10;
  static constexpr uint32_t kChunkRecords = uint32_t{1} << kChunkBits;  // 60 KiB
  static constexpr uint32_t kDirBits = 10;                              // chunks a directory page
  static constexpr size_t kDirPages = kMaxRecords >> (kChunkBits + kDirBits);
  // Chunk c is dir_[c >> kDirBits][c % 2^kDirBits]; a page is made with its
  // first chunk and neither moves after.
  std::array<std::unique_ptr<Cell*[]>, kDirPages> dir_;
  Cell* CellAt(uint32_t id) const {
    Cell* chunk = dir_[id >> (kChunkBits + kDirBits)][(id >> kChunkBits) & ((1u << kDirBits) - 1)];
    return &chunk[id & (kChunkRecords - 1)];
  }
  std::vector<std::unique_ptr<Cell[]>> chunks_;  // in number order
  // (first cell's address, chunk number), by address: IdOf's search.
  std::vector<std::pair<uintptr_t, uint32_t>> by_address_;
  uint32_t carved_ = kChunkRecords;  // cells handed out of the last chunk
  std::vector<uint32_t> free_;       // numbers of freed records
  const uint32_t limit_ = kMaxRecords;
  size_t live_ = 0;
};

class BlockIndex {
 public:
  static constexpr size_t kShards = 64;

  // The shard's set holds its records' numbers in its pool; hashing and
  // comparing one reads the record's namespace and key, which never change.
  struct IdHash {
    using is_transparent = void;
    const RecordPool* pool;
    size_t operator()(uint32_t id) const { return BlockHash{}(pool->At(id)); }
    size_t operator()(const BlockRef& r) const { return BlockHash{}(r); }
  };
  struct IdEq {
    using is_transparent = void;
    const RecordPool* pool;
    bool operator()(uint32_t a, uint32_t b) const { return a == b || BlockEq{}(pool->At(a), pool->At(b)); }
    bool operator()(uint32_t a, const BlockRef& b) const { return BlockEq{}(pool->At(a), b); }
    bool operator()(const BlockRef& a, uint32_t b) const { return BlockEq{}(a, pool->At(b)); }
  };
  struct Shard {
    Shard() : set(0, IdHash{&pool}, IdEq{&pool}) {}
    Mutex mu;
    // A leaf lock (docs/architecture.md, "Lock order"): records are made
    // and freed with or without the shard's lock held.
    Mutex pool_mu;
    RecordPool pool ABSL_GUARDED_BY(pool_mu);
    absl::flat_hash_set<uint32_t, IdHash, IdEq> set ABSL_GUARDED_BY(mu);
  };

  // A record's number across the index (its shard's in the top bits, its
  // number in the shard's pool below): 4 bytes where a table names a block
  // (HostSlotTable's owners). Never kNoRecord.
  static constexpr uint32_t kNoRecord = UINT32_MAX;
  static_assert(uint64_t{kShards} * RecordPool::kMaxRecords == uint64_t{1} << 32);

  BlockIndex() = default;
  ~BlockIndex() = default;  // the pools free every record, indexed or not
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // A default record holding `ns` and `key`, from the pool of the shard they
  // map to (so FreeRecord finds that pool again); nullptr when that pool is
  // full (RecordPool::kMaxRecords).
  BlockRecord* NewRecord(uint32_t ns, const BlockKey& key) {
    Shard& s = ShardFor(ns, key);
    BlockRecord* r;
    {
      MutexLock l(&s.pool_mu);
      r = s.pool.New();
    }
    if (r == nullptr) return nullptr;
    r->ns = ns;
    r->key = key;
    return r;
  }
  // Frees a record made by NewRecord (its ns and key unchanged).
  void FreeRecord(BlockRecord* r) {
    Shard& s = ShardFor(r);
    MutexLock l(&s.pool_mu);
    s.pool.Delete(r);
  }

  Shard& ShardFor(uint32_t ns, const BlockKey& key) {
    // Keys are uniform hashes (or an engine's own hashes): mix anyway.
    return shards_[absl::HashOf(ns, key) % kShards];
  }
  Shard& ShardFor(const BlockRecord* r) { return ShardFor(r->ns, r->key); }

  // Starts fetching the memory a Find of this key will touch.
  static void Prefetch(Shard& s, uint32_t ns, const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    s.set.prefetch(BlockRef{ns, &key});
  }
  static BlockRecord* Find(Shard& s, uint32_t ns, const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    auto it = s.set.find(BlockRef{ns, &key});
    return it == s.set.end() ? nullptr : At(s, *it);
  }
  // `r` comes from s's pool (NewRecord of its ns and key), and no record of
  // its ns and key is indexed.
  void Insert(Shard& s, BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    uint32_t id;
    {
      MutexLock l(&s.pool_mu);
      id = s.pool.IdOf(r);
    }
    if (s.set.insert(id).second) size_.fetch_add(1, std::memory_order_relaxed);
  }
  // Takes `r` out of the index; nothing when it is not there (another
  // record of its ns and key may be).
  void Erase(Shard& s, BlockRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    auto it = s.set.find(BlockRef{r->ns, &r->key});
    if (it == s.set.end() || At(s, *it) != r) return;
    s.set.erase(it);
    size_.fetch_sub(1, std::memory_order_relaxed);
  }
  // Calls f(BlockRecord*) for each record indexed in `s` until it returns
  // false; f must not change the index.
  template <typename F>
  static void ForEach(Shard& s, F f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    for (uint32_t id : s.set) {
      if (!f(At(s, id))) return;
    }
  }

  // The number of a record made by NewRecord and not yet freed. Takes its
  // pool's leaf lock.
  uint32_t NumberOf(const BlockRecord* r) {
    Shard& s = ShardFor(r);
    MutexLock l(&s.pool_mu);
    return static_cast<uint32_t>(&s - shards_.data()) * RecordPool::kMaxRecords + s.pool.IdOf(r);
  }
  // The record of a number NumberOf gave, while that record lives; any
  // thread that learned the number after the record was made (RecordPool::At).
  BlockRecord* Numbered(uint32_t n) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return shards_[n / RecordPool::kMaxRecords].pool.At(n % RecordPool::kMaxRecords);
  }

  // Records currently indexed (writing or ready). Relaxed: for reporting.
  uint64_t size() const { return size_.load(std::memory_order_relaxed); }

  std::array<Shard, kShards>& shards() { return shards_; }

 private:
  // The record numbered `id` in s's pool: its numbers in s.set are of
  // records made and indexed under s.mu, after their chunk was in the
  // directory (RecordPool::At).
  static BlockRecord* At(const Shard& s, uint32_t id) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s.pool.At(id); }

  std::array<Shard, kShards> shards_;
  std::atomic<uint64_t> size_{0};
};

}  // namespace kvtier

#endif  // KVTIER_STORE_BLOCK_INDEX_H_
