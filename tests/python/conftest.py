# SPDX-License-Identifier: Apache-2.0
"""Fixtures: a kvtierd child process with its config in a temp folder (as
tools/common/daemon_process.cc runs one for the C++ tests)."""
import json
import os
import signal
import socket
import subprocess
import time

import pytest


# The daemons' device backend: the host-simulated device, unless a GPU run
# (tests/gpu/run.sh) asks for "cuda".
DEVICE = os.environ.get("KVTIER_TEST_DEVICE", "sim")


class Daemon:
    def __init__(self, tmp, extra=""):
        self.dir = str(tmp)
        self.socket = os.path.join(self.dir, "kvtierd.sock")
        self.admin = os.path.join(self.dir, "kvtierd-admin.sock")
        cfg = os.path.join(self.dir, "kvtierd.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nrun_dir = "{self.dir}"\ndata_dir = "{self.dir}/data"\nlog_level = "debug"\n'
                    f'device = "{DEVICE}"\n[metrics]\nenabled = false\n{extra}')
            if "[tiers.nvme]" not in extra:
                f.write("[tiers.nvme]\ncapacity = 0\n")
        self.log = open(os.path.join(self.dir, "kvtierd.log"), "w")
        binary = os.environ.get("KVTIERD_BIN", "kvtierd")
        self.proc = subprocess.Popen([binary, "--config", cfg], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kvtierd exited at start: " + open(self.log.name).read())
            if self._admin_answers():
                return
            time.sleep(0.01)
        raise RuntimeError("kvtierd did not answer in 30 s")

    def _admin_answers(self):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self.admin)
                s.sendall(b'{"cmd": "ping"}\n')
                return b'"ok":true' in s.recv(4096)
        except OSError:
            return False

    def status(self):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(self.admin)
            s.sendall(b'{"cmd": "status"}\n')
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        answer = json.loads(data)
        return answer.get("status", answer)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path)
    yield d
    d.stop()


@pytest.fixture
def make_daemon(tmp_path):
    started = []

    def make(extra="", sub="d"):
        path = tmp_path / f"{sub}{len(started)}"
        path.mkdir()
        started.append(Daemon(path, extra))
        return started[-1]

    yield make
    for d in started:
        d.stop()
