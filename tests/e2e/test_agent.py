"""Pull-mode agents (`meridian agent`, DESIGN §12) on real kube-apiservers: members the hub
holds no credential for join with a bootstrap token and stream their objects over mutual TLS.

The shared fleet (kube_fleet.py): m1 stays a push member (the hub's kubeconfig); m2 (and m3,
for the identity test) become agent members (`source: {agent: {}}`). Each agent runs as the
ServiceAccount deploy/rbac/agent.yaml makes in its member (a TokenRequest token): it only
reads what it streams and writes what the write-back puts there. The hub keeps the agent CA
and tokens in Secrets of meridian-system (deploy/rbac/hub-agents.yaml lets it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import BIN, FROM_UNKNOWN, ROOT, Meridian, free_port, stop_process
from kube_fleet import HUB_NAMESPACE, NAMESPACE, wait_for
from test_kube_faults import FreezableProxy

AGENT_RBAC = ROOT / "deploy" / "rbac" / "agent.yaml"
AGENT_SA = "meridian-agent"
AGENT_STATE_SECRET = "meridian-agent-state"  # deploy/rbac/agent.yaml lets the agent keep this one
NAME = "cart.shop.global"


class Agent:
    """`meridian agent` for one member, logging to ROOT/agent-NAME-N.log."""

    def __init__(self, fleet, member: str, hub_port: int | str, *, token: str | None, state_dir: Path | None = None,
                 kubeconfig: Path, ca_file: Path, cluster: str | None = None, state_secret: str | None = None):
        self.log = fleet.root / f"agent-{member}-{time.monotonic_ns()}.log"
        self.admin_port = free_port()
        state = ["--state-dir", str(state_dir)] if state_dir else ["--state-secret", state_secret]
        hub = hub_port if isinstance(hub_port, str) else f"127.0.0.1:{hub_port}"  # str: --hub as is
        args = [str(BIN), "agent", "--hub", hub, "--cluster", cluster or member, *state,
                "--kubeconfig", str(kubeconfig), "--hub-ca-file", str(ca_file),
                "--admin-listen", f"127.0.0.1:{self.admin_port}"]
        if token is not None:
            token_file = fleet.root / f"{member}-{time.monotonic_ns()}.token"
            token_file.write_text(token + "\n")
            args += ["--bootstrap-token-file", str(token_file)]
        self.proc = subprocess.Popen(args, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, "MERIDIAN_LOG": "debug,kube=info,hyper=info,h2=info,tower=info"})

    def text(self) -> str:
        return self.log.read_text()

    def admin(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=5) as r:
            return r.read().decode()

    def exited(self, timeout: float = 20) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self):
        stop_process(self.proc)


@pytest.fixture
def agents(kube_fleet):
    """Starts agents; stops them (and puts m2, m3 back as push members) after the test."""
    started: list[Agent] = []

    def start(*args, **kwargs) -> Agent:
        a = Agent(kube_fleet, *args, **kwargs)
        started.append(a)
        return a

    yield start
    for a in started:
        a.stop()


def agent_kubeconfig(fleet, member: str) -> Path:
    """A kubeconfig for `member` as ServiceAccount meridian-system/meridian-agent (the RBAC of
    deploy/rbac/agent.yaml), with a token from the TokenRequest API."""
    return fleet.service_account_kubeconfig(member, AGENT_RBAC, AGENT_SA,
                                            fleet.kubeconfig_dir / f"{member}-agent.kubeconfig")


def agent_member(fleet, member: str) -> None:
    fleet.register_member(member, source={"agent": {}})


def start_hub(fleet, agent_port: int, **extra):
    fleet.grant_agents()  # deploy/rbac/hub-agents.yaml: the hub's agent CA and token Secrets
    return fleet.start_meridian(agent={"listen": f"127.0.0.1:{agent_port}", **extra})


def token_create(config: Path, member: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), "token", "create", "--config", str(config), "--cluster", member, *args],
                          capture_output=True, text=True, timeout=30)


def make_token(fleet, member: str, ttl: str = "10m") -> str:
    """`meridian token create` on the config of the running hub."""
    out = token_create(fleet.root / "meridian.yaml", member, "--ttl", ttl)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert len(token) == 23 and token[6] == ".", token
    return token


def hub_ca(fleet) -> Path:
    """The agent CA the hub made (Secret meridian-agent-ca), as the operator hands it out."""
    secret = fleet.hub.get("v1", "Secret", "meridian-agent-ca", HUB_NAMESPACE)
    assert secret is not None, "the hub made no agent CA"
    path = fleet.root / "agent-ca.crt"
    path.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    return path


def cluster(m, name: str) -> dict:
    clusters = yaml.safe_load(m.http("/debug/clusters")[1])["clusters"]
    return next(c for c in clusters if c["name"] == name)


def publish_cart(fleet, member: str, addresses) -> None:
    fleet.publish(member, "cart", addresses)
    fleet.export(member, "cart")


def test_agents_join_with_a_token_and_serve_beside_a_push_member_and_bad_tokens_and_identities_are_refused(
        kube_fleet, agents, tmp_path):
    f = kube_fleet
    audited_before = len(f.audit_events("m2"))
    publish_cart(f, "m1", ["10.1.0.1"])
    publish_cart(f, "m2", ["10.2.0.1"])
    publish_cart(f, "m3", ["10.3.0.1"])
    agent_member(f, "m2")
    agent_member(f, "m3")
    port = free_port()
    m = start_hub(f, port)
    # The agent members have no agent yet: m1 alone answers, and the others say why.
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"], what="m1's cart alone")
    assert "no agent has connected" in cluster(m, "m2")["reason"]

    ca = hub_ca(f)
    kubeconfig = agent_kubeconfig(f, "m2")
    state = tmp_path / "m2-state"
    token = make_token(f, "m2")
    # m1 reads its member's API itself: a token for it would admit an agent the hub refuses,
    # so none is made unless asked for (a member about to be registered).
    push = token_create(f.root / "meridian.yaml", "m1")
    assert push.returncode != 0 and "no MemberCluster m1 with `source: {agent: {}}`" in push.stderr, push.stderr
    assert token_create(f.root / "meridian.yaml", "m9", "--new-member").returncode == 0
    agent = agents("m2", port, token=token, state_dir=state, kubeconfig=kubeconfig, ca_file=ca)
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.2.0.1"], timeout=20,
               what="m2's cart through its agent")
    # Served from the relist on; Healthy with the agent's first heartbeat on the new stream.
    m.wait_for(lambda: cluster(m, "m2")["health"] == "Healthy", timeout=10, what="m2 Healthy")
    assert sorted(p.name for p in state.iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
    assert oct(os.stat(state / "key.pem").st_mode & 0o777) == "0o600"
    # Changes stream through: a new endpoint, then the service gone from m2.
    f.publish("m2", "cart", ["10.2.0.1", "10.2.0.2"])
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.2.0.1", "10.2.0.2"], what="m2's new endpoint")
    dump = m.http("/debug/xds/dump?cluster=m1&network=net1&role=proxyless")[1]
    assert "10.2.0.2" in dump, "xDS carries the agent member's endpoints too"
    # The write-back reaches the agent member through its agent (the hub has no credential
    # for m2): the ServiceImport with both clusters, and m2's export marked Valid.
    imported = wait_for(lambda: import_clusters(f, "m2", "cart") == ["m1", "m2"] and f.service_import("m2", "cart"),
                        timeout=20, what="the ServiceImport written by m2's agent")
    assert imported["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "meridian"
    # m2's audit log: every ServiceImport write of this test was the agent's ServiceAccount.
    writers = {(e["user"]["username"], e["responseStatus"]["code"])
               for e in f.audit_events("m2")[audited_before:]
               if e["objectRef"].get("resource") == "serviceimports" and e["stage"] == "ResponseComplete"}
    assert writers and {user for user, _ in writers} == {"system:serviceaccount:meridian-system:meridian-agent"}, writers
    assert all(code < 300 for _, code in writers), writers
    valid = wait_for(lambda: f.export_condition("m2", "cart", "Valid"), timeout=20, what="m2's export condition")
    assert valid["status"] == "True", valid
    # /debug/agents and `meridian status` show the agent.
    agents_view = yaml.safe_load(m.http("/debug/agents")[1])["agents"]
    assert agents_view["m2"]["connected"] is True
    assert agents_view["m2"]["certificateExpires"] > time.time() + 3600
    assert agents_view["m3"] == {"connected": False, "note": "no agent has connected"}
    status = subprocess.run([str(BIN), "status", "--admin", f"127.0.0.1:{m.admin_port}"],
                            capture_output=True, text=True, timeout=30)
    assert "m2: connected, certificate expires in" in status.stdout, status.stdout
    assert "m3: not connected" in status.stdout, status.stdout
    # The agent's own admin server: its stream, what it sent, its certificate.
    assert json.loads(agent.admin("/debug"))["agent"]["connected"] is True
    agent_metrics = metric_values(agent.admin("/metrics"))
    assert agent_metrics["meridian_agent_connected"] == 1
    assert agent_metrics["meridian_agent_events_sent_total"] >= 10, agent_metrics
    # The hub's writes went down the stream as API requests the agent carried.
    assert agent_metrics["meridian_agent_api_requests_total"] >= 2, agent_metrics
    assert metric_values(m.http("/metrics")[1])["meridian_agent_api_requests_total"] >= 2
    assert agent_metrics["meridian_agent_certificate_expiry_timestamp_seconds"] > time.time() + 3600

    # The token is spent: a second agent presenting it is refused and stops with the reason.
    again = agents("m2", port, token=token, state_dir=tmp_path / "again", kubeconfig=kubeconfig, ca_file=ca)
    assert again.exited() != 0
    assert "already used" in again.text(), again.text()
    # An expired token is refused.
    stale = make_token(f, "m3", ttl="1s")
    time.sleep(2)
    late = agents("m3", port, token=stale, state_dir=tmp_path / "late", kubeconfig=agent_kubeconfig(f, "m3"),
                  ca_file=ca)
    assert late.exited() != 0
    assert "expired" in late.text(), late.text()
    # m2's certificate speaking for m3: refused and logged on both sides, and m2's own
    # stream is not displaced; nothing of m3's is served.
    stolen = tmp_path / "stolen"
    shutil.copytree(state, stolen)
    impostor = agents("m3", port, token=None, state_dir=stolen, kubeconfig=agent_kubeconfig(f, "m3"), ca_file=ca)
    wait_for(lambda: "a certificate for cluster m2 sent objects of cluster m3" in impostor.text(), timeout=20,
             what="the impostor's refusal in its log")
    assert "a certificate for cluster m2 sent objects of cluster m3" in m.log.read_text()
    assert m.addresses(NAME) == ["10.1.0.1", "10.2.0.1", "10.2.0.2"]
    assert cluster(m, "m2")["health"] == "Healthy"
    assert agent.proc.poll() is None
    hub_metrics = metric_values(m.http("/metrics")[1])
    assert hub_metrics['meridian_agent_joins_total{result="admitted"}'] == 1, hub_metrics
    assert hub_metrics['meridian_agent_joins_total{result="refused"}'] >= 2, hub_metrics
    assert hub_metrics['meridian_agent_streams_refused_total{reason="impersonation"}'] >= 1, hub_metrics
    assert hub_metrics["meridian_agent_streams"] == 1, hub_metrics
    # The agent's identity in its member (deploy/rbac/agent.yaml): the write-back's kinds, no
    # Secrets, no workloads.
    for verb, resource, group, allowed in (("watch", "services", "", True),
                                           ("create", "serviceimports", "multicluster.x-k8s.io", True),
                                           ("get", "secrets", "", False),
                                           ("create", "deployments", "apps", False)):
        status, review = f.cluster("m2").request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
             "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                             "namespace": "shop"}}},
            token=kubeconfig_token(kubeconfig))
        assert status == 201, review
        assert review["status"]["allowed"] is allowed, (verb, resource, review)


def import_clusters(fleet, member: str, name: str) -> list[str]:
    si = fleet.service_import(member, name) or {}
    return sorted(c["cluster"] for c in (si.get("status") or {}).get("clusters") or [])


def metric_values(text: str) -> dict[str, float]:
    """`name{labels} value` lines of an OpenMetrics text, by `name{labels}`."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


