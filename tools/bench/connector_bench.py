#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kvtier.vllm's costs against baselines measured in the same run.

  scheduler   get_num_new_matched_tokens with N requests in flight, per call
              (p50/p99), against walking the same keys in a Python dict
  load        a layer-by-layer load of a prefix into CPU KV tensors (start_load_kv,
              then wait_for_layer_load per layer), bytes/s, against torch copying
              the same bytes from one contiguous buffer: copied by the connector
              (tensors from torch's allocator) and moved by kvtierd itself (the
              tensors in a memfd, registered with the daemon)

Starts its own kvtierd (build/release/daemon/kvtierd unless --kvtierd) in a
temporary folder. Needs Debian's python3-torch and the built kvtier package
(PYTHONPATH=build/release/python).

    PYTHONPATH=build/release/python python3 tools/bench/connector_bench.py [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "examples", "python"))
os.environ.setdefault("PYTHONHASHSEED", "0")

import kvtier.vllm as kv_vllm  # noqa: E402
import tiny_vllm  # noqa: E402


def start_daemon(binary: str, folder: str, host_bytes: str) -> subprocess.Popen:
    cfg = os.path.join(folder, "kvtierd.toml")
    with open(cfg, "w") as f:
        f.write(f'[daemon]\nrun_dir = "{folder}"\ndata_dir = "{folder}/data"\ndevice = "sim"\n'
                f'[metrics]\nenabled = false\n[tiers.host]\ncapacity = "{host_bytes}"\n[tiers.nvme]\ncapacity = 0\n')
    proc = subprocess.Popen([binary, "--config", cfg], stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(folder, "kvtierd.log"), "w"))
    admin = os.path.join(folder, "kvtierd-admin.sock")
    for _ in range(300):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(admin)
                return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("kvtierd did not start: " + open(os.path.join(folder, "kvtierd.log")).read())


