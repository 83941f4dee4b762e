"""The Helm charts of deploy/helm/ with the real Helm (tests/peers/helm.sh) and real
kube-apiservers:

- `helm lint` passes both charts, with their default values and with others (flags and a
  values file), with nothing to report; the values schema and the templates refuse bad
  values with a message naming the value and the reason;
- the charts cannot drift from deploy/: their CRDs are the same bytes as deploy/crds/, and
  the RBAC `helm template` renders is deploy/rbac/'s (compared as RBAC: rules, role
  references and subjects, whatever the order or the comments);
- what the charts render with other values is accepted by the API server (server-side dry
  run, strict field validation) and its config by meridian (`meridian validate`);
- `helm install` of the hub chart into a hub and of meridian-member into a member, both bare
  kube-apiservers (nothing from deploy/ applied: CRDs and RBAC come from the charts alone),
  then meridian started with exactly the args, environment and config file of the installed
  Deployment and ConfigMap, with only what a test machine needs changed (see
  test_installed_charts_serve_dns_for_a_member_service), answers DNS for a Service exported
  in the member, writes back into the member, and the member chart's CoreDNS snippet
  forwards to it.

Helm is never optional: a missing or unbuildable Helm fails the tests with the reason
(tests/run builds it and passes HELM_BIN).
"""

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from conftest import BIN, ROOT, Meridian, built_peer, free_port
from kube_fleet import CORE, COORDINATION, KubeFleet, Member, start_all, wait_for
from test_forwarders import Peer, addresses_of, ask, coredns_bin  # noqa: F401 - coredns_bin is a fixture

HELM_SCRIPT = ROOT / "tests" / "peers" / "helm.sh"
HELM_BUILD_TIMEOUT = 1800  # seconds; a first build downloads and compiles Helm
HUB_CHART = ROOT / "deploy" / "helm" / "meridian"
MEMBER_CHART = ROOT / "deploy" / "helm" / "meridian-member"
DEPLOY = ROOT / "deploy"

RELEASE_NAMESPACE = "meridian-system"  # the hub release's namespace (and deploy/rbac/hub.yaml's)
MEMBER_NAMESPACE = "kube-system"  # where the member release goes (beside CoreDNS's own config)
SERVICE = "web"
ENDPOINTS = ["10.1.0.1", "10.1.0.2"]
NAME = f"{SERVICE}.shop.global"
POD_NAME = "meridian-6c9f7d5b8-x2k4q"  # MERIDIAN_IDENTITY: the pod name, from the downward API

# Values other than the defaults, as a user would put them in a file.
HUB_VALUES_FILE = {
    "replicas": 3,
    "image": {"repository": "registry.example/meridian", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "logLevel": "debug,hickory_server=info",
    "leaderElection": {"leaseName": "meridian-hub", "leaseDurationSeconds": 30, "renewDeadlineSeconds": 20,
                       "retryPeriodSeconds": 4},
    "listenAddress": "::",
    "dns": {"port": 5353, "zones": [{"name": "global", "style": "global"},
                                    {"name": "global.svc.cluster.local", "style": "global", "namespace": "shop"}],
            "ttl": 30, "maxAnswers": 4, "allowTransfer": ["10.0.0.0/8", "fd00::/8"], "tcpMaxConnections": 2048,
            "udpWorkers": 2, "cacheEntries": 1000000},
    "xds": {"port": 15010, "debounceMillis": 50, "debounceMaxMillis": 500,
            "tls": {"secretName": "meridian-xds-tls", "clientCA": True}},
    "admin": {"port": 9090},
    "syncDeadlineSeconds": 60,
    "geo": {"ranges": [{"cidrs": ["203.0.113.0/24", "2001:db8::/32"], "region": "eu", "zone": "eu-1a"}]},
    "service": {"dns": {"type": "LoadBalancer", "port": 53, "externalTrafficPolicy": "Local",
                        "annotations": {"example.com/lb": "internal"}}},
    "rbac": {"extraSubjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "meridian"}],
             "extraRules": [{"apiGroups": ["example.com"], "resources": ["widgets"],
                             "verbs": ["get", "list", "watch"]}]},
    "podDisruptionBudget": {"enabled": True, "minAvailable": 2},
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
    "networkPolicy": {"enabled": True, "dnsFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                      "adminFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "dns", "effect": "NoSchedule"}],
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "meridian"}}}],
    "podAnnotations": {"example.com/team": "fleet"},
    "agent": {"enabled": True, "port": 9444, "serverNames": ["hub.example.com"], "autoApprove": False,
              "certificateLifetimeSeconds": 3600},
}
HUB_SET = ["--set", "replicas=3,kubernetes.watchTimeoutSeconds=45,kubernetes.resyncSeconds=300,"
                    "dns.tcpIdleTimeoutSeconds=20,"
                    "resources.limits.memory=2Gi"]
MEMBER_SET = ["--set", "propagation.enabled=true,coredns.forwardTo={203.0.113.53:53,[2001:db8::53]:53},"
                       "coredns.cacheSeconds=0",
              "--set", "subjects[0].kind=ServiceAccount,subjects[0].name=meridian,subjects[0].namespace=fleet"]


# ---------------------------------------------------------------------------------------
# Helm


