#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU checks in one go, for a machine with an NVIDIA GPU: builds (release,
# with tests), runs the CUDA tests (ctest label "gpu"), `kvtier-bench gpu` and
# `tiny-engine-bench engine` (the tiny engine on the GPU),
# and prints every figure. A few minutes of device time.
#
#   tests/gpu/run.sh                 build here (installs Debian packages), then run
#   tests/gpu/run.sh --pack DIR      run binaries packed by tests/gpu/pack.sh (for a
#                                    GPU machine that cannot install packages)
#   OUT=DIR tests/gpu/run.sh ...     also write the log and the figures' JSON to DIR
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
pack=""
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) pack=$2; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "tests/gpu/run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
out=${OUT:-}
log() { if [ -n "$out" ]; then tee -a "$out/gpu.log"; else cat; fi; }

{
  echo "== kvtier gpu: $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "(no nvidia-smi)"
} | log

status=0
if [ -n "$pack" ]; then
  pack=$(cd "$pack" && pwd)
  export LD_LIBRARY_PATH="$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  bin=$pack/bin
  export KVTIERD_BIN=$bin/kvtierd
  for t in cuda_device_test cuda_kernels_test kv_kernels_test kv_math_test tiny_engine_cuda_test; do
    echo "== kvtier gpu: $t" | log
    "$bin/$t" 2>&1 | log
    rc=${PIPESTATUS[0]}
    echo "== kvtier gpu: $t exit $rc" | log
    [ "$rc" -eq 0 ] || status=1
  done
  bench=$bin/kvtier-bench
  engine_bench=$bin/tiny-engine-bench
else
  scripts/install-deps
  cmake --preset release -DKVTIER_BUILD_TESTS=ON >/dev/null && cmake --build --preset release -j "$(nproc)" 2>&1 | tail -3 | log
  (cd build/release && ctest -L gpu --output-on-failure -V 2>&1) | log
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  (cd build/release && ctest -R 'kv_(math|kernels)_test' --output-on-failure 2>&1) | log
  # The vLLM connector with the engine's cache in GPU memory, registered with
  # kvtierd through CUDA IPC (skips where torch has no CUDA).
  echo "== kvtier gpu: vLLM connector, CUDA cache" | log
  (cd tests/python && KVTIER_TEST_DEVICE=cuda PYTHONPATH="$root/build/release/python" \
     KVTIERD_BIN="$root/build/release/daemon/kvtierd" python3 -m pytest -q -rs test_vllm_connector.py \
     -k "stand-ins and cuda" 2>&1) | log
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  bench=build/release/tools/kvtier-bench
  engine_bench=build/release/examples/tiny-engine/tiny-engine-bench
fi

echo "== kvtier gpu: kvtier-bench gpu" | log
"$bench" gpu 2>&1 | log
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || status=1
if [ -n "$out" ]; then "$bench" gpu --json --quick > "$out/gpu-bench-quick.json" 2>&1; fi
# The tiny engine on the GPU: TTFT with a cached prefix vs none (CPU rows too).
echo "== kvtier gpu: tiny-engine-bench engine" | log
kvtierd_bin=${KVTIERD_BIN:-build/release/daemon/kvtierd}
"$engine_bench" engine --kvtierd "$kvtierd_bin" 2>&1 | log
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || status=1
echo "== kvtier gpu: done, exit $status" | log
exit $status
