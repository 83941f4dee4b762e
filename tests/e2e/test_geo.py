"""Geography for DNS clients outside the fleet (issue 20), end to end: the release binary on
the quickstart fleet (eu-1 in zone eu-1a and eu-2 in eu-2a, region eu; us-1 in us-1a, region
us), with geo ranges from the config and from a watched `network,region[,zone]` file, asked by
real `dig` and `kdig`, by EDNS Client Subnet and by source address (`-b 127.0.x.y`).

Locality mode answers the first tier only, so the addresses tell the tier: a client placed in
region eu gets eu-1's and eu-2's endpoints, one in zone eu-1a only eu-1's, one in us only
us-1's (its endpoints, not its gateway: a geo client has no network), and an unknown client
all six.
"""

import json
import subprocess

import pytest

from conftest import BIN, FROM_EU1, FROM_EU2, Meridian, require_tool

NAME = "payments.shop.global"
EU1 = ["127.1.1.1", "127.1.1.2"]
EU2 = ["127.1.2.1", "127.1.2.2"]
US1 = ["127.1.3.1", "127.1.3.2"]
EU = sorted(EU1 + EU2)
EVERYONE = sorted(EU1 + EU2 + US1)

# The config's own ranges (merged before the file's).
CONFIG = """
geo:
  ranges:
    - {cidrs: [203.0.113.0/24, '2001:db8::/32'], region: eu}
  file: geo.csv
  reloadSeconds: 1
"""

# A MaxMind-style export: a header, comments, and ranges none of the clusters' dnsClientCIDRs
# (127.0.1.0/24, 127.0.2.0/24, 127.0.3.0/24) claims, except on purpose:
#  - 127.0.0.0/16 holds every cluster's /24: the clusters' longer prefixes win there;
#  - 127.0.2.128/25 is inside eu-2's /24 and longer: it wins in its half.
GEO_CSV = """\
network,region,zone
# outside clients by region
198.51.100.0/24,us
127.0.50.0/24,eu,eu-1a
127.0.60.0/24,us
127.0.0.0/16,us
127.0.2.128/25,us
"""


def dig(m, *args, source="127.0.9.9", tool="dig"):
    """Sorted A addresses `tool` gets for NAME from `source` with extra `args` (+subnet=…)."""
    exe = require_tool(tool)
    retry = "+tries=1" if tool == "dig" else "+retry=0"
    cmd = [exe, "@127.0.0.1", "-p", str(m.dns_port), "-b", source, "+norec", "+time=3", retry,
           "+noall", "+answer", *args, NAME, "A"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}{p.stderr}"
    out = []
    for line in p.stdout.splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[3] == "A":
            out.append(fields[4])
    return sorted(out)


def problems(m):
    status, body = m.http("/debug/problems")
    assert status == 200, body
    return json.loads(body)["problems"]


def geo_problems(m):
    return [p for p in problems(m) if p["cluster"] == "geo"]


def metric(m, name):
    status, body = m.http("/metrics")
    assert status == 200
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics:\n{body}")


@pytest.fixture
def geo(fleet):
    """The quickstart with CONFIG's ranges and GEO_CSV, and meridian serving it."""
    fleet.write("meridian.yaml", fleet.config.read_text() + CONFIG)
    fleet.write("geo.csv", GEO_CSV)
    m = Meridian(fleet)
    # The ranges are read before the hub: ready means they are served.
    yield m
    m.stop()


def test_an_ecs_subnet_in_a_geo_range_gets_that_regions_clusters_first(geo):
    assert dig(geo, "+subnet=203.0.113.0/24") == EU, "203.0.113.0/24 (config) is in eu"
    assert dig(geo, "+subnet=198.51.100.0/24") == US1, "198.51.100.0/24 (file) is in us"
    # ECS wins over a source inside eu-1.
    assert dig(geo, "+subnet=198.51.100.0/24", source=FROM_EU1) == US1
    assert dig(geo, "+subnet=203.0.113.0/24", tool="kdig") == EU
    assert dig(geo, "+subnet=2001:db8:7::/48", tool="kdig") == EU, "an IPv6 range"
    assert dig(geo, "+subnet=192.0.2.0/24") == EVERYONE, "in no range: an unknown client"


def test_a_source_address_in_a_geo_range_gets_that_region(geo):
    # Asked twice each: the second answer comes from the hot path's cache.
    for _ in range(2):
        assert dig(geo, source="127.0.50.1") == EU1, "127.0.50.0/24 is zone eu-1a: eu-1 first"
        assert dig(geo, source="127.0.60.1") == US1, "127.0.60.0/24 is in us"
        assert dig(geo, source=FROM_EU1) == EU1, "a cluster's client is still its cluster's"
    # The admin API explains the place a geo client is given, and its answer.
    status, body = geo.http("/debug/resolve?name=payments.shop.global&from=127.0.50.1")
    assert status == 200, body
    explained = json.loads(body)
    assert explained["clientGeo"] == {"region": "eu", "zone": "eu-1a"}, explained
    assert explained["clientCluster"] is None
    assert sorted(a.split()[-1] for a in explained["answers"]) == EU1, explained
    assert [t["reasons"] for t in explained["decision"]["tiers"]] == [["SameZone"], ["SameRegion"], ["Remote"]]


