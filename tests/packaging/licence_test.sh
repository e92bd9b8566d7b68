#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvtier is Apache-2.0: the LICENSE file is the licence's text, and every
# source file the repository tracks (code, build files, scripts) names it in an
# SPDX-License-Identifier line near its top.
#   tests/packaging/licence_test.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: licence_test.sh SOURCE_DIR}
cd "$src"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -f LICENSE ] || fail "no LICENSE file"
grep -q '^ *Apache License$' LICENSE && grep -q 'Version 2.0, January 2004' LICENSE \
  || fail "LICENSE is not the Apache License 2.0"
grep -q 'END OF TERMS AND CONDITIONS' LICENSE || fail "LICENSE is cut short"
if ! command -v git >/dev/null || ! git rev-parse --git-dir >/dev/null 2>&1; then
  echo "SKIP: not a git checkout: the tracked files are unknown"; exit 77
fi
missing=()
while IFS= read -r f; do
  case "$f" in
    *.c|*.cc|*.h|*.cu|*.in|*.map|*.lua|*.py|*.pyi|*.sh|*.cmake|*.supp|*.toml|*.sysusers|*.tmpfiles|\
    */CMakeLists.txt|CMakeLists.txt|scripts/*|.ci/*|systemd/debian/post*|systemd/debian/pre*) ;;
    *) continue ;;
  esac
  # (a Debian changelog has no comment syntax)
  case "$f" in */corpus/*|scripts/packages.txt|systemd/debian/changelog.in) continue ;; esac
  [ -f "$f" ] || continue
  head -n 5 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0' || missing+=("$f")
done < <(git ls-files)
if [ ${#missing[@]} -gt 0 ]; then
  printf '  %s\n' "${missing[@]}" >&2
  fail "${#missing[@]} source files lack an 'SPDX-License-Identifier: Apache-2.0' line in their first 5 lines"
fi
echo "ok: LICENSE is Apache-2.0 and every tracked source file carries its SPDX line"
