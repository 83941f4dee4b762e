#!/usr/bin/env bash
# Write-back at fleet scale (issue 11): after one service changes, what an MCS write-back round
# computes for every member, as the scoped round meridian runs (only the services whose views
# changed, `writeback::Scope::Services`) beside a full round over every service (what a round
# cost before rounds were scoped), on the same restamped snapshots, in one process. The write
# target is in-process: a round's output is the objects it would apply (counted); no API server
# is involved, so this is the decision's cost per round, not the writes'. A full round is timed
# over a sample of members and scaled (at 255 x 33,000 it takes minutes). Since this stop a full
# round happens only at start, on a new term, after a failed pass or when a member's namespaces
# change; the 60 s resync is a listing of what is in the member, not a full round.
#
#   bench/writeback.sh                       (255 members, 33,000 services)
#   MEMBERS=100 SERVICES=10000 bench/writeback.sh
set -euo pipefail

cd "$(dirname "$0")/.."
MEMBERS=${MEMBERS:-255}
SERVICES=${SERVICES:-33000}
source bench/lib.sh

log "building the example (release)"
cargo build --release --quiet -p meridian-controllers --example writeback_scale
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/examples/writeback_scale
[[ -x $BIN ]] || die "no $BIN after the build"
log "running: $MEMBERS members x $SERVICES services"
RESULT=$("$BIN" "$MEMBERS" "$SERVICES")

echo "=== write-back round after one service change: $MEMBERS members, $SERVICES services ==="
python3 - "$RESULT" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
full, scoped = r["full"], r["scoped"]
print(f"services whose views changed       {r['changed_services']}")
est = "" if r["full_sample"] == r["members"] else f"   (timed over {r['full_sample']} members, scaled)"
print(f"full round (every service)         {full['ms']:>10.2f} ms   {full['objects']:>9} objects to apply{est}")
print(f"scoped round (changed services)    {scoped['ms']:>10.3f} ms   {scoped['objects']:>9} objects to apply")
print(f"full / scoped                      {r['ratio']:>10.1f}x")
ok = r["changed_services"] == 1 and 0 < scoped["objects"] < full["objects"]
per_member = scoped["objects"] / r["members"]
print(f"scoped objects per member          {per_member:>10.1f}")
print(f"[{'PASS' if ok else 'FAIL'}] a one-service change writes that service's objects only "
      f"(O(changed x members), not O(services x members))")
sys.exit(0 if ok else 1)
PY
echo "command: MEMBERS=$MEMBERS SERVICES=$SERVICES bench/writeback.sh"
