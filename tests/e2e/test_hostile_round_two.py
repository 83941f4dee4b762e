"""Hostile input, round two (issue 43), against the release binary: the surfaces added since
the first round must not stall the server. Each attack is checked while it runs and after:
UDP and TCP DNS answer another name, /healthz answers within 1 s.

- an answer over 64 KiB over TCP is valid DNS (whole records, counted; dnspython is strict
  about trailing bytes);
- a zone transfer of 40,000 records is linear: it completes while the rest keeps answering,
  and twenty transfers that are never read stall nothing;
- the status page's stream is bounded (a 503 past its bound), and idle pages cost no CPU;
- `render` never writes through a symlink planted in `--out`.
"""

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.request

import dns.message
import dns.query
import dns.rdatatype
import pytest

from conftest import BIN, FROM_EU1, ROOT, Fleet, Meridian, wait_xds_listening
from test_hostile_listeners import metric

OTHER = "payments.shop.global"


def slice_yaml(name, addresses, hostnames=False):
    """An EndpointSlice of service `big` in namespace shop (an exported Service with it)."""
    endpoints = "\n".join(
        f"  - addresses: [{a}]" + (f"\n    hostname: h{i}" if hostnames else "")
        for i, a in enumerate(addresses)
    )
    return f"""apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}, namespace: shop, labels: {{kubernetes.io/service-name: big}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
{endpoints}
"""


def big_service(fleet: Fleet, count, hostnames=False):
    docs = ["""apiVersion: v1
kind: Service
metadata: {name: big, namespace: shop}
spec:
  ports: [{name: http, port: 80}]
""", """apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: big, namespace: shop}
"""]
    addresses = [f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}" for i in range(1, count + 1)]
    for n in range(0, count, 1000):
        docs.append(slice_yaml(f"big-{n // 1000}", addresses[n:n + 1000], hostnames))
    fleet.write("clusters/eu-1/big.yaml", "---\n".join(docs))
    return addresses


def healthz_within(m, seconds=1.0):
    started = time.time()
    with urllib.request.urlopen(m.url("/healthz"), timeout=seconds) as r:
        assert r.status == 200
    return time.time() - started


def still_serving(m):
    assert healthz_within(m) < 1.0
    assert m.addresses(OTHER, source=FROM_EU1), "UDP DNS answers"
    r = m.query(OTHER, source=FROM_EU1, tcp=True)
    assert r.answer, "TCP DNS answers"


def test_an_answer_over_64_kib_over_tcp_is_valid_dns(fleet):
    big_service(fleet, 5000)
    m = Meridian(fleet)
    try:
        m.wait_for(lambda: m.query("big.shop.global", tcp=True).answer, timeout=15, what="big to resolve")
        # dnspython raises TrailingJunk on any byte after the records the header counts.
        r = m.query("big.shop.global", tcp=True)
        kept = sum(len(rrset) for rrset in r.answer)
        assert 1000 < kept < 5000, kept
        assert r.flags & dns.flags.TC, "what did not fit is said"
        kdig = shutil.which("kdig")
        assert kdig, "kdig is installed by tests/run (knot-dnsutils)"
        out = subprocess.run([kdig, "+tcp", "-p", str(m.dns_port), "@127.0.0.1", "big.shop.global", "A"],
                             capture_output=True, text=True, timeout=20)
        assert "trailing" not in (out.stdout + out.stderr).lower(), out.stdout[-2000:] + out.stderr
        assert ";; ANSWER SECTION:" in out.stdout, out.stdout[-2000:]
        still_serving(m)
    finally:
        m.stop()


