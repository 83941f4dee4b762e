#!/usr/bin/env bash
# xDS benchmark: meridian against go-control-plane (the reference Go xDS server library)
# serving the same fleet to many ADS streams.
#
#   bench/xds.sh            (from the repository root; runs as root, needs Go and cargo)
#
# The fleet ($CLUSTERS clusters x $SERVICES services x $ENDPOINTS endpoints, all exported from
# every cluster; bench/xds/fleet/fleet.go describes it): meridian reads it as a directory fleet
# written here, gcp-server (bench/xds/cmd/gcp-server: go-control-plane v0.14 SnapshotCache, one
# snapshot per member cluster, the node hash being metadata CLUSTER_ID) builds the same
# resources in memory from the same three numbers. Both serve CDS clusters
# `s<i>.bench.global:80` (type EDS over ADS) and their ClusterLoadAssignments, one locality per
# member cluster, priorities by locality relative to the client's cluster. The first round
# checks that both send the same resources to a node of c000 (printed).
#
# The load (bench/xds/cmd/xds-load): N concurrent ADS streams (StreamAggregatedResources, state
# of the world), one HTTP/2 connection each, node CLUSTER_ID spread over the clusters,
# user_agent_name "envoy"; each stream subscribes CDS wildcard and EDS for $EDS_SERVICES
# services (s0 and others) and ACKs every response. Measured per run:
#   - initial state: from the first dial until every stream has ACKed CDS and all its EDS names;
#   - server memory per stream: (VmRSS once every stream has its initial state, after 2 s)
#     minus (VmRSS before the first stream) over N;
#   - convergence after one endpoint change (endpoint 0 of s0 in c000 gets a new address): for
#     each stream, the time from the trigger until it has ACKed an EDS response holding the new
#     address; p50, p99, max over the N streams (a stream that never converges counts as +inf).
#     The trigger for meridian: the EndpointSlice file of s0 in c000 replaced by an atomic
#     rename; for gcp-server: SIGHUP, on which it rebuilds and sets the snapshot of every node
#     group (what a go-control-plane user does on a change), without any debounce.
#   Meridian runs with its defaults: the directory source reads a change up to 50 ms after it
#   (inotify, 50 ms debounce), and xDS pushes are debounced (100 ms quiet, 1 s max), so 100-150
#   ms of its convergence is by design (the "min" row shows it); go-control-plane pushes at once.
#   MERIDIAN_ARGS="--xds-debounce-ms 0" takes the push debounce out.
# Also printed: server CPU per phase, and how much of each core other processes took during the
# initial state and the change (a shared box makes figures noisy). A run where meridian could not
# get an inotify instance for c000's directory (fs.inotify.max_user_instances is per user, and
# meridian takes one per directory) and so polled it is flagged.
# Every run starts its server afresh; rounds alternate the order (M G, G M, M G, ...); medians
# over $ROUNDS rounds. Servers run on $SERVER_CPU (taskset; one core each: tokio and the Go
# runtime both size themselves from the affinity mask), xds-load on $LOAD_CPU.
#
# Knobs (environment): STREAMS="1000 10000" ROUNDS=3 CLUSTERS=10 SERVICES=100 ENDPOINTS=3
# EDS_SERVICES=10 SERVER_CPU=1 LOAD_CPU=0 SYNC_TIMEOUT=300 CONVERGE_TIMEOUT=60
# MERIDIAN=path (skip the cargo build and use that binary) MERIDIAN_ARGS="..." (extra flags for
# meridian serve, e.g. "--xds-debounce-ms 0") KEEP=1 (keep the work directory).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
STREAMS=${STREAMS:-"1000 10000"}
ROUNDS=${ROUNDS:-3}
CLUSTERS=${CLUSTERS:-10}
SERVICES=${SERVICES:-100}
ENDPOINTS=${ENDPOINTS:-3}
EDS_SERVICES=${EDS_SERVICES:-10}
SERVER_CPU=${SERVER_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
SYNC_TIMEOUT=${SYNC_TIMEOUT:-300}
CONVERGE_TIMEOUT=${CONVERGE_TIMEOUT:-60}
MERIDIAN_ARGS=${MERIDIAN_ARGS:-}
COMMAND="STREAMS=\"$STREAMS\" ROUNDS=$ROUNDS CLUSTERS=$CLUSTERS SERVICES=$SERVICES ENDPOINTS=$ENDPOINTS EDS_SERVICES=$EDS_SERVICES${MERIDIAN_ARGS:+ MERIDIAN_ARGS=\"$MERIDIAN_ARGS\"} bench/xds.sh"

source "$ROOT/bench/lib.sh"

# --- prerequisites -----------------------------------------------------------------------
missing=()
command -v python3 >/dev/null || missing+=(python3)
command -v curl >/dev/null || missing+=(curl)
command -v taskset >/dev/null || missing+=(util-linux)
command -v flock >/dev/null || missing+=(util-linux)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v go >/dev/null || die "the Go toolchain ('go') is needed to build bench/xds (gcp-server, xds-load)"
[[ $(nproc) -ge 2 ]] || log "warning: fewer than 2 cores; server and load generator share a core"
max_streams=$(tr ' ' '\n' <<<"$STREAMS" | sort -n | tail -1)
# One fd per stream on each side, plus slack.
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"
(($(ulimit -n) >= max_streams + 1024)) || die "open-file limit $(ulimit -n) is too low for $max_streams streams (ulimit -n)"

meridian_binary
"$MERIDIAN" serve --help 2>&1 | grep -q -- --xds-listen || die "$MERIDIAN serve has no --xds-listen: no xDS server in this build"

# gcp-server and xds-load: built once per source hash into a cache outside the repository.
build_go_tools() {
    local hash cache
    hash=$( (cd "$ROOT/bench/xds" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs sha256sum
        go version) | sha256sum | cut -c1-16)
    cache="${XDG_CACHE_HOME:-$HOME/.cache}/meridian-bench/xds-$hash"
    mkdir -p "$cache"
    exec 9>"$cache/.lock"
    flock 9
    if [[ ! -x $cache/gcp-server || ! -x $cache/xds-load ]]; then
        log "building bench/xds (go-control-plane server, load client) into $cache"
        (cd "$ROOT/bench/xds" && GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath -o "$cache/" ./cmd/gcp-server ./cmd/xds-load) \
            >"$cache/build.log" 2>&1 || { tail -30 "$cache/build.log" >&2; die "building bench/xds failed (log: $cache/build.log)"; }
    fi
    exec 9>&-
    GCP_SERVER=$cache/gcp-server
    XDS_LOAD=$cache/xds-load
}
build_go_tools

bench_workdir xds

# --- the fleet (as bench/memory.sh writes it: compact flow-style YAML) -------------------------
# Everything of a cluster in one services.yaml, except the EndpointSlice of s0 in c000, which has
# a file of its own: the change replaces that file. $WORK/slice-changed.yaml is the replacement.
log "writing the directory fleet: $CLUSTERS clusters x $SERVICES services x $ENDPOINTS endpoints in $WORK/fleet"
python3 - "$WORK" "$CLUSTERS" "$SERVICES" "$ENDPOINTS" <<'EOF'
import os, sys
work, nc, ns, ne = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
CHANGE_ADDR = "10.255.255.254"  # fleet.ChangeAddr
def cname(c): return f"c{c:03d}"
def region(c): return f"r{c % 3}"
def zone(c): return f"r{c % 3}-z{(c // 3) % 2}"
def addr(c, s, e, changed=False):
    if changed and c == 0 and s == 0 and e == 0:
        return CHANGE_ADDR
    i = s * ne + e
    return f"10.{c}.{i // 250}.{i % 250 + 1}"
def slice_doc(c, s, changed=False):
    eps = ", ".join(
        f"{{addresses: [{addr(c, s, e, changed)}], conditions: {{ready: true}}, zone: {zone(c)}}}" for e in range(ne)
    )
    return (
        f"---\n{{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {{name: s{s}-{cname(c)}, namespace: bench, "
        f"labels: {{kubernetes.io/service-name: s{s}}}}}, addressType: IPv4, ports: [{{name: http, port: 8080, protocol: TCP}}], endpoints: [{eps}]}}\n"
    )
os.makedirs(f"{work}/fleet/hub")
with open(f"{work}/fleet/hub/members.yaml", "w") as hub:
    for c in range(nc):
        hub.write(
            f"---\n{{apiVersion: meridian.io/v1alpha1, kind: MemberCluster, metadata: {{name: {cname(c)}, labels: "
            f"{{topology.kubernetes.io/region: {region(c)}, topology.kubernetes.io/zone: {zone(c)}}}}}, "
            f"spec: {{source: {{directory: {{path: ../clusters/{cname(c)}}}}}, network: {{name: n1, "
            f"podCIDRs: [10.{c}.0.0/16], dnsClientCIDRs: [127.1.{c}.0/24]}}}}}}\n"
        )
for c in range(nc):
    d = f"{work}/fleet/clusters/{cname(c)}"
    os.makedirs(d)
    out = []
    for s in range(ns):
        out.append(
            f"---\n{{apiVersion: v1, kind: Service, metadata: {{name: s{s}, namespace: bench}}, spec: {{ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}}}\n"
            f"---\n{{apiVersion: multicluster.x-k8s.io/v1alpha1, kind: ServiceExport, metadata: {{name: s{s}, namespace: bench}}}}\n"
        )
        if (c, s) != (0, 0):
            out.append(slice_doc(c, s))
    with open(f"{d}/services.yaml", "w") as f:
        f.write("".join(out))
with open(f"{work}/slice-orig.yaml", "w") as f:
    f.write(slice_doc(0, 0))
with open(f"{work}/slice-changed.yaml", "w") as f:
    f.write(slice_doc(0, 0, changed=True))
EOF
SLICE=$WORK/fleet/clusters/c000/s0-slice.yaml
cat >"$WORK/fleet/meridian.yaml" <<EOF
hub: {directory: hub}
dns:
  zones: [{name: global, style: global}]
  ttl: 5
EOF
N_ENDPOINTS=$((CLUSTERS * SERVICES * ENDPOINTS))

# --- servers -----------------------------------------------------------------------------------
# start_meridian / start_gcp: a fresh server on $SERVER_CPU; sets SERVER_PID and XDS_PORT, and
# returns once it serves.
start_meridian() {
    cp "$WORK/slice-orig.yaml" "$SLICE"
    XDS_PORT=$(free_port)
    local dns admin
    dns=$(free_port)
    admin=$(free_port)
    ADMIN_PORT=$admin
    # shellcheck disable=SC2086 # MERIDIAN_ARGS is a list of flags
    MERIDIAN_LOG=warn taskset -c "$SERVER_CPU" "$MERIDIAN" serve --config "$WORK/fleet/meridian.yaml" \
        --xds-listen "127.0.0.1:$XDS_PORT" --dns-listen "127.0.0.1:$dns" --admin-listen "127.0.0.1:$admin" \
        $MERIDIAN_ARGS >>"$WORK/meridian.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    local start=$SECONDS have
    while ((SECONDS - start < 120)); do
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$WORK/meridian.log" >&2; die "meridian exited while starting; log above"; }
        if curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:$admin/readyz"; then
            have=$(curl -sf --max-time 2 "http://127.0.0.1:$admin/metrics" | awk '$1 == "meridian_index_endpoints" {print $2; exit}' || true)
            [[ -z $have || $have == "$N_ENDPOINTS" ]] && return 0
        fi
        sleep 0.2
    done
    tail -20 "$WORK/meridian.log" >&2
    die "meridian not ready with $N_ENDPOINTS endpoints after 120 s"
}
start_gcp() {
    XDS_PORT=$(free_port)
    local logf=$WORK/gcp-server.log lines
    touch "$logf"
    lines=$(wc -l <"$logf")
    taskset -c "$SERVER_CPU" "$GCP_SERVER" -listen "127.0.0.1:$XDS_PORT" \
        -clusters "$CLUSTERS" -services "$SERVICES" -endpoints "$ENDPOINTS" >>"$logf" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    local start=$SECONDS
    while ((SECONDS - start < 60)); do
        kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$logf" >&2; die "gcp-server exited while starting; log above"; }
        tail -n +"$((lines + 1))" "$logf" | grep -q ' ready: ' && return 0
        sleep 0.1
    done
    die "gcp-server did not start within 60 s"
}
stop_server() { # pid
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    local p keep=()
    for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}
trigger_of() { # server -> xds-load -trigger value
    if [[ $1 == meridian ]]; then echo "rename:$WORK/slice-next.yaml:$SLICE"; else echo "signal:$SERVER_PID"; fi
}
load_cmd() { # streams server -> the xds-load command line (words)
    echo taskset -c "$LOAD_CPU" "$XDS_LOAD" -addr "127.0.0.1:$XDS_PORT" -streams "$1" \
        -clusters "$CLUSTERS" -services "$SERVICES" -endpoints "$ENDPOINTS" -eds-services "$EDS_SERVICES" \
        -rss-pid "$SERVER_PID" -server-cpu "$SERVER_CPU" -load-cpu "$LOAD_CPU" -trigger "$(trigger_of "$2")" \
        -sync-timeout "${SYNC_TIMEOUT}s" -converge-timeout "${CONVERGE_TIMEOUT}s" -label "$2"
}
start_server() { if [[ $1 == meridian ]]; then start_meridian; else start_gcp; fi; }

# --- 0. how busy is the box already? same resources from both? -----------------------------
core_ticks() { awk -v c="cpu$1" '$1 == c {print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
busy_now() { # seconds -> "cpu0% cpu1%" busy over that time
    local a b
    a=$(core_ticks 0; core_ticks 1); sleep "$1"; b=$(core_ticks 0; core_ticks 1)
    paste <(echo "$a") <(echo "$b") | awk '{ printf "%.0f ", (($4 > $2) ? 100 * ($3 - $1) / ($4 - $2) : 0) }'
}
PRE_BUSY=$(busy_now 2)
log "before starting: cores busy $PRE_BUSY% (other tenants of this box)"
if awk -v b="$PRE_BUSY" 'BEGIN { split(b, x, " "); exit !(x[1] + x[2] > 20) }'; then
    log "  warning: the box is busy; figures will be noisy (see 'other processes' in the table)"
fi

# meridian's directory source takes one inotify instance per directory (hub + each member):
# when the user's instances (fs.inotify.max_user_instances) run out, it polls instead and its
# convergence includes the poll interval. Such runs are flagged.
inotify_used() { find /proc/[0-9]*/fd -lname 'anon_inode:inotify' 2>/dev/null | wc -l; }
INOTIFY_MAX=$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null || echo 0)
if (($(inotify_used) + CLUSTERS + 1 > INOTIFY_MAX)); then
    log "  warning: $(inotify_used) of $INOTIFY_MAX inotify instances in use; meridian needs $((CLUSTERS + 1)) and will poll without them"
fi

# One stream of a c000 node against each server.
log "checking that both serve the same resources to a node of c000"
for s in meridian gcp; do
    start_server "$s"
    "$XDS_LOAD" -addr "127.0.0.1:$XDS_PORT" -streams 1 -clusters "$CLUSTERS" -services "$SERVICES" \
        -eds-services "$EDS_SERVICES" -trigger none -settle 0s -sync-timeout 30s -dump "$WORK/dump-$s.json" \
        >"$WORK/probe-$s.json" 2>>"$WORK/probe.log" || { cat "$WORK/probe-$s.json" "$WORK/probe.log" >&2; die "$s: one stream did not get its initial state"; }
    stop_server "$SERVER_PID"
done
SAME=$(python3 - "$WORK/dump-meridian.json" "$WORK/dump-gcp.json" <<'EOF'
import json, sys
def load(p):
    out = {}
    for r in json.load(open(p)):
        t = r["typeUrl"].rsplit(".", 1)[-1]
        for res in r.get("resources", []):
            name = res.get("name") or res.get("clusterName")
            if t == "ClusterLoadAssignment":  # order of localities and endpoints does not matter
                res["endpoints"] = sorted(res.get("endpoints", []), key=lambda l: json.dumps(l.get("locality"), sort_keys=True))
                for l in res["endpoints"]:
                    l["lbEndpoints"] = sorted(l.get("lbEndpoints", []), key=lambda e: json.dumps(e, sort_keys=True))
            out[(t, name)] = res
    return out
m, g = load(sys.argv[1]), load(sys.argv[2])
kinds = lambda d: {t: sum(1 for k in d if k[0] == t) for t, _ in d}
if m == g:
    print(f"identical: {kinds(m)}")
    sys.exit()
diffs = []
for k in sorted(set(m) | set(g)):
    if k not in m: diffs.append(f"only go-control-plane: {k}")
    elif k not in g: diffs.append(f"only meridian: {k}")
    elif m[k] != g[k]:
        a, b = m[k], g[k]
        fields = sorted(f for f in set(a) | set(b) if a.get(f) != b.get(f))
        diffs.append(f"{k[0]} {k[1]} differs in {fields}")
print(f"DIFFERENT (meridian {kinds(m)}, go-control-plane {kinds(g)}): " + "; ".join(diffs[:6]) + (f"; ... {len(diffs)} in all" if len(diffs) > 6 else ""))
EOF
)
log "  resources for a c000 node: $SAME"

# --- 1. the runs ---------------------------------------------------------------------------------
mkdir -p "$WORK/runs"
cat >"$WORK/summary.py" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
f = lambda v: "inf" if v is None else f"{v:.0f}"
line = (f"initial {r['synced']}/{r['streams']} in {r['sync_ms']:.0f} ms; converged {r['converged']}, "
        f"p50 {f(r['p50_ms'])} p99 {f(r['p99_ms'])} max {f(r['max_ms'])} ms; "
        f"{r.get('server_rss_per_stream_bytes', 0):.0f} B/stream; failed {r['failed_streams']}")
if r.get("errors"):
    line += f"; errors {r['errors']}"
line += (f"; other processes took {r['other_on_server_core_sync_pct']:.0f} / {r['other_on_server_core_change_pct']:.0f} % of the server core, "
         f"{r['other_on_load_core_sync_pct']:.0f} / {r['other_on_load_core_change_pct']:.0f} % of the load core (initial state / change)")
print(line)
EOF
: >"$WORK/runs.tsv"
for n in $STREAMS; do
    for ((i = 1; i <= ROUNDS; i++)); do
        if ((i % 2)); then order=(meridian gcp); else order=(gcp meridian); fi
        for s in "${order[@]}"; do
            t0=$SECONDS
            touch "$WORK/meridian.log"
            mlines=$(wc -l <"$WORK/meridian.log")
            start_server "$s"
            sleep 1
            cp "$WORK/slice-changed.yaml" "$WORK/slice-next.yaml"
            out=$WORK/runs/$n-$s-$i
            read -ra cmd <<<"$(load_cmd "$n" "$s")"
            echo "${cmd[*]}" >"$out.cmd"
            rc=0
            "${cmd[@]}" >"$out.json" 2>"$out.log" || rc=$?
            stop_server "$SERVER_PID"
            [[ -s $out.json ]] || { tail -20 "$out.log" >&2; die "xds-load printed nothing for $s, $n streams (exit $rc); log above"; }
            secs=$((SECONDS - t0))
            # The change is in c000's directory: did meridian have to poll that one?
            if [[ $s == meridian ]] && tail -n +"$((mlines + 1))" "$WORK/meridian.log" | grep 'polling only' | grep -q 'clusters/c000'; then
                python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); r["meridian_polled"] = True; json.dump(r, open(sys.argv[1], "w"))' "$out.json"
                log "    warning: meridian could not watch c000's directory at some point in this run ($(tail -n +"$((mlines + 1))" "$WORK/meridian.log" | sed 's/\x1b\[[0-9;]*m//g' | grep -o 'error=[^(]*' | sort -u | head -1)) and polled it instead"
            fi
            summary=$(python3 "$WORK/summary.py" "$out.json")
            log "  $n streams, round $i, $(printf '%-8s' "$s"): $summary ($secs s)"
            printf '%s\t%s\t%s\t%s\n' "$n" "$s" "$i" "$secs" >>"$WORK/runs.tsv"
            if [[ $rc != 0 ]]; then
                log "    xds-load exited $rc; its log: $out.log; command: $(cat "$out.cmd")"
                grep -v '^\s*$' "$out.log" | tail -5 | sed 's/^/      /' >&2
            fi
        done
    done
