//! The request path: authenticate, route, then forward to one member or the hub, or fan out
//! to every member and merge (lists and named GETs here, watches in `watch`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use kube::Client;
use meridian_controllers::kubernetes::Fleet;
use meridian_core::registry::Health;
use meridian_core::tenant::Reach;
use meridian_core::{ClusterId, Snapshot};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::Instrument;

use crate::headers;
use crate::jwks::KeyRing;
use crate::merge::{self, Composite, Continue, MemberList};
use crate::metrics::{ClusterLabels, GatewayMetrics, RequestLabels, RouteLabels};
use crate::path::{self, ApiPath, Route, query_param, with_params};
use crate::tenant;
use crate::token::{self, Identity};
use crate::trace;
use crate::{GatewayConfig, watch as fleet_watch};

/// Where requests go: the members (their clients, from the controllers' Fleet; their health,
/// from the snapshot) and the hub.
#[derive(Clone)]
pub struct Targets {
    pub fleet: Fleet,
    pub snapshots: watch::Receiver<Arc<Snapshot>>,
    pub hub: Option<Client>,
}

/// A member as the gateway can use it now.
pub(crate) enum Member {
    Ready(Client),
    /// Registered but not to be asked: why.
    Down(String),
}

impl Targets {
    /// `name`'s client; None: no such member.
    pub(crate) fn member(&self, name: &str) -> Option<Member> {
        let snapshot = self.snapshots.borrow().clone();
        let view = snapshot.cluster_view(&ClusterId::new(name))?;
        Some(self.usable(name, view.health, view.reason.as_deref()))
    }

    /// Every registered member, in name order.
    pub(crate) fn members(&self) -> Vec<(String, Member)> {
        let snapshot = self.snapshots.borrow().clone();
        let mut out: Vec<(String, Member)> = snapshot
            .clusters
            .iter()
            .map(|v| {
                let name = v.spec.id.as_str().to_string();
                let member = self.usable(&name, v.health, v.reason.as_deref());
                (name, member)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn usable(&self, name: &str, health: Health, reason: Option<&str>) -> Member {
        if health == Health::Unreachable {
            return Member::Down(format!(
                "cluster {name} is Unreachable{}",
                reason.map(|r| format!(": {r}")).unwrap_or_default()
            ));
        }
        match self.fleet.get(&ClusterId::new(name), |f| f.client.clone()) {
            Some(client) => Member::Ready(client),
            None => Member::Down(format!(
                "cluster {name} has no Kubernetes API meridian reaches (a directory member, or not connected yet)"
            )),
        }
    }
}

/// What `/debug/gateway` shows.
#[derive(Clone, Default)]
pub struct GatewayView(Arc<Mutex<ViewState>>);

#[derive(Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct ViewState {
    listen: Option<String>,
    issuer: String,
    keys: usize,
    open_watches: i64,
    /// The last problems (newest last): refused tokens, members left out, failed forwards.
    recent_problems: VecDeque<Problem>,
}

#[derive(Serialize)]
struct Problem {
    at: String,
    route: &'static str,
    cluster: String,
    code: u16,
    message: String,
}

const PROBLEMS_KEPT: usize = 50;

impl GatewayView {
    pub(crate) fn started(&self, listen: String, issuer: &str, keys: usize) {
        let mut s = self.0.lock();
        s.listen = Some(listen);
        s.issuer = issuer.to_string();
        s.keys = keys;
    }

    pub(crate) fn problem(&self, route: &'static str, cluster: &str, code: u16, message: &str) {
        let mut s = self.0.lock();
        if s.recent_problems.len() == PROBLEMS_KEPT {
            s.recent_problems.pop_front();
        }
        let at = epoch_seconds(SystemTime::now());
        s.recent_problems.push_back(Problem {
            at,
            route,
            cluster: cluster.to_string(),
            code,
            message: message.chars().take(300).collect(),
        });
    }

    pub(crate) fn watches(&self, delta: i64) {
        self.0.lock().open_watches += delta;
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(&*self.0.lock()).unwrap_or(Value::Null)
    }
}

fn epoch_seconds(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    format!("{secs:.3}")
}

/// Everything a request needs.
pub(crate) struct Shared {
    pub config: GatewayConfig,
    pub keys: Arc<KeyRing>,
    pub targets: Targets,
    pub metrics: GatewayMetrics,
    pub view: GatewayView,
    /// meridian's own metrics, added to `/clusters/metrics`.
    pub own_metrics: Arc<prometheus_client::registry::Registry>,
    /// The bound on open connections (`maxConnections`): a tunnel outlives the connection it
    /// was upgraded from, so it holds a place of its own.
    pub connections: Arc<tokio::sync::Semaphore>,
}

/// One request's outcome for the metrics: which route and cluster, the response.
struct Handled {
    route: &'static str,
    cluster: String,
    response: Response,
}

pub(crate) async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let started = Instant::now();
    let span = tracing::info_span!(
        "gateway.request",
        otel.name = tracing::field::Empty,
        otel.kind = "server",
        http.request.method = %request.method(),
        url.path = request.uri().path(),
        route = tracing::field::Empty,
        cluster = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    trace::continue_from(&span, request.headers());
    let method = request.method().clone();
    let Handled {
        route,
        cluster,
        response,
    } = dispatch(&shared, request).instrument(span.clone()).await;
    let code = response.status().as_u16();
    span.record("otel.name", format!("{method} {route}"));
    span.record("route", route);
    span.record("cluster", cluster.as_str());
    span.record("http.response.status_code", code);
    shared
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            route,
            cluster: cluster.clone(),
            code,
        })
        .inc();
    shared
        .metrics
        .seconds
        .get_or_create(&RouteLabels { route })
        .observe(started.elapsed().as_secs_f64());
    if code >= 400 && code != 404 && code != 409 {
        let message = response
            .headers()
            .get("x-meridian-reason")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        shared.view.problem(route, &cluster, code, &message);
    }
    tracing::debug!(route, %cluster, code, elapsed_ms = started.elapsed().as_millis() as u64, "gateway request");
    response
}