def kubeconfig_token(path: Path) -> str:
    return yaml.safe_load(path.read_text())["users"][0]["user"]["token"]


def test_a_cut_agent_is_unreachable_then_withdrawn_and_comes_back_current_and_certificates_rotate(
        kube_fleet, agents, tmp_path):
    f = kube_fleet
    publish_cart(f, "m1", ["10.1.0.1"])
    publish_cart(f, "m2", ["10.2.0.1"])
    agent_member(f, "m2")
    port = free_port()
    m = start_hub(f, port, certificateLifetimeSeconds=60)
    proxy = FreezableProxy(port)
    ca = hub_ca(f)
    kubeconfig = agent_kubeconfig(f, "m2")
    state = tmp_path / "m2-state"
    agent = agents("m2", proxy.port, token=make_token(f, "m2"), state_dir=state, kubeconfig=kubeconfig,
                   ca_file=ca)
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.2.0.1"], timeout=20, what="m2 through its agent")
    joined = time.monotonic()

    # Cut: the stream goes silent. Unreachable within unreachableAfterSeconds (3) of the last
    # heartbeat, withdrawn after the grace (6); m2 changes meanwhile.
    proxy.freeze()
    cut = time.monotonic()
    m.wait_for(lambda: cluster(m, "m2")["health"] == "Unreachable", timeout=10, what="m2 unreachable")
    assert time.monotonic() - cut < 6
    f.publish("m2", "cart", ["10.2.0.9"])
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1"], timeout=15, what="m2 withdrawn")
    assert cluster(m, "m2")["withdrawn"] is True
    # Back: the agent reconnects and relists; the stale endpoint never comes back.
    proxy.cut()
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.2.0.9"], timeout=40, what="m2 back, current")
    assert cluster(m, "m2")["health"] == "Healthy"

    # The hub restarts: the agent reconnects with the certificate it has (the CA is kept in
    # its Secret) and nothing in m2 was deleted.
    wait_for(lambda: import_clusters(f, "m2", "cart") == ["m1", "m2"], timeout=20, what="m2's ServiceImport")
    m.stop()
    f.meridians.remove(m)
    time.sleep(2)
    assert import_clusters(f, "m2", "cart") == ["m1", "m2"], "the hub being down deletes nothing in m2"
    m = start_hub(f, port, certificateLifetimeSeconds=60)
    m.wait_for(lambda: m.addresses(NAME) == ["10.1.0.1", "10.2.0.9"], timeout=40, what="m2 after the hub's restart")
    assert f.cluster("m2").get("v1", "Service", "cart", "shop") is not None
    assert import_clusters(f, "m2", "cart") == ["m1", "m2"]
    assert agent.proc.poll() is None

    # 60-second certificates: renewed at 75–80 % of their life counted from the signing (45 to
    # 48 s; the certificate is valid from a minute before it), twice within about 100 s of the
    # join, while DNS answers m2's endpoint without a gap.
    failures: list[str] = []
    stop = threading.Event()

    def query_steadily():
        while not stop.is_set():
            try:
                got = m.addresses(NAME, source=FROM_UNKNOWN)
                if got != ["10.1.0.1", "10.2.0.9"]:
                    failures.append(f"{time.monotonic() - joined:.1f}s: {got}")
            except Exception as e:  # noqa: BLE001 - every failed answer counts
                failures.append(f"{time.monotonic() - joined:.1f}s: {e!r}")
            time.sleep(0.25)

    querier = threading.Thread(target=query_steadily, daemon=True)
    querier.start()
    try:
        wait_for(lambda: agent.text().count("certificate renewed") >= 2, timeout=max(10, 120 - (time.monotonic() - joined)),
                 what="two renewals in the agent's log")
        renewed_at = time.monotonic() - joined
    finally:
        stop.set()
        querier.join(5)
    assert failures == [], failures
    # Neither renewal came at half the life (the backdate counted): the second is at least
    # 2 × 45 s after the first signing, a few seconds before `joined` (counted from the
    # backdate, it would be at most 72 s).
    assert renewed_at >= 78, renewed_at
    renewed = yaml.safe_load(m.http("/debug/agents")[1])["agents"]["m2"]
    assert renewed["connected"] is True
    assert "certificate renewed" in m.log.read_text()
    # The hub shows the certificate the agent holds now, not the one its stream opened with
    # (which expired about 40 s ago).
    held = metric_values(agent.admin("/metrics"))["meridian_agent_certificate_expiry_timestamp_seconds"]
    assert renewed["certificateExpires"] == held > time.time(), (renewed, held)


