# SPDX-License-Identifier: Apache-2.0
"""The kvtier Python package against a live kvtierd: keys, lookups, loads
into NumPy, stores from NumPy and raw pointers, async operations, errors,
and namespace isolation."""
import ctypes
import gc
import os
import time

import numpy as np
import pytest

import kvtier

BLOCK_TOKENS = 16
BLOCK_BYTES = 4096


def attach(d, **kw):
    kw.setdefault("block_tokens", BLOCK_TOKENS)
    kw.setdefault("block_bytes", BLOCK_BYTES)
    kw.setdefault("kv_dtype", "fp16")
    kw.setdefault("kv_layout", "layer_major")
    return kvtier.Client.attach(kw.pop("model_id", "py/test"), socket=d.socket, **kw)


def blocks_for(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, BLOCK_BYTES), dtype=np.uint8)


def test_attach_reports_the_session(daemon):
    c = attach(daemon)
    assert c.block_bytes == BLOCK_BYTES and c.block_tokens == BLOCK_TOKENS
    assert c.session_id > 0 and c.tenant == "default" and c.connected
    assert c.hash == "sha256" and len(c.namespace_id) == 32
    c.ping()


def test_keys_are_chained_and_cover_full_blocks_only(daemon):
    c = attach(daemon)
    tokens = np.arange(100, dtype=np.uint32)
    keys = c.compute_keys(tokens)
    assert len(keys) == 100 // BLOCK_TOKENS and all(len(k) == 32 for k in keys)
    assert c.compute_keys(list(range(100))) == keys, "lists and arrays give the same keys"
    assert c.compute_keys(tokens[:32]) == keys[:2], "a prefix has the prefix's keys"
    assert c.compute_keys(tokens[32:96], parent=keys[1]) == keys[2:6], "parent continues the chain"
    assert c.compute_keys(tokens, extra=b"image-hash")[0] != keys[0]
    with pytest.raises(ValueError):
        c.compute_keys(tokens, parent=b"short")


def test_store_lookup_load_round_trip(daemon):
    c = attach(daemon)
    keys = c.compute_keys(np.arange(96, dtype=np.uint32))  # 6 blocks
    data = blocks_for(4, seed=1)
    assert c.store(keys[:4], data) == 4
    assert c.store(keys[:4], data) == 0, "already cached"
    probe = c.lookup(keys)
    assert probe.hit_blocks == 4 and probe.lease == 0
    assert probe.tiers == ["host"] * 4 + ["none"] * 2
    assert probe.lanes == [None] * 6, "host blocks and misses are in no lower tier's lane"
    hit = c.lookup(keys, lease=True)
    assert hit.hit_blocks == 4 and hit.lease != 0
    views = c.load(hit.lease, keys[:4])
    assert len(views) == 4
    for i, v in enumerate(views):
        assert v.dtype == np.uint8 and v.shape == (BLOCK_BYTES,)
        assert np.array_equal(v, data[i])
        assert not v.flags.writeable, "views of the shared arena are read-only"
    out = np.zeros((4, BLOCK_BYTES), dtype=np.uint8)
    assert c.load_into(hit.lease, keys[:4], out) == 4
    assert np.array_equal(out, data)
    c.release(hit.lease)


def test_store_from_a_list_of_buffers_and_raw_pointers(daemon):
    c = attach(daemon)
    keys = c.compute_keys(np.arange(1000, 1064, dtype=np.uint32))  # 4 blocks
    data = blocks_for(4, seed=2)
    assert c.store(keys[:2], [bytes(data[0]), memoryview(data[1])]) == 2
    buffers = [np.ascontiguousarray(data[i]) for i in (2, 3)]
    assert c.store_from_pointers(keys[2:], [b.ctypes.data for b in buffers]) == 2
    hit = c.lookup(keys, lease=True)
    assert hit.hit_blocks == 4
    assert all(np.array_equal(v, data[i]) for i, v in enumerate(c.load(hit.lease, keys)))
    c.release(hit.lease)


