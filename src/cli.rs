//! Command line: every setting has a flag and an environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;

/// The version and the commit it was built from (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("MERIDIAN_GIT_COMMIT"),
    ")"
);

/// Where the admin server listens unless told otherwise, and where the client subcommands
/// look for it.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9180";

#[derive(Debug, Parser)]
#[command(
    name = "meridian",
    version = VERSION,
    about = "One control plane for a fleet of Kubernetes clusters: authoritative DNS and xDS from one scheduling core"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The flags of `serve` that the subcommands reading a hub directory use.
const HUB_DIRECTORY_FLAGS: &[&str] = &[
    "config",
    "hub-directory",
    "directory-*",
    "geo-*",
    "log-format",
];

/// The flags of `serve` that say where the hub keeps the agent CA and bootstrap tokens.
const AGENT_STORE_FLAGS: &[&str] = &["config", "hub-*", "agent-state-dir"];

const ENVIRONMENT_HELP: &str = "Every flag can also be set by an environment variable: MERIDIAN_ \
and the flag's name in capitals (MERIDIAN_DNS_LISTEN for --dns-listen; MERIDIAN_DNS_ZONES and \
MERIDIAN_GEO_RANGES for the repeatable ones, comma-separated). A variable that is set is shown \
beside its flag.";

