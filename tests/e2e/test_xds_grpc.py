"""meridian's xDS feed, used by gRPC's own xDS clients: grpcio (C-core's xDS client, run by
xds_client.py) and grpc-go (tests/peers/xds: xds-greeter-client), calling real gRPC servers
(greeter.py) through `xds:///greeter.demo.global:50051`.

The fleet (xds_fleet.py) is the quickstart plus ap-1 (region ap, network n1) and an exported
gRPC service demo/greeter with servers in every cluster. us-1 stays on network n2, as in the
quickstart: a proxyless client has no east-west gateway, so a client in eu-1 must never be
sent to us-1's servers, whatever fails; ap-1 gives it a reachable cross-region tier.

Each client is a process of its own (the xDS bootstrap is process-global): the pytest
process hosts no gRPC xDS state. A client calls every 50 ms and prints one JSON line per
call; the tests read them as they come. The peers are never optional: a missing or
unbuildable peer fails the test with the reason. Switch times are printed as "MEASURED:".
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import ads
import xds_fleet
from ads import AdsStream, client_status
from conftest import ROOT
from xds_client import XdsClient
from xds_fleet import NETWORKS, replies, target

EU1 = replies("eu-1")
EU2 = replies("eu-2")
US1 = replies("us-1")
AP1 = replies("ap-1")
GREETER = target("greeter")
GREETER2 = target("greeter2")
GREETER3 = target("greeter3")

XDS_PEERS_SCRIPT = ROOT / "tests" / "peers" / "xds.sh"
XDS_PEERS_BUILD_TIMEOUT = 1800  # seconds; a first build downloads and compiles grpc-go

FIRST_CALL_TIMEOUT = 30  # seconds from a client's start to its first calls answered
SWITCH_TIMEOUT = 10  # seconds from an edit on disk to calls following it


# ---------------------------------------------------------------------------------------
# Peers and clients


@pytest.fixture(scope="session")
def xds_peers():
    """The directory holding the Go peers (xds-greeter-client, xds-validate) built by
    tests/peers/xds.sh (fails, never skips). tests/run builds them first and passes the
    directory in XDS_PEERS_DIR."""
    given = os.environ.get("XDS_PEERS_DIR")
    if given:
        directory = Path(given)
    else:
        if not XDS_PEERS_SCRIPT.exists():
            pytest.fail(f"{XDS_PEERS_SCRIPT} is missing: it builds the Go xDS peers")
        try:
            out = subprocess.run(["bash", str(XDS_PEERS_SCRIPT)], capture_output=True, text=True,
                                 timeout=XDS_PEERS_BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{XDS_PEERS_SCRIPT} did not finish within {XDS_PEERS_BUILD_TIMEOUT}s")
        if out.returncode != 0:
            pytest.fail(f"cannot build the Go xDS peers with {XDS_PEERS_SCRIPT} (exit {out.returncode}):\n{out.stderr[-4000:]}")
        lines = out.stdout.strip().splitlines()
        directory = Path(lines[-1]) if lines else Path("")
    for name in ("xds-greeter-client", "xds-validate"):
        if not os.access(directory / name, os.X_OK):
            pytest.fail(f"no executable {name} in {directory} (from XDS_PEERS_DIR or {XDS_PEERS_SCRIPT})")
    return directory


@pytest.fixture(params=["python", "go"])
def start_client(request, xds_meridian, xds_clients, tmp_path):
    """Starts a greeter client of one kind (grpcio or grpc-go) as a node of a cluster."""
    kind = request.param

    def start(name, cluster, call=GREETER, network=None):
        network = network or NETWORKS[cluster]
        if kind == "python":
            client = XdsClient.python(tmp_path, name, xds_meridian.xds_port, [call], cluster, network)
        else:
            binary = request.getfixturevalue("xds_peers") / "xds-greeter-client"
            client = XdsClient.go(binary, tmp_path, name, xds_meridian.xds_port, call, cluster, network)
        return xds_clients(client)

    start.kind = kind
    return start


def python_client(m, xds_clients, tmp_path, name, cluster, targets=(GREETER,), **bootstrap_kw):
    return xds_clients(XdsClient.python(tmp_path, name, m.xds_port, list(targets), cluster, NETWORKS[cluster], **bootstrap_kw))


def stray(calls, servers):
    """The calls that failed or were answered by a server not in `servers`."""
    servers = set(servers)
    return [c for c in calls if not (c["ok"] and c["server"] in servers)]


def assert_only(client, calls, servers, what):
    assert calls, f"no calls over the window ({what})\n{client.describe()}"
    bad = stray(calls, servers)
    assert not bad, (
        f"{what}: {len(bad)} of {len(calls)} calls failed or went elsewhere than {sorted(servers)}; "
        f"first: {bad[:3]}\n{client.describe()}"
    )


# ---------------------------------------------------------------------------------------
# A client reaches its own cluster's servers, and only those.


def test_each_client_reaches_only_its_own_cluster(start_client):
    clients = {cluster: start_client(f"{cluster}-{start_client.kind}", cluster) for cluster in ("eu-1", "eu-2", "us-1", "ap-1")}
    for cluster, client in clients.items():
        client.wait_serving(replies(cluster), timeout=FIRST_CALL_TIMEOUT)
    start = time.time()
    time.sleep(3)
    for cluster, client in clients.items():
        calls = [c for c in client.calls(since=start) if c["t"] < start + 3]
        assert len(calls) >= 30, f"{cluster}: only {len(calls)} calls in 3 s at one per 50 ms\n{client.describe()}"
        assert_only(client, calls, replies(cluster), f"a client of {cluster}")
        # Every endpoint of the locality gets calls (round robin inside a locality).
        assert {c["server"] for c in calls} == set(replies(cluster)), f"{cluster}: not every server was called"


def test_cluster_from_locality_sub_zone_without_metadata(xds_meridian, xds_clients, tmp_path):
    """No CLUSTER_ID in the node metadata: meridian takes the cluster from locality.sub_zone."""
    client = python_client(xds_meridian, xds_clients, tmp_path, "sub-zone-only", "eu-2", cluster_id=False)
    client.wait_serving(EU2, timeout=FIRST_CALL_TIMEOUT)
    assert_only(client, client.window(2), EU2, "a node whose locality.sub_zone is eu-2")


def test_csds_reports_what_a_real_client_acked(xds_meridian, xds_clients, tmp_path):
    """CSDS (FetchClientStatus) on a grpcio client: the four resources of its service ACKed,
    a service it asks for that does not exist listed as such."""
    client = python_client(xds_meridian, xds_clients, tmp_path, "csds-eu-1", "eu-1", targets=(GREETER, GREETER3))
    client.wait_serving(EU1, target=GREETER, timeout=FIRST_CALL_TIMEOUT)
    name = xds_fleet.resource_name("greeter")
    expected = {(kind, name): ("ACKED", "SYNCED", "") for kind in ("LDS", "RDS", "CDS", "EDS")}
    expected[("LDS", xds_fleet.resource_name("greeter3"))] = ("DOES_NOT_EXIST", "NOT_SENT", "")
    deadline = time.time() + 5
    while True:
        status = client_status(xds_meridian.xds_port, "csds-eu-1")
        if status == expected or time.time() > deadline:
            break
        time.sleep(0.1)
    assert status == expected
    assert client_status(xds_meridian.xds_port, "no-such-node") == {}


def localities(cla):
    """[(priority, sub_zone, [(address, port, health)], weight)] of a ClusterLoadAssignment."""
    from envoy.config.core.v3 import health_check_pb2

    out = []
    for loc in cla.endpoints:
        eps = [
            (e.endpoint.address.socket_address.address, e.endpoint.address.socket_address.port_value,
             health_check_pb2.HealthStatus.Name(e.health_status))
            for e in loc.lb_endpoints
        ]
        out.append((loc.priority, loc.locality.sub_zone, sorted(eps), loc.load_balancing_weight.value))
    return sorted(out)


def eds_for(m, user_agent, cluster, name=None):
    """The EDS assignment of greeter for a node of `cluster` (raw SotW stream, as that agent)."""
    name = name or xds_fleet.resource_name("greeter")
    s = AdsStream(m.xds_port)
    try:
        s.send(ads.request(ads.EDS, [name], node=ads.node(f"eds-{cluster}", cluster, NETWORKS[cluster], user_agent=user_agent)))
        r = s.recv_type(ads.EDS, timeout=10)
        return ads.decode(r)[name]
    finally:
        s.close()


def test_what_a_proxyless_node_and_an_envoy_node_are_sent(xds_meridian):
    """EDS as the clients above get it: tiers as contiguous priorities from the client's own
    cluster; a proxyless node gets no endpoint on another network, an Envoy node gets that
    cluster's east-west gateway instead."""
    m = xds_meridian
    port = xds_fleet.PORT
    grpc_eu1 = eds_for(m, ads.GRPC_AGENT, "eu-1")
    assert [loc[:3] for loc in localities(grpc_eu1)] == [
        (0, "eu-1", [("127.1.1.21", port, "HEALTHY"), ("127.1.1.22", port, "HEALTHY")]),
        (1, "eu-2", [("127.1.2.21", port, "HEALTHY")]),
        (2, "ap-1", [("127.1.4.21", port, "HEALTHY")]),
    ], localities(grpc_eu1)
    assert all(w > 0 for *_, w in localities(grpc_eu1)), "a locality without weight"
    assert grpc_eu1.policy.overprovisioning_factor.value == 100
    # A proxyless node in us-1 (n2) gets us-1 alone.
    assert [(p, z) for p, z, *_ in localities(eds_for(m, ads.GRPC_AGENT, "us-1"))] == [(0, "us-1")]
    # An Envoy node in eu-1: the same, plus us-1 through its gateway, in the same tier as ap-1
    # (both in another region).
    envoy_eu1 = localities(eds_for(m, "envoy", "eu-1"))
    assert [(p, z) for p, z, *_ in envoy_eu1] == [(0, "eu-1"), (1, "eu-2"), (2, "ap-1"), (2, "us-1")], envoy_eu1
    assert envoy_eu1[3][2] == [("127.0.3.100", 15443, "HEALTHY")], envoy_eu1[3]


