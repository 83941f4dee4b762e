#!/usr/bin/env bash
# Scoring benchmark (issue 14; budget: a Lua-scored decision over 255 clusters within 1 ms on
# one core). The same fleet (255 clusters, TEMPLATES Deployments placed Aggregated with a
# region spread) is decided four ways, side by side in one run:
#   none     no scoring: the reference every other figure is a ratio against;
#   builtin  every built-in plugin (ResourceBalance, Cost, DataLocality, ClusterAffinity,
#            TaintToleration, preferred workload anti-affinity);
#   lua      a Lua filter and a Lua cost score, run in the sandbox for every candidate;
#   webhook  a local scoring webhook (Python, loopback HTTP) answering every candidate.
# The first three are `meridian render` pinned to one core, the time it reports for deciding
# every placement, best of RUNS. The webhook variant needs `serve` (render makes no calls):
# the time from start to every template scheduled, polled on /metrics — calls, the cache and
# the decisions again after each answer included.
#
#   bench/scoring.sh                    (from the repository root)
#   TEMPLATES=200 WEBHOOK_TEMPLATES=50 bench/scoring.sh
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
CLUSTERS=${CLUSTERS:-255}
TEMPLATES=${TEMPLATES:-1000}
WEBHOOK_TEMPLATES=${WEBHOOK_TEMPLATES:-200}
RUNS=${RUNS:-3}
BUDGET_US=1000

source "$ROOT/bench/lib.sh"

log "building meridian (release)"
cargo build --release --quiet --bin meridian
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
MERIDIAN=$TARGET_DIR/release/meridian
bench_workdir scoring

# Best decision time (ms) of `render` for VARIANT.
render_ms() {
    local variant=$1 dir="$WORK/$1" best= line ms
    python3 bench/scoring_fleet.py "$dir" "$CLUSTERS" "$TEMPLATES" "$variant"
    printf 'hub:\n  directory: hub\n' > "$dir/meridian.yaml"
    for run in $(seq "$RUNS"); do
        rm -rf "$dir/out"
        line=$(taskset -c 0 "$MERIDIAN" render --config "$dir/meridian.yaml" --out "$dir/out" | tail -1) \
            || die "render of $variant failed: $line"
        ms=$(sed -n 's/.* decided in \([0-9.]*\) ms.*/\1/p' <<<"$line")
        [[ -n $ms ]] || die "render printed no decision time: $line"
        log "$variant run $run: $line"
        if [[ -z $best ]] || awk "BEGIN{exit !($ms < $best)}"; then best=$ms; fi
    done
    echo "$best"
}

none=$(render_ms none)
builtin=$(render_ms builtin)
lua=$(render_ms lua)

# The webhook: a local server scoring by a hash of the cluster name; serve until every
# template is scheduled.
HOOK_PORT=$(free_port)
python3 - "$HOOK_PORT" >"$WORK/webhook.log" 2>&1 <<'PY' &
import json, sys, zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = {"clusters": [{"name": c["name"], "score": zlib.crc32(c["name"].encode()) % 101}
                               for c in body["clusters"]]}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
PIDS+=($!)
hook_dir="$WORK/webhook"
python3 bench/scoring_fleet.py "$hook_dir" "$CLUSTERS" "$WEBHOOK_TEMPLATES" webhook "http://127.0.0.1:$HOOK_PORT/score"
printf 'hub:\n  directory: hub\n' > "$hook_dir/meridian.yaml"
ADMIN_PORT=$(free_port)
start=$(date +%s.%N)
"$MERIDIAN" serve --config "$hook_dir/meridian.yaml" --dns-listen "127.0.0.1:$(free_port)" \
    --admin-listen "127.0.0.1:$ADMIN_PORT" --xds-listen "127.0.0.1:$(free_port)" \
    >"$WORK/serve.log" 2>&1 &
PIDS+=($!)
webhook_s=$(python3 - "$ADMIN_PORT" "$WEBHOOK_TEMPLATES" "$start" <<'PY'
import sys, time, urllib.request
port, want, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.time() + 300
while time.time() < deadline:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        time.sleep(0.05)
        continue
    for line in text.splitlines():
        if line.startswith('meridian_placements{result="scheduled"}') and int(float(line.split()[1])) >= want:
            print(f"{time.time() - start:.3f}")
            sys.exit(0)
    time.sleep(0.05)
sys.exit("not every template was scheduled within 300 s")
PY
) || die "webhook variant: $webhook_s"
calls=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^meridian_placement_webhook_calls_total\{result="ok"\}/{print $2}')

us() { awk "BEGIN{printf \"%.1f\", $1 * 1000 / $2}"; }
rate() { awk "BEGIN{printf \"%.0f\", $2 / ($1 / 1000)}"; }
ratio() { awk "BEGIN{printf \"%.2f\", $1 / $2}"; }
lua_us=$(us "$lua" "$TEMPLATES")
echo
echo "scoring: $TEMPLATES templates over $CLUSTERS clusters, one core, best of $RUNS"
echo "  none     ${none} ms  $(us "$none" "$TEMPLATES") µs/decision  $(rate "$none" "$TEMPLATES") decisions/s  (reference)"
echo "  builtin  ${builtin} ms  $(us "$builtin" "$TEMPLATES") µs/decision  $(rate "$builtin" "$TEMPLATES") decisions/s  ratio to none $(ratio "$builtin" "$none")"
echo "  lua      ${lua} ms  ${lua_us} µs/decision  $(rate "$lua" "$TEMPLATES") decisions/s  ratio to none $(ratio "$lua" "$none")  ($(awk "BEGIN{print ($lua_us <= $BUDGET_US) ? \"within\" : \"OVER\"}") the ${BUDGET_US} µs budget)"
echo "  webhook  $WEBHOOK_TEMPLATES templates scheduled ${webhook_s} s after serve started, ${calls:-0} calls ok: $(awk "BEGIN{printf \"%.0f\", $WEBHOOK_TEMPLATES / $webhook_s}") decisions/s (calls, cache and start-up included)"
