"""meridian behind real forwarding resolvers, as production uses it (DESIGN.md §4).

Member clusters do not query meridian directly: their CoreDNS forwards `global` and
`clusterset.local` to it, and other sites put a caching resolver such as unbound in front.
These tests start those peers on free loopback ports and check what survives the hop:

- CoreDNS's forward plugin queries meridian from 127.0.0.1, which is in no cluster's
  dnsClientCIDRs, so every client behind it is an unknown client (all ready endpoints),
  whatever the address of the client that asked CoreDNS;
- unbound can pin its source address (`outgoing-interface`), and an address inside a
  cluster's dnsClientCIDRs keeps locality through the forwarder;
- a change to a member's manifests reaches clients through the forwarder within meridian's
  TTL plus a little; the delays are printed with the prefix "MEASURED:".

The peers are never optional: a missing or unbuildable peer fails the test with the reason.
CoreDNS is built from its Go module by tests/peers/coredns.sh (cached after the first build).
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest

from conftest import FROM_EU1, FROM_US1, FROM_UNKNOWN, ROOT, built_peer, free_port, require_tool, stop_process

PAYMENTS = "payments.shop.global"
PAYMENTS_CLUSTERSET = "payments.shop.svc.clusterset.local"
EU1 = ["127.1.1.1", "127.1.1.2"]
US1 = ["127.1.3.1", "127.1.3.2"]
ALL_READY = ["127.1.1.1", "127.1.1.2", "127.1.2.1", "127.1.2.2", "127.1.3.1", "127.1.3.2"]

COREDNS_SCRIPT = ROOT / "tests" / "peers" / "coredns.sh"
COREDNS_BUILD_TIMEOUT = 1800  # seconds; a first build downloads and compiles CoreDNS


# ---------------------------------------------------------------------------------------
# Peers


def ask(port, name, rdtype="A", source="127.0.0.1", timeout=2, tcp=False, rd=True, **make_kwargs):
    """One fresh query (new ID) to a server on 127.0.0.1:port; returns the response."""
    q = dns.message.make_query(name, rdtype, **make_kwargs)
    if not rd:
        q.flags &= ~dns.flags.RD
    if tcp:
        return dns.query.tcp(q, "127.0.0.1", port=port, source=source, timeout=timeout)
    return dns.query.udp(q, "127.0.0.1", port=port, source=source, timeout=timeout)


def addresses_of(response, rdtype=dns.rdatatype.A):
    return sorted(rr.address for rrset in response.answer if rrset.rdtype == rdtype for rr in rrset)


def dig_addresses(port, name, source="127.0.0.1", rdtype="A"):
    """The addresses `dig +short` prints for name, asked of 127.0.0.1:port from source."""
    dig = require_tool("dig")
    out = subprocess.run(
        [dig, "@127.0.0.1", "-p", str(port), "-b", source, "+short", "+tries=1", "+time=3", name, rdtype],
        capture_output=True, text=True, timeout=15,
    )
    assert out.returncode == 0, f"dig failed ({out.returncode}): {out.stdout}{out.stderr}"
    return sorted(line for line in out.stdout.split() if line)


class Peer:
    """A resolver process in front of meridian, with its log kept for failure messages."""

    def __init__(self, name, args, log: Path, port):
        self.name = name
        self.port = port
        self.log = log
        self.args = args
        self.proc = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)

    def log_text(self, lines=60):
        try:
            return "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def wait_answering(self, name, timeout=20):
        """Waits until the peer answers `name` with NOERROR and an answer section."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"{self.name} exited with {self.proc.returncode} on start "
                    f"({' '.join(self.args)}):\n{self.log_text()}"
                )
            try:
                r = ask(self.port, name, timeout=0.5)
                last = f"{dns.rcode.to_text(r.rcode())} {r.answer}"
                if r.rcode() == dns.rcode.NOERROR and r.answer:
                    return
            except (dns.exception.Timeout, OSError) as e:
                last = repr(e)
            time.sleep(0.1)
        pytest.fail(f"{self.name} on port {self.port} did not answer {name} within {timeout}s; "
                    f"last: {last}\n--- {self.name} log ---\n{self.log_text()}")

    def stop(self):
        stop_process(self.proc)


