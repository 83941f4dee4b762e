"""Workload placement on a Kubernetes hub (kube_fleet.py): resource templates and
OverridePolicies created through the hub's API, decided on like a directory hub's
(test_placement.py), and the capacity of Kubernetes members read from their Nodes and Pods.

The API servers run no controller manager and no kubelet: a Deployment on the hub is only
stored (a template), and Nodes and Pods in a member are created through the API (a Pod bound
by spec.nodeName stays Pending, which holds its Node's resources as a running one does).
"""

import json
import subprocess
import time

from conftest import BIN
from kube_fleet import CORE, MERIDIAN, NAMESPACE, wait_for
from kube_cluster import resource_path

APPS = "apps/v1"


def run(*args, check=None):
    p = subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True, timeout=60)
    if check is not None:
        assert p.returncode == check, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def deployment(name, replicas, cpu="500m"):
    return {"apiVersion": APPS, "kind": "Deployment",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": name}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": name, "image": f"registry.example.com/shop/{name}:1",
                                                           "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]}}}}


def override(name, cluster, value):
    image = {"component": "Registry", "operator": "replace"}
    if value is not None:
        image["value"] = value
    return {"apiVersion": MERIDIAN, "kind": "OverridePolicy", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment"}],
                     "overrideRules": [{"targetClusters": {"clusterNames": [cluster]},
                                        "overriders": {"image": [image]}}]}}


def decisions(m):
    status, body = m.http("/debug/placements")
    assert status == 200, body
    return json.loads(body)["decisions"]


def decision(m, name, kind="Deployment"):
    found = [d for d in decisions(m) if d["template"]["kind"] == kind and d["template"]["name"] == name]
    return found[0] if found else None


def replicas(m, name):
    d = decision(m, name)
    if not d or d["outcome"]["result"] != "scheduled":
        return None
    return {p["cluster"]: p["replicas"] for p in d["placed"]}


def problems(m):
    status, body = m.http("/debug/problems")
    assert status == 200
    return json.loads(body)["problems"]


def problems_naming(m, *words):
    return [p for p in problems(m) if all(w in json.dumps(p) for w in words)]


def test_templates_and_overrides_on_the_hub_api_are_placed(kube_fleet, kube_meridian):
    m = kube_meridian
    hub = kube_fleet.hub
    try:
        hub.apply(deployment("web", 9))
        hub.apply(override("m2-mirror", "m2", "mirror.example.com"))
        kube_fleet.policy("web", {
            "resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "web"}],
            "placement": {
                "clusterAffinities": [{"name": "eu", "clusterNames": ["m1", "m2"]}],
                "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
                                      "weights": [{"clusterNames": ["m1"], "weight": 1},
                                                  {"clusterNames": ["m2"], "weight": 2}]},
            },
        })
        # Webster at 1:2: 9 replicas are 3/6.
        m.wait_for(lambda: replicas(m, "web") == {"m1": 3, "m2": 6}, timeout=15, what="9 replicas divided 3/6")
        d = decision(m, "web")
        assert d["tier"] == "eu", d
        by_cluster = {p["cluster"]: p for p in d["placed"]}
        assert by_cluster["m1"]["overrides"] == [], d
        assert len(by_cluster["m2"]["overrides"]) == 1 and "m2-mirror" in json.dumps(by_cluster["m2"]["overrides"]), d
        assert [e["cluster"] for e in d["excluded"]] == ["m3"], d

        admin = f"127.0.0.1:{m.admin_port}"
        words = run("explain", "Deployment/web", "-n", NAMESPACE, "--admin", admin, check=0).stdout
        assert "apps/v1/Deployment/shop/web: placed by ClusterSchedulingPolicy shop/web, tier \"eu\"" in words, words
        assert "placed: m1 — 3 replica(s) (static weight 1)" in words, words
        m2_line = [line for line in words.splitlines() if "placed: m2 — 6 replica(s)" in line]
        assert m2_line and "overrides" in m2_line[0] and "m2-mirror" in m2_line[0], words

        # The replicas are edited on the hub: the decision follows (10 at 1:2 are 3/7).
        hub.apply(deployment("web", 10))
        m.wait_for(lambda: replicas(m, "web") == {"m1": 3, "m2": 7}, timeout=15, what="10 replicas divided 3/7")

        # An invalid edit of the OverridePolicy (an image replace without a value): a problem
        # naming it, and its last valid version keeps serving.
        hub.apply(override("m2-mirror", "m2", None))
        found = m.wait_for(lambda: problems_naming(m, "OverridePolicy", "m2-mirror", "needs a value"),
                           timeout=15, what="the invalid OverridePolicy on /debug/problems")
        assert "last valid version keeps serving" in json.dumps(found), found
        d = decision(m, "web")
        m2 = [p for p in d["placed"] if p["cluster"] == "m2"][0]
        assert "m2-mirror" in json.dumps(m2["overrides"]), d

        # A policy selecting a kind the hub does not serve: a problem of that policy; the rest
        # keeps its decision.
        kube_fleet.policy("widgets", {
            "resourceSelectors": [{"apiVersion": "example.com/v1", "kind": "Widget"}],
        })
        found = m.wait_for(lambda: problems_naming(m, "ClusterSchedulingPolicy", "widgets",
                                                   "kind Widget in apiVersion example.com/v1 is not served by the hub"),
                           timeout=15, what="the unserved kind on /debug/problems")
        assert found
        assert replicas(m, "web") == {"m1": 3, "m2": 7}

        # The template goes: its decision goes.
        hub.delete(APPS, "Deployment", "web", NAMESPACE)
        m.wait_for(lambda: decision(m, "web") is None, timeout=15, what="the decision gone with its template")
    finally:
        hub.delete(APPS, "Deployment", "web", NAMESPACE)
        hub.delete(MERIDIAN, "OverridePolicy", "m2-mirror", NAMESPACE)


