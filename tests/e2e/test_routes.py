"""Gateway API routes whose parent is a fleet Service (GAMMA), served as RDS to gRPC's own xDS
clients: grpcio (xds_client.py) and grpc-go (tests/peers/xds: xds-greeter-client), calling
real gRPC servers (greeter.py) of the xDS test fleet (xds_fleet.py) through
`xds:///<service>.demo.global:50051`.

The routes are written into the hub directory while the clients run:
- a GRPCRoute whose header match (`x-canary: 1`) sends canaries to a canary service and every
  other call to the service by tiers; deleting it gives the clients the service itself again;
- an HTTPRoute splitting 90/10 between two fleet services, measured over 1,500 calls, whose
  90 % moves to the next cluster when the client's own cluster stops serving;
- a retry policy that turns a failing endpoint's errors into successes, and a per-route
  timeout that ends calls to a slow endpoint at 200 ms instead of the client's 1 s;
- a route with a backend in another namespace and no ReferenceGrant, and one whose parent does
  not exist: each rejects itself (validate, /debug/problems say why) while the others serve,
  and a ReferenceGrant resolves the first;
- filters (header modifiers both ways, a mirror, a host rewrite, a redirect): served as Envoy
  route configuration that go-control-plane's validators accept (tests/peers/xds:
  xds-validate, as an Envoy and as a gRPC node), explained, while gRPC clients, which apply
  none of them, keep calling; a filter meridian does not apply rejects its route alone.
"""

import json
import subprocess
import time

import pytest

from conftest import BIN, metric
from greeter import Greeters
from test_xds_grpc import validate, xds_peers  # noqa: F401 (xds_peers: a fixture, the Go xDS peers)
from xds_client import XdsClient
from xds_fleet import NAMESPACE, NETWORKS, PORT, add_service, replies, service_yaml, set_endpoints, slice_yaml, target

FIRST_CALL_TIMEOUT = 30  # seconds from a client's start to its first calls answered
SWITCH_TIMEOUT = 15  # seconds from an edit on disk to calls following it

EU1 = replies("eu-1")
EU2 = replies("eu-2")
CANARY = replies("eu-2", "greeter3")  # greeter3: one server, in eu-2

PARENT = f"parentRefs: [{{group: '', kind: Service, name: greeter, port: {PORT}}}]"

CANARY_ROUTE = f"""apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: greeter-canary, namespace: {NAMESPACE}}}
spec:
  {PARENT}
  rules:
  - matches:
    - method: {{service: meridian.test.Greeter, method: Hello}}
      headers: [{{name: x-canary, value: "1"}}]
    backendRefs: [{{name: greeter3, port: {PORT}}}]
  - backendRefs: [{{name: greeter, port: {PORT}}}]
"""

SPLIT_ROUTE = f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: greeter-split, namespace: {NAMESPACE}}}
spec:
  {PARENT}
  rules:
  - backendRefs:
    - {{name: greeter, port: {PORT}, weight: 90}}
    - {{kind: ServiceImport, group: multicluster.x-k8s.io, name: greeter3, port: {PORT}, weight: 10}}
