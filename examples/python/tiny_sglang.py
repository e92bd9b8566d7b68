#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A miniature SGLang HiCache around an L3 storage backend: the host KV pool,
the page hashes and the HiCacheController's storage paths, so a backend can
be driven exactly as SGLang drives it where SGLang cannot be installed.

What it follows from SGLang (sgl-project/sglang at the commit kvtier.sglang
names: mem_cache/pool_host/{mha,mla}.py, mem_cache/utils.py,
managers/cache_controller.py, mem_cache/storage/backend_factory.py):
- the backend is loaded as StorageBackendFactory loads a "dynamic" one:
  importlib of module_path, getattr class_name, an issubclass check against
  HiCacheStorage, `cls(storage_config, {})`, then register_mem_pool_host;
  HiRadixCache first pops prefetch_threshold and the timeouts out of the
  extra config, the controller tp_lcm_size;
- the host pools of MHATokenToKVPoolHost / MLATokenToKVPoolHost: kv_buffer
  shapes per layout, page-aligned int64 token slots from alloc(),
  get_data_page, set_from_flat_data_page, get_dummy_flat_data_page,
  get_page_buffer_meta, get_ksize_per_token;
- page keys: get_hash_str, SHA-256 chained page by page over the previous
  page's digest and the page's token ids as u32 little-endian;
- prefetch: batch_exists over slices of at most 128 pages until one comes
  back short, a revoke below prefetch_threshold tokens, host slots for the
  hit, then per slice batch_get_v1 (interface_v1) or batch_get of dummy flat
  pages + set_from_flat_data_page, counting the leading successes and
  reading no slice after a short one; the slots past what loaded go back;
- backup: per slice all(batch_set_v1(...)) or batch_set of get_data_page,
  stopping at the first failure; skipped on MLA ranks other than 0.

The KV a page holds is drawn from its hash (so from the token ids of the
whole prefix) and, for MHA, the TP rank (each rank holds its own heads):
`expected_page` gives it and `check_pages` compares the pool bit for bit.

    python3 examples/python/tiny_sglang.py --socket /path/kvtierd.sock
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
from typing import Optional

import torch

try:
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )
except ImportError:  # the same-shaped stand-ins the backend derives from
    from kvtier.sglang import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo

STORAGE_BATCH_SIZE = 128


