"""Kubernetes' own validation for directory members (issue 19, finding 7): a member directory
skips the API server, so meridian refuses what the API server would refuse — names that are
not DNS labels, hostnames that are not one label, endpoint addresses that are unspecified,
link-local (the cloud metadata address), multicast, broadcast or IPv4-mapped — and names each
refused object or endpoint with file, object, field and reason. Everything else in the same
files is served, and loopback endpoints stay allowed in a directory member (the quickstart
runs on loopback)."""

import json
import re
import subprocess

import dns.query
import dns.rdatatype
import dns.rcode
import dns.zone
import pytest

from ads import CDS, EDS, AdsStream, decode, node, request
from conftest import BIN, FROM_EU1, wait_xds_listening
from test_dns_wire import addrs, ask, records

A = dns.rdatatype.A
AAAA = dns.rdatatype.AAAA
SRV = dns.rdatatype.SRV
NXDOMAIN = dns.rcode.NXDOMAIN

FILE = "clusters/eu-1/hostile.yaml"

BAD_SERVICE_NAMES = ["Bad_Name", "a.b", "*"]
BAD_V4 = ["0.0.0.0", "224.0.0.1", "255.255.255.255", "169.254.169.254"]
BAD_V6 = ["::", "ff02::1", "::ffff:127.0.0.1"]
# (hostname as YAML writes it, as the reason shows it, the endpoint's otherwise good address)
BAD_HOSTNAMES = [
    ('"' + "h" * 300 + '"', '"' + "h" * 64 + '"… (300 characters)', "127.1.1.91"),
    ('"a.b"', '"a.b"', "127.1.1.92"),
    ('"a\\0b"', '"a\\0b"', "127.1.1.93"),
    ('"a b"', '"a b"', "127.1.1.94"),
]
GOOD_V4 = ["127.1.1.81", "127.1.1.82"]  # loopback: served in a directory member
GOOD_V6 = ["::1", "fd00:1:9::1"]


def service(name, namespace="shop", port_name="http"):
    return (
        "apiVersion: v1\nkind: Service\n"
        f'metadata: {{name: "{name}", namespace: "{namespace}"}}\n'
        f"spec: {{ports: [{{name: {port_name}, port: 8080, protocol: TCP}}]}}\n---\n"
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\n"
        f'metadata: {{name: "{name}", namespace: "{namespace}"}}\n---\n'
    )


def slice_of(name, service, address_type, endpoints):
    lines = [
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice",
        f'metadata: {{name: {name}, namespace: shop, labels: {{kubernetes.io/service-name: "{service}"}}}}',
        f"addressType: {address_type}",
        "ports: [{name: http, port: 8080, protocol: TCP}]",
        "endpoints:",
    ]
    lines += [f"  - {{{ep}}}" for ep in endpoints]
    return "\n".join(lines) + "\n---\n"


def hostile_yaml():
    docs = []
    for i, name in enumerate(BAD_SERVICE_NAMES):
        docs.append(service(name))
        docs.append(slice_of(f"bad-name-{i}", name, "IPv4", [f'addresses: ["127.1.1.{70 + i}"]']))
    docs.append(service("badport", port_name="my_port"))
    docs.append(slice_of("badport-1", "badport", "IPv4", ['addresses: ["127.1.1.75"]']))
    docs.append(service("web", namespace="Bad.NS"))
    docs.append(service("good"))
    v4 = [f'addresses: ["{GOOD_V4[0]}"]', f'addresses: ["{GOOD_V4[1]}"], hostname: web-0']
    v4 += [f'addresses: ["{a}"]' for a in BAD_V4]
    v4 += [f'addresses: ["{a}"], hostname: {h}' for h, _, a in BAD_HOSTNAMES]
    docs.append(slice_of("good-v4", "good", "IPv4", v4))
    v6 = [f'addresses: ["{a}"]' for a in GOOD_V6 + BAD_V6]
    docs.append(slice_of("good-v6", "good", "IPv6", v6))
    return "".join(docs)