@pytest.fixture(scope="module")
def helm(tmp_path_factory):
    """Runs the Helm that tests/peers/helm.sh built (HELM_BIN, else the script builds it),
    with its cache, config and data in a directory of this test run's own:
    helm(*args, kubeconfig=None) -> CompletedProcess (text, stdout and stderr captured)."""
    path = built_peer("HELM_BIN", HELM_SCRIPT, "Helm", HELM_BUILD_TIMEOUT)
    home = tmp_path_factory.mktemp("helm-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_") and k != "KUBECONFIG"}
    env.update(HELM_CACHE_HOME=str(home / "cache"), HELM_CONFIG_HOME=str(home / "config"),
               HELM_DATA_HOME=str(home / "data"))

    def run(*args, kubeconfig=None, timeout=120):
        e = dict(env, KUBECONFIG=str(kubeconfig)) if kubeconfig else env
        return subprocess.run([path, *map(str, args)], capture_output=True, text=True, env=e, timeout=timeout)

    version = run("version", "--template", "{{.Version}}")
    if version.returncode != 0:
        pytest.fail(f"{path} version failed: {version.stdout}{version.stderr}")
    return run


def ok(result):
    """The stdout of a Helm run that must succeed; fails with its output otherwise."""
    assert result.returncode == 0, (
        f"{' '.join(result.args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result.stdout


def render(helm, chart, *args, release="meridian", namespace=RELEASE_NAMESPACE):
    """The documents `helm template` renders (no CRDs), as parsed YAML."""
    out = ok(helm("template", release, chart, "--namespace", namespace, *args))
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name=None):
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def values_file(tmp_path, name, values):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------
# Lint and the values schema


def test_both_charts_lint_clean_with_default_and_other_values(helm, tmp_path):
    """`helm lint --strict` passes each chart with its defaults, with --set flags and with a
    values file, and reports nothing at all (no errors, warnings or notes); the other values
    reach what the chart renders."""
    hub_file = values_file(tmp_path, "hub.yaml", HUB_VALUES_FILE)
    runs = [
        (HUB_CHART, []),
        (HUB_CHART, HUB_SET),
        (HUB_CHART, ["--values", hub_file, *HUB_SET]),
        (MEMBER_CHART, []),
        (MEMBER_CHART, MEMBER_SET),
    ]
    for chart, args in runs:
        r = helm("lint", "--strict", chart, "--namespace", RELEASE_NAMESPACE, *args)
        assert "1 chart(s) linted, 0 chart(s) failed" in ok(r), r.stdout
        notes = [line for line in (r.stdout + r.stderr).splitlines() if re.search(r"\[(INFO|WARNING|ERROR)\]", line)]
        assert notes == [], f"helm lint {chart.name} {args}: {notes}"

    docs = render(helm, HUB_CHART, "--values", hub_file, *HUB_SET)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 3
    assert pod["containers"][0]["image"] == "registry.example/meridian:0.1.0-rc1"
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "2Gi"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["meridian.yaml"])
    assert config["dns"]["listen"] == "[::]:5353" and config["admin"]["listen"] == "[::]:9090"
    assert config["dns"]["cacheEntries"] == 1000000 and config["dns"]["tcpMaxConnections"] == 2048
    assert config["kubernetes"] == {"watchTimeoutSeconds": 45, "resyncSeconds": 300}
    assert config["leaderElection"] == HUB_VALUES_FILE["leaderElection"]
    assert config["geo"] == HUB_VALUES_FILE["geo"]
    assert one(docs, "PodDisruptionBudget")["spec"] == {
        "minAvailable": 2, "selector": deployment["spec"]["selector"]}


# (chart, helm arguments, what the message must say): refused by the values schema.
BAD_VALUES = [
    (HUB_CHART, ["--set", "replicas=0"], ["at '/replicas'", "minimum: got 0, want 1"]),
    (HUB_CHART, ["--set-string", "replicas=three"], ["at '/replicas'", "got string, want integer"]),
    (HUB_CHART, ["--set", "replica=3"], ["additional properties 'replica' not allowed"]),
    (HUB_CHART, ["--set", "dns.udpWorkers=2000"], ["at '/dns/udpWorkers'", "maximum: got 2,000, want 1,024"]),
    (HUB_CHART, ["--set", "syncDeadlineSeconds=0"], ["at '/syncDeadlineSeconds'", "minimum: got 0, want 1"]),
    (HUB_CHART, ["--set", "logFormat=xml"], ["at '/logFormat'", "value must be one of 'plain', 'json'"]),
    (HUB_CHART, ["--set", "dns.allowTransfer={nowhere}"], ["at '/dns/allowTransfer/0'", "'nowhere' does not match"]),
    (HUB_CHART, ["--set", "service.dns.type=ExternalName"], ["at '/service/dns/type'", "value must be one of"]),
    (HUB_CHART, ["--set", "xds.tls.secretname=x"], ["at '/xds/tls'", "additional properties 'secretname' not allowed"]),
    (HUB_CHART, ["--set", "tracing.samplingRatio=2"], ["at '/tracing/samplingRatio'", "maximum: got 2, want 1"]),
    (HUB_CHART, ["--set", "gateway.oidc.issuer=http://idp"], ["at '/gateway/oidc/issuer'", "does not match"]),
    (HUB_CHART, ["--values", "ZONES_FILE"], ["at '/dns/zones/0/style'", "value must be one of 'global', 'clusterset'"]),
    (MEMBER_CHART, ["--set", "subjects[0].kind=Robot"], ["at '/subjects/0/kind'", "value must be one of"]),
    (MEMBER_CHART, ["--set", "subjects[0].kind=ServiceAccount"], ["at '/subjects/0'", "missing property 'namespace'"]),
    (MEMBER_CHART, ["--set", "coredns.forwardTo={meridian.example}"], ["at '/coredns/forwardTo/0'", "does not match"]),
    (MEMBER_CHART, ["--set", "propagation.enable=true"], ["additional properties 'enable' not allowed"]),
    (MEMBER_CHART, ["--set", "agent.cluster=EU_1"], ["at '/agent/cluster'", "does not match"]),
    (MEMBER_CHART, ["--set", "agent.hub=hub.example"], ["at '/agent/hub'", "does not match"]),
]

