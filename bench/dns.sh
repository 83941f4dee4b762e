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
# Each server runs pinned to one core (taskset -c $SERVER_CPU), dnsperf to the other
# (taskset -c $LOAD_CPU). Measured:
#   1. top rate: alternating rounds M K K M M K …, $DURATION s each, medians; server CPU use
#      from /proc/PID/stat (utime+stime) over each run;
#   2. latency: meridian at 80 % of its top rate; meridian and Knot at half of Knot's top
#      rate (alternating rounds, medians of p50/p99 from dnsperf -v per-query latencies;
#      lost queries count as +inf);
#   3. instructions per query: each server under valgrind --tool=callgrind; counters are
#      dumped when the server answers (start-up), after one pass over every distinct name
#      (cold: the first query of each name), and after $CG_QUERIES more queries (warm:
#      steady state, what the throughput rounds see). Ir = user-space instructions, all threads.
#
# Knobs (environment): ROUNDS=3 DURATION=10 LAT_DURATION=10 CG_QUERIES=50000 SERVER_CPU=1
# LOAD_CPU=0 KEEP=1 (keep the work directory).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
N_SERVICES=${N_SERVICES:-10000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
LAT_DURATION=${LAT_DURATION:-10}
CG_QUERIES=${CG_QUERIES:-50000}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
NX_PERCENT=10
QUERY_LINES=100000

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

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

log "building meridian (release)"
cargo build --release --quiet --bin meridian
MERIDIAN=$ROOT/target/release/meridian
[[ -x $MERIDIAN ]] || die "no $MERIDIAN after the build"

# --- work directory and cleanup ------------------------------------------------------------
WORK=$(mktemp -d /tmp/meridian-bench-dns.XXXXXX)
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [[ ${KEEP:-0} == 1 ]]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 - <<'EOF'
import socket
while True:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
    port = u.getsockname()[1]
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        t.bind(("127.0.0.1", port)); print(port); break
    except OSError:
        pass
    finally:
        t.close(); u.close()
EOF
}

# --- the fleet, the zone and the queries ---------------------------------------------------
log "generating $N_SERVICES services x 3 clusters, the Knot zone and the query files in $WORK"
python3 - "$WORK" "$N_SERVICES" "$NX_PERCENT" "$QUERY_LINES" "$CG_QUERIES" <<'EOF'
import os, random, sys
work, n, nx_pct, lines, cg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
clusters = [("c1", "eu", "eu-1a"), ("c2", "eu", "eu-2a"), ("c3", "us", "us-1a")]
os.makedirs(f"{work}/fleet/hub")
with open(f"{work}/fleet/hub/members.yaml", "w") as f:
    for i, (name, region, zone) in enumerate(clusters, 1):
        # Clients of each cluster live in 100.64.i.0/24: nobody claims 127.0.0.1.
        f.write(f"""---
apiVersion: meridian.io/v1alpha1
kind: MemberCluster
metadata: {{name: {name}, labels: {{topology.kubernetes.io/region: {region}, topology.kubernetes.io/zone: {zone}}}}}
spec:
  source: {{directory: {{path: ../clusters/{name}}}}}
  network: {{name: n1, dnsClientCIDRs: [100.64.{i}.0/24]}}
""")
def addr(c, s):
    return f"10.{c}.{s // 250}.{s % 250 + 1}"
for c, (name, _, zone) in enumerate(clusters, 1):
    os.makedirs(f"{work}/fleet/clusters/{name}")
    with open(f"{work}/fleet/clusters/{name}/services.yaml", "w") as f:
        for s in range(n):
            f.write(
                f"---\n{{apiVersion: v1, kind: Service, metadata: {{name: s{s}, namespace: bench}}, spec: {{ports: [{{name: http, port: 80, protocol: TCP}}]}}}}\n"
                f"---\n{{apiVersion: multicluster.x-k8s.io/v1alpha1, kind: ServiceExport, metadata: {{name: s{s}, namespace: bench}}}}\n"
                f"---\n{{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {{name: s{s}-{name}, namespace: bench, labels: {{kubernetes.io/service-name: s{s}}}}}, "
                f"addressType: IPv4, ports: [{{name: http, port: 80, protocol: TCP}}], endpoints: [{{addresses: [{addr(c, s)}], conditions: {{ready: true}}, zone: {zone}}}]}}\n"
            )
