// SPDX-License-Identifier: Apache-2.0
// Stores: StoreBegin reserves host slots for the blocks not cached yet (all
// or nothing) and indexes them as being written; StoreCommit makes them
// visible (and, when durable, waits for their lower copy and its journal);
// StoreAbort gives the slots back.
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/checked.h"
#include "core/fan_in.h"
#include "core/status.h"
#include "core/units.h"
#include "store/block_store.h"
#include "spdlog/spdlog.h"

namespace kvtier {

std::optional<size_t> BlockStore::ChainDepthOf(const SessionHoldings& s, std::span<const BlockKey> keys) {
  if (keys.empty()) return std::nullopt;
  const uint64_t first = PolicyKeyOf(s.ns.handle, keys[0]);
  auto at = std::find(s.last_chain.begin(), s.last_chain.end(), first);
  if (at == s.last_chain.end()) return std::nullopt;
  return static_cast<size_t>(at - s.last_chain.begin());
}

BlockStore::NewBlocks BlockStore::IndexNewBlocks(const SessionHoldings& s, std::span<const BlockKey> keys,
                                                 std::optional<size_t> depth) {
  NewBlocks n;
  for (size_t i = 0; i < keys.size(); ++i) {
    BlockIndex::Shard& sh = books_.index.ShardFor(s.ns.handle, keys[i]);
    MutexLock l(&sh.mu);
    if (BlockIndex::Find(sh, s.ns.handle, keys[i]) != nullptr) continue;  // cached, moving, or being written
    BlockRecord* r = books_.index.NewRecord(s.ns.handle, keys[i]);
    // The index is full: neither this block nor the rest of the chain is
    // taken (a lookup could not reach past it).
    if (r == nullptr) break;
    r->tenant = s.ns.tenant;
    r->state = BlockState::kWriting;
    r->depth = depth ? static_cast<uint16_t>(std::min<size_t>(*depth + i, kUnknownDepth - 1)) : kUnknownDepth;
    books_.index.Insert(sh, r);
    n.records.push_back(r);
    n.at.push_back(i);
  }
  return n;
}

std::string BlockStore::StoreNeverFits(const HostResidency& t, const NamespaceInfo& ns, size_t blocks) {
  const uint64_t need_tokens = uint64_t{ns.block_tokens} * blocks;
  const uint64_t need_bytes = t.host->SlotSizeFor(ns.block_bytes) * blocks;
  const uint64_t quota = t.QuotaHostTokens();
  if (quota != 0 && need_tokens > quota) {
    return absl::StrCat(blocks, " new blocks of ", ns.block_tokens, " tokens are over tenant \"", t.name,
                        "\"'s host_tokens quota of ", quota,
                        "; store fewer at a time or raise [[tenants]] host_tokens");
  }
  if (need_bytes > t.host->arena_bytes()) {
    return absl::StrCat(blocks, " new blocks (", FormatBytes(need_bytes), ") do not fit tenant \"", t.name,
                        "\"'s host arena of ", FormatBytes(t.host->arena_bytes()),
                        "; store fewer at a time or raise tiers.host.capacity");
  }
  return "";
}

std::vector<uint64_t> BlockStore::ParentsOf(const SessionHoldings& s, std::span<const BlockKey> keys,
                                            const std::vector<size_t>& at, std::optional<size_t> depth) {
  std::vector<uint64_t> parents(at.size(), 0);
  for (size_t j = 0; j < at.size(); ++j) {
    if (at[j] > 0) {
      parents[j] = PolicyKeyOf(s.ns.handle, keys[at[j] - 1]);
    } else if (depth && *depth > 0) {
      parents[j] = s.last_chain[*depth - 1];
    }
  }
  return parents;
}

void BlockStore::CountStoreUses(const SessionHoldings& s, std::span<const BlockKey> keys) {
  if (books_.reuse == nullptr) return;
  // A store is a request using its blocks. Those the session's last lease
  // counted (AfterReply) are not counted again: engines that probe (or ask)
  // without a lease and lease only what they load (kvtier.vllm,
  // kvtier.sglang) are counted once per block either way.
  const absl::flat_hash_set<uint64_t> looked_up(s.last_chain.begin(), s.last_chain.end());
  for (const BlockKey& k : keys) {
    const uint64_t key = PolicyKeyOf(s.ns.handle, k);
    if (!looked_up.contains(key)) books_.reuse->Record(key);
  }
}

absl::StatusOr<uint32_t> BlockStore::StoreBegin(SessionHoldings& s, std::span<const BlockKey> keys,
                                                uint64_t* ticket, std::span<BlockLocation> out) {
  *ticket = 0;
  if (draining_.load(std::memory_order_acquire)) {
    books_.stats->store_refused_draining.Add();
    return CodedStatus(KVTIER_EBUSY, "kvtierd is draining (shutting down): stores are refused; store again once it "
                                     "is back (lookups and loads still answer until it exits)");
  }
  HostResidency& t = *books_.tenants[s.ns.tenant];
  for (BlockLocation& o : out.first(keys.size())) o = BlockLocation{};
  // Depth prices recomputation.
  const std::optional<size_t> depth = ChainDepthOf(s, keys);
  NewBlocks created = IndexNewBlocks(s, keys, depth);
  CountStoreUses(s, keys);
  books_.CountRecords(s.ns.handle, static_cast<int64_t>(created.records.size()));
  books_.stats->stores.Add();
  books_.stats->blocks_already_present.Add(keys.size() - created.records.size());
  // A store that could never fit is refused before it evicts anything.
  const std::string too_big = StoreNeverFits(t, s.ns, created.records.size());
  MutexLock l(&t.mu);
  // All or nothing: a refused store gives back what it took.
  auto give_back = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (BlockRecord* c : created.records) {
      BlockIndex::Shard& sh = books_.index.ShardFor(c);
      {
        MutexLock sl(&sh.mu);
        books_.UnindexLocked(sh, c);
      }
      if (c->host_slot != kNoSlot) t.FreeSlotLocked(c->host_slot);
      books_.index.FreeRecord(c);
    }
    books_.CountRecords(s.ns.handle, -static_cast<int64_t>(created.records.size()));
  };
  if (!too_big.empty()) {
    give_back();
    books_.stats->store_refused_no_space.Add();
    return CodedStatus(KVTIER_ENOSPC, too_big);
  }
  uint32_t busy_wait_ms = HostResidency::kStoreBusyWaitMs;  // for all of this store's slots together
  for (size_t j = 0; j < created.records.size(); ++j) {
    BlockRecord* r = created.records[j];
    absl::StatusOr<SlotHandle> slot = t.AllocateSlotLocked(s.ns.block_bytes, s.ns.block_tokens, r, &busy_wait_ms);
    if (!slot.ok()) {
      give_back();
      return slot.status();
    }
    const uint64_t offset = t.host->ArenaOffset(*slot);
    {
      BlockIndex::Shard& sh = books_.index.ShardFor(r);
      MutexLock sl(&sh.mu);
      r->host_slot = *slot;
      r->set_arena_offset(offset);
    }
    out[created.at[j]] = BlockLocation{TierKind::kHost, offset, true};
  }
  if (created.records.empty()) return 0u;
  *ticket = s.next_id++;
  const uint32_t needed = static_cast<uint32_t>(created.records.size());
  std::vector<uint64_t> parents = ParentsOf(s, keys, created.at, depth);
  s.tickets.emplace(*ticket, SessionHoldings::Ticket{std::move(created.records), std::move(parents)});
  s.ticket_count.fetch_add(1, std::memory_order_relaxed);
  return needed;
}

