#!/usr/bin/env bash
# DNS under churn: meridian's answer rate against Knot DNS's while endpoints change (issue 11:
# DNS answers stay at Knot's rate while the fleet changes).
#
#   bench/dns-churn.sh      (from the repository root; runs as root, installs what it needs)
#   ROUNDS=1 DURATION=3 RATES="0 100" bench/dns-churn.sh      (a quick look)
#
# The fleet, the zone and the queries of bench/dns.sh: 10,000 services in namespace `bench`,
# each exported from three directory members with one endpoint per cluster; Knot serves a
# `global.` zone with the same three A records per name. Queries: names uniform over the 10k
# services, 10 % names that do not exist (NXDOMAIN), type A, no EDNS, over UDP. The first
# $CHURNED services have their c1 documents (Service, ServiceExport, EndpointSlice) in a file
# of their own, clusters/c1/churn-s<i>.yaml; the rest of c1 is in services.yaml.
#
# One change = one service's c1 endpoint address changes, rotating over s0..s$((CHURNED - 1)):
#   - meridian: that service's churn-s<i>.yaml is rewritten (temporary file + rename);
#   - Knot: one control-socket transaction: zone-begin, zone-unset of the old A record,
#     zone-set of the new one, zone-commit (over one control connection for the whole round,
#     through Knot's own Python binding, python3-libknot: knotc connects once per command).
# The churn driver (bench/dns_churn.py) keeps $RATE changes a second on absolute deadlines
# for the $DURATION s of the round and reports the rate it achieved. A driver that falls
# behind applies every change due by then at once (at most $MAX_BATCH, one per service): Knot
# in one transaction (its zone-begin alone takes ~10 ms on a 30k-record zone, so it cannot
# commit 100 single-change transactions a second next to the query load), meridian one file
# after the other; none is skipped. The transactions (batches) per second are printed too.
# The driver runs on the load core with dnsperf, for both servers.
# Meridian reads a file once it has been stable for 100 ms (manifest settle): with CHURNED
# services each file is rewritten every CHURNED/RATE s, which must stay above that for
# meridian to follow the changes during the round (50 at 100 changes/s: every 0.5 s).
#
# Each server runs pinned to one core (taskset -c $SERVER_CPU; every thread re-pinned after
# start, because Knot pins its UDP workers itself), dnsperf and the churn driver on the other
# (taskset -c $LOAD_CPU). For each change rate: alternating rounds M K K M M K …, $DURATION s
# each, medians. Printed per rate: q/s of each server and the ratio, the change rate each
# driver achieved, meridian's answer-cache hit ratio over its rounds (from
# meridian_dns_answer_cache_hits/misses at the admin listener), the snapshots it published and
# the share of the round it spent building them (meridian_snapshot_build_seconds).
# The budget lines also give meridian's rate under churn against Knot's without churn (when
# RATES has 0), for information: Knot's own rate moves under churn too (on a busy 2-core VM
# it was seen answering faster while committing transactions than idle).
# After the run, every churned name must be answered by each server with the last address
# written for it (else the script exits non-zero).
#
# Knobs (environment): RATES="0 10 100" ROUNDS=3 DURATION=10 CHURNED=50 MAX_BATCH=50 (1: one
# transaction per change, whatever the rate achieved) N_SERVICES=10000 SERVER_CPU=1 LOAD_CPU=0
# MERIDIAN=path (skip the cargo build and use that binary) KEEP=1 (keep the work directory).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
N_SERVICES=${N_SERVICES:-10000}
CHURNED=${CHURNED:-50}
MAX_BATCH=${MAX_BATCH:-50}
RATES=${RATES:-0 10 100}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
NX_PERCENT=10
QUERY_LINES=100000

source "$ROOT/bench/lib.sh"
source "$ROOT/bench/dns-lib.sh"

# --- prerequisites -----------------------------------------------------------------------
missing=()
command -v knotd >/dev/null || missing+=(knot)
command -v knotc >/dev/null || missing+=(knot)
command -v kdig >/dev/null || missing+=(knot-dnsutils)
command -v dnsperf >/dev/null || missing+=(dnsperf)
command -v python3 >/dev/null || missing+=(python3)
command -v taskset >/dev/null || missing+=(util-linux)
command -v curl >/dev/null || missing+=(curl)
# The churn driver talks to knotd through libknot's Python binding, which Debian installs for
# its own python3: the driver runs on whichever python3 has it.
driver_python() { local py; for py in python3 /usr/bin/python3; do "$py" -c 'import libknot.control' 2>/dev/null && { echo "$py"; return; }; done; }
[[ -n $(driver_python) ]] || missing+=(python3-libknot)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[[ $(nproc) -ge 2 ]] || log "warning: fewer than 2 cores; server and load generator share a core"
DRIVER_PY=$(driver_python)
[[ -n $DRIVER_PY ]] || die "no python3 can import libknot.control (python3-libknot)"
for rate in $RATES; do
    [[ $rate =~ ^[0-9]+$ ]] || die "RATES must be whole changes per second, not '$rate'"
