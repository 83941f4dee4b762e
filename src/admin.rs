//! Admin HTTP: `/healthz`, `/readyz`, `/metrics`, and `/debug/*` — what meridian serves and why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use meridian_controllers::kubernetes::Facts;
use meridian_controllers::kubernetes::leader::Leadership;
use meridian_controllers::kubernetes::propagate::PropagationView;
use meridian_controllers::kubernetes::shard::ShardView;
use meridian_core::Snapshot;
use meridian_core::placement::room::{self, Room};
use meridian_core::registry::NEVER_SYNCED;
use meridian_core::whatif::Base;
use meridian_dns::Dns;
use meridian_dns::explain::explain;
use meridian_xds::{Group, Role, Xds};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::EncodeMetric;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::store::Heartbeats;
use crate::whatif::ScenarioRequest;

pub mod auth;
pub mod ui;

#[derive(Clone)]
pub struct AdminState {
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    /// The published snapshot with what decided it: what a what-if starts from.
    pub whatif: watch::Receiver<Arc<Base>>,
    pub dns: Arc<Dns>,
    pub xds: Arc<Xds>,
    pub fleet: Facts,
    pub leadership: Leadership,
    pub metrics: Arc<Registry>,
    /// Whether each listener is accepting, for `/readyz`.
    pub listeners: meridian_listen::Health,
    /// What each member holds of every placed template (the leader's propagation).
    pub propagation: PropagationView,
    /// When each member last answered a heartbeat (the status page shows how long ago).
    pub heartbeats: Heartbeats,
    /// The sharded writers' view (None: the leader writes every member).
    pub shards: Option<ShardView>,
    /// The federation API gateway (None: not configured).
    pub gateway: Option<meridian_gateway::GatewayView>,
    /// The agent members (pull mode), whether or not their agent is connected.
    pub agents: meridian_controllers::agents::AgentRoutes,
    /// The agent CA and tokens (None: no agent listener), for the joins waiting for approval.
    pub agent_store: Option<meridian_agent::HubStore>,
    /// The status page's streams: their bound and the views they share.
    pub ui: ui::UiStreams,
}

/// A listener failing to accept for this long makes meridian unready: long enough to ride
/// out a burst, short enough that a load balancer stops sending it clients.
const STUCK_AFTER: Duration = Duration::from_secs(3);

/// Serves the admin router on `listener`, one connection at a time per task: HTTP/1 with a
/// header-read timeout (a byte-a-second client is closed), the listener's bound and idle
/// timeout around it. (axum::serve has neither.)
pub async fn serve(
    listener: meridian_listen::Listener,
    router: Router,
    header_read_timeout: Duration,
    metrics: meridian_listen::ListenerMetrics,
) {
    loop {
        let conn = listener.accept().await;
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let peer = conn.peer();
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            if let Err(e) = http
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                .await
            {
                if e.is_timeout() {
                    // A request head that did not come in time: a slow or hostile client.
                    metrics
                        .timeouts
                        .get_or_create(&meridian_listen::metrics::KindLabels {
                            listener: "admin",
                            kind: "header_read",
                        })
                        .inc();
                }
                tracing::debug!(%peer, error = %e, "admin connection ended");
            }
        });
    }
}

/// `meridian agent`'s admin server: `/healthz`, `/metrics` (`meridian_agent_*`) and `/debug`
/// (the hub, the stream, the certificate's expiry, the last error).
pub fn agent_router(registry: Arc<Registry>, side: meridian_agent::metrics::AgentSide) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { metrics_text(&registry) }
            }),
        )
        .route(
            "/debug",
            get(move || {
                let view = side.view.lock().clone();
                async move { Json(json!({ "agent": view })) }
            }),
        )
}

impl AdminState {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshots.borrow().clone()
    }

    fn whatif_base(&self) -> Arc<Base> {
        self.whatif.borrow().clone()
    }
}

