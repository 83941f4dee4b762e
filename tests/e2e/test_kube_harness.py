"""The Kubernetes fleet of kube_fleet.py on real kube-apiservers, before meridian runs on it:
the clusters start, the CRDs of deploy/crds/ are established everywhere, the kubeconfigs
meridian gets work, and deploy/rbac/ gives its `meridian` user what it needs and nothing
else (every refusal is a real 403 from a real API server)."""

import base64
import ipaddress
import json
import ssl
import urllib.error
import urllib.request

import pytest
import yaml

import kube_fleet as kf
from kube_fleet import ApiError, resource_path

MEMBERS = ("m1", "m2", "m3")


def kubeconfig_call(kubeconfig_text, method, path, body=None):
    """A REST call made only from a kubeconfig (server, inlined CA, token): (status, JSON or text)."""
    cfg = yaml.safe_load(kubeconfig_text)
    ctx_name = cfg["current-context"]
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
    tls = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    req = urllib.request.Request(
        cluster["server"] + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {user['token']}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=tls, timeout=10) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def watch_status(cluster, path):
    """The status a watch as `meridian` starts with (read from the headers; no waiting for events)."""
    req = urllib.request.Request(cluster.server + path + "?watch=1",
                                 headers={"Authorization": f"Bearer {cluster.tokens[kf.USER]}"})
    try:
        with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=str(cluster.ca_file)),
                                    timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def as_meridian(cluster, method, path, body=None, content_type="application/json"):
    status, _ = cluster.request(method, path, body, token=cluster.tokens[kf.USER], content_type=content_type)
    return status


def test_fleet_starts_one_hub_and_three_members(kube_fleet):
    assert set(kube_fleet.members) == set(MEMBERS)
    servers = {c.server for c in kube_fleet.clusters}
    assert len(servers) == 4
    for c in kube_fleet.clusters:
        status, version = c.request("GET", "/version")
        assert status == 200 and version["gitVersion"] == "v1.34.12", (c.name, status, version)
        assert "--authorization-mode=RBAC" in c.apiserver_args()
        # The clusters are separate: a member's token means nothing elsewhere.
        other = kube_fleet.hub if c is not kube_fleet.hub else kube_fleet.members["m1"]
        assert other.request("GET", "/api/v1/namespaces", token=c.tokens[kf.USER])[0] == 401


def test_member_clusters_are_registered_on_the_hub(kube_fleet):
    got = {mc["metadata"]["name"]: mc for mc in kube_fleet.hub.list(kf.MERIDIAN, "MemberCluster")}
    assert set(got) == set(MEMBERS)
    expect = {"m1": ("eu", "eu-a", "127.0.1.0/24"), "m2": ("eu", "eu-b", "127.0.2.0/24"),
              "m3": ("us", "us-a", "127.0.3.0/24")}
    for name, (region, zone, cidr) in expect.items():
        mc = got[name]
        assert mc["metadata"]["labels"] == {"topology.kubernetes.io/region": region,
                                            "topology.kubernetes.io/zone": zone}
        assert mc["spec"]["network"] == {"name": "net1", "dnsClientCIDRs": [cidr]}
        assert mc["spec"]["health"] == kf.DEFAULT_HEALTH
        assert ipaddress.ip_address(kf.FROM[name]) in ipaddress.ip_network(cidr)
    assert got["m1"]["spec"]["source"] == {"kubernetes": {"kubeconfig": {"path": str(kube_fleet.member_kubeconfig("m1"))}}}
    assert got["m3"]["spec"]["source"] == {"kubernetes": {"secretRef": {
        "namespace": "meridian-system", "name": "m3-kubeconfig", "key": "kubeconfig"}}}


@pytest.mark.parametrize("name", MEMBERS)
def test_member_kubeconfigs_reach_the_member_as_meridian(kube_fleet, name):
    """By path (m1, m2) or from the hub Secret (m3), read with the hub's `meridian` user as
    meridian would: the kubeconfig alone (server, CA, token) reaches the right member."""
    mc = kube_fleet.member_cluster(name)
    source = mc["spec"]["source"]["kubernetes"]
    if "secretRef" in source:
        ref = source["secretRef"]
        status, secret = kubeconfig_call(kube_fleet.hub_kubeconfig.read_text(), "GET",
                                         f"/api/v1/namespaces/{ref['namespace']}/secrets/{ref['name']}")
        assert status == 200, secret
        text = base64.b64decode(secret["data"][ref["key"]]).decode()
    else:
        text = open(source["kubeconfig"]["path"]).read()
    member = kube_fleet.members[name]
    status, svcs = kubeconfig_call(text, "GET", "/api/v1/namespaces/shop/services")
    assert status == 200, svcs
    kube_fleet.service(name, f"only-in-{name}", 80)
    status, svc = kubeconfig_call(text, "GET", f"/api/v1/namespaces/shop/services/only-in-{name}")
    assert status == 200 and svc["metadata"]["name"] == f"only-in-{name}"
    # Not admin: the member's RBAC applies.
    assert kubeconfig_call(text, "GET", "/api/v1/namespaces/shop/secrets")[0] == 403
    assert text == member.kubeconfig_for(kf.USER).read_text()


