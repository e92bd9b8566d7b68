// SPDX-License-Identifier: Apache-2.0
/* kvtier C ABI: the engine-side client library (libkvtier).
 *
 * Every function returns a negative errno-style code (KVTIER_E*) on failure,
 * as liburing does, and on success 0, or a count where it says so (the
 * counts the C++ API returns). kvtier_strerror() turns a code into text;
 * kvtier_last_error(c) gives the message of the last call on c: "" when it
 * succeeded. A failure without a client (kvtier_attach, or a NULL client)
 * leaves its message in kvtier_last_error(NULL), kept per thread.
 *
 * Threads: a kvtier_client is used by one thread at a time (calls on one
 * client are not synchronized; give each issuing thread its own client).
 * Different clients may be used from different threads at once.
 * kvtier_strerror is thread-safe; kvtier_last_error(NULL) is per thread.
 *
 * Ownership: the library owns the client (kvtier_detach frees it and
 * everything it holds: leases are released, open stores aborted, KV-cache
 * registrations dropped; finish every daemon-driven load first, or the daemon
 * may still be writing the pages after kvtier_detach returns). Every pointer
 * argument is borrowed for the call; output buffers of an asynchronous call
 * are written when it completes and must stay valid until kvtier_poll
 * returns 1 or kvtier_wait returns anything but KVTIER_ETIMEDOUT for it.
 * Block memory (kvtier_block.data) belongs to the client's shared arena:
 * a loaded block is readable until its lease is released, a store slot
 * writable until its ticket is committed or aborted, and none outlives the
 * client. Strings returned (kvtier_strerror, kvtier_last_error, kvtier_tenant,
 * kvtier_hash_name) are owned by the library: kvtier_last_error's until the
 * next call on that client (or thread), the others' until kvtier_detach.
 *
 * Example (error handling elided):
 *
 *   kvtier_namespace_desc ns = {0};
 *   ns.model_id = "meta-llama/Llama-3.1-8B"; ns.model_revision = "0e9e39f";
 *   ns.kv_dtype = "bf16"; ns.kv_layout = "layer_major";
 *   ns.block_tokens = 16; ns.block_bytes = 2 * 32 * 16 * 8 * 128 * 2;
 *   ns.tp_size = 1;
 *   kvtier_client* c;
 *   if (kvtier_attach(NULL, &ns, &c) < 0)
 *     fprintf(stderr, "kvtier: %s\n", kvtier_last_error(NULL));
 *   kvtier_key keys[4]; size_t n;
 *   kvtier_compute_keys(c, tokens, 64, NULL, NULL, 0, keys, 4, &n);
 *   kvtier_lookup_result r;
 *   kvtier_lookup(c, keys, n, KVTIER_LOOKUP_LEASE, &r, NULL);
 *   ...
 *   kvtier_release(c, r.lease);
 *   kvtier_detach(c);
 */
#ifndef KVTIER_KVTIER_H_
#define KVTIER_KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes: negative Linux errno values, so they print with strerror too. */
enum {
  KVTIER_OK = 0,
  KVTIER_EIO = -5,             /* I/O error in a tier */
  KVTIER_ENOENT = -2,          /* unknown key, lease or store ticket */
  KVTIER_ENOMEM = -12,         /* out of memory in the client */
  KVTIER_EACCES = -13,         /* not admitted: no tenant matches the peer */
  KVTIER_EBUSY = -16,          /* too many operations in flight */
  KVTIER_EEXIST = -17,         /* already present */
  KVTIER_EINVAL = -22,         /* bad argument */
  KVTIER_ENOSPC = -28,         /* tier full and nothing evictable */
  KVTIER_EPROTO = -71,         /* malformed message: the session was closed */
  KVTIER_EPROTONOSUPPORT = -93,/* ABI version mismatch between client and daemon */
  KVTIER_ENOTCONN = -107,      /* daemon unreachable or gone; re-attach */
  KVTIER_ETIMEDOUT = -110,     /* wait timed out; the operation is still in flight */
  KVTIER_ECANCELED = -125      /* operation cancelled (session closing) */
};

/* Tiers, in order of speed. A lookup reports where each hit block is:
 * NVME, REMOTE and FILE blocks are brought into host memory by kvtier_load
 * (a REMOTE block is read from a store other nodes share, over the
 * network; a FILE block from a file system other nodes mount). */
typedef enum {
  KVTIER_TIER_NONE = 0,
  KVTIER_TIER_GPU = 1,
  KVTIER_TIER_HOST = 2,
  KVTIER_TIER_NVME = 3,
  KVTIER_TIER_REMOTE = 4,
  KVTIER_TIER_FILE = 5
} kvtier_tier;

/* kvtier_lookup_lanes: a block in no lower tier (host memory, GPU, a miss).
 * Otherwise a lane is the lower tier's position in the daemon's chain, 0 the
 * first below host memory, as `kvtierctl tiers`, the status and the metrics'
 * `lane` label number them. */