"""


def start(kind, request, xds_clients, tmp_path, xds_port, name, cluster, call, headers=None, interval=0.05):
    """A grpcio or grpc-go client as node `name` of `cluster`, sending `headers` on every call."""
    if kind == "python":
        client = XdsClient.python(tmp_path, name, xds_port, [call], cluster, NETWORKS[cluster], interval=interval, headers=headers)
    else:
        binary = request.getfixturevalue("xds_peers") / "xds-greeter-client"
        client = XdsClient.go(binary, tmp_path, name, xds_port, call, cluster, NETWORKS[cluster],
                              interval_ms=int(interval * 1000), headers=headers)
    return xds_clients(client)


def assert_only(client, calls, servers, what):
    assert calls, f"no calls over the window ({what})\n{client.describe()}"
    bad = [c for c in calls if not (c["ok"] and c["server"] in set(servers))]
    assert not bad, f"{what}: {len(bad)} of {len(calls)} calls failed or went elsewhere than {sorted(servers)}; first {bad[:3]}\n{client.describe()}"


def debug_problems(m):
    status, body = m.http("/debug/problems")
    assert status == 200, body
    return body


@pytest.mark.parametrize("kind", ["python", "go"])
def test_a_header_match_sends_canaries_to_the_canary_service_and_the_rest_by_tiers(
        kind, request, grpc_fleet, xds_meridian, xds_clients, tmp_path):
    add_service(grpc_fleet, "greeter3")
    plain = start(kind, request, xds_clients, tmp_path, xds_meridian.xds_port, f"plain-{kind}", "eu-1", target())
    canary = start(kind, request, xds_clients, tmp_path, xds_meridian.xds_port, f"canary-{kind}", "eu-1", target(),
                   headers={"x-canary": "1"})
    plain.wait_serving(EU1, timeout=FIRST_CALL_TIMEOUT)
    canary.wait_serving(EU1, timeout=FIRST_CALL_TIMEOUT)

    grpc_fleet.write("hub/routes.yaml", CANARY_ROUTE)
    canary.wait_serving(CANARY, timeout=SWITCH_TIMEOUT)
    window_start = time.time()
    time.sleep(2)
    assert_only(canary, canary.calls(since=window_start), CANARY, "a call with x-canary: 1")
    assert_only(plain, plain.calls(since=window_start), EU1, "a call without the header, from eu-1 (its own tier)")

    # The route gone, the service is the port's only route again.
    (grpc_fleet.hub / "routes.yaml").unlink()
    canary.wait_serving(EU1, timeout=SWITCH_TIMEOUT)
    assert_only(plain, plain.window(1), EU1, "a call without the header, after the route left")


def test_a_weighted_split_holds_over_1500_calls_and_a_withdrawn_clusters_share_moves(
        grpc_fleet, xds_meridian, xds_clients, tmp_path, request):
    add_service(grpc_fleet, "greeter3")
    grpc_fleet.write("hub/routes.yaml", SPLIT_ROUTE)
    client = start("python", request, xds_clients, tmp_path, xds_meridian.xds_port, "split", "eu-1", target(), interval=0.004)
    client.wait_for(lambda calls: {c["server"] for c in calls if c["ok"]} >= set(CANARY) | set(EU1),
                    timeout=FIRST_CALL_TIMEOUT, what="calls to both backends")

    def split(servers_90, n=1500):
        since = time.time()
        calls = client.wait_for(lambda cs: len(cs) >= n and cs, timeout=60, since=since, what=f"{n} calls")[:n]
        assert_only(client, calls, set(servers_90) | set(CANARY), "a call through the 90/10 route")
        share = sum(c["server"] in CANARY for c in calls) / len(calls)
        return share

    share = split(EU1)
    print(f"MEASURED: 90/10 split over 1500 calls: {share:.1%} to greeter3")
    assert 0.07 <= share <= 0.13, f"greeter3 took {share:.1%} of 1500 calls; the route gives it 10 % (±3)"

    # eu-1's greeter servers stop being ready: the 90 % goes to the next tier (eu-2), the
    # 10 % stays where it was.
    set_endpoints(grpc_fleet, "eu-1", ready=False)
    client.wait_for(lambda calls: len(calls) > 20 and all(c["ok"] and c["server"] in set(EU2) | set(CANARY) for c in calls[-20:]),
                    timeout=SWITCH_TIMEOUT, what="the 90 % moving to eu-2")
    share = split(EU2)
    print(f"MEASURED: after eu-1 withdrew, over 1500 calls: {share:.1%} to greeter3, the rest to eu-2")
    assert 0.07 <= share <= 0.13, f"greeter3 took {share:.1%} after the move"


def write_service(fleet, service, servers):
    """Service `service` exported from eu-1, its slice listing `servers` (ips)."""
    fleet.write(f"clusters/eu-1/{service}.yaml", service_yaml(service))
    fleet.write(f"clusters/eu-1/{service}-slice.yaml", slice_yaml("eu-1", service, addresses=servers))


@pytest.mark.parametrize("kind", ["python", "go"])
def test_a_retry_policy_hides_a_failing_endpoint_and_a_route_timeout_ends_slow_calls(
        kind, grpc_fleet, xds_meridian, xds_clients, tmp_path, request):
    special = Greeters([("fail", f"127.1.1.41:{PORT}"), ("eu-1", f"127.1.1.42:{PORT}"), ("slow", f"127.1.1.51:{PORT}")],
                       tmp_path / "special-greeters.log")
    request.addfinalizer(special.stop)
    write_service(grpc_fleet, "flaky", ["127.1.1.41", "127.1.1.42"])
    write_service(grpc_fleet, "sluggish", ["127.1.1.51"])
    flaky = start(kind, request, xds_clients, tmp_path, xds_meridian.xds_port, f"flaky-{kind}", "eu-1", target("flaky"))
    sluggish = start(kind, request, xds_clients, tmp_path, xds_meridian.xds_port, f"sluggish-{kind}", "eu-1", target("sluggish"))
    good = f"eu-1 127.1.1.42:{PORT}"
    # Without a route: round robin sends every other call to the failing endpoint.
    calls = flaky.wait_for(lambda cs: len(cs) >= 40 and any(c["ok"] for c in cs) and cs, timeout=FIRST_CALL_TIMEOUT, what="40 calls")
    failed = [c for c in calls if not c["ok"]]
    assert failed and all(c["code"] == "UNAVAILABLE" for c in failed), flaky.describe()
    slow = sluggish.wait_for(lambda cs: len(cs) >= 3 and cs, timeout=FIRST_CALL_TIMEOUT, what="3 calls")
    assert all(c["code"] == "DEADLINE_EXCEEDED" and c["ms"] >= 900 for c in slow[-2:]), sluggish.describe()

    grpc_fleet.write("hub/routes.yaml", f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: flaky-retries, namespace: {NAMESPACE}}}
spec:
  parentRefs: [{{group: '', kind: Service, name: flaky}}]
  rules:
  - retry: {{attempts: 3, codes: [503], backoff: 10ms}}
    backendRefs: [{{name: flaky, port: {PORT}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: sluggish-timeout, namespace: {NAMESPACE}}}
spec:
  parentRefs: [{{group: '', kind: Service, name: sluggish}}]
  rules:
  - timeouts: {{request: 200ms}}
    backendRefs: [{{name: sluggish, port: {PORT}}}]
""")
    flaky.wait_serving([good], settle=20, timeout=SWITCH_TIMEOUT)
    calls = flaky.window(3)
    assert len(calls) >= 40
    assert_only(flaky, calls, [good], "a call with retries on 503 (UNAVAILABLE)")
    print(f"MEASURED: with retries: {len(calls)} of {len(calls)} calls succeeded over 3 s")

    def short(cs):
        recent = cs[-3:]
        return len(recent) == 3 and all(c["code"] == "DEADLINE_EXCEEDED" and c["ms"] < 600 for c in recent)

    sluggish.wait_for(short, timeout=SWITCH_TIMEOUT, what="calls ended by the route's 200 ms timeout")
    recent = sluggish.calls()[-3:]
    print(f"MEASURED: {kind}: with timeouts.request 200ms: calls end after {[c['ms'] for c in recent]} ms (client deadline 1000 ms)")
    if kind == "go":
        # grpc-go ends the call at the route's timeout, counted from the call's start...
        assert all(c["ms"] >= 150 for c in recent), f"ended before the route's timeout: {recent}"
    else:
        # ...grpcio 1.85 (C-core) ends it at once, with the same DEADLINE_EXCEEDED: its
        # per-method timeout is not counted from this call's start. Known, and in the notes.
        assert all(c["ms"] < 150 for c in recent), f"grpcio now honours the route timeout as grpc-go does: {recent}"


