"""The rough edges a new user meets first: shell completions, `meridian version`, logs to a
pipe without colour codes, `serve --help`, a config that is not YAML, ports in use, and a
reader that goes away (`meridian status | head`)."""

import base64
import http.client
import json
import os
import re
import socket
import subprocess
from pathlib import Path

from conftest import BIN, free_port, require_tool

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(*args, timeout=30, **kw):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout, **kw)


def test_bash_completions_load():
    """`source <(meridian completions bash)` registers a completion for meridian that
    offers its subcommands."""
    bash = require_tool("bash")
    script = run("completions", "bash")
    assert script.returncode == 0, script.stderr
    probe = subprocess.run(
        [bash, "-c", 'source /dev/stdin; complete -p meridian; '
                     'COMP_WORDS=(meridian st); COMP_CWORD=1; COMP_LINE="meridian st"; COMP_POINT=11; '
                     '_meridian meridian st meridian; printf "%s\\n" "${COMPREPLY[@]}"'],
        input=script.stdout, capture_output=True, text=True, timeout=30)
    assert probe.returncode == 0, probe.stderr
    lines = probe.stdout.splitlines()
    assert lines[0].startswith("complete ") and lines[0].endswith(" meridian"), lines[0]
    assert "status" in lines[1:], lines
    for shell in ("zsh", "fish"):
        out = run("completions", shell)
        assert out.returncode == 0 and "meridian" in out.stdout, (shell, out.stderr)


def test_version_names_the_commit():
    """`meridian version` and `--version` print the version and the git commit built from."""
    out = run("version")
    assert out.returncode == 0, out.stderr
    match = re.fullmatch(r"meridian (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}|unknown)\)\n", out.stdout)
    assert match, out.stdout
    assert match.group(2) != "unknown", "built in a git checkout, the commit is known"
    # The binary may be older than HEAD, but its commit is one of this repository's.
    known = subprocess.run(["git", "cat-file", "-t", match.group(2)], capture_output=True, text=True,
                           cwd=Path(__file__).parent)
    assert known.stdout.strip() == "commit", (match.group(2), known.stderr)
    assert run("--version").stdout == out.stdout


def test_logs_to_a_pipe_have_no_colour_codes(meridian):
    """Its stderr is a file here (not a terminal): not one escape code in the log."""
    meridian.query("payments.shop.global")
    log = meridian.log.read_text()
    assert "meridian started" in log
    assert not ANSI.search(log), ANSI.search(log)


def test_start_up_says_what_synced_and_where_the_status_page_is(meridian):
    """The first lines a new user reads say what was found and where to look; the admin
    address itself, opened in a browser, goes to the status page."""
    meridian.wait_for(lambda: "synced:" in meridian.log.read_text(), timeout=10, what="the synced line")
    line = next(l for l in meridian.log.read_text().splitlines() if "synced:" in l)
    services = len(json.loads(meridian.http("/debug/services")[1])["services"])
    want = f"synced: 3 member(s), {services} service(s); status page at http://127.0.0.1:{meridian.admin_port}/ui"
    assert want in line, line
    # Each member's first word is its health becoming known, not a change from a placeholder.
    log = meridian.log.read_text()
    for member in ("eu-1", "eu-2", "us-1"):
        assert f'member health changed cluster={member} from="Unknown" to="Healthy"' in log, log
    assert 'from="Degraded"' not in log, log
    conn = http.client.HTTPConnection("127.0.0.1", meridian.admin_port, timeout=5)
    conn.request("GET", "/")
    r = conn.getresponse()
    assert (r.status, r.getheader("Location")) == (307, "/ui"), (r.status, r.getheaders())


def test_serve_help_shows_defaults_and_the_log_format():
    help_text = run("serve", "--help").stdout
    for default in ("default 127.0.0.1:1053", "default 127.0.0.1:9180", "default 127.0.0.1:18000",
                    "default 5)", "[default: plain]"):
        assert default in help_text, default
    assert "--log-format <LOG_FORMAT>" in help_text and "JSON object per line" in help_text


def test_a_config_that_is_not_yaml_says_so_with_its_line(fleet):
    """A YAML syntax error is reported as malformed YAML with its line; a value of the wrong
    type as an invalid config naming the field."""
    text = fleet.config.read_text()
    fleet.config.write_text(text + "unclosed: [1, 2\n")
    out = run("validate", "--config", str(fleet.config))
    assert out.returncode == 1
    line = len(text.splitlines()) + 2
    assert "malformed YAML" in out.stderr and f"line {line}" in out.stderr, out.stderr
    assert "invalid config" not in out.stderr

    fleet.config.write_text("hub:\n  directory: hub\nadmin:\n  listen: not-an-address\n")
    out = run("validate", "--config", str(fleet.config))
    assert out.returncode == 1
    assert "invalid config" in out.stderr and "admin.listen" in out.stderr and "line 4" in out.stderr, out.stderr


