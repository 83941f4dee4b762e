"""Propagation into Kubernetes members (issue 13) on the real kube-apiservers of kube_fleet.py:
hub templates placed by ClusterSchedulingPolicies are applied into the members by the leader
(server-side apply, field manager meridian), kept there (drift reverted, an HPA's replicas
left alone), reported back (a Placement per template, the template's status summed), and
moved gracefully: the new copies first, traffic next, the old copy last.

There is no controller manager and no kubelet: nothing runs the Deployments. The test writes
a member Deployment's status itself, as the Deployment controller would, to say what is ready.
"""

import base64
import json
import subprocess
import threading
import time
import uuid

import pytest

from conftest import BIN
from kube_fleet import CORE, FROM, MCS, MERIDIAN, NAMESPACE, wait_for
from kube_cluster import resource_path
from test_kube import eds_addresses

APPS = "apps/v1"
MANAGED = "app.kubernetes.io/managed-by"
TEMPLATE_LABEL = "meridian.io/template"


@pytest.fixture(autouse=True)
def propagation_rbac(kube_fleet):
    """Members get deploy/rbac/member-propagation.yaml for these tests only: the other kube
    tests check that member.yaml alone lets meridian write nothing but its MCS objects."""
    kube_fleet.grant_propagation()
    yield
    kube_fleet.revoke_propagation()


def deployment(name, replicas, *, namespace=NAMESPACE, image_tag="1", annotations=None):
    pod_meta = {"labels": {"app": name}}
    if annotations:
        pod_meta["annotations"] = annotations
    return {"apiVersion": APPS, "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": pod_meta,
                                  "spec": {"containers": [{"name": name,
                                                           "image": f"registry.example.com/shop/{name}:{image_tag}"}]}}}}


def divided(name, weights, **placement):
    """A policy placing Deployment `name` in tier eu (m1, m2) by static weights."""
    return {
        "resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": name}],
        "placement": {
            "clusterAffinities": [{"name": "eu", "clusterNames": list(weights)}],
            "replicaScheduling": {"type": "Divided", "divisionPreference": "Weighted",
                                  "weights": [{"clusterNames": [c], "weight": w} for c, w in weights.items()]},
            **placement,
        },
    }


def member_deployment(kube_fleet, member, name, namespace=NAMESPACE):
    return kube_fleet.cluster(member).get(APPS, "Deployment", name, namespace)


def member_replicas(kube_fleet, name, members=("m1", "m2", "m3")):
    """{member: spec.replicas} of the Deployment `name` where it exists."""
    out = {}
    for member in members:
        d = member_deployment(kube_fleet, member, name)
        if d is not None:
            out[member] = d["spec"]["replicas"]
    return out


def write_status(kube_fleet, member, name, ready, *, replicas=None, namespace=NAMESPACE):
    """What the member's Deployment controller would report: it observed the current
    generation, and `ready` of its replicas are ready and available."""
    c = kube_fleet.cluster(member)
    for _ in range(10):
        d = c.get(APPS, "Deployment", name, namespace)
        total = d["spec"]["replicas"] if replicas is None else replicas
        d["status"] = {"observedGeneration": d["metadata"]["generation"], "replicas": total,
                       "updatedReplicas": total, "readyReplicas": ready, "availableReplicas": ready,
                       "unavailableReplicas": max(total - ready, 0),
                       "conditions": [{"type": "Available", "status": "True" if ready >= total else "False",
                                       "reason": "MinimumReplicasAvailable" if ready >= total else "MinimumReplicasUnavailable",
                                       "message": f"{ready} of {total} available",
                                       "lastTransitionTime": "2026-12-01T00:00:00Z"}]}
        status, body = c.request("PUT", resource_path(APPS, "Deployment", namespace, name, "status"), d)
        if status == 200:
            return body
        assert status == 409, body  # meridian wrote it meanwhile: read it again
    raise AssertionError(f"cannot write the status of {member} {name}")


def placement(kube_fleet, name, kind="deployment.apps", namespace=NAMESPACE):
    return kube_fleet.hub.get(MERIDIAN, "Placement", f"{kind}.{name}", namespace)


def condition(obj, type_):
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None


