"""Traces in a real Jaeger (built by tests/peers/jaeger.sh, its OTLP receiver and query API on
loopback ports of the test's own): meridian exports its spans over OTLP/gRPC when
`tracing.otlpEndpoint` is set.

A kubectl request through the gateway is one trace: the gateway's request span and, under
it, a span per member call. The member's kube-apiserver traces too (its own
--tracing-config-file, to the same Jaeger): it got the member call's `traceparent`, and —
meridian's member credential being an ordinary user, whose trace context Kubernetes does not
adopt — it starts a trace of its own *linked* to meridian's member span. A client's own
`traceparent` is continued by the gateway. Snapshot builds, DNS misses and xDS pushes have
spans of their own."""

import json
import os
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import BIN, free_port, make_certs
from kube_fleet import NAMESPACE, ROOT, Member, started, wait_for
from test_gateway import ANA, AUDIENCE, ISSUER, PREFIX, Issuer, Gateway, configmap, grant_callers

GATEWAY_RBAC = ROOT / "deploy" / "rbac" / "gateway.yaml"


def jaeger_bin() -> str:
    path = os.environ.get("JAEGER_BIN")
    if not path or not Path(path).exists():
        pytest.fail("JAEGER_BIN is not set to a Jaeger binary: tests/run builds it (tests/peers/jaeger.sh)")
    return path


