"""Pull-mode agents (bench/agent.sh runs it): an endpoint change in an agent member → new DNS
answer, beside the same change in a push member; and a storm of agents joining, then
reconnecting after a hub restart.

    python3 bench/agent.py WORK [--changes 100] [--gap-ms 20] [--agents 1000] [--objects 300]
                                [--parts change,storm,replicas]

Needs MERIDIAN_BIN (meridian-agent-swarm is taken from beside it), KUBE_APISERVER_BIN, ETCD_BIN.

1. Change → answer. A Kubernetes hub with m1 (push: the hub's kubeconfig) and m2 (an agent
   member: `meridian agent` runs as ServiceAccount meridian-system/meridian-agent of
   deploy/rbac/agent.yaml in m2; the hub holds no credential for m2). Both export shop/payments,
   one endpoint each. Changes alternate between m1 and m2, one at a time: a merge PATCH of
   that member's EndpointSlice (as admin, kept-alive HTTPS) replacing its endpoint by a new
   address. The clock starts just before the PATCH and stops, separately, when
     - a raw watch on that member's EndpointSlices receives the event (the API server's own
       delivery: the floor both paths share);
     - a DNS client polling payments.shop.global every ~1 ms gets the new address.
   The agent path adds its watch → gRPC stream → the hub's member task; the push path is the
   hub's own watch.
2. Storm. A directory hub with AGENTS agent members (`agent.admissionPerSecond` 50) and
   meridian-agent-swarm: AGENTS real agent member sides in one process, all reading m2
   (tests/e2e/swarm-rbac.yaml: read-only; m2 exports nothing then). Measured: swarm start → every agent connected
   (joins are one at a time on the hub: signing, the token store); the hub stopped and started
   again → every agent reconnected without joining again, how many streams waited for the
   admission rate, and the floor that rate sets ((AGENTS − 50) / 50 s).
3. Replicas. m2 holds OBJECTS exported services (a Service, an EndpointSlice and a
   ServiceExport each); one `meridian agent` for m2 streams to N hub replicas (N = 1, then 3:
   `--hub` names each, as a headless Service's name resolves to every replica). Once every
   replica answers for m2's last service: the WATCH requests m2's API server holds for the
   agent (apiserver_longrunning_requests, less the settled count before the agent started)
   and the agent's RSS.

Prints one JSON object with every figure on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from benchstats import log, summary  # noqa: E402
from conftest import Meridian, free_port, stop_process  # noqa: E402
from kube import Dns, DnsPoller, Seen, Watcher, metrics  # noqa: E402  (bench/kube.py)
from kube_fleet import DISCOVERY, HUB_NAMESPACE, NAMESPACE, KubeFleet, Member, wait_for  # noqa: E402

BIN = Path(os.environ["MERIDIAN_BIN"])
SWARM_BIN = BIN.parent / "meridian-agent-swarm"
NAME = "payments.shop.global"
PORT = [{"name": "http", "port": 80, "protocol": "TCP"}]
TARGET = [{"name": "http", "port": 8080, "protocol": "TCP"}]
AGENT_RBAC = ROOT / "deploy" / "rbac" / "agent.yaml"
SWARM_RBAC = ROOT / "tests" / "e2e" / "swarm-rbac.yaml"
ADMISSION_PER_SECOND = 50


def address(member: str, i: int) -> str:
    return f"10.{1 if member == 'm1' else 2}.{i // 250}.{i % 250 + 1}"


def token(config: Path, cluster: str) -> str:
    out = subprocess.run([str(BIN), "token", "create", "--config", str(config), "--cluster", cluster],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"meridian token create --cluster {cluster}: {out.stderr}")
    return out.stdout.strip()


def start_agent(fleet: KubeFleet, hub: int | str, work: Path, state: str = "m2-state") -> subprocess.Popen:
    """`meridian agent` for m2 (`hub`: a port on 127.0.0.1, or `--hub` as is), joined with a
    fresh token."""
    hub = hub if isinstance(hub, str) else f"127.0.0.1:{hub}"
    kubeconfig = fleet.service_account_kubeconfig("m2", AGENT_RBAC, "meridian-agent", work / "m2-agent.kubeconfig")
    secret = fleet.hub.get("v1", "Secret", "meridian-agent-ca", HUB_NAMESPACE)
    ca = work / "agent-ca.crt"
    ca.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    (work / "m2.token").write_text(token(fleet.root / "meridian.yaml", "m2"))
    return subprocess.Popen(
        [str(BIN), "agent", "--hub", hub, "--cluster", "m2", "--state-dir", str(work / state),
         "--kubeconfig", str(kubeconfig), "--hub-ca-file", str(ca), "--bootstrap-token-file", str(work / "m2.token"),
         "--admin-listen", f"127.0.0.1:{free_port()}"],
        stdout=open(work / f"agent-m2-{state}.log", "w"), stderr=subprocess.STDOUT,
        env={**os.environ, "MERIDIAN_LOG": os.environ.get("MERIDIAN_LOG", "info")})


def change_to_answer(fleet: KubeFleet, m, changes: int, gap_ms: int) -> dict:
    for member in ("m1", "m2"):
        c = fleet.cluster(member)
        fleet.service(c, "payments", PORT)
        fleet.endpoint_slice(c, "payments", [address(member, 0)], ports=TARGET, name=f"payments-{member}")
        fleet.export(c, "payments")
    probe = Dns(m.dns_port, NAME)
    wait_for(lambda: (r := probe.query()) and r[1] == 2, timeout=60, what="payments answered by m1 and m2", log=m)

    watch_seen, dns_seen = Seen(), Seen()
    watchers = [Watcher(fleet.cluster(member), NAMESPACE, "payments", watch_seen) for member in ("m1", "m2")]
    for w in watchers:
        w.start()
        w.ready.wait(10)
        if w.error:
            raise w.error
    poller = DnsPoller(m.dns_port, dns_seen)
    poller.start()
    conns = {}
    for member in ("m1", "m2"):
        c = fleet.cluster(member)
        conns[member] = (c, http.client.HTTPSConnection(
            "127.0.0.1", c.apiserver_port, context=ssl.create_default_context(cafile=str(c.ca_file)), timeout=30))
    rows = {"m1": [], "m2": []}
    log(f"{changes} EndpointSlice updates, alternating m1 (push) and m2 (agent), {gap_ms} ms apart")
    for i in range(1, changes + 1):
        member = "m1" if i % 2 else "m2"
        c, conn = conns[member]
        addr = address(member, i)
        path = f"/apis/{DISCOVERY}/namespaces/{NAMESPACE}/endpointslices/payments-{member}"
        headers = {"Authorization": f"Bearer {c.admin_token}", "Content-Type": "application/merge-patch+json"}
        body = json.dumps({"endpoints": [{"addresses": [addr], "conditions": {"ready": True}}]})
        poller.look_for(addr)
        t0 = time.monotonic()
        conn.request("PATCH", path, body, headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"PATCH {path}: {resp.status}")
        for seen, what in ((watch_seen, "watch event"), (dns_seen, "DNS answer")):
            if not seen.wait(addr, 15):
                raise RuntimeError(f"change {i} in {member}: no {what} with {addr} after 15 s\n{m.log_tail()}")
        rows[member].append({"watch": (watch_seen.at[addr] - t0) * 1000, "dns": (dns_seen.at[addr] - t0) * 1000})
        time.sleep(gap_ms / 1000)
        if i % 50 == 0:
            log(f"  {i} changes")
    for _, conn in conns.values():
        conn.close()

    def figures(member):
        r = rows[member]
        return {
            "changes": len(r),
            "watch_delivery_ms": summary([x["watch"] for x in r]),
            "dns_ms": summary([x["dns"] for x in r]),
            "dns_beyond_watch_ms": summary([x["dns"] - x["watch"] for x in r]),
        }

    push, agent = figures("m1"), figures("m2")
    ratio = {f"{k}_{q}": round(agent[k][q] / push[k][q], 2)
             for k in ("dns_ms", "dns_beyond_watch_ms") for q in ("p50", "p99") if push[k][q] > 0}
    return {"gap_ms": gap_ms, "push": push, "agent": agent, "agent_over_push": ratio}


def storm(fleet: KubeFleet, work: Path, agents: int) -> dict:
    names = [f"swarm-{i:04d}" for i in range(agents)]
    hub_dir = work / "storm-hub"
    hub_dir.mkdir()
    (hub_dir / "swarm.yaml").write_text("".join(
        f"---\napiVersion: meridian.io/v1alpha1\nkind: MemberCluster\nmetadata: {{name: {n}}}\n"
        f"spec: {{source: {{agent: {{}}}}, network: {{name: {n}}}}}\n" for n in names))
    state, port = work / "storm-hub-state", free_port()
    config = work / "storm.yaml"
    config.write_text(yaml.safe_dump({
        "hub": {"directory": str(hub_dir)},
        "agent": {"listen": f"127.0.0.1:{port}", "stateDir": str(state), "admissionPerSecond": ADMISSION_PER_SECOND},
        "dns": {"zones": [{"name": "global", "style": "global"}], "ttl": 5},
    }))
    env = {"MERIDIAN_LOG": "warn"}
    m = Meridian(None, (), env, config=config, log=work / "storm-hub.log", ready_timeout=60)
    tokens = work / "storm-tokens"
    tokens.mkdir()
    log(f"{agents} bootstrap tokens (meridian token create)")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for n, t in zip(names, pool.map(lambda n: token(config, n), names)):
            (tokens / f"{n}.token").write_text(t)
    kubeconfig = fleet.service_account_kubeconfig("m2", SWARM_RBAC, "meridian-swarm", work / "swarm.kubeconfig")
    swarm = None

    def streams(hub) -> float:
        return metrics(hub).get("meridian_agent_streams", 0)

    def until_all(hub, t0, what) -> float:
        deadline = t0 + 600
        while streams(hub) < agents:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {streams(hub)} of {agents} after 600 s")
            if swarm.poll() is not None:
                raise RuntimeError(f"meridian-agent-swarm exited: {(work / 'swarm.log').read_text()[-2000:]}")
            time.sleep(0.1)
        return time.monotonic() - t0

    try:
        log(f"meridian-agent-swarm: {agents} agents joining at once")
        t0 = time.monotonic()
        swarm = subprocess.Popen(
            [str(SWARM_BIN), "--hub", f"127.0.0.1:{port}", "--hub-ca-file", str(state / "ca.crt"),
             "--kubeconfig", str(kubeconfig), "--tokens", str(tokens), "--state-root", str(work / "swarm-state")],
            stdout=subprocess.DEVNULL, stderr=open(work / "swarm.log", "w"))
        joined = until_all(m, t0, "joined and connected")
        first = metrics(m)
        log(f"  every agent connected after {joined:.1f} s; restarting the hub")
        m.stop()
        t1 = time.monotonic()
        m = Meridian(None, (), env, config=config, log=work / "storm-hub-2.log", ready_timeout=60)
        reconnected = until_all(m, t1, "reconnected")
        second = metrics(m)
        log(f"  every agent back after {reconnected:.1f} s")
        return {
            "agents": agents,
            "admission_per_second": ADMISSION_PER_SECOND,
            "joined_and_connected_s": round(joined, 2),
            "joins_admitted": first.get('meridian_agent_joins_total{result="admitted"}', 0),
            "restart_to_all_reconnected_s": round(reconnected, 2),
            "rejoins_after_restart": second.get('meridian_agent_joins_total{result="admitted"}', 0),
            "reconnects_that_waited": second.get("meridian_agent_admission_waits_total", 0),
            "admission_floor_s": round(max(0, agents - ADMISSION_PER_SECOND) / ADMISSION_PER_SECOND, 2),
            "hub_rss_mib": rss_mib(m.proc.pid),
            "swarm_rss_mib": rss_mib(swarm.pid),
        }
    finally:
        if swarm is not None:
            stop_process(swarm)
        m.stop()


# What `meridian agent` watches in its member (controllers/src/kubernetes/member.rs watch_all).
AGENT_WATCHED = ("services", "endpointslices", "serviceexports", "serviceimports", "nodes", "namespaces",
                 "pods", "resourcequotas")


def member_watches(fleet: KubeFleet, member: str) -> dict[str, int]:
    """WATCH requests the member's API server holds open now, by resource (any client)."""
    status, text = fleet.cluster(member).request("GET", "/metrics")
    if status != 200:
        raise RuntimeError(f"{member} /metrics: {status}")
    watches: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            labels, _, value = line.rpartition(" ")
            resource = labels.split('resource="', 1)[1].split('"', 1)[0]
            watches[resource] = watches.get(resource, 0) + int(float(value))
    return watches


