"""Bad input, on the wire and on disk: each gets a clear error or the right rcode, and every
other name keeps answering afterwards (DESIGN §4, §6, §7)."""

import json
import socket
import struct
import subprocess
import threading
import time

import dns.flags
import dns.message
import dns.rcode
import pytest

from conftest import BIN, FROM_EU1, FROM_EU2, FROM_UNKNOWN, FROM_US1, QUICKSTART
from test_dns_wire import (
    ALL_PAYMENTS,
    EU1,
    EU2,
    US1,
    GATEWAY_US1,
    addrs,
    ask,
    check_notimp,
    exported_service_yaml,
    metric,
    metrics,
    query_wire,
    records,
    slice_yaml,
    tcp_connect,
    tcp_raw,
    udp_raw,
)

FORMERR = dns.rcode.FORMERR
NXDOMAIN = dns.rcode.NXDOMAIN
NOTIMP = dns.rcode.NOTIMP

IDLE = 2  # seconds: the TCP idle timeout the wire tests run with


@pytest.fixture
def m(fleet, start_meridian):
    return start_meridian(fleet, "--dns-tcp-idle-timeout-seconds", str(IDLE))


def still_serving(m):
    """Every other name keeps answering, over UDP and TCP."""
    assert addrs(ask(m, "payments.shop.global", source=FROM_EU1)) == EU1
    assert addrs(ask(m, "payments.shop.global", source=FROM_US1, tcp=True)) == US1
    assert addrs(ask(m, "db-0.us-1.db.shop.global")) == ["127.1.3.11"]
    assert addrs(ask(m, "cart.shop.global", "AAAA"), dns.rdatatype.AAAA) == ["fd00:1:2::21"]
    assert ask(m, "nope.shop.global").rcode() == NXDOMAIN
    assert m.proc.poll() is None, "meridian exited"


def header(qid=0x1234, flags=0x0100, qd=1, an=0, ns=0, ar=0):
    return struct.pack("!HHHHHH", qid, flags, qd, an, ns, ar)


QUESTION = b"\x08payments\x04shop\x06global\x00\x00\x01\x00\x01"


def assert_formerr(reply, qid=0x1234):
    assert reply is not None, "no reply: a request whose header parses gets FORMERR"
    assert len(reply) >= 12
    rid, flags = struct.unpack("!HH", reply[:4])
    assert rid == qid, "the ID is echoed"
    assert flags & 0x8000, "QR set"
    assert flags & 0xF == FORMERR, f"rcode {flags & 0xF}, expected FORMERR"
    an = struct.unpack("!H", reply[6:8])[0]
    assert an == 0


# ---------------------------------------------------------------------------------------
# Malformed DNS packets over UDP.


def test_packets_shorter_than_a_header_get_no_reply(m):
    before = metrics(m)
    dropped_before = sum(v for (n, _), v in before.items() if n == "meridian_dns_dropped_total")
    for data in (b"", b"\x12", b"\x12\x34\x01\x00\x00\x01", header()[:11]):
        assert udp_raw(m, data, timeout=0.5) is None, f"a reply to {data!r}"
    after = metrics(m)
    dropped = sum(v for (n, _), v in after.items() if n == "meridian_dns_dropped_total")
    assert dropped - dropped_before == 4, "every dropped packet is counted"
    still_serving(m)


def test_responses_are_never_answered(m):
    # QR set: answering would let two servers bounce packets at each other.
    for flags in (0x8000, 0x8400, 0x8180):
        assert udp_raw(m, header(flags=flags) + QUESTION, timeout=0.5) is None
    still_serving(m)


def test_header_without_its_question_is_formerr(m):
    assert_formerr(udp_raw(m, header(qd=1)))
    # A question cut short: in the name, after the name, in the class.
    for cut in (b"\x08paym", b"\x08payments\x04shop\x06global\x00", b"\x08payments\x04shop\x06global\x00\x00\x01\x00"):
        assert_formerr(udp_raw(m, header() + cut))
    # No question at all.
    assert_formerr(udp_raw(m, header(qd=0)))
    still_serving(m)


def test_counts_larger_than_the_data_are_formerr(m):
    for counts in (dict(qd=3), dict(an=5), dict(ns=2), dict(ar=1), dict(ar=4), dict(qd=1, an=1, ns=1, ar=1)):
        assert_formerr(udp_raw(m, header(**counts) + QUESTION))
    still_serving(m)