def test_async_operations(daemon):
    c = attach(daemon)
    keys = c.compute_keys(np.arange(2000, 2048, dtype=np.uint32))
    data = blocks_for(3, seed=3)
    c.store(keys, data)
    op = c.lookup_async(keys, lease=True)
    hit = op.wait(5.0)
    assert isinstance(hit, kvtier.LookupResult) and hit.hit_blocks == 3
    assert op.poll(), "a completed operation stays completed"
    load = c.load_async(hit.lease, keys)
    views = load.wait()
    assert [np.array_equal(v, data[i]) for i, v in enumerate(views)] == [True] * 3
    assert c.prefetch_async(keys).wait() == 0, "no NVMe tier: nothing to promote"
    c.release(hit.lease)


def test_errors_carry_the_code_and_say_why(daemon):
    c = attach(daemon)
    keys = c.compute_keys(np.arange(32, dtype=np.uint32))
    with pytest.raises(ValueError, match="shape"):
        c.store(keys, np.zeros((2, BLOCK_BYTES - 1), dtype=np.uint8))
    with pytest.raises(ValueError, match="32 bytes"):
        c.lookup([b"not a key"])
    with pytest.raises(kvtier.KvtierError) as e:
        c.release(123456)
    assert e.value.code == -2, "ENOENT: no such lease"
    assert "lease" in str(e.value)
    with pytest.raises(kvtier.KvtierError, match="needs a lease") as e:
        c.lookup(keys, ask=False)
    assert e.value.code == -22, "EINVAL"
    before = daemon.status()["stats"]["lookups"]
    assert c.lookup(keys, ask=True).lease == 0, "an ask without a lease pins nothing"
    assert daemon.status()["stats"]["lookups"] == before + 1, "but counts as its request's lookup"
    with pytest.raises(kvtier.KvtierError):
        kvtier.Client.attach("m", 16, 4096, socket=daemon.dir + "/no-such.sock", kv_dtype="fp16",
                             kv_layout="layer_major")


def test_namespaces_never_share_blocks(daemon):
    a = attach(daemon, cache_salt="one")
    b = attach(daemon, cache_salt="two")
    rev = attach(daemon, cache_salt="one", model_revision="v2")
    tokens = np.arange(64, dtype=np.uint32)
    a.store(a.compute_keys(tokens), blocks_for(4, seed=4))
    assert a.lookup(a.compute_keys(tokens)).hit_blocks == 4
    assert b.lookup(b.compute_keys(tokens)).hit_blocks == 0, "another salt"
    assert rev.lookup(rev.compute_keys(tokens)).hit_blocks == 0, "another model revision"
    assert a.namespace_id != b.namespace_id != rev.namespace_id


def test_invalidate_and_report_prefill(daemon):
    c = attach(daemon)
    keys = c.compute_keys(np.arange(500, 548, dtype=np.uint32))
    c.store(keys, blocks_for(3, seed=5))
    assert c.invalidate(keys[1:]) == 2
    assert c.lookup(keys).hit_blocks == 1
    c.report_prefill(cached_tokens=16, computed_tokens=32, seconds=0.002)


def test_invalidate_namespace_removes_every_block_of_it_only(daemon):
    c = attach(daemon)
    other = attach(daemon, model_id="py/other")
    keys = c.compute_keys(np.arange(600, 664, dtype=np.uint32))  # 4 blocks
    c.store(keys, blocks_for(4, seed=6))
    other_keys = other.compute_keys(np.arange(600, 632, dtype=np.uint32))
    other.store(other_keys, blocks_for(2, seed=7))
    assert c.invalidate_namespace() == 4
    assert c.lookup(keys).hit_blocks == 0
    assert other.lookup(other_keys).hit_blocks == 2, "another namespace keeps its blocks"
    assert c.invalidate_namespace() == 0