impl Cli {
    /// Parses the process's arguments as [`command`] describes them.
    pub fn parse_args() -> Self {
        let matches = command().get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// The command line: the derived one, where the subcommands that take `serve`'s settings
/// (to find the hub) list only the flags they read, and an environment variable is shown
/// beside its flag only when it is set (unset, `[env: MERIDIAN_X=]` on every line is noise).
pub fn command() -> clap::Command {
    let serve_ids: Vec<clap::Id> = ServeArgs::augment_args(clap::Command::new("serve"))
        .get_arguments()
        .map(|a| a.get_id().clone())
        .collect();
    let only = |flags: &'static [&'static str]| {
        let serve_ids = serve_ids.clone();
        move |c: clap::Command| hide_serve_flags_except(c, &serve_ids, flags)
    };
    let cli = Cli::command()
        .mut_subcommand("validate", only(HUB_DIRECTORY_FLAGS))
        .mut_subcommand("render", only(HUB_DIRECTORY_FLAGS))
        .mut_subcommand("approve", only(AGENT_STORE_FLAGS))
        .mut_subcommand("token", |token| {
            token.mut_subcommand("create", only(AGENT_STORE_FLAGS))
        })
        .mut_subcommand("serve", |serve| serve.after_help(ENVIRONMENT_HELP));
    env_shown_only_when_set(cli)
}

/// Hides from `command`'s help the flags of `serve` not named in `flags` (a name ending in
/// `*` is a prefix); they are still accepted, so one set of variables serves every command.
fn hide_serve_flags_except(
    command: clap::Command,
    serve_ids: &[clap::Id],
    flags: &[&str],
) -> clap::Command {
    let read = |long: &str| {
        flags.iter().any(|f| match f.strip_suffix('*') {
            Some(prefix) => long.starts_with(prefix),
            None => long == *f,
        })
    };
    command.mut_args(|arg| {
        let from_serve = serve_ids.contains(arg.get_id());
        if from_serve && !arg.get_long().is_some_and(read) {
            arg.hide(true)
        } else {
            arg
        }
    })
}

fn env_shown_only_when_set(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| {
            let unset = arg
                .get_env()
                .is_some_and(|name| std::env::var_os(name).is_none());
            arg.hide_env(unset)
        })
        .mut_subcommands(env_shown_only_when_set)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run meridian: sources, DNS, xDS, admin.
    Serve(ServeArgs),
    /// Check a config and every manifest it reaches; exit non-zero on any problem.
    Validate(ServeArgs),
    /// Decide where every resource template goes and write the per-cluster manifests to
    /// --out (`<cluster>/<namespace>/<Kind>.<name>.yaml`), for a GitOps repository; exit
    /// non-zero naming each unschedulable template or override that cannot apply.
    Render(RenderArgs),
    /// Print the member clusters and their health (asks a running meridian).
    Status(ClientArgs),
    /// Show what meridian would answer for a name, and the decision behind it.
    Resolve(ResolveArgs),
    /// Why a service's traffic goes where it goes: filtered clusters, tiers, weights,
    /// spill-over, and the resulting DNS answer and EDS priorities; or, for a template
    /// (KIND/NAME -n NS), where it is placed and why, beside its Services' traffic (asks a
    /// running meridian).
    Explain(ExplainArgs),
    /// What would change if… (asks a running meridian; nothing is written or pushed): for
    /// every service and workload whose decision changes under the assumptions, the DNS
    /// answers and EDS priorities per client cluster and the replicas per cluster, before and
    /// after, with totals.
    Simulate(SimulateArgs),
    /// Inspect the xDS feed of a running meridian.
    #[command(subcommand)]
    Xds(XdsCommand),
    /// The federation API gateway of a running meridian.
    #[command(subcommand)]
    Gateway(GatewayCommand),
    /// Staged rollouts (placement.rollout) of a running meridian: where each stands, and an
    /// operator's approve, pause, resume and abort (sent to the leader's admin server).
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// Bootstrap tokens for pull-mode agents (kept where the hub keeps its agent state).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Approve the join an agent of this cluster asked for with its bootstrap token (with
    /// `agent.autoApprove: false`, a join waits for this).
    Approve(ApproveArgs),
    /// Join a member cluster to a Kubernetes hub: in the member, meridian's ServiceAccount,
    /// its roles (deploy/rbac) and a token; on the hub, a Secret with a kubeconfig for it and
    /// the MemberCluster. Running it again updates what differs.
    Join(JoinArgs),
    /// Check what traffic depends on, per member, each with pass or fail and the fix: its API
    /// and meridian's permissions there, its CoreDNS forwarding the zones, its gateway, its xDS
    /// clients; with --resolver, the member's resolver asked for the probe name (forwarded to
    /// meridian? taken for this cluster?). Exits 1 when a check fails (asks a running meridian).
    Diagnose(DiagnoseArgs),
    /// Take a member off the hub: its MemberCluster (meridian moves its copies out first),
    /// the kubeconfig Secret, and what `join` made in the member.
    Unjoin(UnjoinArgs),
    /// Run as a member's pull-mode agent: join the hub with a bootstrap token, then stream
    /// the member's Services, EndpointSlices, ServiceExports, ServiceImports, Nodes and
    /// Namespaces to it over mutual TLS. The hub needs no credential for the member.
    Agent(AgentRunArgs),
    /// Print the CustomResourceDefinitions of meridian's kinds (MemberCluster,
    /// ClusterSchedulingPolicy, OverridePolicy, Placement, Tenant) as YAML, generated from the
    /// types meridian reads.
    Crds,
    /// Print a shell completion script, e.g. `source <(meridian completions bash)`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print meridian's version and the git commit it was built from.
    Version,
}

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum LogFormat {
    #[default]
    Plain,
    Json,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The config file (meridian.yaml).
    #[arg(long, env = "MERIDIAN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Seconds DNS waits (answering SERVFAIL) for members that have neither synced nor failed
    /// before it answers without them (default 30, at most 3600).
    #[arg(long = "sync-deadline-seconds", env = "MERIDIAN_SYNC_DEADLINE_SECONDS")]
    pub sync_deadline_seconds: Option<u64>,
    /// File descriptors kept out of the listeners' connection bounds for meridian's own
    /// member connections and files (default: half the limit, at most 1024).
    #[arg(long = "reserved-descriptors", env = "MERIDIAN_RESERVED_DESCRIPTORS")]
    pub reserved_descriptors: Option<u64>,
    /// Log lines as plain text (coloured only on a terminal) or as one JSON object per line,
    /// for a log collector. Levels and targets: MERIDIAN_LOG (e.g. `debug,kube=info`).
    #[arg(long, env = "MERIDIAN_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// The hub directory holding MemberCluster and ClusterSchedulingPolicy manifests.
    #[arg(long, env = "MERIDIAN_HUB_DIRECTORY", help_heading = "Hub")]
    pub hub_directory: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Hub")]
    pub hub: HubArgs,
    #[command(flatten, next_help_heading = "Leader election and shards")]
    pub lease: LeaseArgs,
    #[command(flatten, next_help_heading = "DNS")]
    pub dns: DnsArgs,
    #[command(flatten, next_help_heading = "xDS")]
    pub xds: XdsArgs,
    #[command(flatten, next_help_heading = "Directory sources")]
    pub directory: DirectoryArgs,
    #[command(flatten, next_help_heading = "Geography of clients outside the fleet")]
    pub geo: GeoArgs,
    /// Admin HTTP listen address: /healthz, /readyz, /metrics, /debug/*, /ui (default
    /// 127.0.0.1:9180).
    #[arg(long, env = "MERIDIAN_ADMIN_LISTEN", help_heading = "Admin")]
    pub admin_listen: Option<SocketAddr>,
    #[command(flatten, next_help_heading = "Admin")]
    pub admin: AdminArgs,
    #[command(flatten, next_help_heading = "Federation API gateway")]
    pub gateway: GatewayArgs,
    #[command(flatten, next_help_heading = "Tracing")]
    pub tracing: TracingArgs,
    #[command(flatten, next_help_heading = "Pull-mode agents")]
    pub agent: AgentListenerArgs,
}

#[derive(Debug, Args)]
pub struct AgentListenerArgs {
    /// Where pull-mode agents connect (gRPC over TLS; default: no agent listener).
    #[arg(
        id = "agent_listen",
        long = "agent-listen",
        env = "MERIDIAN_AGENT_LISTEN",
        value_name = "LISTEN"
    )]
    pub listen: Option<SocketAddr>,
    /// Where a directory hub keeps the agent CA and bootstrap tokens.
    #[arg(
        id = "agent_state_dir",
        long = "agent-state-dir",
        env = "MERIDIAN_AGENT_STATE_DIR",
        value_name = "STATE_DIR"
    )]
    pub state_dir: Option<PathBuf>,
    /// An agent certificate's lifetime in seconds (default 86400).
    #[arg(
        long = "agent-certificate-lifetime-seconds",
        env = "MERIDIAN_AGENT_CERTIFICATE_LIFETIME_SECONDS"
    )]
    pub certificate_lifetime_seconds: Option<u64>,
}