def test_two_questions_are_formerr(m):
    q2 = b"\x02db\x04shop\x06global\x00\x00\x01\x00\x01"
    assert_formerr(udp_raw(m, header(qd=2) + QUESTION + q2))
    still_serving(m)


def test_compression_loops_are_formerr_and_do_not_hang(m):
    for name in (
        b"\xc0\x0c",  # points at itself
        b"\x01a\xc0\x0c",  # a label, then back to the start
        b"\x01a\xc0\x0e",  # points at its own pointer
        b"\xc0\xff",  # points past the end
        b"\xc0",  # half a pointer
    ):
        start = time.time()
        assert_formerr(udp_raw(m, header() + name + b"\x00\x01\x00\x01"))
        assert time.time() - start < 1.0
    still_serving(m)


def test_oversized_labels_and_names_are_formerr(m):
    # A 64-byte label: 0x40 is not a length at all (the 01 label type).
    assert_formerr(udp_raw(m, header() + b"\x40" + b"a" * 64 + b"\x06global\x00\x00\x01\x00\x01"))
    # The reserved 10 label type.
    assert_formerr(udp_raw(m, header() + b"\x80abc\x00\x00\x01\x00\x01"))
    # A name of 5 × 63-byte labels: over 255 bytes.
    long_name = b"".join(b"\x3f" + b"a" * 63 for _ in range(5)) + b"\x00"
    assert_formerr(udp_raw(m, header() + long_name + b"\x00\x01\x00\x01"))
    # 63 is fine, and outside the zones it is REFUSED, inside NXDOMAIN.
    r = dns.message.from_wire(udp_raw(m, header() + b"\x3f" + b"a" * 63 + b"\x04shop\x06global\x00\x00\x01\x00\x01"))
    assert r.rcode() == NXDOMAIN
    still_serving(m)


def test_labels_that_are_not_text_are_nxdomain_in_our_zone(m):
    r = dns.message.from_wire(udp_raw(m, header() + b"\x02\xff\xfe\x04shop\x06global\x00\x00\x01\x00\x01"))
    assert r.rcode() == NXDOMAIN
    assert r.flags & dns.flags.AA
    r = dns.message.from_wire(udp_raw(m, header() + b"\x02\xff\xfe\x08payments\x04shop\x06global\x00\x00\x01\x00\x01"))
    assert r.rcode() == NXDOMAIN
    still_serving(m)


def test_every_opcode_gets_an_answer(m):
    for opcode in range(16):
        qid = 0x7000 + opcode
        flags = opcode << 11
        wire = header(qid=qid, flags=flags) + QUESTION
        reply = udp_raw(m, wire)
        if opcode == 0:
            r = dns.message.from_wire(reply)
            assert r.id == qid and r.rcode() == dns.rcode.NOERROR
            assert addrs(r) == ALL_PAYMENTS
        else:
            check_notimp(reply, opcode, qid)
        (tcp_reply,) = tcp_raw(m, [wire])
        if opcode:
            check_notimp(tcp_reply, opcode, qid)
    still_serving(m)


# ---------------------------------------------------------------------------------------
# Bad TCP framing and slow clients.


def wait_closed(s, within):
    """Returns (bytes received, seconds until the server closed), or fails if it did not."""
    s.settimeout(within)
    start = time.time()
    data = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        pytest.fail(f"the server kept the connection open for {within}s (received {data!r})")
    return data, time.time() - start


def test_tcp_zero_length_message(m):
    s = tcp_connect(m)
    try:
        s.sendall(b"\x00\x00")
        data, _ = wait_closed(s, IDLE + 2)
        assert data == b"", f"a reply to an empty message: {data!r}"
    finally:
        s.close()
    still_serving(m)


def test_tcp_length_prefix_longer_than_the_data(m):
    s = tcp_connect(m)
    try:
        wire = query_wire("payments.shop.global")
        s.sendall(struct.pack("!H", len(wire) + 40) + wire)
        s.shutdown(socket.SHUT_WR)
        data, elapsed = wait_closed(s, IDLE + 2)
        assert data == b"", f"a reply to a message that never arrived whole: {data!r}"
    finally:
        s.close()
    # Same, but the client just stops sending: the idle timeout ends it.
    s = tcp_connect(m)
    try:
        s.sendall(struct.pack("!H", 300) + b"\x12\x34" + b"\x00" * 20)
        data, elapsed = wait_closed(s, IDLE + 2)
        assert data == b""
    finally:
        s.close()
    still_serving(m)