def test_two_step_store_fills_slots_in_place(daemon):
    c = attach(daemon)
    keys = c.compute_keys(np.arange(700, 764, dtype=np.uint32))  # 4 blocks
    data = blocks_for(4, seed=8)
    c.store(keys[:1], data[:1])
    with c.store_begin(keys) as t:
        assert t.needed == 3 and t.needed_mask == [False, True, True, True]
        assert t.blocks[0] is None, "a cached block needs no writing"
        for i, view in enumerate(t.blocks):
            if view is not None:
                assert view.flags.writeable and view.shape == (BLOCK_BYTES,)
                view[:] = data[i]
        assert c.lookup(keys).hit_blocks == 1, "invisible until committed"
    assert t.done
    hit = c.lookup(keys, lease=True)
    assert hit.hit_blocks == 4
    assert all(np.array_equal(v, data[i]) for i, v in enumerate(c.load(hit.lease, keys)))
    c.release(hit.lease)
    with pytest.raises(kvtier.KvtierError):
        t.commit()  # once only

    # An exception inside the block aborts: nothing becomes visible.
    more = c.compute_keys(np.arange(800, 832, dtype=np.uint32))
    with pytest.raises(RuntimeError, match="engine failed"):
        with c.store_begin(more) as t2:
            t2.blocks[0][:] = 1
            raise RuntimeError("engine failed")
    assert t2.done and c.lookup(more).hit_blocks == 0
    t3 = c.store_begin(more)
    t3.abort()
    assert c.lookup(more).hit_blocks == 0


def test_close_ends_the_session_and_views_say_what_they_are(daemon):
    with attach(daemon) as c:
        keys = c.compute_keys(np.arange(900, 932, dtype=np.uint32))
        c.store(keys, blocks_for(2, seed=9))
        hit = c.lookup(keys, lease=True)
        views = c.load(hit.lease, keys)
        assert not c.closed and c.connected
    assert c.closed and not c.connected
    with pytest.raises(kvtier.KvtierError) as e:
        c.lookup(keys)
    assert e.value.code == -107 and "closed" in str(e.value)
    # The views keep the arena mapped after close (no crash reading them);
    # the docstring says they no longer are the blocks once the lease goes.
    assert views[0].shape == (BLOCK_BYTES,) and int(views[0].sum()) >= 0
    assert "after release" in kvtier.Client.load.__doc__
    c.close()  # twice is harmless
    # close() released the lease the client still held: the blocks are
    # evictable again, though a view keeps the session's memory mapped.
    d = attach(daemon)
    assert d.lookup(keys).hit_blocks == 2
    assert daemon.status()["tiers"][0]["pinned_blocks"] == 0
    assert len(daemon.status()["sessions"]) == 2
    del views
    gc.collect()
    deadline = time.time() + 30
    while len(daemon.status()["sessions"]) != 1 and time.time() < deadline:
        time.sleep(0.01)
    assert len(daemon.status()["sessions"]) == 1, "the session ends with its last view"


def test_docstrings_and_type_hints_ship_with_the_package():
    import pathlib
    assert kvtier.Client.lookup.__doc__ and "prefix" in kvtier.Client.lookup.__doc__
    assert kvtier.Client.attach.__doc__
    pkg = pathlib.Path(kvtier.__file__).parent
    assert (pkg / "__init__.pyi").is_file() and (pkg / "py.typed").is_file()