#[derive(Debug, Args)]
pub struct TracingArgs {
    /// Export OpenTelemetry traces to this OTLP/gRPC collector (`http://host:4317`; default:
    /// no traces).
    #[arg(long = "tracing-otlp-endpoint", env = "MERIDIAN_TRACING_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// The share of new traces kept, 0 to 1 (default 0.1); a caller's sampled traceparent is
    /// followed.
    #[arg(
        long = "tracing-sampling-ratio",
        env = "MERIDIAN_TRACING_SAMPLING_RATIO"
    )]
    pub sampling_ratio: Option<f64>,
}

#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// The federation API gateway's HTTPS listen address (default: no gateway); its identity
    /// settings (gateway.oidc) are in the config file.
    #[arg(
        id = "gateway_listen",
        long = "gateway-listen",
        env = "MERIDIAN_GATEWAY_LISTEN",
        value_name = "LISTEN"
    )]
    pub listen: Option<SocketAddr>,
    /// The gateway's server certificate (PEM).
    #[arg(
        id = "gateway_tls_cert",
        long = "gateway-tls-cert",
        env = "MERIDIAN_GATEWAY_TLS_CERT",
        value_name = "TLS_CERT"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The gateway's private key (PEM).
    #[arg(
        id = "gateway_tls_key",
        long = "gateway-tls-key",
        env = "MERIDIAN_GATEWAY_TLS_KEY",
        value_name = "TLS_KEY"
    )]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) whose client certificates are an identity at the gateway.
    #[arg(
        id = "gateway_client_ca",
        long = "gateway-client-ca",
        env = "MERIDIAN_GATEWAY_CLIENT_CA",
        value_name = "CLIENT_CA"
    )]
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct DnsArgs {
    /// DNS listen address, UDP and TCP (default 127.0.0.1:1053).
    #[arg(long = "dns-listen", env = "MERIDIAN_DNS_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// A zone as NAME[:global|clusterset[:NAMESPACE]]; repeat for several (replaces the file's;
    /// default global and clusterset.local).
    #[arg(long = "dns-zone", env = "MERIDIAN_DNS_ZONES", value_delimiter = ',')]
    pub zones: Vec<String>,
    /// TTL of answers (and SOA minimum) unless a policy sets one (default 5).
    #[arg(long = "dns-ttl", env = "MERIDIAN_DNS_TTL")]
    pub ttl: Option<u32>,
    /// Cap on A/AAAA answers; 0 means no cap (default 0).
    #[arg(long = "dns-max-answers", env = "MERIDIAN_DNS_MAX_ANSWERS")]
    pub max_answers: Option<u32>,
    /// CIDRs allowed to AXFR (default: none).
    #[arg(
        long = "dns-allow-transfer",
        env = "MERIDIAN_DNS_ALLOW_TRANSFER",
        value_delimiter = ','
    )]
    pub allow_transfer: Vec<IpNet>,
    /// A TCP connection is closed when its next query has not come whole (or a reply has not
    /// been taken) after this many seconds (default 10).
    #[arg(
        long = "dns-tcp-idle-timeout-seconds",
        env = "MERIDIAN_DNS_TCP_IDLE_TIMEOUT_SECONDS"
    )]
    pub tcp_idle_timeout_seconds: Option<u64>,
    /// Open TCP DNS connections at most; more are closed at once, after evicting one that
    /// has not sent a query yet (default: 3/16 of the descriptors the reserve leaves).
    #[arg(
        long = "dns-tcp-max-connections",
        env = "MERIDIAN_DNS_TCP_MAX_CONNECTIONS"
    )]
    pub tcp_max_connections: Option<u64>,
    /// Threads serving UDP (default 1).
    #[arg(long = "dns-udp-workers", env = "MERIDIAN_DNS_UDP_WORKERS")]
    pub udp_workers: Option<usize>,
    /// Answer-cache capacity in entries (default 100000).
    #[arg(long = "dns-cache-entries", env = "MERIDIAN_DNS_CACHE_ENTRIES")]
    pub cache_entries: Option<u64>,
}

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Open admin connections at most; more are closed at once (default: 1/16 of the
    /// descriptors the reserve leaves).
    #[arg(
        id = "admin_max_connections",
        long = "admin-max-connections",
        env = "MERIDIAN_ADMIN_MAX_CONNECTIONS",
        value_name = "MAX_CONNECTIONS"
    )]
    pub max_connections: Option<u64>,
    /// A request head must arrive within this many seconds (default 10).
    #[arg(
        id = "admin_header_read_timeout_seconds",
        long = "admin-header-read-timeout-seconds",
        env = "MERIDIAN_ADMIN_HEADER_READ_TIMEOUT_SECONDS",
        value_name = "HEADER_READ_TIMEOUT_SECONDS"
    )]
    pub header_read_timeout_seconds: Option<u64>,
    /// An admin connection silent this many seconds is closed (default 60).
    #[arg(
        id = "admin_idle_timeout_seconds",
        long = "admin-idle-timeout-seconds",
        env = "MERIDIAN_ADMIN_IDLE_TIMEOUT_SECONDS",
        value_name = "IDLE_TIMEOUT_SECONDS"
    )]
    pub idle_timeout_seconds: Option<u64>,
    /// A file holding a token that /debug/* and /ui then require (Bearer, or the password of
    /// HTTP Basic in a browser); /healthz, /readyz and /metrics stay open.
    #[arg(
        id = "admin_token_file",
        long = "admin-token-file",
        env = "MERIDIAN_ADMIN_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct HubArgs {
    /// A Kubernetes hub: the kubeconfig to reach it with.
    #[arg(long = "hub-kubeconfig", env = "MERIDIAN_HUB_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context of the hub (default: the current one).
    #[arg(long = "hub-context", env = "MERIDIAN_HUB_CONTEXT")]
    pub context: Option<String>,
    /// A Kubernetes hub reached with the pod's service account.
    #[arg(long = "hub-in-cluster", env = "MERIDIAN_HUB_IN_CLUSTER")]
    pub in_cluster: bool,
    /// The hub namespace of meridian's own objects: the leader-election Leases, the agent CA
    /// and bootstrap tokens (default meridian-system).
    #[arg(long = "hub-namespace", env = "MERIDIAN_HUB_NAMESPACE")]
    pub namespace: Option<String>,
    /// Bound of one watch on a member's API, in seconds (default 30); a watch connection
    /// silent for a third longer is taken as stalled and opened again.
    #[arg(
        long = "kube-watch-timeout-seconds",
        env = "MERIDIAN_KUBE_WATCH_TIMEOUT_SECONDS"
    )]
    pub watch_timeout_seconds: Option<u32>,
    /// How often the MCS write-back lists what it wrote into each member to repair drift, in
    /// seconds (default 60).
    #[arg(long = "kube-resync-seconds", env = "MERIDIAN_KUBE_RESYNC_SECONDS")]
    pub resync_seconds: Option<u32>,
}

