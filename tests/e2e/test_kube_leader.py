"""Leader election on real kube-apiservers: two replicas, and the API servers' audit logs as
the witness of who wrote what, when.

The fleet (hub, m1, m3) runs with audit logs, and the two replicas authenticate as different
users everywhere — replica "meridian" as user meridian, replica "meridian-b" as user meridian-b
(kube_fleet's replica_users: the same roles, an exec credential plugin choosing the token by
MERIDIAN_IDENTITY) — so every write in the hub and in every member names its replica.

From the hub's audit log the Lease terms are rebuilt: a successful create/update of the Lease
by a replica makes it leader from that request until renewDeadlineSeconds after the replica
sent its renewal (bounded by when the API server received the replica's GET of the Lease
that preceded it; the replica's own clock starts before that GET). Every other write of a
replica — MemberCluster status on the hub; ServiceImports, derived Services and
EndpointSlices, ServiceExport status in the members — must fall inside one of its terms, and a
replica takes the Lease over only after the previous holder's term ended.
"""

import os
import re
import signal
import threading
import time
from datetime import datetime, timedelta

import dns.flags
import dns.message
import dns.query
import dns.rcode
import pytest

from conftest import FROM_UNKNOWN
from kube_fleet import DEFAULT_MEMBERS, LEASE, WRITE_VERBS, started, wait_for

A, B = "meridian", "meridian-b"  # replica names, which are also their users
LEASE_DURATION, RENEW_DEADLINE = 4, 3  # kube_fleet.config's leaderElection
MEMBERS = tuple(m for m in DEFAULT_MEMBERS if m.name in ("m1", "m3"))  # m3: kubeconfig in a hub Secret
PORT = [{"name": "http", "port": 80, "protocol": "TCP"}]
TARGET = [{"name": "http", "port": 8080, "protocol": "TCP"}]


@pytest.fixture
def audited_fleet(tmp_path):
    with started(tmp_path / "kube", MEMBERS, audit=True, replica_users=[B]) as fleet:
        yield fleet


def imported(fleet, member, service, clusters):
    si = fleet.service_import(member, service)
    got = sorted(c["cluster"] for c in ((si or {}).get("status") or {}).get("clusters") or [])
    return si if si and got == sorted(clusters) else None


def leader_metric(m):
    status, body = m.http("/metrics")
    assert status == 200, body
    match = re.search(r"^meridian_leader(?:\{[^}]*\})? (\S+)$", body, re.M)
    assert match, "no meridian_leader in /metrics"
    return int(float(match.group(1)))


def debug_kubernetes(m):
    import json

    status, body = m.http("/debug/kubernetes")
    assert status == 200, body
    return json.loads(body)


