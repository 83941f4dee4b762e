"""Bad input on meridian's xDS port: each gets a clear error or is absorbed, and afterwards
a well-behaved client (grpcio's xDS client, xds_client.py) still follows the fleet.

The misbehaving clients are driven by hand (ads.py): DiscoveryRequests built with the Envoy
protos that xds-protos ships, sent on plain gRPC streams, and bare HTTP/2 over TCP for a
client that never reads and one that disconnects in the middle of a response.
"""

import time

import pytest

import xds_fleet
from ads import (
    CDS,
    EDS,
    GRPC_AGENT,
    LDS,
    AdsStream,
    DeltaDiscoveryRequest,
    RawH2,
    StreamEnded,
    ack,
    client_status,
    decode,
    node,
    request,
)
from ads import DATA, HEADERS, PING, SETTINGS, WINDOW_UPDATE, frame
from xds_client import XdsClient
from xds_fleet import NAMESPACE, NETWORKS, replies, resource_name, target

EU1 = replies("eu-1")
EU2 = replies("eu-2")
GREETER = resource_name("greeter")
SWITCH_TIMEOUT = 10

INVALID_ARGUMENT = "INVALID_ARGUMENT"


@pytest.fixture
def m(xds_meridian):
    return xds_meridian


@pytest.fixture
def bystander(m, xds_clients, tmp_path):
    """A well-behaved grpcio xDS client in eu-1, running through the whole test."""
    client = xds_clients(XdsClient.python(tmp_path, "bystander", m.xds_port, [target()], "eu-1", "n1"))
    client.wait_serving(EU1, timeout=30)
    return client


@pytest.fixture
def streams():
    opened = []

    def open_stream(m, **kw):
        s = AdsStream(m.xds_port, **kw)
        opened.append(s)
        return s

    yield open_stream
    for s in opened:
        s.close()


def still_converges(m, bystander, xds_clients, tmp_path):
    """meridian is up, the bystander follows an edit and its undoing, a new client starts."""
    assert m.proc.poll() is None, f"meridian exited with {m.proc.returncode}\n{m.log_tail()}"
    fleet = m.fleet
    edited = time.time()
    xds_fleet.set_endpoints(fleet, "eu-1", ready=False)
    bystander.wait_serving(EU2, since=edited, timeout=SWITCH_TIMEOUT)
    edited = time.time()
    xds_fleet.set_endpoints(fleet, "eu-1")
    bystander.wait_serving(EU1, since=edited, timeout=SWITCH_TIMEOUT)
    fresh = xds_clients(XdsClient.python(tmp_path, f"fresh-{time.time_ns()}", m.xds_port, [target()], "eu-2", "n1"))
    fresh.wait_serving(EU2, timeout=30)
    panics = [line for line in m.log.read_text().splitlines() if "panic" in line.lower()]
    assert not panics, f"meridian logged a panic: {panics[:3]}"


def envoy_node(name="bad-client", cluster="eu-1"):
    return node(name, cluster, NETWORKS[cluster])


def subscribe_cds(stream, n=None):
    """Wildcard CDS on a fresh stream; returns the first response (not yet ACKed)."""
    stream.send(request(CDS, node=n or envoy_node()))
    r = stream.recv_type(CDS)
    assert GREETER in decode(r), f"CDS without {GREETER}: {sorted(decode(r))}"
    return r