#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// The name of the leader-election Lease (default meridian).
    #[arg(long = "lease-name", env = "MERIDIAN_LEASE_NAME")]
    pub name: Option<String>,
    /// How long a lease holds without renewal (default 15).
    #[arg(
        long = "lease-duration-seconds",
        env = "MERIDIAN_LEASE_DURATION_SECONDS"
    )]
    pub duration_seconds: Option<u64>,
    /// A leader stops writing this long after its last successful renewal (default 10).
    #[arg(
        long = "lease-renew-deadline-seconds",
        env = "MERIDIAN_LEASE_RENEW_DEADLINE_SECONDS"
    )]
    pub renew_deadline_seconds: Option<u64>,
    /// How often the lease is renewed or tried (default 2).
    #[arg(
        long = "lease-retry-period-seconds",
        env = "MERIDIAN_LEASE_RETRY_PERIOD_SECONDS"
    )]
    pub retry_period_seconds: Option<u64>,
    /// This replica's name in the Lease (default: hostname and process id).
    #[arg(long = "identity", env = "MERIDIAN_IDENTITY")]
    pub identity: Option<String>,
    /// Shard the member writes over the replicas (a Lease each; a Kubernetes hub only):
    /// each member is written by one live replica, and a member is withdrawn only when a
    /// majority of the replicas cannot reach it.
    #[arg(long = "shards", env = "MERIDIAN_SHARDS")]
    pub shards: bool,
}

#[derive(Debug, Args)]
pub struct XdsArgs {
    /// xDS listen address, ADS and CSDS over gRPC (default 127.0.0.1:18000).
    #[arg(
        id = "xds_listen",
        long = "xds-listen",
        env = "MERIDIAN_XDS_LISTEN",
        value_name = "LISTEN"
    )]
    pub listen: Option<SocketAddr>,
    /// Server certificate (PEM) for TLS on the xDS listener (default: plaintext).
    #[arg(long = "xds-tls-cert", env = "MERIDIAN_XDS_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long = "xds-tls-key", env = "MERIDIAN_XDS_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to; makes TLS mutual (default: none).
    #[arg(long = "xds-tls-client-ca", env = "MERIDIAN_XDS_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Quiet time before a change is pushed, in milliseconds (default 100).
    #[arg(long = "xds-debounce-ms", env = "MERIDIAN_XDS_DEBOUNCE_MS")]
    pub debounce_ms: Option<u64>,
    /// Longest a push waits while changes keep coming, in milliseconds (default 1000).
    #[arg(long = "xds-debounce-max-ms", env = "MERIDIAN_XDS_DEBOUNCE_MAX_MS")]
    pub debounce_max_ms: Option<u64>,
    /// New xDS streams admitted per second, so reconnect storms queue (default 1000).
    #[arg(
        long = "xds-admission-per-second",
        env = "MERIDIAN_XDS_ADMISSION_PER_SECOND"
    )]
    pub admission_per_second: Option<u32>,
    /// Open xDS connections at most; more are closed at once (default: 3/4 of the descriptors
    /// the reserve leaves).
    #[arg(
        id = "xds_max_connections",
        long = "xds-max-connections",
        env = "MERIDIAN_XDS_MAX_CONNECTIONS",
        value_name = "MAX_CONNECTIONS"
    )]
    pub max_connections: Option<u64>,
    /// HTTP/2 streams per xDS connection (default 100).
    #[arg(
        id = "xds_max_concurrent_streams",
        long = "xds-max-concurrent-streams",
        env = "MERIDIAN_XDS_MAX_CONCURRENT_STREAMS",
        value_name = "MAX_CONCURRENT_STREAMS"
    )]
    pub max_concurrent_streams: Option<u32>,
    /// HTTP/2 keepalive PING interval in seconds (default 30).
    #[arg(
        id = "xds_keepalive_interval_seconds",
        long = "xds-keepalive-interval-seconds",
        env = "MERIDIAN_XDS_KEEPALIVE_INTERVAL_SECONDS",
        value_name = "KEEPALIVE_INTERVAL_SECONDS"
    )]
    pub keepalive_interval_seconds: Option<u64>,
    /// Seconds a PING may go unanswered before the connection is dropped (default 10).
    #[arg(
        id = "xds_keepalive_timeout_seconds",
        long = "xds-keepalive-timeout-seconds",
        env = "MERIDIAN_XDS_KEEPALIVE_TIMEOUT_SECONDS",
        value_name = "KEEPALIVE_TIMEOUT_SECONDS"
    )]
    pub keepalive_timeout_seconds: Option<u64>,
    /// A new xDS connection must send the HTTP/2 preface (or TLS hello) within this many
    /// seconds (default 10).
    #[arg(
        id = "xds_handshake_timeout_seconds",
        long = "xds-handshake-timeout-seconds",
        env = "MERIDIAN_XDS_HANDSHAKE_TIMEOUT_SECONDS",
        value_name = "HANDSHAKE_TIMEOUT_SECONDS"
    )]
    pub handshake_timeout_seconds: Option<u64>,
    /// An xDS connection that sends nothing (not even PING answers) this many seconds is
    /// closed (default 300).
    #[arg(
        id = "xds_idle_timeout_seconds",
        long = "xds-idle-timeout-seconds",
        env = "MERIDIAN_XDS_IDLE_TIMEOUT_SECONDS",
        value_name = "IDLE_TIMEOUT_SECONDS"
    )]
    pub idle_timeout_seconds: Option<u64>,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The directory to render into (created if missing; only files meridian rendered are
    /// ever removed from it).
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a bootstrap token for one cluster's agent; prints `id.secret`.
    Create(TokenCreateArgs),
}

