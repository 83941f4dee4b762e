"""The golden xDS resources (tests/golden/xds/*.pb, written by `cargo test --test xds golden`
from meridian's resource builders) decoded by a different implementation: go-control-plane's
generated types, whose `ValidateAll()` runs on every message, plus reference checks (listener →
route → cluster → assignment) and, for proxyless nodes, the checks grpc-go makes before it
accepts a resource. The Go peer is built by tests/peers/xds.sh."""

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = sorted((ROOT / "tests" / "golden" / "xds").glob("*.pb"))


@pytest.fixture(scope="module")
def validator():
    built = subprocess.run([str(ROOT / "tests" / "peers" / "xds.sh")], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.fail(f"building the xDS test peers failed:\n{built.stderr}")
    return Path(built.stdout.strip()) / "xds-validate"


def test_there_are_golden_files_for_every_kind_of_node():
    names = {p.stem for p in GOLDEN}
    assert {"envoy-eu-1", "proxyless-eu-1", "proxyless-us-1", "gateway-us-1"} <= names


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_resources_pass_go_control_plane_validation(validator, path):
    user_agent = "gRPC Go" if path.stem.startswith("proxyless") else "envoy"
    run = subprocess.run([str(validator), "golden", "-user-agent", user_agent, str(path)],
                         capture_output=True, text=True)
    report = json.loads(run.stdout)
    assert report["violations"] == [], json.dumps(report["violations"], indent=1)
    assert run.returncode == 0, run.stderr
    counts = {k: len(v) for k, v in report["resources"].items()}
    # Every node gets clusters and their assignments; proxyless nodes also their listeners and
    # routes; the gateway its one SNI listener.
    assert counts["CDS"] > 0 and counts["EDS"] == counts["CDS"], counts
    if path.stem.startswith("proxyless"):
        assert counts["LDS"] == counts["RDS"] == counts["CDS"], counts
    elif path.stem.startswith("gateway"):
        assert counts["LDS"] == 1 and counts["RDS"] == 0, counts
    else:
        assert counts["LDS"] == counts["RDS"] == 0, counts


def test_the_validator_catches_a_broken_resource(validator, tmp_path):
    """The check itself can fail: a response whose cluster has an empty name is refused."""
    # A DiscoveryResponse (varint-length-delimited) with one Any holding Cluster{name: ""} and
    # type EDS: type_url field 4, resources field 2.
    any_type = b"type.googleapis.com/envoy.config.cluster.v3.Cluster"
    cluster = bytes([0x50, 0x03])  # field 10 (type) = EDS, name left empty
    any_msg = b"\x0a" + bytes([len(any_type)]) + any_type + b"\x12" + bytes([len(cluster)]) + cluster
    response = b"\x12" + bytes([len(any_msg)]) + any_msg + b"\x22" + bytes([len(any_type)]) + any_type
    path = tmp_path / "broken.pb"
    path.write_bytes(bytes([len(response)]) + response)
    run = subprocess.run([str(validator), "golden", str(path)], capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert json.loads(run.stdout)["violations"], run.stdout