#define KVTIER_NO_LANE 255

/* A block key: the full 256-bit chained hash of a prefix. */
typedef struct {
  uint8_t bytes[32];
} kvtier_key;

/* Everything outside the tokens that changes K/V. Strings are NUL-terminated
 * printable UTF-8. model_id, kv_dtype and kv_layout are required (NULL or ""
 * fails the attach with KVTIER_EINVAL); for the others NULL means empty.
 * block_tokens, block_bytes and tp_size must be at least 1, tp_rank below
 * tp_size. Two engines with equal descriptors (and the same tenant) share
 * blocks. cache_salt is never logged. */
typedef struct {
  const char* model_id;
  const char* model_revision;
  const char* tokenizer_revision;
  const char* adapter_id;
  const char* attention_config_hash;
  const char* kv_dtype;
  const char* kv_layout;
  const char* cache_salt;
  uint32_t block_tokens;
  uint64_t block_bytes;
  uint32_t tp_rank;
  uint32_t tp_size;
} kvtier_namespace_desc;

typedef struct kvtier_client kvtier_client;

/* Lookup flags. */
#define KVTIER_LOOKUP_LEASE 1u /* pin the hit prefix; release with kvtier_release */
/* Whether the lookup is its request's ask, the one kvtierd's policies
 * and hit counters learn from (once per request). Neither:
 * a leased lookup is, an unleased one is not. An engine that probes the
 * whole chain first and leases only what it loads flags the probe ASK and
 * the lease NOT_ASK (which needs KVTIER_LOOKUP_LEASE). */
#define KVTIER_LOOKUP_ASK 2u
#define KVTIER_LOOKUP_NOT_ASK 4u

typedef struct {
  uint32_t hit_blocks;       /* longest present prefix worth loading, in blocks */
  uint32_t recompute_blocks; /* present after it, but slower to load than to recompute */
  uint64_t lease;            /* 0 when no lease was taken or nothing hit */
} kvtier_lookup_result;

/* A block the engine reads in place (load) or fills in place (store). */
typedef struct {
  void* data;       /* in the shared host arena; NULL when not needed */
  uint64_t size;    /* block_bytes of the namespace */
  uint8_t tier;     /* kvtier_tier the block was found in (load) */
  uint8_t needed;   /* store: 1 when the engine must fill it, 0 when already cached */
} kvtier_block;

typedef uint64_t kvtier_op; /* asynchronous operation id, never 0 */

/* Attach to the daemon. socket_path NULL: $KVTIER_SOCKET, else kvtierd.sock
 * in the default run directory, or in /run/kvtier (the systemd service's)
 * when that exists. On failure *out is untouched and kvtier_last_error(NULL)
 * says why (e.g. "namespace field kv_dtype is required", or where no daemon
 * answered and what to do). */
int kvtier_attach(const char* socket_path, const kvtier_namespace_desc* ns, kvtier_client** out);
void kvtier_detach(kvtier_client* c);

/* Chained keys for the full blocks of `tokens`: n_tokens / block_tokens
 * keys (the partial last block is not cached). parent NULL starts a new chain. */
int kvtier_compute_keys(kvtier_client* c, const uint32_t* tokens, size_t n_tokens,
                        const kvtier_key* parent, const void* extra, size_t extra_len,
                        kvtier_key* out, size_t max_keys, size_t* n_out);

/* Synchronous forms. tiers (may be NULL) receives n entries; entries past the
 * hit prefix are KVTIER_TIER_NONE. kvtier_load fills the loaded prefix of
 * blocks and returns its length; entries after it have data == NULL (a block
 * that failed to come back from NVMe): recompute those. kvtier_store returns
 * how many blocks it wrote (the rest were already cached), kvtier_invalidate
 * and kvtier_invalidate_namespace how many blocks they removed. */
int kvtier_lookup(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t flags,
                  kvtier_lookup_result* result, uint8_t* tiers);
/* As kvtier_lookup; lanes (may be NULL) receives n entries, each a lower
 * tier's position in the chain or KVTIER_NO_LANE. */
int kvtier_lookup_lanes(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t flags,
                        kvtier_lookup_result* result, uint8_t* tiers, uint8_t* lanes);
int kvtier_load(kvtier_client* c, uint64_t lease, const kvtier_key* keys, size_t n,
                kvtier_block* blocks);
int kvtier_store_begin(kvtier_client* c, const kvtier_key* keys, size_t n, uint64_t* ticket,
                       kvtier_block* blocks);
int kvtier_store_commit(kvtier_client* c, uint64_t ticket);
/* As kvtier_store_commit, returning once the blocks are durable on NVMe. */
int kvtier_store_commit_durable(kvtier_client* c, uint64_t ticket);
/* Brings NVMe blocks of the present prefix of keys into host memory;
 * *promoted (may be NULL) gets how many. */