def test_a_zone_transfer_of_40_000_records_is_linear_and_stalls_nothing(fleet):
    big_service(fleet, 20_000, hostnames=True)
    m = Meridian(fleet)
    try:
        m.wait_for(lambda: m.addresses("h1.eu-1.big.shop.global"), timeout=30, what="the endpoints to load")
        done = {}

        def transfer():
            started = time.time()
            records = 0
            for message in dns.query.xfr("127.0.0.1", "global.", port=m.dns_port, timeout=60, lifetime=60):
                records += sum(len(rrset) for rrset in message.answer)
            done["records"], done["seconds"] = records, time.time() - started

        t = threading.Thread(target=transfer)
        t.start()
        while t.is_alive():
            still_serving(m)
            time.sleep(0.1)
        t.join()
        assert done.get("records", 0) >= 40_000, done
        # Quadratic, it took 32 s on this machine; linear, a second or two.
        assert done["seconds"] < 15, done

        # Twenty transfers whose answers are never read.
        query = dns.message.make_query("global.", "AXFR").to_wire()
        sockets = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", m.dns_port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(struct.pack("!H", len(query)) + query)
            sockets.append(s)
        try:
            for _ in range(20):
                still_serving(m)
                time.sleep(0.1)
            # (At most four are built and written at once, the others wait for a place, the
            # unit tests hold; here each fits the kernel's send buffer and frees its place.)
            assert metric(m, "meridian_dns_transfers_refused_total") == 0
            # SIGTERM ends it within the grace, whatever is in flight.
            stopped = time.time()
            m.proc.terminate()
            m.proc.wait(timeout=15)
            assert time.time() - stopped < 15
        finally:
            for s in sockets:
                s.close()
    finally:
        m.stop()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_status_page_stream_is_bounded_and_idle_pages_cost_nothing(fleet):
    m = Meridian(fleet)
    streams = []
    try:
        for _ in range(64):
            s = socket.create_connection(("127.0.0.1", m.admin_port))
            s.sendall(b"GET /ui/events HTTP/1.1\r\nHost: x\r\n\r\n")
            streams.append(s)
        for s in streams:
            s.settimeout(10)
            head = s.recv(4096)
            assert head.startswith(b"HTTP/1.1 200"), head[:200]
        status, body = m.http("/ui/events")
        assert status == 503 and "status-page streams are open" in body, (status, body)
        # 64 open pages, no change in the fleet: the server sleeps.
        before = cpu_seconds(m.proc.pid)
        time.sleep(6)
        used = cpu_seconds(m.proc.pid) - before
        assert used < 1.0, f"{used:.2f} s of CPU in 6 s for 64 idle pages"
        still_serving(m)
        # A change reaches every page as one event each.
        fleet.write("clusters/eu-1/extra.yaml", slice_yaml("extra", ["10.99.0.1"]).replace("big", "extra") +
                    "---\napiVersion: v1\nkind: Service\nmetadata: {name: extra, namespace: shop}\n"
                    "spec: {ports: [{name: http, port: 80}]}\n---\n"
                    "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\n"
                    "metadata: {name: extra, namespace: shop}\n")
        for s in streams[:5]:
            s.settimeout(10)
            seen = b""
            while b"extra.shop" not in seen and b"shop/extra" not in seen:
                chunk = s.recv(1 << 20)
                assert chunk, "the stream ended before the change"
                seen += chunk
        # Closed pages give their places back.
        for s in streams:
            s.close()
        streams.clear()
        m.wait_for(lambda: m.http("/ui/state")[0] == 200, what="the admin listener")

        def a_stream_opens():
            s = socket.create_connection(("127.0.0.1", m.admin_port))
            try:
                s.settimeout(5)
                s.sendall(b"GET /ui/events HTTP/1.1\r\nHost: x\r\n\r\n")
                return s.recv(4096).startswith(b"HTTP/1.1 200")
            finally:
                s.close()

        m.wait_for(a_stream_opens, timeout=10, interval=0.5, what="a stream to open again")
    finally:
        for s in streams:
            s.close()
        m.stop()


