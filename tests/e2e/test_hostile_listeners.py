"""Hostile input on meridian's listeners (issue 19): descriptor exhaustion, idle and
byte-a-second connections, TCP DNS floods past its bound, HTTP/2 stream floods, xDS requests for types meridian does not
serve and oversized ones, and a config that asked for 100,000 UDP threads.

Each attack is checked during and after: UDP and TCP DNS answer another name, /healthz
answers within 1 s, an xDS stream (ads.py) still receives a change, and the attack shows
where users look (log, metrics, /debug/xds, /readyz).
"""

import http.client
import json
import os
import re
import resource
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import dns.exception
import dns.flags
import dns.message
import pytest

import conftest
import xds_fleet
from ads import CDS, EDS, PREFACE, SETTINGS, AdsStream, RawH2, StreamEnded, ack, decode, frame, node, request
from conftest import BIN, FROM_EU1, Meridian, metric, wait_xds_listening

NAME = "payments.shop.global"
# Never meridian's default ports: a user's own meridian may be serving beside the suite.
NO_DEFAULT_PORTS = ("--dns-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--xds-listen", "127.0.0.1:0")
RST_STREAM = 3
REFUSED_STREAM = 7
SDS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


def log_text(m):
    """meridian's log without the terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", m.log.read_text())


def envoy_node(name="hostile-test"):
    return node(name, "eu-1", "n1")


@pytest.fixture
def low_ulimit(monkeypatch, tmp_path):
    """Starts meridian through a wrapper that lowers `ulimit -n` (soft and hard) first."""

    def wrap(limit):
        wrapper = tmp_path / f"meridian-ulimit-{limit}"
        wrapper.write_text(f'#!/bin/bash\nulimit -n {limit} || exit 99\nexec "{BIN}" "$@"\n')
        wrapper.chmod(0o755)
        monkeypatch.setattr(conftest, "BIN", wrapper)

    return wrap


@pytest.fixture
def started():
    running = []

    def start(fleet, *args):
        m = Meridian(fleet, args)
        running.append(m)
        return m

    yield start
    for m in running:
        m.stop()


def healthz_fast(m):
    start = time.time()
    with socket.create_connection(("127.0.0.1", m.admin_port), timeout=1) as s:
        s.settimeout(1)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while b"ok" not in reply:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    took = time.time() - start
    assert reply.startswith(b"HTTP/1.1 200") and b"ok" in reply, reply
    assert took < 1, f"/healthz took {took:.2f}s"


def dns_answers(m):
    for tcp in (False, True):
        r = m.query(NAME, source=FROM_EU1, tcp=tcp)
        got = [rr.address for rrset in r.answer for rr in rrset]
        assert got, f"no answer for {NAME} over {'TCP' if tcp else 'UDP'}: {r}"


def add_service(fleet, service):
    """Exports `service` in eu-1 with one ready endpoint: a new CDS cluster for everyone."""
    fleet.write(f"clusters/eu-1/{service}.yaml", xds_fleet.service_yaml(service))
    fleet.write(f"clusters/eu-1/{service}-slice.yaml", xds_fleet.slice_yaml("eu-1", service, ["127.1.1.99"]))


class Watcher:
    """An ADS stream subscribed to wildcard CDS; `sees_change` adds a service and waits for
    the push that carries it."""

    def __init__(self, m, name):
        self.m = m
        self.stream = AdsStream(m.xds_port)
        self.stream.send(request(CDS, node=envoy_node(name)))
        r = self.stream.recv_type(CDS, timeout=10)
        self.stream.send(ack(r))

    def sees_change(self, timeout=10):
        service = f"probe{time.time_ns()}"
        add_service(self.m.fleet, service)
        deadline = time.time() + timeout
        while True:
            r = self.stream.recv_type(CDS, timeout=max(0.1, deadline - time.time()))
            self.stream.send(ack(r))
            if xds_fleet.resource_name(service) in decode(r):
                return

    def close(self):
        self.stream.close()


def alive(m, watcher):
    """Everything a user relies on still works."""
    assert m.proc.poll() is None, f"meridian exited with {m.proc.returncode}\n{m.log_tail()}"
    dns_answers(m)
    healthz_fast(m)
    watcher.sees_change()


def members_healthy(m):
    _, body = m.http("/debug/clusters")
    import json

    health = {c["name"]: c["health"] for c in json.loads(body)["clusters"]}
    assert set(health.values()) == {"Healthy"}, health


def hold(port, count, send=b""):
    """`count` connections to `port`, each having sent `send`; the ones refused are skipped."""
    held = []
    for _ in range(count):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            if send:
                s.sendall(send)
            held.append(s)
        except OSError:
            pass
    return held


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------
# Finding 1: descriptors.


def test_idle_connections_past_the_bound_under_a_low_ulimit(fleet, low_ulimit, started):
    """~1,000 idle connections to admin and xDS under `ulimit -n 256`: the listeners hold at
    most their bound (computed from the limit, with a reserve), evict idle probes for real
    clients, and nothing else notices."""
    low_ulimit(256)
    m = started(fleet)
    log = log_text(m)
    assert re.search(r"file descriptor limit.*soft=256", log), "the descriptor limit is not logged"
    watcher = Watcher(m, "idle-flood")
    bound_admin = metric(m, "meridian_listener_max_connections", listener="admin")
    bound_xds = metric(m, "meridian_listener_max_connections", listener="xds")
    bound_dns = metric(m, "meridian_listener_max_connections", listener="dns_tcp")
    assert 0 < bound_admin + bound_xds + bound_dns < 256 - 64, (bound_admin, bound_xds, bound_dns)
    flood = hold(m.admin_port, 500) + hold(m.xds_port, 500)
    try:
        alive(m, watcher)
        members_healthy(m)
        fresh = Watcher(m, "fresh-during")
        fresh.close()
        assert metric(m, "meridian_listener_connections", listener="xds") <= bound_xds
        assert metric(m, "meridian_listener_connections", listener="admin") <= bound_admin
        evicted = metric(m, "meridian_listener_timeouts_total", kind="evicted")
        assert evicted > 0, "the flood is not visible in meridian_listener_timeouts_total"
        assert m.http("/readyz")[0] == 200
        assert "listener at its connection bound" in log_text(m)
    finally:
        close_all(flood)
    wait_xds_listening(m)
    alive(m, watcher)
    members_healthy(m)
    assert "Too many open files" not in log_text(m)
    watcher.close()


def framed_query(name, qid):
    """A DNS query for `name` with its TCP length prefix."""
    q = dns.message.make_query(name, "A", id=qid)
    q.flags &= ~dns.flags.RD
    wire = q.to_wire()
    return struct.pack("!H", len(wire)) + wire


def read_framed(s):
    """One length-prefixed DNS message from `s`, parsed."""
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    (length,) = struct.unpack("!H", exact(2))
    return dns.message.from_wire(exact(length))


def tcp_dns_client(m, qid, source="127.0.0.1"):
    """A TCP DNS connection from `source` that has asked one question and got its answer
    (past the listener's handshake: not a probe), or None if meridian closed it instead."""
    s = socket.socket()
    s.settimeout(2)
    s.bind((source, 0))
    try:
        s.connect(("127.0.0.1", m.dns_port))
        s.sendall(framed_query(NAME, qid))
        r = read_framed(s)
        assert r.id == qid and r.answer, r
        return s
    except (OSError, ConnectionError):
        s.close()
        return None


def asks_again(s, qid):
    """A held TCP DNS connection still answers."""
    s.sendall(framed_query(NAME, qid))
    r = read_framed(s)
    assert r.id == qid and [rr.address for rrset in r.answer for rr in rrset], r


def test_accept_errors_are_survived_and_reported(fleet, low_ulimit, started):
    """meridian really runs out of descriptors. Its own bounds cannot get it there (every
    listener's bound, TCP DNS's included, plus the reserve fit the limit, and meridian refuses
    to start otherwise), so the limit is lowered under the running process (prlimit(2), as a
    careless operator or a container runtime can) to exactly the descriptors it holds, with a
    few TCP DNS clients connected. The accept loops of xDS and TCP DNS then back off instead of
    ending (tonic's ended, and the port was gone for good; hickory-server's spun), the error is
    counted and logged, /readyz names the listeners, UDP DNS and the TCP DNS connections already
    open keep answering; once the limit is back, every port accepts again. The members'
    directories are read every second meanwhile and fail with EMFILE: that is meridian's
    shortage, not theirs, so no member is failed for it (with unreachableAfterSeconds 2 and
    withdrawAfterSeconds 3 they would be withdrawn within the window otherwise)."""
    low_ulimit(256)
    fleet.set_health(heartbeat=1, unreachable=2, withdraw=3)
    m = started(fleet, "--dns-tcp-idle-timeout-seconds", "60")
    # Opened before the attack, kept alive: the admin server's only way in while out of fds.
    admin = http.client.HTTPConnection("127.0.0.1", m.admin_port, timeout=5)
    admin.request("GET", "/healthz")
    assert admin.getresponse().read() == b"ok\n"
    # From sources of their own: one source holds at most a quarter of the bound.
    held = [tcp_dns_client(m, 100 + i, source=f"127.0.8.{i + 1}") for i in range(20)]
    assert all(held), "TCP DNS refused clients within its bound"
    pid = m.proc.pid
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    # A few below what it holds: a file meridian happens to close meanwhile frees no room.
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (fds - 4, 256))
    xds = []
    waiting_dns = []
    try:
        xds = hold(m.xds_port, 5, send=PREFACE + frame(SETTINGS, 0, 0))
        # Connected by the kernel, never accepted: they wait in the backlog while accept fails.
        waiting_dns = hold(m.dns_port, 3)
        deadline = time.time() + 8
        readyz = None
        while time.time() < deadline:
            admin.request("GET", "/readyz")
            r = admin.getresponse()
            readyz = (r.status, r.read().decode())
            if readyz[0] == 503 and "listener dns_tcp" in readyz[1] and "listener xds" in readyz[1]:
                break
            time.sleep(0.5)
        assert readyz and readyz[0] == 503, readyz
        assert "listener xds" in readyz[1] and "listener dns_tcp" in readyz[1], readyz
        assert "out of file descriptors" in readyz[1], readyz
        admin.request("GET", "/metrics")
        body = admin.getresponse().read().decode()
        for listener in ("xds", "dns_tcp"):
            assert re.search(
                rf'meridian_listener_accept_errors_total\{{listener="{listener}",kind="emfile"\}} [1-9]', body
            ), [line for line in body.splitlines() if "accept" in line]
            assert re.search(rf'meridian_listener_accepting\{{listener="{listener}"\}} 0', body), listener
        # What needs no new descriptor keeps working: UDP DNS, and the TCP DNS connections
        # already open.
        r = m.query(NAME, source=FROM_EU1)
        assert [rr.address for rrset in r.answer for rr in rrset], r
        for i, s in enumerate(held[:5]):
            asks_again(s, 200 + i)
        # Past the members' unreachable and withdraw times, still out of descriptors.
        time.sleep(4)
        admin.request("GET", "/debug/clusters")
        clusters = json.loads(admin.getresponse().read())["clusters"]
        assert all(c["health"] == "Healthy" and not c["withdrawn"] for c in clusters), clusters
        r = m.query(NAME, source=FROM_EU1)
        assert [rr.address for rrset in r.answer for rr in rrset], r
        assert m.proc.poll() is None
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (256, 256))
        close_all(xds)
        close_all(waiting_dns)
    admin.close()
    log = log_text(m)
    assert "cannot accept connections; backing off and keeping the listener" in log, m.log_tail()
    assert "meridian is out of file descriptors (not the member's fault" in log, m.log_tail()
    assert 'kind="emfile"' in log or "kind=emfile" in log, m.log_tail()
    assert re.search(r"listener=.?dns_tcp.*cannot accept connections|cannot accept connections.*listener=.?dns_tcp",
                     log), m.log_tail()
    # The ports are still there and serve.
    wait_xds_listening(m)
    m.wait_for(lambda: m.http("/readyz")[0] == 200, timeout=10, what="ready again")
    watcher = Watcher(m, "after-emfile")
    alive(m, watcher)
    assert "listener accepting connections again" in log_text(m)
    for listener in ("xds", "dns_tcp"):
        assert metric(m, "meridian_listener_accepting", listener=listener) == 1, listener
    asks_again(held[-1], 300)
    close_all(held)
    members_healthy(m)
    watcher.close()


