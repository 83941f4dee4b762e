//! Wiring: sources → store → snapshot watch → DNS listeners, the xDS server, the Kubernetes
//! writers (write-back, and status on a Kubernetes hub) and the admin server.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use meridian_agent::{HubSettings, HubStore, PreparedHub};
use meridian_controllers::directory;
use meridian_controllers::geo::{GeoMetrics, GeoSource};
use meridian_controllers::kubernetes;
use meridian_controllers::kubernetes::connect::{self, WatchTimeout};
use meridian_controllers::kubernetes::leader::Leadership;
use meridian_controllers::kubernetes::shard::ShardView;
use meridian_controllers::members::Sources;
use meridian_core::fleet::Fleet;
use meridian_core::{ClusterId, Snapshot};
use meridian_dns::{Dns, Listeners};
use meridian_listen::{
    Bounds, DescriptorLimit, Health, Listener, ListenerMetrics, ListenerSettings,
};
use meridian_xds::Xds;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::info;

use crate::admin::{self, AdminState, FleetCollector};
use crate::config::{Config, Guard, HubSource};
use crate::programs::Runners;
use crate::store::{Heartbeats, Store};

/// A running meridian.
pub struct App {
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    pub dns: Arc<Dns>,
    pub dns_listeners: Listeners,
    pub admin_addr: SocketAddr,
    pub xds: Arc<Xds>,
    pub xds_addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

/// A TCP DNS connection quiet this long (no query, no answer being written) may be closed
/// for a new client when the listener is full: RFC 7766 §6.2.3 lets a server close idle
/// connections under pressure, and answered connections held open by one source locked every
/// other TCP client out.
const QUIET_EVICTABLE: Duration = Duration::from_secs(1);

impl App {
    pub async fn start(cfg: Config) -> Result<Self> {
        let bounds = descriptor_bounds(&cfg)?;
        // Every socket first: a port in use stops meridian before any source starts, with
        // every listener that could not bind named at once.
        let sockets = bind_listeners(&cfg).await?;
        let mut metrics = Registry::with_prefix("meridian");
        let listener_metrics = ListenerMetrics::new(metrics.sub_registry_with_prefix("listener"));
        let admin_token = admin_token(&cfg, &mut metrics)?;
        let health = Health::default();
        // `fair`: quiet connections are evicted for new ones, and one source holds at most a
        // quarter of the bound (DNS over TCP, whose clients reconnect as a matter of course).
        let guarded =
            |name, tcp, max_connections: usize, guard: Guard, handshake_bytes, fair: bool| {
                Listener::new(
                    name,
                    tcp,
                    ListenerSettings {
                        max_connections,
                        handshake_timeout: guard.handshake_timeout,
                        handshake_bytes,
                        idle_timeout: guard.idle_timeout,
                        quiet_eviction: fair.then_some(QUIET_EVICTABLE),
                        max_per_source: fair.then_some((max_connections / 4).max(1)),
                    },
                    &health,
                    &listener_metrics,
                )
            };
        let (publish, snapshots) = watch::channel(Arc::new(Snapshot::empty()));
        let (publish_whatif, whatif) = watch::channel(Arc::new(meridian_core::whatif::Base {
            snapshot: snapshots.borrow().clone(),
            decider: Default::default(),
        }));
        let (events_tx, events_rx) = mpsc::channel(1024);
        let mut fleet = Fleet::new(Instant::now(), cfg.sync_deadline);
        let (runners, webhook_calls) = Runners::serving(
            events_tx.clone(),
            metrics.sub_registry_with_prefix("placement"),
        );
        fleet.set_programs(Arc::new(runners));
        if cfg.leader.shards {
            fleet.require_confirmation();
        }
        let heartbeats = Heartbeats::default();
        let store = Store::new(
            fleet,
            publish,
            publish_whatif,
            heartbeats.clone(),
            &mut metrics,
        );
        let unreachable_here = store.unreachable_here();
        let mut tasks = vec![
            tokio::spawn(store.run(events_rx)),
            tokio::spawn(webhook_calls),
        ];
        let sources = Sources {
            watch_timeout: WatchTimeout(cfg.watch_timeout_seconds),
            limits: cfg.directory.clone(),
            ..Sources::new(events_tx)
        };
        // Geo ranges first, so they are in the fleet before the hub makes it synced.
        start_geo(&cfg, &sources, &mut metrics, &mut tasks).await?;
        let StartedHub {
            sources,
            leadership,
            writer: hub_writer,
            shards,
        } = start_hub(
            &cfg,
            sources,
            &snapshots,
            unreachable_here,
            &mut metrics,
            &mut tasks,
        )
        .await?;
        // Kubernetes members get what is placed in them; a Kubernetes hub the Placements.
        let writers = kubernetes::start_writers(
            &snapshots,
            &sources.fleet,
            &leadership,
            sources.hub.clone().zip(hub_writer),
            cfg.resync,
            &mut metrics,
        );
        tasks.extend(writers.tasks);
        let propagation = writers.propagation;
        let gateway = prepare_gateway(&cfg, &sources, &snapshots, &mut metrics).await?;
        let mut agent_store = None;
        if let Some(agents) = prepare_agents(&cfg, &sources, &mut metrics).await? {
            agent_store = Some(agents.store());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = agents.serve().await {
                    tracing::error!(error = %meridian_controllers::reason_of(&e), "the agent listener stopped");
                }
            }));
        }
        // Directory members with a renderPath keep their placed objects rendered there.
        tasks.push(tokio::spawn(meridian_controllers::render::run(
            snapshots.clone(),
        )));
        // The SOA serial keeps growing across restarts: start time plus snapshot version.
        let serial_base = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as u32);
        let dns = Dns::new(
            cfg.dns.clone(),
            serial_base,
            snapshots.clone(),
            metrics.sub_registry_with_prefix("dns"),
        );
        // 14 bytes: a length prefix and a DNS header, less than any query; until then a
        // connection is a probe the full listener may evict. The first query must come
        // within the idle timeout too.
        let dns_tcp_idle = cfg.dns.tcp_idle_timeout;
        let dns_guard = Guard {
            handshake_timeout: dns_tcp_idle,
            idle_timeout: dns_tcp_idle,
        };
        let dns_listeners = meridian_dns::serve(dns.clone(), sockets.dns, |tcp| {
            guarded("dns_tcp", tcp, bounds.dns_tcp, dns_guard, 14, true)
        })
        .await
        .with_context(|| format!("cannot serve DNS on {}", cfg.dns_listen))?;
        let xds_tcp = sockets.xds;
        // 24 bytes: the HTTP/2 preface (or a TLS hello) is what a real client sends first.
        let xds_listener = guarded("xds", xds_tcp, bounds.xds, cfg.listeners.xds, 24, false);
        let (xds, xds_addr, xds_task) =
            start_xds(&cfg, xds_listener, snapshots.clone(), &mut metrics)?;
        tasks.push(xds_task);
        metrics.register_collector(Box::new(FleetCollector {
            snapshots: snapshots.clone(),
            leadership: leadership.clone(),
        }));
        let admin_listener = sockets.admin;
        let admin_addr = admin_listener.local_addr()?;
        // 16 bytes: less than any request line; a slowloris stays evictable until the
        // header-read timeout ends it.
        let admin_listener = guarded(
            "admin",
            admin_listener,
            bounds.admin,
            cfg.listeners.admin,
            16,
            false,
        );
        let metrics = Arc::new(metrics);
        let gateway_view = gateway.map(|g| {
            let view = g.view.clone();
            tasks.push(tokio::spawn(g.serve(metrics.clone())));
            view
        });
        let router = admin::router(
            AdminState {
                snapshots: snapshots.clone(),
                whatif,
                dns: dns.clone(),
                xds: xds.clone(),
                fleet: sources.fleet.clone(),
                leadership: leadership.clone(),
                metrics,
                listeners: health.clone(),
                propagation,
                heartbeats,
                shards,
                gateway: gateway_view,
                agents: sources.agents.clone(),
                agent_store,
                ui: Default::default(),
            },
            admin_token,
        );
        tasks.push(tokio::spawn(admin::serve(
            admin_listener,
            router,
            cfg.listeners.admin.handshake_timeout,
            listener_metrics.clone(),
        )));
        info!(admin = %admin_addr, xds = %xds_addr, hub = %cfg.hub.describe(), "meridian started");
        tasks.push(tokio::spawn(say_when_synced(snapshots.clone(), admin_addr)));
        Ok(Self {
            snapshots,
            dns,
            dns_listeners,
            admin_addr,
            xds,
            xds_addr,
            tasks,
        })
    }

    pub async fn shutdown(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.dns_listeners.shutdown().await;
    }
}