def config(sock: str, layers: int, heads: int, head_dim: int, bs: int, num_blocks: int, dtype, rank=0):
    from types import SimpleNamespace

    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    T = tiny_vllm.types(False)
    spec = T.FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=head_dim, dtype=dtype)
    kcc = T.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                          kv_cache_groups=[T.KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec)])
    ktc = tiny_vllm.KVTransferConfig("KvtierConnector", "kvtier.vllm", "kv_both", {"socket": sock})
    vc = SimpleNamespace(model_config=SimpleNamespace(model="bench-model", revision=None),
                         cache_config=SimpleNamespace(block_size=bs),
                         parallel_config=SimpleNamespace(tensor_parallel_size=1, rank=rank),
                         kv_transfer_config=ktc)
    return vc, kcc, names


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench_scheduler(sock: str, requests: int, prompt_tokens: int) -> dict:
    bs = 16
    vc, kcc, _ = config(sock, 2, 2, 8, bs, 1024, torch.float16)
    sched = kv_vllm.KvtierConnector(vc, kv_vllm.KVConnectorRole.SCHEDULER, kcc)
    worker_vc, _, names = config(sock, 2, 2, 8, bs, 1024, torch.float16)
    # store half of the requests' prefixes so that lookups hit and miss
    client = sched._clients()[0][0]
    reqs = []
    for i in range(requests):
        toks = [(i * 7919 + j * 31) % 50000 for j in range(prompt_tokens)]
        reqs.append(tiny_vllm.Request(f"r{i}", toks, 1, bs))
    bb = sched._groups[0].block_bytes
    for r in reqs[: requests // 2]:
        keys = [kv_vllm.block_key(h) for h in r.block_hashes]
        client.store(keys, np.zeros((len(keys), bb), dtype=np.uint8))
    table = {}
    for r in reqs[: requests // 2]:
        for h in r.block_hashes:
            table[h] = True
    conn_t, dict_t = [], []
    for rnd in range(3):
        for r in reqs:
            t0 = time.perf_counter_ns()
            sched.get_num_new_matched_tokens(r, 0)
            conn_t.append(time.perf_counter_ns() - t0)
            t0 = time.perf_counter_ns()
            n = 0
            limit = (r.num_tokens - 1) // bs
            for h in r.block_hashes[:limit]:
                if h not in table:
                    break
                n += 1
            dict_t.append(time.perf_counter_ns() - t0)
    sched.shutdown()
    return {"bench": "scheduler_get_num_new_matched_tokens", "requests": requests,
            "blocks_per_request": prompt_tokens // bs,
            "connector_p50_us": pct(conn_t, 0.5) / 1e3, "connector_p99_us": pct(conn_t, 0.99) / 1e3,
            "dict_p50_us": pct(dict_t, 0.5) / 1e3, "dict_p99_us": pct(dict_t, 0.99) / 1e3,
            "ratio_p99": pct(conn_t, 0.99) / max(1, pct(dict_t, 0.99))}


def kv_tensors(names, shape, dtype, memory: str) -> tuple[dict, object]:
    """One cache tensor per layer: from torch's allocator, or all in one
    sealed memfd (which the connector registers with kvtierd)."""
    if memory == "tensor":
        return {n: torch.zeros(*shape, dtype=dtype) for n in names}, None
    import fcntl
    import mmap

    per = int(np.prod(shape))
    nbytes = per * len(names) * torch.tensor([], dtype=dtype).element_size()
    fd = os.memfd_create("bench-kv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    mem = mmap.mmap(fd, nbytes)
    flat = torch.frombuffer(mem, dtype=dtype)
    return {n: flat[i * per:(i + 1) * per].view(*shape) for i, n in enumerate(names)}, (fd, mem)


def bench_load(sock: str, layers: int, tokens: int, repeats: int, memory: str = "tensor") -> dict:
    bs, heads, head_dim, dtype = 16, 8, 64, torch.float16
    nblocks = tokens // bs
    num_pages = nblocks + 8
    vc, kcc, names = config(sock, layers, heads, head_dim, bs, num_pages, dtype)
    sched = kv_vllm.KvtierConnector(vc, kv_vllm.KVConnectorRole.SCHEDULER, kcc)
    caches, keep = kv_tensors(names, (2, num_pages, bs, heads, head_dim), dtype, memory)
    vc.kv_transfer_config.kv_connector_extra_config["cache_registration"] = \
        "required" if memory == "memfd" else "off"
    worker = kv_vllm.KvtierConnector(vc, kv_vllm.KVConnectorRole.WORKER, kcc)
    worker.register_kv_caches(caches)
    bb = sched._groups[0].block_bytes
    req = tiny_vllm.Request("load", [(j * 13) % 50000 for j in range(tokens + 1)], 1, bs)
    keys = [kv_vllm.block_key(h) for h in req.block_hashes[:nblocks]]
    sched._clients()[0][0].store(keys, np.random.default_rng(1).integers(0, 255, (nblocks, bb), dtype=np.uint8))
    pages = list(range(1, nblocks + 1))
    total = nblocks * bb
    ours, base = [], []
    src = torch.empty(total // 2, dtype=dtype)
    dst_flat = torch.empty(total // 2, dtype=dtype)
    for _ in range(repeats):
        meta = kv_vllm.KvtierConnectorMetadata(
            loads=[kv_vllm.LoadSpec("load", [kv_vllm.BlockRange(0, keys, pages)], False, tokens)])
        worker.bind_connector_metadata(meta)
        t0 = time.perf_counter()
        worker.start_load_kv(None)
        for n in names:
            worker.wait_for_layer_load(n)
        worker.wait_for_save()
        ours.append(time.perf_counter() - t0)
        worker.clear_connector_metadata()
        assert not worker.get_block_ids_with_load_errors()
        t0 = time.perf_counter()
        dst_flat.copy_(src)
        base.append(time.perf_counter() - t0)
    # the bytes landed where they belong
    got = bytes(caches[names[0]][:, pages[0]].contiguous().view(torch.uint8).numpy().tobytes())
    assert got == bytes(np.random.default_rng(1).integers(0, 255, (nblocks, bb), dtype=np.uint8)[0][: len(got)])
    worker.shutdown()
    sched.shutdown()
    ours_gbps = total / statistics.median(ours) / 1e9
    base_gbps = total / statistics.median(base) / 1e9
    del caches, keep
    return {"bench": "layerwise_load_cpu", "path": "registered" if memory == "memfd" else "copies",
            "layers": layers, "tokens": tokens, "bytes": total,
            "connector_GBps": ours_gbps, "torch_copy_GBps": base_gbps, "ratio": ours_gbps / base_gbps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.join(here, "..", "..")
    ap.add_argument("--kvtierd", default=os.path.join(root, "build", "release", "daemon", "kvtierd"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--load-tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="kvtier-connector-bench-") as folder:
        proc = start_daemon(args.kvtierd, folder, "2GiB")
        try:
            sock = os.path.join(folder, "kvtierd.sock")
            rows = [bench_scheduler(sock, args.requests, args.prompt_tokens),
                    bench_load(sock, args.layers, args.load_tokens, args.repeats),
                    bench_load(sock, args.layers, args.load_tokens, args.repeats, memory="memfd")]
        finally:
            proc.terminate()
            proc.wait(10)
    if args.json:
        print(json.dumps(rows))
        return 0
    s = rows[0]
    print(f"scheduler: get_num_new_matched_tokens, {s['requests']} requests of {s['blocks_per_request']} blocks "
          f"(half cached)")
    print(f"  connector p50 {s['connector_p50_us']:.1f} us  p99 {s['connector_p99_us']:.1f} us")
    print(f"  dict walk p50 {s['dict_p50_us']:.1f} us  p99 {s['dict_p99_us']:.1f} us   ratio p99 {s['ratio_p99']:.1f}x")
    for l in rows[1:]:
        print(f"load ({l['path']}): {l['layers']} layers x {l['tokens']} tokens ({l['bytes'] / 2**20:.0f} MiB) "
              f"into CPU tensors, median of {args.repeats}")
        print(f"  connector {l['connector_GBps']:.2f} GB/s   torch copy {l['torch_copy_GBps']:.2f} GB/s   "
              f"ratio {l['ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