def at(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def received(event) -> datetime:
    return at(event["requestReceivedTimestamp"])


def describe(cluster, e) -> str:
    ref = e.get("objectRef") or {}
    what = "/".join(x for x in (ref.get("resource"), ref.get("namespace"), ref.get("name"), ref.get("subresource")) if x)
    return (f"{cluster}: {e['user']['username']} {e['verb']} {what} -> {(e.get('responseStatus') or {}).get('code')} "
            f"received {e['requestReceivedTimestamp']} completed {e['stageTimestamp']}")


def is_lease(e) -> bool:
    ref = e.get("objectRef") or {}
    return ref.get("resource") == "leases"


def completed(fleet, cluster):
    """The audit events of requests answered (stage ResponseComplete) in one cluster."""
    return [e for e in fleet.audit_events(cluster) if e.get("stage") == "ResponseComplete"]


def replica_writes(fleet):
    """Every write by either replica's user in every cluster, Lease writes excluded, as
    (cluster, event) in the order the API servers received them."""
    out = []
    for c in fleet.clusters:
        for e in completed(fleet, c.name):
            if e["user"]["username"] in (A, B) and e["verb"] in WRITE_VERBS and not is_lease(e):
                out.append((c.name, e))
    return sorted(out, key=lambda ce: received(ce[1]))


def lease_terms(fleet):
    """[(user, start, end, event)] for each successful create/update of the Lease: the user
    leads from `start` (the API server received the write) until `end` (the API server
    received the user's GET before it, plus renewDeadlineSeconds: the replica's deadline
    runs from before that GET)."""
    last_get: dict[str, datetime] = {}
    terms = []
    events = [e for e in completed(fleet, "hub") if is_lease(e) and (e.get("objectRef") or {}).get("name") == LEASE]
    for e in sorted(events, key=received):
        user = e["user"]["username"]
        if e["verb"] == "get":
            last_get[user] = received(e)
        elif e["verb"] in ("create", "update") and (e.get("responseStatus") or {}).get("code") in (200, 201):
            sent = last_get.get(user, received(e))
            terms.append((user, received(e), sent + timedelta(seconds=RENEW_DEADLINE), e))
    return terms


def check_audit(fleet, excused=()):
    """Asserts the election's safety on the audit logs (but for the `excused` write events);
    returns (terms, writes)."""
    terms = lease_terms(fleet)
    excused_ids = {e["auditID"] for e in excused}
    writes = [(c, e) for c, e in replica_writes(fleet) if e["auditID"] not in excused_ids]
    problems = []
    # A takeover only after the previous holder's deadline.
    holder, holder_end = None, None
    for user, start, end, e in terms:
        if holder is not None and user != holder and start < holder_end:
            problems.append(f"{user} took the Lease at {start.isoformat()} before {holder}'s deadline "
                            f"{holder_end.isoformat()}: {describe('hub', e)}")
        if user != holder:
            holder, holder_end = user, end
        else:
            holder_end = max(holder_end, end)
    # Every write inside one of its replica's terms.
    for cluster, e in writes:
        user, t = e["user"]["username"], received(e)
        if not any(u == user and s <= t <= end for u, s, end, _ in terms):
            problems.append("write outside its replica's term: " + describe(cluster, e))
    assert not problems, "\n".join(problems + ["--- lease terms ---"] + [
        f"{u} {s.isoformat()} .. {end.isoformat()}" for u, s, end, _ in terms])
    return terms, writes


class DnsLoad(threading.Thread):
    """Queries `expected` names round-robin at about `rate` per second; every timeout (2 s),
    error rcode or answer other than expected is a failure."""

    def __init__(self, port, expected, rate=400):
        super().__init__(daemon=True)
        self.port, self.expected, self.rate = port, expected, rate
        self.stopping = threading.Event()
        self.ok = 0
        self.failures: list[str] = []

    def run(self):
        names = list(self.expected)
        i = 0
        start = time.monotonic()
        while not self.stopping.is_set():
            name = names[i % len(names)]
            q = dns.message.make_query(name, "A")
            q.flags &= ~dns.flags.RD
            t = time.monotonic()
            try:
                r = dns.query.udp(q, "127.0.0.1", port=self.port, source=FROM_UNKNOWN, timeout=2)
                got = sorted(rr.address for rrset in r.answer for rr in rrset)
                if r.rcode() != dns.rcode.NOERROR or got != self.expected[name]:
                    self.failures.append(f"{time.strftime('%T')} {name}: {dns.rcode.to_text(r.rcode())} {got}")
                else:
                    self.ok += 1
            except Exception as e:  # noqa: BLE001 - a timeout or a bad packet is a failure
                self.failures.append(f"{time.strftime('%T')} {name}: {type(e).__name__} {e} after "
                                     f"{time.monotonic() - t:.2f} s")
            i += 1
            pause = start + i / self.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    def stop(self):
        self.stopping.set()
        self.join(timeout=10)


def test_only_the_leader_writes_and_a_frozen_leader_stops_before_its_lease_is_taken(audited_fleet):
    fleet = audited_fleet
    a = fleet.start_meridian(A)
    wait_for(lambda: fleet.lease_holder() == A and leader_metric(a) == 1, timeout=15, what="A leads", log=a)
    fleet.publish("m1", "payments", ["10.1.0.1", "10.1.0.2"])
    fleet.publish("m3", "payments", ["10.3.0.1"])
    for member in ("m1", "m3"):
        wait_for(lambda member=member: imported(fleet, member, "payments", ["m1", "m3"]), timeout=15,
                 what=f"A imports payments into {member}", log=a)

    b = fleet.start_meridian(B)
    every = ["10.1.0.1", "10.1.0.2", "10.3.0.1"]
    b.wait_for(lambda: b.addresses("payments.shop.global") == every, what="B answers payments")
    time.sleep(2)  # B watches and sees the lease renewed: it must not write
    assert fleet.lease_holder() == A
    assert leader_metric(b) == 0 and leader_metric(a) == 1
    assert debug_kubernetes(b)["identity"] == B and debug_kubernetes(b)["leader"] is False
    assert debug_kubernetes(a)["identity"] == A and debug_kubernetes(a)["leader"] is True
    _, writes = check_audit(fleet)
    assert {e["user"]["username"] for _, e in writes} == {A}, "only A has written so far"
    assert {c for c, _ in writes} >= {"hub", "m1", "m3"}, "A wrote in the hub and in both members"
    b_lease_writes = [e for e in fleet.audit_events("hub") if e["user"]["username"] == B and e["verb"] in WRITE_VERBS]
    assert not b_lease_writes, [describe("hub", e) for e in b_lease_writes]

    # Freeze A for twice the lease duration: B takes over and writes.
    os.kill(a.proc.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        wait_for(lambda: fleet.lease_holder() == B, timeout=15, what="B takes the lease", log=b)
        took_over = time.monotonic() - stopped_at
        fleet.publish("m3", "orders", ["10.3.0.7"])
        wait_for(lambda: imported(fleet, "m1", "orders", ["m3"]), timeout=10, what="B imports orders into m1", log=b)
        wait_for(lambda: any(e["user"]["username"] == B and (e.get("objectRef") or {}).get("resource") == "memberclusters"
                             and e["verb"] == "patch" for e in fleet.audit_events("hub")),
                 timeout=10, what="B writes MemberCluster status", log=b)
        assert leader_metric(b) == 1
        time.sleep(max(0.0, stopped_at + 2 * LEASE_DURATION - time.monotonic()))
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    resumed_at = datetime.now().astimezone()
    print(f"B took the lease {took_over:.1f} s after A was frozen; A resumed after "
          f"{time.monotonic() - stopped_at:.1f} s")

    # A is back: it must see it lost, and write nothing (a change gives it reasons to).
    fleet.endpoint_slice("m3", "orders", ["10.3.0.8"], ports=TARGET)
    wait_for(lambda: [x for s in fleet.managed_slices("m1", service="derived-orders") for e in s["endpoints"]
                      for x in e["addresses"]] == ["10.3.0.8"], timeout=10, what="B updates the derived slice", log=b)
    a.wait_for(lambda: a.addresses("orders.shop.global") == ["10.3.0.8"], what="A serves the change")
    time.sleep(6)  # A's write-back loop ticks every 5 s, its status loop every second
    assert leader_metric(a) == 0, "A thinks it still leads after being frozen past its lease"
    assert leader_metric(b) == 1
    assert debug_kubernetes(a)["leader"] is False
    assert fleet.lease_holder() == B
    terms, writes = check_audit(fleet)
    a_end = max(end for u, _, end, _ in terms if u == A)
    late = [describe(c, e) for c, e in writes if e["user"]["username"] == A and received(e) > a_end]
    assert not late, "A wrote after its renew deadline:\n" + "\n".join(late)
    after_resume = [describe(c, e) for c, e in writes if e["user"]["username"] == A and received(e) >= resumed_at]
    assert not after_resume, "A wrote after it was resumed:\n" + "\n".join(after_resume)
    b_writes = {(c, (e.get("objectRef") or {}).get("resource")) for c, e in writes if e["user"]["username"] == B}
    assert ("hub", "memberclusters") in b_writes and ("m1", "serviceimports") in b_writes, b_writes
    b_start = min(s for u, s, _, _ in terms if u == B)
    last_a_renew = max(s for u, s, _, _ in terms if u == A and s < b_start)
    gap = (b_start - last_a_renew).total_seconds()
    assert gap >= LEASE_DURATION - 0.5, f"B took over {gap:.2f} s after A's last renewal"

    # A answers DNS without a single failure while B dies and A takes the lease back.
    expected = {"payments.shop.global.": every, "orders.shop.global.": ["10.3.0.8"]}
    for name, want in expected.items():
        a.wait_for(lambda name=name, want=want: a.addresses(name) == want, what=f"A answers {name}")
    load = DnsLoad(a.dns_port, expected)
    load.start()
    try:
        time.sleep(1)
        b.proc.kill()
        b.proc.wait()
        killed_at = time.monotonic()
        wait_for(lambda: fleet.lease_holder() == A, timeout=15, what="A takes the lease back", log=a)
        took_back = time.monotonic() - killed_at
        wait_for(lambda: leader_metric(a) == 1, timeout=5, what="A says it leads", log=a)
        fleet.publish("m1", "inventory", ["10.1.0.5"])
        wait_for(lambda: imported(fleet, "m3", "inventory", ["m1"]), timeout=10, what="A imports inventory", log=a)
        time.sleep(1)
    finally:
        load.stop()
    print(f"A took the lease back {took_back:.1f} s after B was killed; {load.ok} DNS answers from A, "
          f"{len(load.failures)} failures")
    assert not load.failures, f"{len(load.failures)} failed queries of {load.ok + len(load.failures)}:\n" + \
        "\n".join(load.failures[:20])
    assert load.ok >= 1000, f"only {load.ok} queries in the load"

    terms, writes = check_audit(fleet)
    a_terms = [s for u, s, _, _ in terms if u == A]
    assert any(s > b_start for s in a_terms), "A's new term is in the audit log"
    assert any(c == "m3" and e["user"]["username"] == A and received(e) > b_start
               and (e.get("objectRef") or {}).get("name") == "inventory" for c, e in writes), "A writes again"


# The audit policy of the next test: AUDIT_POLICY, plus the moment a ServiceImport write is
# received (stage RequestReceived), to freeze the leader while it waits for the answer.
RECEIVED_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "rules": [
        {"level": "Metadata", "verbs": ["patch"],
         "resources": [{"group": "multicluster.x-k8s.io", "resources": ["serviceimports"]}]},
        {"level": "Metadata", "omitStages": ["RequestReceived"],
         "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Metadata", "omitStages": ["RequestReceived"]},
    ],
}


def tail_lines(f, timeout):
    """The whole lines written to the open file `f` from where it stands, as they come, for
    `timeout` seconds (an audit log, read closely enough to freeze a replica mid-request)."""
    deadline = time.monotonic() + timeout
    buf = ""
    while time.monotonic() < deadline:
        chunk = f.read()
        if not chunk:
            time.sleep(0.0005)
            continue
        buf += chunk
        *lines, buf = buf.split("\n")
        yield from lines


def freeze_on_received(fleet, cluster, user, proc, timeout=20.0):
    """Tails a cluster's audit log and SIGSTOPs `proc` as soon as the API server receives a
    ServiceImport patch (not its status) from `user`: the process is then frozen waiting for
    the answer. Returns that event."""
    import json

    with open(fleet.audit_log(cluster)) as f:
        f.seek(0, os.SEEK_END)
        for line in tail_lines(f, timeout):
            if ('"RequestReceived"' in line and '"serviceimports"' in line and '"subresource"' not in line
                    and f'"username":"{user}"' in line):
                os.kill(proc.pid, signal.SIGSTOP)
                return json.loads(line)
    raise AssertionError(f"no ServiceImport patch by {user} in {cluster} within {timeout} s")


def test_a_leader_frozen_while_a_write_is_in_flight_sends_nothing_more_after_it_resumes(tmp_path):
    """A leader frozen between the requests of one write-back step (here: a ServiceImport's
    spec patch is in flight, its status patch is next) must check its leadership again before
    each request once it wakes up: its lease is long gone."""
    with started(tmp_path / "kube", MEMBERS, audit=RECEIVED_POLICY, replica_users=[B]) as fleet:
        a = fleet.start_meridian(A)
        wait_for(lambda: fleet.lease_holder() == A and leader_metric(a) == 1, timeout=15, what="A leads", log=a)
        b = fleet.start_meridian(B)
        time.sleep(2)
        assert fleet.lease_holder() == A and leader_metric(b) == 0
        for k in range(40):  # a burst of work for A: a ServiceImport (and more) per service and member
            fleet.service("m1", f"s{k}", PORT)
            fleet.endpoint_slice("m1", f"s{k}", [f"10.1.1.{k + 1}"], ports=TARGET)
        for k in range(40):
            fleet.export("m1", f"s{k}")
        caught = freeze_on_received(fleet, "m3", A, a.proc)
        stopped_at = time.monotonic()
        try:
            wait_for(lambda: fleet.lease_holder() == B, timeout=15, what="B takes the lease", log=b)
            time.sleep(max(0.0, stopped_at + 2 * LEASE_DURATION - time.monotonic()))
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        time.sleep(3)
        assert leader_metric(a) == 0 and leader_metric(b) == 1
        print(f"A frozen while {caught['objectRef']['name']}'s ServiceImport patch was in flight "
              f"(received {caught['requestReceivedTimestamp']})")
        check_audit(fleet)
