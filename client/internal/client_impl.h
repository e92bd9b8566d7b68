// SPDX-License-Identifier: Apache-2.0
// The state behind kvtier::Client: the session's rings, outstanding
// operations, and the engine KV caches this client registered. client.cc
// holds the block operations, engine_cache.cc the KV-cache ones.
#ifndef KVTIER_CLIENT_INTERNAL_CLIENT_IMPL_H_
#define KVTIER_CLIENT_INTERNAL_CLIENT_IMPL_H_

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/internal/ring_session.h"
#include "core/status.h"
#include "os/shared_event.h"
#include "kernels/cuda_host.h"
#include "kernels/kv_kernels.h"
#include "kvtier/client.h"

namespace kvtier {

using ipc::Opcode;

namespace client_internal {

// CUDA events opened from the daemon's handles, closed with their owner.
class CudaEvents {
 public:
  CudaEvents() = default;
  ~CudaEvents() {
    for (uint64_t e : ids) kernels::CudaCloseEvent(e);
  }
  CudaEvents(CudaEvents&& o) noexcept : ids(std::move(o.ids)) { o.ids.clear(); }
  CudaEvents& operator=(CudaEvents&&) = delete;
  CudaEvents(const CudaEvents&) = delete;
  CudaEvents& operator=(const CudaEvents&) = delete;
  std::vector<uint64_t> ids;
};

class ClientImpl {
 public:
  std::unique_ptr<client_internal::RingSession> ring;
  ipc::AttachReply info;

  // What an outstanding operation needs when its completion arrives.
  struct OpState {
    Opcode opcode = Opcode::kPing;
    std::byte* scratch = nullptr;  // keys then results (or an error message)
    size_t out_at = 0;             // results offset within scratch
    size_t out_bytes = 0;
    uint32_t count = 0;
    LookupResult* lookup = nullptr;
    std::vector<BlockView>* views = nullptr;
    StoreTicket* ticket = nullptr;
    uint32_t* value = nullptr;
    ipc::DeviceLoadProgress* progress = nullptr;  // kLoadDevice, inside scratch
    uint32_t layers = 0;                          // kLoadDevice
  };
  absl::flat_hash_map<OpId, OpState> ops;
  // Device loads whose completion a layer wait took before FinishLoad asked
  // for it: FinishLoad answers from here (the load's outcome and count).
  struct FinishedLoad {
    Status status;
    uint32_t loaded = 0;
  };
  absl::flat_hash_map<OpId, FinishedLoad> finished_loads;

  // An engine KV cache this client registered, in the engine's own addresses
  // (for client-driven copies on the engine's stream).
  struct KvCache {
    kernels::KvShape shape;
    kernels::BlockCodec codec = kernels::BlockCodec::kLossless;
    kernels::PagedCache cache;
    bool cuda = false;
    // The daemon's per-layer events: opened CUDA events (a CUDA cache), or
    // the simulated device's shared states (a host-memory cache).
    CudaEvents cuda_events;
    std::vector<os::ImportedEvent> shared_events;
  };
  std::map<uint64_t, KvCache> kv_caches;
  // The tenant's GPU-tier arena, once MapGpuArena mapped it: a CUDA IPC
  // mapping, or (simulated device) its memfd mapped.
  struct GpuArena {
    const std::byte* base = nullptr;
    uint64_t bytes = 0;
    bool cuda = false;
    os::MappedRegion region;
    ~GpuArena() {
      if (cuda && base != nullptr) kernels::CudaCloseMemory(base);
    }
  };
  GpuArena gpu_arena;
  std::unique_ptr<kernels::KvKernels> cpu_kernels;   // host-memory caches
  std::unique_ptr<kernels::KvKernels> cuda_kernels;  // CUDA caches
  bool arena_registered_with_cuda = false;