def test_tcp_malformed_message_gets_formerr(m):
    (reply,) = tcp_raw(m, [header(qd=1)])
    assert_formerr(reply)
    (reply,) = tcp_raw(m, [header() + b"\xc0\x0c\x00\x01\x00\x01"])
    assert_formerr(reply)
    still_serving(m)


def test_stalled_tcp_clients_do_not_delay_others(m):
    stalled = []
    try:
        for i in range(40):
            s = tcp_connect(m, FROM_UNKNOWN)
            # One byte of the length prefix, or a prefix and half a message.
            s.sendall(b"\x00" if i % 2 else struct.pack("!H", 60) + b"\x12\x34\x01\x00")
            stalled.append(s)
        slowest = 0.0
        for i in range(20):
            start = time.time()
            assert addrs(ask(m, "payments.shop.global", source=FROM_EU1)) == EU1
            slowest = max(slowest, time.time() - start)
            if i % 4 == 0:
                start = time.time()
                assert addrs(ask(m, "payments.shop.global", source=FROM_EU2, tcp=True)) == EU2
                slowest = max(slowest, time.time() - start)
        assert slowest < 0.5, f"an answer took {slowest:.2f}s while clients stalled"
        # The stalled connections are closed by the idle timeout.
        for s in stalled[:4]:
            wait_closed(s, IDLE + 3)
    finally:
        for s in stalled:
            s.close()
    still_serving(m)


def test_many_concurrent_tcp_clients(m):
    errors = []

    def client(i):
        try:
            source = (FROM_EU1, FROM_EU2, FROM_US1)[i % 3]
            expected = (EU1, EU2, US1)[i % 3]
            for _ in range(5):
                assert addrs(ask(m, "payments.shop.global", source=source, tcp=True)) == expected
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[:3]
    still_serving(m)


# ---------------------------------------------------------------------------------------
# Bad manifests.


def problems(m):
    status, body = m.http("/debug/problems")
    assert status == 200
    return json.loads(body)["problems"]


def clusters(m):
    status, body = m.http("/debug/clusters")
    assert status == 200
    return {c["name"]: c for c in json.loads(body)["clusters"]}


def log_lines_with(m, *needles):
    return [line for line in m.log.read_text().splitlines() if all(n in line for n in needles)]


EARLY = exported_service_yaml("early") + slice_yaml("early", ["127.1.1.71"])
BROKEN_DOC = "apiVersion: v1\nkind: Service\nmetadata: {name: x\n  bad: [\n"


def test_malformed_yaml_in_a_member_directory(fleet, start_meridian):
    m = start_meridian(fleet)
    # A valid service, then a document the YAML parser chokes on.
    fleet.write("clusters/eu-1/broken.yaml", EARLY + "---\n" + BROKEN_DOC)
    path = str(fleet.cluster_dir("eu-1") / "broken.yaml")
    found = m.wait_for(
        lambda: [p for p in problems(m) if path in p["object"]],
        what="the malformed file on /debug/problems",
    )
    assert len(found) == 1, found
    assert found[0]["cluster"] == "eu-1"
    assert "document 4" in found[0]["object"]
    assert found[0]["reason"].startswith("malformed YAML: "), found
    assert "line" in found[0]["reason"]
    logged = log_lines_with(m, "broken.yaml", "malformed YAML")
    assert logged, "the problem is logged with file and reason"
    # What came before the bad document, the rest of eu-1 and every other cluster still serve.
    assert addrs(ask(m, "early.shop.global")) == ["127.1.1.71"]
    still_serving(m)
    assert addrs(ask(m, "db-0.eu-1.db.shop.global")) == ["127.1.1.11"]
    assert clusters(m)["eu-1"]["health"] == "Healthy"
    # Fixing the file clears the problem.
    fleet.write("clusters/eu-1/broken.yaml", EARLY)
    m.wait_for(lambda: not problems(m), what="the problem to clear")
    assert addrs(ask(m, "early.shop.global")) == ["127.1.1.71"]


