"""meridian on real kube-apiservers when things go wrong: a member's API stops and comes back,
a watch's resourceVersion is compacted away (410 Gone) while the connection is frozen, a
member's credentials are wrong or missing, a kubeconfig authenticates through an exec
credential plugin, and meridian runs with nothing but the RBAC of deploy/rbac/.

Most tests use the session's fleet (kube_fleet.py: hub + m1..m3, health every 1 s,
Unreachable after 3 s, withdrawn after 6 s). Two need kube-apiserver flags of their own and
share a fleet of this module (`fault_fleet`): every cluster writes an audit log of what the
`meridian` user does, and m1 runs with --watch-cache=false, so a watch is served by etcd
itself and a compacted resourceVersion is answered with 410 Gone.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import select
import socket
import stat
import threading
import time
import urllib.request
from datetime import datetime, timezone
from fractions import Fraction

import pytest

import kube_fleet as kf
from conftest import FROM_UNKNOWN
from kube_fleet import DEFAULT_HEALTH, FROM, HUB_NAMESPACE, USER, resource_path, wait_for

NAME = "payments.shop.global"
TARGET = [{"name": "http", "port": 8080, "protocol": "TCP"}]
HEARTBEAT = DEFAULT_HEALTH["heartbeatSeconds"]
UNREACHABLE_AFTER = DEFAULT_HEALTH["unreachableAfterSeconds"]
WITHDRAW_AFTER = DEFAULT_HEALTH["withdrawAfterSeconds"]


# Helpers.
def clusters(m) -> dict:
    """/debug/clusters by cluster name."""
    status, body = m.http("/debug/clusters")
    assert status == 200, (status, body)
    return {c["name"]: c for c in json.loads(body)["clusters"]}


def debug_kubernetes(m) -> dict:
    status, body = m.http("/debug/kubernetes")
    assert status == 200, (status, body)
    return json.loads(body)


def metrics(m) -> dict:
    """/metrics as {(name, ((label, value), ...)): value}."""
    status, body = m.http("/metrics")
    assert status == 200, (status, body)
    out = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        pairs = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)))
        out[(name, pairs)] = float(value)
    return out


def metric(ms: dict, name: str, **labels) -> float:
    return ms.get((name, tuple(sorted(labels.items()))), 0.0)


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def log_text(m) -> str:
    """meridian's log without colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", m.log.read_text(errors="replace"))


