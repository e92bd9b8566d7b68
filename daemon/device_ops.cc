// SPDX-License-Identifier: Apache-2.0
#include "daemon/device_ops.h"

#include <fcntl.h>

#include "absl/strings/str_cat.h"
#include "core/checked.h"
#include "core/fmt_absl.h"
#include "core/status.h"
#include "os/futex.h"
#include "spdlog/spdlog.h"

namespace kvtier {

DeviceOps::DeviceOps(Context ctx, DeviceBackend* device, KvCacheBudget* kv_budget)
    : ctx_(std::move(ctx)),
      engines_(device != nullptr && ctx_.arena_base != nullptr
                   ? std::make_unique<EngineCaches>(device, ctx_.ns, kv_budget)
                   : nullptr) {}

std::shared_ptr<const EngineCache> DeviceOps::Find(uint64_t id) const {
  return engines_ ? engines_->Find(id) : nullptr;
}

uint64_t DeviceOps::kv_caches() const { return engines_ ? engines_->size() : 0; }

ipc::KvRegisterReply DeviceOps::OnKvMessage(std::span<const std::byte> data, std::vector<UniqueFd> fds,
                                            std::vector<UniqueFd>* reply_fds) {
  ipc::KvRegisterReply reply;
  GpuCache* const gpu = ctx_.gpu;
  DaemonStats* const stats = ctx_.stats;
  absl::StatusOr<ipc::KvMessage> m = ipc::DecodeKvMessage(data);
  absl::Status st = m.status();
  if (st.ok() && engines_ == nullptr) st = absl::FailedPreconditionError("this kvtierd has no device backend");
  if (st.ok() && m->gpu_arena) {
    if (gpu == nullptr) {
      st = absl::NotFoundError("this kvtierd has no GPU tier for this tenant (tiers.gpu.capacity = 0)");
    } else if (absl::StatusOr<IpcMemHandle> h = gpu->ExportArena(); !h.ok()) {
      st = h.status();
    } else {
      reply.arena_bytes = gpu->arena_bytes();
      if (h->fd.valid()) {
        // Engines read pinned copies in place and never write them: the
        // simulated device's arena goes out as a read-only descriptor.
        UniqueFd ro(open(absl::StrCat("/proc/self/fd/", h->fd.get()).c_str(), O_RDONLY | O_CLOEXEC));
        if (ro.valid()) {
          reply.arena_kind = ipc::KvArenaKind::kMemfd;
          reply_fds->push_back(std::move(ro));
        } else {
          st = ErrnoStatus(errno, "reopening the GPU-tier arena read-only");
        }
      } else {
        reply.arena_kind = ipc::KvArenaKind::kCudaIpc;
        reply.arena_handle = h->opaque;
      }
      if (ctx_.log_ok()) {
        spdlog::info("event=gpu_arena_exported session={} bytes={}", ctx_.session_id, reply.arena_bytes);
      }
    }
  } else if (st.ok() && m->unregister) {
    st = engines_->Unregister(m->registration);
    reply.registration = m->registration;
  } else if (st.ok()) {
    absl::StatusOr<Registered> r = engines_->Register(m->request, std::move(fds));
    st = r.status();
    if (r.ok()) {
      reply.registration = r->id;
      reply.event_kind = r->event_kind;
      reply.layer_events = std::move(r->layer_events);
      *reply_fds = std::move(r->fds);
      stats->kv_registrations.Add();
      if (ctx_.log_ok()) {
        spdlog::info("event=kv_cache_registered session={} registration={} layers={} page_tokens={} pages={} "
                     "regions={}",
                     ctx_.session_id, r->id, m->request.layers, m->request.page_tokens, m->request.num_pages,
                     m->request.regions.size());
      }
    }
  }
  if (!st.ok() && m.ok() && m->gpu_arena) {
    reply.status = ToErrorCode(st);
    reply.message = std::string(st.message());
    if (ctx_.log_ok()) {
      spdlog::info("event=gpu_arena_refused session={} reason=\"{}\"", ctx_.session_id, LogQuoted(reply.message));
    }
  } else if (!st.ok()) {
    stats->kv_registrations_refused.Add();
    reply.status = ToErrorCode(st);
    reply.message = std::string(st.message());
    if (ctx_.log_ok()) {
      spdlog::warn("event=kv_cache_refused session={} pid={} reason=\"{}\"", ctx_.session_id, ctx_.pid,
                   LogQuoted(reply.message));
    }
  }
  return reply;
}

absl::Status DeviceOps::Gather(const EngineCache& reg, std::span<const uint32_t> pages,
                               const std::vector<BlockKey>& keys, std::span<const BlockLocation> locs) {
  GpuCache* const gpu = ctx_.gpu;
  const NamespaceInfo& ns = ctx_.ns;
  std::vector<uint32_t> sel;
  std::vector<uint64_t> dst;
  std::vector<EngineCaches::CopyOp> demote;
  std::vector<const BlockKey*> in_gpu;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!locs[i].needed) continue;
    std::byte* host = ctx_.arena_base + locs[i].arena_offset;
    std::optional<GpuCache::Pin> pin = gpu ? gpu->Reserve(ns.handle, keys[i], ns.block_bytes, ns.block_tokens) : std::nullopt;
    if (pin) {
      dst.push_back(reinterpret_cast<uint64_t>(pin->data));
      demote.push_back({host, pin->data});
      in_gpu.push_back(&keys[i]);
    } else {
      dst.push_back(reinterpret_cast<uint64_t>(host));
    }
    sel.insert(sel.end(), pages.begin() + i * reg.pages_per_block, pages.begin() + (i + 1) * reg.pages_per_block);
  }
  absl::Status g = engines_->Gather(reg, sel, dst);
  if (g.ok() && !demote.empty()) g = engines_->Copy(demote, ns.block_bytes);
  for (const BlockKey* k : in_gpu) {
    if (g.ok() && ctx_.store->PublishGpuCopy(ns.tenant, ns.handle, *k)) gpu->CountDemotion();
    gpu->Release(ns.handle, *k);  // frees it when unpublished
  }
  if (!g.ok()) {
    ctx_.stats->device_errors.Add();
    if (ctx_.log_ok()) {
      spdlog::warn("event=device_store_failed session={} reason=\"{}\"", ctx_.session_id, LogQuoted(g.message()));
    }
  }
  return g;
}

