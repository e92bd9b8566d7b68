#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Grafana dashboard (tools/grafana/kvtier-dashboard.json) against live
# scrapes: a real Redis Cluster (Debian's redis-server) behind two kvtierd,
# one with [metrics] per_tenant = true and one without, both serving
# kvtier-replay's traffic; every metric family a panel queries must be in a
# scrape of one of them (node addresses and per-tenant series only show with
# per_tenant, the summed node counts only without), every per-tenant family
# must carry the tenant's series, and the tenant's lookups must add up to
# the daemon's. The dashboard is checked for what Grafana needs to import it.
#   tests/packaging/dashboard_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$(cd "${1:?usage: dashboard_test.sh SOURCE_DIR BUILD_DIR}" && pwd)
build=$(cd "${2:?usage: dashboard_test.sh SOURCE_DIR BUILD_DIR}" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in redis-server redis-cli openssl; do
  command -v $tool >/dev/null || { echo "SKIP: no $tool (scripts/install-deps installs it)"; exit 77; }
done
scratch=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  "$src/scripts/redis-cluster" stop "$scratch/cluster" >/dev/null 2>&1 || true
  rm -rf "$scratch"
}
trap cleanup EXIT
"$src/scripts/redis-cluster" start "$scratch/cluster" --primaries 3 --replicas 0 --tenant dash --owner $$ \
  >"$scratch/cluster.log" 2>&1 || { cat "$scratch/cluster.log" >&2; fail "the Redis Cluster did not start"; }
# shellcheck disable=SC1091
. "$scratch/cluster/cluster.env"
seeds=$(printf '"%s", ' ${SEEDS//,/ })
(umask 077; openssl rand -hex 32 >"$scratch/dash.key")

start() {  # NAME PER_TENANT
  local n=$1
  mkdir -p "$scratch/$n"
  cat >"$scratch/$n/kvtierd.toml" <<TOML
[daemon]
device = "sim"
[metrics]
enabled = true
port = 0
per_tenant = $2
[tiers.host]
capacity = "64MiB"
[tiers.nvme]
capacity = "64MiB"
segment_bytes = "4MiB"
[tiers.remote]
seeds = [${seeds%, }]
write_policy = "committed"
[[tenants]]
name = "dash"
uids = [$(id -u)]
remote_user = "kvtier-dash"
remote_password_file = "$scratch/cluster/tenants/dash.pass"
remote_key_file = "$scratch/dash.key"
TOML
  "$build/daemon/kvtierd" --config "$scratch/$n/kvtierd.toml" --run-dir "$scratch/$n" --data-dir "$scratch/$n/data" \
    2>"$scratch/$n/kvtierd.log" &
  pids+=($!)
  for _ in $(seq 300); do [ -S "$scratch/$n/kvtierd.sock" ] && break; sleep 0.05; done
  [ -S "$scratch/$n/kvtierd.sock" ] || { cat "$scratch/$n/kvtierd.log" >&2; fail "kvtierd $n did not start"; }
  "$build/tools/kvtier-replay" --socket "$scratch/$n/kvtierd.sock" --conversations 4 --turns 3 --json \
    >"$scratch/$n/replay.json" || fail "kvtier-replay against $n failed"
  "$build/tools/kvtierctl" --socket "$scratch/$n/kvtierd-admin.sock" status --json >"$scratch/$n/status.json"
}
start detailed true
start summed false

/usr/bin/python3 - "$src/tools/grafana/kvtier-dashboard.json" "$scratch" <<'PY'
import json, re, sys, urllib.request

dash = json.load(open(sys.argv[1]))
scratch = sys.argv[2]
failures = []

def scrape(name):
    st = json.load(open(f"{scratch}/{name}/status.json"))
    url = st["metrics"]["url"]
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    families, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, fam, kind = line.split()
            families[fam] = kind
        elif line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            samples[series] = float(value)
    return families, samples

scrapes = {n: scrape(n) for n in ("detailed", "summed")}

def present(metric):
    for fams, _ in scrapes.values():
        if metric in fams:
            return True
        for suffix in ("_bucket", "_sum", "_count"):
            if metric.endswith(suffix) and fams.get(metric[: -len(suffix)]) == "histogram":
                return True
    return False

# What Grafana needs to import it.
if dash.get("uid") != "kvtier-overview" or not dash.get("panels"):
    failures.append("no uid or panels")
ids = [p["id"] for p in dash["panels"]]
if len(ids) != len(set(ids)):
    failures.append("panel ids repeat")
names = {v["name"] for v in dash["templating"]["list"]}
if not {"datasource", "tenant"} <= names:
    failures.append(f"template variables: {names}")
queried = set()
for p in dash["panels"]:
    if not p.get("targets"):
        failures.append(f"panel {p['title']!r} queries nothing")
    for t in p.get("targets", []):
        if t.get("datasource", {}).get("uid") != "${datasource}":
            failures.append(f"panel {p['title']!r} has a fixed data source")
        queried.update(re.findall(r"\bkvtier_[a-z0-9_]+", t["expr"]))
for v in dash["templating"]["list"]:
    if isinstance(v.get("query"), dict):
        queried.update(re.findall(r"\bkvtier_[a-z0-9_]+", v["query"]["query"]))
missing = sorted(m for m in queried if not present(m))
if missing:
    failures.append(f"metrics the dashboard queries that no scrape has: {missing}")
if len(queried) < 30:
    failures.append(f"only {len(queried)} metrics queried")

# Per-tenant series: only with per_tenant, each with the tenant.
fams_d, samples_d = scrapes["detailed"]
fams_s, samples_s = scrapes["summed"]
tenant_fams = sorted(m for m in fams_d if m.startswith("kvtier_tenant_"))
if len(tenant_fams) < 8:
    failures.append(f"per-tenant families: {tenant_fams}")
for fam in tenant_fams:
    if not any(s.startswith(fam + "{") and 'tenant="dash"' in s for s in samples_d):
        failures.append(f"{fam} has no series of tenant dash")
if any(m.startswith("kvtier_tenant_") for m in fams_s):
    failures.append("per-tenant series without per_tenant")
lookups = samples_d.get('kvtier_tenant_lookups_total{tenant="dash"}', -1)
if lookups <= 0 or lookups != samples_d.get("kvtier_lookups_total"):
    failures.append(f"tenant lookups {lookups} vs all {samples_d.get('kvtier_lookups_total')}")
hits = sum(v for s, v in samples_d.items() if s.startswith('kvtier_tenant_blocks_hit_total{tenant="dash"'))
all_hits = sum(v for s, v in samples_d.items() if s.startswith("kvtier_blocks_hit_total{"))
if hits <= 0 or hits != all_hits:
    failures.append(f"tenant blocks hit {hits} vs all {all_hits}")

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"ok: the dashboard's {len(dash['panels'])} panels query {len(queried)} metrics, all in live scrapes; "
      f"{len(tenant_fams)} per-tenant families carry tenant dash ({int(lookups)} lookups, {int(hits)} blocks hit)")
PY
