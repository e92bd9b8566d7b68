# SPDX-License-Identifier: Apache-2.0
"""kvtier.vllm driven as vLLM drives a KV connector (examples/python/tiny_vllm.py:
a scheduler and worker processes around a tiny PyTorch model), checking the
engine's KV pages bit for bit against recomputing them from scratch."""
import glob
import json
import os
import signal
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="Debian's python3-torch is needed to drive the vLLM connector")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))

import kvtier  # noqa: E402
import kvtier.vllm as kv_vllm  # noqa: E402
import tiny_vllm  # noqa: E402

BS = 16


@pytest.fixture(autouse=True, params=["stand-ins", "vllm"])
def engine_classes(request):
    """Every scenario runs on same-shaped stand-ins of vLLM's classes and,
    where vLLM is importable, on vLLM's own (its data types and its
    KVConnectorFactory loading the connector)."""
    real = request.param == "vllm"
    if real and not tiny_vllm.vllm_available():
        pytest.skip("vLLM is not importable here (not a Debian package): the scenario ran on stand-ins of its "
                    "classes; install vLLM to run it against vLLM's own")
    tiny_vllm.USE_REAL_VLLM = real
    yield request.param
    tiny_vllm.USE_REAL_VLLM = False


@pytest.fixture(params=["copies", "registered", "cuda"])
def cache_path(request):
    """The scenarios that move pages run each way: the workers' caches in
    torch's memory (the connector copies blocks through kvtier's host arena),
    in a memfd (the connector registers the cache and kvtierd scatters and
    gathers the pages itself), and in GPU memory (registered through CUDA
    IPC: where a GPU and a CUDA-enabled torch are there)."""
    if request.param == "cuda" and not (torch.cuda.is_available() and os.environ.get("KVTIER_TEST_DEVICE") == "cuda"):
        pytest.skip("no GPU run (tests/gpu/run.sh sets KVTIER_TEST_DEVICE=cuda; torch must be built with CUDA, "
                    "which Debian's python3-torch is not): the registered-cache path ran on a memfd cache instead")
    tiny_vllm.CACHE_MEMORY = {"copies": "tensor", "registered": "memfd", "cuda": "cuda"}[request.param]
    yield request.param
    tiny_vllm.CACHE_MEMORY = "tensor"


both_paths = pytest.mark.usefixtures("cache_path")


def ktc(daemon, **extra):
    if tiny_vllm.CACHE_MEMORY in ("memfd", "cuda"):
        extra.setdefault("cache_registration", "required")
    return {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
            "kv_connector_extra_config": dict({"socket": daemon.socket}, **extra)}


def registered_groups(eng):
    return eng.worker_stats[0].get("registered_groups", 0)


def prompt(seed, n):
    return [(seed * 131 + i * 31 + 7) % tiny_vllm.VOCAB for i in range(n)]


def reference_outputs(prompts, max_tokens=4, **kw):
    """The same engine without kvtier: what every run must produce."""
    with tiny_vllm.TinyEngine(kv_transfer_config=None, **kw) as eng:
        return eng.generate(prompts, max_tokens)


@both_paths
def test_reuse_is_bit_exact_and_only_full_blocks_before_the_last_token(daemon):
    shared = prompt(1, 100)
    first, second = {"a": shared + [1, 2, 3]}, {"b": shared + [4, 5, 6, 7, 8]}
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        assert eng.generate(first) == reference_outputs(first)
        assert eng.scheduler_stats["offered_tokens"] == 0, "an empty kvtier offers nothing"
        stored = eng.worker_stats[0]["saved_blocks"]
        # 103 prompt tokens + 4 outputs = 107 tokens computed: 6 full blocks
        assert stored == 6, stored
        assert eng.mismatches == 0
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        out = eng.generate(second)
        assert out == reference_outputs(second)
        # the shared 100 tokens hold 6 full blocks: 96 tokens load, the rest computes
        assert eng.scheduler_stats["offered_tokens"] == 96
        assert eng.worker_stats[0]["loaded_blocks"] == 6
        assert eng.mismatches == 0, "the loaded pages are not what recomputing gives"
        assert registered_groups(eng) == (0 if tiny_vllm.CACHE_MEMORY == "tensor" else 1)


