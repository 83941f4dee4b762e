#!/usr/bin/env bash
# Pull-mode agents (DESIGN §12, issue 16) on real kube-apiservers: an EndpointSlice change in an
# agent member → new DNS answer, p50/p99 over CHANGES changes, beside the same change in a push
# member, in one run (changes alternate); and AGENTS agents (meridian-agent-swarm: the real
# member side each, in one process) joining a hub at once, then reconnecting after the hub
# restarts, admitted at 50 streams a second; and one agent streaming to 1, then 3, hub
# replicas: the watches its member's API server holds for it and the agent's RSS.
#
#   bench/agent.sh                       (from the repository root)
#   CHANGES=200 AGENTS=200 bench/agent.sh
#   PARTS=replicas OBJECTS=1000 bench/agent.sh    (parts: change, storm, replicas)
#   MERIDIAN=/path/to/meridian bench/agent.sh   (meridian-agent-swarm must sit beside it)
#
# A hub and two members (m1 push, m2 agent), each kube-apiserver + etcd built by tests/peers/
# (cached), set up by tests/e2e/kube_fleet.py; the release binaries (built unless MERIDIAN is
# set). See bench/agent.py for what each clock measures. Not part of tests/run. About 3 minutes
# at AGENTS=1000.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
CHANGES=${CHANGES:-100}
GAP_MS=${GAP_MS:-20}
AGENTS=${AGENTS:-1000}
OBJECTS=${OBJECTS:-300}
PARTS=${PARTS:-change,storm,replicas}

source "$ROOT/bench/lib.sh"

if [[ -z ${MERIDIAN:-} ]]; then
    log "building meridian and meridian-agent-swarm (release)"
    cargo build --release --quiet --bin meridian --bin meridian-agent-swarm
    MERIDIAN=${CARGO_TARGET_DIR:-$PWD/target}/release/meridian
fi
[[ -x "$(dirname "$MERIDIAN")/meridian-agent-swarm" ]] || die "no meridian-agent-swarm beside $MERIDIAN"
kube_bench_setup
# The swarm holds a watch connection per agent and resource: lift the descriptor limit.
ulimit -n "$(ulimit -Hn)"

bench_workdir agent
python3 bench/agent.py "$WORK" --changes "$CHANGES" --gap-ms "$GAP_MS" --agents "$AGENTS" \
    --objects "$OBJECTS" --parts "$PARTS" >"$WORK/result.json" &
PIDS+=($!)
wait "${PIDS[-1]}" || die "bench/agent.py failed (KEEP=1 keeps $WORK with the logs)"

echo "=== pull-mode agents on kube-apiservers ($PARTS): $CHANGES EndpointSlice updates alternating m1 (push) and m2 (agent); $AGENTS agents joining and reconnecting; one agent and 1 or 3 replicas ==="
python3 - "$WORK/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if "replicas" in r:
    p = r["replicas"]
    print(f"one agent, m2 holding {p['member_objects']} objects ({p['objects']} exported services); "
          "after every replica answers for m2:")
    for run in p["runs"]:
        print(f"  {run['replicas']} replica(s): m2 API server WATCHes for the agent {run['watches_opened']:>3} "
              f"({', '.join(f'{k} {v}' for k, v in run['by_resource'].items())}), "
              f"agent RSS {run['agent_rss_mib']:>6.1f} MiB, every replica answers {run['every_replica_answers_s']:.1f} s")
if "change_to_answer" not in r:
    print(f"total {r['seconds']} s; meridian {r['meridian']}")
    sys.exit(0)
c = r["change_to_answer"]
print(f"API write -> observed, ms (from just before the PATCH is sent; changes {c['gap_ms']} ms apart)")
rows = (("watch_delivery_ms", "watch event (plain client)"),
        ("dns_ms", "new DNS answer"),
        ("dns_beyond_watch_ms", "DNS minus watch delivery"))
for path in ("push", "agent"):
    p = c[path]
    print(f" {path} member ({p['changes']} changes)")
    for key, label in rows:
        v = p[key]
        print(f"  {label:<30} p50 {v['p50']:>7.1f}   p99 {v['p99']:>7.1f}   max {v['max']:>7.1f}")
ratio = c["agent_over_push"]
print("  agent / push: " + ", ".join(f"{k} {v}x" for k, v in ratio.items()))
if "storm" not in r:
    print(f"total {r['seconds']} s; meridian {r['meridian']}")
    sys.exit(0)
s = r["storm"]
print(f"{s['agents']} agents (one meridian-agent-swarm process), admission {s['admission_per_second']} streams/s")
print(f"  swarm start -> every agent joined and streaming   {s['joined_and_connected_s']:>7.2f} s "
      f"({s['joins_admitted']:.0f} joins admitted)")
print(f"  hub restart -> every agent streaming again        {s['restart_to_all_reconnected_s']:>7.2f} s "
      f"(floor set by the admission rate {s['admission_floor_s']} s; {s['reconnects_that_waited']:.0f} stream "
      f"admissions waited; {s['rejoins_after_restart']:.0f} joins again)")
print(f"  memory: hub {s['hub_rss_mib']} MiB, swarm {s['swarm_rss_mib']} MiB "
      f"({s['swarm_rss_mib'] * 1024 / s['agents']:.0f} KiB per agent)")
ok = s["rejoins_after_restart"] == 0
print(f"  check: every agent reconnected with its certificate, none joined again: {'OK' if ok else 'FAIL'}")
print(f"total {r['seconds']} s; meridian {r['meridian']}")
sys.exit(0 if ok else 1)
PY
echo "command: CHANGES=$CHANGES GAP_MS=$GAP_MS AGENTS=$AGENTS OBJECTS=$OBJECTS PARTS=$PARTS MERIDIAN=$MERIDIAN bench/agent.sh"
