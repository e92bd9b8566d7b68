#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# No secret on a command line or in an environment: another local user reads
# both from /proc (they once read the cluster's admin password from
# `scripts/redis-cluster status` and rewrote a tenant's blocks with it).
# While scripts/redis-cluster starts, reports on, checks, kills, restarts and
# stops a cluster:
#   - a scanner reads every /proc/*/cmdline and /proc/*/environ as fast as
#     it can, keeping each distinct string it saw;
#   - redis-cli and redis-server run through shims on PATH that record their
#     arguments and environment before they exec the real ones, so no
#     short-lived invocation escapes the check.
# Then no password the cluster was given appears in either record.
# Usage: script_secrets_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
for tool in redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed (scripts/install-deps installs it)"; exit 77; }
done
scratch=$(mktemp -d)
scanner=
cleanup() {
  [ -n "$scanner" ] && kill "$scanner" 2>/dev/null || true
  "$src/scripts/redis-cluster" stop "$scratch/cluster" >/dev/null 2>&1 || true
  "$src/scripts/redis-cluster" stop "$scratch/owned" >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The shims.
mkdir -p "$scratch/shims"
for tool in redis-cli redis-server; do
  real=$(command -v "$tool")
  cat >"$scratch/shims/$tool" <<SHIM
#!/bin/sh
{ printf 'argv:'; printf ' %s' "\$0" "\$@"; printf '\n'; env | sed 's/^/env: /'; } >>"$scratch/shim.log"
exec "$real" "\$@"
SHIM
  chmod +x "$scratch/shims/$tool"
done

# The scanner.
python3 - "$scratch/scan.log" "$scratch/stop" <<'PY' &
import os, sys
out, stop = sys.argv[1], sys.argv[2]
seen, sweeps = set(), 0
while not os.path.exists(stop):
    sweeps += 1
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for what in ("cmdline", "environ"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    seen.add(f.read().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:
                pass
with open(out, "w") as f:
    f.write(f"sweeps {sweeps}\n")
    for s in sorted(seen):
        f.write(s + "\n")
PY
scanner=$!

export PATH="$scratch/shims:$PATH"
rc="$src/scripts/redis-cluster"
"$rc" start "$scratch/cluster" --tenant alice --tenant bob >/dev/null
status=$("$rc" status "$scratch/cluster")
grep -q master <<<"$status" || fail "status shows no primary: $status"
for _ in $(seq 50); do "$rc" synced "$scratch/cluster" && break; sleep 0.1; done
"$rc" kill "$scratch/cluster" 0 >/dev/null
"$rc" restart "$scratch/cluster" >/dev/null
"$rc" status "$scratch/cluster" >/dev/null
"$rc" stop "$scratch/cluster" >/dev/null
touch "$scratch/stop"
wait "$scanner"
scanner=

# The test can fail: it saw the scripts' processes.
grep -q "redis-server $scratch/cluster/node0/redis.conf" "$scratch/scan.log" \
  || fail "the scanner never saw a node's command line ($(head -1 "$scratch/scan.log"))"
calls=$(grep -c '^argv: .*redis-cli' "$scratch/shim.log" || true)
[ "$calls" -ge 10 ] || fail "only $calls redis-cli calls went through the shim"

secrets=("$scratch/cluster/admin.pass" "$scratch"/cluster/tenants/*.pass)
[ ${#secrets[@]} -eq 3 ] || fail "expected 3 password files, found ${#secrets[@]}"
for f in "${secrets[@]}"; do
  pw=$(head -1 "$f")
  [ ${#pw} -ge 16 ] || fail "$f holds no password"
  if grep -qF -- "$pw" "$scratch/scan.log"; then fail "$(basename "$f")'s password was on a command line or in an environment in /proc"; fi
  if grep -qF -- "$pw" "$scratch/shim.log"; then fail "$(basename "$f")'s password was passed to redis-cli or redis-server: $(grep -F -- "$pw" "$scratch/shim.log" | sed "s/$pw/<secret>/g" | head -3)"; fi
done
# A folder another user made beforehand: start must refuse it (it once
# wrote the passwords into that user's files, and status sourced the
# cluster.env they could rewrite, as root).
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  chmod 711 "$scratch"  # nobody may pass through to the shared folder, as through /tmp
  mkdir -m 1777 "$scratch/shared"
  trap_dir="$scratch/shared/cluster"
  setpriv --reuid=65534 --regid=65534 --clear-groups sh -c \
    "mkdir -m 777 $trap_dir $trap_dir/tenants && touch $trap_dir/admin.pass && chmod 666 $trap_dir/admin.pass"
  if out=$("$rc" start "$trap_dir" --tenant alice 2>&1); then fail "start accepted a folder of another user: $out"; fi
  grep -q "another user" <<<"$out" || fail "start refused the folder without saying why: $out"
  [ ! -s "$trap_dir/admin.pass" ] || fail "start wrote a password into another user's file"
  # And status never sources a cluster.env someone else could write.
  setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "echo 'touch $scratch/shared/pwned' > $trap_dir/cluster.env"
  "$rc" status "$trap_dir" >/dev/null 2>&1 && fail "status read another user's folder"
  [ ! -e "$scratch/shared/pwned" ] || fail "status ran another user's cluster.env"
  echo "ok: a folder of another user is refused by start and status"
fi
# --owner: a cluster whose owner dies (a test killed by a sanitizer) stops
# on its own instead of running on.
sleep 300 & owner=$!
"$rc" start "$scratch/owned" --owner "$owner" >/dev/null
node_pid=$(cat "$scratch/owned/node0/redis.pid")
kill -0 "$node_pid" || fail "the owned cluster did not start"
kill -9 "$owner"; wait "$owner" 2>/dev/null || true
for _ in $(seq 100); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$node_pid" 2>/dev/null; then fail "the cluster outlived its owner by 10 s"; fi
echo "ok: a cluster stops when its owner dies"
echo "ok: $calls redis-cli calls and $(head -1 "$scratch/scan.log" | cut -d' ' -f2) sweeps of /proc saw no password"