  // Submits an operation with `keys`, results space for count blocks (or an
  // error message), and the op state to finish it with.
  // `pages` (device ops) go to scratch after the keys, at args[0]; `extra_out`
  // more result bytes (a load's progress) after the block results.
  Result<OpId> Submit(Opcode opcode, uint16_t flags, uint64_t handle, std::span<const BlockKey> keys,
                      OpState state, uint64_t arg0 = 0, uint64_t arg1 = 0, std::span<const uint32_t> pages = {},
                      size_t extra_out = 0) {
    if (Status s = ToPublic(ring->health()); !s.ok()) return s;
    if (keys.size() > ring->max_keys_per_op()) {
      return Status(ErrorCode::kInvalidArgument,
                    absl::StrCat(keys.size(), " keys in one request; the daemon takes at most ",
                                 ring->max_keys_per_op(), " (split the batch)"));
    }
    const size_t key_bytes = keys.size() * sizeof(BlockKey);
    const size_t page_bytes = (pages.size() * sizeof(uint32_t) + 7) / 8 * 8;
    const size_t out_bytes =
        std::max(keys.size() * sizeof(ipc::BlockResult) + extra_out, ipc::kErrorMessageBytes);
    std::byte* scratch = ring->AllocScratch(key_bytes + page_bytes + out_bytes);
    if (scratch == nullptr) {
      return Status(ErrorCode::kBusy, absl::StrCat("no room in the session's scratch region for ", keys.size(),
                                                   " keys; wait for outstanding operations or use smaller batches"));
    }
    if (!keys.empty()) std::memcpy(scratch, keys.data(), key_bytes);
    if (!pages.empty()) {
      std::memcpy(scratch + key_bytes, pages.data(), pages.size() * sizeof(uint32_t));
      arg0 = ring->ScratchOffset(scratch + key_bytes);
    }
    ipc::RequestRecord rec{};
    rec.opcode = static_cast<uint16_t>(opcode);
    rec.flags = flags;
    rec.count = static_cast<uint32_t>(keys.size());
    rec.handle = handle;
    rec.keys_offset = ring->ScratchOffset(scratch);
    rec.out_offset = rec.keys_offset + key_bytes + page_bytes;
    rec.out_bytes = out_bytes;
    rec.args[0] = arg0;
    rec.args[1] = arg1;
    if (opcode == Opcode::kLoadDevice) {
      // Before the submit: the daemon may write progress as soon as it has
      // the record (scratch is reused, so stale values must not show).
      auto* progress = reinterpret_cast<ipc::DeviceLoadProgress*>(scratch + key_bytes + page_bytes +
                                                                  keys.size() * sizeof(ipc::BlockResult));
      progress->blocks.store(ipc::kDeviceLoadUnknown, std::memory_order_relaxed);
      progress->layers_done.store(0, std::memory_order_relaxed);
      progress->failed.store(0, std::memory_order_relaxed);
      progress->armed.store(0, std::memory_order_relaxed);
      state.progress = progress;
    }
    absl::StatusOr<uint64_t> op = ring->Submit(rec);
    if (!op.ok()) {
      ring->FreeScratch(scratch);
      return ToPublic(op.status());
    }
    state.opcode = opcode;
    state.scratch = scratch;
    state.out_at = key_bytes + page_bytes;
    state.out_bytes = out_bytes;
    state.count = rec.count;
    ops.emplace(*op, state);
    return *op;
  }

  // Turns a completion into the caller's outputs and a status.
  Status Finish(OpId op, const ipc::CompletionRecord& c) {
    auto it = ops.find(op);
    OpState st = it->second;
    ops.erase(it);
    Status result;
    const std::byte* out = st.scratch + st.out_at;
    if (c.status != 0) {
      // The daemon wrote a NUL-terminated reason into the results area.
      const size_t n = strnlen(reinterpret_cast<const char*>(out), st.out_bytes);
      result = Status(static_cast<ErrorCode>(c.status), std::string(reinterpret_cast<const char*>(out), n));
    } else {
      result = Fill(st, c, out);
    }
    ring->FreeScratch(st.scratch);
    return result;
  }

