# SPDX-License-Identifier: Apache-2.0
"""kvtier.vllm: a KV connector for vLLM's v1 engine.

Turn it on with one flag (see docs/integration.md):

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

It follows the KVConnectorBase_V1 interface of vLLM's sources at commit
003df2961dd8 of vllm-project/vllm (the three-argument constructor,
`resumed_req_ids`, `get_block_ids_with_load_errors`, `handle_preemptions`
taking the metadata); it also reads `resumed_from_preemption`, which older
releases pass instead of `resumed_req_ids`.

What it does:
- Identity: vLLM's own block hashes (`request.block_hashes`, which already
  carry `cache_salt`, the LoRA name and multimodal hashes) are the kvtier
  keys, so lookups agree with what vLLM and routers compute. Each KV-cache
  group (full attention, sliding window) and each tensor-parallel rank is
  its own kvtier namespace.
- The scheduler side offers a prefix only when every rank holds it and
  kvtier's cost model says it is cheaper to load than to recompute
  (`always_load` turns the model off), a sliding-window group only over its
  window. Loads from a slow tier (NVMe, remote) are asynchronous.
- The worker side registers vLLM's paged cache with kvtierd where it can
  (CUDA memory; host memory that lies in a memfd), so the daemon scatters
  loads into the pages layer by layer and gathers saves from them itself;
  otherwise it copies blocks between the cache and kvtier's shared host
  arena, layer by layer (`wait_for_layer_load`). Either way it stores every
  block a step completes (`save_kv_layer` / `wait_for_save`).
- A block that does not load (a checksum or tier error, an eviction since
  the lookup, the daemon gone) is reported by
  `get_block_ids_with_load_errors` and recomputed by vLLM; its pages are
  never written, and a step that read such pages stores nothing.

vLLM is not needed to import this module: without it the connector derives
from same-shaped stand-ins, so the tests can drive it exactly as vLLM does.
"""
from __future__ import annotations

import dataclasses
import enum
import errno
import hashlib
import logging
import math
import os
import time
from typing import Any, Iterable

import numpy as np

from . import _kvtier
from ._kvtier import Client, KvtierError

logger = logging.getLogger("kvtier.vllm")

try:  # the real base classes when vLLM is importable
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA  # type: ignore
    except ImportError:  # a release before hybrid-model connectors
        class SupportsHMA:  # type: ignore[no-redef]
            pass

    VLLM_AVAILABLE = True
