"""What-if (issue 20), end to end on the quickstart fleet against the release binary:
`meridian simulate` and `meridian explain --assume` ask the running server about a fleet that
does not exist yet; then the assumption is made true (eu-1's directory goes away, so its
heartbeats fail) and real clients — dig from each cluster's source addresses, and a
gRPC ADS stream (grpcio with the Envoy protos) for the EDS priorities — get exactly what the
simulation said. Nothing the simulation does is written or served before that.

Health timings are short (unreachable after 2 s, withdrawn 3 s later), so the settle instant
is seconds away and the real outage reaches it quickly. Every wait has a deadline and fails
with what it last saw.
"""

import ipaddress
import json
import re
import shutil
import subprocess
import urllib.request

import pytest

import ads
from ads import AdsStream
from conftest import BIN, FROM_EU1, FROM_EU2, FROM_UNKNOWN, FROM_US1, Meridian, require_tool

SOURCES = {"eu-1": FROM_EU1, "eu-2": FROM_EU2, "us-1": FROM_US1, None: FROM_UNKNOWN}
NETWORKS = {"eu-1": "n1", "eu-2": "n1", "us-1": "n2"}
WITHDRAWN_TIMEOUT = 20  # seconds from eu-1's directory going away to it being withdrawn


def cli(m, *args):
    """Runs `meridian ARGS --admin …`; returns (returncode, stdout, stderr)."""
    p = subprocess.run(
        [str(BIN), *args, "--admin", f"127.0.0.1:{m.admin_port}"],
        capture_output=True, text=True, timeout=60,
    )
    return p.returncode, p.stdout, p.stderr


def simulate_json(m, *args):
    rc, out, err = cli(m, "simulate", *args, "--json")
    assert rc == 0, f"simulate failed ({rc}): {err}\n{out}"
    return json.loads(out)