QUANTITY_SUFFIX = {"": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                   "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(text: str) -> Fraction:
    """A Kubernetes resource quantity ("2500m", "8Gi", "9663676416") as a number."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)", str(text))
    assert match and match[2] in QUANTITY_SUFFIX, f"not a quantity: {text!r}"
    return Fraction(match[1]) * QUANTITY_SUFFIX[match[2]]


def wait_until(get, ok, timeout=10.0, interval=0.1, what="condition"):
    """Polls get() until ok(value); returns the value, or fails with the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value {value!r}")
        time.sleep(interval)


def timestamp(text: str) -> datetime:
    """An RFC 3339 time as Kubernetes writes it (any number of fractional digits, Z)."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", text)
    assert match, f"not an RFC 3339 UTC time: {text!r}"
    t = datetime.strptime(match[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return t.replace(microsecond=int((match[2] or "0")[:6].ljust(6, "0")))


class DnsSampler(threading.Thread):
    """Queries NAME (A) from `source` every `every` seconds and records every answer as
    (monotonic time, rcode or error text, sorted addresses)."""

    def __init__(self, m, name=NAME, source=FROM_UNKNOWN, every=0.01):
        super().__init__(daemon=True)
        self.m, self.name, self.source, self.every = m, name, source, every
        self.samples: list[tuple[float, object, list[str]]] = []
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.is_set():
            t = time.monotonic()
            try:
                r = self.m.query(self.name, source=self.source)
                self.samples.append((t, r.rcode(), sorted(rr.address for rrset in r.answer for rr in rrset)))
            except Exception as e:  # noqa: BLE001 - a timeout is an answer too (a bad one)
                self.samples.append((t, f"error: {e!r}", []))
            self.stopping.wait(self.every)

    def stop(self):
        self.stopping.set()
        self.join(10)
        return self.samples


@contextlib.contextmanager
def stopping_apiserver(fleet, name):
    """fleet.stop_apiserver(name) in a background thread; yields the monotonic time it began.

    kube-apiserver stops listening at once on SIGTERM but keeps the connections it has open
    (meridian's watches) until it exits, which it does not do before the harness kills it
    20 s later. The test observes meridian meanwhile; on leaving, the process is killed
    (the stop it began would end the same way) and the thread joined, so the next
    start_apiserver (from the main thread: its children die with the thread that started
    them) finds it stopped."""
    cluster = fleet.members[name]
    proc = cluster.apiserver
    assert proc is not None and proc.poll() is None, f"{name}'s kube-apiserver is not running"
    stopper = threading.Thread(target=fleet.stop_apiserver, args=(name,), daemon=True)
    began = time.monotonic()
    stopper.start()
    try:
        yield began
    finally:
        if proc.poll() is None:
            proc.kill()
        stopper.join(30)
        assert not stopper.is_alive(), f"{name}'s kube-apiserver did not stop"


class FreezableProxy:
    """A TCP proxy on loopback to `upstream` (TLS passes through untouched). freeze() stops
    forwarding bytes in both directions, keeping every connection open (new ones are
    accepted and held too); cut() closes every connection and forwards again for new ones."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.conns: set[_ProxiedConn] = set()
        self.frozen = False
        self.closing = False
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            conn = _ProxiedConn(client)
            with self.lock:
                if self.closing:
                    conn.close()
                    return
                self.conns.add(conn)
                self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="proxy-conn").start()

    def _serve(self, conn: "_ProxiedConn"):
        try:
            while self.frozen and not conn.closed:  # held, unforwarded, while frozen
                time.sleep(0.01)
            with conn.lock:
                if conn.closed:
                    return
                try:
                    conn.upstream = socket.create_connection(self.upstream, timeout=5)
                    conn.upstream.settimeout(None)
                except OSError:
                    conn.close()
                    return
            while True:
                if (self.frozen or conn.held) and not conn.closed:
                    time.sleep(0.01)
                    continue
                with conn.lock:  # freeze() and cut() wait for a forwarding step to end
                    if conn.closed:
                        return
                    if self.frozen or conn.held:
                        continue
                    ready, _, _ = select.select([conn.client, conn.upstream], [], [], 0.05)
                    for s in ready:
                        data = s.recv(65536)
                        if not data:
                            conn.close()
                            return
                        (conn.upstream if s is conn.client else conn.client).sendall(data)
        except OSError:
            with conn.lock:
                conn.close()
        finally:
            with self.lock:
                self.conns.discard(conn)

    def open_connections(self) -> int:
        with self.lock:
            return sum(1 for c in self.conns if not c.closed)

    def freeze(self):
        self.frozen = True
        with self.lock:
            conns = list(self.conns)
        for c in conns:  # no forwarding step in progress after this
            with c.lock:
                pass

    def blackhole(self) -> int:
        """Every connection open now goes silent for good, in both directions, and is never
        closed (as behind a NAT that forgot it); new connections are forwarded. Returns how
        many went silent."""
        with self.lock:
            conns = [c for c in self.conns if not c.closed]
        for c in conns:
            with c.lock:
                c.held = True
        return len(conns)

    def cut(self) -> int:
        """Closes every connection (frozen or not), then lets new ones through; returns how many it closed."""
        with self.lock:
            conns = list(self.conns)
        closed = 0
        for c in conns:
            with c.lock:
                if not c.closed:
                    closed += 1
                c.close()
        self.frozen = False
        return closed

    def close(self):
        with self.lock:
            self.closing = True
        self.listener.close()
        self.cut()


class _ProxiedConn:
    def __init__(self, client: socket.socket):
        self.client = client
        self.upstream: socket.socket | None = None
        self.lock = threading.Lock()
        self.closed = False
        self.held = False

    def close(self):
        self.closed = True
        for s in (self.client, self.upstream):
            if s is None:
                continue
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def etcd_call(cluster, path: str, body: dict) -> dict:
    """A call on etcd's v3 JSON gateway (served on its client URL)."""
    req = urllib.request.Request(cluster.etcd_url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"http_status": e.code, **json.loads(e.read() or b"{}")}


def etcd_compact_all(cluster) -> int:
    """Compacts the cluster's etcd up to its current revision (physically); returns it."""
    revision = int(etcd_call(cluster, "/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})["header"]["revision"])
    answer = etcd_call(cluster, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    assert "header" in answer, f"etcd compaction to {revision} failed: {answer}"
    # A read at an older revision is refused now: the history is gone.
    old = etcd_call(cluster, "/v3/kv/range", {"key": base64.b64encode(b"/registry/").decode(),
                                              "revision": str(revision - 1)})
    assert "compacted" in json.dumps(old), f"etcd still serves revision {revision - 1}: {old}"
    return revision


# The module's own fleet: audit logs everywhere, and m1 serving watches from etcd.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: [meridian]
  - level: None
"""


@pytest.fixture(scope="module")
def fault_fleet_session(tmp_path_factory):
    root = tmp_path_factory.mktemp("kube-faults")
    policy = root / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    names = ["hub", *(m.name for m in kf.DEFAULT_MEMBERS)]
    args = {n: [f"--audit-policy-file={policy}", f"--audit-log-path={root / n / 'audit.log'}",
                "--audit-log-mode=blocking", "--audit-log-maxsize=0"] for n in names}
    args["m1"].append("--watch-cache=false")
    try:
        fleet = kf.KubeFleet(root, extra_apiserver_args=args).start()
    except Exception as e:  # noqa: BLE001 - a missing peer fails loudly
        pytest.fail(f"cannot start the Kubernetes fleet with audit logs and --watch-cache=false: {e}")
    yield fleet
    fleet.stop()


@pytest.fixture
def fault_fleet(fault_fleet_session):
    fault_fleet_session.reset()
    yield fault_fleet_session
    fault_fleet_session.stop_meridians()


def audit_log_size(cluster) -> int:
    path = cluster.dir / "audit.log"
    return path.stat().st_size if path.exists() else 0


def audit_events(cluster, since: int = 0) -> list[dict]:
    """The audit events a cluster logged after byte `since` of its audit log."""
    path = cluster.dir / "audit.log"
    assert path.exists(), f"{cluster.name} writes no audit log ({path})"
    events = []
    with open(path, "rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    for line in text.splitlines():
        with contextlib.suppress(ValueError):  # the line being written
            events.append(json.loads(line))
    return events


# 1. A member's API stops and comes back.
def test_a_stopped_member_api_turns_unreachable_then_withdrawn_and_recovers_without_stale_endpoints(
        kube_fleet, kube_meridian):
    f, m = kube_fleet, kube_meridian
    f.publish("m1", "payments", ["10.1.0.1"])
    f.publish("m2", "payments", ["10.2.0.1"])
    both = ["10.1.0.1", "10.2.0.1"]
    m.wait_for(lambda: m.addresses(NAME) == both, what="both clusters' endpoints")
    m.wait_for(lambda: {c["health"] for c in clusters(m).values()} == {"Healthy"}, what="every member Healthy")
    assert m.addresses(NAME, source=FROM["m2"]) == ["10.2.0.1"]
    before = metrics(m)

    samples = []  # (seconds since the stop began, m1 health, m1 withdrawn, answer, m2 client's answer, m2 health)
    with stopping_apiserver(f, "m1") as began:
        while True:
            cs = clusters(m)
            now = time.monotonic() - began
            s = (now, cs["m1"]["health"], cs["m1"]["withdrawn"], m.addresses(NAME),
                 m.addresses(NAME, source=FROM["m2"]), cs["m2"]["health"])
            samples.append(s)
            if s[3] == ["10.2.0.1"] and s[2] or now > UNREACHABLE_AFTER + WITHDRAW_AFTER + 10:
                break
            time.sleep(0.1)
        # Stay a little longer: the withdrawal holds.
        settle = time.monotonic() + 1.5
        while time.monotonic() < settle:
            cs = clusters(m)
            samples.append((time.monotonic() - began, cs["m1"]["health"], cs["m1"]["withdrawn"], m.addresses(NAME),
                            m.addresses(NAME, source=FROM["m2"]), cs["m2"]["health"]))
            time.sleep(0.1)
        cs = clusters(m)
        after = metrics(m)
        status = wait_for(lambda: (s := f.member_status("m1")).get("health") == "Unreachable"
                          and condition(s, "Withdrawn").get("status") == "True" and s, timeout=5,
                          what="m1's status on the hub: Unreachable and Withdrawn", log=m)
    table = "\n".join(repr(s) for s in samples)

    # Unreachable within unreachableAfterSeconds of the API going away (not at its first failure).
    unreachable = [s for s in samples if s[1] == "Unreachable"]
    assert unreachable, f"m1 never turned Unreachable:\n{table}"
    unreachable_at = unreachable[0][0]
    assert UNREACHABLE_AFTER - HEARTBEAT - 0.5 <= unreachable_at < UNREACHABLE_AFTER + 2, \
        f"m1 turned Unreachable {unreachable_at:.2f} s after its API stopped (unreachableAfterSeconds " \
        f"{UNREACHABLE_AFTER}):\n{table}"
    assert all(s[1] == "Unreachable" for s in samples if s[0] >= unreachable_at), \
        f"m1 left Unreachable with its API still down:\n{table}"
    # Its endpoints are answered until withdrawAfterSeconds of Unreachable, then withdrawn.
    assert samples[-1][3] == ["10.2.0.1"], f"m1's endpoints were never withdrawn:\n{table}"
    for s in samples:
        if s[0] < unreachable_at + WITHDRAW_AFTER - 1:  # (unreachable_at is up to one poll late)
            assert s[3] == both and not s[2], f"m1's endpoints withdrawn too early ({s}):\n{table}"
    first_withdrawn = next(s[0] for s in samples if s[3] == ["10.2.0.1"])
    assert first_withdrawn - unreachable_at < WITHDRAW_AFTER + 2, \
        f"withdrawn {first_withdrawn - unreachable_at:.2f} s after Unreachable (withdrawAfterSeconds " \
        f"{WITHDRAW_AFTER}):\n{table}"
    assert all(s[3] == ["10.2.0.1"] and s[2] for s in samples if s[0] >= first_withdrawn), \
        f"the withdrawal did not hold:\n{table}"
    # m2 is untouched throughout.
    assert all(s[5] == "Healthy" and s[4] == ["10.2.0.1"] for s in samples), f"m2 was disturbed:\n{table}"
    assert cs["m1"]["reason"] and "/readyz" in cs["m1"]["reason"], cs["m1"]
    # Metrics and the hub's status say the same.
    assert metric(after, "meridian_registry_withdrawals_total", cluster="m1", to="withdrawn") == \
        metric(before, "meridian_registry_withdrawals_total", cluster="m1", to="withdrawn") + 1
    assert metric(after, "meridian_registry_transitions_total", cluster="m1", to="Unreachable") == \
        metric(before, "meridian_registry_transitions_total", cluster="m1", to="Unreachable") + 1
    assert metric(after, "meridian_cluster_withdrawn", cluster="m1") == 1
    assert metric(after, "meridian_cluster_health", cluster="m1", state="Unreachable") == 1
    assert metric(after, "meridian_cluster_withdrawn", cluster="m2") == 0
    assert metric(after, "meridian_registry_transitions_total", cluster="m2", to="Unreachable") == 0
    assert condition(status, "Ready")["status"] == "False"
    assert condition(status, "Withdrawn")["reason"] == "UnreachableTooLong"

    # Back: the first thing done through the API is to move m1's endpoint to a new address.
    sampler = DnsSampler(m, every=0.02)
    sampler.start()
    try:
        f.start_apiserver("m1")
        restarted = time.monotonic()
        f.endpoint_slice("m1", "payments", ["10.1.0.9"], ports=TARGET)
        m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.9", "10.2.0.1"], timeout=20,
                   what="m1's new address answered, and its old one no more")
        time.sleep(1.5)
    finally:
        answers = sampler.stop()
    trace = "\n".join(f"{t - restarted:+.2f} {rcode} {a}" for t, rcode, a in answers)
    wait_until(lambda: clusters(m)["m1"], lambda c: c["health"] == "Healthy", timeout=10,
               what="m1 Healthy again (its heartbeats succeed and its watches relisted)")
    assert all(rcode == 0 and "10.2.0.1" in a for _, rcode, a in answers), f"a bad answer meanwhile:\n{trace}"
    first_new = next(i for i, (_, _, a) in enumerate(answers) if "10.1.0.9" in a)
    assert all(a == ["10.1.0.9", "10.2.0.1"] for _, _, a in answers[first_new:]), \
        f"after the new address showed, something else was answered:\n{trace}"
    final = clusters(m)["m1"]
    assert final["health"] == "Healthy" and final["withdrawn"] is False, final
    restored = metrics(m)
    assert metric(restored, "meridian_registry_withdrawals_total", cluster="m1", to="restored") == \
        metric(before, "meridian_registry_withdrawals_total", cluster="m1", to="restored") + 1
    assert metric(restored, "meridian_cluster_withdrawn", cluster="m1") == 0
    assert metric(restored, "meridian_cluster_health", cluster="m1", state="Healthy") == 1
    status = wait_for(lambda: (s := f.member_status("m1")).get("health") == "Healthy" and s, timeout=5,
                      what="m1's status Healthy again", log=m)
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Withdrawn")["status"] == "False"


# 2. 410 Gone: a relist with no empty answer in between.
def test_a_410_gone_relists_without_an_empty_answer(fault_fleet):
    """m1's API (with --watch-cache=false: watches read etcd) is reached through a proxy the
    test controls. The proxy freezes, the objects change behind it, etcd's history is
    compacted away, and every connection is cut: the watches come back with
    resourceVersions that no longer exist (410 Gone) and must relist, swapping the result in
    at once. m1 beats every 20 s here, so its heartbeat does not restart the watches first
    (it would relist too, without a 410); the relist the test sees is the watches' own."""
    f = fault_fleet
    c = f.members["m1"]
    assert "--watch-cache=false" in c.apiserver_args()
    proxy = FreezableProxy(c.apiserver_port)
    try:
        f.register_member("m1", source={"kubernetes": {
            "kubeconfig": {"path": str(f.member_kubeconfig("m1"))},
            "apiEndpoint": f"https://127.0.0.1:{proxy.port}"}},
            health={"heartbeatSeconds": 20, "unreachableAfterSeconds": 60, "withdrawAfterSeconds": 120})
        f.publish("m1", "payments", ["10.1.0.1"])
        m = f.start_meridian()
        m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"], what="m1's endpoint, through the proxy")
        m.wait_for(lambda: debug_kubernetes(m)["members"]["m1"]["listed"], what="m1 listed")
        # Every watch is open (six kinds), through the proxy: as streams of one HTTP/2 connection.
        wait_for(lambda: proxy.open_connections() >= 1, what="meridian's connection through the proxy", log=m)
        time.sleep(1)
        m1_log_start = len(log_text(m))

        sampler = DnsSampler(m)
        sampler.start()
        try:
            time.sleep(0.3)
            proxy.freeze()
            frozen_at = time.monotonic()
            # Behind meridian's back, as admin straight to the API: the watches see none of it.
            f.endpoint_slice("m1", "payments", ["10.1.0.1", "10.1.0.2"], ports=TARGET)
            f.service("m1", "scratch", 80)
            f.delete_service("m1", "scratch")
            f.node("m1", "scratch-node")
            f.delete("m1", "Node", "scratch-node")
            f.endpoint_slice("m1", "payments", ["10.1.0.2", "10.1.0.3"], ports=TARGET)
            revision = etcd_compact_all(c)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - frozen_at)))
            assert m.addresses(NAME) == ["10.1.0.1"], "meridian saw a change through a frozen proxy"
            cut = proxy.cut()
            cut_at = time.monotonic()
            assert cut >= 1, "no connection was open through the proxy"
            m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.2", "10.1.0.3"], timeout=30,
                       what="the relisted endpoints")
            time.sleep(1)
            # Every watch relisted: nothing is failing any more.
            health = wait_until(lambda: clusters(m)["m1"], lambda c: c["health"] == "Healthy", timeout=10,
                                what="m1 Healthy after its watches relisted")
        finally:
            answers = sampler.stop()
    finally:
        f.stop_meridians()
        proxy.close()

    trace = "\n".join(f"{t - cut_at:+.3f} {rcode} {a}" for t, rcode, a in answers)
    assert len(answers) > 100, f"too few DNS samples:\n{trace}"
    bad = [(t - cut_at, rcode, a) for t, rcode, a in answers if rcode != 0 or not a]
    assert not bad, f"empty, NXDOMAIN, SERVFAIL or no answer while relisting: {bad[:10]}\n{trace}"
    assert {tuple(a) for _, _, a in answers} <= {("10.1.0.1",), ("10.1.0.2", "10.1.0.3")}, trace
    assert answers[-1][2] == ["10.1.0.2", "10.1.0.3"]
    first_new = next(i for i, (_, _, a) in enumerate(answers) if a == ["10.1.0.2", "10.1.0.3"])
    assert all(a == ["10.1.0.2", "10.1.0.3"] for _, _, a in answers[first_new:]), trace

    # The watches were told their resourceVersion is gone (410), and relisted.
    log = log_text(m)[m1_log_start:]
    # meridian logs each kind whose watch was refused as expired (kube-apiserver answers 410 with
    # reason Expired: "The resourceVersion for the provided watch is too old.").
    gone = [line for line in log.splitlines() if "INFO" in line and "resourceVersion expired (410 Gone); relisting" in line]
    assert gone, ("meridian's log shows no watch failing with 410 Expired ('too old') after etcd was "
                  f"compacted to {revision}:\n" + "\n".join(line for line in log.splitlines()
                                                          if "watch" in line and "m1" in line)[-6000:])
    assert any("endpointslices" in line for line in gone), gone
    assert any("code: 410" in line for line in log.splitlines() if "watchevent error" in line), \
        "kube-rs logged no 410 watch event"
    assert health["withdrawn"] is False and health["reason"] is None, health