def test_a_directory_hub_keeps_the_agent_ca_and_tokens_in_its_state_dir_and_joins_wait_for_approval(
        kube_fleet, agents, tmp_path):
    """The other store: a directory hub (no API to keep Secrets in) keeps the agent CA and the
    tokens as files under agent.stateDir; with agent.autoApprove: false the join waits, shown
    in /debug/agents, until `meridian approve m2`; then m2 is served as on a Kubernetes hub."""
    f = kube_fleet
    publish_cart(f, "m2", ["10.2.0.1"])
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    (hub_dir / "m2.yaml").write_text(yaml.safe_dump(f.member_cluster_manifest("m2", source={"agent": {}})))
    state = tmp_path / "agent-state"
    port = free_port()
    config = tmp_path / "meridian.yaml"
    config.write_text(yaml.safe_dump({
        "hub": {"directory": str(hub_dir)},
        "agent": {"listen": f"127.0.0.1:{port}", "stateDir": str(state), "autoApprove": False},
        "dns": {"zones": [{"name": "global", "style": "global"}], "ttl": 5},
    }))
    m = Meridian(None, config=config, log=tmp_path / "meridian.log")
    try:
        assert oct((state / "ca.key").stat().st_mode & 0o777) == "0o600"
        out = token_create(config, "m2")
        assert out.returncode == 0, out.stderr
        token = out.stdout.strip()
        kept = state / "tokens" / f"{token[:6]}.json"
        assert json.loads(kept.read_text())["used"] is False
        assert oct(kept.stat().st_mode & 0o777) == "0o600"
        approve = [str(BIN), "approve", "--config", str(config), "m2"]
        early = subprocess.run(approve, capture_output=True, text=True, timeout=30)
        assert early.returncode != 0 and "no join of cluster m2 is waiting" in early.stderr, early.stderr
        # This agent keeps its state in a Secret of its member (as one in a pod would).
        m2 = f.cluster("m2")
        m2.delete("v1", "Secret", AGENT_STATE_SECRET, HUB_NAMESPACE)
        kubeconfig = agent_kubeconfig(f, "m2")

        def start_agent(with_token: bool) -> Agent:
            return agents("m2", port, token=token if with_token else None, kubeconfig=kubeconfig,
                          ca_file=state / "ca.crt", state_secret=f"{HUB_NAMESPACE}/{AGENT_STATE_SECRET}")

        def kept_in_secret() -> set[str]:
            secret = m2.get("v1", "Secret", AGENT_STATE_SECRET, HUB_NAMESPACE) or {}
            return set(secret.get("data") or {})

        agent = start_agent(with_token=True)

        def waiting():
            return json.loads(m.http("/debug/agents")[1])["waitingForApproval"]
        m.wait_for(lambda: len(waiting()) == 1, timeout=20, what="m2's join waiting for approval")
        [asked] = waiting()
        assert asked["cluster"] == "m2" and asked["token"] == token[:6], asked
        assert asked["key"].startswith("sha256:") and len(asked["key"]) == 7 + 64, asked
        record = json.loads(kept.read_text())
        assert record["used"] is False and record["approved"] is False, record
        assert "sha256:" + record["request_key"] == asked["key"], record
        # Waiting, nothing is served for m2, and the agent says why it waits.
        time.sleep(4)
        assert m.addresses(NAME) == [], "an unapproved agent is served"
        assert "waits for the hub's approval" in agent.text()
        assert 'meridian_agent_joins_total{result="pending"}' in m.http("/metrics")[1]
        # The key asking is kept before it is sent: restarted while waiting, the agent asks
        # with the same key (another key would be refused).
        assert kept_in_secret() == {"key.pem"}
        agent.stop()
        agent = start_agent(with_token=True)
        wait_for(lambda: agent.text().count("waits for the hub's approval") >= 1, timeout=20,
                 what="the restarted agent waiting with its kept key")
        assert "another key" not in agent.text() and [a["key"] for a in waiting()] == [asked["key"]]
        approved = subprocess.run(approve, capture_output=True, text=True, timeout=30)
        assert approved.returncode == 0, approved.stderr
        assert asked["key"] in approved.stdout and "cluster m2" in approved.stdout, approved.stdout
        m.wait_for(lambda: m.addresses(NAME) == ["10.2.0.1"], timeout=20, what="m2 through its agent")
        record = json.loads(kept.read_text())
        assert record["used"] is True and record["approved"] is True, "the join spent the approved token"
        assert waiting() == []
        assert kept_in_secret() == {"key.pem", "cert.pem", "ca.pem"}
        # Restarted with no token at all (it was spent), the agent reconnects with what its
        # Secret keeps.
        agent.stop()
        f.publish("m2", "cart", ["10.2.0.1", "10.2.0.2"])
        start_agent(with_token=False)
        m.wait_for(lambda: m.addresses(NAME) == ["10.2.0.1", "10.2.0.2"], timeout=30,
                   what="m2 through its restarted agent")
        # A token is made only for a cluster name (a DNS label) ...
        bad = token_create(config, "Not_A_Name")
        assert bad.returncode != 0 and "is not a cluster name" in bad.stderr, bad.stderr
        # ... that the hub directory names as an agent member, unless asked to (one to come).
        unnamed = token_create(config, "m3")
        assert unnamed.returncode != 0 and "pass --new-member" in unnamed.stderr, unnamed.stderr
        assert token_create(config, "m3", "--new-member").returncode == 0
    finally:
        m.stop()