def test_a_prompt_wholly_cached_still_computes_its_last_token(daemon):
    p = prompt(2, 64)  # exactly 4 blocks
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.generate({"a": p})
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        assert eng.generate({"b": p}) == reference_outputs({"b": p})
        assert eng.scheduler_stats["offered_tokens"] == 48, "block 4 holds the last prompt token: computed"
        assert eng.mismatches == 0


def test_the_page_check_catches_a_wrong_page(daemon):
    """The bit-exact check every other test relies on does fail on a wrong byte."""
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.add_request("a", prompt(3, 40), 3)
        eng.step()
        eng.corrupt_next = {"block": eng.blocks["a"][0][0]}
        eng.run()
        assert eng.mismatches > 0


def test_lookups_are_side_effect_free_and_salted(daemon):
    p = prompt(4, 80)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.generate({"a": p})
        r = tiny_vllm.Request("x", p + [9], 4, BS)
        before = daemon.status()
        answers = {eng.connector.get_num_new_matched_tokens(r, 0) for _ in range(20)}
        assert answers == {(80, False)}
        after = daemon.status()
        for key in ("blocks", "leases"):
            if key in before.get("host", {}):
                assert before["host"][key] == after["host"][key]
        salted = tiny_vllm.Request("y", p + [9], 4, BS, cache_salt="tenant-b")
        assert eng.connector.get_num_new_matched_tokens(salted, 0) == (0, False), \
            "vLLM puts cache_salt in the first block's hash: another salt shares nothing"
        # never allocated: no update_state_after_alloc, and nothing pinned or planned
        T = tiny_vllm.types()
        assert eng.connector.build_connector_meta(
            tiny_vllm.scheduler_output(T, [], tiny_vllm.empty_cached(T), {}, set(), set())).loads == []


def test_each_request_is_asked_once_with_its_whole_chain(daemon):
    """kvtierd's policies and hit counters learn from each
    request's ask. vLLM's scheduler probes a request's chain, again and again
    while it waits, and the worker leases only the blocks it loads: the first
    probe is the ask, misses included; the lease and the later probes are not."""
    shared = prompt(5, 100)
    before = daemon.status()["stats"]
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.generate({"a": shared + [1, 2, 3]})       # 6 blocks asked, none there
        r = tiny_vllm.Request("w", shared + [4, 5, 6, 7, 8], 4, BS)
        for _ in range(5):                             # a request that waits
            assert eng.connector.get_num_new_matched_tokens(r, 0) == (96, False)
        eng.generate({"b": shared + [9, 10]})         # 6 asked, 6 found and loaded
        assert eng.worker_stats[0]["loaded_blocks"] == 6
    after = daemon.status()["stats"]
    d = {k: after[k] - before[k] for k in ("lookups", "lookup_hits", "tokens_queried", "tokens_hit", "probes")}
    assert d["lookups"] == 3, d                    # a, w once, b; not b's lease
    assert d["tokens_queried"] == 3 * 6 * BS, d    # each whole chain, misses included
    assert d["tokens_hit"] == 2 * 6 * BS, d        # w and b found the 6 blocks a stored
    assert d["lookup_hits"] == 2, d
    assert d["probes"] == 4, d                     # w's four asks again


