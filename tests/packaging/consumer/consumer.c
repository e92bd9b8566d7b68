/* SPDX-License-Identifier: Apache-2.0 */
/* An out-of-tree C engine built against an installed libkvtier (pkg-config
 * or find_package): attaches, stores blocks, finds and loads them back, and
 * checks every byte. Exit 0 on success. Usage: consumer SOCKET */
#include <kvtier/kvtier.h>
#include <stdio.h>
#include <string.h>

#define BLOCK_TOKENS 16
#define BLOCK_BYTES 4096
#define TOKENS 96

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: consumer SOCKET\n");
    return 2;
  }
  kvtier_namespace_desc ns;
  memset(&ns, 0, sizeof ns);
  ns.model_id = "consumer/c";
  ns.kv_dtype = "f16";
  ns.kv_layout = "layer_major";
  ns.block_tokens = BLOCK_TOKENS;
  ns.block_bytes = BLOCK_BYTES;
  ns.tp_size = 1;
  kvtier_client* c = NULL;
  int rc = kvtier_attach(argv[1], &ns, &c);
  if (rc != 0) {
    fprintf(stderr, "attach: %s (%s)\n", kvtier_strerror(rc), kvtier_last_error(NULL));
    return 1;
  }
  uint32_t tokens[TOKENS];
  for (uint32_t i = 0; i < TOKENS; ++i) tokens[i] = i * 7 + 3;
  kvtier_key keys[TOKENS / BLOCK_TOKENS];
  size_t n = 0;
  rc = kvtier_compute_keys(c, tokens, TOKENS, NULL, NULL, 0, keys, TOKENS / BLOCK_TOKENS, &n);
  if (rc != 0 || n != TOKENS / BLOCK_TOKENS) {
    fprintf(stderr, "compute_keys: %d, %zu keys\n", rc, n);
    return 1;
  }
  static unsigned char data[TOKENS / BLOCK_TOKENS][BLOCK_BYTES];
  const void* src[TOKENS / BLOCK_TOKENS];
  for (size_t b = 0; b < n; ++b) {
    for (size_t i = 0; i < BLOCK_BYTES; ++i) data[b][i] = (unsigned char)(b * 31 + i * 7);
    src[b] = data[b];
  }
  rc = kvtier_store(c, keys, n, src);
  if (rc != (int)n) {
    fprintf(stderr, "store: %d (%s)\n", rc, kvtier_last_error(c));
    return 1;
  }
  kvtier_lookup_result hit;
  rc = kvtier_lookup(c, keys, n, KVTIER_LOOKUP_LEASE, &hit, NULL);
  if (rc != 0 || hit.hit_blocks != n) {
    fprintf(stderr, "lookup: %d, %u of %zu blocks\n", rc, hit.hit_blocks, n);
    return 1;
  }
  kvtier_block blocks[TOKENS / BLOCK_TOKENS];
  rc = kvtier_load(c, hit.lease, keys, n, blocks);
  if (rc != (int)n) {
    fprintf(stderr, "load: %d (%s)\n", rc, kvtier_last_error(c));
    return 1;
  }
  for (size_t b = 0; b < n; ++b) {
    if (blocks[b].size != BLOCK_BYTES || memcmp(blocks[b].data, data[b], BLOCK_BYTES) != 0) {
      fprintf(stderr, "block %zu came back different\n", b);
      return 1;
    }
  }
  kvtier_release(c, hit.lease);
  /* Leave the daemon as found, so the next build of this consumer stores anew. */
  rc = kvtier_invalidate_namespace(c);
  if (rc != (int)n) {
    fprintf(stderr, "invalidate_namespace: %d\n", rc);
    return 1;
  }
  kvtier_detach(c);
  printf("c consumer: %zu blocks stored and loaded back byte-exactly\n", n);
  return 0;
}
