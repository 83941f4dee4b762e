"""Scoring webhooks end to end (issue 14), on the directory fleet of examples/federation: a
real HTTPS server started by the test (its own CA in the policy's caBundle) answers
`placement.webhooks` calls, and `meridian serve` decides from its scores and filter verdicts.

The Deployment (6 replicas of 500m) is placed Aggregated — as few clusters as fit — so the
scores decide which: without them the roomiest (us-1, 16 free) takes all six; a webhook
preferring the EU puts them on eu-1 (4 free) and eu-2 (2 free). A timeout follows the
failurePolicy (Ignore: the other scores decide; Fail: unschedulable with the reason); a
malformed answer is a failure too; meanwhile the other policy's template keeps being decided
and DNS keeps answering.
"""

import json
import shutil
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from conftest import BIN, ROOT, Fleet, Meridian, https_server, make_certs, require_tool

EXAMPLE = ROOT / "examples" / "federation"

POLICY = """apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {{name: web, namespace: shop}}
spec:
  resourceSelectors:
    - {{apiVersion: apps/v1, kind: Deployment, name: web}}
  placement:
{scheduling}
    webhooks:
      - url: https://127.0.0.1:{port}{path}
        timeoutMillis: {timeout}
        failurePolicy: {failure}
        caBundle: |
{ca}
---
# Another policy's template: decided whatever the webhook does.
apiVersion: v1
kind: ConfigMap
metadata: {{name: flags, namespace: shop}}
data: {{a: "1"}}
---
apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {{name: flags, namespace: shop}}
spec:
  resourceSelectors: [{{apiVersion: v1, kind: ConfigMap, name: flags}}]
"""


