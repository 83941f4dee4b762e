//! The configuration file (`meridian.yaml`), overridden by flags and environment variables.
//! Relative paths resolve against the file that names them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ipnet::IpNet;
use meridian_controllers::geo::{ConfigRange, GeoSettings};
use meridian_controllers::manifest::Limits;
use meridian_dns::{DnsConfig, Style, ZoneConfig};
use meridian_gateway::{GatewayConfig, JwksSource, OidcConfig};
use meridian_xds::{TlsFiles, XdsConfig};
use serde::Deserialize;

use crate::cli::ServeArgs;
use crate::telemetry::TracingConfig;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct File {
    #[serde(default)]
    pub hub: HubSection,
    #[serde(default)]
    pub dns: DnsSection,
    #[serde(default)]
    pub xds: XdsSection,
    #[serde(default)]
    pub admin: AdminSection,
    /// The federation API gateway (off unless `listen` is set).
    #[serde(default)]
    pub gateway: GatewaySection,
    /// OpenTelemetry traces (off unless `otlpEndpoint` is set).
    #[serde(default)]
    pub tracing: TracingSection,
    /// The listener of pull-mode agents (off unless `listen` is set).
    #[serde(default)]
    pub agent: AgentSection,
    #[serde(default)]
    pub leader_election: LeaderSection,
    #[serde(default)]
    pub kubernetes: KubernetesSection,
    #[serde(default)]
    pub directory: DirectorySection,
    /// Geography for DNS clients outside the fleet.
    #[serde(default)]
    pub geo: GeoSection,
    /// How long readiness waits for members that have neither synced nor failed.
    pub sync_deadline_seconds: Option<u64>,
    /// File descriptors kept out of the listeners' connection bounds for meridian itself.
    pub reserved_descriptors: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubernetesSection {
    pub watch_timeout_seconds: Option<u32>,
    pub resync_seconds: Option<u32>,
}

/// Bounds of the directory sources (`meridian_controllers::manifest::Limits`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DirectorySection {
    pub max_file_bytes: Option<u64>,
    pub max_member_bytes: Option<u64>,
    pub max_depth: Option<usize>,
    pub read_timeout_seconds: Option<u64>,
    pub settle_milliseconds: Option<u64>,
    pub grace_seconds: Option<u64>,
}

