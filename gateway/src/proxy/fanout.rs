//! Fan-out across the members for `/clusters/*/…` reads and `/clusters/metrics`: each ready
//! member asked (reads through `*` MEMBERS_AT_ONCE at a time) and bounded by the member
//! timeout, the answers merged, and every member left out named in a Warning instead of
//! failing the whole answer, so one member down does not take the fleet's reads with it.
//! The fleet watch (`crate::watch`) and lists (`list`) leave members out the same way,
//! through `LeftOut` here.

use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{self, HeaderMap, HeaderValue};
use kube::Client;
use serde_json::Value;

use futures::StreamExt;

use super::forward::{SendError, forward, send};
use super::list::MEMBERS_AT_ONCE;
use super::state::{Call, Member, Shared, failure};
use crate::merge::{self, Composite, Rosters, VersionError};
use crate::metrics::ClusterLabels;
use crate::path::query_param;

/// Discovery (and /version, /openapi) through `*`: the first reachable member's, in name
/// order — a fleet runs one API, and kubectl needs discovery before it lists anything.
pub(crate) async fn discovery(shared: &Shared, path: &str, call: &Call) -> Response {
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
pub(crate) fn json_only(headers: &mut HeaderMap) {
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

/// Every ready member's answer to `ask`, MEMBERS_AT_ONCE at a time, in name order; the
/// members that are down go to `left_out`.
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
    futures::stream::iter(asks)
        .buffered(MEMBERS_AT_ONCE)
        .collect()
        .await
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
pub(crate) async fn named(shared: &Shared, path: &str, call: &Call) -> Response {
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
pub(crate) async fn metrics(shared: &Shared, call: &Call) -> Response {
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

/// The request's `resourceVersion` parameter, and the composite it is (if it is one); or the
/// answer when it is a composite that cannot be read: 400 when it is not the gateway's, 410
/// `Expired` when it was made for members no longer known (the client lists again, as after
/// an API server's compaction).
pub(crate) fn requested_version<'a>(
    path: &'a str,
    rosters: &Rosters,
) -> Result<(Option<&'a str>, Option<Composite>), Box<Response>> {
    let requested = query_param(path, "resourceVersion");
    match Composite::requested(requested, rosters) {
        Ok(composite) => Ok((requested, composite)),
        Err(e @ VersionError::Bad(_)) => Err(Box::new(failure(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &e.to_string(),
        ))),
        Err(e @ VersionError::Expired(_)) => Err(Box::new(failure(
            StatusCode::GONE,
            "Expired",
            &e.to_string(),
        ))),
    }
}
