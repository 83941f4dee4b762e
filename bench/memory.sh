#!/usr/bin/env bash
# Memory benchmark: RSS per endpoint at 1,000,000 endpoints over 255 clusters (DESIGN §8:
# <= 1 KiB per endpoint, all indexes included).
#
#   bench/memory.sh            (from the repository root)
#
# The fleet, meant to look like a large real one:
#   - 255 member clusters in 5 regions (51 each), one network per region, an east-west gateway
#     per cluster (clients on another network are answered with gateway addresses), a /20 pod
#     CIDR of 10.0.0.0/8 and DNS clients in it (plus 127.1.<c>.0/24 so that this benchmark can
#     query as a client of cluster c from loopback); the load generator at 127.0.0.1 is in
#     none, so it is an unknown client and gets every endpoint of a service;
#   - clusters come in 85 groups of three, one cluster per region in a group: a team deploys
#     its services to the three clusters of its group (the usual HA spread) and exports each
#     service from all three; so a service has ~30 endpoints and there are ~33,400 distinct
#     exported services over 10 namespaces per group;
#   - per cluster ~3,922 endpoints: 392 services of 10 ready endpoints (one EndpointSlice each,
#     one named port, zone set, like a Deployment behind a ClusterIP Service) plus one smaller
#     service that makes the total exactly 1,000,000;
#   - every endpoint has its own pod address.
# Measured: time from start until meridian is ready with every endpoint indexed
# (/readyz and meridian_index_endpoints), VmRSS after one query for every service name
# (fills the answer cache the way traffic would), minus the VmRSS of meridian with an empty
# fleet after a few queries. Also printed: VmHWM (peak RSS, i.e. during loading), and the RSS
# once the answer cache is full: every name queried again as a client of $CACHE_CLUSTERS
# clusters (answers are cached per client cluster; 3 x 33,405 exceeds the default capacity of
# 100,000 entries), which is where a long-running meridian serving many clusters ends up.
#
# Knobs (environment): CLUSTERS=255 ENDPOINTS=1000000 PER_SERVICE=10 KEEP=1 (keep files).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
CLUSTERS=${CLUSTERS:-255}
ENDPOINTS=${ENDPOINTS:-1000000}
PER_SERVICE=${PER_SERVICE:-10}
CACHE_CLUSTERS=${CACHE_CLUSTERS:-2}
READY_TIMEOUT=${READY_TIMEOUT:-900}

source "$ROOT/bench/lib.sh"

missing=()
command -v dnsperf >/dev/null || missing+=(dnsperf)
command -v kdig >/dev/null || missing+=(knot-dnsutils)
command -v curl >/dev/null || missing+=(curl)
command -v python3 >/dev/null || missing+=(python3)
if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

meridian_binary

bench_workdir mem

# --- the fleet (compact flow-style YAML, one multi-document file per cluster) ---------------
log "generating $ENDPOINTS endpoints over $CLUSTERS clusters in $WORK"
GEN_START=$SECONDS
python3 bench/fleet.py "$WORK" "$CLUSTERS" "$ENDPOINTS" "$PER_SERVICE"
N_NAMES=$(cat "$WORK/nnames")
FLEET_MB=$(du -sm "$WORK/fleet" | cut -f1)
log "  $N_NAMES distinct service names, ${FLEET_MB} MB of YAML, generated in $((SECONDS - GEN_START)) s"

# --- helpers ------------------------------------------------------------------------------------
DNS_PORT=$(free_port)
ADMIN_PORT=$(free_port)
[[ $DNS_PORT != "$ADMIN_PORT" ]] || die "port clash"

