"""The gateway beside the member API servers (bench/gateway.sh runs it).

    python3 bench/gateway.py WORK [--objects 5000] [--gets 500] [--lists 20] [--events 100]

Starts a hub and three members (kube-apiserver + etcd each, tests/e2e/kube_fleet.py) and
`meridian serve` (MERIDIAN_BIN) with its gateway, an issuer of the test's own (an RSA key,
tests/e2e/test_gateway.py's Issuer), deploy/rbac/gateway.yaml everywhere and the bench user's
group bound to cluster-admin in every member. Then, alternating gateway and direct so both see
the same machine:

- GET: one ConfigMap of m1, `--gets` times each, over one kept-alive HTTPS connection each
  (gateway: /clusters/m1/…, as the bench user; direct: m1's API server, as its admin).
- LIST: every ConfigMap of namespace shop (`--objects` over three members), `--lists` times
  each: through /clusters/*/…, and the three members' LISTs issued at once (threads), timed
  until the last answers.
- watch: a watch through /clusters/*/… and one on m1 directly, both open; `--events` times a
  ConfigMap is created in m1 (the clock starts before the POST) and each watch's ADDED event
  for it is timed.

Prints one JSON object with every figure on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import yaml  # noqa: E402
from benchstats import log, summary  # noqa: E402
from conftest import free_port, make_certs  # noqa: E402
from kube_fleet import CORE, DEFAULT_MEMBERS, NAMESPACE, KubeFleet  # noqa: E402
from test_gateway import AUDIENCE, GATEWAY_RBAC, ISSUER, PREFIX, Issuer  # noqa: E402

USER, GROUP = "bench@meridian.test", "bench"
MEMBERS = ("m1", "m2", "m3")


class Conn:
    """One kept-alive HTTPS connection to `port` with a bearer token."""

    def __init__(self, port: int, ca: Path, token: str):
        self.port, self.token = port, token
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.conn = http.client.HTTPSConnection("127.0.0.1", port, context=self.ctx, timeout=60)

    def get(self, path: str) -> tuple[int, bytes]:
        self.conn.request("GET", path, headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"})
        r = self.conn.getresponse()
        return r.status, r.read()


def timed(f) -> float:
    start = time.perf_counter()
    f()
    return (time.perf_counter() - start) * 1000


def configmap(name: str) -> dict:
    return {"apiVersion": CORE, "kind": "ConfigMap", "metadata": {"name": name, "namespace": NAMESPACE},
            "data": {"k": name}}


def grant(fleet):
    rbac = [d for d in yaml.safe_load_all(GATEWAY_RBAC.read_text()) if d]
    for c in fleet.clusters:
        c.apply(rbac)
    for name in MEMBERS:
        fleet.cluster(name).apply({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-admin"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": PREFIX + GROUP}]})


def create_objects(fleet, count: int):
    log(f"creating {count} ConfigMaps over {len(MEMBERS)} members")
    names = [(MEMBERS[i % len(MEMBERS)], f"cm-{i:05d}") for i in range(count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda mn: fleet.cluster(mn[0]).apply(configmap(mn[1])), names))


class Watch(threading.Thread):
    """A raw watch (HTTP/1.1 chunked JSON lines): records when each ADDED name arrives."""

    def __init__(self, port, ca, token, path):
        super().__init__(daemon=True)
        self.conn = Conn(port, ca, token)
        self.path, self.seen, self.ready = path, {}, threading.Event()

    def run(self):
        c = self.conn.conn
        c.request("GET", self.path, headers={"Authorization": f"Bearer {self.conn.token}"})
        r = c.getresponse()
        assert r.status == 200, r.read()
        self.ready.set()
        for line in r:
            if not line.strip():
                continue
            e = json.loads(line)
            if e["type"] == "ADDED":
                self.seen[e["object"]["metadata"]["name"]] = time.perf_counter()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work", type=Path)
    p.add_argument("--objects", type=int, default=5000)
    p.add_argument("--gets", type=int, default=500)
    p.add_argument("--lists", type=int, default=20)
    p.add_argument("--events", type=int, default=100)
    a = p.parse_args()
    started = time.monotonic()
    fleet = KubeFleet(a.work / "kube", DEFAULT_MEMBERS).start()
    try:
        grant(fleet)
        create_objects(fleet, a.objects)
        ca, cert, key = make_certs(a.work / "tls")
        issuer = Issuer(a.work)
        port = free_port()
        fleet.start_meridian(gateway={
            "listen": f"127.0.0.1:{port}", "tls": {"cert": str(cert), "key": str(key)},
            "oidc": {"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": str(issuer.jwks), "usernameClaim": "email",
                     "usernamePrefix": PREFIX, "groupsPrefix": PREFIX}})
        token = issuer.token(USER, [GROUP], lifetime=3600)
        m1 = fleet.cluster("m1")
        gateway, direct = Conn(port, ca, token), Conn(m1.apiserver_port, m1.ca_file, m1.admin_token)
        one = f"/api/v1/namespaces/{NAMESPACE}/configmaps/cm-00000"
        deadline = time.monotonic() + 60
        while gateway.get("/clusters/m1" + one)[0] != 200:
            assert time.monotonic() < deadline, "the gateway does not reach m1"
            time.sleep(0.2)

        log(f"GET x {a.gets}, alternating")
        gets = {"gateway": [], "direct": []}
        for _ in range(a.gets):
            gets["gateway"].append(timed(lambda: gateway.get("/clusters/m1" + one)))
            gets["direct"].append(timed(lambda: direct.get(one)))

        log(f"LIST x {a.lists}, alternating")
        collection = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
        directs = [Conn(fleet.cluster(n).apiserver_port, fleet.cluster(n).ca_file, fleet.cluster(n).admin_token)
                   for n in MEMBERS]
        lists = {"gateway": [], "direct": []}
        counts = {}
        with ThreadPoolExecutor(len(MEMBERS)) as pool:
            for _ in range(a.lists):
                answer = {}
                lists["gateway"].append(timed(lambda: answer.update(g=gateway.get("/clusters/*" + collection))))
                status, body = answer["g"]
                assert status == 200, body[:300]
                counts["gateway"] = len(json.loads(body)["items"])
                lists["direct"].append(timed(lambda: answer.update(d=list(pool.map(lambda c: c.get(collection), directs)))))
                counts["direct"] = sum(len(json.loads(b)["items"]) for _, b in answer["d"])

        log(f"watch x {a.events}")
        through = Watch(port, ca, token, f"/clusters/*{collection}?watch=1&resourceVersion={json.loads(gateway.get('/clusters/*' + collection)[1])['metadata']['resourceVersion']}")
        plain = Watch(m1.apiserver_port, m1.ca_file, m1.admin_token,
                      f"{collection}?watch=1&resourceVersion={json.loads(direct.get(collection)[1])['metadata']['resourceVersion']}")
        for w in (through, plain):
            w.start()
            assert w.ready.wait(30), "a watch did not start"
        lags = {"gateway": [], "direct": []}
        for i in range(a.events):
            name = f"event-{i:04d}"
            t0 = time.perf_counter()
            m1.apply(configmap(name))
            deadline = time.monotonic() + 10
            while name not in through.seen or name not in plain.seen:
                assert time.monotonic() < deadline, f"{name} not seen by both watches"
                time.sleep(0.0005)
            lags["gateway"].append((through.seen[name] - t0) * 1000)
            lags["direct"].append((plain.seen[name] - t0) * 1000)

        out = {
            "objects": a.objects,
            "get": {k: summary(v) for k, v in gets.items()},
            "list": {k: summary(v) for k, v in lists.items()},
            "watch": {k: summary(v) for k, v in lags.items()},
            "list_items": counts["gateway"],
            "direct_items": counts["direct"],
            "seconds": round(time.monotonic() - started, 1),
            "meridian": os.environ.get("MERIDIAN_BIN", ""),
        }
        assert counts["gateway"] == counts["direct"], counts
        print(json.dumps(out, indent=1))
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