def test_crds_are_established_on_hub_and_members(kube_fleet):
    names = sorted(c["metadata"]["name"] for c in kube_fleet.crds)
    assert {"serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io",
            "memberclusters.meridian.io", "clusterschedulingpolicies.meridian.io"} <= set(names)
    for c in kube_fleet.clusters:
        for name in names:
            crd = c.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
            conds = {x["type"]: x["status"] for x in crd["status"]["conditions"]}
            assert conds.get("Established") == "True", (c.name, name, conds)
        # The MCS kinds are served at v1alpha1, as meridian uses them.
        status, body = c.request("GET", "/apis/multicluster.x-k8s.io/v1alpha1")
        assert status == 200
        assert {r["name"] for r in body["resources"]} >= {"serviceexports", "serviceimports",
                                                          "serviceexports/status", "serviceimports/status"}


def test_mcs_schema_as_meridian_writes_it(kube_fleet):
    """What the pinned MCS CRDs accept and refuse, for the shapes meridian writes."""
    m1 = kube_fleet.members["m1"]
    si = {"apiVersion": kf.MCS, "kind": "ServiceImport",
          "metadata": {"name": "web", "namespace": "shop", "labels": {kf.MANAGED_BY: "meridian"}},
          "spec": {"type": "ClusterSetIP", "ips": ["10.96.100.1"], "sessionAffinity": "None",
                   "ports": [{"name": "http", "protocol": "TCP", "port": 80, "appProtocol": "http"}]}}
    path = resource_path(kf.MCS, "ServiceImport", "shop")
    assert as_meridian(m1, "POST", path, si) == 201
    status_path = resource_path(kf.MCS, "ServiceImport", "shop", "web", "status")
    assert as_meridian(m1, "PATCH", status_path, {"status": {"clusters": [{"cluster": "m1"}, {"cluster": "m2"}]}},
                       "application/merge-patch+json") == 200
    assert [c["cluster"] for c in kube_fleet.service_import("m1", "web")["status"]["clusters"]] == ["m1", "m2"]
    # spec.ports is required (an empty list is accepted); type must be ClusterSetIP or Headless.
    headless = {**si, "metadata": {"name": "db", "namespace": "shop"}, "spec": {"type": "Headless"}}
    status, body = m1.request("POST", path, headless)
    assert status == 422 and "spec.ports" in body["message"], body
    headless["spec"]["ports"] = []
    assert m1.request("POST", path, headless)[0] == 201
    bad = {**si, "metadata": {"name": "bad", "namespace": "shop"}, "spec": {"type": "LoadBalancer", "ports": []}}
    assert m1.request("POST", path, bad)[0] == 422
    # A ServiceExport as users write it has no spec at all.
    se = kube_fleet.export("m1", "web")
    assert "spec" not in se


