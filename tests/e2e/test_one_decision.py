"""One scheduling decision for DNS and xDS (commit 9e814f4: `select_for(Client{cluster,
network, uses_gateways})`), end to end against the release binary, real gRPC servers
(greeter.py), a real proxyless gRPC client (grpcio, xds_client.py), hand-driven ADS streams
(ads.py) and dnspython.

1. A proxyless gRPC client cannot use an east-west gateway, so a gateway member must not
   count towards `minHealthyEndpoints` for it: its own tier spills into the next one, as
   DNS's does for a client that sees only same-network clusters. The fleet (region r1 unless
   said otherwise, Locality mode, `minHealthyEndpoints: 2`):

       home    zone r1-a  net-1  1 ready endpoint   <- the clients
       across  zone r1-a  net-2  3 ready, east-west gateway 127.2.2.100:15443
       near    zone r1-b  net-1  2 ready
       far     r2 / r2-a  net-1  1 ready

   An Envoy node (and DNS) in home: priority 0 = home + across's gateway (1 + 3 >= 2),
   then near, then far. A proxyless node in home: across is filtered (GatewayUnusable), so
   home (1 < 2) spills into near: priority 0 = home + near, then far. Before 9e814f4, xDS
   dropped the gateway member after the decision: the proxyless node got home alone at
   priority 0 and near at priority 1, so a gRPC client with a healthy home endpoint only ever
   called home's server.

   Every address in this fleet has a greeter server (labelled by cluster, the gateway as
   "gateway"), so where the gRPC client's calls land is what it was sent.

2. Two clusters reporting one address: the decision answers it once, by the member that
   comes first; a member left with no ready endpoint is filtered (DuplicateAddresses). DNS
   A, SRV and EDS give the same addresses, the shared one exactly once. Before 9e814f4, DNS
   answered the address once per cluster (an SRV record under each cluster's name) while
   EDS kept one copy.

No test sleeps to assert: each waits for what it expects with a deadline, and fails with
the state it last saw.
"""

import json
import socket
import struct

import dns.edns
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import grpc
import pytest
from envoy.config.core.v3 import base_pb2, health_check_pb2
from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc

import ads
from ads import AdsStream
from conftest import FROM_UNKNOWN, Fleet, Meridian, wait_xds_listening
from greeter import Greeters
from xds_client import XdsClient

NS = "one"
PORT = 50051
GRPC_SERVICE = "echo"
RESOURCE = f"{GRPC_SERVICE}.{NS}.global:{PORT}"
TARGET = f"xds:///{RESOURCE}"

FIRST_CALL_TIMEOUT = 30  # seconds from a client's start to its first calls answered
SPREAD_TIMEOUT = 10  # seconds for the client's calls to reach every server of its priority 0
SWITCH_TIMEOUT = 10  # seconds from an edit on disk to DNS following it

MERIDIAN_YAML = """\
hub:
  directory: hub
dns:
  zones:
    - {name: global, style: global}
  ttl: 5
"""


def member(name, region, zone, network, cidr, gateway=None):
    text = (
        "---\napiVersion: meridian.io/v1alpha1\nkind: MemberCluster\n"
        f"metadata:\n  name: {name}\n"
        f"  labels: {{topology.kubernetes.io/region: {region}, topology.kubernetes.io/zone: {zone}}}\n"
        f"spec:\n  source: {{directory: {{path: ../clusters/{name}}}}}\n"
        f"  network: {{name: {network}, dnsClientCIDRs: [{cidr}]}}\n"
    )
    if gateway:
        text += f"  gateway: {{address: {gateway[0]}, port: {gateway[1]}}}\n"
    return text


def service_yaml(service, port_name, port, zone, addresses):
    """Service + ServiceExport + one EndpointSlice with every address ready, in `zone`."""
    endpoints = "".join(
        f"  - {{addresses: [\"{ip}\"], conditions: {{ready: true}}, zone: {zone}}}\n" for ip in addresses
    )
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata: {{name: {service}, namespace: {NS}}}\n"
        f"spec: {{ports: [{{name: {port_name}, port: {port}, protocol: TCP}}]}}\n"
        "---\napiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\n"
        f"metadata: {{name: {service}, namespace: {NS}}}\n"
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n"
        f"metadata: {{name: {service}-x, namespace: {NS}, labels: {{kubernetes.io/service-name: {service}}}}}\n"
        "addressType: IPv4\n"
        f"ports: [{{name: {port_name}, port: {port}, protocol: TCP}}]\n"
        "endpoints:\n" + endpoints
    )


