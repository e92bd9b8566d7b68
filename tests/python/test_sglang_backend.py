# SPDX-License-Identifier: Apache-2.0
"""kvtier.sglang driven as SGLang's HiCacheController drives an L3 storage
backend (examples/python/tiny_sglang.py: SGLang's host pools, page hashes
and prefetch/backup paths), checking host-pool pages bit for bit."""
import logging
import os
import signal
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="Debian's python3-torch is needed for SGLang's host pools")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))

import kvtier  # noqa: E402
import kvtier.sglang as kv_sglang  # noqa: E402
import tiny_sglang as ts  # noqa: E402
from conftest import Daemon  # noqa: E402

PS = 4
MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def pool(mla=False, layout="page_first", pages=96, ps=PS):
    if mla:
        return ts.MLATokenToKVPoolHost(3, 32, 16, pages * ps, ps, layout)
    return ts.MHATokenToKVPoolHost(3, 2, 16, pages * ps, ps, layout)


def engine(socket, mla=False, layout="page_first", v1=True, tp_rank=0, tp_size=1, pages=96, ps=PS, **extra):
    cfg = ts.extra_config(socket, interface_v1=int(v1), **extra)
    return ts.HiCacheController(pool(mla, layout, pages, ps), cfg, tp_rank=tp_rank, tp_size=tp_size)


def prompt(seed, n):
    return [(seed * 131 + i * 31 + 7) % 32000 for i in range(n)]


def pinned(daemon):
    return [t for t in daemon.status()["tiers"] if t["tier"] == "host"][0]["pinned_blocks"]


@pytest.mark.parametrize("paths", ["v1>v1", "generic>generic", "v1>generic", "generic>v1"])
@pytest.mark.parametrize("kind,layout", [("mha", x) for x in MHA_LAYOUTS] + [("mla", x) for x in MLA_LAYOUTS])
def test_backup_then_prefetch_into_other_pages_is_bit_exact(daemon, kind, layout, paths):
    w, r = paths.split(">")
    a = engine(daemon.socket, kind == "mla", layout, v1=w == "v1")
    b = engine(daemon.socket, kind == "mla", layout, v1=r == "v1")
    p = prompt(1, 20 * PS)
    hashes, slots = a.write_prompt(p)
    assert a.backup(hashes, slots) == 20 * PS
    assert a.storage_backend.get_stats().pages_stored == 20
    b.pool.alloc(8 * PS)                                   # b's pages land elsewhere
    got = b.prefetch(p + [1, 2])
    assert got.completed_tokens == 20 * PS
    assert int(got.host_indices[0]) != int(slots[0])
    assert ts.check_pages(b.pool, hashes, got.host_indices) == [True] * 20
    assert b.storage_backend.get_stats().pages_loaded == 20
    assert pinned(daemon) == 0, "a load left its lease"
    assert not any(ts.check_pages(b.pool, hashes, slots)), "pages landed in the writer's slots"


def test_prefetch_and_backup_go_in_slices_of_128_pages(daemon):
    a = engine(daemon.socket, pages=400, ps=2)
    b = engine(daemon.socket, pages=400, ps=2)
    p = prompt(2, 300 * 2)
    hashes, slots = a.write_prompt(p)
    sets, gets = [], []
    for ctl, name, calls in ((a, "batch_set_v1", sets), (b, "batch_get_v1", gets)):
        orig = getattr(ctl.storage_backend, name)
        setattr(ctl.storage_backend, name, lambda k, i, e=None, o=orig, c=calls: (c.append(len(k)), o(k, i, e))[1])
    assert a.backup(hashes, slots) == 600
    got = b.prefetch(p)
    assert (sets, b.exists_calls, gets) == ([128, 128, 44],) * 3
    assert got.completed_tokens == 600
    assert all(ts.check_pages(b.pool, hashes, got.host_indices))


def test_batch_exists_counts_leading_hits(daemon):
    a = engine(daemon.socket)
    p = prompt(3, 12 * PS)
    hashes, slots = a.write_prompt(p[:10 * PS])
    a.backup(hashes, slots)
    be = a.storage_backend
    all_hashes = ts.page_hashes(p, PS)
    assert all_hashes[:10] == hashes
    assert be.batch_exists(all_hashes) == 10
    with kvtier.Client.attach(**be.attach_args) as c:
        assert c.invalidate([kv_sglang.page_key(hashes[3])]) == 1
    assert be.batch_exists(all_hashes) == 3
    assert be.batch_exists(all_hashes[3:]) == 0
    assert be.batch_exists(all_hashes[4:]) == 6
    assert be.exists(hashes[0]) and not be.exists(hashes[3])
    # keys: SGLang's hex digests are the key; any other string is hashed
    assert kv_sglang.page_key(hashes[0]) == bytes.fromhex(hashes[0])
    page = a.pool.get_data_page(int(slots[0]))
    assert be.set("not-a-hash", page) and be.exists("not-a-hash")
    assert torch.equal(be.get("not-a-hash").view(torch.int16), page.view(torch.int16))
    assert be.get("missing") is None


