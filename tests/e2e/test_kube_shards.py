"""Sharded writers and quorum health on real kube-apiservers (DESIGN §13): three replicas,
30 members — m1 and m3 are Kubernetes members, d01..d28 directory members — and the API
servers' audit logs as the witness of who wrote which member, when.

Every replica authenticates as its own user (kube_fleet's replica_users), so each write names
its replica. From the hub's audit log the test rebuilds, for each member, the claim terms (a
patch setting the MemberCluster's `meridian.io/writer` annotation to a replica starts its term;
one clearing it or naming another ends it) and, for each replica, the terms of its shard Lease
(a renewal makes it valid until renewDeadlineSeconds after the GET before it). Every write
about a member — its MemberCluster status and meridian's finalizer on it on the hub;
ServiceImports, derived Services, EndpointSlices and the placed Deployment in m1 and m3 — must
fall inside its writer's claim term *and* Lease term, and a
claim is taken from a replica that did not release it only a lease duration after that
replica's last renewal.

Routes are cut per replica and member: each replica runs in a working directory of its own, in
which `members/dNN` (the relative path in the MemberCluster) is a symlink to the member's
directory, and `kubeconfigs/m1.kubeconfig` (m1's relative kubeconfig path) points at a loopback
proxy of that replica's own in front of m1's API server; removing one replica's symlink, or
freezing its proxy, cuts only that replica's route to that member. The hub, too, is reached
through a proxy per replica, to cut one replica off from it.
"""

import json
import os
import re
import signal
import time
from datetime import datetime, timedelta

import pytest
import yaml

from kube_fleet import (AUDIT_POLICY, DEFAULT_HEALTH, DEFAULT_MEMBERS, HUB_NAMESPACE, MERIDIAN, WRITE_VERBS,
                        exported_service_yaml, started, wait_for)
from test_kube_faults import FreezableProxy
from test_kube_leader import DnsLoad, describe, received
from test_kube_propagation import APPS, deployment, member_replicas

A, B, C = "meridian", "meridian-b", "meridian-c"  # replicas, and their users
REPLICAS = (A, B, C)
LEASE_DURATION, RENEW_DEADLINE, RETRY = 4, 3, 1
KUBE_MEMBERS = tuple(m for m in DEFAULT_MEMBERS if m.name in ("m1", "m3"))
DIRECTORY_MEMBERS = tuple(f"d{i:02d}" for i in range(1, 29))
EVERY_MEMBER = tuple(m.name for m in KUBE_MEMBERS) + DIRECTORY_MEMBERS
CUT = "d07"  # the member whose routes the test cuts
LEADER_ELECTION = {"leaseName": "meridian", "leaseDurationSeconds": LEASE_DURATION,
                   "renewDeadlineSeconds": RENEW_DEADLINE, "retryPeriodSeconds": RETRY, "shards": True}

# AUDIT_POLICY (every write, and the Leases' reads, at Metadata), and the request
# body of MemberCluster patches: the claims they set.
SHARD_AUDIT_POLICY = {
    **AUDIT_POLICY,
    "rules": [
        *AUDIT_POLICY["rules"][:-1],
        {"level": "Request", "verbs": ["patch"],
         "resources": [{"group": "meridian.io", "resources": ["memberclusters"]}]},
        AUDIT_POLICY["rules"][-1],
    ],
}


def directory_member(root, name, index):
    """d<index>'s objects: service svc-<name> with one endpoint 10.9.<index>.1, exported."""
    d = root / "members" / name
    d.mkdir(parents=True)
    (d / "objects.yaml").write_text(exported_service_yaml(f"svc-{name}", [f"10.9.{index}.1"]))
    return d


def replica_dirs(root, members):
    """A working directory per replica whose members/<name> links to each member's directory."""
    dirs = {}
    for r in REPLICAS:
        cwd = root / f"cwd-{r}"
        (cwd / "members").mkdir(parents=True)
        for name, path in members.items():
            (cwd / "members" / name).symlink_to(path)
        dirs[r] = cwd
    return dirs