def make_fleet(root, members, services):
    """A directory fleet: `members` (member() texts), `services` {cluster: service yaml}."""
    fleet = Fleet(root)
    fleet.write("meridian.yaml", MERIDIAN_YAML)
    fleet.write("hub/members.yaml", "".join(members))
    for cluster, text in services.items():
        fleet.write(f"clusters/{cluster}/service.yaml", text)
    return fleet


@pytest.fixture
def run_meridian():
    started = []

    def run(fleet):
        m = Meridian(fleet)
        started.append(m)
        wait_xds_listening(m)
        return m

    yield run
    for m in started:
        m.stop()


# ---------------------------------------------------------------------------------------
# DNS and xDS helpers.


def raw_query(m, name, rdtype, source=FROM_UNKNOWN, ecs=None):
    """(ANCOUNT from the reply's header, the parsed reply): dnspython merges identical records
    of an RRset when it parses, so duplicates are counted on the wire."""
    options = [dns.edns.ECSOption(*ecs)] if ecs else []
    q = dns.message.make_query(name, rdtype, use_edns=0 if ecs else False, options=options)
    q.flags &= ~dns.flags.RD
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((source, 0))
        s.settimeout(5)
        s.sendto(q.to_wire(), ("127.0.0.1", m.dns_port))
        wire, _ = s.recvfrom(65535)
    reply = dns.message.from_wire(wire)
    assert reply.id == q.id
    assert reply.rcode() == dns.rcode.NOERROR, f"{name} {rdtype}: {dns.rcode.to_text(reply.rcode())}\n{reply}"
    return struct.unpack("!H", wire[6:8])[0], reply


def a_records(m, name, **kw):
    """The addresses of the A records of `name`, one entry per record on the wire."""
    count, reply = raw_query(m, name, "A", **kw)
    addresses = [rr.address for rrset in reply.answer if rrset.rdtype == dns.rdatatype.A for rr in rrset]
    assert count == len(addresses), (
        f"{name} A: {count} answer records on the wire, {len(addresses)} distinct: an address answered twice\n{reply}"
    )
    return sorted(addresses)


def srv_records(m, name, **kw):
    """[(priority, port, target, [addresses of target in the additional section])]."""
    count, reply = raw_query(m, name, "SRV", **kw)
    records = [rr for rrset in reply.answer if rrset.rdtype == dns.rdatatype.SRV for rr in rrset]
    assert count == len(records), f"{name} SRV: {count} records on the wire, {len(records)} parsed\n{reply}"
    glue = {}
    for rrset in reply.additional:
        if rrset.rdtype == dns.rdatatype.A:
            glue.setdefault(rrset.name.to_text(), []).extend(rr.address for rr in rrset)
    return sorted(
        (rr.priority, rr.port, rr.target.to_text(), sorted(glue.get(rr.target.to_text(), [])))
        for rr in records
    )


def node(node_id, cluster, network, user_agent):
    """An xDS node; cluster None names no cluster at all (an unknown client)."""
    if cluster is None:
        return base_pb2.Node(id=node_id, user_agent_name=user_agent)
    return ads.node(node_id, cluster, network, user_agent=user_agent)


def eds(m, resource, cluster, network, user_agent="envoy"):
    """The ClusterLoadAssignment of `resource` sent to a node of `cluster` on `network`."""
    s = AdsStream(m.xds_port)
    try:
        who = f"{'grpc' if user_agent != 'envoy' else 'envoy'}-{cluster}"
        s.send(ads.request(ads.EDS, [resource], node=node(who, cluster, network, user_agent)))
        got = ads.decode(s.recv_type(ads.EDS, timeout=10))
        assert resource in got, f"EDS for {who}: no {resource} in {sorted(got)}"
        return got[resource]
    finally:
        s.close()


def priorities(cla):
    """{priority: sorted [(sub_zone, address, port, health)]} of an assignment."""
    out = {}
    for loc in cla.endpoints:
        for e in loc.lb_endpoints:
            sa = e.endpoint.address.socket_address
            out.setdefault(loc.priority, []).append(
                (loc.locality.sub_zone, sa.address, sa.port_value, health_check_pb2.HealthStatus.Name(e.health_status))
            )
    return {p: sorted(eps) for p, eps in sorted(out.items())}


