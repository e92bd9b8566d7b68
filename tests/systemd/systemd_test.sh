#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The systemd pieces as an operator gets them: `cmake --install` into a
# scratch prefix, then systemd's own tools check the unit (systemd-analyze
# verify: no warning allowed), create the user (systemd-sysusers) and the
# folders (systemd-tmpfiles) under a scratch root, kvtierd accepts the
# installed config, and `cpack -G DEB` packs it all with /usr paths and the
# config as a conffile.
# Usage: systemd_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in systemd-analyze systemd-sysusers systemd-tmpfiles cpack dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed (scripts/install-deps installs it)"; exit 77; }
done

prefix="$scratch/usr"
cmake --install "$build" --prefix "$prefix" >/dev/null
unit="$prefix/lib/systemd/system/kvtierd.service"
[ -f "$unit" ] || fail "no unit at $unit"
grep -qx "ExecStart=$prefix/bin/kvtierd --config $prefix/etc/kvtier/kvtierd.toml" "$unit" \
  || fail "ExecStart does not name the installed binary and config: $(grep ExecStart "$unit")"
for want in Type=notify WatchdogSec= Restart=on-failure LimitMEMLOCK=infinity RuntimeDirectory=kvtier \
            StateDirectory=kvtier User=kvtier ProtectSystem=strict ProtectHome=true PrivateTmp=true \
            NoNewPrivileges=true CapabilityBoundingSet=CAP_IPC_LOCK ReadWritePaths= ExecReload=; do
  grep -q "^$want" "$unit" || fail "the unit lacks $want"
done
out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify failed: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
echo "ok: systemd-analyze verify is silent on the installed unit"

root="$scratch/root"
mkdir -p "$root/etc"
systemd-sysusers --root="$root" "$prefix/lib/sysusers.d/kvtier.conf"
grep -q '^kvtier:' "$root/etc/passwd" || fail "systemd-sysusers created no kvtier user"
systemd-tmpfiles --create --root="$root" "$prefix/lib/tmpfiles.d/kvtier.conf"
for d in /var/lib/kvtier /var/lib/kvtier/nvme; do
  [ -d "$root$d" ] || fail "systemd-tmpfiles did not create $d"
  [ "$(stat -c %a "$root$d")" = 750 ] || fail "$d has mode $(stat -c %a "$root$d"), not 750"
done
echo "ok: the kvtier user and its folders are created"

"$prefix/bin/kvtierd" --config "$prefix/etc/kvtier/kvtierd.toml" --check-config >/dev/null \
  || fail "kvtierd refuses the installed config"
echo "ok: kvtierd accepts the installed config"

# The daemon's package (tests/packaging/deb_test.sh checks all five).
(cd "$build" && cpack -G DEB -B "$scratch/pkg" >/dev/null) || fail "cpack -G DEB failed"
deb=$(ls "$scratch"/pkg/kvtierd_*.deb)
files=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/bin/kvtierd ./usr/lib/systemd/system/kvtierd.service \
         ./usr/lib/sysusers.d/kvtier.conf ./usr/lib/tmpfiles.d/kvtier.conf ./etc/kvtier/kvtierd.toml \
         ./usr/share/doc/kvtierd/copyright ./usr/share/man/man8/kvtierd.8.gz ./usr/share/man/man5/kvtierd.toml.5.gz; do
  grep -qx "$f" <<<"$files" || fail "the .deb lacks $f"
done
# Read each whole before grep -q looks at it: grep -q stops at its first
# match, and the writer killed by SIGPIPE fails the pipeline (pipefail).
packaged_unit=$(dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/lib/systemd/system/kvtierd.service)
grep -qx 'ExecStart=/usr/bin/kvtierd --config /etc/kvtier/kvtierd.toml' <<<"$packaged_unit" || fail "the packaged unit's ExecStart"
conffiles=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles)
grep -qx /etc/kvtier/kvtierd.toml <<<"$conffiles" || fail "the config is not a conffile"
depends=$(dpkg-deb -f "$deb" Depends)
grep -q systemd <<<"$depends" || fail "the .deb does not depend on systemd"
echo "ok: $(basename "$deb") holds the binaries, the unit, sysusers, tmpfiles and the config (a conffile)"
