"""DESIGN §4 (DNS), checked on the wire against a running `meridian serve`.

Every name form and every protocol rule of §4 is asked with real DNS clients: dnspython
(from chosen source addresses, which is how meridian tells client clusters apart), raw
bytes for what no client library sends, and the `dig` and `kdig` command-line clients.

The quickstart fleet (examples/quickstart/): eu-1 and eu-2 (region eu, network n1), us-1
(region us, network n2, east-west gateway 127.0.3.100:15443). shop/payments is exported by
all three (two ready endpoints and one terminating in each), shop/db is headless (eu-1:
db-0, db-1; us-1: db-0), shop/cart is dual-stack in eu-2 only, eu-2 imports payments with the
ClusterSetIP 10.96.200.10, and shop/internal is not exported.
"""

import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.query
import dns.rcode
import dns.rdatatype
import dns.update
import dns.xfr
import dns.zone
import pytest

from conftest import (
    FROM_EU1,
    FROM_EU2,
    FROM_UNKNOWN,
    FROM_US1,
    QUICKSTART,
    Fleet,
    Meridian,
    require_tool,
)

# ---------------------------------------------------------------------------------------
# The quickstart's answers.

EU1 = ["127.1.1.1", "127.1.1.2"]
EU2 = ["127.1.2.1", "127.1.2.2"]
US1 = ["127.1.3.1", "127.1.3.2"]
ALL_PAYMENTS = sorted(EU1 + EU2 + US1)
TERMINATING = {"127.1.1.3", "127.1.2.3", "127.1.3.3"}
GATEWAY_US1 = "127.0.3.100"
GATEWAY_PORT = 15443
CLUSTERSET_IP = "10.96.200.10"
TTL = 5

NOERROR = dns.rcode.NOERROR
NXDOMAIN = dns.rcode.NXDOMAIN
SERVFAIL = dns.rcode.SERVFAIL
REFUSED = dns.rcode.REFUSED
FORMERR = dns.rcode.FORMERR
NOTIMP = dns.rcode.NOTIMP

A = dns.rdatatype.A
AAAA = dns.rdatatype.AAAA
SRV = dns.rdatatype.SRV
SOA = dns.rdatatype.SOA
NS = dns.rdatatype.NS
TXT = dns.rdatatype.TXT
HINFO = dns.rdatatype.HINFO
OPT = dns.rdatatype.OPT


# ---------------------------------------------------------------------------------------
# Fixtures and helpers.


@pytest.fixture(scope="module")
def qs(tmp_path_factory):
    """One meridian on an untouched quickstart copy, shared by the read-only tests."""
    root = tmp_path_factory.mktemp("qs") / "fleet"
    shutil.copytree(QUICKSTART, root)
    m = Meridian(Fleet(root))
    yield m
    m.stop()


def ask(m, name, rdtype="A", source=FROM_UNKNOWN, tcp=False, **kw):
    """A query with RD clear (Meridian.query); keyword arguments go to make_query."""
    return m.query(name, rdtype, source=source, tcp=tcp, **kw)


def ask_edns(m, name, rdtype="A", source=FROM_UNKNOWN, tcp=False, payload=1232, options=None):
    return m.query(name, rdtype, source=source, tcp=tcp, use_edns=0, payload=payload, options=options or [])


def records(r, rdtype, section="answer"):
    """Every rdata of a type in a section."""
    return [rd for rrset in getattr(r, section) if rrset.rdtype == rdtype for rd in rrset]


def rrsets(r, rdtype, section="answer"):
    return [rrset for rrset in getattr(r, section) if rrset.rdtype == rdtype]


def addrs(r, rdtype=A):
    return sorted(rd.address for rd in records(r, rdtype))


def in_order(r, rdtype=A):
    return [rd.address for rd in records(r, rdtype)]


def name(text):
    return dns.name.from_text(text)


def assert_authoritative(r):
    assert r.flags & dns.flags.QR, "not a response"
    assert r.flags & dns.flags.AA, f"AA clear in an authoritative answer:\n{r}"
    assert not r.flags & dns.flags.RA, f"RA set, but meridian does not recurse:\n{r}"


def assert_positive(r, rdtype=A, ttl=TTL):
    assert r.rcode() == NOERROR, f"expected NOERROR, got {dns.rcode.to_text(r.rcode())}:\n{r}"
    assert_authoritative(r)
    assert not r.flags & dns.flags.TC
    assert r.authority == [], f"a positive answer carries no authority section:\n{r}"
    assert r.answer, f"expected answers:\n{r}"
    for rrset in r.answer:
        assert rrset.rdtype == rdtype, f"unexpected {dns.rdatatype.to_text(rrset.rdtype)} in the answer:\n{r}"
        assert rrset.ttl == ttl, f"TTL {rrset.ttl}, expected {ttl}:\n{r}"
        assert rrset.name == r.question[0].name


def assert_negative(r, rcode, zone="global.", ttl=TTL):
    """NXDOMAIN or NODATA, exactly: no answer, the zone's SOA alone in authority."""
    assert r.rcode() == rcode, (
        f"expected {dns.rcode.to_text(rcode)}, got {dns.rcode.to_text(r.rcode())} for {r.question[0]}:\n{r}"
    )
    assert_authoritative(r)
    assert r.answer == [], f"a negative answer has no answer section:\n{r}"
    assert len(r.authority) == 1, f"expected exactly the SOA in authority:\n{r}"
    soa_set = r.authority[0]
    assert soa_set.rdtype == SOA and soa_set.name == name(zone), f"expected the SOA of {zone}:\n{r}"
    assert len(soa_set) == 1
    assert soa_set[0].minimum == ttl, f"SOA minimum {soa_set[0].minimum}, expected the TTL {ttl}"
    assert soa_set.ttl == ttl


def serial(m, zone="global."):
    r = ask(m, zone, "SOA")
    assert r.rcode() == NOERROR
    return records(r, SOA)[0].serial


