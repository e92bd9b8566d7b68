// SPDX-License-Identifier: Apache-2.0
#include "ipc/kv_registration.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "ipc/abi.h"
#include "ipc/wire.h"

namespace kvtier::ipc {
namespace {

constexpr uint32_t kRegister = 1, kUnregister = 2, kGpuArena = 3;

absl::Status Malformed(absl::string_view what) {
  return CodedStatus(KVTIER_EPROTO, absl::StrCat("malformed KV-cache registration (", what, ")"));
}

}  // namespace

std::vector<std::byte> EncodeKvRegister(const KvRegisterRequest& req) {
  ByteWriter w;
  w.Put(kKvRegisterMagic);
  w.Put(kAbiVersion);
  w.Put(kRegister);
  w.Put(req.layers);
  w.Put(req.page_tokens);
  w.Put(req.kv_heads);
  w.Put(req.head_dim);
  w.Put(req.dtype);
  w.Put(req.codec);
  w.Put(req.num_pages);
  w.Put(req.page_stride);
  w.Put(static_cast<uint32_t>(req.regions.size()));
  for (const KvRegion& r : req.regions) {
    w.Put(static_cast<uint8_t>(r.kind));
    w.Put(r.base);
    w.Put(r.bytes);
    w.PutBytes(r.handle);
  }
  w.Put(static_cast<uint32_t>(req.k_layers.size()));
  for (uint64_t a : req.k_layers) w.Put(a);
  for (uint64_t a : req.v_layers) w.Put(a);
  return std::move(w.bytes());
}

std::vector<std::byte> EncodeKvUnregister(uint64_t registration) {
  ByteWriter w;
  w.Put(kKvRegisterMagic);
  w.Put(kAbiVersion);
  w.Put(kUnregister);
  w.Put(registration);
  return std::move(w.bytes());
}

std::vector<std::byte> EncodeGpuArenaRequest() {
  ByteWriter w;
  w.Put(kKvRegisterMagic);
  w.Put(kAbiVersion);
  w.Put(kGpuArena);
  return std::move(w.bytes());
}

absl::StatusOr<KvMessage> DecodeKvMessage(std::span<const std::byte> data) {
  ByteReader r(data);
  uint64_t magic = 0;
  uint32_t version = 0, kind = 0;
  if (!r.Get(&magic) || magic != kKvRegisterMagic) return Malformed("bad magic");
  if (!r.Get(&version) || version != kAbiVersion) {
    return CodedStatus(KVTIER_EPROTONOSUPPORT, absl::StrCat("KV-cache registration of ABI v", version,
                                                            "; this kvtierd speaks v", kAbiVersion));
  }
  if (!r.Get(&kind)) return Malformed("short");
  KvMessage m;
  if (kind == kUnregister) {
    m.unregister = true;
    if (!r.Get(&m.registration) || !r.AtEnd()) return Malformed("unregister");
    return m;
  }
  if (kind == kGpuArena) {
    m.gpu_arena = true;
    if (!r.AtEnd()) return Malformed("GPU arena request");
    return m;
  }
  if (kind != kRegister) return Malformed(absl::StrCat("unknown kind ", kind));
  KvRegisterRequest& q = m.request;
  uint32_t regions = 0, layers = 0;
  if (!r.Get(&q.layers) || !r.Get(&q.page_tokens) || !r.Get(&q.kv_heads) || !r.Get(&q.head_dim) ||
      !r.Get(&q.dtype) || !r.Get(&q.codec) || !r.Get(&q.num_pages) || !r.Get(&q.page_stride) ||
      !r.Get(&regions)) {
    return Malformed("short header");
  }
  if (regions == 0 || regions > kMaxKvRegions) {
    return Malformed(absl::StrCat(regions, " memory regions (1 to ", kMaxKvRegions, ")"));
  }
  for (uint32_t i = 0; i < regions; ++i) {
    KvRegion g;
    uint8_t kind_byte = 0;
    if (!r.Get(&kind_byte) || !r.Get(&g.base) || !r.Get(&g.bytes) || !r.GetBytes(g.handle)) {
      return Malformed("short region");
    }
    if (kind_byte != static_cast<uint8_t>(KvRegionKind::kHostMemfd) &&
        kind_byte != static_cast<uint8_t>(KvRegionKind::kCudaIpc)) {
      return Malformed(absl::StrCat("region ", i, " of unknown kind ", kind_byte));
    }
    g.kind = static_cast<KvRegionKind>(kind_byte);
    q.regions.push_back(g);
  }
  if (!r.Get(&layers)) return Malformed("short layer list");
  if (layers != q.layers || layers == 0 || layers > kMaxKvLayers) {
    return Malformed(absl::StrCat(layers, " layer addresses for ", q.layers, " layers (1 to ", kMaxKvLayers, ")"));
  }
  q.k_layers.resize(layers);
  q.v_layers.resize(layers);
  for (uint64_t& a : q.k_layers) {
    if (!r.Get(&a)) return Malformed("short K layer addresses");
  }
  for (uint64_t& a : q.v_layers) {
    if (!r.Get(&a)) return Malformed("short V layer addresses");
  }
  if (!r.AtEnd()) return Malformed("trailing bytes");
  return m;
}

std::vector<std::byte> EncodeKvReply(const KvRegisterReply& reply) {
  ByteWriter w;
  w.Put(kKvReplyMagic);
  w.Put(kAbiVersion);
  w.Put(reply.status);
  w.Put(reply.registration);
  w.PutString(reply.message);
  w.Put(static_cast<uint8_t>(reply.event_kind));
  w.Put(static_cast<uint32_t>(reply.layer_events.size()));
  for (const KvEventRef& e : reply.layer_events) {
    if (reply.event_kind == KvEventKind::kCudaIpc) {
      w.PutBytes(e.handle);
    } else {
      w.Put(e.fd_index);
      w.Put(e.offset);
    }
  }
  w.Put(static_cast<uint8_t>(reply.arena_kind));
  if (reply.arena_kind != KvArenaKind::kNone) {
    w.PutBytes(reply.arena_handle);
    w.Put(reply.arena_bytes);
  }
  return std::move(w.bytes());
}

absl::StatusOr<KvRegisterReply> DecodeKvReply(std::span<const std::byte> data, size_t fds) {
  ByteReader r(data);
  uint64_t magic = 0;
  uint32_t version = 0, events = 0;
  uint8_t kind = 0;
  KvRegisterReply rep;
  if (!r.Get(&magic) || magic != kKvReplyMagic || !r.Get(&version) || version != kAbiVersion ||
      !r.Get(&rep.status) || !r.Get(&rep.registration) || !r.GetString(&rep.message, 4096) || !r.Get(&kind) ||
      kind > static_cast<uint8_t>(KvEventKind::kSharedPage) || !r.Get(&events) || events > kMaxKvLayers ||
      (kind == 0 && events != 0)) {
    return Malformed("reply");
  }
  rep.event_kind = static_cast<KvEventKind>(kind);
  rep.layer_events.resize(events);
  for (KvEventRef& e : rep.layer_events) {
    if (rep.event_kind == KvEventKind::kCudaIpc) {
      if (!r.GetBytes(e.handle)) return Malformed("reply's event handles");
    } else if (!r.Get(&e.fd_index) || !r.Get(&e.offset) || e.fd_index >= fds) {
      return Malformed("reply's event pages");
    }
  }
  uint8_t arena = 0;
  if (!r.Get(&arena) || arena > static_cast<uint8_t>(KvArenaKind::kMemfd)) return Malformed("reply's arena");
  rep.arena_kind = static_cast<KvArenaKind>(arena);
  if (rep.arena_kind != KvArenaKind::kNone &&
      (!r.GetBytes(rep.arena_handle) || !r.Get(&rep.arena_bytes) ||
       (rep.arena_kind == KvArenaKind::kMemfd && fds == 0))) {
    return Malformed("reply's arena");
  }
  if (!r.AtEnd()) return Malformed("reply");
  return rep;
}

}  // namespace kvtier::ipc