class Jaeger:
    """Jaeger v2 with memory storage: OTLP/gRPC in, the HTTP query API out."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.otlp, self.query, query_grpc, health = free_port(), free_port(), free_port(), free_port()
        config = {
            "service": {
                "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
                "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                         "exporters": ["jaeger_storage_exporter"]}},
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}},
            },
            "extensions": {
                "jaeger_storage": {"backends": {"memory": {"memory": {"max_traces": 100000}}}},
                "jaeger_query": {"storage": {"traces": "memory"},
                                 "http": {"endpoint": f"127.0.0.1:{self.query}"},
                                 "grpc": {"endpoint": f"127.0.0.1:{query_grpc}"}},
                "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"127.0.0.1:{health}"}},
            },
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{self.otlp}"}}}},
            "processors": {"batch": {"timeout": "200ms"}},
            "exporters": {"jaeger_storage_exporter": {"trace_storage": "memory"}},
        }
        path = root / "jaeger.yaml"
        path.write_text(yaml.safe_dump(config))
        self.log = root / "jaeger.log"
        self.proc = subprocess.Popen([jaeger_bin(), "--config", str(path)], stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT)
        wait_for(lambda: self._answers(), timeout=60, what=f"Jaeger answers (log: {self.log})")

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"Jaeger exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            self.get("/api/services")
            with socket.create_connection(("127.0.0.1", self.otlp), timeout=1):
                return True
        except OSError:
            return False

    def get(self, path: str, **params):
        url = f"http://127.0.0.1:{self.query}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    def traces(self, service: str, **params) -> list[dict]:
        return self.get("/api/traces", service=service, limit=2000, lookback="1h", **params)["data"] or []

    def trace(self, trace_id: str) -> dict | None:
        try:
            data = self.get(f"/api/traces/{trace_id}")["data"]
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        return data[0] if data else None

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def tags(span: dict) -> dict:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def service_of(trace: dict, span: dict) -> str:
    return trace["processes"][span["processID"]]["serviceName"]


def refs(span: dict, kind: str) -> list[tuple[str, str]]:
    return [(r["traceID"], r["spanID"]) for r in span.get("references", []) if r["refType"] == kind]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracing")
    jaeger = Jaeger(root / "jaeger")
    # m1's API server traces every request it serves to the same Jaeger.
    apiserver_tracing = root / "apiserver-tracing.yaml"
    apiserver_tracing.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "TracingConfiguration",
        "endpoint": f"127.0.0.1:{jaeger.otlp}", "samplingRatePerMillion": 1000000}))
    members = (Member("m1", "eu", "eu-a", "127.0.1.0/24"),)
    try:
        with started(root / "kube", members,
                     extra_apiserver_args={"m1": [f"--tracing-config-file={apiserver_tracing}"]}) as fleet:
            gateway_rbac = [d for d in yaml.safe_load_all(GATEWAY_RBAC.read_text()) if d]
            for c in fleet.clusters:
                c.apply(gateway_rbac)
            grant_callers(fleet, members=("m1",))
            ca, cert, key = make_certs(root / "tls")
            issuer = Issuer(root)
            port = free_port()
            m = fleet.start_meridian(
                env={"MERIDIAN_LOG": "info"},
                gateway={
                    "listen": f"127.0.0.1:{port}",
                    "tls": {"cert": str(cert), "key": str(key)},
                    "oidc": {"issuer": ISSUER, "audiences": [AUDIENCE], "jwks": str(issuer.jwks),
                             "usernameClaim": "email", "groupsClaim": "groups",
                             "usernamePrefix": PREFIX, "groupsPrefix": PREFIX},
                },
                tracing={"otlpEndpoint": f"http://127.0.0.1:{jaeger.otlp}", "samplingRatio": 1.0},
            )
            gw = Gateway(m, port, ca, issuer)
            gw.fleet, gw.jaeger = fleet, jaeger
            try:
                yield gw
            finally:
                fleet.stop_meridians()
    finally:
        jaeger.stop()


def test_a_kubectl_request_is_one_trace_of_the_gateway_and_its_member_call_linked_from_the_member(traced):
    gw, jaeger = traced, traced.jaeger
    gw.fleet.cluster("m1").apply(configmap("traced"))
    path = f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps/traced"
    out = gw.kubectl("/clusters/m1", "get", "configmap", "traced", "-n", NAMESPACE, "-o", "name").stdout
    assert out.strip() == "configmap/traced", out

    def gateway_trace():
        for trace in jaeger.traces("meridian", operation="GET member"):
            roots = [s for s in trace["spans"] if tags(s).get("url.path") == path
                     and s["operationName"] == "GET member"]
            members = [s for s in trace["spans"] if s["operationName"] == "gateway.member"]
            if roots and members:
                return trace, roots[0], members[0]
        return None

    trace, request, member = wait_for(gateway_trace, timeout=30, what="the gateway's trace in Jaeger")
    assert int(tags(request)["http.response.status_code"]) == 200, tags(request)
    assert tags(request)["cluster"] == "m1" and tags(request)["route"] == "member", tags(request)
    assert tags(request)["span.kind"] == "server", tags(request)
    # The member call is the request's child, in the same trace.
    assert refs(member, "CHILD_OF") == [(request["traceID"], request["spanID"])], member["references"]
    assert tags(member)["cluster"] == "m1" and tags(member)["span.kind"] == "client", tags(member)
    assert tags(member)["url.path"] == f"/api/v1/namespaces/{NAMESPACE}/configmaps/traced", tags(member)
    assert int(tags(member)["http.response.status_code"]) == 200, tags(member)
    assert service_of(trace, member) == "meridian"

    # m1's API server got the member span's traceparent: its span for that GET links to it.
    def apiserver_span():
        for t in jaeger.traces("apiserver"):
            for s in t["spans"]:
                if (member["traceID"], member["spanID"]) in refs(s, "FOLLOWS_FROM") + refs(s, "CHILD_OF"):
                    return s
        return None

    linked = wait_for(apiserver_span, timeout=30, what="m1's API server span linked to the member call")
    assert "configmaps" in linked["operationName"], linked["operationName"]


def test_a_clients_traceparent_is_continued_by_the_gateway(traced):
    gw, jaeger = traced, traced.jaeger
    trace_id, parent_id = os.urandom(16).hex(), os.urandom(8).hex()
    status, _, body = gw.request(f"/clusters/m1/api/v1/namespaces/{NAMESPACE}/configmaps",
                                 token=gw.issuer.token(ANA, ["shop-devs"]),
                                 headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    assert status == 200, body
    trace = wait_for(lambda: jaeger.trace(trace_id), timeout=30, what="the client's trace in Jaeger")
    request = next(s for s in trace["spans"] if s["operationName"] == "GET member")
    assert refs(request, "CHILD_OF") == [(trace_id, parent_id)], request["references"]
    assert any(s["operationName"] == "gateway.member" for s in trace["spans"]), trace["spans"]


def test_snapshot_builds_dns_misses_and_xds_pushes_have_spans(traced):
    gw, jaeger = traced, traced.jaeger
    fleet, m = gw.fleet, gw.meridian
    fleet.publish("m1", "traced-web", ["10.1.0.7"])
    name = f"traced-web.{NAMESPACE}.global."
    wait_for(lambda: m.addresses(name) == ["10.1.0.7"], timeout=30, what="the exported service answers")
    r = subprocess.run([str(BIN), "xds", "watch", "--xds", f"127.0.0.1:{m.xds_port}", "--count", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr

    def spans(operation):
        return [s for t in jaeger.traces("meridian", operation=operation) for s in t["spans"]
                if s["operationName"] == operation]

    misses = wait_for(lambda: [s for s in spans("dns.miss") if tags(s).get("qname") == name], timeout=30,
                      what="a DNS miss span for the exported name")
    assert int(tags(misses[0])["qtype"]) == 1, tags(misses[0])
    builds = wait_for(lambda: spans("snapshot.build"), timeout=30, what="snapshot build spans")
    assert any(int(tags(s).get("services_changed", 0)) >= 1 for s in builds), [tags(s) for s in builds]
    pushes = wait_for(lambda: spans("xds.push"), timeout=30, what="an xDS push span")
    assert int(tags(pushes[0])["responses"]) >= 1 and tags(pushes[0])["protocol"], tags(pushes[0])
