"""A proxyless gRPC xDS client (grpcio, C-core's xDS client) for the end-to-end tests.

Run as a script, with GRPC_XDS_BOOTSTRAP naming a bootstrap file (the xDS bootstrap is
process-global, so each node identity is its own process), it opens
grpc.insecure_channel(TARGET) for each --target and calls /meridian.test.Greeter/Hello on
it every --interval seconds until killed, printing one JSON line per call, flushed:

    {"t": 1767225600.123, "target": "xds:///greeter.demo.global:50051", "ok": true,
     "server": "eu-1 127.1.1.21:50051", "code": "OK", "error": null, "ms": 1.2}

"t" is when the call started, "ms" how long it took (as the Go client prints them).

A line "call TARGET" on standard input opens one more channel, in the same process and on
the same xDS client, and starts calling TARGET as well.

The tests import XdsClient, which runs a client (this script, or the Go peer
xds-greeter-client that prints the same lines) and reads its lines in a background thread.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

METHOD = "/meridian.test.Greeter/Hello"


def bootstrap(xds_port, node_id, cluster, network, region=None, zone=None, metadata=None, cluster_id=True):
    """A gRPC xDS bootstrap for a node of `cluster` on `network`, served by meridian.

    The cluster is named twice, in metadata CLUSTER_ID and in locality.sub_zone, unless
    cluster_id is false (then only the locality names it)."""
    locality = {"sub_zone": cluster}
    if region:
        locality["region"] = region
    if zone:
        locality["zone"] = zone
    return {
        "xds_servers": [
            {
                "server_uri": f"127.0.0.1:{xds_port}",
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {
            "id": node_id,
            "metadata": {**({"CLUSTER_ID": cluster} if cluster_id else {}), "NETWORK": network, **(metadata or {})},
            "locality": locality,
        },
    }


class XdsClient:
    """A running xDS greeter client process; its JSON lines collected as they come."""

    def __init__(self, args, log_path, env=None, stdin=False):
        self.args = [str(a) for a in args]
        self.log_path = Path(log_path)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lock = threading.Lock()
        self.lines = []
        self.garbage = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @classmethod
    def python(cls, tmp_path, name, xds_port, targets, cluster, network, interval=0.05, headers=None, **bootstrap_kw):
        """The grpcio client (this file) as node `name` of `cluster` on `network`; `headers`
        ({name: value}) go with every call as gRPC metadata."""
        path = Path(tmp_path) / f"{name}-bootstrap.json"
        path.write_text(json.dumps(bootstrap(xds_port, name, cluster, network, **bootstrap_kw), indent=2))
        args = [sys.executable, str(Path(__file__).resolve()), "--interval", str(interval)]
        for key, value in (headers or {}).items():
            args += ["--header", f"{key}={value}"]
        for target in targets:
            args += ["--target", target]
        env = {"GRPC_XDS_BOOTSTRAP": str(path), "GRPC_VERBOSITY": os.environ.get("GRPC_VERBOSITY", "ERROR")}
        return cls(args, Path(tmp_path) / f"{name}.log", env=env, stdin=True)

    @classmethod
    def go(cls, binary, tmp_path, name, xds_port, target, cluster, network, interval_ms=50, headers=None):
        """The Go peer (grpc-go's xDS client) as node `name` of `cluster` on `network`."""
        args = [
            binary, "-server", f"127.0.0.1:{xds_port}", "-node-id", name, "-cluster", cluster,
            "-network", network, "-target", target, "-interval", f"{interval_ms}ms", "-calls", "0",
        ]
        for key, value in (headers or {}).items():
            args += ["-header", f"{key}={value}"]
        # It calls until its standard input closes: keep the pipe open.
        return cls(args, Path(tmp_path) / f"{name}.log", stdin=True)

    def _read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                call = json.loads(line)
            except ValueError:
                with self.lock:
                    self.garbage.append(line)
                continue
            # The Go client leaves out what does not apply (no "server" on a failure).
            for key in ("server", "code", "error"):
                call.setdefault(key, None)
            with self.lock:
                self.lines.append(call)

    def call(self, target):
        """Starts calling one more target, on a new channel in the same process."""
        self.proc.stdin.write(f"call {target}\n")
        self.proc.stdin.flush()

    def calls(self, since=0.0, target=None):
        """The calls made at or after `since` (the client's time stamps), for `target` if given."""
        with self.lock:
            return [
                c for c in self.lines
                if c["t"] >= since and (target is None or c.get("target", target) == target)
            ]

    def alive(self):
        return self.proc.poll() is None

    def describe(self, calls=None, lines=12):
        """The last calls and the log tail, for a failure message."""
        calls = self.calls() if calls is None else calls
        outcomes = {}
        for c in calls:
            key = c["server"] if c["ok"] else c.get("code")
            outcomes[key] = outcomes.get(key, 0) + 1
        short = [{**c, "error": (c.get("error") or "")[:240] or None} for c in calls[-lines:]]
        shown = f"outcomes {outcomes}\n" + "\n".join(json.dumps(c) for c in short)
        log = "\n".join(self.log_path.read_text().splitlines()[-30:])
        exited = "" if self.alive() else f" (exited with {self.proc.returncode})"
        garbage = f"\nnon-JSON lines: {self.garbage[:5]}" if self.garbage else ""
        return f"{' '.join(self.args[:4])}...{exited}: {len(calls)} calls, last:\n{shown}{garbage}\n--- client log ---\n{log}"

    def wait_for(self, predicate, timeout=20, what="condition", target=None, since=0.0):
        """Waits until predicate(calls since `since`) is true; returns that value."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if not self.alive():
                break
            last = predicate(self.calls(since=since, target=target))
            if last:
                return last
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value {last!r}\n{self.describe()}")

    def wait_serving(self, servers, target=None, timeout=20, settle=5, since=None):
        """Waits until `settle` consecutive calls succeed, each answered by one of `servers`.

        Returns the time stamp of the first of those calls: the moment the switch happened."""
        servers = set(servers)
        start = time.time() if since is None else since

        def settled(calls):
            run = 0
            for i in range(len(calls) - 1, -1, -1):
                if calls[i]["ok"] and calls[i]["server"] in servers:
                    run += 1
                else:
                    break
            return run >= settle and calls[len(calls) - run]["t"]

        return self.wait_for(settled, timeout=timeout, target=target, since=start, what=f"calls answered only by {sorted(servers)}")

    def first_answer(self, since, target=None):
        """When the first call started at or after `since` was answered (its end), or None."""
        for c in self.calls(since=since, target=target):
            if c["ok"]:
                return c["t"] + c.get("ms", 0) / 1000
        return None

    def window(self, seconds, target=None):
        """The calls made over the next `seconds`."""
        start = time.time()
        time.sleep(seconds)
        return [c for c in self.calls(since=start, target=target) if c["t"] < start + seconds]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        self.log.close()


# ---------------------------------------------------------------------------------------
# The client process itself.


def caller(grpc, target, interval, timeout, headers, out_lock):
    channel = grpc.insecure_channel(target)
    hello = channel.unary_unary(METHOD)
    next_call = time.time()
    while True:
        t = time.time()
        line = {"t": t, "target": target, "ok": False, "server": None, "code": None, "error": None}
        try:
            reply = hello(b"", timeout=timeout, metadata=headers or None)
            line.update(ok=True, server=reply.decode(), code="OK")
        except grpc.RpcError as e:
            line.update(code=e.code().name, error=e.details())
        line["ms"] = round((time.time() - t) * 1000, 3)
        with out_lock:
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
        next_call += interval
        time.sleep(max(0.0, next_call - time.time()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", default=[], help="xds:///NAME:PORT (repeat for several)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between calls")
    parser.add_argument("--timeout", type=float, default=1.0, help="deadline of each call, seconds")
    parser.add_argument("--header", action="append", default=[], help="KEY=VALUE gRPC metadata on every call (repeat for several)")
    args = parser.parse_args()
    if "GRPC_XDS_BOOTSTRAP" not in os.environ:
        sys.exit("xds_client: GRPC_XDS_BOOTSTRAP is not set")

    import grpc

    from greeter import exit_with_parent

    exit_with_parent()
    out_lock = threading.Lock()
    headers = [tuple(h.split("=", 1)) for h in args.header]

    def start(target):
        threading.Thread(target=caller, args=(grpc, target, args.interval, args.timeout, headers, out_lock), daemon=True).start()

    for target in args.target:
        start(target)
    for line in sys.stdin:
        words = line.split()
        if len(words) == 2 and words[0] == "call":
            start(words[1])
        elif words:
            print(f"xds_client: unknown command {line.strip()!r}", file=sys.stderr, flush=True)
    # Standard input closed: keep calling until killed.
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