int kvtier_prefetch(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t* promoted);
int kvtier_store_abort(kvtier_client* c, uint64_t ticket);
int kvtier_store(kvtier_client* c, const kvtier_key* keys, size_t n, const void* const* src);
int kvtier_release(kvtier_client* c, uint64_t lease);
int kvtier_invalidate(kvtier_client* c, const kvtier_key* keys, size_t n);
int kvtier_invalidate_namespace(kvtier_client* c);
/* Reports a prefill's cost: cached_tokens reused, computed_tokens computed
 * after them, in elapsed_ns. The daemon calibrates its cost model on these. */
int kvtier_report_prefill(kvtier_client* c, uint64_t cached_tokens, uint64_t computed_tokens, uint64_t elapsed_ns);

/* Asynchronous forms: the output buffers must stay valid until the operation
 * completes (kvtier_poll returns 1, or kvtier_wait returns anything but
 * KVTIER_ETIMEDOUT). */
int kvtier_lookup_async(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t flags,
                        kvtier_lookup_result* result, uint8_t* tiers, kvtier_op* op);
int kvtier_lookup_lanes_async(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t flags,
                              kvtier_lookup_result* result, uint8_t* tiers, uint8_t* lanes, kvtier_op* op);
int kvtier_load_async(kvtier_client* c, uint64_t lease, const kvtier_key* keys, size_t n,
                      kvtier_block* blocks, kvtier_op* op);
/* 1 when done (its status in *status), 0 while in flight, <0 on error:
 * KVTIER_ENOENT for an operation that is not outstanding (unknown, or its
 * result already taken by a poll or wait that returned it). */
int kvtier_poll(kvtier_client* c, kvtier_op op, int* status);
/* Waits up to timeout_ms (<0: no limit); returns the operation's status
 * (KVTIER_ETIMEDOUT: still in flight, wait again; KVTIER_ENOENT as for poll). */
int kvtier_wait(kvtier_client* c, kvtier_op op, int timeout_ms);

/* Asynchronous store, prefetch and release. kvtier_store_begin_async writes
 * *ticket and blocks[0..n) when it completes; flags of the commit:
 * KVTIER_COMMIT_DURABLE completes once the blocks are durable on NVMe. */
#define KVTIER_COMMIT_DURABLE 1u
int kvtier_store_begin_async(kvtier_client* c, const kvtier_key* keys, size_t n, uint64_t* ticket,
                             kvtier_block* blocks, kvtier_op* op);
int kvtier_store_commit_async(kvtier_client* c, uint64_t ticket, uint32_t flags, kvtier_op* op);
int kvtier_prefetch_async(kvtier_client* c, const kvtier_key* keys, size_t n, uint32_t* promoted, kvtier_op* op);
int kvtier_release_async(kvtier_client* c, uint64_t lease, kvtier_op* op);
/* Operations submitted and not yet taken by kvtier_poll / kvtier_wait. */
int kvtier_in_flight(const kvtier_client* c);

/* An empty round trip (health checks, latency). */
int kvtier_ping(kvtier_client* c);
/* 1 while the session is up, 0 once the daemon closed it or went away (every
 * call then fails with the reason; attach again). */
int kvtier_connected(const kvtier_client* c);

/* What the daemon assigned at attach: block size in bytes and tokens, the
 * namespace id (32 bytes), the session id, the tenant's name. */
uint64_t kvtier_block_bytes(const kvtier_client* c);
uint32_t kvtier_block_tokens(const kvtier_client* c);
void kvtier_namespace_id(const kvtier_client* c, uint8_t out[32]);
uint64_t kvtier_session_id(const kvtier_client* c);
const char* kvtier_tenant(const kvtier_client* c);
/* The daemon's block-key hash ("sha256", "xxh3-128"): kvtier_compute_keys
 * uses it; an engine that computes keys itself must match it. */
const char* kvtier_hash_name(const kvtier_client* c);

/* ---- Engine KV caches -----------------------------------------------------
 * An engine registers its paged KV cache; kvtierd then gathers blocks from
 * its pages (kvtier_store_from_cache) and scatters loads into them layer by
 * layer (kvtier_load_into_cache_async + kvtier_wait_layers). Pages are
 * [page_tokens, kv_heads, head_dim] of K and of V per layer, page_stride
 * bytes apart. `pages` lists, key after key, block_tokens / page_tokens page
 * ids per key. */
typedef struct {
  const void* base; /* a CUDA region: what cudaMalloc returned; a host one: where the memfd is mapped */
  uint64_t bytes;
  int memfd;        /* -1 for CUDA device memory; else a memfd sealed against shrinking */
} kvtier_memory_region;

