"""Hand-driven xDS streams for the bad-input tests: what a misbehaving client sends.

AdsStream is one StreamAggregatedResources call made with grpcio and the Envoy protos that
the xds-protos package ships (plain gRPC: no xDS state in the calling process); the test
sends DiscoveryRequests one by one and reads DiscoveryResponses with a timeout.

RawH2 speaks HTTP/2 by hand over a TCP socket, for what grpcio will not do: a client that
never reads (it never replenishes flow-control windows nor drains its socket) and a client
that disconnects in the middle of a response.
"""

import queue
import socket
import struct
import threading
import time

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2
from google.rpc import status_pb2

ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
DELTA_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LDS = "type.googleapis.com/envoy.config.listener.v3.Listener"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"

MESSAGES = {
    CDS: cluster_pb2.Cluster,
    EDS: endpoint_pb2.ClusterLoadAssignment,
    LDS: listener_pb2.Listener,
    RDS: route_pb2.RouteConfiguration,
}

GRPC_AGENT = "gRPC C-core test"  # a proxyless gRPC node, by the contract's rule ("gRPC" in the name)

DiscoveryRequest = discovery_pb2.DiscoveryRequest
DiscoveryResponse = discovery_pb2.DiscoveryResponse
DeltaDiscoveryRequest = discovery_pb2.DeltaDiscoveryRequest
DeltaDiscoveryResponse = discovery_pb2.DeltaDiscoveryResponse


def node(node_id, cluster, network, user_agent="envoy", role=None):
    metadata = struct_pb2.Struct()
    metadata.update({"CLUSTER_ID": cluster, "NETWORK": network, **({"ROLE": role} if role else {})})
    return base_pb2.Node(
        id=node_id, cluster=cluster, metadata=metadata, user_agent_name=user_agent,
        locality=base_pb2.Locality(sub_zone=cluster),
    )


def request(type_url, names=(), version="", nonce="", node=None, error=None):
    r = DiscoveryRequest(type_url=type_url, resource_names=list(names), version_info=version, response_nonce=nonce)
    if node is not None:
        r.node.CopyFrom(node)
    if error is not None:
        r.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return r


def ack(response, names=()):
    return request(response.type_url, names, version=response.version_info, nonce=response.nonce)


def decode(response):
    """The resources of a response, decoded to their Envoy messages, by name."""
    out = {}
    for any_ in response.resources:
        message = MESSAGES[any_.type_url]()
        any_.Unpack(message)
        out[getattr(message, "cluster_name", "") or message.name] = message
    return out


class StreamEnded(Exception):
    def __init__(self, code, details):
        super().__init__(f"{code.name if code else None}: {details}")
        self.code = code
        self.details = details


class AdsStream:
    """One StreamAggregatedResources call (DeltaAggregatedResources with delta=True);
    send() requests, recv() responses."""

    _END = object()

    def __init__(self, port, max_receive=64 << 20, delta=False):
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", max_receive)],
        )
        self.requests = queue.Queue()
        self.responses = queue.Queue()
        req, resp = (DeltaDiscoveryRequest, DeltaDiscoveryResponse) if delta else (DiscoveryRequest, DiscoveryResponse)
        call = self.channel.stream_stream(
            DELTA_METHOD if delta else ADS_METHOD,
            request_serializer=req.SerializeToString,
            response_deserializer=resp.FromString,
        )
        self.call = call(iter(self.requests.get, self._END))
        self.ended = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for response in self.call:
                self.responses.put(response)
            self.responses.put(StreamEnded(self.call.code(), self.call.details()))
        except grpc.RpcError as e:
            self.responses.put(StreamEnded(e.code(), e.details()))

    def send(self, req):
        self.requests.put(req)

    def recv(self, timeout=5):
        """The next response; raises StreamEnded if the stream ended, TimeoutError if none came."""
        if self.ended is not None:
            raise self.ended
        try:
            item = self.responses.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no response within {timeout}s") from None
        if isinstance(item, StreamEnded):
            self.ended = item
            raise item
        return item

    def recv_type(self, type_url, timeout=5):
        """The next response of `type_url`, skipping (and ACKing) others."""
        deadline = time.time() + timeout
        while True:
            r = self.recv(max(0.01, deadline - time.time()))
            if r.type_url == type_url:
                return r
            self.send(ack(r))

    def quiet(self, seconds):
        """The responses that arrive within `seconds` (none expected, usually)."""
        got = []
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                got.append(self.recv(max(0.01, deadline - time.time())))
            except TimeoutError:
                break
        return got

    def end(self, timeout=5):
        """Waits for the stream to end; returns the StreamEnded (code, details)."""
        deadline = time.time() + timeout
        while True:
            try:
                self.recv(max(0.01, deadline - time.time()))
            except StreamEnded as e:
                return e

    def close(self):
        self.requests.put(self._END)
        self.call.cancel()
        self.channel.close()


