"""ClusterSchedulingPolicy end to end, seen by two real clients side by side: `dig` (a DNS
client in eu-1: its source address is in eu-1's dnsClientCIDRs) and gRPC's own xDS client
(grpcio, xds_client.py, a node of eu-1) calling xds:///greeter.demo.global:50051.

At every step of every scenario, the clusters of the A records dig gets for
greeter.demo.global and the clusters of the greeter servers the gRPC client actually reached
over a short window must be the same clusters (and the servers the client reached must be
among the addresses dig got): DNS and xDS are two views of one scheduling decision.

The fleet is the xDS test fleet (xds_fleet.py: the quickstart plus ap-1 and demo/greeter with
real gRPC servers in eu-1, eu-2, us-1 and ap-1) with one change: us-1 is moved from network n2
onto n1 (and loses its east-west gateway), so all four clusters share one network. A proxyless
gRPC client has no east-west gateway: it is never sent to, and could never reach, a cluster
on another network, whereas DNS answers such a cluster with its gateway's address. With us-1
on n2 the two clients would legitimately differ whenever us-1 is in the first tier, which is
exactly what "prefer EU, fall back to US/AP" needs; on one network they must agree exactly.

Each test writes its policies into the hub directory (atomically, by rename, as Fleet.write
does) and waits for the change with meridian.wait_for. Switch times are printed as
"MEASURED:".
"""

import json
import re
import subprocess
import time

import pytest

import xds_fleet
from conftest import BIN, require_tool, wait_xds_listening
from xds_client import XdsClient
from xds_fleet import PORT, SERVERS

NAME = "greeter.demo.global"
TARGET = xds_fleet.target("greeter")
FROM = {"eu-1": "127.0.1.1", "eu-2": "127.0.2.1", "us-1": "127.0.3.1", "ap-1": "127.0.4.1"}
# Every cluster on one network (see the module docstring).
NETWORK = "n1"
# greeter's server address -> its cluster
CLUSTER_OF = {ip: cluster for cluster, ips in SERVERS["greeter"].items() for ip in ips}
# The quickstart's payments (DNS only: it has no gRPC servers).
PAYMENTS = "payments.shop.global"
PAYMENTS_EU1 = ["127.1.1.1", "127.1.1.2"]
PAYMENTS_EU2 = ["127.1.2.1", "127.1.2.2"]

FIRST_CALL_TIMEOUT = 30  # seconds from a client's start to its first calls answered
SWITCH_TIMEOUT = 10  # seconds from an edit on disk to both clients following it
WINDOW = 1.5  # seconds over which the two clients are compared


# ---------------------------------------------------------------------------------------
# The fleet, meridian and the two clients.


US1_N2 = "  network: {name: n2, dnsClientCIDRs: [127.0.3.0/24]}\n  gateway: {address: 127.0.3.100, port: 15443}\n"
US1_N1 = "  network: {name: n1, dnsClientCIDRs: [127.0.3.0/24]}\n"


@pytest.fixture
def policy_fleet(grpc_fleet):
    """The xDS test fleet with us-1 moved onto network n1 (see the module docstring)."""
    text = (grpc_fleet.hub / "members.yaml").read_text()
    assert US1_N2 in text, "the quickstart's us-1 network changed; update US1_N2"
    grpc_fleet.write("hub/members.yaml", text.replace(US1_N2, US1_N1))
    return grpc_fleet


