"""ClusterProfiles (issue 41, KEP-4322) on the shared Kubernetes fleet: with the upstream CRD
of sigs.k8s.io/cluster-inventory-api on the hub (the version tests/peers/cluster-inventory
pins, from its module), meridian keeps one ClusterProfile per MemberCluster in its namespace,
and they are read back with that project's own clientset and types — as Argo CD, MultiKueue
and multicluster-runtime would read them. A member whose API goes away turns
ControlPlaneHealthy False; a member that leaves loses its profile.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from conftest import ROOT, peer_module_binary, pinned_module_dir
from kube_fleet import HUB_NAMESPACE, wait_for

PEER = ROOT / "tests" / "peers" / "cluster-inventory"
CRD_NAME = "clusterprofiles.multicluster.x-k8s.io"
EXT = "apiextensions.k8s.io/v1"


def reader() -> str:
    """The clusterprofiles binary: CLUSTER_INVENTORY_DIR when tests/run built it, else built now."""
    return peer_module_binary("CLUSTER_INVENTORY_DIR", ROOT / "tests" / "peers" / "cluster-inventory.sh",
                              "clusterprofiles", "the ClusterProfile reader")


def upstream_crd() -> dict:
    """The ClusterProfile CRD as the pinned module ships it (config/crd/bases)."""
    module = pinned_module_dir(PEER, "sigs.k8s.io/cluster-inventory-api")
    return yaml.safe_load((module / "config" / "crd" / "bases" / "multicluster.x-k8s.io_clusterprofiles.yaml").read_text())


def profiles(binary, fleet) -> dict:
    out = subprocess.run([binary, "-kubeconfig", str(fleet.hub.admin_kubeconfig), "-namespace", HUB_NAMESPACE],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def with_crd(kube_fleet):
    hub = kube_fleet.hub
    hub.apply(upstream_crd())
    hub.wait_crds_established([CRD_NAME])
    yield kube_fleet
    # The session's hub goes back to serving no ClusterProfile.
    hub.delete(EXT, "CustomResourceDefinition", CRD_NAME)


def test_every_member_has_a_cluster_profile_the_upstream_clientset_reads(with_crd):
    f = with_crd
    binary = reader()
    m = f.start_meridian()

    def all_joined():
        p = profiles(binary, f)
        ok = sorted(p) == ["m1", "m2", "m3"] and all(
            v["conditions"].get("ControlPlaneHealthy") == "True" and v["conditions"].get("Joined") == "True"
            for v in p.values())
        return p if ok else None

    got = wait_for(all_joined, timeout=30, what="three ClusterProfiles, healthy and joined")
    m1 = got["m1"]
    assert m1["clusterManager"] == "meridian" and m1["labels"]["x-k8s.io/cluster-manager"] == "meridian"
    assert m1["version"].startswith("v1."), m1
    assert m1["properties"]["cluster.clusterset.k8s.io"] == "m1"
    assert (m1["properties"]["meridian.io/region"], m1["properties"]["meridian.io/zone"]) == ("eu", "eu-a"), m1
    assert m1["properties"]["meridian.io/network"] == "net1", m1
    # Where meridian reaches m1's API, with the CA it trusts there.
    assert m1["accessProviders"]["meridian"] == {"server": f.cluster("m1").server, "certificateAuthorityData": True}
    assert got["m3"]["properties"]["meridian.io/region"] == "us"

    # m3's API goes away: its profile says the control plane is not healthy.
    f.stop_apiserver("m3")
    wait_for(lambda: profiles(binary, f)["m3"]["conditions"]["ControlPlaneHealthy"] == "False", timeout=30,
             what="m3's ControlPlaneHealthy False")
    assert profiles(binary, f)["m3"]["reasons"]["ControlPlaneHealthy"] in ("Degraded", "Unreachable")
    # m2 leaves the hub: its profile goes with it.
    f.delete_member_cluster("m2")
    wait_for(lambda: "m2" not in profiles(binary, f), timeout=30, what="m2's profile deleted")
    assert "m1" in profiles(binary, f)
    m.stop()