# What the schema cannot relate (one value against another): the templates refuse it, in
# meridian's own words (src/config.rs would refuse the config at start-up).
BAD_COMBINATIONS = [
    (["--set", "leaderElection.renewDeadlineSeconds=20"],
     "renewDeadlineSeconds (20) must be below leaseDurationSeconds (15)"),
    (["--set", "leaderElection.retryPeriodSeconds=10"],
     "retryPeriodSeconds (10) must be below renewDeadlineSeconds (10)"),
    (["--set", "xds.debounceMaxMillis=50"], "debounceMaxMillis (50) is shorter than debounceMillis (100)"),
    (["--set", "xds.port=9180"], "dns.port, xds.port, admin.port (and agent.port, gateway.port) must differ"),
    (["--set", "agent.enabled=true,agent.port=1053"], "dns.port, xds.port, admin.port (and agent.port, gateway.port) must differ"),
    (["--set", "gateway.enabled=true"], "gateway.tls {cert, key} is required"),
    (["--set", "gateway.enabled=true,gateway.tls.secretName=t"], "gateway.oidc is required"),
]


@pytest.mark.parametrize("chart,args,says", BAD_VALUES, ids=[" ".join(a) for _, a, _ in BAD_VALUES])
def test_bad_values_are_refused_with_the_reason(helm, tmp_path, chart, args, says):
    """`helm template` and `helm lint` both refuse a value the schema forbids, and the
    message names the value and says why."""
    zones = values_file(tmp_path, "zones.yaml", {"dns": {"zones": [{"name": "global", "style": "galactic"}]}})
    args = [str(zones) if a == "ZONES_FILE" else a for a in args]
    for command in (["template", "x", chart], ["lint", chart]):
        r = helm(*command, *args)
        out = r.stdout + r.stderr
        assert r.returncode != 0, f"helm {' '.join(map(str, command))} {args} accepted the value:\n{out}"
        for s in says:
            assert s in out, f"helm {command[0]} {args}: expected {s!r} in:\n{out}"


@pytest.mark.parametrize("args,says", BAD_COMBINATIONS, ids=[" ".join(a) for a, _ in BAD_COMBINATIONS])
def test_bad_combinations_are_refused_by_the_templates(helm, args, says):
    """`helm template` (as `helm install`) refuses values that contradict each other, with
    the reason; `helm lint` reports the same reason, as a note (Helm's lint mode never fails
    on a template's `fail`)."""
    r = helm("template", "x", HUB_CHART, *args)
    assert r.returncode != 0 and says in r.stderr, f"helm template {args}:\n{r.stdout}{r.stderr}"
    r = helm("lint", HUB_CHART, *args)
    assert says in r.stdout + r.stderr, f"helm lint {args}:\n{r.stdout}{r.stderr}"


# ---------------------------------------------------------------------------------------
# No drift from deploy/


def test_deploy_readme_names_every_crd_and_rbac_file_and_crds_help_every_kind():
    """A user reads deploy/README.md to learn which file goes where: a file added without a
    line there fails here. And `meridian crds --help` names each kind the command prints."""
    readme = (DEPLOY / "README.md").read_text()
    for folder in ("crds", "rbac"):
        for f in sorted((DEPLOY / folder).glob("*.yaml")):
            assert f"`{folder}/{f.name}`" in readme, f"deploy/README.md does not describe {folder}/{f.name}"
    printed = subprocess.run([str(BIN), "crds"], capture_output=True, text=True, timeout=30, check=True).stdout
    kinds = [d["spec"]["names"]["kind"] for d in yaml.safe_load_all(printed) if d]
    assert len(kinds) >= 5, kinds
    help_text = " ".join(subprocess.run([str(BIN), "crds", "--help"], capture_output=True, text=True,
                                        timeout=30, check=True).stdout.split())
    for kind in kinds:
        assert kind in help_text, f"`meridian crds --help` does not name {kind}: {help_text}"


def test_chart_crds_are_the_deploy_crds_and_the_app_version_is_meridians():
    """Each chart's crds/ holds exactly the CRD files of deploy/crds/ it ships, byte for
    byte (copy them again after `meridian crds > deploy/crds/meridian.io.yaml`), and both
    charts' appVersion is the workspace version in Cargo.toml."""
    expected = {HUB_CHART: ["meridian.io.yaml"], MEMBER_CHART: ["multicluster.x-k8s.io.yaml"]}
    for chart, files in expected.items():
        assert sorted(p.name for p in (chart / "crds").iterdir()) == files, chart
        for f in files:
            assert (chart / "crds" / f).read_bytes() == (DEPLOY / "crds" / f).read_bytes(), (
                f"{chart / 'crds' / f} differs from deploy/crds/{f}: cp deploy/crds/{f} {chart / 'crds'}/")
    version = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    for chart in expected:
        assert yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"] == version, chart