def metric(m, name):
    status, body = m.http("/metrics")
    assert status == 200
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_divided_deployment_is_applied_overridden_summed_and_kept(kube_fleet, kube_meridian):
    m, hub = kube_meridian, kube_fleet.hub
    hub.apply(deployment("web", 9))
    hub.apply({"apiVersion": MERIDIAN, "kind": "OverridePolicy", "metadata": {"name": "m2-mirror", "namespace": NAMESPACE},
               "spec": {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment"}],
                        "overrideRules": [{"targetClusters": {"clusterNames": ["m2"]},
                                           "overriders": {"image": [{"component": "Registry", "operator": "replace",
                                                                     "value": "mirror.example.com"}]}}]}})
    kube_fleet.policy("web", divided("web", {"m1": 1, "m2": 2}))

    # 9 at 1:2 are 3 and 6, written into the members; the image overridden in m2 only.
    wait_for(lambda: member_replicas(kube_fleet, "web") == {"m1": 3, "m2": 6}, timeout=20,
             what="the Deployment applied as 3 in m1 and 6 in m2", log=m)
    m1, m2 = (member_deployment(kube_fleet, c, "web") for c in ("m1", "m2"))
    assert m1["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/shop/web:1"
    assert m2["spec"]["template"]["spec"]["containers"][0]["image"] == "mirror.example.com/shop/web:1"
    for d in (m1, m2):
        assert d["metadata"]["labels"][MANAGED] == "meridian", d["metadata"]
        assert d["metadata"]["labels"][TEMPLATE_LABEL] == "deployment.apps.web", d["metadata"]
        assert d["metadata"]["annotations"]["meridian.io/template"] == "apps/v1/Deployment/shop/web"
        managers = {f["manager"] for f in d["metadata"]["managedFields"]}
        assert managers == {"meridian"}, managers
    assert member_deployment(kube_fleet, "m3", "web") is None

    # The Placement names the decision.
    record = wait_for(lambda: placement(kube_fleet, "web"), timeout=10, what="the Placement of web")
    assert record["spec"]["summary"] == "m1=3,m2=6", record["spec"]
    assert record["spec"]["policy"] == "shop/web" and record["spec"]["tier"] == "eu", record["spec"]

    # The members report (as their controllers would): the hub template's status sums them,
    # and observedGeneration is the hub's generation once every member observed its apply.
    write_status(kube_fleet, "m1", "web", 3)
    write_status(kube_fleet, "m2", "web", 4)
    generation = hub.get(APPS, "Deployment", "web", NAMESPACE)["metadata"]["generation"]

    def hub_status():
        return (hub.get(APPS, "Deployment", "web", NAMESPACE).get("status") or {})

    s = wait_for(lambda: (lambda s: s if s.get("readyReplicas") == 7 else None)(hub_status()), timeout=15,
                 what="the hub's status summed over the members", log=m)
    assert (s["replicas"], s["availableReplicas"], s["unavailableReplicas"]) == (9, 7, 2), s
    assert s.get("observedGeneration") == generation, s
    available = [c for c in s["conditions"] if c["type"] == "Available"][0]
    assert available["status"] == "False" and "m2" in available["message"], available

    # A new template generation: the members get it, and the hub's observedGeneration waits
    # until every member has observed it.
    hub.apply(deployment("web", 12))
    wait_for(lambda: member_replicas(kube_fleet, "web") == {"m1": 4, "m2": 8}, timeout=15,
             what="12 applied as 4/8", log=m)
    new_generation = hub.get(APPS, "Deployment", "web", NAMESPACE)["metadata"]["generation"]
    assert new_generation > generation
    time.sleep(2)
    assert hub_status().get("observedGeneration") != new_generation, hub_status()
    write_status(kube_fleet, "m1", "web", 4)
    time.sleep(1.5)
    assert hub_status().get("observedGeneration") != new_generation, "m2 has not observed it yet"
    write_status(kube_fleet, "m2", "web", 8)
    wait_for(lambda: hub_status().get("observedGeneration") == new_generation, timeout=15,
             what="observedGeneration once both members observed the new generation", log=m)
    assert hub_status()["readyReplicas"] == 12

    # Drift on a field meridian owns is reverted.
    m1c = kube_fleet.cluster("m1")
    status, body = m1c.request("PATCH", resource_path(APPS, "Deployment", NAMESPACE, "web"),
                               {"spec": {"replicas": 1}}, content_type="application/merge-patch+json")
    assert status == 200, body
    wait_for(lambda: member_replicas(kube_fleet, "web", ["m1"]) == {"m1": 4}, timeout=15,
             what="the drifted replica count reverted", log=m)
    assert metric(m, "meridian_propagation_drift_reverted_total") >= 1

    # An HPA in m2 scales web there: its replica count is the member's from then on.
    m2c = kube_fleet.cluster("m2")
    m2c.apply({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": "web", "namespace": NAMESPACE},
               "spec": {"scaleTargetRef": {"apiVersion": APPS, "kind": "Deployment", "name": "web"},
                        "minReplicas": 1, "maxReplicas": 20,
                        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                                                                      "target": {"type": "Utilization", "averageUtilization": 80}}}]}})
    time.sleep(1.5)  # the HPA reaches meridian's watch
    status, body = m2c.request("PATCH", resource_path(APPS, "Deployment", NAMESPACE, "web", "scale"),
                               {"spec": {"replicas": 11}}, content_type="application/merge-patch+json")
    assert status == 200, body
    # A template edit makes meridian apply both copies again: m1 gets it, m2 keeps 11.
    hub.apply(deployment("web", 12, annotations={"rev": "2"}))
    wait_for(lambda: (member_deployment(kube_fleet, "m2", "web")["spec"]["template"]["metadata"]
                      .get("annotations", {}).get("rev")) == "2", timeout=15, what="the edit applied in m2",
             log=m)
    time.sleep(1.5)
    assert member_replicas(kube_fleet, "web", ["m1", "m2"]) == {"m1": 4, "m2": 11}
    # meridian let go of m2's replicas (handed over, then left out of its apply), so a watch
    # that lags the HPA cannot send an old count back; m1's it still owns.
    def applied_fields(member):
        d = member_deployment(kube_fleet, member, "web")
        ours = [f for f in d["metadata"]["managedFields"] if f["manager"] == "meridian" and f["operation"] == "Apply"]
        assert len(ours) == 1, d["metadata"]["managedFields"]
        return ours[0]["fieldsV1"]["f:spec"]
    assert "f:replicas" not in applied_fields("m2"), applied_fields("m2")
    assert "f:replicas" in applied_fields("m1"), applied_fields("m1")

    # explain says what each member holds.
    p = subprocess.run([str(BIN), "explain", "Deployment/web", "-n", NAMESPACE,
                                      "--admin", f"127.0.0.1:{m.admin_port}"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "m1 holds: applied, 4 replicas," in p.stdout, p.stdout
    assert metric(m, "meridian_propagation_applies_total") >= 4

    # The template goes: so do its copies and its Placement; the namespace stays (meridian
    # did not create it).
    hub.delete(APPS, "Deployment", "web", NAMESPACE)
    wait_for(lambda: member_replicas(kube_fleet, "web") == {}, timeout=15, what="the copies deleted",
             log=m)
    wait_for(lambda: placement(kube_fleet, "web") is None, timeout=10, what="the Placement deleted")
    ns = kube_fleet.cluster("m1").get(CORE, "Namespace", NAMESPACE)
    assert ns is not None and not ns["metadata"].get("deletionTimestamp"), ns


def test_drift_another_writer_keeps_making_is_held_off_and_reported(kube_fleet, kube_meridian):
    m, hub = kube_meridian, kube_fleet.hub
    hub.apply(deployment("fought", 2))
    kube_fleet.policy("fought", {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "fought"}],
                                 "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m1"]}]}})
    wait_for(lambda: member_replicas(kube_fleet, "fought", ["m1"]) == {"m1": 2}, timeout=20,
             what="fought applied in m1", log=m)
    before = metric(m, "meridian_propagation_drift_reverted_total")
    m1 = kube_fleet.cluster("m1")
    stop, fights = threading.Event(), []

    def fight():
        """Another controller that wants 5 replicas, and puts them back whenever meridian reverts."""
        while not stop.is_set():
            d = member_deployment(kube_fleet, "m1", "fought")
            if d and d["spec"]["replicas"] != 5:
                status, _ = m1.request("PATCH", resource_path(APPS, "Deployment", NAMESPACE, "fought"),
                                       {"spec": {"replicas": 5}}, content_type="application/merge-patch+json")
                fights.append(status)
            time.sleep(0.1)

    fighter = threading.Thread(target=fight, daemon=True)
    fighter.start()
    try:
        def held():
            c = condition(placement(kube_fleet, "fought"), "Applied")
            return c if c and c["status"] == "False" and "comes back after every revert" in c["message"] else None

        c = wait_for(held, timeout=40, what="the fight reported on the Placement", log=m)
        assert "/spec/replicas" in c["message"] and "m1" in c["message"], c
        reverts = metric(m, "meridian_propagation_drift_reverted_total") - before
        assert reverts >= 5, f"held after {reverts} reverts"
        time.sleep(4)  # held for 30 s: no revert meanwhile, however often the other writer writes
        assert metric(m, "meridian_propagation_drift_reverted_total") - before == reverts
        assert member_replicas(kube_fleet, "fought", ["m1"]) == {"m1": 5}
        assert len(fights) >= 5 and all(s == 200 for s in fights), fights
    finally:
        stop.set()
        fighter.join(timeout=5)


