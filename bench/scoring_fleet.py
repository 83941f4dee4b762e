"""Writes a scoring benchmark fleet: CLUSTERS directory members in three regions, each with a
Node manifest (its capacity), a `spec.cost` for all but every tenth (missing data is part of
the work), and TEMPLATES Deployments placed by one ClusterSchedulingPolicy whose placement is
the same in every variant except how it scores:

    python3 bench/scoring_fleet.py DIR CLUSTERS TEMPLATES VARIANT [WEBHOOK_URL]

VARIANT: none (no scoring: the reference), builtin (every built-in plugin weighed), lua (a Lua
score by cost and a Lua filter), webhook (a scoring webhook at WEBHOOK_URL).
"""

import sys
from pathlib import Path

root, clusters, templates, variant = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
url = sys.argv[5] if len(sys.argv) > 5 else None
REGIONS = ["eu", "us", "ap"]
names = [f"{REGIONS[i % 3]}-{i:03d}" for i in range(clusters)]
hub = root / "hub"
hub.mkdir(parents=True, exist_ok=True)

members = []
for i, name in enumerate(names):
    region = name.split("-")[0]
    cost = "" if i % 10 == 9 else (
        f"  cost: {{cpuCoreHour: {0.02 + 0.001 * (i % 23):.3f}, memoryGiBHour: 0.004, egressGiB: 0.05, "
        f"spotRatio: {(i % 5) / 10:.1f}}}\n")
    members.append(
        f"apiVersion: meridian.io/v1alpha1\nkind: MemberCluster\nmetadata:\n  name: {name}\n"
        f"  labels: {{topology.kubernetes.io/region: {region}, topology.kubernetes.io/zone: {name}a, "
        f"tier: {'gold' if i % 4 == 0 else 'std'}}}\n"
        f"spec:\n  source: {{directory: {{path: ../clusters/{name}}}}}\n{cost}")
    d = root / "clusters" / name
    d.mkdir(parents=True, exist_ok=True)
    cpu = 200 + 40 * (i % 17)
    (d / "nodes.yaml").write_text(
        f"apiVersion: v1\nkind: Node\nmetadata: {{name: {name}-n}}\n"
        f"status: {{allocatable: {{cpu: \"{cpu}\", memory: {cpu * 4}Gi, pods: \"20000\"}}}}\n")
(hub / "members.yaml").write_text("---\n".join(members))

SCORING = {
    "none": "",
    "builtin": """    scoring:
      - {plugin: ResourceBalance, weight: 1}
      - {plugin: Cost, weight: 2}
      - {plugin: DataLocality, weight: 1}
      - {plugin: ClusterAffinity, weight: 1}
      - {plugin: TaintToleration, weight: 1}
      - {plugin: WorkloadAffinity, weight: 1}
    dataLocality: {fromAnnotation: meridian.io/data-location}
    preferredClusterAffinities: [{labelSelector: {matchLabels: {tier: gold}}, weight: 3}]
    workloadAntiAffinity: [{labelSelector: {matchLabels: {group: g0}}, topology: zone, weight: 2}]
""",
    "lua": """    script:
      lua: |
        function filter(cluster, workload)
          return cluster.health ~= "Unreachable", "unreachable"
        end
        function score(cluster, workload)
          local c = cluster.cost
          if c == nil then return 50 end
          local price = c.cpu_core_hour * (1 - 0.7 * c.spot_ratio)
          return math.max(0, math.min(100, 100 - price * 2000))
        end
""",
    "webhook": f"""    webhooks: [{{url: "{url}", timeoutMillis: 5000, failurePolicy: Fail}}]
""",
}[variant]

(hub / "policy.yaml").write_text(
    "apiVersion: meridian.io/v1alpha1\nkind: ClusterSchedulingPolicy\n"
    "metadata: {name: scored, namespace: bench}\n"
    "spec:\n  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment}]\n"
    "  placement:\n"
    "    replicaScheduling: {type: Divided, divisionPreference: Aggregated}\n"
    "    spreadConstraints: [{spreadByField: region, maxGroups: 2}]\n" + SCORING)


def deployment(i):
    return (f"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-{i}\n  namespace: bench\n"
            f"  labels: {{group: g{i % 7}}}\n"
            f"  annotations: {{meridian.io/data-location: \"{names[i % len(names)]}\", meridian.io/egress-gib-hour: \"0.5\"}}\n"
            f"spec:\n  replicas: {3 + i % 20}\n  selector: {{matchLabels: {{app: app-{i}}}}}\n"
            f"  template:\n    metadata: {{labels: {{app: app-{i}}}}}\n    spec:\n"
            f"      containers: [{{name: app, image: example.com/app:{i}, resources: {{requests: {{cpu: 100m, memory: 128Mi}}}}}}]\n")


(hub / "apps.yaml").write_text("---\n".join(deployment(i) for i in range(templates)))