void DeviceOps::PromoteToGpu(const std::vector<BlockKey>& keys, const LoadOutcome& lo,
                             const std::vector<bool>& from_gpu) {
  GpuCache* const gpu = ctx_.gpu;
  const NamespaceInfo& ns = ctx_.ns;
  std::vector<EngineCaches::CopyOp> copies;
  std::vector<const BlockKey*> reserved;
  for (uint32_t i = 0; i < lo.loaded; ++i) {
    if (from_gpu[i]) continue;
    std::optional<GpuCache::Pin> pin = gpu->Reserve(ns.handle, keys[i], ns.block_bytes, ns.block_tokens);
    if (!pin) continue;  // no room: every copy is pinned
    copies.push_back({pin->data, ctx_.arena_base + lo.locations[i].arena_offset});
    reserved.push_back(&keys[i]);
  }
  const absl::Status st = copies.empty() ? absl::OkStatus() : engines_->Copy(copies, ns.block_bytes);
  if (!st.ok()) {
    ctx_.stats->device_errors.Add();
    if (ctx_.log_ok()) {
      spdlog::warn("event=gpu_promotion_failed session={} reason=\"{}\"", ctx_.session_id, LogQuoted(st.message()));
    }
  }
  for (const BlockKey* k : reserved) {
    // Not published when the block left the store meanwhile (invalidated
    // under the engine's lease): the copy is freed instead.
    if (st.ok() && ctx_.store->PublishGpuCopy(ns.tenant, ns.handle, *k)) gpu->CountPromotion();
    gpu->Release(ns.handle, *k);
  }
}