def test_render_never_writes_through_a_symlink_in_its_output(tmp_path):
    root = tmp_path / "federation"
    shutil.copytree(ROOT / "examples" / "federation", root)
    fleet = Fleet(root)
    out = tmp_path / "out"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (out / "eu-1" / "shop").mkdir(parents=True)
    # A link planted at the temporary name meridian writes first.
    (out / "eu-1" / "shop" / ".Deployment.web.yaml.meridian-tmp").symlink_to(victim)
    # An output subdirectory that is a link out of --out.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "eu-2").symlink_to(elsewhere)
    p = subprocess.run([str(BIN), "render", "--config", str(fleet.config), "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert victim.read_text() == "keep me\n", "written through the planted link"
    assert not any(elsewhere.iterdir()), "written outside --out"
    assert p.returncode != 0, p.stdout + p.stderr
    assert "is in the way: a symlink" in p.stderr and "eu-2" in p.stderr, p.stderr


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


def test_a_geo_file_of_a_million_bad_lines_is_a_bounded_report(fleet):
    """Issue 43 #6: 1,000,000 bad lines took RSS to 3.1 GB and /debug/problems to 100 MB;
    one 50 MB line was copied whole into the log, the problems and the UI."""
    fleet.write("meridian.yaml", fleet.config.read_text() +
                "geo:\n  file: geo.csv\n  reloadSeconds: 1\n  maxFileBytes: 134217728\n")
    fleet.write("geo.csv", "198.51.100.0/24,us\n")
    m = Meridian(fleet)
    try:
        baseline = rss_mib(m.proc.pid)
        fleet.write("geo.csv", "198.51.100.0/24,us\n" + "not-a-cidr,eu\n" * 1_000_000
                    + "bad-" + "x" * (50 << 20) + ",eu\n")

        def reported():
            status, body = m.http("/debug/problems")
            found = [p for p in json.loads(body)["problems"] if p["cluster"] == "geo"]
            return (found, len(body)) if len(found) > 100 else None

        found, size = m.wait_for(reported, timeout=60, interval=0.5, what="the geo problems")
        assert len(found) == 101, len(found)
        assert found[-1]["reason"].startswith("999901 more problems of this input"), found[-1]
        assert size < 1 << 20, f"/debug/problems is {size} bytes"
        assert max(len(p["reason"]) for p in found) < 1024
        status, state = m.http("/ui/state")
        assert status == 200 and len(state) < 2 << 20, len(state)
        assert rss_mib(m.proc.pid) - baseline < 600, f"RSS grew from {baseline} to {rss_mib(m.proc.pid)} MiB"
        log = m.log.read_text()
        assert log.count("geo range rejected") <= 101 + 1, log.count("geo range rejected")
        assert max(len(line) for line in log.splitlines()) < 8192, "a line of the input copied into the log"
        still_serving(m)
        # The good range still serves: 198.51.100.0/24 is in us.
        r = m.query(OTHER, source=FROM_EU1)
        assert r.answer
    finally:
        m.stop()


def test_a_delta_subscription_of_100_000_names_is_linear_and_more_is_refused(fleet):
    """Issue 43 #3: one request naming 100,000 EDS resources stalled /healthz and TCP DNS for
    13 s (each absent name was searched for in a list of the others)."""
    from ads import EDS, AdsStream, DeltaDiscoveryRequest, node

    m = Meridian(fleet)
    streams = []
    try:
        wait_xds_listening(m)
        names = [f"absent-{i}.shop.global:80" for i in range(100_000)]
        s = AdsStream(m.xds_port, delta=True)
        streams.append(s)
        s.send(DeltaDiscoveryRequest(type_url=EDS, node=node("many", "eu-1", "n1"), resource_names_subscribe=names))
        started = time.time()
        while True:
            still_serving(m)
            try:
                r = s.recv(timeout=0.2)
                break
            except TimeoutError:
                assert time.time() - started < 30, "no answer to the subscription"
        assert len(r.removed_resources) == 100_000, len(r.removed_resources)
        # One more name than a stream may hold: the stream ends, saying why.
        s.send(DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=["one-more.shop.global:80"],
                                     response_nonce=r.nonce))
        ended = s.end(timeout=10)
        assert ended.code is not None and ended.code.name == "RESOURCE_EXHAUSTED", ended
        assert "at most 100000 names" in (ended.details or ""), ended.details
        still_serving(m)
    finally:
        for s in streams:
            s.close()
        m.stop()


def test_scripts_that_burn_their_budget_never_hold_dns_updates(fleet):
    """Issue 43 #1: a script burning its 250 ms on each of 100 templates held every DNS and
    xDS update for 27 s, because placement ran it on the writer. Scripts now run on their
    own worker: a member's change reaches DNS meanwhile."""
    deployments = "\n---\n".join(f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: burn-{i}, namespace: shop}}