def rbac_view(docs):
    """RBAC objects as comparable data: {(kind, namespace, name): what RBAC reads}, with
    rules as sorted tuples of sorted fields and subjects as a sorted list."""
    def rule(r):
        return tuple((k, tuple(sorted(r.get(k) or []))) for k in
                     ("apiGroups", "resources", "resourceNames", "nonResourceURLs", "verbs"))

    def subject(s):
        return tuple(sorted(s.items()))

    out = {}
    for d in docs:
        meta = d["metadata"]
        key = (d["kind"], meta.get("namespace"), meta["name"])
        if d["kind"] in ("ClusterRole", "Role"):
            out[key] = sorted(rule(r) for r in d.get("rules") or [])
        elif d["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            out[key] = (tuple(sorted(d["roleRef"].items())), sorted(subject(s) for s in d.get("subjects") or []))
        elif d["kind"] == "ServiceAccount":
            out[key] = None
    return out


def deploy_rbac(*files):
    docs = []
    for f in files:
        docs += [d for d in yaml.safe_load_all((DEPLOY / "rbac" / f).read_text()) if d]
    return rbac_view(docs)


def test_rendered_rbac_is_deploy_rbac(helm):
    """The RBAC the charts render is that of deploy/rbac/ (roles, rules, role references and
    subjects), for releases named as deploy/rbac's objects are: the hub chart's with
    rbac.extraSubjects = deploy/rbac/hub.yaml's User meridian (its ServiceAccount is the
    chart's own) is hub.yaml (and hub-shards.yaml with leaderElection.shards); the member
    chart's defaults are member.yaml, and with
    propagation.enabled member.yaml and member-propagation.yaml."""
    hub = render(helm, HUB_CHART, "--set", "rbac.extraSubjects[0].apiGroup=rbac.authorization.k8s.io,"
                                           "rbac.extraSubjects[0].kind=User,rbac.extraSubjects[0].name=meridian")
    assert rbac_view(hub) == deploy_rbac("hub.yaml")
    # Sharded writers: hub.yaml and hub-shards.yaml, and the config says so.
    sharded = render(helm, HUB_CHART, "--set", "leaderElection.shards=true,"
                     "rbac.extraSubjects[0].apiGroup=rbac.authorization.k8s.io,"
                     "rbac.extraSubjects[0].kind=User,rbac.extraSubjects[0].name=meridian")
    assert rbac_view(sharded) == deploy_rbac("hub.yaml", "hub-shards.yaml")
    config = yaml.safe_load(one(sharded, "ConfigMap")["data"]["meridian.yaml"])
    assert config["leaderElection"]["shards"] is True
    # With the defaults, only the chart's ServiceAccount is bound, to the same roles.
    defaults = rbac_view(render(helm, HUB_CHART))
    sa = [(("kind", "ServiceAccount"), ("name", "meridian"), ("namespace", RELEASE_NAMESPACE))]
    for key, view in deploy_rbac("hub.yaml").items():
        assert defaults[key] == ((view[0], sa) if key[0].endswith("Binding") else view), key

    member = render(helm, MEMBER_CHART, release="meridian-member", namespace=MEMBER_NAMESPACE)
    assert rbac_view(member) == deploy_rbac("member.yaml")
    assert by_kind(member, "ConfigMap") == [], "no CoreDNS snippet without coredns.forwardTo"
    both = render(helm, MEMBER_CHART, "--set", "propagation.enabled=true", release="meridian-member",
                  namespace=MEMBER_NAMESPACE)
    assert rbac_view(both) == deploy_rbac("member.yaml", "member-propagation.yaml")
    # Pull-mode agents: the hub's Secrets for the agent CA and tokens (hub-agents.yaml) and the
    # listener in the config; in the member, agent.yaml's identity and roles instead of the
    # hub's, and the agent's Deployment.
    agents = render(helm, HUB_CHART, "--set", "agent.enabled=true,"
                    "rbac.extraSubjects[0].apiGroup=rbac.authorization.k8s.io,"
                    "rbac.extraSubjects[0].kind=User,rbac.extraSubjects[0].name=meridian")
    assert rbac_view(agents) == deploy_rbac("hub.yaml", "hub-agents.yaml")
    config = yaml.safe_load(one(agents, "ConfigMap")["data"]["meridian.yaml"])
    assert config["agent"] == {"listen": "0.0.0.0:9443", "serverNames": [
        f"meridian-agent.{RELEASE_NAMESPACE}.svc", f"meridian-agent.{RELEASE_NAMESPACE}.svc.cluster.local"],
        "certificateLifetimeSeconds": 86400, "admissionPerSecond": 50, "autoApprove": True}
    assert one(agents, "Service", "meridian-agent")["spec"]["ports"][0]["targetPort"] == "agent"
    # The federation API gateway: hub.yaml and gateway.yaml (impersonating callers on the hub).
    gateway = render(helm, HUB_CHART, *GATEWAY_SET, "--set",
                     "rbac.extraSubjects[0].apiGroup=rbac.authorization.k8s.io,"
                     "rbac.extraSubjects[0].kind=User,rbac.extraSubjects[0].name=meridian")
    expected = deploy_rbac("hub.yaml", "gateway.yaml")
    binding = ("ClusterRoleBinding", None, "meridian-gateway-impersonate")
    sa = (("kind", "ServiceAccount"), ("name", "meridian"), ("namespace", RELEASE_NAMESPACE))
    # gateway.yaml binds User meridian; the chart binds its ServiceAccount and extraSubjects.
    expected[binding] = (expected[binding][0], sorted(expected[binding][1] + [sa]))
    assert rbac_view(gateway) == expected
    agent = render(helm, MEMBER_CHART, "--set", "agent.enabled=true,agent.hub=hub.example.com:9443,"
                   "agent.cluster=edge-1", release="meridian-member", namespace="meridian-system")
    assert rbac_view(agent) == deploy_rbac("agent.yaml")
    args = one(agent, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["agent", "--hub=hub.example.com:9443", "--cluster=edge-1"], args
    assert "--state-secret=meridian-system/meridian-agent-state" in args, args
    # Placed workloads reach an agent member through its agent: the propagation roles are the
    # agent's.
    placing = render(helm, MEMBER_CHART, "--set", "agent.enabled=true,agent.hub=hub.example.com:9443,"
                     "agent.cluster=edge-1,propagation.enabled=true", release="meridian-member",
                     namespace="meridian-system")
    expected = deploy_rbac("agent.yaml", "member-propagation.yaml")
    binding = ("ClusterRoleBinding", None, "meridian-member-propagation")
    agent_sa = (("kind", "ServiceAccount"), ("name", "meridian-agent"), ("namespace", "meridian-system"))
    expected[binding] = (expected[binding][0], [agent_sa])
    assert rbac_view(placing) == expected
    refused = helm("template", "m", MEMBER_CHART, "--set", "agent.enabled=true,agent.cluster=edge-1")
    assert refused.returncode != 0 and "agent.hub" in refused.stderr, refused.stderr


GATEWAY_SET = ["--set", "gateway.enabled=true,gateway.tls.secretName=meridian-gateway-tls,"
               "gateway.tls.clientCA=true,gateway.oidc.issuer=https://idp.example,"
               "gateway.oidc.audiences={meridian},gateway.oidc.jwks=https://idp.example/keys,"
               "gateway.oidc.groupsClaim=groups,tracing.otlpEndpoint=http://collector:4317,"
               "extraArgs={--dns-ttl=9},extraEnv[0].name=RUST_BACKTRACE,"
               "extraEnv[0].value=full"]


def validate_on_a_directory_hub(config, directory):
    """`meridian validate` of a rendered config with its hub replaced by an empty directory
    (validate reads no Kubernetes hub)."""
    (directory / "hub").mkdir(parents=True, exist_ok=True)
    config["hub"] = {"directory": str(directory / "hub")}
    path = directory / "meridian.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([str(BIN), "validate", "--config", str(path)], capture_output=True, text=True, timeout=60)


def test_the_gateway_tracing_and_extra_values_reach_the_pod_and_its_config(helm, tmp_path):
    """gateway, tracing, extraEnv and extraArgs: the gateway's listener, certificate and OIDC
    settings and the collector in the config file (which meridian accepts), the gateway's port,
    Secret and Service on the pod, and the extra variables and flags on its container."""
    docs = render(helm, HUB_CHART, *GATEWAY_SET)
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["meridian.yaml"])
    assert config["gateway"] == {
        "listen": "0.0.0.0:8443",
        "tls": {"cert": "/etc/meridian/gateway-tls/tls.crt", "key": "/etc/meridian/gateway-tls/tls.key",
                "clientCA": "/etc/meridian/gateway-tls/ca.crt"},
        "oidc": {"issuer": "https://idp.example", "audiences": ["meridian"],
                 "jwks": "https://idp.example/keys", "groupsClaim": "groups"}}
    assert config["tracing"] == {"otlpEndpoint": "http://collector:4317", "samplingRatio": 0.1}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][-1] == "--dns-ttl=9", container["args"]
    assert {"name": "RUST_BACKTRACE", "value": "full"} in container["env"], container["env"]
    assert {"name": "gateway", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    assert {"name": "gateway-tls", "secret": {"secretName": "meridian-gateway-tls"}} in pod["volumes"]
    assert one(docs, "Service", "meridian-gateway")["spec"]["ports"][0]["targetPort"] == "gateway"
    # `validate` reads a directory hub, and a gateway needs a Kubernetes hub: with the gateway
    # section meridian gets as far as that (the section itself is accepted), without it the
    # rest of the file is valid.
    r = validate_on_a_directory_hub(config, tmp_path)
    assert r.returncode == 1 and "gateway needs a Kubernetes hub" in r.stderr, f"{r.stdout}{r.stderr}"
    del config["gateway"]
    r = validate_on_a_directory_hub(config, tmp_path)
    assert r.returncode == 0 and "0 error(s)" in r.stdout, f"{r.stdout}{r.stderr}"
    # Without tracing.otlpEndpoint, no tracing section at all (a ratio alone is refused).
    assert "tracing" not in yaml.safe_load(one(render(helm, HUB_CHART), "ConfigMap")["data"]["meridian.yaml"])


def test_an_admin_token_secret_is_mounted_and_named_in_the_config(helm, tmp_path):
    """admin.tokenSecret: the Secret's key `token` mounted read-only and `admin.tokenFile`
    naming it in the config, which meridian accepts; without it, neither."""
    docs = render(helm, HUB_CHART, "--set", "admin.tokenSecret=meridian-admin-token")
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["meridian.yaml"])
    assert config["admin"]["tokenFile"] == "/etc/meridian/admin-token/token", config["admin"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "admin-token", "secret": {"secretName": "meridian-admin-token",
                                              "items": [{"key": "token", "path": "token"}]}} in pod["volumes"]
    assert {"name": "admin-token", "mountPath": "/etc/meridian/admin-token", "readOnly": True} in \
        pod["containers"][0]["volumeMounts"]
    r = validate_on_a_directory_hub(config, tmp_path)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}"
    plain = render(helm, HUB_CHART)
    assert "tokenFile" not in one(plain, "ConfigMap")["data"]["meridian.yaml"]
    assert not any(v["name"] == "admin-token" for v in one(plain, "Deployment")["spec"]["template"]["spec"]["volumes"])


