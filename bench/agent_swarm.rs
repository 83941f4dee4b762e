//! `meridian-agent-swarm`: many pull-mode agents in one process, for the end-to-end test that
//! hundreds of agents joining (and reconnecting) at once converge, and for `bench/agent.sh`.
//! Each agent is the real member side (`meridian_agent::member::run`: join, stream, heartbeats,
//! write-back, renewal) with its own cluster name, token and state directory; all of them
//! watch one member API server through one client.
//!
//! ```text
//!  meridian-agent-swarm --hub 127.0.0.1:9443 --hub-ca-file ca.crt --kubeconfig member.kubeconfig \
//!      --tokens DIR --state-root DIR
//! ```
//!
//! `DIR` holds one `<cluster>.token` file per agent (`meridian token create` output). An agent
//! whose run ends (a refused join, a broken state dir) says so on stderr as `agent NAME:
//! stopped`; progress is read on the hub (its metrics and `/debug/agents`). Logs go to stderr
//! at `MERIDIAN_LOG` (default `warn`). It runs until killed, or exits 2 once every agent
//! stopped.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use meridian_agent::AgentSettings;
use meridian_agent::metrics::AgentSide;
use meridian_core::ClusterId;

struct Args {
    hub: String,
    hub_ca_file: PathBuf,
    kubeconfig: PathBuf,
    tokens: PathBuf,
    state_root: PathBuf,
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MERIDIAN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("meridian-agent-swarm: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<()> {
    let args = parse(std::env::args().skip(1))?;
    let member = meridian_controllers::kubernetes::connect::from_kubeconfig(&args.kubeconfig, None)
        .await
        .context("the member's kubeconfig")?
        .client;
    let clusters = clusters_with_tokens(&args.tokens)?;
    if clusters.is_empty() {
        bail!("no <cluster>.token files in {}", args.tokens.display());
    }
    let mut agents = tokio::task::JoinSet::new();
    for (cluster, token_file) in clusters {
        let settings = AgentSettings {
            hub: args.hub.clone(),
            state: meridian_agent::AgentState::Directory(args.state_root.join(cluster.as_str())),
            cluster,
            token_file: Some(token_file),
            hub_ca_file: Some(args.hub_ca_file.clone()),
            watch_timeout: Default::default(),
        };
        agents.spawn(run_one(settings, member.clone()));
    }
    while agents.join_next().await.is_some() {}
    bail!("every agent stopped")
}

/// One agent, until its run ends (which only a refusal or a broken state dir does).
async fn run_one(settings: AgentSettings, member: kube::Client) {
    let cluster = settings.cluster.clone();
    match meridian_agent::member::run(settings, member, AgentSide::default()).await {
        Ok(()) => eprintln!("agent {cluster}: stopped"),
        Err(e) => eprintln!(
            "agent {cluster}: stopped: {}",
            meridian_controllers::reason_of(&e)
        ),
    }
}

/// The `<cluster>.token` files of `dir`, by cluster name.
fn clusters_with_tokens(dir: &Path) -> Result<Vec<(ClusterId, PathBuf)>> {
    let mut clusters = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".token"))
        else {
            continue;
        };
        if !meridian_core::is_cluster_name(name) {
            bail!("{}: {name:?} is not a cluster name", path.display());
        }
        clusters.push((ClusterId::new(name), path.clone()));
    }
    clusters.sort();
    Ok(clusters)
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args> {
    let (mut hub, mut hub_ca_file, mut kubeconfig, mut tokens, mut state_root) =
        (None, None, None, None, None);
    while let Some(flag) = argv.next() {
        let value = argv
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--hub" => hub = Some(value),
            "--hub-ca-file" => hub_ca_file = Some(PathBuf::from(value)),
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value)),
            "--tokens" => tokens = Some(PathBuf::from(value)),
            "--state-root" => state_root = Some(PathBuf::from(value)),
            other => bail!("unknown flag {other}"),
        }
    }
    let need = |name: &str| format!("{name} is required");
    Ok(Args {
        hub: hub.with_context(|| need("--hub"))?,
        hub_ca_file: hub_ca_file.with_context(|| need("--hub-ca-file"))?,
        kubeconfig: kubeconfig.with_context(|| need("--kubeconfig"))?,
        tokens: tokens.with_context(|| need("--tokens"))?,
        state_root: state_root.with_context(|| need("--state-root"))?,
    })
}