class Pair:
    """dig and a gRPC xDS client, both in one cluster, against one meridian."""

    def __init__(self, m, client, cluster):
        self.m = m
        self.client = client
        self.cluster = cluster
        self.source = FROM[cluster]
        self.measured = []

    # DNS (dig) --------------------------------------------------------------------------

    def dig(self, name=NAME):
        """[(address, ttl)] of the A records dig gets for `name`, asked from this cluster."""
        exe = require_tool("dig")
        cmd = [exe, "-p", str(self.m.dns_port), "@127.0.0.1", "-b", self.source, name, "A",
               "+norecurse", "+noall", "+answer", "+time=2", "+tries=1"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}"
        out = []
        for line in p.stdout.splitlines():
            fields = line.split()
            if len(fields) == 5 and fields[3] == "A":
                out.append((fields[4], int(fields[1])))
        return sorted(out)

    def dns_addresses(self, name=NAME):
        return sorted(a for a, _ in self.dig(name))

    def dns_clusters(self):
        return frozenset(CLUSTER_OF.get(a, f"?{a}") for a in self.dns_addresses())

    # gRPC -------------------------------------------------------------------------------

    @staticmethod
    def grpc_clusters(calls):
        return frozenset(c["server"].split()[0] for c in calls if c["ok"])

    # Both -------------------------------------------------------------------------------

    def diagnosis(self, calls=None):
        return (f"\n--- meridian resolve ---\n{resolve(self.m, self.cluster)}"
                f"\n--- gRPC client ---\n{self.client.describe(calls)}"
                f"\n--- meridian log (scheduling lines) ---\n{meridian_log(self.m)}")

    def converge(self, expected, since, what):
        """Waits until dig answers exactly the clusters `expected` and the gRPC client's calls
        (made at or after `since`) go to those clusters' servers that dig answers, and only
        there; returns (DNS switch, gRPC switch) in seconds after `since`. The gRPC switch is
        the first of the last 8+ calls all answered as expected: when the new clusters are a
        subset of the old ones and no call after the edit happened to reach a dropped one, it
        is the first call after the edit."""
        expected = frozenset(expected)
        self.m.wait_for(lambda: self.dns_clusters() == expected, timeout=SWITCH_TIMEOUT,
                        what=f"{what}: dig answering {sorted(expected)}")
        dns_at = time.time() - since
        servers = {f"{CLUSTER_OF[a]} {a}:{PORT}" for a in self.dns_addresses() if a in CLUSTER_OF}
        grpc_at = self.client.wait_serving(servers, since=since, timeout=SWITCH_TIMEOUT, settle=8) - since
        self.measured.append(f"{what}: DNS {dns_at:.2f}s, gRPC {grpc_at:.2f}s")
        return dns_at, grpc_at

    def same_clusters(self, expected, what):
        """Over WINDOW seconds: dig (sampled) and the gRPC client's calls reach the same
        clusters, which are `expected`; no call fails; every server called is among the
        addresses dig returns."""
        expected = frozenset(expected)
        start = time.time()
        samples = []
        while time.time() < start + WINDOW:
            samples.append(self.dns_addresses())
            time.sleep(0.15)
        end = time.time()
        calls = [c for c in self.client.calls(since=start) if c["t"] < end]
        dns_addresses = set().union(*map(set, samples))
        dns = frozenset(CLUSTER_OF.get(a, f"?{a}") for a in dns_addresses)
        grpc = self.grpc_clusters(calls)
        detail = f"{what}: dig samples {samples}\n{self.diagnosis(calls)}"
        assert calls, f"{what}: no gRPC calls over {WINDOW}s\n{detail}"
        assert len({tuple(s) for s in samples}) == 1, f"{what}: dig's answer changed within the window\n{detail}"
        assert dns == grpc, (
            f"{what}: dig answers clusters {sorted(dns)} but the gRPC client reached {sorted(grpc)} "
            f"(expected {sorted(expected)})\n{detail}"
        )
        assert dns == expected, f"{what}: both clients on {sorted(dns)}, expected {sorted(expected)}\n{detail}"
        failed = [c for c in calls if not c["ok"]]
        assert not failed, f"{what}: {len(failed)} of {len(calls)} gRPC calls failed: {failed[:3]}\n{detail}"
        called = {c["server"].split()[1].rsplit(":", 1)[0] for c in calls if c["ok"]}
        assert called <= dns_addresses, (
            f"{what}: the gRPC client called {sorted(called - dns_addresses)}, which dig does not answer\n{detail}"
        )

    def step(self, what, edit, expected):
        """An edit on disk, then both clients on `expected`, compared over a window."""
        edited = time.time()
        edit()
        self.converge(expected, edited, what)
        self.same_clusters(expected, f"after '{what}'")

    def report(self, test):
        print(f"\nMEASURED: {test}, edit on disk to the switch: " + "; ".join(self.measured))


