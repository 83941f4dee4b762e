"""Staged rollouts that move traffic first (issue 40), on the real kube-apiservers of
kube_fleet.py: a ClusterSchedulingPolicy with `placement.rollout` duplicates Deployment `roll`
into m1, m2 and m3 and governs Service `roll`, which each member exports. A template edit
then rolls out stage by stage: canary m1, then m2 and m3 once approved.

What is checked, against real DNS answers and the members' audit logs:
- m1's address leaves the answers before meridian's write of m1's copy reaches m1's API
  server (sampled every 20 ms), and comes back only once m1 runs ready at the new generation;
- m2 and m3 keep the old generation until `meridian rollout approve`, and while an operator's
  `pause` holds until `resume`;
- a copy that does not become ready in time pauses the rollout, said in `rollout status`, the
  policy's `Rollout` condition and meridian_propagation_rollout_paused;
- `meridian rollout abort` gives every stage reached the previous generation again and brings
  the traffic back; the policy status says RolledBack;
- an OverridePolicy edit rolls out through the same stages (the template generation unchanged),
  and a later edit changing only m3's rules stages m3 alone (m1 keeps its traffic and copy),
  and its abort gives m3 the rules it had before;
- a ConfigMap the Deployment uses (no generation: told apart by its body's digest) rolls
  out through the same stages, the Deployment's copies untouched;
- a health gate, a query against a real Prometheus scraping the apps' error ratio per
  cluster, lets the canary through and rolls the second stage back when its clusters' errors
  go over the threshold.

There is no controller manager: the test writes the members' Deployment status, as the
Deployment controller would.
"""

import datetime
import http.server
import json
import subprocess
import threading
import time

import pytest

from conftest import BIN
from kube_fleet import FROM, MERIDIAN, NAMESPACE, wait_for
from test_kube_propagation import APPS, condition, deployment, member_deployment, metric, write_status
from test_observability import Prometheus, prometheus_bin  # noqa: F401 (a fixture)

GENERATION = "meridian.io/template-generation"
OVERRIDES = "meridian.io/overrides"
ADDRESS = {"m1": "10.1.0.7", "m2": "10.2.0.7", "m3": "10.3.0.7"}
NAME = "roll.shop.global"


@pytest.fixture(autouse=True)
def propagation_rbac(kube_fleet):
    """Members get deploy/rbac/member-propagation.yaml for this test only."""
    kube_fleet.grant_propagation()
    yield
    kube_fleet.revoke_propagation()


def image_of(kube_fleet, member, name="roll"):
    d = member_deployment(kube_fleet, member, name)
    return d and d["spec"]["template"]["spec"]["containers"][0]["image"].rsplit(":", 1)[1]


def images(kube_fleet, name="roll"):
    return {m: image_of(kube_fleet, m, name) for m in ("m1", "m2", "m3")}


def rollout_cli(m, *args, check=True):
    r = subprocess.run([BIN, "rollout", *args, "--admin", f"127.0.0.1:{m.admin_port}"],
                       capture_output=True, text=True, timeout=30)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def policy_status(kube_fleet, name="roll"):
    p = kube_fleet.hub.get(MERIDIAN, "ClusterSchedulingPolicy", name, NAMESPACE) or {}
    return p.get("status") or {}


class Sampler:
    """Asks meridian for roll.shop.global as a client in `member` every 20 ms, keeping
    (wall-clock time, addresses)."""

    def __init__(self, m, member):
        self.m, self.source, self.samples = m, FROM[member], []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stopped.is_set():
            at = time.time()
            try:
                self.samples.append((at, tuple(self.m.addresses(NAME, source=self.source))))
            except Exception as e:  # a timeout is a sample too: no answer
                self.samples.append((at, ("error", str(e))))
            time.sleep(0.02)

    def stop(self):
        self.stopped.set()
        self.thread.join(5)
        return self.samples


REGION = {"m1": "eu", "m2": "eu", "m3": "us"}
CLUSTER_OF = {address: cluster for cluster, address in ADDRESS.items()}


def answered_as_planned(m, step):
    """While `step`'s stage is drained, the clusters DNS answers a client of each member with
    are those `simulate --rollout` gave its region a share of."""
    for client, region in REGION.items():
        planned = {s["cluster"] for s in step["shares"] if s["region"] == region and s["percent"] > 0}
        answered = {CLUSTER_OF[a] for a in m.addresses(NAME, source=FROM[client])}
        assert answered == planned, (client, step["stage"], answered, step["shares"])


