"""Shared fixtures for the end-to-end tests: a copy of the quickstart fleet on disk and a
real `meridian serve` process on free loopback ports, queried with real DNS clients.

The binary is target/release/meridian unless MERIDIAN_BIN says otherwise; tests/run builds
it before pytest starts.
"""

import json
import os
import random
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import dns.message
import dns.query
import dns.rdatatype
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MERIDIAN_BIN", ROOT / "target" / "release" / "meridian"))
QUICKSTART = ROOT / "examples" / "quickstart"

# The quickstart's clusters and the source addresses that belong to them (dnsClientCIDRs).
FROM_EU1 = "127.0.1.1"
FROM_EU2 = "127.0.2.1"
FROM_US1 = "127.0.3.1"
FROM_UNKNOWN = "127.0.9.9"


def _ephemeral_range():
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def metric(m, name, **labels):
    """The sum of meridian `m`'s samples of metric `name` whose labels include `labels`
    (0 when there are none)."""
    status, body = m.http("/metrics")
    assert status == 200, body
    total = 0.0
    for line in body.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def free_port():
    """A port free for both UDP and TCP on 127.0.0.1, chosen below the kernel's ephemeral range:
    a port the kernel handed out for bind(0) may be handed out again as the local port of some
    other process's outgoing connection (API servers, etcd, clients) before meridian binds it."""
    low, _ = _ephemeral_range()
    candidates = range(10000, low) if low > 12000 else range(low, 65536)
    for _ in range(200):
        port = random.choice(candidates)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            tcp.bind(("127.0.0.1", port))
            udp.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            udp.close()
            tcp.close()
        return port
    raise RuntimeError("no free port")


class Fleet:
    """A writable copy of a fleet directory (hub/ and clusters/)."""

    def __init__(self, root: Path):
        self.root = root
        self.config = root / "meridian.yaml"
        self.hub = root / "hub"
        self.clusters = root / "clusters"

    def cluster_dir(self, name):
        return self.clusters / name

    def write(self, relative, text):
        """Writes a file atomically (rename), as editors and kubectl-based sync tools do."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name("." + path.name + ".tmp")
        tmp.write_text(text)
        tmp.rename(path)

    def set_health(self, heartbeat=1, unreachable=2, withdraw=3):
        """Short health timings for every member, so failure tests run in seconds."""
        text = (self.hub / "members.yaml").read_text()
        text = text.replace(
            "  source: {directory:",
            f"  health: {{heartbeatSeconds: {heartbeat}, unreachableAfterSeconds: {unreachable}, withdrawAfterSeconds: {withdraw}}}\n  source: {{directory:",
        )
        self.write("hub/members.yaml", text)


class Meridian:
    """A running `meridian serve`: of a directory fleet (`fleet.config`, log in its root), or
    of any config file (`config=`, `log=`; fleet None), e.g. kube_fleet.py's. The listen
    ports are free ones unless `ports=(dns, admin, xds)`; they are passed as flags."""

    def __init__(self, fleet: Fleet | None, extra_args=(), env=None, *, config=None, log=None, ports=None,
                 ready_timeout=20, cwd=None):
        self.fleet = fleet
        self.cwd = cwd  # relative member paths on a Kubernetes hub resolve against it
        self.config = Path(config) if config is not None else fleet.config
        self.log = Path(log) if log is not None else fleet.root / "meridian.log"
        # Ports chosen here may still be taken by another process between the choice and the
        # bind; then meridian exits at once saying so, and it is started again on new ports.
        attempts = 1 if ports else 3
        for attempt in range(attempts):
            self.dns_port, self.admin_port, self.xds_port = ports or (free_port(), free_port(), free_port())
            self._start(extra_args, env)
            try:
                self.wait_ready(ready_timeout)
                return
            except RuntimeError:
                if attempt + 1 == attempts or "Address already in use" not in self.log.read_text():
                    raise
                self.proc.kill()
                self.proc.wait()

    def _start(self, extra_args, env):
        args = [
            str(BIN), "serve", "--config", str(self.config),
            "--dns-listen", f"127.0.0.1:{self.dns_port}",
            "--admin-listen", f"127.0.0.1:{self.admin_port}",
            "--xds-listen", f"127.0.0.1:{self.xds_port}",
            *extra_args,
        ]
        self.proc = subprocess.Popen(
            args, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, cwd=self.cwd,
            env={**os.environ, "MERIDIAN_LOG": "debug,hickory_server=info", **(env or {})},
        )

    def url(self, path):
        return f"http://127.0.0.1:{self.admin_port}{path}"

    def http(self, path):
        """(status, body) of a GET on the admin server."""
        try:
            with urllib.request.urlopen(self.url(path), timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_ready(self, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"meridian exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if self.http("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"meridian not ready after {timeout}s:\n{self.log.read_text()}")

    def query(self, name, rdtype="A", source=FROM_UNKNOWN, tcp=False, **make_kwargs):
        """A dnspython query; returns the response message."""
        q = dns.message.make_query(name, rdtype, **make_kwargs)
        q.flags &= ~dns.flags.RD
        if tcp:
            return dns.query.tcp(q, "127.0.0.1", port=self.dns_port, source=source, timeout=5)
        return dns.query.udp(q, "127.0.0.1", port=self.dns_port, source=source, timeout=5, ignore_trailing=False)

    def addresses(self, name, rdtype="A", source=FROM_UNKNOWN):
        r = self.query(name, rdtype, source=source)
        return sorted(rr.address for rrset in r.answer for rr in rrset)

    def wait_for(self, predicate, timeout=10, interval=0.05, what="condition"):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out waiting for {what}; last value {last!r}\n--- log tail ---\n{self.log_tail()}")

    def log_tail(self, lines=40):
        return "\n".join(self.log.read_text().splitlines()[-lines:])

    def stop(self):
        stop_process(self.proc)


def stop_process(proc):
    """Terminates a test peer, killing it if it does not exit within 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session", autouse=True)
