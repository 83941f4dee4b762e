"""meridian's propagation and write-back at fleet scale, against simulated members
(meridian-kubesim: N loopback API servers in one process), or against real kube-apiservers
(--real: one kube-apiserver and etcd per member, tests/e2e/kube_fleet.py, to check the
simulation against the real thing at a size this machine holds). bench/fleet_members.sh runs it.

    python3 bench/fleet_members.py WORK --meridian BIN (--kubesim BIN | --real) [--members 1000]
        [--templates 10000] [--duplicated 1000] [--wide 100] [--narrow-policies 100]
        [--new-samples 20] [--edit-samples 50] [--settle-s 30]

With --real, what kubesim's write log and /stats say comes from each API server's audit log
(meridian's requests at Metadata level, its Deployment writes at Request level for the rev they
carry; stageTimestamp of ResponseComplete is the write's time, on this machine's clock), a
server-side apply is counted as the `patch` it is on the wire (kubesim says `apply`), and the
full resync is not run (a real API server cannot expire every watch on demand).

The fleet:
  - MEMBERS simulated members m0001…, 3 Ready nodes each, in groups of WIDE (member label
    bench.meridian.io/group: gK, members of one group contiguous);
  - a directory hub (WORK/hub) with one MemberCluster per member (kubeconfig by path), and in
    namespace bench: DUPLICATED "wide" Deployments (one file each, labelled with a group
    round-robin), placed Duplicated onto the WIDE members of their group by one
    ClusterSchedulingPolicy per group (selecting by template labels); the other
    TEMPLATES - DUPLICATED "narrow" Deployments (files of 100), split over NARROW_POLICIES
    policies each placing its share onto 3 members (policy p: members 3p+1..3p+3), or left
    unselected when NARROW_POLICIES is 0;
  - one `meridian serve` on it (it leads: a directory hub always does).

What the clocks measure (kubesim's write log stamps each write when it is answered, on the
same clock as this script):
  initial      from just before `meridian serve` starts (templates and policies already on
               disk) to the last copy's first successful apply in kubesim's write log; the
               rate is copies / that time (every copy's first apply counted once).
  new template from just before a new wide template's file is renamed into the hub
               directory (a file of its own, its mtime set 1 s in the past so the directory
               source's 100 ms settle rule reads it at once; inotify's 50 ms debounce
               remains) to its apply in the last of the WIDE members of group g0.
  edit         the same for an edit of one wide template's pod-template annotation
               bench.meridian.io/rev (its file rewritten the same way) to the last of its
               WIDE members having applied that rev.
  settled      SETTLE_S seconds with nothing changing: requests per second meridian makes to
               all members by verb (kubesim /stats), writes among them, and the mean of
               meridian_propagation_plan_seconds over the passes in that window.
  full resync  POST /expire-all (every watch ends, every older resourceVersion is 410): from
               then to the last new LIST request (no new LIST for QUIET_S seconds), and the
               writes meridian made from then until that point.
  restart      meridian stopped (SIGTERM) and started again: from the new process's start
               to the last LIST / write (none for QUIET_S seconds), and its writes.
  memory       VmRSS and open fds of meridian and kubesim from /proc, settled.

Prints one JSON object on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

NS = "bench"
GROUP = "bench.meridian.io/group"
PLACEMENT = "bench.meridian.io/placement"
SLOT = "bench.meridian.io/slot"
REV = "bench.meridian.io/rev"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def http(method: str, url: str, body: bytes | None = None, timeout: float = 30):
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Content-Type": "application/json"} if body else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        data = r.read()
    return json.loads(data) if data else None


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_figures(pid: int) -> dict:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return {"rss_mib": round(rss_kb / 1024, 1), "fds": fds, "threads": threads, "cpu_s": round(cpu_s, 1)}
    except (OSError, AttributeError):
        return {}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary_ms(values_s: list[float]) -> dict:
    ms = [v * 1000 for v in values_s]
    return {"n": len(ms), "p50": round(pct(ms, 50), 1), "p90": round(pct(ms, 90), 1),
            "p99": round(pct(ms, 99), 1), "max": round(max(ms), 1) if ms else None}


class FirstWrites:
    """Per Deployment name, per member, the first successful apply (time) and the time each
    rev was first applied: what WriteTail and AuditTail learn from their logs."""

    def __init__(self):
        self.lock = threading.Lock()
        self.first: dict[str, dict[str, float]] = {}
        self.revs: dict[tuple[str, str], dict[str, float]] = {}

    def applied(self, name: str, member: str, rev: str | None, t: float) -> None:
        self.first.setdefault(name, {}).setdefault(member, t)
        if rev:
            self.revs.setdefault((name, rev), {}).setdefault(member, t)

    def copies(self) -> tuple[int, float | None]:
        with self.lock:
            times = [t for m in self.first.values() for t in m.values()]
        return len(times), (max(times) if times else None)

    def wait_rev(self, name: str, rev: str, members: int, timeout: float) -> float | None:
        end = time.time() + timeout
        while time.time() < end:
            with self.lock:
                got = self.revs.get((name, rev), {})
                if len(got) >= members:
                    return max(got.values())
            time.sleep(0.01)
        return None


class WriteTail(FirstWrites):
    """Follows kubesim's write log (what FirstWrites keeps)."""

    def __init__(self, control: str):
        super().__init__()
        self.control = control
        self.since = 0
        self.errors: list[dict] = []
        self.stop = False
        threading.Thread(target=self.run, daemon=True).start()

    def __repr__(self) -> str:
        return f"WriteTail({self.control})"

    def run(self) -> None:
        while not self.stop:
            try:
                page = http("GET", f"{self.control}/writes?since={self.since}&limit=50000")
            except OSError:
                time.sleep(0.2)
                continue
            with self.lock:
                for w in page["writes"]:
                    if w["code"] >= 300:
                        if len(self.errors) < 50:
                            self.errors.append(w)
                        continue
                    if w["resource"] != "deployments" or w["verb"] != "apply" or w.get("subresource"):
                        continue
                    self.applied(w["name"], w["member"], w.get("rev"), w["time_ns"] / 1e9)
                self.since = page["next"]
            if not page["writes"]:
                time.sleep(0.02)


