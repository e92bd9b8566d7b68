// SPDX-License-Identifier: Apache-2.0
// libkvtier: engine KV caches — registration with the daemon, daemon-driven
// stores and layer-by-layer loads, and client-driven copies on the engine's
// own stream.
#include <chrono>
#include <thread>

#include "client/internal/client_impl.h"
#include "core/status.h"
#include "os/futex.h"
#include "ipc/kv_registration.h"
#include "kernels/cuda_host.h"
#include "kernels/cuda_kernels.h"
#include "kvtier/client.h"

namespace kvtier {

using client_internal::ClientImpl;

namespace {

Status Invalid(std::string message) { return Status(ErrorCode::kInvalidArgument, std::move(message)); }

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Opens the daemon's per-layer events: CUDA events for a CUDA cache, the
// simulated device's shared states for a host-memory one.
absl::Status OpenLayerEvents(const ipc::KvRegisterReply& reply, const std::vector<UniqueFd>& fds,
                             ClientImpl::KvCache* kc) {
  const ipc::KvEventKind want = kc->cuda ? ipc::KvEventKind::kCudaIpc : ipc::KvEventKind::kSharedPage;
  if (reply.event_kind != want) {
    return absl::InvalidArgumentError(absl::StrCat("kvtierd sent layer events of kind ",
                                                   static_cast<int>(reply.event_kind), " for a ",
                                                   kc->cuda ? "CUDA" : "host-memory", " KV cache"));
  }
  for (const ipc::KvEventRef& ref : reply.layer_events) {
    if (kc->cuda) {
      ASSIGN_OR_RETURN(uint64_t e, kernels::CudaOpenEvent(ref.handle));
      kc->cuda_events.ids.push_back(e);
    } else {
      // DecodeKvReply checked fd_index against the descriptors that came.
      ASSIGN_OR_RETURN(os::ImportedEvent e, os::ImportedEvent::Open(fds[ref.fd_index].get(), ref.offset));
      kc->shared_events.push_back(std::move(e));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Result<uint64_t> KvBlockBytes(const KvCacheLayout& layout, uint32_t block_tokens) {
  kernels::KvDtype dtype;
  kernels::BlockCodec codec;
  if (absl::Status s = kernels::ParseDtype(layout.dtype, &dtype); !s.ok()) return ToPublic(s);
  if (absl::Status s = kernels::ParseCodec(layout.codec, &codec); !s.ok()) return ToPublic(s);
  const kernels::KvShape shape{layout.layers, block_tokens, layout.kv_heads, layout.head_dim, dtype};
  if (absl::Status s = kernels::Validate(shape, codec); !s.ok()) return ToPublic(s);
  return kernels::GeometryOf(shape, codec).block_bytes;
}

Result<uint64_t> Client::RegisterKvCache(const KvCacheLayout& layout) {
  ClientImpl& c = *impl_;
  kernels::KvDtype dtype;
  kernels::BlockCodec codec;
  if (absl::Status s = kernels::ParseDtype(layout.dtype, &dtype); !s.ok()) return ToPublic(s);
  if (absl::Status s = kernels::ParseCodec(layout.codec, &codec); !s.ok()) return ToPublic(s);
  if (layout.k_layers.size() != layout.layers || layout.v_layers.size() != layout.layers) {
    return Invalid(absl::StrCat(layout.k_layers.size(), " K and ", layout.v_layers.size(), " V layer addresses for ",
                                layout.layers, " layers"));
  }
  if (layout.regions.empty() || layout.regions.size() > ipc::kMaxKvRegions) {
    return Invalid(absl::StrCat("a KV cache lies in 1 to ", ipc::kMaxKvRegions, " memory regions, not ",
                                layout.regions.size()));
  }
  ClientImpl::KvCache local;
  local.shape = kernels::KvShape{layout.layers, c.info.block_tokens, layout.kv_heads, layout.head_dim, dtype};
  local.codec = codec;
  local.cache.page_tokens = layout.page_tokens;
  local.cache.num_pages = layout.num_pages;
  local.cache.page_stride = layout.page_stride;
  if (local.cache.page_stride == 0 && layout.page_tokens != 0) {
    local.cache.page_stride = kernels::PageBytes(local.shape, local.cache);
  }
  for (uint32_t l = 0; l < layout.layers; ++l) {
    local.cache.k_base.push_back(Addr(layout.k_layers[l]));
    local.cache.v_base.push_back(Addr(layout.v_layers[l]));
  }
  if (absl::Status s = kernels::Validate(local.shape, codec); !s.ok()) return ToPublic(s);
  if (absl::Status s = kernels::Validate(local.shape, local.cache); !s.ok()) return ToPublic(s);

  ipc::KvRegisterRequest req;
  req.layers = layout.layers;
  req.page_tokens = layout.page_tokens;
  req.kv_heads = layout.kv_heads;
  req.head_dim = layout.head_dim;
  req.dtype = static_cast<uint8_t>(dtype);
  req.codec = static_cast<uint8_t>(codec);
  req.num_pages = layout.num_pages;
  req.page_stride = local.cache.page_stride;
  req.k_layers = local.cache.k_base;
  req.v_layers = local.cache.v_base;
  std::vector<int> fds;
  for (const KvMemoryRegion& r : layout.regions) {
    ipc::KvRegion g;
    g.base = Addr(r.base);
    g.bytes = r.bytes;
    if (r.memfd >= 0) {
      g.kind = ipc::KvRegionKind::kHostMemfd;
      fds.push_back(r.memfd);
    } else {
      g.kind = ipc::KvRegionKind::kCudaIpc;
      local.cuda = true;
      absl::StatusOr<std::array<uint8_t, 64>> h = kernels::CudaIpcHandleOf(r.base);
      if (!h.ok()) return ToPublic(h.status());
      g.handle = *h;
    }
    req.regions.push_back(g);
  }
  if (local.cuda && fds.size() > 0) {
    return Invalid("a KV cache lies either in CUDA device memory or in host memfds, not both");
  }
  if (local.cuda && !c.arena_registered_with_cuda) {
    // Client-driven copies read and write the arena from kernels on the
    // engine's stream: pin it for the device.
    if (absl::Status s = kernels::CudaRegisterHost(c.ring->arena(), c.ring->arena_bytes()); !s.ok()) {
      return ToPublic(s);
    }
    c.arena_registered_with_cuda = true;
  }
  absl::StatusOr<ipc::ReceivedMessage> answer =
      c.ring->Exchange(ipc::EncodeKvRegister(req), fds, std::chrono::seconds(10));
  if (!answer.ok()) return ToPublic(answer.status());
  absl::StatusOr<ipc::KvRegisterReply> reply = ipc::DecodeKvReply(answer->data, answer->fds.size());
  if (!reply.ok()) return ToPublic(reply.status());
  if (reply->status != 0) return Status(static_cast<ErrorCode>(reply->status), reply->message);
  absl::Status events = OpenLayerEvents(*reply, answer->fds, &local);
  if (events.ok() && local.cuda_events.ids.size() + local.shared_events.size() != layout.layers) {
    events = absl::InvalidArgumentError(absl::StrCat("kvtierd sent ", reply->layer_events.size(),
                                                     " layer events for ", layout.layers, " layers"));
  }
  if (!events.ok()) {
    // The daemon holds a registration this client cannot use: drop it there.
    (void)c.ring->Exchange(ipc::EncodeKvUnregister(reply->registration), {}, std::chrono::seconds(10));
    return ToPublic(events);
  }
  c.kv_caches.emplace(reply->registration, std::move(local));
  return reply->registration;
}

Result<uint64_t> Client::MapGpuArena() {
  ClientImpl& c = *impl_;
  if (c.gpu_arena.base != nullptr) return c.gpu_arena.bytes;
  absl::StatusOr<ipc::ReceivedMessage> answer =
      c.ring->Exchange(ipc::EncodeGpuArenaRequest(), {}, std::chrono::seconds(10));
  if (!answer.ok()) return ToPublic(answer.status());
  absl::StatusOr<ipc::KvRegisterReply> reply = ipc::DecodeKvReply(answer->data, answer->fds.size());
  if (!reply.ok()) return ToPublic(reply.status());
  if (reply->status != 0) return Status(static_cast<ErrorCode>(reply->status), reply->message);
  if (reply->arena_kind == ipc::KvArenaKind::kCudaIpc) {
    absl::StatusOr<void*> p = kernels::CudaOpenMemory(reply->arena_handle);
    if (!p.ok()) return ToPublic(p.status());
    c.gpu_arena.cuda = true;
    c.gpu_arena.base = static_cast<const std::byte*>(*p);
  } else if (reply->arena_kind == ipc::KvArenaKind::kMemfd) {
    const int fd = answer->fds[0].get();
    absl::StatusOr<uint64_t> size = os::FdSize(fd);
    if (!size.ok()) return ToPublic(size.status());
    if (!os::IsSealedAgainstShrink(fd) || *size < reply->arena_bytes) {
      return Status(ErrorCode::kProtocol, "kvtierd's GPU-tier arena memfd is unsealed or smaller than it claims");
    }
    absl::StatusOr<os::MappedRegion> region = os::MappedRegion::MapReadOnly(fd, reply->arena_bytes);
    if (!region.ok()) return ToPublic(region.status());
    c.gpu_arena.region = std::move(*region);
    c.gpu_arena.base = c.gpu_arena.region.data();
  } else {
    return Status(ErrorCode::kProtocol, "kvtierd answered a GPU arena request without an arena");
  }
  c.gpu_arena.bytes = reply->arena_bytes;
  return c.gpu_arena.bytes;
}

Status Client::UnregisterKvCache(uint64_t registration) {
  ClientImpl& c = *impl_;
  if (!c.kv_caches.contains(registration)) {
    return Status(ErrorCode::kNotFound, absl::StrCat("no KV-cache registration ", registration));
  }
  absl::StatusOr<ipc::ReceivedMessage> answer =
      c.ring->Exchange(ipc::EncodeKvUnregister(registration), {}, std::chrono::seconds(10));
  if (!answer.ok()) return ToPublic(answer.status());
  absl::StatusOr<ipc::KvRegisterReply> reply = ipc::DecodeKvReply(answer->data, answer->fds.size());
  if (!reply.ok()) return ToPublic(reply.status());
  c.kv_caches.erase(registration);
  if (reply->status != 0) return Status(static_cast<ErrorCode>(reply->status), reply->message);
  return Status();
}

namespace {

// The pages of keys.size() blocks, checked against the registration.
Status CheckPages(const ClientImpl& c, uint64_t registration, size_t keys, std::span<const uint32_t> pages,
                  const ClientImpl::KvCache** out) {
  auto it = c.kv_caches.find(registration);
  if (it == c.kv_caches.end()) {
    return Status(ErrorCode::kNotFound, absl::StrCat("no KV-cache registration ", registration,
                                                     " in this client; RegisterKvCache first"));
  }
  const uint64_t ppb = kernels::PagesPerBlock(it->second.shape, it->second.cache);
  if (pages.size() != keys * ppb) {
    return Invalid(absl::StrCat(pages.size(), " page ids for ", keys, " blocks of ", ppb, " pages"));
  }
  *out = &it->second;
  return Status();
}

}  // namespace

Result<uint32_t> Client::StoreFromCache(uint64_t registration, std::span<const BlockKey> keys,
                                        std::span<const uint32_t> pages) {
  const ClientImpl::KvCache* kc;
  if (Status s = CheckPages(*impl_, registration, keys.size(), pages, &kc); !s.ok()) return s;
  uint32_t written = 0;
  ClientImpl::OpState st;
  st.value = &written;
  Result<OpId> op = impl_->Submit(Opcode::kStoreDevice, 0, 0, keys, st, 0, registration, pages);
  if (!op.ok()) return op.status();
  if (Status s = impl_->WaitOp(*op, std::chrono::nanoseconds::max()); !s.ok()) return s;
  return written;
}

Result<DeviceLoad> Client::LoadIntoCacheAsync(uint64_t registration, uint64_t lease, std::span<const BlockKey> keys,
                                              std::span<const uint32_t> pages) {
  const ClientImpl::KvCache* kc;
  if (Status s = CheckPages(*impl_, registration, keys.size(), pages, &kc); !s.ok()) return s;
  ClientImpl::OpState st;
  st.layers = kc->shape.layers;
  Result<OpId> op = impl_->Submit(Opcode::kLoadDevice, 0, lease, keys, st, 0, registration, pages,
                                  sizeof(ipc::DeviceLoadProgress));
  if (!op.ok()) return op.status();
  return DeviceLoad{*op, kc->shape.layers, registration};
}

uint32_t Client::LayersReady(const DeviceLoad& load) const {
  auto it = impl_->ops.find(load.op);
  if (it == impl_->ops.end() || it->second.progress == nullptr) return load.layers;  // already finished
  return it->second.progress->layers_done.load(std::memory_order_acquire);
}

namespace {

// Waits until `*word` reaches `target` in a load's progress (layers_done, or
// armed); returns the blocks the load covers.
Result<uint32_t> WaitProgress(ClientImpl& c, const DeviceLoad& load, std::atomic<uint32_t> ipc::DeviceLoadProgress::*word,
                              uint32_t target, std::chrono::nanoseconds timeout) {
  auto it = c.ops.find(load.op);
  if (it == c.ops.end() || it->second.progress == nullptr) {
    // Finished, its outcome not yet collected by FinishLoad: every layer is in.
    if (auto done = c.finished_loads.find(load.op); done != c.finished_loads.end()) {
      if (!done->second.status.ok()) return done->second.status;
      return done->second.loaded;
    }
    return Status(ErrorCode::kNotFound, absl::StrCat("load ", load.op, " is not outstanding (already finished?)"));
  }
  ipc::DeviceLoadProgress* p = it->second.progress;
  std::atomic<uint32_t>* w = &(p->*word);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  uint64_t waited_ns = 0;
  for (;;) {
    const uint32_t now_at = w->load(std::memory_order_acquire);
    if (now_at >= target) return p->blocks.load(std::memory_order_acquire);
    if (p->failed.load(std::memory_order_acquire) != 0) {
      return Status(ErrorCode::kIo, "the load into the engine's cache failed; FinishLoad says why");
    }
    // The operation may have completed (with an error before any layer, or
    // successfully since `now_at` was read: the daemon publishes every layer
    // before it posts the completion). Its outcome is kept for FinishLoad.
    if (std::optional<ipc::CompletionRecord> done_op = c.ring->TryTake(load.op)) {
      uint32_t loaded = 0;
      it->second.value = &loaded;
      Status s = c.Finish(load.op, *done_op);
      c.finished_loads[load.op] = ClientImpl::FinishedLoad{s, loaded};
      if (!s.ok()) return s;
      return loaded;
    }
    if (Status h = ToPublic(c.ring->health()); !h.ok()) return h;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return Status(ErrorCode::kTimedOut, "the load's layers did not arrive in time");
    if (waited_ns < 50'000) {
      os::PollPause(waited_ns);
      waited_ns += 1000;
    } else {
      os::FutexWait(w, now_at, std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(100)));
    }
  }
}

}  // namespace

Result<uint32_t> Client::WaitLayers(const DeviceLoad& load, uint32_t layers, std::chrono::nanoseconds timeout) {
  layers = std::max(1u, std::min(layers, load.layers));  // layer 1 also means "the prefix is known"
  return WaitProgress(*impl_, load, &ipc::DeviceLoadProgress::layers_done, layers, timeout);
}

Result<uint32_t> Client::StreamWaitLayers(const DeviceLoad& load, uint32_t layers, uint64_t stream,
                                          std::chrono::nanoseconds timeout) {
  ClientImpl& c = *impl_;
  auto kc = c.kv_caches.find(load.registration);
  if (kc == c.kv_caches.end()) {
    return Status(ErrorCode::kNotFound, absl::StrCat("no KV-cache registration ", load.registration));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Once armed, each layer's event stands behind this load's layer.
  Result<uint32_t> blocks = WaitProgress(c, load, &ipc::DeviceLoadProgress::armed, 1, timeout);
  if (!blocks.ok() || *blocks == 0) return blocks;
  // load.layers is the caller's word; the registration's events bound it.
  const size_t events = kc->second.cuda ? kc->second.cuda_events.ids.size() : kc->second.shared_events.size();
  layers = static_cast<uint32_t>(std::min<size_t>({layers, load.layers, events}));
  for (uint32_t l = 0; l < layers; ++l) {
    if (kc->second.cuda) {
      if (absl::Status s = kernels::CudaStreamWaitEvent(stream, kc->second.cuda_events.ids[l]); !s.ok()) {
        return ToPublic(s);
      }
      continue;
    }
    os::SharedEventState& e = kc->second.shared_events[l].state();
    const auto left = deadline - std::chrono::steady_clock::now();
    if (!os::EventWait(e, os::EventTarget(e), std::max<std::chrono::nanoseconds>(left, std::chrono::nanoseconds(0)))) {
      return Status(ErrorCode::kTimedOut, absl::StrCat("layer ", l, "'s event did not complete in time"));
    }
  }
  return blocks;
}

Result<uint32_t> Client::FinishLoad(const DeviceLoad& load, std::chrono::nanoseconds timeout) {
  ClientImpl& c = *impl_;
  if (auto done = c.finished_loads.find(load.op); done != c.finished_loads.end()) {
    const ClientImpl::FinishedLoad f = done->second;
    c.finished_loads.erase(done);
    if (!f.status.ok()) return f.status;
    return f.loaded;
  }
  auto it = c.ops.find(load.op);
  if (it == c.ops.end()) {
    return Status(ErrorCode::kNotFound, absl::StrCat("load ", load.op, " is not outstanding"));
  }
  uint32_t loaded = 0;
  it->second.value = &loaded;
  if (Status s = c.WaitOp(load.op, timeout); !s.ok()) {
    if (auto again = c.ops.find(load.op); again != c.ops.end()) again->second.value = nullptr;  // still in flight
    return s;
  }
  return loaded;
}

Result<uint32_t> Client::LoadIntoCache(uint64_t registration, uint64_t lease, std::span<const BlockKey> keys,
                                       std::span<const uint32_t> pages) {
  Result<DeviceLoad> load = LoadIntoCacheAsync(registration, lease, keys, pages);
  if (!load.ok()) return load.status();
  return FinishLoad(*load, std::chrono::nanoseconds::max());
}

namespace {

Result<kernels::KvKernels*> KernelsFor(ClientImpl& c, const ClientImpl::KvCache& kc) {
  if (kc.cuda) {
    if (!c.cuda_kernels) c.cuda_kernels = kernels::MakeCudaKernels();
    if (!c.cuda_kernels) return Status(ErrorCode::kInvalidArgument, "this libkvtier was built without CUDA");
    return c.cuda_kernels.get();
  }
  if (!c.cpu_kernels) c.cpu_kernels = kernels::MakeReferenceKernels();
  return c.cpu_kernels.get();
}

}  // namespace

Status Client::ScatterToCache(uint64_t registration, std::span<const BlockView> blocks, std::span<const uint32_t> pages,
                              uint64_t stream, uint32_t first_layer, uint32_t layer_count) {
  const ClientImpl::KvCache* kc;
  if (Status s = CheckPages(*impl_, registration, blocks.size(), pages, &kc); !s.ok()) return s;
  std::vector<uint64_t> src;
  for (const BlockView& v : blocks) {
    if (v.data == nullptr || v.size != impl_->info.block_bytes) {
      return Invalid("a block view is empty or not block_bytes() long");
    }
    src.push_back(Addr(v.data));
  }
  Result<kernels::KvKernels*> k = KernelsFor(*impl_, *kc);
  if (!k.ok()) return k.status();
  return ToPublic((*k)->Scatter(kc->shape, kc->codec, kc->cache,
                                kernels::BlockIo{pages, src, first_layer, layer_count}, stream));
}

Status Client::GatherFromCache(uint64_t registration, const StoreTicket& ticket, std::span<const uint32_t> pages,
                               uint64_t stream) {
  const ClientImpl::KvCache* kc;
  if (Status s = CheckPages(*impl_, registration, ticket.slots.size(), pages, &kc); !s.ok()) return s;
  const uint64_t ppb = kernels::PagesPerBlock(kc->shape, kc->cache);
  std::vector<uint64_t> dst;
  std::vector<uint32_t> sel;
  for (size_t i = 0; i < ticket.slots.size(); ++i) {
    if (!ticket.slots[i].needed) continue;
    dst.push_back(Addr(ticket.slots[i].data));
    sel.insert(sel.end(), pages.begin() + i * ppb, pages.begin() + (i + 1) * ppb);
  }
  if (dst.empty()) return Status();
  Result<kernels::KvKernels*> k = KernelsFor(*impl_, *kc);
  if (!k.ok()) return k.status();
  return ToPublic((*k)->Gather(kc->shape, kc->codec, kc->cache, kernels::BlockIo{sel, dst}, stream));
}

}  // namespace kvtier
