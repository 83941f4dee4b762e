#!/usr/bin/env bash
# meridian's propagation at fleet scale: MEMBERS simulated Kubernetes members (meridian-kubesim,
# loopback API servers in one process, kubesim/), a directory hub of TEMPLATES Deployments of
# which DUPLICATED are placed Duplicated onto WIDE members each, one `meridian serve`.
#
#   bench/fleet_members.sh                                  (from the repository root)
#   MEMBERS=100 TEMPLATES=1000 bench/fleet_members.sh       (a quick run, ~2 minutes)
#   MERIDIAN=/path/to/meridian NARROW_POLICIES=0 bench/fleet_members.sh
#   REAL=1 MEMBERS=20 TEMPLATES=200 WIDE=20 bench/fleet_members.sh
#                 the same against real members (a kube-apiserver and etcd each, built by
#                 tests/peers/; ~0.4 GiB a member): run it beside the same numbers without
#                 REAL to check the simulation against the real thing (no full resync: a
#                 real API server cannot expire every watch on demand)
#
# What the clocks measure (bench/fleet_members.py says it in full; every copy is counted by
# kubesim's write log, which stamps a write when it is answered, on this machine's clock):
#   initial       `meridian serve` started with everything on disk → the last copy's first
#                 successful apply; objects/s = copies / that time. The other
#                 TEMPLATES - DUPLICATED templates go onto 3 members each through
#                 NARROW_POLICIES policies (NARROW_POLICIES=0: left unselected).
#   new template  a new template's file renamed into the hub directory → applied in all WIDE
#                 members of its group. The file's mtime is set 1 s back, so the directory
#                 source reads it at once instead of after its 100 ms settle; its inotify
#                 debounce (50 ms) is included. The first is written AFTER_BURST_S (5) after
#                 the initial burst's last copy, while meridian may still be handling it.
#   edit          a wide template's pod-template annotation bench.meridian.io/rev rewritten the
#                 same way → that rev applied in all its WIDE members.
#   settled       SETTLE_S s with nothing changing: meridian's requests to all members per
#                 second (kubesim /stats), its writes (budget 0), and the mean of
#                 meridian_propagation_plan_seconds over that window's passes.
#   full resync   kubesim POST /expire-all (every watch ends with 410, so every watcher
#                 relists) → the last LIST (none for QUIET_S s after it), and writes made.
#   restart       meridian stopped and started again (a directory hub's "failover": a new
#                 process, a new term) → the last LIST or write, and the writes made.
#   memory        VmRSS and fds of meridian and kubesim (/proc), settled.
# Budgets printed beside the figures are issue 38's; Karmada's ~200 Works/s and KubeFleet's
# p90 of 20 s are their published figures, not runs here.
#
# The meridian binary: $MERIDIAN, else $CARGO_TARGET_DIR/release/meridian (built if missing);
# kubesim is built with cargo (release) unless $KUBESIM names a binary. MERIDIAN_LOG=info
# unless set. Not part of tests/run. At the defaults ~20 minutes and ~11 GiB of memory (meridian
# ~8 GiB, kubesim ~2 GiB in 4 processes); MEMBERS=100 TEMPLATES=1000 ~2 minutes.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
MEMBERS=${MEMBERS:-1000}
TEMPLATES=${TEMPLATES:-10000}
DUPLICATED=${DUPLICATED:-$((TEMPLATES / 10))}
WIDE=${WIDE:-100}
NARROW_POLICIES=${NARROW_POLICIES:-100}
NEW_SAMPLES=${NEW_SAMPLES:-20}
EDIT_SAMPLES=${EDIT_SAMPLES:-50}
SETTLE_S=${SETTLE_S:-30}
QUIET_S=${QUIET_S:-10}
export AFTER_BURST_S=${AFTER_BURST_S:-5}
PER_PROCESS=${PER_PROCESS:-250}  # members a kubesim process: each has its own fd limit (over HTTP/1.1 meridian opened ~36 connections a member in the initial burst; over HTTP/2 ~8)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

source "$ROOT/bench/lib.sh"

if [[ -z ${MERIDIAN:-} ]]; then
    MERIDIAN=$TARGET/release/meridian
    if [[ ! -x $MERIDIAN ]]; then
        log "building meridian (release)"
        cargo build --release --quiet -p meridian --bin meridian
    fi
fi
[[ -x $MERIDIAN ]] || die "no meridian binary at $MERIDIAN"
REAL=${REAL:-0}
if [[ $REAL == 1 ]]; then
    kube_bench_setup  # kube-apiserver and etcd from tests/peers, the e2e helpers' Python packages
    MEMBERS_ARGS=(--real)
else
    if [[ -z ${KUBESIM:-} ]]; then
        log "building meridian-kubesim (release)"
        cargo build --release --quiet -p meridian-kubesim
        KUBESIM=$TARGET/release/meridian-kubesim
    fi
    [[ -x $KUBESIM ]] || die "no kubesim binary at $KUBESIM"
    MEMBERS_ARGS=(--kubesim "$KUBESIM")
fi
# Each member costs meridian a connection per open watch (HTTP/1.1), and kubesim the same.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

bench_workdir fleet-members
log "work directory $WORK (KEEP=1 keeps it)"
python3 bench/fleet_members.py "$WORK" --meridian "$MERIDIAN" "${MEMBERS_ARGS[@]}" \
    --members "$MEMBERS" --templates "$TEMPLATES" --duplicated "$DUPLICATED" --wide "$WIDE" \
    --narrow-policies "$NARROW_POLICIES" --new-samples "$NEW_SAMPLES" --edit-samples "$EDIT_SAMPLES" \
    --settle-s "$SETTLE_S" --quiet-s "$QUIET_S" --per-process "$PER_PROCESS" >"$WORK/result.json" &