@pytest.fixture(scope="session")
def coredns_bin():
    """CoreDNS built from its Go module by tests/peers/coredns.sh (fails, never skips).
    tests/run builds it first and passes the path in COREDNS_BIN."""
    path = built_peer("COREDNS_BIN", COREDNS_SCRIPT, "CoreDNS", COREDNS_BUILD_TIMEOUT)
    version = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=10).stdout.strip()
    print(f"\nCoreDNS: {path} ({version.splitlines()[0] if version else 'unknown version'})")
    return path


@pytest.fixture(scope="session")
def unbound_bin():
    """unbound from Debian's package, installed here if missing (fails, never skips)."""
    if shutil.which("unbound") is None and shutil.which("apt-get") is not None and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "unbound"]
        r = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
        if r.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env, timeout=600)
            r = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
        if r.returncode != 0:
            pytest.fail(f"unbound is not installed and `apt-get install unbound` failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return require_tool("unbound")


@pytest.fixture
def peers():
    """Starts peers; stops every one of them when the test ends."""
    started = []

    def add(peer):
        started.append(peer)
        return peer

    yield add
    for p in started:
        p.stop()


def start_coredns(binary, workdir: Path, upstream_port, peers):
    """CoreDNS forwarding both of meridian's zones to it, as a member cluster's Corefile does."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    corefile = workdir / "Corefile"
    corefile.write_text(
        "".join(
            f"{zone}:{port} {{\n"
            f"    bind 127.0.0.1\n"
            f"    errors\n"
            f"    forward . 127.0.0.1:{upstream_port}\n"
            f"}}\n"
            for zone in ("global", "clusterset.local")
        )
    )
    peer = peers(Peer("coredns", [binary, "-conf", str(corefile)], workdir / "coredns.log", port))
    peer.wait_answering(PAYMENTS)
    return peer


def unbound_server(workdir: Path, port: int) -> list[str]:
    """The `server:` lines every unbound here shares: loopback only, no daemon habits."""
    return [
        "server:",
        "    interface: 127.0.0.1",
        f"    port: {port}",
        "    do-ip6: no",
        "    access-control: 127.0.0.0/8 allow",
        '    chroot: ""',
        '    username: ""',
        f'    directory: "{workdir}"',
        f'    pidfile: "{workdir / "unbound.pid"}"',
        '    logfile: ""',
        "    use-syslog: no",
        "    num-threads: 1",
        "    so-reuseport: no",
    ]


def run_unbound(binary, workdir: Path, port: int, config: str, name: str, peers):
    """Writes `config`, has unbound-checkconf check it, and starts unbound on it."""
    conf = workdir / "unbound.conf"
    conf.write_text(config)
    checkconf = shutil.which("unbound-checkconf")
    if checkconf:
        r = subprocess.run([checkconf, str(conf)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            pytest.fail(f"unbound-checkconf rejects {conf}:\n{r.stdout}{r.stderr}\n{conf.read_text()}")
    return peers(Peer(name, [binary, "-d", "-c", str(conf)], workdir / "unbound.log", port))


def start_unbound(binary, workdir: Path, upstream_port, outgoing, peers, cache_max_ttl=None):
    """unbound as a caching forwarder for meridian's zones, querying from `outgoing`."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    lines = unbound_server(workdir, port) + [
        "    do-not-query-localhost: no",
        f"    outgoing-interface: {outgoing}",
        # .global is a real, signed TLD; DESIGN.md §4 tells users to mark the zone insecure.
        '    domain-insecure: "global"',
        '    domain-insecure: "clusterset.local"',
        '    module-config: "iterator"',
        "    verbosity: 1",
        "    prefetch: no",
        "    serve-expired: no",
    ]
    if cache_max_ttl is not None:
        lines += [f"    cache-max-ttl: {cache_max_ttl}", f"    cache-max-negative-ttl: {cache_max_ttl}"]
    for zone in ("global.", "clusterset.local."):
        lines += ["forward-zone:", f'    name: "{zone}"', f"    forward-addr: 127.0.0.1@{upstream_port}"]
    peer = run_unbound(binary, workdir, port, "\n".join(lines) + "\n", f"unbound(outgoing {outgoing})", peers)
    peer.wait_answering(PAYMENTS)
    return peer