def udp_raw(m, data, source=FROM_UNKNOWN, timeout=1.0):
    """Sends raw bytes over UDP; returns the reply bytes, or None when none comes."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((source, 0))
        s.settimeout(timeout)
        s.sendto(data, ("127.0.0.1", m.dns_port))
        try:
            return s.recv(65535)
        except socket.timeout:
            return None
    finally:
        s.close()


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def tcp_connect(m, source=FROM_UNKNOWN, timeout=5):
    return socket.create_connection(("127.0.0.1", m.dns_port), timeout=timeout, source_address=(source, 0))


def tcp_read_message(s):
    (length,) = struct.unpack("!H", recv_exact(s, 2))
    return recv_exact(s, length)


def tcp_raw(m, wires, source=FROM_UNKNOWN):
    """Sends every message back to back on one connection, then reads as many replies."""
    s = tcp_connect(m, source)
    try:
        s.sendall(b"".join(struct.pack("!H", len(w)) + w for w in wires))
        return [tcp_read_message(s) for _ in wires]
    finally:
        s.close()


def query_wire(qname, rdtype="A", qid=0x4242, edns_payload=None):
    if edns_payload:
        q = dns.message.make_query(qname, rdtype, use_edns=0, payload=edns_payload)
    else:
        q = dns.message.make_query(qname, rdtype)
        assert q.edns < 0
    q.id = qid
    q.flags &= ~dns.flags.RD
    return q.to_wire()


def metrics(m):
    """{(metric name, frozenset of labels): value} from /metrics."""
    status, body = m.http("/metrics")
    assert status == 200
    out = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        mt = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$", line)
        if not mt:
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', mt.group(2) or ""))
        out[(mt.group(1), labels)] = float(mt.group(3))
    return out


def metric(snapshot, metric_name, **labels):
    return snapshot.get((metric_name, frozenset(labels.items())), 0.0)


def run(cmd, timeout=20):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def dig(m, *args, source=FROM_UNKNOWN):
    exe = require_tool("dig")
    p = run([exe, "@127.0.0.1", "-p", str(m.dns_port), "-b", source, "+norec", "+time=3", "+tries=1", *args])
    return p.stdout


def kdig(m, *args, source=FROM_UNKNOWN):
    exe = require_tool("kdig")
    p = run([exe, "@127.0.0.1", "-p", str(m.dns_port), "-b", source, "+norec", "+time=3", "+retry=0", *args])
    return p.stdout


def short_lines(out):
    return sorted(line.strip() for line in out.splitlines() if line.strip() and not line.startswith(";"))


def slice_yaml(service, endpoints, port_name="http", port=8080, address_type="IPv4", slice_name=None):
    """An EndpointSlice manifest; endpoints are (address, extra-yaml-fields) pairs or addresses."""
    lines = [
        "apiVersion: discovery.k8s.io/v1",
        "kind: EndpointSlice",
        f"metadata: {{name: {slice_name or service + '-x'}, namespace: shop, labels: {{kubernetes.io/service-name: {service}}}}}",
        f"addressType: {address_type}",
        f"ports: [{{name: {port_name}, port: {port}, protocol: TCP}}]" if port_name else f"ports: [{{port: {port}, protocol: TCP}}]",
        "endpoints:",
    ]
    for ep in endpoints:
        address, extra = (ep, "") if isinstance(ep, str) else ep
        lines.append(f"  - {{addresses: [\"{address}\"]{', ' + extra if extra else ''}}}")
    return "\n".join(lines) + "\n"


def exported_service_yaml(service, port_name="http", port=80, headless=False):
    ports = f"[{{name: {port_name}, port: {port}, protocol: TCP}}]" if port_name else f"[{{port: {port}, protocol: TCP}}]"
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata: {{name: {service}, namespace: shop}}\n"
        f"spec: {{ports: {ports}{', clusterIP: None' if headless else ''}}}\n"
        "---\n"
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\n"
        f"metadata: {{name: {service}, namespace: shop}}\n"
        "---\n"
    )


def big_service(fleet, cluster, service, count, base="127.2"):
    """An exported service with `count` ready endpoints, to overflow a UDP answer."""
    endpoints = [f"{base}.{i // 250}.{i % 250 + 1}" for i in range(count)]
    fleet.write(f"clusters/{cluster}/{service}.yaml", exported_service_yaml(service) + slice_yaml(service, endpoints))
    return sorted(endpoints)


# ---------------------------------------------------------------------------------------
# A/AAAA: the first tier for the client's cluster.


def test_first_tier_by_source_address(qs):
    for source, expected in [(FROM_EU1, EU1), (FROM_EU2, EU2), (FROM_US1, US1)]:
        r = ask(qs, "payments.shop.global", source=source)
        assert_positive(r)
        assert addrs(r) == expected, f"client {source}"
        # Another address of the same /24 is the same cluster.
        assert addrs(ask(qs, "payments.shop.global", source=source[:-1] + "200")) == expected


def test_unknown_client_gets_every_ready_endpoint(qs):
    r = ask(qs, "payments.shop.global", source=FROM_UNKNOWN)
    assert_positive(r)
    assert addrs(r) == ALL_PAYMENTS
    r = ask(qs, "payments.shop.global", source=FROM_UNKNOWN, tcp=True)
    assert_positive(r)
    assert addrs(r) == ALL_PAYMENTS


def test_query_name_case_is_preserved_and_ignored(qs):
    r = ask(qs, "PayMents.SHOP.global", source=FROM_EU1)
    assert_positive(r)
    assert addrs(r) == EU1
    assert r.question[0].name.to_text() == "PayMents.SHOP.global."
    assert r.answer[0].name.to_text().lower() == "payments.shop.global."


def test_ecs_overrides_the_source_address_and_scope_is_echoed(qs):
    cases = [
        (FROM_UNKNOWN, "127.0.1.0", 24, EU1),
        (FROM_EU1, "127.0.3.0", 24, US1),
        (FROM_US1, "127.0.2.77", 32, EU2),
    ]
    for source, subnet, prefix, expected in cases:
        for tcp in (False, True):
            ecs = dns.edns.ECSOption(subnet, prefix)
            r = ask_edns(qs, "payments.shop.global", source=source, tcp=tcp, options=[ecs])
            assert_positive(r)
            assert addrs(r) == expected, f"ECS {subnet}/{prefix} from {source} (tcp={tcp})"
            echoed = [o for o in r.options if isinstance(o, dns.edns.ECSOption)]
            assert len(echoed) == 1, f"ECS not echoed:\n{r}"
            assert echoed[0].address == subnet
            assert echoed[0].srclen == prefix
            assert echoed[0].scopelen == prefix, f"scope {echoed[0].scopelen}, expected {prefix}"
    # An ECS naming no cluster makes the client unknown, wherever it sits.
    r = ask_edns(qs, "payments.shop.global", source=FROM_EU1, options=[dns.edns.ECSOption("10.9.9.0", 24)])
    assert addrs(r) == ALL_PAYMENTS
    # Source prefix 0 (RFC 7871 §7.1.2): the source address decides, and scope 0 is echoed.
    r = ask_edns(qs, "payments.shop.global", source=FROM_US1, options=[dns.edns.ECSOption("0.0.0.0", 0)])
    assert addrs(r) == US1
    echoed = [o for o in r.options if isinstance(o, dns.edns.ECSOption)]
    assert len(echoed) == 1 and echoed[0].scopelen == 0


def test_ecs_with_kdig(qs):
    out = kdig(qs, "+subnet=127.0.3.0/24", "payments.shop.global", "A", source=FROM_EU1)
    assert "status: NOERROR" in out, out
    assert "CLIENT-SUBNET: 127.0.3.0/24/24" in out, out
    answers = sorted(re.findall(r"^payments\.shop\.global\.\s+\d+\s+IN\s+A\s+(\S+)$", out, re.M))
    assert answers == US1, out


def test_terminating_and_not_ready_endpoints_are_never_answered(fleet, start_meridian):
    # eu-1 gets a not-ready endpoint as well (ready: false, not terminating) and one that is
    # serving but not ready.
    path = fleet.cluster_dir("eu-1") / "payments.yaml"
    text = path.read_text().replace(
        "  - addresses: [127.1.1.3]",
        "  - addresses: [127.1.1.4]\n    conditions: {ready: false}\n"
        "  - addresses: [127.1.1.5]\n    conditions: {ready: false, serving: true, terminating: false}\n"
        "  - addresses: [127.1.1.3]",
    )
    fleet.write("clusters/eu-1/payments.yaml", text)
    m = start_meridian(fleet)
    never = TERMINATING | {"127.1.1.4", "127.1.1.5"}
    for source in (FROM_EU1, FROM_UNKNOWN):
        for tcp in (False, True):
            got = addrs(ask(m, "payments.shop.global", source=source, tcp=tcp))
            assert not set(got) & never, f"not-ready endpoints answered to {source}: {got}"
    assert addrs(ask(m, "payments.shop.global", source=FROM_EU1)) == EU1
    assert addrs(ask(m, "eu-1.payments.shop.global")) == EU1
    r = ask(m, "_http._tcp.payments.shop.global", "SRV")
    targets = {rd.target.to_text() for rd in records(r, SRV)}
    additional = {rd.address for rd in records(r, A, "additional")}
    assert not additional & never
    for host in ("127-1-1-3", "127-1-1-4", "127-1-1-5"):
        assert f"{host}.eu-1.payments.shop.global." not in targets
        assert_negative(ask(m, f"{host}.eu-1.payments.shop.global"), NXDOMAIN)
    for host in ("127-1-1-1", "127-1-1-2"):
        assert f"{host}.eu-1.payments.shop.global." in targets


def test_dual_stack_a_and_aaaa(qs):
    for source in (FROM_UNKNOWN, FROM_EU2, FROM_EU1):
        r = ask(qs, "cart.shop.global", "A", source=source)
        assert_positive(r, A)
        assert addrs(r) == ["127.1.2.21"]
        r = ask(qs, "cart.shop.global", "AAAA", source=source)
        assert_positive(r, AAAA)
        assert addrs(r, AAAA) == ["fd00:1:2::21"]
    assert addrs(ask(qs, "eu-2.cart.shop.global", "AAAA"), AAAA) == ["fd00:1:2::21"]
    # An IPv4-only service has no AAAA: NODATA.
    assert_negative(ask(qs, "payments.shop.global", "AAAA"), NOERROR)
    # us-1 sits on network n2 and eu-2 (n1) has no gateway: nothing reachable, NODATA.
    assert_negative(ask(qs, "cart.shop.global", "A", source=FROM_US1), NOERROR)
    assert_negative(ask(qs, "cart.shop.global", "AAAA", source=FROM_US1), NOERROR)


def test_dig_and_kdig_agree_on_the_first_tier(qs):
    out = dig(qs, "payments.shop.global", "A", "+short", source=FROM_EU1)
    assert short_lines(out) == EU1, out
    out = dig(qs, "payments.shop.global", "A", source=FROM_US1)
    assert re.search(r"status: NOERROR", out), out
    flags = re.search(r";; flags: ([a-z ]+);", out).group(1).split()
    assert "aa" in flags and "ra" not in flags and "qr" in flags, out
    out = kdig(qs, "payments.shop.global", "A", "+short", source=FROM_EU2)
    assert short_lines(out) == EU2, out
    out = kdig(qs, "cart.shop.global", "AAAA", "+short", source=FROM_EU2)
    assert short_lines(out) == ["fd00:1:2::21"], out


# ---------------------------------------------------------------------------------------
# Per-cluster and hostname names.


def test_per_cluster_names(qs):
    for cluster, expected in [("eu-1", EU1), ("eu-2", EU2), ("us-1", US1)]:
        for source in (FROM_UNKNOWN, FROM_EU2 if cluster != "us-1" else FROM_US1):
            r = ask(qs, f"{cluster}.payments.shop.global", source=source)
            assert_positive(r)
            assert addrs(r) == expected, f"{cluster}.payments from {source}"
    # A cluster that does not export the service, and one that does not exist.
    assert_negative(ask(qs, "eu-2.db.shop.global"), NXDOMAIN)
    assert_negative(ask(qs, "eu-3.payments.shop.global"), NXDOMAIN)
    # The name exists; other types are NODATA.
    assert_negative(ask(qs, "eu-1.payments.shop.global", "TXT"), NOERROR)
    assert_negative(ask(qs, "eu-1.payments.shop.global", "AAAA"), NOERROR)


def test_gateway_answers_a_client_on_another_network(qs):
    r = ask(qs, "us-1.payments.shop.global", source=FROM_EU1)
    assert_positive(r)
    assert addrs(r) == [GATEWAY_US1]
    r = ask(qs, "us-1.payments.shop.global", source=FROM_EU1, tcp=True)
    assert addrs(r) == [GATEWAY_US1]
    # Same network, or an unknown client: the endpoints.
    assert addrs(ask(qs, "us-1.payments.shop.global", source=FROM_US1)) == US1
    assert addrs(ask(qs, "us-1.payments.shop.global", source=FROM_UNKNOWN)) == US1


def test_gateway_is_one_address_per_cluster_in_the_first_tier(fleet, start_meridian):
    # shop/ledger lives in us-1 only, with three endpoints.
    fleet.write(
        "clusters/us-1/ledger.yaml",
        exported_service_yaml("ledger") + slice_yaml("ledger", ["127.1.3.41", "127.1.3.42", "127.1.3.43"]),
    )
    m = start_meridian(fleet)
    for source in (FROM_EU1, FROM_EU2):
        r = ask(m, "ledger.shop.global", source=source)
        assert_positive(r)
        assert addrs(r) == [GATEWAY_US1], f"a client on n1 gets the gateway once: {r}"
        r = ask(m, "_http._tcp.ledger.shop.global", "SRV", source=source)
        srv = records(r, SRV)
        assert [(rd.priority, rd.port, rd.target.to_text()) for rd in srv] == [(0, GATEWAY_PORT, "us-1.ledger.shop.global.")]
    assert addrs(ask(m, "ledger.shop.global", source=FROM_US1)) == ["127.1.3.41", "127.1.3.42", "127.1.3.43"]
    assert addrs(ask(m, "ledger.shop.global", source=FROM_UNKNOWN)) == ["127.1.3.41", "127.1.3.42", "127.1.3.43"]


def test_headless_hostname_names(qs):
    for host, expected in [
        ("db-0.eu-1", "127.1.1.11"),
        ("db-1.eu-1", "127.1.1.12"),
        ("db-0.us-1", "127.1.3.11"),
    ]:
        for source in (FROM_UNKNOWN, FROM_EU1, FROM_US1):
            r = ask(qs, f"{host}.db.shop.global", source=source)
            assert_positive(r)
            assert addrs(r) == [expected], f"{host} from {source}"
    r = ask(qs, "DB-0.EU-1.db.shop.global")
    assert addrs(r) == ["127.1.1.11"]
    assert_negative(ask(qs, "db-1.us-1.db.shop.global"), NXDOMAIN)
    assert_negative(ask(qs, "db-0.eu-2.db.shop.global"), NXDOMAIN)
    assert_negative(ask(qs, "db-9.eu-1.db.shop.global"), NXDOMAIN)
    assert_negative(ask(qs, "db-0.eu-1.db.shop.global", "AAAA"), NOERROR)
    # The service name itself: the first tier.
    assert addrs(ask(qs, "db.shop.global", source=FROM_EU1)) == ["127.1.1.11", "127.1.1.12"]
    assert addrs(ask(qs, "db.shop.global", source=FROM_US1)) == ["127.1.3.11"]
    assert addrs(ask(qs, "db.shop.global", source=FROM_EU2)) == ["127.1.1.11", "127.1.1.12"]
    assert addrs(ask(qs, "db.shop.global")) == ["127.1.1.11", "127.1.1.12", "127.1.3.11"]
    assert short_lines(dig(qs, "db-1.eu-1.db.shop.global", "+short")) == ["127.1.1.12"]


# ---------------------------------------------------------------------------------------
# SRV.


def check_srv_targets_resolve(m, r, source):
    """Every SRV target resolves (for the same client) to the address in the additional
    section; returns {target: address}."""
    additional = {}
    for rrset in r.additional:
        if rrset.rdtype in (A, AAAA):
            assert rrset.name.to_text() not in additional, f"{rrset.name} twice in additional"
            additional[rrset.name.to_text()] = sorted(rd.address for rd in rrset)
    for rd in records(r, SRV):
        target = rd.target.to_text()
        assert target in additional, f"no address for {target} in the additional section:\n{r}"
        rtype = "AAAA" if ":" in additional[target][0] else "A"
        got = ask(m, target, rtype, source=source)
        assert_positive(got, A if rtype == "A" else AAAA)
        assert addrs(got, A if rtype == "A" else AAAA) == additional[target], f"{target} resolves elsewhere"
    return additional


def test_srv_covers_every_tier_with_priority_as_tier_index(qs):
    r = ask(qs, "_http._tcp.payments.shop.global", "SRV", source=FROM_EU1)
    assert_positive(r, SRV)
    got = sorted((rd.priority, rd.port, rd.target.to_text()) for rd in records(r, SRV))
    assert got == [
        (0, 8080, "127-1-1-1.eu-1.payments.shop.global."),
        (0, 8080, "127-1-1-2.eu-1.payments.shop.global."),
        (1, 8080, "127-1-2-1.eu-2.payments.shop.global."),
        (1, 8080, "127-1-2-2.eu-2.payments.shop.global."),
        (2, GATEWAY_PORT, "us-1.payments.shop.global."),
    ]
    # Weight = the cluster's weight (proportional to ready endpoints: 2 each), shared by its
    # records.
    per_cluster = {}
    for rd in records(r, SRV):
        assert rd.weight > 0
        labels = rd.target.to_text().split(".")
        per_cluster.setdefault(labels[labels.index("payments") - 1], []).append(rd.weight)
    assert sorted(per_cluster) == ["eu-1", "eu-2", "us-1"]
    sums = {c: sum(w) for c, w in per_cluster.items()}
    assert len(set(sums.values())) == 1, f"equal clusters, unequal SRV weights: {sums}"
    additional = check_srv_targets_resolve(qs, r, FROM_EU1)
    assert additional == {
        "127-1-1-1.eu-1.payments.shop.global.": ["127.1.1.1"],
        "127-1-1-2.eu-1.payments.shop.global.": ["127.1.1.2"],
        "127-1-2-1.eu-2.payments.shop.global.": ["127.1.2.1"],
        "127-1-2-2.eu-2.payments.shop.global.": ["127.1.2.2"],
        "us-1.payments.shop.global.": [GATEWAY_US1],
    }
    # gRPC port too.
    r = ask(qs, "_grpc._tcp.payments.shop.global", "SRV", source=FROM_EU1)
    assert sorted({(rd.priority, rd.port) for rd in records(r, SRV)}) == [(0, 9090), (1, 9090), (2, GATEWAY_PORT)]
    check_srv_targets_resolve(qs, r, FROM_EU1)


def test_srv_for_other_clients(qs):
    # us-1: its own endpoints first; eu-1 and eu-2 sit on n1 without a gateway.
    r = ask(qs, "_http._tcp.payments.shop.global", "SRV", source=FROM_US1)
    assert sorted((rd.priority, rd.port, rd.target.to_text()) for rd in records(r, SRV)) == [
        (0, 8080, "127-1-3-1.us-1.payments.shop.global."),
        (0, 8080, "127-1-3-2.us-1.payments.shop.global."),
    ]
    check_srv_targets_resolve(qs, r, FROM_US1)
    # Unknown client: one tier, every endpoint address.
    r = ask(qs, "_http._tcp.payments.shop.global", "SRV", source=FROM_UNKNOWN)
    got = sorted((rd.priority, rd.port, rd.target.to_text()) for rd in records(r, SRV))
    assert got == sorted(
        (0, 8080, f"{a.replace('.', '-')}.{c}.payments.shop.global.")
        for c, group in (("eu-1", EU1), ("eu-2", EU2), ("us-1", US1))
        for a in group
    )
    check_srv_targets_resolve(qs, r, FROM_UNKNOWN)


def test_srv_headless_targets_are_hostnames(qs):
    r = ask(qs, "_postgres._tcp.db.shop.global", "SRV", source=FROM_EU1)
    assert_positive(r, SRV)
    got = sorted((rd.priority, rd.port, rd.target.to_text()) for rd in records(r, SRV))
    assert got == [
        (0, 5432, "db-0.eu-1.db.shop.global."),
        (0, 5432, "db-1.eu-1.db.shop.global."),
        (1, GATEWAY_PORT, "us-1.db.shop.global."),
    ]
    assert check_srv_targets_resolve(qs, r, FROM_EU1) == {
        "db-0.eu-1.db.shop.global.": ["127.1.1.11"],
        "db-1.eu-1.db.shop.global.": ["127.1.1.12"],
        "us-1.db.shop.global.": [GATEWAY_US1],
    }


def test_srv_dual_stack_additionals(qs):
    r = ask(qs, "_http._tcp.cart.shop.global", "SRV", source=FROM_EU2)
    assert_positive(r, SRV)
    srv = records(r, SRV)
    # The endpoints listen on 8080 (the Service's port 80 maps to targetPort 8080): the SRV
    # points at endpoints, so it names the endpoint port.
    assert sorted((rd.priority, rd.port, rd.target.to_text()) for rd in srv) == [
        (0, 8080, "127-1-2-21.eu-2.cart.shop.global."),
        (0, 8080, "fd00-1-2--21.eu-2.cart.shop.global."),
    ]
    check_srv_targets_resolve(qs, r, FROM_EU2)


def test_srv_with_kdig(qs):
    out = kdig(qs, "_http._tcp.payments.shop.global", "SRV", source=FROM_EU1)
    assert "status: NOERROR" in out, out
    rows = re.findall(r"^_http\._tcp\.payments\.shop\.global\.\s+\d+\s+IN\s+SRV\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)$", out, re.M)
    assert sorted((int(p), int(port), t) for p, _, port, t in rows) == [
        (0, 8080, "127-1-1-1.eu-1.payments.shop.global."),
        (0, 8080, "127-1-1-2.eu-1.payments.shop.global."),
        (1, 8080, "127-1-2-1.eu-2.payments.shop.global."),
        (1, 8080, "127-1-2-2.eu-2.payments.shop.global."),
        (2, GATEWAY_PORT, "us-1.payments.shop.global."),
    ]
    assert re.search(r"^us-1\.payments\.shop\.global\.\s+\d+\s+IN\s+A\s+127\.0\.3\.100$", out, re.M), out


def test_unnamed_ports_have_no_srv(fleet, start_meridian):
    fleet.write(
        "clusters/eu-1/legacy.yaml",
        exported_service_yaml("legacy", port_name=None, port=80) + slice_yaml("legacy", ["127.1.1.31"], port_name=None, port=80),
    )
    m = start_meridian(fleet)
    assert addrs(ask(m, "legacy.shop.global")) == ["127.1.1.31"]
    for qname in ("_tcp.legacy.shop.global", "_http._tcp.legacy.shop.global", "_80._tcp.legacy.shop.global"):
        assert_negative(ask(m, qname, "SRV"), NXDOMAIN)
    # Named ports of other services: a port or protocol that does not exist is NXDOMAIN.
    assert_negative(ask(m, "_http._udp.payments.shop.global", "SRV"), NXDOMAIN)
    assert_negative(ask(m, "_nope._tcp.payments.shop.global", "SRV"), NXDOMAIN)
    assert_negative(ask(m, "_udp.payments.shop.global", "SRV"), NXDOMAIN)
    # The SRV name exists: other types are NODATA.
    assert_negative(ask(m, "_http._tcp.payments.shop.global", "A"), NOERROR)


# ---------------------------------------------------------------------------------------
# NXDOMAIN versus NODATA, SOA and NS.


NXDOMAIN_NAMES = [
    ("nope.shop.global", "A", "global."),
    ("payments.nope.global", "A", "global."),
    ("nope.global", "A", "global."),
    ("internal.shop.global", "A", "global."),  # not exported
    ("eu-3.payments.shop.global", "A", "global."),
    ("a.b.c.payments.shop.global", "A", "global."),
    ("x.y.z.w.v.global", "A", "global."),
    ("_http._tcp.nope.shop.global", "SRV", "global."),
    ("nope.shop.svc.clusterset.local", "A", "clusterset.local."),
    ("internal.shop.svc.clusterset.local", "A", "clusterset.local."),
    ("payments.shop.pod.clusterset.local", "A", "clusterset.local."),
    ("other.clusterset.local", "A", "clusterset.local."),
    ("nope.svc.clusterset.local", "A", "clusterset.local."),
]

NODATA_NAMES = [
    ("global", "A", "global."),
    ("global", "TXT", "global."),
    ("shop.global", "A", "global."),
    ("shop.global", "SRV", "global."),
    ("_tcp.payments.shop.global", "A", "global."),
    ("_tcp.payments.shop.global", "SRV", "global."),
    ("payments.shop.global", "TXT", "global."),
    ("payments.shop.global", "MX", "global."),
    ("payments.shop.global", "SRV", "global."),
    ("payments.shop.global", "SOA", "global."),
    ("clusterset.local", "A", "clusterset.local."),
    ("svc.clusterset.local", "A", "clusterset.local."),
    ("shop.svc.clusterset.local", "A", "clusterset.local."),
    ("shop.svc.clusterset.local", "SRV", "clusterset.local."),
    ("_tcp.payments.shop.svc.clusterset.local", "SRV", "clusterset.local."),
    ("dns-version.clusterset.local", "A", "clusterset.local."),
    ("payments.shop.svc.clusterset.local", "TXT", "clusterset.local."),
]


@pytest.mark.parametrize("qname,qtype,zone", NXDOMAIN_NAMES)
def test_nxdomain_carries_the_soa(qs, qname, qtype, zone):
    for tcp in (False, True):
        assert_negative(ask(qs, qname, qtype, tcp=tcp), NXDOMAIN, zone)


@pytest.mark.parametrize("qname,qtype,zone", NODATA_NAMES)
def test_nodata_and_empty_non_terminals(qs, qname, qtype, zone):
    for tcp in (False, True):
        assert_negative(ask(qs, qname, qtype, tcp=tcp), NOERROR, zone)


def test_nxdomain_versus_nodata_with_dig(qs):
    out = dig(qs, "shop.global", "A")
    assert "status: NOERROR" in out and "ANSWER: 0" in out and "AUTHORITY: 1" in out, out
    assert re.search(r"^global\.\s+5\s+IN\s+SOA\s+ns\.global\. hostmaster\.global\. \d+ \d+ \d+ \d+ 5$", out, re.M), out
    out = dig(qs, "nope.shop.global", "A")
    assert "status: NXDOMAIN" in out and "ANSWER: 0" in out and "AUTHORITY: 1" in out, out
    out = kdig(qs, "_tcp.payments.shop.global", "A")
    assert "status: NOERROR" in out and "ANSWER: 0" in out and "AUTHORITY: 1" in out, out


def test_soa_and_ns_at_the_apex(qs):
    for zone in ("global.", "clusterset.local."):
        r = ask(qs, zone, "SOA")
        assert_positive(r, SOA)
        (soa,) = records(r, SOA)
        assert soa.mname == name("ns." + zone)
        assert soa.rname == name("hostmaster." + zone)
        assert soa.minimum == TTL
        assert soa.serial > 0
        r = ask(qs, zone, "NS")
        assert_positive(r, NS)
        assert [rd.target for rd in records(r, NS)] == [name("ns." + zone)]
        # The name server's name resolves (to the DNS listen address).
        assert addrs(ask(qs, "ns." + zone)) == ["127.0.0.1"]
        # Negative answers carry the same SOA.
        nx = ask(qs, "nothing-here." + zone)
        assert nx.rcode() == NXDOMAIN
        assert nx.authority[0][0] == soa


def test_soa_serial_increases_with_every_snapshot(fleet, start_meridian):
    m = start_meridian(fleet)
    first = serial(m)
    assert serial(m, "clusterset.local.") == first
    path = fleet.cluster_dir("eu-2") / "payments.yaml"
    fleet.write(
        "clusters/eu-2/payments.yaml",
        path.read_text().replace("  - addresses: [127.1.2.3]", "  - addresses: [127.1.2.4]\n  - addresses: [127.1.2.3]"),
    )
    m.wait_for(lambda: "127.1.2.4" in addrs(ask(m, "payments.shop.global", source=FROM_EU2)), what="the new endpoint")
    second = serial(m)
    assert second > first, f"serial {first} -> {second} after a change"
    assert serial(m, "clusterset.local.") == second
    nx = ask(m, "nope.shop.global")
    assert nx.authority[0][0].serial == second
    # And again.
    fleet.write("clusters/eu-2/payments.yaml", path.read_text().replace("  - addresses: [127.1.2.4]\n", ""))
    m.wait_for(lambda: "127.1.2.4" not in addrs(ask(m, "payments.shop.global", source=FROM_EU2)), what="the endpoint to go")
    assert serial(m) > second


def test_refused_outside_our_zones(qs):
    for qname, qtype in [
        ("example.com", "A"),
        ("com", "NS"),
        (".", "NS"),
        ("local", "SOA"),
        ("svc.cluster.local", "A"),
        ("xglobal", "A"),
        ("global.example", "A"),
        ("notclusterset.local", "A"),
    ]:
        for tcp in (False, True):
            r = ask(qs, qname, qtype, tcp=tcp)
            assert r.rcode() == REFUSED, f"{qname} {qtype}: {dns.rcode.to_text(r.rcode())}"
            assert r.answer == [] and r.authority == []
            assert not r.flags & dns.flags.AA
            assert not r.flags & dns.flags.RA
    # Another class than IN.
    r = ask(qs, "payments.shop.global", "A", rdclass="CH")
    assert r.rcode() == REFUSED
    out = dig(qs, "example.com", "A")
    assert "status: REFUSED" in out, out


def test_aa_set_ra_clear_even_when_recursion_is_desired(qs):
    for qname, qtype in [("payments.shop.global", "A"), ("nope.shop.global", "A"), ("shop.global", "A"), ("global", "SOA")]:
        q = dns.message.make_query(qname, qtype)  # RD set
        r = dns.query.udp(q, "127.0.0.1", port=qs.dns_port, source=FROM_EU1, timeout=5)
        assert r.flags & dns.flags.AA
        assert not r.flags & dns.flags.RA
        assert r.flags & dns.flags.RD, "RD is copied from the query"
        r = dns.query.tcp(q, "127.0.0.1", port=qs.dns_port, source=FROM_EU1, timeout=5)
        assert r.flags & dns.flags.AA and not r.flags & dns.flags.RA and r.flags & dns.flags.RD


def test_ttl_from_config(fleet, start_meridian):
    m = start_meridian(fleet, "--dns-ttl", "42")
    r = ask(m, "payments.shop.global", source=FROM_EU1)
    assert_positive(r, A, ttl=42)
    assert_positive(ask(m, "cart.shop.global", "AAAA"), AAAA, ttl=42)
    assert_positive(ask(m, "db-0.eu-1.db.shop.global"), A, ttl=42)
    assert_positive(ask(m, "eu-1.payments.shop.global"), A, ttl=42)
    r = ask(m, "_http._tcp.payments.shop.global", "SRV", source=FROM_EU1)
    assert_positive(r, SRV, ttl=42)
    assert all(rrset.ttl == 42 for rrset in r.additional if rrset.rdtype != OPT)
    r = ask(m, "global", "SOA")
    assert_positive(r, SOA, ttl=42)
    assert records(r, SOA)[0].minimum == 42
    assert_positive(ask(m, "global", "NS"), NS, ttl=42)
    assert_positive(ask(m, "dns-version.clusterset.local", "TXT"), TXT, ttl=42)
    assert_negative(ask(m, "nope.shop.global"), NXDOMAIN, ttl=42)
    assert_negative(ask(m, "shop.global"), NOERROR, ttl=42)
    assert_negative(ask(m, "nope.shop.svc.clusterset.local"), NXDOMAIN, "clusterset.local.", ttl=42)
    out = dig(m, "payments.shop.global", "A", source=FROM_EU1)
    assert re.search(r"^payments\.shop\.global\.\s+42\s+IN\s+A\s+127\.1\.1\.1$", out, re.M), out


def test_default_ttl_is_five(fleet, start_meridian):
    text = fleet.config.read_text().replace("  ttl: 5\n", "")
    assert "ttl" not in text
    fleet.write("meridian-nottl.yaml", text)
    fleet.config = fleet.root / "meridian-nottl.yaml"
    m = start_meridian(fleet)
    assert_positive(ask(m, "payments.shop.global", source=FROM_EU1), A, ttl=5)
    assert_negative(ask(m, "nope.shop.global"), NXDOMAIN, ttl=5)


# ---------------------------------------------------------------------------------------
# The clusterset style (MCS DNS).


def test_clusterset_clustersetip_for_the_importing_cluster(qs):
    r = ask(qs, "payments.shop.svc.clusterset.local", source=FROM_EU2)
    assert_positive(r)
    assert addrs(r) == [CLUSTERSET_IP]
    assert addrs(ask(qs, "payments.shop.svc.clusterset.local", source=FROM_EU2, tcp=True)) == [CLUSTERSET_IP]
    # ECS saying eu-2 counts as eu-2.
    r = ask_edns(qs, "payments.shop.svc.clusterset.local", source=FROM_UNKNOWN, options=[dns.edns.ECSOption("127.0.2.0", 24)])
    assert addrs(r) == [CLUSTERSET_IP]
    assert_negative(ask(qs, "payments.shop.svc.clusterset.local", "AAAA", source=FROM_EU2), NOERROR, "clusterset.local.")
    # Clusters without an import: the selected endpoints.
    assert addrs(ask(qs, "payments.shop.svc.clusterset.local", source=FROM_EU1)) == EU1
    assert addrs(ask(qs, "payments.shop.svc.clusterset.local", source=FROM_US1)) == US1
    assert addrs(ask(qs, "payments.shop.svc.clusterset.local", source=FROM_UNKNOWN)) == ALL_PAYMENTS
    # eu-2 imported payments, not cart.
    assert addrs(ask(qs, "cart.shop.svc.clusterset.local", source=FROM_EU2)) == ["127.1.2.21"]
    assert addrs(ask(qs, "cart.shop.svc.clusterset.local", "AAAA", source=FROM_EU2), AAAA) == ["fd00:1:2::21"]


def test_clusterset_srv_for_a_clustersetip_service(qs):
    r = ask(qs, "_http._tcp.payments.shop.svc.clusterset.local", "SRV", source=FROM_EU2)
    assert_positive(r, SRV)
    assert [(rd.port, rd.target.to_text()) for rd in records(r, SRV)] == [(8080, "payments.shop.svc.clusterset.local.")]
    assert [(rrset.name.to_text(), sorted(rd.address for rd in rrset)) for rrset in rrsets(r, A, "additional")] == [
        ("payments.shop.svc.clusterset.local.", [CLUSTERSET_IP])
    ]


def test_clusterset_headless(qs):
    assert addrs(ask(qs, "db.shop.svc.clusterset.local", source=FROM_EU1)) == ["127.1.1.11", "127.1.1.12"]
    assert addrs(ask(qs, "db.shop.svc.clusterset.local", source=FROM_US1)) == ["127.1.3.11"]
    assert addrs(ask(qs, "db.shop.svc.clusterset.local")) == ["127.1.1.11", "127.1.1.12", "127.1.3.11"]
    for host, expected in [("db-0.eu-1", "127.1.1.11"), ("db-1.eu-1", "127.1.1.12"), ("db-0.us-1", "127.1.3.11")]:
        r = ask(qs, f"{host}.db.shop.svc.clusterset.local", source=FROM_EU2)
        assert_positive(r)
        assert addrs(r) == [expected]
    assert_negative(ask(qs, "db-1.us-1.db.shop.svc.clusterset.local"), NXDOMAIN, "clusterset.local.")
    # <clusterid>.<svc>... is an empty non-terminal above the hostnames.
    assert_negative(ask(qs, "eu-1.db.shop.svc.clusterset.local"), NOERROR, "clusterset.local.")
    assert_negative(ask(qs, "eu-2.db.shop.svc.clusterset.local"), NXDOMAIN, "clusterset.local.")
    r = ask(qs, "_postgres._tcp.db.shop.svc.clusterset.local", "SRV", source=FROM_EU1)
    assert_positive(r, SRV)
    targets = sorted((rd.port, rd.target.to_text()) for rd in records(r, SRV))
    assert (5432, "db-0.eu-1.db.shop.svc.clusterset.local.") in targets
    assert (5432, "db-1.eu-1.db.shop.svc.clusterset.local.") in targets
    check_srv_targets_resolve(qs, r, FROM_EU1)
    out = kdig(qs, "db-0.us-1.db.shop.svc.clusterset.local", "+short")
    assert short_lines(out) == ["127.1.3.11"], out


def test_clusterset_no_per_cluster_names_for_clustersetip_services(qs):
    for source in (FROM_EU1, FROM_EU2, FROM_UNKNOWN):
        for qname in (
            "eu-1.payments.shop.svc.clusterset.local",
            "us-1.payments.shop.svc.clusterset.local",
            "127-1-1-1.eu-1.payments.shop.svc.clusterset.local",
            "eu-2.cart.shop.svc.clusterset.local",
        ):
            assert_negative(ask(qs, qname, source=source), NXDOMAIN, "clusterset.local.")


def test_dns_version(qs):
    for tcp in (False, True):
        r = ask(qs, "dns-version.clusterset.local", "TXT", tcp=tcp)
        assert_positive(r, TXT)
        (txt,) = records(r, TXT)
        assert txt.strings == (b"1.0.0",)
    out = dig(qs, "dns-version.clusterset.local", "TXT", "+short")
    assert short_lines(out) == ['"1.0.0"'], out
    # Only in the clusterset zone.
    assert_negative(ask(qs, "dns-version.global", "TXT"), NXDOMAIN)


def test_clusterset_headless_without_ready_endpoints_is_nxdomain(fleet, start_meridian):
    m = start_meridian(fleet)
    assert addrs(ask(m, "db.shop.svc.clusterset.local")) == ["127.1.1.11", "127.1.1.12", "127.1.3.11"]
    for cluster in ("eu-1", "us-1"):
        path = fleet.cluster_dir(cluster) / "db.yaml"
        text = re.sub(r"hostname: (db-\d)\}", r"hostname: \1, conditions: {ready: false}}", path.read_text())
        assert "ready: false" in text
        fleet.write(f"clusters/{cluster}/db.yaml", text)
    m.wait_for(lambda: ask(m, "db.shop.svc.clusterset.local").rcode() == NXDOMAIN, what="db to lose its endpoints")
    for source in (FROM_EU1, FROM_US1, FROM_UNKNOWN):
        for qtype in ("A", "AAAA", "SRV"):
            assert_negative(ask(m, "db.shop.svc.clusterset.local", qtype, source=source), NXDOMAIN, "clusterset.local.")
        # Nothing exists below a name that does not exist (RFC 8020).
        assert_negative(ask(m, "_postgres._tcp.db.shop.svc.clusterset.local", "SRV", source=source), NXDOMAIN, "clusterset.local.")
        assert_negative(ask(m, "_tcp.db.shop.svc.clusterset.local", "SRV", source=source), NXDOMAIN, "clusterset.local.")
        assert_negative(ask(m, "db-0.eu-1.db.shop.svc.clusterset.local", source=source), NXDOMAIN, "clusterset.local.")
        assert_negative(ask(m, "eu-1.db.shop.svc.clusterset.local", source=source), NXDOMAIN, "clusterset.local.")
        # The global style: an exported service with no ready endpoint is NODATA.
        assert_negative(ask(m, "db.shop.global", source=source), NOERROR)
    # Other names are unaffected.
    assert addrs(ask(m, "payments.shop.svc.clusterset.local", source=FROM_EU2)) == [CLUSTERSET_IP]


def test_global_service_without_ready_endpoints_is_nodata(fleet, start_meridian):
    fleet.write("clusters/eu-1/idle.yaml", exported_service_yaml("idle") + slice_yaml("idle", [("127.1.1.61", "conditions: {ready: false}")]))
    m = start_meridian(fleet)
    for source in (FROM_EU1, FROM_UNKNOWN):
        assert_negative(ask(m, "idle.shop.global", source=source), NOERROR)
        assert_negative(ask(m, "idle.shop.global", "AAAA", source=source), NOERROR)
    # ClusterSetIP-style (not headless) service with no endpoint: it exists, NODATA.
    assert_negative(ask(m, "idle.shop.svc.clusterset.local"), NOERROR, "clusterset.local.")


# ---------------------------------------------------------------------------------------
# A zone with a fixed namespace.


def test_zone_with_a_namespace(fleet, start_meridian):
    m = start_meridian(
        fleet,
        "--dns-zone", "global.svc.cluster.local:global:shop",
        "--dns-zone", "global",
        "--dns-zone", "clusterset.local:clusterset",
    )
    zone = "global.svc.cluster.local."
    r = ask(m, "payments.global.svc.cluster.local", source=FROM_EU1)
    assert_positive(r)
    assert addrs(r) == EU1
    assert addrs(ask(m, "payments.global.svc.cluster.local")) == ALL_PAYMENTS
    assert addrs(ask(m, "us-1.payments.global.svc.cluster.local", source=FROM_EU1)) == [GATEWAY_US1]
    assert addrs(ask(m, "eu-2.payments.global.svc.cluster.local")) == EU2
    assert addrs(ask(m, "db-1.eu-1.db.global.svc.cluster.local")) == ["127.1.1.12"]
    assert addrs(ask(m, "cart.global.svc.cluster.local", "AAAA"), AAAA) == ["fd00:1:2::21"]
    r = ask_edns(m, "_http._tcp.payments.global.svc.cluster.local", "SRV", source=FROM_EU1)
    assert sorted((rd.priority, rd.target.to_text()) for rd in records(r, SRV)) == [
        (0, "127-1-1-1.eu-1.payments.global.svc.cluster.local."),
        (0, "127-1-1-2.eu-1.payments.global.svc.cluster.local."),
        (1, "127-1-2-1.eu-2.payments.global.svc.cluster.local."),
        (1, "127-1-2-2.eu-2.payments.global.svc.cluster.local."),
        (2, "us-1.payments.global.svc.cluster.local."),
    ]
    check_srv_targets_resolve(m, r, FROM_EU1)
    (soa,) = records(ask(m, zone, "SOA"), SOA)
    assert soa.mname == name("ns." + zone)
    assert_negative(ask(m, "nope.global.svc.cluster.local"), NXDOMAIN, zone)
    assert_negative(ask(m, "payments.shop.global.svc.cluster.local"), NXDOMAIN, zone)
    assert_negative(ask(m, "internal.global.svc.cluster.local"), NXDOMAIN, zone)
    assert_negative(ask(m, "_tcp.payments.global.svc.cluster.local"), NOERROR, zone)
    assert ask(m, "svc.cluster.local").rcode() == REFUSED
    assert ask(m, "payments.shop.svc.cluster.local").rcode() == REFUSED
    # The other zones keep working.
    assert addrs(ask(m, "payments.shop.global", source=FROM_EU1)) == EU1
    assert addrs(ask(m, "payments.shop.svc.clusterset.local", source=FROM_EU2)) == [CLUSTERSET_IP]
    out = dig(m, "payments.global.svc.cluster.local", "+short", source=FROM_US1)
    assert short_lines(out) == US1, out


# ---------------------------------------------------------------------------------------
# ANY, AXFR.


def test_any_is_answered_with_one_hinfo(qs):
    for qname in ("payments.shop.global", "global", "db-0.eu-1.db.shop.global", "payments.shop.svc.clusterset.local"):
        for tcp in (False, True):
            r = ask(qs, qname, "ANY", tcp=tcp)
            assert r.rcode() == NOERROR
            assert_authoritative(r)
            assert len(r.answer) == 1 and len(r.answer[0]) == 1, f"{qname}: {r}"
            assert r.answer[0].rdtype == HINFO
            assert r.answer[0][0].cpu == b"RFC8482"
            assert r.answer[0].name == name(qname)
    assert_negative(ask(qs, "nope.shop.global", "ANY"), NXDOMAIN)
    out = dig(qs, "payments.shop.global", "ANY", "+notcp")
    assert re.search(r'IN\s+HINFO\s+"RFC8482"', out), out
    assert "ANSWER: 1," in out, out


def global_zone_expectations(z):
    """What an AXFR of global. from the quickstart must hold."""
    def node_addrs(n, rdtype=A):
        rds = z.get_rdataset(n, rdtype)
        return sorted(rd.address for rd in rds) if rds else []

    assert node_addrs("payments.shop") == ALL_PAYMENTS
    assert node_addrs("eu-1.payments.shop") == EU1
    assert node_addrs("us-1.payments.shop") == US1
    assert node_addrs("127-1-1-1.eu-1.payments.shop") == ["127.1.1.1"]
    assert node_addrs("db-0.eu-1.db.shop") == ["127.1.1.11"]
    assert node_addrs("db-0.us-1.db.shop") == ["127.1.3.11"]
    assert node_addrs("cart.shop", AAAA) == ["fd00:1:2::21"]
    srv = z.get_rdataset("_http._tcp.payments.shop", SRV)
    assert srv is not None and len(srv) == 6
    assert z.get_rdataset("_postgres._tcp.db.shop", SRV) is not None
    assert z.get_node("internal.shop") is None
    assert z.get_node("127-1-1-3.eu-1.payments.shop") is None, "a terminating endpoint in the transfer"
    assert z.get_rdataset("@", SOA)[0].minimum == TTL


def test_axfr_with_dnspython(qs):
    z = dns.zone.from_xfr(dns.query.xfr("127.0.0.1", "global.", port=qs.dns_port, source=FROM_EU1, timeout=5, lifetime=10))
    global_zone_expectations(z)
    z = dns.zone.from_xfr(dns.query.xfr("127.0.0.1", "clusterset.local.", port=qs.dns_port, source=FROM_UNKNOWN, timeout=5, lifetime=10))
    txt = z.get_rdataset("dns-version", TXT)
    assert txt is not None and txt[0].strings == (b"1.0.0",)
    assert sorted(rd.address for rd in z.get_rdataset("db.shop.svc", A)) == ["127.1.1.11", "127.1.1.12", "127.1.3.11"]


def test_axfr_with_dig(qs):
    out = dig(qs, "global.", "AXFR", source=FROM_US1)
    lines = [line for line in out.splitlines() if line and not line.startswith(";")]
    assert lines, out
    assert re.match(r"^global\.\s+\d+\s+IN\s+SOA\s", lines[0]), out
    assert re.match(r"^global\.\s+\d+\s+IN\s+SOA\s", lines[-1]), out
    for a in ALL_PAYMENTS:
        assert re.search(rf"^payments\.shop\.global\.\s+\d+\s+IN\s+A\s+{re.escape(a)}$", out, re.M), out
    assert re.search(r"^db-0\.eu-1\.db\.shop\.global\.\s+\d+\s+IN\s+A\s+127\.1\.1\.11$", out, re.M), out
    assert "Transfer failed" not in out


def test_axfr_refused_without_allow_transfer(fleet, start_meridian):
    text = fleet.config.read_text()
    assert "allowTransfer" in text
    fleet.write("meridian-noxfr.yaml", "".join(line + "\n" for line in text.splitlines() if "allowTransfer" not in line))
    fleet.config = fleet.root / "meridian-noxfr.yaml"
    m = start_meridian(fleet)
    for source in (FROM_EU1, FROM_UNKNOWN):
        with pytest.raises(dns.xfr.TransferError) as e:
            dns.zone.from_xfr(dns.query.xfr("127.0.0.1", "global.", port=m.dns_port, source=source, timeout=5, lifetime=10))
        assert e.value.rcode == REFUSED
        r = ask(m, "global", "AXFR", tcp=True, source=source)
        assert r.rcode() == REFUSED and r.answer == []
    out = dig(m, "global.", "AXFR")
    assert "Transfer failed" in out, out
    assert not re.search(r"IN\s+A\s+127\.1\.", out), out
    # Ordinary queries are unaffected.
    assert addrs(ask(m, "payments.shop.global", source=FROM_EU1)) == EU1


def test_axfr_only_to_the_allowed_cidrs(fleet, start_meridian):
    m = start_meridian(fleet, "--dns-allow-transfer", "127.0.1.0/24")
    z = dns.zone.from_xfr(dns.query.xfr("127.0.0.1", "global.", port=m.dns_port, source=FROM_EU1, timeout=5, lifetime=10))
    global_zone_expectations(z)
    for source in (FROM_EU2, FROM_UNKNOWN):
        with pytest.raises(dns.xfr.TransferError) as e:
            dns.zone.from_xfr(dns.query.xfr("127.0.0.1", "global.", port=m.dns_port, source=source, timeout=5, lifetime=10))
        assert e.value.rcode == REFUSED


# ---------------------------------------------------------------------------------------
# maxAnswers and rotation.


def test_max_answers_caps_address_answers(fleet, start_meridian):
    m = start_meridian(fleet, "--dns-max-answers", "1")
    seen = set()
    for _ in range(12):
        r = ask(m, "payments.shop.global", source=FROM_UNKNOWN)
        assert_positive(r)
        got = addrs(r)
        assert len(got) == 1, got
        seen |= set(got)
    assert seen == set(ALL_PAYMENTS), f"the capped answer should rotate over every endpoint, saw {sorted(seen)}"
    for source in (FROM_EU1, FROM_US1):
        got = addrs(ask(m, "payments.shop.global", source=source))
        assert len(got) == 1 and got[0] in (EU1 if source == FROM_EU1 else US1)
    assert len(addrs(ask(m, "db.shop.global"))) == 1
    assert len(addrs(ask(m, "payments.shop.global", tcp=True))) == 1


def test_answers_rotate_across_repeated_queries(qs):
    orders = [tuple(in_order(ask(qs, "payments.shop.global", source=FROM_UNKNOWN))) for _ in range(8)]
    assert all(sorted(o) == ALL_PAYMENTS for o in orders), orders
    for a, b in zip(orders, orders[1:]):
        assert a != b, f"two queries in a row got the same order: {orders}"
    assert len(set(orders)) >= 6, orders
    orders = [tuple(in_order(ask(qs, "payments.shop.global", source=FROM_EU1))) for _ in range(4)]
    assert set(orders) == {tuple(EU1), tuple(reversed(EU1))}, orders


def test_answers_rotate_over_tcp_too(qs):
    orders = [tuple(in_order(ask(qs, "payments.shop.global", source=FROM_UNKNOWN, tcp=True))) for _ in range(6)]
    assert all(sorted(o) == ALL_PAYMENTS for o in orders), orders
    assert len(set(orders)) > 1, f"every TCP query got the same order: {orders[0]}"


def test_answers_rotate_for_ecs_queries_too(qs):
    ecs = dns.edns.ECSOption("127.0.9.0", 24)
    orders = [tuple(in_order(ask_edns(qs, "payments.shop.global", source=FROM_UNKNOWN, options=[ecs]))) for _ in range(6)]
    assert all(sorted(o) == ALL_PAYMENTS for o in orders), orders
    assert len(set(orders)) > 1, f"every ECS query got the same order: {orders[0]}"


# ---------------------------------------------------------------------------------------
# UDP truncation, TCP.


def test_udp_truncation_and_tcp_fallback(fleet, start_meridian):
    big = big_service(fleet, "eu-1", "big", 40)
    huge = big_service(fleet, "eu-1", "huge", 100, base="127.3")
    m = start_meridian(fleet)
    # 40 records: about 700 bytes. Without EDNS: over 512, so TC with no records.
    r = ask(m, "big.shop.global")
    assert r.rcode() == NOERROR and r.flags & dns.flags.TC and r.flags & dns.flags.AA
    assert r.answer == [] and r.authority == [] and r.additional == []
    assert r.question[0].name == name("big.shop.global")
    raw = udp_raw(m, query_wire("big.shop.global"))
    assert len(raw) <= 512
    # With EDNS 1232 it fits, untruncated.
    r = ask_edns(m, "big.shop.global", payload=1232)
    assert not r.flags & dns.flags.TC
    assert addrs(r) == big
    assert r.edns == 0 and r.payload == 1232
    raw = udp_raw(m, query_wire("big.shop.global", edns_payload=1232))
    assert 512 < len(raw) <= 1232
    # An EDNS size below 512 counts as 512.
    r = ask_edns(m, "big.shop.global", payload=300)
    assert r.flags & dns.flags.TC and r.answer == []
    assert addrs(ask_edns(m, "payments.shop.global", payload=300)) == ALL_PAYMENTS
    # Over TCP: everything.
    r = ask(m, "big.shop.global", tcp=True)
    assert not r.flags & dns.flags.TC
    assert addrs(r) == big
    # 100 records (about 1.6 kB) do not fit 1232, whatever the client offers.
    for payload in (1232, 4096, 65535):
        r = ask_edns(m, "huge.shop.global", payload=payload)
        assert r.flags & dns.flags.TC and r.answer == [], f"payload {payload}"
        assert r.edns == 0
        raw = udp_raw(m, query_wire("huge.shop.global", edns_payload=payload))
        assert len(raw) <= 1232
    r = ask_edns(m, "huge.shop.global", tcp=True, payload=4096)
    assert not r.flags & dns.flags.TC
    assert addrs(r) == huge
    # An SRV answer with its additional section is larger still.
    r = ask(m, "_http._tcp.huge.shop.global", "SRV")
    assert r.flags & dns.flags.TC and r.answer == []
    r = ask(m, "_http._tcp.huge.shop.global", "SRV", tcp=True)
    assert len(records(r, SRV)) == 100 and len(records(r, A, "additional")) == 100


def test_truncation_with_dig_and_kdig(fleet, start_meridian):
    big = big_service(fleet, "eu-1", "big", 40)
    m = start_meridian(fleet)
    out = dig(m, "big.shop.global", "+noedns", "+ignore")
    flags = re.search(r";; flags: ([a-z ]+);", out).group(1).split()
    assert "tc" in flags, out
    assert "ANSWER: 0" in out, out
    # dig retries over TCP by itself.
    out = dig(m, "big.shop.global", "+noedns", "+short")
    assert short_lines(out) == big, out
    out = dig(m, "big.shop.global", "+bufsize=1232", "+short")
    assert short_lines(out) == big, out
    out = kdig(m, "big.shop.global", "+noedns", "+notcp", "+ignore")
    assert re.search(r"Flags: qr aa tc", out), out
    out = kdig(m, "big.shop.global", "+tcp", "+short")
    assert short_lines(out) == big, out


def test_badvers_for_edns_version_1(qs):
    for tcp in (False, True):
        q = dns.message.make_query("payments.shop.global", "A", use_edns=1)
        q.flags &= ~dns.flags.RD
        if tcp:
            r = dns.query.tcp(q, "127.0.0.1", port=qs.dns_port, source=FROM_EU1, timeout=5)
        else:
            r = dns.query.udp(q, "127.0.0.1", port=qs.dns_port, source=FROM_EU1, timeout=5)
        assert r.rcode() == dns.rcode.BADVERS, dns.rcode.to_text(r.rcode())
        assert r.edns == 0, "the reply's OPT says the version meridian speaks"
        assert r.answer == []
    out = dig(qs, "payments.shop.global", "+edns=1", "+noednsneg")
    assert "status: BADVERS" in out, out


def test_formerr_for_two_opt_records(qs):
    q = bytearray(query_wire("payments.shop.global", qid=0x1111, edns_payload=1232))
    assert q[10:12] == b"\x00\x01"
    q[10:12] = b"\x00\x02"
    q += b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x00"
    for reply in (udp_raw(qs, bytes(q)), tcp_raw(qs, [bytes(q)])[0]):
        assert reply is not None, "no reply to two OPT records"
        assert reply[:2] == b"\x11\x11"
        r = dns.message.from_wire(reply)
        assert r.rcode() == FORMERR, dns.rcode.to_text(r.rcode())
        assert r.answer == []


def opcode_message(opcode, qid):
    """A request with the given opcode: a proper UPDATE / NOTIFY where dnspython builds one."""
    if opcode == dns.opcode.UPDATE:
        u = dns.update.UpdateMessage("global.", id=qid)
        u.add("x.shop", 5, "A", "10.0.0.1")
        return u.to_wire()
    q = dns.message.make_query("global." if opcode == dns.opcode.NOTIFY else "payments.shop.global", "SOA" if opcode == dns.opcode.NOTIFY else "A")
    q.id = qid
    q.set_opcode(opcode)
    if opcode == dns.opcode.NOTIFY:
        q.flags |= dns.flags.AA
    return q.to_wire()


def check_notimp(reply, opcode, qid):
    assert reply is not None, f"no reply to opcode {opcode}"
    hdr = struct.unpack("!HHHHHH", reply[:12])
    assert hdr[0] == qid
    flags = hdr[1]
    assert flags & 0x8000, "QR clear"
    assert (flags >> 11) & 0xF == opcode, f"opcode {opcode} not echoed: {(flags >> 11) & 0xF}"
    assert flags & 0xF == NOTIMP, f"opcode {opcode}: rcode {flags & 0xF}, expected NOTIMP"
    assert hdr[3] == 0, "answers to an unimplemented opcode"


def test_notimp_for_update_notify_and_unknown_opcodes(qs):
    for i, opcode in enumerate([dns.opcode.UPDATE, dns.opcode.NOTIFY, 3, 6, 7, 15]):
        qid = 0x2000 + i
        check_notimp(udp_raw(qs, opcode_message(opcode, qid)), opcode, qid)
    # Over TCP as well.
    check_notimp(tcp_raw(qs, [opcode_message(dns.opcode.UPDATE, 0x3001)])[0], dns.opcode.UPDATE, 0x3001)
    check_notimp(tcp_raw(qs, [opcode_message(dns.opcode.NOTIFY, 0x3002)])[0], dns.opcode.NOTIFY, 0x3002)
    # dnspython's own UPDATE client sees NOTIMP.
    u = dns.update.UpdateMessage("global.")
    u.delete("payments.shop")
    r = dns.query.udp(u, "127.0.0.1", port=qs.dns_port, source=FROM_EU1, timeout=5)
    assert r.rcode() == NOTIMP
    # And nothing changed.
    assert addrs(ask(qs, "payments.shop.global", source=FROM_EU1)) == EU1


def test_tcp_pipelining(qs):
    wires = [
        query_wire("payments.shop.global", qid=0x0101),
        query_wire("_http._tcp.payments.shop.global", "SRV", qid=0x0102),
        query_wire("nope.shop.global", qid=0x0103),
    ]
    s = tcp_connect(qs, FROM_EU1)
    try:
        s.sendall(b"".join(struct.pack("!H", len(w)) + w for w in wires))
        replies = [dns.message.from_wire(tcp_read_message(s)) for _ in wires]
        # The connection stays open for more.
        w = query_wire("db-0.eu-1.db.shop.global", qid=0x0104)
        s.sendall(struct.pack("!H", len(w)) + w)
        last = dns.message.from_wire(tcp_read_message(s))
    finally:
        s.close()
    by_id = {r.id: r for r in replies}
    assert sorted(by_id) == [0x0101, 0x0102, 0x0103], "answers must match the query IDs"
    assert by_id[0x0101].question[0].name == name("payments.shop.global")
    assert addrs(by_id[0x0101]) == EU1
    assert len(records(by_id[0x0102], SRV)) == 5
    assert by_id[0x0103].rcode() == NXDOMAIN
    assert last.id == 0x0104 and addrs(last) == ["127.1.1.11"]


def seconds_until_closed(s):
    """Waits for the server to close `s` (then closes it too); returns (bytes read, seconds)."""
    try:
        start = time.time()
        try:
            data = s.recv(1)
        except ConnectionResetError:
            data = b""
        return data, time.time() - start
    finally:
        s.close()


def test_tcp_idle_timeout(fleet, start_meridian):
    m = start_meridian(fleet, "--dns-tcp-idle-timeout-seconds", "1")
    s = tcp_connect(m, FROM_EU1, timeout=10)
    w = query_wire("payments.shop.global", qid=7)
    s.sendall(struct.pack("!H", len(w)) + w)
    assert addrs(dns.message.from_wire(tcp_read_message(s))) == EU1
    data, elapsed = seconds_until_closed(s)
    assert data == b"", f"unexpected bytes {data!r}"
    assert 0.5 <= elapsed <= 3.0, f"idle connection closed after {elapsed:.2f}s (timeout 1s)"
    # A connection that never sends anything is closed too.
    data, elapsed = seconds_until_closed(tcp_connect(m, FROM_EU1, timeout=10))
    assert data == b"" and elapsed <= 3.0, f"silent connection open after {elapsed:.2f}s"
    assert addrs(ask(m, "payments.shop.global", source=FROM_EU1, tcp=True)) == EU1


def test_tcp_connection_is_kept_below_the_idle_timeout(qs):
    s = tcp_connect(qs, FROM_EU1)
    try:
        for i in range(3):
            w = query_wire("payments.shop.global", qid=100 + i)
            s.sendall(struct.pack("!H", len(w)) + w)
            r = dns.message.from_wire(tcp_read_message(s))
            assert r.id == 100 + i and addrs(r) == EU1
            time.sleep(0.7)
    finally:
        s.close()


# ---------------------------------------------------------------------------------------
# The UDP hot path and the hickory-server path give the same bytes.


def test_hot_path_and_tcp_give_identical_bytes(fleet, start_meridian):
    m = start_meridian(fleet)
    single_rotation = [
        ("_http._tcp.payments.shop.global", "SRV", FROM_EU1),
        ("_postgres._tcp.db.shop.svc.clusterset.local", "SRV", FROM_US1),
        ("nope.shop.global", "A", FROM_EU1),
        ("shop.global", "A", FROM_EU2),
        ("payments.shop.global", "AAAA", FROM_EU1),
        ("db-0.eu-1.db.shop.global", "A", FROM_UNKNOWN),
        ("cart.shop.global", "AAAA", FROM_EU2),
        ("global", "SOA", FROM_UNKNOWN),
        ("global", "NS", FROM_UNKNOWN),
        ("dns-version.clusterset.local", "TXT", FROM_UNKNOWN),
        ("payments.shop.svc.clusterset.local", "A", FROM_EU2),
        ("us-1.payments.shop.global", "A", FROM_EU1),
        ("payments.shop.global", "ANY", FROM_EU1),
    ]
    for i, (qname, qtype, source) in enumerate(single_rotation):
        for payload in (1232, None):
            wire = query_wire(qname, qtype, qid=0x5000 + i, edns_payload=payload)
            hits = metric(metrics(m), "meridian_dns_answer_cache_hits_total")
            first = udp_raw(m, wire, source)
            second = udp_raw(m, wire, source)
            assert metric(metrics(m), "meridian_dns_answer_cache_hits_total") == hits + 1, (
                f"{qname} {qtype}: the second UDP answer did not come from the hot-path cache"
            )
            (tcp,) = tcp_raw(m, [wire], source)
            assert not dns.message.from_wire(first).flags & dns.flags.TC
            assert first == second, f"{qname} {qtype}: cached bytes differ from the first answer"
            assert first == tcp, (
                f"{qname} {qtype} (EDNS {payload}): UDP and TCP bytes differ\n udp {first.hex()}\n tcp {tcp.hex()}"
            )


def test_hot_path_patches_id_and_case(fleet, start_meridian):
    m = start_meridian(fleet)
    for qname, qtype, source in [
        ("_http._tcp.payments.shop.global", "SRV", FROM_EU1),
        ("nope.shop.global", "A", FROM_EU1),
        ("db-0.eu-1.db.shop.global", "A", FROM_UNKNOWN),
    ]:
        first = udp_raw(m, query_wire(qname, qtype, qid=1, edns_payload=1232), source)
        mixed = "".join(c.upper() if i % 2 else c for i, c in enumerate(qname))
        wire = query_wire(mixed, qtype, qid=0xBEEF, edns_payload=1232)
        hits = metric(metrics(m), "meridian_dns_answer_cache_hits_total")
        cached = udp_raw(m, wire, source)
        assert metric(metrics(m), "meridian_dns_answer_cache_hits_total") == hits + 1
        r = dns.message.from_wire(cached)
        assert r.id == 0xBEEF
        assert r.question[0].name.to_text() == mixed + "."
        assert dns.message.from_wire(first).answer == r.answer
        (tcp,) = tcp_raw(m, [wire], source)
        assert cached == tcp, f"{mixed}: UDP (cached) and TCP bytes differ\n udp {cached.hex()}\n tcp {tcp.hex()}"


def test_multi_address_answers_identical_for_the_same_rotation(fleet, start_meridian):
    m = start_meridian(fleet)
    wire = query_wire("payments.shop.global", "A", qid=0x6000, edns_payload=1232)
    udp = [udp_raw(m, wire, FROM_EU2) for _ in range(3)]
    (tcp,) = tcp_raw(m, [wire], FROM_EU2)
    # Two addresses: rotations 0, 1, 0.
    assert udp[0] == udp[2] == tcp
    assert udp[1] != udp[0]
    assert addrs(dns.message.from_wire(udp[1])) == EU2


def test_cache_follows_snapshot_changes(fleet, start_meridian):
    m = start_meridian(fleet)
    wire = query_wire("db-0.eu-1.db.shop.global", qid=9, edns_payload=1232)
    for _ in range(2):
        assert addrs(dns.message.from_wire(udp_raw(m, wire))) == ["127.1.1.11"]
    path = fleet.cluster_dir("eu-1") / "db.yaml"
    fleet.write("clusters/eu-1/db.yaml", path.read_text().replace("127.1.1.11", "127.1.1.19"))
    m.wait_for(lambda: addrs(dns.message.from_wire(udp_raw(m, wire))) == ["127.1.1.19"], what="the cached answer to change")


def test_a_change_to_one_service_keeps_every_other_answer_cached(fleet, start_meridian):
    """Answers are cached per service, not per snapshot: rewriting db's endpoints re-decides
    db only; payments' answers (every rotation) and an NXDOMAIN keep coming from the cache."""
    m = start_meridian(fleet)
    db = query_wire("db-0.eu-1.db.shop.global", qid=9, edns_payload=1232)
    payments = query_wire("payments.shop.global", qid=10, edns_payload=1232)
    nope = query_wire("nope.shop.global", qid=11, edns_payload=1232)
    # Every rotation of payments' answer cached (there are at most 16).
    before = {udp_raw(m, payments, FROM_EU1) for _ in range(16)}
    assert dns.message.from_wire(udp_raw(m, nope, FROM_EU1)).rcode() == dns.rcode.NXDOMAIN
    assert addrs(dns.message.from_wire(udp_raw(m, db, FROM_EU1))) == ["127.1.1.11"]
    path = fleet.cluster_dir("eu-1") / "db.yaml"
    fleet.write("clusters/eu-1/db.yaml", path.read_text().replace("127.1.1.11", "127.1.1.19"))
    m.wait_for(lambda: addrs(dns.message.from_wire(udp_raw(m, db, FROM_EU1))) == ["127.1.1.19"],
               what="db's answer to change")
    hits, misses = (metric(metrics(m), f"meridian_dns_answer_cache_{k}_total") for k in ("hits", "misses"))
    for _ in range(16):
        assert udp_raw(m, payments, FROM_EU1) in before, "payments' answer is one it gave before"
    assert dns.message.from_wire(udp_raw(m, nope, FROM_EU1)).rcode() == dns.rcode.NXDOMAIN
    after = metrics(m)
    assert metric(after, "meridian_dns_answer_cache_misses_total") == misses, "nothing but db was re-decided"
    assert metric(after, "meridian_dns_answer_cache_hits_total") == hits + 17