async fn dispatch(shared: &Shared, request: Request) -> Handled {
    let (mut parts, body) = request.into_parts();
    // Only an HTTP/1.1 request asking for it has one (hyper puts it there).
    let upgrade =
        headers::upgrade(&parts.headers).and_then(|_| parts.extensions.remove::<OnUpgrade>());
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let handled = |route, cluster: &str, response| Handled {
        route,
        cluster: cluster.to_string(),
        response,
    };
    let mut who = match authenticate(shared, &parts.headers, parts.extensions.get()) {
        Ok(who) => who,
        Err(message) => {
            shared.metrics.unauthenticated.inc();
            return handled(
                "none",
                "",
                failure(StatusCode::UNAUTHORIZED, "Unauthorized", &message),
            );
        }
    };
    let route = match path::route(&path_and_query) {
        Ok(route) => route,
        Err(e) => {
            return handled(
                "none",
                "",
                failure(StatusCode::NOT_FOUND, "NotFound", &e.to_string()),
            );
        }
    };
    let reach = match bound(shared, &route, &parts.method, &mut who) {
        Ok(reach) => reach,
        Err(why) => return handled("none", "", failure(why.code, why.reason, &why.message)),
    };
    let body = match read_body(body, shared.config.max_body_bytes).await {
        Ok(body) => body,
        Err(response) => return handled("none", "", response),
    };
    let forwarded = match headers::forwarded(&parts.headers, &who) {
        Ok(h) => h,
        Err(e) => {
            return handled(
                "none",
                "",
                failure(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
            );
        }
    };
    let call = Call {
        method: parts.method,
        headers: forwarded,
        body,
        reach,
    };
    match route {
        Route::Hub { path } => {
            let response = match &shared.targets.hub {
                Some(hub) => forward(shared, hub, "hub", &path, &call, upgrade).await,
                None => failure(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    "this meridian's hub is a directory, not a Kubernetes API",
                ),
            };
            handled("hub", "", response)
        }
        Route::Member { cluster, path } => {
            let response = match shared.targets.member(&cluster) {
                None => failure(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("no member cluster {cluster:?}"),
                ),
                Some(Member::Down(why)) => {
                    failure(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", &why)
                }
                Some(Member::Ready(client)) => {
                    forward(shared, &client, &cluster, &path, &call, upgrade).await
                }
            };
            handled("member", &cluster, response)
        }
        Route::Every { path } => handled("every", "*", every(shared, &path, &call).await),
        Route::Metrics => handled("metrics", "*", metrics(shared, &call).await),
    }
}

/// A request as it goes on: its method, the forwarded headers, the body read, and where the
/// caller's tenants let it go (None: no tenant bounds it).
pub(crate) struct Call {
    pub method: Method,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub reach: Option<Arc<Reach>>,
}

impl Call {
    /// The same request, as a GET with no body (what aggregated reads send members); an
    /// aggregated read never upgrades, so an upgrade's headers do not go on.
    fn get(&self) -> Call {
        let mut headers = self.headers.clone();
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
        Call {
            method: Method::GET,
            headers,
            body: Bytes::new(),
            reach: self.reach.clone(),
        }
    }

    /// Whether `object` of `cluster`, answered for `path`, may be shown to the caller.
    pub(crate) fn shows(&self, cluster: &str, path: &str, object: &Value) -> bool {
        self.reach
            .as_ref()
            .is_none_or(|r| tenant::visible(r, cluster, path, object))
    }
}

/// Where the caller's tenants let it go, after checking this request against it (403); the
/// caller's tenant becomes theirs when its token names none. None: no tenant bounds it.
fn bound(
    shared: &Shared,
    route: &Route,
    method: &Method,
    who: &mut Identity,
) -> Result<Option<Arc<Reach>>, Refusal> {
    let snapshot = shared.targets.snapshots.borrow().clone();
    if !snapshot.tenants.listed {
        return Err(Refusal {
            code: StatusCode::SERVICE_UNAVAILABLE,
            reason: "ServiceUnavailable",
            message: "the hub's Tenants are not read yet: who may reach what is not known".into(),
        });
    }
    let Some(tenants) = snapshot.tenants.bound(&who.user, &who.groups) else {
        return Ok(None);
    };
    let names = tenants.names().join(",");
    let reach = tenants.reach(snapshot.clusters.iter().map(|c| &c.spec), |spec| {
        shared
            .targets
            .fleet
            .get(&spec.id, |f| f.listed.then(|| f.namespace_labels.clone()))
    });
    let (target, path) = match route {
        Route::Hub { path } => (tenant::Target::Hub, path.as_str()),
        Route::Member { cluster, path } => (tenant::Target::Member(cluster), path.as_str()),
        Route::Every { path } => (tenant::Target::Every, path.as_str()),
        Route::Metrics => {
            return Err(Refusal::forbidden(tenant::Refused::Metrics {
                tenants: names,
            }));
        }
    };
    if let Err(refused) = tenant::check(&reach, &names, target, method, path) {
        shared.metrics.tenant_refused.inc();
        return Err(Refusal::forbidden(refused));
    }
    who.tenant.get_or_insert(names);
    Ok(Some(Arc::new(reach)))
}

/// A request answered before it is forwarded: the Status to answer.
struct Refusal {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl Refusal {
    fn forbidden(why: tenant::Refused) -> Self {
        Self {
            code: StatusCode::FORBIDDEN,
            reason: "Forbidden",
            message: why.to_string(),
        }
    }
}

impl Shared {
    /// The members a request through `*` asks: every registered one, or the caller's
    /// tenants' (where its namespace is theirs), in name order.
    pub(crate) fn members_for(&self, call: &Call, path: &str) -> Vec<(String, Member)> {
        let mut members = self.targets.members();
        if let Some(reach) = &call.reach {
            members.retain(|(name, _)| tenant::asks(reach, path, name));
        }
        members
    }
}

/// The identity a connection's client certificate names (None: it presented none).
#[derive(Clone, Debug)]
pub(crate) struct ClientCert(pub Option<Result<crate::token::Identity, crate::cert::CertError>>);

/// The caller: the bearer token's, else the client certificate's.
fn authenticate(
    shared: &Shared,
    headers: &HeaderMap,
    cert: Option<&ClientCert>,
) -> Result<Identity, String> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return match cert.and_then(|c| c.0.clone()) {
            Some(identity) => identity.map_err(|e| e.to_string()),
            None => Err(
                "no bearer token: the gateway needs an OIDC ID token in Authorization (or a client certificate)"
                    .into(),
            ),
        };
    };
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not text")?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or("the Authorization header is not a bearer token")?;
    token::verify(
        token.trim(),
        &shared.keys.current(),
        &shared.config.oidc,
        SystemTime::now(),
    )
    .map_err(|e| {
        if matches!(e, token::TokenError::UnknownKey(_)) {
            shared.keys.unknown_key();
        }
        e.to_string()
    })
}

/// A body past the limit is still read (and dropped) up to this much more, so a client that
/// sends it all before reading the answer gets its 413 instead of a broken connection; past
/// that the connection is cut.
const DRAINED_AT_MOST: usize = 64 * 1024 * 1024;

async fn read_body(mut body: Body, limit: usize) -> Result<Bytes, Response> {
    let mut read = bytes::BytesMut::new();
    let mut over = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            failure(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                &format!("cannot read the request body: {e}"),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if over == 0 && read.len() + data.len() <= limit {
            read.extend_from_slice(&data);
            continue;
        }
        read.clear();
        over += data.len();
        if over > DRAINED_AT_MOST {
            break;
        }
    }
    if over > 0 {
        return Err(failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            &format!("the request body is larger than {limit} bytes"),
        ));
    }
    Ok(read.freeze())
}

