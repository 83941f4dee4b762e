"""Template change → applied in every member, and initial propagation of many templates, on
real kube-apiservers (bench/propagation.sh runs it).

    python3 bench/propagation.py WORK [--changes 300] [--gap-ms 20] [--templates 1000]
                                      [--create-threads 8] [--initial-timeout 900]

Starts a hub and members m1, m2, m3 (kube-apiserver + etcd each, tests/e2e/kube_fleet.py with
the peers of tests/peers/) and `meridian serve` (MERIDIAN_BIN) with the hub, as one replica,
which leads and propagates:

1. Change → applied in every member. The hub holds Deployment shop/web, placed Duplicated
   into m1, m2 and m3 by a ClusterSchedulingPolicy. Each change is one merge PATCH of the hub
   template (over a kept-alive HTTPS connection, as admin) setting the pod-template
   annotation `rev: N`; the clock starts just before the request is sent and stops, for each
   of these raw HTTP watches (threads of this process, as admin) separately, at the first
   event whose object carries `rev: N`:
     - on the hub's Deployment web: the API server's own write → watch delivery, the same
       thing meridian's template watch waits for (the reference figure);
     - on Deployment web in each of m1, m2, m3: meridian saw the template change, rendered it
       and server-side applied it there, and that member's API server delivered it;
   "all" is the latest of the three members per change. Changes go one at a time, GAP ms
   after every observation of the last one. "Beyond hub watch" subtracts, per change, the hub
   watch delivery from "all": meridian's own part (its template watch, the propagation
   loop's 100 ms debounce, the three applies and their watch delivery).
2. Initial propagation. TEMPLATES Deployments (bulk/t-00000, ...) are created on the hub as
   fast as CREATE_THREADS threads (a kept-alive connection each) can, before any policy
   selects them: the time that takes is the API server's own create rate, for reference.
   Then the clock starts just before the ClusterSchedulingPolicy selecting all of them
   (Duplicated into m1, m2, m3) is created, and stops when a raw watch on each member's
   bulk Deployments labelled app.kubernetes.io/managed-by=meridian has seen every one of
   them (namespace bulk does not exist in the members: meridian creates it). Per member:
   time to the first and to the last copy, and its write rate (TEMPLATES / time to the
   last copy); a list with that labelSelector per member confirms the count at the end. A
   watch on the hub's Placements in bulk says when meridian's per-template record of each was
   written too (reported beside the members' figure; waited for up to PLACEMENTS_TIMEOUT
   seconds after the last copy). Then, from the first 2 s in which no pass looked at a
   template, IDLE_S seconds with nothing changing: the mean of
   meridian_propagation_plan_seconds (one pass's deciding — finding what changed, then its
   steps and renders — before its requests) and of meridian_propagation_looked_templates
   (templates a pass looked at), during the initial phase and while settled.

meridian's log (WORK/kube/meridian.log) is scanned at the end: its WARN and ERROR lines are
counted and the first ones included. Prints one JSON object with every figure on stdout
(progress on stderr).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import ssl
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from benchstats import log, summary  # noqa: E402  (bench/, the script's own folder)
from kube_fleet import CORE, MANAGED, MERIDIAN, NAMESPACE, KubeFleet, wait_for  # noqa: E402

APPS = "apps/v1"
MEMBERS = ("m1", "m2", "m3")
BULK = "bulk"  # the namespace of the TEMPLATES templates (hub only; meridian creates it in members)
KARMADA_P99_MS = 1300  # Karmada's published push p99 at 100 clusters (not run here)


def deployment(name, namespace, *, labels=None, annotations=None):
    pod_meta = {"labels": {"app": name}}
    if annotations:
        pod_meta["annotations"] = annotations
    return {"apiVersion": APPS, "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name, **(labels or {})}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": pod_meta,
                                  "spec": {"containers": [{"name": "app",
                                                           "image": f"registry.example.com/{namespace}/{name}:1"}]}}}}


def duplicated(selector: dict) -> dict:
    return {"resourceSelectors": [selector],
            "placement": {"clusterAffinities": [{"name": "all", "clusterNames": list(MEMBERS)}],
                          "replicaScheduling": {"type": "Duplicated"}}}


def connect(cluster, timeout=30) -> http.client.HTTPSConnection:
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
    return http.client.HTTPSConnection("127.0.0.1", cluster.apiserver_port, context=ctx, timeout=timeout)


class Seen:
    """First time (monotonic) each key was observed, with a wake-up for waiters."""

    def __init__(self):
        self.at: dict[str, float] = {}
        self.cond = threading.Condition()

    def add(self, key, t):
        with self.cond:
            if key not in self.at:
                self.at[key] = t
                self.cond.notify_all()

    def wait(self, key, timeout):
        with self.cond:
            return self.cond.wait_for(lambda: key in self.at, timeout)

    def wait_count(self, n, timeout):
        with self.cond:
            return self.cond.wait_for(lambda: len(self.at) >= n, timeout)

    def __len__(self):
        with self.cond:
            return len(self.at)


class Watcher(threading.Thread):
    """A raw HTTP watch (as admin) on a collection path; `key(obj)` of each event's object (None:
    ignored) goes into `seen`, timestamped when its line arrived. No resourceVersion: it starts
    with the objects that exist (ADDED), then follows."""

    def __init__(self, cluster, path: str, seen: Seen, key):
        super().__init__(daemon=True)
        self.cluster, self.seen, self.key = cluster, seen, key
        sep = "&" if "?" in path else "?"
        self.path = f"{path}{sep}watch=1&timeoutSeconds=3600"
        self.ready = threading.Event()
        self.error = None
        self.events = 0

    def run(self):
        try:
            conn = connect(self.cluster, timeout=3700)
            conn.request("GET", self.path, headers={"Authorization": f"Bearer {self.cluster.admin_token}"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"watch {self.path}: {resp.status} {resp.read()[:300]!r}")
            self.ready.set()
            for line in resp:
                t = time.monotonic()
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"watch {self.path}: {event.get('object')}")
                self.events += 1
                k = self.key(event.get("object") or {})
                if k is not None:
                    self.seen.add(k, t)
            raise RuntimeError(f"watch {self.path} ended")
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            self.error = e
            self.ready.set()


def start_watch(cluster, path, seen, key) -> Watcher:
    w = Watcher(cluster, path, seen, key)
    w.start()
    w.ready.wait(15)
    if w.error or not w.ready.is_set():
        raise RuntimeError(f"{cluster.name}: watch not started: {w.error}")
    return w


def rev_of(obj) -> str | None:
    return ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}).get("rev")


def metrics(m) -> dict[str, float]:
    """Every sample of meridian's /metrics, by name with labels."""
    out = {}
    for line in m.http("/metrics")[1].splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def applies(before: dict, after: dict) -> dict:
    """meridian_propagation_applies_total between two metrics() readings, by cluster and result."""
    out = {}
    for k, v in after.items():
        if k.startswith("meridian_propagation_applies_total{"):
            d = v - before.get(k, 0)
            if d:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', k))
                out[f"{labels.get('cluster')}/{labels.get('result')}"] = int(d)
    return out


