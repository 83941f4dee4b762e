#!/usr/bin/env bash
# DNS benchmark: meridian against Knot DNS serving the same records (DESIGN §8).
#
#   bench/dns.sh            (from the repository root; runs as root, installs what it needs)
#
# The fleet: 10,000 services in namespace `bench`, each exported from three clusters with one
# endpoint per cluster (30,000 endpoints). No MemberCluster claims the load generator's address
# (127.0.0.1), so meridian answers `<svc>.bench.global A` with all three endpoint addresses;
# Knot serves a `global.` zone holding exactly those three A records per name (plus SOA/NS,
# same TTL and SOA timers as meridian's). Queries: names uniform over the 10k services, 10 %
# names that do not exist (NXDOMAIN), type A, no EDNS, over UDP.
#
# Each server runs pinned to one core (taskset -c $SERVER_CPU; every thread re-pinned after
# start, because Knot pins its UDP workers to CPU 0.. itself), dnsperf to the other
# (taskset -c $LOAD_CPU). Both servers stay up during the rate and latency rounds (the idle one
# sleeps). Measured:
#   1. top rate: alternating rounds M K K M M K …, $DURATION s each, medians; server CPU use
#      from /proc/PID/stat (utime+stime) and both cores' use from /proc/stat over seconds
#      1..$DURATION-1 of each run; answers per server CPU-second as a load-independent view;
#   2. latency: meridian at 80 % of its top rate; meridian and Knot at half of Knot's top
#      rate ($ROUNDS alternating rounds each, medians of p50/p99 from dnsperf -v per-query
#      latencies; lost queries count as +inf);
#   3. instructions per query: each server under valgrind --tool=callgrind, queried at
#      $CG_RATE q/s; counters are dumped (callgrind_control) when the server first answers
#      (start-up), after one pass over every distinct name of the query file (cold: the first
#      query of each name, meridian's cache-miss path), after two more passes (fills meridian's
#      one-cache-slot-per-rotation; not reported) and after $CG_QUERIES queries drawn like the
#      query file (warm: the steady state the rate rounds see; this one is held against the
#      budget); then, from a fresh start, $CG_MIX_A random queries and $CG_MIX_B more (cold
#      mix: a quarter of them a name's first question; issue 11's budget). Ir = user-space instructions of all threads, idle threads included; kernel
#      work (the syscalls) is not counted, which is why the CPU split is printed too.
#
# Knobs (environment): ROUNDS=3 DURATION=10 LAT_DURATION=10 CG_QUERIES=50000 CG_MIX_A=5000
# CG_MIX_B=20000 CG_RATE=3000
# SERVER_CPU=1 LOAD_CPU=0 MERIDIAN=path (skip the cargo build and use that binary) KEEP=1 (keep
# the work directory).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
N_SERVICES=${N_SERVICES:-10000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
LAT_DURATION=${LAT_DURATION:-10}
CG_QUERIES=${CG_QUERIES:-50000}
CG_MIX_A=${CG_MIX_A:-5000}
CG_MIX_B=${CG_MIX_B:-20000}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
NX_PERCENT=10
QUERY_LINES=100000

source "$ROOT/bench/lib.sh"
source "$ROOT/bench/dns-lib.sh"

# --- prerequisites -----------------------------------------------------------------------
missing=()
command -v knotd >/dev/null || missing+=(knot)
command -v kdig >/dev/null || missing+=(knot-dnsutils)
command -v dnsperf >/dev/null || missing+=(dnsperf)
command -v valgrind >/dev/null || missing+=(valgrind)
command -v callgrind_control >/dev/null || missing+=(valgrind)
command -v python3 >/dev/null || missing+=(python3)
command -v taskset >/dev/null || missing+=(util-linux)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[[ $(nproc) -ge 2 ]] || log "warning: fewer than 2 cores; server and load generator share a core"

meridian_binary

# --- work directory and cleanup ------------------------------------------------------------
bench_workdir dns

# --- the fleet, the zone and the queries ---------------------------------------------------
log "generating $N_SERVICES services x 3 clusters, the Knot zone and the query files in $WORK"
python3 bench/dns_fleet.py "$WORK" "$N_SERVICES" 0 "$NX_PERCENT" "$QUERY_LINES" "$CG_QUERIES" "$CG_MIX_A" "$CG_MIX_B"
N_DISTINCT=$(cat "$WORK/distinct")
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

# --- 0. how busy is the box already? start both, check they answer the same -------------
busy_now() { # seconds -> "cpu0% cpu1%" busy over that time
    local a b
    a=$(core_ticks 0; core_ticks 1); sleep "$1"; b=$(core_ticks 0; core_ticks 1)
    paste <(echo "$a") <(echo "$b") | awk '{ printf "%.0f ", (($6 > $3) ? 100 * ($4 - $1) / ($6 - $3) : 0) }'
}
PRE_BUSY=$(busy_now 2)
log "before starting: cores busy $PRE_BUSY% (other tenants of this box)"
if awk -v b="$PRE_BUSY" 'BEGIN { split(b, x, " "); exit !(x[1] + x[2] > 20) }'; then
    log "  warning: the box is busy; top processes now:"
    top -bn2 -d 0.5 -w 200 | awk '/^top -/ {n++} n == 2' | sed -n '8,11p' | cut -c1-120 >&2
fi
log "starting meridian (udp $MPORT, admin $MADMIN) and knotd (udp $KPORT), both on cpu $SERVER_CPU"
T0=$(date +%s.%N)
start_meridian
MPID=$SERVER_PID
wait_answer "$MPORT" "$MPID" "$WORK/meridian.log" 120
pin_all "$MPID"
M_READY=$(awk -v t0="$T0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.2f", t1 - t0 }')
start_knot
KPID=$SERVER_PID
wait_answer "$KPORT" "$KPID" "$WORK/knot.log" 60
pin_all "$KPID"
log "meridian answered after ${M_READY}s"

for name in s0.bench.global s4242.bench.global x1.bench.global; do
    m=$(check_answers "$MPORT" "$name")
    k=$(check_answers "$KPORT" "$name")
    # Compare names, types and addresses (SOA serials differ; compare the first fields only).
    ms=$(kdig @127.0.0.1 -p "$MPORT" +notcp +norec "$name" A | awk '/status:/ {print $6}')
    ks=$(kdig @127.0.0.1 -p "$KPORT" +notcp +norec "$name" A | awk '/status:/ {print $6}')
    log "  $name  meridian: $ms $m | knot: $ks $k"
    [[ $ms == "$ks" ]] || die "meridian and knot disagree on the status for $name"
    [[ $m == "$k" ]] || die "meridian and knot disagree on $name"
done
msize=$(kdig @127.0.0.1 -p "$MPORT" +notcp +noedns s0.bench.global A | awk '/Received/ {print $3}')
ksize=$(kdig @127.0.0.1 -p "$KPORT" +notcp +noedns s0.bench.global A | awk '/Received/ {print $3}')
log "  reply sizes for s0.bench.global A (no EDNS, as dnsperf asks): meridian $msize B, knot $ksize B"

# --- 1. top rate, alternating rounds --------------------------------------------------------
log "warm-up: 3 s each"
run_load "$MPID" "$MPORT" "$WORK/warm-m.txt" -d "$WORK/queries.txt" -l 3 >/dev/null
run_load "$KPID" "$KPORT" "$WORK/warm-k.txt" -d "$WORK/queries.txt" -l 3 >/dev/null

order=()
for ((r = 0; r < ROUNDS; r++)); do
    if ((r % 2 == 0)); then order+=(meridian knot); else order+=(knot meridian); fi
done
: >"$WORK/rates"
i=0
for s in "${order[@]}"; do
    i=$((i + 1))
    if [[ $s == meridian ]]; then pid=$MPID port=$MPORT; else pid=$KPID port=$KPORT; fi
    read -r qps cpu lost completed cbusy cirq lcore ucpu < <(run_load "$pid" "$port" "$WORK/rate-$i-$s.txt" -d "$WORK/queries.txt" -l "$DURATION")
    rcodes=$(awk -F': ' '/Response codes:/ {print $2}' "$WORK/rate-$i-$s.txt" | tr -s ' ')
    log "  round $i $(printf '%-8s' "$s") ${qps} q/s; server ${cpu} % of its core (user ${ucpu} %) (core busy ${cbusy} %, of which irq/softirq ${cirq} %); load core busy ${lcore} %; lost ${lost};${rcodes}"
    echo "$s $qps $cpu $lost $cbusy $lcore $cirq $ucpu" >>"$WORK/rates"
done
M_QPS=$(awk '$1 == "meridian" {print $2}' "$WORK/rates" | median)
K_QPS=$(awk '$1 == "knot" {print $2}' "$WORK/rates" | median)
M_CPU=$(awk '$1 == "meridian" {print $3}' "$WORK/rates" | median)
K_CPU=$(awk '$1 == "knot" {print $3}' "$WORK/rates" | median)
M_CORE=$(awk '$1 == "meridian" {print $5}' "$WORK/rates" | median)
K_CORE=$(awk '$1 == "knot" {print $5}' "$WORK/rates" | median)
M_LCORE=$(awk '$1 == "meridian" {print $6}' "$WORK/rates" | median)
K_LCORE=$(awk '$1 == "knot" {print $6}' "$WORK/rates" | median)
M_USER=$(awk '$1 == "meridian" {print $8}' "$WORK/rates" | median)
K_USER=$(awk '$1 == "knot" {print $8}' "$WORK/rates" | median)
M_IRQ=$(awk '$1 == "meridian" {print $7}' "$WORK/rates" | median)
K_IRQ=$(awk '$1 == "knot" {print $7}' "$WORK/rates" | median)
M_OTHER=$(awk -v b="$M_CORE" -v s="$M_CPU" -v i="$M_IRQ" 'BEGIN { x = b - s - i; printf "%.1f", x < 0 ? 0 : x }')
K_OTHER=$(awk -v b="$K_CORE" -v s="$K_CPU" -v i="$K_IRQ" 'BEGIN { x = b - s - i; printf "%.1f", x < 0 ? 0 : x }')
# Answers per second of server CPU (process utime+stime): what one fully used core would give,
# robust to other tenants taking part of the server core and to a load generator that cannot
# saturate the server.
M_EFF=$(awk '$1 == "meridian" && $3 > 0 {printf "%.0f\n", $2 / ($3 / 100)}' "$WORK/rates" | median)
K_EFF=$(awk '$1 == "knot" && $3 > 0 {printf "%.0f\n", $2 / ($3 / 100)}' "$WORK/rates" | median)
RATE_RATIO=$(awk -v m="$M_QPS" -v k="$K_QPS" 'BEGIN { printf "%.3f", m / k }')
EFF_RATIO=$(awk -v m="$M_EFF" -v k="$K_EFF" 'BEGIN { printf "%.3f", m / k }')
LIMIT_NOTE=""
INCONCLUSIVE=0
# A server is the limit when its core is (nearly) fully busy and mostly with it. (Process
# times and irq/softirq may overlap, depending on the kernel's IRQ time accounting.)
for row in "meridian $M_CPU $M_CORE $M_LCORE $M_IRQ $M_OTHER" "knot $K_CPU $K_CORE $K_LCORE $K_IRQ $K_OTHER"; do
    set -- $row
    if awk -v o="$6" 'BEGIN { exit !(o > 5) }'; then
        INCONCLUSIVE=1
        LIMIT_NOTE+="  note: at its top rate $1 used $2 % of its core (+ $5 % irq/softirq) while other processes took $6 % of it (noisy box): $1's rate is a lower bound."$'\n'
    elif awk -v c="$3" 'BEGIN { exit !(c >= 95) }'; then
        continue
    elif awk -v c="$4" 'BEGIN { exit !(c >= 95) }'; then
        INCONCLUSIVE=1
        LIMIT_NOTE+="  note: at its top rate $1's core was $3 % busy, not saturated ($1 $2 %), while the load core was $4 % busy: the load generator (dnsperf on one core), not $1, was the limit; $1's rate is a lower bound."$'\n'
    else
        INCONCLUSIVE=1
        LIMIT_NOTE+="  note: at its top rate neither core was saturated ($1's core $3 %, load core $4 %): the rate was bounded by latency x outstanding queries (dnsperf -q 200), not by CPU."$'\n'
    fi
done

# --- 2. latency -------------------------------------------------------------------------------
# lat_run PID PORT RATE OUT: p50 and p99 in ms from dnsperf -v (lost queries count as +inf).
lat_run() {
    local pid=$1 port=$2 rate=$3 out=$4
    read -r qps cpu lost completed _ < <(run_load "$pid" "$port" "$out" -d "$WORK/queries.txt" -l "$LAT_DURATION" -Q "$rate" -v)
    if awk -v q="$qps" -v r="$rate" 'BEGIN { exit !(q < 0.95 * r) }'; then
        log "  warning: offered $rate q/s but only $qps q/s went out: the load generator fell behind, latencies include its queueing"
    fi
    # "> NOERROR name A 0.000123"; timeouts ("> T name A") are the lost queries.
    awk '/^> / && $2 != "T" && $NF ~ /^[0-9.]+$/ {print $NF}' "$out" | sort -g >"$out.lat"
    awk -v lost="$lost" -v qps="$qps" -v cpu="$cpu" '
        { a[NR] = $1 }
        END {
            n = NR + lost
            i50 = int(0.50 * n + 0.999999); i99 = int(0.99 * n + 0.999999)
            p50 = (i50 <= NR) ? sprintf("%.3f", a[i50] * 1000) : "inf"
            p99 = (i99 <= NR) ? sprintf("%.3f", a[i99] * 1000) : "inf"
            printf "%s %s %s %s %s\n", p50, p99, qps, lost, cpu
        }' "$out.lat"
}
L80=$(awk -v m="$M_QPS" 'BEGIN { printf "%d", 0.8 * m }')
LHALF=$(awk -v k="$K_QPS" 'BEGIN { printf "%d", 0.5 * k }')
log "latency: meridian at 80 % of its top rate ($L80 q/s), both at half of Knot's top rate ($LHALF q/s)"
read -r M80_P50 M80_P99 M80_QPS M80_LOST _ < <(lat_run "$MPID" "$MPORT" "$L80" "$WORK/lat80-m.txt")
log "  meridian @${L80}: p50 ${M80_P50} ms, p99 ${M80_P99} ms (achieved ${M80_QPS} q/s, lost ${M80_LOST})"
: >"$WORK/lat-half"
for s in "${order[@]}"; do
    if [[ $s == meridian ]]; then pid=$MPID port=$MPORT; else pid=$KPID port=$KPORT; fi
    read -r p50 p99 qps lost cpu < <(lat_run "$pid" "$port" "$LHALF" "$WORK/lathalf-$s-$RANDOM.txt")
    log "  $(printf '%-8s' "$s") @${LHALF}: p50 ${p50} ms, p99 ${p99} ms (achieved ${qps} q/s, lost ${lost}, server cpu ${cpu} %)"
    echo "$s $p50 $p99" >>"$WORK/lat-half"
done
medinf() { sed 's/^inf$/1e300/' | median | sed 's/^1e+300$/inf/'; }
MH_P50=$(awk '$1 == "meridian" {print $2}' "$WORK/lat-half" | medinf)
MH_P99=$(awk '$1 == "meridian" {print $3}' "$WORK/lat-half" | medinf)
KH_P50=$(awk '$1 == "knot" {print $2}' "$WORK/lat-half" | medinf)
KH_P99=$(awk '$1 == "knot" {print $3}' "$WORK/lat-half" | medinf)

stop_server "$MPID"
stop_server "$KPID"

# --- 3. instructions per query under callgrind ----------------------------------------------
# A server under callgrind is ~50x slower: queries go at a modest rate so none is lost.
# Counters are dumped (and zeroed) with callgrind_control after each phase; .1 is the start-up
# until the first answer. Two runs per server:
#   run 1: .2 cold pass (first query of every distinct name: meridian's miss path), .3 two more
#          passes (fills meridian's per-rotation cache slots; not reported), .4 the warm run of
#          $CG_QUERIES (the steady state the rate rounds see);
#   run 2, from a fresh start: .2 the first $CG_MIX_A random queries, .3 the next $CG_MIX_B
#          (cold mix: the difference between a run of $CG_MIX_A and one of $((CG_MIX_A + CG_MIX_B))
#          queries drawn like the query file, so about a quarter are a name's first question).
CG_RATE=${CG_RATE:-3000}
cg_total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
# The answer cache's misses and the misses the fast encoder took, from meridian's metrics.
cache_counters() {
    curl -s --max-time 30 "http://127.0.0.1:$MADMIN/metrics" |
        awk '{ v[$1] = $2 } END { printf "%d %d\n", v["meridian_dns_answer_cache_misses_total"], v["meridian_dns_answer_quick_total"] }'
}
cg_phase() { # pid dir name queries-file -> completed count; then dumps
    local pid=$1 dir=$2 phase=$3 file=$4 n lost
    read -r _ _ lost n _ < <(run_load "$pid" "$PORT_CG" "$dir/$phase.txt" -d "$file" -n 1 -Q "$CG_RATE" -t 10)
    callgrind_control --dump="$phase" "$pid" >/dev/null
    sleep 1
    [[ $lost == 0 ]] || log "  warning: $lost queries lost in the $phase phase (not counted)"
    echo "$n"
}
# callgrind_measure NAME START_FN PORT PHASE...: one server run under callgrind, queried with
# $WORK/cg-PHASE.txt for each PHASE in turn; writes "startup_ir" then "ir queries misses quick"
# per phase (misses and quick: meridian's counters over the phase, 0 for Knot) to
# $WORK/cg-NAME-RUN/result, RUN being the first phase (runs in the main shell, so the EXIT
# trap knows the server's pid).
callgrind_measure() {
    local name=$1 start=$2 dir="$WORK/cg-$1-$4" logf phase
    PORT_CG=$3
    shift 3
    mkdir -p "$dir"
    $start valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" --dump-instr=no --collect-jumps=no
    local pid=$SERVER_PID
    if [[ $name == meridian ]]; then logf="$WORK/meridian.log"; else logf="$WORK/knot.log"; fi
    wait_answer "$PORT_CG" "$pid" "$logf" 1500
    pin_all "$pid"
    callgrind_control --dump=startup "$pid" >/dev/null
    sleep 1
    local counts=() before after n
    for phase in "$@"; do
        before="0 0" after="0 0"
        [[ $name == meridian ]] && before=$(cache_counters)
        n=$(cg_phase "$pid" "$dir" "$phase" "$WORK/cg-$phase.txt")
        [[ $name == meridian ]] && after=$(cache_counters)
        counts+=("$n $(awk -v a="$before" -v b="$after" 'BEGIN { split(a, x, " "); split(b, y, " "); print y[1] - x[1], y[2] - x[2] }')")
    done
    stop_server "$pid"
    local i=1 result total
    result=$(cg_total "$dir/callgrind.out.1")
    [[ -n $result ]] || { ls -l "$dir" >&2; die "callgrind start-up dump missing for $name"; }
    for n in "${counts[@]}"; do
        i=$((i + 1))
        total=$(cg_total "$dir/callgrind.out.$i")
        [[ -n $total ]] || { ls -l "$dir" >&2; die "callgrind dump $i missing for $name"; }
        result+=" $total $n"
    done
    echo "$result" >"$dir/result"
}
log "callgrind: meridian (start-up; cold pass over $N_DISTINCT names; 2 fill passes; $CG_QUERIES warm queries; at $CG_RATE q/s)"
callgrind_measure meridian start_meridian "$MPORT" cold fill warm
read -r MCG_START MCG_COLD MCG_COLD_N _ _ _ _ _ _ MCG_WARM MCG_WARM_N _ <"$WORK/cg-meridian-cold/result"
log "  meridian: start-up $MCG_START Ir; cold $MCG_COLD Ir / $MCG_COLD_N; warm $MCG_WARM Ir / $MCG_WARM_N"
log "callgrind: meridian again (start-up; $CG_MIX_A then $CG_MIX_B random queries)"
callgrind_measure meridian start_meridian "$MPORT" mix-a mix-b
read -r _ _ _ _ _ MCG_MIX MCG_MIX_N MCG_MIX_MISSES MCG_MIX_QUICK <"$WORK/cg-meridian-mix-a/result"
log "  meridian: cold mix $MCG_MIX Ir / $MCG_MIX_N ($MCG_MIX_MISSES misses, $MCG_MIX_QUICK of them by the fast encoder)"
log "callgrind: knot (the same two runs)"
callgrind_measure knot start_knot "$KPORT" cold fill warm
read -r KCG_START KCG_COLD KCG_COLD_N _ _ _ _ _ _ KCG_WARM KCG_WARM_N _ <"$WORK/cg-knot-cold/result"
callgrind_measure knot start_knot "$KPORT" mix-a mix-b
read -r _ _ _ _ _ KCG_MIX KCG_MIX_N _ _ <"$WORK/cg-knot-mix-a/result"
log "  knot: start-up $KCG_START Ir; cold $KCG_COLD Ir / $KCG_COLD_N; warm $KCG_WARM Ir / $KCG_WARM_N; cold mix $KCG_MIX Ir / $KCG_MIX_N"
per() { awk -v ir="$1" -v n="$2" 'BEGIN { printf "%.0f", ir / n }'; }
M_IPQ=$(per "$MCG_WARM" "$MCG_WARM_N"); M_IPQ_COLD=$(per "$MCG_COLD" "$MCG_COLD_N")
K_IPQ=$(per "$KCG_WARM" "$KCG_WARM_N"); K_IPQ_COLD=$(per "$KCG_COLD" "$KCG_COLD_N")
M_IPQ_MIX=$(per "$MCG_MIX" "$MCG_MIX_N"); K_IPQ_MIX=$(per "$KCG_MIX" "$KCG_MIX_N")
# What a naive "total Ir / queries" would say for a run of start-up + $CG_QUERIES queries.
M_IPQ_ALL=$(awk -v a="$MCG_START" -v c="$MCG_WARM" -v m="$MCG_WARM_N" 'BEGIN { printf "%.0f", (a + c) / m }')
K_IPQ_ALL=$(awk -v a="$KCG_START" -v c="$KCG_WARM" -v m="$KCG_WARM_N" 'BEGIN { printf "%.0f", (a + c) / m }')
IPQ_RATIO=$(awk -v m="$M_IPQ" -v k="$K_IPQ" 'BEGIN { printf "%.2f", m / k }')
IPQ_RATIO_COLD=$(awk -v m="$M_IPQ_COLD" -v k="$K_IPQ_COLD" 'BEGIN { printf "%.2f", m / k }')
IPQ_RATIO_MIX=$(awk -v m="$M_IPQ_MIX" -v k="$K_IPQ_MIX" 'BEGIN { printf "%.2f", m / k }')
# A miss's own cost in the cold mix: what the mix cost beyond its hits at the warm rate.
M_PER_MISS=$(awk -v ir="$MCG_MIX" -v n="$MCG_MIX_N" -v m="$MCG_MIX_MISSES" -v w="$M_IPQ" 'BEGIN { printf "%.0f", (m > 0) ? (ir - (n - m) * w) / m : 0 }')

# callgrind_annotate counts the "calls=0" records callgrind writes for frames that were on the
# stack at a dump as self cost (it shows e.g. clone() with 100 %): make them ordinary call
# records (inclusive cost only), then list self cost per function, summed over the source
# files that inlining scattered it across.
top_functions() { # callgrind.out count
    sed 's/^calls=0 /calls=1 /' "$1" >"$1.fixed"
    callgrind_annotate --inclusive=no --threshold=100 "$1.fixed" 2>/dev/null | python3 -c '
import re, sys
rows, total = {}, None
lines = sys.stdin.read().split("\n")
start = next(i for i, l in enumerate(lines) if l.strip().endswith("file:function")) + 2
for line in [lines[lines.index(next(l for l in lines if "PROGRAM TOTALS" in l))]] + lines[start:]:
    if not line.strip():
        break
    m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line.rstrip("\n"))
    if not m:
        continue
    ir, what = int(m.group(1).replace(",", "")), m.group(2)
    if what == "PROGRAM TOTALS":
        total = ir; continue
    what = re.sub(r" \[[^\]]*\]$", "", what)
    fn = what.split(":", 1)[1] if ":" in what and not what.startswith("???") else what
    rows[fn] = rows.get(fn, 0) + ir
n = int(sys.argv[1])
for fn, ir in sorted(rows.items(), key=lambda kv: -kv[1])[:n]:
    print(f"  {ir:>13,} {100 * ir / total:5.1f} %  {fn[:150]}")
' "$2"
}