/// A Kubernetes Status failure response (the reason also in `x-meridian-reason` for the
/// debug view).
pub(crate) fn failure(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = merge::status(code.as_u16(), reason, message).to_string();
    let mut response = (code, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Ok(v) = HeaderValue::from_str(&message.replace(['\r', '\n'], " ")) {
        response.headers_mut().insert("x-meridian-reason", v);
    }
    response
}

/// Whether the request is a watch (streams without a deadline).
pub(crate) fn is_watch(path_and_query: &str) -> bool {
    matches!(query_param(path_and_query, "watch"), Some("1" | "true"))
        || path_and_query.contains("/watch/")
        || path_and_query.split('?').next().is_some_and(|p| {
            p.ends_with("/log")
                && matches!(query_param(path_and_query, "follow"), Some("1" | "true"))
        })
}

/// Sends `call` to `path` of one API server and answers what it answered, streaming; an
/// upgrade the member accepts becomes a tunnel.
async fn forward(
    shared: &Shared,
    client: &Client,
    cluster: &str,
    path: &str,
    call: &Call,
    upgrade: Option<OnUpgrade>,
) -> Response {
    // A watch streams for as long as the member keeps it; anything else (an upgrade too,
    // until its 101) answers within the member timeout.
    let timeout = (!is_watch(path)).then_some(shared.config.member_timeout);
    let place = match upgrade {
        Some(_) => match shared.connections.clone().try_acquire_owned() {
            Ok(place) => Some(place),
            Err(_) => {
                return failure(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    "the gateway holds as many connections as gateway.maxConnections allows",
                );
            }
        },
        None => None,
    };
    let mut response = match send(client, cluster, path, call, timeout).await {
        Ok(response) => response,
        Err(e) => return e.response(cluster),
    };
    let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let tunnel = match upgrade {
        Some(client_side) if switching => Some((client_side, hyper::upgrade::on(&mut response))),
        _ => None,
    };
    let protocol = response.headers().get(header::UPGRADE).cloned();
    let mut out = relayed(response);
    if let (Some((client_side, member_side)), Some(protocol)) = (tunnel, protocol) {
        out.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        out.headers_mut().insert(header::UPGRADE, protocol);
        tokio::spawn(carry(
            client_side,
            member_side,
            cluster.to_string(),
            shared.metrics.tunnels.clone(),
            place,
        ));
    }
    out
}

/// A member's answer as the client's: its status, its headers but the hop-by-hop and
/// identity ones, its body streamed.
fn relayed(response: http::Response<kube::client::Body>) -> Response {
    let (parts, body) = response.into_parts();
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !headers::is_stripped(name) {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    out
}

/// Bytes both ways between the client's and the member's upgraded connections (exec,
/// attach, port-forward), until either side closes; the protocol inside is theirs.
async fn carry(
    client_side: OnUpgrade,
    member_side: OnUpgrade,
    cluster: String,
    tunnels: prometheus_client::metrics::gauge::Gauge,
    // Held until the tunnel closes: it counts against maxConnections.
    _place: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let (client_io, member_io) = match tokio::try_join!(client_side, member_side) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(%cluster, error = %e, "gateway upgrade not completed");
            return;
        }
    };
    tunnels.inc();
    let mut client_io = hyper_util::rt::TokioIo::new(client_io);
    let mut member_io = hyper_util::rt::TokioIo::new(member_io);
    match tokio::io::copy_bidirectional(&mut client_io, &mut member_io).await {
        Ok((up, down)) => tracing::debug!(%cluster, up, down, "gateway tunnel closed"),
        Err(e) => tracing::debug!(%cluster, error = %e, "gateway tunnel ended"),
    }
    tunnels.dec();
}