def test_the_connector_example_reuses_the_shared_system_prompt(daemon):
    import pathlib
    import subprocess
    import sys
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "connector_example.py"
    out = subprocess.run([sys.executable, str(example), "--socket", daemon.socket], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "kvtier matched 0, loaded 0 blocks" in lines[0]
    assert "kvtier matched 64, loaded 4 blocks, computed 2, stored 2 new; cache exact: True" in lines[1], lines


def _paged_cache(layers, pages, page_tokens, kv_heads, head_dim):
    """An engine's paged KV cache in a sealed memfd, as the daemon maps it:
    per layer K then V, each [pages, page_tokens, kv_heads, head_dim] f32."""
    import fcntl
    import mmap
    shape = (layers, 2, pages, page_tokens, kv_heads, head_dim)
    nbytes = int(np.prod(shape)) * 4
    fd = os.memfd_create("py-engine-kv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    mem = mmap.mmap(fd, nbytes)
    cache = np.frombuffer(mem, dtype=np.float32).reshape(shape)
    base = cache.ctypes.data
    layer_bytes = 2 * pages * page_tokens * kv_heads * head_dim * 4
    k_layers = [base + l * layer_bytes for l in range(layers)]
    v_layers = [a + layer_bytes // 2 for a in k_layers]
    return cache, mem, fd, k_layers, v_layers, (base, nbytes, fd)


def test_registered_cache_moves_pages_layer_by_layer(daemon):
    layers, page_tokens, kv_heads, head_dim, pages = 3, 8, 2, 16, 32
    bb = kvtier.kv_block_bytes(layers, 8, kv_heads, head_dim, dtype="f32")
    assert bb == layers * 2 * 8 * kv_heads * head_dim * 4
    c = kvtier.Client.attach("py/registered", block_tokens=8, block_bytes=bb, socket=daemon.socket, kv_dtype="f32",
                             kv_layout="layer_major")
    cache, mem, fd, k_layers, v_layers, region = _paged_cache(layers, pages, page_tokens, kv_heads, head_dim)
    try:
        reg = c.register_kv_cache(layers, page_tokens, kv_heads, head_dim, pages, k_layers, v_layers, [region],
                                  dtype="f32")
        rng = np.random.default_rng(3)
        src = [5, 1, 9]
        cache[:, :, src] = rng.standard_normal(cache[:, :, src].shape, dtype=np.float32)
        keys = c.compute_keys(np.arange(24, dtype=np.uint32))
        assert c.store_from_cache(reg, keys, src) == 3
        hit = c.lookup(keys, lease=True)
        assert hit.hit_blocks == 3
        dst = [20, 21, 22]
        load = c.load_into_cache_async(reg, hit.lease, keys, dst)
        assert load.layers == layers
        for layer in range(layers):
            assert load.wait_layers(layer + 1) == 3
            assert load.layers_ready() >= layer + 1
            np.testing.assert_array_equal(cache[layer, :, dst], cache[layer, :, src])
        assert load.finish() == 3
        c.release(hit.lease)
        # A page list of the wrong length is refused with the reason.
        with pytest.raises(kvtier.KvtierError) as e:
            c.store_from_cache(reg, keys, [1, 2])
        assert e.value.code == -22
        c.unregister_kv_cache(reg)
        with pytest.raises(kvtier.KvtierError):
            c.store_from_cache(reg, keys, src)
    finally:
        del cache
        mem.close()
        os.close(fd)


def test_kv_block_bytes_sizes_quantized_blocks_and_names_bad_input():
    lossless = kvtier.kv_block_bytes(2, 16, 2, 64, dtype="f16")
    assert lossless == 2 * 2 * 16 * 2 * 64 * 2
    assert kvtier.kv_block_bytes(2, 16, 2, 64, dtype="f16", codec="int8") < lossless
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.kv_block_bytes(2, 16, 2, 64, dtype="f17")
    assert "f17" in str(e.value)


def test_a_namespace_without_kv_dtype_is_refused_as_in_c(daemon):
    # It defaulted to "fp16": two engines whose KV bytes differ could share blocks.
    with pytest.raises(TypeError, match="kv_dtype"):
        kvtier.Client.attach("py/test", BLOCK_TOKENS, BLOCK_BYTES, socket=daemon.socket, kv_layout="layer_major")
    with pytest.raises(TypeError, match="kv_layout"):
        kvtier.Client.attach("py/test", BLOCK_TOKENS, BLOCK_BYTES, socket=daemon.socket, kv_dtype="fp16")
    with pytest.raises(Exception, match="kv_dtype"):
        kvtier.Client.attach("py/test", BLOCK_TOKENS, BLOCK_BYTES, socket=daemon.socket, kv_dtype="",
                             kv_layout="layer_major")


def test_the_policies_learn_from_asks_only(daemon):
    """The default policy's shadows score each request's ask: a leased
    lookup, or an unleased one flagged ask=True. A probe, and a lease
    flagged ask=False (its request asked before), teach them nothing."""
    c = attach(daemon)
    keys = c.compute_keys(np.arange(16 * 8, dtype=np.uint32))
    c.store(keys[:4], np.ones((4, BLOCK_BYTES), dtype=np.uint8))

    def scores():
        return [p["scores"] for p in daemon.status()["tenants"][0]["policies"]]

    def lease(**kw):
        r = c.lookup(keys, lease=True, **kw)
        c.release(r.lease)

    lease()
    seen = [scores()]
    for step in (lambda: c.lookup(keys), lambda: lease(ask=False), lambda: c.lookup(keys, ask=True), lease):
        step()
        seen.append(scores())
    moved = [after != before for before, after in zip(seen, seen[1:])]
    assert moved == [False, False, True, True], (moved, seen)
