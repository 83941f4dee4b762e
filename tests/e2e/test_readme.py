"""The README is executable documentation (issue 41): every command in its `sh` blocks is
either run here, as written, on the fleet it describes — the quickstart copied out of the
checkout, the federation example, the geo ranges — or named with the test that runs it against
the peers it needs (kube-apiservers, Helm, gRPC's xDS client), and that test's module must use
the command's subcommand, every flag and every value key it shows. A command added to the
README that is neither fails the suite, and so does an entry here the README no longer has.

What changes between the README and this run, and nothing else: the listen ports (free ones,
given as MERIDIAN_*_LISTEN, which `serve` and the client commands both read), `/tmp/quickstart`
and `/tmp/fleet` (under the test's own directory), and `meridian` (the binary under test).
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, ROOT, free_port, require_tool, stop_process

README = ROOT / "README.md"
E2E = Path(__file__).parent

# A command, with the comment that follows it on its line dropped.
COMMENT = re.compile(r"\s+#\s.*$")


def readme_commands() -> list[tuple[int, str]]:
    """(line, command) for each command of the README's `sh` blocks: continuation lines joined,
    comment lines and trailing comments dropped, spaces collapsed."""
    commands, in_block, pending, start = [], False, "", 0
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_block = line.strip() == "```sh"
            continue
        if not in_block or not line.strip() or line.lstrip().startswith("#"):
            continue
        if not pending:
            start = number
        text = COMMENT.sub("", line).rstrip()
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        commands.append((start, " ".join((pending + text).split())))
        pending = ""
    return commands


# Commands that need peers this file does not start: the test that runs them, and any helper
# module where it keeps the command line.
ELSEWHERE = {
    "tests/run": ("the suite itself", ()),
    "GRPC_XDS_BOOTSTRAP=bootstrap.json your-grpc-client --target xds:///payments.shop.global:9090": (
        "test_xds_grpc.py::test_each_client_reaches_only_its_own_cluster", ("xds_client.py",)),
    "meridian token create --config meridian.yaml --cluster edge-1 --ttl 1h": (
        "test_agent.py::test_agents_join_with_a_token_and_serve_beside_a_push_member_and_bad_tokens_and_identities_are_refused",
        ()),
    "meridian agent --hub hub.example.com:9443 --cluster edge-1 --bootstrap-token-file token "
    "--hub-ca-file agent-ca.crt --state-dir /var/lib/meridian-agent": (
        "test_agent.py::test_a_cut_agent_is_unreachable_then_withdrawn_and_comes_back_current_and_certificates_rotate",
        ()),
    "meridian join eu-1 --hub-kubeconfig hub.kubeconfig --member-kubeconfig eu-1.kubeconfig --network n1 "
    "--dns-client-cidr 10.1.0.0/16 [--propagation] [--dry-run]": (
        "test_join.py::test_join_registers_a_member_meridian_serves_and_unjoin_leaves_nothing_behind", ()),
    "meridian unjoin eu-1 --hub-kubeconfig hub.kubeconfig --member-kubeconfig eu-1.kubeconfig": (
        "test_join.py::test_join_registers_a_member_meridian_serves_and_unjoin_leaves_nothing_behind", ()),
    "meridian diagnose": (
        "test_diagnose.py::test_diagnose_passes_a_good_member_and_names_each_fault_with_its_fix", ()),
    "meridian diagnose --cluster eu-1 --resolver 127.0.0.1:10053 --json": (
        "test_diagnose.py::test_diagnose_passes_a_good_member_and_names_each_fault_with_its_fix", ()),
    "helm install meridian deploy/helm/meridian -n meridian-system --create-namespace "
    "--set image.repository=registry.example/meridian "
    "--set service.dns.type=LoadBalancer,service.dns.externalTrafficPolicy=Local": (
        "test_helm.py::test_installed_charts_serve_dns_for_a_member_service", ()),
    "helm install meridian-member deploy/helm/meridian-member --set 'coredns.forwardTo={203.0.113.53:53}'": (
        "test_helm.py::test_installed_charts_serve_dns_for_a_member_service", ()),
    "meridian explain grpcroute/payments-canary -n shop --from-cluster eu-1": (
        "test_routes.py::test_an_invalid_route_rejects_itself_while_the_others_serve", ()),
    "meridian simulate --rollout shop/web": (
        "test_placement.py::test_simulate_rollout_prints_each_stage_its_drains_and_the_traffic_shares_meanwhile", ()),
    "meridian rollout status shop/web": ("test_kube_rollout.py::test_an_edit_drains_the_canary_first_waits_for_approval_pauses_on_failure_and_aborts_back", ()),
    "meridian rollout approve web -n shop": ("test_kube_rollout.py::test_an_edit_drains_the_canary_first_waits_for_approval_pauses_on_failure_and_aborts_back", ()),
    "meridian rollout pause web -n shop": ("test_kube_rollout.py::test_an_edit_drains_the_canary_first_waits_for_approval_pauses_on_failure_and_aborts_back", ()),
    "meridian rollout abort web -n shop": ("test_kube_rollout.py::test_an_edit_drains_the_canary_first_waits_for_approval_pauses_on_failure_and_aborts_back", ()),
    "meridian gateway kubeconfig --user ana --certificate-authority ca.crt --token-file ~/.ana-token > fleet.kubeconfig": (
        "test_gateway.py::test_kubectl_works_each_member_and_the_hub_as_the_caller", ()),
    "kubectl --kubeconfig fleet.kubeconfig --context eu-1 get deploy -n shop": (
        "test_gateway.py::test_kubectl_works_each_member_and_the_hub_as_the_caller", ()),
    "kubectl --kubeconfig fleet.kubeconfig --context fleet get pods -A -w": (
        "test_gateway.py::test_star_watch_carries_a_composite_version_to_resume_from", ()),
    "kubectl --kubeconfig fleet.kubeconfig --context hub get memberclusters": (
        "test_gateway.py::test_kubectl_works_each_member_and_the_hub_as_the_caller", ()),
}


def what_a_test_must_use(command: str) -> list[str]:
    """The words a test running `command` must contain: meridian's subcommand, every long
    flag, and the key of every `--set KEY=VALUE` (or each of `A=1,B=2`)."""
    words = command.split()
    needed = []
    if words[0] == "meridian":
        needed += [w for w in words[1:3] if not w.startswith("-") and re.fullmatch(r"[a-z-]+", w)][:2]
    for i, w in enumerate(words):
        flag = w.strip("[]").split("=", 1)[0]
        if flag.startswith("--"):
            needed.append(flag)
        if flag == "--set" and i + 1 < len(words):
            value = words[i + 1].strip("'")
            needed += [pair.split("=", 1)[0] for pair in re.split(r",(?=[A-Za-z.]+=)", value)]
        if w.startswith("GRPC_XDS_BOOTSTRAP="):
            needed.append("GRPC_XDS_BOOTSTRAP")
    return needed


def test_every_readme_command_is_run_here_or_by_a_named_test():
    commands = [c for _, c in readme_commands()]
    assert len(commands) > 40, commands  # the parser found the blocks
    missing = [f"README.md:{line}: {c}" for line, c in readme_commands() if c not in RUN and c not in ELSEWHERE]
    assert not missing, "README commands that no test runs (add them to RUN or ELSEWHERE):\n" + "\n".join(missing)
    stale = [c for c in (*RUN, *ELSEWHERE) if c not in commands]
    assert not stale, f"entries for commands the README no longer has: {stale}"

    for command, (test, helpers) in ELSEWHERE.items():
        if command == "tests/run":
            continue
        module, name = test.split("::")
        source = (E2E / module).read_text()
        tests = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
        assert name in tests, f"{test} (for {command!r}) does not exist"
        text = source + "".join((E2E / h).read_text() for h in helpers)
        unused = [w for w in what_a_test_must_use(command) if w not in text]
        assert not unused, f"{module} runs no {unused} of the README's {command!r}"


# ---- run here -------------------------------------------------------------------------------

class Session:
    """The commands' environment: the binary as `meridian` on PATH, the ports, the paths."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.bin.mkdir()
        (self.bin / "meridian").symlink_to(BIN)
        self.quickstart = tmp / "quickstart"
        self.fleet_out = tmp / "fleet"
        self.dns, self.admin, self.xds = free_port(), free_port(), free_port()
        self.env = {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "MERIDIAN_DNS_LISTEN": f"127.0.0.1:{self.dns}",
            "MERIDIAN_ADMIN_LISTEN": f"127.0.0.1:{self.admin}",
            "MERIDIAN_XDS_LISTEN": f"127.0.0.1:{self.xds}",
        }

    def as_run_here(self, command: str) -> str:
        return (command.replace("/tmp/quickstart", str(self.quickstart))
                .replace("/tmp/fleet", str(self.fleet_out))
                .replace("-p 1053", f"-p {self.dns}")
                .replace("localhost:9180", f"localhost:{self.admin}"))

    def shell(self, command: str, timeout=60, cwd=ROOT) -> str:
        """Runs the README's command line in bash (pipes fail as a whole), in the checkout."""
        line = self.as_run_here(command)
        done = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=self.env)
        assert done.returncode == 0, f"{line}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def serve(self, command: str) -> subprocess.Popen:
        """Starts the README's `meridian serve …` and waits until it is ready."""
        log = open(self.tmp / f"serve-{time.monotonic_ns()}.log", "w")
        proc = subprocess.Popen(["bash", "-c", "exec " + self.as_run_here(command)], cwd=ROOT, env=self.env,
                                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, Path(log.name).read_text()
            probe = subprocess.run(["curl", "-sf", f"localhost:{self.admin}/readyz"], capture_output=True)
            if probe.returncode == 0:
                return proc
            time.sleep(0.1)
        stop_process(proc)
        raise AssertionError(f"{command} never became ready:\n{Path(log.name).read_text()}")


def addresses(out: str) -> list[str]:
    found = [line for line in out.split() if re.fullmatch(r"[0-9.]+|[0-9a-f:]+:[0-9a-f:]*", line)]
    for a in found:
        ipaddress.ip_address(a)
    return found


def check_dig_answers(s: Session, out: dict[str, str]):
    """What the comments beside the dig lines say."""
    every = addresses(out["unknown"])
    eu1 = addresses(out["eu-1"])
    assert len(every) > len(eu1) >= 1 and set(eu1) < set(every), (every, eu1)
    records = [line.split() for line in out["srv"].splitlines() if not line.startswith(";")]
    priorities = {int(r[4]) for r in records if len(r) > 4 and r[3] == "SRV"}
    assert len(priorities) >= 2, out["srv"]
    gateway = addresses(out["us-1 gateway"])
    assert gateway == ["127.0.3.100"], gateway  # us-1's gateway in the quickstart's members.yaml
    assert len(addresses(out["headless"])) == 1, out["headless"]
    (cluster_set_ip,) = addresses(out["clusterset"])
    assert cluster_set_ip not in every, cluster_set_ip
    assert out["txt"].startswith('"'), out["txt"]
    from_us1 = s.shell(f"dig @127.0.0.1 -p {s.dns} -b 127.0.3.1 payments.shop.global +short")
    assert addresses(out["ecs"]) == addresses(from_us1) != eu1, (out["ecs"], from_us1)
    assert out["axfr"].count("\tSOA\t") == 2 and "payments.shop.global." in out["axfr"], out["axfr"]


@pytest.fixture
def session(tmp_path):
    for tool in ("dig", "curl", "jq", "bash"):
        require_tool(tool)
    return Session(tmp_path)


def test_the_quickstart_commands_as_written(session):
    s = session
    (first,) = [c for _, c in readme_commands() if c.startswith("cargo install")]
    install, copy, serve = first.split(" && ")
    # `cargo install` from the checkout installs the binary this suite tests: the same version
    # and commit (into the test's own root, not the user's ~/.cargo).
    if shutil.which("cargo"):
        root = s.tmp / "cargo"
        done = subprocess.run([*install.split(), "--root", str(root)], capture_output=True, text=True,
                              cwd=ROOT, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        installed = subprocess.run([str(root / "bin" / "meridian"), "version"], capture_output=True, text=True)
        tested = subprocess.run([str(BIN), "version"], capture_output=True, text=True)
        assert installed.stdout == tested.stdout != "", (installed.stdout, tested.stdout)
    else:
        pytest.fail("cargo is not on PATH: the README's first command cannot be run")
    s.shell(copy.replace("/tmp/quickstart", str(s.quickstart)))
    assert (s.quickstart / "meridian.yaml").is_file()
    server = s.serve(serve)
    try:
        dig = {key: s.shell(command) for key, command in RUN_DIG.items()}
        check_dig_answers(s, dig)
        for command, check in RUN_WITH_THE_QUICKSTART.items():
            check(s, s.shell(command))
        watch_xds_while_listing_clients(s)
        # The policy edit the what-if lines name, beside them: traffic for payments weighted.
        (s.tmp / "new-policy.yaml").write_text(NEW_POLICY)
        for command, check in RUN_WHAT_IF.items():
            check(s, s.shell(command, cwd=s.tmp))
    finally:
        stop_process(server)

    # The geo lines: the quickstart again, with its two ranges.
    (geo_serve,) = [c for c in RUN_GEO if c.startswith("meridian serve")]
    server = s.serve(geo_serve)
    try:
        ecs, source = (s.shell(c) for c in RUN_GEO if c.startswith("dig"))
        assert addresses(ecs)[:1] == addresses(dig["eu-1"])[:1], (ecs, dig["eu-1"])  # eu-1a first
        assert addresses(source) == addresses(s.shell(
            f"dig @127.0.0.1 -p {s.dns} -b 127.0.3.1 payments.shop.global +short")), source
    finally:
        stop_process(server)


def test_the_federation_render_commands_as_written(session):
    s = session
    render, listing = (s.shell(c) for c in RUN_RENDER)
    # The README shows render's line with its timing: everything but the timing as shown.
    readme = README.read_text()
    shown = re.search(r"^# (\d+ file\(s\) for \d+ template\(s\)), decided in [0-9.]+ ms: (.*)$", readme, re.M)
    assert shown, "README shows render's summary"
    assert re.fullmatch(re.escape(shown.group(1)) + r", decided in [0-9.]+ ms: " + re.escape(shown.group(2)) + "\n",
                        render), render
    per_cluster = {}
    for block in listing.strip().split("\n\n"):
        head, *files = block.split("\n")
        per_cluster[Path(head.rstrip(":")).parent.name] = " ".join(files)
    want = "ConfigMap.web-config.yaml Deployment.web.yaml Service.web.yaml"
    assert per_cluster == {"eu-1": want, "eu-2": want}, listing


def expect(*words):
    def check(_s, out):
        for w in words:
            assert w in out, (w, out)
    return check


def json_with(*keys):
    def check(_s, out):
        value = json.loads(out)
        for k in keys:
            assert k in value, (k, list(value)[:20])
    return check


def non_empty(_s, out):
    assert out.strip(), "no output"


def completions_load(s, _out):
    probe = subprocess.run(["bash", "-c", "source <(meridian completions bash) && complete -p meridian"],
                           capture_output=True, text=True, env=s.env, timeout=30)
    assert probe.returncode == 0 and probe.stdout.rstrip().endswith(" meridian"), probe


def watch_xds_while_listing_clients(s: Session):
    """`xds watch` prints its first update live; `xds clients`, run meanwhile, lists it."""
    (watch,) = [c for c in RUN_XDS_LIVE if c.startswith("meridian xds watch")]
    (clients,) = [c for c in RUN_XDS_LIVE if c.startswith("meridian xds clients")]
    proc = subprocess.Popen(["bash", "-c", "exec " + s.as_run_here(watch)], cwd=ROOT, env=s.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.strip(), proc.stderr.read() if proc.poll() is not None else "no update"
        listed = s.shell(clients)
        assert "eu-1" in listed and "meridian-xds-watch" in listed, listed
    finally:
        stop_process(proc)


RUN_DIG = {
    "unknown": "dig @127.0.0.1 -p 1053 payments.shop.global +short",
    "eu-1": "dig @127.0.0.1 -p 1053 -b 127.0.1.1 payments.shop.global +short",
    "srv": "dig @127.0.0.1 -p 1053 -b 127.0.1.1 _http._tcp.payments.shop.global SRV",
    "us-1 gateway": "dig @127.0.0.1 -p 1053 -b 127.0.1.1 us-1.payments.shop.global +short",
    "headless": "dig @127.0.0.1 -p 1053 db-0.us-1.db.shop.global +short",
    "clusterset": "dig @127.0.0.1 -p 1053 -b 127.0.2.1 payments.shop.svc.clusterset.local +short",
    "txt": "dig @127.0.0.1 -p 1053 dns-version.clusterset.local TXT +short",
    "ecs": "dig @127.0.0.1 -p 1053 payments.shop.global +subnet=127.0.3.0/24 +short",
    "axfr": "dig @127.0.0.1 -p 1053 global AXFR",
}

RUN_WITH_THE_QUICKSTART = {
    "meridian status": expect("eu-1", "eu-2", "us-1", "Healthy"),
    "meridian resolve payments.shop.global --from-cluster eu-1": expect("eu-1"),
    "meridian resolve payments.shop.global --from 127.0.1.7": expect("eu-1"),
    "meridian validate --config /tmp/quickstart/meridian.yaml": lambda _s, _out: None,
    "meridian version": expect("meridian ", "(commit "),
    "source <(meridian completions bash)": completions_load,
    "curl -s localhost:9180/metrics | grep meridian_": expect("meridian_dns_"),
    "curl -s localhost:9180/debug/services | jq .": json_with("services"),
    "meridian xds dump --node-cluster eu-1 --role proxyless": expect("payments.shop.global"),
    "meridian xds dump --node-cluster us-1 --role eastwest-gateway": non_empty,
    "curl -s localhost:9180/debug/xds | jq .": json_with("clients"),
    "meridian explain payments.shop --from-cluster eu-1": expect("priority 0", "weight", "DNS A:", "EDS "),
    "curl -s 'localhost:9180/debug/explain?service=payments.shop&cluster=eu-1' | jq .": non_empty,
}

RUN_XDS_LIVE = [
    "meridian xds watch --node-cluster eu-1 --node-network n1",
    "meridian xds clients",
]

RUN_WHAT_IF = {
    "meridian simulate --assume eu-1=Unreachable": expect("eu-1"),
    "meridian simulate --assume eu-1:taint=maint:NoExecute --assume-remove us-1": non_empty,
    "meridian simulate --assume-policy new-policy.yaml": expect("shop/payments"),
    "meridian explain payments.shop --from-cluster eu-1 --assume eu-1=Unreachable": expect("Unreachable"),
    "curl -s 'localhost:9180/debug/simulate?assume=eu-1=Unreachable' | jq .totals": non_empty,
}

NEW_POLICY = """\
apiVersion: meridian.io/v1alpha1
kind: ClusterSchedulingPolicy
metadata: {name: spread, namespace: shop}
spec:
  resourceSelectors: [{kind: Service, name: payments}]
  traffic: {mode: Weighted}
"""

RUN_GEO = [
    "meridian serve --config /tmp/quickstart/meridian.yaml --geo-range 203.0.113.0/24=eu:eu-1a "
    "--geo-range 127.0.50.0/24=us",
    "dig @127.0.0.1 -p 1053 payments.shop.global +subnet=203.0.113.0/24 +short",
    "dig @127.0.0.1 -p 1053 -b 127.0.50.1 payments.shop.global +short",
]

RUN_RENDER = [
    "meridian render --config examples/federation/meridian.yaml --out /tmp/fleet",
    "ls /tmp/fleet/*/shop",
]

RUN = {
    "cargo install --locked --path . && cp -r examples/quickstart /tmp/quickstart && "
    "meridian serve --config /tmp/quickstart/meridian.yaml": None,
    **{c: None for c in RUN_DIG.values()}, **RUN_WITH_THE_QUICKSTART, **{c: None for c in RUN_XDS_LIVE},
    **RUN_WHAT_IF, **{c: None for c in RUN_GEO}, **{c: None for c in RUN_RENDER},
}