def test_each_prefetch_query_is_an_ask_and_its_loads_are_not(daemon):
    """kvtierd's policies and hit counters learn from each
    request's ask. SGLang queries batch_exists before it loads what exists:
    the query is the ask, misses included; the loads that follow are leases
    that are not asks, and exists() of one page is a probe."""
    a = engine(daemon.socket)
    b = engine(daemon.socket)
    p = prompt(7, 12 * PS)
    hashes, slots = a.write_prompt(p[:8 * PS])
    assert a.backup(hashes, slots) == 8 * PS
    before = daemon.status()["stats"]
    got = b.prefetch(p)                              # 12 pages asked, 8 there
    assert got.completed_tokens == 8 * PS
    assert b.storage_backend.exists(hashes[0])
    after = daemon.status()["stats"]
    d = {k: after[k] - before[k] for k in ("lookups", "blocks_queried", "blocks_hit", "probes", "loads")}
    assert d == {"lookups": 1, "blocks_queried": 12, "blocks_hit": 8, "probes": 1, "loads": 1}, d


def test_bad_arguments_are_failures_not_exceptions(daemon):
    a = engine(daemon.socket)
    h, s = a.write_prompt(prompt(16, 4 * PS))
    be = a.storage_backend
    assert be.batch_set_v1(h, s) == [True] * 4
    host = a.pool.alloc(4 * PS).clone()
    host[2 * PS] += 1                                    # page 2 does not start a page
    assert be.batch_get_v1(h, host) == [True, True, False, False]
    assert be.batch_get_v1(h, host[:PS]) == [True, False, False, False]   # slots for one page only
    assert be.batch_set(h, [torch.zeros(3)] * 4) is False
    assert be.batch_get(h, [torch.zeros(3)] * 4) == [None] * 4
    assert be.get_stats().pages_failed == 2 + 3 + 4 + 4


def test_two_engines_share_pages_while_both_run(daemon):
    a, b = engine(daemon.socket), engine(daemon.socket)
    p, q = prompt(4, 6 * PS), prompt(5, 5 * PS)
    ha, sa = a.write_prompt(p)
    a.backup(ha, sa)
    assert b.prefetch(p).completed_tokens == 6 * PS
    hb, sb = b.write_prompt(p + q)                       # b computed on from there
    assert b.backup(hb, sb) == 11 * PS
    st = b.storage_backend.get_stats()
    assert (st.pages_present, st.pages_stored) == (6, 5), "the shared pages were stored again"
    got = a.prefetch(p + q + [9])
    assert got.completed_tokens == 11 * PS
    assert all(ts.check_pages(a.pool, hb, got.host_indices))


def test_tp_ranks_of_an_mha_model_are_apart_and_mla_ranks_share(daemon):
    p = prompt(6, 8 * PS)
    r0, r1 = (engine(daemon.socket, tp_rank=r, tp_size=2) for r in (0, 1))
    h0, s0 = r0.write_prompt(p)
    r0.backup(h0, s0)
    assert r1.storage_backend.batch_exists(h0) == 0, "rank 1 sees rank 0's heads"
    h1, s1 = r1.write_prompt(p)
    r1.backup(h1, s1)
    for rank in (0, 1):
        fresh = engine(daemon.socket, tp_rank=rank, tp_size=2)
        got = fresh.prefetch(p)
        assert got.completed_tokens == 8 * PS
        assert all(ts.check_pages(fresh.pool, h0, got.host_indices, tp_rank=rank))
        assert not any(ts.check_pages(fresh.pool, h0, got.host_indices, tp_rank=1 - rank))

    m0, m1 = (engine(daemon.socket, mla=True, tp_rank=r, tp_size=2) for r in (0, 1))
    hm, sm = m1.write_prompt(p)
    assert m1.backup(hm, sm) == 0                        # SGLang's backup_skip
    assert m1.storage_backend.batch_set_v1(hm, sm) == [True] * 8
    assert m1.storage_backend.batch_set(hm, [m1.pool.get_data_page(int(sm[i * PS])) for i in range(8)])
    assert m1.storage_backend.get_stats().pages_stored == 0
    assert m0.storage_backend.batch_exists(hm) == 0, "an MLA rank other than 0 wrote"
    hm0, sm0 = m0.write_prompt(p)
    assert m0.backup(hm0, sm0) == 8 * PS
    m1b = engine(daemon.socket, mla=True, tp_rank=1, tp_size=2)
    got = m1b.prefetch(p)
    assert got.completed_tokens == 8 * PS
    assert all(ts.check_pages(m1b.pool, hm, got.host_indices))


