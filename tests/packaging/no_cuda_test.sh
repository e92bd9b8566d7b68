#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvtier installed on a node without the CUDA toolkit: the installed kvtierd,
# libkvtier and the Python module link no CUDA library (the runtime is linked
# in statically and finds the driver with dlopen), and with the toolkit's
# folder hidden (an empty tmpfs mounted over it in a private mount namespace)
# the installed daemon starts, says why it uses the simulated device, and
# serves an installed client's traffic byte-exactly.
#   tests/packaging/no_cuda_test.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: no_cuda_test.sh BUILD_DIR}
build=$(cd "$build" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
grep -q '^KVTIER_HAVE_CUDA:INTERNAL=ON' "$build/CMakeCache.txt" 2>/dev/null \
  || grep -q 'KVTIER_HAVE_CUDA=1' "$build/compile_commands.json" 2>/dev/null \
  || skip "this build has no CUDA pieces: nothing to hide"
[ "$(id -u)" = 0 ] || skip "hiding the toolkit needs a mount namespace (root; CI runs as root)"
command -v unshare >/dev/null || skip "no unshare (util-linux)"
unshare --mount true 2>/dev/null || skip "unshare --mount is not permitted here"
drivers=$(ldconfig -p 2>/dev/null || true)
! grep -q 'libcuda\.so\.1 ' <<<"$drivers" || skip "this host has the NVIDIA driver (libcuda.so.1): kvtierd would use the GPU"

scratch=$(mktemp -d)
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT
root=$scratch/root
DESTDIR=$root cmake --install "$build" >/dev/null || fail "cmake --install failed"
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
libdir=$root/usr/lib/$multiarch
pydir=$root/usr/lib/python3/dist-packages
export LD_LIBRARY_PATH=$libdir

# Link time: nothing of CUDA.
for f in "$root/usr/bin/kvtierd" "$libdir/libkvtier.so.0" "$root/usr/bin/kvtierctl" "$root/usr/bin/kvtier-replay" \
         "$pydir"/kvtier/_kvtier*.so; do
  [ -e "$f" ] || fail "the install lacks $f"
  deps=$(ldd "$f")
  if grep -qi -e cuda -e nccl <<<"$deps"; then
    grep -i -e cuda -e nccl <<<"$deps" >&2
    fail "$(basename "$f") links a CUDA library"
  fi
  if grep -q 'not found' <<<"$deps"; then
    grep 'not found' <<<"$deps" >&2
    fail "$(basename "$f") lacks a library"
  fi
done
echo "ok: the installed kvtierd, libkvtier, tools and Python module link no CUDA library"

# Run time, with the toolkit hidden.
cuda=$(readlink -f /usr/local/cuda 2>/dev/null || true)
mkdir -p "$scratch/run"
cat >"$scratch/kvtierd.toml" <<TOML
[daemon]
run_dir = "$scratch/run"
data_dir = "$scratch/data"
device = "auto"
[tiers.nvme]
capacity = 0
[metrics]
enabled = false
TOML
cat >"$scratch/hidden.sh" <<'SH'
set -euo pipefail
scratch=$1 root=$2 pydir=$3 cuda=$4
if [ -n "$cuda" ] && [ -d "$cuda" ]; then
  mount -t tmpfs -o size=1m,mode=755 kvtier-no-cuda "$cuda"
  [ -z "$(ls -A "$cuda")" ] || { echo "FAIL: $cuda is still visible" >&2; exit 1; }
fi
"$root/usr/bin/kvtierd" --config "$scratch/kvtierd.toml" 2>"$scratch/kvtierd.log" &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true' EXIT
for _ in $(seq 300); do [ -S "$scratch/run/kvtierd.sock" ] && break; sleep 0.05; done
[ -S "$scratch/run/kvtierd.sock" ] || { cat "$scratch/kvtierd.log" >&2; echo "FAIL: kvtierd did not start" >&2; exit 1; }
"$root/usr/bin/kvtier-replay" --socket "$scratch/run/kvtierd.sock" --conversations 4 --turns 3 --sessions 2 \
  --block-bytes 16KiB --json >"$scratch/replay.json"
PYTHONPATH=$pydir /usr/bin/python3 - "$scratch/run/kvtierd.sock" <<'PY'
import sys
import numpy as np
import kvtier
c = kvtier.Client.attach("no-cuda/model", 16, 4096, socket=sys.argv[1], kv_dtype="f16", kv_layout="layer_major")
keys = c.compute_keys(np.arange(64, dtype=np.uint32))
data = np.random.default_rng(5).integers(0, 255, (len(keys), 4096), dtype=np.uint8)
assert c.store(keys, data) == len(keys)
hit = c.lookup(keys, lease=True)
assert hit.hit_blocks == len(keys), hit
views = c.load(hit.lease, keys)
assert all(bytes(v) == data[i].tobytes() for i, v in enumerate(views)), "a block came back different"
c.release(hit.lease)
print("python client: stored, found and loaded", len(keys), "blocks byte-exactly")
PY
"$root/usr/bin/kvtierctl" --socket "$scratch/run/kvtierd-admin.sock" status --json >"$scratch/status.json"
kill -TERM $pid
wait $pid
trap - EXIT
SH
unshare --mount --propagation private -- bash "$scratch/hidden.sh" "$scratch" "$root" "$pydir" "$cuda" \
  || { cat "$scratch/kvtierd.log" >&2 2>/dev/null; fail "the installed kvtier did not serve with the toolkit hidden"; }
/usr/bin/python3 - "$scratch/replay.json" "$scratch/status.json" <<'PY' || fail "the replay or the status answer is wrong"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["requests"] == 12 and r["verify_failures"] == 0 and r["error"] == "" and r["blocks_loaded"] > 0, r
s = json.load(open(sys.argv[2]))
assert s["tiers"][0]["tier"] == "host", s["tiers"]
PY
grep -q 'backend=sim' "$scratch/kvtierd.log" || fail "kvtierd did not say which device backend it chose"
grep -q 'libcuda.so.1 cannot be loaded' "$scratch/kvtierd.log" \
  || { grep 'event=device' "$scratch/kvtierd.log" >&2; fail "kvtierd did not say why it fell back to the simulated device"; }
echo "ok: with $cuda hidden, the installed kvtierd fell back to the simulated device, saying why, and served" \
     "kvtier-replay (12 requests, every byte verified), the Python client and kvtierctl"