def test_every_full_attention_group_is_asked_and_an_empty_lookup_never_sent():
    """With two full-attention groups, the ask names each group's whole chain
    even where an earlier group found nothing; a later probe stops at the
    first group that holds nothing instead of sending it an empty lookup
    (kvtierd refuses one, and the connector would drop its clients)."""
    class Probe:
        def __init__(self, hits):
            self.hits, self.calls = hits, []

        def lookup(self, keys, lease=False, ask=None):
            assert keys, "an empty lookup"
            self.calls.append((len(keys), ask))
            n = min(self.hits, len(keys))
            return type("R", (), {"hit_blocks": n, "recompute_blocks": 0, "tiers": ["host"] * n})()

    conn = object.__new__(kv_vllm.KvtierConnector)
    conn._block_size = BS
    conn._opts = type("Opts", (), {"always_load": False})()
    conn.stats = {"declined_by_cost_tokens": 0}
    conn._groups = [kv_vllm.GroupInfo(g, "full", BS, 0, 4096, [], "") for g in range(2)]
    g0, g1 = Probe(0), Probe(5)
    assert conn._present_all([[g0], [g1]], list(range(6)), 0, 6, ask=True) == (0, False, ())
    assert (g0.calls, g1.calls) == ([(6, True)], [(6, True)]), "both groups asked, each its whole chain"
    assert conn._present_all([[g0], [g1]], list(range(6)), 0, 6) == (0, False, ())
    assert (g0.calls[1:], g1.calls[1:]) == ([(6, None)], []), "group 1 is not sent an empty probe"


def test_only_the_groups_offered_blocks_priced_recompute_prefetch_first():
    """With always_load, blocks kvtierd prices "recompute" are offered; they
    are in no lease until prefetched. The plan names the groups whose offer
    takes them in (their worker parts prefetch, then lease once); a group
    whose offer ends before them, or that has none, leases at once."""
    class Probe:
        def __init__(self, hits, recompute):
            self.hits, self.recompute = hits, recompute

        def lookup(self, keys, lease=False, ask=None):
            n = min(self.hits, len(keys))
            r = min(self.recompute, len(keys) - n)
            return type("R", (), {"hit_blocks": n, "recompute_blocks": r, "tiers": ["host"] * (n + r)})()

        def lookup_async(self, keys, lease=False, ask=None):  # tensor parallel: every rank's at once
            r = self.lookup(keys, lease, ask)
            return type("Op", (), {"wait": lambda _self, timeout: r})()

    conn = object.__new__(kv_vllm.KvtierConnector)
    conn._block_size = BS
    conn._opts = type("Opts", (), {"always_load": True, "load_timeout_s": 1.0})()
    conn.stats = {"declined_by_cost_tokens": 0}
    conn._groups = [kv_vllm.GroupInfo(g, "full", BS, 0, 4096, [], "") for g in range(3)]
    # group 0: 6 held; group 1: 2 held and 4 priced; group 2: 6 held
    assert conn._present_all([[Probe(6, 0)], [Probe(2, 4)], [Probe(6, 0)]], list(range(6)), 0, 6) == (6, False, (1,))
    # two ranks of group 0, one of which holds the tail only priced
    assert conn._present_all([[Probe(6, 0), Probe(3, 3)], [Probe(6, 0)], [Probe(6, 0)]],
                             list(range(6)), 0, 6) == (6, False, (0,))
    # group 1's priced blocks lie past where group 0's offer ends
    assert conn._present_all([[Probe(2, 0)], [Probe(2, 4)], [Probe(6, 0)]], list(range(6)), 0, 6) == (2, False, ())
    conn._opts.always_load = False  # the cost model declines them: nothing priced is offered
    assert conn._present_all([[Probe(6, 0)], [Probe(2, 4)], [Probe(6, 0)]], list(range(6)), 0, 6) == (2, False, ())