#[derive(Debug, Args)]
pub struct TokenCreateArgs {
    /// The one cluster that may join with the token (its MemberCluster's name).
    #[arg(long)]
    pub cluster: String,
    /// How long the token admits: 90s, 30m, 1h (at most 168h).
    #[arg(id = "token_ttl", long = "ttl", default_value = "1h", value_parser = parse_duration,
        value_name = "TTL"
    )]
    pub ttl: u64,
    /// Make the token although no MemberCluster of that name reads from an agent yet (the
    /// hub refuses the agent until one does).
    #[arg(long)]
    pub new_member: bool,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Args)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub serve: ServeArgs,
    /// The cluster whose waiting join to approve (its MemberCluster's name).
    #[arg(id = "approve_cluster", value_name = "CLUSTER")]
    pub cluster: String,
}

/// The two clusters `join` and `unjoin` speak to.
#[derive(Debug, Args)]
pub struct JoinClusters {
    /// The hub's kubeconfig (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long = "hub-kubeconfig", value_name = "FILE")]
    pub hub_kubeconfig: Option<PathBuf>,
    /// The hub's kubeconfig context (default: the current one).
    #[arg(long = "hub-context", value_name = "CONTEXT")]
    pub hub_context: Option<String>,
    /// The hub namespace of meridian's own objects, where the kubeconfig Secret goes.
    #[arg(
        long = "hub-namespace",
        value_name = "NAMESPACE",
        default_value = "meridian-system"
    )]
    pub hub_namespace: String,
    /// The member's kubeconfig, with rights to make a ServiceAccount and ClusterRoles
    /// (default: the hub's file).
    #[arg(long = "member-kubeconfig", value_name = "FILE")]
    pub member_kubeconfig: Option<PathBuf>,
    /// The member's kubeconfig context (default: the current one).
    #[arg(long = "member-context", value_name = "CONTEXT")]
    pub member_context: Option<String>,
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// The member's name on the hub (a DNS label).
    #[arg(value_name = "CLUSTER")]
    pub cluster: String,
    #[command(flatten)]
    pub clusters: JoinClusters,
    /// The member's region (default: what most of its Nodes' topology.kubernetes.io/region say).
    #[arg(long)]
    pub region: Option<String>,
    /// The member's zone (default: from its Nodes, as the region).
    #[arg(long)]
    pub zone: Option<String>,
    /// The member's network (clusters on one network reach each other's pods directly).
    #[arg(long)]
    pub network: Option<String>,
    /// A CIDR the member's DNS queries come from (its CoreDNS's addresses); repeatable.
    #[arg(long = "dns-client-cidr", value_name = "CIDR")]
    pub dns_client_cidrs: Vec<String>,
    /// Also the roles meridian needs to place workloads in the member.
    #[arg(long)]
    pub propagation: bool,
    /// The member runs a pull-mode agent: only the MemberCluster is made (nothing in the
    /// member); prints the token command and the member chart's values.
    #[arg(long)]
    pub agent: bool,
    /// Lifetime of the member token the hub keeps (join again before it ends to renew it).
    #[arg(long = "token-ttl", default_value = "8760h", value_parser = parse_duration)]
    pub token_ttl: u64,
    /// Print the objects (the token left out) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// Only this member (default: every member).
    #[arg(long)]
    pub cluster: Option<String>,
    /// The member's resolver (its CoreDNS, HOST:PORT, e.g. reached with kubectl port-forward)
    /// to ask `_meridian-whoami.<zone>` TXT through; needs --cluster.
    #[arg(long, value_name = "HOST:PORT")]
    pub resolver: Option<SocketAddr>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct UnjoinArgs {
    /// The member's name on the hub.
    #[arg(value_name = "CLUSTER")]
    pub cluster: String,
    #[command(flatten)]
    pub clusters: JoinClusters,
    /// How long to wait for meridian to let go of the MemberCluster (its copies moved out).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub wait: u64,
}