# 3. Wrong or missing credentials on one member.
def test_a_silently_stalled_watch_is_noticed_and_opened_again(fault_fleet):
    """meridian reaches m1 through a proxy; every connection open to it then goes silent for
    good without being closed (a black hole: no error, no FIN, nothing). With watches bounded
    at 3 s (--kube-watch-timeout-seconds 3), a read silent for 5 s fails, and the watches
    open again on new connections: a change made meanwhile arrives. Without the bound it would
    never arrive. m1 beats every 20 s, so a heartbeat does not restart the watches first."""
    f = fault_fleet
    c = f.members["m1"]
    proxy = FreezableProxy(c.apiserver_port)
    try:
        f.register_member("m1", source={"kubernetes": {
            "kubeconfig": {"path": str(f.member_kubeconfig("m1"))},
            "apiEndpoint": f"https://127.0.0.1:{proxy.port}"}},
            health={"heartbeatSeconds": 20, "unreachableAfterSeconds": 60, "withdrawAfterSeconds": 120})
        f.publish("m1", "payments", ["10.1.0.1"])
        m = f.start_meridian("meridian", "--kube-watch-timeout-seconds", "3")
        m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"], what="m1's endpoint, through the proxy")
        m.wait_for(lambda: debug_kubernetes(m)["members"]["m1"]["listed"], what="m1 listed")
        time.sleep(1)
        silenced = proxy.blackhole()
        assert silenced >= 1, "no connection to m1 was open"
        accepted_before = proxy.accepted
        silenced_at = time.monotonic()
        f.endpoint_slice("m1", "payments", ["10.1.0.7"], ports=TARGET)
        m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.7"], timeout=20,
                   what="the change, after the stalled watch was noticed and opened again")
        took = time.monotonic() - silenced_at
        # Read timeout 3 + 3/3 + 1 = 5 s, then the watch's backoff (under a second at first).
        assert took < 5 + 6, f"the stall took {took:.1f} s to notice"
        assert took > 1, f"seen after {took:.1f} s: the black hole did not hold"
        assert proxy.accepted > accepted_before, "the change did not come through a new connection"
        assert proxy.open_connections() >= silenced, "the silent connections were closed by the proxy"
    finally:
        proxy.close()