/// Why a member gave no answer.
#[derive(Debug)]
pub(crate) enum SendError {
    Timeout(Duration),
    Failed(String),
}

impl SendError {
    pub(crate) fn response(&self, cluster: &str) -> Response {
        match self {
            SendError::Timeout(t) => failure(
                StatusCode::GATEWAY_TIMEOUT,
                "Timeout",
                &format!("{cluster} did not answer within {} s", t.as_secs()),
            ),
            SendError::Failed(e) => failure(
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                &format!("cannot reach {cluster}: {e}"),
            ),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            SendError::Timeout(t) => format!("no answer within {} s", t.as_secs()),
            SendError::Failed(e) => e.clone(),
        }
    }
}

/// Sends `call` to `path` of `cluster`'s API server (or the hub's) in a span of its own,
/// whose context the member gets as its `traceparent`; answers once the head has come.
pub(crate) async fn send(
    client: &Client,
    cluster: &str,
    path: &str,
    call: &Call,
    timeout: Option<Duration>,
) -> Result<http::Response<kube::client::Body>, SendError> {
    let span = tracing::info_span!(
        "gateway.member",
        otel.kind = "client",
        cluster,
        http.request.method = %call.method,
        url.path = path.split('?').next().unwrap_or_default(),
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let mut request = http::Request::builder()
        .method(call.method.clone())
        .uri(path)
        .body(kube::client::Body::from(call.body.clone()))
        .map_err(|e| SendError::Failed(e.to_string()))?;
    *request.headers_mut() = call.headers.clone();
    trace::pass_on(&span, request.headers_mut());
    let sent = client.send(request).instrument(span.clone());
    let failed = |e: kube::Error| SendError::Failed(e.to_string());
    let answered = match timeout {
        Some(t) => match tokio::time::timeout(t, sent).await {
            Ok(answered) => answered.map_err(failed),
            Err(_) => Err(SendError::Timeout(t)),
        },
        None => sent.await.map_err(failed),
    };
    match &answered {
        Ok(response) => span.record("http.response.status_code", response.status().as_u16()),
        Err(_) => span.record("otel.status_code", "ERROR"),
    };
    answered
}

/// The `/clusters/*/…` routes: GET only, on resources.
async fn every(shared: &Shared, path: &str, call: &Call) -> Response {
    if call.method != Method::GET {
        return failure(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "/clusters/*/ only lists, watches and gets: write through /clusters/<name>/",
        );
    }
    let mut call = call.get();
    let Some(api) = ApiPath::parse(path) else {
        return discovery(shared, path, &call).await;
    };
    json_only(&mut call.headers);
    if api.subresource.is_some() {
        return failure(
            StatusCode::NOT_FOUND,
            "NotFound",
            "subresources are per cluster: use /clusters/<name>/",
        );
    }
    if is_watch(path) {
        return fleet_watch::every(shared, path, &call).await;
    }
    if !api.is_collection() {
        return named(shared, path, &call).await;
    }
    list(shared, path, &call).await
}

/// Discovery (and /version, /openapi) through `*`: the first reachable member's, in name
/// order — a fleet runs one API, and kubectl needs discovery before it lists anything.
async fn discovery(shared: &Shared, path: &str, call: &Call) -> Response {
    let first = shared
        .members_for(call, path)
        .into_iter()
        .find_map(|(name, m)| match m {
            Member::Ready(client) => Some((name, client)),
            Member::Down(_) => None,
        });
    match first {
        Some((name, client)) => forward(shared, &client, &name, path, call, None).await,
        None => failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "no member can be reached for discovery",
        ),
    }
}