def test_meridian_on_a_member_may_do_its_job(kube_fleet):
    m1 = kube_fleet.members["m1"]
    kube_fleet.service("m1", "web", 80)
    kube_fleet.endpoint_slice("m1", "web", ["10.0.0.1"])
    kube_fleet.export("m1", "web")
    for kind, ns in (("Service", "shop"), ("EndpointSlice", "shop"), ("ServiceExport", "shop"),
                     ("ServiceImport", "shop"), ("Service", None), ("EndpointSlice", None),
                     ("ServiceExport", None), ("ServiceImport", None), ("Node", None), ("Namespace", None)):
        path = resource_path(kf.API_VERSIONS[kind], kind, ns)
        assert as_meridian(m1, "GET", path) == 200, (kind, ns)
        assert watch_status(m1, path) == 200, (kind, ns)
    for path in ("/readyz", "/version", "/healthz"):
        assert as_meridian(m1, "GET", path) == 200, path

    # ServiceExport status (conditions).
    cond = {"type": "Valid", "status": "True", "reason": "Exported", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
    assert as_meridian(m1, "PATCH", resource_path(kf.MCS, "ServiceExport", "shop", "web", "status"),
                       {"status": {"conditions": [cond]}}, "application/merge-patch+json") == 200
    assert kube_fleet.export_condition("m1", "web", "Valid")["reason"] == "Exported"

    # ServiceImports: create, update, delete.
    si = {"apiVersion": kf.MCS, "kind": "ServiceImport",
          "metadata": {"name": "web", "namespace": "shop", "labels": {kf.MANAGED_BY: "meridian"}},
          "spec": {"type": "ClusterSetIP", "ports": [{"port": 80, "protocol": "TCP"}]}}
    assert as_meridian(m1, "POST", resource_path(kf.MCS, "ServiceImport", "shop"), si) == 201
    assert as_meridian(m1, "PATCH", resource_path(kf.MCS, "ServiceImport", "shop", "web"),
                       {"spec": {"ips": ["10.96.200.1"]}}, "application/merge-patch+json") == 200
    assert kube_fleet.service_imports("m1")[0]["spec"]["ips"] == ["10.96.200.1"]
    assert as_meridian(m1, "DELETE", resource_path(kf.MCS, "ServiceImport", "shop", "web")) == 200
    assert kube_fleet.service_imports("m1") == []

    # The same by server-side apply (a PATCH that creates), then its status subresource.
    apply = "application/apply-patch+yaml"
    params = "?fieldManager=meridian&force=true"
    assert as_meridian(m1, "PATCH", resource_path(kf.MCS, "ServiceImport", "shop", "web") + params, si, apply) == 201
    status_patch = {"apiVersion": kf.MCS, "kind": "ServiceImport", "status": {"clusters": [{"cluster": "m1"}]}}
    assert as_meridian(m1, "PATCH", resource_path(kf.MCS, "ServiceImport", "shop", "web", "status") + params,
                       status_patch, apply) == 200
    assert kube_fleet.service_import("m1", "web")["status"]["clusters"] == [{"cluster": "m1"}]
    export_status = {"apiVersion": kf.MCS, "kind": "ServiceExport", "status": {"conditions": [cond]}}
    assert as_meridian(m1, "PATCH", resource_path(kf.MCS, "ServiceExport", "shop", "web", "status") + params,
                       export_status, apply) == 200
    assert as_meridian(m1, "DELETE", resource_path(kf.MCS, "ServiceImport", "shop", "web")) == 200

    # A derived Service and its imported EndpointSlice, labelled as meridian's.
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "derived-web", "namespace": "shop", "labels": {kf.MANAGED_BY: "meridian"}},
           "spec": {"ports": [{"port": 80, "protocol": "TCP"}]}}
    assert as_meridian(m1, "PATCH", resource_path("v1", "Service", "shop", "derived-web") + params, svc, apply) == 201
    eps = {"apiVersion": kf.DISCOVERY, "kind": "EndpointSlice",
           "metadata": {"name": "derived-web-m2", "namespace": "shop",
                        "labels": {kf.MANAGED_BY: "meridian", kf.SERVICE_NAME_LABEL: "derived-web"}},
           "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.2"]}], "ports": [{"port": 80}]}
    assert as_meridian(m1, "PATCH", resource_path(kf.DISCOVERY, "EndpointSlice", "shop", "derived-web-m2") + params,
                       eps, apply) == 201
    assert [s["metadata"]["name"] for s in kube_fleet.managed_services("m1")] == ["derived-web"]
    assert [s["metadata"]["name"] for s in kube_fleet.managed_slices("m1", service="derived-web")] == ["derived-web-m2"]
    assert as_meridian(m1, "DELETE", resource_path(kf.DISCOVERY, "EndpointSlice", "shop", "derived-web-m2")) == 200
    assert as_meridian(m1, "DELETE", resource_path("v1", "Service", "shop", "derived-web")) == 200