#[derive(Debug, Args)]
pub struct AgentRunArgs {
    /// The hub's agent listener, host:port (its certificate must name host); a stream is held
    /// to every address host resolves to (each replica behind a headless Service), and to
    /// every entry of a comma-separated list (replicas reached at addresses of their own).
    #[arg(long, env = "MERIDIAN_AGENT_HUB")]
    pub hub: String,
    /// The member this agent speaks for (its MemberCluster's name on the hub).
    #[arg(long, env = "MERIDIAN_AGENT_CLUSTER")]
    pub cluster: String,
    /// A file holding the bootstrap token (`meridian token create`), for the first join.
    #[arg(long, env = "MERIDIAN_AGENT_BOOTSTRAP_TOKEN_FILE")]
    pub bootstrap_token_file: Option<PathBuf>,
    /// The agent CA's certificate (the hub's `ca.crt`, or its Secret meridian-agent-ca), to
    /// trust the hub by on the first join.
    #[arg(long, env = "MERIDIAN_AGENT_HUB_CA_FILE")]
    pub hub_ca_file: Option<PathBuf>,
    /// Where the agent keeps its key and certificates: a directory (files 0600) ...
    #[arg(
        long,
        env = "MERIDIAN_AGENT_STATE_DIR",
        required_unless_present = "state_secret",
        conflicts_with = "state_secret"
    )]
    pub state_dir: Option<PathBuf>,
    /// ... or a Secret NAMESPACE/NAME in the member (for an agent in a pod: kept across
    /// restarts without a volume; deploy/rbac/agent.yaml lets it keep meridian-system/meridian-agent-state).
    #[arg(
        long,
        env = "MERIDIAN_AGENT_STATE_SECRET",
        value_name = "NAMESPACE/NAME"
    )]
    pub state_secret: Option<String>,
    /// The member's kubeconfig (default: KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, env = "MERIDIAN_AGENT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context.
    #[arg(long)]
    pub context: Option<String>,
    /// The agent's own admin server: /healthz, /metrics, /debug.
    #[arg(
        long,
        env = "MERIDIAN_AGENT_ADMIN_LISTEN",
        default_value = "127.0.0.1:9181"
    )]
    pub admin_listen: SocketAddr,
    /// Log lines as plain text or JSON.
    #[arg(long, env = "MERIDIAN_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
}

/// Where a running meridian's admin server is, and the token it may require.
#[derive(Debug, Args)]
pub struct AdminClientArgs {
    /// The admin address of a running meridian.
    #[arg(long = "admin", env = "MERIDIAN_ADMIN_LISTEN", default_value = DEFAULT_ADMIN)]
    pub address: SocketAddr,
    /// A file holding the admin token, when that meridian requires one (its
    /// --admin-token-file).
    #[arg(
        id = "admin_token_file",
        long = "admin-token-file",
        env = "MERIDIAN_ADMIN_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub admin: AdminClientArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// The name to resolve, e.g. payments.shop.global
    pub name: String,
    /// Record type.
    #[arg(long = "type", short = 't', default_value = "A")]
    pub qtype: String,
    /// Answer as a client in this cluster.
    #[arg(long, conflicts_with = "from")]
    pub from_cluster: Option<String>,
    /// Answer as a client at this address: placed as DNS places a query's source (a member's
    /// dnsClientCIDRs, a geo range, or nowhere).
    #[arg(long, value_name = "ADDRESS")]
    pub from: Option<std::net::IpAddr>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The service: NAME.NAMESPACE (payments.shop), NAME.NAMESPACE.global or NAMESPACE/NAME;
    /// or a resource template as KIND/NAME (Deployment/web, deployment/web, deploy/web) with
    /// --namespace; or a Gateway API route as httproute/NAME or grpcroute/NAME.
    pub service: String,
    /// The namespace of a KIND/NAME template (default: default).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Decide as for a client in this cluster (default: an unknown client).
    #[arg(long)]
    pub from_cluster: Option<String>,
    #[command(flatten)]
    pub whatif: WhatIfArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub whatif: WhatIfArgs,
    /// Print the plan of this policy's staged rollout (placement.rollout) instead: its
    /// stages, what each drains, and each client region's traffic shares at every step.
    #[arg(long, value_name = "NAMESPACE/POLICY", conflicts_with_all = ["assume", "remove", "policies", "after"])]
    pub rollout: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A fleet that does not exist yet: each flag may be given several times, and they combine.
#[derive(Debug, Default, Args)]
pub struct WhatIfArgs {
    /// Assume CLUSTER=Unreachable|Degraded|Healthy, CLUSTER:taint=KEY[=VALUE]:EFFECT or
    /// CLUSTER:untaint=KEY.
    #[arg(long = "assume", value_name = "ASSUMPTION")]
    pub assume: Vec<String>,
    /// Assume this member leaves the hub.
    #[arg(long = "assume-remove", value_name = "CLUSTER")]
    pub remove: Vec<String>,
    /// Assume the ClusterSchedulingPolicies in FILE (replacing those of the same name).
    #[arg(long = "assume-policy", value_name = "FILE")]
    pub policies: Vec<PathBuf>,
    /// Compare this long from now (`90`, `30s`, `5m`, `1h`; default: once every window the
    /// assumptions start has run out).
    #[arg(long, value_parser = parse_duration)]
    pub after: Option<u64>,
}

impl WhatIfArgs {
    pub fn is_empty(&self) -> bool {
        self.assume.is_empty() && self.remove.is_empty() && self.policies.is_empty()
    }
}

/// `90`, `90s`, `5m`, `1h` → seconds.
fn parse_duration(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?}: a duration is a number of seconds, or with s, m or h"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("{text:?}: the unit is s, m or h")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?}: too long"))
}