@pytest.fixture
def pair(policy_fleet, greeter_servers, start_meridian, xds_clients, tmp_path):
    """start(cluster="eu-1", prepare=None) starts meridian on policy_fleet (after
    prepare(fleet), e.g. short health timings or a first policy) and a Pair in `cluster`."""

    def start(cluster="eu-1", prepare=None):
        if prepare:
            prepare(policy_fleet)
        m = start_meridian(policy_fleet)
        wait_xds_listening(m)
        started = time.time()
        client = xds_clients(XdsClient.python(tmp_path, f"{cluster}-policy", m.xds_port, [TARGET], cluster, NETWORK))
        p = Pair(m, client, cluster)
        p.started = started
        client.wait_for(lambda calls: [c for c in calls if c["ok"]], timeout=FIRST_CALL_TIMEOUT,
                        what="a first answered call")
        return p

    return start


# ---------------------------------------------------------------------------------------
# Manifests and inspection.


def policy_yaml(name, spec, created="2026-01-01T00:00:00Z", namespace="demo"):
    """A ClusterSchedulingPolicy; `spec` is the YAML under spec:, indented by two."""
    return (
        "apiVersion: meridian.io/v1alpha1\nkind: ClusterSchedulingPolicy\n"
        f"metadata: {{name: {name}, namespace: {namespace}, creationTimestamp: \"{created}\"}}\n"
        "spec:\n" + spec
    )


SELECT_GREETER = "  resourceSelectors: [{kind: Service, name: greeter}]\n"


def write_policy(fleet, file, name, spec, **kw):
    fleet.write(f"hub/{file}", policy_yaml(name, SELECT_GREETER + spec, **kw))


def set_slice(fleet, cluster, not_ready=(), addresses=None):
    """greeter's EndpointSlice in `cluster`: every server ready except `not_ready`."""
    text = xds_fleet.slice_yaml(cluster, addresses=addresses)
    for ip in not_ready:
        old = f'["{ip}"], conditions: {{ready: true}}'
        assert old in text, (ip, text)
        text = text.replace(old, f'["{ip}"], conditions: {{ready: false, serving: false, terminating: false}}')
    fleet.write(f"clusters/{cluster}/greeter-slice.yaml", text)


def set_taints(fleet, cluster, taints):
    """Rewrites members.yaml with `taints` ("{key: k, effect: E}" strings) on `cluster`."""
    text = (fleet.hub / "members.yaml").read_text()
    text = re.sub(r"  taints: \[.*\]\n(?=  source: \{directory: \{path: \.\./clusters/" + re.escape(cluster) + r"\}\})", "", text)
    anchor = f"  source: {{directory: {{path: ../clusters/{cluster}}}}}\n"
    assert anchor in text
    if taints:
        text = text.replace(anchor, f"  taints: [{', '.join(taints)}]\n" + anchor)
    fleet.write("hub/members.yaml", text)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def meridian_log(m, lines=20):
    """The last lines of meridian's log, without the HTTP/2 frame chatter."""
    text = ANSI.sub("", m.log.read_text())
    return "\n".join([line for line in text.splitlines() if "h2::" not in line and "Connection{" not in line][-lines:])


def problems(m):
    status, body = m.http("/debug/problems")
    assert status == 200, body
    return json.loads(body)["problems"]


def clusters(m):
    status, body = m.http("/debug/clusters")
    assert status == 200, body
    return {c["name"]: c for c in json.loads(body)["clusters"]}