def test_a_terminating_endpoint_gets_no_new_calls(xds_meridian, start_client):
    """eu-1's 127.1.1.22 terminating (serving, not ready): sent as DRAINING, and the client
    sends its calls to 127.1.1.21 alone, without failing over to eu-2."""
    fleet = xds_meridian.fleet
    client = start_client(f"eu-1-{start_client.kind}", "eu-1")
    client.wait_serving(EU1, timeout=FIRST_CALL_TIMEOUT)
    yaml = xds_fleet.slice_yaml("eu-1").replace(
        '["127.1.1.22"], conditions: {ready: true}',
        '["127.1.1.22"], conditions: {ready: false, serving: true, terminating: true}',
    )
    assert "terminating: true" in yaml
    edited = time.time()
    fleet.write("clusters/eu-1/greeter-slice.yaml", yaml)
    client.wait_serving(EU1[:1], since=edited, timeout=SWITCH_TIMEOUT, settle=10)
    eds = localities(eds_for(xds_meridian, ads.GRPC_AGENT, "eu-1"))
    assert eds[0][2] == [("127.1.1.21", xds_fleet.PORT, "HEALTHY"), ("127.1.1.22", xds_fleet.PORT, "DRAINING")], eds[0]
    assert_only(client, client.window(2), EU1[:1], "with 127.1.1.22 terminating")
    assert_only(client, client.calls(since=edited), EU1, "while 127.1.1.22 began terminating")
    edited = time.time()
    xds_fleet.set_endpoints(fleet, "eu-1")
    client.wait_for(lambda calls: {c["server"] for c in calls if c["ok"]} >= set(EU1), since=edited,
                    timeout=SWITCH_TIMEOUT, what="both eu-1 servers called again")