#[derive(Debug, Subcommand)]
pub enum XdsCommand {
    /// Print, as JSON, what a node in a cluster would receive over ADS.
    Dump(XdsDumpArgs),
    /// Print the connected xDS clients and what they ACKed or NACKed (as CSDS reports it).
    Clients(ClientArgs),
    /// Connect as an xDS client (a node of a cluster) and print every update the xDS server
    /// sends, live: clusters, then the endpoints of each, by priority. Each update is ACKed.
    Watch(XdsWatchArgs),
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Where each staged rollout stands (every one, or POLICY's): the stage, its clusters, the
    /// phase, what is drained, and why it waits or is paused.
    Status(RolloutStatusArgs),
    /// Let POLICY's rollouts past the stage that waits for approval.
    Approve(RolloutArgs),
    /// Stop POLICY's rollouts where they are (nothing more drained or written) until resume.
    Pause(RolloutArgs),
    /// Go on after a pause, an operator's or a failure's (the stage's failures count afresh).
    Resume(RolloutArgs),
    /// Stop POLICY's rollouts and give the stages reached the previous generation again; their
    /// traffic comes back once it runs ready.
    Abort(RolloutArgs),
}

#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// The ClusterSchedulingPolicy (NAME, or NAMESPACE/NAME).
    pub policy: String,
    /// The policy's namespace.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub admin: AdminClientArgs,
}

#[derive(Debug, Args)]
pub struct RolloutStatusArgs {
    /// Only this ClusterSchedulingPolicy's rollouts (NAME, or NAMESPACE/NAME).
    pub policy: Option<String>,
    /// The policy's namespace.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub enum GatewayCommand {
    /// Print a kubeconfig for the gateway: a context per member cluster (/clusters/NAME),
    /// `fleet` for all of them at once (/clusters/*, current) and `hub` for the hub's API.
    Kubeconfig(GatewayKubeconfigArgs),
}

#[derive(Debug, Args)]
pub struct GatewayKubeconfigArgs {
    /// The user name of the kubeconfig's user entry.
    #[arg(long)]
    pub user: String,
    /// The gateway's URL as clients reach it (default: https:// and its listen address).
    #[arg(long)]
    pub server: Option<String>,
    /// The CA certificate (PEM) clients check the gateway's certificate with, embedded.
    #[arg(long)]
    pub certificate_authority: Option<PathBuf>,
    /// A file holding the user's ID token (kubectl reads it on each request); without it the
    /// user entry is empty, for an OIDC credential plugin.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The running meridian the member clusters are read from.
    #[command(flatten)]
    pub admin: AdminClientArgs,
}

#[derive(Debug, Args)]
pub struct XdsWatchArgs {
    /// The xDS server (meridian's --xds-listen).
    #[arg(long, env = "MERIDIAN_XDS_LISTEN", default_value = "127.0.0.1:18000")]
    pub xds: SocketAddr,
    /// The node's id.
    #[arg(long, default_value = "meridian-xds-watch")]
    pub node_id: String,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Stop after this many updates (default: watch until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
}

#[derive(Debug, Args)]
pub struct XdsDumpArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Who an xDS node is: what the server places it by.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The node's cluster (its CLUSTER_ID).
    #[arg(long)]
    pub node_cluster: Option<String>,
    /// The node's network (NETWORK); default: its cluster's.
    #[arg(long)]
    pub node_network: Option<String>,
    /// What the node is.
    #[arg(long, value_enum, default_value = "envoy")]
    pub role: NodeRole,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NodeRole {
    Envoy,
    Proxyless,
    EastwestGateway,
}

impl ServeArgs {
    /// Parses the arguments of `serve` alone (for tests and for embedding the app).
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let command = <Self as Args>::augment_args(clap::Command::new("serve"));
        <Self as clap::FromArgMatches>::from_arg_matches(&command.try_get_matches_from(args)?)
    }
}