def test_cache_salt_separates(daemon):
    p = prompt(7, 6 * PS)
    a = engine(daemon.socket, cache_salt="tenant-a")
    h, s = a.write_prompt(p)
    a.backup(h, s)
    assert engine(daemon.socket, cache_salt="tenant-b").storage_backend.batch_exists(h) == 0
    assert engine(daemon.socket).storage_backend.batch_exists(h) == 0
    assert engine(daemon.socket, cache_salt="tenant-a").storage_backend.batch_exists(h) == 6


@pytest.mark.parametrize("v1", [True, False])
def test_a_page_removed_between_exists_and_get_stops_the_load_there(daemon, v1):
    a, b = engine(daemon.socket), engine(daemon.socket)
    p = prompt(8, 8 * PS)
    h, s = a.write_prompt(p)
    a.backup(h, s)
    be = b.storage_backend
    assert be.batch_exists(h) == 8
    with kvtier.Client.attach(**be.attach_args) as c:
        assert c.invalidate([kv_sglang.page_key(h[5])]) == 1
    if v1:
        host = b.pool.alloc(8 * PS)
        b.pool.kv_buffer.fill_(3.25)
        assert be.batch_get_v1(h, host) == [True] * 5 + [False] * 3
        assert ts.check_pages(b.pool, h[:5], host) == [True] * 5
        for i in range(5, 8):
            assert bool((b.pool.logical_page(int(host[i * PS])) == 3.25).all()), f"page {i} was written"
    else:
        dummies = [b.pool.get_dummy_flat_data_page() for _ in h]
        out = be.batch_get(h, dummies)
        assert [x is not None for x in out] == [True] * 5 + [False] * 3
        for i in range(5):
            assert out[i] is dummies[i]
            want = ts.expected_page(b.pool, h[i])
            b.pool.set_from_flat_data_page(0, out[i])
            assert torch.equal(b.pool.logical_page(0).contiguous().view(torch.int16), want.view(torch.int16))
        assert all(not d.view(torch.int16).any() for d in dummies[5:]), "a missing page's buffer was written"
    st = be.get_stats()
    assert (st.pages_loaded, st.pages_failed) == (5, 3)
    assert pinned(daemon) == 0


def test_generic_get_with_one_target_for_every_page(daemon):
    """Older SGLang passes `[get_dummy_flat_data_page()] * n`: one tensor."""
    a = engine(daemon.socket, v1=False)
    h, s = a.write_prompt(prompt(15, 4 * PS))
    a.backup(h, s)
    dummy = a.pool.get_dummy_flat_data_page()
    out = a.storage_backend.batch_get(h, [dummy] * 4)
    assert len({x.data_ptr() for x in out}) == 4
    for i in range(4):
        a.pool.set_from_flat_data_page(0, out[i])
        assert torch.equal(a.pool.logical_page(0).contiguous().view(torch.int16),
                           ts.expected_page(a.pool, h[i]).view(torch.int16))


def test_a_killed_daemon_gives_misses_and_a_new_one_is_used_again(daemon, caplog):
    a, b = engine(daemon.socket), engine(daemon.socket)
    p, q = prompt(9, 8 * PS), prompt(10, 6 * PS)
    h, s = a.write_prompt(p)
    a.backup(h, s)
    be = b.storage_backend
    assert be.batch_exists(h) == 8
    host = b.pool.alloc(8 * PS)
    hq, sq = b.write_prompt(q)
    before = b.pool.kv_buffer.clone()
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(10)
    with caplog.at_level(logging.WARNING, logger="kvtier.sglang"):
        assert be.batch_get_v1(h, host) == [False] * 8
        assert be.batch_set_v1(hq, sq) == [False] * 6
        assert be.batch_exists(h) == 0 and not be.exists(h[0])
        assert be.batch_get(h, [b.pool.get_dummy_flat_data_page() for _ in h]) == [None] * 8
        assert be.batch_set(hq, [b.pool.get_data_page(int(sq[i * PS])) for i in range(6)]) is False
        assert b.backup(hq, sq) == 0 and b.prefetch(p).completed_tokens == 0
    assert torch.equal(b.pool.kv_buffer.view(torch.int16), before.view(torch.int16)), "a failed load wrote the pool"
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot be reached" in r.message]
    assert len(warned) == 1, [r.message for r in caplog.records]
    again = Daemon(daemon.dir)                           # a new kvtierd on the same socket
    try:
        deadline = time.monotonic() + 5
        while be.batch_set_v1(hq, sq) != [True] * 6:
            assert time.monotonic() < deadline, "the backend did not attach to the new daemon"
            time.sleep(0.1)
        got = engine(daemon.socket).prefetch(q)
        assert got.completed_tokens == 6 * PS
        assert all(ts.check_pages(b.pool, hq, sq))
    finally:
        again.stop()