def test_malformed_yaml_at_startup(fleet, start_meridian):
    fleet.write("clusters/eu-2/broken.yaml", BROKEN_DOC)
    fleet.write("clusters/us-1/junk.yaml", ": : :\n\t- [}\n")
    m = start_meridian(fleet)
    found = problems(m)
    files = sorted(p["object"].split(":")[0] for p in found)
    assert files == [str(fleet.cluster_dir("eu-2") / "broken.yaml"), str(fleet.cluster_dir("us-1") / "junk.yaml")], found
    assert all(p["reason"].startswith("malformed YAML") for p in found)
    still_serving(m)
    assert addrs(ask(m, "payments.shop.global")) == ALL_PAYMENTS


def test_unknown_field_in_a_kubernetes_kind_is_a_warning(fleet, start_meridian):
    service = exported_service_yaml("early").replace("spec: {ports:", "spec: {bogusField: 1, ports:")
    assert "bogusField" in service
    fleet.write("clusters/eu-1/early.yaml", service + slice_yaml("early", ["127.1.1.71"]))
    m = start_meridian(fleet)
    # Served all the same.
    assert addrs(ask(m, "early.shop.global")) == ["127.1.1.71"]
    assert not problems(m), "a warning is not a rejection"
    status, body = m.http("/debug/problems")
    warnings = json.loads(body)["warnings"]
    assert [w["cluster"] for w in warnings] == ["eu-1"], warnings
    assert "early.yaml: Service shop/early" in warnings[0]["object"]
    assert "spec.bogusField" in warnings[0]["reason"]
    warned = log_lines_with(m, "early.yaml", "bogusField")
    assert warned, f"no warning naming the file and the field:\n{m.log_tail()}"
    assert "Service shop/early" in warned[0]
    still_serving(m)


def test_unknown_field_in_a_member_cluster_is_rejected_at_startup(fleet, start_meridian):
    fleet.write(
        "hub/extra.yaml",
        "apiVersion: meridian.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: eu-3}\n"
        "spec:\n  source: {directory: {path: ../clusters/eu-3}}\n  netwrk: {name: n1}\n",
    )
    fleet.write("clusters/eu-3/payments.yaml", (fleet.cluster_dir("eu-1") / "payments.yaml").read_text().replace("127.1.1.", "127.1.4."))
    m = start_meridian(fleet)
    assert sorted(clusters(m)) == ["eu-1", "eu-2", "us-1"]
    found = [p for p in problems(m) if "extra.yaml" in p["object"]]
    assert len(found) == 1, problems(m)
    assert found[0]["cluster"] == "hub"
    assert "MemberCluster eu-3" in found[0]["object"]
    assert "unknown field" in found[0]["reason"] and "spec.netwrk" in found[0]["reason"]
    assert log_lines_with(m, "extra.yaml", "spec.netwrk")
    # The rest of the hub serves; eu-3's endpoints do not.
    assert addrs(ask(m, "payments.shop.global")) == ALL_PAYMENTS
    assert ask(m, "eu-3.payments.shop.global").rcode() == NXDOMAIN
    still_serving(m)


def test_unknown_field_in_a_member_cluster_added_while_running(fleet, start_meridian):
    m = start_meridian(fleet)
    fleet.write("clusters/eu-3/payments.yaml", (fleet.cluster_dir("eu-1") / "payments.yaml").read_text().replace("127.1.1.", "127.1.4."))
    fleet.write(
        "hub/extra.yaml",
        "apiVersion: meridian.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: eu-3}\n"
        "spec:\n  source: {directory: {path: ../clusters/eu-3}}\n  netwrk: {name: n1}\n",
    )
    m.wait_for(lambda: log_lines_with(m, "extra.yaml", "spec.netwrk"), what="the rejection to be logged")
    found = m.wait_for(
        lambda: [p for p in problems(m) if "extra.yaml" in p["object"]],
        timeout=5,
        what="the rejected MemberCluster on /debug/problems",
    )
    assert "MemberCluster eu-3" in found[0]["object"] and "spec.netwrk" in found[0]["reason"]
    assert sorted(clusters(m)) == ["eu-1", "eu-2", "us-1"]
    assert addrs(ask(m, "payments.shop.global")) == ALL_PAYMENTS
    still_serving(m)