def left_before_written(kube_fleet, samplers, stage, since, resource="deployments", name="roll"):
    """Stops the samplers and checks, for the client of every member, that each cluster of
    `stage` left the answers before meridian's write of its copy (after `since`) reached its
    API server, stayed out until after that write (back at most once), and that no answer was
    empty meanwhile."""
    samples = {c: s.stop() for c, s in samplers.items()}
    for cluster in stage:
        write = written_at(kube_fleet, cluster, since, resource, name)
        assert write is not None, f"no write of {cluster}'s copy in its audit log"
        for client, seen in samples.items():
            gone = [t for t, a in seen if ADDRESS[cluster] not in a]
            assert gone, f"{cluster}'s address never left the answers to a client in {client}"
            first_gone = min(gone)
            assert first_gone < write, (
                f"{cluster}'s copy was written {first_gone - write:.3f} s before its traffic left {client}'s answers")
            back = [t for t, a in seen if t > first_gone and ADDRESS[cluster] in a]
            first_back = min(back) if back else float("inf")
            assert all(ADDRESS[cluster] not in a for t, a in seen if first_gone <= t < first_back), (cluster, client)
            assert first_back > write, f"{cluster} came back to {client}'s clients before its copy changed"
    for client, seen in samples.items():
        empty = [s for s in seen if not s[1] or s[1][0] == "error"]
        assert not empty, (client, empty[:3])


def written_at(kube_fleet, member, after, resource="deployments", name="roll"):
    """When meridian's first write of `resource` `name` after `after` reached `member`'s API
    server (the audit log's requestReceivedTimestamp), or None."""
    for e in kube_fleet.audit_events(member):
        ref = e.get("objectRef") or {}
        if (ref.get("resource") == resource and ref.get("name") == name
                and e.get("user", {}).get("username") == "meridian" and e.get("verb") in ("patch", "update", "create")):
            at = datetime.datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if at > after:
                return at
    return None


def canary_ready_then_awaiting_approval(kube_fleet, m, samplers, edited):
    """The canary m1 runs ready with what it was given: its address comes back (it left the
    answers before the write, checked from the samplers), and the next stage waits for
    approval. Returns what `rollout status` says then."""
    write_status(kube_fleet, "m1", "roll", 1)
    m.wait_for(lambda: ADDRESS["m1"] in m.addresses(NAME, source=FROM["m1"]), timeout=20,
               what="m1's address back once it runs ready")
    left_before_written(kube_fleet, samplers, ["m1"], edited)
    wait_for(lambda: (condition({"status": policy_status(kube_fleet)}, "Rollout") or {}).get("reason") == "AwaitingApproval",
             timeout=20, what="the Rollout condition AwaitingApproval", log=m)
    return rollout_cli(m, "status", "roll", "-n", NAMESPACE).stdout


def roll_deployed(kube_fleet, m, rollout, template=None):
    """Deployment `roll` (image tag 1, or `template`) duplicated into m1, m2 and m3 by policy
    `roll` with `rollout`, each copy ready, each member exporting Service `roll`, and m1's
    address answered to a client in m1. Returns the policy's spec."""
    for member, address in ADDRESS.items():
        kube_fleet.publish(member, "roll", [address])
    kube_fleet.hub.apply(template or deployment("roll", 1, image_tag="1"))
    spec = {
        "resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "roll"}, {"name": "roll"}],
        "placement": {
            "clusterAffinities": [{"name": "all", "clusterNames": ["m1", "m2", "m3"]}],
            "rollout": rollout,
        },
    }
    kube_fleet.policy("roll", spec)
    wait_for(lambda: images(kube_fleet) == {"m1": "1", "m2": "1", "m3": "1"}, timeout=30,
             what="roll:1 duplicated into m1, m2 and m3", log=m)
    for member in ADDRESS:
        write_status(kube_fleet, member, "roll", 1)
    m.wait_for(lambda: ADDRESS["m1"] in m.addresses(NAME, source=FROM["m1"]), timeout=20,
               what="m1's address answered to a client in m1")
    return spec