/// Bounds of the directory sources (the hub directory and directory members).
#[derive(Debug, Default, Args)]
pub struct DirectoryArgs {
    /// Largest manifest file read, in bytes (default 16 MiB); larger files are skipped.
    #[arg(
        long = "directory-max-file-bytes",
        env = "MERIDIAN_DIRECTORY_MAX_FILE_BYTES"
    )]
    pub max_file_bytes: Option<u64>,
    /// Most bytes read from one directory, all files together (default 64 MiB).
    #[arg(
        long = "directory-max-member-bytes",
        env = "MERIDIAN_DIRECTORY_MAX_MEMBER_BYTES"
    )]
    pub max_member_bytes: Option<u64>,
    /// Deepest nesting a YAML document may have (default 64).
    #[arg(long = "directory-max-depth", env = "MERIDIAN_DIRECTORY_MAX_DEPTH")]
    pub max_depth: Option<usize>,
    /// Seconds reading one file may take before it is abandoned (default 5).
    #[arg(
        long = "directory-read-timeout-seconds",
        env = "MERIDIAN_DIRECTORY_READ_TIMEOUT_SECONDS"
    )]
    pub read_timeout_seconds: Option<u64>,
    /// Milliseconds a file must stay unchanged before it is read (default 100).
    #[arg(
        long = "directory-settle-milliseconds",
        env = "MERIDIAN_DIRECTORY_SETTLE_MILLISECONDS"
    )]
    pub settle_milliseconds: Option<u64>,
    /// Seconds a file that was good and now reads broken keeps its last good content (default 5).
    #[arg(
        long = "directory-grace-seconds",
        env = "MERIDIAN_DIRECTORY_GRACE_SECONDS"
    )]
    pub grace_seconds: Option<u64>,
}

/// Geography for DNS clients outside the fleet (`geo` in the config).
#[derive(Debug, Default, Args)]
pub struct GeoArgs {
    /// A range as CIDR=REGION[:ZONE]; repeatable, added after the config's ranges.
    #[arg(
        id = "geo_ranges",
        long = "geo-range",
        env = "MERIDIAN_GEO_RANGES",
        value_delimiter = ',',
        value_name = "RANGES"
    )]
    pub ranges: Vec<String>,
    /// A file of network,region[,zone] lines, watched for changes.
    #[arg(
        id = "geo_file",
        long = "geo-file",
        env = "MERIDIAN_GEO_FILE",
        value_name = "FILE"
    )]
    pub file: Option<PathBuf>,
    /// Seconds between looks at the geo file (default 1).
    #[arg(
        id = "geo_reload_seconds",
        long = "geo-reload-seconds",
        env = "MERIDIAN_GEO_RELOAD_SECONDS",
        value_name = "RELOAD_SECONDS"
    )]
    pub reload_seconds: Option<u64>,
    /// Largest geo file read, in bytes (default 256 MiB).
    #[arg(
        id = "geo_max_file_bytes",
        long = "geo-max-file-bytes",
        env = "MERIDIAN_GEO_MAX_FILE_BYTES",
        value_name = "MAX_FILE_BYTES"
    )]
    pub max_file_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{Cli, Command, command};

    /// clap's own checks of every subcommand (unique argument ids, valid defaults), which it
    /// otherwise runs only when that subcommand is parsed.
    #[test]
    fn every_subcommand_is_well_formed() {
        Cli::command().debug_assert();
        command().debug_assert();
    }

    fn help(path: &[&str]) -> String {
        let mut cmd = command();
        for name in path {
            cmd = cmd
                .find_subcommand(name)
                .unwrap_or_else(|| panic!("no subcommand {name}"))
                .clone();
        }
        cmd.render_long_help().to_string()
    }

    #[test]
    fn subcommands_that_find_the_hub_list_only_the_flags_they_read() {
        let validate = help(&["validate"]);
        assert!(validate.contains("--hub-directory"), "{validate}");
        assert!(validate.contains("--directory-max-depth"), "{validate}");
        for serve_only in [
            "--dns-listen",
            "--xds-listen",
            "--lease-name",
            "--gateway-listen",
        ] {
            assert!(!validate.contains(serve_only), "{serve_only} in {validate}");
        }
        let token = help(&["token", "create"]);
        for own in [
            "--cluster",
            "--ttl",
            "--new-member",
            "--hub-kubeconfig",
            "--agent-state-dir",
        ] {
            assert!(token.contains(own), "{own} missing from {token}");
        }
        assert!(!token.contains("--dns-zone"), "{token}");
        let approve = help(&["approve"]);
        assert!(approve.contains("--hub-namespace") && !approve.contains("--xds-tls-cert"));
        // Hidden, not refused: the same settings (or variables) serve every command.
        let parsed = command()
            .try_get_matches_from(["meridian", "validate", "--dns-listen", "127.0.0.1:53"])
            .map(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
        assert!(matches!(
            parsed,
            Ok(Ok(Cli {
                command: Command::Validate(_)
            }))
        ));
    }

    #[test]
    fn serve_groups_its_flags_and_names_a_variable_only_when_it_is_set() {
        let serve = help(&["serve"]);
        for heading in [
            "Hub:",
            "DNS:",
            "xDS:",
            "Admin:",
            "Federation API gateway:",
            "Tracing:",
        ] {
            assert!(serve.contains(heading), "{heading} missing");
        }
        let dns = serve.find("DNS:").unwrap();
        let xds = serve.find("xDS:").unwrap();
        let listen = serve.find("--dns-listen").unwrap();
        assert!(
            dns < listen && listen < xds,
            "--dns-listen is not under DNS:"
        );
        // No test sets MERIDIAN_XDS_DEBOUNCE_MS: its flag carries no `[env: …=]`.
        assert!(!serve.contains("MERIDIAN_XDS_DEBOUNCE_MS"), "{serve}");
        assert!(serve.contains("Every flag can also be set by an environment variable"));
    }
}