def test_an_object_meridian_did_not_create_is_a_conflict_unless_the_policy_overwrites(kube_fleet, kube_meridian):
    m, hub = kube_meridian, kube_fleet.hub
    m1 = kube_fleet.cluster("m1")
    m1.apply(deployment("legacy", 1, image_tag="old"))
    hub.apply(deployment("legacy", 2))
    spec = {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "legacy"}],
            "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m1"]}]}}
    kube_fleet.policy("legacy", spec)
    record = wait_for(lambda: (lambda p: p if condition(p, "Conflict") else None)(placement(kube_fleet, "legacy")),
                      timeout=15, what="a Conflict condition on the Placement", log=m)
    c = condition(record, "Conflict")
    assert c["status"] == "True" and "m1" in c["message"], c
    legacy = member_deployment(kube_fleet, "m1", "legacy")
    assert legacy["spec"]["replicas"] == 1 and MANAGED not in (legacy["metadata"].get("labels") or {}), legacy
    assert metric(m, "meridian_propagation_conflicts_total") >= 1

    spec["placement"]["conflictResolution"] = "Overwrite"
    kube_fleet.policy("legacy", spec)
    wait_for(lambda: member_replicas(kube_fleet, "legacy", ["m1"]) == {"m1": 2}, timeout=15,
             what="the object adopted under Overwrite", log=m)
    legacy = member_deployment(kube_fleet, "m1", "legacy")
    assert legacy["metadata"]["labels"][MANAGED] == "meridian"
    assert legacy["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":1")
    wait_for(lambda: condition(placement(kube_fleet, "legacy"), "Conflict") is None, timeout=10,
             what="the Conflict condition cleared")


def test_a_namespace_is_created_where_needed_and_removed_with_the_last_object(kube_fleet, kube_meridian):
    m, hub = kube_meridian, kube_fleet.hub
    # Fresh per run: a deleted namespace never goes away without a controller manager.
    ns = f"team-{uuid.uuid4().hex[:8]}"
    hub.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": ns}})
    hub.apply({"apiVersion": CORE, "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": ns},
               "data": {"mode": "fast"}})
    kube_fleet.policy("settings", {
        "resourceSelectors": [{"apiVersion": CORE, "kind": "ConfigMap", "name": "settings"}],
        "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m1"]}]},
    }, namespace=ns)
    m1 = kube_fleet.cluster("m1")
    cm = wait_for(lambda: m1.get(CORE, "ConfigMap", "settings", ns), timeout=20,
                  what="the ConfigMap in a namespace m1 did not have", log=m)
    assert cm["data"] == {"mode": "fast"}
    created = m1.get(CORE, "Namespace", ns)
    assert created["metadata"]["labels"][MANAGED] == "meridian", created["metadata"]
    # Only where something is placed: the hub's namespace is not copied to m2 or m3.
    assert kube_fleet.cluster("m2").get(CORE, "Namespace", ns) is None
    assert kube_fleet.cluster("m3").get(CORE, "Namespace", ns) is None

    hub.delete(CORE, "ConfigMap", "settings", ns)
    wait_for(lambda: m1.get(CORE, "ConfigMap", "settings", ns) is None, timeout=15,
             what="the ConfigMap deleted with its template", log=m)
    gone = wait_for(lambda: (lambda n: n is None or n["metadata"].get("deletionTimestamp"))(m1.get(CORE, "Namespace", ns)),
                    timeout=15, what="the namespace meridian created deleted", log=m)
    assert gone


