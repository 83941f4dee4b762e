"""The federation API gateway (DESIGN §11) on real kube-apiservers, driven by kubectl built
from the same release, and by plain HTTPS requests with ID tokens the test mints (PyJWT).

A fleet of its own (hub, m1, m2, m3, every request audited at Metadata) with
deploy/rbac/gateway.yaml applied everywhere: meridian may impersonate, and the clusters'
own RBAC decides what each caller may do. ana (group shop-devs) may change ConfigMaps and Services in
namespace shop of every member and read the hub's policies there; bob is bound to nothing;
carol may change ConfigMaps in every namespace of every member, but a Tenant bounds her.
"""

import base64
import json
import os
import re
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from conftest import BIN, _openssl, free_port, make_certs
from kube_fleet import CORE, NAMESPACE, ROOT, started, wait_for

GATEWAY_RBAC = ROOT / "deploy" / "rbac" / "gateway.yaml"
ISSUER, AUDIENCE = "https://issuer.meridian.test", "meridian-gateway"
PREFIX = "oidc:"
ANA, BOB, CAROL = "ana@shop.test", "bob@shop.test", "carol@ads.test"
EVERYTHING_AUDITED = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                      "rules": [{"level": "Metadata"}]}


def kubectl_bin() -> str:
    path = os.environ.get("KUBECTL_BIN")
    if not path or not Path(path).exists():
        pytest.fail("KUBECTL_BIN is not set to a kubectl binary: tests/run builds it (tests/peers/kubectl.sh)")
    return path


def b64url_uint(n: int, length: int | None = None) -> str:
    """An unsigned integer in base64url, big-endian, in `length` bytes (default: as few as fit)."""
    raw = n.to_bytes(length or (n.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class Issuer:
    """An OIDC issuer of the test's own: an RSA and a P-256 key, published as a JWKS file."""

    def __init__(self, d: Path):
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        rn = self.rsa.public_key().public_numbers()
        en = self.ec.public_key().public_numbers()
        self.jwks = d / "jwks.json"
        self.jwks.write_text(json.dumps({"keys": [
            {"kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256", "n": b64url_uint(rn.n), "e": b64url_uint(rn.e)},
            {"kty": "EC", "kid": "ec-1", "crv": "P-256", "x": b64url_uint(en.x, 32), "y": b64url_uint(en.y, 32)},
        ]}))

    def token(self, email, groups=(), *, alg="RS256", audience=AUDIENCE, lifetime=600, tenant=None, **extra):
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": audience, "sub": email, "email": email, "groups": list(groups),
                  "iat": now, "nbf": now - 5, "exp": now + lifetime, **extra}
        if tenant:
            claims["tenant"] = tenant
        if alg == "none":
            return jwt.encode(claims, None, algorithm="none")
        key, kid = (self.rsa, "rsa-1") if alg == "RS256" else (self.ec, "ec-1")
        return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})