def assert_fleet_loaded(meridian):
    """meridian itself answers as the quickstart says, before any forwarder is involved:
    eu-1's client gets eu-1's endpoints, an unknown client all six."""
    got_eu1 = meridian.addresses(PAYMENTS, source=FROM_EU1)
    got_all = meridian.addresses(PAYMENTS, source=FROM_UNKNOWN)
    if got_eu1 != EU1 or got_all != ALL_READY:
        status, clusters = meridian.http("/debug/clusters")
        pytest.fail(
            f"meridian (queried directly, no forwarder) answers {PAYMENTS} A from {FROM_EU1} with "
            f"{got_eu1} (expected {EU1}) and from {FROM_UNKNOWN} with {got_all} (expected "
            f"{ALL_READY}) after /readyz said ready\n/debug/clusters ({status}): {clusters}\n"
            f"--- meridian log ---\n{meridian.log_tail()}"
        )


# ---------------------------------------------------------------------------------------
# CoreDNS


def test_coredns_forward_answers_as_for_an_unknown_client(meridian, coredns_bin, peers, tmp_path):
    """CoreDNS's forward plugin asks meridian from 127.0.0.1, in no cluster's dnsClientCIDRs,
    so every client behind it gets the unknown client's answer: all ready endpoints."""
    assert_fleet_loaded(meridian)
    coredns = start_coredns(coredns_bin, tmp_path / "coredns", meridian.dns_port, peers)

    direct_unknown = meridian.addresses(PAYMENTS, source=FROM_UNKNOWN)
    assert direct_unknown == ALL_READY
    # What CoreDNS itself is, to meridian: an unknown client.
    assert meridian.addresses(PAYMENTS, source="127.0.0.1") == ALL_READY

    for client in (FROM_EU1, FROM_US1, FROM_UNKNOWN, "127.0.0.1"):
        r = ask(coredns.port, PAYMENTS, source=client)
        assert r.rcode() == dns.rcode.NOERROR, f"{PAYMENTS} via CoreDNS from {client}: {r}"
        assert addresses_of(r) == direct_unknown, (
            f"{PAYMENTS} A via CoreDNS asked from {client}: expected meridian's answer for an "
            f"unknown client {direct_unknown}, got {addresses_of(r)}"
        )
        for rrset in r.answer:
            assert rrset.ttl <= 5, f"TTL {rrset.ttl} above meridian's 5 via CoreDNS"
        # dig, the tool operators use, sees the same.
        assert dig_addresses(coredns.port, PAYMENTS, source=client) == direct_unknown

    # The same over TCP through CoreDNS (forward keeps the client's transport).
    r = ask(coredns.port, PAYMENTS, source=FROM_EU1, tcp=True)
    assert addresses_of(r) == direct_unknown

    # A per-cluster name selects that cluster whoever asks.
    r = ask(coredns.port, f"eu-1.{PAYMENTS}", source=FROM_US1)
    assert addresses_of(r) == meridian.addresses(f"eu-1.{PAYMENTS}") == EU1