/// Aggregated answers are parsed: JSON only (a Table in JSON too), never protobuf, and not
/// compressed (the client's Accept-Encoding is for the gateway's answer).
fn json_only(headers: &mut HeaderMap) {
    headers.remove(header::ACCEPT_ENCODING);
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let json: Vec<&str> = accept
        .split(',')
        .map(str::trim)
        .filter(|a| a.starts_with("application/json"))
        .collect();
    let value = if json.is_empty() {
        "application/json".to_string()
    } else {
        json.join(",")
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(header::ACCEPT, v);
    }
}

/// A member's JSON answer: (status, body).
pub(crate) async fn get_json(
    client: &Client,
    cluster: &str,
    path: &str,
    call: &Call,
    timeout: Duration,
) -> Result<(StatusCode, Value), SendError> {
    let response = send(client, cluster, path, call, Some(timeout)).await?;
    let status = response.status();
    let bytes = tokio::time::timeout(timeout, response.into_body().collect_bytes())
        .await
        .map_err(|_| SendError::Timeout(timeout))?
        .map_err(|e| SendError::Failed(e.to_string()))?;
    let body = serde_json::from_slice(&bytes)
        .map_err(|e| SendError::Failed(format!("the answer is not JSON: {e}")))?;
    Ok((status, body))
}

