#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Starts a kvtierd (simulated device, no NVMe) and runs the C program
# c_abi_test against it.   tests/client/c_abi_test.sh KVTIERD C_ABI_TEST
set -euo pipefail
kvtierd=${1:?usage: c_abi_test.sh KVTIERD C_ABI_TEST}
program=${2:?usage: c_abi_test.sh KVTIERD C_ABI_TEST}
scratch=$(mktemp -d)
cleanup() {
  if [ -n "${pid:-}" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$scratch"
}
trap cleanup EXIT
mkdir -p "$scratch/run"
printf '[daemon]\nrun_dir = "%s/run"\ndata_dir = "%s/data"\ndevice = "sim"\n[tiers.nvme]\ncapacity = 0\n[metrics]\nenabled = false\n' \
  "$scratch" "$scratch" >"$scratch/kvtierd.toml"
"$kvtierd" --config "$scratch/kvtierd.toml" 2>"$scratch/kvtierd.log" &
pid=$!
for _ in $(seq 600); do [ -S "$scratch/run/kvtierd.sock" ] && break; sleep 0.05; done
[ -S "$scratch/run/kvtierd.sock" ] || { cat "$scratch/kvtierd.log" >&2; echo "FAIL: kvtierd did not start" >&2; exit 1; }
"$program" "$scratch/run/kvtierd.sock" || { tail -20 "$scratch/kvtierd.log" >&2; exit 1; }
