#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A miniature vLLM: a scheduler and worker processes that drive a KV
connector exactly as vLLM's v1 engine does, around a tiny attention model in
PyTorch (Debian's python3-torch), so the connector can be run and checked
where vLLM cannot be installed.

What it follows from vLLM (vllm-project/vllm, vllm/v1/core/sched/scheduler.py,
vllm/v1/worker/kv_connector_model_runner_mixin.py, at the commit kvtier.vllm
names):
- the connector is loaded as vLLM's factory loads a third-party one
  (`kv_connector_module_path` + `kv_connector`) with (vllm_config, role,
  kv_cache_config);
- scheduler: for a waiting request with nothing computed,
  get_num_new_matched_tokens(request, local_hit) (possibly never allocated
  after), allocation, update_state_after_alloc(request, all its blocks, n);
  an asynchronous load parks the request in WAITING_FOR_REMOTE_KVS until a
  worker reports it in finished_recving; build_connector_meta every step,
  before the scheduled tokens are added to num_computed_tokens; preemption
  frees a request's blocks and sets its computed tokens to 0, and its resume
  comes in scheduled_cached_reqs.resumed_req_ids with a whole new block list;
  invalid_block_ids cut num_computed_tokens back to the first failed block
  (kv_load_failure_policy = "recompute") and drop that step's sampled token;
  request_finished (request_finished_all_groups for a hybrid model) when a
  request ends or is aborted;
- workers, in separate processes that get the scheduler output pickled:
  handle_preemptions, bind_connector_metadata, start_load_kv(forward
  context; attn_metadata None in a step with no tokens), per attention layer
  wait_for_layer_load -> attention -> save_kv_layer, wait_for_save,
  get_finished(finished_req_ids), get_block_ids_with_load_errors,
  clear_connector_metadata; TP ranks hold their own KV heads and a transfer
  counts as finished once every rank reported it.

Block hashes are vLLM's: sha256(pickle((parent or NONE_HASH, tokens,
extra_keys))) with the cache_salt in the first block's extra keys, and
NONE_HASH derived from PYTHONHASHSEED as vLLM does when it is set.

The model: per layer, K and V of a token are projections of its hidden
state, which goes through causal attention over the paged cache (sliding
window on the layers of a sliding-window group). Every token is computed
alone, with the same operations whether its context came from the cache,
from kvtier or from a recomputation, so the cache of a correct engine is
bit-identical to a from-scratch reference; each step the workers compare
the pages of every running request with that reference (`mismatches`).

    python3 examples/python/tiny_vllm.py --socket /path/kvtierd.sock     # two runs of a shared prefix
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import hashlib
import importlib
import json
import multiprocessing as mp
import os
import pickle
import sys
import time
from types import SimpleNamespace
from typing import Any

import torch

# --- vLLM's data types, same fields -------------------------------------------


class RequestStatus(enum.IntEnum):
    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_ABORTED = 5


@dataclasses.dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    sliding_window: int | None = None

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * torch.tensor([], dtype=self.dtype).element_size()


@dataclasses.dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    sliding_window: int = 0


@dataclasses.dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: Any


@dataclasses.dataclass
class KVCacheTensor:
    size: int
    shared_by: list


@dataclasses.dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


@dataclasses.dataclass
class KVCacheBlocks:
    block_ids: tuple

    def get_block_ids(self, allow_none: bool = False):
        return tuple(list(ids) for ids in self.block_ids)


@dataclasses.dataclass
class KVTransferConfig:
    kv_connector: str | None = None
    kv_connector_module_path: str | None = None
    kv_role: str | None = "kv_both"
    kv_connector_extra_config: dict = dataclasses.field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    mm_features: list
    sampling_params: Any
    pooling_params: Any
    block_ids: tuple
    num_computed_tokens: int
    lora_request: Any


@dataclasses.dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set
    free_encoder_mm_hashes: list
    preempted_req_ids: set | None = None
    kv_connector_metadata: Any = None


@dataclasses.dataclass
class KVConnectorOutput:
    finished_sending: set | None = None
    finished_recving: set | None = None
    invalid_block_ids: set = dataclasses.field(default_factory=set)


# The classes a run uses: the stand-ins above, or vLLM's own when it is
# importable and asked for (TinyEngine(real_vllm=True); the tests run every
# scenario both ways). Always built by keyword, as vLLM's fields are named.
USE_REAL_VLLM = False
# Where the workers' KV caches live: "tensor" (torch's allocator: the
# connector copies blocks through kvtier's host arena) or "memfd" (memory
# kvtierd can map: the connector registers the cache and the daemon moves
# the pages itself, the path a CUDA cache takes on a GPU) or "cuda" (GPU
# memory: registered with kvtierd through CUDA IPC; needs a GPU and a torch
# built with CUDA).
CACHE_MEMORY = "tensor"


