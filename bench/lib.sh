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