def test_bad_credentials_on_one_member_do_not_block_the_others(kube_fleet):
    f = kube_fleet
    f.write_member_kubeconfig("m2", token="wrong")  # the file meridian reads, and the hub Secret
    missing = "m3-missing-kubeconfig"
    f.register_member("m3", source={"kubernetes": {"secretRef": {"namespace": HUB_NAMESPACE, "name": missing,
                                                                 "key": "kubeconfig"}}})
    assert f.hub.get("v1", "Secret", missing, HUB_NAMESPACE) is None
    f.publish("m1", "payments", ["10.1.0.1"])
    f.publish("m2", "payments", ["10.2.0.1"])
    f.publish("m3", "payments", ["10.3.0.1"])
    started = time.monotonic()
    m = f.start_meridian()
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"], what="m1 served while m2 and m3 cannot be reached")
    assert time.monotonic() - started < 10

    def reasons():
        cs = clusters(m)
        m2, m3 = cs["m2"]["reason"] or "", cs["m3"]["reason"] or ""
        ok = (("401" in m2 or "Unauthorized" in m2) and missing in m3
              and ("not found" in m3.lower() or "notfound" in m3.lower()))
        return ok and cs
    m.wait_for(reasons, what="m2's 401 and m3's missing Secret in /debug/clusters")
    # Neither ever had a good heartbeat: Unreachable after unreachableAfterSeconds.
    cs = wait_until(lambda: clusters(m), lambda cs: cs["m2"]["health"] == cs["m3"]["health"] == "Unreachable",
                    timeout=UNREACHABLE_AFTER + 5, what="m2 and m3 Unreachable")
    assert reasons(), cs
    assert cs["m1"]["health"] == "Healthy" and cs["m1"]["reason"] is None, cs["m1"]
    kube = debug_kubernetes(m)["members"]
    assert kube["m1"]["connected"] and kube["m1"]["listed"], kube["m1"]
    assert not kube.get("m3", {}).get("connected"), kube.get("m3")  # no client: it has no kubeconfig

    def ready_false_with(name, *words):
        def check():
            ready = condition(f.member_status(name), "Ready")
            return ready.get("status") == "False" and any(w in ready.get("message", "") for w in words) and ready
        return wait_for(check, what=f"{name}: Ready=False naming {words}", log=m)
    ready_false_with("m2", "401", "Unauthorized")
    ready_false_with("m3", missing)
    assert condition(f.member_status("m1"), "Ready").get("status") == "True"

    # The kubeconfig file is fixed (as a rotated token would be), and nothing else: credentials
    # refused heartbeat after heartbeat make the member source read them again.
    generation = f.member_cluster("m2")["metadata"]["generation"]
    f.write_member_kubeconfig("m2")
    m.wait_for(lambda: "10.2.0.1" in m.addresses(NAME), timeout=20,
               what="m2 answered once its kubeconfig file has the right token")
    assert f.member_cluster("m2")["metadata"]["generation"] == generation
    assert "credentials refused: reading them again and reconnecting" in log_text(m)
    wait_until(lambda: clusters(m)["m2"], lambda c: c["health"] == "Healthy" and c["reason"] is None, timeout=10,
               what="m2 Healthy, with no reason left, once it reconnected with the right token")
    wait_until(lambda: condition(f.member_status("m2"), "Ready"), lambda c: c.get("status") == "True",
               what="m2 Ready=True on the hub")

    # The missing Secret appears: m3's source, retrying all along, connects by itself.
    f.hub.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": missing, "namespace": HUB_NAMESPACE},
                 "type": "Opaque",
                 "data": {"kubeconfig": base64.b64encode(f.member_kubeconfig("m3").read_bytes()).decode()}})
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.2.0.1", "10.3.0.1"], timeout=20,
               what="m3 answered once its Secret exists")
    wait_until(lambda: clusters(m)["m3"], lambda c: c["health"] == "Healthy" and c["reason"] is None, timeout=10,
               what="m3 Healthy once its Secret exists")


