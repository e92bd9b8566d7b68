#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The manual pages and kvtierctl's bash completion the build writes: each page
# renders without a warning from man; kvtierd.toml(5) names every key that
# `kvtierd --print-default-config` prints, under its section; each program's
# page names every subcommand and option its --help lists (walked down to
# nested subcommands); and the completion completes subcommands, nested ones
# and options after a subcommand.
#   tests/packaging/docs_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: docs_test.sh BUILD_DIR}" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v man >/dev/null || { echo "SKIP: no man (man-db)"; exit 77; }
doc=$build/doc
for page in man8/kvtierd.8 man5/kvtierd.toml.5 man1/kvtierctl.1 man1/kvtier-replay.1 man1/kvtier-bench.1; do
  f=$doc/$page.gz
  [ -f "$f" ] || fail "the build wrote no $page"
  warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$f" 2>&1 >/dev/null || true)
  [ -z "$warnings" ] || { echo "$warnings" >&2; fail "man warns about $page"; }
  rendered=$(LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$f" 2>/dev/null)
  [ -n "$rendered" ] || fail "$page renders empty"
done
echo "ok: 5 manual pages render without warnings"

/usr/bin/python3 - "$build" <<'PY'
import gzip, re, subprocess, sys

build = sys.argv[1]
def page(name):
    roff = gzip.open(f"{build}/doc/{name}.gz", "rt").read()
    return roff.replace("\\-", "-").replace("\\e", "\\")

def run(*args):
    return subprocess.run(args, capture_output=True, text=True).stdout

failures = []

# kvtierd.toml(5): every key of --print-default-config, under its section.
toml = page("man5/kvtierd.toml.5")
sections = {}
current = None
for m in re.finditer(r"^\.SS (.*)$|^\.B (\S+)", toml, re.M):
    if m.group(1):
        current = m.group(1)
        sections[current] = set()
    elif current:
        sections[current].add(m.group(2))
keys = 0
section = None
for line in run(f"{build}/daemon/kvtierd", "--print-default-config").splitlines():
    if re.match(r"^\[\[?[a-z._]+\]\]?$", line):
        section = line
    elif section and (m := re.match(r"^([a-z_0-9]+) = ", line)):
        keys += 1
        if m.group(1) not in sections.get(section, ()):
            failures.append(f"kvtierd.toml(5) lacks {section} {m.group(1)}")
if keys < 50:
    failures.append(f"only {keys} keys read from --print-default-config")

# CLI11 help: options and subcommands of a (sub)command.
def cli_help(argv):
    out = run(*argv, "--help")
    opts, subs, part = set(), [], None
    for line in out.splitlines():
        if line.startswith("Options:"): part = "o"; continue
        if line.startswith("Subcommands:"): part = "s"; continue
        if not line.startswith("  ") or line.startswith("   "):
            if not line.strip(): part = None if part == "s" else part
            continue
        word = line.split()[0]
        if part == "o" and word.startswith("-"):
            opts.update(n for n in word.split(",") if n.startswith("-"))
        elif part == "s":
            subs.append(word)
    return opts, subs

def check_cli(program, path, man, name):
    opts, subs = cli_help(path)
    where = " ".join([name] + path[1:])
    for o in opts:
        if not re.search(r"(^|[\s,])" + re.escape(o) + r"(\b|$)", man, re.M):
            failures.append(f"{name}'s page lacks option {o} of `{where}`")
    for s in subs:
        title = " ".join(path[1:] + [s])
        if not re.search(r"^\.SS " + re.escape(title) + r"$", man, re.M):
            failures.append(f"{name}'s page lacks command `{title}`")
        check_cli(program, path + [s], man, name)
    return len(opts) + len(subs)

counted = 0
for name, binary, man in [("kvtierctl", f"{build}/tools/kvtierctl", "man1/kvtierctl.1"),
                          ("kvtier-replay", f"{build}/tools/kvtier-replay", "man1/kvtier-replay.1"),
                          ("kvtierd", f"{build}/daemon/kvtierd", "man8/kvtierd.8")]:
    counted += check_cli(name, [binary], page(man), name)

# kvtier-bench: its usage lists suites and options.
bench = page("man1/kvtier-bench.1")
usage = subprocess.run([f"{build}/tools/kvtier-bench", "--help"], capture_output=True, text=True).stderr
suites = re.findall(r"^(?:suites:)?\s{1,8}([a-z]+)\s{2,}", usage, re.M)
options = re.findall(r"^  (-[-\w*]+)", usage.split("options:", 1)[1], re.M) if "options:" in usage else []
if len(suites) < 5 or len(options) < 5:
    failures.append(f"kvtier-bench --help: {len(suites)} suites, {len(options)} options read")
for s in suites:
    if not re.search(r"^\.SS " + s + "$", bench, re.M):
        failures.append(f"kvtier-bench's page lacks suite {s}")
for o in options:
    if o not in bench:
        failures.append(f"kvtier-bench's page lacks option {o}")

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"ok: kvtierd.toml(5) names all {keys} config keys; the pages name all {counted} options and subcommands "
      f"of kvtierctl, kvtier-replay and kvtierd, and kvtier-bench's {len(suites)} suites and {len(options)} options")
PY

# Completion: source the script and ask as bash would.
complete_words() {
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _kvtierctl; echo "${COMPREPLY[*]}"' \
    _ "$doc/bash-completion/kvtierctl" "$@"
}
[ "$(complete_words kvtierctl st)" = "status" ] || fail "completion of 'kvtierctl st': $(complete_words kvtierctl st)"
got=$(complete_words kvtierctl blocks "")
[[ " $got " == *" ls "* && " $got " == *" inspect "* ]] || fail "completion after 'kvtierctl blocks': $got"
got=$(complete_words kvtierctl status --j)
[ "$got" = "--json" ] || fail "completion of 'kvtierctl status --j': $got"
got=$(complete_words kvtierctl top --)
[[ " $got " == *" --interval "* && " $got " == *" --iterations "* ]] || fail "completion of 'kvtierctl top --': $got"
echo "ok: kvtierctl's bash completion completes subcommands, nested ones and options"
