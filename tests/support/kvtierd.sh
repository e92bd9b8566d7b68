# SPDX-License-Identifier: Apache-2.0
# Sourced by the shell tests: a kvtierd of their own in a folder.
#   kvtierd_start KVTIERD DIR [EXTRA_TOML]   writes DIR/kvtierd.toml (simulated
#       device, no NVMe, no metrics, sockets in DIR/run, then EXTRA_TOML), starts
#       the daemon, waits for its socket; sets KVTIERD_PID and KVTIERD_SOCK, its
#       log in DIR/kvtierd.log. Returns 1 (log on stderr) when it does not start.
#   kvtierd_stop                             SIGTERM, and waits for it.
kvtierd_start() {
  local bin=$1 dir=$2 extra=${3:-}
  mkdir -p "$dir/run"
  printf '[daemon]\nrun_dir = "%s/run"\ndata_dir = "%s/data"\ndevice = "sim"\n[tiers.nvme]\ncapacity = 0\n[metrics]\nenabled = false\n%s\n' \
    "$dir" "$dir" "$extra" >"$dir/kvtierd.toml"
  "$bin" --config "$dir/kvtierd.toml" 2>"$dir/kvtierd.log" &
  KVTIERD_PID=$!
  KVTIERD_SOCK=$dir/run/kvtierd.sock
  for _ in $(seq 600); do
    [ -S "$KVTIERD_SOCK" ] && return 0
    kill -0 "$KVTIERD_PID" 2>/dev/null || break
    sleep 0.05
  done
  cat "$dir/kvtierd.log" >&2
  echo "FAIL: kvtierd did not start" >&2
  return 1
}

kvtierd_stop() {
  if [ -n "${KVTIERD_PID:-}" ]; then
    kill "$KVTIERD_PID" 2>/dev/null || true
    wait "$KVTIERD_PID" 2>/dev/null || true
    KVTIERD_PID=
  fi
}