def settled_watches(fleet: KubeFleet, member: str) -> dict[str, int]:
    """member_watches once two readings a second apart agree."""
    last = member_watches(fleet, member)
    for _ in range(30):
        time.sleep(1)
        now = member_watches(fleet, member)
        if now == last:
            return now
        last = now
    return last


def replicas(fleet: KubeFleet, work: Path, counts, objects: int) -> dict:
    names = [f"svc-{i:04d}" for i in range(objects)]
    log(f"m2: {objects} exported services (Service, EndpointSlice, ServiceExport each)")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: fleet.publish("m2", names[i], [address("m2", i)]), range(objects)))
    last = f"{names[-1]}.{NAMESPACE}.global"
    rows = []
    for n in counts:
        before = settled_watches(fleet, "m2")
        hubs = []
        for i in range(n):
            port = free_port()
            hubs.append((fleet.start_meridian("meridian" if i == 0 else f"meridian-{i + 1}",
                                              env={"MERIDIAN_LOG": "warn"}, agent={"listen": f"127.0.0.1:{port}"}),
                         port))
        t0 = time.monotonic()
        agent = start_agent(fleet, ",".join(f"127.0.0.1:{p}" for _, p in hubs), work, state=f"m2-state-{n}")
        try:
            for m, _ in hubs:
                wait_for(lambda m=m: m.addresses(last) == [address("m2", objects - 1)], timeout=120,
                         what=f"{last} answered by every replica", log=m)
            ready_s = time.monotonic() - t0
            time.sleep(5)
            now = member_watches(fleet, "m2")
            opened = {r: now.get(r, 0) - before.get(r, 0) for r in AGENT_WATCHED}
            rows.append({"replicas": n, "watches_opened": sum(opened.values()), "by_resource": opened,
                         "agent_rss_mib": rss_mib(agent.pid), "every_replica_answers_s": round(ready_s, 2)})
            log(f"  {n} replica(s): {rows[-1]}")
        finally:
            stop_process(agent)
            fleet.stop_meridians()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: (fleet.unexport("m2", n), fleet.delete_service("m2", n)), names))
    return {"objects": objects, "member_objects": objects * 3, "runs": rows}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--changes", type=int, default=100)
    ap.add_argument("--gap-ms", type=int, default=20)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--objects", type=int, default=300)
    ap.add_argument("--parts", default="change,storm,replicas")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not SWARM_BIN.exists():
        raise SystemExit(f"{SWARM_BIN} is not built (cargo build --release builds it beside meridian)")

    members = (Member("m1", "eu", "eu-a", "127.0.1.0/24"), Member("m2", "us", "us-a", "127.0.2.0/24"))
    started = time.monotonic()
    log("starting hub, m1 and m2 (kube-apiserver + etcd each)")
    fleet = KubeFleet(args.work / "kube", members).start()
    agent = None
    try:
        fleet.grant_agents()
        fleet.register_member("m2", source={"agent": {}})
        result = {"meridian": str(BIN)}
        if "change" in parts:
            hub_port = free_port()
            m = fleet.start_meridian("meridian", env={"MERIDIAN_LOG": os.environ.get("MERIDIAN_LOG", "info")},
                                     agent={"listen": f"127.0.0.1:{hub_port}"})
            agent = start_agent(fleet, hub_port, args.work)
            result["change_to_answer"] = change_to_answer(fleet, m, args.changes, args.gap_ms)
            stop_process(agent)
            fleet.stop_meridians()
            # The storm measures the agents' protocol: m2 exports nothing then. (A service every
            # swarm cluster exported would give each agent a write-back set naming all the others,
            # sent again to every agent on any change: O(agents²) traffic of its own.)
            fleet.delete_service("m2", "payments")
            fleet.unexport("m2", "payments")
        if "replicas" in parts:
            result["replicas"] = replicas(fleet, args.work, (1, 3), args.objects)
        if "storm" in parts:
            result["storm"] = storm(fleet, args.work, args.agents)
        result["seconds"] = round(time.monotonic() - started)
        print(json.dumps(result))
    finally:
        if agent is not None:
            stop_process(agent)
        fleet.stop()


if __name__ == "__main__":
    main()
