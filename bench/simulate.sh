#!/usr/bin/env bash
# What-if benchmark (issue 20: `simulate` over 33,000 services and 255 clusters in under 2 s).
# The large fleet of bench/memory.sh (1,000,000 endpoints over 255 clusters, ~33,400 services,
# each service in a group of three clusters across regions) is served by `meridian serve`;
# then each scenario is simulated RUNS times through `meridian simulate --json` (the server's
# own time, `tookMilliseconds`, and the CLI's wall time), beside the server's snapshot build
# time for the same fleet (meridian_snapshot_build_seconds: one full merge), so the ratio says
# what a simulation costs against what one change of the fleet costs.
#
#   bench/simulate.sh                    (from the repository root)
#   ENDPOINTS=100000 RUNS=3 bench/simulate.sh
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
CLUSTERS=${CLUSTERS:-255}
ENDPOINTS=${ENDPOINTS:-1000000}
PER_SERVICE=${PER_SERVICE:-10}
RUNS=${RUNS:-5}
BUDGET_MS=2000

source "$ROOT/bench/lib.sh"

if [[ -z ${MERIDIAN:-} ]]; then
    log "building meridian (release)"
    cargo build --release --quiet --bin meridian
    MERIDIAN=${CARGO_TARGET_DIR:-$ROOT/target}/release/meridian
fi

bench_workdir simulate
serve_large_fleet
SERVICES=$(wc -l <"$WORK/names.txt")
log "$SERVICES services"

python3 - "$MERIDIAN" "$ADMIN_PORT" "$RUNS" "$BUDGET_MS" "$SERVICES" "$CLUSTERS" <<'PY'
import json, subprocess, sys, time, urllib.request
sys.path.insert(0, "bench")
from benchstats import pct as percentile

meridian, admin, runs, budget, services, clusters = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
metrics = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics").read().decode()
def metric(name):
    return sum(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith(name + " ") or l.startswith(name + "{"))
builds = metric("meridian_snapshot_build_seconds_count")
build_ms = 1000 * metric("meridian_snapshot_build_seconds_sum") / max(builds, 1)

scenarios = [
    ("c000=Unreachable", ["--assume", "c000=Unreachable"]),
    ("c001:taint=maint:NoExecute", ["--assume", "c001:taint=maint:NoExecute"]),
    ("remove c002", ["--assume-remove", "c002"]),
]
print(f"=== simulate: {services} services, {clusters} clusters, {runs} runs each ===")
print(f"snapshot build (mean of {int(builds)} in this run): {build_ms:.1f} ms")
failed = False
for label, args in scenarios:
    server, wall = [], []
    for _ in range(runs):
        t = time.monotonic()
        out = subprocess.run([meridian, "simulate", *args, "--json", "--admin", f"127.0.0.1:{admin}"],
                             capture_output=True, text=True, check=True).stdout
        wall.append(1000 * (time.monotonic() - t))
        body = json.loads(out)
        server.append(body["tookMilliseconds"])
    totals = body["totals"]
    if totals["servicesChanged"] == 0:
        print(f"{label}: no service changed: the scenario did not touch the fleet", file=sys.stderr)
        failed = True
    p50 = percentile(server, 50)
    print(f"{label:<30} server p50 {p50:8.1f} ms  max {max(server):8.1f} ms  "
          f"CLI wall p50 {percentile(wall, 50):8.1f} ms  "
          f"({totals['servicesChanged']} services, {totals['clientsChanged']} client routes changed)  "
          f"{p50 / build_ms:6.1f}x a snapshot build  {p50 / budget:5.2f} of the {budget:.0f} ms budget")
    failed |= max(server) > budget
sys.exit(1 if failed else 0)
PY
echo "command: CLUSTERS=$CLUSTERS ENDPOINTS=$ENDPOINTS RUNS=$RUNS bench/simulate.sh"