typedef struct {
  uint32_t layers;
  uint32_t page_tokens;   /* the engine's block size; divides the namespace's block_tokens */
  uint32_t kv_heads;      /* this rank's KV heads */
  uint32_t head_dim;
  const char* dtype;      /* f16, bf16, f32, fp8_e4m3, int8 (NULL: f16) */
  const char* codec;      /* none, int8, fp8 (NULL: none): how kvtier keeps blocks */
  uint64_t num_pages;
  uint64_t page_stride;   /* bytes between pages; 0: one page */
  const void* const* k_layers; /* layers entries: page 0 of each layer's K */
  const void* const* v_layers; /* and of its V */
  const kvtier_memory_region* regions; /* every address above lies in one */
  size_t n_regions;
} kvtier_kv_cache_layout;

/* A daemon-driven load in flight (kvtier_load_into_cache_async). */
typedef struct {
  uint64_t op;
  uint32_t layers;
  uint64_t registration;
} kvtier_device_load;

/* Bytes of one kvtier block of this layout's shape over block_tokens tokens:
 * the block_bytes to attach with before registering. */
int kvtier_kv_block_bytes(const kvtier_kv_cache_layout* layout, uint32_t block_tokens, uint64_t* out);
int kvtier_register_kv_cache(kvtier_client* c, const kvtier_kv_cache_layout* layout, uint64_t* registration);
int kvtier_unregister_kv_cache(kvtier_client* c, uint64_t registration);
/* Returns the blocks written (the rest were already cached). */
int kvtier_store_from_cache(kvtier_client* c, uint64_t registration, const kvtier_key* keys, size_t n,
                            const uint32_t* pages, size_t n_pages);
int kvtier_load_into_cache_async(kvtier_client* c, uint64_t registration, uint64_t lease, const kvtier_key* keys,
                                 size_t n, const uint32_t* pages, size_t n_pages, kvtier_device_load* load);
/* Layers of the load already in the pages (never blocks). It does not see a
 * load that failed: poll with kvtier_wait_layers(c, load, load->layers, 0),
 * which returns the blocks once every layer is in, an error once the load
 * failed, and KVTIER_ETIMEDOUT while it is in flight. */
int kvtier_layers_ready(const kvtier_client* c, const kvtier_device_load* load);
/* Until the first `layers` layers are in the pages; returns the blocks the
 * load covers (a prefix: recompute the rest). In these three waits,
 * timeout_ms < 0 means 30 s (not "no limit" as in kvtier_wait), and
 * KVTIER_ETIMEDOUT means the load is still in flight: the daemon may still
 * write the pages, so finish it (kvtier_finish_load until it returns
 * something else) before recomputing into them. */
int kvtier_wait_layers(kvtier_client* c, const kvtier_device_load* load, uint32_t layers, int timeout_ms);
/* Makes CUDA `stream` (a cudaStream_t) wait on the device for the first
 * `layers` layers; a host-memory cache waits here instead. Returns the
 * blocks the load covers. */
int kvtier_stream_wait_layers(kvtier_client* c, const kvtier_device_load* load, uint32_t layers, uint64_t stream,
                              int timeout_ms);
/* Waits for the whole load and ends it; returns the blocks loaded. */
int kvtier_finish_load(kvtier_client* c, const kvtier_device_load* load, int timeout_ms);
/* kvtier_load_into_cache_async + kvtier_finish_load. */
int kvtier_load_into_cache(kvtier_client* c, uint64_t registration, uint64_t lease, const kvtier_key* keys,
                           size_t n, const uint32_t* pages, size_t n_pages);
/* Client-driven copies on the engine's own stream (ignored, and done at once,
 * for a host-memory cache): loaded blocks (from kvtier_load) into pages,
 * layers [first_layer, first_layer + layer_count) (0: all); and pages into
 * the needed slots of an open store (from kvtier_store_begin), then commit. */
int kvtier_scatter_to_cache(kvtier_client* c, uint64_t registration, const kvtier_block* blocks, size_t n,
                            const uint32_t* pages, size_t n_pages, uint64_t stream, uint32_t first_layer,
                            uint32_t layer_count);
int kvtier_gather_from_cache(kvtier_client* c, uint64_t registration, uint64_t ticket, const uint32_t* pages,
                             size_t n_pages, uint64_t stream);
/* Maps the tenant's GPU-tier arena so leased lookups can report GPU blocks;
 * *bytes (may be NULL) gets its size. KVTIER_ENOENT without a GPU tier. */
int kvtier_map_gpu_arena(kvtier_client* c, uint64_t* bytes);

const char* kvtier_strerror(int code);
/* Message of the last call on c, "" when it succeeded (valid until the next
 * call on c); with c NULL, of the last call on this thread that had no client. */
const char* kvtier_last_error(const kvtier_client* c);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_KVTIER_H_ */