def route_m1_through_proxies(fleet, cwds):
    """Per replica: a proxy in front of m1's API server and, in its working directory, m1's
    kubeconfig pointing at it; m1's MemberCluster names that relative path."""
    m1 = fleet.members["m1"]
    fleet.write_member_kubeconfig("m1")
    config = yaml.safe_load(fleet.member_kubeconfig("m1").read_text())
    proxies = {}
    for r, cwd in cwds.items():
        proxies[r] = FreezableProxy(m1.apiserver_port)
        for c in config["clusters"]:
            c["cluster"]["server"] = f"https://127.0.0.1:{proxies[r].port}"
        (cwd / "kubeconfigs").mkdir(exist_ok=True)
        path = cwd / "kubeconfigs" / "m1.kubeconfig"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
    fleet.hub.apply(fleet.member_cluster_manifest(
        "m1", source={"kubernetes": {"kubeconfig": {"path": "kubeconfigs/m1.kubeconfig"}}}))
    return proxies


def hubs_through_proxies(fleet, cwds):
    """Per replica: a proxy in front of the hub's API server and a hub kubeconfig through it
    (in its working directory); returns the proxies and each replica's `hub` config section."""
    config = yaml.safe_load(fleet.hub_kubeconfig.read_text())
    proxies, sections = {}, {}
    for r, cwd in cwds.items():
        proxies[r] = FreezableProxy(fleet.hub.apiserver_port)
        for c in config["clusters"]:
            c["cluster"]["server"] = f"https://127.0.0.1:{proxies[r].port}"
        path = cwd / "hub.kubeconfig"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        sections[r] = {"kubeconfig": str(path), "namespace": HUB_NAMESPACE}
    return proxies, sections


def shards(m):
    status, body = m.http("/debug/shards")
    assert status == 200, body
    return json.loads(body)


def held_by(replicas: dict) -> dict[str, list[str]]:
    """member → the replicas that say they write it now."""
    out: dict[str, list[str]] = {}
    for name, m in replicas.items():
        try:
            s = shards(m)["shards"]
        except OSError:
            continue
        for member, v in s["members"].items():
            if v["held"]:
                out.setdefault(member, []).append(name)
    return out


def settled(replicas: dict):
    """Every member written by exactly one of `replicas`, each of which sees the same live set."""
    held = held_by(replicas)
    if sorted(held) != sorted(EVERY_MEMBER) or any(len(v) != 1 for v in held.values()):
        return None
    lives = {tuple(shards(m)["shards"]["liveReplicas"]) for m in replicas.values()}
    if lives != {tuple(sorted(replicas))}:
        return None
    return {member: v[0] for member, v in held.items()}


def cluster(m, name):
    status, body = m.http("/debug/clusters")
    assert status == 200, body
    return next(c for c in json.loads(body)["clusters"] if c["name"] == name)


def metric(m, name):
    status, body = m.http("/metrics")
    assert status == 200, body
    match = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", body, re.M)
    assert match, f"no {name} in /metrics"
    return float(match.group(1))


# The audit logs.
def completed(fleet, name):
    return [e for e in fleet.audit_events(name) if e.get("stage") == "ResponseComplete"]


def succeeded(e) -> bool:
    return (e.get("responseStatus") or {}).get("code") in (200, 201)


def ref(e) -> dict:
    return e.get("objectRef") or {}


def lease_terms(hub_events):
    """user → [(start, end)]: each successful write of the user's shard Lease makes it valid
    from then until renewDeadline after the user's GET of it before the write."""
    last_get: dict[str, datetime] = {}
    terms: dict[str, list] = {}
    for e in sorted(hub_events, key=received):
        r, user = ref(e), e["user"]["username"]
        if r.get("resource") != "leases" or not r.get("name", "").startswith("meridian-shard-"):
            continue
        if e["verb"] == "get":
            last_get[user] = received(e)
        elif e["verb"] in ("create", "update") and succeeded(e):
            sent = last_get.get(user, received(e))
            terms.setdefault(user, []).append((received(e), sent + timedelta(seconds=RENEW_DEADLINE)))
    return terms


def claim_patches(hub_events):
    """[(member, user, claim or None, event)] of the successful claim writes, in order."""
    out = []
    for e in sorted(hub_events, key=received):
        r = ref(e)
        if r.get("resource") != "memberclusters" or r.get("subresource") or e["verb"] != "patch":
            continue
        annotations = (((e.get("requestObject") or {}).get("metadata") or {}).get("annotations") or {})
        if "meridian.io/writer" in annotations and succeeded(e):
            out.append((r["name"], e["user"]["username"], annotations["meridian.io/writer"], e))
    return out