def meridian_binary():
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: build it with `cargo build --release` (tests/run does)")
    return BIN


@pytest.fixture
def fleet(tmp_path):
    root = tmp_path / "fleet"
    shutil.copytree(QUICKSTART, root)
    return Fleet(root)


@pytest.fixture
def meridian(fleet):
    m = Meridian(fleet)
    yield m
    m.stop()


@pytest.fixture
def start_meridian():
    """Starts meridian on a fleet prepared by the test (e.g. with short health timings)."""
    started = []

    def start(fleet, *extra_args, env=None):
        m = Meridian(fleet, extra_args, env)
        started.append(m)
        return m

    yield start
    for m in started:
        m.stop()


@pytest.fixture(scope="session")
def greeter_servers(tmp_path_factory):
    """The greeter gRPC servers of every cluster (xds_fleet.SERVERS), in one subprocess."""
    from greeter import Greeters
    from xds_fleet import all_servers

    try:
        servers = Greeters(all_servers(), tmp_path_factory.mktemp("greeters") / "greeters.log")
    except RuntimeError as e:
        pytest.fail(str(e))
    yield servers
    servers.stop()


@pytest.fixture
def grpc_fleet(fleet):
    """The quickstart plus ap-1 and the exported gRPC service demo/greeter (xds_fleet.py)."""
    import xds_fleet

    return xds_fleet.prepare(fleet)


def wait_xds_listening(m, timeout=5):
    """Fails the test unless meridian accepts TCP connections on its xDS port."""
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", m.xds_port), timeout=1).close()
            return
        except OSError as e:
            if time.time() > deadline:
                pytest.fail(
                    f"meridian does not accept connections on --xds-listen 127.0.0.1:{m.xds_port} ({e}); "
                    f"is {BIN} a build with the xDS server?\n--- log tail ---\n{m.log_tail()}"
                )
            time.sleep(0.05)


@pytest.fixture
def xds_meridian(grpc_fleet, greeter_servers, start_meridian):
    """meridian serving DNS and xDS for grpc_fleet, with the greeter servers running."""
    m = start_meridian(grpc_fleet)
    wait_xds_listening(m)
    return m


@pytest.fixture
def xds_clients():
    """Collects the xDS client processes a test starts (xds_client.XdsClient) and stops them."""
    started = []

    def add(client):
        started.append(client)
        return client

    yield add
    for client in started:
        client.stop()


