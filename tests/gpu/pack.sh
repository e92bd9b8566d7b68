#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs what tests/gpu/run.sh --pack needs into DIR (default .gpu-pack, which
# git ignores): release builds of the CUDA tests, the kernel tests, the
# tiny engine's CUDA test, kvtierd (which that test and tiny-engine-bench
# start), kvtier-bench and tiny-engine-bench, with every shared library they load except the C
# library and the NVIDIA driver. For GPU machines that cannot install Debian packages:
# carry DIR there and run `tests/gpu/run.sh --pack DIR`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
dir=${1:-.gpu-pack}
scripts/install-deps
cmake --preset release -DKVTIER_BUILD_TESTS=ON >/dev/null
cmake --build --preset release -j "$(nproc)" --target cuda_device_test cuda_kernels_test kv_kernels_test kv_math_test \
  tiny_engine_cuda_test kvtier-bench tiny-engine-bench kvtierd
rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
bins=(build/release/tests/cuda_device_test build/release/tests/cuda_kernels_test build/release/tests/kv_kernels_test
      build/release/tests/kv_math_test build/release/tests/tiny_engine_cuda_test build/release/tools/kvtier-bench
      build/release/examples/tiny-engine/tiny-engine-bench
      build/release/daemon/kvtierd)
cp "${bins[@]}" "$dir/bin/"
strip "$dir"/bin/*
for b in "${bins[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda)\.so' | while read -r lib; do
  cp -L "$lib" "$dir/lib/"
done
du -sh "$dir"