# ---------------------------------------------------------------------------------------
# HTTP/2 by hand.

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 4, 6, 7, 8


def frame(kind, flags, stream, payload=b""):
    return struct.pack("!I", len(payload))[1:] + bytes([kind, flags]) + struct.pack("!I", stream) + payload


def _hpack_int(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_literal(name, value):
    """A header as 'literal without indexing, new name', no Huffman coding."""
    name, value = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


def grpc_message(payload):
    return b"\x00" + struct.pack("!I", len(payload)) + payload


class RawH2:
    """A gRPC client on a bare socket: preface, SETTINGS, one stream, then whatever the test does."""

    def __init__(self, port, window=None, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(5)
        self.sock.connect(("127.0.0.1", port))
        self.port = port
        settings = b""
        if window is not None:
            settings = struct.pack("!HI", 0x4, window)  # SETTINGS_INITIAL_WINDOW_SIZE
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, settings))

    def open_ads(self, stream=1):
        block = b"".join(hpack_literal(n, v) for n, v in [
            (":method", "POST"), (":scheme", "http"), (":path", ADS_METHOD),
            (":authority", f"127.0.0.1:{self.port}"), ("content-type", "application/grpc"), ("te", "trailers"),
        ])
        self.sock.sendall(frame(HEADERS, 0x4, stream, block))

    def send_request(self, req, stream=1):
        self.sock.sendall(frame(DATA, 0, stream, grpc_message(req.SerializeToString())))

    def read_frame(self):
        head = self._exact(9)
        length = int.from_bytes(head[:3], "big")
        return head[3], head[4], struct.unpack("!I", head[5:9])[0] & 0x7FFFFFFF, self._exact(length)

    def _exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data

    def abort(self):
        """Closes with a TCP reset (SO_LINGER 0), mid-whatever."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ---------------------------------------------------------------------------------------
# CSDS: what the server says each client was sent and answered.


def client_status(port, node_id):
    """FetchClientStatus for one node id: {(short type, name): (client_status, config_status,
    error details)} over every stream of that node."""
    from envoy.admin.v3 import config_dump_shared_pb2
    from envoy.service.status.v3 import csds_pb2, csds_pb2_grpc

    shorts = {CDS: "CDS", EDS: "EDS", LDS: "LDS", RDS: "RDS"}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = csds_pb2_grpc.ClientStatusDiscoveryServiceStub(channel).FetchClientStatus(
            csds_pb2.ClientStatusRequest(node=base_pb2.Node(id=node_id)), timeout=5,
        )
    out = {}
    for config in response.config:
        assert config.node.id == node_id, f"CSDS for {node_id!r} returned node {config.node.id!r}"
        for g in config.generic_xds_configs:
            out[(shorts.get(g.type_url, g.type_url), g.name)] = (
                config_dump_shared_pb2.ClientResourceStatus.Name(g.client_status),
                csds_pb2.ConfigStatus.Name(g.config_status),
                g.error_state.details,
            )
    return out
