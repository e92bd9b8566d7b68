# SPDX-License-Identifier: Apache-2.0
"""kvtier.sglang: an L3 storage backend for SGLang's HiCache.

Turn it on with one flag (next to --enable-hierarchical-cache):

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierStorage", "interface_v1": 1,
        "socket": "/run/kvtier/kvtierd.sock"}'

It follows the HiCacheStorage interface of sgl-project/sglang at commit
001067fffe33 (mem_cache/hicache_storage.py, managers/cache_controller.py,
mem_cache/storage/backend_factory.py): the dynamic factory constructs it as
`cls(storage_config, kwargs)` and hands it the host pool through
`register_mem_pool_host`; with `"interface_v1": 1` the controller calls
`batch_exists` / `batch_get_v1` / `batch_set_v1` (zero copy), without it the
generic `batch_get` / `batch_set` of flat pages. The older form (v0.5.x,
commit bb424de23a46: no pp/cp fields, no `interface_v1`) works too.

What it does:
- A SGLang page is a kvtier block: its key is the page hash SGLang chains
  over the token ids (64 hex digits: the 32 bytes themselves), its bytes
  are the page as `get_data_page(index).flatten()` gives it (this rank's K
  and V of every layer), so the v1 and the generic paths share blocks.
- Everything SGLang leaves out of the page hash is the kvtier namespace:
  model, dtype, the host pool's layout and shape, `cache_salt`, the pp (and
  attention-cp) rank, and for MHA the TP rank. MLA ranks hold the same
  latent cache: one namespace for all of them, written by rank 0 only.
- Loads land in the host pool only for the leading pages that arrived
  under a lease; a page that did not (evicted since `batch_exists`, the
  daemon gone) is False from there on and its pool slots are not written.
- With no daemon every call is a miss or a False, never an exception:
  SGLang's prefetch and backup threads die on one, and are not restarted.
- Calls come from SGLang's prefetch, prefetch-IO and backup threads at
  once; each call takes a kvtier Client of its own from a small pool.
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import hashlib
import logging
import threading
import time
from typing import Any, List, Optional

import numpy as np

from . import _kvtier
from ._kvtier import Client, KvtierError

logger = logging.getLogger("kvtier.sglang")

try:  # the real base class when SGLang is importable
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )

    SGLANG_AVAILABLE = True
except ImportError:
    SGLANG_AVAILABLE = False

    @dataclasses.dataclass
    class HiCacheStorageConfig:  # type: ignore[no-redef]
        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        dp_rank: int = 0
        dp_size: int = 1
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclasses.dataclass
    class HiCacheStorageExtraInfo:  # type: ignore[no-redef]
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class HiCacheStorage(abc.ABC):  # type: ignore[no-redef]
        """The parts of SGLang's base class a backend relies on."""

        def register_mem_pool_host(self, mem_pool_host) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
            raise NotImplementedError()

        def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
            raise NotImplementedError()

        @abc.abstractmethod
        def get(self, key, target_location=None, target_sizes=None):
            pass

        @abc.abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None):
            pass

        @abc.abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
            pass

        @abc.abstractmethod
        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
            pass

        @abc.abstractmethod
        def exists(self, key) -> bool:
            pass

        def batch_exists(self, keys, extra_info=None) -> int:
            for i in range(len(keys)):
                if not self.exists(keys[i]):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None

try:  # what SGLang's metrics collector asserts get_stats() returns
    from sglang.srt.metrics.collector import StorageMetrics  # type: ignore
except Exception:
    @dataclasses.dataclass
    class StorageMetrics:  # type: ignore[no-redef]
        prefetch_pgs: List[int] = dataclasses.field(default_factory=list)
        backup_pgs: List[int] = dataclasses.field(default_factory=list)
        prefetch_bandwidth: List[float] = dataclasses.field(default_factory=list)
        backup_bandwidth: List[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class KvtierStorageMetrics(StorageMetrics):
    """SGLang's per-interval lists (pages and GB/s of each batch since the
    last get_stats) plus kvtier's running counts."""
    pages_loaded: int = 0
    pages_stored: int = 0      # written to kvtier (not counting pages it held already)
    pages_present: int = 0     # sets of pages it held already
    pages_failed: int = 0      # pages a get or set asked for that did not come or go
    bytes_loaded: int = 0
    bytes_stored: int = 0


# extra_config keys SGLang itself reads (HiRadixCache, the controller, the
# dynamic factory); some versions pop them before the backend sees them
SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold",
               "prefetch_timeout_base", "prefetch_timeout_per_ki_token", "prefetch_timeout_max",
               "hicache_storage_pass_prefix_keys", "tp_lcm_size"}