class ScoringWebhook:
    """An HTTPS scoring webhook on 127.0.0.1 (a thread of the test process). `answers` maps a
    path to what it does: a dict {cluster: score | (False, reason)}, "slow" (no answer for
    3 s), or raw bytes. Every request body is kept in `requests` as (path, body)."""

    def __init__(self, certs_dir):
        self.ca, cert, key = make_certs(certs_dir)
        self.lock = threading.Lock()
        self.requests = []
        self.answers = {}
        hook = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with hook.lock:
                    hook.requests.append((self.path, body))
                    answer = hook.answers.get(self.path)
                if answer == "slow":
                    time.sleep(3)
                    answer = {}
                if answer == "hang":
                    time.sleep(40)
                    answer = {}
                if isinstance(answer, bytes):
                    data = answer
                else:
                    clusters = []
                    for name, verdict in (answer or {}).items():
                        if isinstance(verdict, tuple):
                            clusters.append({"name": name, "filter": verdict[0], "reason": verdict[1]})
                        else:
                            clusters.append({"name": name, "score": verdict})
                    data = json.dumps({"clusters": clusters}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    pass  # the caller gave up (its timeout): what a slow webhook sees

            def log_message(self, *args):
                pass

        self.server, self.port = https_server(Handler, cert, key, "scoring-webhook")

    def calls(self, path):
        with self.lock:
            return [b for p, b in self.requests if p == path]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(tmp_path):
    hook = ScoringWebhook(tmp_path / "certs")
    yield hook
    hook.stop()


@pytest.fixture
def fleet(tmp_path):
    root = tmp_path / "federation"
    shutil.copytree(EXAMPLE, root)
    f = Fleet(root)
    f.set_health(heartbeat=1, unreachable=3, withdraw=30)
    return f


AGGREGATED = "    replicaScheduling: {type: Divided, divisionPreference: Aggregated}"
# Every replica in the one best-scored cluster, decided afresh each time (Aggregated is steady:
# it keeps replicas where they run).
BEST_ONE = ("    replicaScheduling: {type: Duplicated}\n"
            "    spreadConstraints: [{spreadByField: cluster, maxGroups: 1}]")


def use_webhook(fleet, webhook, path, *, timeout=1000, failure="Ignore", scheduling=AGGREGATED):
    ca = "\n".join("          " + line for line in webhook.ca.read_text().strip().splitlines())
    fleet.write("hub/placement.yaml", POLICY.format(port=webhook.port, path=path, timeout=timeout,
                                                    failure=failure, ca=ca, scheduling=scheduling))


def decisions(m):
    body = json.loads(m.http("/debug/placements")[1])
    return {d["template"]["name"]: d for d in body["decisions"]}


def placed(m, name="web"):
    d = decisions(m).get(name)
    return d and {p["cluster"]: p["replicas"] for p in d["placed"]}


def outcome(m, name="web"):
    d = decisions(m).get(name)
    return d and d["outcome"]


def settled_calls(webhook, path, quiet=2.0, timeout=20):
    """How many calls `path` has had once none came for `quiet` seconds."""
    deadline = time.time() + timeout
    count, since = len(webhook.calls(path)), time.time()
    while time.time() < deadline:
        time.sleep(0.2)
        now = len(webhook.calls(path))
        if now != count:
            count, since = now, time.time()
        elif time.time() - since >= quiet:
            return count
    raise AssertionError(f"calls to {path} never settled: {count} and counting")


def changed_fields(before, after, prefix=""):
    """The paths at which two request bodies differ (to say what input made a new call)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [f for k in sorted(set(before) | set(after))
                for f in changed_fields(before.get(k), after.get(k), f"{prefix}.{k}")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [f for i, (b, a) in enumerate(zip(before, after))
                for f in changed_fields(b, a, f"{prefix}[{i}]")]
    return [] if before == after else [prefix or "."]


def test_webhook_scores_choose_the_clusters_and_answers_are_reused(fleet, webhook):
    webhook.answers["/eu"] = {"eu-1": 100, "eu-2": 50, "us-1": 0}
    webhook.answers["/us"] = {"eu-1": 0, "eu-2": 0, "us-1": 100}
    use_webhook(fleet, webhook, "/eu")
    m = Meridian(fleet)
    try:
        m.wait_for(lambda: placed(m) == {"eu-1": 4, "eu-2": 2}, timeout=15, what="the EU-scored placement")
        # A call sent once every member's capacity was known (the first ones may predate it;
        # each member's capacity arriving is a new input, so a new call).
        def with_capacity():
            full = [b for b in webhook.calls("/eu") if all(c["capacity"] for c in b["clusters"])]
            return full[-1] if full else None

        body = m.wait_for(with_capacity, timeout=15, what="a call with every member's capacity")
        assert body["kind"] == "ScoringRequest"
        assert body["workload"]["name"] == "web" and body["workload"]["replicas"] == 6
        assert body["workload"]["requests"]["cpuMillis"] == 500
        names = sorted(c["name"] for c in body["clusters"])
        assert names == ["eu-1", "eu-2", "us-1"]
        us1 = [c for c in body["clusters"] if c["name"] == "us-1"][0]
        assert us1["region"] == "us" and us1["capacity"]["allocatable"]["cpuMillis"] == 8000
        scores = decisions(m)["web"]["scores"]
        assert [c["cluster"] for c in scores["order"]] == ["eu-1", "eu-2", "us-1"]
        assert scores["order"][0]["total"] == 10000
        assert scores["programs"][0]["judgement"]["answer"] == "answered"

        # Nothing the call sends changed: later decisions reuse the answer, no new call. The
        # members' reports may still be arriving (each a new input), so count once they settle.
        calls = settled_calls(webhook, "/eu")
        fleet.write("hub/other.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: shop}\n")
        time.sleep(3)
        after = webhook.calls("/eu")
        assert len(after) == calls, ("an unchanged input is answered from the cache; the new call "
                                     f"differs in {changed_fields(after[calls - 1], after[-1])}")

        # The scores change the chosen cluster: the one best-scored cluster takes every
        # replica, first by the EU-preferring webhook, then by one preferring the US.
        use_webhook(fleet, webhook, "/eu", scheduling=BEST_ONE)
        m.wait_for(lambda: placed(m) == {"eu-1": 6}, timeout=15, what="the best EU cluster alone")
        use_webhook(fleet, webhook, "/us", scheduling=BEST_ONE)
        m.wait_for(lambda: placed(m) == {"us-1": 6}, timeout=15, what="the US-scored placement")
        excluded = {e["cluster"]: e["reason"]["reason"] for e in decisions(m)["web"]["excluded"]}
        assert excluded == {"eu-1": "SpreadMaxGroups", "eu-2": "SpreadMaxGroups"}, excluded

        p = subprocess.run([str(BIN), "explain", "Deployment/web", "-n", "shop", "--admin",
                            f"127.0.0.1:{m.admin_port}"], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert f"webhook https://127.0.0.1:{webhook.port}/us: answered for 3 clusters (3 scored, 0 filtered out)" in p.stdout, p.stdout
        assert "score #1: us-1 100.00 = Webhook 100×1" in p.stdout, p.stdout
        metrics = m.http("/metrics")[1]
        assert 'meridian_placement_webhook_calls_total{result="ok"}' in metrics, metrics
    finally:
        m.stop()


def test_a_webhook_filter_verdict_excludes_a_cluster_with_its_reason(fleet, webhook):
    webhook.answers["/filter"] = {"us-1": (False, "no GPUs here"), "eu-1": 10, "eu-2": 90}
    use_webhook(fleet, webhook, "/filter")
    m = Meridian(fleet)
    try:
        # eu-2 (2 free) first, then eu-1 (4 free): six fit; us-1 is filtered out.
        m.wait_for(lambda: placed(m) == {"eu-1": 4, "eu-2": 2}, timeout=15, what="the filtered placement")
        excluded = {e["cluster"]: e["reason"] for e in decisions(m)["web"]["excluded"]}
        assert excluded["us-1"]["reason"] == "Rejected", excluded
        assert excluded["us-1"]["detail"]["reason"] == "no GPUs here"
    finally:
        m.stop()


def test_a_timeout_follows_the_failure_policy_and_everything_else_keeps_working(fleet, webhook):
    require_tool("dig")
    webhook.answers["/slow"] = "slow"
    use_webhook(fleet, webhook, "/slow", timeout=300, failure="Ignore")
    m = Meridian(fleet)
    try:
        # Ignore: decided as if there were no webhook — Aggregated by room, us-1 takes all.
        m.wait_for(lambda: placed(m) == {"us-1": 6}, timeout=15, what="the placement without the webhook")
        report = decisions(m)["web"]["scores"]["programs"][0]["judgement"]
        assert report["answer"] == "failed" and "no answer within 300 ms" in report["detail"], report

        # Fail: unschedulable with the reason; the last placement stays, the other policy's
        # template stays scheduled, DNS answers.
        use_webhook(fleet, webhook, "/slow", timeout=300, failure="Fail")
        # Until the call times out the template waits ("waiting for the webhook …").
        m.wait_for(lambda: "failed" in (outcome(m) or {}).get("reason", ""), timeout=15, what="the failure")
        reason = outcome(m)["reason"]
        assert outcome(m)["result"] == "unschedulable"
        assert "failed (failurePolicy Fail): no answer within 300 ms" in reason, reason
        assert placed(m) == {"us-1": 6}, "an unschedulable template keeps its last placement"
        assert outcome(m, "flags")["result"] == "scheduled"
        dig = subprocess.run(["dig", "+short", "+time=2", "+tries=1", "-p", str(m.dns_port), "@127.0.0.1",
                              "global", "SOA"], capture_output=True, text=True, timeout=10)
        assert dig.returncode == 0 and dig.stdout.strip(), f"DNS answers meanwhile: {dig.stdout}{dig.stderr}"
    finally:
        m.stop()


def test_a_malformed_answer_is_a_failure_with_what_is_wrong(fleet, webhook):
    webhook.answers["/bad"] = json.dumps({"clusters": [{"name": "eu-1", "score": 140}]}).encode()
    use_webhook(fleet, webhook, "/bad", failure="Fail")
    m = Meridian(fleet)
    try:
        m.wait_for(lambda: "failed" in (outcome(m) or {}).get("reason", ""), timeout=15, what="the failure")
        reason = outcome(m)["reason"]
        assert "score 140 is not a number in [0, 100]" in reason, reason
        assert placed(m) == {}, "a template never scheduled places nothing"
        metrics = m.http("/metrics")[1]
        assert 'meridian_placement_webhook_calls_total{result="malformed"}' in metrics, metrics
    finally:
        m.stop()


# ---------------------------------------------------------------------------------------
# Built-in scores and Lua scripts, through `meridian render` (no calls, one decision) and
# `serve`.

SCORED = """apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {{name: web, namespace: shop}}
spec:
  resourceSelectors:
    - {{apiVersion: apps/v1, kind: Deployment, name: web}}
  placement:
    replicaScheduling: {{type: Duplicated}}
    spreadConstraints: [{{spreadByField: cluster, maxGroups: 1}}]
{extra}
"""

COSTS = {"eu-1": "{cpuCoreHour: 0.05, memoryGiBHour: 0.01}",
         "eu-2": "{cpuCoreHour: 0.02, memoryGiBHour: 0.004}",
         "us-1": "{cpuCoreHour: 0.04, memoryGiBHour: 0.008, spotRatio: 0.0}"}


def render(fleet, out):
    return subprocess.run([str(BIN), "render", "--config", str(fleet.config), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)


def rendered_clusters(out):
    return sorted(p.parts[-3] for p in out.glob("*/shop/Deployment.web.yaml"))


def with_costs(fleet):
    text = (fleet.hub / "members.yaml").read_text()
    for name, cost in COSTS.items():
        text = text.replace(f"  source: {{directory: {{path: ../clusters/{name}}}}}",
                            f"  source: {{directory: {{path: ../clusters/{name}}}}}\n  cost: {cost}")
    fleet.write("hub/members.yaml", text)


def test_resource_balance_counts_a_namespace_quota(fleet, tmp_path):
    fleet.write("hub/placement.yaml", SCORED.format(extra="    scoring: [{plugin: ResourceBalance, weight: 1}]"))
    p = render(fleet, tmp_path / "a")
    assert p.returncode == 0, p.stdout + p.stderr
    assert rendered_clusters(tmp_path / "a") == ["us-1"], "the emptiest cluster (8 cores) scores best"
    # A quota in us-1's shop namespace nearly used up: us-1 is no longer the best balanced.
    fleet.write("clusters/us-1/quota.yaml", """apiVersion: v1
kind: ResourceQuota
metadata: {name: compute, namespace: shop}
spec: {hard: {requests.cpu: "1"}}
status: {hard: {requests.cpu: "1"}, used: {requests.cpu: 900m}}
""")
    p = render(fleet, tmp_path / "b")
    assert p.returncode == 0, p.stdout + p.stderr
    assert rendered_clusters(tmp_path / "b") == ["eu-1"], p.stdout


def test_a_lua_script_filters_by_label_and_scores_by_cost(fleet, tmp_path):
    with_costs(fleet)
    members = (fleet.hub / "members.yaml").read_text().replace(
        "labels: {topology.kubernetes.io/region: eu, topology.kubernetes.io/zone: eu-2a}",
        "labels: {topology.kubernetes.io/region: eu, topology.kubernetes.io/zone: eu-2a, pci: 'no'}")
    fleet.write("hub/members.yaml", members)
    script = """    script:
      lua: |
        function filter(cluster, workload)
          return cluster.labels["pci"] ~= "no", "not PCI compliant"
        end
        function score(cluster, workload)
          if cluster.cost == nil then return 0 end
          return 100 - cluster.cost.cpu_core_hour * 1000
        end"""
    fleet.write("hub/placement.yaml", SCORED.format(extra=script))
    p = render(fleet, tmp_path / "out")
    assert p.returncode == 0, p.stdout + p.stderr
    # eu-2 is the cheapest but filtered out; us-1 (0.04) beats eu-1 (0.05).
    assert rendered_clusters(tmp_path / "out") == ["us-1"], p.stdout


def test_a_script_that_does_not_compile_is_an_invalid_policy_with_its_line(fleet):
    fleet.write("hub/placement.yaml", SCORED.format(extra="""    script:
      lua: |
        function score(cluster, workload)
          return cluster.cost.
        end"""))
    p = subprocess.run([str(BIN), "validate", "--config", str(fleet.config)], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "placement.script.lua" in out and "script:3:" in out, out


HOSTILE = {
    "loop": ("function score(c, w) while true do end end", "exceeded its budget of 1000000 instructions"),
    "huge string": ("function score(c, w) local s = string.rep('x', 2^30) return 1 end",
                    "string.rep would build 1073741824"),
    "os.execute": ("function score(c, w) os.execute('touch /tmp/meridian-pwned') return 1 end",
                   "attempt to index a nil value (global 'os')"),
    "io.open": ("function score(c, w) io.open('/etc/passwd') return 1 end",
                "attempt to index a nil value (global 'io')"),
    "runtime error": ("function score(c, w)\n  local x = nil\n  return x.y\nend",
                      "script:3: attempt to index a nil value (local 'x')"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_script_is_stopped_with_its_reason_and_the_rest_keeps_serving(fleet, case):
    require_tool("dig")
    source, reason = HOSTILE[case]
    lua = "\n".join("        " + line for line in source.splitlines())
    policy = SCORED.format(extra=f"    script:\n      lua: |\n{lua}")
    # The flags ConfigMap of POLICY's second half: another policy, unaffected.
    fleet.write("hub/placement.yaml", policy + "---\n" + POLICY.split("---\n", 1)[1].format())
    m = Meridian(fleet)
    try:
        # "waiting for the script" first: it runs off the writer, on the script worker.
        m.wait_for(lambda: reason in (outcome(m) or {}).get("reason", ""), timeout=15, what="the script's failure")
        got = outcome(m)
        assert got["result"] == "unschedulable" and reason in got["reason"], got
        assert outcome(m, "flags")["result"] == "scheduled"
        dig = subprocess.run(["dig", "+short", "+time=2", "+tries=1", "-p", str(m.dns_port), "@127.0.0.1",
                              "global", "SOA"], capture_output=True, text=True, timeout=10)
        assert dig.returncode == 0 and dig.stdout.strip(), f"DNS answers meanwhile: {dig.stdout}{dig.stderr}"
        assert m.proc.poll() is None
        metrics = m.http("/metrics")[1]
        assert 'meridian_placement_program_judgements_total{program="script",result="failed"}' in metrics, metrics
    finally:
        m.stop()
    assert not Path("/tmp/meridian-pwned").exists()


def test_render_calls_the_webhooks_and_waits_for_their_answers(fleet, webhook, tmp_path):
    webhook.answers["/eu"] = {"eu-1": 100, "eu-2": 50, "us-1": 0}
    use_webhook(fleet, webhook, "/eu")
    p = render(fleet, tmp_path / "out")
    assert p.returncode == 0, p.stdout + p.stderr
    assert rendered_clusters(tmp_path / "out") == ["eu-1", "eu-2"], p.stdout
    assert webhook.calls("/eu"), "render asked the webhook"
    # A webhook that does not answer in time, with failurePolicy Fail: render names the
    # template it could not place and exits non-zero.
    webhook.answers["/slow"] = "slow"
    use_webhook(fleet, webhook, "/slow", timeout=300, failure="Fail")
    p = render(fleet, tmp_path / "slow")
    assert p.returncode != 0, p.stdout
    out = p.stdout + p.stderr
    assert "failed (failurePolicy Fail): no answer within 300 ms" in out, out


def test_a_hanging_webhook_starves_only_its_own_policy(fleet, webhook):
    """Issue 43: one hanging webhook took all 8 shared call slots for minutes, so every other
    policy's webhook waited behind it. Each webhook now has a share of its own."""
    webhook.answers["/hang"] = "hang"
    webhook.answers["/fast"] = {"eu-1": 100, "eu-2": 50, "us-1": 0}
    ca = "\n".join("          " + line for line in webhook.ca.read_text().strip().splitlines())
    hanging = "\n---\n".join(f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: hang-{i}, namespace: shop}}
