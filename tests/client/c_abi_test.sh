#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Starts a kvtierd (simulated device, no NVMe) and runs the C program
# c_abi_test against it.   tests/client/c_abi_test.sh KVTIERD C_ABI_TEST
set -euo pipefail
kvtierd=${1:?usage: c_abi_test.sh KVTIERD C_ABI_TEST}
program=${2:?usage: c_abi_test.sh KVTIERD C_ABI_TEST}
# shellcheck source=../support/kvtierd.sh
. "$(dirname "${BASH_SOURCE[0]}")/../support/kvtierd.sh"
scratch=$(mktemp -d)
cleanup() {
  kvtierd_stop
  rm -rf "$scratch"
}
trap cleanup EXIT
kvtierd_start "$kvtierd" "$scratch" || exit 1
"$program" "$KVTIERD_SOCK" || { tail -20 "$scratch/kvtierd.log" >&2; exit 1; }