/// The agent listener, when configured: its CA read or made and its port bound (either
/// failing stops the start).
async fn prepare_agents(
    cfg: &Config,
    sources: &Sources,
    metrics: &mut Registry,
) -> Result<Option<PreparedHub>> {
    let Some(agent) = &cfg.agent else {
        return Ok(None);
    };
    let store = hub_agent_store(cfg, sources.hub.clone()).await?;
    let settings = HubSettings {
        listen: agent.listen,
        server_names: agent.server_names.clone(),
        certificate_lifetime: agent.certificate_lifetime,
        admission_per_second: agent.admission_per_second,
        approval: if agent.auto_approve {
            meridian_core::agent::Approval::Automatic
        } else {
            meridian_core::agent::Approval::ByOperator
        },
    };
    let metrics = meridian_agent::AgentMetrics::new(metrics.sub_registry_with_prefix("agent"));
    let prepared = meridian_agent::prepare(&settings, store, sources.agents.clone(), metrics)
        .await
        .context("agent")?;
    Ok(Some(prepared))
}

/// Logs, once, that every member has synced or failed once (what `/readyz` waits for), with
/// what was found and where to look at it.
/// The admin token, when one is configured: read once, at start-up (a new token takes a
/// restart), and the count of requests refused for want of it.
fn admin_token(cfg: &Config, metrics: &mut Registry) -> Result<Option<admin::auth::AdminToken>> {
    let Some(path) = &cfg.admin_token_file else {
        return Ok(None);
    };
    let refused = prometheus_client::metrics::counter::Counter::default();
    metrics.register(
        "admin_unauthorized_requests",
        "Requests to /debug or /ui refused for want of the admin token",
        refused.clone(),
    );
    Ok(Some(admin::auth::AdminToken::read(path, refused)?))
}