def test_a_policy_edit_moves_traffic_first_and_deletes_the_old_copy_once_the_new_one_is_ready(kube_fleet, kube_meridian):
    """The policy places web in m1 and m2 and governs its Service; the edit drops m1. A client
    in m1 is sent to m2 at once (its endpoints are ready), m1's copy stays until m2's copy
    reports ready, then goes."""
    m, hub = kube_meridian, kube_fleet.hub
    kube_fleet.publish("m1", "web", ["10.1.0.1"])
    kube_fleet.publish("m2", "web", ["10.2.0.1"])
    hub.apply(deployment("web", 4))
    spec = {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "web"}, {"name": "web"}],
            "placement": {"clusterAffinities": [{"name": "eu", "clusterNames": ["m1", "m2"]}],
                          "gracePeriodSeconds": 120}}
    kube_fleet.policy("web", spec)
    wait_for(lambda: member_replicas(kube_fleet, "web") == {"m1": 4, "m2": 4}, timeout=20,
             what="web duplicated into m1 and m2", log=m)
    name = "web.shop.global"
    m.wait_for(lambda: m.addresses(name, source=FROM["m1"]) == ["10.1.0.1"], timeout=15,
               what="a client in m1 sent to m1 (its own cluster)")
    eds = "web.shop.global:80"
    wait_for(lambda: eds_addresses(m.xds_port, "m1", eds) == {0: ["10.1.0.1"], 1: ["10.2.0.1"]}, timeout=15,
             what="EDS for an Envoy in m1: m1 first, m2 (same region) next", log=m)
    write_status(kube_fleet, "m1", "web", 4)

    spec["placement"]["clusterAffinities"] = [{"name": "eu", "clusterNames": ["m2"]}]
    kube_fleet.policy("web", spec)
    # Traffic first: m1 is no longer placed, so its endpoints come after m2's.
    m.wait_for(lambda: m.addresses(name, source=FROM["m1"]) == ["10.2.0.1"], timeout=15,
               what="a client in m1 sent to m2 once m1 is no longer placed")
    # EDS agrees: m2 first, m1's draining copy only as the last priority.
    wait_for(lambda: eds_addresses(m.xds_port, "m1", eds) == {0: ["10.2.0.1"], 1: ["10.1.0.1"]}, timeout=15,
             what="EDS for an Envoy in m1: m2 first, m1 last", log=m)
    # The old copy stays while the new one is not ready, shown as an eviction.
    record = wait_for(lambda: (lambda p: p if (p.get("status") or {}).get("evictions") else None)(placement(kube_fleet, "web")),
                      timeout=10, what="the eviction on the Placement", log=m)
    assert [e["cluster"] for e in record["status"]["evictions"]] == ["m1"], record["status"]
    time.sleep(2)
    assert member_deployment(kube_fleet, "m1", "web") is not None, "deleted before its replacement was ready"
    assert m.addresses(name, source=FROM["m1"]) == ["10.2.0.1"]
    # m2 reports ready: m1's copy goes.
    write_status(kube_fleet, "m2", "web", 4)
    wait_for(lambda: member_deployment(kube_fleet, "m1", "web") is None, timeout=15,
             what="m1's copy deleted once m2's is ready", log=m)
    assert member_replicas(kube_fleet, "web") == {"m2": 4}
    assert metric(m, "meridian_propagation_evictions_total") >= 1
    wait_for(lambda: metric(m, "meridian_propagation_converge_seconds_count") >= 1, timeout=10,
             what="the rollout's convergence observed", log=m)


