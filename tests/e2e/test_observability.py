"""The Grafana dashboard (deploy/grafana/meridian.json) and the Prometheus alert rules
(deploy/prometheus/meridian-rules.yaml) against a real meridian and a real Prometheus.

promtool checks the rules and runs their unit tests (meridian-rules.test.yaml). Then meridian
serves the quickstart fleet (plus the federation example's placed Deployment, so placement has
something to decide) and does some work, in two rounds with scrapes between them: DNS over
UDP and TCP, two xDS streams (one ACKs, one NACKs each EDS version), a member's directory
removed so it turns Unreachable and is withdrawn. Every metric name the dashboard and the
rules use must be on its /metrics (but one that only Kubernetes members give series, see
KUBERNETES_ONLY); a Prometheus started here scrapes it every second with the rules loaded,
every dashboard query (Grafana's variables substituted) must parse and return data, the
template variables must find the job and the instance, the rules must be loaded and healthy,
and the alerts about the removed member and the NACKs must be pending for exactly those, and
no other alert.

prometheus and promtool come from tests/peers/prometheus.sh: PROMETHEUS_DIR names the
directory holding them (tests/run sets it).
"""

import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from ads import CDS, EDS, AdsStream, ack, decode, node, request
from conftest import FROM_EU1, FROM_UNKNOWN, QUICKSTART, ROOT, Fleet, Meridian, free_port, stop_process

DASHBOARD = ROOT / "deploy" / "grafana" / "meridian.json"
RULES = ROOT / "deploy" / "prometheus" / "meridian-rules.yaml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "meridian-rules.test.yaml"
FEDERATION = ROOT / "examples" / "federation"

JOB = "meridian"
SCRAPE_SECONDS = 1
# What Grafana would put in for a one-hour dashboard at a 1 s scrape interval is smaller;
# a minute covers everything this test did (Prometheus starts after meridian).
RATE_INTERVAL = "1m"
INTERVAL = "2s"
# The member whose directory the test removes.
GONE = "eu-2"

# Metrics that have data only once meridian propagates into Kubernetes members. On a directory
# fleet the dashboard queries over them are checked to parse and to return no data (empty or
# NaN) instead; anything not listed here must return data. A labelled family with no series
# yet is not on /metrics at all (prometheus-client leaves it out): for those, `registered`
# names the source file and the registration that make the name, checked instead.
KUBERNETES_ONLY = {
    "meridian_propagation_applies_total": {
        "why": "server-side applies into Kubernetes members, by member and result",
        "registered": [("controllers/src/kubernetes/start.rs", r'PropagationMetrics::new\(metrics\.sub_registry_with_prefix\("propagation"\)\)'),
                       ("controllers/src/metrics.rs", r'registry\.register\(\s*"applies",'),
                       ("controllers/src/metrics.rs", r"pub applies: Family<ApplyLabels, Counter>")],
    },
    "meridian_writeback_failing": {
        "why": "MCS write-back rounds into Kubernetes members, by member",
        "registered": [("controllers/src/kubernetes/start.rs", r'WritebackMetrics::new\(metrics\.sub_registry_with_prefix\("writeback"\)\)'),
                       ("controllers/src/metrics.rs", r'registry\.register\(\s*"failing",'),
                       ("controllers/src/metrics.rs", r"pub failing: Family<MemberLabels, Gauge>")],
    },
    "meridian_propagation_rollout_paused": {
        "why": "staged rollouts of templates placed into Kubernetes members, by policy",
        "registered": [("controllers/src/kubernetes/start.rs", r'PropagationMetrics::new\(metrics\.sub_registry_with_prefix\("propagation"\)\)'),
                       ("controllers/src/metrics.rs", r'registry\.register\(\s*"rollout_paused",'),
                       ("controllers/src/metrics.rs", r"pub rollout_paused: Family<PolicyLabels, Gauge>")],
    },
    "meridian_xds_tls_certificate_expiry_timestamp_seconds": {
        "why": "only when xDS is served over TLS (the quickstart serves it in plain text)",
        "registered": [("xds/src/server.rs", r'"tls_certificate_expiry_timestamp_seconds",')],
    },
    "meridian_propagation_converge_seconds_bucket": {
        "why": "observed when every copy is applied and ready in Kubernetes members (the buckets are there, all 0)",
        "registered": None,
    },
}