SWARM_BIN = BIN.parent / "meridian-agent-swarm"  # built beside meridian (Cargo.toml [[bin]])
SWARM = 200
SWARM_RBAC = Path(__file__).parent / "swarm-rbac.yaml"  # read-only: see the file


def swarm_kubeconfig(fleet, member: str, tmp_path: Path) -> Path:
    return fleet.service_account_kubeconfig(member, SWARM_RBAC, "meridian-swarm", tmp_path / "swarm.kubeconfig")


def test_two_hundred_agents_joining_at_once_converge_and_reconnect_at_a_bounded_rate_after_a_hub_restart(
        kube_fleet, tmp_path):
    """200 agents (one process, `meridian-agent-swarm`: the real member side each) join a
    directory hub at once: every one is admitted, connected and served (the service m2 exports
    is backed by all 200 clusters). Restarted, the hub admits their reconnects at
    agent.admissionPerSecond (streams wait), and every agent is back without joining again."""
    assert SWARM_BIN.exists(), f"{SWARM_BIN} is not built (cargo build builds it beside meridian)"
    f = kube_fleet
    publish_cart(f, "m2", ["10.2.0.1"])
    names = [f"swarm-{i:03d}" for i in range(SWARM)]
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    (hub_dir / "swarm.yaml").write_text(yaml.safe_dump_all(
        [f.member_cluster_manifest(n, source={"agent": {}}, labels={}, network={"name": n}) for n in names]))
    state, port = tmp_path / "hub-state", free_port()
    config = tmp_path / "meridian.yaml"
    config.write_text(yaml.safe_dump({
        "hub": {"directory": str(hub_dir)},
        "agent": {"listen": f"127.0.0.1:{port}", "stateDir": str(state), "admissionPerSecond": 50},
        "dns": {"zones": [{"name": "global", "style": "global"}], "ttl": 5},
    }))
    m = Meridian(None, config=config, log=tmp_path / "meridian.log")
    swarm = None
    try:
        tokens = tmp_path / "tokens"
        tokens.mkdir()
        for n in names:
            out = token_create(config, n)
            assert out.returncode == 0, out.stderr
            (tokens / f"{n}.token").write_text(out.stdout)
        swarm_log = tmp_path / "swarm.log"
        swarm = subprocess.Popen(
            [str(SWARM_BIN), "--hub", f"127.0.0.1:{port}", "--hub-ca-file", str(state / "ca.crt"),
             "--kubeconfig", str(swarm_kubeconfig(f, "m2", tmp_path)), "--tokens", str(tokens),
             "--state-root", str(tmp_path / "agents")],
            stdout=subprocess.DEVNULL, stderr=open(swarm_log, "w"))

        def connected() -> int:
            agents = json.loads(m.http("/debug/agents")[1])["agents"]
            return sum(1 for a in agents.values() if a["connected"])

        def backends() -> set[str]:
            services = json.loads(m.http("/debug/services")[1])["services"]
            cart = [s for s in services if s["service"] == "shop/cart"]
            return {c["cluster"] for c in cart[0]["clusters"]} if cart else set()

        m.wait_for(lambda: connected() == SWARM, timeout=120, interval=0.5, what=f"{SWARM} agents connected")
        m.wait_for(lambda: backends() == set(names), timeout=60, interval=0.5,
                   what="shop/cart backed by every agent's cluster")
        assert m.addresses(NAME) == ["10.2.0.1"]
        hub = metric_values(m.http("/metrics")[1])
        assert hub['meridian_agent_joins_total{result="admitted"}'] == SWARM, hub
        assert hub["meridian_agent_streams"] == SWARM, hub

        m.stop()
        m = Meridian(None, config=config, log=tmp_path / "meridian-2.log")
        m.wait_for(lambda: connected() == SWARM, timeout=120, interval=0.5, what="every agent back")
        m.wait_for(lambda: backends() == set(names), timeout=60, interval=0.5,
                   what="shop/cart backed by every agent's cluster again")
        hub = metric_values(m.http("/metrics")[1])
        assert 'meridian_agent_joins_total{result="admitted"}' not in hub, "agents rejoined instead of reconnecting"
        # Joins are one at a time, so the first streams trickled in; reconnects come at once
        # and queue behind 50 a second.
        assert hub["meridian_agent_admission_waits_total"] > 0, \
            f"{SWARM} reconnects at once must queue behind a rate of 50/s"
        assert hub["meridian_agent_streams"] == SWARM
        assert swarm.poll() is None, swarm_log.read_text()[-3000:]
        assert "stopped" not in swarm_log.read_text(), swarm_log.read_text()[-3000:]
    finally:
        if swarm is not None:
            stop_process(swarm)
        m.stop()