# ---------------------------------------------------------------------------------------
# Failover: endpoints leave on disk, calls move to the next tier, and come back.


def test_failover_to_the_next_tier_and_back(xds_meridian, start_client):
    fleet = xds_meridian.fleet
    client = start_client(f"eu-1-{start_client.kind}", "eu-1")
    begin = client.wait_serving(EU1, timeout=FIRST_CALL_TIMEOUT)
    measured = []

    def step(what, edit, expected):
        edited = time.time()
        edit()
        switched = client.wait_serving(expected, since=edited, timeout=SWITCH_TIMEOUT)
        measured.append(f"{what}: {switched - edited:.2f}s")
        assert_only(client, client.window(1.5), expected, f"after '{what}'")

    # Not ready: the next tier is eu-2 (same region), never us-1 (another network).
    step("eu-1 not ready", lambda: xds_fleet.set_endpoints(fleet, "eu-1", ready=False), EU2)
    step("eu-1 ready again", lambda: xds_fleet.set_endpoints(fleet, "eu-1"), EU1)
    # No endpoints at all.
    step("eu-1 without endpoints", lambda: xds_fleet.set_endpoints(fleet, "eu-1", addresses=[]), EU2)
    # The whole region gone: ap-1 (another region, same network), still never us-1.
    step("eu-2 without endpoints too", lambda: xds_fleet.set_endpoints(fleet, "eu-2", addresses=[]), AP1)
    step("eu-2 back", lambda: xds_fleet.set_endpoints(fleet, "eu-2"), EU2)
    step("eu-1 back", lambda: xds_fleet.set_endpoints(fleet, "eu-1"), EU1)
    print(f"\nMEASURED: {start_client.kind} client, edit on disk to calls moved: " + "; ".join(measured))

    every = client.calls(since=begin)
    assert not [c for c in every if c["server"] in US1], "a proxyless client in eu-1 reached us-1 (network n2)"
    failed = [c for c in every if not c["ok"]]
    assert not failed, (
        f"{len(failed)} of {len(every)} calls failed while the endpoints moved (each update carries "
        f"the next tier, so none should): {failed[:3]}\n{client.describe()}"
    )


