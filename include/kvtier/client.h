// SPDX-License-Identifier: Apache-2.0
// kvtier C++ client API (libkvtier): what an inference engine links to reuse
// KV-cache blocks through kvtierd.
//
// One Client is one session and serves one issuing thread; an engine with
// several issuing threads opens several clients. Blocks live in a shared host
// arena that the client maps: lookups and loads hand out pointers into it
// (zero copy), stores hand out slots to fill in place.
//
//   kvtier::AttachOptions opts;
//   opts.ns = {.model_id = "meta-llama/Llama-3.1-8B", .model_revision = "0e9e39f",
//              .kv_dtype = "bf16", .kv_layout = "layer_major",
//              .block_tokens = 16, .block_bytes = 131072};
//   auto client = kvtier::Client::Attach(opts);
//   if (!client.ok()) { /* client.status().message() says why */ }
//   std::vector<kvtier::BlockKey> keys = (*client)->ComputeKeys(prompt_tokens);
//
//   // Scheduling: how much is cached? (no side effects, may repeat)
//   auto probe = (*client)->Lookup(keys);
//   // Commit to it: pin the hit prefix, then read it in place.
//   auto hit = (*client)->Lookup(keys, {.lease = true});
//   auto views = (*client)->Load(hit->lease, std::span(keys).first(hit->hit_blocks));
//   for (const kvtier::BlockView& v : *views) copy_into_engine(v.data, v.size);
//   (*client)->Release(hit->lease);
//
//   // After prefill: offload the blocks that were computed.
//   auto ticket = (*client)->StoreBegin(std::span(keys).subspan(hit->hit_blocks));
//   for (auto& slot : ticket->slots) if (slot.needed) fill_from_engine(slot.data, slot.size);
//   (*client)->StoreCommit(*ticket);
#ifndef KVTIER_CLIENT_H_
#define KVTIER_CLIENT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/types.h"