void BlockStore::StoreCommit(SessionHoldings& s, uint64_t ticket, bool durable, StatusCallback done) {
  auto it = s.tickets.find(ticket);
  if (it == s.tickets.end()) {
    std::move(done)(CodedStatus(KVTIER_ENOENT, absl::StrCat("unknown store ticket ", ticket,
                                                            ": committed or aborted already, or not this session's")));
    return;
  }
  std::vector<BlockRecord*> blocks = std::move(it->second.blocks);
  std::vector<uint64_t> parents = std::move(it->second.parents);
  s.tickets.erase(it);
  s.ticket_count.fetch_sub(1, std::memory_order_relaxed);
  HostResidency& t = *books_.tenants[s.ns.tenant];
  // Every committed block goes up to the shared tier too on write_policy
  // "committed" (after the reply: AfterReply).
  const bool publish = shared_.Publishes(SharedWrites::kCommitted);
  {
    MutexLock l(&t.mu);
    // Chain order is root first; insert leaves first (see Lookup).
    for (size_t j = blocks.size(); j-- > 0;) {
      BlockRecord* r = blocks[j];
      {
        BlockIndex::Shard& sh = books_.index.ShardFor(r);
        MutexLock sl(&sh.mu);
        r->state = BlockState::kReady;
        if (publish) shared_.QueuePublishLocked(s, r);
      }
      t.PolicyForLocked(t.host->SlotBytes(r->host_slot))
          ->InsertInChain(r->host_slot, PolicyKeyOf(*r), parents[j], PositionOf(*r, s.ns.block_tokens));
    }
    for (BlockRecord* r : blocks) t.AnnounceLocked(r->host_slot);  // KV events: root first, as engines send
  }
  books_.stats->blocks_stored.Add(blocks.size());
  books_.stats->bytes_stored.Add(blocks.size() * s.ns.block_bytes);
  if (!durable) {
    if (opts_.write_through && !books_.lanes.empty()) {
      for (BlockRecord* r : blocks) migrator_.WriteThrough(t, r, IoOptions{.prio = IoPriority::kDemote}, [](absl::Status) {});
    }
    std::move(done)(absl::OkStatus());
    shared_.StartPublishes(s);  // a commit's reply is posted from `done`, with no AfterReply
    return;
  }
  shared_.StartPublishes(s);
  if (books_.lanes.empty()) {
    std::move(done)(CodedStatus(KVTIER_EINVAL,
                                "the blocks are committed to host memory, but kvtierd has no NVMe tier to make them "
                                "durable; configure [tiers.nvme] or commit without durability"));
    return;
  }
  if (!books_.lanes[0]->tier->durable()) {
    // Only the first lower tier takes commits; one that forgets at a restart
    // must not acknowledge a durable one.
    std::move(done)(CodedStatus(KVTIER_EINVAL, absl::StrCat("the blocks are committed to host memory, but the ",
                                                            std::string(books_.lanes[0]->tier->name()),
                                                            " tier below it is not durable; commit without "
                                                            "durability")));
    return;
  }
  // Complete once every block's NVMe write is journaled (or one failed).
  auto fan = FanIn<absl::Status>::Make(blocks.size(), absl::OkStatus(), [done = std::move(done)](absl::Status first_error) mutable {
    std::move(done)(first_error.ok() ? first_error
                                     : absl::Status(first_error.code(), absl::StrCat("committed to host memory but not "
                                                                                     "durable: ", first_error.message())));
  });
  for (BlockRecord* r : blocks) {
    migrator_.WriteThrough(t, r, IoOptions{.prio = IoPriority::kPrefetch}, [fan](absl::Status st) {
      if (!st.ok()) {
        fan->With([&](absl::Status& first_error) {
          if (first_error.ok()) first_error = st;
        });
      }
      fan->Arrive();
    });
  }
}

absl::Status BlockStore::StoreAbort(SessionHoldings& s, uint64_t ticket) {
  auto it = s.tickets.find(ticket);
  if (it == s.tickets.end()) {
    return CodedStatus(KVTIER_ENOENT, absl::StrCat("unknown store ticket ", ticket));
  }
  HostResidency& t = *books_.tenants[s.ns.tenant];
  {
    MutexLock l(&t.mu);
    for (BlockRecord* r : it->second.blocks) {
      {
        BlockIndex::Shard& sh = books_.index.ShardFor(r);
        MutexLock sl(&sh.mu);
        books_.UnindexLocked(sh, r);
      }
      books_.DestroyRecord(t, r);
    }
  }
  books_.stats->store_aborts.Add();
  s.tickets.erase(it);
  s.ticket_count.fetch_sub(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace kvtier