def test_an_invalid_route_rejects_itself_while_the_others_serve(grpc_fleet, xds_meridian, xds_clients, tmp_path, request):
    add_service(grpc_fleet, "greeter3")
    bad = f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: to-elsewhere, namespace: {NAMESPACE}}}
spec:
  parentRefs: [{{group: '', kind: Service, name: greeter3}}]
  rules:
  - backendRefs: [{{name: ledger, namespace: billing, port: 7000}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: orphan, namespace: {NAMESPACE}}}
spec:
  parentRefs: [{{group: '', kind: Service, name: nowhere}}]
  rules:
  - backendRefs: [{{name: greeter, port: {PORT}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: broken, namespace: {NAMESPACE}}}
spec:
  parentRefs: [{{group: '', kind: Service, name: greeter}}]
  rules:
  - timeouts: {{request: soon}}
    backendRefs: [{{name: greeter, port: {PORT}}}]
"""
    grpc_fleet.write("hub/routes.yaml", CANARY_ROUTE + "---\n" + bad)
    canary = start("python", request, xds_clients, tmp_path, xds_meridian.xds_port, "canary", "eu-1", target(), headers={"x-canary": "1"})
    canary.wait_serving(CANARY, timeout=FIRST_CALL_TIMEOUT)

    body = xds_meridian.wait_for(lambda: "RefNotPermitted" in (b := debug_problems(xds_meridian)) and b,
                                 what="the route's problem on /debug/problems")
    for says in ("HTTPRoute demo/to-elsewhere", "ResolvedRefs=False (RefNotPermitted)",
                 "no ReferenceGrant in namespace billing",
                 "GRPCRoute demo/orphan", "Accepted=False (NoMatchingParent)", "no member cluster exports Service demo/nowhere",
                 "HTTPRoute demo/broken", "not a Gateway API duration", "routes.yaml"):
        assert says in body, f"{says!r} not on /debug/problems:\n{body}"
    assert metric(xds_meridian, "meridian_route_parents", kind="GRPCRoute", accepted="false", resolved_refs="true") == 1
    assert metric(xds_meridian, "meridian_route_parents", kind="HTTPRoute", accepted="true", resolved_refs="false") == 1

    out = subprocess.run([str(BIN), "validate", "--config", str(grpc_fleet.config)], capture_output=True, text=True, timeout=60)
    for says in ("RefNotPermitted", "NoMatchingParent", "not a Gateway API duration"):
        assert says in out.stdout + out.stderr, f"validate does not say {says!r}:\n{out.stdout}{out.stderr}"
    assert out.returncode != 0, out.stdout

    explained = subprocess.run([str(BIN), "explain", "grpcroute/greeter-canary", "-n", NAMESPACE, "--from-cluster", "eu-1",
                                "--admin", f"127.0.0.1:{xds_meridian.admin_port}"], capture_output=True, text=True, timeout=30)
    assert explained.returncode == 0, explained.stderr
    words = explained.stdout
    for says in ("Accepted=true (Accepted)", "header x-canary = 1", "100.0% → demo/greeter3:50051", "100.0% in eu-2",
                 "100.0% in eu-1 (the client's own cluster)"):
        assert says in words, f"{says!r} not in explain:\n{words}"

    # A ReferenceGrant in billing lets the route name billing's service; it does not exist,
    # so the reason moves on to BackendNotFound.
    grpc_fleet.write("hub/grant.yaml", """apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: let-demo-in, namespace: billing}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: demo}]
  to: [{group: '', kind: Service}]
