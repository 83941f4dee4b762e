"""meridian on real Kubernetes API servers: a hub and three members (kube_fleet.py), with
meridian reaching each through tokens bound only to the roles in deploy/rbac.

Objects are created through the API as a user would (Services, EndpointSlices,
ServiceExports); DNS answers, xDS assignments, ServiceImports and derived Services and
EndpointSlices in the other members must follow, and everything meridian wrote must go when
the service is unexported.
"""

import os
import re
import time
from pathlib import Path

import ads
from kube_fleet import FROM, MANAGED, resource_path, wait_for

NAME = "payments.shop.global"


def eds_addresses(xds_port, cluster, service_name):
    """The endpoint addresses of an EDS assignment, by priority, as an Envoy node in `cluster`."""
    stream = ads.AdsStream(xds_port)
    try:
        node = ads.node(f"test-{cluster}", cluster, "net1")
        stream.send(ads.request(ads.EDS, [service_name], node=node))
        response = stream.recv_type(ads.EDS)
        out = {}
        for res in ads.decode(response).values():
            for locality in res.endpoints:
                for lb in locality.lb_endpoints:
                    out.setdefault(locality.priority, []).append(lb.endpoint.address.socket_address.address)
        return {p: sorted(a) for p, a in out.items()}
    finally:
        stream.close()


def test_services_created_through_the_api_are_answered_and_imported(kube_fleet, kube_meridian):
    m = kube_meridian
    kube_fleet.publish("m1", "payments", ["10.1.0.1", "10.1.0.2"])
    kube_fleet.publish("m3", "payments", ["10.3.0.1"])
    # A client in m1 gets m1's endpoints first (Locality); an unknown client every cluster's.
    # The two members are watched independently, so m3's endpoints may arrive after m1's.
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.1.0.2", "10.3.0.1"],
               what="every cluster's endpoints for an unknown client")
    assert m.addresses(NAME, source=FROM["m1"]) == ["10.1.0.1", "10.1.0.2"]
    # xDS: the same decision as EDS priorities.
    # (The xDS push trails the DNS answer by its debounce, 100 ms.)
    wait_for(lambda: eds_addresses(m.xds_port, "m1", "payments.shop.global:80")
             == {0: ["10.1.0.1", "10.1.0.2"], 1: ["10.3.0.1"]}, timeout=3, what="EDS priorities", log=m)

    # Every member with the namespace gets a ServiceImport, a derived Service whose ClusterIP
    # is the import's spec.ips, and EndpointSlices of the endpoints its clients are sent to.
    for member in ("m1", "m2", "m3"):
        def imported(member=member):
            si = kube_fleet.service_import(member, "payments")
            clusters = sorted(c["cluster"] for c in (si or {}).get("status", {}).get("clusters", []))
            return si if si and si["spec"].get("ips") and clusters == ["m1", "m3"] else None
        si = wait_for(imported, what=f"ServiceImport with ips and both clusters in {member}", log=m)
        assert si["spec"]["type"] == "ClusterSetIP"
        assert [p["port"] for p in si["spec"]["ports"]] == [80]
        derived = [s for s in kube_fleet.managed_services(member) if s["metadata"]["name"] == "derived-payments"]
        assert len(derived) == 1
        assert si["spec"]["ips"] == [derived[0]["spec"]["clusterIP"]]
        assert "selector" not in derived[0]["spec"]
    m2_slices = wait_for(lambda: kube_fleet.managed_slices("m2", service="derived-payments"),
                         what="derived slices in m2", log=m)
    # m2 has no endpoints of its own: its clients go to the same zone's... none, then region eu:
    # m1 (same region), exactly as DNS answers a client in m2.
    by_source = {s["metadata"]["labels"]["multicluster.kubernetes.io/source-cluster"]: s for s in m2_slices}
    assert set(by_source) == {"m1"}, by_source.keys()
    s = by_source["m1"]
    assert s["metadata"]["labels"]["kubernetes.io/service-name"] == "derived-payments"
    assert s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == "meridian.io"
    assert sorted(a for e in s["endpoints"] for a in e["addresses"]) == ["10.1.0.1", "10.1.0.2"]
    assert [p["port"] for p in s["ports"]] == [8080]
    assert m.addresses(NAME, source=FROM["m2"]) == ["10.1.0.1", "10.1.0.2"]

    # clusterset.local answers carry the ClusterSetIP of the client's own cluster.
    m2_ip = kube_fleet.service_import("m2", "payments")["spec"]["ips"]
    m.wait_for(lambda: m.addresses("payments.shop.svc.clusterset.local", source=FROM["m2"]) == m2_ip,
               what="clusterset.local answers m2's ClusterSetIP")

    # ServiceExport conditions.
    valid = wait_for(lambda: kube_fleet.export_condition("m1", "payments", "Valid"), what="Valid condition")
    assert valid["status"] == "True"
    assert kube_fleet.export_condition("m1", "payments", "Conflict")["status"] == "False"

    # Write-back is counted per member: rounds that ended well, and none failing now (m3,
    # with nothing of its own to import, may have its first round a moment after the others).
    def every_member_wrote():
        text = m.http("/metrics")[1]
        counted = all(f'meridian_writeback_failing{{cluster="{member}"}}' in text for member in ("m1", "m2", "m3"))
        return text if counted else None

    metrics = wait_for(every_member_wrote, what="a write-back round for every member", log=m)
    for member in ("m1", "m2", "m3"):
        assert f'meridian_writeback_failing{{cluster="{member}"}} 0' in metrics, member
        ok = re.search(rf'meridian_writeback_rounds_total{{cluster="{member}",result="ok"}} (\d+)', metrics)
        assert ok and int(ok.group(1)) > 0, member
        assert f'meridian_writeback_rounds_total{{cluster="{member}",result="error"}} 0' in metrics, member

    # An endpoint change follows through DNS, xDS and the derived slices.
    kube_fleet.endpoint_slice("m1", "payments", ["10.1.0.9"], ports=[{"name": "http", "port": 8080, "protocol": "TCP"}])
    m.wait_for(lambda: m.addresses(NAME, source=FROM["m1"]) == ["10.1.0.9"], what="the new endpoint in DNS")
    wait_for(lambda: [a for sl in kube_fleet.managed_slices("m2", service="derived-payments") for e in sl["endpoints"]
                      for a in e["addresses"]] == ["10.1.0.9"], what="the derived slice follows", log=m)

    # Unexport everywhere: DNS forgets the name and everything meridian wrote is deleted.
    kube_fleet.unexport("m1", "payments")
    kube_fleet.unexport("m3", "payments")
    m.wait_for(lambda: m.query(NAME).rcode() == 3, what="NXDOMAIN after unexport")
    for member in ("m1", "m2", "m3"):
        wait_for(lambda: not kube_fleet.service_imports(member) and not kube_fleet.managed_services(member)
                 and not kube_fleet.managed_slices(member), what=f"cleanup in {member}", log=m)
    # The users' own objects are untouched.
    assert kube_fleet.cluster("m1").get("v1", "Service", "payments", "shop") is not None


