#!/usr/bin/env python3
"""Starts real Kubernetes control planes (etcd + kube-apiserver) on loopback, for tests.

Each cluster lives in a work directory of its own and listens on free loopback ports:

    <work-dir>/<name>/
        ca.crt ca.key                 a CA made for this cluster (openssl)
        apiserver.crt apiserver.key   the serving certificate (SAN 127.0.0.1, localhost)
        sa.key sa.pub                 the service-account signing key pair (RSA)
        tokens.csv                    --token-auth-file: the admin, the limited user and
                                      any extra users (extra_users=[...] / --user NAME)
        admin.kubeconfig              token of "admin" (group system:masters)
        limited.kubeconfig            token of "limited": get/list/watch only (see below)
        USER.kubeconfig               token of each extra user (no rights until bound)
        cluster.json                  all of the above as JSON, with ports and pids
        etcd-data/ etcd.log kube-apiserver.log

The limited user is bound to the ClusterRole meridian-test-read-only (get, list and watch
on every resource, made by the launcher), so every write of theirs is refused with 403;
--limited-clusterrole names another ClusterRole, or '' for none (then a test binds what
it wants, as admin).

There is no controller manager, scheduler or kubelet: what the API server does alone
works (namespaces, Services with ClusterIPs allocated, EndpointSlices written by the
test, RBAC, watches, CRDs), what controllers do does not (no EndpointSlices made from
Pods, a deleted Namespace stays Terminating, no "default" ServiceAccounts so no Pods can
be created, the aggregated ClusterRoles view/edit/admin are empty, no garbage
collection).

As a command (stdlib only; the binaries come from etcd.sh and kube-apiserver.sh beside
this file unless ETCD_BIN / KUBE_APISERVER_BIN or --etcd / --kube-apiserver name them):

    tests/peers/kube_cluster.py up --work-dir DIR [--name hub --name m1 ...] [--detach]
                                   [--user meridian ...] [--apiserver-arg=--watch-cache=false ...]
    tests/peers/kube_cluster.py down --work-dir DIR [--name ...]

`up` starts the named clusters (default: one named "kube") side by side and prints one
JSON line per cluster when it is ready (keys: name, server, admin_kubeconfig,
limited_kubeconfig, admin_token, limited_token, ca_file, etcd_url, work_dir,
ready_seconds, ...). It then stays in the foreground until SIGTERM/SIGINT (or, with
--exit-on-stdin-eof, until its standard input closes, for a parent that may die
without cleaning up), and stops etcd and kube-apiserver on its way out; they also get
SIGTERM if it is killed. With --detach it exits once the clusters are ready and leaves
them running; `down` stops them (from the pids in cluster.json).

A work directory that already holds a cluster is reused: the same certificates, tokens
and etcd data, and the same ports when they are still free, so a test can stop and
start a control plane "at the same address".

As a library (from the e2e tests):

    from kube_cluster import KubeCluster
    with KubeCluster(work_dir / "hub", name="hub", extra_users=["meridian"],
                     extra_apiserver_args=["--watch-cache=false"]) as hub:
        hub.request("GET", "/api/v1/namespaces")          # as admin; returns (status, json)
        hub.apply(yaml.safe_load_all(text))                 # create or replace, as admin
        hub.wait_crds_established(["memberclusters.meridian.io"])
        hub.request("GET", "/api/v1/services", token=hub.tokens["meridian"])
        hub.kubeconfig_for("meridian")                      # DIR/hub/meridian.kubeconfig
        hub.stop_apiserver(); hub.start_apiserver()         # same port, same etcd

start_all([...]) starts several clusters side by side, each from a thread of its own that
lives until stop_all([...]).

The processes get SIGTERM when the thread that started them ends (PR_SET_PDEATHSIG), so
start a cluster from a thread that outlives it (pytest's main thread does), or pass
die_with_parent=False and stop it yourself.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent

# A range for ClusterIPs: only written into Service objects, never routed or contacted.
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
ADMIN_USER, ADMIN_GROUP = "admin", "system:masters"
LIMITED_USER = "limited"
# Made by the launcher: get, list and watch on every resource, and nothing else. (The
# built-in "view" would not do: it is an aggregated ClusterRole whose rules the controller
# manager fills in, so it is empty here.)
DEFAULT_LIMITED_CLUSTERROLE = "meridian-test-read-only"
READ_ONLY_CLUSTERROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": DEFAULT_LIMITED_CLUSTERROLE},
    "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}],
}


# The REST resource of each kind apply() and path() know, by (API group, kind): its plural
# and whether it is namespaced. The version comes from the object's apiVersion.
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("", "Namespace"): ("namespaces", False),
    ("", "Node"): ("nodes", False),
    ("", "Service"): ("services", True),
    ("", "Endpoints"): ("endpoints", True),
    ("", "Secret"): ("secrets", True),
    ("", "ConfigMap"): ("configmaps", True),
    ("", "ServiceAccount"): ("serviceaccounts", True),
    ("", "Pod"): ("pods", True),
    ("", "Event"): ("events", True),
    ("apps", "Deployment"): ("deployments", True),
    ("apps", "StatefulSet"): ("statefulsets", True),
    ("apps", "DaemonSet"): ("daemonsets", True),
    ("apps", "ReplicaSet"): ("replicasets", True),
    ("rbac.authorization.k8s.io", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io", "RoleBinding"): ("rolebindings", True),
    ("apiextensions.k8s.io", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("coordination.k8s.io", "Lease"): ("leases", True),
    ("discovery.k8s.io", "EndpointSlice"): ("endpointslices", True),
    ("multicluster.x-k8s.io", "ServiceExport"): ("serviceexports", True),
    ("multicluster.x-k8s.io", "ServiceImport"): ("serviceimports", True),
    ("gateway.networking.k8s.io", "HTTPRoute"): ("httproutes", True),
    ("gateway.networking.k8s.io", "GRPCRoute"): ("grpcroutes", True),
    ("gateway.networking.k8s.io", "ReferenceGrant"): ("referencegrants", True),
    ("meridian.io", "MemberCluster"): ("memberclusters", False),
    ("meridian.io", "ClusterSchedulingPolicy"): ("clusterschedulingpolicies", True),
    ("meridian.io", "OverridePolicy"): ("overridepolicies", True),
    ("meridian.io", "Tenant"): ("tenants", False),
    ("meridian.io", "Placement"): ("placements", True),
    ("autoscaling", "HorizontalPodAutoscaler"): ("horizontalpodautoscalers", True),
    ("batch", "Job"): ("jobs", True),
}


class ClusterError(RuntimeError):
    pass


class ApiError(ClusterError):
    """A REST call that did not answer as expected; `status` and `body` are the answer."""

    def __init__(self, message: str, status: int, body):
        super().__init__(f"{message}: {status} {body}")
        self.status, self.body = status, body


def resource_path(api_version: str, kind: str, namespace: str | None = None, name: str | None = None,
                  subresource: str | None = None) -> str:
    """The REST path of a kind's collection (no name) or of one object, e.g.
    resource_path("discovery.k8s.io/v1", "EndpointSlice", "shop", "web-1")
    == "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-1".
    A namespaced kind without `namespace` names the collection across all namespaces."""
    group, _, version = api_version.rpartition("/")
    try:
        plural, namespaced = KINDS[(group, kind)]
    except KeyError:
        raise ClusterError(f"kube_cluster.KINDS does not know {kind} of {api_version!r}; add it") from None
    path = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespaced and namespace:
        path += f"/namespaces/{namespace}"
    path += f"/{plural}"
    if name:
        path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
    return path


def object_path(obj: dict, *, collection: bool = False) -> str:
    """The REST path of a parsed object (its collection with collection=True). A namespaced
    object without metadata.namespace is in "default"."""
    kind, api_version = obj["kind"], obj["apiVersion"]
    group = api_version.rpartition("/")[0]
    namespaced = KINDS.get((group, kind), (None, False))[1]
    meta = obj.get("metadata") or {}
    ns = (meta.get("namespace") or "default") if namespaced else None
    return resource_path(api_version, kind, ns, None if collection else meta["name"])


def _documents(objs) -> list[dict]:
    """A dict, an iterable of dicts (None skipped, as yaml.safe_load_all gives for empty
    documents), YAML text or a Path of a YAML file, as a list of dicts."""
    if isinstance(objs, os.PathLike):
        objs = Path(objs).read_text()
    if isinstance(objs, str):
        import yaml  # PyYAML (tests/requirements.txt); the command itself needs only the stdlib

        objs = list(yaml.safe_load_all(objs))
    if isinstance(objs, dict):
        objs = [objs]
    out = []
    for o in objs:
        if o is None:
            continue
        if o.get("kind", "").endswith("List") and "items" in o:
            out.extend(o["items"])
        else:
            out.append(o)
    return out


def _build(script: str, env_var: str) -> str:
    if os.environ.get(env_var):
        return os.environ[env_var]
    out = subprocess.run([str(HERE / script)], stdout=subprocess.PIPE, check=False, text=True)
    if out.returncode != 0:
        raise ClusterError(f"{script} failed (exit {out.returncode}); its reason is on stderr above")
    return out.stdout.strip().splitlines()[-1]


def etcd_binary() -> str:
    return _build("etcd.sh", "ETCD_BIN")


def kube_apiserver_binary() -> str:
    return _build("kube-apiserver.sh", "KUBE_APISERVER_BIN")


def _free_ports(n: int, prefer: list[int] | None = None) -> list[int]:
    """n distinct free loopback ports; `prefer` (all of them) when they are all free."""
    if prefer and len(prefer) == n and len(set(prefer)) == n:
        socks = []
        try:
            for p in prefer:
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return list(prefer)
        except OSError:
            pass
        finally:
            for s in socks:
                s.close()
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent():
    """preexec_fn: SIGTERM the child when the process that started it goes away."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)} failed in {cwd}:\n{r.stdout}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"