  Status Fill(const OpState& st, const ipc::CompletionRecord& c, const std::byte* out) {
    auto results = [&](std::vector<ipc::BlockResult>* r) {
      r->resize(st.count);
      std::memcpy(r->data(), out, st.count * sizeof(ipc::BlockResult));
    };
    auto pointer = [&](uint64_t offset) -> std::byte* {
      // Defensive: a daemon bug must not turn into a wild pointer.
      if (offset > ring->arena_bytes() || info.block_bytes > ring->arena_bytes() - offset) return nullptr;
      return ring->arena() + offset;
    };
    switch (st.opcode) {
      case Opcode::kLookup: {
        std::vector<ipc::BlockResult> r;
        results(&r);
        st.lookup->hit_blocks = c.count;
        st.lookup->recompute_blocks =
            c.count <= st.count ? static_cast<uint32_t>(std::min<uint64_t>(c.value, st.count - c.count)) : 0;
        st.lookup->lease = c.handle;
        st.lookup->tiers.resize(st.count);
        st.lookup->lanes.assign(st.count, kNoLane);
        st.lookup->gpu_blocks.assign(st.count, nullptr);
        for (uint32_t i = 0; i < st.count; ++i) {
          st.lookup->tiers[i] = static_cast<TierKind>(r[i].tier);
          // Any tier below host memory (a kind this client does not know
          // too) has a lane.
          const TierKind t = st.lookup->tiers[i];
          if (t != TierKind::kNone && t != TierKind::kGpu && t != TierKind::kHost) st.lookup->lanes[i] = r[i].lane;
          // A pinned GPU-tier copy, reachable once this client mapped the arena.
          const uint64_t g = r[i].gpu_offset;
          if (g != ipc::kNoGpuCopy && gpu_arena.base != nullptr && g <= gpu_arena.bytes &&
              info.block_bytes <= gpu_arena.bytes - g) {
            st.lookup->gpu_blocks[i] = gpu_arena.base + g;
          }
        }
        return Status();
      }
      case Opcode::kLoad: {
        std::vector<ipc::BlockResult> r;
        results(&r);
        // The loaded prefix (c.count <= keys).
        const uint32_t loaded = std::min(c.count, st.count);
        st.views->resize(loaded);
        for (uint32_t i = 0; i < loaded; ++i) {
          std::byte* p = pointer(r[i].arena_offset);
          if (p == nullptr) return Status(ErrorCode::kProtocol, "kvtierd returned a block outside the arena");
          (*st.views)[i] = BlockView{p, info.block_bytes, static_cast<TierKind>(r[i].tier)};
        }
        return Status();
      }
      case Opcode::kStoreBegin: {
        std::vector<ipc::BlockResult> r;
        results(&r);
        st.ticket->id = c.handle;
        st.ticket->needed = c.count;
        st.ticket->slots.assign(st.count, StoreSlot{});
        for (uint32_t i = 0; i < st.count; ++i) {
          if ((r[i].flags & ipc::kBlockNeeded) == 0) continue;
          std::byte* p = pointer(r[i].arena_offset);
          if (p == nullptr) return Status(ErrorCode::kProtocol, "kvtierd returned a slot outside the arena");
          st.ticket->slots[i] = StoreSlot{p, info.block_bytes, true};
        }
        return Status();
      }
      case Opcode::kStoreDevice:
      case Opcode::kLoadDevice:
        if (st.value) *st.value = c.count;
        return Status();
      case Opcode::kInvalidate:
      case Opcode::kInvalidateNamespace:
      case Opcode::kPrefetch:
        if (st.value) *st.value = static_cast<uint32_t>(c.value);
        return Status();
      default:
        return Status();
    }
  }

  Status WaitOp(OpId op, std::chrono::nanoseconds timeout) {
    if (!ops.contains(op)) {
      return Status(ErrorCode::kNotFound, absl::StrCat("operation ", op, " is not outstanding"));
    }
    absl::StatusOr<ipc::CompletionRecord> c = ring->WaitTake(op, timeout);
    if (!c.ok()) {
      Status s = ToPublic(c.status());
      // A timed-out operation stays outstanding; any other failure ends it.
      if (s.code() != ErrorCode::kTimedOut) {
        ring->FreeScratch(ops[op].scratch);
        ops.erase(op);
      }
      return s;
    }
    return Finish(op, *c);
  }
};

}  // namespace client_internal

}  // namespace kvtier

#endif  // KVTIER_CLIENT_INTERNAL_CLIENT_IMPL_H_
