"""Workload placement end to end, on directory fleets (no Kubernetes): `meridian render`
checked file by file, `meridian validate` on every bad input the placement issue names,
`serve` keeping each member's renderPath in step with edits (a weight, a replica count, a
taint, a member's directory removed and restored: failover and failback), `explain` showing
a Deployment's placement beside its Service's traffic, and active/standby — the standby gets
replicas *and* traffic only once the primary tier is gone, and DNS (dig) follows.

The first fleet is examples/federation (the README's example): a Deployment placed "EU first,
US fallback" by available capacity, an image-registry override for the US.
"""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ROOT, Fleet, Meridian, require_tool

EXAMPLE = ROOT / "examples" / "federation"


def run(*args, check=None):
    p = subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True, timeout=60)
    if check is not None:
        assert p.returncode == check, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def files(root: Path):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def load(path: Path):
    return yaml.safe_load(path.read_text())


@pytest.fixture
def example(tmp_path):
    root = tmp_path / "federation"
    shutil.copytree(EXAMPLE, root)
    return Fleet(root)


# ---------------------------------------------------------------------------------------
# meridian render


def test_render_writes_each_placed_object_once_per_cluster(example, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("a GitOps repository's own file\n")
    p = run("render", "--config", example.config, "--out", out, check=0)
    assert "6 file(s) for 3 template(s)" in p.stdout and ": 6 written" in p.stdout, p.stdout
    assert files(out) == [
        "README.md",
        "eu-1/shop/ConfigMap.web-config.yaml",
        "eu-1/shop/Deployment.web.yaml",
        "eu-1/shop/Service.web.yaml",
        "eu-2/shop/ConfigMap.web-config.yaml",
        "eu-2/shop/Deployment.web.yaml",
        "eu-2/shop/Service.web.yaml",
    ]
    # 6 replicas of 500m: eu-1 has 2 cores free (4 fit), eu-2 one (2 fit): divided 4/2.
    eu1 = load(out / "eu-1/shop/Deployment.web.yaml")
    eu2 = load(out / "eu-2/shop/Deployment.web.yaml")
    assert (eu1["spec"]["replicas"], eu2["spec"]["replicas"]) == (4, 2)
    for d in (eu1, eu2):
        assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "meridian"
        assert d["metadata"]["annotations"]["meridian.io/template"] == "apps/v1/Deployment/shop/web"
        assert d["metadata"]["annotations"]["meridian.io/template-generation"] == "0"
        assert d["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/shop/web:1.4.2"
    cm = load(out / "eu-1/shop/ConfigMap.web-config.yaml")
    assert cm["data"] == {"greeting": "hello"}, "the ConfigMap the Deployment mounts follows it"
    assert cm["metadata"]["annotations"]["meridian.io/template"] == "v1/ConfigMap/shop/web-config"

    # Unchanged input: nothing rewritten.
    p = run("render", "--config", example.config, "--out", out, check=0)
    assert "0 written, 6 unchanged, 0 removed" in p.stdout, p.stdout

    # 10 replicas do not fit in the EU (6 free): the US tier takes them all, from its mirror,
    # and the ConfigMap goes with them. The Service has no replicas: under the same policy it
    # follows the Deployment to the US, never left where no pod runs.
    web = (example.hub / "web.yaml").read_text().replace("replicas: 6", "replicas: 10")
    example.write("hub/web.yaml", web)
    p = run("render", "--config", example.config, "--out", out, check=0)
    assert "3 written, 0 unchanged, 6 removed" in p.stdout, p.stdout
    assert files(out) == [
        "README.md",
        "us-1/shop/ConfigMap.web-config.yaml",
        "us-1/shop/Deployment.web.yaml",
        "us-1/shop/Service.web.yaml",
    ]
    us = load(out / "us-1/shop/Deployment.web.yaml")
    assert us["spec"]["replicas"] == 10
    assert us["spec"]["template"]["spec"]["containers"][0]["image"] == "mirror.us.example.com/shop/web:1.4.2"


def test_render_fails_naming_unschedulable_templates_and_broken_overrides(example, tmp_path):
    out = tmp_path / "out"
    web = (example.hub / "web.yaml").read_text().replace("replicas: 6", "replicas: 100")
    example.write("hub/web.yaml", web)
    example.write("hub/other.yaml", """apiVersion: v1
kind: ConfigMap
metadata: {name: flags, namespace: shop, labels: {app: flags}}
data: {a: "1"}
---
apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: flags, namespace: shop}
spec:
  resourceSelectors: [{apiVersion: v1, kind: ConfigMap, name: flags}]
---
apiVersion: meridian.io/v1alpha1
kind: OverridePolicy
metadata: {name: broken, namespace: shop}
spec:
  resourceSelectors: [{kind: ConfigMap, name: flags}]
  overrideRules:
    - targetClusters: {clusterNames: [eu-2]}
      overriders:
        jsonPatch: [{op: replace, path: /data/missing, value: "2"}]
""")
    p = run("render", "--config", example.config, "--out", out, check=1)
    err = p.stderr
    assert "Deployment shop/web: unschedulable:" in err, err
    # The numbers: 100 replicas, and what each cluster has free.
    assert "100" in err and "eu-1" in err and "us-1" in err, err
    assert "OverridePolicy shop/broken" in err and "spec.overrideRules[0] cannot apply to ConfigMap shop/flags" in err, err
    assert "ConfigMap shop/flags in eu-2: not rendered" in err, err
    # Everything else is rendered: the ConfigMap where the rule does not apply, untouched.
    assert (out / "eu-1/shop/ConfigMap.flags.yaml").exists()
    assert (out / "us-1/shop/ConfigMap.flags.yaml").exists()
    assert not (out / "eu-2/shop/ConfigMap.flags.yaml").exists(), "never half-overridden"
    assert load(out / "eu-1/shop/ConfigMap.flags.yaml")["data"] == {"a": "1"}


BAD_INPUTS = {
    "unknown-field.yaml": ("""apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: typo, namespace: shop}
spec:
  resourceSelectors: [{kind: Deployment, name: web}]
  placement: {replicaSchedulng: {type: Divided}}
""", "unknown field(s): spec.placement.replicaSchedulng"),
    "no-namespace.yaml": ("""apiVersion: apps/v1
kind: Deployment
metadata: {name: orphan}
spec: {replicas: 1}
""", "a template needs a namespace"),
    "bad-selector.yaml": ("""apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: badsel, namespace: shop}
spec:
  resourceSelectors: [{kind: Deployment, labelSelector: {matchExpressions: [{key: app, operator: Near, values: [x]}]}}]
""", 'unknown operator "Near"'),
    "zero-weights.yaml": ("""apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: zero, namespace: shop}
spec:
  resourceSelectors: [{kind: Deployment, name: zero}]
  placement:
    replicaScheduling:
      type: Divided
      weights: [{clusterNames: [eu-1], weight: 0}, {clusterNames: [eu-2], weight: 0}]
""", "every weight is 0"),
    "min-max.yaml": ("""apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: minmax, namespace: shop}
spec:
  resourceSelectors: [{kind: Deployment, name: minmax}]
  placement:
    spreadConstraints: [{spreadByField: region, minGroups: 3, maxGroups: 2}]
""", "minGroups 3 is greater than maxGroups 2"),
    "spread-field.yaml": ("""apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: field, namespace: shop}
spec:
  resourceSelectors: [{kind: Deployment, name: field}]
  placement:
    spreadConstraints: [{spreadByField: provider, minGroups: 1}]
""", "unknown variant `provider`"),
    "patch.yaml": ("""apiVersion: meridian.io/v1alpha1
kind: OverridePolicy
metadata: {name: patch, namespace: shop}
spec:
  resourceSelectors: [{kind: Deployment, name: web}]
  overrideRules:
    - overriders:
        jsonPatch: [{op: replace, path: /spec/nothing/here, value: 1}]
""", "spec.overrideRules[0] cannot apply to Deployment shop/web"),
    "unplaceable.yaml": ("""apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: nodes, namespace: shop}
spec:
  resourceSelectors: [{apiVersion: v1, kind: Node}]
""", "Node cannot be placed: it is cluster-scoped"),
}


def test_validate_names_each_bad_input_and_keeps_deciding_the_rest(example):
    p = run("validate", "--config", example.config, check=0)
    assert "3 placed template(s); 0 error(s)" in p.stdout, p.stdout
    for name, (text, _) in BAD_INPUTS.items():
        example.write(f"hub/bad/{name}", text)
    p = run("validate", "--config", example.config, check=1)
    for name, (_, needle) in BAD_INPUTS.items():
        lines = [l for l in p.stdout.splitlines() if needle in l]
        assert lines, f"{name}: {needle!r} missing from:\n{p.stdout}"
        assert all(l.startswith("error: ") for l in lines), lines
        if name != "patch.yaml":  # found when the override meets its template, not in a file
            assert any(f"bad/{name}" in l for l in lines), f"{name}: the file is not named: {lines}"
    # The good templates are still decided: web, its ConfigMap and its Service.
    assert "3 placed template(s)" in p.stdout, p.stdout


# ---------------------------------------------------------------------------------------
# serve: renderPath follows the decisions


WEIGHTED = """apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {{name: web, namespace: shop}}
spec:
  resourceSelectors:
    - {{apiVersion: apps/v1, kind: Deployment, name: web}}
    - {{kind: Service, name: web}}
  placement:
    clusterAffinities:
      - {{name: eu, labelSelector: {{matchLabels: {{topology.kubernetes.io/region: eu}}}}}}
      - {{name: us, labelSelector: {{matchLabels: {{topology.kubernetes.io/region: us}}}}}}
    replicaScheduling:
      type: Divided
      weights: [{{clusterNames: [eu-1], weight: {w1}}}, {{clusterNames: [eu-2], weight: {w2}}}]
    failover: {{afterSeconds: 2}}
    failbackAfterSeconds: 3
  traffic: {{mode: Tiers}}
"""

TRAFFIC_SERVICE = """apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec:
  ports: [{{name: http, port: 80, protocol: TCP}}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {{name: web, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-{cluster}
  namespace: shop
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
  - addresses: [{address}]
"""

WEB_ADDRESS = {"eu-1": "127.20.1.1", "eu-2": "127.20.2.1", "us-1": "127.20.3.1"}


def render_paths(fleet: Fleet, short_health=True):
    """Each member gets renderPath ../rendered/<name>, outside its own directory (and short
    health timings unless `short_health` is False)."""
    text = (fleet.hub / "members.yaml").read_text()
    for name in ("eu-1", "eu-2", "us-1"):
        text = text.replace(
            f"source: {{directory: {{path: ../clusters/{name}}}}}",
            f"source: {{directory: {{path: ../clusters/{name}, renderPath: ../rendered/{name}}}}}",
        )
    fleet.write("hub/members.yaml", text)
    if short_health:
        fleet.set_health(heartbeat=1, unreachable=2, withdraw=30)


def with_traffic(fleet: Fleet):
    for cluster, address in WEB_ADDRESS.items():
        fleet.write(f"clusters/{cluster}/web.yaml", TRAFFIC_SERVICE.format(cluster=cluster, address=address))


def replicas(fleet: Fleet):
    """{cluster: replicas} of the rendered Deployment, as on disk now."""
    out = {}
    for d in sorted((fleet.root / "rendered").glob("*/shop/Deployment.web.yaml")):
        try:
            out[d.parts[-3]] = load(d)["spec"]["replicas"]
        except FileNotFoundError:
            pass  # removed between the listing and the read: not rendered any more
    return out


@pytest.fixture
def weighted(example):
    render_paths(example)
    with_traffic(example)
    example.write("hub/placement.yaml", WEIGHTED.format(w1=1, w2=2))
    web = (example.hub / "web.yaml").read_text().replace("replicas: 6", "replicas: 9")
    example.write("hub/web.yaml", web)
    return example


def rendered_once(fleet: Fleet, out: Path):
    """{cluster: replicas} of the Deployment as `meridian render` decides it from scratch."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    run("render", "--config", fleet.config, "--out", out, check=0)
    return {d.parts[-3]: load(d)["spec"]["replicas"] for d in sorted(out.glob("*/shop/Deployment.web.yaml"))}


def test_render_path_follows_weights_replicas_taints_failover_and_failback(weighted, tmp_path):
    fleet = weighted
    m = Meridian(fleet)
    eu = sorted(WEB_ADDRESS[c] for c in ("eu-1", "eu-2"))
    samples = []

    def settled(expected):
        # DNS sampled while serve moves the replicas: never an empty answer, never outside eu.
        samples.append(m.addresses("web.shop.global"))
        return replicas(fleet) == expected

    try:
        def want(expected, what, stateless=True):
            m.wait_for(lambda: settled(expected), timeout=15, what=what)
            if stateless:
                # What serve decided incrementally, round after round, is what one render decides.
                assert rendered_once(fleet, tmp_path / "render") == expected, what
        # Webster at 1:2 of 9 replicas.
        want({"eu-1": 3, "eu-2": 6}, "the first render")
        cm = fleet.root / "rendered/eu-1/shop/ConfigMap.web-config.yaml"
        assert cm.exists(), "the dependency is rendered with its workload"

        fleet.write("hub/placement.yaml", WEIGHTED.format(w1=2, w2=1))
        want({"eu-1": 6, "eu-2": 3}, "the weight change")

        web = (fleet.hub / "web.yaml").read_text().replace("replicas: 9", "replicas: 12")
        fleet.write("hub/web.yaml", web)
        want({"eu-1": 8, "eu-2": 4}, "the replica change")

        members = (fleet.hub / "members.yaml").read_text()
        tainted = members.replace(
            "  source: {directory: {path: ../clusters/eu-2",
            "  taints: [{key: maintenance, effect: NoSchedule}]\n  source: {directory: {path: ../clusters/eu-2",
        )
        fleet.write("hub/members.yaml", tainted)
        want({"eu-1": 12}, "the NoSchedule taint on eu-2")
        assert not (fleet.root / "rendered/eu-2/shop").exists(), "eu-2's rendered objects are removed"
        # Traffic follows the workload: eu-2 runs none of it, so it answers after eu-1 only.
        m.wait_for(lambda: m.addresses("web.shop.global") == [WEB_ADDRESS["eu-1"]], what="DNS after the move")
        fleet.write("hub/members.yaml", members)
        want({"eu-1": 8, "eu-2": 4}, "the taint removed")

        # A taint on us-1, outside the tier used: nothing moves, and why us-1 is left out
        # follows the taint — decided again for the first key, only patched for the second.
        def us1_reason():
            placements = json.loads(m.http("/debug/placements")[1])
            web = [d for d in placements["decisions"] if d["template"]["kind"] == "Deployment"][0]
            return {e["cluster"]: e["reason"] for e in web["excluded"]}.get("us-1")

        for key in ("maintenance", "upgrade"):
            fleet.write("hub/members.yaml", members.replace(
                "  source: {directory: {path: ../clusters/us-1",
                "  taints: [{key: " + key + ", effect: NoSchedule}]\n"
                "  source: {directory: {path: ../clusters/us-1"))
            m.wait_for(lambda: us1_reason() == {"reason": "NoScheduleTaint", "detail": key},
                       timeout=15, what=f"us-1 left out for the taint {key}")
            want({"eu-1": 8, "eu-2": 4}, f"the taint {key} on us-1")
        fleet.write("hub/members.yaml", members)
        m.wait_for(lambda: us1_reason() == {"reason": "LaterTier", "detail": "us"}, timeout=15,
                   what="us-1 in a later tier again")
        bad = [s for s in samples if not s or not set(s) <= set(eu)]
        assert not bad, f"{len(bad)} of {len(samples)} DNS samples empty or outside eu: {bad[:5]}"

        # eu-2's directory goes: Unreachable after 2 s, failed over 2 s later; total kept.
        # (Failover and failback depend on serve's clocks: render, deciding once, has none.)
        shutil.move(fleet.cluster_dir("eu-2"), fleet.root / "eu-2.away")
        want({"eu-1": 12}, "the failover", stateless=False)
        # Restored: healthy again, and failback waits 3 s of health.
        shutil.move(fleet.root / "eu-2.away", fleet.cluster_dir("eu-2"))
        back = time.time()
        want({"eu-1": 8, "eu-2": 4}, "the failback", stateless=False)
        waited = time.time() - back
        assert waited >= 3, f"failback came after {waited:.1f}s, before the 3 s window"
        placements = json.loads(m.http("/debug/placements")[1])
        web = [d for d in placements["decisions"] if d["template"]["kind"] == "Deployment"][0]
        assert web["tier"] == "eu" and web["outcome"]["result"] == "scheduled"
        metrics = m.http("/metrics")[1]
        assert 'meridian_placements{result="scheduled"} 3' in metrics, metrics
        assert 'meridian_placed_replicas{cluster="eu-1"} 8' in metrics
        assert "meridian_placement_decision_seconds_count" in metrics
    finally:
        m.stop()


def test_explain_shows_the_placement_beside_the_traffic_of_the_same_policy(weighted):
    m = Meridian(weighted)
    try:
        m.wait_for(lambda: replicas(weighted) == {"eu-1": 3, "eu-2": 6}, what="the first render")
        p = run("explain", "Deployment/web", "-n", "shop", "--admin", f"127.0.0.1:{m.admin_port}", check=0)
        words = p.stdout
        assert "apps/v1/Deployment/shop/web: placed by ClusterSchedulingPolicy shop/web, tier \"eu\"" in words, words
        assert "placed: eu-1 — 3 replica(s) (static weight 1)" in words, words
        assert "placed: eu-2 — 6 replica(s) (static weight 2)" in words, words
        assert "excluded: us-1 — in a later tier (\"us\")" in words, words
        assert "traffic of Service shop/web (the same policy):" in words, words
        assert "affinity \"eu\"" in words and "eu-1 weight" in words, words
        j = json.loads(run("explain", "Deployment/web", "-n", "shop", "--json",
                           "--admin", f"127.0.0.1:{m.admin_port}", check=0).stdout)
        assert [p["cluster"] for p in j["placement"]["placed"]] == ["eu-1", "eu-2"]
        assert j["traffic"][0]["service"] == "shop/web"
        # As kubectl spells it, the same explanation.
        for spelled in ("deployment/web", "deploy/web", "deployments.apps/web"):
            assert run("explain", spelled, "-n", "shop", "--admin", f"127.0.0.1:{m.admin_port}",
                       check=0).stdout == words, spelled
        # An unknown template is a clear error, not an empty answer.
        p = run("explain", "Deployment/nope", "-n", "shop", "--admin", f"127.0.0.1:{m.admin_port}")
        assert p.returncode != 0 and "no resource template Deployment shop/nope" in p.stderr, p.stderr
    finally:
        m.stop()


STANDBY = """apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: web, namespace: shop}
spec:
  resourceSelectors:
    - {apiVersion: apps/v1, kind: Deployment, name: web}
    - {kind: Service, name: web}
  placement:
    clusterAffinities:
      - {name: eu, labelSelector: {matchLabels: {topology.kubernetes.io/region: eu}}}
      - {name: us, labelSelector: {matchLabels: {topology.kubernetes.io/region: us}}}
    replicaScheduling:
      type: Divided
      weights: [{clusterNames: [eu-1, eu-2, us-1], weight: 1}]
      standby: {replicas: 1}
    failover: {afterSeconds: 2}
"""


def test_active_standby_moves_replicas_and_traffic_together(example):
    require_tool("dig")
    render_paths(example)
    with_traffic(example)
    example.write("hub/placement.yaml", STANDBY)
    m = Meridian(example)
    try:
        m.wait_for(lambda: replicas(example) == {"eu-1": 3, "eu-2": 3, "us-1": 1}, what="the standby replica")

        def dig():
            out = subprocess.run(
                ["dig", "+short", "+norecurse", "-p", str(m.dns_port), "@127.0.0.1", "web.shop.global", "A"],
                capture_output=True, text=True, timeout=10).stdout
            return sorted(out.split())

        # Traffic goes to the running tier only, though the standby has a ready endpoint.
        assert dig() == sorted([WEB_ADDRESS["eu-1"], WEB_ADDRESS["eu-2"]])
        for c in ("eu-1", "eu-2"):
            shutil.move(example.cluster_dir(c), example.root / f"{c}.away")
        m.wait_for(lambda: replicas(example) == {"us-1": 6}, timeout=15, what="the standby taking over")
        # The same policy's traffic half: withdrawn with the failover, the standby answers.
        m.wait_for(lambda: dig() == [WEB_ADDRESS["us-1"]], timeout=10, what="traffic to the standby")
        p = run("explain", "Deployment/web", "-n", "shop", "--admin", f"127.0.0.1:{m.admin_port}", check=0)
        assert 'tier "us"' in p.stdout and "failed over" in p.stdout, p.stdout
    finally:
        m.stop()


ROLLOUT = """
    rollout:
      drainSeconds: 20
      stages:
        - {name: canary, clusterNames: [eu-1], waitSeconds: 60}
        - {name: rest, maxUnavailablePercent: 100, approval: Required}
"""


def test_simulate_rollout_prints_each_stage_its_drains_and_the_traffic_shares_meanwhile(example):
    """`simulate --rollout shop/web` on the federation example with traffic: the canary eu-1
    drained sends every region to eu-2, the rest (eu-2, approval required) back to eu-1; a
    stage that would drain every cluster with traffic names the clients left without one. The live
    server says the rollout is planned, not applied; bad stages are refused by validate."""
    with_traffic(example)
    policy = (example.hub / "placement.yaml").read_text()
    policy = policy.replace("    failbackAfterSeconds: 300\n", "    failbackAfterSeconds: 300" + ROLLOUT)
    example.write("hub/placement.yaml", policy)
    m = Meridian(example)
    try:
        admin = ("--admin", f"127.0.0.1:{m.admin_port}")
        m.wait_for(lambda: '"shop/web"' in m.http("/debug/services")[1], what="shop/web served")
        words = run("simulate", "--rollout", "shop/web", *admin, check=0).stdout.splitlines()
        assert words[0] == ("rollout of shop/web: 2 stage(s); traffic Drain (20 s before a stage's copies change; "
                            "back at once once ready); shares over shop/web"), words
        assert words[1] == "before: eu → eu-1 50%, eu-2 50%; us → eu-1 50%, eu-2 50%", words
        assert words[2:6] == [
            'stage 1 "canary": eu-1; drains eu-1; waits 60 s once ready',
            "  eu → eu-2 100%; us → eu-2 100%",
            'stage 2 "rest": eu-2; approval required; drains eu-2',
            "  eu → eu-1 100%; us → eu-1 100%",
        ], words
        assert len(words) == 6, words
        plan = json.loads(run("simulate", "--rollout", "shop/web", "--json", *admin, check=0).stdout)
        assert [(s["stage"], s["drained"], s["stranded"]) for s in plan["steps"]] == [
            ("canary", ["eu-1"], []), ("rest", ["eu-2"], [])], plan
        warnings = json.loads(m.http("/debug/problems")[1])["warnings"]
        assert any("templates read from files carry none: an edit reaches every member at once here"
                   in w["reason"] and "meridian simulate --rollout shop/web" in w["reason"]
                   for w in warnings), warnings

        # One stage of both placed clusters: every client goes to us-1, which exports web
        # too; once us-1 stops exporting it, every client would be left with nothing, and
        # the plan names where it would pause.
        example.write("hub/placement.yaml", policy.replace(
            "        - {name: canary, clusterNames: [eu-1], waitSeconds: 60}\n", "").replace(
            "{name: rest, maxUnavailablePercent: 100, approval: Required}", "{name: all, clusterNames: [eu-1, eu-2]}"))
        m.wait_for(lambda: '"all"' in run("simulate", "--rollout", "shop/web", "--json", *admin).stdout,
                   what="the one-stage plan")
        (step,) = json.loads(run("simulate", "--rollout", "shop/web", "--json", *admin, check=0).stdout)["steps"]
        assert step["drained"] == ["eu-1", "eu-2"] and step["stranded"] == [] and step["shares"] == [
            {"region": r, "cluster": "us-1", "percent": 100.0} for r in ("eu", "us")], step
        (example.cluster_dir("us-1") / "web.yaml").unlink()
        m.wait_for(lambda: "would pause" in run("simulate", "--rollout", "shop/web", *admin).stdout,
                   what="the plan without us-1's web")
        words = run("simulate", "--rollout", "shop/web", *admin, check=0).stdout.splitlines()
        assert words[-4:] == ["  no traffic"] + [
            f"  would pause: clients in {c} of shop/web would have no cluster left with traffic"
            for c in ("eu-1", "eu-2", "us-1")], words

        for args, says in ((["--rollout", "shop/nope"], 'no ClusterSchedulingPolicy "shop/nope"'),
                           (["--rollout", "shop/web", "--assume", "eu-1=Unreachable"], "cannot be used with")):
            p = run("simulate", *args, *admin)
            assert p.returncode != 0 and says in p.stderr, (args, p.stderr)
        assert m.addresses("web.shop.global"), "DNS serves throughout"
    finally:
        m.stop()

    # validate refuses a stage of the rest that is not last, and a stage of nothing.
    example.write("hub/placement.yaml", policy.replace(
        "{name: canary, clusterNames: [eu-1], waitSeconds: 60}", "{name: canary, maxUnavailableClusters: 1}").replace(
        "{name: rest, maxUnavailablePercent: 100, approval: Required}", "{name: rest}"))
    p = run("validate", "--config", example.config, check=1)
    assert ("placement.rollout.stages[0]: a stage of the rest (maxUnavailable…) takes every cluster left, "
            "so it must be the last") in p.stdout, p.stdout
    assert ("placement.rollout.stages[1]: exactly one of clusterNames/labelSelector, tier, maxUnavailableClusters "
            "(at least 1) or maxUnavailablePercent (1 to 100)") in p.stdout, p.stdout