start_meridian() { # config
    MERIDIAN_LOG=warn "$MERIDIAN" serve --config "$1" --dns-listen "127.0.0.1:$DNS_PORT" \
        --admin-listen "127.0.0.1:$ADMIN_PORT" >>"$WORK/meridian.log" 2>&1 &
    MPID=$!
    PIDS+=("$MPID")
}
stop_meridian() {
    kill -TERM "$MPID" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$MPID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$MPID" 2>/dev/null || true
    wait "$MPID" 2>/dev/null || true
    PIDS=()
}
metric() { # name -> value (empty if not scraped)
    curl -sf --max-time 5 "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null | awk -v m="$1" '$1 == m {print $2; exit}'
}
status_kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$MPID/status"; }
# wait_ready ENDPOINTS TIMEOUT: /readyz is 200 and meridian_index_endpoints == ENDPOINTS.
wait_ready() {
    local want=$1 timeout=$2 start=$SECONDS have="" last=-1
    while ((SECONDS - start < timeout)); do
        kill -0 "$MPID" 2>/dev/null || { tail -20 "$WORK/meridian.log" >&2; die "meridian exited while loading; log above"; }
        have=$(metric meridian_index_endpoints || true)
        if [[ -n $have && $have == "$want" ]] && curl -sf --max-time 5 -o /dev/null "http://127.0.0.1:$ADMIN_PORT/readyz"; then
            return 0
        fi
        if [[ -n $have && $have != "$last" ]] && ((SECONDS - start > 0)); then
            log "  $((SECONDS - start)) s: $have endpoints indexed, RSS $(($(status_kb VmRSS) / 1024)) MiB"
            last=$have
        fi
        sleep 0.25
    done
    tail -20 "$WORK/meridian.log" >&2
    die "meridian not ready with $want endpoints after ${timeout}s (last seen: ${have:-nothing})"
}
settle_rss() { # waits until VmRSS stops changing (allocator settles), prints it in kB
    local a b
    a=$(status_kb VmRSS)
    for _ in $(seq 20); do
        sleep 0.5
        b=$(status_kb VmRSS)
        [[ $a == "$b" ]] && break
        a=$b
    done
    echo "$a"
}

# --- baseline: an empty fleet -----------------------------------------------------------------
log "baseline: meridian with an empty fleet"
start_meridian "$WORK/empty/meridian.yaml"
wait_ready 0 60
for _ in $(seq 20); do
    kdig @127.0.0.1 -p "$DNS_PORT" +notcp +time=1 +retry=0 "svc000.team00-0.global" A >/dev/null 2>&1 || true
done
BASE_RSS=$(settle_rss)
log "  baseline VmRSS $BASE_RSS kB"
stop_meridian

# --- the full fleet -------------------------------------------------------------------------------
log "starting meridian with $ENDPOINTS endpoints over $CLUSTERS clusters"
T0=$(date +%s.%N)
start_meridian "$WORK/fleet/meridian.yaml"
wait_ready "$ENDPOINTS" "$READY_TIMEOUT"
READY_S=$(awk -v t0="$T0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.1f", t1 - t0 }')
LOADED_RSS=$(settle_rss)
log "  ready with $ENDPOINTS endpoints after ${READY_S}s; VmRSS $LOADED_RSS kB before queries"
sample=$(head -1 "$WORK/names.txt" | cut -d' ' -f1)
answers=$(kdig @127.0.0.1 -p "$DNS_PORT" +notcp +bufsize=1232 +time=2 +retry=1 +noall +answer "$sample" A | grep -c 'IN[[:space:]]*A[[:space:]]' || true)
log "  $sample A: $answers addresses (kdig over UDP, EDNS 1232)"
[[ $answers -ge 1 ]] || die "meridian does not answer $sample"

log "querying all $N_NAMES service names once (dnsperf, EDNS)"
dnsperf -s 127.0.0.1 -p "$DNS_PORT" -d "$WORK/names.txt" -n 1 -e -c 4 -q 100 -t 5 >"$WORK/dnsperf.txt" 2>&1 || true
completed=$(awk '/Queries completed:/ {print $3}' "$WORK/dnsperf.txt")
lost=$(awk '/Queries lost:/ {print $3}' "$WORK/dnsperf.txt")
rcodes=$(awk -F': ' '/Response codes:/ {print $2}' "$WORK/dnsperf.txt" | tr -s ' ')
avgsize=$(awk '/Average packet size:/ {print $NF}' "$WORK/dnsperf.txt")
log "  completed $completed, lost $lost; $rcodes; reply size ${avgsize} B"
[[ -n $completed ]] || { cat "$WORK/dnsperf.txt" >&2; die "dnsperf failed"; }
FULL_RSS=$(settle_rss)
HWM=$(status_kb VmHWM)
ANON=$(status_kb RssAnon)
SNAPSHOTS=$(metric meridian_snapshots_published_total || metric meridian_snapshots_published || true)
SERVICES=$(metric meridian_exported_services || true)
CACHE_HITS=$(metric meridian_dns_cache_hits_total || true)
# The answer cache at capacity: the same names asked by clients of other clusters.
for ((c = 1; c <= CACHE_CLUSTERS; c++)); do
    dnsperf -s 127.0.0.1 -a "127.1.$((c * 3)).1" -p "$DNS_PORT" -d "$WORK/names.txt" -n 1 -e -c 4 -q 100 -t 5 >"$WORK/dnsperf-c$c.txt" 2>&1 || true
    log "  as a client of c$(printf '%03d' $((c * 3))): $(awk '/Queries completed:/ {print $3}' "$WORK/dnsperf-c$c.txt") completed; $(awk -F': ' '/Response codes:/ {print $2}' "$WORK/dnsperf-c$c.txt" | tr -s ' '); reply size $(awk '/Average packet size:/ {print $NF}' "$WORK/dnsperf-c$c.txt") B"