with open(f"{work}/global.zone", "w") as f:
    # Same SOA timers and TTL as meridian's (ttl 5; refresh 60, retry 10, expire 3600, minimum = ttl).
    f.write("$ORIGIN global.\n$TTL 5\n@ SOA ns.global. hostmaster.global. 1 60 10 3600 5\n@ NS ns.global.\nns A 127.0.0.1\n")
    for s in range(n):
        for c in range(1, len(clusters) + 1):
            f.write(f"s{s}.bench A {addr(c, s)}\n")
rng = random.Random(42)
def query():
    if rng.randrange(100) < nx_pct:
        return f"x{rng.randrange(n)}.bench.global A\n"
    return f"s{rng.randrange(n)}.bench.global A\n"
with open(f"{work}/queries.txt", "w") as f:
    f.writelines(query() for _ in range(lines))
# Callgrind: one pass over every distinct name of queries.txt (cold cache), then a run of
# exactly `cg` queries from the same distribution (warm).
with open(f"{work}/queries.txt") as f:
    distinct = sorted(set(f))
with open(f"{work}/cg-cold.txt", "w") as f:
    f.writelines(distinct)
with open(f"{work}/cg-warm.txt", "w") as f:
    f.writelines(query() for _ in range(cg))
print(len(distinct), file=open(f"{work}/distinct", "w"))
EOF
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

write_knot_conf() { # dir port
    mkdir -p "$1"
    cp "$WORK/global.zone" "$1/global.zone"
    cat >"$1/knot.conf" <<EOF
server:
    rundir: "$1"
    listen: 127.0.0.1@$2
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
log:
  - target: stderr
    any: warning
database:
    storage: "$1"
template:
  - id: default
    storage: "$1"
    file: "%s.zone"
    zonefile-sync: -1
    zonefile-load: whole
    journal-content: none
    semantic-checks: off
zone:
  - domain: global
EOF
}

# start_server NAME PREFIX... ; sets SERVER_PID. The server runs on $SERVER_CPU.
start_meridian() { # [wrapper...]
    MERIDIAN_LOG=warn taskset -c "$SERVER_CPU" "$@" "$MERIDIAN" serve --config "$WORK/fleet/meridian.yaml" \
        --dns-listen "127.0.0.1:$MPORT" --admin-listen "127.0.0.1:$MADMIN" --dns-udp-workers 1 \
        >>"$WORK/meridian.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
}
start_knot() { # [wrapper...]
    write_knot_conf "$WORK/knot" "$KPORT"
    taskset -c "$SERVER_CPU" "$@" knotd -c "$WORK/knot/knot.conf" >>"$WORK/knot.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
}
stop_server() { # pid
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 600); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    local p keep=()
    for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# wait_answer PORT PID LOG TIMEOUT: until s0.bench.global A gets NOERROR with 3 addresses.
wait_answer() {
    local port=$1 pid=$2 logf=$3 timeout=$4 start=$SECONDS out
    while ((SECONDS - start < timeout)); do
        kill -0 "$pid" 2>/dev/null || { tail -20 "$logf" >&2; die "server (pid $pid) exited while starting; log above"; }
        out=$(kdig @127.0.0.1 -p "$port" +notcp +time=1 +retry=0 +noall +answer s0.bench.global A 2>/dev/null || true)
        if [[ $(grep -c 'IN[[:space:]]*A[[:space:]]' <<<"$out") == 3 ]]; then return 0; fi
        sleep 0.2
    done
    tail -20 "$logf" >&2
    die "server on port $port did not answer s0.bench.global with 3 addresses within ${timeout}s"
}

