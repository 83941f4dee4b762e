//! The control API (JSON over HTTP on `--control-port`): what the simulated fleet was asked,
//! what was written into it, and switches for outages and full resyncs.
//!
//! ```text
//!  GET  /stats[?detail=false]          requests by verb and resource, open watches, totals
//!  POST /stats/reset
//!  GET  /writes?since=SEQ&limit=L      the write log, oldest first; `next` to ask from
//!  GET  /members                       name, port, up
//!  POST /members/{name}/down | /up     close the listener and connections | listen again
//!  POST /members/{name}/expire         end every watch; older resourceVersions are 410
//!  POST /expire-all
//!  GET  /members/{name}/objects?resource=deployments.apps[&namespace=ns]
//!  PUT  /members/{name}/objects        seed objects (one, a JSON list, or {"items": [...]})
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::fleet::{Fleet, Member};
use crate::store::{Filter, Target, Writer};

type Shared = State<Arc<Fleet>>;

pub fn router(fleet: Arc<Fleet>) -> Router {
    Router::new()
        .route("/stats", get(stats))
        .route("/stats/reset", post(reset))
        .route("/writes", get(writes))
        .route("/members", get(members))
        .route("/members/:name/down", post(down))
        .route("/members/:name/up", post(up))
        .route("/members/:name/expire", post(expire))
        .route("/expire-all", post(expire_all))
        .route("/members/:name/objects", get(objects).put(seed))
        .with_state(fleet)
}

/// Serves the control API until the process ends.
pub async fn serve(fleet: Arc<Fleet>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, router(fleet)).await
}

async fn stats(State(fleet): Shared, Query(q): Query<HashMap<String, String>>) -> Json<Value> {
    let detail = q.get("detail").is_none_or(|d| d != "false" && d != "0");
    Json(fleet.stats(detail))
}

async fn reset(State(fleet): Shared) -> StatusCode {
    fleet.reset_stats();
    StatusCode::NO_CONTENT
}

async fn writes(State(fleet): Shared, Query(q): Query<HashMap<String, String>>) -> Json<Value> {
    let since = q.get("since").and_then(|s| s.parse().ok()).unwrap_or(0);
    let limit = q
        .get("limit")
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let (entries, next) = fleet.log.lock().since(since, limit);
    Json(json!({"next": next, "writes": entries}))
}

async fn members(State(fleet): Shared) -> Json<Value> {
    let list: Vec<Value> = fleet
        .members
        .iter()
        .map(|m| json!({"name": m.name, "port": m.port, "up": m.is_up()}))
        .collect();
    Json(json!(list))
}

/// A member name the fleet does not have: 404.
struct NoMember(String);

impl IntoResponse for NoMember {
    fn into_response(self) -> Response {
        (StatusCode::NOT_FOUND, format!("no member {:?}\n", self.0)).into_response()
    }
}

fn find(fleet: &Fleet, name: &str) -> Result<Arc<Member>, NoMember> {
    fleet
        .member(name)
        .cloned()
        .ok_or_else(|| NoMember(name.to_owned()))
}

async fn down(State(fleet): Shared, Path(name): Path<String>) -> Response {
    match find(&fleet, &name) {
        Ok(m) => {
            m.set_up(false);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn up(State(fleet): Shared, Path(name): Path<String>) -> Response {
    match find(&fleet, &name) {
        Ok(m) => {
            m.set_up(true);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn expire(State(fleet): Shared, Path(name): Path<String>) -> Response {
    match find(&fleet, &name) {
        Ok(m) => {
            m.expire();
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn expire_all(State(fleet): Shared) -> StatusCode {
    for m in &fleet.members {
        m.expire();
    }
    StatusCode::NO_CONTENT
}

async fn objects(
    State(fleet): Shared,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let member = match find(&fleet, &name) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let wanted = q.get("resource").map_or("", String::as_str);
    let Some(resource) = Fleet::resource_of(&member, wanted) else {
        return (StatusCode::NOT_FOUND, format!("no resource {wanted:?}\n")).into_response();
    };
    let filter = Filter {
        namespace: q.get("namespace").cloned(),
        ..Filter::default()
    };
    let items: Vec<Value> = member
        .store
        .lock()
        .all(&resource, &filter)
        .iter()
        .map(|o| serde_json::from_slice(o).unwrap_or(Value::Null))
        .collect();
    Json(json!({"items": items})).into_response()
}

/// Creates or replaces each object (its namespace created when missing). Seeds are not
/// counted as requests nor logged as writes.
async fn seed(State(fleet): Shared, Path(name): Path<String>, body: axum::body::Bytes) -> Response {
    let member = match find(&fleet, &name) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    // Any content type: a seed is JSON (curl -d sends form-encoded by default).
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("not JSON: {e}\n")).into_response(),
    };
    let objects = match body {
        Value::Array(items) => items,
        Value::Object(ref o) if o.contains_key("items") => {
            o["items"].as_array().cloned().unwrap_or_default()
        }
        other => vec![other],
    };
    let mut seeded = 0;
    for object in objects {
        if let Err(e) = seed_one(&member, object) {
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
        seeded += 1;
    }
    member.notify();
    Json(json!({"seeded": seeded})).into_response()
}

fn seed_one(member: &Member, mut object: Value) -> Result<(), String> {
    let now = crate::time::now_rfc3339();
    let who = Writer {
        manager: "kubesim-seed",
        force: true,
        now: &now,
    };
    let text = |o: &Value, p: &str| o.pointer(p).and_then(Value::as_str).map(str::to_owned);
    let (Some(api_version), Some(kind), Some(name)) = (
        text(&object, "/apiVersion"),
        text(&object, "/kind"),
        text(&object, "/metadata/name"),
    ) else {
        return Err("an object needs apiVersion, kind and metadata.name".into());
    };
    let namespace = text(&object, "/metadata/namespace");
    let mut store = member.store.lock();
    let resource = store
        .registry
        .by_kind(&api_version, &kind)
        .ok_or_else(|| format!("{api_version} {kind} is not served"))?;
    if let Some(ns) = namespace.as_deref().filter(|_| resource.namespaced)
        && !store.namespace_exists(ns)
    {
        let namespaces = store
            .registry
            .get("", "v1", "namespaces")
            .expect("built in");
        let t = Target {
            resource: &namespaces,
            namespace: None,
            name: ns,
            subresource: None,
        };
        store
            .create(&t, json!({"metadata": {"name": ns}}), &who)
            .map_err(|e| e.to_string())?;
    }
    let t = Target {
        resource: &resource,
        namespace: namespace.as_deref(),
        name: &name,
        subresource: None,
    };
    let status = object.get("status").cloned();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    match store.get(&t) {
        Ok(_) => store.update(&t, object.clone(), &who),
        Err(_) => store.create(&t, object.clone(), &who),
    }
    .map_err(|e| e.to_string())?;
    // A seeded status (a Service's load balancer, an export's conditions) goes in too.
    if let Some(status) = status.filter(|_| resource.status) {
        object["status"] = status;
        let t = Target {
            subresource: Some("status"),
            ..t
        };
        store.update(&t, object, &who).map_err(|e| e.to_string())?;
    }
    Ok(())
}