def test_a_member_being_deleted_hands_its_replicas_over_first_and_goes_once_emptied(kube_fleet, kube_meridian):
    """Deleting m1's MemberCluster retires m1: nothing is placed there, m2 takes all 9, a
    client in m1 is sent to m2 at once, m1's copy goes once m2's is ready, and only then is
    the MemberCluster (held by meridian's finalizer) gone."""
    m, hub = kube_meridian, kube_fleet.hub
    kube_fleet.publish("m1", "web", ["10.1.0.1"])
    kube_fleet.publish("m2", "web", ["10.2.0.1"])
    hub.apply(deployment("web", 9))
    policy = divided("web", {"m1": 1, "m2": 2}, gracePeriodSeconds=120)
    policy["resourceSelectors"].append({"name": "web"})
    kube_fleet.policy("web", policy)
    wait_for(lambda: member_replicas(kube_fleet, "web") == {"m1": 3, "m2": 6}, timeout=20,
             what="web divided 3/6", log=m)
    write_status(kube_fleet, "m1", "web", 3)
    write_status(kube_fleet, "m2", "web", 6)
    name = "web.shop.global"
    m.wait_for(lambda: m.addresses(name, source=FROM["m1"]) == ["10.1.0.1"], timeout=15,
               what="a client in m1 sent to m1")
    held = wait_for(lambda: (lambda mc: mc if "meridian.io/placed-copies" in (mc["metadata"].get("finalizers") or [])
                             else None)(hub.get(MERIDIAN, "MemberCluster", "m1")),
                    timeout=10, what="meridian's finalizer on m1's MemberCluster", log=m)
    assert held["spec"], "the finalizer is all meridian applied: the spec is the user's"
    m3 = hub.get(MERIDIAN, "MemberCluster", "m3")
    assert "meridian.io/placed-copies" not in (m3["metadata"].get("finalizers") or []), \
        "m3 holds nothing of meridian's: nothing holds its deletion"

    hub.delete(MERIDIAN, "MemberCluster", "m1")
    wait_for(lambda: member_replicas(kube_fleet, "web", ["m2"]) == {"m2": 9}, timeout=20,
             what="m2 takes all 9 from the retiring m1", log=m)
    m.wait_for(lambda: m.addresses(name, source=FROM["m1"]) == ["10.2.0.1"], timeout=15,
               what="a client in m1 sent to m2 once m1 retires")
    record = wait_for(lambda: (lambda p: p if (p.get("status") or {}).get("evictions") else None)(placement(kube_fleet, "web")),
                      timeout=10, what="the eviction on the Placement", log=m)
    assert [(e["cluster"], e["reason"]) for e in record["status"]["evictions"]] == [("m1", "Retiring")], record["status"]
    time.sleep(2)
    assert member_deployment(kube_fleet, "m1", "web") is not None, "deleted before its replacement was ready"
    mc = hub.get(MERIDIAN, "MemberCluster", "m1")
    assert mc is not None and mc["metadata"].get("deletionTimestamp"), "let go while it still holds a copy"

    write_status(kube_fleet, "m2", "web", 9)
    wait_for(lambda: member_deployment(kube_fleet, "m1", "web") is None, timeout=15,
             what="m1's copy deleted once m2's 9 are ready", log=m)
    wait_for(lambda: hub.get(MERIDIAN, "MemberCluster", "m1") is None, timeout=15,
             what="the MemberCluster gone once m1 holds nothing of meridian's", log=m)
    m.wait_for(lambda: m.addresses(name, source=FROM["m2"]) == ["10.2.0.1"], timeout=15,
               what="m1's endpoints gone with it")
    assert member_replicas(kube_fleet, "web", ["m2"]) == {"m2": 9}


def test_a_template_two_policies_select_is_placed_by_the_older_one(kube_fleet, kube_meridian):
    m, hub = kube_meridian, kube_fleet.hub
    hub.apply(deployment("web", 2))
    kube_fleet.policy("first", {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "web"}],
                                "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m1"]}]}})
    wait_for(lambda: member_replicas(kube_fleet, "web") == {"m1": 2}, timeout=20, what="web in m1", log=m)
    time.sleep(1.1)  # creationTimestamp has a resolution of a second: "second" is younger
    kube_fleet.policy("second", {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment"}],
                                 "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m3"]}]}})

    def conflict():
        status, body = m.http("/debug/problems")
        assert status == 200
        return [p for p in json.loads(body)["problems"]
                if "second" in json.dumps(p) and "older policy shop/first" in json.dumps(p)]

    found = wait_for(conflict, timeout=15, what="a Conflict problem naming the younger policy", log=m)
    assert "apps/v1/Deployment/shop/web" in json.dumps(found[0]), found
    time.sleep(1.5)
    assert member_replicas(kube_fleet, "web") == {"m1": 2}, "the younger policy moved the template"
    assert placement(kube_fleet, "web")["spec"]["policy"] == "shop/first"

    # Both policies say so in their status (kubectl get csp -o yaml).
    def policy_condition(name, type_, status):
        c = condition(kube_fleet.hub.get(MERIDIAN, "ClusterSchedulingPolicy", name, NAMESPACE), type_)
        return c if c and c["status"] == status else None

    lost = wait_for(lambda: policy_condition("second", "Conflict", "True"), timeout=15,
                    what="Conflict on the younger policy's status", log=m)
    assert lost["reason"] == "OlderPolicy" and "older policy shop/first" in lost["message"], lost
    assert policy_condition("second", "Valid", "True"), "a conflict is not an invalid policy"
    assert policy_condition("first", "Conflict", "False")
    scheduled = policy_condition("first", "Scheduled", "True")
    assert scheduled and scheduled["message"] == "1 template(s) placed", scheduled
    assert policy_condition("first", "Applied", "True")