async fn say_when_synced(mut snapshots: watch::Receiver<Arc<Snapshot>>, admin: SocketAddr) {
    let Ok(snap) = snapshots.wait_for(|s| s.synced).await else {
        return;
    };
    let admin = match admin.ip().is_unspecified() {
        true => SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, admin.port())),
        false => admin,
    };
    info!(
        "synced: {} member(s), {} service(s); status page at http://{admin}/ui",
        snap.clusters.len(),
        snap.service_count()
    );
}

/// Where the hub keeps the agent CA and bootstrap tokens (for `meridian token create`).
pub async fn agent_store(cfg: &Config) -> Result<HubStore> {
    hub_agent_store(cfg, None).await
}

/// The agent store, on the hub's client when there is one already.
async fn hub_agent_store(cfg: &Config, client: Option<kube::Client>) -> Result<HubStore> {
    match &cfg.hub {
        HubSource::Directory(_) => {
            let dir = cfg.agent_state_dir.clone().context(
                "agent.stateDir (or --agent-state-dir) is required on a directory hub: where the agent CA and bootstrap tokens are kept",
            )?;
            Ok(HubStore::Directory(dir))
        }
        HubSource::Kubernetes {
            kubeconfig,
            context,
            namespace,
        } => {
            let client = match client {
                Some(client) => client,
                None => {
                    match kubeconfig {
                        Some(path) => connect::from_kubeconfig(path, context.as_deref()).await,
                        None => connect::in_cluster(),
                    }
                    .context("the hub")?
                    .client
                }
            };
            Ok(HubStore::Secrets {
                client,
                namespace: namespace.clone(),
            })
        }
    }
}