def meridian_rss_kib(m):
    for line in open(f"/proc/{m.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# ---------------------------------------------------------------------------------------
# Requests the server must refuse or ignore.


def test_first_message_without_a_node_ends_the_stream(m, bystander, streams, xds_clients, tmp_path):
    for first in (request(CDS), request(LDS, [GREETER]), request(EDS, [GREETER], version="1", nonce="1")):
        s = streams(m)
        s.send(first)
        # A node in the second message does not make up for it.
        s.send(request(CDS, node=envoy_node()))
        ended = s.end(timeout=5)
        assert ended.code is not None and ended.code.name == INVALID_ARGUMENT, f"{first.type_url}: {ended}"
        assert "node" in (ended.details or "").lower(), f"the status does not say why: {ended.details!r}"
    # Delta streams too.
    s = streams(m, delta=True)
    s.send(DeltaDiscoveryRequest(type_url=CDS, resource_names_subscribe=[GREETER]))
    ended = s.end(timeout=5)
    assert ended.code is not None and ended.code.name == INVALID_ARGUMENT, f"delta: {ended}"
    assert "node" in (ended.details or "").lower(), f"the status does not say why: {ended.details!r}"
    still_converges(m, bystander, xds_clients, tmp_path)


UNKNOWN_TYPES = [
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",  # real, not served
    "type.googleapis.com/meridian.test.NoSuchThing",
    "not a type url at all",
]


@pytest.mark.parametrize("type_url", UNKNOWN_TYPES)
def test_unknown_type_url_is_ignored_and_the_stream_stays(m, bystander, streams, xds_clients, tmp_path, type_url):
    """meridian ignores a type it does not serve, as go-control-plane does (issue 19: an
    Envoy asking for SDS over its ADS stream lost its clusters when the stream was ended):
    no response, the stream stays open and the served types keep flowing; the request is
    logged and shown on /debug/xds."""
    # As the first request of a stream: the node counts, CDS works afterwards.
    s = streams(m)
    s.send(request(type_url, ["x"], node=envoy_node()))
    assert s.quiet(1.0) == [], "a response to a type meridian does not serve"
    r = subscribe_cds(s, envoy_node("after-unknown-first"))
    s.send(ack(r))
    # In the middle of a good stream, after an ACK: the next change still arrives.
    s2 = streams(m)
    r2 = subscribe_cds(s2)
    s2.send(ack(r2))
    s2.send(request(type_url, ["x"]))
    assert s2.quiet(1.0) == []
    xds_fleet.add_service(m.fleet, "greeter2")
    pushed = s2.recv_type(CDS, timeout=SWITCH_TIMEOUT)
    assert resource_name("greeter2") in decode(pushed)
    s2.send(ack(pushed))
    # On a delta stream.
    s3 = streams(m, delta=True)
    s3.send(DeltaDiscoveryRequest(type_url=type_url, node=envoy_node(), resource_names_subscribe=["x"]))
    s3.send(DeltaDiscoveryRequest(type_url=CDS))
    got = s3.recv(timeout=5)
    assert got.type_url == CDS, got.type_url
    logged = [line for line in m.log.read_text().splitlines() if type_url in line]
    assert logged, f"meridian ignored {type_url!r} without saying so in its log\n{m.log_tail()}"
    still_converges(m, bystander, xds_clients, tmp_path)


def test_nonce_from_nowhere_is_ignored(m, bystander, streams, xds_clients, tmp_path):
    s = streams(m)
    r = subscribe_cds(s)
    s.send(ack(r))
    assert s.quiet(1.0) == [], "a response to an ACK"
    # A request carrying a nonce the server never sent, as an ACK and as a NACK.
    s.send(request(CDS, version="v-from-nowhere", nonce="nonce-from-nowhere"))
    s.send(request(CDS, version=r.version_info, nonce="nonce-from-nowhere", error="rejected, says the client"))
    s.send(request(CDS, version=r.version_info, nonce=r.nonce + "x"))
    got = s.quiet(1.5)
    assert got == [], f"responses to requests with unknown nonces: {[(x.version_info, x.nonce) for x in got]}"
    # The stream still follows the fleet: a new service comes in a push with a new nonce.
    xds_fleet.add_service(m.fleet, "greeter2")
    pushed = s.recv_type(CDS, timeout=SWITCH_TIMEOUT)
    assert resource_name("greeter2") in decode(pushed)
    assert pushed.nonce not in (r.nonce, "nonce-from-nowhere")
    assert pushed.version_info != r.version_info
    s.send(ack(pushed))
    still_converges(m, bystander, xds_clients, tmp_path)


def test_megabyte_error_detail_is_absorbed(m, bystander, streams, xds_clients, tmp_path):
    s = streams(m)
    r = subscribe_cds(s)
    big = "x" * (1 << 20)
    # A NACK of the first response, with a 1 MiB message.
    s.send(request(CDS, version="", nonce=r.nonce, error=big))
    got = s.quiet(1.5)
    assert got == [], "a NACK is answered by the next change, not by resending what was rejected"
    long_lines = [len(line) for line in m.log.read_text().splitlines() if len(line) > 64 << 10]
    assert not long_lines, f"the 1 MiB error_detail went into the log whole (lines of {long_lines} bytes)"
    # Still a working stream: the next change arrives and is ACKed.
    xds_fleet.add_service(m.fleet, "greeter2")
    pushed = s.recv_type(CDS, timeout=SWITCH_TIMEOUT)
    assert resource_name("greeter2") in decode(pushed)
    s.send(ack(pushed))
    # Many of them, on many streams.
    for i in range(5):
        s2 = streams(m)
        r2 = subscribe_cds(s2, envoy_node(f"nacker-{i}"))
        s2.send(request(CDS, nonce=r2.nonce, error=big))
    # CSDS reports the NACK, with the detail cut short.
    deadline = time.time() + 5
    while True:
        status = client_status(m.xds_port, "nacker-4")
        cds = {name: st for (kind, name), st in status.items() if kind == "CDS"}
        if (cds and all(st[0] == "NACKED" for st in cds.values())) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert GREETER in cds and cds[GREETER][:2] == ("NACKED", "ERROR"), cds.get(GREETER)
    detail = cds[GREETER][2]
    assert detail.startswith("xxxx") and len(detail) <= 4096, f"CSDS error detail of {len(detail)} bytes"
    still_converges(m, bystander, xds_clients, tmp_path)


def test_a_hundred_thousand_resource_names(m, bystander, streams, xds_clients, tmp_path):
    names = [f"svc-{i:06d}.{NAMESPACE}.global:50051" for i in range(100_000)]
    s = streams(m)
    r = subscribe_cds(s)
    s.send(ack(r))
    rss_before = meridian_rss_kib(m)
    start = time.time()
    s.send(request(EDS, names + [GREETER]))
    try:
        eds = s.recv_type(EDS, timeout=10)
    except StreamEnded as ended:
        assert ended.code is not None and ended.code.name == "RESOURCE_EXHAUSTED", ended
        print(f"\nMEASURED: 100,000 names: RESOURCE_EXHAUSTED ({ended.details}) after {time.time() - start:.2f}s")
    else:
        # Absorbed: the one that exists is served, the others are not invented.
        assert list(decode(eds)) == [GREETER], sorted(decode(eds))[:5]
        print(f"\nMEASURED: 100,000 names: EDS answered in {time.time() - start:.2f}s, "
              f"RSS {rss_before} -> {meridian_rss_kib(m)} KiB")
        s.send(ack(eds, names + [GREETER]))
        # A change still reaches this stream.
        xds_fleet.set_endpoints(m.fleet, "eu-1", ready=False)
        pushed = s.recv_type(EDS, timeout=SWITCH_TIMEOUT)
        assert list(decode(pushed)) == [GREETER]
        s.send(ack(pushed, names + [GREETER]))
        xds_fleet.set_endpoints(m.fleet, "eu-1")
        pushed = s.recv_type(EDS, timeout=SWITCH_TIMEOUT)
        s.send(ack(pushed, names + [GREETER]))
    # The same as a grpc node, on LDS.
    s = streams(m)
    s.send(request(LDS, names, node=node("many-names", "eu-1", "n1", user_agent=GRPC_AGENT)))
    try:
        got = s.quiet(3)
        assert all(not decode(x) for x in got if x.type_url == LDS), "listeners for names that do not exist"
    except StreamEnded as ended:
        assert ended.code is not None and ended.code.name == "RESOURCE_EXHAUSTED", ended
    still_converges(m, bystander, xds_clients, tmp_path)


# ---------------------------------------------------------------------------------------
# Slow and vanishing clients, on bare HTTP/2.


def bulk_service(fleet, count, version=0):
    """Service demo/bulk in eu-2 with `count` endpoints: an EDS response of count * ~50 bytes.
    `version` changes one endpoint, so each call makes a new push."""
    ips = [f"127.3.{i // 250}.{i % 250 + 1}" for i in range(count)]
    ips[0] = f"127.4.0.{version % 250 + 1}"
    fleet.write("clusters/eu-2/bulk.yaml", xds_fleet.service_yaml("bulk"))
    fleet.write("clusters/eu-2/bulk-slice.yaml", xds_fleet.slice_yaml("eu-2", "bulk", ips))


BULK = resource_name("bulk")


def raw_ads(m, names, window=None, rcvbuf=None, cluster="eu-1"):
    """A bare HTTP/2 connection with one ADS stream subscribed to CDS (wildcard) and to EDS
    for `names`."""
    c = RawH2(m.xds_port, window=window, rcvbuf=rcvbuf)
    c.open_ads()
    c.send_request(request(CDS, node=envoy_node(f"raw-{time.time_ns()}", cluster)))
    c.send_request(request(EDS, names))
    return c


def test_clients_that_never_read(m, bystander, xds_clients, tmp_path):
    """Clients that open a stream, subscribe, and then never read a byte (HTTP/2 window 0 and a
    tiny socket buffer): the pushes to them cannot go out. Everyone else is still served on time."""
    bulk_service(m.fleet, 4000)
    time.sleep(1)
    stuck = [raw_ads(m, [GREETER, BULK], window=0 if i % 2 else None, rcvbuf=4096) for i in range(20)]
    try:
        rss_before = meridian_rss_kib(m)
        slowest = 0.0
        for version in range(1, 21):
            bulk_service(m.fleet, 4000, version)
            if version % 5 == 0:
                # The bystander follows a change while the pushes to the stuck clients pile up.
                edited = time.time()
                eu1_ready = version % 10 == 0
                xds_fleet.set_endpoints(m.fleet, "eu-1", ready=eu1_ready)
                switched = bystander.wait_serving(EU1 if eu1_ready else EU2, since=edited, timeout=SWITCH_TIMEOUT)
                slowest = max(slowest, switched - edited)
            time.sleep(0.3)
        xds_fleet.set_endpoints(m.fleet, "eu-1")
        bystander.wait_serving(EU1, timeout=SWITCH_TIMEOUT)
        rss_after = meridian_rss_kib(m)
        print(f"\nMEASURED: 20 clients that never read, 20 pushes of ~200 KB: bystander switched in <= {slowest:.2f}s, "
              f"RSS {rss_before} -> {rss_after} KiB")
        still_converges(m, bystander, xds_clients, tmp_path)
    finally:
        for c in stuck:
            c.close()
    still_converges(m, bystander, xds_clients, tmp_path)


def read_until_data(c, min_bytes):
    """Reads frames, answering SETTINGS and PINGs, until `min_bytes` of DATA came in."""
    got = 0
    while got < min_bytes:
        kind, flags, stream, payload = c.read_frame()
        if kind == SETTINGS and not flags & 1:
            c.sock.sendall(frame(SETTINGS, 1, 0))
        elif kind == PING and not flags & 1:
            c.sock.sendall(frame(PING, 1, 0, payload))
        elif kind == DATA:
            got += len(payload)
        elif kind == HEADERS and flags & 1:
            raise AssertionError(f"the stream ended early (trailers {payload!r})")
    return got


def test_disconnect_in_the_middle_of_a_push(m, bystander, xds_clients, tmp_path):
    """Clients that reset the connection half-way through a large EDS response, at startup and
    while pushes are going out; and grpcio clients killed in the middle of pushes."""
    bulk_service(m.fleet, 20000)  # ~1 MB of EDS
    time.sleep(1)
    for i in range(10):
        c = raw_ads(m, [BULK], window=1 << 24)
        c.sock.sendall(frame(WINDOW_UPDATE, 0, 0, (1 << 24).to_bytes(4, "big")))
        read_until_data(c, 1000 + i * 20000)
        c.abort()
    # Pushes under way: a burst of edits, connections reset while they go out.
    waiting = []
    for i in range(10):
        c = raw_ads(m, [BULK], window=1 << 24)
        c.sock.sendall(frame(WINDOW_UPDATE, 0, 0, (1 << 24).to_bytes(4, "big")))
        waiting.append(c)
    for version in range(1, 6):
        bulk_service(m.fleet, 20000, version)
        time.sleep(0.15)
        c = waiting.pop()
        read_until_data(c, 5000)
        c.abort()
        c = waiting.pop()
        c.abort()  # without reading anything
    # grpcio xDS clients killed (SIGKILL) while their updates go out.
    victims = [
        xds_clients(XdsClient.python(tmp_path, f"victim-{i}", m.xds_port, [target()], "eu-2", "n1"))
        for i in range(4)
    ]
    for v in victims:
        v.wait_serving(EU2, timeout=30)
    for i, v in enumerate(victims):
        xds_fleet.set_endpoints(m.fleet, "eu-2", ready=i % 2 == 0)
        time.sleep(0.1 * i)
        v.proc.kill()
    xds_fleet.set_endpoints(m.fleet, "eu-2")
    still_converges(m, bystander, xds_clients, tmp_path)
