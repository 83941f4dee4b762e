#!/usr/bin/env bash
# The federation API gateway's added cost (issue 15), side by side with talking to the member
# API servers directly, in one run:
#   - GET of one object: through /clusters/m1/… vs m1 directly (p50, p99);
#   - LIST of OBJECTS ConfigMaps over three members: through /clusters/*/… vs the three direct
#     LISTs issued at once (what a client doing it itself would do at best);
#   - watch event lag: a ConfigMap created in m1, seen by a watch through /clusters/*/… vs a
#     watch on m1 directly.
# Then the gateway at fleet size (issue 38), FLEET_MEMBERS simulated members (1,000) of
# FLEET_OBJECTS ConfigMaps each (300), one process serving each member on its own loopback port
# as a kube-apiserver pages a LIST (gateway/examples/fleet_bench.rs, testing::FakeFleet), the
# gateway in a process of its own:
#   - LIST of every member through /clusters/* (streamed) vs the same pages fetched from the
#     members directly, 32 members at once; paged through it (limit=500, continue) vs the same
#     pages fetched directly one at a time (as one pager does);
#     the gateway's peak RSS during each, and the longest continue token;
#   - a watch through /clusters/* over every member, from the list's resourceVersion in its URL
#     (as a client-go reflector watches): its status, the members' count of watches opened.
#
#   bench/gateway.sh                    (from the repository root)
#   OBJECTS=5000 GETS=500 LISTS=20 EVENTS=100 bench/gateway.sh
#   FLEET_ONLY=1 FLEET_MEMBERS=1000 FLEET_OBJECTS=300 FLEET_RUNS=3 bench/gateway.sh   (no kube peers)
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
FLEET_ONLY=${FLEET_ONLY:-0}
FLEET_MEMBERS=${FLEET_MEMBERS:-1000}
FLEET_OBJECTS=${FLEET_OBJECTS:-300}
FLEET_SIZE=${FLEET_SIZE:-200}
FLEET_RUNS=${FLEET_RUNS:-3}

source "$ROOT/bench/lib.sh"

# The gateway at fleet size: fake members, the gateway and the client are
# gateway/examples/fleet_bench.rs (built here, release).
fleet_bench() {
    log "building gateway/examples/fleet_bench.rs (release)"
    cargo build --release --locked --quiet -p meridian-gateway --features testing --example fleet_bench
    local bin=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/fleet_bench
    local d=$WORK/fleet port gw
    mkdir -p "$d"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
        -addext subjectAltName=IP:127.0.0.1 -keyout "$d/key.pem" -out "$d/cert.pem" -days 1 2>/dev/null
    log "starting $FLEET_MEMBERS fake members of $FLEET_OBJECTS ConfigMaps each"
    "$bin" members "$FLEET_MEMBERS" "$FLEET_OBJECTS" "$FLEET_SIZE" "$d/addrs" 2>"$d/members.log" &
    PIDS+=($!)
    for _ in $(seq 600); do [[ -s $d/addrs ]] && break; sleep 0.1; done
    [[ -s $d/addrs ]] || die "the fake members did not start (see $d/members.log)"
    port=$(free_port)
    "$bin" gateway "$d/addrs" "127.0.0.1:$port" "$d" 2>"$d/gateway.log" &
    gw=$!
    PIDS+=("$gw")
    for _ in $(seq 300); do
        [[ -s $d/token ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    log "measuring: $FLEET_RUNS runs"
    "$bin" client "$d/addrs" "https://127.0.0.1:$port" "$d" "$gw" "$FLEET_RUNS" >"$d/result.json" \
        || die "the fleet client failed (KEEP=1 keeps $WORK)"
    echo "=== the gateway at fleet size: $FLEET_MEMBERS members of $FLEET_OBJECTS ConfigMaps each ==="
    python3 - "$d/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
d = r["direct_s"]
print(f"  direct: every member's pages of 500, 32 members at once      {d * 1000:>9.0f} ms  "
      f"({r['direct_items']} items, {r['direct_mib']:.0f} MiB)")
print(f"  LIST through * (streamed, one response)                      {r['whole_s'] * 1000:>9.0f} ms  "
      f"ratio {r['whole_s'] / d:.2f}x   gateway RSS {r['whole_before_mib']:.0f} -> peak {r['whole_peak_mib']:.0f} MiB "
      f"({r['whole_items']} items)")
s = r["direct_one_by_one_s"]
print(f"  direct: the same pages one at a time (one pager)             {s * 1000:>9.0f} ms")
print(f"  LIST through * paged (limit=500, {r['paged_pages']} pages)                  {r['paged_s'] * 1000:>9.0f} ms  "
      f"ratio {r['paged_s'] / s:.2f}x   gateway RSS {r['paged_before_mib']:.0f} -> peak {r['paged_peak_mib']:.0f} MiB "
      f"({r['paged_items']} items)")
print(f"  gateway RSS idle {r['idle_mib']:.0f} MiB; longest continue token {r['longest_token']} bytes; "
      f"the list's composite resourceVersion {r['version_len']} bytes (mrv2.; mrv1. was ~20 KB at 1,000)")
print(f"  watch through * from that resourceVersion (in its URL, as a reflector's): {r['watch_status']}, {r['member_watches']} member watches opened for "
      f"{r['members']} members, +{r['watch_mib']:.1f} MiB RSS while open")
print(f"  (medians of {r['runs']} runs; RSS of the last run, before it and its peak; the fleet's list is "
      f"{r['direct_mib']:.0f} MiB as the members send it)")
PY
    echo "command: FLEET_ONLY=1 FLEET_MEMBERS=$FLEET_MEMBERS FLEET_OBJECTS=$FLEET_OBJECTS FLEET_SIZE=$FLEET_SIZE FLEET_RUNS=$FLEET_RUNS bench/gateway.sh"
}

if [[ $FLEET_ONLY == 1 ]]; then
    bench_workdir gateway
    fleet_bench
    exit 0
fi

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

fleet_bench