/// The federation API gateway, when configured: its TLS and keys read (a misconfigured
/// gateway stops the start), its listener bound and its metrics registered; served once
/// meridian's registry is complete (its own series are part of `/clusters/metrics`).
async fn prepare_gateway(
    cfg: &Config,
    sources: &Sources,
    snapshots: &watch::Receiver<Arc<Snapshot>>,
    metrics: &mut Registry,
) -> Result<Option<PreparedGateway>> {
    let Some((listen, config)) = &cfg.gateway else {
        return Ok(None);
    };
    let gateway = meridian_gateway::Gateway::new(config.clone())
        .await
        .context("gateway")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen for the gateway on {listen}"))?;
    Ok(Some(PreparedGateway {
        gateway,
        listener,
        targets: meridian_gateway::Targets {
            fleet: sources.fleet.clone(),
            snapshots: snapshots.clone(),
            hub: sources.hub.clone(),
        },
        metrics: meridian_gateway::GatewayMetrics::new(metrics.sub_registry_with_prefix("gateway")),
        view: meridian_gateway::GatewayView::default(),
    }))
}

struct PreparedGateway {
    gateway: meridian_gateway::Gateway,
    listener: tokio::net::TcpListener,
    targets: meridian_gateway::Targets,
    metrics: meridian_gateway::GatewayMetrics,
    view: meridian_gateway::GatewayView,
}

impl PreparedGateway {
    async fn serve(self, own: Arc<Registry>) {
        self.gateway
            .serve(self.listener, self.targets, self.metrics, self.view, own)
            .await
    }
}

