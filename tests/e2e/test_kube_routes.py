"""Gateway API routes on a Kubernetes hub (the shared fleet: hub, m1, m2, m3), with the upstream
standard-channel CRDs of sigs.k8s.io/gateway-api (the version tests/peers/gateway-api pins,
from its module) installed on the hub. meridian reads HTTPRoutes, GRPCRoutes and
ReferenceGrants from the hub API, serves them as the RDS of proxyless clients, and writes each
route's `status.parents` — read back here with the project's own clientset and types, as
Gateway API tooling reads it: Accepted and ResolvedRefs with the spec's reasons and the
route's generation, another controller's entry kept, meridian's entry gone when the route
stops naming a Service.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from conftest import BIN, ROOT, metric, peer_module_binary, pinned_module_dir
from kube_fleet import NAMESPACE, wait_for

PEER = ROOT / "tests" / "peers" / "gateway-api"
GATEWAY = "gateway.networking.k8s.io/v1"
EXT = "apiextensions.k8s.io/v1"
CRDS = ("httproutes", "grpcroutes", "referencegrants")
CONTROLLER = "meridian.io/gateway-controller"


def reader() -> str:
    """The routestatus binary: GATEWAY_API_DIR when tests/run built it, else built now."""
    return peer_module_binary("GATEWAY_API_DIR", ROOT / "tests" / "peers" / "gateway-api.sh",
                              "routestatus", "the Gateway API route-status reader")


def upstream_crds() -> list[dict]:
    """The standard-channel CRDs of the pinned gateway-api module."""
    module = pinned_module_dir(PEER, "sigs.k8s.io/gateway-api")
    return [yaml.safe_load((module / "config" / "crd" / "standard" / f"gateway.networking.k8s.io_{name}.yaml").read_text())
            for name in CRDS]


@pytest.fixture
def gateway_api(kube_fleet):
    hub = kube_fleet.hub
    hub.apply(upstream_crds())
    hub.wait_crds_established([f"{name}.gateway.networking.k8s.io" for name in CRDS])
    yield kube_fleet
    # The session's hub goes back to serving no Gateway API kind (its routes go with the CRDs).
    for name in CRDS:
        hub.delete(EXT, "CustomResourceDefinition", f"{name}.gateway.networking.k8s.io")


def statuses(binary, fleet) -> dict:
    out = subprocess.run([binary, "-kubeconfig", str(fleet.hub.admin_kubeconfig), "-namespace", NAMESPACE],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def ours(status: dict, route: str) -> list[dict]:
    return [p for p in status.get(route) or [] if p["controllerName"] == CONTROLLER]


def canary_route(parent_kind="Service", parent_group=""):
    return {
        "apiVersion": GATEWAY, "kind": "GRPCRoute",
        "metadata": {"name": "greeter-canary", "namespace": NAMESPACE},
        "spec": {
            "parentRefs": [{"group": parent_group, "kind": parent_kind, "name": "greeter", "port": 80}],
            "rules": [
                {"matches": [{"headers": [{"name": "x-canary", "value": "1"}]}],
                 "backendRefs": [{"name": "greeter-canary", "port": 80}]},
                {"backendRefs": [{"name": "greeter", "port": 80, "weight": 90},
                                 {"group": "multicluster.x-k8s.io", "kind": "ServiceImport", "name": "greeter-canary",
                                  "port": 80, "weight": 10}]},
            ],
        },
    }


def proxyless_routes(m, cluster) -> list[dict]:
    """The routes of greeter's port in the RDS a proxyless client of `cluster` gets, as
    `meridian xds dump` decodes them."""
    out = subprocess.run([str(BIN), "xds", "dump", "--json", "--node-cluster", cluster, "--role", "proxyless",
                          "--admin", f"127.0.0.1:{m.admin_port}"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    rds = json.loads(out.stdout)["feed"]["resources"]["RDS"]
    config = next((r for r in rds if r["name"] == f"greeter.{NAMESPACE}.global:80"), None)
    return config["detail"]["virtualHosts"][0]["routes"] if config else []


def test_hub_routes_are_served_and_their_status_is_written_as_the_spec_says(gateway_api):
    f = gateway_api
    binary = reader()
    f.publish("m1", "greeter", ["10.1.0.1"])
    f.publish("m2", "greeter-canary", ["10.2.0.1"])
    m = f.start_meridian()
    hub = f.hub
    hub.apply(canary_route())
    hub.apply({
        "apiVersion": GATEWAY, "kind": "HTTPRoute",
        "metadata": {"name": "to-billing", "namespace": NAMESPACE},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "greeter-canary"}],
                 "rules": [{"backendRefs": [{"name": "ledger", "namespace": "billing", "port": 80}]}]},
    })

    # RDS: the header match first, then the 90/10 split, for a proxyless client in m1.
    routes = wait_for(lambda: (r := proxyless_routes(m, "m1")) and len(r) == 2 and r, timeout=30,
                      what="the GRPCRoute in m1's RDS", log=m)
    assert routes[0]["name"] == f"GRPCRoute/{NAMESPACE}/greeter-canary/rule-0", routes
    assert routes[0]["headers"] == [{"name": "x-canary", "value": {"exact": "1"}}], routes
    assert routes[0]["clusters"] == [{"name": f"greeter-canary.{NAMESPACE}.global:80", "weight": 1}], routes
    assert routes[1]["clusters"] == [{"name": f"greeter.{NAMESPACE}.global:80", "weight": 90},
                                     {"name": f"greeter-canary.{NAMESPACE}.global:80", "weight": 10}], routes

    # Status, read with the upstream clientset.
    def written():
        s = statuses(binary, f)
        ok = ours(s, "GRPCRoute/greeter-canary") and ours(s, "HTTPRoute/to-billing")
        return s if ok else None

    s = wait_for(written, timeout=30, what="both routes' status written by meridian", log=m)
    canary = ours(s, "GRPCRoute/greeter-canary")
    assert len(canary) == 1 and canary[0]["parent"] == "Service/greeter" and canary[0]["port"] == 80, canary
    assert canary[0]["conditions"] == {"Accepted": "True Accepted", "ResolvedRefs": "True ResolvedRefs"}, canary
    assert set(canary[0]["observedGeneration"].values()) == {s["generation/GRPCRoute/greeter-canary"]}
    billing = ours(s, "HTTPRoute/to-billing")[0]
    assert billing["conditions"] == {"Accepted": "True Accepted", "ResolvedRefs": "False RefNotPermitted"}, billing
    # The same, as metrics: the parents by their conditions, the matches served (the canary
    # route's two rules on greeter, to-billing's one on greeter-canary), the writes made.
    assert metric(m, "meridian_route_parents", kind="GRPCRoute", accepted="true", resolved_refs="true") == 1
    assert metric(m, "meridian_route_parents", kind="HTTPRoute", accepted="true", resolved_refs="false") == 1
    assert metric(m, "meridian_route_parents") == 2
    assert metric(m, "meridian_route_matches") == 3
    for kind in ("GRPCRoute", "HTTPRoute"):
        assert metric(m, "meridian_routes_status_writes_total", kind=kind, result="ok") >= 1, kind

    # A ReferenceGrant in billing permits the reference; no member exports billing/ledger, so
    # the reason moves on to BackendNotFound.
    hub.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "billing"}})
    hub.apply({
        "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
        "metadata": {"name": "let-shop-in", "namespace": "billing"},
        "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "namespace": NAMESPACE}],
                 "to": [{"group": "", "kind": "Service"}]},
    })
    wait_for(lambda: ours(statuses(binary, f), "HTTPRoute/to-billing")[0]["conditions"]["ResolvedRefs"]
             == "False BackendNotFound", timeout=30, what="the grant moving the reason on to BackendNotFound", log=m)

    # Another controller's entry is kept when meridian writes again (an edit bumps the generation).
    status = hub.get(GATEWAY, "GRPCRoute", "greeter-canary", NAMESPACE)
    status["status"]["parents"].append({
        "parentRef": {"name": "edge", "kind": "Gateway", "group": "gateway.networking.k8s.io"},
        "controllerName": "example.com/other",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
    })
    code, body = hub.request("PUT", f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/grpcroutes/greeter-canary/status",
                             status)
    assert code == 200, body
    edited = canary_route()
    edited["spec"]["rules"][1]["backendRefs"][0]["weight"] = 80
    hub.apply(edited)

    def rewritten():
        s = statuses(binary, f)
        mine = ours(s, "GRPCRoute/greeter-canary")
        generation = s["generation/GRPCRoute/greeter-canary"]
        other = [p for p in s["GRPCRoute/greeter-canary"] if p["controllerName"] == "example.com/other"]
        return (mine and set(mine[0]["observedGeneration"].values()) == {generation} and other) and s

    wait_for(rewritten, timeout=30, what="meridian's entry at the new generation, the other controller's kept", log=m)
    wait_for(lambda: proxyless_routes(m, "m1")[1]["clusters"][0]["weight"] == 80, timeout=30,
             what="the edited weight in RDS", log=m)

    # The route now names a Gateway, not a Service: meridian's entry leaves, the route leaves RDS.
    hub.apply(canary_route(parent_kind="Gateway", parent_group="gateway.networking.k8s.io"))
    wait_for(lambda: not ours(statuses(binary, f), "GRPCRoute/greeter-canary"), timeout=30,
             what="meridian's entry removed", log=m)
    others = statuses(binary, f)["GRPCRoute/greeter-canary"]
    assert [p["controllerName"] for p in others] == ["example.com/other"], others
    wait_for(lambda: [r["clusters"] for r in proxyless_routes(m, "m1")] == [[{"name": f"greeter.{NAMESPACE}.global:80", "weight": 1}]],
             timeout=30, what="greeter's RDS back to the service itself", log=m)
