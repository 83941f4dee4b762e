# Shared by the DNS benchmarks (dns.sh, dns-churn.sh), after bench/lib.sh: meridian and Knot
# on one server core ($SERVER_CPU), dnsperf on the other ($LOAD_CPU), over the fleet of
# bench/dns_fleet.py in $WORK (run from the repository root). Uses $MERIDIAN, $MPORT, $MADMIN (meridian's DNS and admin
# ports) and $KPORT (Knot's; its control socket is $WORK/knot/knot.sock).

write_knot_conf() { # dir port
    mkdir -p "$1"
    cp "$WORK/global.zone" "$1/global.zone"
    cat >"$1/knot.conf" <<KNOT
server:
    rundir: "$1"
    listen: 127.0.0.1@$2
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
control:
    listen: "$1/knot.sock"
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
KNOT
}

# start_meridian / start_knot [WRAPPER...]: start in the background on $SERVER_CPU (through
# WRAPPER, e.g. valgrind); set SERVER_PID.
start_meridian() {
    # xDS on a free port too: the default one may be another meridian's (a test suite's).
    MXDS=${MXDS:-$(free_port)}
    MERIDIAN_LOG=warn taskset -c "$SERVER_CPU" "$@" "$MERIDIAN" serve --config "$WORK/fleet/meridian.yaml" \
        --dns-listen "127.0.0.1:$MPORT" --admin-listen "127.0.0.1:$MADMIN" --xds-listen "127.0.0.1:$MXDS" --dns-udp-workers 1 \
        >>"$WORK/meridian.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
}
start_knot() {
    write_knot_conf "$WORK/knot" "$KPORT"
    taskset -c "$SERVER_CPU" "$@" knotd -c "$WORK/knot/knot.conf" >>"$WORK/knot.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
}
forget_pid() { # pid: no longer one for the cleanup to stop
    local p keep=()
    for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}
stop_server() { # pid
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 600); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    forget_pid "$1"
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

# Knot pins its UDP worker threads to CPUs itself (worker i on CPU i), which overrides
# taskset: re-pin every thread of a server once it answers, and check.
pin_all() { # pid
    taskset -a -c -p "$SERVER_CPU" "$1" >/dev/null
    local t bad=0
    for t in /proc/"$1"/task/*; do
        [[ $(taskset -c -p "${t##*/}" 2>/dev/null | awk '{print $NF}') == "$SERVER_CPU" ]] || bad=$((bad + 1))
    done
    ((bad == 0)) || log "  warning: $bad thread(s) of pid $1 are not on cpu $SERVER_CPU"
}

check_answers() { # port qname: answer and authority as sorted "owner type data" words
    kdig @127.0.0.1 -p "$1" +notcp +norec +noall +answer +authority "$2" A 2>&1 | awk '{print $1, $4, $5}' | sort | tr '\n' ' '
}

cpu_ticks() { awk '{print $14 + $15, $14}' "/proc/$1/stat"; }  # "user+system user"
CLK_TCK=$(getconf CLK_TCK)
# core_ticks CPU: "busy irq+softirq total" jiffies of one core (/proc/stat).
core_ticks() { awk -v c="cpu$1" '$1 == c {print $2 + $3 + $4 + $7 + $8 + $9, $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
sample() { # pid -> "server_ticks|core|load_core|time"
    echo "$(cpu_ticks "$1")|$(core_ticks "$SERVER_CPU")|$(core_ticks "$LOAD_CPU")|$(date +%s.%N)"
}

# run_load PID PORT OUT [dnsperf args...]: dnsperf on $LOAD_CPU; prints
# "qps server_cpu% lost completed server_core_busy% server_core_irq% load_core_busy% server_user%".
# With -l L (L >= 4) the CPU figures cover seconds 1 .. L-1 of the run (steady state, without
# start-up and the wait for lost queries at the end); else the whole run.
run_load() {
    local pid=$1 port=$2 out=$3; shift 3
    local dur="" prev="" arg a b dp
    for arg in "$@"; do [[ $prev == -l ]] && dur=$arg; prev=$arg; done
    if [[ -n $dur ]] && ((dur >= 4)); then
        taskset -c "$LOAD_CPU" dnsperf -s 127.0.0.1 -p "$port" -c 4 -q 200 -t 2 "$@" >"$out" 2>&1 &
        dp=$!
        sleep 1
        a=$(sample "$pid")
        sleep $((dur - 2))
        b=$(sample "$pid")
        wait "$dp" || true
    else
        a=$(sample "$pid")
        taskset -c "$LOAD_CPU" dnsperf -s 127.0.0.1 -p "$port" -c 4 -q 200 -t 2 "$@" >"$out" 2>&1 || true
        b=$(sample "$pid")
    fi
    local qps lost completed
    qps=$(awk '/Queries per second:/ {print $4}' "$out")
    lost=$(awk '/Queries lost:/ {print $3}' "$out")
    completed=$(awk '/Queries completed:/ {print $3}' "$out")
    [[ -n $qps ]] || { cat "$out" >&2; die "dnsperf failed (output above)"; }
    awk -v a="$a" -v b="$b" -v hz="$CLK_TCK" -v q="$qps" -v l="$lost" -v n="$completed" '
        BEGIN {
            split(a, x, "|"); split(b, y, "|")
            split(x[1], px, " "); split(y[1], py, " ")
            split(x[2], sx, " "); split(y[2], sy, " "); split(x[3], lx, " "); split(y[3], ly, " ")
            st = sy[3] - sx[3]; lt = ly[3] - lx[3]; dt = (y[4] - x[4]) * hz
            printf "%.0f %.1f %s %s %.1f %.1f %.1f %.1f\n", q, 100 * (py[1] - px[1]) / dt, l, n,
                ((st > 0) ? 100 * (sy[1] - sx[1]) / st : 0), ((st > 0) ? 100 * (sy[2] - sx[2]) / st : 0),
                ((lt > 0) ? 100 * (ly[1] - lx[1]) / lt : 0), 100 * (py[2] - px[2]) / dt
        }'
}

median() { sort -g | awk '{a[NR] = $1} END { if (NR == 0) { print "nan"; exit } if (NR % 2) print a[(NR + 1) / 2]; else printf "%.6g\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
pf() { if awk "BEGIN { exit !($1) }"; then echo PASS; else echo FAIL; fi; }