spec: {{replicas: 1}}""" for i in range(12))
    selectors = ", ".join(f"{{apiVersion: apps/v1, kind: Deployment, name: hang-{i}}}" for i in range(12))
    fleet.write("hub/hang.yaml", hanging + f"""
---
apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {{name: hang, namespace: shop}}
spec:
  resourceSelectors: [{selectors}]
  placement:
    webhooks:
      - url: https://127.0.0.1:{webhook.port}/hang
        timeoutMillis: 30000
        failurePolicy: Fail
        caBundle: |
{ca}
""")
    use_webhook(fleet, webhook, "/fast", timeout=5000, failure="Fail", scheduling=AGGREGATED)
    m = Meridian(fleet)
    try:
        m.wait_for(lambda: len(webhook.calls("/hang")) >= 2, timeout=15, what="the hanging webhook called")
        # web's own webhook answers at once, though twelve calls to /hang hang.
        m.wait_for(lambda: webhook.calls("/fast") and placed(m), timeout=10,
                   what="web placed with its own webhook's answer while /hang hangs")
        assert len(webhook.calls("/hang")) <= 2, "a hanging webhook gets at most its own two slots"
        assert "waiting for the webhook" in decisions(m)["hang-0"]["outcome"]["reason"]
    finally:
        m.stop()