def healthy_addresses(cla, priority):
    return sorted(a for _, a, _, h in priorities(cla).get(priority, []) if h == "HEALTHY")


def every_address(cla):
    """Every endpoint address over every priority, one entry per lb_endpoint."""
    return sorted(a for eps in priorities(cla).values() for _, a, _, _ in eps)


def described(assignment):
    """{priority: sorted [(cluster, "ip:port", health, via gateway)]} of an assignment as
    /debug/xds/dump and /debug/explain describe it."""
    out = {}
    for loc in assignment["detail"]["localities"]:
        out.setdefault(loc["priority"], []).extend(
            (loc["cluster"], e["address"], e["health"], e["viaGateway"]) for e in loc["endpoints"])
    return {p: sorted(v) for p, v in sorted(out.items())}


def debug_json(m, path):
    status, body = m.http(path)
    assert status == 200, f"{path}: {status} {body}"
    return json.loads(body)


def csds_versions(m, node_id):
    """{(type_url, name): (version, client status)} CSDS reports for `node_id`."""
    from envoy.admin.v3 import config_dump_shared_pb2

    with grpc.insecure_channel(f"127.0.0.1:{m.xds_port}") as channel:
        response = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel).FetchClientStatus(
            csds_pb2.ClientStatusRequest(node=base_pb2.Node(id=node_id)), timeout=5,
        )
    return {
        (g.type_url, g.name): (g.version_info, config_dump_shared_pb2.ClientResourceStatus.Name(g.client_status))
        for config in response.config
        for g in config.generic_xds_configs
    }


# ---------------------------------------------------------------------------------------
# 1. A proxyless gRPC client spills past a gateway it cannot use.

HOME_FROM = "127.0.61.1"
HOME = ["127.2.1.1"]
ACROSS = ["127.2.2.1", "127.2.2.2", "127.2.2.3"]
GATEWAY = ("127.2.2.100", 15443)
NEAR = ["127.2.3.1", "127.2.3.2"]
FAR = ["127.2.4.1"]

SPILL_MEMBERS = {
    "home": member("home", "r1", "r1-a", "net-1", "127.0.61.0/24"),
    "across": member("across", "r1", "r1-a", "net-2", "127.0.62.0/24", gateway=GATEWAY),
    "near": member("near", "r1", "r1-b", "net-1", "127.0.63.0/24"),
    "far": member("far", "r2", "r2-a", "net-1", "127.0.64.0/24"),
}

MIN_HEALTHY_2 = f"""\
apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {{name: echo-min-2, namespace: {NS}, creationTimestamp: "2026-01-01T00:00:00Z"}}
spec:
  resourceSelectors: [{{kind: Service, name: {GRPC_SERVICE}}}]
  traffic: {{mode: Locality, minHealthyEndpoints: 2}}
"""


def reply(label, ip, port=PORT):
    return f"{label} {ip}:{port}"


@pytest.fixture(scope="module")
def spill_servers(tmp_path_factory):
    """A greeter server on every address of the spill fleet, the gateway's included."""
    servers = [(c, f"{ip}:{PORT}") for c, ips in
               (("home", HOME), ("across", ACROSS), ("near", NEAR), ("far", FAR)) for ip in ips]
    servers.append(("gateway", f"{GATEWAY[0]}:{GATEWAY[1]}"))
    try:
        g = Greeters(servers, tmp_path_factory.mktemp("one-decision") / "greeters.log")
    except RuntimeError as e:
        pytest.fail(str(e))
    yield g
    g.stop()


@pytest.fixture
def spill_fleet(tmp_path):
    zones = {"home": ("r1-a", HOME), "across": ("r1-a", ACROSS), "near": ("r1-b", NEAR), "far": ("r2-a", FAR)}
    fleet = make_fleet(
        tmp_path / "fleet", SPILL_MEMBERS.values(),
        {c: service_yaml(GRPC_SERVICE, "grpc", PORT, z, ips) for c, (z, ips) in zones.items()},
    )
    fleet.write("hub/echo-policy.yaml", MIN_HEALTHY_2)
    return fleet