spec: {{replicas: 1}}""" for i in range(100))
    fleet.write("hub/burn.yaml", deployments + """
---
apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: burn, namespace: shop}
spec:
  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment}]
  placement:
    script:
      lua: |
        function score(cluster, workload)
          while true do local s = string.rep("x", 1048576) end
        end
""")
    m = Meridian(fleet)
    try:
        time.sleep(1)  # the worker is busy with the first of 100 quarter-second decisions
        text = (fleet.cluster_dir("eu-1") / "payments.yaml").read_text()
        fleet.write("clusters/eu-1/payments.yaml", text.replace("127.1.1.2]", "127.1.1.9]"))
        changed = time.time()
        m.wait_for(lambda: "127.1.1.9" in m.addresses(OTHER, source=FROM_EU1), timeout=5, interval=0.05,
                   what="the member's change in DNS while scripts burn")
        assert time.time() - changed < 5
        still_serving(m)

        def all_failed():
            placements = json.loads(m.http("/debug/placements")[1])["decisions"]
            burn = [d for d in placements if d["template"]["name"].startswith("burn-")]
            return len(burn) == 100 and all("time limit" in d["outcome"].get("reason", "") for d in burn)

        # 100 decisions of a quarter second on one worker; a decision asked again on newer
        # inputs (the members syncing, the edit above) replaces the one still queued.
        m.wait_for(all_failed, timeout=180, interval=1, what="every burning template unschedulable, with the reason")
        runs = m.log.read_text().count("placement script failed")
        assert runs < 300, f"{runs} script runs for 100 templates: superseded decisions ran"
    finally:
        m.stop()


def test_simulate_far_in_the_future_is_a_clear_error(fleet):
    """Issue 43: `/debug/simulate?after=` of 2^63 or more panicked (caught) computing the
    instant; it is an error naming the bound now."""
    m = Meridian(fleet)
    try:
        for after in (2 ** 63, 2 ** 64 - 1, 10 ** 12):
            status, body = m.http(f"/debug/simulate?assume=eu-1=Unreachable&after={after}")
            assert status == 400, (after, status, body)
            assert "at most 315360000 seconds" in json.loads(body)["error"], body
        status, body = m.http("/debug/simulate?assume=eu-1=Unreachable&after=60")
        assert status == 200, body
        assert "panicked" not in m.log.read_text()
        still_serving(m)
    finally:
        m.stop()


def test_the_config_file_is_read_like_any_untrusted_file(tmp_path):
    """Issue 43: a FIFO as the config hung start-up silently; /dev/zero reached 2 GB."""
    fifo = tmp_path / "meridian.yaml"
    os.mkfifo(fifo)
    for config, said in ((fifo, "a FIFO, not a regular file"), ("/dev/zero", "a character device")):
        for command in ("validate", "serve"):
            started = time.time()
            p = subprocess.run([str(BIN), command, "--config", str(config), "--dns-listen", "127.0.0.1:0",
                                "--admin-listen", "127.0.0.1:0", "--xds-listen", "127.0.0.1:0"],
                               capture_output=True, text=True, timeout=30)
            assert p.returncode != 0 and said in p.stderr, (command, config, p.stderr)
            assert time.time() - started < 10
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (5 << 20) + "\n")
    p = subprocess.run([str(BIN), "validate", "--config", str(big)], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "is larger than 4194304 bytes" in p.stderr, p.stderr


def test_a_member_pointed_at_a_huge_tree_never_slows_the_other_members(fleet, tmp_path):
    """Issue 43: a MemberCluster with path `/` took every inotify watch the user may hold, so
    every member fell back to polling (changes took a heartbeat), and kept doing so after it
    was removed. A tree past the watch bound (1,024 directories) is polled, one past the
    listing bound (100,000 entries) refused with the reason; the others keep their watches.
    (`/` itself fails on an unreadable /proc entry on some machines: a tree of our own.)"""
    huge = tmp_path / "huge"
    for d in range(1100):
        sub = huge / f"d{d}"
        sub.mkdir(parents=True)
        for f in range(91):
            (sub / f"f{f}.txt").touch()
    members = (fleet.hub / "members.yaml").read_text()
    fleet.write("hub/members.yaml", members + f"""---