def post(m, path, body):
    req = urllib.request.Request(m.url(path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def dns_view(m, name, source):
    """What dig answers from `source`: the sorted A addresses, or the rcode's name when there
    are none (as the simulation reports them)."""
    exe = require_tool("dig")
    cmd = [exe, "@127.0.0.1", "-p", str(m.dns_port), "-b", source, "+norec", "+time=3", "+tries=1",
           "+noall", "+answer", "+comments", name, "A"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}"
    addresses = sorted(f[4] for f in (l.split() for l in p.stdout.splitlines())
                       if len(f) == 5 and f[3] == "A" and not l_is_comment(f))
    if addresses:
        return addresses
    status = re.search(r"status: ([A-Z]+)", p.stdout)
    assert status, p.stdout
    return [status.group(1)]


def l_is_comment(fields):
    return fields[0].startswith(";")


def expected(answers):
    """The simulation's DNS answers in `dns_view`'s form."""
    ips = []
    for a in answers:
        try:
            ipaddress.ip_address(a)
            ips.append(a)
        except ValueError:
            return [a]
    return sorted(ips)


def eds_tiers(m, service_port, cluster):
    """The EDS priorities a node in `cluster` receives for `service_port`: [[sub_zones]]."""
    resource = f"payments.shop.global:{service_port}"
    s = AdsStream(m.xds_port)
    try:
        node = ads.node(f"envoy-{cluster}", cluster, NETWORKS[cluster])
        s.send(ads.request(ads.EDS, [resource], node=node))
        got = ads.decode(s.recv_type(ads.EDS, timeout=10))
        assert resource in got, f"no {resource} in {sorted(got)}"
        by_priority = {}
        for loc in got[resource].endpoints:
            by_priority.setdefault(loc.priority, set()).add(loc.locality.sub_zone)
        return [sorted(by_priority[p]) for p in sorted(by_priority)]
    finally:
        s.close()


def route_tiers(route):
    return [sorted(member["cluster"] for member in tier) for tier in route["tiers"]]


def clusters(m):
    status, body = m.http("/debug/clusters")
    assert status == 200
    return {c["name"]: c for c in json.loads(body)["clusters"]}


@pytest.fixture
def whatif_meridian(fleet):
    fleet.set_health(heartbeat=1, unreachable=2, withdraw=3)
    m = Meridian(fleet)
    yield m
    m.stop()


def test_simulated_outage_is_what_the_real_outage_serves(whatif_meridian, fleet, tmp_path):
    m = whatif_meridian
    sim = simulate_json(m, "--assume", "eu-1=Unreachable")
    assert sim["assumptions"] == ["eu-1=Unreachable"]
    # Withdrawn 3 s after turning unreachable; the settle instant covers both windows.
    assert 3 <= sim["afterSeconds"] <= 10, sim["afterSeconds"]
    changed = {s["service"]: s for s in sim["services"]}
    assert "shop/payments" in changed, sorted(changed)
    by_client = {client: group for group in changed["shop/payments"]["clients"] for client in group["clients"]}
    eu1 = by_client["eu-1"]
    assert expected(eu1["dns"]["before"]) == ["127.1.1.1", "127.1.1.2"], eu1
    assert expected(eu1["dns"]["after"]) == ["127.1.2.1", "127.1.2.2"], eu1
    assert route_tiers(eu1["before"])[0] == ["eu-1"]
    assert route_tiers(eu1["after"])[0] == ["eu-2"]
    assert sim["totals"]["firstTierChanged"] >= 1, sim["totals"]
    shares = {(s["region"], s["cluster"]): s for s in sim["totals"]["shares"]}
    assert shares[("eu", "eu-2")]["afterPercent"] > shares[("eu", "eu-2")]["beforePercent"], shares
    assert shares[("eu", "eu-1")]["afterPercent"] == 0, shares

    # Words, for people: the totals and one line per changed client route.
    rc, words, err = cli(m, "simulate", "--assume", "eu-1=Unreachable")
    assert rc == 0, err
    assert "assuming eu-1=Unreachable" in words, words
    assert "service shop/payments:" in words and "from eu-1: EDS priorities [eu-1]" in words, words
    assert "DNS 127.1.1.1, 127.1.1.2 → 127.1.2.1, 127.1.2.2" in words, words

    # Nothing was written or served: eu-1 is healthy and still answers its own clients.
    assert clusters(m)["eu-1"]["health"] == "Healthy"
    assert dns_view(m, "payments.shop.global", FROM_EU1) == ["127.1.1.1", "127.1.1.2"]
    assert eds_tiers(m, 8080, "eu-1")[0] == ["eu-1"]

    # Now for real: eu-1's directory goes away, its heartbeats fail, it is withdrawn.
    shutil.move(str(fleet.cluster_dir("eu-1")), str(tmp_path / "eu-1-away"))
    m.wait_for(lambda: clusters(m)["eu-1"]["withdrawn"], timeout=WITHDRAWN_TIMEOUT,
               what="eu-1 withdrawn")

    for service in sim["services"]:
        ns, name = service["service"].split("/")
        for group in service["clients"]:
            for client in group["clients"]:
                got = dns_view(m, f"{name}.{ns}.global", SOURCES[client])
                assert got == expected(group["dns"]["after"]), (service["service"], client, got, group)
    # And a gRPC ADS client in each cluster gets the simulated EDS priorities (once xDS's
    # debounce has passed: pushes trail the snapshot by up to --xds-debounce-ms).
    assert "eu-2" in by_client, sorted(by_client, key=str)
    for client, change in by_client.items():
        if client is None or client == "eu-1":
            continue
        want = route_tiers(change["after"])
        m.wait_for(lambda: eds_tiers(m, 8080, client) == want, timeout=10,
                   what=f"EDS priorities {want} for a node in {client}")


def test_explain_with_an_assumption_and_without(whatif_meridian):
    m = whatif_meridian
    rc, out, err = cli(m, "explain", "payments.shop", "--from-cluster", "eu-1", "--assume", "eu-1=Unreachable")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("assuming eu-1=Unreachable, "), out
    assert "filtered: eu-1 — unreachable past its withdraw time" in out, out
    assert any(l.startswith("DNS A: 127.1.2.1, 127.1.2.2") for l in lines), out
    # The same question of the fleet as it is.
    rc, out, err = cli(m, "explain", "payments.shop", "--from-cluster", "eu-1")
    assert rc == 0, err
    assert "assuming" not in out
    assert any(l.startswith("DNS A: 127.1.1.1, 127.1.1.2") for l in out.splitlines()), out
    # Early in the outage nothing has moved yet.
    rc, out, err = cli(m, "explain", "payments.shop", "--from-cluster", "eu-1",
                       "--assume", "eu-1=Unreachable", "--after", "1s")
    assert rc == 0, err
    assert any(l.startswith("DNS A: 127.1.1.1, 127.1.1.2") for l in out.splitlines()), out


def test_an_invalid_policy_is_reported_and_nothing_simulated(whatif_meridian, tmp_path):
    m = whatif_meridian
    bad = tmp_path / "bad-policy.yaml"
    bad.write_text(
        "apiVersion: meridian.io/v1alpha1\nkind: ClusterSchedulingPolicy\n"
        "metadata: {name: broken, namespace: shop}\n"
        "spec:\n  resourceSelectors: [{kind: Service, name: payments}]\n"
        "  traffic: {mode: Tiers, minHealthyEndpoints: 0}\n"
    )
    rc, out, err = cli(m, "simulate", "--assume-policy", str(bad))
    assert rc != 0
    assert str(bad) in err and "minHealthyEndpoints" in err, err
    assert "nothing was simulated" in err, err
    assert out == "", out

    # A bad assumption and an unknown member: refused with the reason, over HTTP too.
    status, body = post(m, "/debug/simulate", {"assume": ["eu-1=Sleepy", "mars-1=Unreachable"]})
    assert status == 400, body
    assert any("CLUSTER=Unreachable" in e for e in body["errors"]), body
    status, body = post(m, "/debug/simulate", {"assume": ["mars-1=Unreachable"]})
    assert status == 400 and "no member cluster \"mars-1\" (members: eu-1, eu-2, us-1)" in body["error"], body
    rc, _, err = cli(m, "simulate")
    assert rc != 0 and "nothing to simulate" in err

    # DNS still serves the fleet as it is.
    assert dns_view(m, "payments.shop.global", FROM_EU1) == ["127.1.1.1", "127.1.1.2"]


def test_a_policy_edit_and_a_removal_simulated(whatif_meridian, tmp_path):
    m = whatif_meridian
    weighted = tmp_path / "weighted.yaml"
    weighted.write_text(
        "apiVersion: meridian.io/v1alpha1\nkind: ClusterSchedulingPolicy\n"
        "metadata: {name: spread, namespace: shop, creationTimestamp: \"2026-01-01T00:00:00Z\"}\n"
        "spec:\n  resourceSelectors: [{kind: Service, name: payments}]\n"
        "  traffic: {mode: Weighted}\n"
    )
    sim = simulate_json(m, "--assume-policy", str(weighted))
    changed = {s["service"]: s for s in sim["services"]}
    assert sorted(changed) == ["shop/payments"], sorted(changed)
    groups = changed["shop/payments"]["clients"]
    # us-1's clients see only us-1 either way (eu-1 and eu-2 are on another network, without
    # a gateway): only the eu clients and the client of no cluster change, to one tier of all.
    assert sorted(c for g in groups for c in g["clients"] if c) == ["eu-1", "eu-2"], groups
    for group in groups:
        assert route_tiers(group["after"]) == [["eu-1", "eu-2", "us-1"]], group
    # As JSON over GET, the same question a removal asks.
    status, body = m.http("/debug/simulate?remove=us-1")
    assert status == 200, body
    removal = json.loads(body)
    assert any("clients in us-1 are not compared" in n for n in removal["notes"]), removal
    db = {s["service"]: s for s in removal["services"]}["shop/db"]
    assert db["clients"], db
    for c in db["clients"]:
        assert "us-1" in sum(route_tiers(c["before"]), []), c
        assert "us-1" not in sum(route_tiers(c["after"]), []), c
    # With both of db's clusters gone, its clients get no address, and the words say so
    # (the JSON keeps the rcode, as dig would print it).
    rc, words, err = cli(m, "simulate", "--assume-remove", "eu-1", "--assume-remove", "us-1")
    assert rc == 0, err
    db_lines = words[words.index("service shop/db:"):].splitlines()[1:]
    assert any(re.search(r"DNS 127\.[\d., ]+ → no address \([A-Z]+\)$", line) for line in db_lines), words
