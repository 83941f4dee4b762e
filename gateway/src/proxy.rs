//! The request path: authenticate, route, then forward to one member or the hub, or fan out
//! to every member and merge. This is the entry — who is asking, where to, with what body —
//! and the `/clusters/*/` router. The router sits here rather than in `fanout` because it
//! chooses between the fan-out and the fleet watch (`crate::watch`), and the watch builds on
//! the fan-out: with the chooser above both, the parts depend one way only (`state` ←
//! `forward` ← `fanout` ← `watch` ← here ← `serve`, the listener).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use meridian_core::tenant::Reach;
use tracing::Instrument;

use crate::headers;
use crate::metrics::{RequestLabels, RouteLabels};
use crate::path::{self, ApiPath, Route};
use crate::tenant;
use crate::token::{self, Identity};
use crate::trace;
use crate::watch as fleet_watch;

pub(crate) mod fanout;
pub(crate) mod forward;
pub(crate) mod list;
pub(crate) mod state;

use fanout::{discovery, json_only, metrics, named};
use forward::{forward, is_watch};
use list::list;
use state::{Call, Member, Shared, failure};

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

async fn dispatch(shared: &Arc<Shared>, request: Request) -> Handled {
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
        Route::Hub { path } => (tenant::Destination::Hub, path.as_str()),
        Route::Member { cluster, path } => (tenant::Destination::Member(cluster), path.as_str()),
        Route::Every { path } => (tenant::Destination::Every, path.as_str()),
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

/// The `/clusters/*/…` routes: GET only, on resources.
async fn every(shared: &Arc<Shared>, path: &str, call: &Call) -> Response {
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

#[cfg(test)]
mod tests;
