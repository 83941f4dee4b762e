//! `meridian-kubesim`: N simulated Kubernetes members in one process (see the library docs).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use meridian_kubesim::{FleetConfig, MemberSpec, NodeShape, Options};

#[derive(Debug, Parser)]
#[command(
    name = "meridian-kubesim",
    about = "Simulated Kubernetes member clusters on loopback"
)]
struct Args {
    /// How many members to simulate (named <prefix>0001, …).
    #[arg(long, env = "KUBESIM_MEMBERS", default_value_t = 3)]
    members: usize,
    /// A JSON list of {name, labels, nodes} instead of --members.
    #[arg(long, env = "KUBESIM_MEMBERS_FILE")]
    members_file: Option<PathBuf>,
    #[arg(long, env = "KUBESIM_NAME_PREFIX", default_value = "m")]
    name_prefix: String,
    /// The number of the first member (several processes can share one fleet's names).
    #[arg(long, env = "KUBESIM_FIRST_INDEX", default_value_t = 1)]
    first_index: usize,
    /// Where kubeconfigs/<name>.kubeconfig and members.json are written.
    #[arg(long, env = "KUBESIM_DIR")]
    dir: Option<PathBuf>,
    /// Member i listens on base-port + i (default: any free port).
    #[arg(long, env = "KUBESIM_BASE_PORT")]
    base_port: Option<u16>,
    /// The control API's port on 127.0.0.1.
    #[arg(long, env = "KUBESIM_CONTROL_PORT", default_value_t = 18080)]
    control_port: u16,
    #[arg(long, env = "KUBESIM_NODES_PER_MEMBER", default_value_t = 3)]
    nodes_per_member: usize,
    #[arg(long, env = "KUBESIM_NODE_CPU", default_value = "8")]
    node_cpu: String,
    #[arg(long, env = "KUBESIM_NODE_MEMORY", default_value = "32Gi")]
    node_memory: String,
    #[arg(long, env = "KUBESIM_NODE_PODS", default_value = "110")]
    node_pods: String,
    /// Workloads report a new generation ready this long after it is written.
    #[arg(long, env = "KUBESIM_READY_DELAY_MS", default_value_t = 0)]
    ready_delay_ms: u64,
    /// Bookmarks to watches that allow them, this often.
    #[arg(long, env = "KUBESIM_BOOKMARK_SECONDS", default_value_t = 60)]
    bookmark_seconds: u64,
    /// Events each member keeps for watches to resume from (older: 410 Gone).
    #[arg(long, env = "KUBESIM_WATCH_WINDOW", default_value_t = 10_000)]
    watch_window: usize,
    /// Writes the control API's log keeps.
    #[arg(long, env = "KUBESIM_WRITE_LOG", default_value_t = 1_000_000)]
    write_log: usize,
    /// Serve plain HTTP/1.1 instead of TLS (HTTP/2 or HTTP/1.1 by ALPN, as an API server).
    #[arg(long, env = "KUBESIM_PLAIN_HTTP")]
    plain_http: bool,
    /// `plain` or `json`.
    #[arg(long, env = "KUBESIM_LOG_FORMAT", default_value = "plain")]
    log_format: String,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("KUBESIM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match args.log_format.as_str() {
        "json" => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init(),
        "plain" => tracing_subscriber::fmt().with_env_filter(filter).init(),
        other => bail!("--log-format {other:?}: plain or json"),
    }
    let members = match &args.members_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str::<Vec<MemberSpec>>(&text).with_context(|| {
                format!(
                    "{} is not a list of {{name, labels, nodes}}",
                    path.display()
                )
            })?
        }
        None => meridian_kubesim::numbered_from(&args.name_prefix, args.first_index, args.members),
    };
    let count = members.len();
    let options = Options {
        members,
        nodes_per_member: args.nodes_per_member,
        node_shape: NodeShape {
            cpu: args.node_cpu,
            memory: args.node_memory,
            pods: args.node_pods,
        },
        base_port: args.base_port,
        config: FleetConfig {
            ready_delay: Duration::from_millis(args.ready_delay_ms),
            bookmark_every: Duration::from_secs(args.bookmark_seconds.max(1)),
            window: args.watch_window,
            log_capacity: args.write_log,
        },
        plain_http: args.plain_http,
    };
    let control = tokio::net::TcpListener::bind(("127.0.0.1", args.control_port))
        .await
        .with_context(|| format!("control port {}", args.control_port))?;
    let fleet = meridian_kubesim::start(options).await?;
    if let Some(dir) = &args.dir {
        meridian_kubesim::write_kubeconfigs(&fleet, dir)?;
    }
    tracing::info!(
        members = count,
        control = args.control_port,
        "kubesim serving"
    );
    tokio::select! {
        served = meridian_kubesim::control::serve(fleet, control) => served.context("control API")?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