# What must be refused: (object, field, phrase of the reason).
EXPECTED = (
    [(f"Service shop/{n}", "metadata.name", "is not a DNS-1035 label") for n in BAD_SERVICE_NAMES]
    + [(f"ServiceExport shop/{n}", "metadata.name", "is not a DNS-1035 label") for n in BAD_SERVICE_NAMES]
    + [
        (f"EndpointSlice shop/bad-name-{i}", "metadata.labels[kubernetes.io/service-name]", "is not a DNS-1035 label")
        for i in range(len(BAD_SERVICE_NAMES))
    ]
    + [
        ("Service shop/badport", "spec.ports[0].name", '"my_port" is not a DNS-1123 label'),
        ("Service Bad.NS/web", "metadata.namespace", '"Bad.NS" is not a DNS-1123 label'),
        ("ServiceExport Bad.NS/web", "metadata.namespace", '"Bad.NS" is not a DNS-1123 label'),
        ("EndpointSlice shop/good-v4", "endpoints[2].addresses[0]", "0.0.0.0 may not be unspecified"),
        ("EndpointSlice shop/good-v4", "endpoints[3].addresses[0]", "224.0.0.1 may not be in the link-local multicast range"),
        ("EndpointSlice shop/good-v4", "endpoints[4].addresses[0]", "255.255.255.255 may not be the broadcast address"),
        ("EndpointSlice shop/good-v4", "endpoints[5].addresses[0]", "169.254.169.254 may not be in the link-local range"),
        ("EndpointSlice shop/good-v6", "endpoints[2].addresses[0]", ":: may not be unspecified"),
        ("EndpointSlice shop/good-v6", "endpoints[3].addresses[0]", "ff02::1 may not be in the link-local multicast range"),
        ("EndpointSlice shop/good-v6", "endpoints[4].addresses[0]", "::ffff:127.0.0.1 may not be an IPv4-mapped IPv6 address"),
    ]
    + [
        ("EndpointSlice shop/good-v4", f"endpoints[{6 + i}].hostname", f"{shown} is not a DNS-1123 label")
        for i, (_, shown, _) in enumerate(BAD_HOSTNAMES)
    ]
)
# The slice with a refused Service name in it (badport-1) is not refused itself: its Service is.


@pytest.fixture
def hostile(fleet, start_meridian):
    fleet.write(FILE, hostile_yaml())
    m = start_meridian(fleet)
    return m


def problems(m):
    status, body = m.http("/debug/problems")
    assert status == 200
    return json.loads(body)["problems"]


def test_every_refused_object_and_endpoint_is_named_on_debug_problems(hostile, fleet):
    path = str(fleet.root / FILE)
    found = hostile.wait_for(lambda: len(problems(hostile)) >= len(EXPECTED) and problems(hostile),
                             timeout=5, what="every refusal on /debug/problems")
    assert len(found) == len(EXPECTED), json.dumps(found, indent=1)
    for obj, field, phrase in EXPECTED:
        hits = [p for p in found if p["object"] == f"{path}: {obj}" and field in p["reason"] and phrase in p["reason"]]
        assert len(hits) == 1, f"{obj} {field} {phrase!r} in {json.dumps(found, indent=1)}"
        assert hits[0]["cluster"] == "eu-1" and hits[0]["file"] == path and hits[0]["source"] == "file"
    for p in found:
        assert "\x00" not in p["reason"] and "\n" not in p["reason"], p
        if p["kind"] == "EndpointSlice" and p["name"].startswith("good-"):
            assert p["reason"].endswith("; endpoint left out"), p


def all_names_and_addresses(m):
    z = dns.zone.from_xfr(dns.query.xfr("127.0.0.1", "global.", port=m.dns_port, source=FROM_EU1, timeout=5, lifetime=10))
    names = [n.to_text() for n in z.nodes]
    addresses = set()
    targets = set()
    for n, rdataset in z.iterate_rdatasets():
        for rd in rdataset:
            if rdataset.rdtype in (A, AAAA):
                addresses.add(rd.address)
            elif rdataset.rdtype == SRV:
                targets.add(rd.target.to_text())
    return names, addresses, targets


