#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An engine's build against an installed kvtier, outside kvtier's tree: a C and
# a C++ consumer (tests/packaging/consumer/) built once with
# find_package(kvtier CONFIG) and once with pkg-config against a staged
# install (DESTDIR), each run against a kvtierd and checking every byte.
#   tests/packaging/consumer_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=${1:?usage: consumer_test.sh SOURCE_DIR BUILD_DIR}
build=$(cd "${2:?usage: consumer_test.sh SOURCE_DIR BUILD_DIR}" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }
scratch=$(mktemp -d)
# shellcheck source=../support/kvtierd.sh
. "$src/tests/support/kvtierd.sh"
cleanup() {
  kvtierd_stop
  rm -rf "$scratch"
}
trap cleanup EXIT
stage=$scratch/stage
DESTDIR=$stage cmake --install "$build" >/dev/null || fail "cmake --install failed"
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
libdir=$stage/usr/lib/$multiarch
for f in "$libdir/cmake/kvtier/kvtierConfig.cmake" "$libdir/cmake/kvtier/kvtierConfigVersion.cmake" \
         "$libdir/cmake/kvtier/kvtierTargets.cmake" "$libdir/pkgconfig/kvtier.pc" "$stage/usr/include/kvtier/kvtier.h" \
         "$stage/usr/include/kvtier/client.h"; do
  [ -f "$f" ] || fail "the install lacks ${f#"$stage"}"
done
export LD_LIBRARY_PATH=$libdir

# A daemon for the consumers (the build's own).
kvtierd_start "$build/daemon/kvtierd" "$scratch" || exit 1
sock=$KVTIERD_SOCK

# 1. CMake: find_package(kvtier CONFIG) -> kvtier::kvtier.
cmake -S "$src/tests/packaging/consumer" -B "$scratch/cmake-build" -DCMAKE_PREFIX_PATH="$stage/usr" \
  -DCMAKE_BUILD_TYPE=Release >"$scratch/cmake.log" 2>&1 || { cat "$scratch/cmake.log" >&2; fail "find_package(kvtier) failed"; }
cmake --build "$scratch/cmake-build" >>"$scratch/cmake.log" 2>&1 \
  || { cat "$scratch/cmake.log" >&2; fail "the find_package consumers did not build"; }
"$scratch/cmake-build/consumer" "$sock" || fail "the C consumer (find_package) failed"
"$scratch/cmake-build/consumer_cxx" "$sock" || fail "the C++ consumer (find_package) failed"
deps=$(ldd "$scratch/cmake-build/consumer")
grep -q "$libdir/libkvtier.so.0" <<<"$deps" || fail "the consumer did not link the installed libkvtier"

# 2. pkg-config (the staged root as sysroot: -I and -L point into it).
export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage
[ "$(pkg-config --modversion kvtier)" = "$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")" ] \
  || fail "kvtier.pc's version is not the project's"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$scratch/consumer-pc" "$src/tests/packaging/consumer/consumer.c" \
  $(pkg-config --cflags --libs kvtier) || fail "the C consumer did not build with pkg-config"
# shellcheck disable=SC2046
c++ -std=c++20 -Wall -Werror -o "$scratch/consumer-cxx-pc" "$src/tests/packaging/consumer/consumer.cc" \
  $(pkg-config --cflags --libs kvtier) || fail "the C++ consumer did not build with pkg-config"
"$scratch/consumer-pc" "$sock" || fail "the C consumer (pkg-config) failed"
"$scratch/consumer-cxx-pc" "$sock" || fail "the C++ consumer (pkg-config) failed"
echo "ok: C and C++ consumers built with find_package(kvtier CONFIG) and with pkg-config ran against kvtierd"