def test_a_workload_placed_in_an_agent_member_is_written_watched_and_removed_through_its_agent(
        kube_fleet, agents, tmp_path):
    """Propagation into an agent member: the hub holds no credential for m2, so its writes and
    watches go down m2's agent stream, and m2's RBAC for the *agent* decides — refused until
    the agent's ServiceAccount has the propagation role, then applied (by the agent, says the
    audit log), its status read back through the agent's watch and summed on the hub, scaled,
    and deleted when the policy goes."""
    from test_kube_propagation import (deployment, divided, member_replicas, placement,
                                       write_status)
    f = kube_fleet
    f.grant_propagation()  # m1 (push): User meridian; m2 gets its agent's binding below
    audited_before = len(f.audit_events("m2"))
    agent_member(f, "m2")
    port = free_port()
    m = start_hub(f, port)
    agents("m2", port, token=make_token(f, "m2"), state_dir=tmp_path / "m2-state",
           kubeconfig=agent_kubeconfig(f, "m2"), ca_file=hub_ca(f))
    m.wait_for(lambda: cluster(m, "m2")["health"] == "Healthy", timeout=20, what="m2's agent connected")

    f.hub.apply(deployment("web", 4))
    f.policy("web", divided("web", {"m1": 1, "m2": 1}))
    # m1 gets its half; m2's agent may not write Deployments yet: the member's answer (403,
    # naming the agent's ServiceAccount) comes back to the hub.
    wait_for(lambda: member_replicas(f, "web") == {"m1": 2}, timeout=20, what="m1's half", log=m)
    agent_user = "system:serviceaccount:meridian-system:meridian-agent"
    wait_for(lambda: agent_user in m.http("/debug/placements")[1] + m.log.read_text(), timeout=20,
             what="m2's refusal of the agent's write (naming the agent's user), seen on the hub", log=m)
    assert member_replicas(f, "web") == {"m1": 2}
    try:
        f.cluster("m2").apply({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "meridian-member-propagation"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "meridian-member-propagation"},
            "subjects": [{"kind": "ServiceAccount", "name": "meridian-agent", "namespace": HUB_NAMESPACE}]})
        wait_for(lambda: member_replicas(f, "web") == {"m1": 2, "m2": 2}, timeout=30,
                 what="m2's half, written through its agent once RBAC allows", log=m)
        writers = {e["user"]["username"] for e in f.audit_events("m2")[audited_before:]
                   if e["objectRef"].get("resource") == "deployments" and e["stage"] == "ResponseComplete"
                   and e["responseStatus"]["code"] < 300}
        assert writers == {agent_user}, writers
        # The members report: m2's status reaches the hub through the agent's watch.
        write_status(f, "m1", "web", 2)
        write_status(f, "m2", "web", 1)
        wait_for(lambda: (f.hub.get("apps/v1", "Deployment", "web", NAMESPACE).get("status") or {})
                 .get("readyReplicas") == 3, timeout=20, what="the hub's status summed over m1 and m2", log=m)
        record = wait_for(lambda: placement(f, "web"), timeout=10, what="the Placement of web")
        assert record["spec"]["summary"] == "m1=2,m2=2", record["spec"]
        # A new size is written through the agent too; the policy gone, m2's copy goes.
        f.hub.apply(deployment("web", 6))
        wait_for(lambda: member_replicas(f, "web") == {"m1": 3, "m2": 3}, timeout=20, what="6 as 3/3", log=m)
        f.hub.delete("meridian.io/v1alpha1", "ClusterSchedulingPolicy", "web", NAMESPACE)
        wait_for(lambda: member_replicas(f, "web") == {}, timeout=30,
                 what="both copies deleted once nothing places web", log=m)
    finally:
        f.revoke_propagation()  # m2's binding (the agent's) too: it has the same name


