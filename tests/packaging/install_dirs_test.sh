#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The install folders are settled before anything installs into them: a
# fresh configure and a second configure of the same build folder install
# libkvtier (and everything else) to the same places, under Debian's
# multiarch lib folder for the /usr prefix.
#   tests/packaging/install_dirs_test.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: install_dirs_test.sh SOURCE_DIR}
fail() { echo "FAIL: $*" >&2; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cfg=(-S "$src" -B "$scratch/b" -G Ninja -DKVTIER_BUILD_TESTS=OFF -DKVTIER_WITH_CUDA=OFF -DKVTIER_CCACHE=OFF)
command -v ninja >/dev/null || cfg=(-S "$src" -B "$scratch/b" -DKVTIER_BUILD_TESTS=OFF -DKVTIER_WITH_CUDA=OFF -DKVTIER_CCACHE=OFF)
# Where each install() rule puts its files, as the generated install scripts say.
destinations() {
  find "$scratch/b" -name cmake_install.cmake -print0 | sort -z | xargs -0 grep -ho 'DESTINATION "[^"]*"' | sort
}
cmake "${cfg[@]}" >"$scratch/first.log" 2>&1 || { cat "$scratch/first.log" >&2; fail "first configure failed"; }
first=$(destinations)
cmake "${cfg[@]}" >"$scratch/second.log" 2>&1 || { cat "$scratch/second.log" >&2; fail "second configure failed"; }
second=$(destinations)
[ -n "$first" ] || fail "no install destinations found"
if [ "$first" != "$second" ]; then
  diff <(echo "$first") <(echo "$second") >&2 || true
  fail "the second configure installs elsewhere than the first"
fi
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || true)
lib=$(grep -o 'DESTINATION "[^"]*lib[^"]*"' <<<"$first" | grep -v -e systemd -e sysusers -e tmpfiles -e python \
      -e cmake -e pkgconfig | head -1)
if [ -n "$multiarch" ]; then
  grep -q "/lib/$multiarch\"" <<<"$lib" || fail "libkvtier installs to $lib, not lib/$multiarch"
fi
echo "ok: two configures install to the same places (libkvtier: ${lib#DESTINATION })"