def claim_terms(patches, lease):
    """member → [(user, start, end or None)], and the takeovers that came too early: a claim
    taken from a replica that had not released it, less than a lease duration after that
    replica's last renewal."""
    terms: dict[str, list] = {}
    early = []
    holder: dict[str, str | None] = {}
    for member, user, claim, e in patches:
        t = received(e)
        current = terms.setdefault(member, [])
        previous = holder.get(member)
        if current and current[-1][2] is None and previous != claim:
            u, s, _ = current[-1]
            current[-1] = (u, s, t)
        if claim and claim != previous:
            if previous:
                renewals = [s for s, _ in lease.get(previous, []) if s <= t]
                gap = (t - max(renewals)).total_seconds() if renewals else None
                if gap is None or gap < LEASE_DURATION - 0.5:
                    early.append(f"{user} took {member} from {previous} {gap} s after its last renewal: "
                                 + describe("hub", e))
            current.append((claim, t, None))
        holder[member] = claim
    return terms, early


def writes_about_members(fleet):
    """(member, cluster, event) for every write by a replica about one member: its status and
    meridian's finalizer (every MemberCluster write but the claims) on the hub, and anything but
    Leases in a Kubernetes member."""
    claims = {id(e) for _, _, _, e in claim_patches(completed(fleet, "hub"))}
    out = []
    for e in completed(fleet, "hub"):
        r = ref(e)
        if (e["user"]["username"] in REPLICAS and e["verb"] in WRITE_VERBS and r.get("resource") == "memberclusters"
                and id(e) not in claims and succeeded(e)):
            out.append((r["name"], "hub", e))
    for m in KUBE_MEMBERS:
        for e in completed(fleet, m.name):
            if e["user"]["username"] in REPLICAS and e["verb"] in WRITE_VERBS and ref(e).get("resource") != "leases":
                out.append((m.name, m.name, e))
    return out


def check_one_writer(fleet):
    """Asserts the sharding's safety on the audit logs; returns the writes checked."""
    hub = completed(fleet, "hub")
    lease = lease_terms(hub)
    claims, early = claim_terms(claim_patches(hub), lease)
    problems = list(early)
    writes = writes_about_members(fleet)
    for member, where, e in writes:
        user, t = e["user"]["username"], received(e)
        in_claim = any(u == user and s <= t and (end is None or t <= end) for u, s, end in claims.get(member, []))
        in_lease = any(s <= t <= end for s, end in lease.get(user, []))
        if not (in_claim and in_lease):
            problems.append(f"write about {member} outside its writer's {'claim' if not in_claim else 'Lease'} "
                            f"term: " + describe(where, e))
    assert not problems, "\n".join(problems[:40] + ["--- claims ---"] + [
        f"{m}: " + ", ".join(f"{u} {s.time()}..{e.time() if e else ''}" for u, s, e in ts)
        for m, ts in sorted(claims.items())])
    return writes


@pytest.fixture
def shard_fleet(tmp_path):
    with started(tmp_path / "kube", KUBE_MEMBERS, audit=SHARD_AUDIT_POLICY, replica_users=[B, C]) as fleet:
        fleet.grant_shards()
        fleet.grant_propagation()
        yield fleet


def copies_applied(fleet):
    """The Placement of web: {member: applied} as the leader reports it."""
    record = fleet.hub.get(MERIDIAN, "Placement", "deployment.apps.web", "shop") or {}
    return {c["name"]: c.get("applied") for c in (record.get("status") or {}).get("clusters") or []}