# --- report ------------------------------------------------------------------------------------
fmt() { awk -v x="$1" 'BEGIN { if (x == "inf") print "inf"; else printf "%.3f", x }'; }
ratio_or_inf() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "inf") print "inf"; else if (b == "inf") print 0; else printf "%.2f", a / b }'; }
LAT_RATIO=$(ratio_or_inf "$MH_P99" "$KH_P99")

echo
echo "=== meridian DNS benchmark: $N_SERVICES services x 3 endpoints, UDP, ${NX_PERCENT} % NXDOMAIN, one server core ==="
echo "dnsperf $(dnsperf -h 2>&1 | awk '/^Version/ {print $2}') (-c 4 -q 200, cpu $LOAD_CPU), $(knotd --version 2>&1 | head -1), servers on cpu $SERVER_CPU; $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cores busy before the benchmark started: $PRE_BUSY% (cpu0 cpu1)"
echo "meridian answered its first query ${M_READY}s after start; reply to s0.bench.global A: meridian $msize B, knot $ksize B"
echo
printf '%-52s %15s %15s %8s\n' "" "meridian" "knot" "ratio"
printf '%-52s %15s %15s %8s\n' "top rate, q/s (median of $ROUNDS alternating rounds)" "$M_QPS" "$K_QPS" "$RATE_RATIO"
printf '%-52s %15s %15s\n' "server CPU at top rate, % of one core" "$M_CPU" "$K_CPU"
printf '%-52s %15s %15s\n' "  of which user / kernel, %" "$M_USER / $(awk -v a="$M_CPU" -v b="$M_USER" 'BEGIN { printf "%.1f", a - b }')" "$K_USER / $(awk -v a="$K_CPU" -v b="$K_USER" 'BEGIN { printf "%.1f", a - b }')"
printf '%-52s %15s %15s\n' "server core: busy / irq+softirq / other processes, %" "$M_CORE / $M_IRQ / $M_OTHER" "$K_CORE / $K_IRQ / $K_OTHER"
printf '%-52s %15s %15s\n' "load-generator core busy, %" "$M_LCORE" "$K_LCORE"
printf '%-52s %15s %15s %8s\n' "answers per server CPU-second (median of rounds)" "$M_EFF" "$K_EFF" "$EFF_RATIO"
printf '%-52s %15s %15s %8s\n' "Ir/query, warm ($MCG_WARM_N queries)" "$M_IPQ" "$K_IPQ" "$IPQ_RATIO"
printf '%-52s %15s %15s %8s\n' "Ir/query, cold (first query of each of $N_DISTINCT names)" "$M_IPQ_COLD" "$K_IPQ_COLD" "$IPQ_RATIO_COLD"
printf '%-52s %15s %15s %8s\n' "Ir/query, cold mix (queries $((CG_MIX_A + 1))..$((CG_MIX_A + CG_MIX_B)) from start)" "$M_IPQ_MIX" "$K_IPQ_MIX" "$IPQ_RATIO_MIX"
printf '%-52s %15s\n' "  meridian: misses in it / by the fast encoder" "$MCG_MIX_MISSES / $MCG_MIX_QUICK"
printf '%-52s %15s %15s\n' "  Ir per miss (beyond the warm rate), Knot's query" "$M_PER_MISS" "$K_IPQ_MIX"
printf '%-52s %15s %15s\n' "Ir, start-up until the first answer" "$MCG_START" "$KCG_START"
printf '%-52s %15s %15s\n' "Ir/query, (start-up + warm run) / warm queries" "$M_IPQ_ALL" "$K_IPQ_ALL"
printf '%-52s %15s %15s\n' "p50 / p99 ms at 80 % of meridian's top ($L80 q/s)" "$(fmt "$M80_P50") / $(fmt "$M80_P99")" "-"
printf '%-52s %15s %15s\n' "p50 ms at half of Knot's top ($LHALF q/s)" "$(fmt "$MH_P50")" "$(fmt "$KH_P50")"
printf '%-52s %15s %15s %8s\n' "p99 ms at half of Knot's top ($LHALF q/s)" "$(fmt "$MH_P99")" "$(fmt "$KH_P99")" "$LAT_RATIO"
printf '%s' "$LIMIT_NOTE"
echo
echo "DESIGN §8 budgets:"
if ((INCONCLUSIVE)); then rate_note="; a server core was not saturated (see notes), so also compare per server CPU-second: $EFF_RATIO x [$(pf "$EFF_RATIO >= 0.8")]"; else rate_note="; per server CPU-second $EFF_RATIO x"; fi
echo "  [$(pf "$RATE_RATIO >= 0.8")] DNS answers per second, one server core, 10k services x 3 endpoints: >= 0.8 x Knot   ($RATE_RATIO x$rate_note)"
echo "  [$(pf "$IPQ_RATIO <= 1.25")] DNS user-space instructions per query (callgrind): <= 1.25 x Knot's   ($IPQ_RATIO x warm; cold $IPQ_RATIO_COLD x)"
echo "  [$(pf "$IPQ_RATIO_MIX <= 1.25")] DNS user-space instructions per query, cold mix (issue 11): <= 1.25 x Knot's   ($IPQ_RATIO_MIX x)"
if [[ $LAT_RATIO == inf ]]; then lat_pf=FAIL; else lat_pf=$(pf "$LAT_RATIO <= 1.5"); fi
echo "  [$lat_pf] DNS latency at half of Knot's top rate: p99 <= 1.5 x Knot's p99 at the same rate   ($LAT_RATIO x)"
echo
echo "meridian, top 15 functions by self Ir, warm run:"
top_functions "$WORK/cg-meridian-cold/callgrind.out.4" 15
echo "meridian, top 15 functions by self Ir, cold pass (miss path):"
top_functions "$WORK/cg-meridian-cold/callgrind.out.2" 15
echo "meridian, top 10 functions by self Ir, start-up:"
top_functions "$WORK/cg-meridian-cold/callgrind.out.1" 10
echo "knot, top 10 functions by self Ir, warm run:"
top_functions "$WORK/cg-knot-cold/callgrind.out.4" 10