def test_an_nxdomain_is_not_replayed_once_its_name_exists(fleet, start_meridian):
    m = start_meridian(fleet)
    late = query_wire("late.shop.global", qid=12, edns_payload=1232)
    for _ in range(2):
        assert dns.message.from_wire(udp_raw(m, late, FROM_EU1)).rcode() == dns.rcode.NXDOMAIN
    fleet.write("clusters/eu-1/late.yaml", exported_service_yaml("late") + slice_yaml("late", ["127.1.1.77"]))
    m.wait_for(lambda: addrs(dns.message.from_wire(udp_raw(m, late, FROM_EU1))) == ["127.1.1.77"],
               what="late.shop.global to resolve")


# ---------------------------------------------------------------------------------------
# SERVFAIL before the first sync.


class Unready(Meridian):
    """A meridian that is not waited for: the test watches it come up."""

    def wait_ready(self, timeout=20):
        pass


def wait_listening(m, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if m.proc.poll() is not None:
            raise RuntimeError(f"meridian exited:\n{m.log.read_text()}")
        if udp_raw(m, query_wire("example.com", qid=1), timeout=0.1) is not None:
            return
    raise AssertionError("DNS never answered")


def readyz(m):
    try:
        return m.http("/readyz")[0]
    except OSError:
        return None


def test_servfail_until_every_member_has_synced(fleet):
    # eu-2 holds a file that is still being written (rewritten every 20 ms): its first read
    # waits for the file to settle, so eu-2 has neither synced nor failed, and meridian must
    # not answer from a partial view. (A FIFO used to do this by blocking the reader; FIFOs
    # are now skipped, issue 19.)
    late = exported_service_yaml("late") + slice_yaml("late", ["127.1.2.51"])
    writing = fleet.cluster_dir("eu-2") / "zz-late.yaml"
    writing.write_text(late)
    stop = threading.Event()

    def keep_writing():
        while not stop.is_set():
            with open(writing, "w") as f:
                f.write(late)
            time.sleep(0.02)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        m = Unready(fleet)
    except BaseException:
        stop.set()
        writer.join()
        raise
    try:
        wait_listening(m)
        deadline = time.time() + 1.5
        seen = 0
        while time.time() < deadline:
            for qname, qtype, source in [
                ("payments.shop.global", "A", FROM_EU1),
                ("nope.shop.global", "A", FROM_EU1),
                ("late.shop.global", "A", FROM_EU2),
                ("payments.shop.svc.clusterset.local", "A", FROM_EU2),
                ("global", "SOA", FROM_UNKNOWN),
            ]:
                r = ask(m, qname, qtype, source=source)
                assert r.rcode() == SERVFAIL, f"before sync, {qname} got {dns.rcode.to_text(r.rcode())}:\n{r}"
                assert r.answer == []
                seen += 1
            r = ask(m, "payments.shop.global", source=FROM_EU1, tcp=True)
            assert r.rcode() == SERVFAIL
            assert ask(m, "example.com").rcode() == REFUSED
            assert readyz(m) == 503
        assert seen > 10
        # Let eu-2 finish: the writer stops, the file settles and is read.
        stop.set()
        writer.join()
        observations = []
        deadline = time.time() + 10
        while time.time() < deadline:
            before = readyz(m)
            r = ask(m, "payments.shop.global", source=FROM_EU1)
            late_r = ask(m, "late.shop.global", source=FROM_EU2)
            after = readyz(m)
            observations.append((before, r.rcode(), late_r.rcode(), after))
            assert r.rcode() in (SERVFAIL, NOERROR) and late_r.rcode() in (SERVFAIL, NOERROR), observations
            if r.rcode() == SERVFAIL:
                assert before != 200, f"ready, yet SERVFAIL: {observations}"
            else:
                assert addrs(r) == EU1 and addrs(late_r) == ["127.1.2.51"], f"answered from a partial view: {r}\n{late_r}"
                assert after == 200
            if before == 200:
                assert r.rcode() == NOERROR, f"ready, yet {dns.rcode.to_text(r.rcode())}"
                break
        else:
            raise AssertionError(f"never became ready: {observations}")
    finally:
        stop.set()
        writer.join()
        m.stop()


def test_startup_never_answers_nxdomain_or_partial(fleet):
    """From the first packet on: SERVFAIL, or the full answer — and readiness agrees."""
    m = Unready(fleet)
    try:
        observations = []
        deadline = time.time() + 10
        while time.time() < deadline:
            before = readyz(m)
            reply = udp_raw(m, query_wire("payments.shop.global", qid=len(observations) & 0xFFFF), timeout=0.2)
            after = readyz(m)
            if reply is None:
                assert before != 200
                continue
            r = dns.message.from_wire(reply)
            observations.append((before, dns.rcode.to_text(r.rcode()), len(records(r, A)), after))
            assert r.rcode() in (SERVFAIL, NOERROR), observations
            if r.rcode() == SERVFAIL:
                assert before != 200, observations
            else:
                assert addrs(r) == ALL_PAYMENTS, f"answered before every member was read: {addrs(r)}"
                assert after == 200, observations
            if before == 200:
                break
        else:
            raise AssertionError(f"never ready: {observations}")
        # Once ready, every cluster's endpoints are there.
        for source, expected in [(FROM_EU1, EU1), (FROM_EU2, EU2), (FROM_US1, US1)]:
            assert addrs(ask(m, "payments.shop.global", source=source)) == expected
    finally:
        m.stop()


def test_ready_means_every_member_was_read(fleet):
    """Readiness promises that every member synced. With many members the first ones are read
    while the hub is still starting the others: their first read must not be lost."""
    docs = [
        "apiVersion: meridian.io/v1alpha1\nkind: MemberCluster\n"
        f"metadata: {{name: extra-{i}}}\n"
        f"spec:\n  source: {{directory: {{path: ../clusters/extra-{i}}}}}\n  network: {{name: n9}}\n"
        for i in range(300)
    ]
    fleet.write("hub/zz-extra.yaml", "---\n".join(docs))
    for i in range(300):
        (fleet.clusters / f"extra-{i}").mkdir()
    for attempt in range(3):
        m = Meridian(fleet)
        try:
            got = {c: addrs(ask(m, f"{c}.payments.shop.global")) for c in ("eu-1", "eu-2", "us-1")}
            assert got == {"eu-1": EU1, "eu-2": EU2, "us-1": US1}, (
                f"start {attempt}: ready, but a member's endpoints are missing: {got}\n{m.http('/debug/clusters')[1][:2000]}"
            )
            assert addrs(ask(m, "payments.shop.global")) == ALL_PAYMENTS
        finally:
            m.stop()


# ---------------------------------------------------------------------------------------
# Metrics.


def test_metrics_count_queries_and_cache_hits(fleet, start_meridian):
    m = start_meridian(fleet)
    before = metrics(m)
    assert metric(before, "meridian_dns_answer_cache_hits_total") == 0
    soa = query_wire("global", "SOA", qid=1)
    for _ in range(3):
        assert udp_raw(m, soa) is not None
    ask(m, "nope1.shop.global")
    ask(m, "nope2.shop.global")
    ask(m, "example.com")
    ask(m, "payments.shop.global", tcp=True)
    ask(m, "payments.shop.svc.clusterset.local", "AAAA", source=FROM_EU2)
    after = metrics(m)
    q = "meridian_dns_queries_total"
    assert metric(after, q, zone="global.", qtype="SOA", rcode="NOERROR", transport="udp") == 3
    assert metric(after, q, zone="global.", qtype="A", rcode="NXDOMAIN", transport="udp") == 2
    assert metric(after, q, zone="global.", qtype="A", rcode="NOERROR", transport="tcp") == 1
    assert metric(after, q, zone="clusterset.local.", qtype="AAAA", rcode="NOERROR", transport="udp") == 1
    refused = sum(v for (n, labels), v in after.items() if n == q and ("rcode", "REFUSED") in labels)
    assert refused == 1
    total = sum(v for (n, _), v in after.items() if n == q)
    assert total == 8
    assert metric(after, "meridian_dns_answer_cache_hits_total") == 2
    assert metric(after, "meridian_dns_answer_cache_misses_total") == 5
    # FORMERR and BADVERS are counted too.
    udp_raw(m, b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00")
    m2 = metrics(m)
    formerr = sum(v for (n, labels), v in m2.items() if n == q and ("rcode", "FORMERR") in labels)
    assert formerr == 1
