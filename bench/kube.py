"""Change → answer and registration → resolvable on real kube-apiservers (bench/kube.sh runs it).

    python3 bench/kube.py WORK [--changes 300] [--gap-ms 20] [--xds-debounce-ms 10]
                               [--endpoints 10000] [--slices 100] [--rounds 5]

Starts a hub and two members (kube-apiserver + etcd each, tests/e2e/kube_fleet.py with the
peers of tests/peers/) and `meridian serve` (MERIDIAN_BIN) with the hub, as one replica:

1. API write → answer. Member m1 holds the exported Service shop/payments with one endpoint.
   Each change is one merge PATCH of its EndpointSlice (over a kept-alive HTTPS connection,
   as admin) replacing the endpoint by a new address; the clock starts just before the
   request is sent and stops, separately, when
     - a plain watch on m1's EndpointSlices (a raw HTTP watch in a thread of this process,
       the same API server meridian watches) receives the event carrying the address:
       the API server's own write → watch delivery;
     - a DNS client polling payments.shop.global every ~1 ms gets the new address;
     - an ADS stream (an Envoy node in m1) subscribed to payments.shop.global:80 receives an
       EDS assignment with the new address.
   Changes go one at a time, each GAP ms after all three observations of the last one (the
   leader's write-back of a change into m1 — derived Service, EndpointSlice, ServiceImport
   status — follows ~100 ms after it, so with short gaps it overlaps later changes, as in a
   busy fleet). "Beyond" figures subtract, per change, the watch delivery (and for xDS the
   --xds-debounce-ms quiet time): DESIGN §8 starts its clock at the watch event.
2. Registration → resolvable. Member "big" holds the exported Service shop/catalog with
   ENDPOINTS endpoints over SLICES EndpointSlices, and is not registered. Each round creates
   its MemberCluster on the hub (the clock starts before the request) and polls
   catalog.shop.global until it is answered; then deletes the MemberCluster and waits for
   NXDOMAIN before the next round.

Prints one JSON object with every figure on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import ssl
import statistics
import struct
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import ads  # noqa: E402  (the raw ADS client of the e2e tests)
from benchstats import log, summary  # noqa: E402  (bench/, the script's own folder)
from kube_fleet import DISCOVERY, NAMESPACE, Member, SERVICE_NAME_LABEL, KubeFleet, wait_for  # noqa: E402

NAME = "payments.shop.global"
EDS_NAME = f"{NAME}:80"
BIG_NAME = "catalog.shop.global"
PORT = [{"name": "http", "port": 80, "protocol": "TCP"}]
TARGET = [{"name": "http", "port": 8080, "protocol": "TCP"}]


def address(i: int) -> str:
    return f"10.2.{i // 250}.{i % 250 + 1}"


class Dns:
    """A minimal UDP client on one connected socket: A queries, raw replies."""

    def __init__(self, port: int, name: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(0.5)
        self.qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
        self.id = 0

    def query(self):
        """(rcode, answer count, bytes after the question, truncated) or None on a timeout."""
        self.id = (self.id + 1) & 0xFFFF
        packet = struct.pack("!HHHHHH", self.id, 0, 1, 0, 0, 0) + self.qname + struct.pack("!HH", 1, 1)
        self.sock.send(packet)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                reply = self.sock.recv(65535)
            except socket.timeout:
                return None
            if len(reply) >= 12 and struct.unpack("!H", reply[:2])[0] == self.id:
                flags, _, ancount = struct.unpack("!HHH", reply[2:8])
                return flags & 0xF, ancount, reply[len(packet):], bool(flags & 0x0200)
        return None


class Seen:
    """First time (monotonic) each address was observed, with a wake-up for the waiter."""

    def __init__(self):
        self.at: dict[str, float] = {}
        self.cond = threading.Condition()

    def add(self, addresses, t):
        with self.cond:
            new = False
            for a in addresses:
                if a not in self.at:
                    self.at[a] = t
                    new = True
            if new:
                self.cond.notify_all()

    def wait(self, a, timeout):
        with self.cond:
            return self.cond.wait_for(lambda: a in self.at, timeout)


class Watcher(threading.Thread):
    """A raw HTTP watch (as admin) on the EndpointSlices of one Service in a cluster."""

    def __init__(self, cluster, namespace, service, seen: Seen):
        super().__init__(daemon=True)
        self.cluster, self.seen = cluster, seen
        sel = urllib.parse.quote(f"{SERVICE_NAME_LABEL}={service}")
        self.path = (f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
                     f"?watch=1&labelSelector={sel}&timeoutSeconds=3600")
        self.ready = threading.Event()
        self.error = None

    def run(self):
        try:
            ctx = ssl.create_default_context(cafile=str(self.cluster.ca_file))
            conn = http.client.HTTPSConnection("127.0.0.1", self.cluster.apiserver_port, context=ctx, timeout=3700)
            conn.request("GET", self.path, headers={"Authorization": f"Bearer {self.cluster.admin_token}"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"watch: {resp.status} {resp.read()[:300]!r}")
            self.ready.set()
            for line in resp:
                t = time.monotonic()
                event = json.loads(line)
                obj = event.get("object") or {}
                self.seen.add([a for e in obj.get("endpoints") or [] for a in e.get("addresses") or []], t)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            self.error = e
            self.ready.set()


class DnsPoller(threading.Thread):
    """Polls NAME every ~1 ms while a target address is set; records when it shows up."""

    def __init__(self, port, seen: Seen):
        super().__init__(daemon=True)
        self.dns = Dns(port, NAME)
        self.seen = seen
        self.target: bytes | None = None
        self.target_text = ""
        self.go = threading.Event()
        self.lock = threading.Lock()
        self.queries = 0

    def look_for(self, addr):
        with self.lock:
            self.target_text, self.target = addr, socket.inet_aton(addr)
            self.go.set()

    def run(self):
        while True:
            self.go.wait()
            target, text = self.target, self.target_text
            r = self.dns.query()
            self.queries += 1
            if r is not None and r[0] == 0 and r[1] > 0 and target in r[2]:
                self.seen.add([text], time.monotonic())
                with self.lock:
                    if self.target == target:
                        self.go.clear()
                continue
            time.sleep(0.001)


class EdsReader(threading.Thread):
    """One ADS stream (an Envoy node in m1) subscribed to EDS_NAME; this thread reads every
    response straight off the gRPC call (timestamped there), ACKs it and records the
    addresses of each EDS assignment."""

    def __init__(self, port: int, seen: Seen):
        super().__init__(daemon=True)
        import queue

        import grpc

        self.seen = seen
        self.requests: queue.Queue = queue.Queue()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call = self.channel.stream_stream(ads.ADS_METHOD, request_serializer=ads.DiscoveryRequest.SerializeToString,
                                          response_deserializer=ads.DiscoveryResponse.FromString)
        self.requests.put(ads.request(ads.EDS, [EDS_NAME], node=ads.node("bench-envoy", "m1", "net1")))
        self.call = call(iter(self.requests.get, None))
        self.responses = 0
        self.error = None

    def run(self):
        try:
            for r in self.call:
                t = time.monotonic()
                self.requests.put(ads.ack(r, [EDS_NAME]))
                if r.type_url != ads.EDS:
                    continue
                self.responses += 1
                addrs = [lb.endpoint.address.socket_address.address
                         for res in ads.decode(r).values() for loc in res.endpoints for lb in loc.lb_endpoints]
                self.seen.add(addrs, t)
        except Exception as e:  # noqa: BLE001 - the stream ended; reported by the main thread
            self.error = e

    def close(self):
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


def change_to_answer(fleet: KubeFleet, m, changes: int, debounce_ms: int, gap_ms: int) -> dict:
    c = fleet.cluster("m1")
    fleet.service(c, "payments", PORT)
    fleet.endpoint_slice(c, "payments", [address(0)], ports=TARGET, name="payments-m1")
    fleet.export(c, "payments")
    probe = Dns(m.dns_port, NAME)
    wait_for(lambda: (r := probe.query()) and r[1] > 0, timeout=30, what="payments answered", log=m)

    watch_seen, dns_seen, xds_seen = Seen(), Seen(), Seen()
    watcher = Watcher(c, NAMESPACE, "payments", watch_seen)
    watcher.start()
    watcher.ready.wait(10)
    if watcher.error:
        raise watcher.error
    reader = EdsReader(m.xds_port, xds_seen)
    reader.start()
    poller = DnsPoller(m.dns_port, dns_seen)
    poller.start()
    if not xds_seen.wait(address(0), 10):
        raise RuntimeError(f"no EDS assignment with {address(0)}: {reader.error}")

    ctx = ssl.create_default_context(cafile=str(c.ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", c.apiserver_port, context=ctx, timeout=30)
    path = f"/apis/{DISCOVERY}/namespaces/{NAMESPACE}/endpointslices/payments-m1"
    headers = {"Authorization": f"Bearer {c.admin_token}", "Content-Type": "application/merge-patch+json"}
    rows = []
    before = metrics(m)
    log(f"{changes} EndpointSlice updates in m1, one at a time, {gap_ms} ms apart")
    for i in range(1, changes + 1):
        addr = address(i)
        body = json.dumps({"endpoints": [{"addresses": [addr], "conditions": {"ready": True}}]})
        poller.look_for(addr)
        t0 = time.monotonic()
        conn.request("PATCH", path, body, headers)
        resp = conn.getresponse()
        resp.read()
        t_written = time.monotonic()
        if resp.status != 200:
            raise RuntimeError(f"PATCH {path}: {resp.status}")
        for seen, what in ((watch_seen, "watch event"), (dns_seen, "DNS answer"), (xds_seen, "EDS push")):
            if not seen.wait(addr, 15):
                raise RuntimeError(f"change {i}: no {what} with {addr} after 15 s "
                                   f"(watch {watcher.error}, xds {reader.error})\n{m.log_tail()}")
        rows.append({
            "write": (t_written - t0) * 1000,
            "watch": (watch_seen.at[addr] - t0) * 1000,
            "dns": (dns_seen.at[addr] - t0) * 1000,
            "xds": (xds_seen.at[addr] - t0) * 1000,
        })
        time.sleep(gap_ms / 1000)
        if i % 50 == 0:
            log(f"  {i} changes")
    reader.close()
    conn.close()
    after = metrics(m)
    delta = lambda k: after.get(k, 0) - before.get(k, 0)  # noqa: E731
    col = lambda k: [r[k] for r in rows]  # noqa: E731
    return {
        "changes": changes,
        "gap_ms": gap_ms,
        "xds_debounce_ms": debounce_ms,
        # Per change: snapshots the store published, EDS responses meridian pushed.
        "snapshots_per_change": round(delta("meridian_snapshot_version") / changes, 2),
        "eds_pushes_per_change": round(delta('meridian_xds_pushes_total{resource="EDS"}') / changes, 2),
        "write_response_ms": summary(col("write")),
        "watch_delivery_ms": summary(col("watch")),
        "dns_ms": summary(col("dns")),
        "xds_ms": summary(col("xds")),
        "dns_beyond_watch_ms": summary([r["dns"] - r["watch"] for r in rows]),
        "xds_beyond_watch_and_debounce_ms": summary([r["xds"] - r["watch"] - debounce_ms for r in rows]),
        "eds_responses": reader.responses,
        "each_ms": [{k: round(v, 2) for k, v in r.items()} for r in rows],
        "dns_polls": poller.queries,
    }


def registration(fleet: KubeFleet, m, endpoints: int, slices: int, rounds: int) -> dict:
    big = fleet.cluster("big")
    fleet.delete_member_cluster("big")  # registered by setup(); the rounds register it
    fleet.service(big, "catalog", PORT)
    per = -(-endpoints // slices)
    log(f"big: {endpoints} endpoints in {slices} EndpointSlices of shop/catalog")
    made = 0
    for s in range(slices):
        n = min(per, endpoints - made)
        if n <= 0:
            break
        addrs = [f"10.{100 + (made + k) // 65536}.{(made + k) // 256 % 256}.{(made + k) % 256}" for k in range(n)]
        fleet.endpoint_slice(big, "catalog", addrs, ports=TARGET, name=f"catalog-{s:03d}")
        made += n
    fleet.export(big, "catalog")
    dns = Dns(m.dns_port, BIG_NAME)
    wait_for(lambda: (r := dns.query()) and r[0] == 3, timeout=30, what="catalog unknown before registration", log=m)
    resolvable, indexed, withdrawn = [], [], []
    for r in range(rounds):
        t0 = time.monotonic()
        fleet.register_member("big")
        while True:
            a = dns.query()
            # 10,000 addresses do not fit a UDP answer: NOERROR with TC set (and no records)
            # says the name now has them (it was NXDOMAIN), as a client would retry over TCP.
            if a is not None and a[0] == 0 and (a[1] > 0 or a[3]):
                resolvable.append((time.monotonic() - t0) * 1000)
                break
            if time.monotonic() - t0 > 30:
                raise RuntimeError(f"round {r}: catalog not answered 30 s after registration\n{m.log_tail()}")
            time.sleep(0.001)
        # How much of the member was indexed when it first answered, and when all of it was.
        at_answer = member_endpoints(m)
        wait_for(lambda: member_endpoints(m) >= endpoints, timeout=30, what="all of big indexed", log=m)
        indexed.append((time.monotonic() - t0) * 1000)
        log(f"  round {r + 1}: answered after {resolvable[-1]:.0f} ms ({at_answer} endpoints of big indexed then)")
        time.sleep(2)  # let the leader's write-back into m1 settle
        t1 = time.monotonic()
        fleet.delete_member_cluster("big")
        wait_for(lambda: (a := dns.query()) and a[0] == 3, timeout=30, what="catalog gone after deregistration", log=m)
        withdrawn.append((time.monotonic() - t1) * 1000)
        time.sleep(2)
    return {
        "endpoints": endpoints, "slices": slices, "rounds": rounds,
        "resolvable_ms": [round(x) for x in resolvable], "resolvable_median_ms": round(statistics.median(resolvable)),
        "fully_indexed_ms": [round(x) for x in indexed],
        "deregistered_nxdomain_ms": [round(x) for x in withdrawn],
    }


def metrics(m) -> dict[str, float]:
    """Every sample of meridian's /metrics, by name with labels."""
    out = {}
    for line in m.http("/metrics")[1].splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def member_endpoints(m) -> int:
    """meridian_cluster_endpoints of member big (0 when absent)."""
    status, body = m.http("/metrics")
    for line in body.splitlines():
        if line.startswith("meridian_cluster_endpoints{") and 'cluster="big"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--changes", type=int, default=300)
    ap.add_argument("--xds-debounce-ms", type=int, default=10)
    ap.add_argument("--gap-ms", type=int, default=20, help="pause after each change is observed")
    ap.add_argument("--endpoints", type=int, default=10000)
    ap.add_argument("--slices", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    members = (Member("m1", "eu", "eu-a", "127.0.1.0/24"), Member("big", "us", "us-a", "127.0.3.0/24"))
    started = time.monotonic()
    log("starting hub, m1 and big (kube-apiserver + etcd each)")
    fleet = KubeFleet(args.work / "kube", members).start()
    try:
        fleet.delete_member_cluster("big")
        log(f"fleet up after {time.monotonic() - started:.0f} s; starting meridian "
            f"(--xds-debounce-ms {args.xds_debounce_ms})")
        m = fleet.start_meridian("meridian", "--xds-debounce-ms", str(args.xds_debounce_ms),
                                 env={"MERIDIAN_LOG": os.environ.get("MERIDIAN_LOG", "info")})
        wait_for(lambda: fleet.lease_holder() == "meridian", timeout=15, what="meridian leads", log=m)
        result = {"meridian": str(m.proc.args[0])}
        result["change_to_answer"] = change_to_answer(fleet, m, args.changes, args.xds_debounce_ms, args.gap_ms)
        result["registration"] = registration(fleet, m, args.endpoints, args.slices, args.rounds)
        result["seconds"] = round(time.monotonic() - started)
        print(json.dumps(result))
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