METRIC_NAME = re.compile(r"\bmeridian_[a-z0-9_]+\b")


def _tool(name):
    d = os.environ.get("PROMETHEUS_DIR")
    if not d:
        pytest.fail("PROMETHEUS_DIR is not set: build the peers with `PROMETHEUS_DIR=$(tests/peers/prometheus.sh)` "
                    "(tests/run does) and export it")
    path = Path(d) / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{path} is missing or not executable: PROMETHEUS_DIR={d} should be the directory "
                    "tests/peers/prometheus.sh prints")
    return path


@pytest.fixture(scope="module")
def promtool():
    return _tool("promtool")


@pytest.fixture(scope="module")
def prometheus_bin():
    return _tool("prometheus")


def rules_doc():
    return yaml.safe_load(RULES.read_text())


def alert_rules():
    return [r for g in rules_doc()["groups"] for r in g["rules"]]


def dashboard():
    return json.loads(DASHBOARD.read_text())


def dashboard_targets():
    """(panel title, refId, expr) of every query of every panel."""
    out = []
    for p in dashboard()["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["refId"], t["expr"]))
    return out


def grafana_regex(value):
    """A value of a multi-value variable as Grafana puts it in a =~ matcher: regex-escaped,
    each backslash doubled for the PromQL string."""
    return re.escape(value).replace("\\", "\\\\")


def substitute(expr, instance):
    """What Grafana sends for a query: its variables replaced."""
    for var, value in (("$__rate_interval", RATE_INTERVAL), ("$__interval", INTERVAL),
                       ("$instance", grafana_regex(instance)), ("$job", JOB)):
        expr = expr.replace("${" + var[1:] + "}", value).replace(var, value)
    assert "$" not in expr, f"a variable is left in {expr!r}"
    return expr


def run(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


# ---------------------------------------------------------------------------------------
# promtool, and the files' own shape.


def test_promtool_check_rules(promtool):
    rc, out = run(promtool, "check", "rules", RULES)
    assert rc == 0, out
    n = len(alert_rules())
    assert f"SUCCESS: {n} rules found" in out, out
    assert n >= 8, f"only {n} rules"


def test_promtool_test_rules_covers_every_alert_firing_and_not(promtool):
    rc, out = run(promtool, "test", "rules", RULES_TEST)
    assert rc == 0, out
    assert "SUCCESS" in out, out
    # Every alert of the rules file is tested both ways.
    fixture = yaml.safe_load(RULES_TEST.read_text())
    assert fixture["rule_files"] == [RULES.name]
    firing, quiet = set(), set()
    for group in fixture["tests"]:
        for case in group["alert_rule_test"]:
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - firing == set(), f"never tested firing: {sorted(names - firing)}"
    assert names - quiet == set(), f"never tested not firing: {sorted(names - quiet)}"
    assert (firing | quiet) - names == set(), f"tests of alerts that do not exist: {sorted((firing | quiet) - names)}"


def test_rules_have_for_severity_and_annotations():
    for r in alert_rules():
        assert set(r) >= {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert r["labels"]["severity"] in {"critical", "warning", "info"}, r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]


def test_dashboard_shape():
    d = dashboard()
    assert 36 <= d["schemaVersion"] <= 41, d["schemaVersion"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            if t["expr"].startswith("sum by (job)"):
                continue  # leaders across the whole job: every instance on purpose
            assert 'instance=~"$instance"' in t["expr"], f"{p['title']}: {t['expr']}"
    titles = " ".join(p["title"] for p in d["panels"]).lower()
    for topic in ("dns queries", "cache hit", "xds streams", "pushes", "nack", "push-to-ack", "health",
                  "withdraw", "snapshot build", "leadership", "placement", "propagation"):
        assert topic in titles, f"no panel about {topic}"


# ---------------------------------------------------------------------------------------
# A real meridian, doing some work, scraped by a real Prometheus.


class Prometheus:
    """A real Prometheus on a free loopback port, scraping `target` every second with the
    rules loaded; its data and log (prometheus.log) in `workdir`."""

    def __init__(self, binary, workdir: Path, target: str, **scrape):
        """`scrape`: more settings of the scrape job (scheme, metrics_path, tls_config, …)."""
        self.log = workdir / "prometheus.log"
        config = workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "scrape_timeout": f"{SCRAPE_SECONDS}s",
                       "evaluation_interval": f"{SCRAPE_SECONDS}s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}], **scrape}],
        }))
        # As with meridian: a port chosen free may be taken before Prometheus binds it.
        for attempt in range(3):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [str(binary), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=info"],
                stdout=open(self.log, "w"), stderr=subprocess.STDOUT, cwd=workdir,
            )
            try:
                self._wait_ready()
                return
            except RuntimeError:
                if attempt == 2 or "address already in use" not in self.log.read_text():
                    raise
                stop_process(self.proc)

    def _wait_ready(self):
        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.HTTPError):
                pass
            if time.time() > deadline:
                raise RuntimeError(f"prometheus not ready after 30 s:\n{self.log.read_text()}")
            time.sleep(0.1)

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        return body

    def query(self, expr):
        body = self.api("query", query=expr)
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def wait_for(self, expr, what, timeout=20):
        deadline = time.time() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.time() > deadline:
                raise AssertionError(f"Prometheus: no result for {expr} ({what}) after {timeout} s\n"
                                     f"--- prometheus log tail ---\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, lines=30):
        return "\n".join(self.log.read_text().splitlines()[-lines:])

    def stop(self):
        stop_process(self.proc)


def prepare_fleet(root: Path) -> Fleet:
    """The quickstart, with the federation example's Deployment placed over it."""
    shutil.copytree(QUICKSTART, root)
    fleet = Fleet(root)
    for name in ("web.yaml", "placement.yaml"):
        shutil.copy(FEDERATION / "hub" / name, fleet.hub / name)
    for cluster in ("eu-1", "eu-2", "us-1"):
        shutil.copy(FEDERATION / "clusters" / cluster / "nodes.yaml", fleet.cluster_dir(cluster) / "nodes.yaml")
    fleet.set_health(heartbeat=1, unreachable=2, withdraw=3)
    return fleet


def dns_work(m):
    """Answers of every kind meridian gives here: NOERROR over UDP (again and again, so the
    cache answers) and TCP, NXDOMAIN, REFUSED outside the zones, clusterset names."""
    for _ in range(20):
        assert m.addresses("payments.shop.global", source=FROM_EU1), "no answer for payments.shop.global"
    assert m.addresses("payments.shop.global") != []
    assert m.query("payments.shop.global", "A", tcp=True).answer
    assert m.query("nothing-here.shop.global").rcode() == 3  # NXDOMAIN
    assert m.query("example.com", source=FROM_UNKNOWN).rcode() == 5  # REFUSED
    m.query("payments.shop.svc.clusterset.local", source="127.0.2.1")
    m.query("_http._tcp.payments.shop.global", "SRV", source=FROM_EU1)


NACKED = "EDS"


class XdsWork:
    """Two Envoy nodes: one in us-1 ACKs CDS and EDS; one in eu-1 ACKs CDS and NACKs every EDS
    version it is sent."""

    def __init__(self, m, streams):
        self.names = {}
        self.streams = {}
        for cluster, network in (("us-1", "n2"), ("eu-1", "n1")):
            s = AdsStream(m.xds_port)
            streams.append(s)
            self.streams[cluster] = s
            s.send(request(CDS, node=node(f"observability-{cluster}", cluster, network)))
            cds = s.recv_type(CDS, timeout=10)
            self.names[cluster] = sorted(decode(cds))
            assert self.names[cluster], "CDS with no clusters"
            s.send(ack(cds))
            s.send(request(EDS, self.names[cluster]))
            eds = s.recv_type(EDS, timeout=10)
            assert decode(eds), "EDS with no assignments"
            if cluster == "eu-1":
                self.nack(eds)
            else:
                s.send(ack(eds, self.names[cluster]))

    def nack(self, eds):
        self.streams["eu-1"].send(request(EDS, self.names["eu-1"], version="", nonce=eds.nonce,
                                          error="rejected by the observability test"))

    def nack_next(self, timeout=15):
        """NACKs the next EDS version eu-1 is sent (after a change in the fleet)."""
        self.nack(self.streams["eu-1"].recv_type(EDS, timeout=timeout))


@pytest.fixture(scope="module")
def observed(tmp_path_factory, prometheus_bin):
    """meridian after its work, the Prometheus scraping it, and what /metrics said."""
    work = tmp_path_factory.mktemp("observability")
    fleet = prepare_fleet(work / "fleet")
    m = Meridian(fleet)
    prom = None
    streams = []
    try:
        try:
            target = f"127.0.0.1:{m.admin_port}"
            prom = Prometheus(prometheus_bin, work, target)
            prom.wait_for(f'up{{job="{JOB}"}} == 1', "meridian scraped")
            started = time.time()
            # Two rounds of work with scrapes between them: meridian creates a labelled series
            # (a zone's rcode, a type's NACKs) when it first counts in it, and a rate sees only
            # what a series gained after Prometheus first saw it, as with steady traffic.
            dns_work(m)
            xds = XdsWork(m, streams)
            prom.wait_for(f'meridian_xds_nacks_total{{job="{JOB}",resource="{NACKED}"}} >= 1', "the first NACK scraped")
            prom.wait_for(f'meridian_dns_queries_total{{job="{JOB}",rcode="NXDOMAIN"}} >= 1', "the first queries scraped")
            # Then a member goes: Unreachable after 2 s, withdrawn after 3 s; the new EDS version
            # eu-1 is sent is NACKed too.
            shutil.rmtree(fleet.cluster_dir(GONE))
            dns_work(m)
            xds.nack_next()
            prom.wait_for(f'meridian_cluster_withdrawn{{job="{JOB}",cluster="{GONE}"}} == 1', f"{GONE} withdrawn")
            prom.wait_for(f'meridian_xds_nacks_total{{job="{JOB}",resource="{NACKED}"}} >= 2', "the second NACK scraped")
            dns_work(m)
            # Two more scrapes, so that every counter's last increase is inside a rate window.
            time.sleep(2 * SCRAPE_SECONDS + 0.5)
            status, metrics_text = m.http("/metrics")
            assert status == 200, metrics_text
        except (AssertionError, TimeoutError, RuntimeError, OSError) as e:
            raise AssertionError(f"{e}\n--- meridian log tail ({m.log}) ---\n{m.log_tail()}") from e
        yield {"meridian": m, "prometheus": prom, "target": target, "metrics": metrics_text,
               "started": started, "nacked": NACKED, "work": work}
    finally:
        for s in streams:
            s.close()
        if prom is not None:
            prom.stop()
        m.stop()


def exposition(text):
    """(sample names, {family: type}) of an OpenMetrics/Prometheus text exposition."""
    samples, families = set(), {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = kind
        elif line and not line.startswith("#"):
            samples.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return samples, families


def declared(name, families):
    """The family a sample name belongs to, with its type, if /metrics declares it."""
    for suffix, kinds in (("_total", {"counter"}), ("_bucket", {"histogram"}), ("_sum", {"histogram"}),
                          ("_count", {"histogram"})):
        if name.endswith(suffix) and families.get(name[: -len(suffix)]) in kinds:
            return name[: -len(suffix)]
    if families.get(name) in {"gauge", "unknown"}:
        return name
    return None


def used_metric_names():
    used = {}
    for title, ref, expr in dashboard_targets():
        for name in METRIC_NAME.findall(expr):
            used.setdefault(name, []).append(f"dashboard: {title} ({ref})")
    for v in dashboard()["templating"]["list"]:
        for name in METRIC_NAME.findall(v.get("definition", "")):
            used.setdefault(name, []).append(f"dashboard variable {v['name']}")
    for r in alert_rules():
        for name in METRIC_NAME.findall(r["expr"]):
            used.setdefault(name, []).append(f"rule {r['alert']}")
    return used


def test_every_metric_used_is_on_meridians_metrics(observed):
    samples, families = exposition(observed["metrics"])
    used = used_metric_names()
    assert len(used) >= 30, sorted(used)
    missing = {n: where for n, where in used.items() if declared(n, families) is None}
    unexplained = {n: where for n, where in missing.items() if not (KUBERNETES_ONLY.get(n) or {}).get("registered")}
    assert not unexplained, f"used but not on meridian's /metrics: {unexplained}"
    for n in missing:
        for path, pattern in KUBERNETES_ONLY[n]["registered"]:
            assert re.search(pattern, (ROOT / path).read_text()), f"{n}: no {pattern!r} in {path}"
    # The others have samples after the work.
    without = {n for n in used if n not in samples} - set(missing)
    assert without <= set(KUBERNETES_ONLY), (
        f"no samples on /metrics for {sorted(without - set(KUBERNETES_ONLY))} after the work")
    for n in KUBERNETES_ONLY:
        assert n in used, f"KUBERNETES_ONLY lists {n}, which nothing uses"


def test_dashboard_variables_find_the_target(observed):
    prom = observed["prometheus"]
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    found = {}
    for name, expect in (("job", JOB), ("instance", observed["target"])):
        definition = variables[name]["definition"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition)
        assert m, definition
        selector, label = m.group(1).replace("$job", JOB), m.group(2)
        assert label == name
        body = prom.api(f"label/{label}/values", **{"match[]": selector})
        assert body["status"] == "success", body
        found[name] = body["data"]
        assert found[name] == [expect], f"{definition}: {found[name]}"


def values_of(result):
    for series in result:
        for _, v in series.get("values") or [series["value"]]:
            yield float(v)


def test_every_dashboard_query_returns_data(observed):
    prom = observed["prometheus"]
    now = time.time()
    checked, kube_only = 0, 0
    for title, ref, expr in dashboard_targets():
        q = substitute(expr, observed["target"])
        # As Grafana asks for a time series panel: a range query over what this test did.
        body = prom.api("query_range", query=q, start=f"{observed['started'] - 5:.3f}", end=f"{now:.3f}", step=INTERVAL)
        assert body["status"] == "success", f"{title} ({ref}): {q}\n{body}"
        result = body["data"]["result"]
        finite = [v for v in values_of(result) if not math.isnan(v)]
        names = set(METRIC_NAME.findall(expr))
        if names & set(KUBERNETES_ONLY):
            assert not finite, f"{title} ({ref}) now returns data on a directory fleet; update KUBERNETES_ONLY: {q}"
            kube_only += 1
            continue
        assert result, f"{title} ({ref}) returned no series: {q}"
        assert finite, f"{title} ({ref}) returned only NaN: {q}\n{result}"
        checked += 1
        # And the instant query a stat panel or an alert would make parses too.
        instant = prom.api("query", query=q)
        assert instant["status"] == "success", f"{title} ({ref}) instant: {instant}"
    assert checked + kube_only == len(dashboard_targets())
    assert kube_only == 3, f"{kube_only} Kubernetes-only queries; expected the applies and two converge quantiles"


def test_dashboard_queries_see_the_work(observed):
    """A few queries, checked for the values the work must have produced."""
    prom = observed["prometheus"]
    sel = f'job="{JOB}"'

    def instant(q):
        return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in prom.query(q)}

    by_rcode = instant(f"sum by (rcode) (increase(meridian_dns_queries_total{{{sel}}}[{RATE_INTERVAL}]))")
    rcodes = {dict(k).get("rcode"): v for k, v in by_rcode.items()}
    assert rcodes.get("NOERROR", 0) > 0 and rcodes.get("NXDOMAIN", 0) > 0 and rcodes.get("REFUSED", 0) > 0, rcodes
    hit_ratio = list(instant(
        f"sum(rate(meridian_dns_answer_cache_hits_total{{{sel}}}[{RATE_INTERVAL}])) / "
        f"(sum(rate(meridian_dns_answer_cache_hits_total{{{sel}}}[{RATE_INTERVAL}])) + "
        f"sum(rate(meridian_dns_answer_cache_misses_total{{{sel}}}[{RATE_INTERVAL}])))").values())
    assert len(hit_ratio) == 1 and 0.5 < hit_ratio[0] < 1, f"cache hit ratio {hit_ratio}: 20 identical UDP queries were asked"
    streams = instant(f"sum by (cluster) (meridian_xds_streams{{{sel}}})")
    assert {dict(k)["cluster"]: v for k, v in streams.items()} == {"eu-1": 1.0, "us-1": 1.0}, streams
    nacks = instant(f'sum by (resource) (meridian_xds_nacks_total{{{sel}}})')
    assert {dict(k)["resource"]: v for k, v in nacks.items()} == {observed["nacked"]: 2.0}, nacks
    acks = instant(f"sum by (resource) (meridian_xds_acks_total{{{sel}}})")
    acked = {dict(k)["resource"]: v for k, v in acks.items()}
    assert acked.get("CDS", 0) >= 2 and acked.get("EDS", 0) >= 1, acked
    health = instant(f"sum by (cluster, state) (meridian_cluster_health{{{sel}}}) == 1")
    assert {dict(k)["cluster"]: dict(k)["state"] for k in health} == {
        "eu-1": "Healthy", GONE: "Unreachable", "us-1": "Healthy"}, f"{health}\n{observed['meridian'].log_tail()}"
    withdrawals = instant(f"sum by (cluster, to) (meridian_registry_withdrawals_total{{{sel}}})")
    assert {(dict(k)["cluster"], dict(k)["to"]) for k in withdrawals} == {(GONE, "withdrawn")}, withdrawals
    leader = instant(f"max(meridian_leader{{{sel}}})")
    assert list(leader.values()) == [1.0], leader
    placements = instant(f"sum by (result) (meridian_placements{{{sel}}})")
    templates = len([d for d in yaml.safe_load_all((FEDERATION / "hub" / "web.yaml").read_text()) if d])
    assert {dict(k)["result"]: v for k, v in placements.items()} == {"scheduled": templates, "unschedulable": 0.0}, placements


def test_rules_are_loaded_healthy_and_alert_on_the_work(observed):
    prom = observed["prometheus"]
    expected = {g["name"]: [r["alert"] for r in g["rules"]] for g in rules_doc()["groups"]}

    def loaded():
        body = prom.api("rules")
        assert body["status"] == "success", body
        return body["data"]["groups"]

    # Each group evaluated at least once since the work (evaluation every second).
    deadline = time.time() + 10
    while True:
        groups = loaded()
        evaluated = all(r.get("lastEvaluation", "").startswith("20") for g in groups for r in g["rules"])
        if evaluated or time.time() > deadline:
            break
        time.sleep(0.2)
    assert {g["name"]: [r["name"] for r in g["rules"]] for g in groups} == expected
    for g in groups:
        assert g["file"] == str(RULES), g["file"]
        for r in g["rules"]:
            assert r["type"] == "alerting", r["name"]
            assert r["health"] == "ok", f"{r['name']}: {r['health']} {r.get('lastError')}"
            assert not r.get("lastError"), f"{r['name']}: {r['lastError']}"
            assert r["lastEvaluation"].startswith("20"), f"{r['name']} never evaluated: {r['lastEvaluation']}"

    # The removed member's alerts and the NACK's are active (pending: their for: is longer than
    # this test), for exactly those series; nothing else is.
    want = {("MeridianMemberUnreachable", GONE), ("MeridianMemberWithdrawn", GONE),
            ("MeridianXdsNacks", observed["nacked"])}

    def active():
        body = prom.api("alerts")
        assert body["status"] == "success", body
        return {(a["labels"]["alertname"], a["labels"].get("cluster") or a["labels"].get("resource")): a
                for a in body["data"]["alerts"]}

    deadline = time.time() + 10
    while set(active()) != want and time.time() < deadline:
        time.sleep(0.2)
    alerts = active()
    assert set(alerts) == want, (f"active alerts {({k: a['state'] for k, a in alerts.items()})}\n"
                                 f"--- meridian log tail ---\n{observed['meridian'].log_tail()}")
    for key, a in alerts.items():
        assert a["state"] in {"pending", "firing"}, (key, a["state"])
        assert a["labels"]["job"] == JOB and a["labels"]["instance"] == observed["target"], a["labels"]
        assert a["labels"]["severity"] in {"warning", "critical"}, a["labels"]
        assert a["annotations"]["summary"] and "{{" not in a["annotations"]["summary"], a["annotations"]
        assert observed["target"] in a["annotations"]["description"], a["annotations"]
