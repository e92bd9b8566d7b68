// SPDX-License-Identifier: Apache-2.0
// StoreBooks: what the store knows of each namespace, and a record's life
// (store_books.h).
#include "store/store_books.h"

#include "events/kv_events.h"

#include "core/checked.h"
#include "spdlog/spdlog.h"

namespace kvtier {

StoreBooks::StoreBooks(DaemonStats* stats_in, const CostTracker::Options& cost_opts)
    : stats(stats_in), cost(cost_opts) {}

void StoreBooks::RegisterNamespace(const NamespaceInfo& info) {
  bool fresh;
  {
    MutexLock l(&ns_mu_);
    if (ns_info_.size() <= info.handle) {
      ns_info_.resize(info.handle + 1);
      ns_records_.resize(info.handle + 1, 0);
    }
    // Said when an engine first describes the namespace (a namespace
    // recovered from NVMe has no model id until one attaches with it), and
    // once per block shape, not once per namespace: fresh namespaces are a
    // peer's to make. The shapes remembered are bounded too.
    fresh = !info.model_id.empty() && ns_info_[info.handle].model_id.empty();
    ns_info_[info.handle] = info;
    constexpr size_t kMaxShapesLogged = 256;
    if (fresh) {
      fresh = unpriced_logged_.size() < kMaxShapesLogged &&
              unpriced_logged_.insert({info.block_bytes, info.block_tokens, info.tp_size}).second;
    }
  }
  if (fresh && cost.decide() && !cost.Prices(info.block_bytes, info.block_tokens, info.tp_size)) {
    spdlog::info(
        "event=cost_model_unpriced namespace={} model_id=\"{}\" bytes_per_token={} profile=\"{}\" "
        "profile_kv_bytes_per_token={} detail=\"blocks of this namespace are always loaded and demoted; set "
        "cost_model.model_config to this model's config.json to price them\"",
        info.id.Hex().substr(0, 16), LogQuoted(info.model_id), info.block_tokens ? info.block_bytes / info.block_tokens : 0,
        LogQuoted(cost.model().name), cost.model().KvBytesPerToken());
  }
}

bool StoreBooks::ForgetNamespace(uint32_t handle) {
  MutexLock l(&ns_mu_);
  if (handle < ns_records_.size() && ns_records_[handle] != 0) return false;
  if (handle < ns_info_.size()) ns_info_[handle] = NamespaceInfo{};
  return true;
}

uint64_t StoreBooks::RecordsOf(uint32_t handle) const {
  MutexLock l(&ns_mu_);
  return handle < ns_records_.size() ? ns_records_[handle] : 0;
}

void StoreBooks::CountRecords(uint32_t ns, int64_t delta) {
  if (delta == 0) return;
  MutexLock l(&ns_mu_);
  if (ns >= ns_records_.size()) ns_records_.resize(ns + 1, 0);
  ns_records_[ns] += static_cast<uint64_t>(delta);  // wraps back for negative deltas
}

BlockMeta StoreBooks::MetaOf(const BlockRecord* r) const {
  NamespaceInfo ns;
  {
    MutexLock l(&ns_mu_);
    if (r->ns < ns_info_.size()) ns = ns_info_[r->ns];
  }
  BlockMeta m;
  m.ns = ns.id;
  m.key = r->key;
  m.payload_bytes = ns.block_bytes;
  m.tenant_hash = tenants[r->tenant]->hash;
  m.block_tokens = ns.block_tokens;
  return m;
}

NamespaceInfo StoreBooks::InfoOf(uint32_t ns) const {
  MutexLock l(&ns_mu_);
  return ns < ns_info_.size() ? ns_info_[ns] : NamespaceInfo{};
}

uint32_t StoreBooks::TpSizeOf(uint32_t ns) const {
  MutexLock l(&ns_mu_);
  return ns < ns_info_.size() ? ns_info_[ns].tp_size : 1;
}

void StoreBooks::UnindexLocked(BlockIndex::Shard& sh, BlockRecord* r) {
  // Once: a later record of the same key may be indexed (and on the GPU) by now.
  if (r->removed) return;
  index.Erase(sh, r);
  r->removed = true;
  if (GpuCache* gpu = tenants[r->tenant]->gpu.get()) gpu->Drop(r->ns, r->key);
}

void StoreBooks::DestroyRecord(HostResidency& t, BlockRecord* r) {
  if (r->host_slot != kNoSlot) t.FreeSlotLocked(r->host_slot);
  r->host_slot = kNoSlot;
  DestroyDetached(r);
}

void StoreBooks::DestroyDetached(BlockRecord* r) {
  if (r->lower_slot != kNoSlot) {
    LowerLane& lane = LaneOf(r);
    MutexLock l(&lane.mu);
    lane.policy->Remove(r->lower_slot);
    FreeLowerSlotLocked(lane, r, r->lower_slot);
    if (r->lower_state == LowerState::kReady) lane.blocks.fetch_sub(1, std::memory_order_relaxed);
  }
  CountRecords(r->ns, -1);
  index.FreeRecord(r);
}

void StoreBooks::ReleaseIoRef(HostResidency& t, BlockRecord* r) {
  bool destroy, has_host;
  {
    BlockIndex::Shard& sh = index.ShardFor(r);
    MutexLock sl(&sh.mu);
    --r->io_refs;
    destroy = r->removed && r->pins == 0 && r->io_refs == 0;
    has_host = r->host_slot != kNoSlot;
  }
  if (!destroy) return;
  // Removed and unreferenced: only this thread can reach r now.
  if (has_host) {
    MutexLock l(&t.mu);
    DestroyRecord(t, r);
  } else {
    DestroyDetached(r);
  }
}

namespace {
KvMedium MediumOf(const LowerLane& lane) { return lane.tier->shared() ? KvMedium::kRemote : KvMedium::kDisk; }
}  // namespace

void StoreBooks::ChargeLocked(LowerLane& lane, const BlockRecord* r, SlotHandle slot, int sign) {
  const BlockMeta meta = MetaOf(r);
  lane.ChargeLocked(r->tenant, slot, meta.payload_bytes, meta.block_tokens, sign);
  if (events != nullptr && events->Publishes(r->tenant)) {
    if (sign > 0) {
      events->Stored(r->tenant, r->key, meta.block_tokens, MediumOf(lane));
    } else {
      events->Removed(r->tenant, r->key, MediumOf(lane));
    }
  }
}

void StoreBooks::FreeLowerSlotLocked(LowerLane& lane, const BlockRecord* r, SlotHandle slot) {
  const BlockMeta meta = MetaOf(r);
  lane.ReleaseLocked(r->tenant, slot, meta);
  if (events != nullptr) events->Removed(r->tenant, r->key, MediumOf(lane));
}

}  // namespace kvtier