/// The admin routes. With a token, everything but the probes and the scrape needs it.
pub fn router(state: AdminState, token: Option<auth::AdminToken>) -> Router {
    let open = Router::new()
        // Someone who opens the admin address in a browser wants the status page.
        .route("/", get(|| async { Redirect::temporary("/ui") }))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));
    let mut guarded = Router::new()
        .route("/debug", get(debug_index))
        .route("/debug/clusters", get(debug_clusters))
        .route("/debug/kubernetes", get(debug_kubernetes))
        .route("/debug/services", get(debug_services))
        .route("/debug/problems", get(debug_problems))
        .route("/debug/resolve", get(debug_resolve))
        .route(
            "/debug/explain",
            get(debug_explain).post(debug_explain_post),
        )
        .route(
            "/debug/simulate",
            get(debug_simulate).post(debug_simulate_post),
        )
        .route("/debug/rollout", get(debug_rollout))
        .route("/debug/rollouts", get(debug_rollouts))
        .route(
            "/debug/rollouts/:command",
            axum::routing::post(debug_rollouts_command),
        )
        .route("/debug/diagnose", get(debug_diagnose))
        .route("/debug/placements", get(debug_placements))
        .route("/debug/shards", get(debug_shards))
        .route("/debug/agents", get(debug_agents))
        .route("/debug/gateway", get(debug_gateway))
        .route("/debug/xds", get(debug_xds))
        .route("/debug/xds/dump", get(debug_xds_dump))
        .merge(ui::routes());
    if let Some(token) = token {
        guarded = guarded.route_layer(axum::middleware::from_fn_with_state(token, auth::require));
    }
    open.merge(guarded).with_state(state)
}

async fn readyz(State(s): State<AdminState>) -> Response {
    let stuck = s.listeners.stuck(Instant::now(), STUCK_AFTER);
    if !stuck.is_empty() {
        let lines: String = stuck.iter().map(|l| format!("{l}\n")).collect();
        return (StatusCode::SERVICE_UNAVAILABLE, lines).into_response();
    }
    let snap = s.snapshot();
    if snap.synced {
        // Ready to serve what the others hold; a member that never synced is named so the
        // probe's body says what is missing (it never makes the whole server unready).
        let mut body = String::from("ready\n");
        for p in snap
            .problems
            .iter()
            .filter(|p| p.reason.starts_with(NEVER_SYNCED))
        {
            body.push_str(&format!("not synced: {}: {}\n", p.origin, p.reason));
        }
        (StatusCode::OK, body).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for every member to sync or fail once\n",
        )
            .into_response()
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    metrics_text(&s.metrics)
}

/// A registry in the OpenMetrics text format.
fn metrics_text(registry: &Registry) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn debug_index() -> Json<Value> {
    Json(json!({
        "endpoints": {
            "/ui": "the status page: members, where each service's traffic goes from a chosen cluster, placements, problems (live)",
            "/debug/clusters": "member clusters, health, withdrawal, locality, network",
            "/debug/kubernetes": "this replica's leadership, and per Kubernetes member: connected, listed, API version, last heartbeat, capacity, namespaces, ServiceExports",
            "/debug/services": "exported services merged across clusters, with conflicts",
            "/debug/problems": "input meridian rejected (problems) or served with a caveat (warnings), with file, object and reason",
            "/debug/resolve?name=N&type=T&cluster=C": "what a client in cluster C (or, with from=ADDR, at that address: a cluster's or a geo range's) is answered for N, and why",
            "/debug/explain?service=S&cluster=C": "the scheduling decision for service S (name.namespace) from cluster C: filtered clusters and why, tiers, weights, spill-over, the DNS answer and the EDS priorities, in words and JSON",
            "/debug/explain?kind=K&name=N&namespace=NS&cluster=C": "the placement decision for template K NS/N: policy, tier, per cluster the replicas and why, the clusters left out and why, the overrides applied; and the traffic decision of the Services the same policy governs",
            "/debug/diagnose?cluster=C": "meridian diagnose's checks of each member (or C): its API, meridian's permissions there (SelfSubjectAccessReview), its CoreDNS's forwarding, its gateway, its xDS clients; each pass, fail or info, with the fix",
            "/debug/rollout?policy=NS/NAME": "the plan of a policy's staged rollout (placement.rollout): the stages in order, what each drains, each client region's traffic shares at every step, and the clients a step would leave without a cluster",
            "/debug/rollouts": "the staged rollouts under way (the leader's): per template its stages, the stage and phase, what is drained, why it is paused or waits; POST /debug/rollouts/{approve,pause,resume,abort}?policy=NS/NAME commands them",
            "/debug/placements": "every placement decision, and what each member holds of it (propagation)",
            "/debug/gateway": "the federation API gateway: its address, issuer and keys, open watches, and the last refused or failed requests",
            "/debug/shards": "sharded writers: live replicas, which members this replica writes, each member's claim and owner, and every replica's view of unreachable members (quorum health)",
            "/debug/agents": "pull-mode agent members: connected or since when not, the agent's address, its certificate's expiry, its last heartbeat, the last set of desired objects it applied (and why not); joins waiting for `meridian approve`",
            "/debug/xds": "connected xDS clients: node, subscriptions, versions sent, ACKed and NACKed (with the last error)",
            "/debug/xds/dump?cluster=C&network=N&role=R": "what a node (envoy, proxyless, eastwest-gateway) in cluster C receives over ADS",
        }
    }))
}

