# SPDX-License-Identifier: Apache-2.0
"""kvtier: keep LLM KV-cache blocks across GPU memory, pinned host memory and
NVMe, shared between engine processes through the kvtierd daemon.

    import kvtier, numpy as np
    with kvtier.Client.attach("my-model", block_tokens=16, block_bytes=c_bytes,
                              kv_dtype="bf16", kv_layout="layer_major") as c:
        keys = c.compute_keys(prompt_tokens)
        hit = c.lookup(keys, lease=True)
        blocks = c.load(hit.lease, keys[:hit.hit_blocks])   # read-only views, in place
        ...                                                 # copy them into the engine's KV cache
        c.release(hit.lease)                                # the views stop being those blocks here
        c.store(keys[hit.hit_blocks:], new_blocks)          # (n, block_bytes) uint8
        with c.store_begin(more_keys) as t:                 # or fill the slots in place:
            for view, block in zip(t.blocks, more_blocks):  # None where already cached
                if view is not None: view[:] = block        # commits on leaving the block

An engine can instead register its paged KV cache (register_kv_cache, with
block_bytes from kvtier.kv_block_bytes) and let the daemon move blocks in and
out of its pages: store_from_cache, and load_into_cache_async, whose
DeviceLoad says when each layer has landed (wait_layers), so layer 0 can run
while later layers arrive.

Errors raise kvtier.KvtierError (.code: the negative errno of kvtier.h).

Engines: kvtier.vllm is a KV connector for vLLM (KvtierConnector) and
kvtier.sglang a HiCache storage backend for SGLang (KvtierStorage); see
docs/integration.md for the one line that turns each on.
"""
from ._kvtier import Client, DeviceLoad, KvtierError, LookupResult, Operation, StoreTicket, kv_block_bytes

__all__ = ["Client", "DeviceLoad", "KvtierError", "LookupResult", "Operation", "StoreTicket", "kv_block_bytes"]