/// `geo`: CIDR ranges mapped to a region (and zone) for DNS clients in no cluster
/// (`meridian_controllers::geo`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GeoSection {
    #[serde(default)]
    pub ranges: Vec<GeoRangeSection>,
    /// A `network,region[,zone]` file, watched for changes.
    pub file: Option<PathBuf>,
    pub reload_seconds: Option<u64>,
    pub max_file_bytes: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GeoRangeSection {
    pub cidrs: Vec<IpNet>,
    pub region: String,
    pub zone: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaderSection {
    pub lease_name: Option<String>,
    pub lease_duration_seconds: Option<u64>,
    pub renew_deadline_seconds: Option<u64>,
    pub retry_period_seconds: Option<u64>,
    pub identity: Option<String>,
    /// Members are written by the replica holding them (a Lease per replica), not all by the
    /// leader; a Kubernetes hub only.
    pub shards: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HubSection {
    pub directory: Option<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    #[serde(default)]
    pub in_cluster: bool,
    /// Where the leader-election Lease lives.
    pub namespace: Option<String>,
}

/// Where MemberClusters and policies come from.
#[derive(Debug, Clone, PartialEq)]
pub enum HubSource {
    Directory(PathBuf),
    /// A Kubernetes API: a kubeconfig (and context), or the in-cluster service account.
    Kubernetes {
        kubeconfig: Option<PathBuf>,
        context: Option<String>,
        namespace: String,
    },
}

impl HubSource {
    pub fn describe(&self) -> String {
        match self {
            HubSource::Directory(d) => d.display().to_string(),
            HubSource::Kubernetes {
                kubeconfig: Some(k),
                ..
            } => format!("Kubernetes API of {}", k.display()),
            HubSource::Kubernetes { .. } => "in-cluster Kubernetes API".into(),
        }
    }
}

/// Leader election on the hub's Lease (a Kubernetes hub only).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    pub identity: String,
    /// Sharded writers and quorum health.
    pub shards: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DnsSection {
    pub listen: Option<SocketAddr>,
    pub zones: Option<Vec<ZoneSection>>,
    pub ttl: Option<u32>,
    pub max_answers: Option<u32>,
    pub allow_transfer: Option<Vec<IpNet>>,
    pub tcp_idle_timeout_seconds: Option<u64>,
    pub tcp_max_connections: Option<u64>,
    pub udp_workers: Option<usize>,
    pub cache_entries: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneSection {
    pub name: String,
    #[serde(default = "default_style")]
    pub style: StyleName,
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StyleName {
    Global,
    Clusterset,
}

fn default_style() -> StyleName {
    StyleName::Global
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct XdsSection {
    pub listen: Option<SocketAddr>,
    pub tls: Option<TlsSection>,
    pub debounce_millis: Option<u64>,
    pub debounce_max_millis: Option<u64>,
    pub admission_per_second: Option<u32>,
    pub max_connections: Option<u64>,
    pub max_concurrent_streams: Option<u32>,
    pub keepalive_interval_seconds: Option<u64>,
    pub keepalive_timeout_seconds: Option<u64>,
    pub handshake_timeout_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsSection {
    pub cert: PathBuf,
    pub key: PathBuf,
    #[serde(rename = "clientCA")]
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewaySection {
    pub listen: Option<SocketAddr>,
    pub tls: Option<TlsSection>,
    pub oidc: Option<OidcSection>,
    pub max_body_bytes: Option<usize>,
    pub member_timeout_seconds: Option<u64>,
    pub max_connections: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OidcSection {
    pub issuer: String,
    pub audiences: Vec<String>,
    /// The issuer's JSON Web Key Set: a file, or its `jwks_uri` (https://…).
    pub jwks: String,
    /// CA certificates (PEM) to trust for a `jwks` URL (default: the system's).
    #[serde(rename = "jwksCA")]
    pub jwks_ca: Option<PathBuf>,
    /// How often the key set is read again (default 300, 10 to 86400).
    pub jwks_refresh_seconds: Option<u64>,
    pub username_claim: Option<String>,
    pub groups_claim: Option<String>,
    pub tenant_claim: Option<String>,
    pub username_prefix: Option<String>,
    pub groups_prefix: Option<String>,
    pub clock_skew_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TracingSection {
    /// The collector's OTLP/gRPC address, `http://host:4317`.
    pub otlp_endpoint: Option<String>,
    /// The share of new traces kept, 0 to 1 (default 0.1).
    pub sampling_ratio: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentSection {
    /// Where agents connect (gRPC over TLS), e.g. `0.0.0.0:9443`.
    pub listen: Option<SocketAddr>,
    /// The names and addresses agents reach the hub by (its serving certificate's).
    pub server_names: Option<Vec<String>>,
    /// An agent certificate's lifetime (default a day; agents renew at 75–80 % of it).
    pub certificate_lifetime_seconds: Option<u64>,
    /// Where a directory hub keeps the agent CA and the bootstrap tokens (a Kubernetes hub
    /// keeps them in Secrets in its namespace).
    pub state_dir: Option<PathBuf>,
    /// New agent streams admitted per second (default 50): a reconnect storm relists a few
    /// agents at a time.
    pub admission_per_second: Option<u32>,
    /// Whether a valid bootstrap token signs an agent's certificate at once (default) or the
    /// join waits for `meridian approve <cluster>`.
    pub auto_approve: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AdminSection {
    pub listen: Option<SocketAddr>,
    pub max_connections: Option<u64>,
    pub header_read_timeout_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    /// A file holding the token `/debug/*` and `/ui` then require.
    pub token_file: Option<PathBuf>,
}

/// How one listener guards itself: the timeouts here, its connection bound computed at
/// start-up from the descriptor limit (`meridian_listen::limits::bounds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard {
    /// Until a connection has sent its first bytes (admin: the whole request head).
    pub handshake_timeout: Duration,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
}

/// The listeners' bounds as configured; `None` takes a share of the descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    pub requested: meridian_listen::Requested,
    pub admin: Guard,
    pub xds: Guard,
}

/// The effective settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub hub: HubSource,
    pub leader: LeaderConfig,
    /// Bound of one watch on a member's API (a stalled one is noticed a third later).
    pub watch_timeout_seconds: u32,
    /// How often the write-back lists what it wrote into a member to repair drift.
    pub resync: Duration,
    /// DNS answers (instead of SERVFAIL) after this long even if some member has neither
    /// synced nor failed yet, so one silent member cannot hold the fleet back.
    pub sync_deadline: Duration,
    /// Bounds of the hub directory and directory members.
    pub directory: Limits,
    /// Geo ranges for DNS clients outside the fleet (none: every such client is unknown).
    pub geo: GeoSettings,
    pub dns_listen: SocketAddr,
    pub dns: DnsConfig,
    pub xds_listen: SocketAddr,
    pub xds: XdsConfig,
    pub admin_listen: SocketAddr,
    /// The file of the token `/debug/*` and `/ui` require; None: they are open.
    pub admin_token_file: Option<PathBuf>,
    pub listeners: ListenerLimits,
    /// The federation API gateway's address and settings; None: no gateway.
    pub gateway: Option<(SocketAddr, GatewayConfig)>,
    /// Where traces are exported; None: nowhere.
    pub tracing: Option<TracingConfig>,
    /// The agent listener; None: no agents (agent members stay unreachable).
    pub agent: Option<AgentConfig>,
    /// Where the hub keeps the agent CA and tokens, for a directory hub (`agent.stateDir`).
    pub agent_state_dir: Option<PathBuf>,
}

/// The agent listener's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub listen: SocketAddr,
    pub server_names: Vec<String>,
    pub certificate_lifetime: Duration,
    pub admission_per_second: u32,
    pub auto_approve: bool,
}

pub const DEFAULT_DNS: &str = "127.0.0.1:1053";
pub const DEFAULT_XDS: &str = "127.0.0.1:18000";
pub const DEFAULT_SYNC_DEADLINE_SECONDS: u64 = 30;
/// An agent certificate lives a day by default; a minute is enough to see rotation in tests,
/// a year is the longest a member should go without proving it still holds its key.
const DEFAULT_AGENT_CERTIFICATE_SECONDS: u64 = 24 * 3600;
const MIN_AGENT_CERTIFICATE_SECONDS: u64 = 60;
/// Fifty relists a second: a thousand agents are back within 20 s of a hub restart, and the
/// streams already serving keep their CPU.
const DEFAULT_AGENT_ADMISSION_PER_SECOND: u32 = 50;
const MAX_AGENT_CERTIFICATE_SECONDS: u64 = 365 * 24 * 3600;
/// One new trace in ten: enough to see where time goes without exporting every DNS miss.
pub const DEFAULT_SAMPLING_RATIO: f64 = 0.1;
/// Longer than any member takes to list: beyond it a typo would leave DNS at SERVFAIL for hours.
const MAX_SYNC_DEADLINE_SECONDS: u64 = 3600;
/// Each UDP worker is a thread: beyond this the thread spawns fail (100,000 aborted).
const MAX_UDP_WORKERS: usize = 1024;
/// One process holds no more connections than this on one listener.
const MAX_CONNECTIONS: u64 = 1_000_000;
/// Timeouts longer than an hour leave a stalled connection holding its place for nothing.
const MAX_TIMEOUT_SECONDS: u64 = 3600;

/// `value` if it lies in `range`, else an error naming the setting and the bounds.
fn bounded<T: PartialOrd + std::fmt::Display + Copy>(
    key: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<T> {
    if !range.contains(&value) {
        bail!(
            "{key} must be between {} and {} (got {value})",
            range.start(),
            range.end()
        );
    }
    Ok(value)
}

/// An optional bound, checked when set.
fn bounded_opt(
    key: &str,
    value: Option<u64>,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Option<u64>> {
    value.map(|v| bounded(key, v, range)).transpose()
}

/// Seconds, bounded to 1..=[`MAX_TIMEOUT_SECONDS`].
fn seconds(key: &str, flag: Option<u64>, file: Option<u64>, default: u64) -> Result<Duration> {
    let value = flag.or(file).unwrap_or(default);
    Ok(Duration::from_secs(bounded(
        key,
        value,
        1..=MAX_TIMEOUT_SECONDS,
    )?))
}

fn resolve_listeners(file: &File, args: &ServeArgs) -> Result<ListenerLimits> {
    let requested = meridian_listen::Requested {
        admin: bounded_opt(
            "admin.maxConnections",
            args.admin.max_connections.or(file.admin.max_connections),
            1..=MAX_CONNECTIONS,
        )?,
        xds: bounded_opt(
            "xds.maxConnections",
            args.xds.max_connections.or(file.xds.max_connections),
            1..=MAX_CONNECTIONS,
        )?,
        dns_tcp: bounded_opt(
            "dns.tcpMaxConnections",
            args.dns
                .tcp_max_connections
                .or(file.dns.tcp_max_connections),
            1..=MAX_CONNECTIONS,
        )?,
        reserve: bounded_opt(
            "reservedDescriptors",
            args.reserved_descriptors.or(file.reserved_descriptors),
            16..=MAX_CONNECTIONS,
        )?,
    };
    Ok(ListenerLimits {
        requested,
        admin: Guard {
            handshake_timeout: seconds(
                "admin.headerReadTimeoutSeconds",
                args.admin.header_read_timeout_seconds,
                file.admin.header_read_timeout_seconds,
                10,
            )?,
            idle_timeout: seconds(
                "admin.idleTimeoutSeconds",
                args.admin.idle_timeout_seconds,
                file.admin.idle_timeout_seconds,
                60,
            )?,
        },
        xds: Guard {
            handshake_timeout: seconds(
                "xds.handshakeTimeoutSeconds",
                args.xds.handshake_timeout_seconds,
                file.xds.handshake_timeout_seconds,
                10,
            )?,
            idle_timeout: seconds(
                "xds.idleTimeoutSeconds",
                args.xds.idle_timeout_seconds,
                file.xds.idle_timeout_seconds,
                300,
            )?,
        },
    })
}

/// Reads the file (if any) and applies the flags over it.
pub fn load(args: &ServeArgs) -> Result<Config> {
    let (file, base) = match &args.config {
        Some(path) => (
            read_file(path)?,
            path.parent().map(Path::to_path_buf).unwrap_or_default(),
        ),
        None => (File::default(), std::env::current_dir()?),
    };
    resolve(file, &base, args)
}

/// The largest config file read: far beyond any real one (it names files, it does not hold
/// the fleet).
const MAX_CONFIG_BYTES: u64 = 4 << 20;

pub fn read_file(path: &Path) -> Result<File> {
    let bytes = meridian_controllers::manifest::read_bounded(
        path,
        MAX_CONFIG_BYTES,
        Duration::from_secs(10),
    )
    .map_err(|why| anyhow::anyhow!("cannot read config {}: {why}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("cannot read config {}: not UTF-8: {e}", path.display()))?;
    parse_file(&text).with_context(|| format!("{}", path.display()))
}

/// A config file's text: YAML that does not parse is said to be malformed YAML (with its
/// line), apart from YAML that parses but does not say what a config can say.
fn parse_file(text: &str) -> Result<File> {
    serde_yaml_ng::from_str(text).map_err(|typed| {
        match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text) {
            Err(syntax) => anyhow::anyhow!("malformed YAML: {syntax}"),
            Ok(_) => anyhow::anyhow!("invalid config: {typed}"),
        }
    })
}

fn resolve(file: File, base: &Path, args: &ServeArgs) -> Result<Config> {
    let hub = resolve_hub(&file.hub, base, args)?;
    let listeners = resolve_listeners(&file, args)?;
    let leader = resolve_leader(&file.leader_election, args)?;
    if leader.shards && matches!(hub, HubSource::Directory(_)) {
        bail!(
            "leaderElection.shards needs a Kubernetes hub (its Leases coordinate the replicas); a directory hub has one replica"
        );
    }
    let zones = match (&args.dns.zones, &file.dns.zones) {
        (z, _) if !z.is_empty() => z
            .iter()
            .map(|s| parse_zone_flag(s))
            .collect::<Result<Vec<_>>>()?,
        (_, Some(z)) => z.clone(),
        _ => vec![
            ZoneSection {
                name: "global".into(),
                style: StyleName::Global,
                namespace: None,
            },
            ZoneSection {
                name: "clusterset.local".into(),
                style: StyleName::Clusterset,
                namespace: None,
            },
        ],
    };
    if zones.is_empty() {
        bail!("dns.zones: at least one zone is required");
    }
    let zones = zones
        .into_iter()
        .map(|z| {
            let style = match z.style {
                StyleName::Global => Style::Global,
                StyleName::Clusterset => Style::Clusterset,
            };
            Ok(ZoneConfig::new(&z.name, style, z.namespace)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let dns_listen = args
        .dns
        .listen
        .or(file.dns.listen)
        .unwrap_or_else(|| DEFAULT_DNS.parse().expect("default"));
    let defaults = DnsConfig::default();
    let dns = DnsConfig {
        zones,
        ttl: args.dns.ttl.or(file.dns.ttl).unwrap_or(defaults.ttl),
        max_answers: args
            .dns
            .max_answers
            .or(file.dns.max_answers)
            .unwrap_or(defaults.max_answers),
        allow_transfer: if args.dns.allow_transfer.is_empty() {
            file.dns.allow_transfer.unwrap_or_default()
        } else {
            args.dns.allow_transfer.clone()
        },
        tcp_idle_timeout: seconds(
            "dns.tcpIdleTimeoutSeconds",
            args.dns.tcp_idle_timeout_seconds,
            file.dns.tcp_idle_timeout_seconds,
            defaults.tcp_idle_timeout.as_secs(),
        )?,
        ns_address: (!dns_listen.ip().is_unspecified()).then_some(dns_listen.ip()),
        udp_workers: bounded(
            "dns.udpWorkers",
            args.dns
                .udp_workers
                .or(file.dns.udp_workers)
                .unwrap_or(defaults.udp_workers),
            1..=MAX_UDP_WORKERS,
        )?,
        cache_entries: args
            .dns
            .cache_entries
            .or(file.dns.cache_entries)
            .unwrap_or(defaults.cache_entries),
    };
    let xds = resolve_xds(&file.xds, base, args)?;
    let watch_timeout_seconds = args
        .hub
        .watch_timeout_seconds
        .or(file.kubernetes.watch_timeout_seconds)
        .unwrap_or(30);
    if watch_timeout_seconds == 0 {
        bail!("kubernetes.watchTimeoutSeconds must be positive");
    }
    let resync_seconds = (args.hub.resync_seconds)
        .or(file.kubernetes.resync_seconds)
        .unwrap_or(60);
    if resync_seconds == 0 {
        bail!("kubernetes.resyncSeconds must be positive");
    }
    let sync_deadline = resolve_sync_deadline(file.sync_deadline_seconds, args)?;
    let directory = resolve_directory(&file.directory, args)?;
    let geo = resolve_geo(&file.geo, base, args, &directory)?;
    let gateway = resolve_gateway(&file.gateway, base, args)?;
    if gateway.is_some() && matches!(hub, HubSource::Directory(_)) {
        bail!("gateway needs a Kubernetes hub: a directory hub has no API to serve through it");
    }
    Ok(Config {
        leader,
        watch_timeout_seconds,
        resync: Duration::from_secs(resync_seconds.into()),
        sync_deadline,
        directory,
        geo,
        dns_listen,
        dns,
        xds_listen: args
            .xds
            .listen
            .or(file.xds.listen)
            .unwrap_or_else(|| DEFAULT_XDS.parse().expect("default")),
        xds,
        admin_listen: args
            .admin_listen
            .or(file.admin.listen)
            .unwrap_or_else(|| crate::cli::DEFAULT_ADMIN.parse().expect("default")),
        admin_token_file: args
            .admin
            .token_file
            .clone()
            .or_else(|| file.admin.token_file.as_ref().map(|f| base.join(f))),
        listeners,
        gateway,
        tracing: resolve_tracing(&file.tracing, args)?,
        agent_state_dir: resolve_agent_state_dir(&file.agent, base, args, &hub)?,
        agent: resolve_agent(&file.agent, args)?,
        hub,
    })
}

/// Where a directory hub keeps the agent CA and tokens; a Kubernetes hub has Secrets.
fn resolve_agent_state_dir(
    file: &AgentSection,
    base: &Path,
    args: &ServeArgs,
    hub: &HubSource,
) -> Result<Option<PathBuf>> {
    let dir = args
        .agent
        .state_dir
        .clone()
        .or_else(|| file.state_dir.clone());
    match (hub, dir) {
        (HubSource::Directory(_), dir) => Ok(dir.map(|d| base.join(d))),
        (HubSource::Kubernetes { .. }, Some(_)) => bail!(
            "agent.stateDir is for a directory hub: a Kubernetes hub keeps the agent CA and tokens in Secrets in its namespace"
        ),
        (HubSource::Kubernetes { .. }, None) => Ok(None),
    }
}

/// The agent listener, when a listen address is set.
fn resolve_agent(file: &AgentSection, args: &ServeArgs) -> Result<Option<AgentConfig>> {
    let Some(listen) = args.agent.listen.or(file.listen) else {
        if file.server_names.is_some()
            || file.certificate_lifetime_seconds.is_some()
            || file.admission_per_second.is_some()
            || file.auto_approve.is_some()
        {
            bail!(
                "agent.serverNames, agent.certificateLifetimeSeconds, agent.admissionPerSecond and agent.autoApprove need agent.listen"
            );
        }
        return Ok(None);
    };
    let server_names = match &file.server_names {
        Some(names) if names.is_empty() => bail!("agent.serverNames: at least one name"),
        Some(names) => names.clone(),
        None => {
            let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
            if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
                names.push(listen.ip().to_string());
            }
            names
        }
    };
    let lifetime = bounded(
        "agent.certificateLifetimeSeconds",
        args.agent
            .certificate_lifetime_seconds
            .or(file.certificate_lifetime_seconds)
            .unwrap_or(DEFAULT_AGENT_CERTIFICATE_SECONDS),
        MIN_AGENT_CERTIFICATE_SECONDS..=MAX_AGENT_CERTIFICATE_SECONDS,
    )?;
    let admission_per_second = bounded(
        "agent.admissionPerSecond",
        file.admission_per_second
            .unwrap_or(DEFAULT_AGENT_ADMISSION_PER_SECOND),
        1..=100_000,
    )?;
    Ok(Some(AgentConfig {
        listen,
        server_names,
        certificate_lifetime: Duration::from_secs(lifetime),
        admission_per_second,
        auto_approve: file.auto_approve.unwrap_or(true),
    }))
}

/// Traces are exported when a collector is named; the ratio alone is a mistake.
fn resolve_tracing(file: &TracingSection, args: &ServeArgs) -> Result<Option<TracingConfig>> {
    let ratio = args.tracing.sampling_ratio.or(file.sampling_ratio);
    let Some(endpoint) = args
        .tracing
        .otlp_endpoint
        .clone()
        .or_else(|| file.otlp_endpoint.clone())
    else {
        if ratio.is_some() {
            bail!("tracing.samplingRatio needs tracing.otlpEndpoint (where the traces go)");
        }
        return Ok(None);
    };
    let authority = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .with_context(|| {
            format!("tracing.otlpEndpoint {endpoint:?} must be an http:// or https:// URL of an OTLP/gRPC collector")
        })?;
    let authority = authority.strip_suffix('/').unwrap_or(authority);
    if authority.is_empty() || authority.contains(['/', ' ', '?', '#']) {
        bail!(
            "tracing.otlpEndpoint {endpoint:?} must name a host and port only (e.g. http://127.0.0.1:4317)"
        );
    }
    let sampling_ratio = ratio.unwrap_or(DEFAULT_SAMPLING_RATIO);
    if !(0.0..=1.0).contains(&sampling_ratio) {
        bail!("tracing.samplingRatio must be between 0 and 1 (got {sampling_ratio})");
    }
    Ok(Some(TracingConfig {
        endpoint,
        sampling_ratio,
    }))
}

/// The gateway, when a listen address is set: TLS and an identity are required (an open
/// gateway would lend meridian's member credentials to anyone).
fn resolve_gateway(
    file: &GatewaySection,
    base: &Path,
    args: &ServeArgs,
) -> Result<Option<(SocketAddr, GatewayConfig)>> {
    let Some(listen) = args.gateway.listen.or(file.listen) else {
        if args.gateway.tls_cert.is_some() || args.gateway.tls_key.is_some() {
            bail!("--gateway-tls-cert and --gateway-tls-key need --gateway-listen");
        }
        return Ok(None);
    };
    let (cert, key) = match (&args.gateway.tls_cert, &args.gateway.tls_key, &file.tls) {
        (Some(cert), Some(key), _) => (cert.clone(), key.clone()),
        (None, None, Some(t)) => (base.join(&t.cert), base.join(&t.key)),
        (None, None, None) => bail!(
            "gateway.tls {{cert, key}} is required: the gateway speaks HTTPS only (bearer tokens must not cross in clear)"
        ),
        _ => bail!("--gateway-tls-cert and --gateway-tls-key go together"),
    };
    let Some(oidc) = &file.oidc else {
        bail!("gateway.oidc is required: every request is authenticated (issuer, audiences, jwks)");
    };
    if oidc.audiences.is_empty() {
        bail!("gateway.oidc.audiences: at least one audience is required");
    }
    let skew = oidc.clock_skew_seconds.unwrap_or(60);
    if skew > 600 {
        bail!("gateway.oidc.clockSkewSeconds must be at most 600");
    }
    let member_timeout = file.member_timeout_seconds.unwrap_or(30);
    if !(1..=600).contains(&member_timeout) {
        bail!("gateway.memberTimeoutSeconds must be between 1 and 600");
    }
    Ok(Some((
        listen,
        GatewayConfig {
            cert,
            key,
            client_ca: args.gateway.client_ca.clone().or_else(|| {
                let t = file.tls.as_ref()?;
                t.client_ca.as_ref().map(|p| base.join(p))
            }),
            oidc: OidcConfig {
                issuer: oidc.issuer.clone(),
                audiences: oidc.audiences.clone(),
                username_claim: oidc.username_claim.clone().unwrap_or_else(|| "sub".into()),
                groups_claim: oidc.groups_claim.clone().unwrap_or_else(|| "groups".into()),
                tenant_claim: oidc.tenant_claim.clone(),
                username_prefix: oidc.username_prefix.clone().unwrap_or_default(),
                groups_prefix: oidc.groups_prefix.clone().unwrap_or_default(),
                clock_skew: Duration::from_secs(skew),
            },
            jwks: jwks_source(oidc, base)?,
            jwks_refresh: Duration::from_secs(bounded(
                "gateway.oidc.jwksRefreshSeconds",
                oidc.jwks_refresh_seconds.unwrap_or(300),
                10..=86_400,
            )?),
            // The API server's own bound on a request body.
            max_body_bytes: file.max_body_bytes.unwrap_or(3 * 1024 * 1024),
            member_timeout: Duration::from_secs(member_timeout),
            max_connections: file.max_connections.unwrap_or(4096),
        },
    )))
}

/// `jwks`: an https:// URL (the issuer's jwks_uri; plain http only on loopback), else a file.
fn jwks_source(oidc: &OidcSection, base: &Path) -> Result<JwksSource> {
    let jwks = oidc.jwks.trim();
    let is_url = jwks.starts_with("https://") || jwks.starts_with("http://");
    if !is_url {
        if oidc.jwks_ca.is_some() {
            bail!("gateway.oidc.jwksCA is for a jwks URL, and jwks names a file");
        }
        return Ok(JwksSource::File(base.join(jwks)));
    }
    let url: http::Uri = jwks
        .parse()
        .with_context(|| format!("gateway.oidc.jwks {jwks:?} is not a URL"))?;
    let host = url.host().unwrap_or_default();
    let loopback = host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if url.scheme_str() == Some("http") && !loopback {
        bail!(
            "gateway.oidc.jwks {jwks:?}: the issuer's keys must come over https:// (plain http only from loopback)"
        );
    }
    Ok(JwksSource::Url {
        url: jwks.to_string(),
        ca: oidc.jwks_ca.as_ref().map(|p| base.join(p)),
    })
}

fn resolve_directory(file: &DirectorySection, args: &ServeArgs) -> Result<Limits> {
    let flags = &args.directory;
    let d = Limits::default();
    let limits = Limits {
        max_file_bytes: flags
            .max_file_bytes
            .or(file.max_file_bytes)
            .unwrap_or(d.max_file_bytes),
        max_member_bytes: flags
            .max_member_bytes
            .or(file.max_member_bytes)
            .unwrap_or(d.max_member_bytes),
        max_depth: flags.max_depth.or(file.max_depth).unwrap_or(d.max_depth),
        read_timeout: flags
            .read_timeout_seconds
            .or(file.read_timeout_seconds)
            .map_or(d.read_timeout, Duration::from_secs),
        settle: flags
            .settle_milliseconds
            .or(file.settle_milliseconds)
            .map_or(d.settle, Duration::from_millis),
        grace: flags
            .grace_seconds
            .or(file.grace_seconds)
            .map_or(d.grace, Duration::from_secs),
    };
    if limits.max_file_bytes == 0 || limits.max_depth == 0 || limits.read_timeout.is_zero() {
        bail!("directory.maxFileBytes, maxDepth and readTimeoutSeconds must be positive");
    }
    Ok(limits)
}

/// The config's ranges, then `--geo-range` ones; the file and its bounds (flags win). The
/// file is read with the directory sources' timeout and settle time, with a size limit of its
/// own (an export is far larger than any manifest).
fn resolve_geo(
    file: &GeoSection,
    base: &Path,
    args: &ServeArgs,
    directory: &Limits,
) -> Result<GeoSettings> {
    let flags = &args.geo;
    let mut ranges = Vec::new();
    for (i, r) in file.ranges.iter().enumerate() {
        ranges.push(config_range(
            &format!("geo.ranges[{i}]"),
            r.cidrs.clone(),
            &r.region,
            r.zone.as_deref(),
        )?);
    }
    for flag in &flags.ranges {
        ranges.push(parse_geo_flag(flag)?);
    }
    let reload = flags
        .reload_seconds
        .or(file.reload_seconds)
        .map_or(Ok(GeoSettings::DEFAULT_RELOAD), |s| {
            bounded("geo.reloadSeconds", s, 1..=MAX_TIMEOUT_SECONDS).map(Duration::from_secs)
        })?;
    let max_file_bytes = flags
        .max_file_bytes
        .or(file.max_file_bytes)
        .unwrap_or(GeoSettings::DEFAULT_MAX_FILE_BYTES);
    if max_file_bytes == 0 {
        bail!("geo.maxFileBytes must be positive");
    }
    Ok(GeoSettings {
        ranges,
        config_file: args.config.clone(),
        file: flags
            .file
            .clone()
            .or_else(|| file.file.as_ref().map(|f| base.join(f))),
        reload,
        max_file_bytes,
        read_timeout: directory.read_timeout,
        settle: directory.settle,
    })
}

fn config_range(
    key: &str,
    cidrs: Vec<IpNet>,
    region: &str,
    zone: Option<&str>,
) -> Result<ConfigRange> {
    if cidrs.is_empty() {
        bail!("{key}: cidrs is empty");
    }
    let name = |what: &str, v: &str| -> Result<String> {
        if v.is_empty() || v.chars().any(char::is_whitespace) {
            bail!("{key}: {what} {v:?} must be a non-empty word");
        }
        Ok(v.to_string())
    };
    Ok(ConfigRange {
        cidrs,
        locality: meridian_core::Locality {
            region: Some(name("region", region)?),
            zone: zone.map(|z| name("zone", z)).transpose()?,
        },
    })
}

/// `CIDR=REGION[:ZONE]`, as `--geo-range` takes it.
fn parse_geo_flag(s: &str) -> Result<ConfigRange> {
    let Some((cidr, locality)) = s.split_once('=') else {
        bail!("--geo-range {s:?}: expected CIDR=REGION[:ZONE]");
    };
    let net: IpNet = cidr
        .trim()
        .parse()
        .with_context(|| format!("--geo-range {s:?}: bad CIDR {cidr:?}"))?;
    let (region, zone) = match locality.split_once(':') {
        Some((r, z)) => (r, Some(z)),
        None => (locality, None),
    };
    config_range(&format!("--geo-range {s:?}"), vec![net], region, zone)
}

fn resolve_sync_deadline(file: Option<u64>, args: &ServeArgs) -> Result<Duration> {
    let seconds = args
        .sync_deadline_seconds
        .or(file)
        .unwrap_or(DEFAULT_SYNC_DEADLINE_SECONDS);
    if !(1..=MAX_SYNC_DEADLINE_SECONDS).contains(&seconds) {
        bail!(
            "syncDeadlineSeconds must be between 1 and {MAX_SYNC_DEADLINE_SECONDS} (got {seconds})"
        );
    }
    Ok(Duration::from_secs(seconds))
}

fn resolve_hub(file: &HubSection, base: &Path, args: &ServeArgs) -> Result<HubSource> {
    let flags = &args.hub;
    let directory = args
        .hub_directory
        .clone()
        .or_else(|| file.directory.as_ref().map(|d| base.join(d)));
    let kubeconfig = flags
        .kubeconfig
        .clone()
        .or_else(|| file.kubeconfig.as_ref().map(|k| base.join(k)));
    let in_cluster = flags.in_cluster || file.in_cluster;
    let namespace = flags
        .namespace
        .clone()
        .or_else(|| file.namespace.clone())
        .unwrap_or_else(|| "meridian-system".into());
    match (directory, kubeconfig, in_cluster) {
        (Some(dir), None, false) => Ok(HubSource::Directory(dir)),
        (None, Some(k), false) => Ok(HubSource::Kubernetes {
            kubeconfig: Some(k),
            context: flags.context.clone().or_else(|| file.context.clone()),
            namespace,
        }),
        (None, None, true) => Ok(HubSource::Kubernetes {
            kubeconfig: None,
            context: None,
            namespace,
        }),
        (None, None, false) => bail!(
            "a hub is required: hub.directory, hub.kubeconfig or hub.inCluster (or --hub-directory, --hub-kubeconfig, --hub-in-cluster)"
        ),
        _ => bail!("hub: set exactly one of directory, kubeconfig, inCluster"),
    }
}

fn resolve_leader(file: &LeaderSection, args: &ServeArgs) -> Result<LeaderConfig> {
    let flags = &args.lease;
    let secs = |flag: Option<u64>, file: Option<u64>, default: u64| {
        Duration::from_secs(flag.or(file).unwrap_or(default))
    };
    let leader = LeaderConfig {
        lease_name: flags
            .name
            .clone()
            .or_else(|| file.lease_name.clone())
            .unwrap_or_else(|| "meridian".into()),
        lease_duration: secs(flags.duration_seconds, file.lease_duration_seconds, 15),
        renew_deadline: secs(
            flags.renew_deadline_seconds,
            file.renew_deadline_seconds,
            10,
        ),
        retry_period: secs(flags.retry_period_seconds, file.retry_period_seconds, 2),
        identity: flags
            .identity
            .clone()
            .or_else(|| file.identity.clone())
            .unwrap_or_else(default_identity),
        shards: flags.shards || file.shards.unwrap_or(false),
    };
    if leader.retry_period.is_zero() || leader.retry_period >= leader.renew_deadline {
        bail!("leaderElection: retryPeriodSeconds must be positive and below renewDeadlineSeconds");
    }
    if leader.renew_deadline >= leader.lease_duration {
        bail!(
            "leaderElection: renewDeadlineSeconds must be below leaseDurationSeconds, so a leader stops writing before its lease can be taken over"
        );
    }
    Ok(leader)
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "meridian".into());
    format!("{host}-{}", std::process::id())
}

fn resolve_xds(file: &XdsSection, base: &Path, args: &ServeArgs) -> Result<XdsConfig> {
    let defaults = XdsConfig::default();
    let millis = |flag: Option<u64>, file: Option<u64>, default: Duration| {
        flag.or(file).map_or(default, Duration::from_millis)
    };
    let debounce = millis(
        args.xds.debounce_ms,
        file.debounce_millis,
        defaults.debounce,
    );
    let debounce_max = millis(
        args.xds.debounce_max_ms,
        file.debounce_max_millis,
        defaults.debounce_max,
    );
    if debounce_max < debounce {
        bail!(
            "xds: debounceMaxMillis ({debounce_max:?}) is shorter than debounceMillis ({debounce:?})"
        );
    }
    let tls = match (&args.xds.tls_cert, &args.xds.tls_key, &file.tls) {
        (Some(cert), Some(key), _) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.xds.tls_client_ca.clone(),
        }),
        (None, None, Some(t)) => Some(TlsFiles {
            cert: base.join(&t.cert),
            key: base.join(&t.key),
            client_ca: args
                .xds
                .tls_client_ca
                .clone()
                .or_else(|| t.client_ca.as_ref().map(|p| base.join(p))),
        }),
        (None, None, None) => None,
        _ => bail!("--xds-tls-cert and --xds-tls-key go together"),
    };
    if tls.is_none() && args.xds.tls_client_ca.is_some() {
        bail!("--xds-tls-client-ca needs a server certificate (--xds-tls-cert, --xds-tls-key)");
    }
    Ok(XdsConfig {
        debounce,
        debounce_max,
        admission_per_second: args
            .xds
            .admission_per_second
            .or(file.admission_per_second)
            .unwrap_or(defaults.admission_per_second),
        tls,
        max_concurrent_streams: bounded(
            "xds.maxConcurrentStreams",
            args.xds
                .max_concurrent_streams
                .or(file.max_concurrent_streams)
                .unwrap_or(defaults.max_concurrent_streams),
            1..=10_000,
        )?,
        keepalive_interval: seconds(
            "xds.keepaliveIntervalSeconds",
            args.xds.keepalive_interval_seconds,
            file.keepalive_interval_seconds,
            defaults.keepalive_interval.as_secs(),
        )?,
        keepalive_timeout: seconds(
            "xds.keepaliveTimeoutSeconds",
            args.xds.keepalive_timeout_seconds,
            file.keepalive_timeout_seconds,
            defaults.keepalive_timeout.as_secs(),
        )?,
    })
}

/// `NAME[:STYLE[:NAMESPACE]]`, as `--dns-zone` takes it.
fn parse_zone_flag(s: &str) -> Result<ZoneSection> {
    let mut parts = s.split(':');
    let name = parts.next().unwrap_or_default().to_string();
    let style = match parts.next() {
        None | Some("global") => StyleName::Global,
        Some("clusterset") => StyleName::Clusterset,
        Some(other) => bail!("--dns-zone {s:?}: unknown style {other:?} (global or clusterset)"),
    };
    Ok(ZoneSection {
        name,
        style,
        namespace: parts.next().map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> ServeArgs {
        let mut argv = vec!["serve"];
        argv.extend_from_slice(extra);
        ServeArgs::from_args(argv).unwrap()
    }

    fn parse(yaml: &str) -> Result<File> {
        parse_file(yaml)
    }

    #[test]
    fn a_syntax_error_is_malformed_yaml_with_its_line_and_a_bad_value_is_an_invalid_config() {
        let syntax =
            parse("hub:\n  directory: hub\ndns: {ttl: 5\nxds:\n  listen: x\n").unwrap_err();
        let syntax = format!("{syntax:#}");
        assert!(syntax.starts_with("malformed YAML: "), "{syntax}");
        assert!(syntax.contains("line 3"), "{syntax}");
        let typed = parse("hub:\n  directory: hub\ndns:\n  ttl: five\n").unwrap_err();
        let typed = format!("{typed:#}");
        assert!(typed.starts_with("invalid config: "), "{typed}");
        assert!(typed.contains("ttl") && typed.contains("line 4"), "{typed}");
    }

    #[test]
    fn the_documented_shape_parses_and_paths_resolve_against_the_file() {
        let file = parse(
            "hub:\n  directory: hub\ndns:\n  listen: 127.0.0.1:1053\n  zones:\n    - {name: global, style: global}\n    - {name: clusterset.local, style: clusterset}\n  ttl: 5\nxds:\n  listen: 127.0.0.1:18000\nadmin:\n  listen: 127.0.0.1:9180\n",
        )
        .unwrap();
        let cfg = resolve(file, Path::new("/etc/meridian"), &args(&[])).unwrap();
        assert_eq!(
            cfg.hub,
            HubSource::Directory(PathBuf::from("/etc/meridian/hub"))
        );
        assert_eq!(cfg.dns.zones.len(), 2);
        assert_eq!(cfg.dns.zones[1].style, Style::Clusterset);
        assert_eq!(cfg.dns.ttl, 5);
        assert_eq!(cfg.admin_listen, "127.0.0.1:9180".parse().unwrap());
    }

    #[test]
    fn flags_override_the_file() {
        let file = parse("hub: {directory: hub}\ndns: {ttl: 5, listen: 127.0.0.1:1053}\n").unwrap();
        let cfg = resolve(
            file,
            Path::new("/x"),
            &args(&[
                "--dns-ttl",
                "30",
                "--dns-listen",
                "127.0.0.2:53",
                "--dns-zone",
                "example:global:shop",
                "--hub-directory",
                "/h",
            ]),
        )
        .unwrap();
        assert_eq!(cfg.dns.ttl, 30);
        assert_eq!(cfg.dns_listen, "127.0.0.2:53".parse().unwrap());
        assert_eq!(cfg.dns.zones[0].namespace.as_deref(), Some("shop"));
        assert_eq!(cfg.hub, HubSource::Directory(PathBuf::from("/h")));
    }

    #[test]
    fn unknown_fields_and_bad_values_are_errors() {
        let e = parse("hub: {directory: hub}\ndns: {tll: 5}\n").unwrap_err();
        assert!(format!("{e:#}").contains("unknown field `tll`"), "{e:#}");
        let e = parse("dns: {listen: nowhere}\n").unwrap_err();
        assert!(format!("{e:#}").contains("invalid socket address"), "{e:#}");
        let e = parse("dns: {zones: [{name: global, style: galactic}]}\n").unwrap_err();
        assert!(
            format!("{e:#}").contains("unknown variant `galactic`"),
            "{e:#}"
        );
        let e = resolve(
            parse("dns: {ttl: 5}\n").unwrap(),
            Path::new("/"),
            &args(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("a hub is required"));
        let e = resolve(
            parse("hub: {directory: h}\ndns: {zones: [{name: clusterset.local, style: clusterset, namespace: x}]}\n").unwrap(),
            Path::new("/"),
            &args(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("global style only"), "{e}");
    }

    #[test]
    fn traces_go_to_an_otlp_url_at_a_ratio_between_zero_and_one() {
        let hub = "hub: {directory: h}\n";
        let resolved = |yaml: &str, flags: &[&str]| {
            let file = parse(&format!("{hub}{yaml}")).unwrap();
            resolve(file, Path::new("/etc/m"), &args(flags))
        };
        assert_eq!(resolved("", &[]).unwrap().tracing, None);
        let on = resolved("tracing: {otlpEndpoint: 'http://127.0.0.1:4317'}\n", &[]).unwrap();
        assert_eq!(
            on.tracing,
            Some(TracingConfig {
                endpoint: "http://127.0.0.1:4317".into(),
                sampling_ratio: DEFAULT_SAMPLING_RATIO,
            })
        );
        let flags = resolved(
            "tracing: {otlpEndpoint: 'http://a:4317', samplingRatio: 0.5}\n",
            &[
                "--tracing-otlp-endpoint",
                "https://b:4317/",
                "--tracing-sampling-ratio",
                "1",
            ],
        )
        .unwrap()
        .tracing
        .unwrap();
        assert_eq!(
            (flags.endpoint.as_str(), flags.sampling_ratio),
            ("https://b:4317/", 1.0)
        );
        for (yaml, says) in [
            (
                "tracing: {samplingRatio: 0.5}\n",
                "needs tracing.otlpEndpoint",
            ),
            (
                "tracing: {otlpEndpoint: '127.0.0.1:4317'}\n",
                "must be an http:// or https:// URL",
            ),
            (
                "tracing: {otlpEndpoint: 'http://c:4317/v1/traces'}\n",
                "host and port only",
            ),
            (
                "tracing: {otlpEndpoint: 'http://c:4317', samplingRatio: 1.5}\n",
                "between 0 and 1",
            ),
            (
                "tracing: {otlpEndpoint: 'http://c:4317', samplingRatio: -0.1}\n",
                "between 0 and 1",
            ),
        ] {
            let e = format!("{:#}", resolved(yaml, &[]).unwrap_err());
            assert!(e.contains(says), "{yaml}: {e}");
        }
    }

    #[test]
    fn the_issuers_keys_come_from_a_file_or_an_https_url() {
        let gateway = |oidc: &str| {
            let file = parse(&format!(
                "hub: {{kubeconfig: k}}\ngateway:\n  listen: 127.0.0.1:9443\n  tls: {{cert: c, key: k}}\n  oidc: {{issuer: https://i, audiences: [m], {oidc}}}\n"
            ))
            .unwrap();
            resolve(file, Path::new("/etc/m"), &args(&[])).map(|c| c.gateway.unwrap().1)
        };
        let url =
            gateway("jwks: 'https://issuer.example/keys', jwksCA: ca.pem, jwksRefreshSeconds: 60")
                .unwrap();
        assert_eq!(
            url.jwks,
            JwksSource::Url {
                url: "https://issuer.example/keys".into(),
                ca: Some(PathBuf::from("/etc/m/ca.pem"))
            }
        );
        assert_eq!(url.jwks_refresh, Duration::from_secs(60));
        assert!(gateway("jwks: 'http://127.0.0.1:8080/keys'").is_ok());
        for (oidc, says) in [
            (
                "jwks: 'http://issuer.example/keys'",
                "must come over https://",
            ),
            (
                "jwks: keys.json, jwksCA: ca.pem",
                "jwksCA is for a jwks URL",
            ),
            (
                "jwks: keys.json, jwksRefreshSeconds: 1",
                "jwksRefreshSeconds must be between 10",
            ),
            ("jwks: 'https://bad host/keys'", "is not a URL"),
        ] {
            let e = format!("{:#}", gateway(oidc).expect_err(oidc));
            assert!(e.contains(says), "{oidc}: {e}");
        }
    }

    #[test]
    fn the_agent_listener_its_names_lifetime_and_where_its_state_is_kept() {
        let dir_hub = "hub: {directory: h}\n";
        let cfg = resolve(
            parse(&format!(
                "{dir_hub}agent: {{listen: '10.0.0.5:9443', stateDir: agent}}\n"
            ))
            .unwrap(),
            Path::new("/etc/m"),
            &args(&[]),
        )
        .unwrap();
        let agent = cfg.agent.unwrap();
        assert_eq!(agent.listen, "10.0.0.5:9443".parse().unwrap());
        assert_eq!(agent.server_names, ["localhost", "127.0.0.1", "10.0.0.5"]);
        assert_eq!(agent.certificate_lifetime, Duration::from_secs(86400));
        assert_eq!(agent.admission_per_second, 50);
        assert!(agent.auto_approve, "tokens sign at once unless told");
        assert_eq!(cfg.agent_state_dir, Some(PathBuf::from("/etc/m/agent")));
        let by_operator = resolve(
            parse(&format!(
                "{dir_hub}agent: {{listen: '10.0.0.5:9443', autoApprove: false}}\n"
            ))
            .unwrap(),
            Path::new("/etc/m"),
            &args(&[]),
        )
        .unwrap();
        assert!(!by_operator.agent.unwrap().auto_approve);
        // Flags, and the bounds of the lifetime.
        let cfg = resolve(
            parse(dir_hub).unwrap(),
            Path::new("/etc/m"),
            &args(&[
                "--agent-listen",
                "0.0.0.0:9443",
                "--agent-certificate-lifetime-seconds",
                "60",
            ]),
        )
        .unwrap();
        assert_eq!(
            cfg.agent.unwrap().certificate_lifetime,
            Duration::from_secs(60)
        );
        for (yaml, expected) in [
            (
                "agent: {listen: '0.0.0.0:9443', certificateLifetimeSeconds: 59}",
                "agent.certificateLifetimeSeconds must be between 60",
            ),
            ("agent: {serverNames: [hub.example]}", "need agent.listen"),
            ("agent: {autoApprove: false}", "need agent.listen"),
            (
                "agent: {listen: '0.0.0.0:9443', admissionPerSecond: 0}",
                "agent.admissionPerSecond must be between 1",
            ),
            (
                "agent: {listen: '0.0.0.0:9443', serverNames: []}",
                "at least one name",
            ),
        ] {
            let e = resolve(
                parse(&format!("{dir_hub}{yaml}\n")).unwrap(),
                Path::new("/"),
                &args(&[]),
            )
            .unwrap_err();
            assert!(format!("{e:#}").contains(expected), "{yaml}: {e:#}");
        }
        // A Kubernetes hub keeps the agent state in Secrets: a stateDir is a mistake.
        let e = resolve(
            parse("hub: {kubeconfig: k}\nagent: {listen: '0.0.0.0:9443', stateDir: s}\n").unwrap(),
            Path::new("/"),
            &args(&[]),
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("keeps the agent CA and tokens in Secrets"),
            "{e:#}"
        );
    }

    #[test]
    fn the_gateway_needs_tls_an_identity_and_a_kubernetes_hub() {
        let hub = "hub: {kubeconfig: hub.kubeconfig}\n";
        let oidc =
            "  oidc: {issuer: https://i, audiences: [m], jwks: keys.json, usernameClaim: email}\n";
        let file = parse(&format!(
            "{hub}gateway:\n  listen: 127.0.0.1:9443\n  tls: {{cert: g.crt, key: g.key}}\n{oidc}"
        ))
        .unwrap();
        let cfg = resolve(file, Path::new("/etc/m"), &args(&[])).unwrap();
        let (listen, gateway) = cfg.gateway.unwrap();
        assert_eq!(listen, "127.0.0.1:9443".parse().unwrap());
        assert_eq!(gateway.cert, PathBuf::from("/etc/m/g.crt"));
        assert_eq!(
            gateway.jwks,
            JwksSource::File(PathBuf::from("/etc/m/keys.json"))
        );
        assert_eq!(gateway.jwks_refresh, Duration::from_secs(300));
        assert_eq!(gateway.oidc.username_claim, "email");
        assert_eq!(gateway.oidc.groups_claim, "groups");
        assert_eq!(gateway.oidc.clock_skew, Duration::from_secs(60));
        assert_eq!(gateway.max_body_bytes, 3 * 1024 * 1024);
        // The listen address alone, on the command line: TLS and OIDC are still required.
        let file = parse(hub).unwrap();
        let e = resolve(
            file,
            Path::new("/etc/m"),
            &args(&["--gateway-listen", "127.0.0.1:9443"]),
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("gateway.tls"), "{e:#}");
        let file = parse(&format!("{hub}gateway:\n  listen: 127.0.0.1:9443\n")).unwrap();
        let e = resolve(
            file,
            Path::new("/etc/m"),
            &args(&["--gateway-tls-cert", "a", "--gateway-tls-key", "b"]),
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("gateway.oidc is required"),
            "{e:#}"
        );
        let file = parse(&format!(
            "hub: {{directory: h}}\ngateway:\n  listen: 127.0.0.1:9443\n  tls: {{cert: a, key: b}}\n{oidc}"
        ))
        .unwrap();
        let e = resolve(file, Path::new("/etc/m"), &args(&[])).unwrap_err();
        assert!(format!("{e:#}").contains("needs a Kubernetes hub"), "{e:#}");
        // No listen address: no gateway, and its TLS flags alone are a mistake.
        let file = parse(hub).unwrap();
        assert!(
            resolve(file, Path::new("/etc/m"), &args(&[]))
                .unwrap()
                .gateway
                .is_none()
        );
        let file = parse(hub).unwrap();
        let e = resolve(
            file,
            Path::new("/etc/m"),
            &args(&["--gateway-tls-cert", "a"]),
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("need --gateway-listen"), "{e:#}");
    }

    #[test]
    fn the_xds_section_resolves_tls_paths_and_debounce() {
        let file = parse(
            "hub: {directory: hub}\nxds:\n  listen: 127.0.0.1:18001\n  debounceMillis: 50\n  debounceMaxMillis: 500\n  tls: {cert: x.pem, key: x.key, clientCA: ca.pem}\n",
        )
        .unwrap();
        let cfg = resolve(file, Path::new("/etc/m"), &args(&[])).unwrap();
        assert_eq!(cfg.xds_listen, "127.0.0.1:18001".parse().unwrap());
        assert_eq!(cfg.xds.debounce, Duration::from_millis(50));
        assert_eq!(cfg.xds.debounce_max, Duration::from_millis(500));
        let tls = cfg.xds.tls.unwrap();
        assert_eq!(tls.cert, PathBuf::from("/etc/m/x.pem"));
        assert_eq!(tls.client_ca, Some(PathBuf::from("/etc/m/ca.pem")));

        let e = resolve(
            parse("hub: {directory: h}\nxds: {debounceMillis: 900, debounceMaxMillis: 100}\n")
                .unwrap(),
            Path::new("/"),
            &args(&[]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("shorter than debounceMillis"), "{e}");
        let e = resolve(
            parse("hub: {directory: h}\n").unwrap(),
            Path::new("/"),
            &args(&["--xds-tls-cert", "a.pem"]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("go together"), "{e}");
        let e = parse("xds: {tls: {cert: a, key: b, clientCa: c}}\n").unwrap_err();
        assert!(
            format!("{e:#}").contains("unknown field `clientCa`"),
            "{e:#}"
        );
    }

    #[test]
    fn a_kubernetes_hub_with_leader_election_and_a_watch_bound() {
        let file = parse(
            "hub: {kubeconfig: hub.kubeconfig, context: fleet, namespace: ops}
leaderElection: {leaseName: m, leaseDurationSeconds: 8, renewDeadlineSeconds: 5, retryPeriodSeconds: 1, identity: a}
kubernetes: {watchTimeoutSeconds: 12}
",
        )
        .unwrap();
        let cfg = resolve(file, Path::new("/etc/m"), &args(&[])).unwrap();
        assert_eq!(
            cfg.hub,
            HubSource::Kubernetes {
                kubeconfig: Some(PathBuf::from("/etc/m/hub.kubeconfig")),
                context: Some("fleet".into()),
                namespace: "ops".into(),
            }
        );
        assert_eq!(cfg.leader.lease_name, "m");
        assert_eq!(cfg.leader.renew_deadline, Duration::from_secs(5));
        assert_eq!(cfg.leader.identity, "a");
        assert_eq!(cfg.watch_timeout_seconds, 12);
        let defaults = resolve(
            parse(
                "hub: {inCluster: true}
",
            )
            .unwrap(),
            Path::new("/"),
            &args(&[]),
        )
        .unwrap();
        assert_eq!(defaults.watch_timeout_seconds, 30);
        assert_eq!(defaults.leader.lease_duration, Duration::from_secs(15));

        let bad = |yaml: &str| {
            resolve(parse(yaml).unwrap(), Path::new("/"), &args(&[]))
                .unwrap_err()
                .to_string()
        };
        assert!(
            bad("hub: {kubeconfig: k}\nleaderElection: {leaseDurationSeconds: 5, renewDeadlineSeconds: 5}\n")
                .contains("below leaseDurationSeconds")
        );
        assert!(
            bad("hub: {kubeconfig: k}\nkubernetes: {watchTimeoutSeconds: 0}\n")
                .contains("positive")
        );
        assert!(bad("hub: {kubeconfig: k, directory: d}\n").contains("exactly one"));
    }

    #[test]
    fn listener_settings_have_defaults_flags_and_bounds() {
        let resolved = |yaml: &str, flags: &[&str]| {
            resolve(parse(yaml).unwrap(), Path::new("/"), &args(flags))
        };
        let cfg = resolved("hub: {directory: h}\n", &[]).unwrap();
        assert_eq!(
            cfg.listeners.requested,
            meridian_listen::Requested::default()
        );
        assert_eq!(
            cfg.listeners.admin.handshake_timeout,
            Duration::from_secs(10)
        );
        assert_eq!(cfg.listeners.admin.idle_timeout, Duration::from_secs(60));
        assert_eq!(cfg.listeners.xds.idle_timeout, Duration::from_secs(300));
        assert_eq!(cfg.xds.max_concurrent_streams, 100);
        assert_eq!(cfg.dns.udp_workers, 1);
        let cfg = resolved(
            "hub: {directory: h}\nadmin: {maxConnections: 7, headerReadTimeoutSeconds: 2}\nxds: {maxConnections: 9, maxConcurrentStreams: 5, idleTimeoutSeconds: 30}\ndns: {udpWorkers: 4, tcpMaxConnections: 11}\nreservedDescriptors: 64\n",
            &["--xds-max-connections", "10", "--admin-max-connections", "8"],
        )
        .unwrap();
        let r = cfg.listeners.requested;
        assert_eq!(
            (r.admin, r.xds, r.dns_tcp, r.reserve),
            (Some(8), Some(10), Some(11), Some(64))
        );
        let flag = resolved(
            "hub: {directory: h}\ndns: {tcpMaxConnections: 11}\n",
            &["--dns-tcp-max-connections", "12"],
        )
        .unwrap();
        assert_eq!(flag.listeners.requested.dns_tcp, Some(12), "the flag wins");
        assert_eq!(
            cfg.listeners.admin.handshake_timeout,
            Duration::from_secs(2)
        );
        assert_eq!(cfg.listeners.xds.idle_timeout, Duration::from_secs(30));
        assert_eq!(cfg.xds.max_concurrent_streams, 5);
        assert_eq!(cfg.dns.udp_workers, 4);
        for (yaml, says) in [
            (
                "dns: {udpWorkers: 100000}",
                "dns.udpWorkers must be between 1 and 1024 (got 100000)",
            ),
            (
                "dns: {udpWorkers: 0}",
                "dns.udpWorkers must be between 1 and 1024 (got 0)",
            ),
            (
                "dns: {tcpIdleTimeoutSeconds: 0}",
                "dns.tcpIdleTimeoutSeconds must be between 1 and 3600",
            ),
            (
                "xds: {maxConcurrentStreams: 0}",
                "xds.maxConcurrentStreams must be between 1 and 10000",
            ),
            (
                "dns: {tcpMaxConnections: 0}",
                "dns.tcpMaxConnections must be between 1 and 1000000 (got 0)",
            ),
            (
                "dns: {tcpMaxConnections: 2000000}",
                "dns.tcpMaxConnections must be between 1 and 1000000",
            ),
            (
                "xds: {maxConnections: 0}",
                "xds.maxConnections must be between 1 and 1000000",
            ),
            (
                "admin: {headerReadTimeoutSeconds: 7200}",
                "admin.headerReadTimeoutSeconds must be between 1 and 3600",
            ),
            (
                "reservedDescriptors: 1",
                "reservedDescriptors must be between 16",
            ),
        ] {
            let e = resolved(&format!("hub: {{directory: h}}\n{yaml}\n"), &[]).unwrap_err();
            assert!(e.to_string().contains(says), "{yaml}: {e}");
        }
    }

    #[test]
    fn the_sync_deadline_defaults_to_30_seconds_and_is_bounded() {
        let resolved = |yaml: &str, flags: &[&str]| {
            resolve(parse(yaml).unwrap(), Path::new("/"), &args(flags))
        };
        let cfg = resolved("hub: {directory: h}\n", &[]).unwrap();
        assert_eq!(cfg.sync_deadline, Duration::from_secs(30));
        let cfg = resolved("hub: {directory: h}\nsyncDeadlineSeconds: 5\n", &[]).unwrap();
        assert_eq!(cfg.sync_deadline, Duration::from_secs(5));
        let cfg = resolved(
            "hub: {directory: h}\nsyncDeadlineSeconds: 5\n",
            &["--sync-deadline-seconds", "9"],
        )
        .unwrap();
        assert_eq!(cfg.sync_deadline, Duration::from_secs(9), "the flag wins");
        for bad in ["0", "3601"] {
            let e = resolved(
                &format!("hub: {{directory: h}}\nsyncDeadlineSeconds: {bad}\n"),
                &[],
            )
            .unwrap_err();
            assert!(e.to_string().contains("between 1 and 3600"), "{e}");
        }
    }

    #[test]
    fn geo_ranges_come_from_the_file_and_the_flags() {
        let file = parse(
            "hub: {directory: hub}\ngeo:\n  ranges:\n    - {cidrs: [203.0.113.0/24, '2001:db8::/32'], region: eu, zone: eu-1a}\n  file: geo.csv\n  reloadSeconds: 3\n",
        )
        .unwrap();
        let cfg = resolve(
            file,
            Path::new("/etc/meridian"),
            &args(&[
                "--geo-range",
                "198.51.100.0/24=us",
                "--geo-range",
                "fd00::/8=ap:ap-1",
            ]),
        )
        .unwrap();
        let geo = &cfg.geo;
        assert_eq!(geo.file, Some(PathBuf::from("/etc/meridian/geo.csv")));
        assert_eq!(geo.reload, Duration::from_secs(3));
        let got: Vec<(usize, Option<&str>, Option<&str>)> = geo
            .ranges
            .iter()
            .map(|r| {
                (
                    r.cidrs.len(),
                    r.locality.region.as_deref(),
                    r.locality.zone.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (2, Some("eu"), Some("eu-1a")),
                (1, Some("us"), None),
                (1, Some("ap"), Some("ap-1"))
            ]
        );
        assert!(
            resolve(
                File::default(),
                Path::new("/x"),
                &args(&["--hub-directory", "h"])
            )
            .unwrap()
            .geo
            .is_empty()
        );
        for (flag, why) in [
            ("203.0.113.0/24", "expected CIDR=REGION"),
            ("nope=eu", "bad CIDR"),
            ("203.0.113.0/24=", "non-empty"),
        ] {
            let e = resolve(
                File::default(),
                Path::new("/x"),
                &args(&["--hub-directory", "h", "--geo-range", flag]),
            )
            .unwrap_err();
            assert!(format!("{e:#}").contains(why), "{flag}: {e:#}");
        }
        assert!(
            parse("geo: {ranges: [{cidrs: [203.0.113.0/24]}]}").is_err(),
            "region is required"
        );
        assert!(parse("geo: {ranges: [{cidrs: [nope], region: eu}]}").is_err());
    }
}