pub fn clusters_json(snap: &Snapshot) -> Value {
    let rooms = rooms_by_cluster(snap);
    let ready = ready_endpoints_by_cluster(snap);
    let clusters: Vec<Value> = snap
        .clusters
        .iter()
        .zip(ready)
        .map(|(c, ready)| {
            let mut card = with_capacity(cluster_json(c), rooms.get(&c.spec.id));
            card["readyEndpoints"] = json!(ready);
            card
        })
        .collect();
    json!({
        "version": snap.version,
        "synced": snap.synced,
        "clusters": clusters,
    })
}

/// The ready endpoints each member (by index) holds, over every service.
fn ready_endpoints_by_cluster(snap: &Snapshot) -> Vec<u64> {
    let mut ready = vec![0; snap.clusters.len()];
    for backend in snap.services().flat_map(|v| &v.backends) {
        if let Some(count) = ready.get_mut(backend.cluster) {
            *count += u64::from(backend.ready);
        }
    }
    ready
}

/// Each member's capacity as placement counts it (allocatable, used, assumed).
pub fn rooms_by_cluster(
    snap: &Snapshot,
) -> std::collections::BTreeMap<meridian_core::ClusterId, Room> {
    room::rooms(
        &snap.capacities,
        &snap.templates,
        &snap.placements.decisions,
        None,
    )
    .into_iter()
    .map(|r| (r.cluster.clone(), r))
    .collect()
}

/// A member's JSON with its capacity (null when it reports none).
pub fn with_capacity(mut card: Value, room: Option<&Room>) -> Value {
    card["capacity"] = json!(room);
    card
}

/// One member as `/debug/clusters` and the status page show it.
pub fn cluster_json(c: &meridian_core::ClusterView) -> Value {
    json!({
        "name": c.spec.id,
        "health": c.health,
        "withdrawn": c.withdrawn,
        "reason": c.reason,
        "region": c.spec.locality.region,
        "zone": c.spec.locality.zone,
        "network": c.spec.network,
        "gateway": c.spec.gateway,
        "dnsClientCIDRs": c.spec.dns_client_cidrs,
        "taints": c.spec.taints,
        "endpoints": c.endpoints,
    })
}

async fn debug_kubernetes(State(s): State<AdminState>) -> Json<Value> {
    let members: serde_json::Map<String, Value> = s
        .fleet
        .all()
        .into_iter()
        .map(|(id, f)| {
            let heartbeat = f.last_heartbeat.and_then(|t| t.elapsed().ok());
            (
                id.to_string(),
                json!({
                    "connected": f.client.is_some(),
                    "listed": f.listed,
                    "kubernetesVersion": f.kubernetes_version,
                    "secondsSinceHeartbeat": heartbeat.map(|d| d.as_secs_f64()),
                    "capacity": f.capacity,
                    "allocatable": f.allocatable,
                    "namespaces": f.namespaces,
                    "serviceExports": f.exports.iter().map(ToString::to_string).collect::<Vec<_>>(),
                }),
            )
        })
        .collect();
    Json(json!({
        "identity": s.leadership.identity(),
        "leader": s.leadership.is_leader(),
        "members": members,
    }))
}