/// Members left out of an aggregated answer, for its Warning headers.
#[derive(Default)]
pub(crate) struct LeftOut(Vec<(String, String)>);

impl LeftOut {
    pub(crate) fn add(&mut self, shared: &Shared, cluster: &str, why: String) {
        shared
            .metrics
            .partial
            .get_or_create(&ClusterLabels {
                cluster: cluster.to_string(),
            })
            .inc();
        tracing::info!(%cluster, %why, "member left out of an aggregated answer");
        self.0.push((cluster.to_string(), why));
    }

    /// One `Warning: 299` header per member left out.
    pub(crate) fn warn(&self, response: &mut Response) {
        for (cluster, why) in &self.0 {
            let text = format!(
                "299 meridian \"{cluster} left out: {}\"",
                why.replace(['"', '\r', '\n'], "'")
            );
            if let Ok(v) = HeaderValue::from_str(&text) {
                response.headers_mut().append(header::WARNING, v);
            }
        }
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Every ready member's answer to `ask`, asked at once, in name order; the members that are
/// down go to `left_out`.
async fn ask_ready<'a, T, F, Fut>(
    shared: &Shared,
    members: &'a [(String, Member)],
    left_out: &mut LeftOut,
    ask: F,
) -> Vec<(String, T)>
where
    F: Fn(&'a str, &'a Client) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let asks = members.iter().filter_map(|(name, m)| match m {
        Member::Ready(client) => {
            let answer = ask(name, client);
            Some(async move { (name.clone(), answer.await) })
        }
        Member::Down(why) => {
            left_out.add(shared, name, why.clone());
            None
        }
    });
    let asks: Vec<_> = asks.collect();
    futures::future::join_all(asks).await
}

/// A member's failure as the reason it is left out of an aggregated answer (None: it
/// answered). Callers answer a 410 themselves: it is the whole answer's (the client relists).
fn member_failure(status: StatusCode, body: &Value) -> Option<String> {
    (!status.is_success()).then(|| {
        format!(
            "{} {}",
            status.as_u16(),
            body["message"].as_str().unwrap_or("(no message)")
        )
    })
}