class Tails:
    """One WriteTail per kubesim process, read as one."""

    def __init__(self, controls: list[str]):
        self.tails = [WriteTail(c) for c in controls]

    @property
    def first(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for t in self.tails:
            with t.lock:
                for name, members in t.first.items():
                    out.setdefault(name, {}).update(members)
        return out

    @property
    def errors(self) -> list[dict]:
        return [e for t in self.tails for e in t.errors]

    def copies(self) -> tuple[int, float | None]:
        got = [t.copies() for t in self.tails]
        last = [l for _, l in got if l is not None]
        return sum(n for n, _ in got), (max(last) if last else None)

    def wait_rev(self, name: str, rev: str, members: int, timeout: float) -> float | None:
        end = time.time() + timeout
        while time.time() < end:
            got: dict[str, float] = {}
            for t in self.tails:
                with t.lock:
                    got.update(t.revs.get((name, rev), {}))
            if len(got) >= members:
                return max(got.values())
            time.sleep(0.01)
        return None

    def stop(self) -> None:
        for t in self.tails:
            t.stop = True


# The audit policy of --real: meridian's Deployment writes with their body (the rev they carry),
# its other requests with who, what and when; nothing of anyone else.
REAL_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Request", "users": ["meridian"], "verbs": ["create", "update", "patch"],
         "resources": [{"group": "apps", "resources": ["deployments"]}]},
        {"level": "Metadata", "users": ["meridian"]},
        {"level": "None"},
    ],
}
AUDIT_WRITES = ("create", "update", "patch", "delete", "deletecollection")