def test_blocks_that_failed_to_load_are_not_offered_again_to_that_request(daemon):
    """vLLM asks again for a request whose load failed; offering the same
    blocks again could fail again, forever."""
    p = prompt(5, 100)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.generate({"a": p})
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        c = eng.connector
        r = tiny_vllm.Request("x", p + [1], 4, BS)
        assert c.get_num_new_matched_tokens(r, 0) == (96, False)
        T = tiny_vllm.types()
        c.update_state_after_alloc(r, T.KVCacheBlocks(([11, 12, 13, 14, 15, 16, 17],)), 96)
        c.update_connector_output(T.KVConnectorOutput(finished_sending=None, finished_recving=None,
                                                      invalid_block_ids={13}))  # the third block failed
        assert c.get_num_new_matched_tokens(r, 0) == (32, False), "only the blocks before the failed one"
        other = tiny_vllm.Request("y", p + [2], 4, BS)
        assert c.get_num_new_matched_tokens(other, 0) == (96, False), "another request is not held back"
        c.request_finished(r, [])
        assert c.get_num_new_matched_tokens(r, 0) == (96, False), "forgotten with the request"


@both_paths
def test_preemption_and_resume_reload_what_was_saved(daemon):
    prompts = {f"r{i}": prompt(10 + i, 90) for i in range(4)}
    ref = reference_outputs(prompts, max_tokens=24, num_blocks=200)
    # 28 pages cannot hold four requests of 7 blocks: the scheduler preempts
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), num_blocks=29, max_batched_tokens=48) as eng:
        out = eng.generate(prompts, max_tokens=24)
        assert sum(r.num_preemptions for r in eng.requests.values()) > 0, "the test did not preempt"
        assert out == ref
        assert eng.mismatches == 0
        assert eng.scheduler_stats["offered_tokens"] > 0, "a resumed request reloads its saved blocks"


@both_paths
def test_abort_mid_prefill_and_mid_async_load(daemon):
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), max_batched_tokens=32) as eng:
        total_free = len(eng.free)
        eng.add_request("a", prompt(20, 120), 4)
        eng.step()
        eng.abort("a")
        eng.add_request("b", prompt(21, 60), 4)
        eng.run()
        assert len(eng.free) == total_free, "every page went back"
        assert eng.mismatches == 0
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.generate({"c": prompt(22, 96)})
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon, load_mode="async")) as eng:
        total_free = len(eng.free)
        eng.add_request("d", prompt(22, 96) + [5], 4)
        held = []

        def abort_while_loading(engine, so):
            if engine.requests["d"].status == tiny_vllm.RequestStatus.WAITING_FOR_REMOTE_KVS:
                engine.abort("d")     # vLLM keeps its pages until the workers report the load
                held.append(total_free - len(engine.free))
                engine.before_execute = None

        eng.before_execute = abort_while_loading
        eng.step()
        assert held == [6], "d's pages (the 96 loaded tokens) were freed while the load wrote them"
        deadline = time.time() + 20
        while len(eng.free) != total_free and time.time() < deadline:
            eng.step()        # the load finishes on a worker; its report frees them
        assert len(eng.free) == total_free, "the load's report never freed them"
        assert eng.generate({"e": prompt(22, 96) + [6]}) == reference_outputs({"e": prompt(22, 96) + [6]})
        assert eng.mismatches == 0


@both_paths
def test_asynchronous_loads_finish_through_get_finished(daemon):
    p = prompt(23, 70)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.generate({"a": p})
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon, load_mode="async")) as eng:
        assert eng.generate({"b": p + [1]}) == reference_outputs({"b": p + [1]})
        assert eng.scheduler_stats["async_loads"] == 1
        assert eng.worker_stats[0]["loaded_blocks"] == 4
        assert eng.mismatches == 0


def test_two_engines_share_a_prefix_while_both_run(daemon):
    shared = prompt(30, 128)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as e1, \
            tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as e2:
        assert e1.generate({"a": shared + [1]}) == reference_outputs({"a": shared + [1]})
        assert e2.generate({"b": shared + [2]}) == reference_outputs({"b": shared + [2]})
        assert e2.scheduler_stats["offered_tokens"] == 128
        assert e1.mismatches == 0 and e2.mismatches == 0