def test_an_edit_drains_the_canary_first_waits_for_approval_pauses_on_failure_and_aborts_back(kube_fleet, kube_meridian):
    m, hub = kube_meridian, kube_fleet.hub
    roll_deployed(kube_fleet, m, {"drainSeconds": 1, "progressDeadlineSeconds": 6, "stages": [
        {"name": "canary", "clusterNames": ["m1"]},
        {"name": "rest", "maxUnavailablePercent": 100, "approval": "Required"},
    ]})

    # The plan, before the edit: what each stage drains and where each region's traffic goes.
    plan = json.loads(subprocess.run([BIN, "simulate", "--rollout", "shop/roll", "--json", "--admin",
                                      f"127.0.0.1:{m.admin_port}"], capture_output=True, text=True, check=True).stdout)
    assert [(s["stage"], s["drained"], s["stranded"]) for s in plan["steps"]] == [
        ("canary", ["m1"], []), ("rest", ["m2", "m3"], [])], plan

    # The edit: generation 2. Clients of every member ask every 20 ms.
    samplers = {c: Sampler(m, c) for c in ADDRESS}
    edited = time.time()
    hub.apply(deployment("roll", 1, image_tag="2"))
    wait_for(lambda: image_of(kube_fleet, "m1") == "2", timeout=30, what="the canary m1 gets roll:2", log=m)
    answered_as_planned(m, plan["steps"][0])
    copy = member_deployment(kube_fleet, "m1", "roll")
    assert copy["metadata"]["annotations"][GENERATION] == "2", copy["metadata"]
    # Not ready at generation 2 yet (its status is generation 1's): still out of traffic.
    time.sleep(1.5)
    assert images(kube_fleet) == {"m1": "2", "m2": "1", "m3": "1"}, "a later stage changed before its turn"
    # Stage 2 waits for approval: m2 and m3 keep generation 1, said everywhere.
    said = canary_ready_then_awaiting_approval(kube_fleet, m, samplers, edited)
    assert "waiting for `meridian rollout approve`" in said, said
    assert 'stage 1 "canary": m1 — done' in said and 'stage 2 "rest": m2, m3 — approval' in said, said
    time.sleep(2)
    assert images(kube_fleet) == {"m1": "2", "m2": "1", "m3": "1"}

    # Paused by an operator, an approval waits for `resume`.
    rollout_cli(m, "pause", "roll", "-n", NAMESPACE)
    rollout_cli(m, "approve", "roll", "-n", NAMESPACE)
    wait_for(lambda: "paused: paused by an operator" in rollout_cli(m, "status").stdout, timeout=10,
             what="the operator's pause shown", log=m)
    time.sleep(2)
    assert images(kube_fleet) == {"m1": "2", "m2": "1", "m3": "1"}
    assert ADDRESS["m2"] in m.addresses(NAME, source=FROM["m2"])
    # Resumed: m2 and m3 leave the traffic (a client in m2 goes to m1), then change.
    samplers = {c: Sampler(m, c) for c in ADDRESS}
    resumed = time.time()
    rollout_cli(m, "resume", "roll", "-n", NAMESPACE)
    m.wait_for(lambda: ADDRESS["m2"] not in m.addresses(NAME, source=FROM["m2"]), timeout=20,
               what="m2 drained after the approval")
    assert policy_status(kube_fleet)["rollout"]["drained"] == ["m2", "m3"], policy_status(kube_fleet)
    answered_as_planned(m, plan["steps"][1])
    wait_for(lambda: images(kube_fleet) == {"m1": "2", "m2": "2", "m3": "2"}, timeout=20,
             what="m2 and m3 get roll:2", log=m)
    time.sleep(0.5)
    left_before_written(kube_fleet, samplers, ["m2", "m3"], resumed)
    # m3 runs ready, m2 never does: past progressDeadlineSeconds the rollout pauses.
    write_status(kube_fleet, "m3", "roll", 1)
    wait_for(lambda: "not ready at the new generation in time" in (policy_status(kube_fleet)["rollout"]["templates"][0].get("paused") or ""),
             timeout=30, what="the rollout paused on m2's readiness", log=m)
    assert condition({"status": policy_status(kube_fleet)}, "Rollout")["reason"] == "Paused"
    assert metric(m, "meridian_propagation_rollout_paused") == 1
    assert "paused: stage 2: not ready at the new generation in time" in rollout_cli(m, "status").stdout

    # Abort: every stage reached gets generation 1 back; traffic returns once it is ready.
    rollout_cli(m, "abort", "roll", "-n", NAMESPACE)
    wait_for(lambda: images(kube_fleet) == {"m1": "1", "m2": "1", "m3": "1"}, timeout=30,
             what="the previous generation back in m1, m2 and m3", log=m)
    assert member_deployment(kube_fleet, "m1", "roll")["metadata"]["annotations"][GENERATION] == "1"
    for member in ADDRESS:
        write_status(kube_fleet, member, "roll", 1)
    wait_for(lambda: policy_status(kube_fleet)["rollout"]["templates"][0]["phase"] == "RolledBack", timeout=20,
             what="the rollout RolledBack", log=m)
    assert condition({"status": policy_status(kube_fleet)}, "Rollout")["reason"] == "RolledBack"
    m.wait_for(lambda: ADDRESS["m2"] in m.addresses(NAME, source=FROM["m2"]), timeout=20,
               what="m2's traffic back after the rollback")
    assert policy_status(kube_fleet)["rollout"]["drained"] == []
    # The hub's template is still generation 2: the members keep generation 1 (nothing
    # re-applies 2 until the next edit), and a command to a finished rollout changes nothing.
    time.sleep(2)
    assert images(kube_fleet) == {"m1": "1", "m2": "1", "m3": "1"}
    views = json.loads(m.http("/debug/rollouts")[1])
    assert views["leading"] and views["rollouts"][0]["phase"] == "RolledBack", views