def test_coredns_forwards_negative_answers_and_clusterset(meridian, coredns_bin, peers, tmp_path):
    assert_fleet_loaded(meridian)
    coredns = start_coredns(coredns_bin, tmp_path / "coredns", meridian.dns_port, peers)

    # NXDOMAIN and NODATA pass through unchanged (CoreDNS must not turn them into each other).
    missing = "nosuch.shop.global"
    direct = meridian.query(missing)
    via = ask(coredns.port, missing)
    assert direct.rcode() == dns.rcode.NXDOMAIN
    assert via.rcode() == dns.rcode.NXDOMAIN, f"{missing} via CoreDNS: {via}"
    assert via.authority and via.authority[0].rdtype == dns.rdatatype.SOA

    # clusterset.local, the MCS name: no ServiceImport in the quickstart, so the selected
    # endpoints, which for CoreDNS (an unknown client) are all ready ones.
    direct = meridian.addresses(PAYMENTS_CLUSTERSET, source="127.0.0.1")
    assert direct, f"meridian gives no address for {PAYMENTS_CLUSTERSET}"
    for client in (FROM_EU1, FROM_US1):
        r = ask(coredns.port, PAYMENTS_CLUSTERSET, source=client)
        assert r.rcode() == dns.rcode.NOERROR, f"{PAYMENTS_CLUSTERSET} via CoreDNS: {r}"
        assert addresses_of(r) == direct
        assert dig_addresses(coredns.port, PAYMENTS_CLUSTERSET, source=client) == direct

    r = ask(coredns.port, "dns-version.clusterset.local", "TXT")
    assert r.rcode() == dns.rcode.NOERROR
    txt = [b"".join(rr.strings).decode() for rrset in r.answer for rr in rrset]
    assert txt == ["1.0.0"], f"dns-version.clusterset.local TXT via CoreDNS: {r}"


# ---------------------------------------------------------------------------------------
# unbound


def test_unbound_outgoing_interface_keeps_locality(meridian, unbound_bin, peers, tmp_path):
    """An unbound whose source address sits in eu-1's dnsClientCIDRs gets eu-1's endpoints
    for every client behind it; one sourcing from us-1's range gets us-1's."""
    assert_fleet_loaded(meridian)
    eu = start_unbound(unbound_bin, tmp_path / "unbound-eu1", meridian.dns_port, FROM_EU1, peers)
    us = start_unbound(unbound_bin, tmp_path / "unbound-us1", meridian.dns_port, FROM_US1, peers)

    assert meridian.addresses(PAYMENTS, source=FROM_EU1) == EU1
    assert meridian.addresses(PAYMENTS, source=FROM_US1) == US1

    for client in ("127.0.0.1", FROM_UNKNOWN, FROM_US1):
        r = ask(eu.port, PAYMENTS, source=client)
        assert r.rcode() == dns.rcode.NOERROR, f"{PAYMENTS} via unbound(eu-1) from {client}: {r}"
        assert addresses_of(r) == EU1, (
            f"{PAYMENTS} A via unbound with outgoing-interface {FROM_EU1}, asked from {client}: "
            f"expected eu-1's {EU1}, got {addresses_of(r)}"
        )
        assert dig_addresses(eu.port, PAYMENTS, source=client) == EU1

        r = ask(us.port, PAYMENTS, source=client)
        assert addresses_of(r) == US1, (
            f"{PAYMENTS} A via unbound with outgoing-interface {FROM_US1}, asked from {client}: "
            f"expected us-1's {US1}, got {addresses_of(r)}"
        )
        assert dig_addresses(us.port, PAYMENTS, source=client) == US1

    # The MCS name keeps locality too: the same first tier as meridian gives eu-1 directly.
    direct = meridian.addresses(PAYMENTS_CLUSTERSET, source=FROM_EU1)
    r = ask(eu.port, PAYMENTS_CLUSTERSET)
    assert r.rcode() == dns.rcode.NOERROR, f"{PAYMENTS_CLUSTERSET} via unbound(eu-1): {r}"
    assert addresses_of(r) == direct

    # A name meridian does not have is NXDOMAIN through unbound too (not SERVFAIL).
    r = ask(eu.port, "nosuch.shop.global")
    assert r.rcode() == dns.rcode.NXDOMAIN, f"nosuch.shop.global via unbound: {r}"


SHIPPED_UNBOUND_CONF = ROOT / "deploy" / "unbound" / "meridian.conf"
ROOT_TRUST_ANCHOR = Path("/usr/share/dns/root.key")  # Debian's dns-root-data (tests/run installs it)