# 4. exec credential plugins (how EKS, GKE and AKS kubeconfigs authenticate).
def test_an_exec_credential_plugin_kubeconfig_works(kube_fleet, tmp_path):
    f = kube_fleet
    c = f.members["m1"]
    calls = tmp_path / "plugin-calls"
    plugin = tmp_path / "meridian-credential"
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": c.tokens[USER]}}
    plugin.write_text("#!/bin/sh\n"
                      f"printf '%s\\n' \"$KUBERNETES_EXEC_INFO\" >> '{calls}'\n"
                      f"cat <<'EOF'\n{json.dumps(credential)}\nEOF\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    kubeconfig = tmp_path / "m1-exec.kubeconfig"
    ca = base64.b64encode(c.ca_file.read_bytes()).decode()
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "m1-exec",
        "clusters": [{"name": "m1", "cluster": {"server": c.server, "certificate-authority-data": ca}}],
        "users": [{"name": "exec", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin), "args": [],
            "interactiveMode": "Never", "provideClusterInfo": False}}}],
        "contexts": [{"name": "m1-exec", "context": {"cluster": "m1", "user": "exec"}}],
    }))
    assert c.tokens[USER] not in kubeconfig.read_text()
    f.register_member("m1", source={"kubernetes": {"kubeconfig": {"path": str(kubeconfig)}}})
    f.publish("m1", "payments", ["10.1.0.1"])
    m = f.start_meridian()
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"] and clusters(m)["m1"]["health"] == "Healthy",
               what="m1 Healthy and answered through the exec plugin's token")
    assert calls.exists() and calls.read_text().strip(), "the exec plugin was never run"
    # Run as client-go runs plugins: told (KUBERNETES_EXEC_INFO) that nobody can answer a prompt.
    for line in calls.read_text().splitlines():
        info = json.loads(line)
        assert info["apiVersion"] == "client.authentication.k8s.io/v1" and info["spec"]["interactive"] is False, info
    kube = debug_kubernetes(m)["members"]["m1"]
    assert kube["connected"] and kube["listed"] and kube["kubernetesVersion"] == "v1.34.12", kube
    # The write-back works with it too.
    wait_for(lambda: f.export_condition("m1", "payments", "Valid"), what="ServiceExport Valid written", log=m)