PIDS+=($!)
wait "${PIDS[-1]}" || die "bench/fleet_members.py failed (KEEP=1 keeps $WORK with the logs)"

echo "=== meridian at fleet scale on $([[ $REAL == 1 ]] && echo "real kube-apiservers" || echo "simulated members"): $MEMBERS members, $TEMPLATES templates, $DUPLICATED × $WIDE members Duplicated ==="
python3 - "$WORK/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def mem(p):
    most = f" (at most {p['max_fds_one_process']} in one process)" if "max_fds_one_process" in p else ""
    return f"{p.get('rss_mib', '?')} MiB RSS, {p.get('fds', '?')} fds{most}, {p.get('cpu_s', '?')} s CPU so far" if p else "?"
narrow = (f"{r['templates'] - r['duplicated']} onto 3 members each ({r['narrow_policies']} policies)"
          if r["narrow_policies"] and r["templates"] > r["duplicated"] else f"{r['templates'] - r['duplicated']} unselected")
print(f"fleet: {r['members']} members in {r['groups']} groups of {r['wide']}; {r['duplicated']} templates × {r['wide']} members, "
      f"{narrow}; {r['copies_expected']} copies")
members = "members' kube-apiservers and etcds" if r.get("real_members") else f"kubesim ({r['kubesim_processes']} processes)"
print(f"{members} idle: {mem(r['kubesim_idle'])} (started in {r['kubesim_start_s']} s)")
i = r.get("initial", {})
if i:
    rate = i.get("objects_per_s")
    state = "" if i["complete"] else f"  INCOMPLETE: {i['copies']} of {r['copies_expected']}"
    print(f"initial: {i['copies']} copies in {i['seconds']} s from serve start (first copy at {i['first_copy_s']} s): "
          f"{rate} objects/s ({i['objects_per_s_from_first_copy']}/s from the first copy){state}")
    if rate:
        print(f"  budget ≥ 1,000/s: ratio {rate / 1000:.2f}; Karmada ~200 Works/s (published): ratio {rate / 200:.1f}x")
    print(f"  after: meridian {mem(i['meridian'])}; members {mem(i['kubesim'])}")
for key, label, budget, other in (
        ("new_template", "new template → all", 2000, ("KubeFleet p90 20 s (published)", 20000, "p90")),
        ("edit", "template edit → all", 1000, None)):
    v = r.get(key)
    if not v:
        continue
    line = (f"{label} {v['members']} members, ms (n={v['n']}): p50 {v['p50']}  p90 {v['p90']}  p99 {v['p99']}  max {v['max']}"
            f"   budget p99 ≤ {budget}: ratio {v['p99'] / budget:.2f}")
    if other:
        line += f"; {other[0]}: ratio p90 {v[other[2]] / other[1]:.3f}"
    print(line)
s = r.get("settled")
if s:
    verbs = ", ".join(f"{k} {v}" for k, v in sorted(s["by_verb_per_s"].items()))
    print(f"settled ({s['seconds']} s): {s['requests_per_s']} requests/s to the members ({verbs}); "
          f"writes {s['writes']} (budget 0); open watches {s['open_watches']}")
    plan = s["plan_ms_mean"]
    ratio = f"ratio {plan / 5:.2f}" if plan is not None else "no pass in the window"
    print(f"  meridian_propagation_plan_seconds mean: {plan} ms over {s['plan_passes']} passes (budget ≤ 5 ms: {ratio}); "
          f"whole run {s['plan_ms_mean_whole_run']} ms")
    rss = s["meridian"].get("rss_mib")
    print(f"  meridian {mem(s['meridian'])} (budget ≤ 2048 MiB: ratio {rss / 2048:.2f}); members {mem(s['kubesim'])}" if rss else "")
f = r.get("full_resync")
if f:
    print(f"full resync (expire-all): last relist after {f['seconds_to_last_list']} s (budget ≤ 120 s: ratio "
          f"{f['seconds_to_last_list'] / 120:.2f}){'' if f['settled'] else ' NOT SETTLED'}; {f['lists']} lists, "
          f"{f['writes']} writes (budget 0); watches open after {f['watches_after']}")
x = r.get("restart")
if x:
    print(f"restart: settled {x['seconds_to_last_list_or_write']} s after start (budget ≤ 60 s: ratio "
          f"{x['seconds_to_last_list_or_write'] / 60:.2f}){'' if x['settled'] else ' NOT SETTLED'}; {x['writes']} writes "
          f"(budget 0); {x['lists']} lists; meridian {mem(x['meridian'])}")
if r.get("write_errors"):
    print(f"refused writes (first {len(r['write_errors'])}):")
    for w in r["write_errors"][:5]:
        print(f"  {w['member']} {w['verb']} {w['resource']} {w.get('namespace')}/{w['name']}: {w['code']}")
lp = r["meridian_log"]
print(f"meridian log: {lp['counts']['ERROR']} ERROR, {lp['counts']['WARN']} WARN of {lp['lines']} lines")
for line in lp["first"][:8]:
    print(f"  {line}")
print(f"total {r['seconds']} s")
PY
echo "command: REAL=$REAL PER_PROCESS=$PER_PROCESS MEMBERS=$MEMBERS TEMPLATES=$TEMPLATES DUPLICATED=$DUPLICATED WIDE=$WIDE NARROW_POLICIES=$NARROW_POLICIES NEW_SAMPLES=$NEW_SAMPLES EDIT_SAMPLES=$EDIT_SAMPLES SETTLE_S=$SETTLE_S QUIET_S=$QUIET_S AFTER_BURST_S=$AFTER_BURST_S MERIDIAN=$MERIDIAN bench/fleet_members.sh"
