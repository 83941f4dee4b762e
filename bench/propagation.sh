#!/usr/bin/env bash
# meridian's propagation on real kube-apiservers: a hub template change → applied in every
# member, p50/p99/max over CHANGES changes, next to the API server's own write → watch
# delivery measured the same way; and TEMPLATES templates × 3 members from the policy that
# selects them to every copy in every member, with the per-member write rate next to the
# hub API server's own create rate.
#
#   bench/propagation.sh                       (from the repository root)
#   CHANGES=100 TEMPLATES=500 bench/propagation.sh
#   MERIDIAN=/path/to/meridian GAP_MS=50 CREATE_THREADS=16 bench/propagation.sh
#
# What the clocks measure (bench/propagation.py says it in full):
#   change → members   from just before the merge PATCH of the hub Deployment shop/web (a new
#                      pod-template annotation rev: N) to a raw watch on web in m1, m2 and m3
#                      each seeing rev N; "all" is the last of the three. Reference: the same
#                      PATCH → a raw watch on the hub's web seeing rev N (what meridian's own
#                      template watch waits for). Changes one at a time, GAP_MS apart.
#   initial            TEMPLATES Deployments created on the hub first (CREATE_THREADS threads:
#                      the hub API server's create rate, for reference); then from just before
#                      the ClusterSchedulingPolicy selecting them all (Duplicated into m1, m2,
#                      m3) is created to a raw watch in each member having seen every copy;
#                      per member its write rate (copies / time to its last one). A watch on
#                      the hub's Placements in bulk reports when each template's record landed.
# Also printed: meridian's applies and drift_reverted counters over each phase, and the WARN
# and ERROR lines of its log.
# Karmada's figure (push p99 1.3 s at 100 clusters) is its published number, not a run here.
#
# A hub and three members (m1, m2, m3), each kube-apiserver + etcd built by tests/peers/
# (cached), set up by tests/e2e/kube_fleet.py as the e2e tests do; one `meridian serve`
# replica (the release binary: $MERIDIAN, else target/release/meridian — this script does not
# build it), MERIDIAN_LOG=info unless set. Not part of tests/run. A few minutes.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
CHANGES=${CHANGES:-300}
GAP_MS=${GAP_MS:-20}  # pause after each change is seen in every member
TEMPLATES=${TEMPLATES:-1000}
CREATE_THREADS=${CREATE_THREADS:-8}
INITIAL_TIMEOUT=${INITIAL_TIMEOUT:-900}  # seconds to wait for every copy before reporting what arrived
PLACEMENTS_TIMEOUT=${PLACEMENTS_TIMEOUT:-180}  # then seconds to wait for every Placement on the hub
MERIDIAN=${MERIDIAN:-$ROOT/target/release/meridian}

source "$ROOT/bench/lib.sh"

kube_bench_setup

bench_workdir propagation
python3 bench/propagation.py "$WORK" --changes "$CHANGES" --gap-ms "$GAP_MS" --templates "$TEMPLATES" \
    --create-threads "$CREATE_THREADS" --initial-timeout "$INITIAL_TIMEOUT" \
    --placements-timeout "$PLACEMENTS_TIMEOUT" >"$WORK/result.json" &
PIDS+=($!)
wait "${PIDS[-1]}" || die "bench/propagation.py failed (KEEP=1 keeps $WORK with the logs)"

echo "=== meridian propagation on kube-apiservers: $CHANGES changes of one Deployment in m1, m2, m3; $TEMPLATES Deployments × 3 members ==="
python3 - "$WORK/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
karmada = r["karmada_published_p99_ms"]
c = r.get("change_to_members")
if c:
    print(f"hub template change -> observed, ms (from just before the PATCH is sent; {c['changes']} changes, "
          f"{c['gap_ms']} ms apart)")
    rows = (("write_response_ms", "PATCH answered (hub API server)"),
            ("hub_watch_delivery_ms", "hub watch event (API server)"),
            ("m1_ms", "applied in m1 (member watch)"),
            ("m2_ms", "applied in m2 (member watch)"),
            ("m3_ms", "applied in m3 (member watch)"),
            ("all_members_ms", "applied in all three (meridian)"),
            ("all_beyond_hub_watch_ms", "all three minus hub watch delivery"))
    for key, label in rows:
        v = c[key]
        print(f"  {label:<38} p50 {v['p50']:>7.1f}   p99 {v['p99']:>7.1f}   max {v['max']:>7.1f}")
    print(f"  p99 ratio meridian (every member has it) / API server (write -> watch event): "
          f"{c['ratio_p99_meridian_to_apiserver']}x")
    print(f"  against Karmada's published push p99 of {karmada} ms at 100 clusters (a published figure, "
          f"not a side-by-side run; ours is 3 members): {c['all_members_ms']['p99']:.1f} ms, "
          f"ratio meridian/Karmada {c['ratio_p99_meridian_to_karmada_published']}")
    print(f"  applies during the changes: {c['applies']}; counted as drift reverted: {c['drift_reverted']}")
i = r.get("initial")
if i:
    h = i["hub_create"]
    done = f"{i['seconds']} s" if i["complete"] else f"INCOMPLETE after {i['timeout_s']:.0f} s ({i['copies_total']} copies)"
    print(f"initial propagation: policy created -> {i['templates']} Deployments in each of m1, m2, m3: {done}")
    for name, p in i["per_member"].items():
        print(f"  {name}: first copy {p['first_s']} s, last {p['last_s']} s, {p['copies']} seen ({p['listed']} listed), "
              f"{p['objects_per_s']} objects/s")
    if i["complete"]:
        print(f"  write rate: {i['per_member_objects_per_s']} objects/s per member, "
              f"{i['all_members_objects_per_s']} objects/s over the three")
    print(f"  reference: this script created the {i['templates']} templates on the hub in {h['seconds']} s "
          f"({h['objects_per_s']} objects/s, {h['threads']} threads)")
    if i["complete"] and i["per_member_objects_per_s"]:
        print(f"  ratio per-member write rate / hub create rate: {i['per_member_objects_per_s'] / h['objects_per_s']:.2f}")
    pl = i["placements_on_hub"]
    print(f"  Placements on the hub: {pl['count']} of {i['templates']} (first at {pl['first_s']} s, last at {pl['last_s']} s)")
    print(f"  applies: {i['applies']}; counted as drift reverted: {i['drift_reverted']}")
    p = i.get("plan_ms_per_pass") or {}
    settled = next((v for k, v in p.items() if k.startswith("settled_") and k != "settled_passes"), None)
    print(f"  one pass's deciding over {i['templates']} templates x 3 members (meridian_propagation_plan_seconds, "
          f"mean): {p.get('initial')} ms during the initial phase, {settled} ms settled "
          f"({p.get('settled_passes')} passes)")
    lk = i.get("looked_per_pass") or {}
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    print(f"  templates a pass looked at (meridian_propagation_looked_templates, mean): "
          f"{fmt(lk.get('initial'))} during the initial phase, {fmt(lk.get('settled'))} settled")
lp = r["meridian_log"]
print(f"meridian log: {lp['counts']['ERROR']} ERROR, {lp['counts']['WARN']} WARN lines; "
      f"still running: {r['meridian_running']}")
for line in lp["first"][:10]:
    print(f"  {line}")
print(f"total {r['seconds']} s; meridian {r['meridian']}")
PY
echo "command: CHANGES=$CHANGES GAP_MS=$GAP_MS TEMPLATES=$TEMPLATES CREATE_THREADS=$CREATE_THREADS MERIDIAN=$MERIDIAN bench/propagation.sh"