/// A named object through `*`: the one member that has it; 409 naming them when several do.
async fn named(shared: &Shared, path: &str, call: &Call) -> Response {
    let members = shared.members_for(call, path);
    let mut left_out = LeftOut::default();
    let answers = ask_ready(shared, &members, &mut left_out, |name, client| {
        get_json(client, name, path, call, shared.config.member_timeout)
    })
    .await;
    let mut found = Vec::new();
    for (name, answer) in answers {
        match answer {
            Ok((status, body)) if status.is_success() => {
                if call.shows(&name, path, &body) {
                    found.push((name, body));
                }
            }
            Ok((StatusCode::NOT_FOUND, _)) => {}
            Ok((status, body)) => left_out.add(
                shared,
                &name,
                member_failure(status, &body).unwrap_or_default(),
            ),
            Err(e) => left_out.add(shared, &name, e.describe()),
        }
    }
    let mut response = match found.len() {
        0 => failure(StatusCode::NOT_FOUND, "NotFound", "no member has it"),
        1 => {
            let (name, mut body) = found.pop().unwrap_or_default();
            merge::mark(&mut body, &name);
            json_response(StatusCode::OK, &body)
        }
        _ => {
            let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
            failure(
                StatusCode::CONFLICT,
                "Conflict",
                &format!(
                    "{} members have it: {}; ask one through /clusters/<name>/",
                    names.len(),
                    names.join(", ")
                ),
            )
        }
    };
    left_out.warn(&mut response);
    response
}

/// `/clusters/metrics`: every reachable member's /metrics (as the caller: the member's RBAC
/// decides), at once and each bounded by the member timeout, merged with meridian's own.
async fn metrics(shared: &Shared, call: &Call) -> Response {
    let members = shared.targets.members();
    let scrapes = members.iter().map(|(name, m)| async move {
        let text = match m {
            Member::Ready(client) => {
                scrape_one(client, name, call, shared.config.member_timeout).await
            }
            Member::Down(why) => Err(why.clone()),
        };
        (name.clone(), text)
    });
    let mut merged = crate::scrape::Merged::default();
    let mut up = Vec::new();
    for (name, text) in futures::future::join_all(scrapes).await {
        match text {
            Ok(text) => {
                merged.add(&text, Some(&name));
                up.push((name, true));
            }
            Err(why) => {
                tracing::info!(cluster = %name, %why, "member metrics not scraped");
                shared.view.problem("metrics", &name, 502, &why);
                up.push((name, false));
            }
        }
    }
    merged.add(&crate::scrape::member_up(&up), None);
    let mut own = String::new();
    if prometheus_client::encoding::text::encode(&mut own, &shared.own_metrics).is_ok() {
        merged.add(&own, None);
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        merged.render(),
    )
        .into_response()
}

async fn scrape_one(
    client: &Client,
    cluster: &str,
    call: &Call,
    timeout: Duration,
) -> Result<String, String> {
    let mut call = call.get();
    call.headers
        .insert(header::ACCEPT, HeaderValue::from_static("text/plain"));
    call.headers.remove(header::ACCEPT_ENCODING);
    let response = send(client, cluster, "/metrics", &call, Some(timeout))
        .await
        .map_err(|e| e.describe())?;
    let status = response.status();
    let body = tokio::time::timeout(timeout, response.into_body().collect_bytes())
        .await
        .map_err(|_| format!("no answer within {} s", timeout.as_secs()))?
        .map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "{} {}",
            status.as_u16(),
            String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>()
        ));
    }
    String::from_utf8(body.to_vec()).map_err(|_| "the metrics are not UTF-8".to_string())
}

/// The request's `resourceVersion` parameter, and the composite it is (if it is one).
pub(crate) fn requested_version(
    path: &str,
) -> Result<(Option<&str>, Option<Composite>), merge::BadToken> {
    let requested = query_param(path, "resourceVersion");
    Composite::requested(requested).map(|composite| (requested, composite))
}