def test_proxyless_client_spills_past_a_gateway_it_cannot_use(spill_fleet, spill_servers, run_meridian,
                                                              xds_clients, tmp_path):
    """(a) Envoy node and DNS of home: home + across's gateway first. (b) The real grpcio
    client of home calls home's and near's servers (one priority), never the gateway; the
    EDS it ACKed (CSDS) is the proxyless feed with home + near at priority 0. (c) That is
    what DNS answers home once across has no gateway (so DNS cannot use it either)."""
    m = run_meridian(spill_fleet)
    explained = debug_json(m, f"/debug/explain?service={GRPC_SERVICE}.{NS}&cluster=home")
    assert explained["policy"]["source"] and explained["policy"]["minHealthyEndpoints"] == 2, explained["policy"]

    # (a) An Envoy node of home: home's endpoint and across's gateway at priority 0 (4 ready
    # endpoints, >= 2: no spill into near).
    envoy = priorities(eds(m, RESOURCE, "home", "net-1"))
    assert envoy == {
        0: [("across", GATEWAY[0], GATEWAY[1], "HEALTHY"), ("home", HOME[0], PORT, "HEALTHY")],
        1: [("near", ip, PORT, "HEALTHY") for ip in NEAR],
        2: [("far", FAR[0], PORT, "HEALTHY")],
    }, envoy

    # DNS for a client of home (source address in home's dnsClientCIDRs) answers the same
    # priority 0: it can use the gateway too.
    assert a_records(m, f"{GRPC_SERVICE}.{NS}.global", source=HOME_FROM) == sorted([HOME[0], GATEWAY[0]])
    # ...and so does the decision `meridian explain` shows for home, and its DNS and EDS
    # halves: home's own tier (1 ready) merged with the same-zone one, across through its
    # gateway.
    decision = explained["decision"]
    assert [(t["reasons"], sorted((c["cluster"], c["viaGateway"]) for c in t["clusters"]))
            for t in decision["tiers"]] == [
        (["ClientCluster", "SameZone"], [("across", True), ("home", False)]),
        (["SameRegion"], [("near", False)]),
        (["Remote"], [("far", False)]),
    ], explained["words"]
    assert decision["spills"] == 1 and decision["filtered"] == [], explained["words"]
    assert sorted(r.split()[-1] for r in explained["dns"]["answers"]) == sorted([HOME[0], GATEWAY[0]]), explained["words"]
    [explained_eds] = [a for a in explained["eds"] if a["name"] == RESOURCE]
    assert sorted(a.rsplit(":", 1)[0] for _, a, _, _ in described(explained_eds)[0]) == sorted([GATEWAY[0], HOME[0]])

    # (b) The real grpcio client in home: with home's only endpoint healthy, its calls reach
    # home's server AND near's (priority 0 spans both), never far's, across's or the gateway.
    client = xds_clients(XdsClient.python(tmp_path, "home-proxyless", m.xds_port, [TARGET], "home", "net-1"))
    client.wait_for(lambda calls: any(c["ok"] for c in calls), timeout=FIRST_CALL_TIMEOUT,
                    what="a first answered call")
    first = min(c["t"] for c in client.calls() if c["ok"])
    priority0 = {reply("home", HOME[0])} | {reply("near", ip) for ip in NEAR}

    def answered_by_all(calls):
        servers = {c["server"] for c in calls if c["ok"]}
        return servers if servers >= priority0 else None

    reached = client.wait_for(
        answered_by_all, since=first, timeout=SPREAD_TIMEOUT, what=f"calls answered by every server of priority 0 {sorted(priority0)}",
    )
    assert reached == priority0
    # Then over a few dozen more calls: every one answered, by priority 0 alone.
    calls = client.wait_for(lambda calls: len(calls) >= 40 and calls, since=first, timeout=SPREAD_TIMEOUT,
                            what="40 calls since the first answered one")
    stray = [c for c in calls if not c["ok"] or c["server"] not in priority0]
    assert not stray, (
        f"{len(stray)} of {len(calls)} calls failed or left priority 0 (home + near): {stray[:3]}\n{client.describe()}"
    )

    expected_proxyless = {
        0: sorted([("home", HOME[0], PORT, "HEALTHY")] + [("near", ip, PORT, "HEALTHY") for ip in NEAR]),
        1: [("far", FAR[0], PORT, "HEALTHY")],
    }
    # A proxyless node of home as the ADS helper sees it (as gRPC): across is not usable,
    # home spills into near at priority 0; across appears nowhere, not even its gateway.
    grpc_eds = priorities(eds(m, RESOURCE, "home", "net-1", user_agent=ads.GRPC_AGENT))
    assert grpc_eds == expected_proxyless, grpc_eds

    # What that very client holds: CSDS says it ACKed the EDS version /debug/xds/dump shows
    # for a proxyless node of home, and that assignment is the one above.
    feed = debug_json(m, "/debug/xds/dump?cluster=home&network=net-1&role=proxyless")["feed"]
    dump = {r["name"]: r for r in feed["resources"]["EDS"]}[RESOURCE]

    def acked():
        held = csds_versions(m, "home-proxyless").get((ads.EDS, RESOURCE))
        return held if held and held[1] == "ACKED" else None

    held = m.wait_for(acked, what="CSDS reporting the real client's EDS as ACKED")
    assert held == (dump["version"], "ACKED"), (held, dump["version"])
    assert described(dump) == {
        p: sorted((c, f"{a}:{port}", h, False) for c, a, port, h in eps) for p, eps in expected_proxyless.items()
    }, dump

    # (c) The proxyless client's priority 0 is what DNS answers a client of home that sees
    # only same-network clusters: take across's gateway away and DNS spills exactly so.
    proxyless_p0 = healthy_addresses(eds(m, RESOURCE, "home", "net-1", user_agent=ads.GRPC_AGENT), 0)
    assert proxyless_p0 == sorted(HOME + NEAR)
    members = (spill_fleet.hub / "members.yaml").read_text()
    gateway_line = f"  gateway: {{address: {GATEWAY[0]}, port: {GATEWAY[1]}}}\n"
    assert gateway_line in members
    spill_fleet.write("hub/members.yaml", members.replace(gateway_line, ""))
    m.wait_for(lambda: a_records(m, f"{GRPC_SERVICE}.{NS}.global", source=HOME_FROM) == proxyless_p0,
               timeout=SWITCH_TIMEOUT, what=f"DNS from home answering {proxyless_p0} once across has no gateway")
    explained = debug_json(m, f"/debug/explain?service={GRPC_SERVICE}.{NS}&cluster=home")
    assert explained["decision"]["filtered"] == [
        {"cluster": "across", "reason": "OtherNetworkNoGateway"}
    ], explained["words"]
    assert [sorted(c["cluster"] for c in t["clusters"]) for t in explained["decision"]["tiers"]] == [
        ["home", "near"], ["far"],
    ], explained["words"]
    # An Envoy node now gets the proxyless client's decision (xDS is rebuilt after a
    # debounce, so it may lag DNS a little); the proxyless one did not depend on across's
    # gateway: it is unchanged, and so is where its calls go.
    m.wait_for(lambda: priorities(eds(m, RESOURCE, "home", "net-1")) == expected_proxyless,
               timeout=SWITCH_TIMEOUT, what="an Envoy node of home getting home + near at priority 0")
    assert priorities(eds(m, RESOURCE, "home", "net-1", user_agent=ads.GRPC_AGENT)) == expected_proxyless
    assert not [c for c in client.calls(since=first) if not c["ok"] or c["server"] not in priority0], client.describe()


