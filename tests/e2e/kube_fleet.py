"""A fleet of real Kubernetes control planes for the end-to-end tests: one hub and three
members (kube-apiserver + etcd each, tests/peers/kube_cluster.py), set up as meridian's
deploy/ manifests say, and `meridian serve` with the hub as a Kubernetes hub.

    hub   MemberClusters m1, m2, m3 (meridian.io CRDs), namespace meridian-system with
          the leader election Lease `meridian` and the Secret m3-kubeconfig
    m1    region eu, zone eu-a, DNS clients 127.0.1.0/24, kubeconfig by path
    m2    region eu, zone eu-b, DNS clients 127.0.2.0/24, kubeconfig by path
    m3    region us, zone us-a, DNS clients 127.0.3.0/24, kubeconfig in a hub Secret
          (spec.source.kubernetes.secretRef)

All on network net1, with short health timings (heartbeat 1 s, unreachable after 3 s,
withdrawn after 6 s). Every cluster gets every CRD in deploy/crds/ and a token user
`meridian` with the RBAC of deploy/rbac/ (hub.yaml on the hub, member.yaml on members):
meridian talks to all of them as that user, never as admin. Every cluster has namespace
`shop` (the members' Services; the hub's ClusterSchedulingPolicies for them).

Tests act on members as admin through the helpers (Services, EndpointSlices,
ServiceExports) and read what meridian writes back (ServiceImports, and the Services and
EndpointSlices labelled app.kubernetes.io/managed-by=meridian).

There is no controller manager: no EndpointSlices are made from Pods (tests write them),
no garbage collection (deleting a Service leaves its EndpointSlices unless the helper
deletes them too), a deleted Namespace never goes away (never delete one).

The fixtures (conftest.py): `kube_fleet_session` starts the clusters once per session (with
audit logs of ServiceImport, Deployment and ConfigMap writes only, SHARED_AUDIT_POLICY);
`kube_fleet` hands that fleet to a test after reset() put it back to the state above;
`kube_meridian` is meridian started on it. A test that needs other kube-apiserver flags
builds its own fleet: `with started(tmp_path / "kube", extra_apiserver_args=[...]) as f:`.

Two options of a fleet of its own, for the leader election tests:
  audit=True           every kube-apiserver writes an audit log (ROOT/NAME/audit.log, policy
                       AUDIT_POLICY: Metadata for every write and for the Lease's reads),
                       read back with audit_events(cluster).
  replica_users=[...]  more token users (e.g. "meridian-b") bound to the same roles as
                       `meridian` (copies of deploy/rbac's bindings of User meridian), and
                       every kubeconfig meridian gets (hub, members by path and by Secret)
                       authenticates through an exec credential plugin that picks the token
                       of the user named like the replica (MERIDIAN_IDENTITY), `meridian`'s
                       otherwise: replica "meridian-b" acts as user meridian-b everywhere,
                       so the audit logs tell the replicas' writes apart.
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from conftest import FROM_EU1, FROM_EU2, FROM_US1, ROOT, Meridian, free_port

sys.path.insert(0, str(ROOT / "tests" / "peers"))
from kube_cluster import (  # noqa: E402
    ApiError,
    KubeCluster,
    etcd_binary,
    kube_apiserver_binary,
    resource_path,
    start_all,
    stop_all,
)

CRDS_DIR = ROOT / "deploy" / "crds"
HUB_RBAC = ROOT / "deploy" / "rbac" / "hub.yaml"
MEMBER_RBAC = ROOT / "deploy" / "rbac" / "member.yaml"
PROPAGATION_RBAC = ROOT / "deploy" / "rbac" / "member-propagation.yaml"
SHARDS_RBAC = ROOT / "deploy" / "rbac" / "hub-shards.yaml"
AGENTS_RBAC = ROOT / "deploy" / "rbac" / "hub-agents.yaml"
SECRETS_RBAC = ROOT / "deploy" / "rbac" / "hub-secrets.yaml"

USER = "meridian"  # the token user meridian runs as, on the hub and in every member
HUB_NAMESPACE = "meridian-system"
LEASE = "meridian"
NAMESPACE = "shop"  # the members' application namespace
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED = f"{MANAGED_BY}=meridian"  # label selector of what meridian writes into members
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

CORE = "v1"
DISCOVERY = "discovery.k8s.io/v1"
MCS = "multicluster.x-k8s.io/v1alpha1"
MERIDIAN = "meridian.io/v1alpha1"
COORDINATION = "coordination.k8s.io/v1"
API_VERSIONS = {
    "Namespace": CORE, "Service": CORE, "Secret": CORE, "ConfigMap": CORE, "Node": CORE,
    "EndpointSlice": DISCOVERY, "ServiceExport": MCS, "ServiceImport": MCS,
    "MemberCluster": MERIDIAN, "ClusterSchedulingPolicy": MERIDIAN, "Lease": COORDINATION,
    "Deployment": "apps/v1", "Placement": MERIDIAN, "OverridePolicy": MERIDIAN, "HorizontalPodAutoscaler": "autoscaling/v2",
}

# The audit policy of KubeFleet(audit=True): every write (and the Lease's reads, to time a
# renewal) at Metadata level, with who, what, when and the response code; no other reads.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Metadata"},
    ],
}
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
# The session's shared fleet (conftest.py) audits ServiceImport writes (who wrote the MCS
# write-back: meridian for a push member, the agent for an agent member), and Deployment and
# ConfigMap writes (the order of a staged rollout's writes); cheap enough for every test.
SHARED_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": list(WRITE_VERBS),
         "resources": [{"group": "multicluster.x-k8s.io", "resources": ["serviceimports"]},
                       {"group": "apps", "resources": ["deployments"]},
                       {"group": "", "resources": ["configmaps"]}]},
        {"level": "None"},
    ],
}


def exported_service_yaml(name: str, addresses, namespace: str = NAMESPACE) -> str:
    """A directory member's manifest: Service `name` (port 80), its ServiceExport and one
    EndpointSlice with an endpoint per address (port 8080)."""
    endpoints = "".join(f"  - addresses: [{a}]\n" for a in addresses)
    return f"""\
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  ports: [{{name: http, port: 80}}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {{name: {name}, namespace: {namespace}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: {namespace}, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
{endpoints}"""


@dataclass(frozen=True)
class Member:
    """How a member is registered on the hub (its MemberCluster)."""

    name: str
    region: str
    zone: str
    dns_client_cidr: str
    network: str = "net1"
    secret_ref: bool = False  # kubeconfig in a hub Secret rather than by path


DEFAULT_MEMBERS = (
    Member("m1", "eu", "eu-a", "127.0.1.0/24"),
    Member("m2", "eu", "eu-b", "127.0.2.0/24"),
    Member("m3", "us", "us-a", "127.0.3.0/24", secret_ref=True),
)
DEFAULT_HEALTH = {"heartbeatSeconds": 1, "unreachableAfterSeconds": 3, "withdrawAfterSeconds": 6}
# A DNS client's source address in each member (inside its dnsClientCIDRs).
FROM = {"m1": FROM_EU1, "m2": FROM_EU2, "m3": FROM_US1}


def wait_for(predicate, timeout=10.0, interval=0.1, what="condition", log=None):
    """Polls until predicate() is truthy and returns that value; AssertionError after
    `timeout` with the last value (and the tail of a Meridian's log when `log` is one)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            tail = f"\n--- log tail ---\n{log.log_tail()}" if log is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value {last!r}{tail}")
        time.sleep(interval)


def crd_documents() -> list[dict]:
    """Every CRD in deploy/crds/*.yaml (meridian.io's and the MCS ones)."""
    docs = []
    for f in sorted(CRDS_DIR.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return docs


def _ports(ports) -> list[dict]:
    """80 / [80, 443] / [{"name": "http", "port": 80, ...}] as ServicePorts; an int gets the
    name "p<port>" when there are several (Service port names are required then)."""
    if isinstance(ports, (int, dict)):
        ports = [ports]
    out = []
    for p in ports:
        if isinstance(p, int):
            p = {"port": p, "protocol": "TCP"}
            if len(ports) > 1:
                p["name"] = f"p{p['port']}"
        out.append(dict(p))
    return out


def _name(x) -> str:
    return x if isinstance(x, str) else x.name


class KubeFleet:
    """The hub and the members (KubeCluster each), set up as the module docstring says."""

    def __init__(self, root: Path, members=DEFAULT_MEMBERS, *, extra_apiserver_args=None, audit: bool | dict = False,
                 replica_users=()):
        """`extra_apiserver_args`: a list for every cluster, or {cluster name: list}.
        `audit`, `replica_users`: see the module docstring (a dict for `audit` is the audit
        policy to use instead of AUDIT_POLICY)."""
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.member_specs: dict[str, Member] = {m.name: m for m in members}
        self.audit = audit
        self.replica_users = [u for u in dict.fromkeys(replica_users) if u != USER]
        etcd, kas = etcd_binary(), kube_apiserver_binary()
        args = extra_apiserver_args or {}
        if audit:
            policy = audit if isinstance(audit, dict) else AUDIT_POLICY
            (self.root / "audit-policy.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))

        def cluster(name):
            extra = list(args.get(name, []) if isinstance(args, dict) else args)
            if audit:
                extra += [f"--audit-log-path={self.audit_log(name)}",
                          f"--audit-policy-file={self.root / 'audit-policy.yaml'}"]
            return KubeCluster(self.root / name, name, etcd_bin=etcd, kube_apiserver_bin=kas,
                               extra_users=[USER, *self.replica_users], extra_apiserver_args=extra,
                               limited_clusterrole=None)

        self.hub = cluster("hub")
        self.members: dict[str, KubeCluster] = {n: cluster(n) for n in self.member_specs}
        self.kubeconfig_dir = self.root / "kubeconfigs"
        self.meridians: list[Meridian] = []
        self.crds = crd_documents()

    @property
    def clusters(self) -> list[KubeCluster]:
        return [self.hub, *self.members.values()]

    def cluster(self, name) -> KubeCluster:
        """The hub or a member by name (a KubeCluster is returned as it is)."""
        if isinstance(name, KubeCluster):
            return name
        return self.hub if name == "hub" else self.members[name]

    # Start, stop, reset.
    def start(self) -> "KubeFleet":
        """Starts every cluster side by side and sets them up; stops them all on failure."""
        start_all(self.clusters)
        try:
            self.setup()
        except BaseException:
            stop_all(self.clusters)
            raise
        return self

    def stop(self) -> None:
        self.stop_meridians()
        stop_all(self.clusters)

    def setup(self) -> None:
        """CRDs, RBAC and namespaces everywhere, then the member kubeconfigs and MemberClusters."""
        names = [c["metadata"]["name"] for c in self.crds]
        if "memberclusters.meridian.io" not in names:
            raise RuntimeError(f"no MemberCluster CRD in {CRDS_DIR}/*.yaml (deploy/crds/meridian.io.yaml is "
                               "written by `meridian crds`)")

        def prepare(c: KubeCluster):
            c.apply(self.crds)
            c.wait_crds_established(names)
            c.apply(HUB_RBAC if c is self.hub else MEMBER_RBAC)  # hub.yaml makes meridian-system
            self._bind_replica_users(c)
            # The hub too: ClusterSchedulingPolicies live in the namespace of their Services.
            c.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": NAMESPACE}})

        with ThreadPoolExecutor(len(self.clusters)) as pool:
            list(pool.map(prepare, self.clusters))
        self.kubeconfig_dir.mkdir(exist_ok=True)
        self._write_meridian_kubeconfig(self.hub, self.hub_kubeconfig)
        for name in self.member_specs:
            self.register_member(name)

    def stop_apiserver(self, name) -> None:
        """Stops a cluster's kube-apiserver (etcd keeps running): the cluster is unreachable."""
        self.cluster(name).stop_apiserver()

    def start_apiserver(self, name) -> None:
        """Starts it again, at the same address, and waits until the CRDs serve too (a
        custom resource answers 429 for a moment after /readyz is 200)."""
        c = self.cluster(name)
        c.start_apiserver()
        c.wait_crds_established([crd["metadata"]["name"] for crd in self.crds])

    def ensure_running(self) -> None:
        """Restarts etcd and kube-apiserver of any cluster a test stopped."""
        for c in self.clusters:
            if c.etcd is None or c.etcd.poll() is not None:
                c.stop()
                c.start_etcd()
            if c.apiserver is None or c.apiserver.poll() is not None:
                self.start_apiserver(c)

    def reset(self) -> None:
        """Puts the fleet back to its starting state for the next test: meridian stopped,
        every cluster running, the members' Services, EndpointSlices, ServiceExports,
        ServiceImports, Nodes, Deployments, ConfigMaps and HPAs deleted (all namespaces;
        finalizers dropped first), the hub's ClusterSchedulingPolicies, OverridePolicies,
        Placements, Deployments, ConfigMaps and Lease deleted, extra MemberClusters deleted and
        the default ones re-registered with their status cleared, the kubeconfigs rewritten,
        RBAC re-applied and deleted CRDs re-created (changed ones are not restored)."""
        self.stop_meridians()
        self.ensure_running()
        names = [c["metadata"]["name"] for c in self.crds]

        def restore_crds(c: KubeCluster):  # only those a test deleted
            have = {crd["metadata"]["name"] for crd in c.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")}
            missing = [crd for crd in self.crds if crd["metadata"]["name"] not in have]
            if missing:
                c.apply(missing)
                c.wait_crds_established(names)

        def reset_member(c: KubeCluster):
            restore_crds(c)
            c.apply(MEMBER_RBAC)
            self._bind_replica_users(c)
            for kind in ("ServiceExport", "ServiceImport", "EndpointSlice", "Service", "Node", "Deployment",
                         "ConfigMap", "HorizontalPodAutoscaler"):
                for obj in c.list(API_VERSIONS[kind], kind):
                    meta = obj["metadata"]
                    if kind == "Service" and meta.get("namespace") == "default" and meta["name"] == "kubernetes":
                        continue
                    self._force_delete(c, kind, meta["name"], meta.get("namespace"), meta)
            c.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": NAMESPACE}})

        def reset_hub(c: KubeCluster):
            restore_crds(c)
            c.apply(HUB_RBAC)
            self._bind_replica_users(c)
            c.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            for kind in ("ClusterSchedulingPolicy", "OverridePolicy", "Placement", "Deployment", "ConfigMap"):
                for obj in c.list(API_VERSIONS[kind], kind):
                    meta = obj["metadata"]
                    self._force_delete(c, kind, meta["name"], meta["namespace"], meta)
            for obj in c.list(MERIDIAN, "MemberCluster"):
                meta = obj["metadata"]
                if meta["name"] not in self.member_specs:
                    self._force_delete(c, "MemberCluster", meta["name"], None, meta)
                elif meta.get("finalizers"):  # meridian's, from propagation: a fresh start
                    c.request("PATCH", resource_path(MERIDIAN, "MemberCluster", None, meta["name"]),
                              {"metadata": {"finalizers": None}}, content_type="application/merge-patch+json")
            c.delete(COORDINATION, "Lease", LEASE, HUB_NAMESPACE)
            self.revoke_agents()

        with ThreadPoolExecutor(len(self.clusters)) as pool:
            list(pool.map(lambda c: reset_hub(c) if c is self.hub else reset_member(c), self.clusters))
        self._write_meridian_kubeconfig(self.hub, self.hub_kubeconfig)
        for name in self.member_specs:
            self.register_member(name)
            self.clear_member_status(name)

    @staticmethod
    def _force_delete(c: KubeCluster, kind: str, name: str, namespace: str | None, meta: dict) -> None:
        api = API_VERSIONS[kind]
        if meta.get("finalizers"):  # nothing would remove them with meridian stopped
            c.request("PATCH", resource_path(api, kind, namespace, name), {"metadata": {"finalizers": None}},
                      content_type="application/merge-patch+json")
        c.delete(api, kind, name, namespace)

    def grant_shards(self) -> None:
        """deploy/rbac/hub-shards.yaml on the hub: what replicas writing sharded need besides
        hub.yaml (with replica_users, each of them gets a copy of its binding)."""
        self.hub.apply(SHARDS_RBAC)
        self._bind_replica_users(self.hub, SHARDS_RBAC)

    def grant_agents(self) -> None:
        """deploy/rbac/hub-agents.yaml on the hub: what a hub with an agent listener needs
        besides hub.yaml (its Secrets: the agent CA and bootstrap tokens). reset() revokes it."""
        self.hub.apply(AGENTS_RBAC)
        self._bind_replica_users(self.hub, AGENTS_RBAC)

    def revoke_agents(self) -> None:
        for binding in ["meridian-hub-agents", *(f"meridian-hub-agents-{u}" for u in self.replica_users)]:
            self.hub.delete("rbac.authorization.k8s.io/v1", "RoleBinding", binding, HUB_NAMESPACE)

    def grant_secrets(self) -> None:
        """deploy/rbac/hub-secrets.yaml on the hub: `get` on every Secret, so the Secrets
        placed workloads name follow them. The caller revokes it (revoke_secrets)."""
        self.hub.apply(SECRETS_RBAC)
        self._bind_replica_users(self.hub, SECRETS_RBAC)

    def revoke_secrets(self) -> None:
        for binding in ["meridian-hub-secrets", *(f"meridian-hub-secrets-{u}" for u in self.replica_users)]:
            self.hub.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", binding)

    def service_account_kubeconfig(self, name, rbac: Path, account: str, path: Path) -> Path:
        """Applies `rbac` (a file making ServiceAccount meridian-system/`account` and its
        bindings) in cluster `name` and writes a kubeconfig for that account to `path`, with a
        TokenRequest token (an hour): how an agent in a member authenticates."""
        c = self.cluster(name)
        c.apply(rbac)
        status, body = c.request(
            "POST", f"/api/v1/namespaces/{HUB_NAMESPACE}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
        if status != 201:
            raise RuntimeError(f"TokenRequest for {account} in {c.name}: {status} {body}")
        c._write_kubeconfig(path, account, body["status"]["token"])
        return path

    def grant_propagation(self) -> None:
        """deploy/rbac/member-propagation.yaml in every member: what meridian needs to place
        workloads there (member.yaml alone does not let it); with replica_users, each of them
        gets a copy of its binding too (NAME-USER, as for member.yaml)."""
        def grant(name):
            c = self.cluster(name)
            c.apply(PROPAGATION_RBAC)
            self._bind_replica_users(c, PROPAGATION_RBAC)

        with ThreadPoolExecutor(len(self.member_specs)) as pool:
            list(pool.map(grant, self.member_specs))

    def revoke_propagation(self) -> None:
        for name in self.member_specs:
            for binding in ["meridian-member-propagation",
                            *(f"meridian-member-propagation-{u}" for u in self.replica_users)]:
                self.cluster(name).delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", binding)

    # Replica users and audit logs (see the module docstring).
    def _bind_replica_users(self, c: KubeCluster, rbac: Path | None = None) -> None:
        """Binds each replica user to the roles deploy/rbac binds User `meridian` to (in
        `rbac`, default hub.yaml or member.yaml): a copy of each such (Cluster)RoleBinding
        named NAME-USER, with that user as its subject."""
        if not self.replica_users:
            return
        rbac = rbac or (HUB_RBAC if c is self.hub else MEMBER_RBAC)
        docs = [d for d in yaml.safe_load_all(rbac.read_text()) if d]
        bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
                    and any(s.get("kind") == "User" and s.get("name") == USER for s in d.get("subjects") or [])]
        for user in self.replica_users:
            for b in bindings:
                meta = {k: v for k, v in b["metadata"].items() if k in ("name", "namespace")}
                meta["name"] = f"{meta['name']}-{user}"
                c.apply({**b, "metadata": meta,
                         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})

    def _write_meridian_kubeconfig(self, c: KubeCluster, path: Path) -> None:
        """meridian's kubeconfig for a cluster: `meridian`'s token, or with replica_users an
        exec credential plugin that picks the token by MERIDIAN_IDENTITY."""
        if not self.replica_users:
            c._write_kubeconfig(path, USER, c.tokens[USER])
            return
        script = self.kubeconfig_dir / f"{c.name}-token.sh"
        cases = "".join(f"  {u}) token={c.tokens[u]} ;;\n" for u in self.replica_users)
        script.write_text(
            "#!/bin/sh\n# The token of the user named like this meridian replica (MERIDIAN_IDENTITY), "
            f"else {USER}'s.\ncase \"$MERIDIAN_IDENTITY\" in\n{cases}  *) token={c.tokens[USER]} ;;\nesac\n"
            "printf '{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\","
            "\"status\":{\"token\":\"%s\"}}\\n' \"$token\"\n")
        script.chmod(0o700)
        ca = base64.b64encode(c.ca_file.read_bytes()).decode()
        user = "meridian-by-identity"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": c.name, "cluster": {"server": c.server, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(script),
                "interactiveMode": "Never"}}}],
            "contexts": [{"name": f"{c.name}-{user}", "context": {"cluster": c.name, "user": user}}],
            "current-context": f"{c.name}-{user}",
        }, sort_keys=False))
        path.chmod(0o600)

    def audit_log(self, name) -> Path:
        return self.root / _name(name) / "audit.log"

    def audit_events(self, name) -> list[dict]:
        """The audit events of a cluster's API server so far (audit=True), in log order."""
        path = self.audit_log(name)
        if not path.exists():
            return []
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:  # a line being written
                pass
        return events

    # Member registration on the hub.
    hub_kubeconfig = property(lambda self: self.kubeconfig_dir / "hub-meridian.kubeconfig")

    def member_kubeconfig(self, name) -> Path:
        """The kubeconfig meridian uses for a member (its `meridian` user, RBAC-limited)."""
        return self.kubeconfig_dir / f"{_name(name)}-meridian.kubeconfig"

    def secret_name(self, name) -> str:
        return f"{_name(name)}-kubeconfig"

    def write_member_kubeconfig(self, name, *, token: str | None = None) -> Path:
        """(Re)writes a member's kubeconfig file, with the `meridian` token unless `token`
        (e.g. a wrong one, for a 401), and the hub Secret with the same text."""
        name = _name(name)
        c = self.members[name]
        path = self.member_kubeconfig(name)
        if token is None:
            self._write_meridian_kubeconfig(c, path)
        else:
            c._write_kubeconfig(path, USER, token)
        self.hub.apply({
            "apiVersion": CORE, "kind": "Secret",
            "metadata": {"name": self.secret_name(name), "namespace": HUB_NAMESPACE},
            "type": "Opaque",
            "data": {"kubeconfig": base64.b64encode(path.read_bytes()).decode()},
        })
        return path

    def member_cluster_manifest(self, name, *, secret_ref: bool | None = None, labels: dict | None = None,
                                network: dict | None = None, health: dict | None = None, **spec) -> dict:
        """The MemberCluster of a member: the defaults of its Member, overridden by the
        arguments (labels replace the region/zone labels; **spec adds or replaces spec keys,
        e.g. taints=[...], gateway={...}, source={...})."""
        name = _name(name)
        m = self.member_specs.get(name) or Member(name, "", "", "")
        use_secret = m.secret_ref if secret_ref is None else secret_ref
        if use_secret:
            source = {"secretRef": {"namespace": HUB_NAMESPACE, "name": self.secret_name(name), "key": "kubeconfig"}}
        else:
            source = {"kubeconfig": {"path": str(self.member_kubeconfig(name))}}
        if labels is None:
            labels = {"topology.kubernetes.io/region": m.region, "topology.kubernetes.io/zone": m.zone}
        body = {
            "source": {"kubernetes": source},
            "network": network if network is not None else {"name": m.network, "dnsClientCIDRs": [m.dns_client_cidr]},
            "health": health if health is not None else dict(DEFAULT_HEALTH),
        }
        body.update(spec)
        return {"apiVersion": MERIDIAN, "kind": "MemberCluster", "metadata": {"name": name, "labels": labels},
                "spec": body}

    def register_member(self, name, **overrides) -> dict:
        """Writes the member's kubeconfig (file and hub Secret) and creates or replaces its
        MemberCluster (member_cluster_manifest(**overrides)). Returns the stored object."""
        if _name(name) in self.members:
            self.write_member_kubeconfig(name)
        return self.hub.apply(self.member_cluster_manifest(name, **overrides))[0]

    def set_member_spec(self, name, **overrides) -> dict:
        """Re-registers a member with other settings (see member_cluster_manifest)."""
        return self.register_member(name, **overrides)

    def clear_member_status(self, name) -> None:
        status, body = self.hub.request(
            "PATCH", resource_path(MERIDIAN, "MemberCluster", None, _name(name), "status"), {"status": None},
            content_type="application/merge-patch+json")
        if status != 200:
            raise ApiError(f"cannot clear the status of MemberCluster {_name(name)}", status, body)

    def member_cluster(self, name) -> dict | None:
        return self.hub.get(MERIDIAN, "MemberCluster", _name(name))

    def member_status(self, name) -> dict:
        return (self.member_cluster(name) or {}).get("status") or {}

    def delete_member_cluster(self, name) -> bool:
        return self.hub.delete(MERIDIAN, "MemberCluster", _name(name))

    def policy(self, name: str, spec: dict, namespace: str = NAMESPACE) -> dict:
        """Creates or replaces a ClusterSchedulingPolicy on the hub."""
        return self.hub.apply({"apiVersion": MERIDIAN, "kind": "ClusterSchedulingPolicy",
                               "metadata": {"name": name, "namespace": namespace}, "spec": spec})[0]

    def lease(self) -> dict | None:
        return self.hub.get(COORDINATION, "Lease", LEASE, HUB_NAMESPACE)

    def lease_holder(self) -> str | None:
        return ((self.lease() or {}).get("spec") or {}).get("holderIdentity")

    # meridian.
    def config(self, dns_port: int, admin_port: int, xds_port: int, **overrides) -> dict:
        """meridian's config for this fleet; top-level `overrides` replace whole sections."""
        cfg = {
            "hub": {"kubeconfig": str(self.hub_kubeconfig), "namespace": HUB_NAMESPACE},
            "leaderElection": {"leaseName": LEASE, "leaseDurationSeconds": 4, "renewDeadlineSeconds": 3,
                               "retryPeriodSeconds": 1},
            "dns": {"listen": f"127.0.0.1:{dns_port}",
                    "zones": [{"name": "global", "style": "global"},
                              {"name": "clusterset.local", "style": "clusterset"}],
                    "ttl": 5},
            "xds": {"listen": f"127.0.0.1:{xds_port}"},
            "admin": {"listen": f"127.0.0.1:{admin_port}"},
        }
        cfg.update(overrides)
        return cfg

    def start_meridian(self, name: str = "meridian", *extra_args, env=None, ready_timeout=30, cwd=None,
                       **overrides) -> Meridian:
        """Writes ROOT/NAME.yaml (config(**overrides)) and starts `meridian serve` on it,
        logging to ROOT/NAME.log, with MERIDIAN_IDENTITY=NAME (its name in the Lease, so
        lease_holder() says which replica leads); a second replica is just another name
        ("meridian-2"). `cwd`: its working directory (what relative member paths in
        MemberClusters resolve against). Stopped by stop_meridians() (the kube_fleet fixture
        does)."""
        ports = (free_port(), free_port(), free_port())
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(self.config(*ports, **overrides), sort_keys=False))
        m = Meridian(None, extra_args, {"MERIDIAN_IDENTITY": name, **(env or {})}, config=path,
                     log=self.root / f"{name}.log", ports=ports, ready_timeout=ready_timeout, cwd=cwd)
        self.meridians.append(m)
        return m

    def stop_meridians(self) -> None:
        while self.meridians:
            self.meridians.pop().stop()

    # Objects in members, as admin.
    def service(self, member, name: str, ports=80, *, namespace: str = NAMESPACE, headless: bool = False,
                publish_not_ready: bool = False, type: str | None = None, external_name: str | None = None,
                labels: dict | None = None, annotations: dict | None = None) -> dict:
        """Creates or replaces a Service (no selector: its EndpointSlices are the test's).
        `ports`: 80, [80, 443] or ServicePort dicts. A change between headless and not
        deletes and re-creates it (spec.clusterIP is immutable). Returns the stored Service."""
        spec: dict = {"ports": _ports(ports)}
        if headless:
            spec["clusterIP"] = "None"
        if publish_not_ready:
            spec["publishNotReadyAddresses"] = True
        if type:
            spec["type"] = type
        if external_name:
            spec.update(type="ExternalName", externalName=external_name)
            spec.pop("clusterIP", None)
        meta = {"name": name, "namespace": namespace}
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        c = self.cluster(member)
        old = c.get(CORE, "Service", name, namespace)
        if old is not None:
            # spec.clusterIP is immutable (a replace without it keeps the old one): a change
            # between headless and not, or to or from ExternalName, needs a new Service.
            was_headless = old["spec"].get("clusterIP") == "None"
            was_external = old["spec"].get("type") == "ExternalName"
            if was_headless != headless or was_external != bool(external_name):
                c.delete(CORE, "Service", name, namespace)
        return c.apply({"apiVersion": CORE, "kind": "Service", "metadata": meta, "spec": spec})[0]

    def endpoint_slice(self, member, service: str, addresses, *, ports=None, name: str | None = None,
                       namespace: str = NAMESPACE, ready: bool | None = True, address_type: str = "IPv4",
                       labels: dict | None = None) -> dict:
        """Creates or replaces an EndpointSlice of `service` (label kubernetes.io/service-name),
        named NAME or "<service>-<member>". `addresses`: IPs, or dicts with "ip" and any of
        ready, serving, terminating, hostname, zone, nodeName (a string gets ready=`ready`;
        ready=None leaves the condition unset, which Kubernetes reads as ready). `ports`: as
        for service(), default the Service's ports (targetPort when it is a number)."""
        c = self.cluster(member)
        if ports is None:
            svc = c.get(CORE, "Service", service, namespace)
            if svc is None:
                raise ValueError(f"no Service {namespace}/{service} in {c.name}: pass ports=")
            ports = [{k: v for k, v in {"name": p.get("name"), "protocol": p.get("protocol", "TCP"),
                                        "port": p["targetPort"] if isinstance(p.get("targetPort"), int) else p["port"],
                                        "appProtocol": p.get("appProtocol")}.items() if v is not None}
                     for p in svc["spec"].get("ports") or []]
        else:
            ports = _ports(ports)
        endpoints = []
        for a in addresses:
            if isinstance(a, str):
                a = {"ip": a, "ready": ready}
            a = dict(a)
            ep = {"addresses": [a.pop("ip")]}
            cond = {k: v for k in ("ready", "serving", "terminating") if (v := a.pop(k, None)) is not None}
            if cond:
                ep["conditions"] = cond
            ep.update(a)  # hostname, zone, nodeName, ...
            endpoints.append(ep)
        meta = {"name": name or f"{service}-{c.name}", "namespace": namespace,
                "labels": {SERVICE_NAME_LABEL: service, **(labels or {})}}
        obj = {"apiVersion": DISCOVERY, "kind": "EndpointSlice", "metadata": meta, "addressType": address_type,
               "endpoints": endpoints, "ports": ports}
        return c.apply(obj)[0]

    def publish(self, member, service: str, addresses, *, port: int = 80, target: int = 8080) -> None:
        """What a member exports, in one call: a Service with one port named http, its
        EndpointSlice (to `target`) and a ServiceExport."""
        self.service(member, service, [{"name": "http", "port": port, "protocol": "TCP"}])
        self.endpoint_slice(member, service, addresses,
                            ports=[{"name": "http", "port": target, "protocol": "TCP"}])
        self.export(member, service)

    def export(self, member, service: str, *, namespace: str = NAMESPACE, labels: dict | None = None,
               spec: dict | None = None) -> dict:
        """Creates a ServiceExport of `service`, without a spec (as users write them) unless
        `spec`."""
        meta = {"name": service, "namespace": namespace}
        if labels:
            meta["labels"] = labels
        obj = {"apiVersion": MCS, "kind": "ServiceExport", "metadata": meta}
        if spec is not None:
            obj["spec"] = spec
        return self.cluster(member).apply(obj)[0]

    def unexport(self, member, service: str, *, namespace: str = NAMESPACE) -> bool:
        return self.cluster(member).delete(MCS, "ServiceExport", service, namespace)

    def delete_service(self, member, name: str, *, namespace: str = NAMESPACE, slices: bool = True) -> bool:
        """Deletes a Service and (no garbage collector here) its EndpointSlices."""
        c = self.cluster(member)
        if slices:
            for s in c.list(DISCOVERY, "EndpointSlice", namespace, label_selector=f"{SERVICE_NAME_LABEL}={name}"):
                c.delete(DISCOVERY, "EndpointSlice", s["metadata"]["name"], namespace)
        return c.delete(CORE, "Service", name, namespace)

    def delete(self, member, kind: str, name: str, namespace: str | None = NAMESPACE) -> bool:
        """Deletes one object of a kind in API_VERSIONS (namespace ignored for cluster-scoped kinds)."""
        return self.cluster(member).delete(API_VERSIONS[kind], kind, name, namespace)

    def node(self, member, name: str, *, cpu: str = "4", memory: str = "8Gi", labels: dict | None = None,
             taints: list | None = None) -> dict:
        """Creates or replaces a Node with capacity = allocatable = cpu/memory (its status is
        written through the status subresource, as a kubelet would)."""
        c = self.cluster(member)
        node = c.apply({"apiVersion": CORE, "kind": "Node",
                        "metadata": {"name": name, "labels": labels or {}},
                        "spec": {"taints": taints} if taints else {}})[0]
        res = {"cpu": cpu, "memory": memory, "pods": "110"}
        node["status"] = {"capacity": res, "allocatable": res}
        status, body = c.request("PUT", resource_path(CORE, "Node", None, name, "status"), node)
        if status != 200:
            raise ApiError(f"{c.name}: cannot write the status of Node {name}", status, body)
        return body

    # What meridian wrote into members.
    def service_exports(self, member, namespace: str | None = NAMESPACE) -> list[dict]:
        return self.cluster(member).list(MCS, "ServiceExport", namespace)

    def service_export(self, member, name: str, namespace: str = NAMESPACE) -> dict | None:
        return self.cluster(member).get(MCS, "ServiceExport", name, namespace)

    def export_condition(self, member, name: str, type: str, namespace: str = NAMESPACE) -> dict | None:
        """One condition (e.g. "Valid", "Conflict") of a ServiceExport's status, or None."""
        se = self.service_export(member, name, namespace) or {}
        return next((c for c in (se.get("status") or {}).get("conditions") or [] if c["type"] == type), None)

    def service_imports(self, member, namespace: str | None = None) -> list[dict]:
        """ServiceImports in a member (every namespace unless `namespace`)."""
        return self.cluster(member).list(MCS, "ServiceImport", namespace)

    def service_import(self, member, name: str, namespace: str = NAMESPACE) -> dict | None:
        return self.cluster(member).get(MCS, "ServiceImport", name, namespace)

    def managed_services(self, member, namespace: str | None = None) -> list[dict]:
        """Services labelled app.kubernetes.io/managed-by=meridian (every namespace unless `namespace`)."""
        return self.cluster(member).list(CORE, "Service", namespace, label_selector=MANAGED)

    def managed_slices(self, member, namespace: str | None = None, service: str | None = None) -> list[dict]:
        """EndpointSlices labelled app.kubernetes.io/managed-by=meridian (and, with `service`,
        kubernetes.io/service-name=SERVICE)."""
        sel = MANAGED + (f",{SERVICE_NAME_LABEL}={service}" if service else "")
        return self.cluster(member).list(DISCOVERY, "EndpointSlice", namespace, label_selector=sel)


@contextlib.contextmanager
def started(root: Path, members=DEFAULT_MEMBERS, **kwargs):
    """A fleet of its own (e.g. other kube-apiserver flags): started, yielded, stopped."""
    fleet = KubeFleet(root, members, **kwargs).start()
    try:
        yield fleet
    finally:
        fleet.stop()


def with_member(members, name: str, **changes) -> tuple[Member, ...]:
    """DEFAULT_MEMBERS (or `members`) with one member's settings changed, e.g.
    with_member(DEFAULT_MEMBERS, "m3", network="net2")."""
    return tuple(replace(m, **changes) if m.name == name else m for m in members)
