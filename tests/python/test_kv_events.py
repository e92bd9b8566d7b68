# SPDX-License-Identifier: Apache-2.0
"""KV events for routers ([events]): a subscriber decodes them as vLLM's own
example subscriber does (ZeroMQ SUB: topic, 8-byte big-endian sequence,
msgpack EventBatch; REQ to the replay socket: a start sequence in, batches
out, ending with -1) and checks them against what the daemon did."""
import os
import socket
import time

import numpy as np
import pytest

zmq = pytest.importorskip("zmq", reason="Debian's python3-zmq is needed to subscribe to KV events")
msgpack = pytest.importorskip("msgpack", reason="Debian's python3-msgpack is needed to decode KV events")

import kvtier  # noqa: E402

BT, BB = 16, 4096


def attach(d, **kw):
    return kvtier.Client.attach("events-model", BT, BB, socket=d.socket, kv_dtype="fp16", kv_layout="layer_major", **kw)


def int_hash(key: bytes) -> int:
    """vLLM's default: int.from_bytes(hash, "big") & (2**64 - 1)."""
    return int.from_bytes(key, "big") & ((1 << 64) - 1)


class Subscriber:
    def __init__(self, endpoint, replay=None):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.replay_endpoint = replay
        self.batches = []  # (seq, decoded)

    def drain(self, seconds=1.0, until=None):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.sub.poll(50):
                topic, seq, payload = self.sub.recv_multipart()
                self.batches.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
            elif until is not None and until(self.events()):
                return
        return

    def events(self):
        return [e for _, b in self.batches for e in b["events"]]

    def replay(self, start):
        """Every buffered batch from `start`, then the end marker. A DEALER
        socket: the replay socket answers one request with many messages,
        and a REQ socket (vLLM's example subscriber) takes only the first."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            assert dealer.poll(5000), "no answer from the replay socket"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            n = int.from_bytes(seq, "big", signed=True)
            if n == -1:
                assert payload == b""
                break
            got.append((n, msgpack.unpackb(payload, raw=False)))
        dealer.close(0)
        return got

    def replay_first_as_vllm_example(self, start):
        """vLLM's examples/online_serving/kv_events_subscriber.py: a REQ socket."""
        req = self.ctx.socket(zmq.REQ)
        req.connect(self.replay_endpoint)
        req.send(start.to_bytes(8, "big"))
        assert req.poll(5000)
        seq_bytes, payload = req.recv_multipart()
        req.close(0)
        return int.from_bytes(seq_bytes, "big"), msgpack.unpackb(payload, raw=False)

    def close(self):
        self.sub.close(0)
        self.ctx.term()


def events_config(extra=""):
    return f'[events]\nenabled = true\nbatch_ms = 5\n{extra}'


def stored(events, medium):
    return [h for e in events if e["type"] == "BlockStored" and e["medium"] == medium for h in e["block_hashes"]]


def removed(events, medium):
    return [h for e in events if e["type"] == "BlockRemoved" and e["medium"] == medium for h in e["block_hashes"]]


def test_events_are_off_by_default(daemon):
    assert daemon.status()["events"] == {"enabled": False}
    assert not [f for f in os.listdir(daemon.dir) if "events" in f]


def test_stores_and_removals_arrive_in_vllms_format_and_replay(make_daemon):
    d = make_daemon(events_config())
    ev = d.status()["events"]
    assert ev["enabled"] and len(ev["publishing"]) == 1
    endpoint = ev["publishing"][0]["endpoint"]
    replay = ev["publishing"][0]["replay_endpoint"]
    assert endpoint.startswith("ipc://") and replay.startswith("ipc://")
    sub = Subscriber(endpoint, replay)
    time.sleep(0.3)  # a SUB socket sees only what is sent after it joined
    with attach(d) as c:
        keys = c.compute_keys(np.arange(BT * 4, dtype=np.uint32))
        assert c.store(keys, np.zeros((4, BB), dtype=np.uint8)) == 4
        want = [int_hash(k) for k in keys]
        sub.drain(3, until=lambda evs: len(stored(evs, "CPU")) >= 4)
        evs = sub.events()
        assert stored(evs, "CPU") == want, "one BlockStored per block, medium CPU, vLLM's int hash"
        first = [e for e in evs if e["type"] == "BlockStored"][0]
        assert first == {"type": "BlockStored", "block_hashes": [want[0]], "parent_block_hash": None,
                         "token_ids": [], "block_size": BT, "lora_id": None, "medium": "CPU", "lora_name": None}
        batch = sub.batches[0][1]
        assert set(batch) == {"ts", "events"} and abs(batch["ts"] - time.time()) < 60
        assert c.invalidate(keys[2:]) == 2
        sub.drain(3, until=lambda evs: len(removed(evs, "CPU")) >= 2)
        assert removed(sub.events(), "CPU") == want[2:]
    seqs = [s for s, _ in sub.batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "sequence numbers count batches without gaps"
    # A subscriber that missed the first batch asks for it again.
    got = sub.replay(seqs[0] + 1)
    assert [s for s, _ in got] == seqs[1:]
    assert [b for _, b in got] == [b for _, b in sub.batches[1:]]
    assert sub.replay_first_as_vllm_example(seqs[0] + 1) == sub.batches[1]
    deadline = time.time() + 5  # the publisher reports its counters every second
    while d.status()["events"]["replays"] < 2 and time.time() < deadline:
        time.sleep(0.05)
    st = d.status()["events"]
    assert st["replays"] == 2 and st["dropped"] == 0 and st["events"] >= 6 and st["publishers_up"] == 1
    sub.close()


def test_a_malformed_replay_request_is_counted_not_served(make_daemon):
    d = make_daemon(events_config())
    replay = d.status()["events"]["publishing"][0]["replay_endpoint"]
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay)
    dealer.send_multipart([b"", b"\x00\x01"])          # a 2-byte sequence
    dealer.send_multipart([b"", b"x" * 8, b"extra"])   # four frames at the router
    dealer.send(b"y" * 4096)                           # over the size a request can have
    deadline = time.time() + 5
    while time.time() < deadline and d.status()["events"]["bad_replays"] < 2:
        time.sleep(0.05)
    assert d.status()["events"]["bad_replays"] >= 2
    assert not dealer.poll(300), "a malformed request got an answer"
    dealer.close(0)
    ctx.term()
    with attach(d) as c:  # the daemon serves on
        assert c.ping() is None