check_answers() { # name port: the two servers must agree on what they answer
    local a
    a=$(kdig @127.0.0.1 -p "$2" +notcp +norec +noall +answer +authority "$3" A 2>&1 | awk '{print $1, $4, $5}' | sort | tr '\n' ' ')
    echo "$a"
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
CLK_TCK=$(getconf CLK_TCK)

# run_load PID PORT OUT [dnsperf args...]: dnsperf on $LOAD_CPU; prints "qps cpu% lost completed"
run_load() {
    local pid=$1 port=$2 out=$3; shift 3
    local t0 t1 c0 c1
    c0=$(cpu_ticks "$pid"); t0=$(date +%s.%N)
    taskset -c "$LOAD_CPU" dnsperf -s 127.0.0.1 -p "$port" -c 4 -q 200 -t 2 "$@" >"$out" 2>&1 || true
    t1=$(date +%s.%N); c1=$(cpu_ticks "$pid")
    local qps lost completed
    qps=$(awk '/Queries per second:/ {print $4}' "$out")
    lost=$(awk '/Queries lost:/ {print $3}' "$out")
    completed=$(awk '/Queries completed:/ {print $3}' "$out")
    [[ -n $qps ]] || { cat "$out" >&2; die "dnsperf failed (output above)"; }
    awk -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" -v hz="$CLK_TCK" -v q="$qps" -v l="$lost" -v n="$completed" \
        'BEGIN { printf "%.0f %.1f %s %s\n", q, 100 * (c1 - c0) / hz / (t1 - t0), l, n }'
}

median() { sort -g | awk '{a[NR] = $1} END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else printf "%.6g\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# --- 0. start both, check they answer the same ---------------------------------------------
log "starting meridian (udp $MPORT, admin $MADMIN) and knotd (udp $KPORT), both on cpu $SERVER_CPU"
T0=$(date +%s.%N)
start_meridian
MPID=$SERVER_PID
wait_answer "$MPORT" "$MPID" "$WORK/meridian.log" 120
M_READY=$(awk -v t0="$T0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.2f", t1 - t0 }')
start_knot
KPID=$SERVER_PID
wait_answer "$KPORT" "$KPID" "$WORK/knot.log" 60
log "meridian answered after ${M_READY}s"

for name in s0.bench.global s4242.bench.global x1.bench.global; do
    m=$(check_answers meridian "$MPORT" "$name")
    k=$(check_answers knot "$KPORT" "$name")
    # Compare names, types and addresses (SOA serials differ; compare the first fields only).
    ms=$(kdig @127.0.0.1 -p "$MPORT" +notcp +norec "$name" A | awk '/status:/ {print $6}')
    ks=$(kdig @127.0.0.1 -p "$KPORT" +notcp +norec "$name" A | awk '/status:/ {print $6}')
    log "  $name  meridian: $ms $m | knot: $ks $k"
    [[ $ms == "$ks" ]] || die "meridian and knot disagree on the status for $name"
    [[ $(tr ' ' '\n' <<<"$m" | grep -c '^10\.') == $(tr ' ' '\n' <<<"$k" | grep -c '^10\.') ]] || die "meridian and knot disagree on $name"
done
msize=$(kdig @127.0.0.1 -p "$MPORT" +notcp s0.bench.global A | awk '/Received/ {print $2}')
ksize=$(kdig @127.0.0.1 -p "$KPORT" +notcp s0.bench.global A | awk '/Received/ {print $2}')
log "  reply sizes for s0.bench.global A (kdig, with EDNS): meridian $msize B, knot $ksize B"

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
    read -r qps cpu lost completed < <(run_load "$pid" "$port" "$WORK/rate-$i-$s.txt" -d "$WORK/queries.txt" -l "$DURATION")
    rcodes=$(awk -F': ' '/Response codes:/ {print $2}' "$WORK/rate-$i-$s.txt")
    log "  round $i $(printf '%-8s' "$s") ${qps} q/s, server cpu ${cpu} %, lost ${lost}; ${rcodes}"
    echo "$s $qps $cpu $lost" >>"$WORK/rates"
done
M_QPS=$(awk '$1 == "meridian" {print $2}' "$WORK/rates" | median)
K_QPS=$(awk '$1 == "knot" {print $2}' "$WORK/rates" | median)
M_CPU=$(awk '$1 == "meridian" {print $3}' "$WORK/rates" | median)
K_CPU=$(awk '$1 == "knot" {print $3}' "$WORK/rates" | median)
RATE_RATIO=$(awk -v m="$M_QPS" -v k="$K_QPS" 'BEGIN { printf "%.3f", m / k }')
LIMIT_NOTE=""
for pair in "meridian $M_CPU" "knot $K_CPU"; do
    set -- $pair
    if awk -v c="$2" 'BEGIN { exit !(c < 90) }'; then
        LIMIT_NOTE+="  note: $1's core was at $2 % (< 90 %) at its top rate: the load generator (dnsperf on one core), not $1, was the limit; its figure is a lower bound."$'\n'
    fi
done

# --- 2. latency -------------------------------------------------------------------------------
# lat_run PID PORT RATE OUT: p50 and p99 in ms from dnsperf -v (lost queries count as +inf).
lat_run() {
    local pid=$1 port=$2 rate=$3 out=$4
    read -r qps cpu lost completed < <(run_load "$pid" "$port" "$out" -d "$WORK/queries.txt" -l "$LAT_DURATION" -Q "$rate" -v)
    awk '/^> / {print $NF}' "$out" | sort -g >"$out.lat"
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
for s in meridian knot knot meridian; do
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
# The cold pass and the warm run go at a modest rate: a server under callgrind is ~50x slower,
# and a lost query would not be counted.
CG_RATE=${CG_RATE:-2000}
cg_total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
# callgrind_measure NAME start_fn PORT: prints "startup_ir cold_ir cold_n warm_ir warm_n"
callgrind_measure() {
    local name=$1 start=$2 port=$3 dir="$WORK/cg-$1"
    mkdir -p "$dir"
    $start valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" --dump-instr=no --collect-jumps=no
    local pid=$SERVER_PID
    local logf="$WORK/$name.log"
    [[ $name == meridian ]] || logf="$WORK/knot.log"
    wait_answer "$port" "$pid" "$logf" 400
    callgrind_control --dump=startup "$pid" >/dev/null
    sleep 1
    read -r _ _ _ cold_n < <(run_load "$pid" "$port" "$dir/cold.txt" -d "$WORK/cg-cold.txt" -n 1 -Q "$CG_RATE" -t 10)
    callgrind_control --dump=cold "$pid" >/dev/null
    sleep 1
    read -r _ _ _ warm_n < <(run_load "$pid" "$port" "$dir/warm.txt" -d "$WORK/cg-warm.txt" -n 1 -Q "$CG_RATE" -t 10)
    callgrind_control --dump=warm "$pid" >/dev/null
    sleep 1
    stop_server "$pid"
    local f startup cold warm
    # Dumps are numbered in order: .1 start-up, .2 cold pass, .3 warm run.
    startup=$(cg_total "$dir/callgrind.out.1")
    cold=$(cg_total "$dir/callgrind.out.2")
    warm=$(cg_total "$dir/callgrind.out.3")
    [[ -n $startup && -n $cold && -n $warm ]] || { ls -l "$dir" >&2; die "callgrind dumps missing for $name"; }
    echo "$startup $cold $cold_n $warm $warm_n"
}
log "callgrind: meridian (start-up, one cold pass over $N_DISTINCT names, $CG_QUERIES warm queries at $CG_RATE q/s)"
read -r MCG_START MCG_COLD MCG_COLD_N MCG_WARM MCG_WARM_N < <(callgrind_measure meridian start_meridian "$MPORT")
log "callgrind: knot"
read -r KCG_START KCG_COLD KCG_COLD_N KCG_WARM KCG_WARM_N < <(callgrind_measure knot start_knot "$KPORT")
per() { awk -v ir="$1" -v n="$2" 'BEGIN { printf "%.0f", ir / n }'; }
M_IPQ=$(per "$MCG_WARM" "$MCG_WARM_N"); M_IPQ_COLD=$(per "$MCG_COLD" "$MCG_COLD_N")
K_IPQ=$(per "$KCG_WARM" "$KCG_WARM_N"); K_IPQ_COLD=$(per "$KCG_COLD" "$KCG_COLD_N")
M_IPQ_ALL=$(awk -v a="$MCG_START" -v b="$MCG_COLD" -v c="$MCG_WARM" -v n="$MCG_COLD_N" -v m="$MCG_WARM_N" 'BEGIN { printf "%.0f", (a + b + c) / (n + m) }')
K_IPQ_ALL=$(awk -v a="$KCG_START" -v b="$KCG_COLD" -v c="$KCG_WARM" -v n="$KCG_COLD_N" -v m="$KCG_WARM_N" 'BEGIN { printf "%.0f", (a + b + c) / (n + m) }')
IPQ_RATIO=$(awk -v m="$M_IPQ" -v k="$K_IPQ" 'BEGIN { printf "%.2f", m / k }')
IPQ_RATIO_COLD=$(awk -v m="$M_IPQ_COLD" -v k="$K_IPQ_COLD" 'BEGIN { printf "%.2f", m / k }')

# --- report ------------------------------------------------------------------------------------
fmt() { awk -v x="$1" 'BEGIN { if (x == "inf") print "inf"; else printf "%.3f", x }'; }
pf() { if awk "BEGIN { exit !($1) }"; then echo PASS; else echo FAIL; fi; }
ratio_or_inf() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "inf") print "inf"; else if (b == "inf") print 0; else printf "%.2f", a / b }'; }
LAT_RATIO=$(ratio_or_inf "$MH_P99" "$KH_P99")

echo
echo "=== meridian DNS benchmark: $N_SERVICES services x 3 endpoints, UDP, ${NX_PERCENT} % NXDOMAIN, one server core ==="
echo "dnsperf $(dnsperf -h 2>&1 | awk '/^Version/ {print $2}'), $(knotd --version 2>&1 | head -1), $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo))"
echo "meridian answered its first query ${M_READY}s after start"
echo
printf '%-44s %14s %14s %10s\n' "" "meridian" "knot" "ratio"
printf '%-44s %14s %14s %10s\n' "top rate, q/s (median of $ROUNDS rounds each)" "$M_QPS" "$K_QPS" "$RATE_RATIO"
printf '%-44s %14s %14s\n' "server CPU at top rate, % of one core" "$M_CPU" "$K_CPU"
printf '%-44s %14s %14s %10s\n' "Ir/query, warm ($MCG_WARM_N queries)" "$M_IPQ" "$K_IPQ" "$IPQ_RATIO"
printf '%-44s %14s %14s %10s\n' "Ir/query, cold (first query of each name)" "$M_IPQ_COLD" "$K_IPQ_COLD" "$IPQ_RATIO_COLD"
printf '%-44s %14s %14s\n' "Ir, start-up until the first answer" "$MCG_START" "$KCG_START"
printf '%-44s %14s %14s\n' "Ir/query, start-up + cold + warm amortised" "$M_IPQ_ALL" "$K_IPQ_ALL"
printf '%-44s %14s %14s\n' "p50 / p99 ms at 80 % of meridian's top ($L80)" "$(fmt "$M80_P50") / $(fmt "$M80_P99")" "-"
printf '%-44s %14s %14s\n' "p50 ms at half of Knot's top ($LHALF q/s)" "$(fmt "$MH_P50")" "$(fmt "$KH_P50")"
printf '%-44s %14s %14s %10s\n' "p99 ms at half of Knot's top ($LHALF q/s)" "$(fmt "$MH_P99")" "$(fmt "$KH_P99")" "$LAT_RATIO"
printf '%s' "$LIMIT_NOTE"
echo
echo "DESIGN §8 budgets:"
echo "  [$(pf "$RATE_RATIO >= 0.8")] DNS answers per second, one server core, 10k services x 3 endpoints: >= 0.8 x Knot   ($RATE_RATIO x)"
echo "  [$(pf "$IPQ_RATIO <= 1.25")] DNS user-space instructions per query (callgrind): <= 1.25 x Knot's   ($IPQ_RATIO x warm; $IPQ_RATIO_COLD x cold)"
if [[ $LAT_RATIO == inf ]]; then lat_pf=FAIL; else lat_pf=$(pf "$LAT_RATIO <= 1.5"); fi
echo "  [$lat_pf] DNS latency at half of Knot's top rate: p99 <= 1.5 x Knot's p99 at the same rate   ($LAT_RATIO x)"
echo
echo "meridian's top 15 functions (warm run, callgrind_annotate, inclusive of nothing: self cost):"
callgrind_annotate --threshold=100 "$WORK/cg-meridian/callgrind.out.3" 2>/dev/null | awk '/^-+$/ {s++} s >= 3 && NF' | sed -n '2,16p' | cut -c1-200 || true