def test_an_agent_holds_a_stream_to_every_hub_replica_and_the_next_leader_writes_through_its_own(
        kube_fleet, agents, tmp_path):
    """Two hub replicas (leader election), each with an agent listener of its own; the agent is
    given both (`--hub A,B`, as a headless Service's name resolves to every replica) and holds
    a stream to each: both replicas hear m2 and serve its endpoints, and when the leader dies
    the next one writes m2 at once through the stream it already holds."""
    f = kube_fleet
    publish_cart(f, "m1", ["10.1.0.1"])
    publish_cart(f, "m2", ["10.2.0.1"])
    agent_member(f, "m2")
    port_a, port_b = free_port(), free_port()
    a = start_hub(f, port_a)
    wait_for(lambda: f.lease_holder() == "meridian", timeout=15, what="A leads", log=a)
    b = f.start_meridian("meridian-2", agent={"listen": f"127.0.0.1:{port_b}"})
    agent = agents("m2", f"127.0.0.1:{port_a},127.0.0.1:{port_b}", token=make_token(f, "m2"),
                   state_dir=tmp_path / "m2-state", kubeconfig=agent_kubeconfig(f, "m2"), ca_file=hub_ca(f))
    for replica in (a, b):
        replica.wait_for(lambda r=replica: r.addresses(NAME) == ["10.1.0.1", "10.2.0.1"], timeout=20,
                         what="m2's cart through its agent, on each replica")
        assert cluster(replica, "m2")["health"] == "Healthy"
        assert metric_values(replica.http("/metrics")[1])["meridian_agent_streams"] == 1
    assert metric_values(agent.admin("/metrics"))["meridian_agent_connected"] == 2
    assert sorted(json.loads(agent.admin("/debug"))["agent"]["streams"]) == sorted(
        [f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"])
    wait_for(lambda: import_clusters(f, "m2", "cart") == ["m1", "m2"], timeout=20,
             what="the ServiceImport in m2, written by the leader through its stream")

    a.stop()
    wait_for(lambda: f.lease_holder() == "meridian-2", timeout=15, what="B takes the lease", log=b)
    # B writes m2 through its own stream: a service exported since appears there as an import.
    publish_cart(f, "m1", ["10.1.0.1"])
    f.publish("m1", "web", ["10.1.0.5"])
    f.export("m1", "web")
    wait_for(lambda: import_clusters(f, "m2", "web") == ["m1"], timeout=20,
             what="web's ServiceImport in m2, written by B", log=b)
    assert cluster(b, "m2")["health"] == "Healthy", "B heard m2 all along"
    assert agent.proc.poll() is None


# What `meridian agent` watches in its member (controllers/src/kubernetes/member.rs watch_all).
AGENT_WATCHED = ("services", "endpointslices", "serviceexports", "serviceimports", "nodes", "namespaces",
                 "pods", "resourcequotas")


def member_watches(fleet, member: str) -> dict[str, int]:
    """WATCH requests the member's API server holds open now, by resource (its /metrics:
    apiserver_longrunning_requests, whoever the client; the API server's own informers too)."""
    status, text = fleet.cluster(member).request("GET", "/metrics")
    assert status == 200, text
    watches: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            labels, _, value = line.rpartition(" ")
            resource = labels.split('resource="', 1)[1].split('"', 1)[0]
            watches[resource] = watches.get(resource, 0) + int(float(value))
    return watches


def test_an_agent_streaming_to_two_replicas_watches_its_member_once_and_both_replicas_answer_for_it(
        kube_fleet, agents, tmp_path):
    """The agent keeps one set of watches of its member whatever the number of hub replicas
    it streams to (agent/src/watch_set.rs): with two replicas, m2's API server holds one more
    watch per kind the agent watches, not two; each replica is given m2's state on its own
    stream and answers for m2, and a change in m2 reaches both."""
    f = kube_fleet
    publish_cart(f, "m1", ["10.1.0.1"])
    publish_cart(f, "m2", ["10.2.0.1"])
    agent_member(f, "m2")
    port_a, port_b = free_port(), free_port()
    a = start_hub(f, port_a)
    b = f.start_meridian("meridian-2", agent={"listen": f"127.0.0.1:{port_b}"})
    # The API server's own watches (its informers), before the agent: settled.
    steady = []
    wait_for(lambda: steady.append(member_watches(f, "m2")) or steady[-2:] == [steady[-1]] * 2, timeout=20,
             interval=1, what="m2's watches settled before the agent")
    before = steady[-1]

    agent = agents("m2", f"127.0.0.1:{port_a},127.0.0.1:{port_b}", token=make_token(f, "m2"),
                   state_dir=tmp_path / "m2-state", kubeconfig=agent_kubeconfig(f, "m2"), ca_file=hub_ca(f))
    for replica in (a, b):
        replica.wait_for(lambda r=replica: r.addresses(NAME) == ["10.1.0.1", "10.2.0.1"], timeout=20,
                         what="m2's cart through its agent, on each replica")
    assert metric_values(agent.admin("/metrics"))["meridian_agent_connected"] == 2

    def opened() -> dict[str, int]:
        now = member_watches(f, "m2")
        return {r: now.get(r, 0) - before.get(r, 0) for r in AGENT_WATCHED}

    one_each = {r: 1 for r in AGENT_WATCHED}
    wait_for(lambda: opened() == one_each, timeout=10, what=f"one watch per kind in m2 (opened: {opened()})")
    time.sleep(2)
    assert opened() == one_each, "still one per kind"

    # A change in m2, watched once, reaches both replicas.
    f.endpoint_slice("m2", "cart", ["10.2.0.9"], ports=[{"name": "http", "port": 8080, "protocol": "TCP"}])
    for replica in (a, b):
        replica.wait_for(lambda r=replica: r.addresses(NAME) == ["10.1.0.1", "10.2.0.9"], timeout=20,
                         what="m2's new endpoint, on each replica")
    assert opened() == one_each
    agent_metrics = metric_values(agent.admin("/metrics"))
    assert agent_metrics["meridian_agent_resyncs_total"] == 0, "no stream fell behind"
    assert agent_metrics["meridian_agent_watch_store_objects"] > 0