class KubeCluster:
    """One etcd and one kube-apiserver on loopback, in `work_dir`."""

    def __init__(
        self,
        work_dir: str | os.PathLike,
        name: str | None = None,
        *,
        etcd_bin: str | None = None,
        kube_apiserver_bin: str | None = None,
        limited_clusterrole: str | None = DEFAULT_LIMITED_CLUSTERROLE,
        ready_timeout: float = 180.0,
        die_with_parent: bool = True,
        extra_apiserver_args: list[str] | None = None,
        extra_users: list[str] | None = None,
    ):
        """`extra_users`: more static token users (no group, no rights until a test binds
        some), each with a kubeconfig DIR/NAME/USER.kubeconfig; their tokens are in
        `tokens`. `extra_apiserver_args` go to kube-apiserver after the default flags
        (e.g. "--watch-cache=false", "--audit-log-path=...", "--audit-policy-file=...")."""
        self.dir = Path(work_dir).resolve()
        self.name = name or self.dir.name
        self.etcd_bin = etcd_bin or etcd_binary()
        self.kube_apiserver_bin = kube_apiserver_bin or kube_apiserver_binary()
        self.limited_clusterrole = limited_clusterrole
        self.ready_timeout = ready_timeout
        self.die_with_parent = die_with_parent
        self.extra_apiserver_args = list(extra_apiserver_args or [])
        self.extra_users = list(dict.fromkeys(extra_users or []))
        for u in self.extra_users:
            if u in (ADMIN_USER, LIMITED_USER) or not u or any(c in u for c in ',"\n'):
                raise ValueError(f"extra user {u!r}: a reserved or unusable name")
        self.tokens: dict[str, str] = {}
        self.etcd: subprocess.Popen | None = None
        self.apiserver: subprocess.Popen | None = None
        self.ready_seconds: float | None = None
        self._ports: list[int] = []
        self._owner: _Owner | None = None  # set by start_all

    # Paths and addresses.
    ca_file = property(lambda self: self.dir / "ca.crt")
    admin_kubeconfig = property(lambda self: self.dir / "admin.kubeconfig")
    limited_kubeconfig = property(lambda self: self.dir / "limited.kubeconfig")

    def kubeconfig_for(self, user: str) -> Path:
        """The kubeconfig of a token user: admin, limited or one of extra_users."""
        return self.dir / f"{user}.kubeconfig"
    etcd_client_port = property(lambda self: self._ports[0])
    etcd_peer_port = property(lambda self: self._ports[1])
    apiserver_port = property(lambda self: self._ports[2])
    etcd_url = property(lambda self: f"http://127.0.0.1:{self.etcd_client_port}")
    server = property(lambda self: f"https://127.0.0.1:{self.apiserver_port}")

    # Set-up of the work directory (kept when it exists, so a restart keeps identities).
    def _prepare(self) -> None:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "ca.crt").exists() or not (d / "apiserver.crt").exists():
            _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=d)
            _openssl(
                "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "3650", "-subj",
                f"/CN=meridian-test-{self.name}-ca", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt", cwd=d,
            )
            _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "apiserver.key", cwd=d)
            _openssl("req", "-new", "-key", "apiserver.key", "-subj", "/CN=kube-apiserver", "-out", "apiserver.csr", cwd=d)
            (d / "apiserver.ext").write_text(
                "basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\n"
                "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
                "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1\n"
            )
            _openssl(
                "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-sha256", "-days", "3650", "-extfile", "apiserver.ext", "-out", "apiserver.crt", cwd=d,
            )
        if not (d / "sa.key").exists() or not (d / "sa.pub").exists():
            _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
            _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
        if not (d / "tokens.csv").exists():
            (d / "tokens.csv").write_text(
                f'{secrets.token_hex(16)},{ADMIN_USER},{ADMIN_USER}-uid,"{ADMIN_GROUP}"\n'
                f"{secrets.token_hex(16)},{LIMITED_USER},{LIMITED_USER}-uid\n"
            )
            os.chmod(d / "tokens.csv", 0o600)
        rows = [line.split(",") for line in (d / "tokens.csv").read_text().splitlines() if line]
        tokens = {r[1]: r[0] for r in rows}
        missing = [u for u in self.extra_users if u not in tokens]
        if missing:  # a reused directory: keep the earlier tokens, add the new users
            with open(d / "tokens.csv", "a") as f:
                for u in missing:
                    tokens[u] = secrets.token_hex(16)
                    f.write(f"{tokens[u]},{u},{u}-uid\n")
        self.tokens = tokens
        self.admin_token, self.limited_token = tokens[ADMIN_USER], tokens[LIMITED_USER]
        prev = self._read_state().get("ports")
        if not self._ports:
            self._ports = _free_ports(3, prefer=prev)

    def _read_state(self) -> dict:
        try:
            return json.loads((self.dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}

    def info(self) -> dict:
        return {
            "name": self.name,
            "server": self.server,
            "admin_kubeconfig": str(self.admin_kubeconfig),
            "limited_kubeconfig": str(self.limited_kubeconfig),
            "admin_token": self.admin_token,
            "limited_token": self.limited_token,
            "limited_clusterrole": self.limited_clusterrole,
            "users": {
                u: {"token": self.tokens.get(u), "kubeconfig": str(self.kubeconfig_for(u))} for u in self.extra_users
            },
            "ca_file": str(self.ca_file),
            "etcd_url": self.etcd_url,
            "work_dir": str(self.dir),
            "ports": self._ports,
            "pids": {
                "etcd": self.etcd.pid if self.etcd else None,
                "kube-apiserver": self.apiserver.pid if self.apiserver else None,
            },
            "ready_seconds": self.ready_seconds,
        }

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> None:
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        ctx = f"{self.name}-{user}"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: {self.name}\n  cluster:\n    server: {self.server}\n"
            f"    certificate-authority-data: {ca}\n"
            f"users:\n- name: {user}\n  user:\n    token: {token}\n"
            f"contexts:\n- name: {ctx}\n  context:\n    cluster: {self.name}\n    user: {user}\n"
            f"    namespace: default\ncurrent-context: {ctx}\n"
        )
        os.chmod(path, 0o600)

    # Processes.
    def _popen(self, args: list[str], log: Path, stdout=None) -> subprocess.Popen:
        logf = open(log, "ab")
        try:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=stdout if stdout is not None else logf,
                stderr=logf,
                cwd=self.dir,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
                start_new_session=not self.die_with_parent,
            )
        finally:
            logf.close()

    def start_etcd(self) -> None:
        log = self.dir / "etcd.log"
        self.etcd = self._popen(
            [
                self.etcd_bin, "--name", self.name, "--data-dir", str(self.dir / "etcd-data"),
                "--listen-client-url", self.etcd_url,
                "--listen-peer-url", f"http://127.0.0.1:{self.etcd_peer_port}",
            ],
            log,
            stdout=subprocess.PIPE,
        )
        line = self.etcd.stdout.readline().decode(errors="replace").strip()  # "ready", or EOF when it died
        self.etcd.stdout.close()
        if line != "ready":
            self.etcd.wait(timeout=10)
            self.etcd = None
            raise ClusterError(f"etcd of {self.name} did not start; {log}:\n{_tail(log)}")

    def apiserver_args(self) -> list[str]:
        d = self.dir
        return [
            self.kube_apiserver_bin,
            f"--etcd-servers={self.etcd_url}",
            "--etcd-prefix=/registry",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # The "kubernetes" Service's Endpoints would name 127.0.0.1, which Endpoints
            # validation refuses (loopback); nothing here routes to it anyway.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={d / 'certs'}",
            "--profiling=false",
            *self.extra_apiserver_args,
        ]

    def start_apiserver(self) -> None:
        log = self.dir / "kube-apiserver.log"
        start = time.monotonic()
        self.apiserver = self._popen(self.apiserver_args(), log)
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        deadline = start + self.ready_timeout
        last = ""
        while True:
            if self.apiserver.poll() is not None:
                code = self.apiserver.returncode
                self.apiserver = None
                raise ClusterError(f"kube-apiserver of {self.name} exited with {code}; {log}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"kube-apiserver of {self.name} not ready after {self.ready_timeout:.0f} s (last: {last}); {log}:\n{_tail(log)}"
                )
            # /readyz, then the "default" namespace (made by a controller of the API server
            # shortly after start), so a test can create objects in it at once.
            status, body = self._get("/readyz", ctx)
            if status == 200:
                status, body = self._get("/api/v1/namespaces/default", ctx)
                if status == 200:
                    break
            last = f"{status} {body[:200]!r}"
            time.sleep(0.2)
        self.ready_seconds = round(time.monotonic() - start, 2)

    def _get(self, path: str, ctx: ssl.SSLContext) -> tuple[int, str]:
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.admin_token}"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as e:
            return 0, str(e)

    def request(self, method: str, path: str, body: dict | None = None, *, token: str | None = None,
                content_type: str = "application/json"):
        """A REST call (as admin unless `token`); returns (status, decoded JSON or text).
        A PATCH takes content_type="application/merge-patch+json" (or strategic/json patch).
        A 429 with Retry-After is retried, up to 10 times, as client-go does: a restarted
        API server answers so for a custom resource while its storage initializes, after
        /readyz is already 200."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(11):
            req = urllib.request.Request(
                self.server + path,
                data=data,
                method=method,
                headers={"Authorization": f"Bearer {token or self.admin_token}", "Content-Type": content_type},
            )
            retry_after = None
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                    status, raw = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, raw = e.code, e.read()
                retry_after = e.headers.get("Retry-After")
            if status != 429 or retry_after is None or attempt == 10:
                break
            try:
                time.sleep(min(max(float(retry_after), 0.1), 1.0))
            except ValueError:
                time.sleep(1.0)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    # Objects by kind (see KINDS), as admin unless `token`.
    def apply(self, objs, *, token: str | None = None) -> list[dict]:
        """Creates, or replaces when it exists, each object: a parsed YAML dict, a list of
        them (e.g. yaml.safe_load_all(...); None documents are skipped), YAML text or a Path.
        Returns the objects as stored; raises ApiError on a refusal (e.g. 403 with a token).
        A replace keeps nothing of the old object but what the server keeps itself
        (a Service's ClusterIP; the status of a kind with a status subresource)."""
        return [self._apply_one(o, token) for o in _documents(objs)]

    def _apply_one(self, obj: dict, token: str | None) -> dict:
        what = f"{obj.get('kind')} {(obj.get('metadata') or {}).get('namespace', '')}/{(obj.get('metadata') or {}).get('name')}"
        status, body = self.request("POST", object_path(obj, collection=True), obj, token=token)
        if status == 201:
            return body
        if status != 409:
            raise ApiError(f"{self.name}: cannot create {what}", status, body)
        path = object_path(obj)
        for _ in range(10):  # a replace needs the current resourceVersion; retry when it moves
            status, old = self.request("GET", path, token=token)
            if status != 200:
                raise ApiError(f"{self.name}: cannot read {what} to replace it", status, old)
            new = json.loads(json.dumps(obj))
            new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
            status, body = self.request("PUT", path, new, token=token)
            if status == 200:
                return body
            if status != 409:
                raise ApiError(f"{self.name}: cannot replace {what}", status, body)
        raise ApiError(f"{self.name}: cannot replace {what} (it keeps changing)", status, body)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
            token: str | None = None) -> dict | None:
        """One object, or None when it does not exist (ApiError on any other refusal)."""
        status, body = self.request("GET", resource_path(api_version, kind, namespace, name), token=token)
        if status == 404:
            return None
        if status != 200:
            raise ApiError(f"{self.name}: cannot get {kind} {namespace or ''}/{name}", status, body)
        return body

    def list(self, api_version: str, kind: str, namespace: str | None = None, *, label_selector: str | None = None,
             token: str | None = None) -> list[dict]:
        """The objects of a kind (in one namespace, or all), optionally by label selector."""
        path = resource_path(api_version, kind, namespace)
        if label_selector:
            path += "?labelSelector=" + urllib.parse.quote(label_selector)
        status, body = self.request("GET", path, token=token)
        if status != 200:
            raise ApiError(f"{self.name}: cannot list {kind} in {namespace or 'all namespaces'}", status, body)
        return body.get("items") or []

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
               token: str | None = None) -> bool:
        """Deletes one object; False when it did not exist."""
        status, body = self.request("DELETE", resource_path(api_version, kind, namespace, name), token=token)
        if status == 404:
            return False
        if status not in (200, 202):
            raise ApiError(f"{self.name}: cannot delete {kind} {namespace or ''}/{name}", status, body)
        return True

    def wait_crds_established(self, names, timeout: float = 30.0) -> None:
        """Waits until each CRD (by name, e.g. "serviceimports.multicluster.x-k8s.io") is
        Established and its resource answers a list (its REST storage is up)."""
        deadline = time.monotonic() + timeout
        for name in names:
            last = None
            while True:
                status, crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                last = (status, crd)
                if status == 200:
                    conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                    if conds.get("Established") == "True":
                        spec = crd["spec"]
                        version = next(v["name"] for v in spec["versions"] if v.get("served"))
                        path = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}?limit=1"
                        status, body = self.request("GET", path)
                        last = (status, body)
                        if status == 200:
                            break
                if time.monotonic() > deadline:
                    raise ClusterError(f"{self.name}: CRD {name} not established after {timeout:.0f} s; last answer {last}")
                time.sleep(0.1)

    def _bind_limited_user(self) -> None:
        """Binds the limited user to limited_clusterrole (and to nothing else)."""
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        name = f"meridian-test-{LIMITED_USER}"
        status, old = self.request("GET", f"{rbac}/clusterrolebindings/{name}")
        if status == 200 and old.get("roleRef", {}).get("name") == self.limited_clusterrole:
            return  # kept from an earlier start over the same etcd data
        if status == 200:  # bound to another role by an earlier start; roleRef is immutable
            status, body = self.request("DELETE", f"{rbac}/clusterrolebindings/{name}")
            if status not in (200, 202, 404):
                raise ClusterError(f"cannot delete ClusterRoleBinding {name}: {status} {body}")
        if not self.limited_clusterrole:
            return
        if self.limited_clusterrole == DEFAULT_LIMITED_CLUSTERROLE:
            status, body = self.request("POST", f"{rbac}/clusterroles", READ_ONLY_CLUSTERROLE)
            if status not in (201, 409):
                raise ClusterError(f"cannot create ClusterRole {DEFAULT_LIMITED_CLUSTERROLE}: {status} {body}")
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": self.limited_clusterrole},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": LIMITED_USER}],
        }
        status, body = self.request("POST", f"{rbac}/clusterrolebindings", binding)
        if status != 201:
            raise ClusterError(f"cannot bind {LIMITED_USER} to ClusterRole {self.limited_clusterrole}: {status} {body}")

    def _write_state(self) -> None:
        (self.dir / "cluster.json").write_text(json.dumps(self.info(), indent=2) + "\n")

    def start(self) -> "KubeCluster":
        self._prepare()
        for attempt in range(3):
            try:
                self.start_etcd()
                self.start_apiserver()
                break
            except ClusterError as e:
                self.stop()
                in_use = "address already in use" in str(e)
                if not in_use or attempt == 2:
                    raise
                self._ports = _free_ports(3)  # another process took a port: pick new ones
        try:
            self._bind_limited_user()
            self._write_kubeconfig(self.admin_kubeconfig, ADMIN_USER, self.admin_token)
            self._write_kubeconfig(self.limited_kubeconfig, LIMITED_USER, self.limited_token)
            for u in self.extra_users:
                self._write_kubeconfig(self.kubeconfig_for(u), u, self.tokens[u])
            self._write_state()
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _terminate(p: subprocess.Popen | None, timeout: float = 20) -> None:
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def stop_apiserver(self) -> None:
        self._terminate(self.apiserver)
        self.apiserver = None

    def stop(self) -> None:
        self.stop_apiserver()
        self._terminate(self.etcd)
        self.etcd = None

    def __enter__(self) -> "KubeCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Owner(threading.Thread):
    """Starts one cluster and lives until told to stop it: the children's PR_SET_PDEATHSIG
    fires when the thread that started them ends, so that thread must outlive them."""

    def __init__(self, cluster: KubeCluster):
        super().__init__(name=f"kube-{cluster.name}", daemon=True)
        self.cluster = cluster
        self.started = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.cluster.start()
        except BaseException as e:  # noqa: BLE001 - handed to start_all
            self.error = e
            self.started.set()
            return
        self.started.set()
        self.stopping.wait()
        self.cluster.stop()