def test_rendered_config_is_accepted_by_meridian(helm, tmp_path):
    """The config file the hub chart renders, with its defaults and with other values, is
    one meridian accepts (`meridian validate`, with only the hub replaced by an empty
    directory: validate reads no Kubernetes hub), and it sets the hub, the Lease's namespace
    and the listen addresses from the chart."""
    for name, args in [("defaults", []), ("other", ["--values", values_file(tmp_path, "v.yaml", HUB_VALUES_FILE)])]:
        docs = render(helm, HUB_CHART, *args)
        config = yaml.safe_load(one(docs, "ConfigMap")["data"]["meridian.yaml"])
        assert config["hub"] == {"inCluster": True, "namespace": RELEASE_NAMESPACE}
        ports = {p["name"]: p["containerPort"] for p in one(docs, "Deployment")["spec"]["template"]["spec"]
                 ["containers"][0]["ports"]}
        host = "[::]" if name == "other" else "0.0.0.0"
        assert (config["dns"]["listen"], config["xds"]["listen"], config["admin"]["listen"]) == (
            f"{host}:{ports['dns-udp']}", f"{host}:{ports['xds']}", f"{host}:{ports['admin']}")
        assert ports["dns-udp"] == ports["dns-tcp"]
        r = validate_on_a_directory_hub(config, tmp_path / name)
        assert r.returncode == 0 and "0 error(s)" in r.stdout, f"{name}: {r.stdout}{r.stderr}"


