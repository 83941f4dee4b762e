"""`meridian join` and `meridian unjoin` (issue 41) against real kube-apiservers: the hub and
member m2 of the shared Kubernetes fleet, with m2 taken off the hub first. join is run as an
operator runs it, with both clusters' admin kubeconfigs; meridian then reads and writes m2 as
the ServiceAccount join made (deploy/rbac/member.yaml's role, bound to it), and unjoin leaves
nothing join made behind, listed by its label in both clusters.
"""

from __future__ import annotations

import subprocess

import yaml

from conftest import BIN
from kube_fleet import CORE, HUB_NAMESPACE, MERIDIAN

NAME = "cart.shop.global"
JOINED = "meridian.io/joined-by=meridian-join"
RBAC = "rbac.authorization.k8s.io/v1"


def meridian_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=330)


def made_by_join(cluster) -> list[str]:
    """Everything in `cluster` carrying join's label, as KIND/[NAMESPACE/]NAME."""
    found = []
    for api_version, kind, namespaced in ((CORE, "Namespace", False), (CORE, "ServiceAccount", True),
                                          (CORE, "Secret", True), (RBAC, "ClusterRole", False),
                                          (RBAC, "ClusterRoleBinding", False), (RBAC, "Role", True),
                                          (RBAC, "RoleBinding", True), (MERIDIAN, "MemberCluster", False)):
        try:
            items = cluster.list(api_version, kind, None, label_selector=JOINED)
        except Exception:  # noqa: BLE001 - MemberCluster is served on the hub only
            if kind == "MemberCluster":
                continue
            raise
        for o in items:
            meta = o["metadata"]
            found.append("/".join(p for p in (kind, meta.get("namespace"), meta["name"]) if p))
    return sorted(found)


def import_clusters(fleet, member: str, name: str) -> list[str]:
    si = fleet.service_import(member, name) or {}
    return sorted(c["cluster"] for c in (si.get("status") or {}).get("clusters") or [])


def test_join_registers_a_member_meridian_serves_and_unjoin_leaves_nothing_behind(kube_fleet, tmp_path):
    f = kube_fleet
    hub, m2 = f.hub, f.cluster("m2")
    f.delete_member_cluster("m2")
    hub.delete(CORE, "Secret", f.secret_name("m2"), HUB_NAMESPACE)
    # A namespace that was there before join (never deleted here: no controller manager
    # would ever finish deleting it) is used and kept.
    m2.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": HUB_NAMESPACE}})
    topology = {"topology.kubernetes.io/region": "eu", "topology.kubernetes.io/zone": "eu-b"}
    f.node("m2", "m2-node-1", labels=topology)
    f.node("m2", "m2-node-2", labels=topology)
    f.node("m2", "m2-node-3", labels={"topology.kubernetes.io/region": "us", "topology.kubernetes.io/zone": "us-a"})
    f.publish("m1", "cart", ["10.1.0.1"])
    f.publish("m2", "cart", ["10.2.0.1"])
    m = f.start_meridian()
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"], timeout=20, what="m1's cart alone")

    clusters = ["--hub-kubeconfig", str(hub.admin_kubeconfig), "--member-kubeconfig", str(m2.admin_kubeconfig)]
    join = ["join", "m2", *clusters, "--network", "net1", "--dns-client-cidr", "127.0.2.0/24"]

    # --dry-run prints the objects, without the token, and writes nothing.
    dry = meridian_cli(*join, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    printed = [d for d in yaml.safe_load_all(dry.stdout) if d]
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in printed)
    assert "MemberCluster/m2" in kinds and "ClusterRoleBinding/meridian-join-member" in kinds, kinds
    assert "ServiceAccount/meridian" in kinds and "Secret/meridian-member-m2" in kinds, kinds
    assert "token: <a token for" in dry.stdout
    # --propagation adds the roles to place workloads (deploy/rbac/member-propagation.yaml).
    placing = meridian_cli(*join, "--propagation", "--dry-run")
    assert placing.returncode == 0, placing.stderr
    placed_kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in yaml.safe_load_all(placing.stdout) if d)
    assert sorted(set(placed_kinds) - set(kinds)) == [
        "ClusterRole/meridian-member-propagation", "ClusterRoleBinding/meridian-join-member-propagation"], placed_kinds
    assert f.member_cluster("m2") is None and made_by_join(m2) == [] and made_by_join(hub) == []

    done = meridian_cli(*join)
    assert done.returncode == 0, done.stderr
    assert "topology.kubernetes.io/region=eu, from its Nodes" in done.stderr, done.stderr
    assert f"Namespace/{HUB_NAMESPACE} is there (not made by join): kept" in done.stderr, done.stderr
    # deploy/rbac/member.yaml's ClusterRole is on every member of this fleet already: used, kept.
    assert "ClusterRole/meridian-member is there (not made by join): kept" in done.stderr, done.stderr
    member = f.member_cluster("m2")
    assert member["metadata"]["labels"]["topology.kubernetes.io/region"] == "eu"
    assert member["metadata"]["labels"]["topology.kubernetes.io/zone"] == "eu-b"
    assert member["spec"]["source"]["kubernetes"]["secretRef"]["name"] == "meridian-member-m2"
    assert member["spec"]["network"] == {"name": "net1", "dnsClientCIDRs": ["127.0.2.0/24"]}
    # meridian reads m2 as the joined ServiceAccount, and writes into it (the ServiceImport).
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.2.0.1"], timeout=30, what="m2's cart, joined")
    m.wait_for(lambda: import_clusters(f, "m2", "cart") == ["m1", "m2"], timeout=30, what="m2's ServiceImport")
    assert made_by_join(m2) == ["ClusterRoleBinding/meridian-join-member",
                                "RoleBinding/kube-system/meridian-join-member-coredns",
                                f"ServiceAccount/{HUB_NAMESPACE}/meridian"]
    assert made_by_join(hub) == ["MemberCluster/m2", f"Secret/{HUB_NAMESPACE}/meridian-member-m2"]

    # Again: nothing new is made; the answers do not change.
    again = meridian_cli(*join, "--zone", "eu-c")
    assert again.returncode == 0, again.stderr
    assert " created" not in again.stderr, again.stderr
    assert f.member_cluster("m2")["metadata"]["labels"]["topology.kubernetes.io/zone"] == "eu-c"
    assert m.addresses(NAME) == ["10.1.0.1", "10.2.0.1"]

    gone = meridian_cli("unjoin", "m2", *clusters, "--wait", "60s")
    assert gone.returncode == 0, gone.stderr
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"], timeout=20, what="m1's cart alone, m2 unjoined")
    assert f.member_cluster("m2") is None
    assert made_by_join(m2) == [] and made_by_join(hub) == [], (made_by_join(m2), made_by_join(hub))
    assert m2.get(CORE, "Namespace", HUB_NAMESPACE) is not None, "a namespace join did not make is kept"
    assert m2.get(RBAC, "ClusterRole", "meridian-member") is not None


def test_join_refuses_a_name_that_is_no_cluster_name_and_writes_nothing(kube_fleet):
    f = kube_fleet
    bad = meridian_cli("join", "Not_A_Name", "--hub-kubeconfig", str(f.hub.admin_kubeconfig),
                       "--member-kubeconfig", str(f.cluster("m2").admin_kubeconfig))
    assert bad.returncode != 0 and "is not a cluster name" in bad.stderr, bad.stderr
    assert made_by_join(f.hub) == [] and made_by_join(f.cluster("m2")) == []