def with_invalid_addresses(fleet):
    path = fleet.cluster_dir("eu-1") / "payments.yaml"
    text = path.read_text().replace(
        "  - addresses: [127.1.1.3]",
        '  - addresses: ["not-an-ip"]\n  - addresses: ["fd00::9"]\n  - addresses: ["127.1.1.300"]\n  - addresses: [127.1.1.3]',
    )
    fleet.write("clusters/eu-1/payments.yaml", text)
    return path


def check_invalid_addresses_left_out(m, path):
    found = m.wait_for(lambda: len(problems(m)) == 3 and problems(m), timeout=5, what="three endpoint problems on /debug/problems")
    for p in found:
        assert p["cluster"] == "eu-1"
        assert p["object"] == f"{path}: EndpointSlice shop/payments-abc12"
        assert "endpoint left out" in p["reason"]
    reasons = " | ".join(p["reason"] for p in found)
    assert '"not-an-ip" is not an IP address' in reasons
    assert "fd00::9 does not match addressType IPv4" in reasons
    assert '"127.1.1.300" is not an IP address' in reasons
    assert len(log_lines_with(m, "payments.yaml", "endpoint left out")) == 3
    # The valid endpoints are served, the bad ones are not.
    assert addrs(ask(m, "payments.shop.global", source=FROM_EU1)) == EU1
    assert addrs(ask(m, "eu-1.payments.shop.global")) == EU1
    assert addrs(ask(m, "payments.shop.global", "AAAA"), dns.rdatatype.AAAA) == []
    r = ask(m, "_http._tcp.payments.shop.global", "SRV", source=FROM_EU1)
    assert len([rd for rd in records(r, dns.rdatatype.SRV) if rd.priority == 0]) == 2
    still_serving(m)


def test_endpoint_with_an_invalid_address_at_startup(fleet, start_meridian):
    path = with_invalid_addresses(fleet)
    m = start_meridian(fleet)
    check_invalid_addresses_left_out(m, path)


def test_endpoint_with_an_invalid_address_while_running(fleet, start_meridian):
    m = start_meridian(fleet)
    assert not problems(m)
    path = with_invalid_addresses(fleet)
    check_invalid_addresses_left_out(m, path)


def test_member_directory_disappears_and_comes_back(fleet, start_meridian):
    fleet.set_health(heartbeat=1, unreachable=2, withdraw=3)
    m = start_meridian(fleet)
    assert addrs(ask(m, "payments.shop.global", source=FROM_EU1)) == EU1
    away = fleet.root / "eu-1-away"
    fleet.cluster_dir("eu-1").rename(away)
    removed = time.time()

    m.wait_for(lambda: clusters(m)["eu-1"]["health"] == "Unreachable", timeout=8, what="eu-1 Unreachable")
    unreachable = time.time()
    eu1 = clusters(m)["eu-1"]
    assert eu1["withdrawn"] is False
    assert "missing" in (eu1["reason"] or ""), eu1
    # Still served until the withdraw time (3 s after Unreachable).
    samples = []
    while time.time() < unreachable + 8:
        got = addrs(ask(m, "payments.shop.global", source=FROM_EU1))
        samples.append((time.time() - unreachable, got))
        if got != EU1:
            break
        time.sleep(0.05)
    served_for = samples[-1][0]
    assert samples[-1][1] == EU2, f"after the withdraw time an eu-1 client gets the next tier (eu-2): {samples[-5:]}"
    assert all(got == EU1 for _, got in samples[:-1])
    assert served_for >= 2.0, f"withdrawn {served_for:.2f}s after Unreachable (withdrawAfterSeconds 3)"
    assert clusters(m)["eu-1"]["withdrawn"] is True
    assert time.time() - removed < 10
    # Everywhere else eu-1 is gone too.
    assert addrs(ask(m, "payments.shop.global")) == sorted(EU2 + US1)
    assert addrs(ask(m, "db.shop.global", source=FROM_EU1)) == [GATEWAY_US1]
    r = ask(m, "_http._tcp.payments.shop.global", "SRV", source=FROM_EU1)
    assert sorted((rd.priority, rd.port, rd.target.to_text()) for rd in records(r, dns.rdatatype.SRV)) == [
        (0, 8080, "127-1-2-1.eu-2.payments.shop.global."),
        (0, 8080, "127-1-2-2.eu-2.payments.shop.global."),
        (1, 15443, "us-1.payments.shop.global."),
    ]
    assert ask(m, "db-0.eu-1.db.shop.global").rcode() == NXDOMAIN
    snap = metrics(m)
    assert metric(snap, "meridian_cluster_health", cluster="eu-1", state="Unreachable") == 1
    assert metric(snap, "meridian_cluster_withdrawn", cluster="eu-1") == 1
    assert metric(snap, "meridian_registry_withdrawals_total", cluster="eu-1", to="withdrawn") == 1
    assert log_lines_with(m, "eu-1", "Unreachable")

    # Back again: the endpoints return.
    away.rename(fleet.cluster_dir("eu-1"))
    m.wait_for(lambda: addrs(ask(m, "payments.shop.global", source=FROM_EU1)) == EU1, timeout=8, what="eu-1 back")
    eu1 = clusters(m)["eu-1"]
    assert eu1["health"] == "Healthy" and eu1["withdrawn"] is False
    assert addrs(ask(m, "payments.shop.global")) == ALL_PAYMENTS
    assert addrs(ask(m, "db-0.eu-1.db.shop.global")) == ["127.1.1.11"]
    still_serving(m)