@both_paths
def test_a_daemon_killed_mid_load_is_a_load_error_and_the_engine_recomputes(daemon):
    p1, p2 = prompt(40, 64), prompt(41, 64)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.generate({"a": p1, "b": p2})
    prompts = {"c": p1 + [1], "d": p2 + [2]}
    ref = reference_outputs(prompts)
    killed = {}

    def kill_when_d_loads(engine, so):
        meta = so.kv_connector_metadata
        if any(load.req_id == "d" for load in meta.loads) and not killed:
            killed["blocks"] = {b for load in meta.loads if load.req_id == "d" for r in load.ranges
                                for b in r.block_ids}
            killed["c_blocks"] = set(engine.blocks["c"][0])
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait(10)

    # c loads while the daemon lives; d, added a step later, meets a dead daemon
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon)) as eng:
        eng.before_execute = kill_when_d_loads
        eng.add_request("c", prompts["c"], 4)
        eng.step()
        eng.add_request("d", prompts["d"], 4)
        eng.run()
        out = {k: eng.outputs[k] for k in prompts}
        assert killed, "d never loaded"
        assert out == ref
        assert eng.mismatches == 0
        assert eng.invalid_reported == killed["blocks"], "exactly d's blocks are reported"
        assert not (eng.invalid_reported & killed["c_blocks"])
        assert eng.worker_stats[0]["loaded_blocks"] == 4, "c's blocks loaded"
        assert eng.worker_stats[0]["load_errors"] == 4


def _nvme_daemon(make_daemon):
    return make_daemon('[tiers.host]\ncapacity = "1MiB"\n[tiers.nvme]\ncapacity = "64MiB"\n'
                       'segment_bytes = "4MiB"\n[cost_model]\ndecide = false\n')


@both_paths
def test_a_corrupted_block_is_recomputed_never_used(make_daemon):
    d = _nvme_daemon(make_daemon)
    kw = dict(head_dim=64)  # blocks of 64 KiB: 16 fill the host tier
    filler = {f"f{i}": prompt(60 + i, 160) for i in range(4)}
    p = prompt(50, 96)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(d), num_blocks=256, max_batched_tokens=256, **kw) as eng:
        eng.generate({"a": p})
        eng.generate(filler)  # pushes a's blocks out of the 1 MiB host tier: NVMe only
    r = tiny_vllm.Request("x", p + [1], 4, BS)
    client_tiers = None
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(d), **kw) as eng:
        assert eng.connector.get_num_new_matched_tokens(r, 0) == (96, True), "on NVMe: loaded asynchronously"
        client_tiers = eng.connector._lookup_clients[0][0].lookup(
            [kv_vllm.block_key(h) for h in r.block_hashes[:6]]).tiers
    assert set(client_tiers) == {"nvme"}, client_tiers
    slabs = glob.glob(os.path.join(d.dir, "data", "nvme", "*.kvt"))
    assert slabs
    with open(slabs[0], "r+b") as f:  # flip a byte in every written 4 KiB page past the slab header
        data = bytearray(f.read())
        for off in range(64 * 1024, len(data), 4096):
            if any(data[off:off + 4096]):
                data[off + 2048] ^= 0x5A
        f.seek(0)
        f.write(data)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(d), **kw) as eng:
        out = eng.generate({"x": p + [1]})
        assert out == reference_outputs({"x": p + [1]}, **kw)
        assert eng.invalid_reported, "the corrupted blocks were not reported"
        assert eng.worker_stats[0]["load_errors"] > 0
        assert eng.mismatches == 0, "a corrupted block reached the engine's pages"