""")
    xds_meridian.wait_for(lambda: "RefNotPermitted" not in (b := debug_problems(xds_meridian)) and "BackendNotFound" in b,
                          what="the grant resolving the reference")
    assert_only(canary, canary.window(1), CANARY, "the canary route, while the others were rejected")
    as_json = json.loads(subprocess.run([str(BIN), "explain", "httproute/to-elsewhere", "-n", NAMESPACE, "--json",
                                         "--admin", f"127.0.0.1:{xds_meridian.admin_port}"],
                                        capture_output=True, text=True, timeout=30, check=True).stdout)
    assert as_json["parents"][0]["resolvedRefs"]["reason"] == "BackendNotFound", as_json
    assert as_json["matches"][0]["fails"] is True, as_json


@pytest.mark.parametrize("kind", ["python", "go"])
def test_an_unresolved_backends_share_fails_and_the_rest_is_served(kind, grpc_fleet, xds_meridian, xds_clients, tmp_path, request):
    """A rule with one backend that resolves and one that does not (weights 1:1): the spec
    fails the unresolved one's share. Half the calls reach greeter, half fail UNAVAILABLE
    (the share goes to a cluster without endpoints); `explain` says so."""
    client = start(kind, request, xds_clients, tmp_path, xds_meridian.xds_port, f"half-{kind}", "eu-1", target(), interval=0.02)
    client.wait_serving(EU1, timeout=FIRST_CALL_TIMEOUT)
    grpc_fleet.write("hub/routes.yaml", f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: greeter-half, namespace: {NAMESPACE}}}
spec:
  {PARENT}
  rules:
  - backendRefs:
    - {{name: greeter, port: {PORT}, weight: 1}}
    - {{name: nowhere, port: {PORT}, weight: 1}}
""")
    client.wait_for(lambda cs: any(not c["ok"] for c in cs[-20:]), timeout=SWITCH_TIMEOUT, what="calls failing after the route")
    calls = client.window(6)
    failed = [c for c in calls if not c["ok"]]
    served = [c for c in calls if c["ok"]]
    assert len(calls) >= 150, client.describe()
    assert all(c["code"] == "UNAVAILABLE" for c in failed), failed[:3]
    assert all(c["server"] in set(EU1) for c in served), served[:3]
    share = len(failed) / len(calls)
    # 1:1 over >= 150 independent picks: 0.5 ± 0.15 holds with probability > 0.9999.
    assert 0.35 <= share <= 0.65, f"{len(failed)} of {len(calls)} failed\n{client.describe()}"

    explained = subprocess.run([str(BIN), "explain", "httproute/greeter-half", "-n", NAMESPACE, "--from-cluster", "eu-1",
                                "--admin", f"127.0.0.1:{xds_meridian.admin_port}"], capture_output=True, text=True, timeout=30)
    assert explained.returncode == 0, explained.stderr
    for says in ("ResolvedRefs=false (BackendNotFound)", "50.0% → backends that do not resolve", f"50.0% → {NAMESPACE}/greeter:{PORT}"):
        assert says in explained.stdout, f"{says!r} not in explain:\n{explained.stdout}"


