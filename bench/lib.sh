# Shared by the benchmark scripts: logging, a work directory whose processes and files are
# cleaned up on exit, and a loopback port free for both UDP and TCP.
# Usage: source "$ROOT/bench/lib.sh"; bench_workdir NAME; PIDS+=($!) for each process.

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
# From a subshell (a $(...) or a pipeline), also stop the script itself.
die() { log "ERROR: $*"; [[ $BASHPID == "$$" ]] || kill -TERM $$; exit 1; }

# Creates $WORK (/tmp/meridian-bench-NAME.XXXXXX) and stops every pid in $PIDS, then removes
# $WORK, on exit (KEEP=1 keeps it).
bench_workdir() {
    WORK=$(mktemp -d "/tmp/meridian-bench-$1.XXXXXX")
    PIDS=()
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [[ ${KEEP:-0} == 1 ]]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}

# Sets $MERIDIAN: the binary given in $MERIDIAN, else a release build (in $CARGO_TARGET_DIR).
meridian_binary() {
    if [[ -n ${MERIDIAN:-} ]]; then
        [[ -x $MERIDIAN ]] || die "MERIDIAN=$MERIDIAN is not an executable"
        log "using meridian at $MERIDIAN"
        return
    fi
    log "building meridian (release)"
    cargo build --release --quiet --bin meridian
    MERIDIAN=${CARGO_TARGET_DIR:-$PWD/target}/release/meridian
    [[ -x $MERIDIAN ]] || die "no $MERIDIAN after the build"
}

free_port() {
    python3 - <<'PY'
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
PY
}

# For the benchmarks on kube-apiservers (kube.sh, propagation.sh): the meridian binary in
# $MERIDIAN, the Python packages of the e2e tests, and the peers tests/peers builds (cached);
# exports KUBE_APISERVER_BIN, ETCD_BIN and MERIDIAN_BIN for tests/e2e/kube_fleet.py.
kube_bench_setup() {
    [[ -x "$MERIDIAN" ]] || die "no meridian binary at $MERIDIAN: build it (cargo build --release) or set MERIDIAN"
    python3 -c 'import grpc, envoy.service.discovery.v3, yaml, dns, pytest' 2>/dev/null ||
        python3 -m pip install -q -r tests/requirements.txt
    log "kube-apiserver and etcd (tests/peers; cached after the first build)"
    KUBE_APISERVER_BIN=${KUBE_APISERVER_BIN:-$(tests/peers/kube-apiserver.sh)}
    ETCD_BIN=${ETCD_BIN:-$(tests/peers/etcd.sh)}
    export KUBE_APISERVER_BIN ETCD_BIN
    export MERIDIAN_BIN=$MERIDIAN
}

# The large fleet of bench/fleet.py ($CLUSTERS clusters, $ENDPOINTS endpoints, $PER_SERVICE per
# service and cluster) generated in $WORK and served by $MERIDIAN on free ports ($DNS_PORT,
# $ADMIN_PORT, $XDS_PORT; extra `serve` flags as arguments); returns once every endpoint is
# indexed and meridian is ready.
serve_large_fleet() {
    log "generating $ENDPOINTS endpoints over $CLUSTERS clusters in $WORK"
    python3 bench/fleet.py "$WORK" "$CLUSTERS" "$ENDPOINTS" "$PER_SERVICE"
    DNS_PORT=$(free_port)
    ADMIN_PORT=$(free_port)
    XDS_PORT=$(free_port)
    MERIDIAN_LOG=${MERIDIAN_LOG:-warn} "$MERIDIAN" serve --config "$WORK/fleet/meridian.yaml" \
        --dns-listen "127.0.0.1:$DNS_PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
        --xds-listen "127.0.0.1:$XDS_PORT" "$@" >>"$WORK/meridian.log" 2>&1 &
    PIDS+=($!)
    log "waiting for meridian to index $ENDPOINTS endpoints"
    local start=$SECONDS
    until [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$ADMIN_PORT/readyz")" == 200 ]] &&
        [[ "$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '$1 == "meridian_index_endpoints" {print $2}')" == "$ENDPOINTS" ]]; do
        ((SECONDS - start < 900)) || die "meridian not ready after 900 s: $(tail -5 "$WORK/meridian.log")"
        sleep 0.5
    done
    log "ready after $((SECONDS - start)) s"
}
