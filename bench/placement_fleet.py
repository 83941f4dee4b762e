"""Writes a placement benchmark fleet: CLUSTERS directory members in three regions (each with
one Node manifest: its capacity), three ClusterSchedulingPolicies (static weights over
"EU first" tiers; divided by available capacity; by capacity with a spread constraint) and
TEMPLATES Deployments, each selected by one of them (by label).

    python3 bench/placement_fleet.py DIR CLUSTERS TEMPLATES [RENDER_MEMBER]

RENDER_MEMBER, if given, is the one member that gets a renderPath (DIR/rendered).
The template app-0 is in a file of its own (hub/app-0.yaml), so an edit of it is small, and is
placed (Duplicated) in RENDER_MEMBER alone by a fourth policy.
"""

import sys
from pathlib import Path

root, clusters, templates = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
render_member = sys.argv[4] if len(sys.argv) > 4 else None
REGIONS = ["eu", "us", "ap"]
names = [f"{REGIONS[i % 3]}-{i:03d}" for i in range(clusters)]
hub = root / "hub"
hub.mkdir(parents=True, exist_ok=True)

members = []
for i, name in enumerate(names):
    region = name.split("-")[0]
    render = f", renderPath: ../rendered" if name == render_member else ""
    members.append(
        f"apiVersion: meridian.io/v1alpha1\nkind: MemberCluster\nmetadata:\n  name: {name}\n"
        f"  labels: {{topology.kubernetes.io/region: {region}, topology.kubernetes.io/zone: {name}a}}\n"
        f"spec:\n  source: {{directory: {{path: ../clusters/{name}{render}}}}}\n")
    d = root / "clusters" / name
    d.mkdir(parents=True, exist_ok=True)
    cpu = 200 + 40 * (i % 17)
    (d / "nodes.yaml").write_text(
        f"apiVersion: v1\nkind: Node\nmetadata: {{name: {name}-n}}\n"
        f"status: {{allocatable: {{cpu: \"{cpu}\", memory: {cpu * 4}Gi, pods: \"20000\"}}}}\n")
(hub / "members.yaml").write_text("---\n".join(members))

eu = [n for n in names if n.startswith("eu")]
TIERS = """    clusterAffinities:
      - {name: eu, labelSelector: {matchLabels: {topology.kubernetes.io/region: eu}}}
      - {name: rest, labelSelector: {matchExpressions: [{key: topology.kubernetes.io/region, operator: NotIn, values: [eu]}]}}
"""
EDIT_TIER = f"    clusterAffinities: [{{name: edit, clusterNames: [{render_member or names[0]}]}}]\n"
policies = {
    "p0": "    replicaScheduling:\n      type: Divided\n      weights: [{clusterNames: [%s], weight: 3}]\n" % ", ".join(eu[:10]),
    "p1": "    replicaScheduling: {type: Divided, divisionPreference: Weighted, dynamic: AvailableCapacity}\n",
    "p2": "    replicaScheduling: {type: Divided, divisionPreference: Weighted, dynamic: AvailableCapacity}\n"
          "    spreadConstraints: [{spreadByField: cluster, minGroups: 2, maxGroups: 20}]\n",
}
# app-0, the template the change benchmark edits, runs in the rendering member alone.
policies["edit"] = "    replicaScheduling: {type: Duplicated}\n"
docs = []
for i, (name, body) in enumerate(policies.items()):
    docs.append(
        f"apiVersion: meridian.io/v1alpha1\nkind: ClusterSchedulingPolicy\n"
        f"metadata: {{name: {name}, namespace: bench, creationTimestamp: \"2026-01-0{i + 1}T00:00:00Z\"}}\n"
        f"spec:\n  resourceSelectors: [{{apiVersion: apps/v1, kind: Deployment, labelSelector: {{matchLabels: {{policy: {name}}}}}}}]\n"
        f"  placement:\n{TIERS if name != 'edit' else EDIT_TIER}{body}")
(hub / "policies.yaml").write_text("---\n".join(docs))


def deployment(i, replicas):
    return (f"apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: app-{i}, namespace: bench, labels: {{policy: p{i % 3}}}}}\n"
            f"spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: app-{i}}}}}\n"
            f"  template:\n    metadata: {{labels: {{app: app-{i}}}}}\n    spec:\n"
            f"      containers: [{{name: app, image: example.com/app:{i}, resources: {{requests: {{cpu: 100m, memory: 128Mi}}}}}}]\n")


(hub / "app-0.yaml").write_text(deployment(0, 3).replace("policy: p0", "policy: edit"))
(hub / "apps.yaml").write_text("---\n".join(deployment(i, 3 + i % 20) for i in range(1, templates)))