def counter(before: dict, after: dict, name: str) -> int:
    return int(after.get(name, 0) - before.get(name, 0))


def mean(before: dict, after: dict, histogram: str) -> float | None:
    """The mean of a histogram's observations between two metrics() readings."""
    n = after.get(f"{histogram}_count", 0) - before.get(f"{histogram}_count", 0)
    total = after.get(f"{histogram}_sum", 0) - before.get(f"{histogram}_sum", 0)
    return total / n if n else None


def mean_ms(before: dict, after: dict, histogram: str) -> float | None:
    """The mean of a histogram's observations between two metrics() readings, in ms."""
    m = mean(before, after, histogram)
    return round(1000 * m, 2) if m is not None else None


IDLE_S = 12


def change_to_members(fleet: KubeFleet, m, changes: int, gap_ms: int) -> dict:
    hub = fleet.hub
    hub.apply(deployment("web", NAMESPACE, annotations={"rev": "0"}))
    fleet.policy("web", duplicated({"apiVersion": APPS, "kind": "Deployment", "name": "web"}))
    path = f"/apis/{APPS}/namespaces/{NAMESPACE}/deployments"
    for name in MEMBERS:
        wait_for(lambda: rev_of(fleet.cluster(name).get(APPS, "Deployment", "web", NAMESPACE) or {}) == "0",
                 timeout=30, what=f"web applied in {name}", log=m)
    log("web applied in m1, m2, m3")

    one = path + "?fieldSelector=" + urllib.parse.quote("metadata.name=web")
    hub_seen = Seen()
    watchers = [start_watch(hub, one, hub_seen, rev_of)]
    member_seen = {}
    for name in MEMBERS:
        member_seen[name] = Seen()
        watchers.append(start_watch(fleet.cluster(name), one, member_seen[name], rev_of))

    conn = connect(hub)
    headers = {"Authorization": f"Bearer {hub.admin_token}", "Content-Type": "application/merge-patch+json"}
    target = f"{path}/web"
    rows = []
    before = metrics(m)
    log(f"{changes} changes of the hub template web, one at a time, {gap_ms} ms apart")
    for i in range(1, changes + 1):
        rev = str(i)
        body = json.dumps({"spec": {"template": {"metadata": {"annotations": {"rev": rev}}}}})
        t0 = time.monotonic()
        conn.request("PATCH", target, body, headers)
        resp = conn.getresponse()
        raw = resp.read()
        t_written = time.monotonic()
        if resp.status != 200:
            raise RuntimeError(f"PATCH {target}: {resp.status} {raw[:300]!r}")
        for what, seen in (("hub", hub_seen), *member_seen.items()):
            if not seen.wait(rev, 30):
                errors = {w.path: w.error for w in watchers if w.error}
                raise RuntimeError(f"change {i}: {what} never showed rev {rev} after 30 s (watch errors {errors})\n"
                                   f"{m.log_tail()}")
        row = {"write": (t_written - t0) * 1000, "hub_watch": (hub_seen.at[rev] - t0) * 1000}
        for name in MEMBERS:
            row[name] = (member_seen[name].at[rev] - t0) * 1000
        row["all"] = max(row[name] for name in MEMBERS)
        rows.append(row)
        time.sleep(gap_ms / 1000)
        if i % 50 == 0:
            log(f"  {i} changes; last: all members {row['all']:.0f} ms, hub watch {row['hub_watch']:.1f} ms")
    conn.close()
    after = metrics(m)
    col = lambda k: [r[k] for r in rows]  # noqa: E731
    out = {
        "changes": changes,
        "gap_ms": gap_ms,
        "write_response_ms": summary(col("write")),
        "hub_watch_delivery_ms": summary(col("hub_watch")),
        **{f"{name}_ms": summary(col(name)) for name in MEMBERS},
        "all_members_ms": summary(col("all")),
        "all_beyond_hub_watch_ms": summary([r["all"] - r["hub_watch"] for r in rows]),
        "applies": applies(before, after),
        # meridian's own count of copies it found changed in a member and applied again.
        "drift_reverted": counter(before, after, "meridian_propagation_drift_reverted_total"),
        "each_ms": [{k: round(v, 2) for k, v in r.items()} for r in rows],
    }
    out["ratio_p99_meridian_to_apiserver"] = round(out["all_members_ms"]["p99"] / out["hub_watch_delivery_ms"]["p99"], 1)
    out["ratio_p99_meridian_to_karmada_published"] = round(out["all_members_ms"]["p99"] / KARMADA_P99_MS, 3)
    return out