def tag_override(*rules):
    """OverridePolicy `roll-tag`: each rule (clusters or None for all, image tag) replaces the
    image tag of Deployment roll in those clusters."""
    def rule(clusters, tag):
        r = {"overriders": {"image": [{"component": "Tag", "operator": "replace", "value": tag}]}}
        if clusters:
            r["targetClusters"] = {"clusterNames": clusters}
        return r
    return {"apiVersion": MERIDIAN, "kind": "OverridePolicy", "metadata": {"name": "roll-tag", "namespace": NAMESPACE},
            "spec": {"resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "roll"}],
                     "overrideRules": [rule(c, t) for c, t in rules]}}


def test_an_override_edit_is_staged_like_a_template_edit_and_only_where_a_copy_changes(kube_fleet, kube_meridian):
    """What a member receives is the template *and* the override rules applied there: an
    OverridePolicy edit rolls out through the same stages, traffic first; a later edit that
    changes only m3's rules stages m3 alone, and m1 keeps its traffic and its copy."""
    m, hub = kube_meridian, kube_fleet.hub
    roll_deployed(kube_fleet, m, {"drainSeconds": 1, "stages": [
        {"name": "canary", "clusterNames": ["m1"]},
        {"name": "rest", "maxUnavailablePercent": 100, "approval": "Required"},
    ]})

    # Every cluster's tag becomes 2 by an override; the template stays at generation 1.
    samplers = {c: Sampler(m, c) for c in ADDRESS}
    edited = time.time()
    hub.apply(tag_override((None, "2")))
    wait_for(lambda: image_of(kube_fleet, "m1") == "2", timeout=30, what="the canary m1 gets the override", log=m)
    copy = member_deployment(kube_fleet, "m1", "roll")
    assert copy["metadata"]["annotations"][GENERATION] == "1", copy["metadata"]
    assert OVERRIDES in copy["metadata"]["annotations"], copy["metadata"]
    time.sleep(1.5)
    assert images(kube_fleet) == {"m1": "2", "m2": "1", "m3": "1"}, "an override edit reached a later stage at once"
    said = canary_ready_then_awaiting_approval(kube_fleet, m, samplers, edited)
    assert "override rules at generation 1" in said and 'stage 2 "rest": m2, m3 — approval' in said, said
    rollout_cli(m, "approve", "roll", "-n", NAMESPACE)
    wait_for(lambda: images(kube_fleet) == {"m1": "2", "m2": "2", "m3": "2"}, timeout=30,
             what="m2 and m3 get the override once approved", log=m)
    for member in ("m2", "m3"):
        write_status(kube_fleet, member, "roll", 1)
    wait_for(lambda: policy_status(kube_fleet)["rollout"]["templates"][0]["phase"] == "Done", timeout=20,
             what="the override's rollout Done", log=m)

    # Only m3's rules change: one stage, m3's; m1 and m2 keep their traffic and their copies.
    m1_client = Sampler(m, "m1")
    second = time.time()
    hub.apply(tag_override((None, "2"), (["m3"], "3")))
    wait_for(lambda: (condition({"status": policy_status(kube_fleet)}, "Rollout") or {}).get("reason") == "AwaitingApproval",
             timeout=20, what="m3's stage awaiting approval", log=m)
    rollout = policy_status(kube_fleet)["rollout"]
    assert [s["clusters"] for s in rollout["templates"][0]["stages"]] == [["m3"]], rollout
    rollout_cli(m, "approve", "roll", "-n", NAMESPACE)
    wait_for(lambda: image_of(kube_fleet, "m3") == "3", timeout=30, what="m3 gets its own tag", log=m)
    # Aborted before m3 runs ready: m3 gets the rules it had before (tag 2), not today's.
    rollout_cli(m, "abort", "roll", "-n", NAMESPACE)
    wait_for(lambda: image_of(kube_fleet, "m3") == "2", timeout=30, what="m3 back at the previous rules", log=m)
    write_status(kube_fleet, "m3", "roll", 1)
    wait_for(lambda: policy_status(kube_fleet)["rollout"]["templates"][0]["phase"] == "RolledBack", timeout=20,
             what="m3's rollout RolledBack", log=m)
    m.wait_for(lambda: ADDRESS["m3"] in m.addresses(NAME, source=FROM["m3"]), timeout=20,
               what="m3's traffic back after the rollback")
    seen = m1_client.stop()
    assert seen and all(ADDRESS["m1"] in a for _, a in seen), "m1 left the traffic for an edit that does not change it"
    assert images(kube_fleet) == {"m1": "2", "m2": "2", "m3": "2"}
    for member in ("m1", "m2"):
        assert written_at(kube_fleet, member, second) is None, f"{member}'s unchanged copy was written"