def start_validating_unbound(binary, workdir: Path, meridian_port, peers, shipped: str):
    """unbound validating DNSSEC from the root's real trust anchor, with `shipped` (the
    deploy/unbound/meridian.conf a user copies, pointed at this meridian) as its fleet zones.
    Everything else is forwarded to meridian too, which refuses names outside its zones: so
    nothing leaves the machine and the root's keys cannot be fetched, and only what the
    shipped file marks insecure can be answered."""
    if not ROOT_TRUST_ANCHOR.is_file():
        pytest.fail(f"no root trust anchor at {ROOT_TRUST_ANCHOR}: install Debian's dns-root-data")
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    anchor = workdir / "root.key"
    anchor.write_text(ROOT_TRUST_ANCHOR.read_text())
    assert "10.0.0.53@1053" in shipped, "the shipped unbound config's forward-addr changed; update this test"
    shipped = shipped.replace("10.0.0.53@1053", f"127.0.0.1@{meridian_port}")
    config = "\n".join(unbound_server(workdir, port) + [
        '    module-config: "validator iterator"',
        f'    trust-anchor-file: "{anchor}"',
        "forward-zone:",
        '    name: "."',
        f"    forward-addr: 127.0.0.1@{meridian_port}",
    ]) + "\n" + shipped
    return run_unbound(binary, workdir, port, config, "unbound(validating)", peers)


def test_the_shipped_unbound_config_answers_both_zones_when_unbound_validates(
        meridian, unbound_bin, peers, tmp_path):
    """deploy/unbound/meridian.conf on a validating unbound: .global and clusterset.local are
    answered (insecure), as meridian answers an unknown client. Without its clusterset.local
    line the same unbound fails that zone: the line is what makes it work."""
    assert_fleet_loaded(meridian)
    shipped = SHIPPED_UNBOUND_CONF.read_text()
    unbound = start_validating_unbound(unbound_bin, tmp_path / "validating", meridian.dns_port, peers, shipped)
    unbound.wait_answering(PAYMENTS)
    direct = meridian.addresses(PAYMENTS_CLUSTERSET, source="127.0.0.1")
    assert direct, f"meridian gives no address for {PAYMENTS_CLUSTERSET}"
    for name, want in ((PAYMENTS, ALL_READY), (PAYMENTS_CLUSTERSET, direct)):
        r = ask(unbound.port, name, timeout=10)
        assert r.rcode() == dns.rcode.NOERROR, f"{name} via a validating unbound: {r}"
        assert addresses_of(r) == want, f"{name} via a validating unbound: {r}"
        assert not (r.flags & dns.flags.AD), f"{name}: unsigned answers are not authenticated: {r}"
    # Validation is on: a name outside the insecure zones (whose keys cannot be fetched here)
    # is SERVFAIL, not answered.
    assert ask(unbound.port, "example.com", timeout=10).rcode() == dns.rcode.SERVFAIL

    without = "\n".join(l for l in shipped.splitlines() if 'domain-insecure: "clusterset.local"' not in l)
    assert without != shipped, "the shipped config has no clusterset.local line"
    bare = start_validating_unbound(unbound_bin, tmp_path / "without", meridian.dns_port, peers, without)
    bare.wait_answering(PAYMENTS)
    r = ask(bare.port, PAYMENTS_CLUSTERSET, timeout=10)
    assert r.rcode() == dns.rcode.SERVFAIL, f"{PAYMENTS_CLUSTERSET} validated without the insecure line: {r}"


# ---------------------------------------------------------------------------------------
# Propagation of a change through the forwarders


def with_extra_endpoint(text, address):
    """eu-1's payments manifest with one more ready endpoint."""
    anchor = "  - addresses: [127.1.1.2]\n"
    assert anchor in text, "the quickstart's eu-1 payments manifest changed; update this test"
    extra = f"  - addresses: [{address}]\n    conditions: {{ready: true}}\n    zone: eu-1a\n"
    return text.replace(anchor, extra + anchor, 1)