@pytest.mark.parametrize("kind", ["python", "go"])
def test_a_policys_failure_percentage_ejects_a_failing_endpoint(kind, grpc_fleet, xds_meridian, xds_clients, tmp_path, request):
    """Outlier detection is the policy's (traffic.outlierDetection): gRPC honours the failure
    percentage (gRFC A50), so a policy that sets it takes a failing endpoint out of its
    clients' picks within an interval or two, where meridian's default (5 consecutive errors,
    which gRPC ignores) leaves every other call failing."""
    special = Greeters([("fail", f"127.1.1.41:{PORT}"), ("eu-1", f"127.1.1.42:{PORT}")], tmp_path / "special-greeters.log")
    request.addfinalizer(special.stop)
    write_service(grpc_fleet, "flaky", ["127.1.1.41", "127.1.1.42"])
    client = start(kind, request, xds_clients, tmp_path, xds_meridian.xds_port, f"ejecting-{kind}", "eu-1", target("flaky"))
    good = f"eu-1 127.1.1.42:{PORT}"
    calls = client.wait_for(lambda cs: len(cs) >= 60 and cs, timeout=FIRST_CALL_TIMEOUT, what="60 calls")
    failed = [c for c in calls[-40:] if not c["ok"]]
    assert len(failed) >= 10, f"without the policy, about half the calls fail; {len(failed)} of 40 did\n{client.describe()}"

    grpc_fleet.write("hub/flaky-policy.yaml", f"""apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {{name: flaky, namespace: {NAMESPACE}}}
spec:
  resourceSelectors: [{{kind: Service, name: flaky}}]
  traffic:
    outlierDetection:
      failurePercentage: {{threshold: 50, minimumHosts: 2, requestVolume: 5}}
      intervalSeconds: 1
      baseEjectionSeconds: 120
""")
    client.wait_serving([good], settle=20, timeout=SWITCH_TIMEOUT)
    assert_only(client, client.window(3), [good], "a call after the failing endpoint was ejected")


FILTERED_ROUTE = f"""apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: greeter-filtered, namespace: {NAMESPACE}}}
spec:
  {PARENT}
  rules:
  - matches: [{{path: {{type: Exact, value: /old.Greeter/Hello}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{scheme: https, hostname: greeter.example.com, statusCode: 301}}
  - matches: [{{path: {{type: PathPrefix, value: /meridian.test.Greeter}}}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: X-Fleet, value: meridian}}], remove: [x-debug]}}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{add: [{{name: x-served-by, value: meridian}}]}}
    - type: URLRewrite
      urlRewrite: {{hostname: greeter.internal}}
    - type: RequestMirror
      requestMirror: {{backendRef: {{name: greeter3, port: {PORT}}}, percent: 50}}
    backendRefs: [{{name: greeter, port: {PORT}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: extended, namespace: {NAMESPACE}}}
spec:
  parentRefs: [{{group: '', kind: Service, name: greeter3, port: {PORT}}}]
  rules:
  - filters: [{{type: ExtensionRef, extensionRef: {{group: example.com, kind: Plugin, name: x}}}}]
    backendRefs: [{{name: greeter3, port: {PORT}}}]
"""