def env_config(mode):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "roll-env", "namespace": NAMESPACE},
            "data": {"MODE": mode}}


def test_a_configmap_the_workload_uses_rolls_out_through_its_stages(kube_fleet, kube_meridian):
    """A ConfigMap that follows Deployment roll has no generation: its edits are told apart
    by its body's digest on the copy (meridian.io/template-digest), and roll out through the
    stages of the policy placing the Deployment, traffic first — the canary's configuration
    changes first, the rest once approved. The Deployment's copies are not written."""
    m, hub = kube_meridian, kube_fleet.hub
    hub.apply(env_config("one"))
    d = deployment("roll", 1, image_tag="1")
    d["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "roll-env"}}]
    # The second stage by tier: the clusters of affinity "all" the canary left (m2, m3).
    roll_deployed(kube_fleet, m, {"drainSeconds": 1, "stages": [
        {"name": "canary", "clusterNames": ["m1"]},
        {"name": "rest", "tier": "all", "approval": "Required"},
    ]}, template=d)

    def modes():
        return {c: ((kube_fleet.cluster(c).get("v1", "ConfigMap", "roll-env", NAMESPACE) or {}).get("data") or {}).get("MODE")
                for c in ADDRESS}

    wait_for(lambda: modes() == {"m1": "one", "m2": "one", "m3": "one"}, timeout=20,
             what="the ConfigMap followed the Deployment into m1, m2 and m3", log=m)
    samplers = {c: Sampler(m, c) for c in ADDRESS}
    edited = time.time()
    hub.apply(env_config("two"))
    wait_for(lambda: modes()["m1"] == "two", timeout=30, what="the canary m1 gets the new configuration", log=m)
    copy = kube_fleet.cluster("m1").get("v1", "ConfigMap", "roll-env", NAMESPACE)
    assert "meridian.io/template-digest" in copy["metadata"]["annotations"], copy["metadata"]
    time.sleep(1.5)
    assert modes() == {"m1": "two", "m2": "one", "m3": "one"}, "the configuration reached a later stage at once"
    m.wait_for(lambda: ADDRESS["m1"] in m.addresses(NAME, source=FROM["m1"]), timeout=20,
               what="m1's address back once its configuration changed")
    left_before_written(kube_fleet, samplers, ["m1"], edited, resource="configmaps", name="roll-env")
    wait_for(lambda: (condition({"status": policy_status(kube_fleet)}, "Rollout") or {}).get("reason") == "AwaitingApproval",
             timeout=20, what="the configuration's second stage awaiting approval", log=m)
    said = rollout_cli(m, "status", "roll", "-n", NAMESPACE).stdout
    assert "v1/ConfigMap/shop/roll-env (no generation) new content" in said, said
    rollout_cli(m, "approve", "roll", "-n", NAMESPACE)
    wait_for(lambda: modes() == {"m1": "two", "m2": "two", "m3": "two"}, timeout=30,
             what="m2 and m3 get the configuration once approved", log=m)
    wait_for(lambda: policy_status(kube_fleet)["rollout"]["templates"][0]["phase"] == "Done", timeout=20,
             what="the configuration's rollout Done", log=m)
    for member in ADDRESS:
        assert written_at(kube_fleet, member, edited) is None, f"{member}'s Deployment was written for a ConfigMap edit"


def first_tier_of(m, client):
    """The first tier of roll's traffic decision for a client in `client`: {cluster: weight}
    and the tier's reasons, with what explain's words say of a ramp (/debug/explain)."""
    status, body = m.http(f"/debug/explain?service=roll.{NAMESPACE}&cluster={client}")
    assert status == 200, body
    explained = json.loads(body)
    tier = explained["decision"]["tiers"][0]
    ramping = [w for w in explained["words"] if w.startswith("ramping:")]
    return {c["cluster"]: c["weight"] for c in tier["clusters"]}, (tier["reasons"], ramping)


def test_a_stage_comes_back_stepping_up_over_ramp_seconds(kube_fleet, kube_meridian):
    """rampSeconds: once the canary runs ready at the new generation, its traffic comes back
    in steps. The policy's status says the share m1 takes now, rising; the decision for m1's
    own clients (m1 alone in their first tier) merges that tier with the next, m1 weighing its
    share; DNS answers m1's clients with m1 and the next tier's cluster together meanwhile,
    and with m1 alone once the ramp is over."""
    m, hub = kube_meridian, kube_fleet.hub
    roll_deployed(kube_fleet, m, {"drainSeconds": 1, "rampSeconds": 10, "progressDeadlineSeconds": 30, "stages": [
        {"name": "canary", "clusterNames": ["m1"]},
        {"name": "rest", "maxUnavailablePercent": 100},
    ]})
    alone, _ = first_tier_of(m, "m1")
    assert list(alone) == ["m1"], alone
    # The plan shows the ramp: at a quarter of its share m1 takes a quarter of its own
    # clients' traffic (m2 the rest), so 12.5 % of region eu's; us keeps m3.
    plan = json.loads(subprocess.run([BIN, "simulate", "--rollout", "shop/roll", "--json", "--admin",
                                      f"127.0.0.1:{m.admin_port}"], capture_output=True, text=True, check=True).stdout)
    quarter = plan["steps"][0]["ramp"][0]
    assert quarter["percent"] == 25 and {(s["region"], s["cluster"]): s["percent"] for s in quarter["shares"]} == {
        ("eu", "m1"): 12.5, ("eu", "m2"): 87.5, ("us", "m3"): 100.0}, quarter
    assert [r["percent"] for r in plan["steps"][0]["ramp"]] == [25, 50, 75], plan["steps"][0]

    hub.apply(deployment("roll", 1, image_tag="2"))
    wait_for(lambda: image_of(kube_fleet, "m1") == "2", timeout=30, what="the canary m1 gets roll:2", log=m)
    write_status(kube_fleet, "m1", "roll", 1)

    # The ramp, sampled every 0.3 s until it is over: the status's share, the decision's
    # weights and DNS's answer to a client in m1.
    samples = []
    deadline = time.time() + 40
    while time.time() < deadline:
        share = ((policy_status(kube_fleet).get("rollout") or {}).get("ramping") or {}).get("m1")
        tier, said = first_tier_of(m, "m1")
        answered = {CLUSTER_OF[a] for a in m.addresses(NAME, source=FROM["m1"])}
        samples.append((share, tier, said, answered))
        if share is None and image_of(kube_fleet, "m2") == "2":
            break
        time.sleep(0.3)
    shares = [s for s, _, _, _ in samples if s is not None]
    assert len(set(shares)) >= 3, f"the share did not step up: {shares}"
    assert shares == sorted(shares) and all(0 < s < 100 for s in shares), shares
    merged = [(share, tier, said, answered) for share, tier, said, answered in samples
              if share is not None and "m1" in tier and len(tier) > 1]
    assert merged, f"m1's clients never had m1 beside the next tier: {samples}"
    for share, tier, (reasons, ramping), answered in merged:
        assert reasons[0] == "ClientCluster" and len(reasons) == 2, reasons
        assert len(ramping) == 1 and ramping[0].startswith("ramping: m1 takes"), ramping
        # m1 weighs its share of the merged tier (the status and the decision are read a
        # moment apart: within one 10 % step).
        assert abs(100 * tier["m1"] / sum(tier.values()) - share) <= 10, (share, tier)
        assert "m1" in answered and len(answered) > 1, answered
    fractions = [tier["m1"] / sum(tier.values()) for _, tier, _, _ in merged]
    assert fractions[-1] - fractions[0] >= 0.3, f"m1's weight did not rise with the share: {fractions}"
    # Over: m1 alone first for its own clients again, and the next stage rolled on.
    wait_for(lambda: list(first_tier_of(m, "m1")[0]) == ["m1"], timeout=20, what="m1 alone in its clients' first tier", log=m)
    assert {CLUSTER_OF[a] for a in m.addresses(NAME, source=FROM["m1"])} == {"m1"}
    assert not (policy_status(kube_fleet)["rollout"].get("ramping"))


class ErrorRatios:
    """What the apps' own /metrics would say: app_error_ratio per cluster, served on a free
    loopback port for Prometheus to scrape."""

    def __init__(self, **ratios):
        self.ratios = dict(ratios)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = "# TYPE app_error_ratio gauge\n" + "".join(
                    f'app_error_ratio{{cluster="{c}"}} {v}\n' for c, v in sorted(outer.ratios.items()))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def test_a_prometheus_gate_passes_the_canary_and_rolls_back_a_stage_whose_errors_rise(
        kube_fleet, kube_meridian, prometheus_bin, tmp_path):  # noqa: F811
    m, hub = kube_meridian, kube_fleet.hub
    ratios = ErrorRatios(m1=0, m2=0, m3=0)
    prom = Prometheus(prometheus_bin, tmp_path, f"127.0.0.1:{ratios.port}")
    try:
        prom.wait_for('count(app_error_ratio) == 3', "the three clusters' error ratios scraped")
        hub.apply(deployment("gated", 1, image_tag="1"))
        kube_fleet.policy("gated", {
            "resourceSelectors": [{"apiVersion": APPS, "kind": "Deployment", "name": "gated"}],
            "placement": {
                "clusterAffinities": [{"name": "all", "clusterNames": ["m1", "m2", "m3"]}],
                "rollout": {"drainSeconds": 0, "onFailure": "Rollback", "stages": [
                    {"name": "canary", "clusterNames": ["m1"], "waitSeconds": 4},
                    {"name": "rest", "maxUnavailableClusters": 2, "waitSeconds": 30},
                ], "analysis": {"prometheusURL": f"http://127.0.0.1:{prom.port}",
                                "query": 'max(app_error_ratio{cluster=~"$clusters"})', "threshold": 0.05}},
            },
        })
        wait_for(lambda: images(kube_fleet, "gated") == {"m1": "1", "m2": "1", "m3": "1"}, timeout=30,
                 what="gated:1 in m1, m2 and m3", log=m)
        for member in ("m1", "m2", "m3"):
            write_status(kube_fleet, member, "gated", 1)
        # m3 already errs, but the canary's query asks about m1 alone.
        ratios.ratios["m3"] = 0.5
        prom.wait_for('app_error_ratio{cluster="m3"} > 0.4', "m3's errors scraped")
        hub.apply(deployment("gated", 1, image_tag="2"))
        wait_for(lambda: image_of(kube_fleet, "m1", "gated") == "2", timeout=30, what="the canary m1 gets gated:2", log=m)
        write_status(kube_fleet, "m1", "gated", 1)
        said = wait_for(lambda: [r for r in json.loads(m.http("/debug/rollouts")[1])["rollouts"]
                                 if r["policy"] == "shop/gated" and r.get("gate")], timeout=20,
                        what="the canary's gate asked", log=m)
        assert "returned at most 0" in said[0]["gate"], said
        # The canary held its gate for waitSeconds: the rest gets generation 2.
        wait_for(lambda: images(kube_fleet, "gated") == {"m1": "2", "m2": "2", "m3": "2"}, timeout=30,
                 what="m2 and m3 get gated:2 after the canary's gate held", log=m)
        write_status(kube_fleet, "m2", "gated", 1)
        write_status(kube_fleet, "m3", "gated", 1)
        # Their query sees m3's errors: the gate fails, and the rollout rolls back everywhere.
        wait_for(lambda: images(kube_fleet, "gated") == {"m1": "1", "m2": "1", "m3": "1"}, timeout=30,
                 what="every stage reached rolled back to gated:1", log=m)
        view = [r for r in json.loads(m.http("/debug/rollouts")[1])["rollouts"] if r["policy"] == "shop/gated"][0]
        assert view["phase"] in ("RollingBack", "RolledBack"), view
        assert "returned 0.5, above 0.05" in view["gate"], view
        for member in ("m1", "m2", "m3"):
            write_status(kube_fleet, member, "gated", 1)
        wait_for(lambda: policy_status(kube_fleet, "gated")["rollout"]["templates"][0]["phase"] == "RolledBack",
                 timeout=20, what="RolledBack in the policy's status", log=m)
    finally:
        prom.stop()
        ratios.stop()


def test_a_new_leader_resumes_the_rollout_at_its_stage_without_rewriting_the_finished_one(kube_fleet):
    """Two replicas; the leader is killed (SIGKILL) while stage 2 waits for approval. The other
    takes the lease, reads the progress from the policy's status and resumes at stage 2: m1's
    copy is not written again, m2 and m3 keep generation 1 until the new leader is told
    approved — through the policy's annotations, as a GitOps tool would: `rollout-paused`
    holds it while set, `rollout-approved: rest` lets stage 2 go."""
    a = kube_fleet.start_meridian("meridian")
    wait_for(lambda: kube_fleet.lease_holder() == "meridian", timeout=15, what="meridian leads", log=a)
    b = kube_fleet.start_meridian("meridian-2")
    hub = kube_fleet.hub
    spec = roll_deployed(kube_fleet, a, {"drainSeconds": 0, "stages": [
        {"name": "canary", "clusterNames": ["m1"]},
        {"name": "rest", "maxUnavailablePercent": 100, "approval": "Required"},
    ]})
    hub.apply(deployment("roll", 1, image_tag="2"))
    wait_for(lambda: image_of(kube_fleet, "m1") == "2", timeout=30, what="the canary m1 gets roll:2", log=a)
    write_status(kube_fleet, "m1", "roll", 1)
    wait_for(lambda: (condition({"status": policy_status(kube_fleet)}, "Rollout") or {}).get("reason") == "AwaitingApproval",
             timeout=20, what="stage 2 awaiting approval", log=a)
    assert "does not lead" in rollout_cli(b, "status", check=False).stderr

    killed = time.time()
    a.proc.kill()
    a.proc.wait()
    wait_for(lambda: kube_fleet.lease_holder() == "meridian-2", timeout=20, what="meridian-2 takes the lease", log=b)
    said = wait_for(lambda: (lambda r: r.stdout if r.returncode == 0 and "roll" in r.stdout else None)(
        rollout_cli(b, "status", "roll", "-n", NAMESPACE, check=False)), timeout=20, what="meridian-2 shows the rollout", log=b)
    assert 'stage 1 "canary": m1 — done' in said and "waiting for `meridian rollout approve`" in said, said
    time.sleep(2)
    assert images(kube_fleet) == {"m1": "2", "m2": "1", "m3": "1"}
    assert written_at(kube_fleet, "m1", killed) is None, "the new leader wrote the finished stage's copy again"

    # Approved by annotation while the annotation also pauses it: nothing moves until the pause goes.
    def annotate(**annotations):
        hub.apply({"apiVersion": MERIDIAN, "kind": "ClusterSchedulingPolicy",
                   "metadata": {"name": "roll", "namespace": NAMESPACE, "annotations": annotations}, "spec": spec})
    annotate(**{"meridian.io/rollout-paused": "true", "meridian.io/rollout-approved": "rest"})
    wait_for(lambda: "paused by the policy's annotation" in rollout_cli(b, "status").stdout, timeout=15,
             what="the annotation's pause", log=b)
    time.sleep(2)
    assert images(kube_fleet) == {"m1": "2", "m2": "1", "m3": "1"}
    annotate(**{"meridian.io/rollout-approved": "rest"})
    b.wait_for(lambda: ADDRESS["m2"] not in b.addresses(NAME, source=FROM["m2"]), timeout=20,
               what="m2 drained by the new leader")
    wait_for(lambda: images(kube_fleet) == {"m1": "2", "m2": "2", "m3": "2"}, timeout=20,
             what="m2 and m3 get roll:2 from the new leader", log=b)
    for member in ("m2", "m3"):
        write_status(kube_fleet, member, "roll", 1)
    wait_for(lambda: policy_status(kube_fleet)["rollout"]["templates"][0]["phase"] == "Done", timeout=20,
             what="the rollout Done", log=b)
    b.wait_for(lambda: ADDRESS["m2"] in b.addresses(NAME, source=FROM["m2"]), timeout=20,
               what="m2's traffic back")
