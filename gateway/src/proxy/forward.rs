//! Forwarding to one API server (a member or the hub): the request sent in a span of its own,
//! the answer relayed as it streams, and an accepted upgrade carried as a tunnel. A watch has
//! no deadline here, since it streams for as long as the member keeps it; everything else
//! answers within the member timeout. The fan-out and the fleet watch send through `send` too,
//! so every request to a member gets the same span, `traceparent` and timeout handling.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::StatusCode;
use http::header::{self, HeaderValue};
use hyper::upgrade::OnUpgrade;
use kube::Client;
use tracing::Instrument;

use super::state::{Call, Shared, failure};
use crate::headers;
use crate::path::query_param;
use crate::trace;

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
pub(crate) async fn forward(
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
