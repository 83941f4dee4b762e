#!/usr/bin/env bash
# Sharded writers (issue 17): member-write throughput with 1, 2 and 3 replicas at MEMBERS
# directory members on a real hub (the write target: each member's MemberCluster status, written
# by the replica holding it), ratios against the single replica; and the time ownership takes to
# settle after a replica dies. See bench/ha.py for what each clock measures.
#
#   bench/ha.sh                        (100 members, 3 rounds per replica count)
#   MEMBERS=200 ROUNDS=5 bench/ha.sh
#   MERIDIAN=/path/to/meridian bench/ha.sh
#
# One hub (kube-apiserver + etcd built by tests/peers/, cached). About 2 minutes. Not part of
# tests/run.
set -euo pipefail

cd "$(dirname "$0")/.."
MEMBERS=${MEMBERS:-100}
ROUNDS=${ROUNDS:-3}
source bench/lib.sh
meridian_binary
kube_bench_setup

bench_workdir ha
python3 bench/ha.py "$WORK" --members "$MEMBERS" --rounds "$ROUNDS" >"$WORK/result.json" &
PIDS+=($!)
wait "${PIDS[-1]}" || die "bench/ha.py failed (KEEP=1 keeps $WORK with the logs)"

echo "=== sharded writers: $MEMBERS directory members, statuses written into a real hub, $ROUNDS rounds ==="
python3 - "$WORK/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["throughput"]
one = t["1"]["writes_per_s_median"]
print(f"{'replicas':>8}  {'change -> last status':>22}  {'status writes/s':>16}  {'vs 1 replica':>12}")
for n in ("1", "2", "3"):
    x = t[n]
    print(f"{n:>8}  {x['last_s_median'] * 1000:>19.0f} ms  {x['writes_per_s_median']:>16.0f}  "
          f"{x['writes_per_s_median'] / one:>11.2f}x")
settle, bound = r["settle_after_death_s"], r["lease_duration_s"] + r["retry_period_s"]
print(f"ownership settled {settle:.2f} s after a replica died "
      f"(lease {r['lease_duration_s']} s + retry {r['retry_period_s']} s = {bound} s)")
ok = settle <= bound + 2
print(f"[{'PASS' if ok else 'FAIL'}] a dead replica's members are owned again within a lease duration "
      f"and a retry (+2 s of polling and list latency)")
sys.exit(0 if ok else 1)
PY