def test_demotion_to_nvme_is_a_disk_store_and_a_cpu_removal(make_daemon):
    d = make_daemon(events_config() + '[tiers.host]\ncapacity = "1MiB"\n[tiers.nvme]\ncapacity = "64MiB"\n'
                    'segment_bytes = "4MiB"\n')
    sub = Subscriber(d.status()["events"]["publishing"][0]["endpoint"])
    time.sleep(0.3)
    bb = 64 * 1024
    with kvtier.Client.attach("events-model", BT, bb, socket=d.socket, kv_dtype="fp16",
                              kv_layout="layer_major") as c:
        keys = c.compute_keys(np.arange(BT * 40, dtype=np.uint32))  # 40 blocks of 64 KiB: 2.5x the host tier
        for i in range(0, 40, 4):
            c.store(keys[i:i + 4], np.full((4, bb), i, dtype=np.uint8))
        sub.drain(5, until=lambda evs: len(removed(evs, "CPU")) >= 10 and len(stored(evs, "DISK")) >= 10)
    evs = sub.events()
    on_disk = set(stored(evs, "DISK"))
    gone_from_host = set(removed(evs, "CPU"))
    assert len(gone_from_host) >= 10, "blocks left host memory"
    assert gone_from_host <= on_disk, "every block evicted from host memory went to NVMe first"
    assert set(stored(evs, "CPU")) == {int_hash(k) for k in keys}
    sub.close()


def test_each_tenant_publishes_on_its_own_socket_only_it_may_open(make_daemon):
    uid = os.getuid()
    d = make_daemon(events_config() + f'[[tenants]]\nname = "alice"\nuids = [{uid}]\n'
                    '[[tenants]]\nname = "bob"\nuids = [65534]\ngids = [65534]\n')
    pubs = {p["tenant"]: p for p in d.status()["events"]["publishing"]}
    assert set(pubs) == {"alice", "bob"}
    assert pubs["alice"]["endpoint"] != pubs["bob"]["endpoint"]
    bob_path = pubs["bob"]["endpoint"][len("ipc://"):]
    st = os.stat(bob_path)
    assert oct(st.st_mode & 0o777) == oct(0o660), "bob's socket: bob and his group only"
    if os.getuid() == 0:
        assert (st.st_uid, st.st_gid) == (65534, 65534)
    alice_st = os.stat(pubs["alice"]["endpoint"][len("ipc://"):])
    assert alice_st.st_mode & 0o077 == 0, "alice's socket is hers alone"
    a_sub, b_sub = Subscriber(pubs["alice"]["endpoint"]), Subscriber(pubs["bob"]["endpoint"])
    time.sleep(0.3)
    with attach(d) as c:  # this uid is alice
        keys = c.compute_keys(np.arange(BT * 2, dtype=np.uint32))
        c.store(keys, np.zeros((2, BB), dtype=np.uint8))
    a_sub.drain(3, until=lambda evs: len(stored(evs, "CPU")) >= 2)
    b_sub.drain(0.5)
    assert stored(a_sub.events(), "CPU") == [int_hash(k) for k in keys]
    assert b_sub.events() == [], "bob's subscribers see none of alice's blocks"
    a_sub.close()
    b_sub.close()