def test_ports_in_use_are_all_named_and_nothing_is_logged_after_the_error(fleet):
    """DNS and admin ports taken: one error names both listeners (xDS, free, is not named),
    it is the last line, and meridian exits at once."""
    taken_tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken_tcp.bind(("127.0.0.1", 0))
    taken_tcp.listen()
    admin = taken_tcp.getsockname()[1]
    taken_udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns_port = free_port()
    taken_udp.bind(("127.0.0.1", dns_port))
    try:
        out = run("serve", "--config", str(fleet.config),
                  "--dns-listen", f"127.0.0.1:{dns_port}", "--admin-listen", f"127.0.0.1:{admin}",
                  "--xds-listen", f"127.0.0.1:{free_port()}", timeout=20)
    finally:
        taken_tcp.close()
        taken_udp.close()
    assert out.returncode == 1
    lines = [ANSI.sub("", l) for l in out.stderr.strip().splitlines()]
    last = lines[-1]
    assert last.startswith("error: cannot listen: "), lines
    assert f"DNS (UDP and TCP) on 127.0.0.1:{dns_port}" in last and f"admin HTTP on 127.0.0.1:{admin}" in last, last
    assert "xDS" not in last
    assert "Address already in use" in last
    assert not any("meridian started" in l for l in lines)


def test_status_columns_line_up(meridian):
    """`meridian status` against the quickstart: every row's columns start where the
    header's do."""
    out = run("status", "--admin", f"127.0.0.1:{meridian.admin_port}")
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()[1:]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    assert header.split() == ["CLUSTER", "HEALTH", "WITHDRAWN", "REGION", "ZONE", "NETWORK", "READY/ENDPOINTS",
                              "CPU", "USED+ASSUMED/ALLOC", "REASON"]
    assert len(rows) == 3
    services = json.loads(meridian.http("/debug/services")[1])["services"]
    for row in rows:
        cells = [m.start() for m in re.finditer(r"\S+", row)]
        # Left-aligned columns start with the header's; ENDPOINTS ends with it; REASON is "-".
        assert cells[:6] == starts[:6], (header, row)
        assert row.endswith(" -")
        # Ready endpoints of the member over every service, then all it registered.
        name, counts = row.split()[0], row.split()[6]
        ready, total = (int(n) for n in counts.split("/"))
        want = sum(b["ready"] for s in services for b in s["clusters"] if b["cluster"] == name)
        assert ready == want and ready <= total, (row, want)


