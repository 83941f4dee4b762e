//! The member's API over the agent's stream, both ends.
//!
//! The hub makes a `kube::Client` per agent member whose requests go down the member's stream
//! (`meridian_controllers::agents::Tunnel`); here they become [`ApiRequest`]s with an id
//! ([`Pending`], the hub's reader), the agent sends each with its own credentials and streams
//! the answer back as [`ApiResponse`] parts ([`carry`]), and the hub hands those to the
//! waiting caller. So the hub's writers and watches — the MCS write-back, propagation, tenant
//! namespaces, the gateway's `/clusters/<name>/` — reach an agent member as they reach a push
//! member, and the member's RBAC for the agent decides what they may do.
//!
//! The agent carries API requests only (`/api…`, `/apis…`, `/version`): no `exec`, `attach`,
//! `portforward` or `proxy`, no upgrades, no other paths ([`refusal`]); the hub's credential
//! headers are dropped (the agent's own go on), everything else (impersonation included)
//! goes to the member, whose RBAC judges it.

use std::collections::HashMap;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue};
use meridian_controllers::agents::{ApiCall, Respond, ResponsePart, Undeliverable};
use tokio::sync::mpsc;

use crate::proto::{AgentMessage, ApiRequest, ApiResponse, Header, agent_message};

/// Subresources that open a connection to a kubelet or a pod: not carried.
const NOT_CARRIED: [&str; 4] = ["exec", "attach", "portforward", "proxy"];
/// Headers that belong to one connection, or that carry the hub's credentials.
const NOT_FORWARDED: [&str; 10] = [
    "authorization",
    "connection",
    "content-length",
    "host",
    "keep-alive",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Why the agent does not carry `method path` (None: it does).
pub fn refusal(method: &str, path: &str) -> Option<String> {
    if !matches!(method, "GET" | "POST" | "PUT" | "PATCH" | "DELETE") {
        return Some(format!("the agent carries no {method} requests"));
    }
    let bare = path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = bare.split('/').skip(1).collect();
    if segments
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == ".." || s.contains('%'))
    {
        return Some(format!("the agent carries no path like {bare:?}"));
    }
    let rest = match segments.as_slice() {
        ["version"] | ["api"] | ["apis"] => return None,
        ["api", _version, rest @ ..] => rest,
        ["apis", _group] => return None,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return Some(format!("the agent carries only API paths, not {bare:?}")),
    };
    let in_namespace = match rest {
        ["namespaces", _ns, resource @ ..] if !resource.is_empty() => resource,
        other => other,
    };
    match in_namespace {
        [_resource, _name, sub, ..] if NOT_CARRIED.contains(sub) => Some(format!(
            "the agent does not carry {sub} (it opens a connection into the member)"
        )),
        _ => None,
    }
}

/// The hub's end: requests sent down one stream and waiting for their answers.
#[derive(Default)]
pub struct Pending {
    waiting: HashMap<u64, Respond>,
    next: u64,
}

impl Pending {
    /// The message that sends `call` down; its answer goes to its caller.
    pub fn start(&mut self, call: ApiCall) -> ApiRequest {
        self.next += 1;
        let id = self.next;
        self.waiting.insert(id, call.respond);
        ApiRequest {
            id,
            method: call.method.to_string(),
            path: call.path,
            headers: to_wire(&call.headers),
            body: call.body.to_vec(),
            cancel: false,
        }
    }

    /// A part of an answer from the agent, to its caller; the cancel to send down when the
    /// caller went or fell too far behind.
    pub fn answer(&mut self, response: ApiResponse) -> Option<ApiRequest> {
        let id = response.id;
        let respond = self.waiting.get(&id)?;
        let end = response.end;
        let delivered = parts(response)
            .into_iter()
            .try_for_each(|part| respond.send(part));
        match delivered {
            Ok(()) => {
                if end {
                    self.waiting.remove(&id);
                }
                None
            }
            Err(Undeliverable::Gone | Undeliverable::Overflow) => {
                self.waiting.remove(&id);
                (!end).then(|| ApiRequest {
                    id,
                    cancel: true,
                    ..ApiRequest::default()
                })
            }
        }
    }