/// The union of every member's list: all at once, or paged by `limit` and `continue`.
async fn list(shared: &Shared, path: &str, call: &Call) -> Response {
    let (requested, composite) = match requested_version(path) {
        Ok(v) => v,
        Err(e) => return failure(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    let limit = query_param(path, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let resume = match query_param(path, "continue")
        .filter(|c| !c.is_empty())
        .map(Continue::decode)
    {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => return failure(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
        None => None,
    };
    let members = shared.members_for(call, path);
    let mut left_out = LeftOut::default();
    let member_path = |cluster: &str, limit: Option<String>, token: Option<&str>| {
        with_params(
            path,
            &[
                (
                    "resourceVersion",
                    Composite::for_member(requested, &composite, cluster),
                ),
                ("limit", limit.as_deref()),
                ("continue", token),
            ],
        )
    };
    let (mut lists, next, done) = match limit {
        None if resume.is_none() => {
            let answers = ask_ready(shared, &members, &mut left_out, |name, client| {
                let p = member_path(name, None, None);
                async move { get_json(client, name, &p, call, shared.config.member_timeout).await }
            })
            .await;
            let mut lists = Vec::new();
            for (name, answer) in answers {
                match answer {
                    Ok((StatusCode::GONE, body)) => return json_response(StatusCode::GONE, &body),
                    Ok((status, body)) => match member_failure(status, &body) {
                        None => lists.push(MemberList {
                            cluster: name,
                            list: body,
                        }),
                        Some(why) => left_out.add(shared, &name, why),
                    },
                    Err(e) => left_out.add(shared, &name, e.describe()),
                }
            }
            (lists, None, Composite::default())
        }
        _ => {
            let limit = limit.unwrap_or(500);
            let resume = resume.unwrap_or_default();
            let mut remaining = limit;
            let mut lists = Vec::new();
            let mut next = None;
            let mut done = resume.done.clone();
            let pending: Vec<&(String, Member)> = members
                .iter()
                .filter(|(n, _)| *n >= resume.cluster)
                .collect();
            for (i, (name, m)) in pending.iter().enumerate() {
                if remaining == 0 {
                    next = Some(Continue {
                        cluster: name.clone(),
                        member: String::new(),
                        done: done.clone(),
                    });
                    break;
                }
                let Member::Ready(client) = m else {
                    if let Member::Down(why) = m {
                        left_out.add(shared, name, why.clone());
                    }
                    continue;
                };
                let token = (i == 0 && *name == resume.cluster && !resume.member.is_empty())
                    .then_some(resume.member.as_str());
                // A later page of a member asks for its own continue token, not a version.
                let p = match token {
                    Some(t) => with_params(
                        path,
                        &[
                            ("resourceVersion", None),
                            ("limit", Some(&remaining.to_string())),
                            ("continue", Some(t)),
                        ],
                    ),
                    None => member_path(name, Some(remaining.to_string()), None),
                };
                match get_json(client, name, &p, call, shared.config.member_timeout).await {
                    Ok((StatusCode::GONE, body)) => return json_response(StatusCode::GONE, &body),
                    Ok((status, body)) => match member_failure(status, &body) {
                        Some(why) => left_out.add(shared, name, why),
                        None => {
                            let field = if body["kind"] == "Table" {
                                "rows"
                            } else {
                                "items"
                            };
                            remaining = remaining
                                .saturating_sub(body[field].as_array().map_or(0, Vec::len));
                            if let Some(rv) = body["metadata"]["resourceVersion"].as_str() {
                                done.set(name, rv);
                            }
                            let more = body["metadata"]["continue"]
                                .as_str()
                                .filter(|c| !c.is_empty())
                                .map(str::to_string);
                            lists.push(MemberList {
                                cluster: name.clone(),
                                list: body,
                            });
                            if let Some(token) = more {
                                next = Some(Continue {
                                    cluster: name.clone(),
                                    member: token,
                                    done: done.clone(),
                                });
                                break;
                            }
                        }
                    },
                    Err(e) => left_out.add(shared, name, e.describe()),
                }
            }
            (lists, next, done)
        }
    };
    if call.reach.is_some() {
        for list in &mut lists {
            merge::retain(&mut list.list, |item| call.shows(&list.cluster, path, item));
        }
    }
    let (mut merged, _) = merge::merge_lists(lists, &done);
    if let Some(next) = next {
        merged["metadata"]["continue"] = json!(next.encode());
    }
    let mut response = json_response(StatusCode::OK, &merged);
    left_out.warn(&mut response);
    response
}