async fn debug_shards(State(s): State<AdminState>) -> Json<Value> {
    match &s.shards {
        Some(view) => Json(json!({ "sharded": true, "shards": view.get() })),
        None => Json(json!({
            "sharded": false,
            "identity": s.leadership.identity(),
            "leader": s.leadership.is_leader(),
            "note": "not sharded: the leader writes every member (leaderElection.shards, --shards)",
        })),
    }
}

async fn debug_agents(State(s): State<AdminState>) -> Json<Value> {
    let agents: serde_json::Map<String, Value> = s
        .agents
        .members()
        .into_iter()
        .map(|id| {
            let facts = s.fleet.get(&id, |f| f.agent.clone());
            let agent = match facts {
                None => json!({ "connected": false, "note": "no agent has connected" }),
                Some(a) => json!({
                    "connected": a.connected,
                    "since": meridian_agent::join::unix(a.since),
                    "peer": a.peer,
                    "certificateExpires": a.certificate_expires.map(meridian_agent::join::unix),
                    "lastHeartbeat": a.last_heartbeat.map(meridian_agent::join::unix),
                    "secondsSinceHeartbeat": a.last_heartbeat.and_then(|t| t.elapsed().ok()).map(|d| d.as_secs_f64()),
                }),
            };
            (id.to_string(), agent)
        })
        .collect();
    Json(json!({ "agents": agents, "waitingForApproval": waiting_for_approval(&s).await }))
}

/// Joins waiting for `meridian approve` (agent.autoApprove: false), oldest first; the store
/// unreadable is said, not hidden.
async fn waiting_for_approval(s: &AdminState) -> Value {
    use meridian_agent::store::TokenStore;
    let Some(store) = &s.agent_store else {
        return json!([]);
    };
    let now = std::time::SystemTime::now();
    match store.tokens().await {
        Ok(tokens) => tokens
            .pending(now)
            .into_iter()
            .map(|t| {
                let request = t.request.as_ref();
                json!({
                    "cluster": t.cluster.to_string(),
                    "token": t.id,
                    "key": request.map(|r| format!("sha256:{}", r.key)),
                    "since": request.map(|r| meridian_agent::join::unix(r.at)),
                })
            })
            .collect(),
        Err(e) => json!({ "error": meridian_controllers::reason_of(&e) }),
    }
}

async fn debug_gateway(State(s): State<AdminState>) -> Json<Value> {
    match &s.gateway {
        Some(view) => Json(json!({ "enabled": true, "gateway": view.to_json() })),
        None => Json(json!({
            "enabled": false,
            "note": "no gateway: set gateway.listen (--gateway-listen) with gateway.tls and gateway.oidc",
        })),
    }
}

async fn debug_clusters(State(s): State<AdminState>) -> Json<Value> {
    Json(clusters_json(&s.snapshot()))
}