def test_filters_are_served_as_envoy_configuration_that_validates_and_clients_keep_calling(
        grpc_fleet, xds_meridian, xds_clients, xds_peers, tmp_path, request):
    add_service(grpc_fleet, "greeter3")
    grpc_fleet.write("hub/routes.yaml", FILTERED_ROUTE)
    client = start("python", request, xds_clients, tmp_path, xds_meridian.xds_port, "plain", "eu-1", target())
    client.wait_serving(EU1, timeout=FIRST_CALL_TIMEOUT)
    body = xds_meridian.wait_for(lambda: "ExtensionRef" in (b := debug_problems(xds_meridian)) and b,
                                 what="the ExtensionRef route's problem")
    for says in ("HTTPRoute demo/extended", "Accepted=False (UnsupportedValue)",
                 "filter ExtensionRef is not supported by meridian"):
        assert says in body, f"{says!r} not on /debug/problems:\n{body}"
    assert "greeter-filtered" not in body, body

    # What an Envoy and a gRPC node receive validates; a gRPC node's RDS (routes are served to
    # proxyless clients) carries each filter.
    name = target().removeprefix("xds:///")
    for who, agent in (("envoy-eu-1", "envoy"), ("grpc-eu-1", "gRPC Go")):
        status, report, stderr = validate(xds_peers, xds_meridian, "sotw", "-node-id", who, "-cluster", "eu-1",
                                          "-network", NETWORKS["eu-1"], "-user-agent", agent, "-dump")
        violations = report["violations"]
        if agent == "envoy":
            assert violations == [], f"{who}: {json.dumps(violations, indent=1)[:6000]}"
            assert status == 0, f"{who}: exit {status}\n{stderr[-2000:]}"
            continue
        # The one thing the validator has to say of a gRPC node's routes: the redirect (route 0,
        # an exact path sorts first) is an action grpc-go does not follow — its calls fail, as
        # a gRPC client follows no redirect. Every resource validates.
        assert [(v["kind"], v["type"], v["name"]) for v in violations] == [("grpc", "RDS", name)], violations
        assert "route 0 has an action grpc-go does not follow" in violations[0]["message"], violations
        rds = report.get("dump", {}).get("RDS", {})
        config = json.dumps(rds.get(name) or rds)
        for says in ('"x-fleet"', '"OVERWRITE_IF_EXISTS_OR_ADD"', '"x-debug"', '"x-served-by"',
                     '"hostRewriteLiteral": "greeter.internal"', '"requestMirrorPolicies"',
                     'greeter3.demo.global:50051', '"numerator": 500000',
                     # 301 is MOVED_PERMANENTLY, the enum's default: protojson leaves responseCode out.
                     '"redirect": {"schemeRedirect": "https", "hostRedirect": "greeter.example.com"}'):
            assert says in config, f"{who}: {says} not in the RDS of {name}:\n{config[:6000]}"

    explained = subprocess.run([str(BIN), "explain", "httproute/greeter-filtered", "-n", NAMESPACE, "--from-cluster", "eu-1",
                                "--admin", f"127.0.0.1:{xds_meridian.admin_port}"], capture_output=True, text=True, timeout=30)
    assert explained.returncode == 0, explained.stderr
    for says in ("request headers: x-fleet: meridian, -x-debug", "response headers: +x-served-by: meridian",
                 "rewritten: host greeter.internal", "mirrored (50.0% of requests) to demo/greeter3:50051",
                 "redirect (301, scheme https, host greeter.example.com): nothing is sent (gRPC clients fail these calls"):
        assert says in explained.stdout, f"{says!r} not in explain:\n{explained.stdout}"
    assert_only(client, client.window(1), EU1, "calls while the filtered route is served (gRPC applies none of its filters)")