# ---------------------------------------------------------------------------------------
# 2. An address two clusters report is answered once, by DNS and EDS alike.

DUP_SERVICE = "dup"
DUP_PORT = 8080
DUP_NAME = f"{DUP_SERVICE}.{NS}.global"
DUP_RESOURCE = f"{DUP_NAME}:{DUP_PORT}"
SHARED = "127.2.9.9"
OWN = {"left": "127.2.5.1", "right": "127.2.6.1"}
FROM_CIDR = {"left": ("127.0.65.0", 24), "right": ("127.0.66.0", 24), "mirror": ("127.0.67.0", 24)}

# left and right share region ra (zones ra-1, ra-2); mirror, in region rb, reports only the
# shared address. All on net-1.
DUP_MEMBERS = [
    member("left", "ra", "ra-1", "net-1", "127.0.65.0/24"),
    member("right", "ra", "ra-2", "net-1", "127.0.66.0/24"),
    member("mirror", "rb", "rb-1", "net-1", "127.0.67.0/24"),
]


@pytest.fixture
def dup_fleet(tmp_path):
    return make_fleet(tmp_path / "fleet", DUP_MEMBERS, {
        "left": service_yaml(DUP_SERVICE, "http", DUP_PORT, "ra-1", [SHARED, OWN["left"]]),
        "right": service_yaml(DUP_SERVICE, "http", DUP_PORT, "ra-2", [SHARED, OWN["right"]]),
        "mirror": service_yaml(DUP_SERVICE, "http", DUP_PORT, "rb-1", [SHARED]),
    })