except ImportError:
    VLLM_AVAILABLE = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        pass

    class SupportsHMA:  # type: ignore[no-redef]
        pass

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """The parts of vLLM's base class a connector relies on."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            if vllm_config.kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None


NULL_BLOCK = 0  # vLLM's null block: pages that hold nothing (sliding-window gaps)
_FAST_TIERS = frozenset(("host", "gpu"))


def block_key(block_hash: Any) -> bytes:
    """vLLM block hash -> 32-byte kvtier key. SHA-256 hashes (vLLM's default,
    32 bytes) are the key itself; shorter ones (xxhash) and the int hashes of
    old releases are widened with SHA-256."""
    if isinstance(block_hash, int):
        block_hash = block_hash.to_bytes(32, "big", signed=False) if block_hash >= 0 else str(block_hash).encode()
    h = bytes(block_hash)
    if len(h) == 32:
        return h
    return hashlib.sha256(b"kvtier.vllm.block\0" + h).digest()


# --- the KV-cache groups, as both sides see them -----------------------------

@dataclasses.dataclass
class GroupInfo:
    index: int
    kind: str              # "full", "sliding_window", or what kvtier does not serve
    block_size: int
    window: int            # sliding window in tokens (0: none)
    block_bytes: int       # one kvtier block: this rank's bytes of every layer of the group
    layer_names: list
    signature: str         # what else changes the bytes: spec, dtype, layers

    @property
    def served(self) -> bool:
        return self.kind in ("full", "sliding_window")


def _spec_kind(spec) -> tuple[str, int]:
    name = type(spec).__name__
    window = getattr(spec, "sliding_window", None) or 0
    if name in ("FullAttentionSpec", "MLAAttentionSpec") and not window:
        return "full", 0
    if name == "SlidingWindowSpec" or (name == "FullAttentionSpec" and window):
        return "sliding_window", int(window)
    return name, 0  # Mamba state, chunked-local, cross attention: not served


def groups_from_config(kv_cache_config) -> list[GroupInfo]:
    groups = []
    for i, g in enumerate(kv_cache_config.kv_cache_groups):
        spec = g.kv_cache_spec
        kind, window = _spec_kind(spec)
        page = int(spec.page_size_bytes)
        dtype = str(getattr(spec, "dtype", "")).replace("torch.", "")
        sig = "|".join([type(spec).__name__, kind, str(spec.block_size), str(window),
                        str(getattr(spec, "num_kv_heads", "")), str(getattr(spec, "head_size", "")),
                        dtype, str(page), ",".join(g.layer_names)])
        groups.append(GroupInfo(i, kind, int(spec.block_size), window, page * len(g.layer_names),
                                list(g.layer_names), sig))
    return groups


# --- metadata: scheduler -> workers (pickled; plain data only) ---------------

@dataclasses.dataclass
class BlockRange:
    """Blocks of one KV-cache group: kvtier keys and the engine pages they go
    to or come from (same length)."""
    group: int
    keys: list
    block_ids: list


@dataclasses.dataclass
class LoadSpec:
    req_id: str
    ranges: list           # [BlockRange]
    is_async: bool
    tokens: int            # tokens the load covers
    # KV-cache groups whose offer takes in blocks some rank's kvtierd priced
    # "recompute" (offered anyway: always_load, or a sliding-window group,
    # which the cost model does not decline): they are in no lease until
    # prefetched, so those groups' parts prefetch before their one leased
    # lookup rather than after a first one (each lease counts its blocks as
    # used: two would count one request's use twice). Every rank's part of
    # such a group prefetches.
    prefetch_groups: tuple = ()


@dataclasses.dataclass
class SaveSpec:
    req_id: str
    ranges: list           # [BlockRange]


@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list = dataclasses.field(default_factory=list)
    saves: list = dataclasses.field(default_factory=list)
    # tokens the engine computes and loads this step (the daemon fits its
    # prefill speed, which prices recomputation, to these reports)
    computed_tokens: int = 0
    loaded_tokens: int = 0


@dataclasses.dataclass
class _ReqState:
    request: Any
    block_ids: list        # per group
    saved_upto: int        # blocks [0, saved_upto) are in kvtier or on their way
    loaded: tuple = (0, 0)  # block positions [a, b) loaded from kvtier


@dataclasses.dataclass
class _Plan:
    start: int             # first block to load
    end: int               # one past the last
    is_async: bool
    prefetch_groups: tuple = ()  # LoadSpec.prefetch_groups


class _Options:
    def __init__(self, vllm_config):
        extra = dict(getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {})
        known = {"socket", "model_id", "model_revision", "cache_salt", "always_load", "load_mode", "save",
                 "client_name", "load_timeout_s", "report_prefill", "cache_registration"}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"kvtier.vllm: unknown kv_connector_extra_config keys {unknown}; known: {sorted(known)}")
        model_config = getattr(vllm_config, "model_config", None)
        self.socket = str(extra.get("socket", ""))
        self.model_id = str(extra.get("model_id") or getattr(model_config, "model", "") or "")
        if not self.model_id:
            raise ValueError("kvtier.vllm: no model name (vllm_config.model_config.model or extra config model_id)")
        self.model_revision = str(extra.get("model_revision") or getattr(model_config, "revision", "") or "")
        self.cache_salt = str(extra.get("cache_salt", ""))
        self.always_load = bool(extra.get("always_load", False))
        self.load_mode = str(extra.get("load_mode", "auto"))
        if self.load_mode not in ("auto", "sync", "async"):
            raise ValueError(f"kvtier.vllm: load_mode is auto, sync or async, not {self.load_mode!r}")
        self.save = str(extra.get("save", "all"))
        if self.save not in ("all", "prompt", "none"):
            raise ValueError(f"kvtier.vllm: save is all, prompt or none, not {self.save!r}")
        self.client_name = str(extra.get("client_name", "vllm"))
        # A load kvtierd has not finished in this long is a failed load (the
        # engine recomputes) rather than a stalled step.
        self.load_timeout_s = float(extra.get("load_timeout_s", 10.0))
        # Each step's time goes to kvtierd's cost model as a prefill report.
        self.report_prefill = bool(extra.get("report_prefill", True))
        # "auto": register the cache with kvtierd where it can be (CUDA
        # memory, a memfd), copy through the arena otherwise; "off": always
        # copy; "required": refuse to start without a registration.
        self.cache_registration = str(extra.get("cache_registration", "auto"))
        if self.cache_registration not in ("auto", "off", "required"):
            raise ValueError(f"kvtier.vllm: cache_registration is auto, off or required, not "
                             f"{self.cache_registration!r}")
        if not 0 < self.load_timeout_s <= 3600:
            raise ValueError(f"kvtier.vllm: load_timeout_s is in (0, 3600], not {self.load_timeout_s}")
        parallel = getattr(vllm_config, "parallel_config", None)
        self.tp_size = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
        cache_config = getattr(vllm_config, "cache_config", None)
        self.hash_block_size = int(getattr(cache_config, "block_size", 0) or 0)


def _tp_rank(vllm_config, tp_size: int) -> int:
    if VLLM_AVAILABLE:
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore
            return int(get_tensor_model_parallel_rank())
        except Exception:  # no process group: a single worker
            pass
    rank = int(getattr(getattr(vllm_config, "parallel_config", None), "rank", 0) or 0)
    return rank % tp_size


def _attach(opts: _Options, group: GroupInfo, tp_rank: int, role: str) -> Client:
    return Client.attach(
        opts.model_id, group.block_size, group.block_bytes, socket=opts.socket,
        model_revision=opts.model_revision,
        attention_config_hash=hashlib.sha256(group.signature.encode()).hexdigest()[:32],
        kv_dtype=group.signature.split("|")[6] or "auto", kv_layout="vllm-paged",
        cache_salt=opts.cache_salt, tp_rank=tp_rank, tp_size=opts.tp_size,
        client_name=f"{opts.client_name}-{role}-g{group.index}-r{tp_rank}")


def _window_start(group: GroupInfo, end_tokens: int) -> int:
    """First block a sliding-window group needs to continue after end_tokens
    tokens (vLLM frees the blocks before it: they are its null block)."""
    if group.kind != "sliding_window":
        return 0
    return max(0, end_tokens - group.window + 1) // group.block_size


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector backed by kvtierd (one instance per scheduler and
    per worker process)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._opts = _Options(vllm_config)
        if kv_cache_config is None:
            raise ValueError("kvtier.vllm needs the KV-cache config (vLLM with the three-argument connector "
                             "constructor)")
        self._groups = groups_from_config(kv_cache_config)
        bs = self._opts.hash_block_size or self._groups[0].block_size
        self._block_size = bs
        # Blocks are keyed by vLLM's hashes, which are taken every block_size
        # tokens: a group with another block size cannot be keyed by them.
        self._servable = all(g.served and g.block_size == bs for g in self._groups)
        if not self._servable:
            logger.warning("kvtier.vllm: KV-cache groups %s are not all full or sliding-window attention of block "
                           "size %d; kvtier offers nothing for this model (requests compute as without it)",
                           [(g.kind, g.block_size) for g in self._groups], bs)
        if os.environ.get("PYTHONHASHSEED") is None:
            logger.warning("kvtier.vllm: PYTHONHASHSEED is not set: vLLM seeds its block hashes at random in each "
                           "process, so no other engine (and no restart) can reuse what this one stores; set the "
                           "same PYTHONHASHSEED on every engine that shares kvtier")
        self._is_scheduler = getattr(role, "name", str(role)).endswith("SCHEDULER")
        if self._is_scheduler:
            self._init_scheduler()
        else:
            self._init_worker()

    # ======================================================================
    # Scheduler side
    # ======================================================================
    def _init_scheduler(self) -> None:
        self._lookup_clients: list | None = None   # [group][rank], attached at first use
        self._retry_at = 0.0
        self._plans: dict[str, _Plan] = {}          # provisional: get_num_new_matched_tokens
        self._reqs: dict[str, _ReqState] = {}
        self._failed_at: dict[str, int] = {}       # request -> first block that failed to load
        # Requests whose chain kvtierd was told as their ask (see _present).
        self._asked: set[str] = set()
        self._loads: list[LoadSpec] = []
        self.stats = {"lookups": 0, "offered_tokens": 0, "declined_by_cost_tokens": 0, "daemon_errors": 0,
                      "loads_planned": 0, "async_loads": 0, "saves_planned_blocks": 0}

    def _clients(self):
        if self._lookup_clients is not None:
            return self._lookup_clients
        if time.monotonic() < self._retry_at:
            return None
        try:
            self._lookup_clients = [[_attach(self._opts, g, r, "sched") for r in range(self._opts.tp_size)]
                                    for g in self._groups]
        except KvtierError as e:
            self._retry_at = time.monotonic() + 1.0
            self.stats["daemon_errors"] += 1
            logger.warning("kvtier.vllm: cannot reach kvtierd (%s); requests compute without it, retrying in 1 s", e)
            return None
        return self._lookup_clients

    def _drop_clients(self, error: Exception) -> None:
        self.stats["daemon_errors"] += 1
        logger.warning("kvtier.vllm: kvtierd call failed (%s); offering nothing until it answers again", error)
        for row in self._lookup_clients or []:
            for c in row:
                try:
                    c.close()
                except Exception:
                    pass
        self._lookup_clients = None
        self._retry_at = time.monotonic() + 1.0

    def _present(self, clients, keys: list, cost: bool, upto: int | None = None,
                 ask: bool = False) -> tuple[int, bool, int, bool]:
        """Blocks of keys[:upto] every rank holds (a prefix): (count, any below
        the host tier, blocks the cost model declined, whether the count takes
        in blocks some rank's kvtierd priced "recompute"). With `ask`, the lookup
        names all of `keys` as the request's ask: kvtierd's policies and hit
        counters learn from it, misses included, once per request (the
        worker's leases are then not asks). Without it they would see only
        what the worker leases: the hits."""
        n = len(keys) if upto is None else min(upto, len(keys))
        slow = False
        declined = 0
        flag = True if ask else None
        # Every rank's lookup in flight at once: one round trip, not tp_size.
        results = [clients[0].lookup(keys, ask=flag)] if len(clients) == 1 else \
            [op.wait(self._opts.load_timeout_s) for op in [c.lookup_async(keys, ask=flag) for c in clients]]
        for r in results:
            hit = r.hit_blocks
            if cost and not self._opts.always_load:
                declined = max(declined, min(n, hit + r.recompute_blocks) - hit)
            else:
                hit = min(n, hit + r.recompute_blocks)
            n = min(n, hit)
            slow = slow or not _FAST_TIERS.issuperset(r.tiers[:n])
        priced = any(r.hit_blocks < n for r in results)
        return n, slow, declined, priced

    def _plan(self, request, num_computed_tokens: int) -> _Plan | None:
        if not self._servable:
            return None
        bs = self._block_size
        hashes = request.block_hashes
        publishable = getattr(request, "num_publishable_block_hashes", None)
        limit = len(hashes) if publishable is None else min(len(hashes), int(publishable))
        # vLLM computes at least one token of a prompt: never offer the last one.
        limit = min(limit, (request.num_tokens - 1) // bs, self._failed_at.get(request.request_id, limit))
        if num_computed_tokens % bs:
            return None
        start = num_computed_tokens // bs
        if limit <= start:
            return None
        clients = self._clients()
        if clients is None:
            return None
        self.stats["lookups"] += 1
        try:
            # vLLM's SHA-256 hashes are the keys as they are; the client
            # refuses anything that is not 32 bytes, and then they are widened.
            keys = hashes[start:limit]
            ask = request.request_id not in self._asked
            # vLLM asks again while the request waits, after a failed load,
            # and on resuming it: one ask per request (a lookup that fails
            # part way is not asked again: a lost ask, never a second one).
            self._asked.add(request.request_id)
            try:
                end, slow, priced = self._present_all(clients, keys, start, limit, ask)
            except (ValueError, TypeError, RuntimeError) as e:
                if isinstance(e, KvtierError):
                    raise
                end, slow, priced = self._present_all(clients, [block_key(h) for h in keys], start, limit, ask)
        except KvtierError as e:
            self._drop_clients(e)
            return None
        if end <= start:
            return None
        mode = self._opts.load_mode
        is_async = mode == "async" or (mode == "auto" and slow)
        return _Plan(start, end, is_async, priced)

    def _present_all(self, clients, keys: list, start: int, limit: int,
                     ask: bool = False) -> tuple[int, bool, tuple]:
        """The end (in blocks) of the prefix every group and rank holds,
        whether a block of it is below host memory, and the groups whose
        offer takes in blocks priced "recompute" (_present). With `ask`, each
        full-attention group's lookup is the request's ask (_present)."""
        bs = self._block_size
        end = limit
        slow = False
        priced = []  # groups whose lookup counted blocks priced "recompute"
        for g, group in enumerate(self._groups):
            if group.kind == "full":
                if end <= start and not ask:
                    break  # an earlier group holds none of it (and kvtierd refuses an empty lookup)
                n, s, declined, p = self._present(clients[g], keys if ask else keys[: end - start], cost=True,
                                                  upto=end - start, ask=ask)
                self.stats["declined_by_cost_tokens"] += declined * bs
                end = start + n
                slow = slow or s
                if p:
                    priced.append(g)
        # Sliding-window groups need only the blocks in the window of the
        # offered end; move the end back until every one is there.
        for g, group in enumerate(self._groups):
            if group.kind != "sliding_window":
                continue
            for _ in range(4):
                if end <= start:
                    break
                lo = max(start, _window_start(group, end * bs))
                n, s, _, p = self._present(clients[g], keys[lo - start: end - start], cost=False)
                if n == end - lo:
                    slow = slow or s
                    if p:
                        priced.append(g)
                    break
                end = lo + n
            else:
                end = start
        # A later group that shortened the offer may have cut off an earlier
        # group's priced blocks: then the worker prefetches needlessly, a
        # promotion of blocks it does not lease, never a use counted twice.
        return end, slow, tuple(priced) if end > start else ()

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens kvtier can supply after the engine's own prefix hit. Called
        repeatedly, also for requests never allocated: it pins nothing."""
        plan = self._plan(request, num_computed_tokens)
        if plan is None:
            self._plans.pop(request.request_id, None)
            return 0, False
        self._plans[request.request_id] = plan
        tokens = (plan.end - plan.start) * self._block_size
        return tokens, plan.is_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        req_id = request.request_id
        block_ids = [list(ids) for ids in blocks.get_block_ids()]
        plan = self._plans.pop(req_id, None)
        st = self._reqs.get(req_id)
        if st is None:
            st = self._reqs[req_id] = _ReqState(request, block_ids, 0)
        else:
            st.request = request
            st.block_ids = block_ids
        if num_external_tokens <= 0:
            if st.saved_upto == 0:
                st.saved_upto = request.num_computed_tokens // self._block_size
            return
        bs = self._block_size
        if plan is None or num_external_tokens % bs or plan.start + num_external_tokens // bs > plan.end:
            # Not what this connector offered (vLLM asks before it allocates,
            # and uses the last answer): the pages it allocated for these
            # tokens are reported as failed loads, so vLLM computes them
            # rather than reading pages nothing wrote.
            logger.error("kvtier.vllm: request %s: %d external tokens allocated, %s offered; they are recomputed",
                         req_id, num_external_tokens, None if plan is None else (plan.end - plan.start) * bs)
            start = plan.start if plan is not None else 0
            n = -(-num_external_tokens // bs)
            self._loads.append(LoadSpec(req_id, [BlockRange(g, [], [b for b in ids[start:start + n] if b != NULL_BLOCK])
                                                 for g, ids in enumerate(block_ids)], False, num_external_tokens))
            return
        plan = _Plan(plan.start, plan.start + num_external_tokens // bs, plan.is_async, plan.prefetch_groups)
        ranges = []
        for g, group in enumerate(self._groups):
            first = max(plan.start, _window_start(group, plan.end * bs))
            ids = block_ids[g][first:plan.end]
            keys = [block_key(h) for h in request.block_hashes[first:plan.end]]
            keep = [(k, b) for k, b in zip(keys, ids) if b != NULL_BLOCK]
            ranges.append(BlockRange(g, [k for k, _ in keep], [b for _, b in keep]))
        self._loads.append(LoadSpec(req_id, ranges, plan.is_async, num_external_tokens, plan.prefetch_groups))
        st.loaded = (plan.start, plan.end)
        st.saved_upto = max(st.saved_upto, plan.end)
        self.stats["loads_planned"] += 1
        self.stats["async_loads"] += int(plan.is_async)
        self.stats["offered_tokens"] += num_external_tokens

    def _save_ranges(self, st: _ReqState, end: int) -> list:
        ranges = []
        request = st.request
        for g, group in enumerate(self._groups):
            # a sliding-window group's blocks are stored too while vLLM still
            # has them (a shorter prefix needs them in its window)
            first = st.saved_upto
            ids = st.block_ids[g][first:end] if g < len(st.block_ids) else []
            keys = [block_key(h) for h in request.block_hashes[first:first + len(ids)]]
            keep = [(k, b) for k, b in zip(keys, ids) if b != NULL_BLOCK]
            ranges.append(BlockRange(g, [k for k, _ in keep], [b for _, b in keep]))
        return ranges

    def build_connector_meta(self, scheduler_output) -> KvtierConnectorMetadata:
        meta = KvtierConnectorMetadata(loads=self._loads)
        self._loads = []
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            st = self._reqs.get(req_id)
            if st is not None:
                st.block_ids = [[] for _ in self._groups]  # its pages are gone; resumed with new ones
        scheduled = scheduler_output.num_scheduled_tokens
        spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        computed_now: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = [list(ids) for ids in new.block_ids]
            computed_now[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        resumed_ids = getattr(cached, "resumed_req_ids", None)
        resumed_flags = getattr(cached, "resumed_from_preemption", None)
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            resumed = (req_id in resumed_ids) if resumed_ids is not None else bool(resumed_flags and resumed_flags[i])
            new_ids = cached.new_block_ids[i]
            if resumed:
                st.block_ids = [list(ids) for ids in new_ids] if new_ids is not None else [[] for _ in self._groups]
            elif new_ids is not None:
                for g, ids in enumerate(new_ids):
                    st.block_ids[g].extend(ids)
            computed_now[req_id] = cached.num_computed_tokens[i]
        if self._opts.save != "none":
            for req_id, before in computed_now.items():
                st = self._reqs[req_id]
                request = st.request
                n = scheduled.get(req_id, 0) - len(spec.get(req_id, ()))
                after = before + max(0, n)
                publishable = getattr(request, "num_publishable_block_hashes", None)
                end = min(after // self._block_size, len(request.block_hashes),
                          len(st.block_ids[0]) if st.block_ids else 0)
                if publishable is not None:
                    end = min(end, int(publishable))
                if self._opts.save == "prompt":
                    end = min(end, request.num_prompt_tokens // self._block_size)
                if end > st.saved_upto:
                    ranges = self._save_ranges(st, end)
                    meta.saves.append(SaveSpec(req_id, ranges))
                    self.stats["saves_planned_blocks"] += sum(len(r.keys) for r in ranges)
                    st.saved_upto = end
                meta.computed_tokens += max(0, n)
        meta.loaded_tokens = sum(load.tokens for load in meta.loads if not load.is_async)
        return meta

    def update_connector_output(self, connector_output) -> None:
        """Blocks that failed to load are recomputed by vLLM: save them again
        once they are."""
        bad = set(getattr(connector_output, "invalid_block_ids", None) or ())
        if not bad:
            return
        for req_id, st in self._reqs.items():
            for pos in range(*st.loaded):
                if any(g < len(st.block_ids) and pos < len(st.block_ids[g]) and st.block_ids[g][pos] in bad
                       for g in range(len(self._groups))):
                    st.saved_upto = min(st.saved_upto, pos)
                    st.loaded = (st.loaded[0], pos)
                    # vLLM asks again for this request (an asynchronous load
                    # that failed starts over): offering the same blocks
                    # again could fail again, forever. Never past this one.
                    self._failed_at[req_id] = min(self._failed_at.get(req_id, pos), pos)
                    break

    def request_finished(self, request, block_ids) -> tuple[bool, dict | None]:
        """Every save of a step is copied out of the engine's pages before the
        step ends (wait_for_save), so the pages can be freed at once."""
        self._reqs.pop(request.request_id, None)
        self._plans.pop(request.request_id, None)
        self._failed_at.pop(request.request_id, None)
        self._asked.discard(request.request_id)
        return False, None

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, dict | None]:
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def take_events(self) -> Iterable[Any]:
        """Routers learn what kvtier holds from kvtierd's own events (which
        say what was stored and removed in every tier), not from here."""
        return ()

    # ======================================================================
    # Worker side
    # ======================================================================
    def _init_worker(self) -> None:
        self._tp_rank = _tp_rank(self._vllm_config, self._opts.tp_size)
        self._clients_w: list[Client | None] = [None] * len(self._groups)
        self._layer_group: dict[str, int] = {}
        self._layers: dict[str, list] = {}       # layer -> [_TensorRuns]
        self._errors: set[int] = set()
        self._step_loads: list[_LoadInFlight] = []
        self._async_loads: dict[str, _LoadInFlight] = {}
        self._step_saves: list[_SaveInFlight] = []
        self._saves_begun = False  # this step's store_begin calls are made
        self._stream_synced = False  # the engine's CUDA stream was synchronized this step
        self._failed_reqs: set[str] = set()
        self._step_started = 0.0
        # Groups whose pages kvtierd moves itself (a registered cache), and
        # each one's registration in the current session of its client.
        self._paged: dict[int, _PagedGroup] = {}
        self._regs: list[int | None] = [None] * len(self._groups)
        self._layer_index: dict[str, int] = {}
        self.stats = {"loaded_blocks": 0, "load_errors": 0, "saved_blocks": 0, "saves_dropped": 0,
                      "bytes_loaded": 0, "bytes_saved": 0, "registered_groups": 0,
                      "leased_lookups": 0, "prefetched_parts": 0}

    def register_kv_caches(self, kv_caches: dict) -> None:
        for g, group in enumerate(self._groups):
            for name in group.layer_names:
                self._layer_group[name] = g
        num_blocks = int(self._kv_cache_config.num_blocks)
        for name, cache in kv_caches.items():
            if name not in self._layer_group:
                continue
            tensors = list(cache) if isinstance(cache, (list, tuple)) else [cache]
            self._layers[name] = [_TensorRuns(t, num_blocks, name) for t in tensors]
        for g, group in enumerate(self._groups):
            if not group.served:
                continue
            have = [n for n in group.layer_names if n in self._layers]
            if len(have) != len(group.layer_names):
                raise ValueError(f"kvtier.vllm: register_kv_caches lacks layers "
                                 f"{sorted(set(group.layer_names) - set(have))} of KV-cache group {g}")
            per_block = sum(tr.block_bytes for n in have for tr in self._layers[n])
            if per_block != group.block_bytes:
                raise ValueError(f"kvtier.vllm: KV-cache group {g} holds {per_block} bytes a block in its tensors, "
                                 f"its spec says {group.block_bytes}: the scheduler and the workers would key "
                                 f"different blocks")
            for i, name in enumerate(group.layer_names):
                self._layer_index[name] = i
            if self._opts.cache_registration != "off":
                self._plan_registration(g, kv_caches, num_blocks)
        for g in list(self._paged):
            try:
                self._client(g)  # registers now, so a refusal shows at start
            except KvtierError as e:
                c = self._clients_w[g]
                if c is not None and c.connected and self._opts.cache_registration == "required":
                    raise RuntimeError(f"kvtier.vllm: cache_registration is required and kvtierd refused KV-cache "
                                       f"group {g}: {e}") from e
                # kvtierd is not reachable yet: registered on first use

    def _plan_registration(self, g: int, kv_caches: dict, num_blocks: int) -> None:
        group = self._groups[g]
        tensors = [kv_caches[n] for n in group.layer_names]
        paged = "a layer's cache is a list of tensors" if any(isinstance(t, (list, tuple)) for t in tensors) \
            else _paged_group(tensors, num_blocks, group.block_size)
        if not isinstance(paged, str):
            want = _kvtier.kv_block_bytes(len(tensors), group.block_size, paged.kv_heads, paged.head_dim,
                                          paged.dtype)
            if want != group.block_bytes:
                paged = f"kvtier's block of this shape is {want} bytes, the group's {group.block_bytes}"
        if isinstance(paged, str):
            if self._opts.cache_registration == "required":
                raise ValueError(f"kvtier.vllm: cache_registration is required, but KV-cache group {g} cannot be "
                                 f"registered: {paged}")
            logger.info("kvtier.vllm: KV-cache group %d is copied through the host arena: %s", g, paged)
            return
        self._paged[g] = paged

    def _register(self, g: int, client: Client) -> None:
        """Registers group g's cache in the client's session. A refusal
        (e.g. CUDA memory and a daemon without a GPU) sends the group back to
        copies, unless registration is required."""
        p = self._paged[g]
        try:
            self._regs[g] = client.register_kv_cache(
                len(p.k_layers), self._groups[g].block_size, p.kv_heads, p.head_dim,
                int(self._kv_cache_config.num_blocks), p.k_layers, p.v_layers, p.regions, dtype=p.dtype,
                page_stride=p.page_stride)
            self.stats["registered_groups"] = sum(r is not None for r in self._regs)
        except KvtierError as e:
            if self._opts.cache_registration == "required" or not client.connected:
                raise
            del self._paged[g]
            logger.warning("kvtier.vllm: kvtierd did not take KV-cache group %d's registration (%s); its blocks "
                           "are copied through the host arena instead", g, e)

    def _client(self, g: int) -> Client:
        c = self._clients_w[g]
        if c is None or not c.connected:
            self._regs[g] = None
            c = self._clients_w[g] = _attach(self._opts, self._groups[g], self._tp_rank, "worker")
        if g in self._paged and self._regs[g] is None:
            self._register(g, c)
        return c

    def handle_preemptions(self, kv_connector_metadata=None) -> None:
        """Saves are copied out within the step that computed them, so a
        preempted request's pages hold nothing kvtier still needs."""
        return None

    def _start_load(self, spec: LoadSpec) -> "_LoadInFlight":
        lf = _LoadInFlight(spec)
        for rng in spec.ranges:
            if not rng.keys and not rng.block_ids:
                continue
            part = _PartLoad(rng, prefetch=rng.group in spec.prefetch_groups)
            if not rng.keys:  # pages the scheduler could not fill: failed loads
                lf.parts.append(part)
                continue
            lf.parts.append(part)
            self._begin_part(part)
        return lf

    def _begin_part(self, part: "_PartLoad") -> None:
        """A leased lookup and an asynchronous load of what it pins. Blocks
        kvtierd holds but prices "recompute" (the scheduler offered them:
        always_load, or a price that changed since) are not in a lease: they
        are brought into host memory first (prefetch), then leased."""
        rng = part.range
        try:
            client = part.client = self._client(rng.group)
            if part.prefetch_first and not part.prefetched:
                # The scheduler offered this group blocks priced "recompute":
                # into host memory first, then the one lease (a use counted once).
                self._prefetch(part, client)
                return
            # A full-attention group's ask was the scheduler's lookup
            # (_present). A sliding-window group's leases name only its
            # window's hits: not asks either, so its policy learns nothing
            # (it keeps its first expert) rather than only of hits.
            hit = client.lookup(rng.keys, lease=True, ask=False)
            self.stats["leased_lookups"] += 1
            part.lease = hit.lease
            if hit.hit_blocks < len(rng.keys) and hit.recompute_blocks and part.prefetch_op is None \
                    and not part.prefetched:
                if hit.lease:
                    client.release(hit.lease)
                    part.lease = 0
                self._prefetch(part, client)
                return
            part.hit = min(hit.hit_blocks, len(rng.keys))
            if part.hit and self._regs[rng.group] is not None:
                # kvtierd scatters the blocks into the pages itself, layer by layer.
                paged = self._paged[rng.group]
                part.cuda_device = paged.device if paged.cuda else None
                if paged.cuda and not self._stream_synced:
                    # The pages were just given to this request; kernels of
                    # an earlier step queued on the engine's stream may still
                    # use them. The daemon's copies are not ordered after
                    # that stream, so wait for it once per step.
                    import torch

                    torch.cuda.current_stream(paged.device).synchronize()
                    self._stream_synced = True
                part.dl = client.load_into_cache_async(self._regs[rng.group], hit.lease, rng.keys[:part.hit],
                                                       rng.block_ids[:part.hit])
            elif part.hit:
                part.op = client.load_async(hit.lease, rng.keys[:part.hit])
        except KvtierError as e:
            part.error = e

    def _prefetch(self, part: "_PartLoad", client: Client) -> None:
        """The part's blocks into host memory, once; _after_prefetch leases them."""
        part.prefetched = True
        self.stats["prefetched_parts"] += 1
        part.prefetch_op = client.prefetch_async(part.range.keys)

    def _part_ready(self, part: "_PartLoad") -> bool:
        """True once nothing more is in flight for the part (never blocks)."""
        if part.error is not None:
            return True
        if part.prefetch_op is not None:
            if not part.prefetch_op.poll():
                return False
            self._after_prefetch(part, 0.0)
            return self._part_ready(part)
        if part.dl is not None:
            # Every layer in, or the load failed or ended (the wait collects
            # its completion); never blocks.
            try:
                part.dl.wait_layers(part.dl.layers, 0.0)
                return True
            except KvtierError as e:
                return getattr(e, "code", None) != -errno.ETIMEDOUT
        return part.op is None or part.op.poll()

    def _after_prefetch(self, part: "_PartLoad", timeout: float) -> None:
        op, part.prefetch_op = part.prefetch_op, None
        try:
            op.wait(timeout)
        except KvtierError as e:
            part.error = e
            return
        self._begin_part(part)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        self._step_started = time.perf_counter()
        self._stream_synced = False
        meta = self._connector_metadata
        if not isinstance(meta, KvtierConnectorMetadata):
            return
        for spec in meta.loads:
            lf = self._start_load(spec)
            if spec.is_async:
                self._async_loads[spec.req_id] = lf
            else:
                self._step_loads.append(lf)

    def _settle(self, lf: "_LoadInFlight") -> None:
        """Waits for the load's blocks; everything that did not come is a load
        error (its pages are never written)."""
        if lf.settled:
            return
        lf.settled = True
        for part in lf.parts:
            views = None
            if part.error is None and part.prefetch_op is not None:
                self._after_prefetch(part, self._opts.load_timeout_s)
            if part.dl is not None:
                continue  # its blocks are counted as its layers land
            if part.error is None and part.op is not None:
                try:
                    views = part.op.wait(self._opts.load_timeout_s)
                except KvtierError as e:
                    part.error = e
            part.views = list(views or [])
            self._record(lf, part, len(part.views))
            if part.views:
                part.src = np.array([v.__array_interface__["data"][0] for v in part.views], dtype=np.uint64)

    def _record(self, lf: "_LoadInFlight", part: "_PartLoad", loaded: int) -> None:
        """The part's first `loaded` blocks are in the pages (a prefix; it
        only shrinks); the rest are load errors vLLM recomputes."""
        n = len(part.range.block_ids)
        before = n if part.loaded is None else part.loaded
        part.loaded = min(before, loaded, n)
        if part.loaded >= before:
            return
        self._errors.update(part.range.block_ids[part.loaded:])
        self.stats["load_errors"] += before - part.loaded
        self._failed_reqs.add(lf.spec.req_id)
        logger.warning("kvtier.vllm: request %s: %d of %d blocks did not load (%s); vLLM recomputes them",
                       lf.spec.req_id, n - part.loaded, n, part.error or "not in kvtier any more")

    def _wait_layers(self, lf: "_LoadInFlight", part: "_PartLoad", layers: int) -> None:
        """Until kvtierd's load has put the group's first `layers` layers in
        the pages (a CUDA cache: until the engine's stream waits for them)."""
        try:
            if part.cuda_device is not None:
                import torch

                stream = torch.cuda.current_stream(part.cuda_device).cuda_stream
                n = part.dl.stream_wait_layers(layers, stream, self._opts.load_timeout_s)
            else:
                n = part.dl.wait_layers(layers, self._opts.load_timeout_s)
        except Exception as e:  # noqa: BLE001 - whatever it was, the engine recomputes; it never crashes
            part.error = e
            self._drain(part)
            n = 0
        self._record(lf, part, n)

    def _drain(self, part: "_PartLoad") -> None:
        """Ends a daemon-driven load. One that failed or is late is still
        waited for to its end: vLLM recomputes its blocks into the same
        pages, which kvtierd must not write after that. A daemon that dies
        writes nothing more, so this ends when it does."""
        dl, part.dl = part.dl, None
        if dl is None:
            return
        while True:
            try:
                return dl.finish(self._opts.load_timeout_s)
            except KvtierError as e:
                if getattr(e, "code", None) != -errno.ETIMEDOUT or not part.client.connected:  # late: wait on
                    part.error = part.error or e
                    return 0
                logger.warning("kvtier.vllm: kvtierd has not finished a load into the cache in %.0f s; waiting for "
                               "it before its pages are used again", self._opts.load_timeout_s)

    def _copy_in(self, lf: "_LoadInFlight", layer: str) -> None:
        g = self._layer_group.get(layer)
        for part in lf.parts:
            if part.range.group != g or layer in part.done_layers:
                continue
            if part.dl is not None:
                part.done_layers.add(layer)
                self._wait_layers(lf, part, self._layer_index[layer] + 1)
                continue
            if not part.views:
                continue
            part.done_layers.add(layer)
            offset = self._layer_offset(g, layer)
            ids = np.asarray(part.range.block_ids[:len(part.views)], dtype=np.int64)
            for tr in self._layers[layer]:
                self.stats["bytes_loaded"] += tr.copy(ids, part.src + np.uint64(offset), to_cache=True)
                offset += tr.block_bytes

    def _layer_offset(self, g: int, layer: str) -> int:
        off = 0
        for name in self._groups[g].layer_names:
            if name == layer:
                return off
            off += sum(tr.block_bytes for tr in self._layers[name])
        raise KeyError(layer)

    def _finish_load(self, lf: "_LoadInFlight") -> None:
        self._settle(lf)
        for part in lf.parts:
            if part.dl is not None:
                done = self._drain(part)
                self._record(lf, part, done or 0)
                self.stats["loaded_blocks"] += part.loaded
                self.stats["bytes_loaded"] += part.loaded * self._groups[part.range.group].block_bytes
            else:
                for layer in self._groups[part.range.group].layer_names:
                    self._copy_in(lf, layer)
                self.stats["loaded_blocks"] += len(part.views)
            part.views = []
            if part.lease and part.client is not None:
                try:
                    part.client.release(part.lease)
                except KvtierError:
                    pass
                part.lease = 0

    def wait_for_layer_load(self, layer_name: str) -> None:
        for lf in self._step_loads:
            self._settle(lf)
            self._copy_in(lf, layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if not isinstance(meta, KvtierConnectorMetadata) or not meta.saves:
            return
        if not self._saves_begun:
            self._begin_saves(meta)
        g = self._layer_group.get(layer_name)
        for sv in self._step_saves:
            sv.copy_layer(self, g, layer_name)

    def _begin_saves(self, meta: KvtierConnectorMetadata) -> None:
        self._saves_begun = True
        for spec in meta.saves:
            for rng in spec.ranges:
                if not rng.keys:
                    continue
                sv = _SaveInFlight(spec.req_id, rng)
                try:
                    client = self._client(rng.group)
                    if self._regs[rng.group] is not None:
                        sv.registered = True  # kvtierd gathers the pages at the step's end
                        self._step_saves.append(sv)
                        continue
                    sv.ticket = client.store_begin(rng.keys)
                    sv.prepare()
                except KvtierError as e:
                    self.stats["saves_dropped"] += len(rng.keys)
                    logger.info("kvtier.vllm: %d blocks of request %s not stored (%s)", len(rng.keys),
                                spec.req_id, e)
                    continue
                self._step_saves.append(sv)

    def wait_for_save(self) -> None:
        # Loads whose layers no attention layer asked for land now.
        for lf in self._step_loads:
            self._finish_load(lf)
        meta = self._connector_metadata
        if isinstance(meta, KvtierConnectorMetadata) and meta.saves and not self._saves_begun:
            self._begin_saves(meta)
        synced = False
        for sv in self._step_saves:
            if sv.registered:
                synced = self._save_registered(sv, synced)
                continue
            if sv.ticket is None:
                continue
            try:
                if sv.req_id in self._failed_reqs:
                    # This step computed after pages that did not load: what
                    # it wrote is not the prefix's KV. Store none of it.
                    sv.ticket.abort()
                    self.stats["saves_dropped"] += len(sv.range.keys)
                    continue
                for layer in self._groups[sv.range.group].layer_names:
                    sv.copy_layer(self, sv.range.group, layer)
                sv.ticket.commit()
                self.stats["saved_blocks"] += sv.ticket.needed
                self.stats["bytes_saved"] += sv.ticket.needed * self._groups[sv.range.group].block_bytes
            except KvtierError as e:
                self.stats["saves_dropped"] += len(sv.range.keys)
                logger.info("kvtier.vllm: blocks of request %s not stored (%s)", sv.req_id, e)
        if (self._opts.report_prefill and isinstance(meta, KvtierConnectorMetadata) and meta.computed_tokens
                and not self._failed_reqs):
            try:
                self._client(0).report_prefill(meta.loaded_tokens, meta.computed_tokens,
                                               time.perf_counter() - self._step_started)
            except KvtierError:
                pass
        self._step_loads = []
        self._step_saves = []
        self._saves_begun = False
        self._failed_reqs = set()

    def _save_registered(self, sv: "_SaveInFlight", synced: bool) -> bool:
        """kvtierd gathers the step's completed blocks from the registered
        pages (a CUDA cache once the engine's stream has written them)."""
        g = sv.range.group
        if sv.req_id in self._failed_reqs:
            self.stats["saves_dropped"] += len(sv.range.keys)
            return synced
        try:
            if self._paged[g].cuda and not synced:
                import torch

                torch.cuda.current_stream(self._paged[g].device).synchronize()
                synced = True
            reg = self._regs[g]
            client = self._client(g)
            if reg is None or self._regs[g] != reg:
                raise KvtierError("kvtierd restarted during the step")
            n = client.store_from_cache(reg, sv.range.keys, sv.range.block_ids)
            self.stats["saved_blocks"] += n
            self.stats["bytes_saved"] += n * self._groups[g].block_bytes
        except (KvtierError, KeyError) as e:
            self.stats["saves_dropped"] += len(sv.range.keys)
            logger.info("kvtier.vllm: blocks of request %s not stored (%s)", sv.req_id, e)
        return synced

    def get_finished(self, finished_req_ids: set) -> tuple[set | None, set | None]:
        done = set()
        now = time.monotonic()
        for req_id, lf in list(self._async_loads.items()):
            if now - lf.started > self._opts.load_timeout_s:
                for p in lf.parts:  # kvtierd did not finish it in time: a failed load
                    # (one kvtierd writes into the pages itself runs to its end)
                    if p.error is None and p.dl is None and not self._part_ready(p):
                        p.error = TimeoutError(f"not loaded in {self._opts.load_timeout_s} s")
                        p.op = p.prefetch_op = None
            if all([self._part_ready(p) for p in lf.parts]):
                self._finish_load(lf)
                del self._async_loads[req_id]
                done.add(req_id)
        return None, (done or None)

    def get_block_ids_with_load_errors(self) -> set:
        errors, self._errors = self._errors, set()
        return errors

    def shutdown(self) -> None:
        for lf in list(getattr(self, "_async_loads", {}).values()) + getattr(self, "_step_loads", []):
            for part in lf.parts:
                self._drain(part)
                if part.lease and part.client is not None:
                    try:
                        part.client.release(part.lease)
                    except KvtierError:
                        pass
        getattr(self, "_async_loads", {}).clear()
        for c in getattr(self, "_clients_w", []) + [x for row in (getattr(self, "_lookup_clients", None) or [])
                                                     for x in row]:
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass


# --- registering the engine's cache with kvtierd -------------------------------

# torch dtypes kvtierd's page kernels know (vLLM's fp8 caches are uint8
# tensors: their format is not in the tensor, so they are copied instead).
_KV_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float8_e4m3fn": "fp8_e4m3", "int8": "int8"}


@dataclasses.dataclass
class _PagedGroup:
    """One KV-cache group's layers as kvtierd's registered-cache kernels see
    them: per layer the address of page 0 of K and of V, pages of
    [block_size, kv_heads, head_dim] page_stride bytes apart, lying in
    `regions` ((base, bytes, memfd); memfd -1 for CUDA memory)."""
    k_layers: list
    v_layers: list
    page_stride: int
    kv_heads: int
    head_dim: int
    dtype: str
    regions: list
    cuda: bool
    device: Any = None


def _kv_halves(t, num_blocks: int):
    """K and V of one layer's cache tensor as [num_blocks, ...] views:
    FlashAttention's (2, num_blocks, ...) or FlashInfer's (num_blocks, 2, ...)."""
    shape = list(t.shape)
    if len(shape) == 5 and shape[0] == 2 and shape[1] == num_blocks:
        return t[0], t[1]
    if len(shape) == 5 and shape[0] == num_blocks and shape[1] == 2:
        return t[:, 0], t[:, 1]
    return None


def _paged_group(tensors: list, num_blocks: int, block_size: int) -> "_PagedGroup | str":
    """The registration of a group's cache tensors (one per layer, in the
    group's layer order), or why kvtierd cannot move its pages itself."""
    k_layers, v_layers, spans = [], [], []
    first = None
    for t in tensors:
        halves = _kv_halves(t, num_blocks)
        if halves is None:
            return f"a layer's cache of shape {list(t.shape)} is not K/V pages of {num_blocks} blocks"
        dtype = _KV_DTYPES.get(str(t.dtype).replace("torch.", ""))
        if dtype is None:
            return f"cache dtype {t.dtype} is not one kvtierd's page kernels move"
        es = t.element_size()
        geo = None
        for half in halves:
            nb, bs, heads, dim = half.shape
            if bs != block_size:
                return f"a page holds {bs} tokens, not the block size {block_size}"
            st = half.stride()
            if st[3] != 1 or st[2] != dim or st[1] != heads * dim:
                return f"a page's tokens are not contiguous (stride {list(st)}): kvtierd needs the NHD layout"
            g = (st[0] * es, heads, dim)
            if geo is not None and g != geo:
                return "K and V pages differ in shape or stride"
            geo = g
        this = (geo, dtype, t.device)
        if first is not None and this != first:
            return "the group's layers differ in page shape, dtype or device"
        first = this
        k_layers.append(int(halves[0].data_ptr()))
        v_layers.append(int(halves[1].data_ptr()))
        lo = min(k_layers[-1], v_layers[-1])
        hi = max(k_layers[-1], v_layers[-1]) + (num_blocks - 1) * geo[0] + block_size * geo[1] * geo[2] * es
        spans.append((lo, hi))
    if first is None:
        return "the group has no layers"
    (page_stride, heads, dim), dtype, device = first
    cuda = device.type == "cuda"
    regions = _cuda_regions(spans) if cuda else _memfd_regions(spans) if device.type == "cpu" else \
        f"a cache on {device.type} memory"
    if isinstance(regions, str):
        return regions
    return _PagedGroup(k_layers, v_layers, page_stride, heads, dim, dtype, regions, cuda, device)


def _cuda_regions(spans: list) -> "list | str":
    """The cudaMalloc allocations the spans lie in (the driver's
    cuMemGetAddressRange): CUDA IPC shares whole allocations."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        get_range = libcuda.cuMemGetAddressRange_v2
    except (OSError, AttributeError) as e:
        return f"the CUDA driver library cannot be loaded ({e})"
    get_range.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
    regions: dict = {}
    for lo, hi in spans:
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        err = get_range(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(lo))
        if err != 0:
            return f"cuMemGetAddressRange failed ({err}) for a cache tensor"
        if hi > base.value + size.value:
            return "a layer's cache spans two CUDA allocations"
        regions[base.value] = (base.value, size.value, -1)
    return _bounded(list(regions.values()))


def _memfd_regions(spans: list) -> "list | str":
    """Host memory the daemon can map: the memfds (open in this process)
    the spans lie in, found through /proc/self/maps. Memory from malloc or
    torch's allocator is in no memfd: it is copied instead."""
    maps = []
    try:
        f = open("/proc/self/maps")
    except OSError as e:
        return f"/proc/self/maps cannot be read ({e})"
    with f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/memfd:"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            maps.append((lo, hi, int(parts[2], 16), int(parts[4])))
    fds: dict = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                fds.setdefault(os.stat(f"/proc/self/fd/{fd}").st_ino, int(fd))
        except OSError:
            continue
    regions: dict = {}
    for lo, hi in spans:
        m = next((m for m in maps if m[0] <= lo < m[1]), None)
        if m is None:
            return "the cache is not in CUDA memory or a memfd (copies through the host arena)"
        if m[3] not in fds:
            return "the memfd the cache lies in is not open in this process"
        # kvtierd maps the memfd and finds an address at its offset from
        # base: the whole span must be in this one mapping (another mapping
        # of the same memfd elsewhere would put other bytes at those offsets).
        if hi > m[1]:
            return "a layer's cache runs past the mapping of its memfd"
        base = m[0] - m[2]
        size = os.fstat(fds[m[3]]).st_size
        if hi > base + size:
            return "a layer's cache runs past the end of its memfd"
        regions[(m[3], base)] = (base, size, fds[m[3]])
    return _bounded(list(regions.values()))


def _bounded(regions: list) -> "list | str":
    if len(regions) > 64:  # kvtier's limit on regions (and descriptors) per registration
        return f"the cache lies in {len(regions)} memory regions, more than the 64 one registration takes"
    return regions


# --- moving bytes between the engine's tensors and the arena -----------------

class _TensorRuns:
    """Where block b of one cache tensor lies: `lead` contiguous runs of
    `run` bytes (e.g. K and V of FlashAttention's (2, num_blocks, ...)), at
    base + lead_offsets + b * block_stride."""

    def __init__(self, t, num_blocks: int, name: str):
        import torch  # vLLM's tensors

        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kvtier.vllm: layer {name}: a KV cache is a torch.Tensor, not {type(t).__name__}")
        shape = list(t.shape)
        if len(shape) >= 2 and shape[0] == 2 and shape[1] == num_blocks:
            dim = 1
        elif shape and shape[0] == num_blocks:
            dim = 0
        else:
            raise ValueError(f"kvtier.vllm: layer {name}: no dimension of shape {shape} is the {num_blocks} blocks")
        es = t.element_size()
        stride = list(t.stride())
        inner = shape[dim + 1:]
        expect = 1
        for size, st in zip(reversed(inner), reversed(stride[dim + 1:])):
            if size != 1 and st != expect:
                raise ValueError(f"kvtier.vllm: layer {name}: a block's pages are not contiguous (shape {shape}, "
                                 f"stride {stride}); use a contiguous (NHD) KV-cache layout")
            expect *= size
        self.tensor = t
        self.is_cpu = t.device.type == "cpu"
        self.dim = dim
        self.run = int(math.prod(inner)) * es
        lead = np.zeros(1, dtype=np.int64)
        for size, st in zip(shape[:dim], stride[:dim]):
            lead = (lead[:, None] + np.arange(size, dtype=np.int64)[None, :] * st * es).reshape(-1)
        self.lead = lead.astype(np.uint64)
        self.block_stride = stride[dim] * es
        self.block_bytes = self.run * len(lead)

    def copy(self, block_ids: np.ndarray, src_or_dst_blocks: np.ndarray, to_cache: bool) -> int:
        """Copies this tensor's part of each block between the cache pages
        `block_ids` and the arena blocks at the addresses given (the tensor's
        part already added). Returns bytes copied."""
        n = len(block_ids)
        if n == 0:
            return 0
        runs = len(self.lead)
        arena = (src_or_dst_blocks[:, None] + (np.arange(runs, dtype=np.uint64) * np.uint64(self.run))[None, :])
        if self.is_cpu:
            base = np.uint64(self.tensor.data_ptr())
            cache = base + (block_ids.astype(np.uint64) * np.uint64(self.block_stride))[:, None] + self.lead[None, :]
            lengths = np.full(n * runs, self.run, dtype=np.uint64)
            if to_cache:
                return _kvtier._copy_runs(cache.reshape(-1), arena.reshape(-1), lengths)
            return _kvtier._copy_runs(arena.reshape(-1), cache.reshape(-1), lengths)
        return self._copy_device(block_ids, arena, to_cache)

    def _copy_device(self, block_ids, arena, to_cache: bool) -> int:
        """A device tensor: gather or scatter its blocks through one host
        tensor of the same layout (the registered-cache path that lets the
        daemon move GPU pages itself is for a later change)."""
        import torch

        idx = torch.as_tensor(block_ids, device=self.tensor.device)
        shape = list(self.tensor.shape)
        shape[self.dim] = len(block_ids)
        host = torch.empty(shape, dtype=self.tensor.dtype).contiguous()
        hs = list(host.stride())
        es = host.element_size()
        base = np.uint64(host.data_ptr())
        lead = np.zeros(1, dtype=np.int64)
        for size, st in zip(shape[:self.dim], hs[:self.dim]):
            lead = (lead[:, None] + np.arange(size, dtype=np.int64)[None, :] * st * es).reshape(-1)
        hostaddr = base + (np.arange(len(block_ids), dtype=np.uint64) * np.uint64(hs[self.dim] * es))[:, None] \
            + lead.astype(np.uint64)[None, :]
        lengths = np.full(arena.size, self.run, dtype=np.uint64)
        if to_cache:
            _kvtier._copy_runs(hostaddr.reshape(-1), arena.reshape(-1), lengths)
            self.tensor.index_copy_(self.dim, idx, host.to(self.tensor.device))
        else:
            host.copy_(self.tensor.index_select(self.dim, idx).cpu())
            _kvtier._copy_runs(arena.reshape(-1), hostaddr.reshape(-1), lengths)
        return int(lengths.sum())


class _PartLoad:
    def __init__(self, rng: BlockRange, prefetch: bool = False):
        self.range = rng
        self.prefetch_first = prefetch    # its group is in LoadSpec.prefetch_groups
        self.client: Client | None = None
        self.lease = 0
        self.hit = 0
        self.op = None
        self.prefetch_op = None
        self.prefetched = False
        self.error: Exception | None = None
        self.dl = None                    # kvtierd's own load into a registered cache
        self.cuda_device = None           # its pages' CUDA device (None: host memory)
        self.loaded: int | None = None    # blocks known to be in the pages (None: not yet known)
        self.views: list = []
        self.src: np.ndarray | None = None
        self.done_layers: set = set()


class _LoadInFlight:
    def __init__(self, spec: LoadSpec):
        self.spec = spec
        self.started = time.monotonic()
        self.parts: list[_PartLoad] = []
        self.settled = False


class _SaveInFlight:
    def __init__(self, req_id: str, rng: BlockRange):
        self.req_id = req_id
        self.range = rng
        self.ticket = None
        self.registered = False
        self.ids: np.ndarray | None = None
        self.dst: np.ndarray | None = None
        self.done_layers: set = set()

    def prepare(self) -> None:
        mask = list(self.ticket.needed_mask)
        views = self.ticket.blocks
        self.ids = np.asarray([b for b, m in zip(self.range.block_ids, mask) if m], dtype=np.int64)
        self.dst = np.asarray([v.__array_interface__["data"][0] for v, m in zip(views, mask) if m],
                              dtype=np.uint64)

    def copy_layer(self, conn: KvtierConnector, g: int | None, layer: str) -> None:
        if self.ticket is None or g != self.range.group or layer in self.done_layers or self.ids is None:
            return
        self.done_layers.add(layer)
        if len(self.ids) == 0:
            return
        offset = conn._layer_offset(g, layer)
        for tr in conn._layers[layer]:
            tr.copy(self.ids, self.dst + np.uint64(offset), to_cache=False)
            offset += tr.block_bytes