def closed_pipe(*args, timeout=30):
    """Runs meridian with its standard output a pipe whose reader is already gone: its first
    write fails with EPIPE, as `meridian status | head` meets once head has its lines."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([str(BIN), *args], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
    finally:
        os.close(write)


def test_a_reader_that_goes_away_ends_each_command_quietly(meridian, fleet, tmp_path):
    """Every command that prints, its reader gone: exit 0 and nothing on stderr — not the
    panic `println!` gives ("failed printing to stdout: Broken pipe")."""
    admin = f"127.0.0.1:{meridian.admin_port}"
    xds = f"127.0.0.1:{meridian.xds_port}"
    config = str(fleet.config)
    for args in (["version"], ["crds"], ["completions", "bash"], ["status", "--admin", admin],
                 ["status", "--admin", admin, "--json"],
                 ["resolve", "payments.shop.global", "--admin", admin],
                 ["explain", "payments.shop", "--admin", admin],
                 ["simulate", "--assume", "eu-1=Unreachable", "--admin", admin],
                 ["xds", "dump", "--node-cluster", "eu-1", "--admin", admin],
                 ["xds", "clients", "--admin", admin],
                 ["xds", "watch", "--xds", xds, "--count", "2"],
                 ["gateway", "kubeconfig", "--user", "ana", "--server", "https://gw.example", "--admin", admin],
                 ["validate", "--config", config],
                 ["render", "--config", config, "--out", str(tmp_path / "rendered")],
                 ["serve", "--help"],
                 # A cut report ends as the others do, whatever its checks said.
                 ["diagnose", "--admin", admin]):
        out = closed_pipe(*args)
        assert (out.returncode, out.stderr) == (0, ""), (args, out.returncode, out.stderr)
    # Printed in full when someone reads.
    assert "CLUSTER" in run("status", "--admin", admin).stdout


def test_problems_name_list_items_by_their_index(fleet):
    """The second endpoint of a slice is `endpoints[1]`, as kubectl and the API server name
    it, and only that endpoint is left out."""
    db = fleet.cluster_dir("eu-1") / "db.yaml"
    db.write_text(db.read_text().replace("[127.1.1.12], hostname: db-1", "[999.1.1.12], hostname: db-1"))
    out = run("validate", "--config", str(fleet.config))
    assert out.returncode == 1
    assert ('EndpointSlice shop/db-x1: endpoints[1].addresses[0]: "999.1.1.12" is not an IP address; '
            "endpoint left out") in out.stdout, out.stdout
    assert "1 error(s)" in out.stdout


def admin_get(m, path, authorization=None):
    conn = http.client.HTTPConnection("127.0.0.1", m.admin_port, timeout=5)
    conn.request("GET", path, headers={"Authorization": authorization} if authorization else {})
    r = conn.getresponse()
    return r.status, r.getheaders(), r.read().decode()


def test_an_admin_token_guards_debug_and_ui_and_leaves_probes_and_metrics_open(fleet, start_meridian, tmp_path):
    """With --admin-token-file, /debug/* and /ui need the token (Bearer, or a browser's Basic
    password); the probes and the scrape do not; the CLI sends it from MERIDIAN_ADMIN_TOKEN_FILE;
    a short token stops serve at start with the reason; DNS serves throughout."""
    short = tmp_path / "short.token"
    short.write_text("abc\n")
    refused = subprocess.run([str(BIN), "serve", "--config", str(fleet.config), "--admin-token-file", str(short),
                              "--dns-listen", f"127.0.0.1:{free_port()}", "--admin-listen", f"127.0.0.1:{free_port()}",
                              "--xds-listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=30)
    assert refused.returncode != 0 and f"admin.tokenFile {short}: the token is 3 characters; at least 16" in refused.stderr, \
        refused.stderr

    token = "5f0c6d2e9a7b41c8b3e0d6f1a2c4e8b7"
    token_file = tmp_path / "admin.token"
    token_file.write_text(token + "\n")
    m = start_meridian(fleet, "--admin-token-file", str(token_file))
    for path in ("/debug/clusters", "/ui", "/ui/state", "/debug"):
        status, headers, body = admin_get(m, path)
        assert status == 401 and "admin token" in body, (path, status, body)
        challenges = [v for k, v in headers if k.lower() == "www-authenticate"]
        assert sorted(c.split()[0] for c in challenges) == ["Basic", "Bearer"], challenges
    assert admin_get(m, "/debug/clusters", "Bearer " + token[:-1] + "0")[0] == 401
    assert admin_get(m, "/debug/clusters", "Basic " + base64.b64encode(f"{token}:x".encode()).decode())[0] == 401
    status, _, body = admin_get(m, "/debug/clusters", "Bearer " + token)
    assert status == 200 and "eu-1" in body, (status, body)
    status, _, body = admin_get(m, "/ui", "Basic " + base64.b64encode(f"ana:{token}".encode()).decode())
    assert status == 200 and "<html" in body.lower(), status
    for path in ("/healthz", "/readyz"):
        assert admin_get(m, path)[0] == 200, path
    status, _, metrics = admin_get(m, "/metrics")
    refusals = re.search(r"^meridian_admin_unauthorized_requests_total (\d+)$", metrics, re.M)
    assert status == 200 and refusals and int(refusals.group(1)) == 6, refusals

    admin = f"127.0.0.1:{m.admin_port}"
    without = run("status", "--admin", admin)
    assert without.returncode != 0 and "needs its admin token: --admin-token-file" in without.stderr, without.stderr
    wrong = tmp_path / "wrong.token"
    wrong.write_text("0" * 32)
    bad = run("status", "--admin", admin, "--admin-token-file", str(wrong))
    assert bad.returncode != 0 and "the token in that file is not it" in bad.stderr, bad.stderr
    ok = run("status", "--admin", admin, env={**os.environ, "MERIDIAN_ADMIN_TOKEN_FILE": str(token_file)})
    assert ok.returncode == 0 and "eu-1" in ok.stdout, ok.stderr
    assert m.addresses("payments.shop.global", source="127.0.1.1"), "DNS serves throughout"