def bound_pod(name, node, cpu):
    return {"apiVersion": CORE, "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}}


def test_capacity_of_kubernetes_members_divides_by_available_capacity(kube_fleet):
    """m1 has a 4-core Node with 3 cores requested by bound Pods (1 core free: 2 replicas of
    500m); m2 a 2-core Node with nothing on it (4 replicas). 6 replicas divided by available
    capacity are 2/4 — by the Nodes alone they would be 4/2."""
    hub = kube_fleet.hub
    m1 = kube_fleet.cluster("m1")
    pods = [f"busy-{i}" for i in range(3)]
    try:
        kube_fleet.node("m1", "n1", cpu="4", memory="8Gi")
        kube_fleet.node("m2", "n1", cpu="2", memory="8Gi")
        # The ServiceAccount admission wants the namespace's default ServiceAccount (no
        # controller manager makes it here).
        m1.apply({"apiVersion": CORE, "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": NAMESPACE}})
        for p in pods:
            m1.apply(bound_pod(p, "n1", "1"))
        # A finished pod holds nothing.
        done = bound_pod("done", "n1", "4")
        m1.apply(done)
        status, body = m1.request("GET", resource_path(CORE, "Pod", NAMESPACE, "done"))
        body["status"] = {"phase": "Succeeded"}
        status, body = m1.request("PUT", resource_path(CORE, "Pod", NAMESPACE, "done", "status"), body)
        assert status == 200, body

        m = kube_fleet.start_meridian()
        time.sleep(2.5)  # the members' capacity goes to the store once per heartbeat (1 s)
        hub.apply(deployment("batch", 6))
        kube_fleet.policy("batch", {
            "resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "batch"}],
            "placement": {
                "clusterAffinities": [{"name": "eu", "clusterNames": ["m1", "m2"]}],
                "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
                                      "dynamic": "AvailableCapacity"},
            },
        })
        m.wait_for(lambda: replicas(m, "batch") == {"m1": 2, "m2": 4}, timeout=15,
                   what="6 replicas divided by free capacity 2/4")
        # m3 has no Nodes: its capacity is unknown, and it is not in the tier anyway.
        assert [e["cluster"] for e in decision(m, "batch")["excluded"]] == ["m3"]
    finally:
        for p in [*pods, "done"]:
            m1.request("DELETE", resource_path(CORE, "Pod", NAMESPACE, p) + "?gracePeriodSeconds=0")
        hub.delete(APPS, "Deployment", "batch", NAMESPACE)