def vllm_available() -> bool:
    try:
        import vllm.v1.core.sched.output  # noqa: F401
        return True
    except ImportError:
        return False


def types(real: bool | None = None) -> SimpleNamespace:
    real = USE_REAL_VLLM if real is None else real
    if not real:
        return SimpleNamespace(
            FullAttentionSpec=FullAttentionSpec, SlidingWindowSpec=SlidingWindowSpec,
            KVCacheGroupSpec=KVCacheGroupSpec, KVCacheConfig=KVCacheConfig,
            KVCacheBlocks=lambda ids: KVCacheBlocks(block_ids=tuple(list(g) for g in ids)),
            SchedulerOutput=SchedulerOutput, CachedRequestData=CachedRequestData, NewRequestData=NewRequestData,
            KVConnectorOutput=KVConnectorOutput, real=False)
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks as VBlocks  # type: ignore
    from vllm.v1.core.kv_cache_utils import KVCacheBlock  # type: ignore
    from vllm.v1.core.sched.output import CachedRequestData as VCached  # type: ignore
    from vllm.v1.core.sched.output import NewRequestData as VNew  # type: ignore
    from vllm.v1.core.sched.output import SchedulerOutput as VOut  # type: ignore
    from vllm.v1.kv_cache_interface import FullAttentionSpec as VFull  # type: ignore
    from vllm.v1.kv_cache_interface import KVCacheConfig as VConfig  # type: ignore
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec as VGroup  # type: ignore
    from vllm.v1.kv_cache_interface import SlidingWindowSpec as VSW  # type: ignore
    from vllm.v1.outputs import KVConnectorOutput as VConnOut  # type: ignore
    return SimpleNamespace(
        FullAttentionSpec=VFull, SlidingWindowSpec=VSW, KVCacheGroupSpec=VGroup, KVCacheConfig=VConfig,
        KVCacheBlocks=lambda ids: VBlocks(tuple([KVCacheBlock(block_id=b) for b in g] for g in ids)),
        SchedulerOutput=VOut, CachedRequestData=VCached, NewRequestData=VNew, KVConnectorOutput=VConnOut, real=True)


def empty_cached(T) -> Any:
    return T.CachedRequestData(req_ids=[], resumed_req_ids=set(), new_token_ids=[], all_token_ids={},
                               new_block_ids=[], num_computed_tokens=[], num_output_tokens=[])


def scheduler_output(T, new_reqs, cached, num_sched, finished, preempted) -> Any:
    return T.SchedulerOutput(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                             num_scheduled_tokens=num_sched, total_num_scheduled_tokens=sum(num_sched.values()),
                             scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
                             num_common_prefix_blocks=[], finished_req_ids=finished, free_encoder_mm_hashes=[],
                             preempted_req_ids=preempted)


# --- vLLM's block hashes -------------------------------------------------------

