#!/usr/bin/env python3
"""The DNS benchmarks' fleet (bench/dns.sh, bench/dns-churn.sh).

  dns_fleet.py WORK N_SERVICES CHURNED NX_PERCENT QUERY_LINES [CG_QUERIES MIX_A MIX_B]

N services in namespace `bench`, each exported from three directory members (c1, c2, c3) with
one endpoint per cluster, and a hub of MemberClusters whose DNS clients live in 100.64.i.0/24
(nobody claims 127.0.0.1, so every answer holds all three addresses). Writes:
  - WORK/fleet/hub/members.yaml and WORK/fleet/clusters/<c>/services.yaml; the c1 documents of
    services s0..s{CHURNED-1} go to files of their own, c1/churn-s<i>.yaml (bench/dns_churn.py
    rewrites them);
  - WORK/global.zone: Knot's `global.` zone with the same three A records per name, and
    meridian's SOA timers and TTL;
  - WORK/queries.txt: QUERY_LINES queries, names uniform over the services, NX_PERCENT % names
    that do not exist, type A;
  - with CG_QUERIES, the callgrind query files of bench/dns.sh: cg-cold.txt (every distinct
    name of queries.txt once), cg-fill.txt (twice more), cg-warm.txt (CG_QUERIES queries drawn
    like queries.txt), cg-mix-a.txt and cg-mix-b.txt (MIX_A, then MIX_B more, drawn the same
    way: the cold mix), and WORK/distinct (their count).
"""

import os
import random
import sys

CLUSTERS = [("c1", "eu", "eu-1a"), ("c2", "eu", "eu-2a"), ("c3", "us", "us-1a")]
ZONE = "global"
NS = "bench"


def addr(c, s):
    """The address of service s's endpoint in cluster c (1-based)."""
    return f"10.{c}.{s // 250}.{s % 250 + 1}"


def service_docs(s, cluster, zone, address):
    return (
        f"---\n{{apiVersion: v1, kind: Service, metadata: {{name: s{s}, namespace: {NS}}}, spec: {{ports: [{{name: http, port: 80, protocol: TCP}}]}}}}\n"
        f"---\n{{apiVersion: multicluster.x-k8s.io/v1alpha1, kind: ServiceExport, metadata: {{name: s{s}, namespace: {NS}}}}}\n"
        f"---\n{{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {{name: s{s}-{cluster}, namespace: {NS}, labels: {{kubernetes.io/service-name: s{s}}}}}, "
        f"addressType: IPv4, ports: [{{name: http, port: 80, protocol: TCP}}], endpoints: [{{addresses: [{address}], conditions: {{ready: true}}, zone: {zone}}}]}}\n"
    )


def churn_file(c1_dir, s):
    return os.path.join(c1_dir, f"churn-s{s}.yaml")


def write_churn_file(c1_dir, s, address):
    """Service s's c1 documents, written atomically (temporary file + rename)."""
    path = churn_file(c1_dir, s)
    tmp = os.path.join(c1_dir, f".churn-s{s}.yaml.tmp")
    with open(tmp, "w") as f:
        f.write(service_docs(s, CLUSTERS[0][0], CLUSTERS[0][2], address))
    os.replace(tmp, path)


def write_members(work):
    os.makedirs(f"{work}/fleet/hub")
    with open(f"{work}/fleet/hub/members.yaml", "w") as f:
        for i, (name, region, zone) in enumerate(CLUSTERS, 1):
            f.write(f"""---
apiVersion: meridian.io/v1alpha1
kind: MemberCluster
metadata: {{name: {name}, labels: {{topology.kubernetes.io/region: {region}, topology.kubernetes.io/zone: {zone}}}}}
spec:
  source: {{directory: {{path: ../clusters/{name}}}}}
  network: {{name: n1, dnsClientCIDRs: [100.64.{i}.0/24]}}
""")


def write_clusters(work, n, churned):
    for c, (name, _, zone) in enumerate(CLUSTERS, 1):
        d = f"{work}/fleet/clusters/{name}"
        os.makedirs(d)
        with open(f"{d}/services.yaml", "w") as f:
            for s in range(n):
                if c == 1 and s < churned:
                    continue
                f.write(service_docs(s, name, zone, addr(c, s)))
        if c == 1:
            for s in range(churned):
                write_churn_file(d, s, addr(c, s))


def write_zone(work, n):
    with open(f"{work}/global.zone", "w") as f:
        # meridian's SOA timers and TTL (ttl 5; refresh 60, retry 10, expire 3600, minimum = ttl).
        f.write("$ORIGIN global.\n$TTL 5\n@ SOA ns.global. hostmaster.global. 1 60 10 3600 5\n@ NS ns.global.\nns A 127.0.0.1\n")
        for s in range(n):
            for c in range(1, len(CLUSTERS) + 1):
                f.write(f"s{s}.bench A {addr(c, s)}\n")


def write_queries(work, n, nx_pct, lines, cg, mix):
    rng = random.Random(42)

    def query():
        if rng.randrange(100) < nx_pct:
            return f"x{rng.randrange(n)}.bench.global A\n"
        return f"s{rng.randrange(n)}.bench.global A\n"

    with open(f"{work}/queries.txt", "w") as f:
        f.writelines(query() for _ in range(lines))
    if cg is None:
        return
    with open(f"{work}/queries.txt") as f:
        distinct = sorted(set(f))
    with open(f"{work}/cg-cold.txt", "w") as f:
        f.writelines(distinct)
    # Two more passes: meridian caches one encoded variant per rotation of a 3-address answer.
    with open(f"{work}/cg-fill.txt", "w") as f:
        f.writelines(distinct + distinct)
    with open(f"{work}/cg-warm.txt", "w") as f:
        f.writelines(query() for _ in range(cg))
    for part, count in zip(("a", "b"), mix):
        with open(f"{work}/cg-mix-{part}.txt", "w") as f:
            f.writelines(query() for _ in range(count))
    with open(f"{work}/distinct", "w") as f:
        print(len(distinct), file=f)


def fleet(work, n, churned, nx_pct, lines, cg=None, mix=(0, 0)):
    write_members(work)
    write_clusters(work, n, churned)
    write_zone(work, n)
    write_queries(work, n, nx_pct, lines, cg, mix)


def main():
    if len(sys.argv) not in (6, 9):
        sys.exit(__doc__)
    work, n, churned, nx, lines = sys.argv[1], *map(int, sys.argv[2:6])
    cg, mix = None, (0, 0)
    if len(sys.argv) == 9:
        cg, mix = int(sys.argv[6]), (int(sys.argv[7]), int(sys.argv[8]))
    if not 0 <= churned <= n:
        sys.exit(f"CHURNED must be 0..{n}")
    fleet(work, n, churned, nx, lines, cg, mix)


if __name__ == "__main__":
    main()