def test_meridian_on_a_member_may_do_nothing_else(kube_fleet):
    m2 = kube_fleet.members["m2"]
    kube_fleet.service("m2", "web", 80)
    kube_fleet.export("m2", "web")
    m2.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "shop"},
              "stringData": {"k": "v"}})
    refused = [
        ("POST", resource_path("v1", "ConfigMap", "shop"),
         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
        ("GET", resource_path("v1", "Secret", "shop", "s"), None),
        ("GET", resource_path("v1", "Secret", None), None),
        ("POST", resource_path("apps/v1", "Deployment", "shop"),
         {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
          "spec": {"selector": {"matchLabels": {"a": "b"}},
                   "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
        # Pods are read (capacity), never written.
        ("POST", "/api/v1/namespaces/shop/pods",
         {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
        ("GET", "/apis/apps/v1/deployments", None),
        ("GET", "/api/v1/configmaps", None),
        # Exports are the users': meridian only writes their status.
        ("POST", resource_path(kf.MCS, "ServiceExport", "shop"),
         {"apiVersion": kf.MCS, "kind": "ServiceExport", "metadata": {"name": "other"}}),
        ("DELETE", resource_path(kf.MCS, "ServiceExport", "shop", "web"), None),
        ("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}),
        ("DELETE", "/api/v1/namespaces/shop", None),
        ("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}),
        ("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles",
         {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "x"}}),
        ("GET", "/metrics", None),
    ]
    for method, path, body in refused:
        assert as_meridian(m2, method, path, body) == 403, (method, path)
    assert watch_status(m2, resource_path("v1", "Secret", None)) == 403
    # The ServiceExport and the Namespace are untouched.
    assert kube_fleet.service_export("m2", "web") is not None


def test_meridian_on_the_hub_may_do_its_job(kube_fleet):
    hub = kube_fleet.hub
    for path in (resource_path(kf.MERIDIAN, "MemberCluster"), resource_path(kf.MERIDIAN, "MemberCluster", None, "m1"),
                 resource_path(kf.MERIDIAN, "ClusterSchedulingPolicy"),
                 resource_path(kf.MERIDIAN, "ClusterSchedulingPolicy", "shop"),
                 resource_path(kf.MERIDIAN, "OverridePolicy"),
                 # Resource templates of the kinds policies select.
                 resource_path("apps/v1", "Deployment"), resource_path("v1", "ConfigMap"),
                 resource_path("v1", "Service"),
                 resource_path("v1", "Secret", "meridian-system"),
                 resource_path("v1", "Secret", "meridian-system", "m3-kubeconfig"),
                 "/readyz", "/version", "/healthz"):
        assert as_meridian(hub, "GET", path) == 200, path
    for path in (resource_path(kf.MERIDIAN, "MemberCluster"), resource_path(kf.MERIDIAN, "ClusterSchedulingPolicy"),
                 resource_path("v1", "Secret", "meridian-system")):
        assert watch_status(hub, path) == 200, path

    # MemberCluster status.
    status_path = resource_path(kf.MERIDIAN, "MemberCluster", None, "m1", "status")
    assert as_meridian(hub, "GET", status_path) == 200
    assert as_meridian(hub, "PATCH", status_path, {"status": {"health": "Healthy", "endpoints": 3}},
                       "application/merge-patch+json") == 200
    assert kube_fleet.member_status("m1") == {"health": "Healthy", "endpoints": 3}
    # ClusterSchedulingPolicy status.
    kube_fleet.policy("web", {"resourceSelectors": [{"kind": "Service", "name": "web"}]})
    assert as_meridian(hub, "PATCH", resource_path(kf.MERIDIAN, "ClusterSchedulingPolicy", "shop", "web", "status"),
                       {"status": {"conditions": []}}, "application/merge-patch+json") == 200

    # The leader election Lease `meridian`: create, read, renew.
    leases = resource_path(kf.COORDINATION, "Lease", "meridian-system")
    lease = {"apiVersion": kf.COORDINATION, "kind": "Lease", "metadata": {"name": "meridian"},
             "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 4}}
    status, created = hub.request("POST", leases, lease, token=hub.tokens[kf.USER])
    assert status == 201, created
    status, got = hub.request("GET", f"{leases}/meridian", token=hub.tokens[kf.USER])
    assert status == 200
    got["spec"]["holderIdentity"] = "replica-b"
    assert as_meridian(hub, "PUT", f"{leases}/meridian", got) == 200
    assert kube_fleet.lease_holder() == "replica-b"


def test_meridian_on_the_hub_may_do_nothing_else(kube_fleet):
    hub = kube_fleet.hub
    hub.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"},
               "stringData": {"k": "v"}})
    hub.apply({"apiVersion": kf.COORDINATION, "kind": "Lease", "metadata": {"name": "other", "namespace": "meridian-system"},
               "spec": {"holderIdentity": "someone"}})
    mc = kube_fleet.member_cluster_manifest("m9")
    refused = [
        ("POST", resource_path(kf.MERIDIAN, "MemberCluster"), mc),
        ("PUT", resource_path(kf.MERIDIAN, "MemberCluster", None, "m1"), kube_fleet.member_cluster("m1")),
        ("DELETE", resource_path(kf.MERIDIAN, "MemberCluster", None, "m1"), None),
        ("POST", resource_path(kf.MERIDIAN, "ClusterSchedulingPolicy", "shop"),
         {"apiVersion": kf.MERIDIAN, "kind": "ClusterSchedulingPolicy", "metadata": {"name": "p"},
          "spec": {"resourceSelectors": []}}),
        ("GET", resource_path("v1", "Secret", "default", "s"), None),
        ("GET", resource_path("v1", "Secret", "default"), None),
        ("GET", resource_path("v1", "Secret", None), None),
        ("POST", resource_path("v1", "Secret", "meridian-system"),
         {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}),
        ("DELETE", resource_path("v1", "Secret", "meridian-system", "m3-kubeconfig"), None),
        # Only the Lease named `meridian`, only in meridian-system.
        ("GET", resource_path(kf.COORDINATION, "Lease", "meridian-system", "other"), None),
        ("PUT", resource_path(kf.COORDINATION, "Lease", "meridian-system", "other"),
         hub.get(kf.COORDINATION, "Lease", "other", "meridian-system")),
        ("GET", resource_path(kf.COORDINATION, "Lease", "meridian-system"), None),
        ("DELETE", resource_path(kf.COORDINATION, "Lease", "meridian-system", "other"), None),
        ("POST", resource_path(kf.COORDINATION, "Lease", "default"),
         {"apiVersion": kf.COORDINATION, "kind": "Lease", "metadata": {"name": "meridian"}}),
        # Resource templates (Deployments, ConfigMaps, Services, ...) are read, never written.
        ("POST", resource_path("v1", "ConfigMap", "meridian-system"),
         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
        ("DELETE", "/api/v1/namespaces/default/services/kubernetes", None),
        ("POST", resource_path("apps/v1", "Deployment", "shop"),
         {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}),
        ("POST", resource_path(kf.MERIDIAN, "OverridePolicy", "shop"),
         {"apiVersion": kf.MERIDIAN, "kind": "OverridePolicy", "metadata": {"name": "o"}}),
        ("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", kube_fleet.crds[0]),
    ]
    for method, path, body in refused:
        assert as_meridian(hub, method, path, body) == 403, (method, path)
    assert set(m["metadata"]["name"] for m in hub.list(kf.MERIDIAN, "MemberCluster")) == set(MEMBERS)


def test_helpers_write_what_a_member_would_hold(kube_fleet):
    svc = kube_fleet.service("m1", "web", [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}])
    assert svc["spec"]["clusterIP"].startswith("10.96.")
    eps = kube_fleet.endpoint_slice("m1", "web", ["10.0.0.1", {"ip": "10.0.0.2", "ready": False, "zone": "eu-a"}])
    assert eps["metadata"]["name"] == "web-m1"
    assert eps["metadata"]["labels"] == {"kubernetes.io/service-name": "web"}
    assert eps["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    assert eps["endpoints"] == [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
                                {"addresses": ["10.0.0.2"], "conditions": {"ready": False}, "zone": "eu-a"}]
    headless = kube_fleet.service("m2", "db", 5432, headless=True, publish_not_ready=True)
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    # Between headless and not: re-created.
    again = kube_fleet.service("m2", "db", 5432)
    assert again["spec"]["clusterIP"] != "None" and again["metadata"]["uid"] != headless["metadata"]["uid"]
    kube_fleet.export("m1", "web")
    assert [e["metadata"]["name"] for e in kube_fleet.service_exports("m1")] == ["web"]
    assert kube_fleet.delete_service("m1", "web")
    assert kube_fleet.members["m1"].list(kf.DISCOVERY, "EndpointSlice", "shop") == []
    node = kube_fleet.node("m3", "node-1", cpu="8", memory="16Gi")
    assert node["status"]["allocatable"]["cpu"] == "8"


def test_reset_puts_the_fleet_back(kube_fleet):
    kube_fleet.service("m1", "web", 80)
    kube_fleet.endpoint_slice("m1", "web", ["10.0.0.1"])
    kube_fleet.export("m1", "web")
    kube_fleet.node("m1", "node-1")
    # A finalizer nothing removes (meridian is not running) does not block the reset.
    kube_fleet.members["m2"].apply({"apiVersion": kf.MCS, "kind": "ServiceImport",
                                    "metadata": {"name": "web", "namespace": "shop",
                                                 "finalizers": ["meridian.io/test"]},
                                    "spec": {"type": "ClusterSetIP", "ports": []}})
    kube_fleet.set_member_spec("m1", labels={"topology.kubernetes.io/region": "ap"},
                               taints=[{"key": "drain", "effect": "NoExecute"}])
    kube_fleet.clear_member_status("m2")
    as_meridian(kube_fleet.hub, "PATCH", resource_path(kf.MERIDIAN, "MemberCluster", None, "m2", "status"),
                {"status": {"health": "Unreachable"}}, "application/merge-patch+json")
    kube_fleet.hub.apply(kube_fleet.member_cluster_manifest("m9"))
    kube_fleet.policy("web", {"resourceSelectors": [{"kind": "Service", "name": "web"}]})
    kube_fleet.stop_apiserver("m3")

    kube_fleet.reset()

    for name in MEMBERS:
        m = kube_fleet.members[name]
        assert m.request("GET", "/readyz")[0] == 200
        for kind in ("ServiceExport", "ServiceImport", "EndpointSlice", "Node"):
            assert m.list(kf.API_VERSIONS[kind], kind) == [], (name, kind)
        assert [s["metadata"]["name"] for s in m.list("v1", "Service")] == ["kubernetes"]
    mcs = {mc["metadata"]["name"]: mc for mc in kube_fleet.hub.list(kf.MERIDIAN, "MemberCluster")}
    assert set(mcs) == set(MEMBERS)
    assert mcs["m1"]["metadata"]["labels"]["topology.kubernetes.io/region"] == "eu"
    assert "taints" not in mcs["m1"]["spec"]
    assert "status" not in mcs["m2"]
    assert kube_fleet.hub.list(kf.MERIDIAN, "ClusterSchedulingPolicy") == []
    assert kube_fleet.lease() is None


def test_meridian_config_names_the_hub_as_meridian(kube_fleet):
    cfg = kube_fleet.config(1053, 9180, 18000)
    assert cfg["hub"] == {"kubeconfig": str(kube_fleet.hub_kubeconfig), "namespace": "meridian-system"}
    assert cfg["leaderElection"] == {"leaseName": "meridian", "leaseDurationSeconds": 4,
                                     "renewDeadlineSeconds": 3, "retryPeriodSeconds": 1}
    assert cfg["dns"]["listen"] == "127.0.0.1:1053" and cfg["admin"] == {"listen": "127.0.0.1:9180"}
    status, mcs = kubeconfig_call(kube_fleet.hub_kubeconfig.read_text(), "GET", resource_path(kf.MERIDIAN, "MemberCluster"))
    assert status == 200 and len(mcs["items"]) == 3
    status, _ = kubeconfig_call(kube_fleet.hub_kubeconfig.read_text(), "POST", resource_path(kf.MERIDIAN, "MemberCluster"),
                                kube_fleet.member_cluster_manifest("m9"))
    assert status == 403
    with pytest.raises(ApiError) as e:
        kube_fleet.hub.apply(kube_fleet.member_cluster_manifest("m9"), token=kube_fleet.hub.tokens[kf.USER])
    assert e.value.status == 403


def test_the_hub_service_account_has_the_same_rights(kube_fleet):
    """meridian inside the hub runs as ServiceAccount meridian-system/meridian: a token the
    API server mints for it (TokenRequest; no controller needed) gets the same answers."""
    hub = kube_fleet.hub
    status, tr = hub.request("POST", "/api/v1/namespaces/meridian-system/serviceaccounts/meridian/token",
                             {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                              "spec": {"expirationSeconds": 600}})
    assert status == 201, tr
    token = tr["status"]["token"]
    assert hub.request("GET", resource_path(kf.MERIDIAN, "MemberCluster"), token=token)[0] == 200
    assert hub.request("GET", resource_path("v1", "Secret", "meridian-system", "m3-kubeconfig"), token=token)[0] == 200
    assert hub.request("POST", resource_path(kf.MERIDIAN, "MemberCluster"), kube_fleet.member_cluster_manifest("m9"),
                       token=token)[0] == 403
    assert hub.request("GET", resource_path("v1", "Secret", "default"), token=token)[0] == 403
