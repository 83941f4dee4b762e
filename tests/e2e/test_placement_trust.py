"""Placement a user can trust (issue 36), end to end against the release binary on
examples/federation: `serve` edited 6 → 7 → 8 → 6 replicas never puts more on a member than
its Nodes hold and, at every step, renders what a fresh `meridian render` of the same files
renders; the Service follows its Deployment; `render` keeps what it rendered for a template
that is unschedulable now; and the mistakes that were silent (a member directory that does
not exist, a policy naming a cluster that is not a member, a service its policy leaves with
no cluster for traffic) are reported.
"""

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from conftest import QUICKSTART, ROOT, Fleet, Meridian
from test_placement import render_paths, run

EXAMPLE = ROOT / "examples" / "federation"
# Each member's Nodes (examples/federation/clusters/*/nodes.yaml), in millicores.
ALLOCATABLE_MILLI = {"eu-1": 2000, "eu-2": 1000, "us-1": 8000}
REPLICA_MILLI = 500  # the Deployment's request


def tree(root: Path):
    """{relative path: text} of every file under root."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def deployment_split(files: dict):
    """{cluster: replicas} of the Deployment in a tree laid out <cluster>/shop/Kind.name.yaml."""
    return {
        path.split("/")[0]: yaml.safe_load(text)["spec"]["replicas"]
        for path, text in files.items()
        if path.endswith("shop/Deployment.web.yaml")
    }


def set_replicas(fleet: Fleet, n: int):
    text = (fleet.hub / "web.yaml").read_text()
    lines = [f"  replicas: {n}" if line.startswith("  replicas: ") else line for line in text.splitlines()]
    fleet.write("hub/web.yaml", "\n".join(lines) + "\n")


@pytest.fixture
def federation(tmp_path):
    root = tmp_path / "federation"
    shutil.copytree(EXAMPLE, root)
    fleet = Fleet(root)
    # Each member renders into rendered/<name>; failback after 3 s instead of 300, so the
    # return to the EU is seen (the window is the one place serve may rightly differ).
    render_paths(fleet, short_health=False)
    policy = (fleet.hub / "placement.yaml").read_text().replace("failbackAfterSeconds: 300", "failbackAfterSeconds: 3")
    fleet.write("hub/placement.yaml", policy)
    return fleet


def serve_tree(fleet: Fleet):
    rendered = fleet.root / "rendered"
    return tree(rendered) if rendered.exists() else {}


def render_tree(fleet: Fleet, out: Path):
    if out.exists():
        shutil.rmtree(out)
    p = run("render", "--config", fleet.config, "--out", out)
    return p, (tree(out) if out.exists() else {})


def deployment_decision(m: Meridian):
    placements = json.loads(m.http("/debug/placements")[1])
    return next(d for d in placements["decisions"] if d["template"]["kind"] == "Deployment")


def test_serve_never_over_commits_and_renders_what_render_renders_at_every_edit(federation, tmp_path):
    fleet = federation
    out = tmp_path / "out"
    m = Meridian(fleet)
    try:
        # (replicas, the split render gives, seconds serve may take: the failback window)
        steps = [(6, {"eu-1": 4, "eu-2": 2}, 10), (7, {"us-1": 7}, 10), (8, {"us-1": 8}, 10),
                 (6, {"eu-1": 4, "eu-2": 2}, 15)]
        for replicas, split, within in steps:
            set_replicas(fleet, replicas)
            p, rendered = render_tree(fleet, out)
            assert p.returncode == 0, p.stderr
            assert deployment_split(rendered) == split, f"render at {replicas}: {deployment_split(rendered)}"
            # The Service and the ConfigMap are where the Deployment is, nowhere else.
            clusters = {path.split("/")[0] for path in rendered}
            assert clusters == set(split), f"render at {replicas}: {sorted(rendered)}"
            over = []

            def settled():
                served = serve_tree(fleet)
                for cluster, n in deployment_split(served).items():
                    if n * REPLICA_MILLI > ALLOCATABLE_MILLI[cluster]:
                        over.append((replicas, cluster, n))
                return served == rendered

            m.wait_for(settled, timeout=within, interval=0.1,
                       what=f"serve to render what render renders at {replicas} replicas")
            assert not over, f"serve over-committed a member (replicas, cluster, placed): {over}"
            d = deployment_decision(m)
            assert d["outcome"]["result"] == "scheduled", d
            placed = {p["cluster"]: p["replicas"] for p in d["placed"] if p.get("replicas")}
            assert placed == split, d
            for p in d["placed"]:
                assert p["replicas"] * REPLICA_MILLI <= ALLOCATABLE_MILLI[p["cluster"]], d
        # explain says the Service follows the Deployment.
        p = run("explain", "Service/web", "-n", "shop", "--admin", f"127.0.0.1:{m.admin_port}", check=0)
        assert "follows Deployment shop/web" in p.stdout, p.stdout
    finally:
        m.stop()


def test_render_keeps_what_it_rendered_for_a_template_unschedulable_now(federation, tmp_path):
    fleet = federation
    out = tmp_path / "out"
    out.mkdir()
    run("render", "--config", fleet.config, "--out", out, check=0)
    before = tree(out)
    assert deployment_split(before) == {"eu-1": 4, "eu-2": 2}
    set_replicas(fleet, 100)  # fits nowhere: 16 + 4 + 2 replicas of room
    p = run("render", "--config", fleet.config, "--out", out, check=1)
    assert "Deployment shop/web: unschedulable" in p.stderr, p.stderr
    assert "kept: apps/v1/Deployment/shop/web: as rendered before" in p.stderr, p.stderr
    assert "unschedulable now because" in p.stderr, p.stderr
    assert tree(out) == before, "nothing that runs is deleted"
    # Deleted from the hub: its files go (the Service, following nothing now, goes by its tiers).
    text = (fleet.hub / "web.yaml").read_text().split("---")
    fleet.write("hub/web.yaml", "---".join(d for d in text if "kind: Deployment" not in d))
    run("render", "--config", fleet.config, "--out", out, check=0)
    after = tree(out)
    assert not deployment_split(after), sorted(after)
    assert "eu-1/shop/Service.web.yaml" in after, sorted(after)


def test_a_member_directory_that_does_not_exist_is_reported_at_once(federation):
    fleet = federation
    shutil.move(fleet.cluster_dir("eu-2"), fleet.root / "eu-2.away")
    started = time.time()
    m = Meridian(fleet)
    try:
        def reported():
            problems = json.loads(m.http("/debug/problems")[1])["problems"]
            return [p for p in problems if p["cluster"] == "eu-2" and "never synced" in p["reason"]]

        found = m.wait_for(reported, timeout=5, what="the missing directory on /debug/problems")
        assert "is missing or unreadable" in found[0]["reason"], found
        assert time.time() - started < 5, "reported before unreachableAfterSeconds"
        status, body = m.http("/readyz")
        assert status == 200 and "not synced: eu-2" in body, (status, body)
        m.wait_for(lambda: "eu-2" in m.log.read_text() and "missing or unreadable" in m.log.read_text(),
                   timeout=5, what="a log line naming eu-2")
        shutil.move(fleet.root / "eu-2.away", fleet.cluster_dir("eu-2"))
        m.wait_for(lambda: not reported(), timeout=10, what="the problem to clear")
        assert m.http("/readyz")[1] == "ready\n"
    finally:
        m.stop()


def test_validate_names_a_policy_with_no_cluster_for_traffic_and_warns_of_unknown_clusters(tmp_path):
    root = tmp_path / "quickstart"
    shutil.copytree(QUICKSTART, root)
    fleet = Fleet(root)
    p = run("validate", "--config", fleet.config, check=0)
    assert "0 error(s), 0 warning(s)" in p.stdout, p.stdout
    # cart is exported by eu-2 alone; the policy gives eu-2 weight 0 and names ap-9.
    fleet.write("hub/cart.yaml", """apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: cart, namespace: shop}
spec:
  resourceSelectors: [{kind: Service, name: cart}]
  traffic:
    mode: Weighted
    weights: [{clusterNames: [eu-2], weight: 0}, {clusterNames: [ap-9], weight: 1}]
""")
    p = run("validate", "--config", fleet.config, check=1)
    lines = p.stdout.splitlines()
    assert any(l.startswith("error: ") and "Service shop/cart" in l and
               "every cluster exporting it (eu-2) has weight 0" in l for l in lines), p.stdout
    assert any(l.startswith("warning: ") and "ClusterSchedulingPolicy shop/cart" in l and
               "names cluster ap-9, which is not a member" in l for l in lines), p.stdout
    # The rest keeps answering in serve, and /debug/problems says the same.
    m = Meridian(fleet)
    try:
        body = json.loads(m.http("/debug/problems")[1])
        assert any("has weight 0" in p["reason"] for p in body["problems"]), body
        assert any("ap-9" in w["reason"] for w in body["warnings"]), body
        assert m.addresses("payments.shop.global"), "everything else is served"
    finally:
        m.stop()