def test_tcp_dns_is_bounded_and_fair_between_sources(fleet, started):
    """TCP DNS holds at most dns.tcpMaxConnections, one source at most a quarter of them
    (issue 43: answered connections held open by one source locked every other TCP client
    out). At the bound, a new client takes the place of the quietest connection (nothing
    asked or answered for a second) of the source holding the most; while every connection
    is busy it is closed at once and counted. UDP DNS and the connections within the bound
    keep answering; once the flood is gone, new TCP clients (dnspython, dig, kdig) are
    answered."""
    bound = 20
    share = bound // 4
    m = started(fleet, "--dns-tcp-max-connections", str(bound), "--dns-tcp-idle-timeout-seconds", "60")
    assert metric(m, "meridian_listener_max_connections", listener="dns_tcp") == bound
    existing = tcp_dns_client(m, 1, source=FROM_EU1)
    assert existing
    held = []
    try:
        # One source asks on three bounds' worth of connections: it holds its share.
        for i in range(3 * bound):
            s = tcp_dns_client(m, 1000 + i, source="127.0.9.1")
            if s:
                held.append(s)
        assert metric(m, "meridian_listener_connections", listener="dns_tcp") <= 1 + share
        assert metric(m, "meridian_listener_rejected_connections_total", listener="dns_tcp") >= 1
        assert re.search(r"listener at its connection bound.*share of it.*new connections are closed at once", log_text(m))
        # Others are answered meanwhile.
        other = tcp_dns_client(m, 2, source="127.0.9.200")
        assert other, "a client of another source is answered while one source floods"
        held.append(other)
        # Three more sources fill the bound.
        for source in ("127.0.9.2", "127.0.9.3", "127.0.9.4"):
            for i in range(share):
                s = tcp_dns_client(m, 2000 + i, source=source)
                if s:
                    held.append(s)
        live = list(held)

        def busy():
            """Every held connection asks again: none is quiet (those closed are dropped)."""
            for i, s in enumerate(list(live)):
                try:
                    asks_again(s, 3000 + i)
                except Exception:  # evicted while the bound filled: closed by meridian
                    live.remove(s)
            asks_again(existing, 5)

        busy()
        assert metric(m, "meridian_listener_connections", listener="dns_tcp") == bound
        # Every connection busy: a new client is closed at once, and counted.
        rejected = metric(m, "meridian_listener_rejected_connections_total", listener="dns_tcp")
        assert tcp_dns_client(m, 4, source="127.0.9.201") is None
        assert metric(m, "meridian_listener_rejected_connections_total", listener="dns_tcp") > rejected
        # Everything else keeps answering, during the flood.
        for i in range(5):
            r = m.query(NAME, source=FROM_EU1)
            assert [rr.address for rrset in r.answer for rr in rrset], r
        healthz_fast(m)
        # Quiet for a second: a new client takes a place, from a source holding the most.
        time.sleep(1.5)
        evicted = metric(m, "meridian_listener_timeouts_total", listener="dns_tcp", kind="evicted")
        newcomer = tcp_dns_client(m, 6, source="127.0.9.202")
        assert newcomer, "a new client is answered once the held connections are quiet"
        held.append(newcomer)
        assert metric(m, "meridian_listener_timeouts_total", listener="dns_tcp", kind="evicted") == evicted + 1
        asks_again(existing, 7)  # its source holds one connection: never the one evicted
        assert metric(m, "meridian_listener_connections", listener="dns_tcp") <= bound
    finally:
        close_all(held)
    m.wait_for(lambda: metric(m, "meridian_listener_connections", listener="dns_tcp") <= 1,
               what="the flood's connections closed")
    assert m.addresses(NAME, source=FROM_EU1) == sorted(
        rr.address for rrset in m.query(NAME, source=FROM_EU1, tcp=True).answer for rr in rrset)
    asks_again(existing, 4)
    dig = subprocess.run(["dig", "@127.0.0.1", "-p", str(m.dns_port), "-b", FROM_EU1, "+tcp", "+norec",
                          "+short", "+time=3", "+tries=1", NAME], capture_output=True, text=True, timeout=20)
    assert dig.returncode == 0 and dig.stdout.split(), dig
    kdig = subprocess.run(["kdig", "@127.0.0.1", "-p", str(m.dns_port), "-b", FROM_EU1, "+tcp", "+norec",
                           "+short", "+time=3", "+retry=0", NAME], capture_output=True, text=True, timeout=20)
    assert kdig.returncode == 0 and sorted(kdig.stdout.split()) == sorted(dig.stdout.split()), kdig
    # Connections that never ask are probes: their source holds its share of them, each new
    # one evicting its oldest; real clients are answered meanwhile.
    probes = hold(m.dns_port, 2 * bound)
    try:
        for _ in range(3):
            r = m.query(NAME, source=FROM_EU1, tcp=True)
            assert [rr.address for rrset in r.answer for rr in rrset], r
        assert metric(m, "meridian_listener_timeouts_total", listener="dns_tcp", kind="evicted") >= 3
        assert metric(m, "meridian_listener_connections", listener="dns_tcp") <= bound
    finally:
        close_all(probes)
    existing.close()
    assert m.proc.poll() is None