class Gateway:
    def __init__(self, meridian, port, ca, issuer):
        self.meridian, self.port, self.ca, self.issuer = meridian, port, ca, issuer
        self.url = f"https://127.0.0.1:{port}"
        self.ctx = ssl.create_default_context(cafile=str(ca))

    def request(self, path, *, token=None, method="GET", body=None, headers=None, timeout=10):
        """(status, headers, parsed JSON or text) of one request."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
                status, hdrs, raw = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, raw = e.code, e.headers, e.read()
        try:
            return status, hdrs, json.loads(raw)
        except ValueError:
            return status, hdrs, raw.decode(errors="replace")

    def kubectl(self, server_path, *args, token=None, check=True, timeout=30):
        token = token or self.issuer.token(ANA, ["shop-devs"])
        cmd = [kubectl_bin(), "--kubeconfig", os.devnull, "--server", self.url + server_path,
               "--certificate-authority", str(self.ca), "--token", token, *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
        return r


PROM = "prometheus@monitoring.test"


def grant_callers(fleet, members=("m1", "m2", "m3")):
    """ana's group edits namespace shop in every member and reads the hub's policies there."""
    group = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": PREFIX + "shop-devs"}
    # Not the built-in `edit`: it is an aggregated role, filled by a controller manager these
    # clusters do not run.
    scraper = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PREFIX + PROM}
    for name in members:
        fleet.cluster(name).apply([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "metrics-reader"}, "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "metrics-reader"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-reader"},
             "subjects": [scraper]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "shop-dev"},
             "rules": [{"apiGroups": [""], "resources": ["configmaps", "services"], "verbs": ["*"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "shop-devs-edit", "namespace": NAMESPACE},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "shop-dev"},
             "subjects": [group]},
        ])
    # carol's RBAC lets her touch ConfigMaps anywhere: only her Tenant stops her.
    carol = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PREFIX + CAROL}
    for name in members:
        fleet.cluster(name).apply([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "configmaps-everywhere"},
             "rules": [{"apiGroups": [""], "resources": ["configmaps", "namespaces"], "verbs": ["*"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "carol-configmaps"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "configmaps-everywhere"},
             "subjects": [carol]},
        ])
    fleet.hub.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "policy-reader", "namespace": NAMESPACE},
         "rules": [{"apiGroups": ["meridian.io"], "resources": ["clusterschedulingpolicies"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "shop-devs-policies", "namespace": NAMESPACE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "policy-reader"},
         "subjects": [group]},
    ])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("gateway")
    with started(root / "kube", audit=EVERYTHING_AUDITED) as fleet:
        gateway_rbac = [d for d in yaml.safe_load_all(GATEWAY_RBAC.read_text()) if d]
        for c in fleet.clusters:
            c.apply(gateway_rbac)
        grant_callers(fleet)
        # Namespaces for Tenants are written with the propagation role.
        fleet.grant_propagation()
        ca, cert, key = make_certs(root / "tls")
        issuer = Issuer(root)
        port = free_port()
        m = fleet.start_meridian(gateway={
            "listen": f"127.0.0.1:{port}",
            "tls": {"cert": str(cert), "key": str(key), "clientCA": str(ca)},
            "oidc": {"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": str(issuer.jwks),
                     "usernameClaim": "email", "groupsClaim": "groups", "tenantClaim": "tenant",
                     "usernamePrefix": PREFIX, "groupsPrefix": PREFIX},
            "maxBodyBytes": 1024 * 1024,
            "memberTimeoutSeconds": 3,
        })
        gw = Gateway(m, port, ca, issuer)
        gw.tls_dir = root / "tls"
        gw.fleet = fleet
        try:
            yield gw
        finally:
            fleet.stop_meridians()


def every_member_healthy(gw):
    wait_for(lambda: all(c["health"] == "Healthy" for c in json.loads(gw.meridian.http("/debug/clusters")[1])["clusters"]),
             timeout=30, what="every member Healthy")


def configmap(name, data=None, namespace=NAMESPACE):
    return {"apiVersion": CORE, "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": data or {"k": name}}


def test_kubectl_works_each_member_and_the_hub_as_the_caller(gateway, tmp_path):
    gw, fleet = gateway, gateway.fleet
    # apply, get and delete in one member, as ana: the member's audit log shows meridian
    # acting as ana, and the object is in m1 only.
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(yaml.safe_dump(configmap("through-gateway")))
    out = gw.kubectl("/clusters/m1", "apply", "-f", str(manifest)).stdout
    assert "configmap/through-gateway" in out, out
    assert fleet.cluster("m1").get(CORE, "ConfigMap", "through-gateway", NAMESPACE)
    assert fleet.cluster("m3").get(CORE, "ConfigMap", "through-gateway", NAMESPACE) is None
    got = json.loads(gw.kubectl("/clusters/m1", "get", "configmap", "through-gateway", "-n", NAMESPACE,
                                "-o", "json").stdout)
    assert got["data"] == {"k": "through-gateway"}
    r = gw.kubectl("/clusters/m3", "get", "configmap", "through-gateway", "-n", NAMESPACE, check=False)
    assert r.returncode != 0 and "NotFound" in r.stderr, r.stderr

    whoami = json.loads(gw.kubectl("/clusters/m1", "auth", "whoami", "-o", "json").stdout)
    info = whoami["status"]["userInfo"]
    assert info["username"] == PREFIX + ANA, info
    assert PREFIX + "shop-devs" in info["groups"], info

    gw.kubectl("/clusters/m1", "delete", "configmap", "through-gateway", "-n", NAMESPACE)
    assert fleet.cluster("m1").get(CORE, "ConfigMap", "through-gateway", NAMESPACE) is None
    creates = [e for e in fleet.audit_events("m1") if e.get("verb") == "create"
               and (e.get("objectRef") or {}).get("name") == "through-gateway"]
    assert creates, "the create is in m1's audit log"
    assert all(e["user"]["username"] == "meridian" and e["impersonatedUser"]["username"] == PREFIX + ANA
               for e in creates), creates

    # The hub's API through /: ana lists the policies in shop.
    fleet.policy("web", {"resourceSelectors": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}],
                         "placement": {"clusterAffinities": [{"name": "eu", "clusterNames": ["m1"]}]}})
    listed = json.loads(gw.kubectl("", "get", "clusterschedulingpolicies.meridian.io", "-n", NAMESPACE,
                                   "-o", "json").stdout)
    assert [p["metadata"]["name"] for p in listed["items"]] == ["web"]
    # `meridian gateway kubeconfig`: a context per member, `fleet` (*) and `hub`.
    token_file = tmp_path / "ana.token"
    token_file.write_text(gw.issuer.token(ANA, ["shop-devs"]))
    r = subprocess.run([str(BIN), "gateway", "kubeconfig", "--user", "ana", "--certificate-authority", str(gw.ca),
                        "--token-file", str(token_file), "--admin", f"127.0.0.1:{gw.meridian.admin_port}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    kubeconfig = tmp_path / "gateway.kubeconfig"
    kubeconfig.write_text(r.stdout)
    contexts = {c["name"] for c in yaml.safe_load(r.stdout)["contexts"]}
    assert contexts == {"fleet", "hub", "m1", "m2", "m3"}, contexts
    fleet.cluster("m3").apply(configmap("in-m3"))
    for context, present in (("m3", True), ("m1", False), ("fleet", True)):
        r = subprocess.run([kubectl_bin(), "--kubeconfig", str(kubeconfig), "--context", context, "get",
                            "configmaps", "-n", NAMESPACE, "-o", "name"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (context, r.stderr)
        assert ("configmap/in-m3" in r.stdout) == present, (context, r.stdout)
    fleet.cluster("m3").delete(CORE, "ConfigMap", "in-m3", NAMESPACE)

    # bob is bound to nothing: the member's 403 passes through, as the member's Status.
    status, _, body = gw.request(f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps",
                                 token=gw.issuer.token(BOB))
    assert status == 403 and body["reason"] == "Forbidden", body
    assert PREFIX + BOB in body["message"], body


def test_star_lists_every_member_merged_pages_and_conflicts(gateway):
    gw, fleet = gateway, gateway.fleet
    for member, names in {"m1": ["a-one", "shared"], "m2": ["b-two"], "m3": ["c-three", "shared", "z-last"]}.items():
        for n in names:
            fleet.cluster(member).apply(configmap(n))
    path = f"/clusters/*/api/v1/namespaces/{NAMESPACE}/configmaps"
    token = gw.issuer.token(ANA, ["shop-devs"], alg="ES256")

    def ours(items):
        return [(i["metadata"]["annotations"]["meridian.io/cluster"], i["metadata"]["name"]) for i in items
                if i["metadata"]["name"] != "kube-root-ca.crt"]

    status, _, body = gw.request(path, token=token)
    assert status == 200, body
    everything = [("m1", "a-one"), ("m1", "shared"), ("m2", "b-two"), ("m3", "c-three"), ("m3", "shared"),
                  ("m3", "z-last")]
    assert ours(body["items"]) == everything
    assert body["metadata"]["resourceVersion"].startswith("mrv2.")
    # Equal state, equal version.
    assert gw.request(path, token=token)[2]["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]

    # Pages of 2 across members: each object exactly once, in the same order.
    seen, cont = [], None
    for _ in range(20):
        status, _, page = gw.request(path + "?limit=2" + (f"&continue={cont}" if cont else ""), token=token)
        assert status == 200, page
        assert len(page["items"]) <= 2
        seen += page["items"]
        cont = page["metadata"].get("continue")
        if not cont:
            break
    assert ours(seen) == everything, ours(seen)

    # kubectl through * (its Table form, in chunks), and a named GET two members answer.
    out = gw.kubectl("/clusters/*", "get", "configmaps", "-n", NAMESPACE, "--chunk-size=2").stdout
    for _, name in everything:
        assert name in out, out
    status, _, body = gw.request(path + "/shared", token=token)
    assert status == 409 and "m1" in body["message"] and "m3" in body["message"], body
    status, _, body = gw.request(path + "/z-last", token=token)
    assert status == 200 and body["metadata"]["annotations"]["meridian.io/cluster"] == "m3", body
    # Writes are per member.
    status, _, body = gw.request(path, token=token, method="POST", body=configmap("nope"))
    assert status == 405 and body["kind"] == "Status", body


def test_star_lists_past_a_member_page_hold_every_object_once(gateway):
    """m2 holds more ConfigMaps than a member page (500): an unpaged LIST through * pages m2
    itself (m2's audit log shows its own continue token) and streams every object once; a
    client paging through * with `limit` and `continue` gets every object once too, with
    tokens of a few hundred bytes; a token whose list the gateway does not hold is 410
    Expired (as an API server answers a compacted one), and kubectl's pager reads it all."""
    gw, fleet = gateway, gateway.fleet
    m2 = fleet.cluster("m2")
    bulk = [dict(configmap(f"bulk-{i:04}"), metadata={"name": f"bulk-{i:04}", "namespace": NAMESPACE,
                                                       "labels": {"bulk": "yes"}})
            for i in range(520)]
    threads = [threading.Thread(target=m2.apply, args=(bulk[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    path = f"/clusters/*/api/v1/namespaces/{NAMESPACE}/configmaps"
    token = gw.issuer.token(ANA, ["shop-devs"])

    def ours(items):
        return [(i["metadata"]["annotations"]["meridian.io/cluster"], i["metadata"]["name"]) for i in items
                if i["metadata"]["name"] != "kube-root-ca.crt"]

    try:
        status, headers, body = gw.request(path, token=token, timeout=60)
        assert status == 200, body
        assert not headers.get_all("Warning"), headers.get_all("Warning")
        everything = ours(body["items"])
        assert len(everything) == len(set(everything)), "an object twice"
        assert everything == sorted(everything), "not in (cluster, namespace, name) order"
        assert sum(1 for c, n in everything if c == "m2" and n.startswith("bulk-")) == 520
        continued = [e["requestURI"] for e in fleet.audit_events("m2")
                     if e.get("verb") == "list" and "/configmaps?" in e["requestURI"]
                     and (e.get("impersonatedUser") or {}).get("username") == PREFIX + ANA
                     and "continue=" in e["requestURI"] and "limit=500" in e["requestURI"]]
        assert continued, "the gateway paged m2 with m2's own continue token"

        seen, tokens = [], []
        for _ in range(40):
            cont = tokens[-1] if tokens else None
            status, _, page = gw.request(path + "?limit=150" + (f"&continue={cont}" if cont else ""), token=token)
            assert status == 200, page
            assert len(page["items"]) <= 150
            seen += page["items"]
            if not page["metadata"].get("continue"):
                break
            tokens.append(page["metadata"]["continue"])
        assert ours(seen) == everything
        assert len(tokens) >= 3 and all(t.startswith("mct2.") and len(t) < 1024 for t in tokens), tokens
        # The last page's version names every member: a watch from it starts each one.
        assert page["metadata"]["resourceVersion"].startswith("mrv2.")

        forged = "mct2." + base64.urlsafe_b64encode(b'{"l":"not-held","m":"m2","c":""}').rstrip(b"=").decode()
        status, _, body = gw.request(path + f"?limit=150&continue={forged}", token=token)
        assert status == 410 and body["reason"] == "Expired", body

        out = gw.kubectl("/clusters/*", "get", "configmaps", "-n", NAMESPACE, "--chunk-size=100",
                         "-o", "name").stdout
        assert sum(1 for line in out.splitlines() if line.startswith("configmap/bulk-")) == 520, out
    finally:
        status, body = m2.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/configmaps?labelSelector=bulk%3Dyes")
        assert status == 200, body


def read_events(gw, path, token, stop_after, timeout=20):
    """Events of a watch through the gateway until `stop_after(events)` is true."""
    req = urllib.request.Request(gw.url + path, headers={"Authorization": f"Bearer {token}"})
    events = []
    with urllib.request.urlopen(req, context=gw.ctx, timeout=timeout) as r:
        for line in r:
            if line.strip():
                events.append(json.loads(line))
                if stop_after(events):
                    break
    return events


def test_star_watch_carries_a_composite_version_to_resume_from(gateway):
    gw, fleet = gateway, gateway.fleet
    token = gw.issuer.token(ANA, ["shop-devs"])
    path = f"/clusters/*/api/v1/namespaces/{NAMESPACE}/configmaps"
    status, _, listed = gw.request(path, token=token)
    assert status == 200, listed
    start = listed["metadata"]["resourceVersion"]
    names = [f"w-{i}" for i in range(6)]

    def writer():
        for i, n in enumerate(names):
            fleet.cluster("m1" if i % 2 == 0 else "m3").apply(configmap(n))
            time.sleep(0.1)

    t = threading.Thread(target=writer)
    t.start()
    watch = f"{path}?watch=1&resourceVersion={start}&allowWatchBookmarks=true"
    events = read_events(gw, watch, token,
                         lambda ev: {e["object"]["metadata"]["name"] for e in ev if e["type"] == "ADDED"} >= set(names))
    t.join()
    added = [e for e in events if e["type"] == "ADDED"]
    assert sorted(e["object"]["metadata"]["name"] for e in added) == names
    for e in added:
        i = names.index(e["object"]["metadata"]["name"])
        assert e["object"]["metadata"]["annotations"]["meridian.io/cluster"] == ("m1" if i % 2 == 0 else "m3")
        assert e["object"]["metadata"]["resourceVersion"].startswith("mrv2.")
    # Resuming from the third event's version gives exactly the events after it.
    middle = added[2]["object"]["metadata"]["resourceVersion"]
    rest = {e["object"]["metadata"]["name"] for e in added[3:]}
    again = read_events(gw, f"{path}?watch=1&resourceVersion={middle}", token,
                        lambda ev: {e["object"]["metadata"]["name"] for e in ev if e["type"] == "ADDED"} >= rest)
    assert sorted(e["object"]["metadata"]["name"] for e in again if e["type"] == "ADDED") == sorted(rest)

    # kubectl get -w through * while two members change.
    proc = subprocess.Popen([kubectl_bin(), "--kubeconfig", os.devnull, "--server", gw.url + "/clusters/*",
                             "--certificate-authority", str(gw.ca), "--token", token, "get", "configmaps",
                             "-n", NAMESPACE, "-w", "--output-watch-events"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        fleet.cluster("m1").apply(configmap("kw-m1"))
        fleet.cluster("m3").apply(configmap("kw-m3"))
        fleet.cluster("m1").delete(CORE, "ConfigMap", "kw-m1", NAMESPACE)
        time.sleep(3)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert "kw-m1" in out and "kw-m3" in out, f"{out}\n{err}"
    assert any(line.startswith("DELETED") and "kw-m1" in line for line in out.splitlines()), out


def test_tokens_are_checked_and_forged_identity_headers_never_reach_a_member(gateway):
    gw, fleet = gateway, gateway.fleet
    path = f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps"
    for what, token in [
        ("no token", None),
        ("expired", gw.issuer.token(ANA, ["shop-devs"], lifetime=-120)),
        ("another audience", gw.issuer.token(ANA, ["shop-devs"], audience="kubernetes")),
        ("unsigned (alg none)", gw.issuer.token(ANA, ["shop-devs"], alg="none")),
        ("garbage", "not.a.token"),
    ]:
        status, _, body = gw.request(path, token=token)
        assert status == 401, (what, status, body)
        assert body["kind"] == "Status" and body["reason"] == "Unauthorized", (what, body)

    # bob forges admin headers: they are stripped; m1 sees meridian acting as bob, refused.
    status, _, body = gw.request("/clusters/m1/api/v1/namespaces/kube-system/secrets", token=gw.issuer.token(BOB),
                                 headers={"Impersonate-User": "system:admin", "Impersonate-Group": "system:masters",
                                          "X-Remote-User": "system:admin", "X-Tenant-ID": "root"})
    assert status == 403, body
    assert PREFIX + BOB in body["message"], body
    events = [e for e in fleet.audit_events("m1")
              if (e.get("objectRef") or {}).get("resource") == "secrets"
              and (e.get("objectRef") or {}).get("namespace") == "kube-system" and e["user"]["username"] == "meridian"]
    assert events, "bob's request is in m1's audit log"
    assert {e["impersonatedUser"]["username"] for e in events} == {PREFIX + BOB}, events
    assert not any("system:masters" in (e["impersonatedUser"].get("groups") or []) for e in events), events


def test_bad_paths_big_bodies_and_a_down_member(gateway, tmp_path):
    """…and /clusters/metrics scraped by a real Prometheus: every member's series labelled by
    cluster beside meridian's own; a member down is `meridian_gateway_member_up` 0 and its
    series go, the others stay."""
    from test_observability import Prometheus, _tool

    gw, fleet = gateway, gateway.fleet
    token = gw.issuer.token(ANA, ["shop-devs"])
    scraper_token = tmp_path / "prometheus.token"
    scraper_token.write_text(gw.issuer.token(PROM, lifetime=1800))
    prometheus = Prometheus(_tool("prometheus"), tmp_path, f"127.0.0.1:{gw.port}", scheme="https",
                            metrics_path="/clusters/metrics", tls_config={"ca_file": str(gw.ca)},
                            authorization={"type": "Bearer", "credentials_file": str(scraper_token)})
    for path in ("/clusters/../api/v1/namespaces/kube-system/secrets", "/clusters/%2e%2e/api/v1/secrets",
                 "/clusters/m1/api/v1/../../../etc", "/clusters/nosuch/api/v1/namespaces"):
        status, _, body = gw.request(path, token=token)
        assert status == 404, (path, status, body)
    status, _, body = gw.request(f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps", token=token,
                                 method="POST", body=b"x" * (2 * 1024 * 1024))
    assert status == 413 and body["reason"] == "RequestEntityTooLarge", body

    # m2 down: `*` answers the others with a Warning naming m2; m2 itself is 503 once
    # Unreachable; the others keep answering.
    try:
        for m in ("m1", "m2", "m3"):
            prometheus.wait_for(f'apiserver_request_total{{cluster="{m}"}}', f"{m}'s API server series")
        up = prometheus.wait_for("meridian_gateway_member_up == 1", "every member scraped")
        assert sorted(r["metric"]["cluster"] for r in up) == ["m1", "m2", "m3"], up
        prometheus.wait_for("meridian_gateway_requests_total", "meridian's own series")
    except AssertionError as e:
        targets = prometheus.api("targets")["data"]["activeTargets"]
        up = prometheus.query("meridian_gateway_member_up")
        prometheus.stop()
        raise AssertionError(f"{e}\nscrape: {[(t['health'], t['lastError']) for t in targets]}; up: {up}; "
                             f"gateway: {gw.meridian.http('/debug/gateway')[1][:1500]}") from None
    except BaseException:
        prometheus.stop()
        raise
    fleet.cluster("m1").apply(configmap("still-here"))
    fleet.stop_apiserver("m2")
    try:
        path = f"/clusters/*/api/v1/namespaces/{NAMESPACE}/configmaps"

        last = []

        def partial():
            status, headers, body = gw.request(path, token=token)
            warnings = headers.get_all("Warning") or []
            last[:] = [status, warnings, str(body)[:300]]
            return (status, warnings, body) if status == 200 and any("m2" in w for w in warnings) else None

        try:
            status, warnings, body = wait_for(partial, timeout=20, what="a partial list with a Warning naming m2")
        except AssertionError as e:
            raise AssertionError(f"{e}; the last answer: {last}") from None
        names = {i["metadata"]["name"] for i in body["items"]}
        assert "still-here" in names
        assert all(i["metadata"]["annotations"]["meridian.io/cluster"] != "m2" for i in body["items"])
        wait_for(lambda: gw.request("/clusters/m2/api/v1/namespaces", token=token)[0] == 503, timeout=20,
                 what="m2 answers 503 once Unreachable")
        _, _, body = gw.request("/clusters/m2/api/v1/namespaces", token=token)
        assert "m2" in body["message"] and body["kind"] == "Status", body
        status, _, body = gw.request(f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps/still-here", token=token)
        assert status == 200, body
        status, metrics = gw.meridian.http("/metrics")
        assert 'meridian_gateway_partial_total{cluster="m2"}' in metrics
        prometheus.wait_for('meridian_gateway_member_up{cluster="m2"} == 0', "m2 not scraped")
        prometheus.wait_for('absent(apiserver_request_total{cluster="m2"})', "m2's series gone")
        assert prometheus.query('apiserver_request_total{cluster="m1"}'), "m1's series stay"
    finally:
        prometheus.stop()
        fleet.start_apiserver("m2")
    # The view keeps the last 50 problems (m2's failed scrapes are many): a refused token now.
    assert gw.request(f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps", token="garbage")[0] == 401
    status, body = gw.meridian.http("/debug/gateway")
    view = json.loads(body)
    assert view["enabled"] and view["gateway"]["keys"] == 2, view
    assert any(p["code"] == 401 for p in view["gateway"]["recentProblems"]), view


def kube_clients_dir() -> Path:
    path = os.environ.get("KUBE_CLIENTS_DIR")
    if not path or not (Path(path) / "gateway-informer").exists():
        pytest.fail("KUBE_CLIENTS_DIR is not set to the Go client peers: tests/run builds them "
                    "(tests/peers/kube-clients.sh)")
    return Path(path)


def test_a_client_go_reflector_through_star_resumes_after_a_cut_and_holds_exactly_the_members_objects(
        gateway, tmp_path):
    """client-go's Reflector lists and watches /clusters/* through a proxy the test cuts
    mid-stream while m1 and m3 change at about 50 writes/s: it watches again from its last
    (composite) version — no relist — and ends with exactly the objects in the members."""
    import random

    from test_kube_faults import FreezableProxy

    gw, fleet = gateway, gateway.fleet
    # Every member reachable first: a member coming back mid-watch rightly makes the client
    # relist (its part of the version is missing), which is not what this test is about.
    every_member_healthy(gw)
    proxy = FreezableProxy(gw.port)
    token = tmp_path / "token"
    token.write_text(gw.issuer.token(ANA, ["shop-devs"]))
    state_path = tmp_path / "state.json"
    proc = subprocess.Popen([str(kube_clients_dir() / "gateway-informer"),
                             "-server", f"https://127.0.0.1:{proxy.port}/clusters/*", "-ca", str(gw.ca),
                             "-token-file", str(token), "-namespace", NAMESPACE, "-state", str(state_path)],
                            stderr=open(tmp_path / "informer.log", "w"))

    def state():
        try:
            return json.loads(state_path.read_text())
        except (OSError, ValueError):
            return None

    try:
        wait_for(lambda: (s := state()) and s["lists"] >= 1 and s["watches"], timeout=20,
                 what="the reflector listed and watches")
        rng = random.Random(15)
        live = {"m1": set(), "m3": set()}
        writes, started_at, cut = 0, time.monotonic(), False
        while time.monotonic() - started_at < 8:
            member = rng.choice(["m1", "m3"])
            c = fleet.cluster(member)
            if live[member] and rng.random() < 0.25:
                name = rng.choice(sorted(live[member]))
                c.delete(CORE, "ConfigMap", name, NAMESPACE)
                live[member].discard(name)
            else:
                name = f"inf-{rng.randrange(40)}"
                c.apply(configmap(name, {"v": str(writes)}))
                live[member].add(name)
            writes += 1
            if not cut and time.monotonic() - started_at > 3:
                proxy.cut()
                cut = True
            time.sleep(max(0.0, started_at + writes / 50 - time.monotonic()))
        rate = writes / (time.monotonic() - started_at)
        print(f"{writes} writes at {rate:.0f}/s, the reflector's connection cut once")
        assert writes >= 200, f"only {writes} writes"

        def expected():
            out = {}
            for member in ("m1", "m2", "m3"):
                for cm in fleet.cluster(member).list(CORE, "ConfigMap", NAMESPACE):
                    out[f"{member}/{NAMESPACE}/{cm['metadata']['name']}"] = (cm.get("data") or {}).get("v", "")
            return out

        want = expected()
        try:
            final = wait_for(lambda: (s := state()) and s["objects"] == want and s, timeout=20,
                             what="the reflector holds exactly the members' objects")
        except AssertionError:
            got = (state() or {}).get("objects", {})
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            stale = sorted(k for k in set(want) & set(got) if want[k] != got[k])
            raise AssertionError(f"missing {missing[:10]}, extra {extra[:10]}, stale {stale[:10]}; "
                                 f"state: lists {(state() or {}).get('lists')}, watches "
                                 f"{len((state() or {}).get('watches', []))}") from None
        assert final["lists"] == 1, f"the reflector listed {final['lists']} times: a relist, not a resume"
        assert len(final["watches"]) >= 2, "the cut connection was not watched again"
        assert all(rv.startswith("mrv2.") for rv in final["watches"]), final["watches"]
    finally:
        proc.kill()
        proc.wait()


def test_a_hanging_member_times_out_and_the_others_answer(gateway):
    """m3's API server frozen (SIGSTOP): its requests end within the member timeout (3 s here)
    with a Status, `*` answers with m1 and m2 and a Warning naming m3, and nothing waits on it."""
    import signal

    gw, fleet = gateway, gateway.fleet
    token = gw.issuer.token(ANA, ["shop-devs"])
    fleet.cluster("m1").apply(configmap("while-m3-hangs"))
    pid = fleet.cluster("m3").apiserver.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        status, _, body = gw.request(f"/clusters/m3/api/v1/namespaces/{NAMESPACE}/configmaps", token=token)
        took = time.monotonic() - started
        # 504 when the request waited out the timeout; 503 once meridian saw m3 Unreachable.
        assert status in (503, 504) and body["kind"] == "Status", (status, body)
        assert took < 8, f"the request to the frozen member took {took:.1f} s"
        started = time.monotonic()
        status, headers, body = gw.request(f"/clusters/*/api/v1/namespaces/{NAMESPACE}/configmaps", token=token)
        took = time.monotonic() - started
        assert status == 200 and took < 8, (status, took)
        assert any("m3" in w for w in headers.get_all("Warning") or []), headers
        assert "while-m3-hangs" in {i["metadata"]["name"] for i in body["items"]}
        status, _, _ = gw.request(f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps/while-m3-hangs", token=token)
        assert status == 200
    finally:
        os.kill(pid, signal.SIGCONT)
    every_member_healthy(gw)


def test_a_thousand_watches_through_star_each_get_the_event(gateway):
    """1,000 concurrent watches through /clusters/* (3,000 member watches behind them): a
    ConfigMap created in m2 reaches every one of them, and closing them all leaves the
    gateway's open-watch count at zero."""
    import asyncio

    gw, fleet = gateway, gateway.fleet
    token = gw.issuer.token(ANA, ["shop-devs"])
    path = f"/clusters/*/api/v1/namespaces/{NAMESPACE}/configmaps"
    rv = gw.request(path, token=token)[2]["metadata"]["resourceVersion"]
    watches = 1000

    attempts, seen = [], []

    async def one(ready: asyncio.Queue, go: asyncio.Event):
        # As a reflector: a watch that ends (a member left out of it, or its own timeout) is
        # watched again from the last version seen, losing nothing.
        version, announced = rv, False
        for _ in range(20):
            attempts.append(1)
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port, ssl=gw.ctx, server_hostname="127.0.0.1")
            # Connection: close, so the end of a watch (a member left out under load ends it
            # within 5 s) is the end of the connection, which this line reader sees; on a
            # kept-alive connection it would wait after the last chunk for ever.
            writer.write(f"GET {path}?watch=1&resourceVersion={version} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
            if not announced:
                announced = True
                await ready.put(1)
            while line := await reader.readline():
                # Chunked: event lines between chunk sizes; every event carries the composite.
                if m := re.search(rb'"resourceVersion":"(mrv2\.[A-Za-z0-9_-]+)"', line):
                    version = m.group(1).decode()
                if b"thousand-watch" in line:
                    seen.append(1)
                    writer.close()
                    return True
            writer.close()
        return False

    def progress(stage):
        view = json.loads(gw.meridian.http("/debug/gateway")[1])["gateway"]
        partial = re.findall(r"meridian_gateway_partial_total\{[^}]*\} \S+", gw.meridian.http("/metrics")[1])
        return (f"{stage}: {len(attempts)} watch requests made, {len(seen)} of {watches} saw the event, "
                f"{view['openWatches']} open in the gateway, members left out: {partial}, "
                f"its last problems: {view['recentProblems'][-5:]}")

    async def run():
        ready, go = asyncio.Queue(), asyncio.Event()
        tasks = [asyncio.create_task(one(ready, go)) for _ in range(watches)]
        try:
            for _ in range(watches):
                await asyncio.wait_for(ready.get(), timeout=120)
        except TimeoutError:
            raise AssertionError(progress("not every watch answered within 120 s")) from None
        await asyncio.to_thread(fleet.cluster("m2").apply, configmap("thousand-watch"))
        try:
            return await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        except TimeoutError:
            raise AssertionError(progress("not every watch saw the event within 120 s")) from None

    started = time.monotonic()
    results = asyncio.run(run())
    print(f"{watches} watches through * opened and each saw the event in {time.monotonic() - started:.1f} s "
          f"({len(attempts)} watch requests)")
    assert sum(results) == watches, f"only {sum(results)} of {watches} watches saw the event"
    # The clients are gone; the next event written to them finds it out, and each watch ends
    # (with the member watches behind it).
    fleet.cluster("m2").apply(configmap("after-the-thousand"))
    wait_for(lambda: json.loads(gw.meridian.http("/debug/gateway")[1])["gateway"]["openWatches"] == 0, timeout=30,
             what="every watch closed in the gateway")


TENANT = "meridian.io/tenant"


def tenant(namespaces):
    return {"apiVersion": "meridian.io/v1alpha1", "kind": "Tenant",
            "metadata": {"name": "ads", "labels": {"team": "ads"}},
            "spec": {"subjects": {"users": [PREFIX + CAROL]}, "namespaces": namespaces,
                     "clusters": {"clusterNames": ["m1", "m2"]}}}


def namespace_state(fleet, member, name):
    """None (absent or being deleted: these clusters run no namespace controller to finish a
    deletion), else its labels."""
    ns = fleet.cluster(member).get(CORE, "Namespace", name)
    if ns is None or ns["metadata"].get("deletionTimestamp"):
        return None
    return ns["metadata"].get("labels") or {}


def test_a_tenant_bounds_its_users_and_its_namespaces_live_in_its_clusters_only(gateway):
    gw, fleet = gateway, gateway.fleet
    # `legacy` exists in m1 already, not meridian's: named by the tenant, it is neither
    # adopted nor ever deleted there.
    fleet.cluster("m1").apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": "legacy"}})
    fleet.hub.apply(tenant(["ads", "ads-dev", "legacy"]))
    try:
        for member in ("m1", "m2"):
            for name in ("ads", "ads-dev"):
                labels = wait_for(lambda: namespace_state(fleet, member, name), timeout=30,
                                  what=f"namespace {name} in {member}", log=gw.meridian)
                assert labels[TENANT] == "ads" and labels["team"] == "ads", labels
                assert labels["app.kubernetes.io/managed-by"] == "meridian", labels
        wait_for(lambda: namespace_state(fleet, "m2", "legacy"), timeout=30, what="legacy in m2")
        assert TENANT not in namespace_state(fleet, "m1", "legacy"), "someone else's namespace is not adopted"
        assert all(namespace_state(fleet, "m3", n) is None for n in ("ads", "ads-dev", "legacy")), \
            "a member outside the tenant's clusters never gets its namespaces"

        token = gw.issuer.token(CAROL)
        # Inside: her namespaces in her clusters, as herself, with her tenant passed on.
        status, _, body = gw.request("/clusters/m1/api/v1/namespaces/ads/configmaps", token=token, method="POST",
                                     body=configmap("mine", namespace="ads"))
        assert status == 201, body
        whoami = json.loads(gw.kubectl("/clusters/m2", "auth", "whoami", "-o", "json", token=token).stdout)
        assert whoami["status"]["userInfo"]["extra"][TENANT] == ["ads"], whoami
        # Outside: another namespace, another cluster, a cluster-scoped write, a read across
        # namespaces of one cluster — 403 at the gateway, though her RBAC would allow each.
        r = gw.kubectl("/clusters/m1", "get", "configmaps", "-n", NAMESPACE, token=token, check=False)
        assert r.returncode != 0 and "not one of tenant ads's namespaces" in r.stderr, r.stderr
        for method, path, why in [
            ("GET", f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps", "namespace shop is not"),
            ("GET", "/clusters/m3/api/v1/namespaces/ads/configmaps", "cluster m3 is not"),
            ("POST", "/clusters/m1/api/v1/namespaces", "cluster-scoped"),
            ("DELETE", "/clusters/m1/api/v1/namespaces/ads", "cluster-scoped"),
            ("GET", "/clusters/m1/api/v1/configmaps", "one namespace at a time"),
            ("GET", "/clusters/metrics", "metrics"),
        ]:
            body = {"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": "grab"}} if method == "POST" else None
            status, _, answer = gw.request(path, token=token, method=method, body=body)
            assert status == 403 and why in answer["message"], (method, path, status, answer)
        assert namespace_state(fleet, "m1", "grab") is None
        refused = [e for e in fleet.audit_events("m1")
                   if (e.get("impersonatedUser") or {}).get("username") == PREFIX + CAROL
                   and (e.get("objectRef") or {}).get("namespace") == NAMESPACE]
        assert refused == [], "nothing refused at the gateway reached the member"

        # Through *: her clusters and namespaces only, in lists and in watches.
        fleet.cluster("m2").apply(configmap("theirs-too", namespace="ads-dev"))
        for member in ("m1", "m3"):
            fleet.cluster(member).apply(configmap("not-hers"))
        status, _, listed = gw.request("/clusters/*/api/v1/configmaps", token=token)
        assert status == 200, listed
        seen = sorted((i["metadata"]["annotations"]["meridian.io/cluster"], i["metadata"]["namespace"],
                       i["metadata"]["name"]) for i in listed["items"])
        assert seen == [("m1", "ads", "mine"), ("m2", "ads-dev", "theirs-too")], seen
        status, _, namespaces = gw.request("/clusters/*/api/v1/namespaces", token=token)
        assert {(i["metadata"]["annotations"]["meridian.io/cluster"], i["metadata"]["name"])
                for i in namespaces["items"]} == {(m, n) for m in ("m1", "m2") for n in ("ads", "ads-dev", "legacy")}
        rv = listed["metadata"]["resourceVersion"]

        def writer():
            time.sleep(1)
            fleet.cluster("m1").apply(configmap("still-not-hers"))
            fleet.cluster("m2").apply(configmap("hers-later", namespace="ads"))

        threading.Thread(target=writer, daemon=True).start()
        events = read_events(gw, f"/clusters/*/api/v1/configmaps?watch=1&resourceVersion={rv}", token,
                             lambda ev: any(e["object"]["metadata"]["name"] == "hers-later" for e in ev))
        assert [e["object"]["metadata"]["name"] for e in events] == ["hers-later"], events
        status, _, _ = gw.request("/clusters/*/api/v1/namespaces/default/configmaps", token=token)
        assert status == 403

        # The tenant drops ads-dev and legacy: meridian's copies go, someone else's stays.
        fleet.hub.apply(tenant(["ads"]))
        for member in ("m1", "m2"):
            wait_for(lambda: namespace_state(fleet, member, "ads-dev") is None, timeout=30,
                     what=f"ads-dev gone from {member}", log=gw.meridian)
        wait_for(lambda: namespace_state(fleet, "m2", "legacy") is None, timeout=30, what="legacy gone from m2")
        assert namespace_state(fleet, "m1", "legacy") is not None, "someone else's namespace stays"
        assert namespace_state(fleet, "m1", "ads") is not None
        status, _, answer = gw.request("/clusters/m2/api/v1/namespaces/ads-dev/configmaps", token=token)
        assert status == 403, answer
        written = gw.meridian.http("/metrics")[1]
        assert 'meridian_tenants_namespace_writes_total{cluster="m2",op="delete",result="ok"}' in written
    finally:
        fleet.hub.delete("meridian.io/v1alpha1", "Tenant", "ads")
        for member in ("m1", "m2", "m3"):
            for name in ("not-hers", "still-not-hers"):
                fleet.cluster(member).delete(CORE, "ConfigMap", name, NAMESPACE)


def client_cert(ca_dir: Path, d: Path, subject: str):
    """A client certificate (and key) for `subject`, signed by the CA make_certs left in `ca_dir`."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "client.key", cwd=d)
    _openssl("req", "-new", "-key", "client.key", "-subj", subject, "-out", "client.csr", cwd=d)
    (d / "client.ext").write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                  "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", "client.csr", "-CA", str(ca_dir / "ca.crt"), "-CAkey", str(ca_dir / "ca.key"),
             "-CAcreateserial", "-sha256", "-days", "1", "-extfile", "client.ext", "-out", "client.crt", cwd=d)
    return d / "client.crt", d / "client.key"


def test_a_client_certificate_of_the_client_ca_is_an_identity(gateway, tmp_path):
    """CN is the user and each O a group, as Kubernetes reads them; a certificate of another
    CA fails the handshake and the gateway serves on."""
    gw = gateway
    cert, key = client_cert(gw.tls_dir, tmp_path / "dave", "/O=ads-devs/O=oncall/CN=dave")

    def kubectl(cert, key, *args):
        return subprocess.run([kubectl_bin(), "--kubeconfig", os.devnull, "--server", gw.url + "/clusters/m1",
                               "--certificate-authority", str(gw.ca), "--client-certificate", str(cert),
                               "--client-key", str(key), *args], capture_output=True, text=True, timeout=30)

    r = kubectl(cert, key, "auth", "whoami", "-o", "json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)["status"]["userInfo"]
    assert info["username"] == "dave", info
    assert {"ads-devs", "oncall"} <= set(info["groups"]), info
    # A member decides what dave may do: nothing here (no binding), as its own 403.
    r = kubectl(cert, key, "get", "configmaps", "-n", NAMESPACE)
    assert r.returncode != 0 and 'User "dave" cannot list' in r.stderr, r.stderr

    _, _, _ = make_certs(tmp_path / "rogue")
    rogue_cert, rogue_key = client_cert(tmp_path / "rogue", tmp_path / "mallory", "/O=system:masters/CN=mallory")
    r = kubectl(rogue_cert, rogue_key, "auth", "whoami")
    assert r.returncode != 0 and "mallory" not in r.stdout, r.stdout
    assert not any((e.get("impersonatedUser") or {}).get("username") == "mallory"
                   for e in gw.fleet.audit_events("m1"))
    status, _, body = gw.request("/clusters/m1/version", token=gw.issuer.token(ANA, ["shop-devs"]))
    assert status == 200, body


class EchoServer:
    """A TCP server on loopback that sends back what it reads: the "pod's port" a
    port-forward reaches through the fake kubelet."""

    def __init__(self):
        import socket
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(b"echo:" + data)

    def close(self):
        self.listener.close()


def test_exec_attach_and_port_forward_pass_through_to_the_members_kubelet(gateway, tmp_path):
    """kubectl exec, attach and port-forward through /clusters/m1/: the gateway carries the
    upgraded connection (WebSocket, or SPDY) to m1's API server, which proxies it to the
    kubelet of the pod's Node — a fake kubelet serving the kubelet's own streaming library."""
    import socket

    gw, fleet = gateway, gateway.fleet
    m1 = fleet.cluster("m1")
    ready = tmp_path / "kubelet.port"
    kubelet = subprocess.Popen([str(kube_clients_dir() / "fake-kubelet"), "-ready", str(ready)],
                               stderr=open(tmp_path / "kubelet.log", "w"))
    echo = EchoServer()
    forward = None
    try:
        wait_for(ready.exists, timeout=20, what="the fake kubelet listens")
        kubelet_port = int(ready.read_text())
        node = {"apiVersion": CORE, "kind": "Node", "metadata": {"name": "fake-node"}}
        m1.apply(node)
        status, body = m1.request("PATCH", "/api/v1/nodes/fake-node/status", {"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}}}},
            content_type="application/merge-patch+json")
        assert status == 200, body
        # No controller manager makes the namespace's default ServiceAccount, which a Pod needs.
        status, body = m1.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                                  {"metadata": {"name": "default"}})
        assert status in (201, 409), body
        group = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": PREFIX + "shop-devs"}
        m1.apply([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "pod-streams", "namespace": NAMESPACE},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                       {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"],
                        "verbs": ["get", "create"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "shop-devs-pod-streams", "namespace": NAMESPACE},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-streams"},
             "subjects": [group]},
            {"apiVersion": CORE, "kind": "Pod", "metadata": {"name": "shell", "namespace": NAMESPACE},
             "spec": {"nodeName": "fake-node", "containers": [{"name": "main", "image": "none"}]}},
        ])
        # kubectl port-forward wants a Running pod; no kubelet reports it, so the test does.
        status, body = m1.request("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/shell/status",
                                  {"status": {"phase": "Running"}}, content_type="application/merge-patch+json")
        assert status == 200, body

        out = gw.kubectl("/clusters/m1", "exec", "-n", NAMESPACE, "shell", "-c", "main", "--",
                         "echo", "hello", "through", "the", "gateway").stdout
        assert out == "hello through the gateway\n", out
        token = gw.issuer.token(ANA, ["shop-devs"])
        r = subprocess.run([kubectl_bin(), "--kubeconfig", os.devnull, "--server", gw.url + "/clusters/m1",
                            "--certificate-authority", str(gw.ca), "--token", token, "exec", "-i", "-n", NAMESPACE,
                            "shell", "-c", "main", "--", "cat"],
                           input="line one\nline two\n", capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout == "line one\nline two\n", (r.stdout, r.stderr)
        # A command that fails: its exit code comes back through both hops.
        r = gw.kubectl("/clusters/m1", "exec", "-n", NAMESPACE, "shell", "-c", "main", "--", "no-such-tool",
                       check=False)
        assert r.returncode == 127 and "command not found" in r.stderr, (r.returncode, r.stderr)
        # The member's RBAC still decides: bob may not exec (403 from m1, as its Status).
        r = gw.kubectl("/clusters/m1", "exec", "-n", NAMESPACE, "shell", "--", "echo", "x",
                       token=gw.issuer.token(BOB), check=False)
        assert r.returncode != 0 and "forbidden" in r.stderr.lower(), r.stderr

        # attach: the "container" copies stdin to stdout.
        r = subprocess.run([kubectl_bin(), "--kubeconfig", os.devnull, "--server", gw.url + "/clusters/m1",
                            "--certificate-authority", str(gw.ca), "--token", token, "attach", "-i", "-n", NAMESPACE,
                            "shell", "-c", "main"],
                           input="attached\n", capture_output=True, text=True, timeout=30)
        assert "attached\n" in r.stdout, (r.stdout, r.stderr)

        # port-forward: a local port through gateway, m1 and the kubelet to the pod's port.
        local = free_port()
        forward = subprocess.Popen([kubectl_bin(), "--kubeconfig", os.devnull, "--server", gw.url + "/clusters/m1",
                                    "--certificate-authority", str(gw.ca), "--token", token, "port-forward",
                                    "-n", NAMESPACE, "pod/shell", f"{local}:{echo.port}"],
                                   stdout=subprocess.DEVNULL, stderr=open(tmp_path / "port-forward.log", "w"))

        def listening():
            assert forward.poll() is None, (tmp_path / "port-forward.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", local), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(listening, timeout=20, what="kubectl port-forward listens")
        for round_ in range(3):
            with socket.create_connection(("127.0.0.1", local), timeout=10) as s:
                s.sendall(f"ping {round_}".encode())
                assert s.recv(100) == f"echo:ping {round_}".encode()
        from test_kube_faults import metric, metrics
        assert metric(metrics(gw.meridian), "meridian_gateway_tunnels") >= 1
        # Both hops are in the member's audit log as ana, through meridian.
        streams = [e for e in fleet.audit_events("m1")
                   if (e.get("objectRef") or {}).get("subresource") in ("exec", "attach", "portforward")]
        assert {e["objectRef"]["subresource"] for e in streams} >= {"exec", "attach", "portforward"}, streams
        assert all(e["user"]["username"] == "meridian" for e in streams), streams
        assert any((e.get("impersonatedUser") or {}).get("username") == PREFIX + ANA for e in streams), streams
    finally:
        if forward:
            forward.kill()
        echo.close()
        kubelet.kill()
        m1.delete(CORE, "Pod", "shell", NAMESPACE)
        m1.delete(CORE, "Node", "fake-node")


def test_the_issuers_keys_come_from_its_url_and_follow_a_rotation_and_an_outage(gateway, tmp_path):
    """`oidc.jwks` as an https:// URL (the issuer's jwks_uri): the keys are fetched at start;
    a token signed with a key published later is refused (401) until the early refresh its
    unknown key asks for, then accepted; the issuer answering 500 keeps the keys held (a
    failed refresh is a metric), so tokens keep working."""
    from http.server import BaseHTTPRequestHandler

    from conftest import https_server
    from test_kube_faults import metric, metrics

    gw, fleet = gateway, gateway.fleet
    published = {"keys": json.loads(gw.issuer.jwks.read_text())["keys"], "status": 200}

    class Keys(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"keys": published["keys"]}).encode()
            self.send_response(published["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server, keys_port = https_server(Keys, gw.tls_dir / "server.crt", gw.tls_dir / "server.key", "jwks")
    port = free_port()
    config = yaml.safe_load((fleet.root / "meridian.yaml").read_text())["gateway"]
    config["listen"] = f"127.0.0.1:{port}"
    config["oidc"] = {**config["oidc"], "jwks": f"https://127.0.0.1:{keys_port}/keys",
                      "jwksCA": str(gw.ca), "jwksRefreshSeconds": 3600}
    m = fleet.start_meridian("meridian-jwks", gateway=config)
    other = Gateway(m, port, gw.ca, gw.issuer)
    path = f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps"
    try:
        assert other.request(path, token=gw.issuer.token(ANA, ["shop-devs"]))[0] == 200

        rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        numbers = rotated.public_key().public_numbers()
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": AUDIENCE, "email": ANA, "groups": ["shop-devs"], "iat": now,
                  "nbf": now - 5, "exp": now + 600}
        token = jwt.encode(claims, rotated, algorithm="RS256", headers={"kid": "rsa-2"})
        published["keys"] = published["keys"] + [
            {"kty": "RSA", "kid": "rsa-2", "use": "sig", "alg": "RS256",
             "n": b64url_uint(numbers.n), "e": b64url_uint(numbers.e)}]
        status, _, body = other.request(path, token=token)
        assert status == 401 and "rsa-2" in body["message"], body
        wait_for(lambda: other.request(path, token=token)[0] == 200, timeout=30,
                 what="the rotated key accepted after the early refresh")

        # The issuer fails: a refresh (asked for by another unknown key) fails, the keys held stay.
        published["status"] = 500
        stranger = jwt.encode(claims, rsa.generate_private_key(public_exponent=65537, key_size=2048),
                              algorithm="RS256", headers={"kid": "rsa-3"})
        assert other.request(path, token=stranger)[0] == 401
        wait_for(lambda: metric(metrics(m), "meridian_gateway_jwks_refreshes_total", result="failed") >= 1,
                 timeout=30, what="a failed refresh counted")
        assert other.request(path, token=token)[0] == 200
        assert other.request(path, token=gw.issuer.token(ANA, ["shop-devs"]))[0] == 200
        assert metric(metrics(m), "meridian_gateway_jwks_refreshes_total", result="ok") >= 1
    finally:
        m.stop()
        fleet.meridians.remove(m)
        server.shutdown()


def test_the_python_kubernetes_client_is_the_caller_its_token_names(gateway):
    """The official Python client (kubernetes on PyPI) with ID tokens the test mints: the
    member sees the token's user and groups, through one member and through *; a bad token is
    401 and the member's RBAC 403 come back as the client's ApiException."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    gw, fleet = gateway, gateway.fleet
    every_member_healthy(gw)

    def api(token, cluster="m1"):
        config = client.Configuration()
        config.host = f"{gw.url}/clusters/{cluster}"
        config.ssl_ca_cert = str(gw.ca)
        config.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(config)

    def refused(call):
        with pytest.raises(ApiException) as e:
            call()
        return e.value.status, json.loads(e.value.body or "{}")

    ana = api(gw.issuer.token(ANA, ["shop-devs"], alg="ES256"))
    review = client.AuthenticationV1Api(ana).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review.status.user_info.username == PREFIX + ANA, review.status.user_info
    assert PREFIX + "shop-devs" in review.status.user_info.groups, review.status.user_info
    core = client.CoreV1Api(ana)
    core.create_namespaced_config_map(NAMESPACE, configmap("from-python"))
    try:
        assert "from-python" in [c.metadata.name for c in core.list_namespaced_config_map(NAMESPACE).items]
        assert fleet.cluster("m1").get(CORE, "ConfigMap", "from-python", NAMESPACE)
        assert fleet.cluster("m2").get(CORE, "ConfigMap", "from-python", NAMESPACE) is None
        fleet_wide = client.CoreV1Api(api(gw.issuer.token(ANA, ["shop-devs"]), cluster="*"))
        found = [c for c in fleet_wide.list_namespaced_config_map(NAMESPACE).items
                 if c.metadata.name == "from-python"]
        assert [c.metadata.annotations["meridian.io/cluster"] for c in found] == ["m1"], found

        for token, says in ((gw.issuer.token(ANA, ["shop-devs"], lifetime=-120), "expired"),
                            (gw.issuer.token(ANA, ["shop-devs"], audience="someone-else"), "audience"),
                            (gw.issuer.token(ANA, ["shop-devs"], alg="none"), "algorithm")):
            status, body = refused(lambda: client.CoreV1Api(api(token)).list_namespaced_config_map(NAMESPACE))
            assert status == 401 and says in body["message"], (says, body)
        # bob is nobody in m1: its RBAC answers, through the gateway, as the client's error.
        status, body = refused(lambda: client.CoreV1Api(api(gw.issuer.token(BOB))).list_namespaced_config_map(
            NAMESPACE))
        assert status == 403 and body["reason"] == "Forbidden" and PREFIX + BOB in body["message"], body
    finally:
        core.delete_namespaced_config_map("from-python", NAMESPACE)