# ---------------------------------------------------------------------------------------
# Services added and removed on disk while clients run.


def test_service_added_on_disk_is_callable_from_a_running_process(xds_meridian, xds_clients, tmp_path):
    """grpcio: one process, one xDS client, new channels opened as services come and go."""
    fleet = xds_meridian.fleet
    client = python_client(xds_meridian, xds_clients, tmp_path, "eu-1-python", "eu-1")
    begin = client.wait_serving(EU1, timeout=FIRST_CALL_TIMEOUT)

    # greeter3 does not exist yet: calls to it fail, the process carries on.
    client.call(GREETER3)
    client.wait_for(lambda calls: len(calls) >= 10 and all(not c["ok"] for c in calls),
                    target=GREETER3, what="failing calls to greeter3, which does not exist yet")

    # greeter2, added in eu-1, then called on a new channel of the same process.
    xds_fleet.add_service(fleet, "greeter2")
    added = time.time()
    client.call(GREETER2)
    client.wait_serving(replies("eu-1", "greeter2"), target=GREETER2, since=added, timeout=SWITCH_TIMEOUT)
    print(f"\nMEASURED: greeter2 written to its first call answered: {client.first_answer(added, GREETER2) - added:.2f}s")

    # greeter3, added in eu-2 (same region as the client: its only tier), reaches the channel
    # that has been waiting for it, without a restart.
    xds_fleet.add_service(fleet, "greeter3")
    added = time.time()
    client.wait_serving(replies("eu-2", "greeter3"), target=GREETER3, since=added, timeout=SWITCH_TIMEOUT)
    print(f"MEASURED: greeter3 written to the waiting channel answered: {client.first_answer(added, GREETER3) - added:.2f}s")

    # greeter2 removed on disk: its calls fail, the others go on.
    xds_fleet.remove_service(fleet, "greeter2")
    removed = time.time()
    client.wait_for(lambda calls: len(calls) >= 10 and all(not c["ok"] for c in calls[-10:]),
                    target=GREETER2, since=removed, timeout=SWITCH_TIMEOUT,
                    what="calls to greeter2 failing after its removal")
    assert_only(client, client.window(1.5, target=GREETER3), replies("eu-2", "greeter3"), "greeter3 after greeter2 left")
    assert_only(client, client.calls(since=begin, target=GREETER), EU1, "greeter, all along")


def test_service_added_on_disk_go(xds_meridian, tmp_path, xds_clients, xds_peers):
    """grpc-go: a client started before its service exists gets it once written; the
    client of another service carries on."""
    fleet = xds_meridian.fleet
    binary = xds_peers / "xds-greeter-client"
    port = xds_meridian.xds_port
    first = xds_clients(XdsClient.go(binary, tmp_path, "eu-1-go", port, GREETER, "eu-1", "n1"))
    begin = first.wait_serving(EU1, timeout=FIRST_CALL_TIMEOUT)

    waiting = xds_clients(XdsClient.go(binary, tmp_path, "eu-1-go-greeter3", port, GREETER3, "eu-1", "n1"))
    waiting.wait_for(lambda calls: len(calls) >= 10 and all(not c["ok"] for c in calls),
                     what="failing calls to greeter3, which does not exist yet")

    xds_fleet.add_service(fleet, "greeter2")
    added = time.time()
    second = xds_clients(XdsClient.go(binary, tmp_path, "eu-1-go-greeter2", port, GREETER2, "eu-1", "n1"))
    second.wait_serving(replies("eu-1", "greeter2"), since=added, timeout=FIRST_CALL_TIMEOUT)

    xds_fleet.add_service(fleet, "greeter3")
    added = time.time()
    waiting.wait_serving(replies("eu-2", "greeter3"), since=added, timeout=SWITCH_TIMEOUT)
    print(f"\nMEASURED: go, greeter3 written to the waiting client answered: {waiting.first_answer(added) - added:.2f}s")

    xds_fleet.remove_service(fleet, "greeter2")
    removed = time.time()
    second.wait_for(lambda calls: len(calls) >= 10 and all(not c["ok"] for c in calls[-10:]),
                    since=removed, timeout=SWITCH_TIMEOUT, what="calls to greeter2 failing after its removal")
    assert_only(first, first.calls(since=begin), EU1, "greeter, all along")


