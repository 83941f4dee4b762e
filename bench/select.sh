#!/usr/bin/env bash
# The cost of one scheduling decision, meridian_core::select, without any result cache.
#
#   bench/select.sh         (from anywhere; needs cargo, and valgrind for instructions/call)
#
# One service (shop/web) exported from 10, 100 and 255 clusters (4 endpoints each, a few with
# none ready, some PreferNoSchedule/NoExecute taints, two networks, most clusters with a
# gateway). Every call asks for another client cluster, and calls alternate between two
# snapshots built from separate indexes, so nothing stays hot by accident. Two policies:
# `locality` (the default) and `tiers` (mode Tiers with label and name affinities, weight rules,
# a minHealthyEndpoints that spills, failback and withdraw windows).
#
#   1. ns/call: `cargo bench -p meridian-core --bench select` (core/benches/select.rs), the
#      median of $SELECT_ROUNDS rounds of $SELECT_CALLS calls per configuration, after a
#      warm-up. Wall-clock on a shared machine: read the min column too.
#   2. instructions/call: the same binary under valgrind --tool=callgrind, one process per
#      configuration, collecting only inside the measured loop (--toggle-collect), so fleet
#      building and warm-up are excluded: Ir / $CG_CALLS. Deterministic, load-independent.
#
# Budget (the issue): under 1 µs per call for 10 clusters.
#
# Knobs (environment): SELECT_ROUNDS=5 SELECT_CALLS=1000000 SELECT_SIZES=10,100,255
# CG_CALLS=20000 KEEP=1 (keep the callgrind output).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
bench_workdir select

export SELECT_ROUNDS=${SELECT_ROUNDS:-5}
export SELECT_CALLS=${SELECT_CALLS:-1000000}
export SELECT_SIZES=${SELECT_SIZES:-10,100,255}
CG_CALLS=${CG_CALLS:-20000}

BENCH_CMD=(cargo bench -p meridian-core --bench select)
log "building: ${BENCH_CMD[*]} --no-run"
BIN=$("${BENCH_CMD[@]}" --no-run --message-format=json 2>"$WORK/build.log" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "select" \
            and "bench" in m["target"].get("kind", []) and m.get("executable"):
        print(m["executable"])
') || { cat "$WORK/build.log" >&2; die "build failed"; }
[[ -x $BIN ]] || { cat "$WORK/build.log" >&2; die "no bench executable found"; }

echo "== ns/call"
echo "\$ SELECT_ROUNDS=$SELECT_ROUNDS SELECT_CALLS=$SELECT_CALLS SELECT_SIZES=$SELECT_SIZES ${BENCH_CMD[*]}"
"${BENCH_CMD[@]}" 2>"$WORK/bench.log" || { cat "$WORK/bench.log" >&2; die "bench failed"; }

echo
echo "== instructions/call (callgrind)"
if ! command -v valgrind >/dev/null; then
    echo "valgrind not installed: skipped (apt-get install valgrind)"
    exit 0
fi
CG=(valgrind --tool=callgrind "--toggle-collect=*measured_loop*"
    "--callgrind-out-file=$WORK/callgrind.out.%p")
printf '$'; printf ' %q' "${CG[@]}" "$BIN" --callgrind; printf ' CLUSTERS POLICY %s\n' "$CG_CALLS"
printf '%8s %9s %12s %14s\n' clusters policy Ir/call "Ir (loop)"
IFS=, read -ra SIZES <<<"$SELECT_SIZES"
for n in "${SIZES[@]}"; do
    for policy in locality tiers; do
        out="$WORK/cg-$n-$policy.log"
        "${CG[@]}" "$BIN" --callgrind "$n" "$policy" "$CG_CALLS" >"$out" 2>&1 \
            || { cat "$out" >&2; die "callgrind run failed ($n $policy)"; }
        ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out" | tail -1)
        [[ -n $ir ]] || { cat "$out" >&2; die "no instruction count ($n $policy)"; }
        printf '%8s %9s %12d %14d\n' "$n" "$policy" "$((ir / CG_CALLS))" "$ir"
    done
done