def test_failover_keeps_the_sum_and_failback_adds_before_it_removes(kube_fleet):
    m = kube_fleet.start_meridian()
    hub = kube_fleet.hub
    hub.apply(deployment("web", 9))
    kube_fleet.policy("web", divided("web", {"m1": 1, "m2": 2}, failover={"afterSeconds": 2},
                                     failbackAfterSeconds=8))
    wait_for(lambda: member_replicas(kube_fleet, "web") == {"m1": 3, "m2": 6}, timeout=20,
             what="3/6", log=m)
    kube_fleet.stop_apiserver("m1")
    try:
        # Unreachable after 3 s, failed over 2 s later: m2 takes all 9 (the sum is kept).
        wait_for(lambda: member_replicas(kube_fleet, "web", ["m2"]) == {"m2": 9}, timeout=25,
                 what="m2 takes the 9 replicas", log=m)
        write_status(kube_fleet, "m2", "web", 9)
        time.sleep(1)
    finally:
        kube_fleet.start_apiserver("m1")
    # Back: m1's old copy goes (its replacement is ready), then after failbackAfterSeconds
    # m1 is placed again, and m2 keeps 9 until m1's new copy is ready.
    wait_for(lambda: member_deployment(kube_fleet, "m1", "web") is None, timeout=20, interval=0.05,
             what="m1's old copy deleted on its return", log=m)
    wait_for(lambda: member_replicas(kube_fleet, "web") == {"m1": 3, "m2": 9}, timeout=25,
             what="m1 placed again after failback, m2 still at 9", log=m)
    time.sleep(2)
    assert member_replicas(kube_fleet, "web") == {"m1": 3, "m2": 9}, "m2 shrank before m1 was ready"
    write_status(kube_fleet, "m1", "web", 3)
    wait_for(lambda: member_replicas(kube_fleet, "web") == {"m1": 3, "m2": 6}, timeout=15,
             what="the split back to 3/6 once m1 is ready", log=m)


def test_a_refused_object_and_a_forbidden_kind_are_reported_and_the_rest_proceeds(kube_fleet, kube_meridian):
    m, hub = kube_meridian, kube_fleet.hub
    # m2's copy gets a label value its API refuses (422); m1's copy is fine.
    hub.apply(deployment("web", 2))
    hub.apply({"apiVersion": MERIDIAN, "kind": "OverridePolicy", "metadata": {"name": "bad-label", "namespace": NAMESPACE},
               "spec": {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "web"}],
                        "overrideRules": [{"targetClusters": {"clusterNames": ["m2"]},
                                           "overriders": {"labels": {"operator": "add",
                                                                     "value": {"tier": "not a valid value!"}}}}]}})
    kube_fleet.policy("web", {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "web"}],
                              "placement": {"clusterAffinities": [{"name": "eu", "clusterNames": ["m1", "m2"]}]}})
    wait_for(lambda: member_replicas(kube_fleet, "web", ["m1"]) == {"m1": 2}, timeout=20,
             what="m1's copy applied", log=m)
    record = wait_for(lambda: (lambda p: p if (condition(p, "Applied") or {}).get("status") == "False" else None)(
        placement(kube_fleet, "web")), timeout=15, what="Applied False on the Placement", log=m)
    message = condition(record, "Applied")["message"]
    assert "m2" in message and "422" in message and "not a valid value!" in message, message
    m2 = [c for c in record["status"]["clusters"] if c["name"] == "m2"][0]
    assert not m2["applied"] and "422" in m2["error"], m2
    assert member_deployment(kube_fleet, "m2", "web") is None
    # The policy's status says it too.
    applied = wait_for(lambda: (lambda c: c if c and c["status"] == "False" else None)(
        condition(kube_fleet.hub.get(MERIDIAN, "ClusterSchedulingPolicy", "web", NAMESPACE), "Applied")),
        timeout=15, what="Applied False on the policy", log=m)
    assert applied["reason"] == "ApplyFailed" and "shop/web in m2" in applied["message"] and "422" in applied["message"], applied

    # A kind the hub lets meridian read but a member's RBAC does not let it write (Roles).
    rbac = "rbac.authorization.k8s.io/v1"
    hub.apply([{"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "meridian-read-roles"},
                "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                           "verbs": ["get", "list", "watch"]}]},
               {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "meridian-read-roles"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "meridian-read-roles"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "meridian"}]},
               {"apiVersion": rbac, "kind": "Role", "metadata": {"name": "reader", "namespace": NAMESPACE},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}])
    try:
        kube_fleet.policy("roles", {"resourceSelectors": [{"apiVersion": rbac, "kind": "Role", "name": "reader"}],
                                    "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m1"]}]}})
        record = wait_for(lambda: (lambda p: p if (condition(p, "Applied") or {}).get("status") == "False" else None)(
            placement(kube_fleet, "reader", kind="role.rbac.authorization.k8s.io")), timeout=20,
            what="the forbidden kind on the Placement", log=m)
        message = condition(record, "Applied")["message"]
        assert "m1" in message and "403" in message and "forbidden" in message.lower(), message
        # Everything else keeps going: m1's Deployment is still applied and DNS answers.
        assert member_replicas(kube_fleet, "web", ["m1"]) == {"m1": 2}
        assert m.query("anything.shop.svc.clusterset.local").rcode() in (0, 3)
    finally:
        hub.delete(rbac, "Role", "reader", NAMESPACE)
        hub.delete(rbac, "ClusterRoleBinding", "meridian-read-roles")
        hub.delete(rbac, "ClusterRole", "meridian-read-roles")
        hub.delete(MERIDIAN, "OverridePolicy", "bad-label", NAMESPACE)


