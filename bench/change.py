"""Measures the time from a change on disk to (a) a new DNS answer and (b) an xDS push, on a
running meridian serving a large directory fleet (bench/change.sh starts it).

    python3 bench/change.py FLEET DNS_PORT XDS_PORT ADMIN_PORT CHANGES [FIRST]

For each change, a new exported service (one endpoint) is appended to clusters/c000/services.yaml
with an atomic rename, as editors and sync tools write files. Meanwhile a DNS client polls the new
name every 2 ms, and an xDS stream (an Envoy node in cluster c001) that subscribed to the new
name's EDS assignment before the change waits for the push that carries it. Prints one JSON
object: per-change milliseconds and p50/max for both.
"""

import json
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
import ads  # noqa: E402  (the raw ADS client of the e2e tests)

fleet, dns_port, xds_port, admin_port, changes = (
    Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
# New names start here (a kept fleet already holds the earlier ones).
FIRST = int(sys.argv[6]) if len(sys.argv) > 6 else 0
SERVICES = fleet / "clusters" / "c000" / "services.yaml"
NAMESPACE = "team00-0"


def dns_query(name):
    """A minimal A query; True if the answer section is not empty."""
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    packet = struct.pack("!HHHHHH", 0x4242, 0, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)
        s.sendto(packet, ("127.0.0.1", dns_port))
        reply, _ = s.recvfrom(4096)
    return struct.unpack("!H", reply[6:8])[0] > 0


def append_service(i):
    svc = f"chg{i:03d}"
    text = SERVICES.read_text() + (
        f"---\n{{apiVersion: v1, kind: Service, metadata: {{name: {svc}, namespace: {NAMESPACE}}}, "
        f"spec: {{ports: [{{name: http, port: 80, targetPort: 8080, protocol: TCP}}]}}}}\n"
        f"---\n{{apiVersion: multicluster.x-k8s.io/v1alpha1, kind: ServiceExport, "
        f"metadata: {{name: {svc}, namespace: {NAMESPACE}}}}}\n"
        f"---\n{{apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {{name: {svc}-x, "
        f"namespace: {NAMESPACE}, labels: {{kubernetes.io/service-name: {svc}}}}}, addressType: IPv4, "
        f"ports: [{{name: http, port: 8080, protocol: TCP}}], "
        f"endpoints: [{{addresses: [10.0.15.{200 + i % 50}], conditions: {{ready: true}}}}]}}\n"
    )
    tmp = SERVICES.with_name(".services.yaml.tmp")
    tmp.write_text(text)
    os.rename(tmp, SERVICES)
    return svc


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    stream = ads.AdsStream(xds_port)
    node = ads.node("bench-envoy", "c001", "net-r1")
    dns_ms, xds_ms = [], []
    for i in range(FIRST, FIRST + changes):
        name = f"chg{i:03d}.{NAMESPACE}.global"
        eds_name = f"{name}:80"
        # Subscribe first: answered at once without the absent resource.
        stream.send(ads.request(ads.EDS, [eds_name], node=node if i == FIRST else None))
        first = stream.recv_type(ads.EDS, timeout=60)
        assert eds_name not in ads.decode(first), f"{eds_name} exists before the change"
        stream.send(ads.ack(first, [eds_name]))
        time.sleep(0.3)
        dns_done = {}

        def poll_dns():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if dns_query(name):
                    dns_done["t"] = time.monotonic()
                    return
                time.sleep(0.002)

        t0 = time.monotonic()
        append_service(i)
        poller = threading.Thread(target=poll_dns)
        poller.start()
        while True:
            r = stream.recv_type(ads.EDS, timeout=30)
            stream.send(ads.ack(r, [eds_name]))
            if eds_name in ads.decode(r):
                xds_ms.append((time.monotonic() - t0) * 1000)
                break
        poller.join()
        if "t" not in dns_done:
            sys.exit(f"DNS never answered {name}")
        dns_ms.append((dns_done["t"] - t0) * 1000)
        time.sleep(0.5)
    stream.close()
    summary = lambda v: {"p50": round(percentile(v, 50), 1), "max": round(max(v), 1),
                         "each": [round(x, 1) for x in v]}
    print(json.dumps({"changes": changes, "dns_ms": summary(dns_ms), "xds_push_ms": summary(xds_ms)}))


main()