@both_paths
def test_the_cost_model_declines_blocks_slower_to_load_than_to_recompute(make_daemon, tmp_path):
    # The daemon prices blocks of the tiny model's shape (its config.json);
    # recomputing is made nearly free and NVMe very slow: NVMe blocks are
    # "recompute" in every lookup, whatever the daemon measures of the disk.
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 2,
                               "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 256,
                               "torch_dtype": "float32"}))
    d = make_daemon('[tiers.host]\ncapacity = "1MiB"\n[tiers.nvme]\ncapacity = "64MiB"\nsegment_bytes = "4MiB"\n'
                    f'[cost_model]\nmodel_config = "{cfg}"\nprefill_tflops = 1000000\nnvme_read_gbps = 0.001\n'
                    'nvme_read_latency_us = 10000000\n')
    kw = dict(head_dim=64)
    p = prompt(55, 96)
    # The tiny engine is slow: its steps, fitted, would make recomputing dear.
    quiet = dict(report_prefill=False)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(d, **quiet), num_blocks=256, max_batched_tokens=256, **kw) as eng:
        eng.generate({"a": p})
        eng.generate({f"f{i}": prompt(65 + i, 160) for i in range(4)})  # a's blocks: NVMe only
    ref = reference_outputs({"x": p + [1]}, **kw)
    r = tiny_vllm.Request("x", p + [1], 4, BS)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(d, **quiet), **kw) as eng:
        assert eng.connector.get_num_new_matched_tokens(r, 0) == (0, False), "slower to load: not offered"
        assert eng.connector.stats["declined_by_cost_tokens"] >= 96
        assert eng.generate({"x": p + [1]}) == ref
        assert eng.worker_stats[0]["loaded_blocks"] == 0
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(d, always_load=True, **quiet), **kw) as eng:
        assert eng.connector.get_num_new_matched_tokens(r, 0) == (96, True), "always_load overrides the model"
        assert eng.generate({"x": p + [1]}) == ref
        assert eng.worker_stats[0]["loaded_blocks"] == 6
        assert eng.mismatches == 0
        # Blocks priced "recompute" are in no lease until prefetched: the
        # worker prefetches first and leases once, for each lease counts
        # its blocks as used (two would make one request's use two).
        assert eng.worker_stats[0]["prefetched_parts"] == 1
        assert eng.worker_stats[0]["leased_lookups"] == 1


@both_paths
def test_hybrid_model_keeps_a_sliding_window_group_apart_and_within_its_window(daemon):
    w = 32
    shared = prompt(70, 128)
    kw = dict(sliding_window=w)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), **kw) as eng:
        eng.generate({"a": shared + [1]})
        assert eng.mismatches == 0
    ref = reference_outputs({"b": shared + [2]}, **kw)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), **kw) as eng:
        assert eng.generate({"b": shared + [2]}) == ref
        assert eng.scheduler_stats["offered_tokens"] == 128
        # full attention loads 8 blocks; the window of 32 tokens after 128 needs blocks 6 and 7
        assert eng.worker_stats[0]["loaded_blocks"] == 8 + 2
        assert eng.mismatches == 0
        assert registered_groups(eng) == (0 if tiny_vllm.CACHE_MEMORY == "tensor" else 2)
        sw = eng.connector._lookup_clients[1][0]
        keys = [kv_vllm.block_key(h) for h in tiny_vllm.Request("z", shared + [3], 4, BS).block_hashes]
        r = tiny_vllm.Request("z", shared + [3], 4, BS)
        assert sw.invalidate(keys[0:2]) == 2          # outside the window: not needed
        assert eng.connector.get_num_new_matched_tokens(r, 0) == (128, False)
        assert sw.invalidate(keys[7:8]) == 1          # inside it: the offer stops before
        n, _ = eng.connector.get_num_new_matched_tokens(r, 0)
        assert n < 128 and n % BS == 0, n


@both_paths
def test_tensor_parallel_offers_only_what_every_rank_holds(daemon):
    shared = prompt(80, 96)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), tp=2) as eng:
        eng.generate({"a": shared + [1]})
        assert eng.worker_stats[0]["saved_blocks"] == 6 and eng.worker_stats[1]["saved_blocks"] == 6
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), tp=2) as eng:
        assert eng.generate({"b": shared + [2]}) == reference_outputs({"b": shared + [2]}, tp=2)
        assert eng.scheduler_stats["offered_tokens"] == 96
        assert eng.mismatches == 0
        r = tiny_vllm.Request("z", shared + [3], 4, BS)
        keys = [kv_vllm.block_key(h) for h in r.block_hashes]
        assert eng.connector._lookup_clients[0][1].invalidate(keys[3:4]) == 1   # rank 1 loses block 3
        assert eng.connector.get_num_new_matched_tokens(r, 0) == (48, False)


