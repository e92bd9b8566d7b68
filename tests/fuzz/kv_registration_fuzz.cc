// SPDX-License-Identifier: Apache-2.0
// The KV-cache registration decoders: arbitrary bytes from an attached client.
#include <cstring>

#include "ipc/kv_registration.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  auto m = kvtier::ipc::DecodeKvMessage(in);
  if (m.ok()) {
    // Whatever decodes re-encodes to the same bytes, and stays within limits.
    std::vector<std::byte> again = m->gpu_arena    ? kvtier::ipc::EncodeGpuArenaRequest()
                                   : m->unregister ? kvtier::ipc::EncodeKvUnregister(m->registration)
                                                   : kvtier::ipc::EncodeKvRegister(m->request);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
    if (!m->unregister && !m->gpu_arena && (m->request.regions.size() > kvtier::ipc::kMaxKvRegions ||
                           m->request.k_layers.size() != m->request.layers ||
                           m->request.layers > kvtier::ipc::kMaxKvLayers)) {
      __builtin_trap();
    }
  }
  // A reply, as if it came with 0 to 3 descriptors: what decodes re-encodes
  // to the same bytes and names only descriptors that came; one that
  // decodes with fewer descriptors decodes alike with more.
  bool decoded_with_fewer = false;
  for (size_t fds = 0; fds <= 3; ++fds) {
    auto r = kvtier::ipc::DecodeKvReply(in, fds);
    if (decoded_with_fewer && !r.ok()) __builtin_trap();
    if (!r.ok()) continue;
    decoded_with_fewer = true;
    std::vector<std::byte> again = kvtier::ipc::EncodeKvReply(*r);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
    if (r->layer_events.size() > kvtier::ipc::kMaxKvLayers) __builtin_trap();
    for (const auto& e : r->layer_events) {
      if (r->event_kind == kvtier::ipc::KvEventKind::kSharedPage && e.fd_index >= fds) __builtin_trap();
    }
  }
  return 0;
}

std::vector<std::string> FuzzSeeds() {
  kvtier::ipc::KvRegisterRequest r;
  r.layers = 2;
  r.page_tokens = 16;
  r.kv_heads = 2;
  r.head_dim = 8;
  r.num_pages = 4;
  r.page_stride = 512;
  r.regions.push_back({kvtier::ipc::KvRegionKind::kHostMemfd, 0x1000, 8192, {}});
  r.regions.push_back({kvtier::ipc::KvRegionKind::kCudaIpc, 0x7f0000000000, 1 << 20, {1, 2, 3}});
  r.k_layers = {0x1000, 0x2000};
  r.v_layers = {0x1800, 0x2800};
  auto a = kvtier::ipc::EncodeKvRegister(r);
  auto b = kvtier::ipc::EncodeKvUnregister(7);
  auto c = kvtier::ipc::EncodeKvReply({0, 7, "ok"});
  kvtier::ipc::KvRegisterReply shared{0, 8, "", kvtier::ipc::KvEventKind::kSharedPage, {}};
  shared.layer_events = {{{}, 0, 0}, {{}, 1, 8}};
  kvtier::ipc::KvRegisterReply cuda{0, 9, "", kvtier::ipc::KvEventKind::kCudaIpc, {}};
  cuda.layer_events = {{{1, 2, 3}, 0, 0}};
  cuda.arena_kind = kvtier::ipc::KvArenaKind::kCudaIpc;
  cuda.arena_bytes = 1 << 20;
  kvtier::ipc::KvRegisterReply memfd_arena{0, 0, "", kvtier::ipc::KvEventKind::kNone, {}};
  memfd_arena.arena_kind = kvtier::ipc::KvArenaKind::kMemfd;
  memfd_arena.arena_bytes = 65536;
  auto d = kvtier::ipc::EncodeKvReply(shared);
  auto e = kvtier::ipc::EncodeKvReply(cuda);
  auto f = kvtier::ipc::EncodeKvReply(memfd_arena);
  auto g = kvtier::ipc::EncodeGpuArenaRequest();
  auto s = [](const std::vector<std::byte>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size()); };
  return {s(a), s(b), s(c), s(d), s(e), s(f), s(g)};
}

long FuzzDefaultIterations() { return 50000; }