def validate(fleet):
    p = subprocess.run([str(BIN), "validate", "--config", str(fleet.config)], capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


def resolve(m, cluster, name=NAME):
    """The text of `meridian resolve NAME --from-cluster CLUSTER --admin ...`."""
    p = subprocess.run(
        [str(BIN), "resolve", name, "--from-cluster", cluster, "--admin", f"127.0.0.1:{m.admin_port}"],
        capture_output=True, text=True, timeout=20,
    )
    return p.stdout + p.stderr + ("" if p.returncode == 0 else f"(exit {p.returncode})")


def decision(text):
    """(tiers, filtered) from resolve's text: tiers = [(reasons, {cluster: (weight, ready)})],
    filtered = {cluster: reason}."""
    tiers, filtered = [], {}
    for line in text.splitlines():
        if m := re.match(r"  priority (\d+) \((.*); (\d+) ready\):$", line):
            assert int(m[1]) == len(tiers), text
            tiers.append((m[2], {}))
        elif m := re.match(r"    (\S+)\s+weight (\d+) ready (\d+)$", line):
            tiers[-1][1][m[1]] = (int(m[2]), int(m[3]))
        elif m := re.match(r"  filtered (\S+)\s+(.+)$", line):
            filtered[m[1]] = m[2].strip()
    return tiers, filtered


# ---------------------------------------------------------------------------------------
# 1. Locality (the default): local first.


def test_local_first(pair):
    """No policy, then a policy that leaves the mode at its default (Locality) and only sets
    the DNS TTL: an eu-1 client gets eu-1 alone, in DNS and in gRPC."""
    p = pair("eu-1")
    fleet = p.m.fleet
    p.converge({"eu-1"}, p.started, "start, no policy")
    p.same_clusters({"eu-1"}, "no policy")
    assert {ttl for _, ttl in p.dig()} == {5}, p.dig()

    edited = time.time()
    write_policy(fleet, "greeter-local.yaml", "greeter-local", "  traffic: {dns: {ttl: 7}}\n")
    p.m.wait_for(lambda: {ttl for _, ttl in p.dig()} == {7}, what="the policy's TTL 7 in dig's answer")
    p.converge({"eu-1"}, edited, "Locality policy")
    p.same_clusters({"eu-1"}, "a Locality policy")
    tiers, filtered = decision(resolve(p.m, "eu-1"))
    assert [(r, sorted(c)) for r, c in tiers] == [
        ("ClientCluster", ["eu-1"]), ("SameRegion", ["eu-2"]), ("Remote", ["ap-1", "us-1"]),
    ], resolve(p.m, "eu-1")
    assert filtered == {}
    assert not problems(p.m)


# ---------------------------------------------------------------------------------------
# 2. Tiers: prefer EU, fall back to US/AP.

TIERS_EU_THEN_REST = (
    "  placement:\n"
    "    clusterAffinities:\n"
    "      - {name: eu, labelSelector: {matchLabels: {topology.kubernetes.io/region: eu}}}\n"
    "      - {name: fallback, labelSelector: {matchExpressions: [{key: topology.kubernetes.io/region, operator: In, values: [us, ap]}]}}\n"
    "  traffic: {mode: Tiers, minHealthyEndpoints: 3}\n"
)


def test_tiers_prefer_eu_fall_back_to_us_and_ap(pair):
    """mode Tiers, clusterAffinities [eu (eu-1, eu-2), fallback (us-1, ap-1)],
    minHealthyEndpoints 3. The EU tier has 3 ready endpoints (eu-1: 2, eu-2: 1), so an eu-1
    client is sent to eu-1 and eu-2 (one tier: no locality inside a policy's tier). Below 3,
    the EU tier merges into the fallback tier (what remains of EU plus us-1 and ap-1); with
    no ready EU endpoint, the fallback tier alone. Back to 3: EU again."""
    p = pair("eu-1", prepare=lambda f: write_policy(f, "greeter-tiers.yaml", "greeter-eu-first", TIERS_EU_THEN_REST))
    fleet = p.m.fleet
    EU, REST = {"eu-1", "eu-2"}, {"us-1", "ap-1"}
    p.converge(EU, p.started, "start")
    p.same_clusters(EU, "EU tier with 3 ready endpoints")

    p.step("eu-1's 127.1.1.22 not ready (EU: 2 ready < 3)",
           lambda: set_slice(fleet, "eu-1", not_ready=["127.1.1.22"]), EU | REST)
    assert "127.1.1.22" not in p.dns_addresses()
    p.step("eu-2 not ready too (EU: 1 ready)", lambda: set_slice(fleet, "eu-2", not_ready=["127.1.2.21"]), {"eu-1"} | REST)
    p.step("eu-1 not ready at all (EU: 0 ready)", lambda: set_slice(fleet, "eu-1", not_ready=["127.1.1.21", "127.1.1.22"]), REST)

    text = resolve(p.m, "eu-1")
    tiers, filtered = decision(text)
    assert [(r, sorted(c)) for r, c in tiers] == [('{"Affinity":"fallback"}', ["ap-1", "us-1"])], text
    assert filtered == {"eu-1": "NoReadyEndpoints", "eu-2": "NoReadyEndpoints"}, text

    # They come back: EU has 3 ready endpoints again.
    def restore():
        set_slice(fleet, "eu-2")
        set_slice(fleet, "eu-1")

    p.step("eu-1 and eu-2 ready again", restore, EU)
    text = resolve(p.m, "eu-1")
    tiers, filtered = decision(text)
    assert [(r, c) for r, c in tiers] == [
        ('{"Affinity":"eu"}', {"eu-1": (2, 2), "eu-2": (1, 1)}),
        ('{"Affinity":"fallback"}', {"ap-1": (1, 1), "us-1": (1, 1)}),
    ], text
    assert filtered == {}, text
    p.report("Tiers")


# ---------------------------------------------------------------------------------------
# 3. NoExecute taint and toleration.


def test_noexecute_taint_drains_and_a_toleration_brings_back(pair):
    """A NoExecute taint on eu-1 (MemberCluster spec.taints) drains it: an eu-1 client moves
    to eu-2 (same region). A policy for greeter tolerating the taint brings eu-1 back for
    greeter, and for greeter alone (payments, which no policy selects, stays drained)."""
    p = pair("eu-1")
    fleet = p.m.fleet
    p.converge({"eu-1"}, p.started, "start")
    p.same_clusters({"eu-1"}, "untainted")

    p.step("eu-1 tainted maintenance:NoExecute",
           lambda: set_taints(fleet, "eu-1", ["{key: maintenance, effect: NoExecute}"]), {"eu-2"})
    assert p.dns_addresses(PAYMENTS) == PAYMENTS_EU2
    text = resolve(p.m, "eu-1")
    tiers, filtered = decision(text)
    assert "NoExecuteTaint" in filtered.get("eu-1", "") and "maintenance" in filtered["eu-1"], text
    assert [sorted(c) for _, c in tiers][0] == ["eu-2"], text

    p.step("a policy tolerating maintenance:NoExecute",
           lambda: write_policy(fleet, "greeter-tolerate.yaml", "greeter-tolerate",
                                "  placement: {tolerations: [{key: maintenance, effect: NoExecute}]}\n"),
           {"eu-1"})
    assert p.dns_addresses(PAYMENTS) == PAYMENTS_EU2, "the toleration is greeter's alone"

    p.step("the toleration removed", lambda: (fleet.hub / "greeter-tolerate.yaml").unlink(), {"eu-2"})
    p.step("the taint removed", lambda: set_taints(fleet, "eu-1", []), {"eu-1"})
    assert p.dns_addresses(PAYMENTS) == PAYMENTS_EU1
    p.report("taints")


# ---------------------------------------------------------------------------------------
# 4. Unreachable, withdrawn after the policy's withdraw.afterSeconds.

WITHDRAW = 2  # the policy's withdraw.afterSeconds
MEMBER_WITHDRAW = 60  # the members' own withdrawAfterSeconds, which the policy overrides


def test_unreachable_cluster_withdrawn_after_the_policys_time(pair):
    """eu-1's directory removed: eu-1 becomes Unreachable (heartbeat 1 s, unreachable after
    2 s) and is withdrawn for greeter WITHDRAW s later (the policy's withdraw.afterSeconds,
    overriding the members' 60 s): both clients move to eu-2 then, not before (the servers
    keep running, so the gRPC client still gets answers from eu-1 meanwhile). payments, which
    no policy selects, keeps eu-1 (60 s). The directory back: eu-1 back in both."""

    def prepare(fleet):
        fleet.set_health(heartbeat=1, unreachable=2, withdraw=MEMBER_WITHDRAW)
        write_policy(fleet, "greeter-withdraw.yaml", "greeter-withdraw", f"  traffic: {{withdraw: {{afterSeconds: {WITHDRAW}}}}}\n")

    p = pair("eu-1", prepare=prepare)
    fleet = p.m.fleet
    p.converge({"eu-1"}, p.started, "start")
    p.same_clusters({"eu-1"}, "eu-1 healthy")

    away = fleet.root / "eu-1-away"
    removed = time.time()
    fleet.cluster_dir("eu-1").rename(away)
    p.m.wait_for(lambda: clusters(p.m)["eu-1"]["health"] == "Unreachable", timeout=8, what="eu-1 Unreachable")
    unreachable = time.time()
    dns_at, grpc_at = p.converge({"eu-2"}, unreachable, "eu-1 withdrawn")
    p.measured[-1] += f" after Unreachable ({unreachable - removed:.2f}s after the removal)"
    # Neither moved before the withdraw time, nor much after it.
    before = [c for c in p.client.calls(since=removed) if c["t"] < unreachable + grpc_at]
    assert before and {c["server"].split()[0] for c in before if c["ok"]} == {"eu-1"}, p.diagnosis(before)
    for what, at in (("DNS", dns_at), ("gRPC", grpc_at)):
        assert WITHDRAW - 1.0 <= at <= WITHDRAW + 2.5, (
            f"{what} left eu-1 {at:.2f}s after it became Unreachable; the policy withdraws after {WITHDRAW}s\n{p.diagnosis()}"
        )
    p.same_clusters({"eu-2"}, "eu-1 withdrawn")
    assert p.dns_addresses(PAYMENTS) == PAYMENTS_EU1, "payments follows the members' withdrawAfterSeconds (60 s)"
    assert clusters(p.m)["eu-1"]["withdrawn"] is False, "eu-1 is withdrawn for greeter's policy only"

    p.step("eu-1's directory back", lambda: away.rename(fleet.cluster_dir("eu-1")), {"eu-1"})
    assert clusters(p.m)["eu-1"]["health"] == "Healthy"
    p.report("withdraw")


# ---------------------------------------------------------------------------------------
# 5. Failback.

FAILBACK = 4  # the policy's failbackAfterSeconds


def test_failback_waits_failback_after_seconds(pair):
    """failbackAfterSeconds 4: eu-1 loses its ready endpoints (both clients move to eu-2);
    when they are ready again, eu-1 sits in the FailingBack tier and both clients stay on
    eu-2 for about 4 s, then both return to eu-1."""
    p = pair("eu-1", prepare=lambda f: write_policy(f, "greeter-failback.yaml", "greeter-failback",
                                                    f"  traffic: {{failbackAfterSeconds: {FAILBACK}}}\n"))
    fleet = p.m.fleet
    p.converge({"eu-1"}, p.started, "start")
    p.same_clusters({"eu-1"}, "eu-1 ready")
    p.step("eu-1 not ready", lambda: set_slice(fleet, "eu-1", not_ready=SERVERS["greeter"]["eu-1"]), {"eu-2"})

    edited = time.time()
    set_slice(fleet, "eu-1")
    samples = []  # (seconds after the edit, clusters dig answers)
    text = None
    while time.time() < edited + FAILBACK + 6:
        got = p.dns_clusters()
        samples.append((time.time() - edited, got))
        if got == {"eu-1"}:
            break
        if text is None and time.time() > edited + 1.0:
            # Inside the window: eu-1 is in the FailingBack tier, after eu-2 and the rest.
            text = resolve(p.m, "eu-1")
        time.sleep(0.05)
    dns_back = samples[-1][0]
    assert samples[-1][1] == {"eu-1"}, f"dig never returned to eu-1: {samples[-5:]}\n{p.diagnosis()}"
    assert all(got == {"eu-2"} for _, got in samples[:-1]), f"dig answers inside the window: {samples}"
    grpc_back = p.client.wait_serving(
        {f"eu-1 {ip}:{PORT}" for ip in SERVERS["greeter"]["eu-1"]}, since=edited, timeout=FAILBACK + 6, settle=8,
    ) - edited
    inside = [c for c in p.client.calls(since=edited) if c["t"] < edited + grpc_back]
    assert inside and Pair.grpc_clusters(inside) == {"eu-2"} and all(c["ok"] for c in inside), (
        f"gRPC calls inside the failback window went elsewhere than eu-2\n{p.diagnosis(inside)}"
    )
    print(f"\nMEASURED: failbackAfterSeconds {FAILBACK}: eu-1 ready again to DNS back on eu-1 {dns_back:.2f}s, "
          f"gRPC {grpc_back:.2f}s")
    for what, at in (("DNS", dns_back), ("gRPC", grpc_back)):
        assert FAILBACK - 1 <= at <= FAILBACK + 3, (
            f"{what} returned to eu-1 {at:.2f}s after its endpoints were ready again (failbackAfterSeconds {FAILBACK})\n{p.diagnosis()}"
        )
    assert text is not None, f"no resolve inside the window: {samples}"
    tiers, _ = decision(text)
    assert tiers and tiers[-1][0] == "FailingBack" and sorted(tiers[-1][1]) == ["eu-1"], text
    assert sorted(tiers[0][1]) == ["eu-2"], text
    p.same_clusters({"eu-1"}, "after the failback window")
    p.report("failback")


# ---------------------------------------------------------------------------------------
# 6. Invalid policies and conflicts.

AP_FIRST = (
    "  placement:\n"
    "    clusterAffinities:\n"
    "      - {name: ap, clusterNames: [ap-1]}\n"
    "      - {name: eu, labelSelector: {matchLabels: {topology.kubernetes.io/region: eu}}}\n"
    "  traffic: {mode: Tiers}\n"
)
EU2_FIRST = (
    "  placement:\n"
    "    clusterAffinities:\n"
    "      - {name: eu-2, clusterNames: [eu-2]}\n"
    "  traffic: {mode: Tiers}\n"
)


def rejected(m, fleet, file, name, reason):
    """The policy in hub/`file` is on /debug/problems with `reason`, and `meridian validate`
    names file, object and reason and exits non-zero."""
    found = m.wait_for(lambda: [x for x in problems(m) if f"ClusterSchedulingPolicy demo/{name}" in x["object"]],
                       what=f"policy {name} on /debug/problems")
    assert len(found) == 1 and found[0]["cluster"] == "hub", found
    assert str(fleet.hub / file) in found[0]["object"], found
    assert reason in found[0]["reason"], found
    status, out = validate(fleet)
    assert status != 0, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out
    assert str(fleet.hub / file) in errors[0] and f"ClusterSchedulingPolicy demo/{name}" in errors[0] and reason in errors[0], out
    return found[0]


def test_invalid_new_policy_is_rejected_and_serving_goes_on(pair):
    """A new policy with a bad value (minHealthyEndpoints 0) would send eu-1 clients to ap-1:
    it is rejected whole, with its reason on /debug/problems and from `meridian validate`,
    and both clients stay on eu-1. Fixed, it applies."""
    p = pair("eu-1")
    fleet = p.m.fleet
    p.converge({"eu-1"}, p.started, "start")
    bad = AP_FIRST.replace("{mode: Tiers}", "{mode: Tiers, minHealthyEndpoints: 0}")
    write_policy(fleet, "greeter-ap.yaml", "greeter-ap", bad)
    found = rejected(p.m, fleet, "greeter-ap.yaml", "greeter-ap", "traffic.minHealthyEndpoints must be at least 1")
    assert "not used" in found["reason"], found
    p.same_clusters({"eu-1"}, "an invalid policy written")
    p.step("the policy fixed", lambda: write_policy(fleet, "greeter-ap.yaml", "greeter-ap", AP_FIRST), {"ap-1"})
    assert not problems(p.m)
    p.report("invalid new policy")


def test_invalid_edit_keeps_the_previous_policy_serving(pair):
    """A policy in force (ap-1 first) is edited with a bad field (a misspelt
    minHealthyEndpoints): the edit is rejected with its reason on /debug/problems and from
    `meridian validate`, and the previous behaviour (ap-1) keeps serving in both clients.

    README says "A policy with an invalid field is not used at all"; this holds that an edit
    which is rejected does not take away the version in force either (falling back to the
    default would move traffic where neither version of the policy sends it)."""
    p = pair("eu-1", prepare=lambda f: write_policy(f, "greeter-ap.yaml", "greeter-ap", AP_FIRST))
    fleet = p.m.fleet
    p.converge({"ap-1"}, p.started, "start")
    p.same_clusters({"ap-1"}, "ap-1 first")
    bad = AP_FIRST.replace("{mode: Tiers}", "{mode: Tiers, minHealthyEndpoint: 2}")
    write_policy(fleet, "greeter-ap.yaml", "greeter-ap", bad)
    rejected(p.m, fleet, "greeter-ap.yaml", "greeter-ap", "unknown field(s): spec.traffic.minHealthyEndpoint")
    time.sleep(0.5)  # past the xDS debounce: a push, had there been one, has reached the client
    p.same_clusters({"ap-1"}, "a bad edit of the policy in force")


def test_two_policies_the_older_wins(pair):
    """Two policies select greeter. The younger (eu-2 first) is in force alone, then the
    older (ap-1 first) arrives: it wins, whatever the file names, and the younger is reported
    as Conflict on /debug/problems and by `meridian validate`. Made the older, the other wins."""
    p = pair("eu-1")
    fleet = p.m.fleet
    p.converge({"eu-1"}, p.started, "start")
    p.step("the young policy (eu-2 first)",
           lambda: write_policy(fleet, "a-young.yaml", "young", EU2_FIRST, created="2026-02-01T00:00:00Z"), {"eu-2"})
    p.step("an older policy (ap-1 first)",
           lambda: write_policy(fleet, "z-old.yaml", "old", AP_FIRST, created="2026-01-01T00:00:00Z"), {"ap-1"})
    found = p.m.wait_for(lambda: problems(p.m), what="the Conflict on /debug/problems")
    assert len(found) == 1 and "ClusterSchedulingPolicy demo/young" in found[0]["object"], found
    assert found[0]["reason"].startswith("Conflict"), found
    assert "demo/greeter" in found[0]["reason"] and "demo/old" in found[0]["reason"], found
    status, out = validate(fleet)
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert status != 0 and len(errors) == 1, out
    assert "ClusterSchedulingPolicy demo/young" in errors[0] and "Conflict" in errors[0] and "demo/old" in errors[0], out

    p.step("the young policy made older than the other",
           lambda: write_policy(fleet, "a-young.yaml", "young", EU2_FIRST, created="2025-12-01T00:00:00Z"), {"eu-2"})
    found = p.m.wait_for(lambda: [x for x in problems(p.m) if "demo/old" in x["object"]], what="old reported as Conflict")
    assert len(problems(p.m)) == 1 and found[0]["reason"].startswith("Conflict") and "demo/young" in found[0]["reason"], found
    p.step("the winner removed", lambda: (fleet.hub / "a-young.yaml").unlink(), {"ap-1"})
    p.m.wait_for(lambda: not problems(p.m), what="no problems left")
    p.report("conflict")
