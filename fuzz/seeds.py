#!/usr/bin/env python3
"""Writes the seed corpus of the dns_request fuzz target (corpus/ is not committed).

    python3 fuzz/seeds.py            # writes fuzz/corpus/dns_request/seed-*

The first byte of a query is the high byte of its ID and also picks the fuzz target's source
address (modulo 10): 0 eu-1, 1 eu-2, 2 us-1, 3 127.0.0.1 (no cluster), 4 10.9.8.7, 5 ::1,
6 fd00:2::5 (eu-2 by IPv6), 7 127.0.9.1 (a CIDR two clusters claim), 8 203.0.113.5 (a geo
range in region us), 9 198.51.100.7 (a geo range in zone eu-1a).
"""

import os
import struct

A, NS, SOA, TXT, AAAA, SRV, OPT, AXFR, ANY = 1, 2, 6, 16, 28, 33, 41, 252, 255
IN, CH = 1, 3


def name(text):
    out = b""
    for label in text.strip(".").split("."):
        if label:
            out += bytes([len(label)]) + label.encode()
    return out + b"\x00"


def opt(payload=1232, version=0, do=False, options=b""):
    ttl = struct.pack(">BBH", 0, version, 0x8000 if do else 0)
    return b"\x00" + struct.pack(">HH", OPT, payload) + ttl + struct.pack(">H", len(options)) + options


