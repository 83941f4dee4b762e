#!/usr/bin/env bash
# The federation API gateway's added cost (issue 15), side by side with talking to the member
# API servers directly, in one run:
#   - GET of one object: through /clusters/m1/… vs m1 directly (p50, p99);
#   - LIST of OBJECTS ConfigMaps over three members: through /clusters/*/… vs the three direct
#     LISTs issued at once (what a client doing it itself would do at best);
#   - watch event lag: a ConfigMap created in m1, seen by a watch through /clusters/*/… vs a
#     watch on m1 directly.
#
#   bench/gateway.sh                    (from the repository root)
#   OBJECTS=5000 GETS=500 LISTS=20 EVENTS=100 bench/gateway.sh
#
# A hub and three members (kube-apiserver + etcd each, tests/peers, cached), set up by
# tests/e2e/kube_fleet.py; `meridian serve` with the gateway ($MERIDIAN, else
# target/release/meridian — this script does not build it). See bench/gateway.py. Not part of
# tests/run. About 2 minutes.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
OBJECTS=${OBJECTS:-5000}
GETS=${GETS:-500}
LISTS=${LISTS:-20}
EVENTS=${EVENTS:-100}
MERIDIAN=${MERIDIAN:-$ROOT/target/release/meridian}

source "$ROOT/bench/lib.sh"

kube_bench_setup

bench_workdir gateway
python3 bench/gateway.py "$WORK" --objects "$OBJECTS" --gets "$GETS" --lists "$LISTS" --events "$EVENTS" \
    >"$WORK/result.json" &
PIDS+=($!)
wait "${PIDS[-1]}" || die "bench/gateway.py failed (KEEP=1 keeps $WORK with the logs)"

echo "=== the gateway beside the member API servers: $OBJECTS ConfigMaps over three members ==="
python3 - "$WORK/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def row(label, key):
    g, d = r[key]["gateway"], r[key]["direct"]
    print(f"  {label:<44} gateway p50 {g['p50']:>8.2f} p99 {g['p99']:>8.2f}   direct p50 {d['p50']:>8.2f} "
          f"p99 {d['p99']:>8.2f}   ratio p50 {g['p50'] / d['p50']:.2f}x, added {g['p50'] - d['p50']:.2f} ms")
print("ms:")
row(f"GET one ConfigMap ({r['get']['gateway']['n']} each)", "get")
row(f"LIST {r['objects']} over three members ({r['list']['gateway']['n']} each)", "list")
row(f"watch: create in m1 -> event ({r['watch']['gateway']['n']} events)", "watch")
print(f"  LIST through * returned {r['list_items']} items, the direct LISTs {r['direct_items']}")
print(f"total {r['seconds']} s; meridian {r['meridian']}")
PY
echo "command: OBJECTS=$OBJECTS GETS=$GETS LISTS=$LISTS EVENTS=$EVENTS MERIDIAN=$MERIDIAN bench/gateway.sh"