apiVersion: meridian.io/v1alpha1
kind: MemberCluster
metadata: {{name: huge}}
spec:
  source: {{directory: {{path: {huge}}}}}
  network: {{name: n1, dnsClientCIDRs: [127.0.9.0/24]}}
""")
    m = Meridian(fleet)
    try:
        def edit_reaches_dns(address):
            text = (fleet.cluster_dir("eu-1") / "payments.yaml").read_text()
            fleet.write("clusters/eu-1/payments.yaml", re.sub(r"127\.1\.1\.\d+\]", address + "]", text, count=1))
            changed = time.time()
            m.wait_for(lambda: address in m.addresses(OTHER, source=FROM_EU1), timeout=15, interval=0.05,
                       what=f"{address} in DNS")
            return time.time() - changed

        def reported():
            problems = json.loads(m.http("/debug/problems")[1])
            return "holds more than 100000 entries" in json.dumps(problems)

        m.wait_for(reported, timeout=30, what="the huge member's directory refused with the reason")
        assert "not watched, polled" in m.log.read_text()
        # The default heartbeat is 10 s: a change seen by polling takes seconds, a watch far less.
        assert edit_reaches_dns("127.1.1.7") < 2.0
        still_serving(m)
        fleet.write("hub/members.yaml", members)
        m.wait_for(lambda: "huge" not in m.http("/debug/clusters")[1], timeout=15, what="the huge member gone")
        assert edit_reaches_dns("127.1.1.8") < 2.0
    finally:
        m.stop()


def test_a_geo_file_written_slowly_is_never_read_half_way(fleet):
    """Issue 43: a slow writer pausing where the lines still parse had its prefix served (a
    shorter table: clients of the ranges still to come lost their place). A file its writer
    has open is read once it is closed."""
    fleet.write("meridian.yaml", fleet.config.read_text() + "geo:\n  file: geo.csv\n  reloadSeconds: 1\n")
    ranges = "".join(f"10.{i // 256}.{i % 256}.0/24,eu\n" for i in range(2000))
    last = "127.0.200.0/24,us\n"
    fleet.write("geo.csv", ranges + last)
    m = Meridian(fleet)
    try:
        geo_client, unknown_client = "127.0.200.1", "127.0.201.1"
        time.sleep(2)
        expected = m.addresses(OTHER, source=geo_client)
        assert expected and expected != m.addresses(OTHER, source=unknown_client), "the geo range decides"
        wrong = []
        with open(fleet.root / "geo.csv", "w") as f:
            f.write(ranges)
            f.flush()
            deadline = time.time() + 3.5  # past the settle time and three reloads
            while time.time() < deadline:
                got = m.addresses(OTHER, source=geo_client)
                if got != expected:
                    wrong.append(got)
                time.sleep(0.05)
            f.write(last)
        time.sleep(2)
        assert m.addresses(OTHER, source=geo_client) == expected
        assert not wrong, f"{len(wrong)} answers from a half-written geo file: {wrong[:3]}"
        still_serving(m)
    finally:
        m.stop()
