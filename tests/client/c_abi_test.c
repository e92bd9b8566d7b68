/* SPDX-License-Identifier: Apache-2.0 */
/* The C ABI from a C program, against a running kvtierd (device "sim"):
 * every call the C++ API has a C form of — asynchronous store, commit,
 * prefetch and release; the session's facts; a KV cache in a memfd
 * registered, stored from, loaded into layer by layer (daemon-driven) and
 * scattered into / gathered from (client-driven), byte-exact; namespace
 * invalidation; and the errors of bad arguments.
 * Usage: c_abi_test SOCKET (tests/client/c_abi_test.sh starts the daemon). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <kvtier/kvtier.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      ++failures;                                          \
    }                                                      \
  } while (0)
/* cond is evaluated once (it is often a call). */
#define REQUIRE(cond, ...)                                              \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, "\n");                                            \
      exit(1);                                                          \
    }                                                                   \
  } while (0)

enum { LAYERS = 2, HEADS = 2, DIM = 16, TOKENS = 16, PAGES = 16 };
#define PAGE_BYTES ((size_t)TOKENS * HEADS * DIM * 4)
#define LAYER_BLOCK_BYTES (2 * PAGE_BYTES)

static unsigned char* mem;
static unsigned char* k_page(int layer, int page) { return mem + ((size_t)layer * 2 * PAGES + page) * PAGE_BYTES; }
static unsigned char* v_page(int layer, int page) { return k_page(layer, page) + (size_t)PAGES * PAGE_BYTES; }

static int same_pages(int a, int b) {
  for (int l = 0; l < LAYERS; ++l) {
    if (memcmp(k_page(l, a), k_page(l, b), PAGE_BYTES) || memcmp(v_page(l, a), v_page(l, b), PAGE_BYTES)) return 0;
  }
  return 1;
}

static void keys_for(kvtier_client* c, uint32_t seed, kvtier_key* keys, size_t want) {
  uint32_t tokens[TOKENS * 8];
  for (size_t i = 0; i < TOKENS * want; ++i) tokens[i] = seed * 1000 + (uint32_t)i;
  size_t n = 0;
  REQUIRE(kvtier_compute_keys(c, tokens, TOKENS * want, NULL, NULL, 0, keys, want, &n) == 0 && n == want, "keys");
}