# One label of a served name: letters, digits and dashes (an IPv6 endpoint's name is its address
# with ':' as '-', so `::1` is `--1`), or `_port`/`_proto` of an SRV name; never an escaped
# dot, space, NUL or wildcard.
LABEL = re.compile(r"^(_?[a-z0-9-]{1,63}|@)$")


def test_refused_names_and_addresses_appear_nowhere_in_dns(hostile):
    # The good service: its loopback and ULA endpoints are served, the refused ones are not.
    assert addrs(ask(hostile, "good.shop.global")) == sorted(GOOD_V4)
    assert addrs(ask(hostile, "good.shop.global", "AAAA"), AAAA) == sorted(GOOD_V6)
    assert addrs(ask(hostile, "web-0.eu-1.good.shop.global")) == ["127.1.1.82"]
    srv = ask(hostile, "_http._tcp.good.shop.global", "SRV")
    targets = sorted(rd.target.to_text() for rd in records(srv, SRV))
    assert len(targets) == len(GOOD_V4) + len(GOOD_V6), targets
    assert "web-0.eu-1.good.shop.global." in targets and "127-1-1-81.eu-1.good.shop.global." in targets
    extra = sorted(rd.address for rrset in srv.additional if rrset.rdtype in (A, AAAA) for rd in rrset)
    assert extra == sorted(GOOD_V4 + GOOD_V6), extra
    # Refused names are not served under any spelling.
    for qname in ("bad_name.shop.global", "Bad_Name.shop.global", "*.shop.global", "badport.shop.global",
                  "web.bad.ns.global", "_my_port._tcp.badport.shop.global"):
        assert ask(hostile, qname).rcode() == NXDOMAIN, qname
    # The whole zone: every name is made of DNS labels, no refused address or hostname is in it.
    names, addresses, srv_targets = all_names_and_addresses(hostile)
    for n in names:
        assert all(LABEL.match(label) for label in n.split(".")), f"{n!r} in the AXFR"
    bad_addresses = set(BAD_V4 + BAD_V6) | {a for _, _, a in BAD_HOSTNAMES} | {f"127.1.1.{70 + i}" for i in range(3)} | {"127.1.1.75"}
    assert not addresses & bad_addresses, addresses & bad_addresses
    assert set(GOOD_V4 + GOOD_V6) <= addresses
    for t in srv_targets:
        assert all(LABEL.match(label) for label in t.rstrip(".").split(".")), t
    # The rest of the fleet still serves.
    assert addrs(ask(hostile, "payments.shop.global", source=FROM_EU1)) == ["127.1.1.1", "127.1.1.2"]


def test_refused_endpoints_are_not_in_eds(hostile):
    wait_xds_listening(hostile)
    s = AdsStream(hostile.xds_port)
    try:
        n = node("hostile-test", "eu-1", "n1")
        s.send(request(CDS, node=n))
        clusters = decode(s.recv_type(CDS, timeout=10))
        assert "good.shop.global:8080" in clusters, sorted(clusters)
        for name in clusters:
            assert re.match(r"^[a-z0-9-]+\.[a-z0-9-]+\.global:\d+$", name), f"refused name in CDS: {name}"
        s.send(request(EDS, ["good.shop.global:8080"], node=n))
        cla = decode(s.recv_type(EDS, timeout=10))["good.shop.global:8080"]
        served = sorted(
            lb.endpoint.address.socket_address.address
            for locality in cla.endpoints for lb in locality.lb_endpoints
        )
        assert served == sorted(GOOD_V4 + GOOD_V6), served
    finally:
        s.close()


def test_validate_names_each_refusal_with_file_field_and_reason(fleet):
    fleet.write(FILE, hostile_yaml())
    p = subprocess.run([str(BIN), "validate", "--config", str(fleet.config)], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0, p.stdout
    errors = [line for line in p.stdout.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(EXPECTED), p.stdout
    path = str(fleet.root / FILE)
    for obj, field, phrase in EXPECTED:
        hits = [e for e in errors if e.startswith(f"error: {path}: {obj}: ") and field in e and phrase in e]
        assert len(hits) == 1, f"{obj} {field} {phrase!r}:\n{p.stdout}"
    assert f"{len(EXPECTED)} error(s)" in p.stdout