def audit_time(stamp: str) -> float:
    """An audit stageTimestamp (RFC 3339, microseconds, UTC) as seconds since the epoch."""
    from datetime import datetime
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class AuditTail(FirstWrites):
    """Follows the audit logs of the members' API servers: what WriteTail and /stats say of
    kubesim — what FirstWrites keeps, and meridian's requests by verb and resource since the
    last reset()."""

    def __init__(self, logs: dict[str, Path]):
        super().__init__()
        self.logs = logs
        self.offsets = {m: 0 for m in logs}
        self.errors: list[dict] = []
        self.counts = self.empty()
        self.stop_flag = False
        threading.Thread(target=self.run, daemon=True).start()

    @staticmethod
    def empty() -> dict:
        return {"byVerb": {}, "byVerbResource": {}, "requests": 0, "writes": 0, "watches": 0}

    def run(self) -> None:
        while not self.stop_flag:
            idle = True
            for member, path in self.logs.items():
                try:
                    with open(path, "rb") as f:
                        f.seek(self.offsets[member])
                        data = f.read()
                except OSError:
                    continue
                end = data.rfind(b"\n") + 1
                if not end:
                    continue
                idle = False
                self.offsets[member] += end
                with self.lock:
                    for line in data[:end].splitlines():
                        try:
                            self.take(member, json.loads(line))
                        except ValueError:
                            pass
            if idle:
                time.sleep(0.02)

    def take(self, member: str, e: dict) -> None:
        verb, ref = e.get("verb"), e.get("objectRef") or {}
        resource = ref.get("resource", "")
        if verb == "watch":
            # A watch is counted when it starts; open until its ResponseComplete.
            if e.get("stage") == "ResponseStarted":
                self.count(verb, resource)
                self.counts["watches"] += 1
            elif e.get("stage") == "ResponseComplete":
                self.counts["watches"] -= 1
            return
        if e.get("stage") != "ResponseComplete":
            return
        self.count(verb, resource)
        code = (e.get("responseStatus") or {}).get("code", 0)
        if verb in AUDIT_WRITES:
            self.counts["writes"] += 1
        if code >= 300:
            if verb in AUDIT_WRITES and len(self.errors) < 50:
                self.errors.append({"member": member, "verb": verb, "resource": resource,
                                    "name": ref.get("name"), "code": code})
            return
        if resource != "deployments" or verb != "patch" or ref.get("subresource"):
            return
        body = e.get("requestObject") or {}
        rev = (((body.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations", {}).get(REV)
        self.applied(ref.get("name", ""), member, rev, audit_time(e["stageTimestamp"]))

    def count(self, verb: str, resource: str) -> None:
        c = self.counts
        c["requests"] += 1
        c["byVerb"][verb] = c["byVerb"].get(verb, 0) + 1
        per = c["byVerbResource"].setdefault(verb, {})
        per[resource] = per.get(resource, 0) + 1

    def stats(self) -> dict:
        with self.lock:
            return json.loads(json.dumps(self.counts))

    def reset(self) -> None:
        with self.lock:
            watches = self.counts["watches"]
            self.counts = self.empty()
            self.counts["watches"] = watches

    def stop(self) -> None:
        self.stop_flag = True


class Kubesim:
    """The simulated members: MEMBERS members in processes of PER_PROCESS."""

    def __init__(self, a, work: Path):
        procs = max(1, -(-a.members // a.per_process))
        self.sims, self.controls = [], []
        sim_log = open(work / "kubesim.log", "ab")
        t = time.time()
        for k in range(procs):
            first = k * a.per_process + 1
            count = min(a.per_process, a.members - k * a.per_process)
            port = free_port()
            self.controls.append(f"http://127.0.0.1:{port}")
            self.sims.append(subprocess.Popen(
                [a.kubesim, "--members", str(count), "--first-index", str(first), "--dir", str(work / f"sim{k}"),
                 "--control-port", str(port), "--nodes-per-member", "3"],
                stdout=sim_log, stderr=subprocess.STDOUT))
        self.members = []
        for k, sim in enumerate(self.sims):
            while not (work / f"sim{k}" / "members.json").exists():
                if sim.poll() is not None or time.time() - t > 120:
                    # The others started: they must not outlive this run.
                    self.stop_sims()
                    raise SystemExit(f"kubesim did not start: see {work}/kubesim.log")
                time.sleep(0.1)
            time.sleep(0.2)
            self.members += json.loads((work / f"sim{k}" / "members.json").read_text())
        self.start_s = round(time.time() - t, 2)
        self.tail = Tails(self.controls)

    def stats(self) -> dict:
        return stats(self.controls)

    def reset(self) -> None:
        post_all(self.controls, "/stats/reset")

    def expire_all(self) -> bool:
        post_all(self.controls, "/expire-all")
        return True

    def figures(self) -> dict:
        return procs_figures([s.pid for s in self.sims])

    def stop(self) -> None:
        self.tail.stop()
        self.stop_sims()

    def stop_sims(self) -> None:
        for sim in self.sims:
            sim.send_signal(signal.SIGTERM)
        for sim in self.sims:
            try:
                sim.wait(10)
            except subprocess.TimeoutExpired:
                sim.kill()


class RealMembers:
    """MEMBERS real members: a kube-apiserver and etcd each (tests/e2e/kube_fleet.py, as the
    e2e tests start them, with meridian's RBAC and 3 Nodes each), audited (REAL_AUDIT_POLICY)."""

    def __init__(self, a, work: Path):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
        from kube_fleet import KubeFleet, Member  # noqa: E402  (needs KUBE_APISERVER_BIN, ETCD_BIN)
        specs = [Member(f"m{i:04d}", "r1", "r1-a", f"127.{1 + i // 250}.{i % 250}.0/24") for i in range(1, a.members + 1)]
        t = time.time()
        self.fleet = KubeFleet(work / "kube", specs, audit=REAL_AUDIT_POLICY).start()
        self.fleet.grant_propagation()
        for name in self.fleet.members:
            self.fleet.cluster(name).apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            for k in range(3):
                self.fleet.node(name, f"node-{k}")
        self.members = [{"name": n, "kubeconfig": str(self.fleet.member_kubeconfig(n))} for n in self.fleet.members]
        self.start_s = round(time.time() - t, 2)
        self.tail = AuditTail({n: self.fleet.audit_log(n) for n in self.fleet.members})

    def stats(self) -> dict:
        return self.tail.stats()

    def reset(self) -> None:
        self.tail.reset()

    def expire_all(self) -> bool:
        return False

    def figures(self) -> dict:
        pids = []
        for c in self.fleet.members.values():
            pids += [p.pid for p in (getattr(c, "apiserver", None), getattr(c, "etcd", None)) if p is not None]
        return procs_figures(pids)

    def stop(self) -> None:
        self.tail.stop()
        self.fleet.stop()


def deployment(name: str, labels: dict, rev: str) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {REV: rev}},
                "spec": {"containers": [{"name": "app", "image": "registry.example.com/bench/app:1.0",
                                         "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]},
            },
        },
    }


def write_file(path: Path, docs: list[dict], backdate: bool) -> None:
    """Written beside, then renamed into place; backdated so the settle rule reads it at once."""
    tmp = path.parent.parent / f".{path.name}.tmp"
    tmp.write_text("".join("---\n" + json.dumps(d) + "\n" for d in docs))
    if backdate:
        past = time.time() - 1
        os.utime(tmp, (past, past))
    os.replace(tmp, path)


class Meridian:
    def __init__(self, binary: str, work: Path, admin: int, dns: int, xds: int):
        self.binary, self.work, self.admin, self.dns, self.xds = binary, work, admin, dns, xds
        self.proc: subprocess.Popen | None = None
        self.logfile = open(work / "meridian.log", "ab")

    def start(self) -> float:
        env = dict(os.environ, MERIDIAN_LOG=os.environ.get("MERIDIAN_LOG", "info"))
        t0 = time.time()
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--config", str(self.work / "meridian.yaml"),
             "--admin-listen", f"127.0.0.1:{self.admin}", "--dns-listen", f"127.0.0.1:{self.dns}",
             "--xds-listen", f"127.0.0.1:{self.xds}"],
            stdout=self.logfile, stderr=subprocess.STDOUT, env=env)
        return t0

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def metric(self, name: str) -> dict[str, float]:
        """Every sample of a metric family: {'sum': …, 'count': …} for histograms."""
        out: dict[str, float] = {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return out
        for line in text.splitlines():
            if line.startswith(name):
                key, _, value = line.rpartition(" ")
                suffix = key[len(name):].split("{")[0].lstrip("_") or "value"
                try:
                    out[suffix] = out.get(suffix, 0.0) + float(value)
                except ValueError:
                    pass
        return out


def stats(controls: list[str]) -> dict:
    """The totals of every kubesim process, summed."""
    out = {"byVerb": {}, "byVerbResource": {}, "requests": 0, "writes": 0, "watches": 0}
    for c in controls:
        t = http("GET", f"{c}/stats?detail=false")["totals"]
        for k in ("requests", "writes", "watches"):
            out[k] += t[k]
        for verb, n in t["byVerb"].items():
            out["byVerb"][verb] = out["byVerb"].get(verb, 0) + n
        for verb, per in t["byVerbResource"].items():
            into = out["byVerbResource"].setdefault(verb, {})
            for r, n in per.items():
                into[r] = into.get(r, 0) + n
    return out


def post_all(controls: list[str], path: str) -> None:
    for c in controls:
        http("POST", f"{c}{path}")


def procs_figures(pids: list[int]) -> dict:
    """Summed over the kubesim processes (fds: also the largest one, which meets the limit)."""
    figs = [proc_figures(p) for p in pids]
    figs = [f for f in figs if f]
    if not figs:
        return {}
    return {"rss_mib": round(sum(f["rss_mib"] for f in figs), 1), "fds": sum(f["fds"] for f in figs),
            "max_fds_one_process": max(f["fds"] for f in figs), "processes": len(figs),
            "cpu_s": round(sum(f["cpu_s"] for f in figs), 1)}


def quiet_after(sim, t0: float, verbs: tuple[str, ...], quiet_s: float, timeout: float) -> dict:
    """Polls the members' stats until none of `verbs` grew for quiet_s seconds: the time of the
    last growth."""
    last = None
    last_change = t0
    end = t0 + timeout
    while time.time() < end:
        s = sim.stats()
        now = time.time()
        value = tuple(s["byVerb"].get(v, 0) for v in verbs)
        if value != last:
            if last is not None:
                last_change = now
            last = value
        elif now - last_change >= quiet_s and sum(value) > 0:
            return {"seconds": round(last_change - t0, 2), "settled": True, "totals": s}
        time.sleep(0.25)
    return {"seconds": round(time.time() - t0, 2), "settled": False, "totals": sim.stats()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--meridian", required=True)
    kind = ap.add_mutually_exclusive_group(required=True)
    kind.add_argument("--kubesim")
    kind.add_argument("--real", action="store_true")
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--templates", type=int, default=10000)
    ap.add_argument("--duplicated", type=int, default=1000)
    ap.add_argument("--wide", type=int, default=100)
    ap.add_argument("--narrow-policies", type=int, default=100)
    ap.add_argument("--new-samples", type=int, default=20)
    ap.add_argument("--edit-samples", type=int, default=50)
    ap.add_argument("--settle-s", type=float, default=30)
    ap.add_argument("--quiet-s", type=float, default=10)
    ap.add_argument("--initial-timeout", type=float, default=1800)
    ap.add_argument("--per-process", type=int, default=250)
    a = ap.parse_args()
    # Stopped by bench/fleet_members.sh's cleanup: stop meridian and kubesim too (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(a.work)
    started = time.time()
    wide = min(a.wide, a.members)
    groups = max(1, a.members // wide)
    narrow_policies = min(a.narrow_policies, a.members // 3)
    result: dict = {"members": a.members, "templates": a.templates, "duplicated": a.duplicated,
                    "wide": wide, "groups": groups, "narrow_policies": narrow_policies}

    # The members: simulated (PER_PROCESS members a kubesim process: each process has its own
    # descriptor limit, and a member costs one descriptor per open connection), or real.
    sim = RealMembers(a, work) if a.real else Kubesim(a, work)
    members = sim.members
    result["real_members"] = a.real
    result["kubesim_processes"] = len(sim.sims) if not a.real else 0
    result["kubesim_start_s"] = sim.start_s
    result["kubesim_idle"] = sim.figures()
    log(f"members: {len(members)} in {result['kubesim_start_s']} s, {result['kubesim_idle']}")

    # The directory hub.
    hub = work / "hub"
    (hub / "templates").mkdir(parents=True)
    (work / "meridian.yaml").write_text("hub: {directory: hub}\ndns:\n  zones: [{name: global, style: global}]\n")
    with open(hub / "members.yaml", "w") as f:
        for i, m in enumerate(members):
            f.write("---\n" + json.dumps({
                "apiVersion": "meridian.io/v1alpha1", "kind": "MemberCluster",
                "metadata": {"name": m["name"], "labels": {GROUP: f"g{min(i // wide, groups - 1)}"}},
                "spec": {"source": {"kubernetes": {"kubeconfig": {"path": m["kubeconfig"]}}}},
            }) + "\n")
    policies = []
    for g in range(groups):
        policies.append({
            "apiVersion": "meridian.io/v1alpha1", "kind": "ClusterSchedulingPolicy",
            "metadata": {"name": f"wide-g{g}", "namespace": NS},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                            "labelSelector": {"matchLabels": {PLACEMENT: "wide", GROUP: f"g{g}"}}}],
                     "placement": {"clusterAffinities": [{"name": f"g{g}", "labelSelector": {"matchLabels": {GROUP: f"g{g}"}}}]}},
        })
    for p in range(narrow_policies):
        names = [members[3 * p + k]["name"] for k in range(3)]
        policies.append({
            "apiVersion": "meridian.io/v1alpha1", "kind": "ClusterSchedulingPolicy",
            "metadata": {"name": f"narrow-{p}", "namespace": NS},
            "spec": {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                            "labelSelector": {"matchLabels": {PLACEMENT: "narrow", SLOT: f"s{p}"}}}],
                     "placement": {"clusterAffinities": [{"name": "three", "clusterNames": names}]}},
        })
    (hub / "policies.yaml").write_text("".join("---\n" + json.dumps(p) + "\n" for p in policies))
    wide_names = [f"w{j:05d}" for j in range(a.duplicated)]
    for j, name in enumerate(wide_names):
        write_file(hub / "templates" / f"{name}.yaml",
                   [deployment(name, {PLACEMENT: "wide", GROUP: f"g{j % groups}"}, "0")], backdate=True)
    narrow = a.templates - a.duplicated
    chunk: list[dict] = []
    for j in range(narrow):
        labels = {PLACEMENT: "narrow", SLOT: f"s{j % narrow_policies}"} if narrow_policies else {PLACEMENT: "none"}
        chunk.append(deployment(f"n{j:05d}", labels, "0"))
        if len(chunk) == 100 or j == narrow - 1:
            write_file(hub / "templates" / f"narrow-{j // 100:03d}.yaml", chunk, backdate=True)
            chunk = []
    expected = a.duplicated * wide + (narrow * 3 if narrow_policies else 0)
    result["copies_expected"] = expected
    log(f"hub: {a.members} MemberClusters, {len(policies)} policies, {a.templates} templates, {expected} copies to place")

    tail = sim.tail
    ports = [free_port() for _ in range(3)]
    mer = Meridian(a.meridian, work, *ports)
    t0 = mer.start()
    try:
        # 1. Initial propagation.
        last_count, last_progress = -1, time.time()
        while True:
            n, last_t = tail.copies()
            if n >= expected:
                break
            if mer.proc.poll() is not None:
                raise SystemExit(f"meridian exited ({mer.proc.returncode}): see {work}/meridian.log")
            if n != last_count:
                if n // 10000 != max(last_count, 0) // 10000:
                    log(f"initial: {n}/{expected} copies after {time.time() - t0:.0f} s")
                last_count, last_progress = n, time.time()
            if time.time() - t0 > a.initial_timeout or time.time() - last_progress > 300:
                break
            time.sleep(0.25)
        n, last_t = tail.copies()
        first_t = min((t for m in tail.first.values() for t in m.values()), default=None)
        secs = (last_t - t0) if last_t else None
        result["initial"] = {
            "complete": n >= expected, "copies": n, "seconds": round(secs, 2) if secs else None,
            "first_copy_s": round(first_t - t0, 2) if first_t else None,
            "objects_per_s": round(n / secs, 1) if secs else None,
            "objects_per_s_from_first_copy": round(n / (last_t - first_t), 1) if first_t and last_t > first_t else None,
            "meridian": proc_figures(mer.proc.pid), "kubesim": sim.figures(),
        }
        log(f"initial: {result['initial']}")
        time.sleep(float(os.environ.get("AFTER_BURST_S", "5")))

        # 2. New templates onto the WIDE members of g0.
        lat = []
        for k in range(a.new_samples):
            name = f"new{k:03d}"
            path = hub / "templates" / f"{name}.yaml"
            t = time.time()
            write_file(path, [deployment(name, {PLACEMENT: "wide", GROUP: "g0"}, "0")], backdate=True)
            done = tail.wait_rev(name, "0", wide, 60)
            if done is None:
                log(f"new template {name}: not in all {wide} members within 60 s")
                continue
            lat.append(done - t)
            time.sleep(0.2)
        result["new_template"] = summary_ms(lat) | {"members": wide, "in_order_ms": [round(x * 1000) for x in lat]}
        log(f"new template: {result['new_template']}")

        # 3. Edits of wide templates.
        lat = []
        for k in range(a.edit_samples):
            j = (k * 37) % a.duplicated
            name = wide_names[j]
            rev = f"e{k}"
            t = time.time()
            write_file(hub / "templates" / f"{name}.yaml",
                       [deployment(name, {PLACEMENT: "wide", GROUP: f"g{j % groups}"}, rev)], backdate=True)
            done = tail.wait_rev(name, rev, wide, 60)
            if done is None:
                log(f"edit {name} {rev}: not in all {wide} members within 60 s")
                continue
            lat.append(done - t)
            time.sleep(0.2)
        result["edit"] = summary_ms(lat) | {"members": wide}
        log(f"edit: {result['edit']}")

        # 4. Settled.
        time.sleep(a.quiet_s)
        plan0 = mer.metric("meridian_propagation_plan_seconds")
        sim.reset()
        time.sleep(a.settle_s)
        s = sim.stats()
        plan1 = mer.metric("meridian_propagation_plan_seconds")
        passes = plan1.get("count", 0) - plan0.get("count", 0)
        result["settled"] = {
            "seconds": a.settle_s,
            "requests_per_s": round(s["requests"] / a.settle_s, 1),
            "by_verb_per_s": {k: round(v / a.settle_s, 2) for k, v in s["byVerb"].items()},
            "by_verb_resource": s["byVerbResource"],
            "writes": s["writes"], "open_watches": s["watches"],
            "plan_passes": passes,
            "plan_ms_mean": round((plan1.get("sum", 0) - plan0.get("sum", 0)) / passes * 1000, 3) if passes else None,
            "plan_ms_mean_whole_run": round(plan1["sum"] / plan1["count"] * 1000, 3) if plan1.get("count") else None,
            "meridian": proc_figures(mer.proc.pid), "kubesim": sim.figures(),
        }
        log(f"settled: {result['settled']}")

        # 5. Full resync (simulated members only).
        sim.reset()
        t = time.time()
        if sim.expire_all():
            q = quiet_after(sim, t, ("list",), a.quiet_s, 300)
            result["full_resync"] = {"seconds_to_last_list": q["seconds"], "settled": q["settled"],
                                     "by_verb_resource": q["totals"]["byVerbResource"],
                                     "writes": q["totals"]["writes"], "lists": q["totals"]["byVerb"].get("list", 0),
                                     "watches_after": q["totals"]["watches"]}
            log(f"full resync: {result['full_resync']}")

        # 6. Restart.
        mer.stop()
        sim.reset()
        t = mer.start()
        q = quiet_after(sim, t, ("list", "create", "update", "patch", "apply", "delete"), a.quiet_s, 600)
        result["restart"] = {"seconds_to_last_list_or_write": q["seconds"], "settled": q["settled"],
                             "writes": q["totals"]["writes"], "lists": q["totals"]["byVerb"].get("list", 0),
                             "by_verb": q["totals"]["byVerb"], "by_verb_resource": q["totals"]["byVerbResource"],
                             "meridian": proc_figures(mer.proc.pid), "kubesim": sim.figures()}
        log(f"restart: {result['restart']}")
    finally:
        mer.stop()
        sim.stop()
    result["write_errors"] = tail.errors[:10]
    text = (work / "meridian.log").read_text(errors="replace").splitlines()
    counts = {"ERROR": 0, "WARN": 0}
    first = []
    for line in text:
        for level in counts:
            if f" {level} " in line or f'"level":"{level}"' in line:
                counts[level] += 1
                if len(first) < 15:
                    first.append(line[:400])
    result["meridian_log"] = {"counts": counts, "first": first, "lines": len(text)}
    result["seconds"] = round(time.time() - started, 1)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
