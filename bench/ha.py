"""Sharded writers (issue 17): member-write throughput with 1, 2 and 3 replicas, and how long
ownership takes to settle after a replica dies (bench/ha.sh runs it).

    python3 bench/ha.py WORK [--members 100] [--rounds 3]

A hub (kube-apiserver + etcd, tests/e2e/kube_fleet.py with the peers of tests/peers/) and
MEMBERS directory members, each exporting one service with one endpoint. Replicas r0, r1, r2
(`meridian serve --shards`, MERIDIAN_BIN, each its own hub user) run with leaseDurationSeconds 4,
renewDeadlineSeconds 3, retryPeriodSeconds 1.

1. Throughput, for 1, 2 and 3 replicas: once every member is held by exactly one replica, each
   round rewrites every member's directory with one more endpoint; the clock starts before the
   first file is written and each member's time is when the hub's MemberCluster status (written
   by that member's holder) first shows the new endpoint count (the hub is listed every ~20 ms).
   A round's time is the last member's. Writes/s = members / (last - first status seen): the
   rate at which the holders wrote statuses, apart from noticing the change. Median of ROUNDS.
   The reference is the single replica (leader-only writing is the same code path with every
   member held by one replica), so the ratios say what sharding buys.
2. Settle after a death: with three replicas settled, r2 is killed (SIGKILL) and the clock runs
   until r0 and r1 between them hold every member, each exactly once (their /debug/shards,
   polled every ~50 ms). Expected about the lease duration plus one retry period.

Prints one JSON object on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from kube_fleet import DEFAULT_HEALTH, MERIDIAN, KubeFleet, exported_service_yaml, wait_for  # noqa: E402

REPLICAS = ("r0", "r1", "r2")
LEASE, RENEW, RETRY = 4, 3, 1


def log(*a):
    print(time.strftime("[%H:%M:%S]"), *a, file=sys.stderr, flush=True)


def write_member(d: Path, index: int, endpoints: int):
    """Rewrites member `index`'s manifest (atomically) with `endpoints` endpoints."""
    addresses = [f"10.{index // 250}.{index % 250}.{k + 1}" for k in range(endpoints)]
    tmp = d / ".objects.yaml.tmp"
    tmp.write_text(exported_service_yaml(f"svc-{index:03d}", addresses))
    tmp.rename(d / "objects.yaml")


def statuses(fleet) -> dict[str, int | None]:
    items = fleet.hub.list(MERIDIAN, "MemberCluster")
    return {i["metadata"]["name"]: ((i.get("status") or {}).get("endpoints")) for i in items}


def shards(m) -> dict:
    status, body = m.http("/debug/shards")
    return json.loads(body)["shards"] if status == 200 else {}


def settled(running: dict, members: list[str]) -> bool:
    held: dict[str, int] = {}
    for m in running.values():
        try:
            s = shards(m)
        except OSError:
            return False
        if sorted(s.get("liveReplicas") or []) != sorted(running):
            return False
        for name, v in (s.get("members") or {}).items():
            held[name] = held.get(name, 0) + int(v["held"])
    return sorted(held) == sorted(members) and all(n == 1 for n in held.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--members", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    fleet = KubeFleet(args.work / "kube", (), replica_users=list(REPLICAS)).start()
    try:
        fleet.grant_shards()
        dirs = {}
        for i in range(args.members):
            name = f"d{i:03d}"
            d = args.work / "members" / name
            d.mkdir(parents=True)
            write_member(d, i, 1)
            dirs[name] = (d, i)
            fleet.hub.apply({
                "apiVersion": MERIDIAN, "kind": "MemberCluster",
                "metadata": {"name": name},
                "spec": {"source": {"directory": {"path": str(d)}}, "network": {"name": "net1"},
                         "health": dict(DEFAULT_HEALTH)},
            })
        members = sorted(dirs)
        election = {"leaseName": "meridian", "leaseDurationSeconds": LEASE, "renewDeadlineSeconds": RENEW,
                    "retryPeriodSeconds": RETRY, "shards": True}
        running = {}
        endpoints = 1
        result = {"members": args.members, "rounds": args.rounds, "throughput": {}}
        for n in (1, 2, 3):
            for r in REPLICAS[:n]:
                if r not in running:
                    running[r] = fleet.start_meridian(r, leaderElection=election,
                                                      directory={"settleMilliseconds": 0}, ready_timeout=60)
            wait_for(lambda: settled(running, members), timeout=60, interval=0.2, what=f"{n} replicas settled")
            log(f"{n} replica(s) settled")
            rounds = []
            for _ in range(args.rounds):
                endpoints += 1
                start = time.monotonic()
                for name, (d, i) in dirs.items():
                    write_member(d, i, endpoints)
                seen: dict[str, float] = {}
                deadline = start + 60
                while len(seen) < len(members) and time.monotonic() < deadline:
                    t = time.monotonic()
                    for name, e in statuses(fleet).items():
                        if e == endpoints and name not in seen:
                            seen[name] = t - start
                    time.sleep(0.02)
                if len(seen) < len(members):
                    raise SystemExit(f"only {len(seen)} of {len(members)} statuses show {endpoints} endpoints "
                                     f"within 60 s: {statuses(fleet)}")
                first, last = min(seen.values()), max(seen.values())
                rounds.append({"first_s": first, "last_s": last,
                               "writes_per_s": len(members) / max(last - first, 0.02)})
                time.sleep(1.5)
            result["throughput"][str(n)] = {
                "rounds": rounds,
                "last_s_median": statistics.median(r["last_s"] for r in rounds),
                "writes_per_s_median": statistics.median(r["writes_per_s"] for r in rounds),
            }
            log(f"{n} replica(s): {result['throughput'][str(n)]}")
        # Kill r2: how long until r0 and r1 hold everything.
        victim = running.pop("r2")
        victim.proc.kill()
        victim.proc.wait()
        killed = time.monotonic()
        wait_for(lambda: settled(running, members), timeout=60, interval=0.05, what="ownership settled after r2 died")
        result["settle_after_death_s"] = time.monotonic() - killed
        result["lease_duration_s"], result["retry_period_s"] = LEASE, RETRY
        print(json.dumps(result))
    finally:
        fleet.stop_meridians()
        fleet.stop()


if __name__ == "__main__":
    main()