def _sha256(obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash() -> bytes:
    seed = os.environ.get("PYTHONHASHSEED")
    if seed is None:
        raise RuntimeError("set PYTHONHASHSEED: vLLM's block hashes are random per process without it")
    return _sha256(seed)


class Request:
    def __init__(self, request_id: str, prompt: list, max_tokens: int, block_size: int,
                 cache_salt: str | None = None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt)
        self._all_token_ids = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_external_computed_tokens = 0
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.cache_salt = cache_salt
        self.lora_request = None
        self.mm_features: list = []
        self.output_token_ids: list = []
        self._block_size = block_size
        self.block_hashes: list = []
        self._pending_computed = 0
        self._sent_tokens = 0
        self.block_hashes.extend(self._hash_new_full_blocks())

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def all_token_ids(self) -> list:
        return self._all_token_ids

    def _hash_new_full_blocks(self) -> list:
        bs = self._block_size
        out = []
        start = len(self.block_hashes) * bs
        parent = self.block_hashes[-1] if self.block_hashes else None
        while start + bs <= self.num_tokens:
            extra = [self.cache_salt] if (start == 0 and self.cache_salt) else []
            h = _sha256((parent or none_hash(), tuple(self._all_token_ids[start:start + bs]),
                         tuple(extra) if extra else None))
            out.append(h)
            parent = h
            start += bs
        return out

    def append_output_token_ids(self, token: int) -> None:
        self.output_token_ids.append(token)
        self._all_token_ids.append(token)
        self.block_hashes.extend(self._hash_new_full_blocks())


# --- the tiny model ---------------------------------------------------------------

VOCAB = 97
HIDDEN = 32


class TinyModel:
    """Per rank: `heads` KV heads of `head_dim`; hidden state of HIDDEN."""

    def __init__(self, layers: int, heads: int, head_dim: int, rank: int, seed: int = 7):
        g = torch.Generator().manual_seed(seed * 1000 + rank)
        r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
        self.layers, self.heads, self.head_dim = layers, heads, head_dim
        self.emb = r(VOCAB, HIDDEN)
        self.pos = r(4096, HIDDEN) * 0.1
        self.wk = [r(HIDDEN, heads * head_dim) for _ in range(layers)]
        self.wv = [r(HIDDEN, heads * head_dim) for _ in range(layers)]
        self.wq = [r(HIDDEN, heads * head_dim) for _ in range(layers)]
        self.wo = [r(heads * head_dim, HIDDEN) for _ in range(layers)]

    def embed(self, token: int, pos: int) -> torch.Tensor:
        return self.emb[token] + self.pos[pos % 4096]

    def kv(self, layer: int, x: torch.Tensor):
        k = torch.tanh(x @ self.wk[layer]).reshape(self.heads, self.head_dim)
        v = torch.tanh(x @ self.wv[layer]).reshape(self.heads, self.head_dim)
        return k, v

    def attend(self, layer: int, x: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor) -> torch.Tensor:
        q = (x @ self.wq[layer]).reshape(self.heads, self.head_dim)
        scores = torch.einsum("hd,phd->hp", q, k_ctx) / (self.head_dim ** 0.5)
        out = torch.einsum("hp,phd->hd", torch.softmax(scores, dim=-1), v_ctx)
        return x + torch.tanh(out.reshape(-1) @ self.wo[layer])

    def logits_token(self, x: torch.Tensor) -> int:
        return int(torch.argmax(x @ self.emb.T))


class Reference:
    """From-scratch K/V of a token sequence (dense, no paging), extended as
    sequences grow: what the engine's pages must hold."""

    def __init__(self, model: TinyModel, windows: list):
        self.m = model
        self.windows = windows
        self.tokens: list = []
        self.k = [torch.zeros(0, model.heads, model.head_dim) for _ in range(model.layers)]
        self.v = [torch.zeros(0, model.heads, model.head_dim) for _ in range(model.layers)]

    def extend(self, tokens: list) -> None:
        if tokens[:len(self.tokens)] != self.tokens:
            self.__init__(self.m, self.windows)
        for p in range(len(self.tokens), len(tokens)):
            x = self.m.embed(tokens[p], p)
            for layer in range(self.m.layers):
                k, v = self.m.kv(layer, x)
                self.k[layer] = torch.cat([self.k[layer], k[None]])
                self.v[layer] = torch.cat([self.v[layer], v[None]])
                lo = max(0, p - self.windows[layer] + 1) if self.windows[layer] else 0
                x = self.m.attend(layer, x, self.k[layer][lo:p + 1], self.v[layer][lo:p + 1])
        self.tokens = list(tokens)


# --- worker process -----------------------------------------------------------------

def _load_connector(vllm_config, role, kv_cache_config, real: bool = False):
    """As vLLM's KVConnectorFactory loads a connector it has no entry for
    (with vLLM: by that factory)."""
    if real:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # type: ignore

        return KVConnectorFactory.create_connector(vllm_config, role, kv_cache_config)
    tc = vllm_config.kv_transfer_config
    module = importlib.import_module(tc.kv_connector_module_path)
    cls = getattr(module, tc.kv_connector)
    return cls(vllm_config, role, kv_cache_config)


class Worker:
    def __init__(self, vllm_config, kv_cache_config, layers, heads, head_dim, windows, use_connector, real=False,
                 cache_memory="tensor"):
        from kvtier.vllm import KVConnectorRole

        self.T = types(real)
        self.cfg = vllm_config
        self.kcc = kv_cache_config
        self.rank = vllm_config.parallel_config.rank
        self.bs = vllm_config.cache_config.block_size
        self.model = TinyModel(layers, heads, head_dim, self.rank)
        self.windows = windows
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        self.layer_group = {}
        for g, group in enumerate(kv_cache_config.kv_cache_groups):
            for name in group.layer_names:
                self.layer_group[name] = g
        nb = kv_cache_config.num_blocks
        if cache_memory == "memfd":
            # The whole cache in one sealed memfd: memory kvtierd can map, so
            # the connector registers it and the daemon moves pages itself
            # (as it does with a CUDA cache on a GPU).
            import fcntl
            import mmap

            per = 2 * nb * self.bs * heads * head_dim
            nbytes = per * layers * 4
            self._kv_fd = os.memfd_create("tiny-vllm-kv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(self._kv_fd, nbytes)
            fcntl.fcntl(self._kv_fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            self._kv_mem = mmap.mmap(self._kv_fd, nbytes)
            flat = torch.frombuffer(self._kv_mem, dtype=torch.float32)
            self.caches = {name: flat[i * per:(i + 1) * per].view(2, nb, self.bs, heads, head_dim)
                           for i, name in enumerate(self.layer_names)}
        else:
            # "cuda": pages in GPU memory (the model still computes on the CPU)
            device = "cuda" if cache_memory == "cuda" else "cpu"
            self.caches = {name: torch.zeros(2, nb, self.bs, heads, head_dim, device=device)
                           for name in self.layer_names}
        self.reqs: dict = {}          # req_id -> SimpleNamespace(tokens, block_ids per group, computed)
        self.refs: dict = {}
        self.connector = None
        if use_connector:
            self.connector = _load_connector(vllm_config, KVConnectorRole.WORKER, kv_cache_config, real)
            self.connector.register_kv_caches(self.caches)

    def _slot(self, req, layer: int, pos: int):
        ids = req.block_ids[self.layer_group[self.layer_names[layer]]]
        return ids[pos // self.bs], pos % self.bs

    def _context(self, req, layer: int, lo: int, hi: int):
        cache = self.caches[self.layer_names[layer]]
        ids = req.block_ids[self.layer_group[self.layer_names[layer]]]
        pos = torch.arange(lo, hi)
        blocks = torch.tensor([ids[p // self.bs] for p in range(lo, hi)], dtype=torch.long)
        return cache[0, blocks, pos % self.bs].cpu(), cache[1, blocks, pos % self.bs].cpu()

    def execute(self, so: SchedulerOutput, verify: bool, corrupt: dict | None = None) -> dict:
        c = self.connector
        # the model runner's request states
        for new in so.scheduled_new_reqs:
            self.reqs[new.req_id] = SimpleNamespace(tokens=list(new.prompt_token_ids),
                                                    block_ids=[list(b) for b in new.block_ids])
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self.reqs[req_id]
            if req_id in cached.resumed_req_ids:
                st.block_ids = [list(b) for b in cached.new_block_ids[i]]
                st.tokens = list(cached.all_token_ids[req_id])
            else:
                if cached.new_block_ids[i] is not None:
                    for g, ids in enumerate(cached.new_block_ids[i]):
                        st.block_ids[g].extend(ids)
                st.tokens.extend(cached.new_token_ids[i])
        for req_id in so.finished_req_ids:
            self.reqs.pop(req_id, None)
            self.refs.pop(req_id, None)
        has_tokens = so.total_num_scheduled_tokens > 0
        out: dict = {"sampled": {}, "mismatches": 0}
        if c is not None:
            c.handle_preemptions(so.kv_connector_metadata)
            c.bind_connector_metadata(so.kv_connector_metadata)
            attn = {n: SimpleNamespace(layer=n) for n in self.layer_names} if has_tokens else None
            c.start_load_kv(SimpleNamespace(attn_metadata=attn, no_compile_layers={}))
        work = []
        computed_before = {}
        for new in so.scheduled_new_reqs:
            computed_before[new.req_id] = new.num_computed_tokens
        for i, req_id in enumerate(cached.req_ids):
            computed_before[req_id] = cached.num_computed_tokens[i]
        for req_id, n in so.num_scheduled_tokens.items():
            st = self.reqs[req_id]
            a = computed_before[req_id]
            work.append((st, a, a + n))
        hidden = {id(st): {} for st, _, _ in work}
        for layer, name in enumerate(self.layer_names):
            if c is not None and has_tokens:
                c.wait_for_layer_load(name)
            cache = self.caches[name]
            w = self.windows[layer]
            for st, a, b in work:
                hs = hidden[id(st)]
                for p in range(a, b):
                    x = hs.get(p)
                    if x is None:
                        x = self.model.embed(st.tokens[p], p)
                    k, v = self.model.kv(layer, x)
                    blk, off = self._slot(st, layer, p)
                    cache[0, blk, off] = k
                    cache[1, blk, off] = v
                    lo = max(0, p - w + 1) if w else 0
                    kc, vc = self._context(st, layer, lo, p + 1)
                    hs[p] = self.model.attend(layer, x, kc, vc)
            if c is not None and has_tokens:
                c.save_kv_layer(name, cache, SimpleNamespace(layer=name))
        if c is not None:
            c.wait_for_save()
            sending, recving = c.get_finished(so.finished_req_ids)
            invalid = c.get_block_ids_with_load_errors()
            c.clear_connector_metadata()
            out["kv"] = self.T.KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                                                 invalid_block_ids=set(invalid or ()))
            out["stats"] = dict(c.stats)
        for st, a, b in work:
            if b == len(st.tokens):
                out["sampled"][self._req_id(st)] = self.model.logits_token(hidden[id(st)][b - 1])
        if corrupt:
            for name in self.layer_names:
                self.caches[name][0, corrupt["block"], 0, 0, 0] += 1.0
        if verify:
            failed = out["kv"].invalid_block_ids if "kv" in out else set()
            for st, a, b in work:
                # a request whose load failed computed over pages it did not
                # get: vLLM drops this step of it and recomputes
                if not any(bid in failed for ids in st.block_ids for bid in ids):
                    out["mismatches"] += self._verify(st, b)
        return out

    def _req_id(self, st) -> str:
        for k, v in self.reqs.items():
            if v is st:
                return k
        raise KeyError

    def _verify(self, st, computed: int) -> int:
        """Positions whose K or V in the pages differ from the reference."""
        rid = self._req_id(st)
        ref = self.refs.get(rid)
        if ref is None:
            ref = self.refs[rid] = Reference(self.model, self.windows)
        ref.extend(st.tokens[:computed])
        bad = 0
        for layer in range(self.model.layers):
            w = self.windows[layer]
            lo = max(0, computed - w + 1) if w else 0   # pages before a window are freed
            kc, vc = self._context(st, layer, lo, computed)
            bad += int(((kc != ref.k[layer][lo:computed]).flatten(1).any(1)
                        | (vc != ref.v[layer][lo:computed]).flatten(1).any(1)).sum())
        return bad


def _worker_main(conn, args):
    torch.set_num_threads(1)
    # The engine's seed, not the fork server's environment (taken when the
    # first engine started it).
    os.environ["PYTHONHASHSEED"] = args["hash_seed"]
    try:
        w = Worker(*args["worker"])
        conn.send(("ready", None))
    except Exception as e:  # noqa: BLE001
        conn.send(("error", repr(e)))
        return
    while True:
        msg = conn.recv()
        if msg[0] == "step":
            so = pickle.loads(msg[1])
            try:
                conn.send(("ok", w.execute(so, msg[2], msg[3])))
            except Exception as e:  # noqa: BLE001
                import traceback
                conn.send(("error", traceback.format_exc()))
        elif msg[0] == "stop":
            if w.connector is not None:
                w.connector.shutdown()
            conn.send(("bye", None))
            return


# --- the engine: scheduler + workers ---------------------------------------------------

_WORKER_CONTEXT = None


def _worker_context():
    """Workers are fresh processes (as vLLM's spawned workers: nothing of the
    scheduler's threads, sockets or connector comes with them), forked from a
    server that imported torch and this module once, instead of each one
    spending ~2 s of CPU importing torch again."""
    global _WORKER_CONTEXT
    if _WORKER_CONTEXT is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        _WORKER_CONTEXT = ctx
    return _WORKER_CONTEXT


class TinyEngine:
    def __init__(self, *, socket: str = "", kv_transfer_config: dict | None = None, tp: int = 1, layers: int = 4,
                 heads: int = 2, head_dim: int = 8, block_size: int = 16, num_blocks: int = 128,
                 max_batched_tokens: int = 64, sliding_window: int = 0, model: str = "tiny-vllm",
                 verify: bool = True, hash_seed: str = "0", real_vllm: bool | None = None,
                 cache_memory: str | None = None):
        os.environ["PYTHONHASHSEED"] = os.environ.get("PYTHONHASHSEED", hash_seed)
        self.real = USE_REAL_VLLM if real_vllm is None else real_vllm
        cache_memory = CACHE_MEMORY if cache_memory is None else cache_memory
        T = self.T = types(self.real)
        self.bs = block_size
        self.verify = verify
        windows = [sliding_window if (sliding_window and i % 2 == 1) else 0 for i in range(layers)]
        names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        spec = T.FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head_dim, dtype=torch.float32)
        groups = [T.KVCacheGroupSpec(layer_names=[n for n, w in zip(names, windows) if not w], kv_cache_spec=spec)]
        if sliding_window:
            groups.append(T.KVCacheGroupSpec(
                layer_names=[n for n, w in zip(names, windows) if w],
                kv_cache_spec=T.SlidingWindowSpec(block_size=block_size, num_kv_heads=heads, head_size=head_dim,
                                                  dtype=torch.float32, sliding_window=sliding_window)))
        self.windows = windows
        self.kv_cache_config = T.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
        self.use_connector = kv_transfer_config is not None
        ktc = KVTransferConfig(**(kv_transfer_config or {}))
        if self.use_connector and "socket" not in ktc.kv_connector_extra_config and socket:
            ktc.kv_connector_extra_config = dict(ktc.kv_connector_extra_config, socket=socket)

        def config(rank):
            return SimpleNamespace(model_config=SimpleNamespace(model=model, revision=None),
                                   cache_config=SimpleNamespace(block_size=block_size),
                                   parallel_config=SimpleNamespace(tensor_parallel_size=tp, rank=rank),
                                   scheduler_config=SimpleNamespace(max_num_batched_tokens=max_batched_tokens,
                                                                    disable_hybrid_kv_cache_manager=False),
                                   kv_transfer_config=ktc if self.use_connector else None)

        self.max_batched = max_batched_tokens
        self.num_groups = len(groups)
        self.free = collections.deque(range(1, num_blocks))   # block 0: the null block
        self.blocks: dict = {}                                # req_id -> [ids per group]
        self.requests: dict = {}
        self.waiting: collections.deque = collections.deque()
        self.running: list = []
        self.finished_req_ids: set = set()
        self.finished_recving_kv: set = set()
        self.failed_recving_kv: set = set()
        self.outputs: dict = {}
        self.mismatches = 0
        self.invalid_reported: set = set()
        self.worker_stats: list = [{} for _ in range(tp)]
        self.steps = 0
        self.before_execute = None        # hook(engine, scheduler_output) for tests
        self.corrupt_next = None
        self.connector = None
        if self.use_connector:
            from kvtier.vllm import KVConnectorRole
            self.connector = _load_connector(config(0), KVConnectorRole.SCHEDULER, self.kv_cache_config, self.real)
        ctx = _worker_context()
        self.workers = []
        for rank in range(tp):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(child, {
                "hash_seed": os.environ["PYTHONHASHSEED"],
                "worker": (config(rank), self.kv_cache_config, layers, heads, head_dim, windows, self.use_connector,
                           self.real, cache_memory)}),
                daemon=True)
            p.start()
            child.close()  # the worker's end: a worker that exits is then EOF here, not a wait forever
            self.workers.append((p, parent))
        for p, conn in self.workers:
            kind, err = conn.recv()
            if kind != "ready":
                self.close()
                raise RuntimeError(f"worker failed to start: {err}")
        self.pending_recv_reported: collections.Counter = collections.Counter()

    # -- requests
    def add_request(self, req_id: str, prompt: list, max_tokens: int, cache_salt: str | None = None) -> None:
        r = Request(req_id, prompt, max_tokens, self.bs, cache_salt)
        self.requests[req_id] = r
        self.waiting.append(r)

    def abort(self, req_id: str) -> None:
        r = self.requests.get(req_id)
        if r is None or r.status >= RequestStatus.FINISHED_STOPPED:
            return
        delay = r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and req_id not in self.finished_recving_kv
        if r in self.waiting:
            self.waiting.remove(r)
        if r in self.running:
            self.running.remove(r)
        r.status = RequestStatus.FINISHED_ABORTED
        self._free_request(r, free_blocks=not delay)

    # -- block manager (one pool shared by the groups, as vLLM's hybrid manager)
    def _group_window(self, g: int) -> int:
        spec = self.kv_cache_config.kv_cache_groups[g].kv_cache_spec
        return getattr(spec, "sliding_window", 0) or 0

    def _allocate(self, r: Request, total_tokens: int) -> bool:
        self._remove_skipped(r, r.num_computed_tokens)
        ids = self.blocks.setdefault(r.request_id, [[] for _ in range(self.num_groups)])
        need = -(-total_tokens // self.bs)
        want = sum(max(0, need - len(g)) for g in ids)
        if want > len(self.free):
            return False
        for g in ids:
            while len(g) < need:
                g.append(self.free.popleft())
        return True

    def _remove_skipped(self, r: Request, computed: int) -> None:
        """vLLM's sliding-window manager: blocks wholly before the window
        become the null block and go back to the pool."""
        ids = self.blocks.get(r.request_id)
        for g in range(self.num_groups):
            w = self._group_window(g)
            if not w or not ids:
                continue
            skipped = max(0, computed - w + 1) // self.bs
            for i in range(min(skipped, len(ids[g]))):
                if ids[g][i] != 0:
                    self.free.append(ids[g][i])
                    ids[g][i] = 0

    def _free_blocks(self, r: Request) -> None:
        for g in self.blocks.pop(r.request_id, []):
            self.free.extend(b for b in g if b != 0)

    def _block_list(self, r: Request) -> tuple:
        return tuple(list(g) for g in self.blocks.get(r.request_id, [[] for _ in range(self.num_groups)]))

    def _free_request(self, r: Request, free_blocks: bool = True) -> None:
        delay = False
        if self.connector is not None:
            ids = self._block_list(r)
            if self.num_groups > 1:
                delay, _ = self.connector.request_finished_all_groups(r, ids)
            else:
                delay, _ = self.connector.request_finished(r, ids[0])
        self.finished_req_ids.add(r.request_id)
        if free_blocks and not delay:
            self._free_blocks(r)

    def _preempt(self, r: Request) -> None:
        self.running.remove(r)
        self._free_blocks(r)
        r.status = RequestStatus.PREEMPTED
        r.num_computed_tokens = 0
        r.num_preemptions += 1
        self.waiting.appendleft(r)

    # -- one engine step
    def schedule(self) -> SchedulerOutput:
        budget = self.max_batched
        new_reqs, num_sched = [], {}
        cached = empty_cached(self.T)
        preempted: set = set()
        for r in list(self.running):
            if r not in self.running:
                continue
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            if n <= 0:
                continue
            before = [len(g) for g in self.blocks.get(r.request_id, [])]
            while not self._allocate(r, r.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is r:
                    break
            if r not in self.running:
                continue
            ids = self.blocks[r.request_id]
            cached.req_ids.append(r.request_id)
            cached.new_token_ids.append(list(r.all_token_ids[r._sent_tokens:]))
            r._sent_tokens = r.num_tokens
            cached.new_block_ids.append(tuple(g[b:] for g, b in zip(ids, before)))
            cached.num_computed_tokens.append(r.num_computed_tokens)
            cached.num_output_tokens.append(len(r.output_token_ids))
            num_sched[r.request_id] = n
            budget -= n
        skipped = []
        while self.waiting and budget > 0 and not preempted:
            r = self.waiting[0]
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if r.request_id not in self.finished_recving_kv:
                    skipped.append(self.waiting.popleft())
                    continue
                self.finished_recving_kv.discard(r.request_id)
                self.failed_recving_kv.discard(r.request_id)
                computed = r._pending_computed
                if computed == r.num_tokens:
                    computed -= 1
                if computed == 0:                 # nothing loaded: start over
                    self._free_blocks(r)
                r.num_computed_tokens = computed
                r.status = RequestStatus.PREEMPTED if r.num_preemptions else RequestStatus.WAITING
            ext, load_async = 0, False
            if r.num_computed_tokens == 0:
                ext, load_async = (self.connector.get_num_new_matched_tokens(r, 0) if self.connector else (0, False))
                if ext is None:
                    skipped.append(self.waiting.popleft())
                    continue
                r.num_external_computed_tokens = ext
                computed = ext
            else:
                computed = r.num_computed_tokens
            n = 0 if load_async else min(r.num_tokens - computed, budget)
            assert load_async or n > 0, "the connector offered every token of the prompt"
            if not self._allocate(r, computed + n):
                break
            if self.connector is not None:
                self.connector.update_state_after_alloc(r, self.T.KVCacheBlocks(self._block_list(r)), ext)
            if load_async:
                r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                r._pending_computed = computed
                skipped.append(self.waiting.popleft())
                continue
            self.waiting.popleft()
            self.running.append(r)
            if r.status == RequestStatus.PREEMPTED:
                cached.req_ids.append(r.request_id)
                cached.resumed_req_ids.add(r.request_id)
                cached.all_token_ids[r.request_id] = list(r.all_token_ids)
                cached.new_token_ids.append([])
                cached.new_block_ids.append(self._block_list(r))
                cached.num_computed_tokens.append(computed)
                cached.num_output_tokens.append(len(r.output_token_ids))
            else:
                new_reqs.append(self.T.NewRequestData(req_id=r.request_id, prompt_token_ids=list(r.prompt_token_ids),
                                                      mm_features=[], sampling_params=None, pooling_params=None,
                                                      block_ids=self._block_list(r), num_computed_tokens=computed,
                                                      lora_request=None))
            r._sent_tokens = r.num_tokens
            r.status = RequestStatus.RUNNING
            r.num_computed_tokens = computed
            if r.num_cached_tokens < 0:
                r.num_cached_tokens = computed
            num_sched[r.request_id] = n
            budget -= n
        for r in reversed(skipped):
            self.waiting.appendleft(r)
        so = scheduler_output(self.T, new_reqs, cached, num_sched, self.finished_req_ids, preempted)
        if self.connector is not None:
            so.kv_connector_metadata = self.connector.build_connector_meta(so)
        for req_id, n in num_sched.items():
            self.requests[req_id].num_computed_tokens += n
        self.finished_req_ids = set()
        return so

    def _handle_invalid_blocks(self, invalid: set) -> set:
        """vLLM's recompute policy, over group 0 as vLLM does."""
        affected = set()
        for r in list(self.running) + [w for w in self.waiting if w.status == RequestStatus.WAITING_FOR_REMOTE_KVS]:
            ids = self.blocks.get(r.request_id)
            if not ids:
                continue
            is_async = r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            upto = r._pending_computed if is_async else r.num_cached_tokens
            for i, b in enumerate(ids[0][: -(-max(upto, 0) // self.bs)]):
                if b in invalid:
                    if is_async:
                        r._pending_computed = i * self.bs
                        self.failed_recving_kv.add(r.request_id)
                    else:
                        r.num_computed_tokens = min(r.num_computed_tokens, i * self.bs)
                        affected.add(r.request_id)
                    break
        return affected

    def step(self) -> None:
        so = self.schedule()
        if self.before_execute:
            self.before_execute(self, so)
        blob = pickle.dumps(so)          # as vLLM sends it to its workers
        corrupt, self.corrupt_next = self.corrupt_next, None
        for _, conn in self.workers:
            conn.send(("step", blob, self.verify, corrupt))
        results = []
        for _, conn in self.workers:
            kind, res = conn.recv()
            if kind != "ok":
                raise RuntimeError("worker failed:\n" + str(res))
            results.append(res)
        self.steps += 1
        kv = self.T.KVConnectorOutput(finished_sending=set(), finished_recving=set(), invalid_block_ids=set())
        for rank, res in enumerate(results):
            self.mismatches += res["mismatches"]
            if "kv" in res:
                kv.invalid_block_ids |= res["kv"].invalid_block_ids
                for req_id in res["kv"].finished_recving or ():
                    self.pending_recv_reported[req_id] += 1
                self.worker_stats[rank] = res["stats"]
        for req_id, count in list(self.pending_recv_reported.items()):
            if count >= len(self.workers):      # every rank: vLLM's KVOutputAggregator
                kv.finished_recving.add(req_id)
                del self.pending_recv_reported[req_id]
        self.invalid_reported |= kv.invalid_block_ids
        failed = self._handle_invalid_blocks(kv.invalid_block_ids) if kv.invalid_block_ids else set()
        sampled = results[0]["sampled"]
        for req_id in so.num_scheduled_tokens:
            r = self.requests[req_id]
            if req_id in failed or req_id not in sampled or r.status != RequestStatus.RUNNING:
                continue
            if r.num_computed_tokens != r.num_tokens:
                continue
            r.append_output_token_ids(sampled[req_id])
            if len(r.output_token_ids) >= r.max_tokens:
                self.running.remove(r)
                r.status = RequestStatus.FINISHED_STOPPED
                self.outputs[req_id] = list(r.output_token_ids)
                self._free_request(r)
        if self.connector is not None:
            self.connector.update_connector_output(kv)
            for req_id in kv.finished_recving:
                r = self.requests[req_id]
                if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    self.finished_recving_kv.add(req_id)
                else:
                    self._free_blocks(r)
            list(self.connector.take_events())

    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.busy():
                return
            self.step()
        raise RuntimeError("the engine did not finish its requests")

    def generate(self, prompts: dict, max_tokens: int = 4, cache_salt: str | None = None) -> dict:
        for req_id, prompt in prompts.items():
            self.add_request(req_id, prompt, max_tokens, cache_salt)
        self.run()
        return {req_id: self.outputs[req_id] for req_id in prompts}

    @property
    def scheduler_stats(self) -> dict:
        return dict(self.connector.stats) if self.connector is not None else {}

    def close(self) -> None:
        for p, conn in self.workers:
            try:
                conn.send(("stop",))
                if conn.poll(10):
                    conn.recv()
            except (OSError, EOFError):
                pass
            p.join(5)
            if p.is_alive():
                p.kill()
        self.workers = []
        if self.connector is not None:
            self.connector.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", default="", help="kvtierd's socket (default: $KVTIER_SOCKET, then the default)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    ktc = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
           "kv_connector_extra_config": {"socket": args.socket}}
    if not args.json:
        print("--kv-transfer-config '" + json.dumps(ktc) + "'")
    prefix = [(i * 31 + 7) % VOCAB for i in range(args.prompt_tokens)]
    rows = []
    runs = (("first", [1, 2, 3], ktc), ("second", [4, 5, 6], ktc), ("no kvtier", [4, 5, 6], None))
    for run, suffix, config in runs:
        with TinyEngine(kv_transfer_config=config, num_blocks=4 * args.prompt_tokens // 16 + 16,
                        max_batched_tokens=256) as eng:
            t0 = time.perf_counter()
            out = eng.generate({"r": prefix + suffix}, max_tokens=4)
            dt = time.perf_counter() - t0
            rows.append({"run": run, "prompt_tokens": len(prefix) + 3,
                         "loaded_tokens": eng.scheduler_stats.get("offered_tokens", 0),
                         "stored_blocks": eng.worker_stats[0].get("saved_blocks", 0),
                         "kv_mismatches": eng.mismatches, "seconds": round(dt, 3), "output": out["r"]})
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'run':<9} {'prompt':>6} {'loaded':>6} {'stored':>6} {'mismatch':>8} {'seconds':>7}  output")
        for r in rows:
            print(f"{r['run']:<9} {r['prompt_tokens']:>6} {r['loaded_tokens']:>6} {r['stored_blocks']:>6} "
                  f"{r['kv_mismatches']:>8} {r['seconds']:>7}  {r['output']}")
    ok = (rows[1]["loaded_tokens"] > 0 and all(r["kv_mismatches"] == 0 for r in rows)
          and rows[1]["output"] == rows[2]["output"])
    if not args.json:
        print("the second run loaded its prefix from kvtier and produced what computing it does"
              if ok else "MISMATCH: the run with kvtier differs from the one without")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