def import_writes(kube_fleet, member, name):
    """How many writes of ServiceImport `name` the member's audit log holds so far."""
    return sum(1 for e in kube_fleet.audit_events(member)
               if e["objectRef"].get("resource") == "serviceimports" and e["objectRef"].get("name") == name
               and e["stage"] == "ResponseComplete")


def test_a_resync_writes_again_only_what_someone_else_changed_or_deleted(kube_fleet):
    """`kubernetes.resyncSeconds` (2 s here): each member's write-back lists what meridian wrote
    there (metadata only) and writes again what someone else deleted or changed, and deletes
    what carries meridian's label without having been written by it. What nobody touched is not
    written again: the member's audit log has no ServiceImport write over several resyncs (a
    resync used to apply everything again)."""
    m = kube_fleet.start_meridian(env={"MERIDIAN_KUBE_RESYNC_SECONDS": "2"})
    kube_fleet.publish("m1", "payments", ["10.1.0.1"])

    def imported(member):
        si = kube_fleet.service_import(member, "payments")
        clusters = [c["cluster"] for c in (si or {}).get("status", {}).get("clusters", [])]
        return si if si and si["spec"].get("ips") and clusters == ["m1"] else None

    def slice_addresses(member):
        return sorted(a for s in kube_fleet.managed_slices(member, service="derived-payments")
                      for e in s["endpoints"] or [] for a in e["addresses"])

    for member in ("m2", "m3"):
        wait_for(lambda: imported(member), what=f"the ServiceImport in {member}", log=m)
        wait_for(lambda: slice_addresses(member) == ["10.1.0.1"], what=f"the derived slice in {member}", log=m)
    time.sleep(1)  # the writes of the first rounds have landed
    before = import_writes(kube_fleet, "m3", "payments")
    assert before > 0, "the shared fleet audits ServiceImport writes"
    time.sleep(7)  # three resyncs or more
    assert import_writes(kube_fleet, "m3", "payments") == before, "a resync wrote what nobody touched"

    # In m2 someone deletes the import, empties the derived slice and leaves a Service that
    # carries meridian's label.
    c = kube_fleet.cluster("m2")
    assert c.delete("multicluster.x-k8s.io/v1alpha1", "ServiceImport", "payments", "shop")
    emptied = kube_fleet.managed_slices("m2", service="derived-payments")[0]
    emptied["endpoints"] = []
    status, body = c.request("PUT", resource_path("discovery.k8s.io/v1", "EndpointSlice", "shop",
                                                  emptied["metadata"]["name"]), emptied)
    assert status == 200, body
    assert slice_addresses("m2") == []
    key, value = MANAGED.split("=")
    c.apply({"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "derived-stray", "namespace": "shop", "labels": {key: value}},
             "spec": {"ports": [{"port": 80}]}})
    wait_for(lambda: imported("m2"), timeout=15, what="the deleted ServiceImport written again", log=m)
    wait_for(lambda: slice_addresses("m2") == ["10.1.0.1"], timeout=15, what="the emptied slice written again",
             log=m)
    wait_for(lambda: not c.get("v1", "Service", "derived-stray", "shop"), timeout=15,
             what="the stray with meridian's label deleted", log=m)
    # m3 was not touched, and is still not written.
    assert import_writes(kube_fleet, "m3", "payments") == before