done
if ! [[ $DURATION =~ ^[1-9][0-9]*$ ]]; then die "DURATION must be whole seconds"; fi

meridian_binary

# --- work directory and cleanup ------------------------------------------------------------
bench_workdir dns-churn

# --- the fleet, the zone and the queries ---------------------------------------------------
log "generating $N_SERVICES services x 3 clusters ($CHURNED churned, one file each in c1), the Knot zone and the queries in $WORK"
python3 bench/dns_churn.py fleet "$WORK" "$N_SERVICES" "$CHURNED" "$NX_PERCENT" "$QUERY_LINES"
cat >"$WORK/fleet/meridian.yaml" <<EOF
hub: {directory: hub}
dns:
  zones: [{name: global, style: global}]
  ttl: 5
EOF

# --- servers ---------------------------------------------------------------------------------
MPORT=$(free_port)
MADMIN=$(free_port)
KPORT=$(free_port)
[[ $MPORT != "$KPORT" && $MPORT != "$MADMIN" && $KPORT != "$MADMIN" ]] || die "port clash"
KSOCK=$WORK/knot/knot.sock

addresses() { # port qname: the A addresses, sorted, space-separated
    kdig @127.0.0.1 -p "$1" +notcp +norec +time=1 +retry=1 +short "$2" A 2>/dev/null | sort | tr '\n' ' ' | sed 's/ $//'
}

# meridian_counters: "cache_hits cache_misses snapshots_published snapshot_build_seconds_sum
# time" from meridian's metrics (0 for a sample that is absent).
meridian_counters() {
    curl -s --max-time 5 "http://127.0.0.1:$MADMIN/metrics" | awk -v now="$(date +%s.%N)" '
        { v[$1] = $2 }
        function get(n) { return (n in v) ? v[n] : ((n "_total") in v) ? v[n "_total"] : 0 }
        END {
            printf "%s %s %s %s %s\n", get("meridian_dns_answer_cache_hits"), get("meridian_dns_answer_cache_misses"),
                get("meridian_snapshots_published"), get("meridian_snapshot_build_seconds_sum"), now
        }'
}
json_field() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# --- start both, check they answer the same ------------------------------------------------
log "starting meridian (udp $MPORT, admin $MADMIN) and knotd (udp $KPORT, control $KSOCK), both on cpu $SERVER_CPU"
start_meridian
MPID=$SERVER_PID
wait_answer "$MPORT" "$MPID" "$WORK/meridian.log" 120
pin_all "$MPID"
start_knot
KPID=$SERVER_PID
wait_answer "$KPORT" "$KPID" "$WORK/knot.log" 60
pin_all "$KPID"
knotc -s "$KSOCK" status >/dev/null || die "knotc cannot reach knotd at $KSOCK"

for name in s0.bench.global s4242.bench.global x1.bench.global; do
    m=$(check_answers "$MPORT" "$name")
    k=$(check_answers "$KPORT" "$name")
    log "  $name  meridian: $m | knot: $k"
    [[ $m == "$k" ]] || die "meridian and knot disagree on $name"
done
METRICS=$(curl -s --max-time 5 "http://127.0.0.1:$MADMIN/metrics")
for metric_name in meridian_dns_answer_cache_hits meridian_dns_answer_cache_misses meridian_snapshots_published meridian_snapshot_build_seconds_sum; do
    grep -Eq "^${metric_name}(_total)? " <<<"$METRICS" ||
        die "meridian has no metric $metric_name at http://127.0.0.1:$MADMIN/metrics"
done

log "warm-up: 3 s each"
run_load "$MPID" "$MPORT" "$WORK/warm-m.txt" -d "$WORK/queries.txt" -l 3 >/dev/null
run_load "$KPID" "$KPORT" "$WORK/warm-k.txt" -d "$WORK/queries.txt" -l 3 >/dev/null