done

# --- report ----------------------------------------------------------------------------------------
echo
echo "=== meridian xDS benchmark: $CLUSTERS clusters x $SERVICES services x $ENDPOINTS endpoints; ADS state of the world, CDS wildcard + EDS for $EDS_SERVICES services per stream ==="
echo "$("$MERIDIAN" --version 2>/dev/null | head -1) (repository at $(git -C "$ROOT" log -1 --format=%h 2>/dev/null || echo ?))${MERIDIAN_ARGS:+ ($MERIDIAN_ARGS)} vs go-control-plane v0.14.0 (SnapshotCache, gRPC-Go v1.85.0, $(go version | awk '{print $3}')); servers on cpu $SERVER_CPU, xds-load on cpu $LOAD_CPU; $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "resources sent to a node of c000: $SAME"
echo "cores busy before the benchmark started: $PRE_BUSY% (cpu0 cpu1)"
python3 - "$WORK/runs" "$STREAMS" "$ROUNDS" <<'EOF'
import json, math, os, statistics, sys
runs, streams, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
INF = math.inf
def get(n, s):
    out = []
    for i in range(1, rounds + 1):
        p = f"{runs}/{n}-{s}-{i}.json"
        if os.path.exists(p) and os.path.getsize(p):
            out.append(json.load(open(p)))
    return out