# ---------------------------------------------------------------------------------------
# The Go validator (tests/peers/xds: xds-validate) on what meridian serves.


def validate(xds_peers, m, *args, timeout=60):
    """Runs xds-validate against meridian; returns (exit status, report, stderr)."""
    cmd = [str(xds_peers / "xds-validate"), *args[:1], "-server", f"127.0.0.1:{m.xds_port}", *args[1:]]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    try:
        report = json.loads(p.stdout)
    except ValueError:
        pytest.fail(f"{' '.join(cmd)} printed no JSON report (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.returncode, report, p.stderr


NODES = {
    # name: (xds-validate flags, names expected among the resources)
    "envoy-eu-1": (
        ["-node-id", "envoy-eu-1", "-cluster", "eu-1", "-network", "n1", "-user-agent", "envoy"],
        {"CDS": [xds_fleet.resource_name("greeter"), "payments.shop.global:8080", "payments.shop.global:9090"],
         "EDS": [xds_fleet.resource_name("greeter")]},
    ),
    "grpc-eu-1": (
        ["-node-id", "grpc-eu-1", "-cluster", "eu-1", "-network", "n1", "-user-agent", "gRPC Go"],
        {"LDS": [xds_fleet.resource_name("greeter")], "RDS": [xds_fleet.resource_name("greeter")],
         "CDS": [xds_fleet.resource_name("greeter")], "EDS": [xds_fleet.resource_name("greeter")]},
    ),
    "eastwest-gateway-us-1": (
        ["-node-id", "gateway-us-1", "-cluster", "us-1", "-network", "n2", "-role", "eastwest-gateway"],
        {"LDS": ["eastwest-gateway:15443"],
         "CDS": ["outbound_.50051_._.greeter.demo.svc.cluster.local", "outbound_.9090_._.payments.shop.svc.cluster.local"],
         "EDS": ["outbound_.50051_._.greeter.demo.svc.cluster.local"]},
    ),
}


@pytest.mark.parametrize("who", sorted(NODES))
def test_validator_finds_no_violations(xds_meridian, xds_peers, who):
    flags, expected = NODES[who]
    status, report, stderr = validate(xds_peers, xds_meridian, "sotw", *flags)
    assert report["violations"] == [], f"{who}: {json.dumps(report['violations'], indent=1)[:6000]}"
    assert status == 0, f"{who}: exit {status} without violations\n{stderr[-2000:]}"
    for kind, names in expected.items():
        missing = sorted(set(names) - set(report["resources"].get(kind, [])))
        assert not missing, f"{who}: {kind} lacks {missing}; has {report['resources'].get(kind)}"


def test_delta_and_sotw_agree_while_the_fleet_changes(xds_meridian, xds_peers):
    """xds-validate delta-vs-sotw holds a SotW and a delta stream side by side and compares
    their states whenever both are quiet, resuming the delta stream once with
    initial_resource_versions. The fleet changes twice meanwhile."""
    m = xds_meridian
    cmd = [str(xds_peers / "xds-validate"), "delta-vs-sotw", "-server", f"127.0.0.1:{m.xds_port}",
           "-node-id", "delta-eu-1", "-cluster", "eu-1", "-network", "n1", "-duration", "12s", "-quiet", "1s"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3.5)
        xds_fleet.add_service(m.fleet, "greeter2")  # new CDS, EDS resources
        time.sleep(3.5)
        xds_fleet.set_endpoints(m.fleet, "eu-1", ready=False)  # EDS changes
        xds_fleet.remove_service(m.fleet, "greeter2")  # removed resources
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    try:
        report = json.loads(out)
    except ValueError:
        pytest.fail(f"delta-vs-sotw printed no JSON report (exit {p.returncode}):\n{out[-2000:]}\n{err[-2000:]}")
    problems = {k: report.get(k) for k in ("mismatches", "violations", "errors")}
    assert not any(problems.values()), json.dumps(problems, indent=1)[:6000]
    assert report["comparisons"] >= 3, f"only {report['comparisons']} comparisons: the edits did not each settle"
    assert p.returncode == 0, f"exit {p.returncode}\n{err[-2000:]}"
    assert xds_fleet.resource_name("greeter2") not in report["resources"]["CDS"]