def test_members_keep_what_they_hold_while_the_hub_is_down(kube_fleet, kube_meridian):
    m, hub = kube_meridian, kube_fleet.hub
    kube_fleet.publish("m1", "api", ["10.1.0.9"])
    hub.apply(deployment("api", 2))
    kube_fleet.policy("api", {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "api"}],
                              "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m1"]}]}})
    wait_for(lambda: member_replicas(kube_fleet, "api") == {"m1": 2}, timeout=20, what="api in m1", log=m)
    m.wait_for(lambda: m.addresses("api.shop.global", source=FROM["m1"]) == ["10.1.0.9"], timeout=15,
               what="api answered")
    kube_fleet.stop_apiserver("hub")
    try:
        time.sleep(6)
        assert member_replicas(kube_fleet, "api") == {"m1": 2}
        assert m.addresses("api.shop.global", source=FROM["m1"]) == ["10.1.0.9"]
    finally:
        kube_fleet.start_apiserver("hub")
    # The hub is back: a template edit reaches the member again.
    hub.apply(deployment("api", 3))
    wait_for(lambda: member_replicas(kube_fleet, "api") == {"m1": 3}, timeout=30,
             what="the edit applied after the hub's return", log=m)


def test_a_hub_configmap_a_deployment_uses_follows_it_changes_with_it_and_goes_with_it(kube_fleet, kube_meridian):
    """On a Kubernetes hub the ConfigMap a pod template names (envFrom, a volume) is read from
    the hub and propagated where the Deployment went (issue 36): only the kinds a policy
    selects used to be watched, so the copies started without their configuration."""
    m, hub = kube_meridian, kube_fleet.hub
    hub.apply({"apiVersion": CORE, "kind": "ConfigMap", "metadata": {"name": "cfgweb-env", "namespace": NAMESPACE},
               "data": {"MODE": "fast"}})
    hub.apply({"apiVersion": CORE, "kind": "ConfigMap", "metadata": {"name": "unrelated", "namespace": NAMESPACE},
               "data": {"x": "1"}})
    d = deployment("cfgweb", 1)
    pod = d["spec"]["template"]["spec"]
    pod["containers"][0]["envFrom"] = [{"configMapRef": {"name": "cfgweb-env"}}]
    pod["volumes"] = [{"name": "files", "configMap": {"name": "cfgweb-env"}}]
    hub.apply(d)
    kube_fleet.policy("cfgweb", {
        "resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "cfgweb"}],
        "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m1"]}]},
    })
    m1 = kube_fleet.cluster("m1")
    cm = wait_for(lambda: m1.get(CORE, "ConfigMap", "cfgweb-env", NAMESPACE), timeout=20,
                  what="the ConfigMap the Deployment uses, in m1", log=m)
    assert cm["data"] == {"MODE": "fast"}
    assert member_deployment(kube_fleet, "m1", "cfgweb") is not None
    assert kube_fleet.cluster("m2").get(CORE, "ConfigMap", "cfgweb-env", NAMESPACE) is None, "only where it went"
    assert m1.get(CORE, "ConfigMap", "unrelated", NAMESPACE) is None, "a ConfigMap nothing names stays on the hub"
    # Edited on the hub: the copy follows.
    hub.apply({"apiVersion": CORE, "kind": "ConfigMap", "metadata": {"name": "cfgweb-env", "namespace": NAMESPACE},
               "data": {"MODE": "slow"}})
    wait_for(lambda: (m1.get(CORE, "ConfigMap", "cfgweb-env", NAMESPACE) or {}).get("data") == {"MODE": "slow"},
             timeout=20, what="the edit in m1", log=m)
    # The Deployment goes: so does the ConfigMap it named.
    hub.delete(APPS, "Deployment", "cfgweb", NAMESPACE)
    wait_for(lambda: m1.get(CORE, "ConfigMap", "cfgweb-env", NAMESPACE) is None, timeout=20,
             what="the ConfigMap removed with the Deployment", log=m)
    hub.delete(CORE, "ConfigMap", "cfgweb-env", NAMESPACE)
    hub.delete(CORE, "ConfigMap", "unrelated", NAMESPACE)