# 5. meridian's own operation stays inside deploy/rbac/.
MEMBER_WRITES = {("services", ""), ("endpointslices", ""), ("serviceimports", ""), ("serviceimports", "status"),
                 ("serviceexports", "status")}
HUB_WRITES = {("leases", ""), ("memberclusters", "status"), ("clusterschedulingpolicies", "status")}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def test_meridian_writes_nothing_outside_its_roles(fault_fleet):
    """The whole flow of test_kube.py, with every request of the `meridian` user in the
    API servers' audit logs: none is refused, and every write is one of meridian's own
    objects (never a user's Service, EndpointSlice or ServiceExport). A write outside
    deploy/rbac/member.yaml with the same token is refused, and shows in the audit log as
    such, so "no refusal" is not an artefact of the log."""
    f = fault_fleet
    m1 = f.members["m1"]
    since = {c.name: audit_log_size(c) for c in f.clusters}  # the module's earlier tests are in there too
    status, body = m1.request("POST", resource_path("v1", "ConfigMap", "shop"),
                              {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}},
                              token=m1.tokens[USER])
    assert status == 403, (status, body)
    status, _ = m1.request("POST", resource_path("apps/v1", "Deployment", "shop"),
                           {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probe"}},
                           token=m1.tokens[USER])
    assert status == 403

    m = f.start_meridian()
    f.publish("m1", "payments", ["10.1.0.1", "10.1.0.2"])
    f.publish("m3", "payments", ["10.3.0.1"])
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.1.0.2", "10.3.0.1"], what="both clusters answered")
    for member in ("m1", "m2", "m3"):
        wait_for(lambda member=member: (si := f.service_import(member, "payments")) and si["spec"].get("ips")
                 and [s for s in f.managed_services(member) if s["metadata"]["name"] == "derived-payments"],
                 what=f"ServiceImport and derived Service in {member}", log=m)
    wait_for(lambda: f.managed_slices("m2", service="derived-payments"), what="derived slices in m2", log=m)
    wait_for(lambda: (f.export_condition("m1", "payments", "Valid") or {}).get("status") == "True",
             what="Valid condition", log=m)
    f.endpoint_slice("m1", "payments", ["10.1.0.9"], ports=TARGET)
    wait_for(lambda: [a for s in f.managed_slices("m2", service="derived-payments") for e in s["endpoints"]
                      for a in e["addresses"]] == ["10.1.0.9"], what="the derived slice follows", log=m)
    wait_for(lambda: f.member_status("m1").get("health") == "Healthy", what="m1 status written", log=m)
    f.unexport("m1", "payments")
    f.unexport("m3", "payments")
    m.wait_for(lambda: m.query(NAME).rcode() == 3, what="NXDOMAIN after unexport")
    for member in ("m1", "m2", "m3"):
        wait_for(lambda member=member: not f.service_imports(member) and not f.managed_services(member)
                 and not f.managed_slices(member), what=f"cleanup in {member}", log=m)
    time.sleep(1)

    def meridians(events):
        return [e for e in events if e.get("user", {}).get("username") == USER
                and not e.get("userAgent", "").startswith("Python-urllib")]

    wrote = {}
    for c in f.clusters:
        events = audit_events(c, since[c.name])
        mine = meridians(events)
        assert mine, f"no request of meridian's in {c.name}'s audit log"
        refused = [e for e in mine if e.get("responseStatus", {}).get("code") in (401, 403)]
        assert not refused, f"{c.name} refused meridian: " + json.dumps(refused[:5], indent=1)
        allowed = HUB_WRITES if c is f.hub else MEMBER_WRITES
        writes = [e for e in mine if e["verb"] in WRITE_VERBS]
        for e in writes:
            ref = e.get("objectRef", {})
            key = (ref.get("resource"), ref.get("subresource", ""))
            assert key in allowed, f"meridian wrote {key} in {c.name}: {json.dumps(e)}"
            if c is f.hub:
                assert ref.get("resource") != "leases" or (ref.get("namespace"), ref.get("name")) == \
                    (HUB_NAMESPACE, kf.LEASE), e
            elif ref.get("resource") in ("services", "endpointslices"):
                # Only its derived objects, never the users' own payments / payments-m1.
                assert ref.get("name", "").startswith("derived-"), f"meridian wrote a user's object: {json.dumps(e)}"
            elif ref.get("resource") == "serviceexports":
                assert ref.get("subresource") == "status", e
        wrote[c.name] = sorted({(e["verb"], e["objectRef"].get("resource"), e["objectRef"].get("subresource", ""))
                                for e in writes})
        # The probes of this test are in the log, refused: the log does record refusals.
        if c is m1:
            probes = [e for e in events if e.get("user", {}).get("username") == USER
                      and e.get("userAgent", "").startswith("Python-urllib") and e["verb"] == "create"]
            assert sorted((e["objectRef"]["resource"], e["responseStatus"]["code"]) for e in probes) == \
                [("configmaps", 403), ("deployments", 403)], probes
    # meridian did write: ServiceImports and derived objects in members, status on the hub.
    assert ("patch", "memberclusters", "status") in wrote["hub"], wrote["hub"]
    assert any(r == "serviceimports" for _, r, _ in wrote["m2"]), wrote["m2"]
    assert any(r == "endpointslices" for _, r, _ in wrote["m2"]), wrote["m2"]
    refusal = re.compile(r"status_code=40[13]\b|code: 40[13]\b|[Ff]orbidden|Unauthorized")
    log = log_text(m)
    assert not refusal.search(log), \
        "meridian logged a refusal:\n" + "\n".join(line for line in log.splitlines() if refusal.search(line))[:4000]


# 6. MemberCluster status on the hub.
def test_member_cluster_status_on_the_hub(kube_fleet):
    f = kube_fleet
    f.node("m1", "node-a", cpu="4", memory="8Gi")
    f.node("m1", "node-b", cpu="2500m", memory="1536Mi")
    f.publish("m1", "payments", ["10.1.0.1", "10.1.0.2"])
    f.publish("m1", "orders", ["10.1.0.3"])
    m = f.start_meridian()
    version = f.members["m1"].request("GET", "/version")[1]["gitVersion"]
    assert version == "v1.34.12"

    def complete():
        s = f.member_status("m1")
        return (s.get("health") == "Healthy" and s.get("exportedServices") == 2 and s.get("endpoints") == 3
                and s.get("capacity", {}).get("pods") is not None and quantity(s["capacity"]["pods"]) == 220 and s)
    status = wait_for(complete, timeout=15, what="m1's complete status on the hub", log=m)
    for field in ("capacity", "allocatable"):
        got = status[field]
        assert quantity(got["cpu"]) == Fraction(13, 2), (field, got)
        assert quantity(got["memory"]) == 8 * 2**30 + 1536 * 2**20, (field, got)
        assert quantity(got["pods"]) == 220, (field, got)
    assert status["kubernetesVersion"] == version
    age = (datetime.now(timezone.utc) - timestamp(status["lastHeartbeat"])).total_seconds()
    assert -2 < age < 15, f"lastHeartbeat {status['lastHeartbeat']} is {age:.1f} s old"
    ready = condition(status, "Ready")
    assert ready["status"] == "True" and ready["reason"] == "Healthy", ready
    assert condition(status, "Withdrawn")["status"] == "False"
    # The other members have their own (no nodes, nothing exported).
    m2 = wait_for(lambda: (s := f.member_status("m2")).get("health") == "Healthy" and s, what="m2 status", log=m)
    assert m2.get("exportedServices") == 0 and m2.get("endpoints") == 0, m2

    stopped = datetime.now(timezone.utc)
    with stopping_apiserver(f, "m1"):
        status = wait_for(lambda: (s := f.member_status("m1")).get("health") == "Unreachable" and s,
                          timeout=UNREACHABLE_AFTER + 5, what="m1's status Unreachable", log=m)
    ready = condition(status, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Unreachable" and "/readyz" in ready["message"], ready
    # What was known stays: the version, the capacity, the last good heartbeat (none since).
    assert status["kubernetesVersion"] == version
    assert quantity(status["capacity"]["cpu"]) == Fraction(13, 2)
    assert (timestamp(status["lastHeartbeat"]) - stopped).total_seconds() < 0.5, (status["lastHeartbeat"], stopped)
