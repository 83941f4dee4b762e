"""The fleet the xDS tests run against: the quickstart plus a gRPC `greeter` service.

The quickstart has eu-1 and eu-2 (region eu, network n1) and us-1 (region us, network n2,
behind an east-west gateway). The tests add:

- a fourth cluster, ap-1 (region ap, zone ap-1a, network n1). us-1 stays on n2 as in the
  quickstart: a proxyless gRPC client has no gateway to cross networks, so a client in eu-1
  must never be handed us-1's endpoints, and the tests check exactly that. ap-1 gives an eu-1
  client a cross-region tier it *can* reach, so failover past its own region is tested too.
- service `greeter` in namespace `demo` (port 50051, name grpc, appProtocol grpc), exported
  from every cluster, its EndpointSlice (a file of its own, so a test can rewrite the slice
  alone) listing that cluster's greeter servers, all ready.

Greeter servers (greeter.py) listen on those addresses and reply "<cluster> <ip>:<port>".
"""

NAMESPACE = "demo"
PORT = 50051

NETWORKS = {"eu-1": "n1", "eu-2": "n1", "us-1": "n2", "ap-1": "n1"}
ZONES = {"eu-1": "eu-1a", "eu-2": "eu-2a", "us-1": "us-1a", "ap-1": "ap-1a"}

# service -> cluster -> addresses of its servers
SERVERS = {
    "greeter": {
        "eu-1": ["127.1.1.21", "127.1.1.22"],
        "eu-2": ["127.1.2.21"],
        "us-1": ["127.1.3.21"],
        "ap-1": ["127.1.4.21"],
    },
    # Added on disk by the tests while clients run.
    "greeter2": {"eu-1": ["127.1.1.31"]},
    "greeter3": {"eu-2": ["127.1.2.31"]},
}


def target(service="greeter"):
    return f"xds:///{service}.{NAMESPACE}.global:{PORT}"


def resource_name(service="greeter"):
    """The name of the LDS/RDS/CDS/EDS resources of a service port."""
    return f"{service}.{NAMESPACE}.global:{PORT}"


def replies(cluster, service="greeter"):
    """What the servers of `service` in `cluster` answer."""
    return [f"{cluster} {ip}:{PORT}" for ip in SERVERS[service][cluster]]


def all_servers():
    """(label, "ip:port") of every greeter server the tests run, whatever the service."""
    return [
        (cluster, f"{ip}:{PORT}")
        for clusters in SERVERS.values()
        for cluster, ips in clusters.items()
        for ip in ips
    ]


AP1_MEMBER = """---
apiVersion: meridian.io/v1alpha1
kind: MemberCluster
metadata:
  name: ap-1
  labels: {topology.kubernetes.io/region: ap, topology.kubernetes.io/zone: ap-1a}
spec:
  source: {directory: {path: ../clusters/ap-1}}
  network: {name: n1, dnsClientCIDRs: [127.0.4.0/24]}
"""


def service_yaml(service="greeter"):
    return (
        "apiVersion: v1\nkind: Service\n"
        f"metadata: {{name: {service}, namespace: {NAMESPACE}}}\n"
        f"spec: {{ports: [{{name: grpc, port: {PORT}, protocol: TCP, appProtocol: grpc}}]}}\n"
        "---\n"
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\n"
        f"metadata: {{name: {service}, namespace: {NAMESPACE}}}\n"
    )


def slice_yaml(cluster, service="greeter", addresses=None, ready=True):
    """The EndpointSlice of `service` in `cluster`: its servers (or `addresses`), all ready
    or all not ready (not serving either); an empty list gives a slice with no endpoints."""
    addresses = SERVERS[service][cluster] if addresses is None else addresses
    lines = [
        "apiVersion: discovery.k8s.io/v1",
        "kind: EndpointSlice",
        f"metadata: {{name: {service}-{cluster}, namespace: {NAMESPACE}, labels: {{kubernetes.io/service-name: {service}}}}}",
        "addressType: IPv4",
        f"ports: [{{name: grpc, port: {PORT}, protocol: TCP, appProtocol: grpc}}]",
    ]
    if not addresses:
        lines.append("endpoints: []")
    else:
        lines.append("endpoints:")
        conditions = "{ready: true}" if ready else "{ready: false, serving: false, terminating: false}"
        for ip in addresses:
            lines.append(f"  - {{addresses: [\"{ip}\"], conditions: {conditions}, zone: {ZONES[cluster]}}}")
    return "\n".join(lines) + "\n"


def add_service(fleet, service, clusters=None):
    """Writes `service` (Service + ServiceExport, then its EndpointSlice) into each cluster."""
    for cluster in clusters or SERVERS[service]:
        fleet.write(f"clusters/{cluster}/{service}.yaml", service_yaml(service))
        fleet.write(f"clusters/{cluster}/{service}-slice.yaml", slice_yaml(cluster, service))


def remove_service(fleet, service, clusters=None):
    for cluster in clusters or SERVERS[service]:
        for name in (f"{service}.yaml", f"{service}-slice.yaml"):
            (fleet.cluster_dir(cluster) / name).unlink()


def set_endpoints(fleet, cluster, service="greeter", addresses=None, ready=True):
    """Rewrites the EndpointSlice of `service` in `cluster` (atomically, by rename)."""
    fleet.write(f"clusters/{cluster}/{service}-slice.yaml", slice_yaml(cluster, service, addresses, ready))


def prepare(fleet):
    """Turns a copy of the quickstart into the xDS test fleet."""
    members = fleet.hub / "members.yaml"
    fleet.write("hub/members.yaml", members.read_text().rstrip("\n") + "\n" + AP1_MEMBER)
    add_service(fleet, "greeter")
    return fleet