def med(rs, k, scale=1):
    v = [INF if r.get(k) is None else r[k] * scale for r in rs]
    return statistics.median(v) if v else math.nan
def fmt(x, d=0):
    if x == INF: return "inf"
    if isinstance(x, float) and math.isnan(x): return "-"
    return f"{x:,.{d}f}"
def ratio(a, b):
    if a == INF: return "inf"
    if b == INF: return "0"
    if b == 0 or math.isnan(a) or math.isnan(b): return "-"
    return f"{a / b:.2f}"
rows = [
    ("convergence p50, ms", "p50_ms", 0),
    ("convergence p99, ms", "p99_ms", 0),
    ("convergence max, ms", "max_ms", 0),
    ("convergence min, ms (fixed delays)", "min_ms", 0),
    ("server memory per stream, bytes", "server_rss_per_stream_bytes", 0),
    ("initial state of all streams, ms", "sync_ms", 0),
    ("server CPU, initial state, s", "server_cpu_sync_s", 2),
    ("server CPU, change until converged, s", "server_cpu_change_s", 2),
    ("load-client CPU, change until converged, s", "client_cpu_change_s", 2),
    ("others on the server core, initial / change, %", ("other_on_server_core_sync_pct", "other_on_server_core_change_pct"), 0),
    ("others on the load core, initial / change, %", ("other_on_load_core_sync_pct", "other_on_load_core_change_pct"), 0),
]
print()
print(f"{'':50} {'meridian':>14} {'go-control-plane':>17} {'ratio M/G':>10}")
for n in streams:
    m, g = get(n, "meridian"), get(n, "gcp")
    print(f"{int(n):,} streams (median of {len(m)} / {len(g)} runs)")
    for label, k, d in rows:
        if isinstance(k, tuple):  # two figures, no ratio
            a, b = (" / ".join(fmt(med(rs, x), d) for x in k) for rs in (m, g))
            print(f"  {label:48} {a:>14} {b:>17}")
            continue
        a, b = med(m, k), med(g, k)
        print(f"  {label:48} {fmt(a, d):>14} {fmt(b, d):>17} {ratio(a, b):>10}")
    conv = lambda rs: "/".join(str(r["converged"]) for r in rs)
    fail = lambda rs: "/".join(str(r["failed_streams"]) for r in rs)
    pushes = lambda rs, k: "/".join(f"{r[k] / r['streams']:.2f}" for r in rs)
    print(f"  {'streams converged, per run':48} {conv(m):>14} {conv(g):>17}")
    print(f"  {'streams failed, per run':48} {fail(m):>14} {fail(g):>17}")
    print(f"  {'EDS responses per stream after the change':48} {pushes(m, 'post_trigger_eds_responses'):>14} {pushes(g, 'post_trigger_eds_responses'):>17}")
    print(f"  {'CDS responses per stream after the change':48} {pushes(m, 'post_trigger_cds_responses'):>14} {pushes(g, 'post_trigger_cds_responses'):>17}")
    polled = [i + 1 for i, r in enumerate(m) if r.get("meridian_polled")]
    if polled:
        print(f"  WARNING: in round(s) {polled} meridian found no inotify instance left for c000's directory (fs.inotify.max_user_instances, shared by all of this user's processes) and polled it for a while: those convergence figures may include its poll interval")
    for s, rs in (("meridian", m), ("go-control-plane", g)):
        errs = {}
        for r in rs:
            for e, c in (r.get("errors") or {}).items():
                errs[e] = errs.get(e, 0) + c
        if errs:
            print(f"  {s} errors: " + "; ".join(f"{c} x {e}" for e, c in errs.items()))