def test_a_peer_that_exhausts_one_tenants_publisher_harms_nobody_else(make_daemon):
    """ZeroMQ aborts a process that runs out of descriptors on accept: a
    tenant flooding its own event socket ends its own publisher process
    (restarted), never kvtierd, and the other tenant's events flow on."""
    uid = os.getuid()
    d = make_daemon(events_config("max_connections = 16\n") + f'[[tenants]]\nname = "alice"\nuids = [{uid}]\n'
                    '[[tenants]]\nname = "bob"\nuids = [65534]\n')
    pubs = {p["tenant"]: p for p in d.status()["events"]["publishing"]}
    a_sub = Subscriber(pubs["alice"]["endpoint"])
    bob_path = pubs["bob"]["endpoint"][len("ipc://"):]
    flood = []
    for _ in range(200):  # root may connect to bob's socket; bob could too
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(bob_path)
        except OSError:
            s.close()
            continue
        flood.append(s)
    deadline = time.time() + 10
    while d.status()["events"]["publisher_restarts"] < 1 and time.time() < deadline:
        time.sleep(0.05)
    for s in flood:
        s.close()
    assert d.proc.poll() is None, "kvtierd died"
    assert d.status()["events"]["publisher_restarts"] >= 1, "bob's publisher did not hit its descriptor limit"
    time.sleep(0.3)
    with attach(d) as c:  # alice's events, through it all
        keys = c.compute_keys(np.arange(BT * 2, dtype=np.uint32))
        c.store(keys, np.zeros((2, BB), dtype=np.uint8))
    a_sub.drain(3, until=lambda evs: len(stored(evs, "CPU")) >= 2)
    assert stored(a_sub.events(), "CPU") == [int_hash(k) for k in keys]
    deadline = time.time() + 10
    while d.status()["events"]["publishers_up"] < 2 and time.time() < deadline:
        time.sleep(0.1)
    assert d.status()["events"]["publishers_up"] == 2, "bob's publisher came back"
    a_sub.close()


def test_bytes_hashes_and_a_chosen_tenant(make_daemon):
    d = make_daemon(events_config('block_hash = "bytes"\ntenants = ["default"]\n'))
    sub = Subscriber(d.status()["events"]["publishing"][0]["endpoint"])
    time.sleep(0.3)
    with attach(d) as c:
        keys = c.compute_keys(np.arange(BT, dtype=np.uint32))
        c.store(keys, np.zeros((1, BB), dtype=np.uint8))
    sub.drain(3, until=lambda evs: len(stored(evs, "CPU")) >= 1)
    assert stored(sub.events(), "CPU") == [keys[0]], "block_hash = bytes sends the 32-byte key"
    sub.close()


def test_one_endpoint_for_two_tenants_is_refused(make_daemon):
    with pytest.raises(RuntimeError, match=r"put \{tenant\} in it"):
        make_daemon(events_config('endpoint = "ipc:///tmp/kvtier-one-for-all.sock"\n') +
                    '[[tenants]]\nname = "a"\nuids = [1]\n[[tenants]]\nname = "b"\nuids = [2]\n')


def test_gpu_tier_copies_are_announced_as_gpu(make_daemon):
    """The GPU tier (on the host-simulated device here) keeps copies of blocks
    an engine stores from its registered cache: medium GPU, withdrawn when
    the block goes."""
    from test_client import _paged_cache

    d = make_daemon(events_config() + '[tiers.gpu]\ncapacity = "4MiB"\n')
    sub = Subscriber(d.status()["events"]["publishing"][0]["endpoint"])
    time.sleep(0.3)
    layers, page_tokens, kv_heads, head_dim, pages = 2, 8, 2, 16, 16
    bb = kvtier.kv_block_bytes(layers, 8, kv_heads, head_dim, dtype="f32")
    c = kvtier.Client.attach("py/registered", block_tokens=8, block_bytes=bb, socket=d.socket, kv_dtype="f32",
                             kv_layout="layer_major")
    cache, mem, fd, k_layers, v_layers, region = _paged_cache(layers, pages, page_tokens, kv_heads, head_dim)
    try:
        reg = c.register_kv_cache(layers, page_tokens, kv_heads, head_dim, pages, k_layers, v_layers, [region],
                                  dtype="f32")
        keys = c.compute_keys(np.arange(24, dtype=np.uint32))
        assert c.store_from_cache(reg, keys, [1, 2, 3]) == 3
        want = [int_hash(k) for k in keys]
        sub.drain(3, until=lambda evs: len(stored(evs, "GPU")) >= 3 and len(stored(evs, "CPU")) >= 3)
        assert stored(sub.events(), "GPU") == want
        assert stored(sub.events(), "CPU") == want
        assert c.invalidate(keys) == 3
        sub.drain(3, until=lambda evs: len(removed(evs, "GPU")) >= 3)
        assert sorted(removed(sub.events(), "GPU")) == sorted(want)
        c.unregister_kv_cache(reg)
    finally:
        c.close()
        del cache
        mem.close()
        os.close(fd)
        sub.close()


def test_abstract_and_shared_endpoints_are_refused(make_daemon):
    with pytest.raises(RuntimeError, match="ABSOLUTE/PATH"):
        make_daemon(events_config('endpoint = "ipc://@kv-{tenant}"\n'), sub="abstract")  # no file: no permissions
    with pytest.raises(RuntimeError, match="which another socket has"):
        make_daemon(events_config('endpoint = "ipc:///tmp/kvtier-ev-{tenant}.sock"\n'
                                  'replay_endpoint = "ipc:///tmp/kvtier-ev-{tenant}.sock"\n'), sub="shared")
