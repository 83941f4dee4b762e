//! The subcommands: `serve`, `validate`, `render`, `crds`, and the clients of a running meridian
//! (`status`, `resolve`, `explain`, `xds dump`, `xds clients`, `gateway kubeconfig`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use meridian_controllers::convert::MemberSource;
use meridian_controllers::{SourceEvent, directory, render};
use meridian_core::Snapshot;
use meridian_core::fleet::Fleet;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cli::{
    AdminClientArgs, AgentRunArgs, ApproveArgs, ClientArgs, Command, ExplainArgs, GatewayCommand,
    GatewayKubeconfigArgs, JoinArgs, JoinClusters, LogFormat, NodeRole, RenderArgs, ResolveArgs,
    ServeArgs, SimulateArgs, TokenCommand, TokenCreateArgs, UnjoinArgs, WhatIfArgs, XdsCommand,
    XdsDumpArgs,
};
use crate::out::{out, outln};
use crate::whatif::{PolicyFile, ScenarioRequest};
use crate::{app, config, telemetry};

pub async fn run(command: Command) -> Result<ExitCode> {
    match &command {
        // serve starts logging once its config is read: it says where traces go.
        Command::Serve(_) => {}
        Command::Validate(args) => {
            telemetry::init(args.log_format, None)?;
        }
        Command::Agent(args) => {
            telemetry::init(args.log_format, None)?;
        }
        _ => {
            telemetry::init(LogFormat::Plain, None)?;
        }
    }
    match command {
        Command::Serve(args) => serve(&args).await,
        Command::Validate(args) => validate(&args).await,
        Command::Render(args) => render_command(&args).await,
        Command::Status(args) => status(&args).await,
        Command::Resolve(args) => resolve(&args).await,
        Command::Explain(args) => explain(&args).await,
        Command::Simulate(args) => simulate(&args).await,
        Command::Xds(XdsCommand::Dump(args)) => xds_dump(&args).await,
        Command::Xds(XdsCommand::Clients(args)) => xds_clients(&args).await,
        Command::Xds(XdsCommand::Watch(args)) => crate::xds_watch::watch(&args).await,
        Command::Gateway(GatewayCommand::Kubeconfig(args)) => gateway_kubeconfig(&args).await,
        Command::Rollout(command) => crate::rollouts::run(&command).await,
        Command::Token(TokenCommand::Create(args)) => token_create(&args).await,
        Command::Approve(args) => approve(&args).await,
        Command::Agent(args) => agent(&args).await,
        Command::Join(args) => join(&args).await,
        Command::Unjoin(args) => unjoin(&args).await,
        Command::Diagnose(args) => crate::diagnose::run(&args).await,
        Command::Crds => {
            out!("{}", meridian_controllers::crd::meridian_crds_yaml()?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut cli = crate::cli::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cli, "meridian", &mut script);
            out!("{}", String::from_utf8_lossy(&script));
            Ok(ExitCode::SUCCESS)
        }
        Command::Version => {
            outln!("meridian {}", crate::cli::VERSION);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `meridian serve`: the config, then logging and traces as it says, then the app; the last
/// spans are sent on the way out.
async fn serve(args: &ServeArgs) -> Result<ExitCode> {
    let cfg = config::load(args)?;
    let telemetry = telemetry::init(args.log_format, cfg.tracing.as_ref())?;
    let served = app::serve(cfg).await;
    telemetry.finish();
    served.map(|()| ExitCode::SUCCESS)
}

/// The longest a bootstrap token may admit: a week (kubeadm's tokens default to a day).
const MAX_TOKEN_TTL_SECONDS: u64 = 7 * 24 * 3600;

/// `meridian token create`: a token kept where the hub keeps its agent state; prints it.
async fn token_create(args: &TokenCreateArgs) -> Result<ExitCode> {
    if !meridian_core::is_cluster_name(&args.cluster) {
        bail!(
            "{:?} is not a cluster name (a DNS label: a-z, 0-9, '-')",
            args.cluster
        );
    }
    if args.ttl == 0 || args.ttl > MAX_TOKEN_TTL_SECONDS {
        bail!("--ttl must be between 1s and 168h");
    }
    let cfg = config::load(&args.serve)?;
    let store = app::agent_store(&cfg).await?;
    if !args.new_member && !is_agent_member(&cfg, &store, &args.cluster).await? {
        bail!(
            "no MemberCluster {} with `source: {{agent: {{}}}}` on this hub: its agent would be refused; \
             add the MemberCluster first, or pass --new-member to make the token before it",
            args.cluster
        );
    }
    let expires = SystemTime::now() + Duration::from_secs(args.ttl);
    let token = store
        .new_token(meridian_core::ClusterId::new(&args.cluster), expires)
        .await
        .context("cannot keep the token")?;
    outln!("{}", token.presented());
    eprintln!(
        "token {} admits one agent of cluster {} for {}s",
        token.id, args.cluster, args.ttl
    );
    Ok(ExitCode::SUCCESS)
}

/// Whether the hub names `cluster` as a member whose objects come from an agent.
async fn is_agent_member(
    cfg: &config::Config,
    store: &meridian_agent::HubStore,
    cluster: &str,
) -> Result<bool> {
    match store {
        meridian_agent::HubStore::Secrets { client, .. } => {
            let members: kube::Api<meridian_controllers::crd::MemberCluster> =
                kube::Api::all(client.clone());
            let member = members
                .get_opt(cluster)
                .await
                .context("reading the MemberCluster on the hub")?;
            Ok(member.is_some_and(|m| m.spec.source.agent.is_some()))
        }
        meridian_agent::HubStore::Directory(_) => {
            let config::HubSource::Directory(dir) = &cfg.hub else {
                bail!("the agent state is a directory only on a directory hub");
            };
            let hub = directory::read_hub(dir).context("the hub directory")?;
            Ok(hub
                .members
                .iter()
                .any(|m| m.spec.id.as_str() == cluster && matches!(m.source, MemberSource::Agent)))
        }
    }
}

/// `meridian approve`: approves the key that asked to join as the cluster; the agent's next
/// attempt is signed.
async fn approve(args: &ApproveArgs) -> Result<ExitCode> {
    let cfg = config::load(&args.serve)?;
    let store = app::agent_store(&cfg).await?;
    let approved = store
        .approve(&meridian_core::ClusterId::new(&args.cluster))
        .await
        .context("nothing approved")?;
    for token in approved {
        let key = token.request.as_ref().map_or("", |r| r.key.as_str());
        outln!("approved {}: key sha256:{key}", token);
    }
    Ok(ExitCode::SUCCESS)
}

/// A kubeconfig: the file given, else KUBECONFIG's or ~/.kube/config; with the directory its
/// relative paths start from.
fn read_kubeconfig(
    file: Option<&std::path::Path>,
) -> Result<(kube::config::Kubeconfig, std::path::PathBuf)> {
    match file {
        Some(path) => {
            let config = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let dir = path
                .parent()
                .unwrap_or(std::path::Path::new("."))
                .to_path_buf();
            Ok((config, dir))
        }
        None => {
            let config = kube::config::Kubeconfig::read()
                .context("reading the kubeconfig (KUBECONFIG or ~/.kube/config)")?;
            Ok((config, std::env::current_dir()?))
        }
    }
}

async fn kube_client(
    config: kube::config::Kubeconfig,
    context: Option<&str>,
) -> Result<kube::Client> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(config, &options).await?;
    Ok(kube::Client::try_from(config)?)
}

/// The hub's client, and the member's (with its kubeconfig and that file's directory).
async fn join_clients(
    clusters: &JoinClusters,
) -> Result<(
    kube::Client,
    kube::Client,
    kube::config::Kubeconfig,
    std::path::PathBuf,
)> {
    let (hub_config, hub_dir) = read_kubeconfig(clusters.hub_kubeconfig.as_deref())?;
    let (member_config, member_dir) = match &clusters.member_kubeconfig {
        Some(path) => read_kubeconfig(Some(path))?,
        None => (hub_config.clone(), hub_dir),
    };
    let hub = kube_client(hub_config, clusters.hub_context.as_deref())
        .await
        .context("the hub")?;
    let member = kube_client(member_config.clone(), clusters.member_context.as_deref())
        .await
        .context("the member")?;
    Ok((hub, member, member_config, member_dir))
}

fn cluster_name(name: &str) -> Result<meridian_core::ClusterId> {
    if !meridian_core::is_cluster_name(name) {
        bail!("{name:?} is not a cluster name (a DNS label: a-z, 0-9, '-')");
    }
    Ok(meridian_core::ClusterId::new(name))
}

/// `meridian join`: the member's access, made and registered; or with --dry-run, printed.
async fn join(args: &JoinArgs) -> Result<ExitCode> {
    use meridian_controllers::kubernetes::join;
    let (hub, member, member_config, member_dir) = join_clients(&args.clusters).await?;
    let mut request = join::Join {
        cluster: cluster_name(&args.cluster)?,
        hub_namespace: args.clusters.hub_namespace.clone(),
        region: args.region.clone(),
        zone: args.zone.clone(),
        network: args.network.clone(),
        dns_client_cidrs: args.dns_client_cidrs.clone(),
        propagation: args.propagation,
        agent: args.agent,
        token_seconds: i64::try_from(args.token_ttl).unwrap_or(i64::MAX),
    };
    for cidr in &request.dns_client_cidrs {
        cidr.parse::<ipnet::IpNet>()
            .with_context(|| format!("--dns-client-cidr {cidr:?} is not a CIDR"))?;
    }
    let mut report = join::Report::default();
    let server = if args.agent {
        None
    } else {
        join::fill_topology(&member, &mut request, &mut report).await?;
        Some(join::MemberServer::from_kubeconfig(
            &member_config,
            args.clusters.member_context.as_deref(),
            &member_dir,
        )?)
    };
    let done = join::join(
        &hub,
        server.as_ref().map(|s| (&member, s)),
        &request,
        args.dry_run,
    )
    .await?;
    report.lines.extend(done.lines);
    for line in &report.lines {
        eprintln!("{line}");
    }
    if args.dry_run {
        for object in &done.objects {
            out!("---\n{}", serde_yaml_ng::to_string(object)?);
        }
    } else if args.agent {
        let c = &request.cluster;
        outln!("MemberCluster {c} made with `source: {{agent: {{}}}}`. Next:");
        outln!(
            "  # on the hub, with its config (and the agent CA: <stateDir>/ca.crt or Secret meridian-agent-ca)"
        );
        outln!("  meridian token create --cluster {c} --ttl 1h > token");
        outln!("  # in the member");
        outln!(
            "  kubectl -n meridian-system create secret generic meridian-agent-bootstrap --from-file=token"
        );
        outln!(
            "  kubectl -n meridian-system create configmap meridian-agent-ca --from-file=ca.crt=agent-ca.crt"
        );
        outln!("  helm install meridian-member deploy/helm/meridian-member -n meridian-system \\");
        outln!("    --set agent.enabled=true,agent.hub=HUB_AGENT_HOST:PORT,agent.cluster={c}");
    } else {
        outln!(
            "joined {}: meridian reads it with the kubeconfig in Secret {}/meridian-member-{}",
            request.cluster,
            request.hub_namespace,
            request.cluster
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `meridian unjoin`: the MemberCluster (once meridian lets go), the Secret, the member's side.
async fn unjoin(args: &UnjoinArgs) -> Result<ExitCode> {
    use meridian_controllers::kubernetes::join;
    let cluster = cluster_name(&args.cluster)?;
    let (hub, member, _, _) = join_clients(&args.clusters).await?;
    let report = join::unjoin(
        &hub,
        Some(&member),
        &cluster,
        &args.clusters.hub_namespace,
        Duration::from_secs(args.wait),
    )
    .await?;
    for line in &report.lines {
        eprintln!("{line}");
    }
    outln!("unjoined {cluster}");
    Ok(ExitCode::SUCCESS)
}

/// Where `meridian agent` keeps its key and certificates (clap makes it exactly one of the two).
fn agent_state(args: &AgentRunArgs, member: &kube::Client) -> Result<meridian_agent::AgentState> {
    match (&args.state_dir, &args.state_secret) {
        (Some(dir), _) => Ok(meridian_agent::AgentState::Directory(dir.clone())),
        (None, Some(secret)) => {
            let (namespace, name) = secret
                .split_once('/')
                .filter(|(ns, name)| {
                    meridian_core::is_cluster_name(ns) && !name.is_empty() && !name.contains('/')
                })
                .with_context(|| format!("--state-secret {secret:?}: NAMESPACE/NAME"))?;
            Ok(meridian_agent::AgentState::secret(
                member.clone(),
                namespace,
                name,
            ))
        }
        (None, None) => bail!("--state-dir or --state-secret"),
    }
}

/// `meridian agent`: the member's side, until the process is stopped.
async fn agent(args: &AgentRunArgs) -> Result<ExitCode> {
    if !meridian_core::is_cluster_name(&args.cluster) {
        bail!("--cluster {:?} is not a cluster name", args.cluster);
    }
    let member = match &args.kubeconfig {
        Some(path) => {
            meridian_controllers::kubernetes::connect::from_kubeconfig(path, args.context.as_deref())
                .await
                .context("the member's kubeconfig")?
                .client
        }
        None => kube::Client::try_default()
            .await
            .context("no --kubeconfig, and neither KUBECONFIG, ~/.kube/config nor an in-cluster service account")?,
    };
    let settings = meridian_agent::AgentSettings {
        hub: args.hub.clone(),
        cluster: meridian_core::ClusterId::new(&args.cluster),
        token_file: args.bootstrap_token_file.clone(),
        hub_ca_file: args.hub_ca_file.clone(),
        state: agent_state(args, &member)?,
        watch_timeout: Default::default(),
    };
    let side = serve_agent_admin(args.admin_listen).await?;
    meridian_agent::member::run(settings, member, side).await?;
    Ok(ExitCode::SUCCESS)
}

/// The agent's admin server (bound now: a port in use stops the agent at once).
async fn serve_agent_admin(listen: SocketAddr) -> Result<meridian_agent::metrics::AgentSide> {
    use meridian_listen::{Health, Listener, ListenerMetrics, ListenerSettings};
    let mut registry = prometheus_client::registry::Registry::with_prefix("meridian");
    let listener_metrics = ListenerMetrics::new(registry.sub_registry_with_prefix("listener"));
    let side = meridian_agent::metrics::AgentSide::new(registry.sub_registry_with_prefix("agent"));
    let tcp = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen for the agent's admin server on {listen}"))?;
    let timeout = Duration::from_secs(10);
    let settings = ListenerSettings {
        max_connections: 64,
        handshake_timeout: timeout,
        handshake_bytes: 16,
        idle_timeout: Duration::from_secs(60),
        quiet_eviction: None,
        max_per_source: None,
    };
    let listener = Listener::new(
        "admin",
        tcp,
        settings,
        &Health::default(),
        &listener_metrics,
    );
    let router = crate::admin::agent_router(std::sync::Arc::new(registry), side.clone());
    tokio::spawn(crate::admin::serve(
        listener,
        router,
        timeout,
        listener_metrics,
    ));
    tracing::info!(admin = %listen, "agent admin server");
    Ok(side)
}

/// Prints the decision for a service in words (or as JSON).
async fn explain(args: &ExplainArgs) -> Result<ExitCode> {
    let body = if args.whatif.is_empty() {
        let mut path = match template_ref(&args.service, args.namespace.is_some()) {
            Some((kind, name)) => format!(
                "/debug/explain?kind={}&name={}&namespace={}",
                encode(&kind),
                encode(name),
                encode(args.namespace.as_deref().unwrap_or("default"))
            ),
            None => format!("/debug/explain?service={}", encode(&args.service)),
        };
        if let Some(c) = &args.from_cluster {
            path.push_str(&format!("&cluster={}", encode(c)));
        }
        AdminClient::new(&args.client.admin)?
            .get_json(&path)
            .await?
    } else {
        let mut request = serde_json::json!({
            "cluster": args.from_cluster,
            "scenario": scenario_request(&args.whatif)?,
        });
        match template_ref(&args.service, args.namespace.is_some()) {
            Some((kind, name)) => {
                request["kind"] = kind.into();
                request["name"] = name.into();
                request["namespace"] = args.namespace.as_deref().unwrap_or("default").into();
            }
            None => request["service"] = args.service.as_str().into(),
        }
        AdminClient::new(&args.client.admin)?
            .post_json("/debug/explain", &request)
            .await?
    };
    print_words(&body, args.client.json)
}

/// A `/debug/explain` or `/debug/simulate` answer: its error, or its words (or the JSON).
fn print_words(body: &Value, json: bool) -> Result<ExitCode> {
    if let Some(err) = body.get("error") {
        bail!("{}", text(err));
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(body)?);
        return Ok(ExitCode::SUCCESS);
    }
    for line in body["words"].as_array().into_iter().flatten() {
        outln!("{}", text(line));
    }
    Ok(ExitCode::SUCCESS)
}

/// The scenario of the what-if flags, with each policy file read here (the server may not
/// see this machine's files).
fn scenario_request(args: &WhatIfArgs) -> Result<ScenarioRequest> {
    let policies = args
        .policies
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --assume-policy {}", path.display()))?;
            Ok(PolicyFile {
                file: path.display().to_string(),
                text,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ScenarioRequest {
        assume: args.assume.clone(),
        remove: args.remove.clone(),
        policies,
        after_seconds: args.after,
    })
}

/// Prints what would change under the assumptions, in words (or as JSON).
async fn simulate(args: &SimulateArgs) -> Result<ExitCode> {
    if let Some(policy) = &args.rollout {
        let body = AdminClient::new(&args.client.admin)?
            .get_json(&format!("/debug/rollout?policy={}", encode(policy)))
            .await?;
        return print_words(&body, args.client.json);
    }
    if args.whatif.is_empty() {
        bail!("nothing to simulate: give --assume, --assume-remove, --assume-policy or --rollout");
    }
    let request = serde_json::to_value(scenario_request(&args.whatif)?)?;
    let body = AdminClient::new(&args.client.admin)?
        .post_json("/debug/simulate", &request)
        .await?;
    if let Some(errors) = body.get("errors").and_then(Value::as_array) {
        for e in errors {
            eprintln!("error: {}", text(e));
        }
        bail!("the scenario is not valid; nothing was simulated");
    }
    print_words(&body, args.client.json)
}

/// kubectl's names for the kinds templates most often are, singular, plural and short.
const KIND_NAMES: &[(&str, &[&str])] = &[
    ("Deployment", &["deployment", "deployments", "deploy"]),
    ("StatefulSet", &["statefulset", "statefulsets", "sts"]),
    ("DaemonSet", &["daemonset", "daemonsets", "ds"]),
    ("ReplicaSet", &["replicaset", "replicasets", "rs"]),
    ("Job", &["job", "jobs"]),
    ("CronJob", &["cronjob", "cronjobs", "cj"]),
    ("Pod", &["pod", "pods", "po"]),
    ("ConfigMap", &["configmap", "configmaps", "cm"]),
    ("Secret", &["secret", "secrets"]),
    ("Service", &["service", "services", "svc"]),
    (
        "ServiceAccount",
        &["serviceaccount", "serviceaccounts", "sa"],
    ),
    ("Ingress", &["ingress", "ingresses", "ing"]),
    ("HTTPRoute", &["httproute", "httproutes"]),
    ("GRPCRoute", &["grpcroute", "grpcroutes"]),
    (
        "PersistentVolumeClaim",
        &["persistentvolumeclaim", "persistentvolumeclaims", "pvc"],
    ),
    (
        "HorizontalPodAutoscaler",
        &["horizontalpodautoscaler", "horizontalpodautoscalers", "hpa"],
    ),
    (
        "PodDisruptionBudget",
        &["poddisruptionbudget", "poddisruptionbudgets", "pdb"],
    ),
    (
        "NetworkPolicy",
        &["networkpolicy", "networkpolicies", "netpol"],
    ),
    ("Role", &["role", "roles"]),
    ("RoleBinding", &["rolebinding", "rolebindings"]),
];

/// Whether `explain`'s argument names a template, as (kind, name): `Deployment/web`, or as
/// kubectl spells it (`deployment/web`, `deploy/web`, `deployments.apps/web`); any `kind/name`
/// with `--namespace` (the namespace of a service is in its own name). Otherwise, as in
/// `shop/web`, it is NAMESPACE/NAME of a service.
fn template_ref(arg: &str, namespace_given: bool) -> Option<(String, &str)> {
    let (kind, name) = arg.split_once('/')?;
    let bare = kind.split('.').next().unwrap_or(kind);
    if bare.starts_with(|c: char| c.is_ascii_uppercase()) {
        return Some((bare.to_owned(), name));
    }
    let known = KIND_NAMES
        .iter()
        .find(|(_, names)| names.contains(&bare.to_ascii_lowercase().as_str()));
    match known {
        Some((kind, _)) => Some(((*kind).to_owned(), name)),
        None => namespace_given.then(|| (bare.to_owned(), name)),
    }
}

/// Prints what a node would receive: JSON, decoded from the bytes meridian would send.
async fn xds_dump(args: &XdsDumpArgs) -> Result<ExitCode> {
    let role = match args.node.role {
        NodeRole::Envoy => "envoy",
        NodeRole::Proxyless => "proxyless",
        NodeRole::EastwestGateway => "eastwest-gateway",
    };
    let mut path = format!("/debug/xds/dump?role={role}");
    if let Some(c) = &args.node.node_cluster {
        path.push_str(&format!("&cluster={}", encode(c)));
    }
    if let Some(n) = &args.node.node_network {
        path.push_str(&format!("&network={}", encode(n)));
    }
    let body = AdminClient::new(&args.client.admin)?
        .get_json(&path)
        .await?;
    if let Some(err) = body.get("error") {
        bail!("{}", text(err));
    }
    if args.client.json {
        outln!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    let node = &body["node"];
    outln!(
        "node: role {}, cluster {}, network {}; snapshot {}",
        text(&node["role"]),
        node["cluster"].as_str().unwrap_or("(none)"),
        node["network"].as_str().unwrap_or("of its cluster"),
        text(&body["feed"]["snapshotVersion"])
    );
    for kind in meridian_xds::Kind::ALL {
        let resources = body["feed"]["resources"][kind.short()]
            .as_array()
            .cloned()
            .unwrap_or_default();
        outln!("{}: {} resource(s)", kind.short(), resources.len());
        for r in &resources {
            let name = r["name"].as_str().unwrap_or("?");
            for line in crate::xds_watch::resource_lines(kind, " ", name, &r["detail"]) {
                outln!("{line}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the connected xDS clients, one line per stream and type.
async fn xds_clients(args: &ClientArgs) -> Result<ExitCode> {
    let body = AdminClient::new(&args.admin)?
        .get_json("/debug/xds")
        .await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<24} {:<12} {:<6} {:<4} {:>6} {:<18} {:<18}  LAST ERROR",
        "NODE",
        "CLUSTER",
        "PROTO",
        "TYPE",
        "NAMES",
        "SENT",
        "ACKED"
    );
    for c in body["clients"].as_array().into_iter().flatten() {
        let node = &c["node"];
        for (kind, t) in c["types"].as_object().into_iter().flatten() {
            outln!(
                "{:<24} {:<12} {:<6} {:<4} {:>6} {:<18} {:<18}  {}",
                text(&node["id"]),
                text(&node["group"]["cluster"]),
                text(&c["protocol"]),
                kind,
                t["sent"].as_object().map_or(0, |m| m.len()),
                text(&t["sentVersion"]),
                text(&t["ackedVersion"]),
                text(&t["lastError"]),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A fleet read once from a hub directory and its directory members, with the events their
/// sources send, so `validate` and `render` decide exactly what `serve` would.
struct ReadOnce {
    hub_directory: std::path::PathBuf,
    members: usize,
    snapshot: Snapshot,
    /// Member directories that cannot be read.
    unreadable: Vec<String>,
    /// How long deciding every placement took.
    placement_took: std::time::Duration,
}

/// How long `render` waits for scoring webhooks (more than the longest timeoutMillis).
const WEBHOOK_WAIT: std::time::Duration = std::time::Duration::from_secs(35);

/// Reads the hub and the directory members once and decides. With `call_webhooks`, scoring
/// webhooks are called and the placement decided again until none is waiting for an answer
/// (at most [`WEBHOOK_WAIT`]); without, they fail and their failurePolicy applies.
async fn read_once(cfg: &config::Config, what: &str, call_webhooks: bool) -> Result<ReadOnce> {
    let config::HubSource::Directory(hub_directory) = &cfg.hub else {
        bail!(
            "{what} reads a hub directory; a Kubernetes hub validates its objects itself (the CRD schemas)"
        );
    };
    let hub = directory::read_hub(hub_directory).context("the hub")?;
    let now = Instant::now();
    let mut fleet = Fleet::new(now, cfg.sync_deadline);
    let (answers_tx, mut answers) = tokio::sync::mpsc::channel(1024);
    let runners = std::sync::Arc::new(if call_webhooks {
        let mut unused = prometheus_client::registry::Registry::default();
        let (runners, calls) = crate::programs::Runners::serving(answers_tx, &mut unused);
        tokio::spawn(calls);
        runners
    } else {
        crate::programs::Runners::offline()
    });
    fleet.set_programs(runners.clone());
    fleet.apply(
        SourceEvent::Members {
            specs: hub.members.iter().map(|m| m.spec.clone()).collect(),
            policies: hub.policies,
            problems: hub.errors,
            warnings: hub.warnings,
        },
        now,
    );
    fleet.apply(
        SourceEvent::Templates {
            templates: hub.templates,
            overrides: hub.overrides,
        },
        now,
    );
    fleet.apply(
        SourceEvent::Tenants(meridian_core::Tenants::listed(hub.tenants)),
        now,
    );
    fleet.apply(
        SourceEvent::Routes {
            routes: hub.routes,
            grants: hub.grants,
        },
        now,
    );
    // The geo ranges as `serve` reads them: bad lines and conflicts are problems here too.
    if !cfg.geo.is_empty() {
        let geo = meridian_controllers::geo::GeoSource::new(cfg.geo.clone());
        fleet.apply(geo.event(), now);
    }
    let mut unreadable = Vec::new();
    for member in &hub.members {
        // Only directory members can be read here; the others are checked as MemberClusters.
        let MemberSource::Directory(dir) = &member.source else {
            continue;
        };
        for event in directory::read_member(&member.spec.id, dir, &cfg.directory) {
            if let SourceEvent::Heartbeat {
                result: Err(reason),
                ..
            } = &event
            {
                unreadable.push(format!(
                    "{}: MemberCluster {}: member directory cannot be read: {reason}",
                    dir.display(),
                    member.spec.id
                ));
            }
            fleet.apply(event, now);
        }
    }
    let empty = Snapshot::empty();
    let published = fleet.publish(&empty, now);
    let placement_took = published.placement.unwrap_or_default();
    let mut snapshot = published.snapshot;
    let give_up = Instant::now() + WEBHOOK_WAIT;
    while runners.calls_in_flight() > 0 && Instant::now() < give_up {
        while runners.calls_in_flight() > 0 && Instant::now() < give_up {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        while answers.try_recv().is_ok() {}
        fleet.apply(SourceEvent::ProgramsAnswered, now);
        snapshot = fleet.publish(&empty, now).snapshot;
    }
    Ok(ReadOnce {
        placement_took,
        hub_directory: hub_directory.clone(),
        members: hub.members.len(),
        snapshot,
        unreadable,
    })
}

/// Problems of rendering that the snapshot does not already name: overrides that cannot
/// apply in a cluster (an unschedulable template is a snapshot problem already).
fn render_problems(rendered: &meridian_federation::render::Rendered) -> Vec<String> {
    rendered
        .problems
        .iter()
        .filter_map(|p| {
            let cluster = p.cluster.as_ref()?;
            Some(format!(
                "{} {}/{} in {cluster}: not rendered: {}",
                p.template.kind, p.template.namespace, p.template.name, p.reason
            ))
        })
        .collect()
}

/// Checks the config and every manifest it reaches. Prints one line per problem.
async fn validate(args: &ServeArgs) -> Result<ExitCode> {
    let cfg = config::load(args)?;
    let read = read_once(&cfg, "validate", false).await?;
    let snapshot = &read.snapshot;
    for w in &snapshot.warnings {
        outln!("warning: {w}");
    }
    for view in snapshot.services() {
        for c in &view.conflicts {
            outln!(
                "warning: {}: ServiceExport {} in {}: conflict: {}",
                read.hub_directory.display(),
                view.key,
                c.cluster,
                c.reason
            );
        }
    }
    let not_rendered = render_problems(&render::render_snapshot(snapshot));
    for p in &snapshot.problems {
        outln!("error: {p}");
    }
    for e in read.unreadable.iter().chain(&not_rendered) {
        outln!("error: {e}");
    }
    let failed = snapshot.problems.len() + read.unreadable.len() + not_rendered.len();
    outln!(
        "{} member(s), {} exported service(s), {} endpoint(s), {} placed template(s); {} error(s), {} warning(s)",
        read.members,
        snapshot.service_count(),
        snapshot.sizes.endpoints,
        snapshot.placements.decisions.len(),
        failed,
        snapshot.warnings.len()
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One line per template whose files `render` kept: where, and why it is not rendered now.
fn kept_lines(snapshot: &Snapshot, kept: &[(std::path::PathBuf, String)]) -> Vec<String> {
    let mut by_template: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (path, template) in kept {
        by_template
            .entry(template)
            .or_default()
            .push(path.display().to_string());
    }
    by_template
        .into_iter()
        .map(|(template, paths)| {
            let why = snapshot
                .placements
                .decisions
                .iter()
                .find(|(k, _)| k.to_string() == template)
                .and_then(|(_, d)| match &d.outcome {
                    meridian_core::placement::Outcome::Unschedulable { reason } => {
                        Some(format!("unschedulable now because {reason}"))
                    }
                    meridian_core::placement::Outcome::Scheduled => None,
                })
                .unwrap_or_else(|| "a dependency of an unschedulable workload".to_owned());
            format!(
                "kept: {template}: as rendered before ({}): {why}",
                paths.join(", ")
            )
        })
        .collect()
}

/// Renders every placed object into `--out` (`<cluster>/<namespace>/<Kind>.<name>.yaml`),
/// removing the files it wrote earlier that are no longer placed. Exits non-zero, naming each
/// problem, when any template is unschedulable or any override cannot apply; the objects
/// that could be rendered are written all the same.
async fn render_command(args: &RenderArgs) -> Result<ExitCode> {
    let cfg = config::load(&args.serve)?;
    let read = read_once(&cfg, "render", true).await?;
    let rendered = render::render_snapshot(&read.snapshot);
    let keep = render::Keep::of(&read.snapshot);
    let synced = render::sync_dir(&args.out, &rendered.files, &keep)
        .with_context(|| format!("writing {}", args.out.display()))?;
    let not_rendered = render_problems(&rendered);
    for p in &read.snapshot.problems {
        eprintln!("error: {p}");
    }
    for line in kept_lines(&read.snapshot, &synced.kept) {
        eprintln!("{line}");
    }
    for e in read.unreadable.iter().chain(&not_rendered) {
        eprintln!("error: {e}");
    }
    outln!(
        "{} file(s) for {} template(s), decided in {:.1} ms: {} written, {} unchanged, {} removed",
        rendered.files.len(),
        read.snapshot.placements.decisions.len(),
        read.placement_took.as_secs_f64() * 1000.0,
        synced.written.len(),
        synced.unchanged,
        synced.removed.len()
    );
    let failed = read.snapshot.problems.len() + read.unreadable.len() + not_rendered.len();
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn status(args: &ClientArgs) -> Result<ExitCode> {
    let admin = AdminClient::new(&args.admin)?;
    let body = admin.get_json("/debug/clusters").await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "snapshot {} ({})",
        body["version"],
        if body["synced"] == true {
            "synced"
        } else {
            "not synced yet"
        }
    );
    out!("{}", status_table(&body));
    // An older meridian has no /debug/shards: the table is the whole status then.
    if let Ok(shards) = admin.get_json("/debug/shards").await {
        out!("{}", shards_summary(&shards));
    }
    if let Ok(agents) = admin.get_json("/debug/agents").await {
        out!("{}", agents_summary(&agents, SystemTime::now()));
    }
    Ok(ExitCode::SUCCESS)
}

/// Each agent member's agent: connected, its certificate's expiry, its last heartbeat;
/// empty when there are no agent members.
fn agents_summary(body: &Value, now: SystemTime) -> String {
    let empty = serde_json::Map::new();
    let agents = body["agents"].as_object().unwrap_or(&empty);
    let waiting = body["waitingForApproval"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if agents.is_empty() && waiting.is_empty() {
        return String::new();
    }
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let ago = |v: &Value| match v.as_u64() {
        Some(t) => format!("{}s ago", now.saturating_sub(t)),
        None => "never".into(),
    };
    let mut out = String::from("\nagents\n");
    for w in waiting {
        out.push_str(&format!(
            "  {}: waiting for approval since {} (key {}): meridian approve {}\n",
            w["cluster"].as_str().unwrap_or("?"),
            ago(&w["since"]),
            w["key"].as_str().unwrap_or("?"),
            w["cluster"].as_str().unwrap_or("?"),
        ));
    }
    for (cluster, a) in agents {
        let state = if a["connected"] == true {
            "connected"
        } else {
            "not connected"
        };
        let expires = match a["certificateExpires"].as_u64() {
            Some(t) if t > now => format!("certificate expires in {}s", t - now),
            Some(_) => "certificate expired".into(),
            None => "no certificate seen".into(),
        };
        out.push_str(&format!(
            "  {cluster}: {state}, {expires}, last heartbeat {}\n",
            ago(&a["lastHeartbeat"])
        ));
    }
    out
}

/// Who writes which member (sharded writers), as this replica sees it; empty when not
/// sharded.
fn shards_summary(body: &Value) -> String {
    if body["sharded"] != true {
        return String::new();
    }
    let s = &body["shards"];
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect::<Vec<_>>()
    };
    let live = names(&s["liveReplicas"]);
    let mut out = format!(
        "\nshards: this replica {}, {} live replica(s) ({}), hub {}\n",
        text(&s["identity"]),
        live.len(),
        live.join(", "),
        if s["hubReadable"] == true {
            "readable"
        } else {
            "NOT readable: members unreachable from here are served stale, never withdrawn"
        }
    );
    let mut by_writer: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (member, m) in s["members"].as_object().into_iter().flatten() {
        let writer = match text(&m["claim"]) {
            w if w.is_empty() || w == "-" => "(nobody yet)".to_string(),
            w => w,
        };
        by_writer.entry(writer).or_default().push(member.clone());
    }
    for (writer, members) in by_writer {
        out.push_str(&format!(
            "  {writer} writes {}: {}\n",
            members.len(),
            members.join(", ")
        ));
    }
    for (member, c) in s["confirmations"].as_object().into_iter().flatten() {
        if c["confirmation"] != "confirmed" {
            out.push_str(&format!(
                "  {member}: unreachable from this replica only ({}): served, not withdrawn\n",
                text(&c["confirmation"])
            ));
        }
    }
    out
}

/// The members as a table whose columns are as wide as their widest cell, `-` for nothing.
fn status_table(body: &Value) -> String {
    const HEADER: [&str; 9] = [
        "CLUSTER",
        "HEALTH",
        "WITHDRAWN",
        "REGION",
        "ZONE",
        "NETWORK",
        "READY/ENDPOINTS",
        "CPU USED+ASSUMED/ALLOC",
        "REASON",
    ];
    let rows: Vec<[String; 9]> = body["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            [
                text(&c["name"]),
                text(&c["health"]),
                text(&c["withdrawn"]),
                text(&c["region"]),
                text(&c["zone"]),
                text(&c["network"]),
                format!("{}/{}", text(&c["readyEndpoints"]), text(&c["endpoints"])),
                cpu_cell(&c["capacity"]),
                text(&c["reason"]),
            ]
        })
        .map(|row| row.map(|cell| if cell.is_empty() { "-".into() } else { cell }))
        .collect();
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 9]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w - cell.chars().count();
            match i {
                // Counts align right; the last column is not padded at all.
                6 | 7 => out.push_str(&format!("{}{cell}  ", " ".repeat(pad))),
                8 => out.push_str(cell),
                _ => out.push_str(&format!("{cell}{}  ", " ".repeat(pad))),
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut table = line(HEADER);
    for row in &rows {
        table.push_str(&line(row.each_ref().map(String::as_str)));
    }
    table
}

/// A member's CPU as placement counts it, in cores: used by pods + assumed for decisions not
/// running yet / allocatable (empty when it reports no capacity).
fn cpu_cell(capacity: &Value) -> String {
    let cores = |r: &Value| r["cpuMillis"].as_u64().unwrap_or(0) as f64 / 1000.0;
    if capacity.is_null() {
        return String::new();
    }
    format!(
        "{:.1}+{:.1}/{:.1}",
        cores(&capacity["used"]),
        cores(&capacity["assumed"]),
        cores(&capacity["allocatable"])
    )
}

async fn resolve(args: &ResolveArgs) -> Result<ExitCode> {
    let mut path = format!(
        "/debug/resolve?name={}&type={}",
        encode(&args.name),
        encode(&args.qtype)
    );
    if let Some(c) = &args.from_cluster {
        path.push_str(&format!("&cluster={}", encode(c)));
    }
    if let Some(address) = &args.from {
        path.push_str(&format!("&from={}", encode(&address.to_string())));
    }
    let body = AdminClient::new(&args.client.admin)?
        .get_json(&path)
        .await?;
    if let Some(err) = body.get("error") {
        bail!("{}", text(err));
    }
    if args.client.json {
        outln!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    let cluster = body["clientCluster"]
        .as_str()
        .unwrap_or("an unknown cluster");
    let from = match &args.from {
        Some(address) => format!("{address} ({cluster})"),
        None => cluster.to_owned(),
    };
    outln!(
        "{} {} from {from}: {}",
        text(&body["name"]),
        text(&body["qtype"]),
        text(&body["rcode"])
    );
    for (section, key) in [
        ("answer", "answers"),
        ("authority", "authority"),
        ("additional", "additionals"),
    ] {
        for r in body[key].as_array().into_iter().flatten() {
            outln!("  {section:<10} {}", text(r));
        }
    }
    let Some(d) = body.get("decision").filter(|d| !d.is_null()) else {
        return Ok(ExitCode::SUCCESS);
    };
    outln!(
        "decision for {}{}:",
        text(&d["service"]),
        if d["headless"] == true {
            " (headless)"
        } else {
            ""
        }
    );
    for tier in d["tiers"].as_array().into_iter().flatten() {
        let reasons: Vec<String> = tier["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        outln!(
            "  priority {} ({}; {} ready):",
            tier["priority"],
            reasons.join(" + "),
            tier["ready"]
        );
        for m in tier["clusters"].as_array().into_iter().flatten() {
            outln!(
                "    {:<16} weight {:<5} ready {:<5}{}",
                text(&m["cluster"]),
                m["weight"],
                m["ready"],
                if m["viaGateway"] == true {
                    " via its east-west gateway"
                } else {
                    ""
                }
            );
        }
    }
    for f in d["filtered"].as_array().into_iter().flatten() {
        let detail = f
            .get("detail")
            .map(|d| format!(" ({})", text(d)))
            .unwrap_or_default();
        outln!(
            "  filtered {:<16} {}{detail}",
            text(&f["cluster"]),
            text(&f["reason"])
        );
    }
    if d["spills"].as_u64().unwrap_or(0) > 0 {
        outln!(
            "  {} tier(s) spilled into the next for lack of healthy endpoints",
            d["spills"]
        );
    }
    for c in d["conflicts"].as_array().into_iter().flatten() {
        outln!("  conflict: {}", text(c));
    }
    Ok(ExitCode::SUCCESS)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prints a kubeconfig for the gateway of the meridian at `args.admin`.
async fn gateway_kubeconfig(args: &GatewayKubeconfigArgs) -> Result<ExitCode> {
    let admin = AdminClient::new(&args.admin)?;
    let gateway = admin.get_json("/debug/gateway").await?;
    let server = match (&args.server, gateway["gateway"]["listen"].as_str()) {
        (Some(server), _) => server.clone(),
        (None, Some(listen)) => format!("https://{listen}"),
        (None, None) => bail!(
            "the meridian at {} runs no gateway (gateway.listen); --server names one elsewhere",
            args.admin.address
        ),
    };
    let clusters: Vec<String> = admin.get_json("/debug/clusters").await?["clusters"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let ca = match &args.certificate_authority {
        Some(path) => {
            Some(std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?)
        }
        None => None,
    };
    let credential = match &args.token_file {
        Some(path) => {
            meridian_gateway::kubeconfig::Credential::TokenFile(path.display().to_string())
        }
        None => meridian_gateway::kubeconfig::Credential::None,
    };
    let kubeconfig = meridian_gateway::kubeconfig::render(
        &server,
        ca.as_deref(),
        &clusters,
        &args.user,
        &credential,
    );
    out!("{}", serde_yaml_ng::to_string(&kubeconfig)?);
    Ok(ExitCode::SUCCESS)
}

/// A running meridian's admin server as the client commands reach it: minimal HTTP/1.1
/// requests (`Connection: close`), with the admin token when one is configured.
pub(crate) struct AdminClient {
    address: SocketAddr,
    token: Option<String>,
}

impl AdminClient {
    pub(crate) fn new(args: &AdminClientArgs) -> Result<Self> {
        let token = match &args.token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| {
                        format!("cannot read the admin token file {}", path.display())
                    })?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        Ok(Self {
            address: args.address,
            token,
        })
    }

    pub(crate) async fn get_json(&self, path: &str) -> Result<Value> {
        self.exchange("GET", path, None).await
    }

    pub(crate) async fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        self.exchange("POST", path, Some(&serde_json::to_vec(body)?))
            .await
    }

    /// Sends one request and reads its JSON answer.
    async fn exchange(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Value> {
        let admin = self.address;
        let mut request =
            format!("{method} {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n");
        if let Some(token) = &self.token {
            request.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if let Some(body) = body {
            request.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        request.push_str("\r\n");
        let mut request = request.into_bytes();
        request.extend_from_slice(body.unwrap_or_default());
        let mut stream = tokio::net::TcpStream::connect(admin)
            .await
            .with_context(|| format!("cannot reach meridian's admin server at {admin} (is `meridian serve` running? set --admin)"))?;
        stream.write_all(&request).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .context("malformed HTTP response")?;
        let status = head.split_whitespace().nth(1).unwrap_or("");
        if status == "401" {
            bail!(
                "the admin server at {admin} needs its admin token: --admin-token-file FILE (or MERIDIAN_ADMIN_TOKEN_FILE){}",
                if self.token.is_some() {
                    "; the token in that file is not it"
                } else {
                    ""
                }
            );
        }
        let value: Value = serde_json::from_str(body)
            .with_context(|| format!("admin server answered {status}: {body}"))?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use std::time::{Duration, SystemTime};

    use super::{agents_summary, shards_summary, status_table, template_ref};

    #[test]
    fn templates_are_named_as_kubectl_names_them_and_services_keep_namespace_slash_name() {
        let kind = |arg, ns| template_ref(arg, ns).map(|(k, n)| format!("{k} {n}"));
        assert_eq!(
            kind("Deployment/web", false).as_deref(),
            Some("Deployment web")
        );
        assert_eq!(
            kind("deployment/web", false).as_deref(),
            Some("Deployment web")
        );
        assert_eq!(kind("deploy/web", false).as_deref(), Some("Deployment web"));
        assert_eq!(
            kind("deployments.apps/web", false).as_deref(),
            Some("Deployment web")
        );
        assert_eq!(kind("sts/db", false).as_deref(), Some("StatefulSet db"));
        assert_eq!(
            kind("cm/settings", false).as_deref(),
            Some("ConfigMap settings")
        );
        // A namespace and a service…
        assert_eq!(kind("shop/payments", false), None);
        assert_eq!(kind("payments.shop", false), None);
        // … unless --namespace says the first part is a kind (a custom one, here).
        assert_eq!(kind("widget/w1", true).as_deref(), Some("widget w1"));
    }

    #[test]
    fn the_agents_summary_says_who_is_connected_and_when_each_was_heard() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let body = serde_json::json!({"agents": {
            "edge-1": {"connected": true, "certificateExpires": 1_040, "lastHeartbeat": 998},
            "edge-2": {"connected": false, "note": "no agent has connected"},
        }});
        assert_eq!(
            agents_summary(&body, now),
            "\nagents\n  edge-1: connected, certificate expires in 40s, last heartbeat 2s ago\n  edge-2: not connected, no certificate seen, last heartbeat never\n"
        );
        assert_eq!(agents_summary(&serde_json::json!({"agents": {}}), now), "");
        let waiting = serde_json::json!({"agents": {}, "waitingForApproval": [
            {"cluster": "edge-3", "token": "abc123", "key": "sha256:5f1c", "since": 990},
        ]});
        assert_eq!(
            agents_summary(&waiting, now),
            "\nagents\n  edge-3: waiting for approval since 10s ago (key sha256:5f1c): meridian approve edge-3\n"
        );
    }

    #[test]
    fn the_shards_summary_names_each_writer_and_the_members_served_stale() {
        assert_eq!(shards_summary(&json!({"sharded": false})), "");
        let body = json!({"sharded": true, "shards": {
            "identity": "a", "liveReplicas": ["a", "b"], "hubReadable": true,
            "members": {"m1": {"claim": "a"}, "m2": {"claim": "b"}, "m3": {"claim": "a"},
                        "m4": {"claim": null}},
            "confirmations": {"m2": {"confirmation": "minority", "unreachable": 1, "live": 2},
                              "m5": {"confirmation": "confirmed"}},
        }});
        assert_eq!(
            shards_summary(&body),
            "\nshards: this replica a, 2 live replica(s) (a, b), hub readable\n  \
             (nobody yet) writes 1: m4\n  a writes 2: m1, m3\n  b writes 1: m2\n  \
             m2: unreachable from this replica only (minority): served, not withdrawn\n"
        );
    }

    /// A wide name, an empty reason, a missing zone: every column still lines up, and the
    /// table is the golden one byte for byte.
    #[test]
    fn status_columns_line_up_whatever_the_names() {
        let body = json!({"clusters": [
            {"name": "eu-1", "health": "Healthy", "withdrawn": false, "region": "eu",
             "zone": "eu-a", "network": "net1", "endpoints": 3, "readyEndpoints": 2, "reason": null,
             "capacity": {"allocatable": {"cpuMillis": 8000}, "used": {"cpuMillis": 1500},
                          "assumed": {"cpuMillis": 2000}}},
            {"name": "a-very-long-member-cluster-name", "health": "Unreachable", "withdrawn": true,
             "region": "us", "zone": null, "network": "", "endpoints": 120, "readyEndpoints": 118,
             "reason": "heartbeat failed: connection refused"},
        ]});
        let golden = include_str!("../tests/golden/cli/status.txt");
        assert_eq!(status_table(&body), golden);
    }
}