def start_all(clusters: list[KubeCluster]) -> list[KubeCluster]:
    """Starts the clusters side by side, each from a thread of its own that lives until
    stop_all (so the processes outlive this call). When one fails, stops the others and
    raises its error."""
    owners = [_Owner(c) for c in clusters]
    for o in owners:
        o.start()
    for o in owners:
        o.started.wait()
    failed = [o for o in owners if o.error is not None]
    if failed:
        stop_all(clusters)
        raise ClusterError("; ".join(f"{o.cluster.name}: {o.error}" for o in failed)) from failed[0].error
    for c, o in zip(clusters, owners):
        c._owner = o
    return clusters


def stop_all(clusters: list[KubeCluster]) -> None:
    """Stops clusters started by start_all (all at once), or by start() (one by one)."""
    owners = [getattr(c, "_owner", None) for c in clusters]
    for c, o in zip(clusters, owners):
        if o is not None:
            o.stopping.set()
    for c, o in zip(clusters, owners):
        if o is not None:
            o.join()
            c._owner = None
        c.stop()  # also whatever a test (re)started from another thread


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except (OSError, IndexError):
        return False


def _stop_pids(pids: list[int], timeout: float = 20) -> None:
    """SIGTERM all of `pids`, wait for them together, SIGKILL what is left."""
    pids = [p for p in pids if p]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for p in pids:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start clusters and print one JSON line per cluster when ready")
    down = sub.add_parser("down", help="stop clusters started with 'up --detach'")
    for p in (up, down):
        p.add_argument("--work-dir", required=True, help="clusters go in WORK_DIR/NAME/")
        p.add_argument("--name", action="append", help="a cluster's name (repeat for several; default: kube)")
    up.add_argument("--etcd", help="etcd-embed binary (default: $ETCD_BIN or built by etcd.sh)")
    up.add_argument("--kube-apiserver", help="kube-apiserver binary (default: $KUBE_APISERVER_BIN or kube-apiserver.sh)")
    up.add_argument("--limited-clusterrole", default=DEFAULT_LIMITED_CLUSTERROLE,
                    help=f"ClusterRole bound to the limited user ('' for none; default: {DEFAULT_LIMITED_CLUSTERROLE}, "
                         "read-only on everything, made by the launcher)")
    up.add_argument("--user", action="append", default=[],
                    help="an extra token user (repeat for several): a token in tokens.csv and DIR/NAME/USER.kubeconfig, "
                         "no rights until bound")
    up.add_argument("--apiserver-arg", action="append", default=[], metavar="ARG",
                    help="an extra kube-apiserver flag, e.g. --apiserver-arg=--watch-cache=false (repeat for several)")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for each cluster (default 180)")
    up.add_argument("--detach", action="store_true", help="exit when ready, leaving the clusters running")
    up.add_argument("--exit-on-stdin-eof", action="store_true", help="also stop when standard input closes")
    args = ap.parse_args(argv)
    work = Path(args.work_dir).resolve()
    names = args.name or ["kube"]
    if len(set(names)) != len(names):
        ap.error("cluster names must differ")

    if args.cmd == "down":
        pids = []
        for n in names:
            try:
                pids.append(json.loads((work / n / "cluster.json").read_text())["pids"])
            except (OSError, ValueError, KeyError):
                print(f"kube_cluster.py: no cluster.json with pids in {work / n}", file=sys.stderr)
        # The API servers first (they would complain about a vanished etcd), then etcd.
        _stop_pids([p.get("kube-apiserver") for p in pids])
        _stop_pids([p.get("etcd") for p in pids])
        return 0

    try:
        etcd_bin = args.etcd or etcd_binary()
        kas_bin = args.kube_apiserver or kube_apiserver_binary()
    except ClusterError as e:
        print(f"kube_cluster.py: {e}", file=sys.stderr)
        return 1
    clusters = [
        KubeCluster(work / n, n, etcd_bin=etcd_bin, kube_apiserver_bin=kas_bin,
                    limited_clusterrole=args.limited_clusterrole or None, ready_timeout=args.timeout,
                    die_with_parent=not args.detach, extra_users=args.user,
                    extra_apiserver_args=args.apiserver_arg)
        for n in names
    ]
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: stop.set())

    errors: list[str] = []
    lock = threading.Lock()
    settled = threading.Semaphore(0)

    # Each cluster is started, and later stopped, by a thread of its own that lives as
    # long as the cluster: the children's PR_SET_PDEATHSIG fires when the *thread* that
    # started them ends, not only when this process does.
    def run(c: KubeCluster) -> None:
        try:
            c.start()
        except Exception as e:  # noqa: BLE001 - reported, and the others are stopped
            with lock:
                errors.append(f"{c.name}: {e}")
            settled.release()
            return
        with lock:
            print(json.dumps(c.info()), flush=True)
        settled.release()
        if args.detach:
            return
        stop.wait()
        c.stop()

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in clusters]
    for t in threads:
        t.start()
    for _ in threads:
        while not settled.acquire(timeout=0.2):
            if stop.is_set():
                break
        if stop.is_set():
            break
    if errors or stop.is_set():
        for e in errors:
            print(f"kube_cluster.py: {e}", file=sys.stderr)
        stop.set()
        for t in threads:
            t.join()
        for c in clusters:
            c.stop()
        return 1 if errors else 0
    if args.detach:
        return 0

    if args.exit_on_stdin_eof:
        def watch_stdin() -> None:
            while sys.stdin.buffer.read(4096):
                pass
            stop.set()
        threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.is_set():
        for c in clusters:
            for proc, what in ((c.etcd, "etcd"), (c.apiserver, "kube-apiserver")):
                if proc is not None and proc.poll() is not None:
                    print(f"kube_cluster.py: {what} of {c.name} exited with {proc.returncode}", file=sys.stderr)
                    stop.set()
        stop.wait(0.5)
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
