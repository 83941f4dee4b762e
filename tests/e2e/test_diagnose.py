"""`meridian diagnose` (issue 41) on the shared Kubernetes fleet, with real resolvers in front
of meridian: a good member passes, and three broken ones are each named with the fault and
the fix — a verb taken out of meridian's role in m2 (its SelfSubjectAccessReview says so), a
CoreDNS in m3 whose Corefile does not forward the zones, and a resolver whose queries reach
meridian from an address outside the member's dnsClientCIDRs (CoreDNS forwarding from
127.0.0.1, against unbound pinned to an address in m1's range).
"""

from __future__ import annotations

import json
import subprocess

from conftest import BIN, FROM_EU1
from kube_fleet import CORE
from test_forwarders import coredns_bin, peers, start_coredns, start_unbound, unbound_bin  # noqa: F401 - fixtures

RBAC = "rbac.authorization.k8s.io/v1"


def diagnose(m, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), "diagnose", "--admin", f"127.0.0.1:{m.admin_port}", *args],
                          capture_output=True, text=True, timeout=60)


def checks(m, cluster: str, *args: str) -> tuple[int, dict[str, list[dict]]]:
    run = diagnose(m, "--cluster", cluster, "--json", *args)
    assert run.stdout, run.stderr
    report = json.loads(run.stdout)
    by_name: dict[str, list[dict]] = {}
    for c in report["clusters"][0]["checks"]:
        by_name.setdefault(c["name"], []).append(c)
    return run.returncode, by_name


def corefile(member_cluster, text: str) -> None:
    member_cluster.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": "kube-system"}})
    member_cluster.apply({"apiVersion": CORE, "kind": "ConfigMap",
                          "metadata": {"name": "coredns", "namespace": "kube-system"},
                          "data": {"Corefile": text}})


def test_diagnose_passes_a_good_member_and_names_each_fault_with_its_fix(
        kube_fleet, coredns_bin, unbound_bin, peers, tmp_path):  # noqa: F811 - fixtures
    f = kube_fleet
    f.publish("m1", "payments", ["10.1.0.5"])  # what the resolvers wait for
    m = f.start_meridian()
    m.wait_for(lambda: m.addresses("payments.shop.global") == ["10.1.0.5"], timeout=20, what="payments")
    forwarding = (f"global:53 {{\n    forward . 127.0.0.1:{m.dns_port}\n}}\n"
                  f"clusterset.local:53 {{\n    forward . 127.0.0.1:{m.dns_port}\n}}\n")
    corefile(f.cluster("m1"), ".:53 {\n    forward . /etc/resolv.conf\n}\n" + forwarding)
    corefile(f.cluster("m2"), forwarding)
    corefile(f.cluster("m3"), ".:53 {\n    forward . /etc/resolv.conf\n}\n")  # the zones are not forwarded
    # m2: meridian's role there loses `list` on EndpointSlices (reset() applies it again).
    stored = f.cluster("m2").get(RBAC, "ClusterRole", "meridian-member")
    role = {"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": "meridian-member"},
            "rules": stored["rules"]}
    for rule in role["rules"]:
        if "endpointslices" in rule.get("resources", []):
            rule["verbs"] = [v for v in rule["verbs"] if v != "list"]
    f.cluster("m2").apply(role)

    rc, good = checks(m, "m1")
    assert rc == 0, json.dumps(good, indent=1)
    assert good["api"][0]["outcome"] == "pass" and "Kubernetes" in good["api"][0]["detail"], good["api"]
    assert good["permissions"][0]["outcome"] == "pass", good["permissions"]
    assert good["coredns"][0]["outcome"] == "pass", good["coredns"]
    assert f"global → 127.0.0.1:{m.dns_port}" in good["coredns"][0]["detail"], good["coredns"]
    assert good["xds"][0]["outcome"] == "info", good["xds"]
    # One machine, one clock: the member's Date header agrees to the second or nearly.
    assert good["clock"][0]["outcome"] == "pass" and "meridian's" in good["clock"][0]["detail"], good["clock"]

    rc, rbac = checks(m, "m2")
    assert rc == 1
    assert rbac["permissions"][0]["outcome"] == "fail", rbac["permissions"]
    assert rbac["permissions"][0]["detail"] == "denied: list endpointslices.discovery.k8s.io", rbac["permissions"]
    assert "deploy/rbac/member.yaml" in rbac["permissions"][0]["fix"]
    assert rbac["coredns"][0]["outcome"] == "pass"

    rc, dns = checks(m, "m3")
    assert rc == 1
    assert dns["coredns"][0]["outcome"] == "fail", dns["coredns"]
    assert "forwards no server block for global, clusterset.local" in dns["coredns"][0]["detail"], dns["coredns"]
    assert "deploy/coredns/Corefile" in dns["coredns"][0]["fix"]

    # Through the member's resolver: unbound querying from an address in m1's range is taken
    # for m1; CoreDNS forwards from 127.0.0.1, in no member's range.
    pinned = start_unbound(unbound_bin, tmp_path / "unbound", m.dns_port, FROM_EU1, peers)
    rc, through = checks(m, "m1", "--resolver", f"127.0.0.1:{pinned.port}")
    assert rc == 0, through
    assert [c["outcome"] for c in through["dns-forwarding"] + through["dns-source"]] == ["pass"] * 4, through
    assert f"from {FROM_EU1}, in m1's dnsClientCIDRs" in through["dns-source"][0]["detail"], through["dns-source"]
    coredns = start_coredns(coredns_bin, tmp_path / "coredns", m.dns_port, peers)
    rc, outside = checks(m, "m1", "--resolver", f"127.0.0.1:{coredns.port}")
    assert rc == 1
    assert outside["dns-forwarding"][0]["outcome"] == "pass", outside["dns-forwarding"]
    source = outside["dns-source"][0]
    assert source["outcome"] == "fail" and "from 127.0.0.1, which it takes for no cluster" in source["detail"], source
    assert "MemberCluster m1's spec.network.dnsClientCIDRs" in source["fix"], source

    # For people: one line per check, the fix under a failure.
    words = diagnose(m, "--cluster", "m2")
    assert words.returncode == 1
    assert "  FAIL  permissions     denied: list endpointslices.discovery.k8s.io" in words.stdout, words.stdout
    assert "fix: apply deploy/rbac/member.yaml" in words.stdout, words.stdout
    unknown = diagnose(m, "--cluster", "nope")
    assert unknown.returncode == 1 and "no member cluster \"nope\" on the hub" in unknown.stderr, unknown.stderr
