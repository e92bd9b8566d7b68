#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a vLLM or SGLang KV connector calls kvtier, written against the
public `kvtier` package only.

An engine's KV connector answers a few questions for its scheduler and
workers (vLLM's KVConnectorBase_V1 names them; SGLang's HiCache storage
backend has the same shape):

  scheduler  get_num_new_matched_tokens  -> Client.lookup (no lease: may repeat)
  scheduler  update_state_after_alloc    -> Client.lookup(lease=True): pin the hit
  worker     start_load_kv               -> Client.load / load_async: copy blocks into the paged cache
  worker     wait_for_layer_load         -> Operation.wait (or, for a registered cache,
                                            DeviceLoad.wait_layers / stream_wait_layers)
  worker     save_kv_layer/wait_for_save -> Client.store: blocks computed by this prefill
  scheduler  request_finished            -> Client.release(lease)

A connector whose engine registers its paged cache (Client.register_kv_cache
at worker start, block_bytes from kvtier.kv_block_bytes) lets the daemon move
the pages itself instead: start_load_kv -> Client.load_into_cache_async,
wait_for_layer_load(layer) -> DeviceLoad.stream_wait_layers(layer + 1,
torch.cuda.current_stream().cuda_stream), save_kv_layer -> Client.store_from_cache.
tests/python/test_client.py (test_registered_cache_moves_pages_layer_by_layer)
shows those calls on a host-memory cache.

This file plays a tiny engine with a paged KV cache in a NumPy array (one
"layer", blocks of BLOCK_TOKENS tokens) so it runs anywhere:

    kvtierd &                             # or: scripts/demo starts one
    python3 examples/python/connector_example.py --socket /run/kvtier/kvtierd.sock
"""
import argparse
import sys

import numpy as np

import kvtier

BLOCK_TOKENS = 16
TOKEN_BYTES = 256                  # K and V of one token, all layers (a toy size)
BLOCK_BYTES = BLOCK_TOKENS * TOKEN_BYTES


class ToyConnector:
    """The connector: one per engine process, one kvtier Client."""

    def __init__(self, socket: str, model: str):
        self.client = kvtier.Client.attach(model, BLOCK_TOKENS, BLOCK_BYTES, socket=socket,
                                           kv_dtype="fp16", kv_layout="layer_major",
                                           client_name="connector-example")
        self.leases: dict[str, int] = {}

    # --- scheduler side -----------------------------------------------------
    def get_num_new_matched_tokens(self, request_id: str, tokens: np.ndarray) -> int:
        """How many prompt tokens kvtier can supply (a probe: pins nothing)."""
        keys = self.client.compute_keys(tokens)
        return self.client.lookup(keys).hit_blocks * BLOCK_TOKENS

    def update_state_after_alloc(self, request_id: str, tokens: np.ndarray) -> list[bytes]:
        """The engine allocated pages for the hit: pin it until the load is done."""
        keys = self.client.compute_keys(tokens)
        hit = self.client.lookup(keys, lease=True)
        self.leases[request_id] = hit.lease
        return keys[:hit.hit_blocks]

    def request_finished(self, request_id: str) -> None:
        lease = self.leases.pop(request_id, 0)
        if lease:
            self.client.release(lease)

    # --- worker side --------------------------------------------------------
    def start_load_kv(self, request_id: str, keys: list[bytes], kv_cache: np.ndarray, pages: list[int]):
        """Starts copying the hit blocks into the engine's pages; returns the operation."""
        if not keys:
            return None                    # nothing hit: nothing to load
        return self.client.load_async(self.leases[request_id], keys), pages, kv_cache

    @staticmethod
    def wait_for_layer_load(started) -> int:
        if started is None:
            return 0
        op, pages, kv_cache = started
        views = op.wait(10.0)              # a prefix: a block that failed to load is a miss
        for view, page in zip(views, pages):
            kv_cache[page] = view          # the engine's own copy into its paged layout
        return len(views)

    def save_kv(self, tokens: np.ndarray, kv_cache: np.ndarray, pages: list[int]) -> int:
        """After prefill: offer every full block; kvtier writes only the new ones."""
        keys = self.client.compute_keys(tokens)
        return self.client.store(keys, kv_cache[pages[:len(keys)]])


def fake_prefill(tokens: np.ndarray, kv_cache: np.ndarray, pages: list[int], start_block: int) -> None:
    """Stands in for the model: K/V of a token are a function of the prefix."""
    for b in range(start_block, len(tokens) // BLOCK_TOKENS):
        seed = int(tokens[:(b + 1) * BLOCK_TOKENS].sum()) + b
        kv_cache[pages[b]] = np.random.default_rng(seed).integers(0, 256, BLOCK_BYTES, dtype=np.uint8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default="", help="kvtierd's socket (default: $KVTIER_SOCKET or the run dir's)")
    ap.add_argument("--model", default="example/toy-model")
    args = ap.parse_args()

    conn = ToyConnector(args.socket, args.model)
    kv_cache = np.zeros((64, BLOCK_BYTES), dtype=np.uint8)   # 64 pages of one block each
    system = np.arange(64, dtype=np.uint32)                   # a 4-block shared system prompt
    turns = [np.concatenate([system, np.full(32, t, dtype=np.uint32)]) for t in (1, 2)]

    for n, tokens in enumerate(turns):
        rid = f"request-{n}"
        pages = list(range(n * 16, n * 16 + len(tokens) // BLOCK_TOKENS))
        matched = conn.get_num_new_matched_tokens(rid, tokens)
        keys = conn.update_state_after_alloc(rid, tokens)
        loaded = conn.wait_for_layer_load(conn.start_load_kv(rid, keys, kv_cache, pages))
        fake_prefill(tokens, kv_cache, pages, start_block=loaded)
        expected = np.zeros_like(kv_cache)
        fake_prefill(tokens, expected, pages, start_block=0)
        exact = np.array_equal(kv_cache[pages], expected[pages])
        written = conn.save_kv(tokens, kv_cache, pages)
        conn.request_finished(rid)
        print(f"{rid}: {len(tokens)} tokens, kvtier matched {matched}, loaded {loaded} blocks, "
              f"computed {len(pages) - loaded}, stored {written} new; cache exact: {exact}")
        if not exact:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