def ecs(addr, prefix):
    family = 1 if "." in addr else 2
    raw = bytes(int(x) for x in addr.split(".")) if family == 1 else bytes.fromhex(addr)
    data = struct.pack(">HBB", family, prefix, 0) + raw[: (prefix + 7) // 8]
    return struct.pack(">HH", 8, len(data)) + data


def cookie():
    return struct.pack(">HH", 10, 8) + bytes(range(1, 9))


def query(source, qname, qtype, qclass=IN, edns=None, flags=0x0100, qd=None, extra=b"", opcode=0):
    ident = (source << 8) | 0x2A
    questions = qd if qd is not None else [(qname, qtype, qclass)]
    body = b"".join(name(n) + struct.pack(">HH", t, c) for n, t, c in questions)
    flags |= opcode << 11
    header = struct.pack(">HHHHHH", ident, flags, len(questions), 0, 0, 1 if edns else 0)
    return header + body + (edns or b"") + extra


EU1, EU2, US1, LOCAL, OTHER, V6, EU2_V6, TIE, GEO_US, GEO_EU1A = range(10)

SEEDS = {
    "payments-a-eu1": query(EU1, "payments.shop.global", A),
    "payments-a-us1": query(US1, "Payments.Shop.Global", A),
    "payments-aaaa": query(EU2, "payments.shop.global", AAAA),
    "payments-cluster": query(LOCAL, "eu-1.payments.shop.global", A),
    "payments-cluster-gw": query(US1, "eu-2.payments.shop.global", A),
    "payments-clusterset-import": query(EU2, "payments.shop.svc.clusterset.local", A, edns=opt()),
    "payments-clusterset": query(EU1, "payments.shop.svc.clusterset.local", A),
    "payments-any": query(EU1, "payments.shop.global", ANY),
    "payments-srv": query(EU1, "_http._tcp.payments.shop.global", SRV),
    "payments-srv-clusterset": query(EU2, "_grpc._tcp.payments.shop.svc.clusterset.local", SRV, edns=opt()),
    "payments-srvproto": query(EU1, "_tcp.payments.shop.global", A),
    "db-a": query(EU1, "db.shop.svc.clusterset.local", A),
    "db-host": query(US1, "db-0.us-1.db.shop.global", A),
    "db-host-clusterset": query(EU1, "db-1.eu-1.db.shop.svc.clusterset.local", A),
    "db-cluster-clusterset": query(EU1, "eu-1.db.shop.svc.clusterset.local", A),
    "db-srv": query(TIE, "_postgres._tcp.db.shop.svc.clusterset.local", SRV, edns=opt(4096)),
    "cart-aaaa": query(EU2_V6, "cart.shop.global", AAAA, edns=opt()),
    "cart-a": query(V6, "cart.shop.svc.clusterset.local", A),
    "big-a-truncated": query(EU1, "big.shop.global", A),
    "big-aaaa-edns": query(OTHER, "big.shop.global", AAAA, edns=opt(1232)),
    "big-srv-udp": query(EU1, "_dns._udp.big.shop.global", SRV, edns=opt(600)),
    "soa-global": query(LOCAL, "global", SOA),
    "ns-global": query(LOCAL, "global", NS),
    "ns-address": query(LOCAL, "ns.global", A),
    "soa-clusterset": query(LOCAL, "clusterset.local", SOA, edns=opt(512)),
    "dns-version": query(LOCAL, "dns-version.clusterset.local", TXT),
    "services-root": query(LOCAL, "svc.clusterset.local", A),
    "namespace": query(LOCAL, "shop.global", A),
    "nxdomain": query(EU1, "nope.shop.global", A),
    "refused-zone": query(EU1, "example.com", A),
    "chaos": query(LOCAL, "version.bind", TXT, qclass=CH),
    "axfr": query(LOCAL, "global", AXFR),
    "axfr-clusterset": query(OTHER, "clusterset.local", AXFR),
    "ixfr": query(LOCAL, "global", 251),
    "ecs-us1": query(OTHER, "payments.shop.global", A, edns=opt(options=ecs("127.0.3.0", 24))),
    "geo-us": query(GEO_US, "payments.shop.global", A),
    "geo-eu1a-srv": query(GEO_EU1A, "_http._tcp.payments.shop.global", SRV, edns=opt()),
    "ecs-geo-eu1a": query(EU1, "payments.shop.global", A, edns=opt(options=ecs("198.51.100.0", 24))),
    "ecs-eu2-v6": query(EU1, "cart.shop.global", AAAA, edns=opt(options=ecs("fd000002000000000000000000000000", 56))),
    "ecs-zero": query(EU2, "payments.shop.svc.clusterset.local", A, edns=opt(options=ecs("0.0.0.0", 0))),
    "cookie": query(EU1, "payments.shop.global", A, edns=opt(do=True, options=cookie())),
    "edns-v1": query(EU1, "payments.shop.global", A, edns=opt(version=1)),
    "two-questions": query(EU1, "", A, qd=[("payments.shop.global", A, IN), ("cart.shop.global", A, IN)]),
    "no-question": query(EU1, "", A, qd=[]),
    # 30 questions: FORMERR, and the echoed questions alone exceed 512 bytes (a known bug).
    "many-questions": query(EU1, "", A, qd=[("payments.shop.global", A, IN)] * 30),
    "notify": query(LOCAL, "global", SOA, opcode=4),
    "update": query(LOCAL, "global", SOA, opcode=5),
    "response": query(EU1, "payments.shop.global", A, flags=0x8100),
    # A pointer to itself (malformed), and a second question pointing into the first.
    "compressed-loop": bytes.fromhex("0a2a01000001000000000000") + name("payments.shop.global")[:9]
    + b"\xc0\x15" + struct.pack(">HH", A, IN),
    "compressed-two": bytes.fromhex("0b2a01000002000000000000") + name("payments.shop.global")
    + struct.pack(">HH", A, IN) + b"\x04cart\xc0\x15" + struct.pack(">HH", A, IN),
    "trailing-garbage": query(EU1, "payments.shop.global", A) + b"\x00\x01\x02",
    "truncated-question": query(EU1, "payments.shop.global", A)[:20],
    "short-header": bytes.fromhex("0a2a0100000100"),
    "garbage": bytes.fromhex("deadbeef" * 8),
}


def tcp(message, capacity=255):
    """A dns_tcp input: the source (the message's first byte, as in dns_request), the pipe's
    capacity, then the message with its length prefix."""
    return bytes([message[0], capacity]) + struct.pack(">H", len(message)) + message


# dns_tcp: an A answer over 65,535 bytes (truncated at a whole record), and it pipelined
# behind a small query through a 16-byte pipe.
TCP_SEEDS = {
    "huge-a": tcp(query(EU1, "huge.shop.global", A)),
    "pipelined-huge": tcp(query(EU1, "payments.shop.global", A), 15)
    + struct.pack(">H", len(query(EU1, "huge.shop.global", A))) + query(EU1, "huge.shop.global", A),
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for target, seeds in (("dns_request", SEEDS), ("dns_tcp", TCP_SEEDS)):
        out = os.path.join(here, "corpus", target)
        os.makedirs(out, exist_ok=True)
        for label, data in seeds.items():
            with open(os.path.join(out, f"seed-{label}"), "wb") as f:
                f.write(data)
        print(f"wrote {len(seeds)} seeds to {out}")


if __name__ == "__main__":
    main()
