"""Greeter servers: real gRPC servers (grpcio) for the xDS end-to-end tests.

Each server implements the unary method /meridian.test.Greeter/Hello on raw bytes (no
protobuf, so no generated code) and replies with the UTF-8 text "<cluster> <ip>:<port>",
so a client can tell which cluster and which endpoint answered. Two labels behave otherwise,
for the route tests: a server labelled "fail" answers every call with UNAVAILABLE, one
labelled "slow" replies after 3 seconds.

Run as a script it serves every LABEL=IP:PORT given on the command line (one grpc.server
each, in one process), prints "ready" once all are bound and serves until killed:

    python3 greeter.py eu-1=127.1.1.21:50051 eu-1=127.1.1.22:50051 eu-2=127.1.2.21:50051

The tests import Greeters, which runs that script as a subprocess: grpc never runs in the
pytest process for these servers (the pytest process hosts no gRPC xDS state either).
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

METHOD = "/meridian.test.Greeter/Hello"
SERVICE = "meridian.test.Greeter"
SLOW_SECONDS = 3.0


def reply_text(label, address):
    return f"{label} {address}"


class Greeters:
    """A subprocess serving the Greeter on each (label, "ip:port") pair; stop() ends it."""

    def __init__(self, servers, log_path, timeout=15):
        self.servers = list(servers)
        self.log_path = Path(log_path)
        args = [sys.executable, str(Path(__file__).resolve()), *(f"{label}={addr}" for label, addr in self.servers)]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout):
        got = []

        def read():
            got.append(self.proc.stdout.readline())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if not got or got[0].strip() != "ready":
            self.stop()
            raise RuntimeError(
                f"greeter servers {self.servers} did not start within {timeout}s "
                f"(stdout {got!r}):\n{self.log_path.read_text()}"
            )

    def replies(self):
        """The reply text of every server."""
        return sorted(reply_text(label, addr) for label, addr in self.servers)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def exit_with_parent():
    """Ends this process when the process that started it (the test) is gone, so a test
    run killed half-way leaves no server or client behind."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def serve(pairs):
    from concurrent import futures

    import grpc

    exit_with_parent()
    servers = []
    for label, address in pairs:
        text = reply_text(label, address).encode()

        def hello(request, context, text=text, label=label):
            if label == "fail":
                context.abort(grpc.StatusCode.UNAVAILABLE, f"{text.decode()} fails every call")
            if label == "slow":
                time.sleep(SLOW_SECONDS)
            return text

        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Hello": grpc.unary_unary_rpc_method_handler(hello)}
        )
        # gRPC binds with SO_REUSEPORT: two test runs on one machine share the addresses, and
        # as every server's reply is made of its own address, either run's server will do.
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as e:
            sys.exit(f"greeter: cannot bind {address}: {e}")
        if bound == 0:
            sys.exit(f"greeter: cannot bind {address}")
        server.start()
        servers.append(server)
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def main(argv):
    pairs = []
    for arg in argv:
        label, sep, address = arg.partition("=")
        if not sep or ":" not in address:
            sys.exit(f"greeter: expected LABEL=IP:PORT, got {arg!r}")
        pairs.append((label, address))
    if not pairs:
        sys.exit("greeter: nothing to serve (expected LABEL=IP:PORT ...)")
    serve(pairs)


if __name__ == "__main__":
    main(sys.argv[1:])