# --- rounds: per rate, M K K M M K … --------------------------------------------------------
# churn_round SERVER RATE ROUND: the churn driver and dnsperf together on $LOAD_CPU; appends
# "server rate qps cpu lost cbusy lcore changes/s late_ms driver_cpu hits misses snapshots
# batches/s build_share%" to $WORK/rounds (the meridian counters are 0 for Knot).
churn_round() {
    local s=$1 rate=$2 i=$3 pid port target out c0="0 0 0 0 0" c1="0 0 0 0 0" dpid
    if [[ $s == meridian ]]; then
        pid=$MPID port=$MPORT target=$WORK/fleet/clusters/c1
        c0=$(meridian_counters)
    else
        pid=$KPID port=$KPORT target=$KSOCK
    fi
    out=$WORK/round-$rate-$i-$s
    taskset -c "$LOAD_CPU" "$DRIVER_PY" bench/dns_churn.py drive "$s" "$WORK/state-$s.json" "$rate" "$DURATION" "$target" "$MAX_BATCH" \
        >"$out.churn" 2>"$out.churn-err" &
    dpid=$!
    PIDS+=("$dpid")
    read -r qps cpu lost _ cbusy _ lcore _ < <(run_load "$pid" "$port" "$out.dnsperf" -d "$WORK/queries.txt" -l "$DURATION")
    if ! wait "$dpid"; then
        cat "$out.churn" "$out.churn-err" >&2
        die "the churn driver failed for $s (output above)"
    fi
    forget_pid "$dpid"
    [[ $s == meridian ]] && c1=$(meridian_counters)
    local achieved batches late dcpu hits misses snaps build extra=""
    # Over the round: cache hits and misses, snapshots published, and the share of the round
    # (wall time) spent building snapshots.
    read -r hits misses snaps build < <(awk -v a="$c0" -v b="$c1" 'BEGIN {
        split(a, x, " "); split(b, y, " ")
        printf "%.0f %.0f %.0f %.1f\n", y[1] - x[1], y[2] - x[2], y[3] - x[3], (y[5] > x[5]) ? 100 * (y[4] - x[4]) / (y[5] - x[5]) : 0 }')
    achieved=$(json_field "$out.churn" rate)
    batches=$(json_field "$out.churn" batch_rate)
    late=$(json_field "$out.churn" worst_late_ms)
    dcpu=$(json_field "$out.churn" cpu_percent)
    if [[ $s == meridian ]]; then
        extra="; cache hits $(awk -v h="$hits" -v m="$misses" 'BEGIN { printf "%.2f", (h + m) ? 100 * h / (h + m) : 0 }') %, $snaps snapshots (building ${build} % of the round)"
    fi
    log "  $rate/s round $i $(printf '%-8s' "$s") $qps q/s; server ${cpu} % of its core (core busy ${cbusy} %); load core busy ${lcore} %; lost $lost; changes ${achieved}/s in ${batches} batches/s (worst late ${late} ms, driver cpu ${dcpu} %)$extra"
    echo "$s $rate $qps $cpu $lost $cbusy $lcore $achieved $late $dcpu $hits $misses $snaps $batches $build" >>"$WORK/rounds"
}

order=()
for ((r = 0; r < ROUNDS; r++)); do
    if ((r % 2 == 0)); then order+=(meridian knot); else order+=(knot meridian); fi
done
: >"$WORK/rounds"
for rate in $RATES; do
    log "$rate changes/s: $ROUNDS rounds of ${DURATION} s per server (${order[*]})"
    i=0
    for s in "${order[@]}"; do
        i=$((i + 1))
        churn_round "$s" "$rate" "$i"
    done
done
LAST_CHANGE=$(date +%s.%N)

# --- answers after the churn ---------------------------------------------------------------
# Every churned name must be answered with the last c1 address written for it and the other
# clusters' addresses. Meridian reads a changed file once it has settled: give it a few s.
expected() { # server: "name|addresses" per churned service
    python3 - "$WORK/state-$1.json" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
for s, a in sorted(st["c1"].items(), key=lambda kv: int(kv[0])):
    print(f"s{s}.bench.global|" + " ".join(sorted([a] + st["others"][s])))
PY
}
verify() { # server port -> number of names answered wrongly; details in $WORK/verify-SERVER
    local name want got bad=0
    : >"$WORK/verify-$1"
    while IFS='|' read -r name want; do
        got=$(addresses "$2" "$name")
        if [[ $got != "$want" ]]; then
            bad=$((bad + 1))
            echo "  $1 $name: want [$want], got [$got]" >>"$WORK/verify-$1"
        fi
    done < <(expected "$1")
    echo "$bad"
}
M_CHANGES=$(json_field "$WORK/state-meridian.json" changes)
K_CHANGES=$(json_field "$WORK/state-knot.json" changes)
start=$SECONDS
while true; do
    M_BAD=$(verify meridian "$MPORT")
    K_BAD=$(verify knot "$KPORT")
    if ((M_BAD == 0 && K_BAD == 0)) || ((SECONDS - start >= 10)); then break; fi
    sleep 0.2
