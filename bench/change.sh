#!/usr/bin/env bash
# Change-to-answer benchmark (DESIGN §8: a change in a member → new DNS answer and xDS push,
# p99 <= 50 ms plus the debounce) on the large fleet of bench/memory.sh (1,000,000 endpoints over
# 255 clusters, ~33,400 services by default).
#
#   bench/change.sh                 (from the repository root)
#   ENDPOINTS=100000 CHANGES=20 bench/change.sh
#
# Each change appends a new exported service to one member's file (atomic rename); the clock
# stops when a DNS client first gets an answer for the new name (polled every 2 ms) and when an
# xDS stream that subscribed to the name's assignment receives it. The directory source adds a
# 50 ms debounce and the xDS server its own (--xds-debounce-ms, 100 ms by default; this run
# uses XDS_DEBOUNCE_MS=10 unless set, to show meridian's own cost). A directory file is read once
# it has been stable for the settle time (100 ms by default); the changes here are atomic
# renames, so this run sets it to SETTLE_MS=0 unless set. "own" is the time minus the debounces
# and the settle time. The snapshot build time histogram of the run is printed too.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
CLUSTERS=${CLUSTERS:-255}
ENDPOINTS=${ENDPOINTS:-1000000}
PER_SERVICE=${PER_SERVICE:-10}
CHANGES=${CHANGES:-10}
XDS_DEBOUNCE_MS=${XDS_DEBOUNCE_MS:-10}
SETTLE_MS=${SETTLE_MS:-0}

source "$ROOT/bench/lib.sh"

python3 -c 'import grpc, envoy.service.discovery.v3' 2>/dev/null ||
    python3 -m pip install -q -r tests/requirements.txt

meridian_binary

bench_workdir change
serve_large_fleet --xds-debounce-ms "$XDS_DEBOUNCE_MS" --directory-settle-milliseconds "$SETTLE_MS"
log "making $CHANGES changes"
RESULT=$(python3 bench/change.py "$WORK/fleet" "$DNS_PORT" "$XDS_PORT" "$ADMIN_PORT" "$CHANGES")
BUILDS=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | grep -E '^meridian_snapshot_build_seconds_(sum|count)|^meridian_xds_view_build_seconds_(sum|count)')

echo "=== change -> answer: $ENDPOINTS endpoints, $CLUSTERS clusters, $CHANGES changes (directory debounce 50 ms, settle $SETTLE_MS ms, xDS debounce $XDS_DEBOUNCE_MS ms) ==="
python3 - "$RESULT" "$SETTLE_MS" "$XDS_DEBOUNCE_MS" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
settle, xds_debounce = float(sys.argv[2]), float(sys.argv[3])
waits = {"dns_ms": 50 + settle, "xds_push_ms": 50 + settle + xds_debounce}
for key, label in (("dns_ms", "new DNS answer"), ("xds_push_ms", "xDS push (EDS) received")):
    v, wait = r[key], waits[key]
    print(f"{label:<24} p50 {v['p50']:>7.1f} ms  max {v['max']:>7.1f} ms  "
          f"own p50 {v['p50'] - wait:>6.1f} ms  own max {v['max'] - wait:>6.1f} ms  each {v['each']}")
PY
echo "$BUILDS"
echo "command: CLUSTERS=$CLUSTERS ENDPOINTS=$ENDPOINTS CHANGES=$CHANGES XDS_DEBOUNCE_MS=$XDS_DEBOUNCE_MS SETTLE_MS=$SETTLE_MS bench/change.sh"