    /// Requests still waiting for (the rest of) their answer.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// One wire part as its caller reads it: the head, data, the end — in that order.
fn parts(response: ApiResponse) -> Vec<ResponsePart> {
    let mut out = Vec::with_capacity(3);
    if response.status != 0 {
        out.push(ResponsePart::Head {
            status: u16::try_from(response.status).unwrap_or(502),
            headers: from_wire(&response.headers),
        });
    }
    if !response.data.is_empty() {
        out.push(ResponsePart::Data(Bytes::from(response.data)));
    }
    if response.end {
        out.push(ResponsePart::End(match response.error.is_empty() {
            true => Ok(()),
            false => Err(response.error),
        }));
    }
    out
}

fn to_wire(headers: &HeaderMap) -> Vec<Header> {
    headers
        .iter()
        .filter(|(name, _)| !NOT_FORWARDED.contains(&name.as_str()))
        .map(|(name, value)| Header {
            name: name.as_str().to_string(),
            value: value.as_bytes().to_vec(),
        })
        .collect()
}

fn from_wire(headers: &[Header]) -> HeaderMap {
    let mut out = HeaderMap::new();
    for header in headers {
        let name = HeaderName::from_bytes(header.name.as_bytes());
        let value = HeaderValue::from_bytes(&header.value);
        if let (Ok(name), Ok(value)) = (name, value)
            && !NOT_FORWARDED.contains(&name.as_str())
        {
            out.append(name, value);
        }
    }
    out
}

/// The agent's end of one request: sent to the member with the agent's credentials, the
/// answer streamed up part by part. Ends when the answer did, or when the stream went.
pub async fn carry(
    member: kube::Client,
    request: ApiRequest,
    cluster: String,
    up: mpsc::Sender<AgentMessage>,
) {
    let id = request.id;
    let send = |response: ApiResponse| {
        let up = up.clone();
        let cluster = cluster.clone();
        async move {
            let message = AgentMessage {
                cluster,
                body: Some(agent_message::Body::Response(response)),
            };
            up.send(message).await.is_ok()
        }
    };
    let http_request = match build(&request) {
        Ok(r) => r,
        Err(refused) => {
            send(refused_answer(id, &refused)).await;
            return;
        }
    };
    let response = match member.send(http_request).await {
        Ok(response) => response,
        Err(e) => {
            send(ApiResponse {
                id,
                end: true,
                error: format!("the member's API: {}", meridian_controllers::reason_of(&e)),
                ..ApiResponse::default()
            })
            .await;
            return;
        }
    };
    let (head, body) = response.into_parts();
    let first = ApiResponse {
        id,
        status: u32::from(head.status.as_u16()),
        headers: to_wire(&head.headers),
        ..ApiResponse::default()
    };
    if !send(first).await {
        return;
    }
    let mut frames = http_body_util::BodyStream::new(body);
    while let Some(frame) = frames.next().await {
        let part = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) if !data.is_empty() => ApiResponse {
                    id,
                    data: data.to_vec(),
                    ..ApiResponse::default()
                },
                _ => continue,
            },
            Err(e) => ApiResponse {
                id,
                end: true,
                error: format!("the member's answer broke off: {e}"),
                ..ApiResponse::default()
            },
        };
        let end = part.end;
        if !send(part).await || end {
            return;
        }
    }
    send(ApiResponse {
        id,
        end: true,
        ..ApiResponse::default()
    })
    .await;
}

/// The request for the member's API, or why it is not carried.
fn build(request: &ApiRequest) -> Result<http::Request<kube::client::Body>, String> {
    if let Some(why) = refusal(&request.method, &request.path) {
        return Err(why);
    }
    let mut builder = http::Request::builder()
        .method(request.method.as_str())
        .uri(request.path.as_str());
    if let Some(headers) = builder.headers_mut() {
        *headers = from_wire(&request.headers);
    }
    builder
        .body(kube::client::Body::from(request.body.clone()))
        .map_err(|e| format!("not a request: {e}"))
}

/// A refused request's answer: a 403 Status, as an API server would say it.
fn refused_answer(id: u64, why: &str) -> ApiResponse {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("meridian agent: {why}"), "reason": "Forbidden", "code": 403,
    });
    ApiResponse {
        id,
        status: 403,
        headers: vec![Header {
            name: "content-type".into(),
            value: b"application/json".to_vec(),
        }],
        data: serde_json::to_vec(&status).unwrap_or_default(),
        end: true,
        error: String::new(),
    }
}

#[cfg(test)]
mod tests;