KVTIER_KEYS = {"socket", "cache_salt", "model_id", "model_revision", "client_name"}

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8_e4m3",
           "float8_e5m2": "fp8_e5m2", "uint8": "u8"}


def page_key(key: str) -> bytes:
    """SGLang page hash -> 32-byte kvtier key: the SHA-256 hex digests SGLang
    chains are the key itself; any other string is hashed with SHA-256."""
    if isinstance(key, str) and len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(str(key).encode()).digest()


class _PageMap:
    """Where a page of the host pool lies: `len(lead)` runs of `run` bytes at
    base + (index // page_size) * page_stride + lead, in the order of
    get_data_page(index).flatten(), which makes a kvtier block."""

    def __init__(self, pool):
        self.page_size = ps = int(pool.page_size)
        self.size = int(pool.size)
        v0 = pool.get_data_page(0, flat=False)
        if v0.device.type != "cpu":
            raise ValueError(f"kvtier.sglang: the host pool lies on {v0.device}, not in host memory")
        es = v0.element_size()
        shape, stride = list(v0.shape), list(v0.stride())
        k, expect = len(shape), 1
        while k > 0 and (shape[k - 1] == 1 or stride[k - 1] == expect):
            expect *= shape[k - 1]
            k -= 1
        lead = np.zeros(1, dtype=np.int64)
        for size, st in zip(shape[:k], stride[:k]):
            lead = (lead[:, None] + np.arange(size, dtype=np.int64)[None, :] * st * es).reshape(-1)
        self.run = expect * es
        self.lead = lead.astype(np.uint64)
        self.block_bytes = self.run * len(lead)
        assert self.block_bytes == v0.numel() * es
        self.base = v0.data_ptr()
        self.page_stride = pool.get_data_page(ps, flat=False).data_ptr() - self.base if self.size >= 2 * ps else 0
        self.inner = (np.arange(len(lead), dtype=np.uint64) * np.uint64(self.run))[None, :]
        self.shape = tuple(v0.shape)

    def pages(self, host_indices, n: int) -> tuple:
        """First slot of each of the n pages, and how many leading ones are
        usable (all n unless host_indices are short or misaligned)."""
        idx = np.asarray(host_indices, dtype=np.int64).reshape(-1)[: n * self.page_size: self.page_size]
        bad = (idx % self.page_size != 0) | (idx < 0) | (idx >= self.size)
        usable = int(np.argmax(bad)) if bad.any() else len(idx)
        if usable < n:
            logger.error("kvtier.sglang: host_indices give %d of %d pages of %d aligned slots in a pool of %d; "
                         "the rest are not moved", usable, n, self.page_size, self.size)
        return idx[:usable], usable

    def _addrs(self, pages: np.ndarray) -> np.ndarray:
        rows = np.uint64(self.base) + (pages // self.page_size).astype(np.uint64) * np.uint64(self.page_stride)
        return rows[:, None] + self.lead[None, :]

    def copy(self, pages: np.ndarray, blocks: np.ndarray, to_pool: bool) -> int:
        if len(pages) == 0:
            return 0
        pool = self._addrs(pages).reshape(-1)
        arena = (blocks[:, None] + self.inner).reshape(-1)
        lengths = np.full(pool.size, self.run, dtype=np.uint64)
        if to_pool:
            return _kvtier._copy_runs(pool, arena, lengths)
        return _kvtier._copy_runs(arena, pool, lengths)


def _addr(view) -> int:
    return view.__array_interface__["data"][0]


class KvtierStorage(HiCacheStorage):
    """SGLang HiCache storage backend backed by kvtierd (one per TP rank)."""

    def __init__(self, storage_config, kwargs: Optional[dict] = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        unknown = sorted(set(extra) - SGLANG_KEYS - KVTIER_KEYS)
        if unknown:
            raise ValueError(f"kvtier.sglang: unknown hicache-storage-backend-extra-config keys {unknown}; "
                             f"kvtier's are {sorted(KVTIER_KEYS)}, SGLang's {sorted(SGLANG_KEYS)}")
        self.storage_config = storage_config
        self.socket = str(extra.get("socket") or "")
        self.cache_salt = str(extra.get("cache_salt") or "")
        self.model_id = str(extra.get("model_id") or getattr(storage_config, "model_name", None) or "")
        if not self.model_id:
            raise ValueError("kvtier.sglang: no model name (storage_config.model_name or extra config model_id)")
        self.model_revision = str(extra.get("model_revision") or "")
        self.client_name = str(extra.get("client_name") or "sglang")
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(storage_config, "tp_size", 1) or 1)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        # MLA: every rank holds the same pages; rank 0 writes them for all
        self.writes = not (self.is_mla and self.tp_rank != 0)
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        self.mem_pool_host = None
        self.attach_args: Optional[dict] = None   # Client.attach(**attach_args): this backend's namespace
        self._map: Optional[_PageMap] = None
        self._lock = threading.Lock()
        self._idle: list = []                     # clients not in a call
        self._retry_at = 0.0
        self._down = False
        self._closed = False
        self._m = KvtierStorageMetrics()
        if not self.interface_v1:
            logger.info("kvtier.sglang: interface_v1 is not set: SGLang moves pages through the generic "
                        "batch_get/batch_set path (a copy more per page); add \"interface_v1\": 1")

    # --- namespace and sessions ------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self.mem_pool_host = mem_pool_host
        m = self._map = _PageMap(mem_pool_host)
        cfg = self.storage_config
        layout = str(getattr(mem_pool_host, "layout", "layer_first"))
        kind = "mla" if self.is_mla else "mha"
        store_dtype = str(mem_pool_host.dtype).replace("torch.", "")
        kv_dtype = str(getattr(getattr(mem_pool_host, "device_pool", None), "dtype", None) or store_dtype)
        kv_dtype = kv_dtype.replace("torch.", "")
        sig = ["sglang", kind, layout, "x".join(map(str, m.shape)), store_dtype]
        pp_size, cp_size = int(getattr(cfg, "pp_size", 1) or 1), int(getattr(cfg, "attn_cp_size", 1) or 1)
        if pp_size > 1:
            sig.append(f"pp{int(getattr(cfg, 'pp_rank', 0) or 0)}/{pp_size}")
        if cp_size > 1:
            sig.append(f"cp{int(getattr(cfg, 'attn_cp_rank', 0) or 0)}/{cp_size}")
        dcp_size = int(getattr(mem_pool_host, "dcp_size", 1) or 1)
        if dcp_size > 1:   # MLA decode context parallel: each rank holds other tokens of a page
            sig.append(f"dcp{int(getattr(mem_pool_host, 'dcp_rank', 0) or 0)}/{dcp_size}")
        self.attach_args = dict(
            model_id=self.model_id, block_tokens=m.page_size, block_bytes=m.block_bytes, socket=self.socket,
            model_revision=self.model_revision,
            attention_config_hash=hashlib.sha256("|".join(sig).encode()).hexdigest()[:32],
            kv_dtype=_DTYPES.get(kv_dtype, kv_dtype), kv_layout=f"sglang-{kind}-{layout}",
            cache_salt=self.cache_salt, tp_rank=0 if self.is_mla else self.tp_rank,
            tp_size=1 if self.is_mla else self.tp_size,
            client_name=f"{self.client_name}-r{self.tp_rank}")
        c = self._acquire()   # a daemon that is not up yet is warned about now, retried later
        if c is not None:
            self._checkin(c)

    def _acquire(self) -> Optional[Client]:
        with self._lock:
            if self._closed or self.attach_args is None:
                return None
            if self._idle:
                return self._idle.pop()
            if time.monotonic() < self._retry_at:
                return None
        try:
            c = Client.attach(**self.attach_args)
        except KvtierError as e:
            self._daemon_down(e)
            return None
        if self._down:
            self._down = False
            logger.info("kvtier.sglang: kvtierd answers again; the storage tier is back")
        return c

    def _checkin(self, c: Client) -> None:
        with self._lock:
            if not self._closed and c.connected:
                self._idle.append(c)
                return
        with contextlib.suppress(Exception):
            c.close()

    def _daemon_down(self, e: Exception) -> None:
        with self._lock:
            self._retry_at = time.monotonic() + 1.0
            stale, self._idle = self._idle, []
            first, self._down = not self._down, True
        for c in stale:
            with contextlib.suppress(Exception):
                c.close()
        if first:
            logger.warning("kvtier.sglang: kvtierd cannot be reached or refused this engine (%s); HiCache runs "
                           "without its storage tier (prefetch finds nothing, backups are dropped) until it "
                           "answers, tried again every second. Start it (systemctl start kvtierd) or give its "
                           "socket as \"socket\" in --hicache-storage-backend-extra-config", e)

    def _failed(self, c: Client, e: KvtierError, what: str) -> None:
        """A call failed: a client whose daemon went away is dropped (and every
        idle one with it); another error leaves the client usable."""
        if c.connected:
            logger.info("kvtier.sglang: %s failed (%s)", what, e)
            self._checkin(c)
            return
        with contextlib.suppress(Exception):
            c.close()
        self._daemon_down(e)

    @contextlib.contextmanager
    def _session(self, what: str):
        """A client for one call (None when there is none). An error in the
        body ends the body and the caller's fallback follows the block: an
        exception would end SGLang's prefetch or backup thread for good."""
        c = self._acquire()
        try:
            yield c
        except KvtierError as e:
            self._failed(c, e, what)
            return
        except Exception:
            logger.exception("kvtier.sglang: %s failed", what)
        if c is not None:
            self._checkin(c)

    def _count(self, **kw) -> None:
        with self._lock:
            for k, v in kw.items():
                if isinstance(v, list):
                    getattr(self._m, k).extend(v)
                else:
                    setattr(self._m, k, getattr(self._m, k) + v)

    # --- lookups ---------------------------------------------------------------
    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        """Leading pages kvtier holds (one lookup, nothing pinned). SGLang
        asks this before it prefetches a request's pages (a slice of at most
        128 at a time): it is the request's ask, the lookup kvtierd's
        eviction policies and hit counters learn from,
        misses included. The loads that follow lease only what it found
        and are not asks: otherwise kvtierd would learn only of the hits."""
        return self._exists(keys, ask=True)

    def exists(self, key: str) -> bool:
        return self._exists([key], ask=None) == 1   # one page: a probe, not a request's ask

    def _exists(self, keys: List[str], ask) -> int:
        if not keys:
            return 0
        with self._session("lookup") as c:
            if c is None:
                return 0
            r = c.lookup([page_key(k) for k in keys], ask=ask)
            return min(len(keys), r.hit_blocks + r.recompute_blocks)
        return 0

    # --- zero copy (interface_v1) ------------------------------------------------
    def _load(self, keys: List[str], place) -> int:
        """Leased lookup + load of keys; place(views) copies them out while the
        lease holds. Returns how many leading pages were placed."""
        done = 0
        with self._session("load") as c:
            if c is None:
                return 0
            kk = [page_key(k) for k in keys]
            hit = c.lookup(kk, lease=True, ask=False)   # batch_exists asked
            try:
                m = min(len(keys), hit.hit_blocks + hit.recompute_blocks)
                if m:
                    views = c.load(hit.lease, kk[:m])   # the prefix that arrived
                    n = 0
                    while n < len(views) and views[n].nbytes == self._map.block_bytes:
                        n += 1
                    if n:
                        place(views[:n])
                        done = n
            finally:
                if hit.lease and c.connected:
                    with contextlib.suppress(KvtierError):
                        c.release(hit.lease)
        return done

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        n = len(keys)
        if n == 0:
            return []
        t0 = time.perf_counter()
        m = self._map
        pages, usable = m.pages(host_indices, n) if m is not None else (None, 0)
        copied = [0]

        def place(views):
            src = np.array([_addr(v) for v in views], dtype=np.uint64)
            copied[0] = m.copy(pages[: len(views)], src, to_pool=True)

        done = self._load(keys[:usable], place) if usable else 0
        dt = max(time.perf_counter() - t0, 1e-9)
        self._count(pages_loaded=done, pages_failed=n - done, bytes_loaded=copied[0],
                    prefetch_pgs=[done] if done else [], prefetch_bandwidth=[copied[0] / dt / 2**30] if done else [])
        return [True] * done + [False] * (n - done)

    def _store(self, keys: List[str], fill) -> bool:
        """store_begin, fill(positions kvtier needs, their block addresses), commit."""
        with self._session("store") as c:
            if c is None:
                return False
            with c.store_begin([page_key(k) for k in keys]) as t:   # commits, or aborts on an exception
                views = t.blocks
                need = [i for i, x in enumerate(t.needed_mask) if x]
                if need:
                    fill(need, np.array([_addr(views[i]) for i in need], dtype=np.uint64))
            self._count(pages_stored=len(need), pages_present=len(keys) - len(need),
                        bytes_stored=len(need) * self._map.block_bytes)
            return True
        return False

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        n = len(keys)
        if n == 0 or not self.writes:
            return [True] * n   # MLA: rank 0 stores what every rank holds
        t0 = time.perf_counter()
        m = self._map
        pages, usable = m.pages(host_indices, n) if m is not None else (None, 0)
        if usable < n or not self._store(keys, lambda need, dst: m.copy(pages[need], dst, to_pool=False)):
            self._count(pages_failed=n)
            return [False] * n
        dt = max(time.perf_counter() - t0, 1e-9)
        self._count(backup_pgs=[n], backup_bandwidth=[n * m.block_bytes / dt / 2**30])
        return [True] * n

    # --- generic (flat pages) ----------------------------------------------------
    def _flat(self, loc, size=None) -> Optional[int]:
        """Address of a flat page buffer: a contiguous CPU tensor or array of
        block_bytes, or a raw address with its size; None if it is not one."""
        bb = self._map.block_bytes
        if isinstance(loc, (int, np.integer)):
            return int(loc) if size is not None and int(size) == bb else None
        if hasattr(loc, "data_ptr"):
            ok = loc.device.type == "cpu" and loc.is_contiguous() and loc.numel() * loc.element_size() == bb
            return loc.data_ptr() if ok else None
        if isinstance(loc, np.ndarray) and loc.flags.c_contiguous and loc.nbytes == bb:
            return _addr(loc)
        return None

    def batch_get(self, keys: List[str], target_locations=None, target_sizes=None) -> List[Any]:
        """Flat pages (the targets SGLang passes, filled in; new tensors
        without them); None for each page from the first that is missing."""
        n = len(keys)
        out: List[Any] = [None] * n
        if n == 0 or self._map is None:
            return out
        import torch

        dtype = self.mem_pool_host.dtype
        per = self._map.block_bytes // torch.empty(0, dtype=dtype).element_size()
        dsts: list = []          # (address, what to return)
        for i in range(n):
            loc = target_locations[i] if target_locations is not None else None
            if loc is None:
                loc = torch.empty(per, dtype=dtype)
            a = self._flat(loc, target_sizes[i] if target_sizes is not None else None)
            if a is not None and hasattr(loc, "data_ptr") and any(a == d for d, _ in dsts):
                loc = torch.empty(per, dtype=dtype)     # one tensor given for two pages
                a = self._flat(loc)
            if a is None:
                logger.error("kvtier.sglang: batch_get target %d is not a flat page of %d bytes", i,
                             self._map.block_bytes)
                break
            dsts.append((a, loc))

        def place(views):
            src = np.array([_addr(v) for v in views], dtype=np.uint64)
            dst = np.array([d for d, _ in dsts[: len(views)]], dtype=np.uint64)
            _kvtier._copy_runs(dst, src, np.full(len(views), self._map.block_bytes, dtype=np.uint64))

        done = self._load(keys[: len(dsts)], place) if dsts else 0
        for i in range(done):
            out[i] = dsts[i][1]
        self._count(pages_loaded=done, pages_failed=n - done, bytes_loaded=done * self._map.block_bytes,
                    prefetch_pgs=[done] if done else [])
        return out

    def get(self, key: str, target_location=None, target_sizes=None):
        return self.batch_get([key], None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])[0]

    def batch_set(self, keys: List[str], values=None, target_locations=None, target_sizes=None) -> bool:
        """Flat pages (values), or buffers / addresses with their sizes
        (target_locations, target_sizes); True when every page is in kvtier."""
        n = len(keys)
        if n == 0 or not self.writes:
            return True
        locs = values if values is not None else target_locations
        srcs = []                # (address, the buffer, kept alive through the copy)
        if self._map is not None and locs is not None:
            for i in range(n):
                v = locs[i]
                if hasattr(v, "is_contiguous") and not v.is_contiguous():
                    v = v.contiguous()
                srcs.append((self._flat(v, target_sizes[i] if target_sizes is not None else None), v))
        if len(srcs) < n or any(a is None for a, _ in srcs):
            logger.error("kvtier.sglang: batch_set needs %d flat pages of %s bytes", n,
                         self._map.block_bytes if self._map else "?")
            self._count(pages_failed=n)
            return False
        bb = self._map.block_bytes

        def fill(need, dst):
            src = np.array([srcs[i][0] for i in need], dtype=np.uint64)
            _kvtier._copy_runs(dst, src, np.full(len(need), bb, dtype=np.uint64))

        if not self._store(keys, fill):
            self._count(pages_failed=n)
            return False
        self._count(backup_pgs=[n])
        return True

    def set(self, key: str, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], None if value is None else [value],
                              None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])

    # --- admin ---------------------------------------------------------------------
    def clear(self) -> None:
        """Drops every page of this backend's namespace (SGLang's admin clear)."""
        with self._session("clear") as c:
            if c is not None:
                logger.info("kvtier.sglang: cleared %d pages", c.invalidate_namespace())

    def get_stats(self) -> KvtierStorageMetrics:
        """SGLang's StorageMetrics of the batches since the last call, with
        kvtier's running counts (pages_loaded, pages_stored, pages_failed, ...)."""
        with self._lock:
            m = self._m
            self._m = dataclasses.replace(m, prefetch_pgs=[], backup_pgs=[], prefetch_bandwidth=[],
                                          backup_bandwidth=[])
        return m

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            with contextlib.suppress(Exception):
                c.close()