namespace kvtier {

struct AttachOptions {
  // Daemon socket; empty: $KVTIER_SOCKET, else the default run directory's
  // kvtierd.sock (see docs/configuration.md).
  std::string socket_path;
  NamespaceDescriptor ns;
  // Shown by kvtierctl; empty: this process's name.
  std::string client_name;
  // Busy-wait this long for a completion before sleeping on the doorbell.
  uint32_t spin_us = 20;
};

struct LookupOptions {
  // Pin the hit prefix so it stays until Release(lease). Without a lease a
  // lookup changes no block (engines may call it repeatedly while
  // scheduling); an unleased ask (below) teaches the policies and counters.
  bool lease = false;
  // Whether this lookup is its request's ask: the one kvtierd's eviction
  // policies and hit counters learn from, once per request.
  // kIfLeased: a leased lookup is, an unleased one is not. An engine that
  // probes a request's whole chain first and leases only what it then loads
  // (perhaps from another process) flags the probe kYes and the lease kNo
  // (kNo needs a lease): otherwise kvtierd learns only of the hits.
  enum class Ask : uint8_t { kIfLeased, kYes, kNo };
  Ask ask = Ask::kIfLeased;
};

struct LookupResult {
  uint32_t hit_blocks = 0;       // longest present prefix worth loading, in blocks
  // Blocks right after that prefix that are present but slower to load (from
  // NVMe) than to recompute at their position: compute them (and what
  // follows). Their tiers entry says where they are.
  uint32_t recompute_blocks = 0;
  uint64_t lease = 0;            // 0 without a lease or without a hit
  std::vector<TierKind> tiers;   // per key; kNone past the prefix
  // Per key, where tiers[i] is a lower tier's kind (kNvme, kRemote, kFile):
  // that tier's position in the daemon's chain (0: the first below host
  // memory, as kvtierctl tiers and the metrics' `lane` label number them);
  // kNoLane otherwise.
  std::vector<uint8_t> lanes;
  // Per key, with a lease and after MapGpuArena: the address, in this
  // process, of the block's copy in the daemon's GPU tier (device memory
  // for a CUDA daemon), pinned until the lease is released; nullptr when
  // the block has no GPU copy. Pass BlockView{p, block_bytes(), kGpu} to
  // ScatterToCache to copy it device to device on the engine's stream.
  std::vector<const std::byte*> gpu_blocks;
};

// A block to read in place; valid until its lease is released.
struct BlockView {
  const std::byte* data = nullptr;
  size_t size = 0;
  TierKind tier = TierKind::kNone;
};

// A slot to fill in place; `needed` is false when the block is already cached
// (or being stored by another engine) and must not be written.
struct StoreSlot {
  std::byte* data = nullptr;
  size_t size = 0;
  bool needed = false;
};

struct CommitOptions {
  // Complete only once the blocks are on NVMe with their journal records
  // synced: they survive a daemon crash or restart.
  bool durable = false;
};

struct StoreTicket {
  uint64_t id = 0;  // 0 when nothing needed storing
  uint32_t needed = 0;
  std::vector<StoreSlot> slots;  // one per key
};

using OpId = uint64_t;

// ---- Engine KV caches ------------------------------------------------------
// An engine can register its paged KV cache (vLLM / SGLang style: per layer,
// K and V each [num_pages][page_tokens][kv_heads][head_dim], apart or fused)
// so that blocks move between its pages and kvtier without the engine
// copying them: the daemon gathers and scatters them itself (StoreFromCache,
// LoadIntoCache), or this client does, on the engine's own stream, from the
// host arena (ScatterToCache, GatherFromCache). A block holds block_tokens()
// tokens = block_tokens() / page_tokens pages per layer.

// Memory the cache lives in. CUDA device memory (memfd = -1): `base` must be
// what cudaMalloc returned; the daemon opens it with a CUDA IPC handle. Host
// memory backed by a memfd (a CPU engine, or tests on the host-simulated
// device): the daemon maps the memfd, which must be sealed against shrinking
// (MFD_ALLOW_SEALING, then fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)).
struct KvMemoryRegion {
  const void* base = nullptr;
  size_t bytes = 0;
  int memfd = -1;
};

struct KvCacheLayout {
  uint32_t layers = 0;
  uint32_t page_tokens = 0;  // the engine's block size; must divide block_tokens()
  uint32_t kv_heads = 0;     // this rank's KV heads
  uint32_t head_dim = 0;
  std::string dtype = "f16";  // f16, bf16, f32, fp8_e4m3, int8
  // Blocks as kvtier keeps them: "none" (a copy), or "int8" / "fp8" (E4M3)
  // quantized on offload with per-channel K and per-token V scales, and
  // restored on reload. The namespace's block_bytes must match the codec.
  std::string codec = "none";
  uint64_t num_pages = 0;
  uint64_t page_stride = 0;  // bytes between pages; 0 = one page (fused K/V: twice that)
  std::vector<const void*> k_layers;  // address of page 0 of each layer's K
  std::vector<const void*> v_layers;  // and of its V (fused: K + one page)
  std::vector<KvMemoryRegion> regions;  // every address above lies in one of them
};

// Bytes of one kvtier block of this layout's shape (layers, kv_heads,
// head_dim, dtype, codec) over `block_tokens` tokens: the block_bytes a
// namespace needs for RegisterKvCache to accept the layout. kInvalidArgument
// names what does not fit (an unknown dtype or codec, an empty shape, a codec
// that cannot quantize the dtype).
Result<uint64_t> KvBlockBytes(const KvCacheLayout& layout, uint32_t block_tokens);

// A daemon-driven load in flight: its layers land in the engine's pages in
// order, and each can be used as soon as it is there.
struct DeviceLoad {
  OpId op = 0;
  uint32_t layers = 0;
  uint64_t registration = 0;
};

namespace client_internal {
class ClientImpl;
}  // namespace client_internal

class Client {
 public:
  // Connects, is admitted by the daemon as one of its tenants, and maps the
  // session's rings and the tenant's host arena.
  static Result<std::unique_ptr<Client>> Attach(const AttachOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // What the daemon assigned at attach.
  uint64_t session_id() const;
  const BlockKey& namespace_id() const;
  uint64_t block_bytes() const;
  uint32_t block_tokens() const;
  HashAlgorithm hash() const;
  const std::string& tenant() const;

  // Chained keys of every full block of `tokens` (the partial tail is not
  // cached), with the daemon's hash. `parent` continues an earlier chain;
  // `extra` carries multimodal input hashes or a per-request salt.
  std::vector<BlockKey> ComputeKeys(std::span<const uint32_t> tokens, const BlockKey* parent = nullptr,
                                    std::span<const std::byte> extra = {}) const;

  // Synchronous operations (each one round trip through the rings). A
  // request names each block once: lookups, loads and stores with a key
  // repeated fail with kInvalidArgument; Prefetch and Invalidate count a
  // repeated key once.
  Result<LookupResult> Lookup(std::span<const BlockKey> keys, LookupOptions options = {});
  // Views of pinned blocks: keys must be in the lease. Blocks on NVMe are
  // brought into host memory first. The result is the prefix of keys that
  // loaded: shorter than keys when a block failed to come back (a checksum
  // or I/O error; such a block is dropped), and the engine recomputes the rest.
  Result<std::vector<BlockView>> Load(uint64_t lease, std::span<const BlockKey> keys);
  // Brings NVMe blocks of the present prefix of keys into host memory ahead
  // of need (e.g. for a request waiting in the engine's queue). Returns how
  // many were promoted. No lease is taken.
  Result<uint32_t> Prefetch(std::span<const BlockKey> keys);
  // Reserves slots; all or nothing (kNoSpace when the tier cannot hold them).
  Result<StoreTicket> StoreBegin(std::span<const BlockKey> keys);
  // Makes the ticket's blocks visible to lookups. A ticket with id 0 is a no-op.
  Status StoreCommit(const StoreTicket& ticket, CommitOptions options = {});
  Status StoreAbort(const StoreTicket& ticket);
  // StoreBegin + copy + StoreCommit. src[i] must be block_bytes() long.
  // Returns how many blocks were written (the rest were already cached).
  Result<uint32_t> Store(std::span<const BlockKey> keys, std::span<const std::span<const std::byte>> src);
  Status Release(uint64_t lease);
  // Removes blocks of this namespace; returns how many.
  Result<uint32_t> Invalidate(std::span<const BlockKey> keys);
  Result<uint32_t> InvalidateNamespace();
  // An empty round trip (for health checks and latency measurement).
  Status Ping();
  // Tells the daemon what a prefill cost: it reused `cached_tokens` (loaded
  // or already on the GPU), computed `computed_tokens` after them, and took
  // `elapsed`. The daemon fits its prefill throughput to these reports
  // (kvtierctl status shows the fit) and prices recomputation with it.
  Status ReportPrefill(uint64_t cached_tokens, uint64_t computed_tokens, std::chrono::nanoseconds elapsed);

  // Asynchronous forms: `out` must stay valid until the operation completes.
  Result<OpId> LookupAsync(std::span<const BlockKey> keys, LookupOptions options, LookupResult* out);
  Result<OpId> LoadAsync(uint64_t lease, std::span<const BlockKey> keys, std::vector<BlockView>* out);
  Result<OpId> StoreBeginAsync(std::span<const BlockKey> keys, StoreTicket* out);
  Result<OpId> StoreCommitAsync(const StoreTicket& ticket, CommitOptions options = {});
  Result<OpId> PrefetchAsync(std::span<const BlockKey> keys, uint32_t* promoted);
  Result<OpId> ReleaseAsync(uint64_t lease);
  // The operation's status once it completed (and forgets it); nullopt while
  // it is in flight. Never blocks.
  std::optional<Status> Poll(OpId op);
  // Blocks until the operation completes or `timeout` passes (kTimedOut, the
  // operation stays in flight). A dead daemon fails the wait within a second
  // with kNotConnected.
  Status Wait(OpId op, std::chrono::nanoseconds timeout = std::chrono::nanoseconds::max());
  // Operations submitted and not yet consumed by Poll/Wait.
  uint32_t InFlight() const;

  // Registers an engine KV cache with the daemon; the id names it in the
  // calls below. Errors name what does not fit (a block size that does not
  // match the namespace, an address outside the regions, a CUDA region on a
  // daemon without a GPU).
  Result<uint64_t> RegisterKvCache(const KvCacheLayout& layout);
  Status UnregisterKvCache(uint64_t registration);

  // Daemon-driven store: kvtier gathers each block from the engine's pages
  // (`pages`: page ids, page_tokens-sized, block_tokens()/page_tokens per key,
  // key after key) into its host tier. Returns the blocks written (the rest
  // were already cached).
  Result<uint32_t> StoreFromCache(uint64_t registration, std::span<const BlockKey> keys,
                                  std::span<const uint32_t> pages);
  // Daemon-driven load of leased blocks into the engine's pages, layer by
  // layer. `keys` must be in the lease; pages as for StoreFromCache.
  Result<DeviceLoad> LoadIntoCacheAsync(uint64_t registration, uint64_t lease, std::span<const BlockKey> keys,
                                        std::span<const uint32_t> pages);
  // Layers of `load` already in the engine's pages. Never blocks.
  uint32_t LayersReady(const DeviceLoad& load) const;
  // Blocks until the first `layers` layers are in the engine's pages; returns
  // how many blocks they cover (the prefix that loaded: the engine recomputes
  // the rest). kIoError when the load failed.
  Result<uint32_t> WaitLayers(const DeviceLoad& load, uint32_t layers,
                              std::chrono::nanoseconds timeout = std::chrono::seconds(30));
  // Makes the engine's `stream` wait, on the device, for the first `layers`
  // layers of `load`: once the daemon has queued the load (it arms it before
  // the copies run), each layer's CUDA event, recorded by the daemon behind
  // that layer, is put on the stream with cudaStreamWaitEvent, so kernels the
  // engine enqueues after this call see the layers without the host waiting
  // for them. A host-memory cache has no stream: this thread waits on the
  // layers' events (shared with the daemon) instead. Returns the blocks the
  // load covers (0: nothing loaded; recompute). Issue it before the next load
  // into the same registration is submitted, or the stream waits for that
  // one too (never less than it needs).
  Result<uint32_t> StreamWaitLayers(const DeviceLoad& load, uint32_t layers, uint64_t stream = 0,
                                    std::chrono::nanoseconds timeout = std::chrono::seconds(30));
  // Waits for the whole load and ends it; returns the blocks loaded.
  Result<uint32_t> FinishLoad(const DeviceLoad& load, std::chrono::nanoseconds timeout = std::chrono::seconds(30));
  // LoadIntoCacheAsync + FinishLoad.
  Result<uint32_t> LoadIntoCache(uint64_t registration, uint64_t lease, std::span<const BlockKey> keys,
                                 std::span<const uint32_t> pages);

  // Client-driven copies, on the engine's own `stream` (a cudaStream_t for a
  // CUDA cache; ignored for a host-memory cache, which this thread copies at
  // once). Scatters blocks read in place (views from Load) into pages, layers
  // [first_layer, first_layer + layer_count) (0 = all).
  Status ScatterToCache(uint64_t registration, std::span<const BlockView> blocks, std::span<const uint32_t> pages,
                        uint64_t stream = 0, uint32_t first_layer = 0, uint32_t layer_count = 0);
  // Gathers pages into the needed slots of a store ticket (pages for every
  // key of the ticket, needed or not); then StoreCommit.
  Status GatherFromCache(uint64_t registration, const StoreTicket& ticket, std::span<const uint32_t> pages,
                         uint64_t stream = 0);

  // Maps the tenant's GPU-tier arena into this process (CUDA IPC; a memfd on
  // the simulated device) so leased lookups give gpu_blocks. Returns its
  // size. kNotFound when the daemon has no GPU tier
  // (tiers.gpu.capacity = 0); calling it again is a no-op.
  Result<uint64_t> MapGpuArena();

  // False once the daemon closed the session or went away; every call then
  // fails with the reason. Attach again to continue.
  bool connected() const;


 private:
  friend class ClientTestPeer;  // kvtier's own tests: replay races step by step
  explicit Client(std::unique_ptr<client_internal::ClientImpl> impl);
  std::unique_ptr<client_internal::ClientImpl> impl_;
};

}  // namespace kvtier

#endif  // KVTIER_CLIENT_H_