done
CAUGHT_UP=$(awk -v t0="$LAST_CHANGE" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.1f", t1 - t0 }')

stop_server "$MPID"
stop_server "$KPID"

# --- report ------------------------------------------------------------------------------------
col() { # server rate field -> median of that field over the rounds
    awk -v s="$1" -v r="$2" -v f="$3" '$1 == s && $2 == r {print $f}' "$WORK/rounds" | median
}

echo
echo "=== meridian DNS under churn: $N_SERVICES services x 3 endpoints, UDP, ${NX_PERCENT} % NXDOMAIN, one server core; $CHURNED churned services ==="
echo "dnsperf $(dnsperf -h 2>&1 | awk '/^Version/ {print $2}') (-c 4 -q 200) and the churn driver on cpu $LOAD_CPU, $(knotd --version 2>&1 | head -1), servers on cpu $SERVER_CPU; $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "medians of $ROUNDS alternating rounds of $DURATION s per server and rate"
echo
row() { printf '%9s %12s %12s %6s %15s %9s %10s %11s %9s %16s %16s\n' "$@"; }
row "changes/s" "meridian q/s" "knot q/s" "ratio" "achieved m / k" "knot tx/s" "cache hits" "snapshots/s" "building" "server cpu m / k" "driver cpu m / k"
: >"$WORK/summary"
for rate in $RATES; do
    mq=$(col meridian "$rate" 3); kq=$(col knot "$rate" 3)
    ratio=$(awk -v m="$mq" -v k="$kq" 'BEGIN { printf "%.3f", (k > 0) ? m / k : 0 }')
    ma=$(col meridian "$rate" 8); ka=$(col knot "$rate" 8)
    mc=$(col meridian "$rate" 4); kc=$(col knot "$rate" 4)
    # Hit ratio over all of meridian's rounds at this rate; snapshots per second of round.
    hit=$(awk -v r="$rate" '$1 == "meridian" && $2 == r { h += $11; m += $12 } END { printf "%.2f%%", (h + m) ? 100 * h / (h + m) : 0 }' "$WORK/rounds")
    sps=$(awk -v r="$rate" -v d="$DURATION" '$1 == "meridian" && $2 == r { n += $13; k++ } END { printf "%.1f", k ? n / k / d : 0 }' "$WORK/rounds")
    ktx=$(col knot "$rate" 14)
    md=$(col meridian "$rate" 10); kd=$(col knot "$rate" 10)
    mb=$(col meridian "$rate" 15)
    row "$rate" "$mq" "$kq" "$ratio" "$ma / $ka" "$ktx" "$hit" "$sps" "$mb%" "$mc / $kc" "$md / $kd"
    echo "$rate $ratio $ma $ka $mq" >>"$WORK/summary"
done
echo "(achieved: changes/s each churn driver reached; knot tx/s: Knot's transactions per second, changes due"
echo " together share one; cache hits: meridian's answer cache over its rounds; snapshots/s, building: snapshots"
echo " meridian published per second of round and the share of the round spent building them; server cpu: % of"
echo " the server core the server process used; driver cpu: % of the load core the churn driver used)"
echo
echo "budget: >= 0.8x Knot at 10 and 100 changes/s"
# Knot's rate without churn, when measured: meridian under churn is also held against it (for
# information; Knot's own rate moves under churn too).
K_QPS0=$(col knot 0 3)
while read -r rate ratio ma ka mq; do
    note=""
    for a in "meridian $ma" "knot $ka"; do
        read -r who got <<<"$a"
        if awk -v a="$got" -v r="$rate" 'BEGIN { exit !(a < 0.95 * r) }'; then
            note+="; the $who driver reached only $got of $rate changes/s"
        fi
    done
    if ((rate == 0)); then
        echo "  [ -- ] $rate changes/s: $ratio x (no churn: the reference)"
    else
        if [[ $K_QPS0 != nan ]]; then
            note+="; against Knot without churn $(awk -v m="$mq" -v k="$K_QPS0" 'BEGIN { printf "%.3f", m / k }') x"
        fi
        echo "  [$(pf "$ratio >= 0.8")] $rate changes/s: $ratio x$note"
    fi
done <"$WORK/summary"
echo
if ((M_BAD == 0 && K_BAD == 0)); then
    echo "answers checked: all $CHURNED churned names answered with the last address written, by meridian (after $M_CHANGES changes) and Knot (after $K_CHANGES changes); checked ${CAUGHT_UP} s after the last round ended"
else
    echo "answers checked: FAILED, $CAUGHT_UP s after the last round: meridian $M_BAD and Knot $K_BAD of $CHURNED churned names not answered with the last address written"
    head -20 "$WORK/verify-meridian" "$WORK/verify-knot"
    exit 1
fi
echo "command: RATES=\"$RATES\" ROUNDS=$ROUNDS DURATION=$DURATION CHURNED=$CHURNED N_SERVICES=$N_SERVICES bench/dns-churn.sh"