def get_hash_str(token_ids, prior_hash: Optional[str] = None) -> str:
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(int(t).to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def page_hashes(token_ids, page_size: int, prior_hash: Optional[str] = None) -> list:
    """The chained hash of every full page (the controller's loop)."""
    out = []
    for i in range(0, len(token_ids) - page_size + 1, page_size):
        prior_hash = get_hash_str(token_ids[i:i + page_size], prior_hash)
        out.append(prior_hash)
    return out


def _isz(dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


class HostKVCache:
    """SGLang's host pool: `size` token slots in pages of `page_size`."""

    def __init__(self, layer_num: int, size: int, page_size: int, layout: str, dtype):
        assert size % page_size == 0
        self.layer_num, self.page_size, self.layout, self.dtype = layer_num, page_size, layout, dtype
        self.size, self.page_num = size, size // page_size
        self.device, self.pin_memory = "cpu", False
        self.size_per_token = self.get_size_per_token()
        self.kv_buffer = self.init_kv_buffer()
        self.free_slots = torch.arange(self.size, dtype=torch.int64)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        assert need_size % self.page_size == 0
        if need_size > len(self.free_slots):
            return None
        select, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return select

    def free(self, indices: torch.Tensor) -> int:
        self.free_slots = torch.cat([self.free_slots, indices])
        return len(indices)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        page = self.get_data_page(index, flat=False)
        page[...] = data_page.reshape(page.shape)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.page_shape, dtype=self.dtype).flatten()


class MHATokenToKVPoolHost(HostKVCache):
    def __init__(self, layer_num, head_num, head_dim, size, page_size, layout="layer_first", dtype=torch.bfloat16):
        self.head_num, self.head_dim = head_num, head_dim
        super().__init__(layer_num, size, page_size, layout, dtype)
        self.page_shape = (2, layer_num, page_size, head_num, head_dim)   # the dummy page; logical_page

    def get_size_per_token(self):
        return self.head_dim * self.head_num * self.layer_num * _isz(self.dtype) * 2

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    def init_kv_buffer(self):
        L, H, D, ps = self.layer_num, self.head_num, self.head_dim, self.page_size
        dims = {"layer_first": (2, L, self.size, H, D), "page_first": (2, self.size, L, H, D),
                "page_first_direct": (2, self.page_num, L, ps, H, D),
                "page_head": (2, self.page_num, H, ps, L, D)}.get(self.layout)
        if dims is None:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return torch.zeros(dims, dtype=self.dtype)

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        index, ps = int(index), self.page_size
        if self.layout == "layer_first":
            page = self.kv_buffer[:, :, index:index + ps, :, :]
        elif self.layout == "page_first":
            page = self.kv_buffer[:, index:index + ps, :, :, :]
        else:  # page_first_direct, page_head
            page = self.kv_buffer[:, index // ps:index // ps + 1, :, :, :, :]
        return page.flatten() if flat else page

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base, isz = self.kv_buffer.data_ptr(), _isz(self.dtype)
        L, H, D, ps = self.layer_num, self.head_num, self.head_dim, self.page_size
        v_offset = L * self.size * H * D * isz
        ptrs, indices = [], indices.tolist()
        for i in range(0, len(indices), ps):
            if self.layout == "layer_first":
                for layer in range(L):
                    k = base + indices[i] * H * D * isz + layer * self.size * H * D * isz
                    ptrs += [k, k + v_offset]
            else:
                k = base + indices[i] * L * H * D * isz
                ptrs += [k, k + v_offset]
        size = isz * ps * H * D * (1 if self.layout == "layer_first" else L)
        return ptrs, [size] * len(ptrs)

    def logical_page(self, index: int) -> torch.Tensor:
        """A view of the page at slot `index` as (2, layer, token, head, dim)."""
        ps = self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index:index + ps]
        if self.layout == "page_first":
            return self.kv_buffer[:, index:index + ps].transpose(1, 2)
        if self.layout == "page_first_direct":
            return self.kv_buffer[:, index // ps]
        return self.kv_buffer[:, index // ps].permute(0, 3, 2, 1, 4)   # page_head


class MLATokenToKVPoolHost(HostKVCache):
    def __init__(self, layer_num, kv_lora_rank, qk_rope_head_dim, size, page_size, layout="layer_first",
                 dtype=torch.bfloat16):
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        super().__init__(layer_num, size, page_size, layout, dtype)
        self.page_shape = (layer_num, page_size, 1, self.kv_cache_dim)

    def get_size_per_token(self):
        return self.kv_cache_dim * _isz(self.dtype) * self.layer_num

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def init_kv_buffer(self):
        L, D, ps = self.layer_num, self.kv_cache_dim, self.page_size
        dims = {"layer_first": (L, self.size, 1, D), "page_first": (self.size, L, 1, D),
                "page_first_direct": (self.page_num, L, ps, 1, D)}.get(self.layout)
        if dims is None:
            raise ValueError(f"Unsupported layout: {self.layout}")
        return torch.zeros(dims, dtype=self.dtype)

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        index, ps = int(index), self.page_size
        if self.layout == "layer_first":
            page = self.kv_buffer[:, index:index + ps, :, :]
        elif self.layout == "page_first":
            page = self.kv_buffer[index:index + ps, :, :, :]
        else:
            page = self.kv_buffer[index // ps:index // ps + 1, :, :, :, :]
        return page.flatten() if flat else page

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base, isz = self.kv_buffer.data_ptr(), _isz(self.dtype)
        L, D, ps = self.layer_num, self.kv_cache_dim, self.page_size
        ptrs, indices = [], indices.tolist()
        for i in range(0, len(indices), ps):
            if self.layout == "layer_first":
                ptrs += [base + indices[i] * D * isz + layer * self.size * D * isz for layer in range(L)]
            else:
                ptrs.append(base + indices[i] * L * D * isz)
        size = isz * ps * D * (1 if self.layout == "layer_first" else L)
        return ptrs, [size] * len(ptrs)

    def logical_page(self, index: int) -> torch.Tensor:
        """A view of the page at slot `index` as (layer, token, 1, dim)."""
        ps = self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, index:index + ps]
        if self.layout == "page_first":
            return self.kv_buffer[index:index + ps].transpose(0, 1)
        return self.kv_buffer[index // ps]


# --- the KV a page holds, and checking it ---------------------------------------

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def expected_page(pool: HostKVCache, page_hash: str, tp_rank: int = 0) -> torch.Tensor:
    """The page's KV in logical order: random bits seeded by its hash (and,
    for MHA, the rank, whose heads differ)."""
    seed = int(page_hash[:15], 16) ^ (0 if isinstance(pool, MLATokenToKVPoolHost) else tp_rank * 7919)
    g = torch.Generator().manual_seed(seed)
    it = _INT[_isz(pool.dtype)]
    info = torch.iinfo(it)
    bits = torch.randint(info.min, info.max, pool.page_shape, dtype=it, generator=g)
    return bits.view(pool.dtype)


def fill_pages(pool, hashes, host_indices, tp_rank: int = 0) -> None:
    """What the device-to-host backup of these pages would have written."""
    for i, h in enumerate(hashes):
        pool.logical_page(int(host_indices[i * pool.page_size])).copy_(expected_page(pool, h, tp_rank))


def check_pages(pool, hashes, host_indices, tp_rank: int = 0) -> list:
    """Per page: does the pool hold its KV bit for bit?"""
    it = _INT[_isz(pool.dtype)]
    return [torch.equal(pool.logical_page(int(host_indices[i * pool.page_size])).contiguous().view(it),
                        expected_page(pool, h, tp_rank).view(it)) for i, h in enumerate(hashes)]


# --- the controller ----------------------------------------------------------------

def create_dynamic_backend(storage_config):
    """StorageBackendFactory.create_backend("dynamic", ...) for a backend
    that is not built in."""
    cfg = storage_config.extra_config
    if cfg is None:
        raise ValueError("Unknown storage backend 'dynamic'")
    for field in ("backend_name", "module_path", "class_name"):
        if field not in cfg:
            raise ValueError(f"Missing required field '{field}' in backend config for 'dynamic' backend")
    backend_class = getattr(importlib.import_module(cfg["module_path"]), cfg["class_name"])
    if not issubclass(backend_class, HiCacheStorage):
        raise TypeError(f"Backend class {cfg['class_name']} must inherit from HiCacheStorage")
    return backend_class(storage_config, {})


@dataclasses.dataclass
class Prefetch:
    hashes: list                          # pages the hit query found
    host_indices: Optional[torch.Tensor]  # slots of the pages that loaded (None: revoked)
    completed_tokens: int


class HiCacheController:
    """One TP rank's HiCacheController, its storage paths only."""

    def __init__(self, pool: HostKVCache, extra_config: dict | str, model_name: str = "tiny/model",
                 tp_rank: int = 0, tp_size: int = 1, pp_rank: int = 0, pp_size: int = 1):
        extra = json.loads(extra_config) if isinstance(extra_config, str) else dict(extra_config)
        self.prefetch_threshold = max(int(extra.pop("prefetch_threshold", 256)), pool.page_size)
        for key in ("prefetch_timeout_base", "prefetch_timeout_per_ki_token", "prefetch_timeout_max",
                    "hicache_storage_pass_prefix_keys", "tp_lcm_size"):
            extra.pop(key, None)
        self.pool, self.page_size, self.tp_rank = pool, pool.page_size, tp_rank
        is_mla = isinstance(pool, MLATokenToKVPoolHost)
        common = dict(tp_rank=tp_rank, tp_size=tp_size, is_mla_model=is_mla,
                      is_page_first_layout=pool.layout == "page_first", model_name=model_name,
                      extra_config=extra)
        try:
            self.storage_config = HiCacheStorageConfig(pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=0,
                                                       attn_cp_size=1, enable_storage_metrics=False, **common)
        except TypeError:  # SGLang before the pp/cp fields
            self.storage_config = HiCacheStorageConfig(**common)
        self.backup_skip = is_mla and tp_rank != 0
        self.storage_backend = create_dynamic_backend(self.storage_config)
        self.storage_backend.register_mem_pool_host(pool)
        if bool(extra.get("interface_v1", 0)):
            self.page_get_func, self.page_set_func = self._page_get_zero_copy, self._page_set_zero_copy
        else:
            self.page_get_func, self.page_set_func = self._generic_page_get, self._generic_page_set
        self.exists_calls: list = []      # keys per batch_exists call

    # prefetch: storage -> host
    def storage_hit_query(self, hashes: list) -> list:
        hit = []
        for start in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[start:start + STORAGE_BATCH_SIZE]
            self.exists_calls.append(len(batch))
            n = self.storage_backend.batch_exists(batch, HiCacheStorageExtraInfo(prefix_keys=None))
            hit.extend(batch[:n])
            if n < len(batch):
                break
        return hit

    def _page_get_zero_copy(self, hashes, host_indices, extra_info=None) -> int:
        results = self.storage_backend.batch_get_v1(hashes, host_indices, extra_info)
        inc = 0
        for i in range(len(hashes)):
            if not results[i]:
                break
            inc += 1
        return inc

    def _generic_page_get(self, hashes, host_indices, extra_info=None) -> int:
        dummy_page_dst = [self.pool.get_dummy_flat_data_page() for _ in hashes]
        page_data = self.storage_backend.batch_get(hashes, dummy_page_dst)
        if page_data is None:
            return 0
        count = 0
        for i in range(len(hashes)):
            if page_data[i] is None:
                break
            self.pool.set_from_flat_data_page(host_indices[i * self.page_size], page_data[i])
            count += 1
        return count

    def page_transfer(self, hashes: list, host_indices: torch.Tensor) -> int:
        all_success, completed = True, 0
        for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
            if all_success:
                batch = hashes[i:i + STORAGE_BATCH_SIZE]
                idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
                hit_pages = self.page_get_func(batch, idx, HiCacheStorageExtraInfo(prefix_keys=None))
                if hit_pages != len(batch):
                    all_success = False
                completed += hit_pages
        return completed

    def prefetch(self, token_ids, last_hash: Optional[str] = None) -> Prefetch:
        hashes = self.storage_hit_query(page_hashes(token_ids, self.page_size, last_hash))
        if len(hashes) * self.page_size < self.prefetch_threshold:
            return Prefetch(hashes, None, 0)     # revoked
        host_indices = self.pool.alloc(len(hashes) * self.page_size)
        if host_indices is None:
            return Prefetch(hashes, None, 0)
        done = self.page_transfer(hashes, host_indices) * self.page_size
        self.pool.free(host_indices[done:])
        return Prefetch(hashes, host_indices[:done], done)

    # backup: host -> storage
    def _page_set_zero_copy(self, hashes, host_indices, extra_info=None) -> bool:
        return all(self.storage_backend.batch_set_v1(hashes, host_indices, extra_info))

    def _generic_page_set(self, hashes, host_indices, extra_info=None) -> bool:
        data = [self.pool.get_data_page(host_indices[i * self.page_size]) for i in range(len(hashes))]
        return self.storage_backend.batch_set(hashes, data)

    def backup(self, hashes: list, host_indices: torch.Tensor) -> int:
        """Tokens backed up (0 on MLA ranks other than 0, which skip)."""
        completed = 0
        if self.backup_skip:
            return 0
        for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[i:i + STORAGE_BATCH_SIZE]
            idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            if not self.page_set_func(batch, idx, HiCacheStorageExtraInfo(prefix_keys=None)):
                break
            completed += self.page_size * len(batch)
        return completed

    def write_prompt(self, token_ids) -> tuple:
        """A prefill that left its pages in the host pool: (hashes, slots)."""
        hashes = page_hashes(token_ids, self.page_size)
        host_indices = self.pool.alloc(len(hashes) * self.page_size)
        fill_pages(self.pool, hashes, host_indices, self.tp_rank)
        return hashes, host_indices

    def close(self) -> None:
        if hasattr(self.storage_backend, "close"):
            self.storage_backend.close()


def extra_config(socket: str, **kw) -> dict:
    return dict({"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
                 "interface_v1": 1, "socket": socket, "prefetch_threshold": 0}, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", default="", help="kvtierd's socket (default: its run directory)")
    ap.add_argument("--layout", default="page_first")
    ap.add_argument("--pages", type=int, default=40)
    args = ap.parse_args()
    prompt = [(i * 31 + 7) % 32000 for i in range(args.pages * 16)]
    pools = [MHATokenToKVPoolHost(4, 2, 64, 2048, 16, args.layout) for _ in range(2)]
    a = HiCacheController(pools[0], extra_config(args.socket))
    b = HiCacheController(pools[1], extra_config(args.socket))
    hashes, slots = a.write_prompt(prompt)
    print(f"engine A backed up {a.backup(hashes, slots)} tokens")
    pools[1].alloc(160)   # B's prefetch lands in other slots than A's pages
    got = b.prefetch(prompt + [1, 2, 3])
    exact = check_pages(pools[1], got.hashes[:got.completed_tokens // 16], got.host_indices)
    print(f"engine B prefetched {got.completed_tokens} tokens; {sum(exact)} of {len(exact)} pages bit-exact; "
          f"stats {b.storage_backend.get_stats()}")
    a.close()
    b.close()


if __name__ == "__main__":
    main()