def test_a_policy_on_the_hub_api_steers_dns_xds_and_the_derived_slices(kube_fleet, kube_meridian):
    """A ClusterSchedulingPolicy created on the hub's API: "prefer us (m3), fall back to the
    rest". A client in m1 is then sent to m3 — by DNS, by xDS, and by the EndpointSlices
    behind m1's ClusterSetIP; deleting the policy brings Locality back."""
    m = kube_meridian
    kube_fleet.publish("m1", "payments", ["10.1.0.1"])
    kube_fleet.publish("m3", "payments", ["10.3.0.1"])
    m.wait_for(lambda: m.addresses(NAME, source=FROM["m1"]) == ["10.1.0.1"], what="Locality first")
    kube_fleet.policy("payments-us-first", {
        "resourceSelectors": [{"kind": "Service", "name": "payments"}],
        "placement": {"clusterAffinities": [
            {"name": "us", "clusterNames": ["m3"]},
            {"name": "rest", "clusterNames": ["m1", "m2"]},
        ]},
        "traffic": {"mode": "Tiers"},
    })
    m.wait_for(lambda: m.addresses(NAME, source=FROM["m1"]) == ["10.3.0.1"], what="the policy's first tier")
    wait_for(lambda: eds_addresses(m.xds_port, "m1", "payments.shop.global:80")
             == {0: ["10.3.0.1"], 1: ["10.1.0.1"]}, timeout=3, what="EDS priorities follow the policy", log=m)
    wait_for(lambda: [a for sl in kube_fleet.managed_slices("m1", service="derived-payments")
                      for e in sl["endpoints"] for a in e["addresses"]] == ["10.3.0.1"],
             what="m1's derived slices follow the policy", log=m)
    # An invalid policy is refused by the CRD schema at the API, before meridian sees it.
    try:
        kube_fleet.policy("broken", {"resourceSelectors": [{"name": "payments"}], "traffic": {"mode": "Sideways"}})
        refused = None
    except Exception as e:  # noqa: BLE001 - the harness raises ApiError with the status
        refused = e
    assert refused is not None and "Sideways" in str(refused), refused
    kube_fleet.hub.delete("meridian.io/v1alpha1", "ClusterSchedulingPolicy", "payments-us-first", "shop")
    m.wait_for(lambda: m.addresses(NAME, source=FROM["m1"]) == ["10.1.0.1"], what="Locality again")


def test_a_member_removed_from_the_hub_is_cleaned_up(kube_fleet, kube_meridian):
    """Deleting a MemberCluster: meridian deletes what it wrote in that member (it does not
    wait for a garbage collector; these API servers run none), and the other members' imports
    and DNS answers forget the removed member's endpoints."""
    m = kube_meridian
    kube_fleet.publish("m1", "payments", ["10.1.0.1"])
    kube_fleet.publish("m3", "payments", ["10.3.0.1"])
    for member in ("m1", "m2", "m3"):
        wait_for(lambda member=member: kube_fleet.managed_slices(member), what=f"derived slices in {member}", log=m)
    assert kube_fleet.delete_member_cluster("m3")
    wait_for(lambda: not kube_fleet.service_imports("m3") and not kube_fleet.managed_services("m3")
             and not kube_fleet.managed_slices("m3"), what="m3 cleaned up", log=m)
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"], what="m3's endpoints gone from DNS")

    def m2_imports_only_m1():
        si = kube_fleet.service_import("m2", "payments") or {}
        return [c["cluster"] for c in si.get("status", {}).get("clusters", [])] == ["m1"]
    wait_for(m2_imports_only_m1, what="m2's import lists m1 only", log=m)
    # The user's own objects in the removed member are untouched.
    assert kube_fleet.cluster("m3").get("v1", "Service", "payments", "shop") is not None


def established_connections(pid: int, port: int) -> int:
    """The established TCP connections of process `pid` to 127.0.0.1:`port`, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if state == "01" and inode in inodes and int(remote.split(":")[1], 16) == port:
            count += 1
    return count


def test_meridian_holds_one_connection_to_each_api_server(kube_fleet, kube_meridian):
    """Every watch, list and read of a cluster goes over one HTTP/2 connection (and writes over
    one more, the fenced writer's), as client-go does: over HTTP/1.1 each of the dozen kinds
    watched in a member held a connection — and a descriptor — of its own, which a thousand
    members could not afford."""
    m = kube_meridian
    kube_fleet.publish("m1", "payments", ["10.1.0.1"])
    for member in ("m1", "m2", "m3"):
        wait_for(lambda member=member: kube_fleet.managed_slices(member), what=f"derived slices in {member}", log=m)
    pid = m.proc.pid
    for name, cluster in [("hub", kube_fleet.hub), *kube_fleet.members.items()]:
        held = established_connections(pid, cluster.apiserver_port)
        # Reader and writer: at least the reader, never one per watch.
        assert 1 <= held <= 2, f"meridian holds {held} connections to {name}'s API server"