absl::Status DeviceOps::Scatter(const EngineCache& reg, std::span<const uint32_t> pages,
                                const std::vector<BlockKey>& keys, const LoadOutcome& lo,
                                ipc::DeviceLoadProgress* progress) {
  GpuCache* const gpu = ctx_.gpu;
  const NamespaceInfo& ns = ctx_.ns;
  // Each block comes from its GPU copy when it has one (pinned meanwhile),
  // else from its host slot.
  std::vector<uint64_t> src;
  std::vector<bool> from_gpu(lo.loaded, false);
  for (uint32_t i = 0; i < lo.loaded; ++i) {
    std::optional<GpuCache::Pin> pin = gpu ? gpu->Acquire(ns.handle, keys[i]) : std::nullopt;
    from_gpu[i] = pin.has_value();
    src.push_back(pin ? reinterpret_cast<uint64_t>(pin->data)
                      : reinterpret_cast<uint64_t>(ctx_.arena_base + lo.locations[i].arena_offset));
  }
  progress->blocks.store(lo.loaded, std::memory_order_release);
  absl::Status st = absl::OkStatus();
  if (lo.loaded > 0) {
    st = engines_->ScatterByLayer(reg, pages.first(uint64_t{lo.loaded} * reg.pages_per_block), src, progress);
  } else {
    // Nothing to wait for, on the host or on a stream.
    progress->armed.store(1, std::memory_order_release);
    progress->layers_done.store(reg.shape.layers, std::memory_order_release);
    os::FutexWakeAll(&progress->armed);
    os::FutexWakeAll(&progress->layers_done);
  }
  for (uint32_t i = 0; i < lo.loaded; ++i) {
    if (from_gpu[i]) gpu->Release(ns.handle, keys[i]);
  }
  // The engine has its layers; now promote what came from host memory, so
  // the next load of these blocks stays on the device.
  if (st.ok() && gpu != nullptr) PromoteToGpu(keys, lo, from_gpu);
  if (!st.ok()) {
    ctx_.stats->device_errors.Add();
    if (ctx_.log_ok()) {
      spdlog::warn("event=device_load_failed session={} reason=\"{}\"", ctx_.session_id, LogQuoted(st.message()));
    }
  }
  return st;
}

void DeviceOps::MarkGpuCopies(std::span<const BlockKey> keys, uint32_t hit, uint64_t lease,
                              std::span<BlockLocation> locs, std::span<uint64_t> gpu_offsets) {
  GpuCache* const gpu = ctx_.gpu;
  if (gpu == nullptr) return;
  for (uint32_t i = 0; i < hit && i < keys.size(); ++i) {
    if (lease == 0) {
      if (gpu->Contains(ctx_.ns.handle, keys[i])) {
        locs[i].tier = TierKind::kGpu;
        locs[i].lane = kNoLane;
      }
      continue;
    }
    // Leased: pin the copy, so the engine may read it in place until it
    // releases the lease.
    if (std::optional<GpuCache::Pin> pin = gpu->Acquire(ctx_.ns.handle, keys[i], /*count_hit=*/false)) {
      locs[i].tier = TierKind::kGpu;
      locs[i].lane = kNoLane;  // the engine reads the GPU copy: no lower tier's lane
      gpu_offsets[i] = gpu->OffsetOf(*pin);
      gpu_pins_[lease].push_back(keys[i]);
    }
  }
}

void DeviceOps::ReleaseLease(uint64_t lease) {
  auto it = gpu_pins_.find(lease);
  if (it == gpu_pins_.end()) return;
  for (const BlockKey& k : it->second) ctx_.gpu->Release(ctx_.ns.handle, k);
  gpu_pins_.erase(it);
}

void DeviceOps::DropNamespace() {
  if (ctx_.gpu != nullptr) ctx_.gpu->DropNamespace(ctx_.ns.handle);
}

void DeviceOps::DropEverything() {
  while (!gpu_pins_.empty()) ReleaseLease(gpu_pins_.begin()->first);
  if (engines_) engines_->Clear();
}

}  // namespace kvtier