def measure_change(targets, expected, timeout, interval=0.01):
    """Polls every target (name -> function returning sorted addresses) with a fresh query
    every `interval` seconds until each returns `expected`; returns name -> delay in seconds
    from now. A target that never does maps to None."""
    start = time.monotonic()
    delays = {name: None for name in targets}
    last = {}
    while time.monotonic() - start < timeout and any(v is None for v in delays.values()):
        for name, probe in targets.items():
            if delays[name] is not None:
                continue
            try:
                last[name] = probe()
            except (dns.exception.Timeout, OSError) as e:
                last[name] = repr(e)
                continue
            if last[name] == expected[name]:
                delays[name] = time.monotonic() - start
        time.sleep(interval)
    return delays, last


def test_change_reaches_clients_through_forwarders(fleet, start_meridian, unbound_bin, coredns_bin, peers, tmp_path):
    """Adds (then removes) an endpoint in eu-1's manifests on disk and measures how long the
    new answer takes to show: directly from meridian, through unbound (which caches for the
    TTL) and through CoreDNS (no cache plugin). meridian runs with TTL 1."""
    ttl = 1
    meridian = start_meridian(fleet, "--dns-ttl", str(ttl))
    assert_fleet_loaded(meridian)
    unbound = start_unbound(unbound_bin, tmp_path / "unbound", meridian.dns_port, FROM_EU1, peers)
    coredns = start_coredns(coredns_bin, tmp_path / "coredns", meridian.dns_port, peers)

    r = meridian.query(PAYMENTS, source=FROM_EU1)
    assert [rrset.ttl for rrset in r.answer] == [ttl], f"--dns-ttl {ttl} not applied: {r}"

    manifest = "clusters/eu-1/payments.yaml"
    original = (fleet.root / manifest).read_text()
    changed = with_extra_endpoint(original, "127.1.1.9")
    eu1_changed = sorted(EU1 + ["127.1.1.9"])
    all_changed = sorted(ALL_READY + ["127.1.1.9"])

    targets = {
        "direct": lambda: meridian.addresses(PAYMENTS, source=FROM_EU1),
        "unbound": lambda: addresses_of(ask(unbound.port, PAYMENTS, timeout=1)),
        "coredns": lambda: addresses_of(ask(coredns.port, PAYMENTS, timeout=1)),
    }
    before = {"direct": EU1, "unbound": EU1, "coredns": ALL_READY}
    after = {"direct": eu1_changed, "unbound": eu1_changed, "coredns": all_changed}
    bounds = {"direct": 3.0, "unbound": ttl + 3.0, "coredns": 3.0}

    results = []
    for trial, (text, expected, label) in enumerate(
        [(changed, after, "add 127.1.1.9"), (original, before, "remove 127.1.1.9"),
         (changed, after, "add 127.1.1.9"), (original, before, "remove 127.1.1.9")]
    ):
        # Prime the caches with the current answer, so unbound holds it when the file changes.
        prior = before if expected is after else after
        for name, probe in targets.items():
            assert probe() == prior[name], f"{name} before trial {trial}: expected {prior[name]}, got {probe()}"
        fleet.write(manifest, text)
        delays, last = measure_change(targets, expected, timeout=max(bounds.values()) + 5)
        results.append((label, delays))
        shown = ", ".join(
            f"{name} {delays[name] * 1000:.0f} ms" if delays[name] is not None else f"{name} never"
            for name in targets
        )
        print(f"\nMEASURED: trial {trial + 1} ({label} in eu-1's payments manifest, meridian TTL {ttl} s): {shown}")
        for name in targets:
            assert delays[name] is not None, (
                f"{PAYMENTS} A via {name} never showed the change ({label}) within "
                f"{max(bounds.values()) + 5:.0f}s: expected {expected[name]}, last {last[name]!r}\n"
                f"--- meridian log ---\n{meridian.log_tail()}"
            )

    for name in targets:
        worst = max(d[name] for _, d in results)
        print(f"MEASURED: {name}: worst {worst * 1000:.0f} ms over {len(results)} changes "
              f"(bound {bounds[name]:.0f} s)")
        assert worst < bounds[name], (
            f"a change took {worst:.2f}s to show via {name}; bound {bounds[name]}s "
            f"(meridian TTL {ttl}s): {results}"
        )