def built_peer(env_var, script, what, timeout=1800):
    """The executable a tests/peers script builds: `env_var` when tests/run passed it, else
    the script is run (a first build downloads and compiles). Fails, never skips."""
    given = os.environ.get(env_var)
    if given:
        if not os.access(given, os.X_OK):
            pytest.fail(f"{env_var}={given} is not an executable file")
        return given
    try:
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script} did not finish within {timeout}s")
    if out.returncode != 0:
        pytest.fail(f"cannot build {what} with {script} (exit {out.returncode}):\n{out.stderr[-4000:]}")
    path = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"{script} printed no executable path: {out.stdout!r}\n{out.stderr[-2000:]}")
    return path


def peer_module_binary(env_var, script, binary, what, timeout=1800):
    """An executable of a Go test-peer module (tests/peers/NAME.sh, via gomodule.sh): in the
    directory `env_var` names when tests/run built it, else in the one the script prints.
    Fails, never skips."""
    directory = os.environ.get(env_var)
    if not directory:
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            pytest.fail(f"cannot build {what} with {script}:\n{out.stderr[-3000:]}")
        directory = out.stdout.strip().splitlines()[-1]
    path = Path(directory) / binary
    if not os.access(path, os.X_OK):
        pytest.fail(f"no {binary} executable in {directory}")
    return str(path)


def pinned_module_dir(peer: Path, module: str) -> Path:
    """The source of Go module `module` at the version the peer's go.mod pins (its CRDs)."""
    version = re.search(rf"{re.escape(module)} (v\S+)", (peer / "go.mod").read_text()).group(1)
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"],
                         capture_output=True, text=True, timeout=600, cwd=peer)
    if out.returncode != 0:
        pytest.fail(f"go mod download {module}@{version}:\n{out.stdout}{out.stderr}")
    return Path(json.loads(out.stdout)["Dir"])


def require_tool(name):
    """Fails loudly (never skips) when a test peer is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; tests/run installs the test peers (apt-get install ...)")
    return path


# Kubernetes: one hub and three members on real kube-apiservers (kube_fleet.py).
@pytest.fixture(scope="session")
def kube_fleet_session(tmp_path_factory):
    """The clusters of kube_fleet.KubeFleet, started once per session (about 5 s)."""
    import kube_fleet

    try:
        fleet = kube_fleet.KubeFleet(tmp_path_factory.mktemp("kube"), audit=kube_fleet.SHARED_AUDIT_POLICY).start()
    except Exception as e:  # noqa: BLE001 - a missing peer or a bad manifest fails loudly
        pytest.fail(f"cannot start the Kubernetes fleet: {e}")
    yield fleet
    fleet.stop()


@pytest.fixture
def kube_fleet(kube_fleet_session):
    """The session's Kubernetes fleet, reset to its starting state (KubeFleet.reset); any
    meridian started on it (kube_fleet.start_meridian) is stopped after the test."""
    kube_fleet_session.reset()
    yield kube_fleet_session
    kube_fleet_session.stop_meridians()


@pytest.fixture
def kube_meridian(kube_fleet):
    """`meridian serve` with the Kubernetes fleet's hub (one replica, named "meridian")."""
    return kube_fleet.start_meridian()


def _openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, f"openssl {' '.join(args)}: {r.stderr}"


def make_certs(d):
    """A self-signed CA and a server certificate for IP 127.0.0.1 (clients check the
    subjectAltName), with openssl as kube_cluster.py makes the API servers'. Returns
    (ca.crt, server.crt, server.key)."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=d)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj", "/CN=meridian-e2e-webhook-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-out", "ca.crt", cwd=d)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "server.key", cwd=d)
    _openssl("req", "-new", "-key", "server.key", "-subj", "/CN=127.0.0.1", "-out", "server.csr", cwd=d)
    (d / "server.ext").write_text("basicConstraints=critical,CA:FALSE\n"
                                  "keyUsage=critical,digitalSignature,keyEncipherment\n"
                                  "extendedKeyUsage=serverAuth\n"
                                  "subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-sha256",
             "-days", "2", "-extfile", "server.ext", "-out", "server.crt", cwd=d)
    return d / "ca.crt", d / "server.crt", d / "server.key"


def https_server(handler, cert, key, name):
    """A ThreadingHTTPServer on 127.0.0.1 serving `handler` over TLS with `cert`/`key`, in a
    daemon thread of the test process. Returns (server, port); `server.shutdown()` stops it."""
    import ssl
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    # The handshake happens in the handler's thread (on its first read), not in accept().
    server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server, server.server_address[1]