/// Reads the geo ranges once (off the runtime), queues them for the writer, and watches the
/// file, if there is one.
async fn start_geo(
    cfg: &Config,
    sources: &Sources,
    metrics: &mut Registry,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<()> {
    let geo_metrics = GeoMetrics::new(metrics.sub_registry_with_prefix("geo"));
    if cfg.geo.is_empty() {
        return Ok(());
    }
    let settings = cfg.geo.clone();
    let source = tokio::task::spawn_blocking(move || GeoSource::new(settings))
        .await
        .context("reading the geo ranges")?;
    sources
        .tx
        .send(source.event())
        .await
        .context("the writer stopped")?;
    tasks.push(tokio::spawn(source.run(sources.tx.clone(), geo_metrics)));
    Ok(())
}

/// What starting the hub gives the rest of the wiring.
struct StartedHub {
    sources: Sources,
    leadership: Leadership,
    /// What a Kubernetes hub's fenced writer client is made from.
    writer: Option<connect::Writer>,
    /// The sharded writers' view (a Kubernetes hub with `leaderElection.shards`).
    shards: Option<ShardView>,
}

/// Starts the hub source (and, for a Kubernetes hub, leader election, the shards if asked
/// for, and the status writer).
async fn start_hub(
    cfg: &Config,
    sources: Sources,
    snapshots: &watch::Receiver<Arc<Snapshot>>,
    unreachable_here: watch::Receiver<Arc<BTreeSet<ClusterId>>>,
    metrics: &mut Registry,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<StartedHub> {
    match &cfg.hub {
        HubSource::Directory(dir) => {
            if let Some(why) = directory::not_a_directory(dir) {
                bail!("hub directory {} {why}", dir.display());
            }
            tasks.push(tokio::spawn(directory::run_hub(
                dir.clone(),
                sources.clone(),
            )));
            Ok(StartedHub {
                sources,
                leadership: Leadership::always(&cfg.leader.identity),
                writer: None,
                shards: None,
            })
        }
        HubSource::Kubernetes {
            kubeconfig,
            context,
            namespace,
        } => {
            let settings = kubernetes::HubSettings {
                kubeconfig: kubeconfig.clone(),
                context: context.clone(),
                namespace: namespace.clone(),
                lease_name: cfg.leader.lease_name.clone(),
                identity: cfg.leader.identity.clone(),
                lease_duration: cfg.leader.lease_duration,
                renew_deadline: cfg.leader.renew_deadline,
                retry_period: cfg.leader.retry_period,
                shards: cfg.leader.shards,
            };
            let hub =
                kubernetes::start_hub(settings, sources, snapshots, unreachable_here, metrics)
                    .await?;
            tasks.extend(hub.tasks);
            Ok(StartedHub {
                sources: hub.sources,
                leadership: hub.leadership,
                writer: Some(hub.writer),
                shards: hub.shards,
            })
        }
    }
}

/// Raises the soft descriptor limit to the hard one and splits it between the listeners,
/// leaving the reserve for meridian's own connections and files.
fn descriptor_bounds(cfg: &Config) -> Result<Bounds> {
    let limit = DescriptorLimit::raise().context("the file descriptor limit")?;
    let bounds = meridian_listen::limits::bounds(limit.soft, cfg.listeners.requested)
        .context("listener connection bounds")?;
    info!(
        soft_before = limit.soft_before,
        soft = limit.soft,
        hard = limit.hard,
        reserved = bounds.reserve,
        admin_max_connections = bounds.admin,
        xds_max_connections = bounds.xds,
        dns_tcp_max_connections = bounds.dns_tcp,
        "file descriptor limit (more connections: raise the hard `ulimit -n`, or set a listener's maxConnections)"
    );
    Ok(bounds)
}

/// The sockets of every listener, bound.
struct Sockets {
    dns: meridian_dns::Bound,
    xds: tokio::net::TcpListener,
    admin: tokio::net::TcpListener,
}

/// Binds DNS, xDS and admin, each tried whatever the others did, so that one error names
/// every listener that cannot listen.
async fn bind_listeners(cfg: &Config) -> Result<Sockets> {
    if let Some(tls) = &cfg.xds.tls {
        meridian_xds::server::check_tls(tls).context("xds.tls")?;
    }
    let dns = meridian_dns::bind(cfg.dns_listen).await;
    let xds = tokio::net::TcpListener::bind(cfg.xds_listen).await;
    let admin = tokio::net::TcpListener::bind(cfg.admin_listen).await;
    match (dns, xds, admin) {
        (Ok(dns), Ok(xds), Ok(admin)) => Ok(Sockets { dns, xds, admin }),
        (dns, xds, admin) => {
            let failed: Vec<String> = [
                ("DNS (UDP and TCP)", cfg.dns_listen, dns.err()),
                ("xDS", cfg.xds_listen, xds.err()),
                ("admin HTTP", cfg.admin_listen, admin.err()),
            ]
            .into_iter()
            .filter_map(|(what, addr, e)| e.map(|e| format!("{what} on {addr}: {e}")))
            .collect();
            bail!("cannot listen: {}", failed.join("; "))
        }
    }
}

/// Serves ADS and CSDS on the xDS listener.
fn start_xds(
    cfg: &Config,
    listener: Listener,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    metrics: &mut Registry,
) -> Result<(Arc<Xds>, SocketAddr, JoinHandle<()>)> {
    let addr = listener.local_addr()?;
    let xds = Xds::new(
        cfg.xds.clone(),
        snapshots,
        metrics.sub_registry_with_prefix("xds"),
    );
    let server = xds.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = server.serve(listener, std::future::pending()).await {
            tracing::error!(error = %e, "xDS server stopped");
        }
    });
    Ok((xds, addr, task))
}

/// Runs until SIGINT or SIGTERM.
pub async fn serve(cfg: Config) -> Result<()> {
    let app = App::start(cfg).await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    info!("shutting down");
    app.shutdown().await;
    Ok(())
}