# ---------------------------------------------------------------------------------------
# meridian validate.


def validate(config):
    return subprocess.run([str(BIN), "validate", "--config", str(config)], capture_output=True, text=True, timeout=30)


def test_validate_quickstart_passes():
    p = validate(QUICKSTART / "meridian.yaml")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "3 member(s), 3 exported service(s)" in p.stdout
    assert "0 error(s), 0 warning(s)" in p.stdout


def test_validate_reports_file_object_and_reason(fleet):
    fleet.write("clusters/eu-1/broken.yaml", EARLY.replace("spec: {ports:", "spec: {bogusField: 1, ports:") + "---\n" + BROKEN_DOC)
    fleet.write(
        "hub/extra.yaml",
        "apiVersion: meridian.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: eu-3}\n"
        "spec:\n  source: {directory: {path: ../clusters/eu-3}}\n  netwrk: {name: n1}\n",
    )
    path = fleet.cluster_dir("us-1") / "payments.yaml"
    fleet.write("clusters/us-1/payments.yaml", path.read_text().replace("addresses: [127.1.3.2]", 'addresses: ["bogus"]'))
    p = validate(fleet.config)
    assert p.returncode != 0, p.stdout
    out = p.stdout
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, out
    broken = [e for e in errors if "broken.yaml" in e]
    assert len(broken) == 1 and "document 4" in broken[0] and "malformed YAML" in broken[0], out
    hub = [e for e in errors if "extra.yaml" in e]
    assert len(hub) == 1 and "MemberCluster eu-3" in hub[0] and "unknown field(s): spec.netwrk" in hub[0], out
    slice_err = [e for e in errors if "us-1/payments.yaml" in e]
    assert len(slice_err) == 1, out
    assert "EndpointSlice shop/payments-abc12" in slice_err[0] and '"bogus" is not an IP address' in slice_err[0], out
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "Service shop/early" in warnings[0] and "spec.bogusField" in warnings[0], out
    assert "3 error(s), 1 warning(s)" in out


def test_validate_rejects_a_bad_config_file(fleet):
    fleet.write("bad.yaml", fleet.config.read_text().replace("  ttl: 5", "  tll: 5"))
    p = validate(fleet.root / "bad.yaml")
    assert p.returncode != 0
    assert "bad.yaml" in p.stderr and "unknown field `tll`" in p.stderr, p.stderr
    p = validate(fleet.root / "missing.yaml")
    assert p.returncode != 0 and "missing.yaml" in p.stderr


def test_serve_refuses_a_missing_hub(fleet):
    fleet.write("nohub.yaml", fleet.config.read_text().replace("directory: hub", "directory: no-such-hub"))
    p = subprocess.run(
        [str(BIN), "serve", "--config", str(fleet.root / "nohub.yaml"), "--dns-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--xds-listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=20,
    )
    assert p.returncode != 0
    assert "no-such-hub" in p.stderr and "does not exist" in p.stderr, p.stderr