def initial_propagation(fleet: KubeFleet, m, templates: int, threads: int, timeout: float,
                        placements_timeout: float) -> dict:
    hub = fleet.hub
    hub.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": BULK}})
    names = [f"t-{i:05d}" for i in range(templates)]
    path = f"/apis/{APPS}/namespaces/{BULK}/deployments"

    # The API server's own rate: TEMPLATES creates on the hub, THREADS kept-alive connections.
    local = threading.local()

    def create(name):
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = connect(hub)
        body = json.dumps(deployment(name, BULK, labels={"bench": "bulk"}))
        conn.request("POST", path, body, {"Authorization": f"Bearer {hub.admin_token}",
                                           "Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 201:
            raise RuntimeError(f"create {BULK}/{name}: {resp.status} {raw[:300]!r}")

    log(f"creating {templates} Deployments in hub namespace {BULK} ({threads} threads)")
    t0 = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, names))
    create_s = time.monotonic() - t0
    log(f"  created in {create_s:.2f} s ({templates / create_s:.0f} objects/s)")

    member_seen = {name: Seen() for name in MEMBERS}
    selector = "?labelSelector=" + urllib.parse.quote(MANAGED)
    watchers = [start_watch(fleet.cluster(name), path + selector, member_seen[name],
                            lambda o: (o.get("metadata") or {}).get("name")) for name in MEMBERS]
    placements_seen = Seen()
    watchers.append(start_watch(hub, f"/apis/{MERIDIAN}/namespaces/{BULK}/placements", placements_seen,
                                lambda o: (o.get("metadata") or {}).get("name")))
    time.sleep(1)  # meridian has seen every template (nothing selects them yet)
    before = metrics(m)
    log(f"policy selecting all {templates} (Duplicated into {', '.join(MEMBERS)}); waiting for every copy")
    t0 = time.monotonic()
    fleet.policy("bulk", duplicated({"apiVersion": APPS, "kind": "Deployment"}), namespace=BULK)
    deadline = t0 + timeout
    progress = []
    while True:
        counts = {name: len(s) for name, s in member_seen.items()}
        elapsed = time.monotonic() - t0
        progress.append({"s": round(elapsed, 1), **counts, "placements": len(placements_seen)})
        if all(c >= templates for c in counts.values()):
            break
        if time.monotonic() > deadline:
            log(f"  TIMEOUT after {timeout:.0f} s: {counts}")
            break
        errors = {w.path: w.error for w in watchers[:3] if w.error}
        if errors:
            raise RuntimeError(f"member watch failed: {errors}")
        if len(progress) % 10 == 1:
            log(f"  {elapsed:5.1f} s: {counts}, {len(placements_seen)} Placements on the hub")
        for s in member_seen.values():
            s.wait_count(templates, 0.5)
    complete = all(len(s) >= templates for s in member_seen.values())
    # The Placements (meridian writes them after the pass over the members).
    if complete and not placements_seen.wait_count(templates, placements_timeout):
        log(f"  only {len(placements_seen)} Placements {placements_timeout:.0f} s after the last copy")
    after = metrics(m)
    # Settled: what one pass costs meridian when nothing changes (the loop still passes every
    # 5 s and on watch events), from the first 2 s in which no pass looked at a template
    # (the passes that confirm the last writes come first).
    settled = after
    for _ in range(30):
        time.sleep(2)
        now = metrics(m)
        quiet = now.get("meridian_propagation_looked_templates_sum") == settled.get("meridian_propagation_looked_templates_sum")
        settled = now
        if quiet:
            break
    time.sleep(IDLE_S)
    idle = metrics(m)

    per_member = {}
    for name, s in member_seen.items():
        times = sorted(s.at.values())
        listed = len(fleet.cluster(name).list(APPS, "Deployment", BULK, label_selector=MANAGED))
        last = (times[-1] - t0) if times else None
        per_member[name] = {
            "copies": len(times), "listed": listed,
            "first_s": round(times[0] - t0, 3) if times else None,
            "last_s": round(last, 3) if last is not None else None,
            "objects_per_s": round(len(times) / last, 1) if last else None,
        }
    lasts = [p["last_s"] for p in per_member.values() if p["last_s"] is not None]
    total_s = max(lasts) if complete else None
    pl = sorted(placements_seen.at.values())
    return {
        "templates": templates,
        "complete": complete,
        "seconds": round(total_s, 2) if total_s is not None else None,
        "timeout_s": timeout,
        "copies_total": sum(p["copies"] for p in per_member.values()),
        "per_member": per_member,
        # Every member's copies over the whole time, per member (they are written side by side).
        "per_member_objects_per_s": round(templates / total_s, 1) if total_s else None,
        "all_members_objects_per_s": round(len(MEMBERS) * templates / total_s, 1) if total_s else None,
        "hub_create": {"threads": threads, "seconds": round(create_s, 2),
                       "objects_per_s": round(templates / create_s, 1)},
        "placements_on_hub": {"count": len(pl), "first_s": round(pl[0] - t0, 2) if pl else None,
                              "last_s": round(pl[-1] - t0, 2) if pl else None},
        "applies": applies(before, after),
        "drift_reverted": counter(before, after, "meridian_propagation_drift_reverted_total"),
        "plan_ms_per_pass": {"initial": mean_ms(before, after, "meridian_propagation_plan_seconds"),
                             f"settled_{IDLE_S}s": mean_ms(settled, idle, "meridian_propagation_plan_seconds"),
                             "settled_passes": counter(settled, idle, "meridian_propagation_plan_seconds_count")},
        # Templates each pass looked at (the others were left as they were).
        "looked_per_pass": {"initial": mean(before, after, "meridian_propagation_looked_templates"),
                            "settled": mean(settled, idle, "meridian_propagation_looked_templates")},
        "progress": progress[::max(1, len(progress) // 60)],
    }


def log_problems(path: Path, keep: int = 20) -> dict:
    """meridian's WARN and ERROR lines: counts and the first `keep` (ANSI colours removed)."""
    counts = {"WARN": 0, "ERROR": 0}
    first = []
    if not path.exists():
        return {"counts": counts, "first": first}
    for line in path.read_text(errors="replace").splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        level = next((lv for lv in ("ERROR", "WARN") if re.search(rf"\b{lv}\b", line[:80])), None)
        if level:
            counts[level] += 1
            if len(first) < keep:
                first.append(line[:600])
    return {"counts": counts, "first": first}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--changes", type=int, default=300)
    ap.add_argument("--gap-ms", type=int, default=20, help="pause after each change is observed everywhere")
    ap.add_argument("--templates", type=int, default=1000)
    ap.add_argument("--create-threads", type=int, default=8)
    ap.add_argument("--initial-timeout", type=float, default=900)
    ap.add_argument("--placements-timeout", type=float, default=180,
                    help="how long after the last copy to wait for every Placement on the hub")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    started = time.monotonic()
    log("starting hub, m1, m2 and m3 (kube-apiserver + etcd each)")
    fleet = KubeFleet(args.work / "kube").start()
    fleet.grant_propagation()  # deploy/rbac/member-propagation.yaml in every member
    try:
        log(f"fleet up after {time.monotonic() - started:.0f} s; starting meridian")
        m = fleet.start_meridian("meridian", env={"MERIDIAN_LOG": os.environ.get("MERIDIAN_LOG", "info")})
        wait_for(lambda: fleet.lease_holder() == "meridian", timeout=15, what="meridian leads", log=m)
        result = {"meridian": str(m.proc.args[0]), "karmada_published_p99_ms": KARMADA_P99_MS}
        if args.changes > 0:
            result["change_to_members"] = change_to_members(fleet, m, args.changes, args.gap_ms)
        if args.templates > 0:
            result["initial"] = initial_propagation(fleet, m, args.templates, args.create_threads,
                                                    args.initial_timeout, args.placements_timeout)
        result["meridian_running"] = m.proc.poll() is None
        result["meridian_log"] = log_problems(m.log)
        result["seconds"] = round(time.monotonic() - started)
        print(json.dumps(result))
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