int main(int argc, char** argv) {
  REQUIRE(argc == 2, "usage: c_abi_test SOCKET");
  const void* k_layers[LAYERS];
  const void* v_layers[LAYERS];
  kvtier_kv_cache_layout layout = {LAYERS, TOKENS, HEADS, DIM, "f32", NULL, PAGES, PAGE_BYTES,
                                   k_layers, v_layers, NULL, 0};
  uint64_t block_bytes = 0;
  REQUIRE(kvtier_kv_block_bytes(&layout, TOKENS, &block_bytes) == 0, "%s", kvtier_last_error(NULL));
  REQUIRE(block_bytes == LAYERS * LAYER_BLOCK_BYTES, "block bytes %llu", (unsigned long long)block_bytes);
  layout.dtype = "f77";
  CHECK(kvtier_kv_block_bytes(&layout, TOKENS, &block_bytes) == KVTIER_EINVAL, "an unknown dtype is refused");
  layout.dtype = "f32";

  kvtier_namespace_desc ns;
  memset(&ns, 0, sizeof ns);
  ns.model_id = "c-abi/test";
  ns.kv_dtype = "f32";
  ns.kv_layout = "layer_major";
  ns.block_tokens = TOKENS;
  ns.block_bytes = LAYERS * LAYER_BLOCK_BYTES;
  ns.tp_size = 1;
  kvtier_client* c = NULL;
  REQUIRE(kvtier_attach(argv[1], &ns, &c) == 0, "attach: %s", kvtier_last_error(NULL));

  /* the session's facts */
  CHECK(kvtier_block_tokens(c) == TOKENS, "block_tokens %u", kvtier_block_tokens(c));
  CHECK(kvtier_block_bytes(c) == LAYERS * LAYER_BLOCK_BYTES, "block_bytes");
  CHECK(kvtier_session_id(c) > 0, "session id");
  CHECK(strcmp(kvtier_tenant(c), "default") == 0, "tenant %s", kvtier_tenant(c));
  CHECK(strcmp(kvtier_hash_name(c), "sha256") == 0, "hash %s", kvtier_hash_name(c));
  CHECK(kvtier_connected(c) == 1, "connected");
  CHECK(kvtier_ping(c) == 0, "ping: %s", kvtier_last_error(c));
  CHECK(kvtier_in_flight(c) == 0, "nothing in flight");

  /* asynchronous store: begin, fill, commit */
  kvtier_key keys[4];
  keys_for(c, 1, keys, 4);
  uint64_t ticket = 0;
  kvtier_block slots[4];
  kvtier_op op = 0;
  REQUIRE(kvtier_store_begin_async(c, keys, 4, &ticket, slots, &op) == 0, "%s", kvtier_last_error(c));
  REQUIRE(kvtier_wait(c, op, 5000) == 0, "store_begin: %s", kvtier_last_error(c));
  REQUIRE(ticket != 0, "a ticket");
  for (int b = 0; b < 4; ++b) {
    REQUIRE(slots[b].data != NULL && slots[b].needed == 1 && slots[b].size == block_bytes, "slot %d", b);
    for (size_t i = 0; i < block_bytes; ++i) ((unsigned char*)slots[b].data)[i] = (unsigned char)(b * 37 + i * 11);
  }
  CHECK(kvtier_store_commit_async(c, ticket, 8, &op) == KVTIER_EINVAL, "unknown commit flags are refused");
  REQUIRE(kvtier_store_commit_async(c, ticket, 0, &op) == 0, "%s", kvtier_last_error(c));
  REQUIRE(kvtier_wait(c, op, 5000) == 0, "commit: %s", kvtier_last_error(c));

  /* lookup with a lease; prefetch and release asynchronously */
  kvtier_lookup_result hit;
  REQUIRE(kvtier_lookup(c, keys, 4, KVTIER_LOOKUP_LEASE, &hit, NULL) == 0 && hit.hit_blocks == 4, "hit %u",
          hit.hit_blocks);
  uint32_t promoted = 99;
  REQUIRE(kvtier_prefetch_async(c, keys, 4, &promoted, &op) == 0, "%s", kvtier_last_error(c));
  REQUIRE(kvtier_wait(c, op, 5000) == 0, "prefetch: %s", kvtier_last_error(c));
  CHECK(promoted == 0, "all in host memory: nothing to promote (%u)", promoted);

  /* the engine's KV cache in a sealed memfd */
  const size_t mem_bytes = (size_t)LAYERS * 2 * PAGES * PAGE_BYTES;
  int fd = memfd_create("c-abi-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0 && ftruncate(fd, (off_t)mem_bytes) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, "memfd");
  mem = mmap(NULL, mem_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(mem != MAP_FAILED, "mmap");
  for (int l = 0; l < LAYERS; ++l) {
    k_layers[l] = k_page(l, 0);
    v_layers[l] = v_page(l, 0);
  }
  kvtier_memory_region region = {mem, mem_bytes, fd};
  layout.regions = &region;
  layout.n_regions = 1;
  uint64_t reg = 0;
  CHECK(kvtier_register_kv_cache(c, NULL, &reg) == KVTIER_EINVAL, "a NULL layout is refused");
  REQUIRE(kvtier_register_kv_cache(c, &layout, &reg) == 0, "register: %s", kvtier_last_error(c));

  /* client-driven: scatter the stored blocks (loaded in place) into pages 5..8 */
  kvtier_block views[4];
  REQUIRE(kvtier_load(c, hit.lease, keys, 4, views) == 4, "load: %s", kvtier_last_error(c));
  uint32_t scatter_pages[4] = {5, 6, 7, 8};
  REQUIRE(kvtier_scatter_to_cache(c, reg, views, 4, scatter_pages, 4, 0, 0, 0) == 0, "scatter: %s",
          kvtier_last_error(c));
  for (int b = 0; b < 4; ++b) {
    for (int l = 0; l < LAYERS; ++l) {
      const unsigned char* blk = (const unsigned char*)views[b].data + (size_t)l * LAYER_BLOCK_BYTES;
      CHECK(memcmp(k_page(l, 5 + b), blk, PAGE_BYTES) == 0 && memcmp(v_page(l, 5 + b), blk + PAGE_BYTES, PAGE_BYTES) == 0,
            "scattered block %d layer %d differs", b, l);
    }
  }
  REQUIRE(kvtier_release_async(c, hit.lease, &op) == 0, "%s", kvtier_last_error(c));
  REQUIRE(kvtier_wait(c, op, 5000) == 0, "release: %s", kvtier_last_error(c));
  CHECK(kvtier_release(c, hit.lease) == KVTIER_ENOENT, "the lease went with the asynchronous release");

  /* daemon-driven: store pages 1..3, load them into 9..11 layer by layer */
  for (size_t i = 0; i < mem_bytes; ++i) {
    size_t page = (i / PAGE_BYTES) % PAGES;
    if (page >= 1 && page <= 3) mem[i] = (unsigned char)(i * 7 + 3);
  }
  kvtier_key keys2[3];
  keys_for(c, 2, keys2, 3);
  uint32_t src_pages[3] = {1, 2, 3}, dst_pages[3] = {9, 10, 11};
  CHECK(kvtier_store_from_cache(c, reg, keys2, 3, src_pages, 2) == KVTIER_EINVAL, "a page list of the wrong length");
  REQUIRE(kvtier_store_from_cache(c, reg, keys2, 3, src_pages, 3) == 3, "store_from_cache: %s", kvtier_last_error(c));
  REQUIRE(kvtier_lookup(c, keys2, 3, KVTIER_LOOKUP_LEASE, &hit, NULL) == 0 && hit.hit_blocks == 3, "hit");
  kvtier_device_load load;
  REQUIRE(kvtier_load_into_cache_async(c, reg, hit.lease, keys2, 3, dst_pages, 3, &load) == 0, "%s",
          kvtier_last_error(c));
  CHECK(load.layers == LAYERS, "layers %u", load.layers);
  for (uint32_t l = 0; l < LAYERS; ++l) {
    CHECK(kvtier_wait_layers(c, &load, l + 1, 5000) == 3, "wait_layers: %s", kvtier_last_error(c));
    CHECK(kvtier_layers_ready(c, &load) >= (int)l + 1, "layers_ready");
    for (int b = 0; b < 3; ++b) {
      CHECK(memcmp(k_page(l, 9 + b), k_page(l, 1 + b), PAGE_BYTES) == 0 &&
                memcmp(v_page(l, 9 + b), v_page(l, 1 + b), PAGE_BYTES) == 0,
            "layer %u of block %d did not land", l, b);
    }
  }
  CHECK(kvtier_finish_load(c, &load, 5000) == 3, "finish: %s", kvtier_last_error(c));
  CHECK(kvtier_wait_layers(c, NULL, 1, 10) == KVTIER_EINVAL, "a NULL load is refused");
  /* the same through the stream wait (a host cache waits here) and the synchronous form */
  uint32_t dst2[3] = {12, 13, 14};
  REQUIRE(kvtier_load_into_cache_async(c, reg, hit.lease, keys2, 3, dst2, 3, &load) == 0, "%s", kvtier_last_error(c));
  CHECK(kvtier_stream_wait_layers(c, &load, LAYERS, 0, 5000) == 3, "stream_wait: %s", kvtier_last_error(c));
  CHECK(kvtier_finish_load(c, &load, 5000) == 3, "finish");
  for (int b = 0; b < 3; ++b) CHECK(same_pages(12 + b, 1 + b), "stream-waited block %d", b);
  memset(k_page(0, 12), 0, PAGE_BYTES);
  CHECK(kvtier_load_into_cache(c, reg, hit.lease, keys2, 3, dst2, 3) == 3, "load_into_cache: %s", kvtier_last_error(c));
  CHECK(same_pages(12, 1), "the synchronous load rewrote page 12");
  CHECK(kvtier_release(c, hit.lease) == 0, "release");

  /* client-driven gather: pages 9..10 into an open store's slots */
  kvtier_key keys3[2];
  keys_for(c, 3, keys3, 2);
  kvtier_block slots3[2];
  REQUIRE(kvtier_store_begin(c, keys3, 2, &ticket, slots3) == 0, "%s", kvtier_last_error(c));
  uint32_t gather_pages[2] = {9, 10};
  CHECK(kvtier_gather_from_cache(c, reg, ticket + 1000, gather_pages, 2, 0) == KVTIER_ENOENT, "an unknown ticket");
  REQUIRE(kvtier_gather_from_cache(c, reg, ticket, gather_pages, 2, 0) == 0, "gather: %s", kvtier_last_error(c));
  REQUIRE(kvtier_store_commit(c, ticket) == 0, "commit");
  CHECK(kvtier_gather_from_cache(c, reg, ticket, gather_pages, 2, 0) == KVTIER_ENOENT, "a committed ticket is closed");
  REQUIRE(kvtier_lookup(c, keys3, 2, KVTIER_LOOKUP_LEASE, &hit, NULL) == 0 && hit.hit_blocks == 2, "hit");
  REQUIRE(kvtier_load(c, hit.lease, keys3, 2, views) == 2, "load");
  for (int b = 0; b < 2; ++b) {
    for (int l = 0; l < LAYERS; ++l) {
      const unsigned char* blk = (const unsigned char*)views[b].data + (size_t)l * LAYER_BLOCK_BYTES;
      CHECK(memcmp(blk, k_page(l, 9 + b), PAGE_BYTES) == 0 && memcmp(blk + PAGE_BYTES, v_page(l, 9 + b), PAGE_BYTES) == 0,
            "gathered block %d layer %d differs", b, l);
    }
  }
  kvtier_release(c, hit.lease);
  CHECK(kvtier_in_flight(c) == 0, "every operation was waited for (%d in flight)", kvtier_in_flight(c));

  CHECK(kvtier_unregister_kv_cache(c, reg) == 0, "unregister");
  CHECK(kvtier_unregister_kv_cache(c, reg) == KVTIER_ENOENT, "unregistered twice");
  uint64_t arena = 0;
  CHECK(kvtier_map_gpu_arena(c, &arena) == KVTIER_ENOENT, "no GPU tier: %s", kvtier_last_error(c));
  CHECK(kvtier_invalidate_namespace(c) == 4 + 3 + 2, "invalidate_namespace: %s", kvtier_last_error(c));
  kvtier_detach(c);
  CHECK(kvtier_ping(NULL) == KVTIER_EINVAL, "a NULL client");
  munmap(mem, mem_bytes);
  close(fd);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("ok: every C call checked against kvtierd\n");
  return 0;
}