def test_a_hybrid_models_requests_are_asked_once_each(daemon):
    """A sliding-window group's leases name only its window's hits: they are
    not asks, so a request is counted (and taught) once, by its full-attention
    group's ask, whether it hit or not."""
    shared = prompt(70, 128)
    kw = dict(sliding_window=32)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), **kw) as eng:
        eng.generate({"a": shared + [1]})
    before = daemon.status()["stats"]
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), **kw) as eng:
        eng.generate({"b": shared + [2]})        # hits: 8 full-attention blocks + the window's 2
        assert eng.worker_stats[0]["loaded_blocks"] == 8 + 2
        eng.generate({"c": prompt(99, 130)})     # misses
    after = daemon.status()["stats"]
    d = {k: after[k] - before[k] for k in ("lookups", "lookup_hits", "blocks_hit")}
    assert d == {"lookups": 2, "lookup_hits": 1, "blocks_hit": 8}, d


def test_bad_configuration_is_refused_with_the_reason(daemon):
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config keys"):
        tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon, sokcet="/x"))
    with pytest.raises(ValueError, match="load_mode"):
        tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon, load_mode="sometimes"))
    with pytest.raises(ValueError, match="cache_registration"):
        tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon, cache_registration="maybe"))
    # torch's own memory is in no memfd: it cannot be registered, and
    # "required" says so at start rather than copying behind the user's back
    with pytest.raises(RuntimeError, match="not in CUDA memory or a memfd"):
        tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon, cache_registration="required"), cache_memory="tensor")


def test_a_registered_cache_is_moved_by_the_daemon_and_auto_falls_back_to_copies(daemon):
    """cache_registration "auto" registers a cache kvtierd can map and copies
    one it cannot; blocks are the same bytes either way, so engines on
    either path share them."""
    shared = prompt(95, 96)
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), cache_memory="memfd") as eng:
        assert eng.generate({"a": shared + [1]}) == reference_outputs({"a": shared + [1]})
        assert registered_groups(eng) == 1
        assert eng.worker_stats[0]["saved_blocks"] == 6
    for memory in ("tensor", "memfd"):   # a copying engine and a registered one load what it stored
        with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon), cache_memory=memory) as eng:
            out = eng.generate({"b": shared + [2]})
            assert out == reference_outputs({"b": shared + [2]})
            assert registered_groups(eng) == (1 if memory == "memfd" else 0)
            assert eng.worker_stats[0]["loaded_blocks"] == 6
            assert eng.mismatches == 0
    with tiny_vllm.TinyEngine(kv_transfer_config=ktc(daemon, cache_registration="off"), cache_memory="memfd") as eng:
        eng.generate({"c": shared + [3]})
        assert registered_groups(eng) == 0 and eng.worker_stats[0]["loaded_blocks"] == 6


def test_no_daemon_means_no_offer_not_a_crash(tmp_path):
    missing = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
               "kv_connector_extra_config": {"socket": str(tmp_path / "none.sock")}}
    p = prompt(90, 50)
    with tiny_vllm.TinyEngine(kv_transfer_config=missing) as eng:
        assert eng.generate({"a": p}) == reference_outputs({"a": p})
        assert eng.scheduler_stats["offered_tokens"] == 0
        assert eng.worker_stats[0]["saves_dropped"] > 0
        assert eng.mismatches == 0


@pytest.mark.skipif(not kv_vllm.VLLM_AVAILABLE, reason="vLLM is not importable here (not a Debian package): "
                    "the connector runs on same-shaped stand-ins of its base classes")
def test_real_vllm_loads_the_connector_by_module_path():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    assert issubclass(kv_vllm.KvtierConnector, KVConnectorBase_V1)