def test_no_daemon_means_misses_not_errors(tmp_path, caplog, monkeypatch):
    tries = []
    real_attach = kv_sglang.Client.attach
    monkeypatch.setattr(kv_sglang.Client, "attach", lambda *a, **k: (tries.append(1), real_attach(*a, **k))[1])
    with caplog.at_level(logging.WARNING, logger="kvtier.sglang"):
        e = engine(str(tmp_path / "none.sock"))
        h, s = e.write_prompt(prompt(11, 4 * PS))
        for _ in range(3):
            assert e.storage_backend.batch_set_v1(h, s) == [False] * 4
            assert e.storage_backend.batch_get_v1(h, s) == [False] * 4
            assert e.storage_backend.batch_exists(h) == 0
        assert len(tries) == 1, "attach is tried again within the second"
        time.sleep(1.05)
        assert e.storage_backend.batch_exists(h) == 0
        assert len(tries) == 2
    assert sum("cannot be reached" in r.message for r in caplog.records) == 1


def test_bad_extra_config_is_refused_with_the_reason(daemon):
    with pytest.raises(ValueError, match="sokcet"):
        engine(daemon.socket, sokcet="/x")
    known = ts.extra_config(daemon.socket, prefetch_timeout_base=2, hicache_storage_pass_prefix_keys=True,
                            tp_lcm_size=2)
    cfg = kv_sglang.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                         attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                                         is_page_first_layout=True, model_name="m", extra_config=known)
    kv_sglang.KvtierStorage(cfg, {})                     # SGLang's own keys are not refused
    with pytest.raises(TypeError, match="inherit from HiCacheStorage"):
        cfg.extra_config = dict(known, class_name="Client")
        ts.create_dynamic_backend(cfg)


def test_stats_and_clear(daemon):
    a = engine(daemon.socket)
    h, s = a.write_prompt(prompt(12, 6 * PS))
    a.backup(h, s)
    be = a.storage_backend
    st = be.get_stats()
    assert isinstance(st, kv_sglang.StorageMetrics)
    assert (st.pages_stored, st.bytes_stored, st.backup_pgs) == (6, 6 * be.attach_args["block_bytes"], [6])
    assert be.attach_args["block_bytes"] == a.pool.get_size_per_token() * PS
    st2 = be.get_stats()
    assert st2.backup_pgs == [] and st2.pages_stored == 6, "lists are per interval, counts run on"
    be.clear()
    assert be.batch_exists(h) == 0


def test_sglangs_three_threads_at_once(daemon):
    """Prefetch, prefetch-IO and backup threads call one backend together."""
    e = engine(daemon.socket, pages=200)
    be = e.storage_backend
    p = prompt(13, 16 * PS)
    h, s = e.write_prompt(p)
    be.batch_set_v1(h, s)
    errors = []

    def run(fn):
        try:
            for i in range(20):
                fn(i)
        except Exception as x:  # noqa: BLE001 - reported below
            errors.append(x)

    def backup(i):
        hh, ss = e.write_prompt(prompt(100 + i, 4 * PS))
        assert be.batch_set_v1(hh, ss) == [True] * 4

    def load(i):
        host = s + 120 * PS                 # slots no write_prompt takes
        assert be.batch_get_v1(h, host) == [True] * 16
        assert all(ts.check_pages(e.pool, h, host))

    threads = [threading.Thread(target=run, args=(f,)) for f in (backup, load, lambda i: be.batch_exists(h))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert 1 <= len(be._idle) <= 3


@pytest.mark.skipif(not kv_sglang.SGLANG_AVAILABLE, reason="SGLang is not importable here (not a Debian "
                    "package): the backend runs on same-shaped stand-ins of its base class")
def test_real_sglang_factory_loads_the_backend(daemon):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    assert issubclass(kv_sglang.KvtierStorage, HiCacheStorage)
    hp = pool()
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="m", extra_config=ts.extra_config(daemon.socket))
    be = StorageBackendFactory.create_backend("dynamic", cfg, hp)
    be.register_mem_pool_host(hp)
    h = ts.page_hashes(prompt(14, 4 * PS), PS)
    slots = hp.alloc(4 * PS)
    assert be.batch_set_v1(h, slots) == [True] * 4 and be.batch_exists(h) == 4