EOF
echo
echo "Notes:"
echo "  meridian's convergence includes its directory source (inotify, up to 50 ms debounce, then the member directory re-read) and its xDS push debounce (${MERIDIAN_ARGS:-default: 100 ms quiet, 1 s max}); go-control-plane's includes rebuilding the snapshots of all $CLUSTERS node groups and has no debounce."
echo "  gcp-server's SnapshotCache runs with ads=false: with ads=true it answers an EDS request only when it names every ClusterLoadAssignment of the node group's snapshot, and these nodes subscribe to $EDS_SERVICES services each."
echo "  memory per stream = (server VmRSS with every stream synced, 2 s later - VmRSS before the first stream) / streams; the Go server's RSS includes garbage its GC has not returned yet."
echo "  run times (server start to stop, s): $(awk '{printf "%s %s r%s %ss; ", $1, $2, $3, $4}' "$WORK/runs.tsv")"
echo "  per-run commands: $WORK/runs/*.cmd (KEEP=1 keeps them), e.g.:"
for s in meridian gcp; do
    f=$(ls "$WORK"/runs/*-"$s"-1.cmd 2>/dev/null | tail -1)
    [[ -n $f ]] && echo "    $(cat "$f")"
done
echo "  whole benchmark: $((SECONDS / 60)) min $((SECONDS % 60)) s"
echo "command: $COMMAND"