async fn debug_services(State(s): State<AdminState>) -> Json<Value> {
    let snap = s.snapshot();
    let name = |i: usize| {
        snap.clusters
            .get(i)
            .map(|c| c.spec.id.to_string())
            .unwrap_or_default()
    };
    let services: Vec<Value> = snap
        .services()
        .map(|v| {
            json!({
                "service": v.key.to_string(),
                "headless": v.headless,
                "ports": v.ports,
                "clusters": v.backends.iter().map(|b| json!({
                    "cluster": name(b.cluster),
                    "ready": b.ready,
                    "publishNotReadyAddresses": b.publish_not_ready,
                    "ports": b.ports,
                    "endpoints": b.endpoints().collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "imports": v.imports.iter().map(|(c, ips)| json!({"cluster": name(*c), "ips": ips})).collect::<Vec<_>>(),
                "conflicts": v.conflicts,
            })
        })
        .collect();
    Json(json!({ "version": snap.version, "services": services }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiagnoseQuery {
    cluster: Option<String>,
}

/// `meridian diagnose`'s checks of each member (or of `cluster`), as meridian reaches it.
async fn debug_diagnose(State(s): State<AdminState>, Query(q): Query<DiagnoseQuery>) -> Response {
    let only = q.cluster.as_deref().filter(|c| !c.is_empty());
    match crate::diagnose::server_checks(&s, only).await {
        Ok(report) => Json(report).into_response(),
        Err(e) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("{e:#}") })),
        )
            .into_response(),
    }
}

async fn debug_problems(State(s): State<AdminState>) -> Json<Value> {
    let snap = s.snapshot();
    Json(json!({ "problems": snap.problems, "warnings": snap.warnings }))
}

#[derive(Deserialize)]
struct ResolveQuery {
    name: String,
    #[serde(rename = "type", default = "default_type")]
    qtype: String,
    cluster: Option<String>,
    /// A client address instead of a cluster: placed as DNS places it (a cluster, a geo range).
    from: Option<std::net::IpAddr>,
}

fn default_type() -> String {
    "A".into()
}

async fn debug_resolve(State(s): State<AdminState>, Query(q): Query<ResolveQuery>) -> Response {
    let snap = s.snapshot();
    let explained = match q.from {
        Some(from) => meridian_dns::explain::explain_from_address(
            s.dns.answerer(),
            &snap,
            &q.name,
            &q.qtype,
            from,
        ),
        None => explain(
            s.dns.answerer(),
            &snap,
            &q.name,
            &q.qtype,
            q.cluster.as_deref().filter(|c| !c.is_empty()),
        ),
    };
    match explained {
        Ok(e) => Json(e).into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainQuery {
    /// A service (traffic only) …
    service: Option<String>,
    /// … or a template: its kind, namespace and name (placement, and the traffic of the
    /// Services the same policy governs).
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    cluster: Option<String>,
    /// What-if, as in `/debug/simulate`'s query: comma-separated assumptions and members.
    assume: Option<String>,
    remove: Option<String>,
    after: Option<u64>,
}

/// `/debug/explain` as a JSON body: the query's fields, and a whole scenario (policy files
/// only fit here).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainRequest {
    service: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    cluster: Option<String>,
    #[serde(default)]
    scenario: ScenarioRequest,
}

async fn debug_explain(State(s): State<AdminState>, Query(q): Query<ExplainQuery>) -> Response {
    let scenario = scenario_of_query(q.assume.as_deref(), q.remove.as_deref(), q.after);
    let request = ExplainRequest {
        service: q.service,
        kind: q.kind,
        namespace: q.namespace,
        name: q.name,
        cluster: q.cluster,
        scenario,
    };
    explain_response(s, request).await
}

async fn debug_explain_post(
    State(s): State<AdminState>,
    Json(request): Json<ExplainRequest>,
) -> Response {
    explain_response(s, request).await
}

async fn explain_response(s: AdminState, q: ExplainRequest) -> Response {
    let snap = s.snapshot();
    let base = s.whatif_base();
    let propagation = s.propagation.get();
    // A what-if decides the whole fleet again: off the runtime.
    let explained = tokio::task::spawn_blocking(move || {
        let imagined = if q.scenario.is_empty() {
            None
        } else {
            Some(
                crate::whatif::imagine(&base, &q.scenario)
                    .map_err(|e| anyhow::anyhow!(e.join("; ")))?,
            )
        };
        let seen = match &imagined {
            Some((fleet, _)) => crate::explain::Seen {
                snap: &fleet.snapshot,
                imagined_at: Some(fleet.at),
            },
            None => crate::explain::Seen::now(&snap),
        };
        let cluster = q.cluster.as_deref().filter(|c| !c.is_empty());
        let mut explained = match (&q.service, &q.kind, &q.name) {
            (Some(service), None, None) => {
                crate::explain::explain(s.dns.answerer(), &s.xds, seen, service, cluster)
            }
            (None, Some(kind), Some(name)) if crate::explain::route_kind(kind).is_some() => {
                crate::explain::explain_route(
                    seen,
                    crate::explain::route_kind(kind).expect("checked by the guard"),
                    q.namespace.as_deref().unwrap_or("default"),
                    name,
                    cluster,
                )
            }
            (None, Some(kind), Some(name)) => crate::explain::explain_template(
                s.dns.answerer(),
                &s.xds,
                seen,
                &propagation,
                (kind, q.namespace.as_deref().unwrap_or("default"), name),
                cluster,
            ),
            _ => Err(anyhow::anyhow!(
                "ask for service=NAME.NAMESPACE, or for kind=KIND&name=NAME&namespace=NS"
            )),
        }?;
        if let Some((_, assuming)) = imagined {
            if let Some(words) = explained["words"].as_array_mut() {
                words.insert(0, Value::String(assuming.clone()));
            }
            explained["assuming"] = Value::String(assuming);
        }
        Ok::<Value, anyhow::Error>(explained)
    })
    .await
    .unwrap_or_else(|e| Err(anyhow::anyhow!("explaining failed: {e}")));
    match explained {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            let error = format!("{e:#}");
            (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response()
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimulateQuery {
    /// Comma-separated assumptions (`eu-1=Unreachable,us-1:taint=maint:NoExecute`).
    assume: Option<String>,
    /// Comma-separated members assumed gone.
    remove: Option<String>,
    /// Seconds after now.
    after: Option<u64>,
}

fn scenario_of_query(
    assume: Option<&str>,
    remove: Option<&str>,
    after: Option<u64>,
) -> ScenarioRequest {
    let list = |s: Option<&str>| -> Vec<String> {
        s.into_iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    ScenarioRequest {
        assume: list(assume),
        remove: list(remove),
        policies: Vec::new(),
        after_seconds: after,
    }
}

/// `/debug/simulate?assume=…`: what would change, before and after. Nothing is written.
async fn debug_simulate(State(s): State<AdminState>, Query(q): Query<SimulateQuery>) -> Response {
    let request = scenario_of_query(q.assume.as_deref(), q.remove.as_deref(), q.after);
    simulate_response(s, request).await
}

async fn debug_simulate_post(
    State(s): State<AdminState>,
    Json(request): Json<ScenarioRequest>,
) -> Response {
    simulate_response(s, request).await
}

/// Simulations running at once: each re-decides the fleet on a blocking thread (a second or
/// so at 10,000 templates), so a client asking in a loop cannot take every core.
static SIMULATIONS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// What a simulation asked for while [`SIMULATIONS`] run gets.
fn simulations_busy() -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        Json(json!({ "error": "two simulations are running; ask again when one is done" })),
    )
        .into_response()
}

async fn simulate_response(s: AdminState, request: ScenarioRequest) -> Response {
    let Ok(_running) = SIMULATIONS.try_acquire() else {
        return simulations_busy();
    };
    let base = s.whatif_base();
    let simulated = tokio::task::spawn_blocking(move || {
        crate::whatif::simulate(s.dns.answerer(), &base, &request)
    })
    .await
    .unwrap_or_else(|e| Err(vec![format!("simulating failed: {e}")]));
    match simulated {
        Ok(v) => Json(v).into_response(),
        Err(errors) => (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": errors.join("; "), "errors": errors })),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct RolloutQuery {
    policy: String,
}

/// The plan of a policy's staged rollout (`simulate --rollout`): its stages, what each
/// drains and the traffic shares meanwhile. Re-decides the fleet, so it shares the
/// simulations' bound.
async fn debug_rollout(State(s): State<AdminState>, Query(q): Query<RolloutQuery>) -> Response {
    let Ok(_running) = SIMULATIONS.try_acquire() else {
        return simulations_busy();
    };
    let base = s.whatif_base();
    let planned = tokio::task::spawn_blocking(move || crate::whatif::rollout(&base, &q.policy))
        .await
        .unwrap_or_else(|e| Err(format!("planning failed: {e}")));
    match planned {
        Ok(v) => Json(v).into_response(),
        Err(error) => (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response(),
    }
}

/// The staged rollouts this replica drives (none unless it leads).
async fn debug_rollouts(State(s): State<AdminState>) -> Json<Value> {
    Json(json!(s.propagation.rollouts()))
}

/// An operator's command for every staged rollout of a policy.
async fn debug_rollouts_command(
    State(s): State<AdminState>,
    axum::extract::Path(command): axum::extract::Path<String>,
    Query(q): Query<RolloutQuery>,
) -> Response {
    use meridian_core::stages::Command;
    let command = match command.as_str() {
        "approve" => Command::Approve,
        "pause" => Command::Pause,
        "resume" => Command::Resume,
        "abort" => Command::Abort,
        other => {
            let error = format!("no rollout command {other:?}: approve, pause, resume or abort");
            return (StatusCode::NOT_FOUND, Json(json!({ "error": error }))).into_response();
        }
    };
    let Some((namespace, name)) = q.policy.split_once('/') else {
        let error = format!("policy {:?}: NAMESPACE/NAME", q.policy);
        return (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response();
    };
    let policy = meridian_core::ObjectKey::new(namespace, name);
    match s.propagation.command(&policy, command) {
        Ok(()) => Json(json!({ "accepted": true, "policy": q.policy })).into_response(),
        Err(error) => (StatusCode::CONFLICT, Json(json!({ "error": error }))).into_response(),
    }
}

/// Every placement decision.
async fn debug_placements(State(s): State<AdminState>) -> Json<Value> {
    Json(crate::explain::placements_json(
        &s.snapshot(),
        &s.propagation.get(),
    ))
}

/// Every connected xDS stream: its node, subscriptions, what it was sent, ACKed and NACKed.
async fn debug_xds(State(s): State<AdminState>) -> Json<Value> {
    let streams = s.xds.stream_statuses();
    Json(json!({ "streams": streams.len(), "clients": streams }))
}

#[derive(Deserialize)]
struct DumpQuery {
    cluster: Option<String>,
    network: Option<String>,
    role: Option<String>,
}

/// What a node of the given cluster, network and role receives, decoded from the wire bytes.
async fn debug_xds_dump(State(s): State<AdminState>, Query(q): Query<DumpQuery>) -> Response {
    let role = match q.role.as_deref().unwrap_or("envoy") {
        "envoy" => Role::Envoy,
        "proxyless" => Role::Proxyless,
        "eastwest-gateway" => Role::EastWestGateway,
        other => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({ "error": format!("unknown role {other:?} (envoy, proxyless, eastwest-gateway)") })),
            )
                .into_response();
        }
    };
    let group = Group {
        cluster: q.cluster.filter(|c| !c.is_empty()),
        network: q.network.filter(|n| !n.is_empty()),
        role,
    };
    let resources = s.xds.resources_for(&s.snapshot(), &group);
    Json(json!({ "node": group, "feed": meridian_xds::describe::describe(&resources) }))
        .into_response()
}

/// Fleet gauges computed from the latest snapshot at scrape time, so the update path carries
/// no metric calls.
#[derive(Debug)]
pub struct FleetCollector {
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    pub leadership: Leadership,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct HealthLabels {
    cluster: String,
    state: &'static str,
}

impl prometheus_client::collector::Collector for FleetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snap = self.snapshots.borrow().clone();
        let sizes = snap.sizes;
        let gauges: [(&str, &str, i64); 10] = [
            (
                "leader",
                "1 while this replica holds the hub's Lease (and writes), else 0",
                i64::from(self.leadership.is_leader()),
            ),
            (
                "index_clusters",
                "Clusters with objects in the index",
                sizes.clusters as i64,
            ),
            (
                "index_services",
                "Services in the index (all clusters)",
                sizes.services as i64,
            ),
            (
                "index_exports",
                "ServiceExports in the index",
                sizes.exports as i64,
            ),
            (
                "index_slices",
                "EndpointSlices in the index",
                sizes.slices as i64,
            ),
            (
                "index_endpoints",
                "Endpoints in the index",
                sizes.endpoints as i64,
            ),
            (
                "index_imports",
                "ServiceImports in the index",
                sizes.imports as i64,
            ),
            (
                "exported_services",
                "Services exported and served",
                snap.service_count() as i64,
            ),
            (
                "snapshot_version",
                "Version of the snapshot being served",
                snap.version as i64,
            ),
            (
                "problems",
                "Input objects rejected (see /debug/problems)",
                snap.problems.len() as i64,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let health = Family::<HealthLabels, Gauge>::default();
        let endpoints = Family::<ClusterLabels, Gauge>::default();
        let withdrawn = Family::<ClusterLabels, Gauge>::default();
        for c in &snap.clusters {
            for state in [
                meridian_core::Health::Healthy,
                meridian_core::Health::Degraded,
                meridian_core::Health::Unreachable,
            ] {
                health
                    .get_or_create(&HealthLabels {
                        cluster: c.spec.id.to_string(),
                        state: state.as_str(),
                    })
                    .set(i64::from(c.health == state));
            }
            let labels = ClusterLabels {
                cluster: c.spec.id.to_string(),
            };
            endpoints.get_or_create(&labels).set(c.endpoints as i64);
            withdrawn.get_or_create(&labels).set(i64::from(c.withdrawn));
        }
        health.encode(encoder.encode_descriptor(
            "cluster_health",
            "1 for the member's current health state",
            None,
            health.metric_type(),
        )?)?;
        endpoints.encode(encoder.encode_descriptor(
            "cluster_endpoints",
            "Endpoints held for the member",
            None,
            endpoints.metric_type(),
        )?)?;
        withdrawn.encode(encoder.encode_descriptor(
            "cluster_withdrawn",
            "1 while the member's endpoints are withdrawn",
            None,
            withdrawn.metric_type(),
        )?)?;
        encode_routes(&snap.routes, &mut encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct RouteParentLabels {
    kind: &'static str,
    accepted: &'static str,
    resolved_refs: &'static str,
}

/// The routes as the fleet resolved them: (route, parent) pairs by their two conditions, and
/// the matches served.
fn encode_routes(
    routes: &meridian_core::route::RouteTable,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let word = |b: bool| if b { "true" } else { "false" };
    let parents = Family::<RouteParentLabels, Gauge>::default();
    for ((kind, _), status) in &routes.statuses {
        for p in &status.parents {
            parents
                .get_or_create(&RouteParentLabels {
                    kind: kind.name(),
                    accepted: word(p.accepted.status),
                    resolved_refs: word(p.resolved_refs.status),
                })
                .inc();
        }
    }
    parents.encode(encoder.encode_descriptor(
        "route_parents",
        "HTTPRoute and GRPCRoute parents (Services) by their Accepted and ResolvedRefs conditions",
        None,
        parents.metric_type(),
    )?)?;
    let matches: usize = routes
        .parents()
        .map(|(_, _, attached)| attached.len())
        .sum();
    let gauge = ConstGauge::new(matches as i64);
    gauge.encode(encoder.encode_descriptor(
        "route_matches",
        "Route matches served to clients (as RDS), over every parent Service port",
        None,
        gauge.metric_type(),
    )?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_third_simulation_at_once_is_told_to_wait() {
        let first = SIMULATIONS.try_acquire().expect("a place");
        let second = SIMULATIONS.try_acquire().expect("a second place");
        assert!(SIMULATIONS.try_acquire().is_err(), "no third");
        assert_eq!(simulations_busy().status(), StatusCode::TOO_MANY_REQUESTS);
        drop(first);
        assert!(
            SIMULATIONS.try_acquire().is_ok(),
            "a place again once one is done"
        );
        drop(second);
    }
}