done
CACHE_RSS=$(settle_rss)
CACHE_MISSES=$(metric meridian_dns_answer_cache_misses_total || true)
CPU_S=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($14 + $15) / hz}' "/proc/$MPID/stat")
stop_meridian

PER_EP=$(awk -v f="$FULL_RSS" -v b="$BASE_RSS" -v n="$ENDPOINTS" 'BEGIN { printf "%.0f", (f - b) * 1024 / n }')
PER_EP_LOADED=$(awk -v f="$LOADED_RSS" -v b="$BASE_RSS" -v n="$ENDPOINTS" 'BEGIN { printf "%.0f", (f - b) * 1024 / n }')
PER_EP_CACHE=$(awk -v f="$CACHE_RSS" -v b="$BASE_RSS" -v n="$ENDPOINTS" 'BEGIN { printf "%.0f", (f - b) * 1024 / n }')
PER_EP_HWM=$(awk -v f="$HWM" -v b="$BASE_RSS" -v n="$ENDPOINTS" 'BEGIN { printf "%.0f", (f - b) * 1024 / n }')
mib() { awk -v k="$1" 'BEGIN { printf "%.1f MiB", k / 1024 }'; }

echo
echo "=== meridian memory benchmark: $ENDPOINTS endpoints, $CLUSTERS clusters, $N_NAMES exported services (~$((ENDPOINTS / N_NAMES)) endpoints each) ==="
echo "fleet on disk: ${FLEET_MB} MB of YAML; $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-58s %s\n' "start -> ready, all $ENDPOINTS endpoints indexed" "${READY_S} s (meridian CPU over the whole run: ${CPU_S} s)"
printf '%-58s %s\n' "snapshots published / exported services" "${SNAPSHOTS:-?} / ${SERVICES:-?}"
printf '%-58s %s\n' "baseline VmRSS (empty fleet)" "$(mib "$BASE_RSS")"
printf '%-58s %s\n' "VmRSS ready, before queries" "$(mib "$LOADED_RSS")  ($PER_EP_LOADED B/endpoint over baseline)"
printf '%-58s %s\n' "VmRSS after one query per service name" "$(mib "$FULL_RSS")  (RssAnon $(mib "$ANON"))"
printf '%-58s %s\n' "VmHWM (peak until then)" "$(mib "$HWM")  ($PER_EP_HWM B/endpoint over baseline)"
printf '%-58s %s\n' "VmRSS, cache full (+$CACHE_CLUSTERS client clusters, ${CACHE_MISSES:-?} misses)" "$(mib "$CACHE_RSS")  ($PER_EP_CACHE B/endpoint over baseline)"
printf '%-58s %s\n' "(VmRSS - baseline) / endpoints" "$PER_EP bytes"
echo
if ((PER_EP <= 1024)); then verdict=PASS; else verdict=FAIL; fi
echo "DESIGN §8 budget:"
echo "  [$verdict] memory: <= 1 KiB per endpoint at 1M endpoints over 255 clusters, all indexes included   ($PER_EP B/endpoint)"
if ((PER_EP_CACHE <= 1024)); then verdict=PASS; else verdict=FAIL; fi
echo "  [$verdict] (same budget, answer cache at capacity)   ($PER_EP_CACHE B/endpoint)"
