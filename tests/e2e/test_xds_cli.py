"""Asking meridian what it serves over xDS: `meridian xds dump`, `meridian xds clients`,
/debug/xds and the xDS metrics, against a running binary with a real ADS client connected."""

import json
import re
import subprocess

import ads
from conftest import BIN


def cli(meridian, *args):
    run = subprocess.run([str(BIN), *args, "--admin", f"127.0.0.1:{meridian.admin_port}"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_dump_shows_what_each_kind_of_node_receives(meridian):
    proxyless = json.loads(cli(meridian, "xds", "dump", "--json", "--node-cluster", "eu-1", "--role", "proxyless"))
    feed = proxyless["feed"]["resources"]
    names = {r["name"] for r in feed["LDS"]}
    assert "payments.shop.global:8080" in names
    eds = next(r for r in feed["EDS"] if r["name"] == "payments.shop.global:8080")
    localities = eds["detail"]["localities"]
    assert [(l["priority"], l["cluster"]) for l in localities] == [(0, "eu-1"), (1, "eu-2")]
    assert {e["health"] for e in localities[0]["endpoints"]} == {"HEALTHY", "DRAINING"}

    envoy = json.loads(cli(meridian, "xds", "dump", "--json", "--node-cluster", "eu-1"))["feed"]["resources"]
    eds = next(r for r in envoy["EDS"] if r["name"] == "payments.shop.global:8080")
    last = eds["detail"]["localities"][-1]
    assert last["cluster"] == "us-1" and last["endpoints"][0]["address"] == "127.0.3.100:15443"
    assert last["endpoints"][0]["viaGateway"] is True
    assert envoy["LDS"] == []

    # Without --json, the same for people: endpoints with their health and route.
    words = cli(meridian, "xds", "dump", "--node-cluster", "eu-1")
    assert words.startswith("node: role envoy, cluster eu-1, network of its cluster; snapshot "), words
    assert "  payments.shop.global:8080 (some endpoints through an east-west gateway)" in words, words
    assert "127.0.3.100:15443 (gateway)" in words, words
    assert "(draining)" in cli(meridian, "xds", "dump", "--node-cluster", "eu-1", "--role", "proxyless")

    gateway = json.loads(cli(meridian, "xds", "dump", "--json", "--node-cluster", "us-1", "--role", "eastwest-gateway"))
    listener = gateway["feed"]["resources"]["LDS"][0]
    assert listener["name"] == "eastwest-gateway:15443"
    assert "outbound_.8080_._.payments.shop.svc.cluster.local" in listener["detail"]["serverNames"]


def test_clients_debug_and_metrics_show_a_connected_node(meridian):
    stream = ads.AdsStream(meridian.xds_port)
    try:
        stream.send(ads.request(ads.CDS, node=ads.node("cli-test-node", "eu-2", "n1")))
        r = stream.recv_type(ads.CDS)
        stream.send(ads.ack(r))
        stream.send(ads.request(ads.EDS, ["payments.shop.global:9090"]))
        r = stream.recv_type(ads.EDS)
        stream.send(ads.request(ads.EDS, ["payments.shop.global:9090"], nonce=r.nonce,
                                error="endpoint rejected by test"))
        meridian.wait_for(
            lambda: "endpoint rejected by test" in cli(meridian, "xds", "clients"),
            what="the NACK in `meridian xds clients`")
        table = cli(meridian, "xds", "clients")
        line = next(l for l in table.splitlines() if l.startswith("cli-test-node") and " CDS " in l)
        assert "eu-2" in line and "sotw" in line
        status, body = meridian.http("/debug/xds")
        clients = json.loads(body)["clients"]
        mine = next(c for c in clients if c["node"]["id"] == "cli-test-node")
        assert mine["types"]["CDS"]["ackedVersion"] == mine["types"]["CDS"]["sentVersion"]
        assert mine["types"]["EDS"]["lastError"] == "endpoint rejected by test"
        _, metrics = meridian.http("/metrics")
        for needle in ('meridian_xds_streams{protocol="sotw",cluster="eu-2"} 1',
                       'meridian_xds_nacks_total{resource="EDS"} 1',
                       'meridian_xds_subscriptions{resource="CDS"} 1',
                       "meridian_xds_push_to_ack_seconds_count"):
            assert needle in metrics, needle
    finally:
        stream.close()


def test_explain_puts_the_decision_dns_and_eds_side_by_side(meridian):
    words = cli(meridian, "explain", "payments.shop", "--from-cluster", "eu-1")
    lines = words.splitlines()
    assert lines[0].startswith("shop/payments for a client in eu-1: no policy selects it")
    assert "priority 0 (the client's own cluster; 2 ready): eu-1 weight 2" in lines
    assert any(l.startswith("priority 2 (other regions") and "us-1 weight 2 (via gateway)" in l for l in lines), words
    assert "DNS A: 127.1.1.1, 127.1.1.2 (No Error)" in lines or "DNS A: 127.1.1.2, 127.1.1.1 (No Error)" in lines, words
    assert "  priority 2 us-1 weight 2 (1 endpoint, through its gateway)" in lines, words
    data = json.loads(cli(meridian, "explain", "shop/payments", "--from-cluster", "eu-1", "--json"))
    assert [t["priority"] for t in data["decision"]["tiers"]] == [0, 1, 2]
    assert {e["name"] for e in data["eds"]} == {"payments.shop.global:8080", "payments.shop.global:9090"}
    # The same decision from DNS and EDS: the clusters of priority 0 agree.
    eds0 = {l["cluster"] for l in data["eds"][0]["detail"]["localities"] if l["priority"] == 0}
    assert eds0 == {m["cluster"] for m in data["decision"]["tiers"][0]["clusters"]} == {"eu-1"}
    bad = subprocess.run([str(BIN), "explain", "nope.shop", "--admin", f"127.0.0.1:{meridian.admin_port}"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "no exported service shop/nope" in bad.stderr
    # Decisions are counted by the tier traffic goes to first, for DNS and for xDS.
    _, metrics = meridian.http("/metrics")
    assert 'meridian_dns_decisions_total{first_tier="client_cluster"}' in metrics
    assert 'meridian_xds_decisions_total{first_tier="client_cluster"}' in metrics
    for name in ("meridian_dns_spills_total", "meridian_xds_failing_back_total", "meridian_cluster_withdrawn"):
        assert name in metrics, name


def test_watch_prints_the_updates_a_node_receives(fleet, meridian):
    """`meridian xds watch` as an Envoy in eu-1: the clusters, then payments' endpoints by
    priority (eu-1 first, us-1 through its gateway last), as a real ADS stream sends them;
    each update timestamped, and a later one says what it changed."""
    watch = subprocess.Popen([str(BIN), "xds", "watch", "--xds", f"127.0.0.1:{meridian.xds_port}",
                              "--node-cluster", "eu-1", "--node-network", "n1", "--count", "3"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []

    def read():
        line = watch.stdout.readline()
        assert line, (lines, watch.stderr.read())
        lines.append(line.rstrip("\n"))
        return lines[-1]

    try:
        assert re.match(r"\d\d:\d\d:\d\d\.\d{3} CDS version \S+: \d+ resource\(s\); \d+ added, 0 changed, 0 removed$",
                        read()), lines
        while " EDS version " not in read():
            pass
        # The whole first EDS update, then one endpoint of eu-1's payments moves.
        remaining = int(re.search(r": (\d+) resource", lines[-1]).group(1))
        while remaining:
            remaining -= read().startswith("  + ")
        text = (fleet.cluster_dir("eu-1") / "payments.yaml").read_text()
        assert "  - addresses: [127.1.1.2]\n" in text
        fleet.write("clusters/eu-1/payments.yaml", text.replace("[127.1.1.2]", "[127.1.1.9]"))
        out, err = watch.communicate(timeout=30)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    lines += out.splitlines()
    eds = lines.index("  + payments.shop.global:8080", lines.index(next(l for l in lines if " EDS version " in l)))
    assert lines[eds + 1].startswith("      priority 0 eu-1 (eu/eu-1a) weight 2: 127.1.1.1:8080"), lines[eds + 1]
    assert lines[eds + 3] == "      priority 2 us-1 (us/us-1a) weight 2: 127.0.3.100:15443 (gateway)", lines[eds + 3]
    last = next(l for l in reversed(lines) if " EDS version " in l)
    assert last.endswith("; 0 added, 1 changed, 0 removed") or last.endswith("; 0 added, 2 changed, 0 removed"), last
    changed = lines[lines.index(last) + 1:]
    assert changed[0] == "  ~ payments.shop.global:8080", changed
    assert "127.1.1.9:8080" in changed[1] and "127.1.1.2" not in changed[1], changed


def test_watch_names_a_server_it_cannot_reach():
    run = subprocess.run([str(BIN), "xds", "watch", "--xds", "127.0.0.1:1", "--count", "1"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert "cannot connect to the xDS server at 127.0.0.1:1" in run.stderr


def test_the_tls_certificates_expiry_is_a_metric(fleet, start_meridian, tmp_path):
    """With xDS over TLS, /metrics says when the served certificate expires: its notAfter as
    openssl reads it (what MeridianCertificateExpiresSoon watches). Without TLS there is no
    such series (a 0 would look expired)."""
    from conftest import make_certs

    _, cert, key = make_certs(tmp_path / "pki")
    end = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-enddate"],
                         capture_output=True, text=True, check=True).stdout.strip().split("=", 1)[1]
    want = int(subprocess.run(["date", "-d", end, "+%s"], capture_output=True, text=True, check=True).stdout)
    m = start_meridian(fleet, "--xds-tls-cert", str(cert), "--xds-tls-key", str(key))
    _, metrics = m.http("/metrics")
    assert f"meridian_xds_tls_certificate_expiry_timestamp_seconds {want}" in metrics.splitlines()


def test_no_expiry_series_without_tls(meridian):
    _, metrics = meridian.http("/metrics")
    assert "meridian_xds_tls_certificate_expiry_timestamp_seconds" not in metrics


def test_resolve_from_an_address_answers_as_dns_places_that_source(meridian):
    """`resolve --from ADDRESS`: the client is placed as a query from that address would be
    (eu-1's dnsClientCIDRs here, nowhere for an address in no range), and answered so."""
    eu1 = cli(meridian, "resolve", "payments.shop.global", "--from", "127.0.1.7")
    assert eu1.splitlines()[0] == "payments.shop.global. A from 127.0.1.7 (eu-1): No Error", eu1
    addresses = sorted(line.split()[-1] for line in eu1.splitlines() if line.strip().startswith("answer"))
    assert addresses == ["127.1.1.1", "127.1.1.2"], eu1
    nowhere = cli(meridian, "resolve", "payments.shop.global", "--from", "127.0.9.9")
    assert nowhere.splitlines()[0] == "payments.shop.global. A from 127.0.9.9 (an unknown cluster): No Error", nowhere
    both = subprocess.run([str(BIN), "resolve", "payments.shop.global", "--from", "127.0.1.7", "--from-cluster",
                           "eu-2"], capture_output=True, text=True, timeout=30)
    assert both.returncode == 2 and "cannot be used with" in both.stderr, both.stderr