def test_three_replicas_share_30_members_one_writer_each_through_kill_freeze_and_partitions(shard_fleet, tmp_path):
    fleet = shard_fleet
    paths = {name: directory_member(tmp_path, name, i + 1) for i, name in enumerate(DIRECTORY_MEMBERS)}
    cwds = replica_dirs(tmp_path, paths)
    for name in DIRECTORY_MEMBERS:
        fleet.hub.apply({
            "apiVersion": MERIDIAN, "kind": "MemberCluster",
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/region": "eu"}},
            "spec": {"source": {"directory": {"path": f"members/{name}"}},
                     "network": {"name": "net1"}, "health": dict(DEFAULT_HEALTH)},
        })
    proxies = route_m1_through_proxies(fleet, cwds)
    hub_proxies, hubs = hubs_through_proxies(fleet, cwds)
    fleet.publish("m1", "payments", ["10.1.0.1"])
    fleet.publish("m3", "payments", ["10.3.0.1"])
    replicas = {r: fleet.start_meridian(r, cwd=cwds[r], leaderElection=LEADER_ELECTION, hub=hubs[r])
                for r in REPLICAS}

    owners = wait_for(lambda: settled(replicas), timeout=30, what="30 members, one writer each",
                      log=replicas[A])
    counts = {r: sum(1 for o in owners.values() if o == r) for r in REPLICAS}
    print(f"assignment with three replicas: {counts}")
    assert all(n >= 3 for n in counts.values()), counts
    for member in ("m1", "m3"):
        wait_for(lambda member=member: ((fleet.service_import(member, "payments") or {}).get("status") or {})
                 .get("clusters"), timeout=15, what=f"payments imported into {member}", log=replicas[owners[member]])
    # A Deployment placed in m1 and m3 is written by each member's owner; the leader's
    # Placement reports both copies applied, whoever wrote them.
    fleet.hub.apply(deployment("web", 2))
    fleet.policy("web", {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "web"}],
                         "placement": {"clusterAffinities": [{"name": "kube", "clusterNames": ["m1", "m3"]}]}})
    wait_for(lambda: member_replicas(fleet, "web", ("m1", "m3")) == {"m1": 2, "m3": 2}, timeout=20,
             what="web placed in m1 and m3", log=replicas[owners["m1"]])
    print(f"web's copies written by {owners['m1']} (m1) and {owners['m3']} (m3); hub records by "
          f"{fleet.lease_holder()}")
    applied = {"m1": True, "m3": True}
    wait_for(lambda: (lambda c: c if c == applied else {"not yet": c})(copies_applied(fleet)) == applied,
             timeout=20, what="the Placement reports both copies applied")
    # Every member's status is written, each by its owner.
    wait_for(lambda: all(fleet.member_status(n).get("health") for n in EVERY_MEMBER), timeout=20,
             what="every member's status written")
    assert metric(replicas[A], "meridian_shard_live_replicas") == 3

    # DNS at a steady rate against every replica for the rest of the test (d07 is cut later).
    expected = {"payments.shop.global.": ["10.1.0.1", "10.3.0.1"]}
    for i, name in enumerate(DIRECTORY_MEMBERS):
        if name != CUT and i % 4 == 0:
            expected[f"svc-{name}.shop.global."] = [f"10.9.{i + 1}.1"]
    for m in replicas.values():
        for name, want in expected.items():
            m.wait_for(lambda m=m, name=name, want=want: m.addresses(name) == want, what=f"{name} answered")
    loads = {r: DnsLoad(m.dns_port, expected, rate=100) for r, m in replicas.items()}
    for load in loads.values():
        load.start()
    finished = []
    try:
        time.sleep(3)
        # Kill C (its own DNS load ends first: a dead replica answers nothing): A and B own its
        # members within a lease duration and a retry.
        finished.append((C, loads.pop(C)))
        finished[-1][1].stop()
        replicas[C].proc.kill()
        replicas[C].proc.wait()
        killed = time.monotonic()
        two = {r: replicas[r] for r in (A, B)}
        owners = wait_for(lambda: settled(two), timeout=15, what="C's members owned again", log=replicas[A])
        took = time.monotonic() - killed
        print(f"C's members owned again {took:.1f} s after it was killed (lease {LEASE_DURATION} s, retry {RETRY} s)")
        assert took <= LEASE_DURATION + RETRY + 3, f"ownership settled only after {took:.1f} s"

        # Freeze B past its lease: A takes everything; B resumed writes nothing it lost. (B's
        # DNS load pauses with it: a stopped process answers nothing; A's runs throughout.)
        finished.append((f"{B} before the freeze", loads.pop(B)))
        finished[-1][1].stop()
        os.kill(replicas[B].proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: settled({A: replicas[A]}), timeout=15, what="A writes every member", log=replicas[A])
            fleet.publish("m3", "orders", ["10.3.0.7"])
            wait_for(lambda: fleet.service_import("m1", "orders"), timeout=10, what="A imports orders into m1")
            fleet.hub.apply(deployment("web", 3))
            wait_for(lambda: member_replicas(fleet, "web", ("m1", "m3")) == {"m1": 3, "m3": 3}, timeout=15,
                     what="A writes the edit of web into both members", log=replicas[A])
            time.sleep(1)
        finally:
            os.kill(replicas[B].proc.pid, signal.SIGCONT)
        wait_for(lambda: settled(two), timeout=20, what="B back: members shared again", log=replicas[B])
        loads[B] = DnsLoad(replicas[B].dns_port, expected, rate=100)
        loads[B].start()

        # Cut B's routes to d07 and to m1 only: neither is withdrawn anywhere; B says Degraded,
        # and why (the DNS loads go on asking for m1's payments endpoint all along).
        (cwds[B] / "members" / CUT).unlink()
        proxies[B].freeze()
        for member in (CUT, "m1"):
            wait_for(lambda member=member: cluster(replicas[B], member)["health"] == "Degraded"
                     and "only 1 of 2" in (cluster(replicas[B], member)["reason"] or ""),
                     timeout=20, what=f"B: {member} Degraded, unreachable from B alone", log=replicas[B])
        time.sleep(DEFAULT_HEALTH["unreachableAfterSeconds"] + DEFAULT_HEALTH["withdrawAfterSeconds"] + 2)
        for r in (A, B):
            for member in (CUT, "m1"):
                c = cluster(replicas[r], member)
                assert not c["withdrawn"] and c["health"] != "Unreachable", (r, c)
            assert replicas[r].addresses(f"svc-{CUT}.shop.global") == ["10.9.7.1"], f"{r} withdrew d07"
        assert cluster(replicas[A], "m1")["health"] == "Healthy"
        assert metric(replicas[B], "meridian_shard_unconfirmed_members") == 2
        assert shards(replicas[A])["shards"]["reports"][B]["unreachable"] == [CUT, "m1"]
        proxies[B].cut()  # m1's route back: new connections go through
        wait_for(lambda: cluster(replicas[B], "m1")["health"] == "Healthy", timeout=20,
                 what="B reaches m1 again", log=replicas[B])

        # Cut A's route too: a majority (both) cannot reach it: withdrawn after the grace.
        (cwds[A] / "members" / CUT).unlink()
        for r in (A, B):
            wait_for(lambda r=r: cluster(replicas[r], CUT)["withdrawn"], timeout=25,
                     what=f"{r} withdraws d07", log=replicas[r])
            assert replicas[r].addresses(f"svc-{CUT}.shop.global") == []
        # And back: served again by both.
        for r in (A, B):
            (cwds[r] / "members" / CUT).symlink_to(paths[CUT])
        for r in (A, B):
            replicas[r].wait_for(lambda r=r: replicas[r].addresses(f"svc-{CUT}.shop.global") == ["10.9.7.1"],
                                 timeout=15, what=f"{r} serves d07 again")

        # Cut B from the hub (its hub proxy frozen) and from d05: B's Lease lapses, so A writes
        # every member; B cannot ask A, so it serves d05 stale, says so, and never withdraws it
        # (svc-d05 is among the names the DNS loads check).
        lost = "d05"
        hub_proxies[B].freeze()
        (cwds[B] / "members" / lost).unlink()
        wait_for(lambda: settled({A: replicas[A]}), timeout=20, what="A writes every member", log=replicas[A])
        wait_for(lambda: metric(replicas[B], "meridian_shard_hub_readable") == 0, timeout=20,
                 what="B says it cannot read the hub", log=replicas[B])
        wait_for(lambda: "the hub cannot be read" in (cluster(replicas[B], lost)["reason"] or ""), timeout=20,
                 what="B: d05 unreachable here, unconfirmable", log=replicas[B])
        time.sleep(DEFAULT_HEALTH["unreachableAfterSeconds"] + DEFAULT_HEALTH["withdrawAfterSeconds"] + 2)
        c = cluster(replicas[B], lost)
        assert c["health"] == "Degraded" and not c["withdrawn"], c
        assert held_by({B: replicas[B]}) == {}, "B still says it writes members without a Lease"
        (cwds[B] / "members" / lost).symlink_to(paths[lost])
        hub_proxies[B].cut()
        wait_for(lambda: settled(two), timeout=30, what="B back from the hub cut: members shared again",
                 log=replicas[B])
    finally:
        for load in loads.values():
            load.stop()
    for r, load in finished + list(loads.items()):
        print(f"{r}: {load.ok} DNS answers, {len(load.failures)} failures")
        assert not load.failures, f"{r}: {len(load.failures)} failed queries:\n" + "\n".join(load.failures[:20])
        assert load.ok >= 200, f"{r}: only {load.ok} queries in the load"

    writes = check_one_writer(fleet)
    by = {r: {m for m, _, e in writes if e["user"]["username"] == r} for r in REPLICAS}
    assert all(by[r] for r in REPLICAS), f"every replica wrote some member: {by}"
    assert {m for m, where, _ in writes if where != "hub"} == {"m1", "m3"}
    placed = [(m, e) for m, where, e in writes if where != "hub" and ref(e).get("resource") == "deployments"]
    assert {m for m, _ in placed} == {"m1", "m3"}, "the placed Deployment's writes are among those checked"