def test_a_hub_secret_a_deployment_names_follows_it_once_the_hub_may_read_it(kube_fleet, kube_meridian):
    """Issue 36: the Secrets a pod template names follow it as its ConfigMaps do, read on the
    hub one by one (never listed). Without deploy/rbac/hub-secrets.yaml the hub cannot read
    them: the Deployment is placed, the Secret is a warning saying what to grant; granted, it
    follows, follows its edits, and goes with the Deployment."""
    m, hub = kube_meridian, kube_fleet.hub
    secret = lambda value: {"apiVersion": CORE, "kind": "Secret", "type": "Opaque",  # noqa: E731
                            "metadata": {"name": "secweb-token", "namespace": NAMESPACE},
                            "data": {"TOKEN": base64.b64encode(value).decode()}}
    hub.apply(secret(b"one"))
    d = deployment("secweb", 1)
    d["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "secweb-token"}}]
    hub.apply(d)
    kube_fleet.policy("secweb", {
        "resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "secweb"}],
        "placement": {"clusterAffinities": [{"name": "one", "clusterNames": ["m1"]}]},
    })
    m1 = kube_fleet.cluster("m1")
    wait_for(lambda: member_deployment(kube_fleet, "m1", "secweb"), timeout=30,
             what="the Deployment placed without its Secret", log=m)

    def warned():
        warnings = json.loads(m.http("/debug/problems")[1])["warnings"]
        return [p for p in warnings if "secweb-token" in p["object"] and "hub-secrets.yaml" in p["reason"]
                and "403 Forbidden" in p["reason"]]

    wait_for(warned, timeout=20, what="a warning naming the grant", log=m)
    assert m1.get(CORE, "Secret", "secweb-token", NAMESPACE) is None
    kube_fleet.grant_secrets()
    try:
        copy = wait_for(lambda: m1.get(CORE, "Secret", "secweb-token", NAMESPACE), timeout=40,
                        what="the Secret in m1 once the hub may read it", log=m)
        assert base64.b64decode(copy["data"]["TOKEN"]) == b"one"
        assert kube_fleet.cluster("m2").get(CORE, "Secret", "secweb-token", NAMESPACE) is None
        assert not warned()
        hub.apply(secret(b"two"))
        wait_for(lambda: base64.b64decode((m1.get(CORE, "Secret", "secweb-token", NAMESPACE) or {})
                                          .get("data", {}).get("TOKEN", "")) == b"two",
                 timeout=60, what="the edit in m1 (read again every 30 s)", log=m)
        hub.delete(APPS, "Deployment", "secweb", NAMESPACE)
        wait_for(lambda: m1.get(CORE, "Secret", "secweb-token", NAMESPACE) is None, timeout=30,
                 what="the Secret removed with the Deployment", log=m)
    finally:
        kube_fleet.revoke_secrets()
        hub.delete(CORE, "Secret", "secweb-token", NAMESPACE)


def test_a_planned_move_keeps_the_old_clusters_answers_until_the_new_one_is_ready(kube_fleet, kube_meridian):
    """Make before break (issue 36): the policy places Deployment mbb with its Service and
    ServiceExport (templates without replicas follow it) in m1; an edit moves them to m2.
    Until m2's copy is ready, m1 keeps its Service and export, so a client in m1, sampled
    every 100 ms, is never answered empty; then traffic moves and m1's copies go."""
    m, hub = kube_meridian, kube_fleet.hub
    hub.apply(deployment("mbb", 1))
    hub.apply({"apiVersion": CORE, "kind": "Service", "metadata": {"name": "mbb", "namespace": NAMESPACE},
               "spec": {"selector": {"app": "mbb"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    hub.apply({"apiVersion": MCS, "kind": "ServiceExport", "metadata": {"name": "mbb", "namespace": NAMESPACE}})
    spec = {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "mbb"},
                                  {"apiVersion": CORE, "kind": "Service", "name": "mbb"},
                                  {"apiVersion": MCS, "kind": "ServiceExport", "name": "mbb"},
                                  {"name": "mbb"}],
            "placement": {"clusterAffinities": [{"name": "here", "clusterNames": ["m1"]}],
                          "gracePeriodSeconds": 300}}
    kube_fleet.policy("mbb", spec)
    m1, m2 = kube_fleet.cluster("m1"), kube_fleet.cluster("m2")
    wait_for(lambda: m1.get(APPS, "Deployment", "mbb", NAMESPACE) and m1.get(CORE, "Service", "mbb", NAMESPACE)
             and m1.get(MCS, "ServiceExport", "mbb", NAMESPACE),
             timeout=20, what="the Deployment, the Service and its export in m1", log=m)
    # What m1's endpoints controller would publish for the running pod.
    kube_fleet.endpoint_slice("m1", "mbb", ["10.1.0.55"])
    write_status(kube_fleet, "m1", "mbb", 1)
    name = "mbb.shop.global"
    m.wait_for(lambda: m.addresses(name, source=FROM["m1"]) == ["10.1.0.55"], timeout=20,
               what="a client in m1 answered by m1")

    spec["placement"]["clusterAffinities"] = [{"name": "here", "clusterNames": ["m2"]}]
    kube_fleet.policy("mbb", spec)
    wait_for(lambda: m2.get(CORE, "Service", "mbb", NAMESPACE) and member_deployment(kube_fleet, "m2", "mbb"),
             timeout=20, what="the new copies in m2", log=m)
    # m2's pod is starting: its endpoint is not ready. m1 keeps answering meanwhile.
    kube_fleet.endpoint_slice("m2", "mbb", ["10.2.0.55"], ready=False)
    empty = []
    deadline = time.time() + 3
    while time.time() < deadline:
        if not m.addresses(name, source=FROM["m1"]):
            empty.append(round(time.time() - deadline + 3, 1))
        time.sleep(0.1)
    assert not empty, f"empty answers during the move, at seconds {empty}"
    assert m1.get(CORE, "Service", "mbb", NAMESPACE) is not None, "m1's Service deleted before m2 was ready"
    assert m.addresses(name, source=FROM["m1"]) == ["10.1.0.55"]
    # m2 is ready: traffic moves there, then m1's copies go.
    kube_fleet.endpoint_slice("m2", "mbb", ["10.2.0.55"])
    write_status(kube_fleet, "m2", "mbb", 1)
    m.wait_for(lambda: m.addresses(name, source=FROM["m1"]) == ["10.2.0.55"], timeout=20,
               what="a client in m1 answered by m2 once it is ready")
    wait_for(lambda: m1.get(CORE, "Service", "mbb", NAMESPACE) is None and member_deployment(kube_fleet, "m1", "mbb") is None,
             timeout=20, what="m1's copies deleted after the move", log=m)
    kube_fleet.policy("mbb", {"resourceSelectors": [{"name": "mbb"}]})
    for kind, api in (("Deployment", APPS), ("Service", CORE), ("ServiceExport", MCS)):
        hub.delete(api, kind, "mbb", NAMESPACE)