# ---------------------------------------------------------------------------------------
# Finding 1: byte-a-second clients.


def trickle(port, data, stop_after):
    """Sends `data` a byte a second; returns the seconds until the server closed the
    connection (None if it was still open after `stop_after`)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    start = time.time()
    try:
        for b in data:
            if time.time() - start > stop_after:
                return None
            try:
                s.sendall(bytes([b]))
            except OSError:
                return time.time() - start
            s.settimeout(1)
            try:
                if s.recv(4096) == b"":
                    return time.time() - start
            except socket.timeout:
                pass
            except OSError:
                return time.time() - start
        return None
    finally:
        s.close()


def test_slowloris_is_closed_by_the_header_read_and_handshake_timeouts(fleet, started):
    m = started(fleet, "--admin-header-read-timeout-seconds", "2", "--xds-handshake-timeout-seconds", "2")
    watcher = Watcher(m, "slowloris")
    results = {}
    threads = [
        threading.Thread(target=lambda: results.__setitem__("admin", trickle(
            m.admin_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60, 15))),
        threading.Thread(target=lambda: results.__setitem__("xds", trickle(m.xds_port, PREFACE + b"x" * 40, 15))),
    ]
    for t in threads:
        t.start()
    time.sleep(1)
    alive(m, watcher)
    for t in threads:
        t.join()
    assert results["admin"] is not None and results["admin"] < 6, f"admin slowloris open for {results['admin']}"
    assert results["xds"] is not None and results["xds"] < 6, f"xDS slowloris open for {results['xds']}"
    # hyper's header-read timeout or meridian's own handshake deadline, whichever fires first.
    assert metric(m, "meridian_listener_timeouts_total", listener="admin") >= 1
    assert metric(m, "meridian_listener_timeouts_total", listener="xds", kind="handshake") >= 1
    alive(m, watcher)
    watcher.close()


# ---------------------------------------------------------------------------------------
# Finding 8: xDS.


def test_http2_stream_flood_is_refused_beyond_max_concurrent_streams(fleet, started):
    m = started(fleet, "--xds-max-concurrent-streams", "10")
    watcher = Watcher(m, "stream-flood")
    c = RawH2(m.xds_port)
    settings = None
    for _ in range(10):
        kind, flags, stream, payload = c.read_frame()
        if kind == SETTINGS and not flags & 1:
            settings = {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                        for i in range(0, len(payload), 6)}
            break
    assert settings is not None and settings.get(3) == 10, f"SETTINGS_MAX_CONCURRENT_STREAMS: {settings}"
    c.sock.sendall(frame(SETTINGS, 1, 0))  # ACK
    opened = 300
    for i in range(opened):
        c.open_ads(stream=1 + 2 * i)
    refused = 0
    deadline = time.time() + 5
    c.sock.settimeout(0.5)
    while time.time() < deadline and refused < opened - 10:
        try:
            kind, _, _, payload = c.read_frame()
        except (socket.timeout, TimeoutError):
            continue
        except ConnectionError:
            break
        if kind == RST_STREAM and int.from_bytes(payload, "big") == REFUSED_STREAM:
            refused += 1
    assert refused >= opened - 10, f"only {refused} of {opened - 10} streams over the limit were refused"
    alive(m, watcher)
    c.close()
    alive(m, watcher)
    watcher.close()


def test_an_unsupported_type_url_keeps_the_ads_stream(fleet, started):
    """An Envoy asking for SDS over the same ADS stream keeps its clusters and endpoints."""
    m = started(fleet)
    s = AdsStream(m.xds_port)
    s.send(request(CDS, node=envoy_node("asks-for-sds")))
    r = s.recv_type(CDS)
    s.send(ack(r))
    s.send(request(SDS, ["server-cert"]))
    s.send(request("type.googleapis.com/meridian.test.NoSuchThing", ["x"]))
    names = list(decode(r))
    s.send(request(EDS, names))
    eds = s.recv_type(EDS, timeout=5)
    assert decode(eds) and set(decode(eds)) <= set(names), (sorted(decode(eds)), names)
    s.send(ack(eds, names))
    watcher = Watcher(m, "bystander")
    alive(m, watcher)
    # The same stream follows a change too.
    add_service(m.fleet, "late")
    deadline = time.time() + 10
    while True:
        pushed = s.recv_type(CDS, timeout=max(0.1, deadline - time.time()))
        s.send(ack(pushed))
        if xds_fleet.resource_name("late") in decode(pushed):
            break
    import json

    clients = json.loads(m.http("/debug/xds")[1])["clients"]
    mine = [c for c in clients if (c.get("node") or {}).get("id") == "asks-for-sds"]
    assert mine and SDS in mine[0]["unsupported"], mine
    assert "ignored" in mine[0]["unsupported"][SDS]["reason"]
    assert metric(m, "meridian_xds_unsupported_type_requests_total", type_url=SDS) >= 1
    assert metric(m, "meridian_xds_unsupported_type_requests_total", type_url="other") >= 1
    assert SDS in log_text(m)
    s.close()
    watcher.close()


def test_an_oversized_node_ends_the_stream_with_resource_exhausted(fleet, started):
    m = started(fleet)
    watcher = Watcher(m, "bystander")
    n = envoy_node("huge")
    n.metadata.update({"junk": "x" * (9 << 20)})
    s = AdsStream(m.xds_port)
    s.send(request(CDS, node=n))
    ended = s.end(timeout=15)
    assert ended.code is not None and ended.code.name == "RESOURCE_EXHAUSTED", ended
    assert "8388608" in (ended.details or ""), ended.details
    s.close()
    m.wait_for(lambda: "over the size limit" in log_text(m), what="a log line naming the limit")
    assert "limit_bytes=8388608" in log_text(m)
    alive(m, watcher)
    watcher.close()


# ---------------------------------------------------------------------------------------
# Finding 9: config bounds.


def test_a_hundred_thousand_udp_workers_is_a_config_error(fleet):
    text = fleet.config.read_text()
    assert re.search(r"^dns:\n", text, re.M), text
    fleet.write("meridian.yaml", re.sub(r"^dns:\n", "dns:\n  udpWorkers: 100000\n", text, count=1, flags=re.M))
    for command in ("validate", "serve"):
        r = subprocess.run([str(BIN), command, "--config", str(fleet.config), *NO_DEFAULT_PORTS],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode not in (0, 134, -6), f"{command}: rc {r.returncode}\n{r.stderr}"
        assert "dns.udpWorkers must be between 1 and 1024 (got 100000)" in r.stderr, f"{command}: {r.stderr}"