def test_the_longest_prefix_decides_between_cluster_cidrs_and_geo_ranges(geo):
    for _ in range(2):
        # eu-1's dnsClientCIDRs 127.0.1.0/24 is longer than the geo 127.0.0.0/16 (us).
        assert dig(geo, source="127.0.1.77") == EU1
        assert dig(geo, source=FROM_EU2) == EU2
        # Only the geo /16 holds these.
        assert dig(geo, source="127.0.70.1") == US1
        assert dig(geo, source="127.0.9.9") == US1
        # The geo /25 inside eu-2's /24 is longer: us there, eu-2 in the other half.
        assert dig(geo, source="127.0.2.200") == US1
        assert dig(geo, source="127.0.2.100") == EU2


def test_a_range_file_edit_takes_effect_without_restart(geo, fleet):
    assert dig(geo, source="127.0.50.1") == EU1
    loaded = metric(geo, "meridian_geo_ranges")
    assert loaded == 7, "two config ranges and five file ranges"
    # Move 127.0.50.0/24 from eu to us, and add a range.
    fleet.write("geo.csv", GEO_CSV.replace("127.0.50.0/24,eu,eu-1a", "127.0.50.0/24,us")
                + "127.0.80.0/24,eu,eu-2a\n")
    geo.wait_for(lambda: dig(geo, source="127.0.50.1") == US1, timeout=15, interval=0.2,
                 what="127.0.50.0/24 answered as us after the edit")
    assert dig(geo, source="127.0.80.1") == EU2, "the added range, zone eu-2a"
    assert dig(geo, "+subnet=203.0.113.0/24") == EU, "the config's ranges stay"
    assert metric(geo, "meridian_geo_ranges") == 8
    assert geo.proc.poll() is None


def test_bad_lines_are_reported_with_line_numbers_and_the_good_lines_serve(geo, fleet):
    fleet.write("geo.csv", "\n".join([
        "network,region,zone",          # 1: header
        "127.0.60.0/24,eu",             # 2: good (moved from us to eu)
        "127.0.61.0/33,eu",             # 3: bad CIDR
        "127.0.62.0/24",                # 4: missing region
        "127.0.63.1,us",                # 5: no prefix length
        "203.0.113.0/24,us",            # 6: the config gives it eu
        "  # a comment",                # 7
        "",                             # 8
        "198.51.100.0/24,us,us-1a,x",   # 9: too many fields
        "127.0.64.0/24,us",             # 10: good
    ]) + "\n")
    path = str(fleet.root / "geo.csv")
    expected = {
        f"{path}: line 3": "bad CIDR",
        f"{path}: line 4": "missing region",
        f"{path}: line 5": "prefix length",
        f"{path}: line 6": "another locality",
        f"{path}: line 9": "4 fields",
    }

    def reported():
        found = {p["object"]: p["reason"] for p in geo_problems(geo)}
        return found if all(k in found for k in expected) else None

    found = geo.wait_for(reported, timeout=15, interval=0.2, what="every bad line on /debug/problems")
    for where, reason in expected.items():
        assert reason in found[where], f"{where}: {found[where]!r} should say {reason!r}"
    # The config's range is reported too, where it was given, and is not served.
    config = [o for o in found if o.endswith("geo.ranges[0]")]
    assert config and "another locality" in found[config[0]], found
    assert dig(geo, "+subnet=203.0.113.0/24") == EVERYONE, "a conflicting CIDR is not used"
    # The good lines serve.
    assert dig(geo, source="127.0.60.1") == EU
    assert dig(geo, source="127.0.64.1") == US1
    assert metric(geo, "meridian_geo_problems") == 6
    assert "geo range rejected" in geo.log.read_text()
    # `meridian validate` reads the ranges as `serve` does, and fails naming each bad line.
    v = subprocess.run([str(BIN), "validate", "--config", str(fleet.config)],
                       capture_output=True, text=True, timeout=60)
    assert v.returncode != 0, v.stdout + v.stderr
    for where in expected:
        assert f"error: {where}: " in v.stdout, f"{where} not in:\n{v.stdout}"

    # Fixed: the problems go.
    fleet.write("geo.csv", GEO_CSV)
    geo.wait_for(lambda: not geo_problems(geo), timeout=15, interval=0.2, what="the geo problems to clear")
    assert dig(geo, source="127.0.60.1") == US1


def test_a_file_that_becomes_unreadable_keeps_the_last_good_ranges(geo, fleet):
    assert dig(geo, source="127.0.60.1") == US1
    (fleet.root / "geo.csv").unlink()
    found = geo.wait_for(lambda: [p for p in geo_problems(geo) if p["object"].endswith("geo.csv: file")],
                         timeout=15, interval=0.2, what="the missing file on /debug/problems")
    assert "keep serving" in found[0]["reason"], found
    assert dig(geo, source="127.0.60.1") == US1, "the last good ranges still serve"
    assert dig(geo, source="127.0.50.1") == EU1
    fleet.write("geo.csv", "127.0.60.0/24,eu\n")
    geo.wait_for(lambda: dig(geo, source="127.0.60.1") == EU, timeout=15, interval=0.2,
                 what="the file read again")
    assert not geo_problems(geo)
    # 127.0.50.0/24 is no longer in the file: that client is unknown again.
    assert dig(geo, source="127.0.50.1") == EVERYONE
