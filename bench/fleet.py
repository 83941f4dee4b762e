"""Writes the large benchmark fleet that bench/memory.sh describes (255 clusters in 5 regions,
groups of three, ~10 endpoints per service and cluster) as a directory hub, up to 4,096
clusters of up to 4,093 endpoints each (cluster c's pods are the /20 10.0.0.0/8 holds at c):

    python3 bench/fleet.py WORK CLUSTERS ENDPOINTS PER_SERVICE

WORK/fleet/{meridian.yaml,hub/,clusters/cNNN/services.yaml}, WORK/empty/ (the same config with
no members), WORK/names.txt (every service name, dnsperf format) and WORK/nnames.
Shared by bench/memory.sh and bench/change.sh.
"""
import os, sys
work, nc, total, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
REGIONS = 5
NAMESPACES = 10
os.makedirs(f"{work}/fleet/hub")
os.makedirs(f"{work}/empty/hub")
for d in ("fleet", "empty"):
    with open(f"{work}/{d}/meridian.yaml", "w") as f:
        f.write("hub: {directory: hub}\ndns:\n  zones: [{name: global, style: global}]\n  ttl: 5\n")
# Cluster c (0-based) is in region c % 5 and in group c // 3 ... but a group must span three
# regions: group g = clusters 3g, 3g+1, 3g+2, whose regions are (3g + k) % 5, all different.
base, extra = divmod(total, nc)                   # the first `extra` clusters hold one more
groups = (nc + 2) // 3
# Endpoints per cluster, then services per group sized by the group's largest cluster.
counts = [base + (1 if c < extra else 0) for c in range(nc)]
assert nc <= 4096 and counts[0] <= 4093, "a cluster's pods are a /20"


def pod(c, i):
    """Address `i` of cluster c's /20 (0 is the network's own)."""
    return f"10.{c >> 4}.{((c & 15) << 4) + (i >> 8)}.{i & 255}"


def client_cidr(c):
    """The loopback /24 a DNS client of cluster c sends from (127.1.c.0/24 below 256)."""
    return f"127.{1 + (c >> 8)}.{c & 255}.0/24"


names = set()
with open(f"{work}/fleet/hub/members.yaml", "w") as hub:
    for c in range(nc):
        region = c % REGIONS
        hub.write(
            f"---\n{{apiVersion: meridian.io/v1alpha1, kind: MemberCluster, metadata: {{name: c{c:03d}, labels: "
            f"{{topology.kubernetes.io/region: r{region}, topology.kubernetes.io/zone: r{region}-c{c:03d}}}}}, "
            f"spec: {{source: {{directory: {{path: ../clusters/c{c:03d}}}}}, network: {{name: net-r{region}, "
            f"podCIDRs: [{pod(c, 0)}/20], dnsClientCIDRs: [{pod(c, 0)}/20, {client_cidr(c)}]}}, "
            f"gateway: {{address: {pod(c, 4094)}, port: 15443}}}}}}\n"
        )
for c in range(nc):
    g = c // 3
    region = c % REGIONS
    zone = f"r{region}-c{c:03d}"
    d = f"{work}/fleet/clusters/c{c:03d}"
    os.makedirs(d)
    left = counts[c]
    s = 0
    ip = 0
    out = []
    while left > 0:
        n = min(per, left)
        ns = f"team{g:02d}-{s % NAMESPACES}"
        svc = f"svc{s:03d}"
        names.add(f"{svc}.{ns}.global")
        eps = ", ".join(
            f"{{addresses: [{pod(c, ip + i + 1)}], conditions: {{ready: true}}, zone: {zone}}}"
            for i in range(n)
        )
        out.append(
            f"---\n{{apiVersion: v1, kind: Service, metadata: {{name: {svc}, namespace: {ns}}}, spec: {{ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}}}\n"
            f"---\n{{apiVersion: multicluster.x-k8s.io/v1alpha1, kind: ServiceExport, metadata: {{name: {svc}, namespace: {ns}}}}}\n"
            f"---\n{{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {{name: {svc}-x{c:03d}, namespace: {ns}, "
            f"labels: {{kubernetes.io/service-name: {svc}}}}}, addressType: IPv4, ports: [{{name: http, port: 8080, protocol: TCP}}], endpoints: [{eps}]}}\n"
        )
        ip += n
        left -= n
        s += 1
    with open(f"{d}/services.yaml", "w") as f:
        f.write("".join(out))
with open(f"{work}/names.txt", "w") as f:
    f.writelines(f"{n} A\n" for n in sorted(names))
print(len(names), file=open(f"{work}/nnames", "w"))