# ---------------------------------------------------------------------------------------
# On real kube-apiservers


@pytest.fixture(scope="module")
def bare_fleet(tmp_path_factory):
    """A hub and one member (m1, its kubeconfig in a hub Secret) on real kube-apiservers,
    with nothing of deploy/ applied: no CRDs, no RBAC, no namespaces but the API server's own.
    Not the session's shared fleet (kube_fleet): that one already holds deploy/'s CRDs and
    RBAC under the names the charts use, so an install there would clash with them or prove
    nothing about the charts' own. The token user `meridian` exists in every cluster, bound
    to nothing until a chart binds it."""
    fleet = KubeFleet(tmp_path_factory.mktemp("helm-kube"),
                      members=(Member("m1", "eu", "eu-a", "127.0.1.0/24", secret_ref=True),))
    fleet.kubeconfig_dir.mkdir()  # KubeFleet.setup() would make it; it is not called here
    try:
        start_all(fleet.clusters)
    except Exception as e:  # noqa: BLE001 - a missing peer fails loudly
        pytest.fail(f"cannot start the kube-apiservers: {e}")
    yield fleet
    fleet.stop()


# The REST collection of each kind the charts render: (API path prefix, plural, namespaced).
KIND_PATHS = {
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Service": ("/api/v1", "services", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}


def dry_run(cluster, doc):
    """POSTs one object with dryRun=All and strict field validation (an unknown or misplaced
    field is refused); returns (status, body)."""
    prefix, plural, namespaced = KIND_PATHS[doc["kind"]]
    ns = f"/namespaces/{doc['metadata']['namespace']}" if namespaced else ""
    return cluster.request("POST", f"{prefix}{ns}/{plural}?dryRun=All&fieldValidation=Strict", doc)


def test_renders_with_other_values_pass_a_server_side_dry_run(helm, tmp_path, bare_fleet):
    """Everything the charts render with values other than the defaults (every optional
    template on) is accepted by a real kube-apiserver in a server-side dry run with strict
    field validation — except the ServiceMonitor, whose CRD (prometheus-operator's) is not
    on these API servers: it is checked to select the admin Service and its port instead."""
    namespace = "helm-dry-run"
    for c in (bare_fleet.hub, bare_fleet.cluster("m1")):
        c.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": namespace}})
    hub_docs = render(helm, HUB_CHART, "--values", values_file(tmp_path, "hub.yaml", HUB_VALUES_FILE), *HUB_SET,
                      *GATEWAY_SET, release="dryrun", namespace=namespace)
    member_docs = render(helm, MEMBER_CHART, *MEMBER_SET, release="dryrun", namespace=namespace)
    agent_docs = render(helm, MEMBER_CHART, "--set", "agent.enabled=true,agent.hub=hub.example.com:9443,"
                        "agent.cluster=edge-1,agent.nodeSelector.kubernetes\\.io/os=linux",
                        release="dryrun", namespace=namespace)
    assert {d["kind"] for d in hub_docs} == set(KIND_PATHS) | {"ServiceMonitor"}
    assert {d["kind"] for d in member_docs} == {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                                                "ConfigMap"}

    assert {d["kind"] for d in agent_docs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                               "RoleBinding", "Deployment"}
    for cluster, docs in ((bare_fleet.hub, hub_docs), (bare_fleet.cluster("m1"), member_docs),
                          (bare_fleet.cluster("m1"), agent_docs)):
        for doc in docs:
            if doc["kind"] == "ServiceMonitor":
                continue
            status, body = dry_run(cluster, doc)
            assert status == 201, f"{cluster.name}: {doc['kind']} {doc['metadata']['name']}: {status} {body}"

    monitor = one(hub_docs, "ServiceMonitor")
    admin = one(hub_docs, "Service", "dryrun-meridian-admin")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= admin["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in admin["spec"]["ports"]]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    snippet = one(member_docs, "ConfigMap")["data"]["meridian.server"]
    assert snippet.count("forward . 203.0.113.53:53 [2001:db8::53]:53") == 2 and "cache" not in snippet, snippet


class ChartMeridian(Meridian):
    """`meridian serve` started with a Deployment container's args and environment (and no
    other MERIDIAN_* variable), on the ports its config file names."""

    def __init__(self, args, env, *, config, log, ports):
        self.chart_args, self.chart_env = list(args), dict(env)
        super().__init__(None, config=config, log=log, ports=ports, ready_timeout=60)

    def _start(self, extra_args, env):
        base = {k: v for k, v in os.environ.items() if not k.startswith("MERIDIAN_")}
        self.proc = subprocess.Popen([str(BIN), *self.chart_args], stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, env={**base, **self.chart_env})


def service_account_kubeconfig(cluster, namespace, name, path: Path) -> Path:
    """A kubeconfig with a token of the ServiceAccount (TokenRequest API), as the pod's
    projected token would be: what `hub.inCluster` authenticates with."""
    status, body = cluster.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
    assert status == 201, f"TokenRequest for {namespace}/{name}: {status} {body}"
    cluster._write_kubeconfig(path, f"system:serviceaccount:{namespace}:{name}", body["status"]["token"])
    return path


def crd_names(chart):
    return [d["metadata"]["name"] for f in sorted((chart / "crds").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]


def test_installed_charts_serve_dns_for_a_member_service(helm, bare_fleet, coredns_bin, tmp_path):
    """`helm install` of both charts into bare API servers, then meridian run as the
    installed Deployment says, against them.

    Taken from the installed objects as they are: the container's args (`serve --config
    <mount>/meridian.yaml --log-format json`), its environment (MERIDIAN_IDENTITY from the
    pod name: a made-up pod name here) and the ConfigMap's meridian.yaml. Changed, because a
    test machine is not a pod: the config file's path (the ConfigMap is not mounted), the
    three listen addresses (free loopback ports instead of 0.0.0.0 and the container ports)
    and `hub.inCluster` (there is no service account mount or KUBERNETES_SERVICE_HOST) —
    replaced by a kubeconfig with a token of the chart's own ServiceAccount, so meridian
    acts on the hub with exactly the chart's RBAC; in the member it acts as User meridian,
    bound only by the member chart. The member is registered through a Secret in the
    release namespace, as the chart's NOTES say.

    meridian must get ready on the probes' paths, take the Lease, answer DNS for a Service
    exported in the member (directly, and through CoreDNS running the member chart's
    snippet), and write the ServiceImport back into the member; `helm uninstall` then removes
    the charts' objects and keeps the CRDs."""
    hub, m1 = bare_fleet.hub, bare_fleet.cluster("m1")
    dns_port, admin_port, xds_port = free_port(), free_port(), free_port()

    # The README's install line, values and all.
    ok(helm("install", "meridian", HUB_CHART, "--namespace", RELEASE_NAMESPACE, "--create-namespace",
            "--set", "image.repository=registry.example/meridian",
            "--set", "service.dns.type=LoadBalancer,service.dns.externalTrafficPolicy=Local",
            kubeconfig=hub.admin_kubeconfig))
    ok(helm("install", "meridian-member", MEMBER_CHART, "--namespace", MEMBER_NAMESPACE,
            "--set", f"coredns.forwardTo={{127.0.0.1:{dns_port}}}", kubeconfig=m1.admin_kubeconfig))
    for name, ns, c in (("meridian", RELEASE_NAMESPACE, hub), ("meridian-member", MEMBER_NAMESPACE, m1)):
        status = json.loads(ok(helm("status", name, "--namespace", ns, "--output", "json",
                                    kubeconfig=c.admin_kubeconfig)))
        assert status["info"]["status"] == "deployed", status["info"]
    hub.wait_crds_established(crd_names(HUB_CHART))
    m1.wait_crds_established(crd_names(MEMBER_CHART))

    # What helm installed: the Deployment, its ConfigMap, the Services.
    deployment = hub.get("apps/v1", "Deployment", "meridian", RELEASE_NAMESPACE)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    cm = hub.get(CORE, "ConfigMap", "meridian", RELEASE_NAMESPACE)
    dns_service = hub.get(CORE, "Service", "meridian-dns", RELEASE_NAMESPACE)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert sorted((p["protocol"], p["port"], p["targetPort"]) for p in dns_service["spec"]["ports"]) == [
        ("TCP", 53, "dns-tcp"), ("UDP", 53, "dns-udp")]
    assert dns_service["spec"]["clusterIP"]
    assert (dns_service["spec"]["type"], dns_service["spec"]["externalTrafficPolicy"]) == ("LoadBalancer", "Local")
    assert container["image"].startswith("registry.example/meridian:"), container["image"]
    assert dns_service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert pod["serviceAccountName"] == "meridian"
    sc = container["securityContext"]
    assert (sc["readOnlyRootFilesystem"], sc["runAsNonRoot"], sc["allowPrivilegeEscalation"], sc["capabilities"]) == (
        True, True, False, {"drop": ["ALL"]})
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    args = container["args"]
    config_path = args[args.index("--config") + 1]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert config_path == f"{mount['mountPath']}/meridian.yaml"
    config = yaml.safe_load(cm["data"]["meridian.yaml"])
    assert config["hub"] == {"inCluster": True, "namespace": RELEASE_NAMESPACE}
    assert (config["dns"]["listen"], config["xds"]["listen"], config["admin"]["listen"]) == (
        f"0.0.0.0:{ports['dns-udp']}", f"0.0.0.0:{ports['xds']}", f"0.0.0.0:{ports['admin']}")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "admin", "scheme": "HTTP"}, container[probe]
    env = {}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            assert e["valueFrom"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}, e
            env[e["name"]] = POD_NAME
    assert env.get("MERIDIAN_IDENTITY") == POD_NAME

    # The changes a test machine needs (see the docstring), and nothing else.
    config["hub"] = {"kubeconfig": str(service_account_kubeconfig(
        hub, RELEASE_NAMESPACE, pod["serviceAccountName"], tmp_path / "hub-sa.kubeconfig")),
        "namespace": config["hub"]["namespace"]}
    config["dns"]["listen"] = f"127.0.0.1:{dns_port}"
    config["xds"]["listen"] = f"127.0.0.1:{xds_port}"
    config["admin"]["listen"] = f"127.0.0.1:{admin_port}"
    test_config = tmp_path / "meridian.yaml"
    test_config.write_text(yaml.safe_dump(config, sort_keys=False))
    args = [str(test_config) if a == config_path else a for a in args]

    # The member: a namespace, an exported Service, and its registration through a Secret.
    m1.apply({"apiVersion": CORE, "kind": "Namespace", "metadata": {"name": "shop"}})
    bare_fleet.publish("m1", SERVICE, ENDPOINTS)
    bare_fleet.register_member("m1")
    assert hub.get(CORE, "Secret", bare_fleet.secret_name("m1"), RELEASE_NAMESPACE) is not None

    m = ChartMeridian(args, env, config=test_config, log=tmp_path / "meridian.log",
                      ports=(dns_port, admin_port, xds_port))
    try:
        for probe in ("readinessProbe", "livenessProbe"):
            assert m.http(container[probe]["httpGet"]["path"])[0] == 200, probe
        m.wait_for(lambda: m.addresses(NAME) == ENDPOINTS, timeout=20, what=f"{NAME} answered with m1's endpoints")
        lease = wait_for(lambda: (hub.get(COORDINATION, "Lease", config["leaderElection"]["leaseName"],
                                          RELEASE_NAMESPACE) or {}).get("spec", {}).get("holderIdentity"),
                         timeout=20, what="the Lease held", log=m)
        assert lease == POD_NAME
        # The leader writes into the member (the member chart's RBAC) and the hub's status.
        # (spec and status are two writes: the status subresource comes second.)
        def imported():
            si = bare_fleet.service_import("m1", SERVICE) or {}
            clusters = [c["cluster"] for c in (si.get("status") or {}).get("clusters") or []]
            return si if si.get("spec", {}).get("ips") and clusters == ["m1"] else None
        wait_for(imported, timeout=20, what="the ServiceImport in m1, with ips and status.clusters [m1]", log=m)
        wait_for(lambda: bare_fleet.member_status("m1").get("health") == "Healthy", timeout=20,
                 what="MemberCluster m1's status Healthy", log=m)
        problems = json.loads(m.http("/debug/problems")[1])
        assert "forbidden" not in json.dumps(problems).lower(), problems

        # CoreDNS with the member chart's snippet (bound to loopback on a free port here).
        snippet = m1.get(CORE, "ConfigMap", "meridian-member-coredns", MEMBER_NAMESPACE)["data"]["meridian.server"]
        assert snippet.count(f"forward . 127.0.0.1:{dns_port}") == 2, snippet
        coredns_port = free_port()
        corefile = tmp_path / "Corefile"
        corefile.write_text(snippet.replace(":53 {", f":{coredns_port} {{\n    bind 127.0.0.1"))
        peer = Peer("coredns", [coredns_bin, "-conf", str(corefile)], tmp_path / "coredns.log", coredns_port)
        try:
            peer.wait_answering(NAME)
            assert addresses_of(ask(coredns_port, NAME)) == ENDPOINTS
        finally:
            peer.stop()
    finally:
        m.stop()

    ok(helm("uninstall", "meridian", "--namespace", RELEASE_NAMESPACE, kubeconfig=hub.admin_kubeconfig))
    ok(helm("uninstall", "meridian-member", "--namespace", MEMBER_NAMESPACE, kubeconfig=m1.admin_kubeconfig))
    rbac = "rbac.authorization.k8s.io/v1"
    assert hub.get(rbac, "ClusterRole", "meridian-hub") is None
    assert hub.get("apps/v1", "Deployment", "meridian", RELEASE_NAMESPACE) is None
    assert m1.get(rbac, "ClusterRole", "meridian-member") is None
    status, _ = hub.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/memberclusters.meridian.io")
    assert status == 200, "helm never deletes a chart's CRDs"
