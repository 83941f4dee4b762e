#!/usr/bin/env bash
# Fleet scale (issue 38): what one change costs at a thousand members.
#
#   bench/fleet.sh                       (from anywhere; needs cargo)
#   PLACEMENT_CLUSTERS=1000 PLACEMENT_TEMPLATES=10000 PLACEMENT_RUNS=5 bench/fleet.sh
#
# 1. Placement rounds (core/benches/placement_rounds.rs): a core Fleet with 1,000 members and
#    10,000 templates (1,000 Duplicated onto 100 members each, 4,000 divided by static
#    weights over 200, 5,000 by available capacity over 100: ~130,000 placed copies). Per
#    kind of change — nothing, one template edit of each division, one member's capacity —
#    the median `Fleet::publish` (build, place, stamp: what the store runs per change), the
#    templates that round decided, the settling rounds that follow at once, and the ratio to
#    one round deciding every template (`Placer::deciding_everything`, run side by side in
#    the same process: what every change cost before rounds were incremental). Budget: one
#    template edit → its placement decided in ≤ 10 ms of meridian's own time.
#
# The gateway at 1,000 members is bench/gateway.sh's fleet part; propagation and write-back
# at fleet size are not measured here yet (see ARCHITECTURE.md, "Scale").
set -euo pipefail

cd "$(dirname "$0")/.."
echo "== placement rounds at fleet size (cargo bench -p meridian-core --bench placement_rounds)"
cargo bench --quiet -p meridian-core --bench placement_rounds 2>&1 | grep -v '^\s*\(Compiling\|Finished\|Running\)'
