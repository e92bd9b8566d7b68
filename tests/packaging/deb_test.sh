#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvtier's Debian packages, as `cpack -G DEB` makes them: the five packages
# and their -dbgsym companions, each with the files it should hold and none it
# should not, binaries stripped (symbols in the .ddeb, found by build id),
# dependencies from dpkg-shlibdeps plus the ones between the packages, dpkg
# willing to install them here (--dry-run), lintian without errors, and the
# daemon started from the packages unpacked into a throwaway root (with the
# CUDA toolkit hidden where a mount namespace is permitted), serving the
# packaged tools and Python module.
#   tests/packaging/deb_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: deb_test.sh BUILD_DIR}" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in cpack dpkg-deb dpkg-shlibdeps lintian file readelf; do
  command -v $tool >/dev/null || { echo "SKIP: $tool is not installed (scripts/install-deps installs it)"; exit 77; }
done
scratch=$(mktemp -d)
cleanup() {
  if [ -n "${pid:-}" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$scratch"
}
trap cleanup EXIT
(cd "$build" && cpack -G DEB -B "$scratch/pkg" >"$scratch/cpack.log" 2>&1) || { cat "$scratch/cpack.log" >&2; fail "cpack -G DEB failed"; }
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
lib=usr/lib/$multiarch
pkgs=(kvtierd libkvtier0 libkvtier-dev python3-kvtier kvtier-tools)
deb() { ls "$scratch"/pkg/"$1"_"$version"_*.deb; }
[ "$(ls "$scratch"/pkg/*.deb | wc -l)" = 5 ] || { ls "$scratch/pkg" >&2; fail "not 5 packages"; }

# -- what each holds
declare -A want=(
  [kvtierd]="./usr/bin/kvtierd ./usr/lib/systemd/system/kvtierd.service ./usr/lib/sysusers.d/kvtier.conf
             ./usr/lib/tmpfiles.d/kvtier.conf ./etc/kvtier/kvtierd.toml ./usr/share/kvtier/ledger.lua
             ./usr/share/man/man8/kvtierd.8.gz ./usr/share/man/man5/kvtierd.toml.5.gz
             ./usr/share/kvtier/kvtier-dashboard.json"
  [libkvtier0]="./$lib/libkvtier.so.0 ./$lib/libkvtier.so.$version"
  [libkvtier-dev]="./usr/include/kvtier/kvtier.h ./usr/include/kvtier/client.h ./usr/include/kvtier/types.h
                   ./$lib/libkvtier.so ./$lib/cmake/kvtier/kvtierConfig.cmake ./$lib/pkgconfig/kvtier.pc"
  [python3-kvtier]="./usr/lib/python3/dist-packages/kvtier/__init__.py ./usr/lib/python3/dist-packages/kvtier/vllm.py
                    ./usr/lib/python3/dist-packages/kvtier/sglang.py"
  [kvtier-tools]="./usr/bin/kvtierctl ./usr/bin/kvtier-replay ./usr/bin/kvtier-bench
                  ./usr/share/man/man1/kvtierctl.1.gz ./usr/share/bash-completion/completions/kvtierctl"
)
# what must stay out of each (another package's)
declare -A forbid=(
  [kvtierd]="/usr/include/ /usr/bin/kvtierctl libkvtier.so dist-packages"
  [libkvtier0]="/usr/include/ /usr/bin/ libkvtier.so$ /cmake/ /pkgconfig/"
  [libkvtier-dev]="/usr/bin/ libkvtier.so.0"
  [python3-kvtier]="/usr/bin/ /usr/include/ libkvtier.so"
  [kvtier-tools]="/usr/bin/kvtierd$ /usr/include/ libkvtier.so dist-packages"
)
for p in "${pkgs[@]}"; do
  d=$(deb "$p")
  files=$(dpkg-deb -c "$d" | awk '{print $6}')
  for f in ${want[$p]} ./usr/share/doc/$p/copyright ./usr/share/doc/$p/changelog.gz; do
    grep -qx -- "$f" <<<"$files" || fail "$p lacks $f"
  done
  for pattern in ${forbid[$p]}; do
    if grep -q -- "$pattern" <<<"$files"; then fail "$p holds $(grep -- "$pattern" <<<"$files" | head -1)"; fi
  done
  copyright=$(dpkg-deb --fsys-tarfile "$d" | tar -xO "./usr/share/doc/$p/copyright")
  grep -qx 'License: Apache-2.0' <<<"$copyright" || fail "$p's copyright file does not name Apache-2.0"
done
echo "ok: the 5 packages hold what each should, and a copyright and changelog each"

# -- stripped, with the symbols in the -dbgsym packages
mkdir -p "$scratch/x"
debug_files=$(for dd in "$scratch"/pkg/*-dbgsym_*.ddeb; do dpkg-deb -c "$dd"; done | awk '{print $6}')
for p in "${pkgs[@]}"; do dpkg-deb -x "$(deb "$p")" "$scratch/x"; done
elfs=0
while IFS= read -r f; do
  info=$(file -b "$f")
  [[ $info == ELF* ]] || continue
  elfs=$((elfs + 1))
  [[ $info == *", stripped"* ]] || fail "${f#"$scratch/x"} is not stripped ($info)"
  id=$(readelf -n "$f" | sed -n 's/.*Build ID: //p')
  [ -n "$id" ] || fail "${f#"$scratch/x"} has no build id"
  grep -qx "./usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug" <<<"$debug_files" || fail "no -dbgsym package holds the symbols of ${f#"$scratch/x"} (build id $id)"
done < <(find "$scratch/x" -type f)
[ $elfs -ge 6 ] || fail "only $elfs ELF files in the packages"
echo "ok: $elfs binaries stripped; their symbols are in $(ls "$scratch"/pkg/*.ddeb | wc -l) -dbgsym packages"

# -- dependencies
depends() { dpkg-deb -f "$(deb "$1")" Depends; }
for p in libkvtier-dev python3-kvtier kvtier-tools; do
  grep -q "libkvtier0 (= $version)" <<<"$(depends "$p")" || fail "$p does not depend on libkvtier0 (= $version)"
done
grep -q 'python3-numpy' <<<"$(depends python3-kvtier)" || fail "python3-kvtier does not depend on python3-numpy"
grep -q 'systemd' <<<"$(depends kvtierd)" || fail "kvtierd does not depend on systemd"
grep -q 'libc6' <<<"$(depends kvtierd)" || fail "kvtierd's dependencies are not from dpkg-shlibdeps"
for p in "${pkgs[@]}"; do
  if grep -qi -e cuda -e nccl <<<"$(depends "$p")"; then fail "$p depends on CUDA: $(depends "$p")"; fi
done
shlibs=$(dpkg-deb --ctrl-tarfile "$(deb libkvtier0)" | tar -xO ./shlibs)
grep -qx "libkvtier 0 libkvtier0 (>= $version)" <<<"$shlibs" || fail "libkvtier0's shlibs: $shlibs"
dpkg --dry-run -i "$scratch"/pkg/*.deb >"$scratch/dpkg.log" 2>&1 || { cat "$scratch/dpkg.log" >&2; fail "dpkg --dry-run -i refuses the packages"; }
echo "ok: dependencies from dpkg-shlibdeps and between the packages; none on CUDA; dpkg --dry-run -i accepts them"

# -- lintian (Debian's checks): no errors
lintian --fail-on error --tag-display-limit 0 "$scratch"/pkg/*.deb >"$scratch/lintian.log" 2>&1 \
  || { cat "$scratch/lintian.log" >&2; fail "lintian finds errors"; }
echo "ok: lintian finds no errors ($(grep -c '^W:' "$scratch/lintian.log" || true) warnings)"

# -- the daemon from the unpacked packages, with the CUDA toolkit hidden (an
# empty tmpfs over it in a private mount namespace) where that is permitted
cat >"$scratch/serve.sh" <<'SH'
set -euo pipefail
scratch=$1 root=$2 lib=$3 cuda=$4
if [ -n "$cuda" ]; then
  mount -t tmpfs -o size=1m,mode=755 kvtier-no-cuda "$cuda"
  [ -z "$(ls -A "$cuda")" ] || { echo "FAIL: $cuda is still visible" >&2; exit 1; }
fi
export LD_LIBRARY_PATH=$root/$lib
"$root/usr/bin/kvtierd" --config "$root/etc/kvtier/kvtierd.toml" --check-config >/dev/null \
  || { echo "FAIL: the packaged kvtierd refuses the packaged config" >&2; exit 1; }
mkdir -p "$scratch/run"
# The packaged config as it is, but for its fixed metrics port (another
# kvtierd on this machine, or a test beside this one, may hold it).
sed 's/^port = 9464 /port = 0 /' "$root/etc/kvtier/kvtierd.toml" >"$scratch/kvtierd.toml"
grep -q '^port = 0 ' "$scratch/kvtierd.toml" || { echo "FAIL: the packaged config has no metrics port line" >&2; exit 1; }
"$root/usr/bin/kvtierd" --config "$scratch/kvtierd.toml" --run-dir "$scratch/run" --data-dir "$scratch/data" \
  2>"$scratch/kvtierd.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 300); do [ -S "$scratch/run/kvtierd.sock" ] && break; sleep 0.05; done
[ -S "$scratch/run/kvtierd.sock" ] || { cat "$scratch/kvtierd.log" >&2; echo "FAIL: the packaged kvtierd did not start" >&2; exit 1; }
out=$("$root/usr/bin/kvtier-replay" --socket "$scratch/run/kvtierd.sock" --conversations 3 --turns 3 --json) \
  || { echo "FAIL: the packaged kvtier-replay failed against it" >&2; exit 1; }
/usr/bin/python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["verify_failures"] == 0 and r["error"] == "" and r["blocks_loaded"] > 0, r' "$out" \
  || { echo "FAIL: the replay's answer: $out" >&2; exit 1; }
PYTHONPATH=$root/usr/lib/python3/dist-packages /usr/bin/python3 -c '
import sys, numpy as np, kvtier
c = kvtier.Client.attach("deb-test/model", 16, 1024, socket=sys.argv[1], kv_dtype="f16", kv_layout="layer_major")
keys = c.compute_keys(np.arange(48, dtype=np.uint32))
assert c.store(keys, np.full((len(keys), 1024), 7, dtype=np.uint8)) == len(keys)
assert c.lookup(keys).hit_blocks == len(keys)
assert kvtier.__file__.startswith(sys.argv[2]), kvtier.__file__
' "$scratch/run/kvtierd.sock" "$root" || { echo "FAIL: the packaged Python module failed against it" >&2; exit 1; }
"$root/usr/bin/kvtierctl" --socket "$scratch/run/kvtierd-admin.sock" status --json >/dev/null \
  || { echo "FAIL: the packaged kvtierctl failed against it" >&2; exit 1; }
SH
cuda=$(readlink -f /usr/local/cuda 2>/dev/null || true)
[ -d "$cuda" ] || cuda=
if [ -n "$cuda" ] && [ "$(id -u)" = 0 ] && unshare --mount true 2>/dev/null; then
  unshare --mount --propagation private -- bash "$scratch/serve.sh" "$scratch" "$scratch/x" "$lib" "$cuda" \
    || fail "the packages did not serve with $cuda hidden"
  hidden=" with $cuda hidden"
else
  bash "$scratch/serve.sh" "$scratch" "$scratch/x" "$lib" "" || fail "the packages did not serve"
  hidden=""
fi
echo "ok: unpacked into a throwaway root$hidden, the packaged kvtierd served kvtier-replay, the Python module" \
     "and kvtierctl"