@pytest.mark.parametrize("client", [None, "left", "right", "mirror"])
def test_an_address_two_clusters_report_is_answered_once(dup_fleet, run_meridian, client):
    """For an unknown client (one tier of every cluster) and a client of each cluster (asked
    by EDNS Client Subnet from an unknown source address, so ECS decides): DNS A = EDS
    priority 0 of an Envoy node of that cluster; the shared address once in A, in SRV and
    in EDS over every priority, under the cluster that comes first; a cluster whose only
    address another one answers is filtered (DuplicateAddresses) from DNS and EDS."""
    m = run_meridian(dup_fleet)
    ecs = FROM_CIDR[client] if client else None
    # Which cluster answers the shared address: the client's own; for an unknown client, the
    # first of the one tier (left and right weigh 2 each, mirror 1; then cluster order).
    owner = client or "left"

    cla = eds(m, DUP_RESOURCE, client, "net-1")
    a = a_records(m, DUP_NAME, ecs=ecs)
    assert a == healthy_addresses(cla, 0), f"DNS A {a} vs EDS priority 0 {priorities(cla)}"
    assert a.count(SHARED) == 1 and every_address(cla).count(SHARED) == 1, (a, priorities(cla))
    # Every address EDS holds, over every priority, once; the shared one under its owner.
    everything = sorted([SHARED, *OWN.values()])
    assert every_address(cla) == everything, priorities(cla)
    assert [c for eps in priorities(cla).values() for c, ip, _, _ in eps if ip == SHARED] == [owner], priorities(cla)
    expected_a = {None: everything, "left": [OWN["left"], SHARED], "right": [OWN["right"], SHARED], "mirror": [SHARED]}
    assert a == sorted(expected_a[client]), a

    # SRV over every tier: one record per address, the shared one under its owner's name;
    # each target resolves to its address, in the additional section and when asked.
    srv = srv_records(m, f"_http._tcp.{DUP_NAME}", ecs=ecs)
    targets = {}
    for _, port, target, glue in srv:
        assert port == DUP_PORT, srv
        ip = target.split(".", 1)[0].replace("-", ".")
        assert glue == [ip], f"{target}: additional section {glue}\n{srv}"
        assert a_records(m, target, ecs=ecs) == [ip], target
        targets.setdefault(ip, []).append(target.split(".")[1])
    assert targets == {OWN["left"]: ["left"], OWN["right"]: ["right"], SHARED: [owner]}, srv
    # SRV priorities are the decision's tiers, as EDS's are.
    srv_priority = {target.split(".", 1)[0].replace("-", "."): p for p, _, target, _ in srv}
    eds_priority = {ip: p for p, eps in priorities(cla).items() for _, ip, _, _ in eps}
    assert srv_priority == eds_priority, (srv, priorities(cla))

    # The decision names the clusters that lost every address they report.
    explained = debug_json(m, f"/debug/explain?service={DUP_SERVICE}.{NS}" + (f"&cluster={client}" if client else ""))
    filtered = {f["cluster"]: (f["reason"], f.get("detail")) for f in explained["decision"]["filtered"]}
    if client == "mirror":
        # mirror comes first for its own client and keeps the shared address; left and
        # right keep their own addresses.
        assert filtered == {}, explained["words"]
    else:
        assert filtered == {"mirror": ("DuplicateAddresses", owner)}, explained["words"]
    assert "mirror" not in {loc.locality.sub_zone for loc in cla.endpoints} or client == "mirror", priorities(cla)
    # The per-cluster name of mirror is not answered where the decision leaves it out.
    _, reply = raw_query(m, f"mirror.{DUP_NAME}", "A", ecs=ecs)
    got = sorted(rr.address for rrset in reply.answer for rr in rrset)
    assert got == ([SHARED] if client == "mirror" else []), reply
