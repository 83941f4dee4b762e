//! `meridian explain httproute/NAME -n NS --from-cluster C` (and grpcroute/NAME): the route's
//! status for each parent, and for each of its matches on each parent port — in the order
//! clients try them — the share each backend gets and, inside it, the share each cluster gets
//! for a proxyless client in C, from the same decision DNS and EDS give that client.

use anyhow::{Result, anyhow};
use meridian_core::route::{
    Actions, Attached, HeaderEdits, PathMatch, PathModifier, RouteKind, ValueMatch,
};
use meridian_core::{Client, ObjectKey, Snapshot, select_for};
use serde::Serialize;
use serde_json::Value;

use super::{Seen, tier_words};

/// `httproute`, `grpcroute` (any case, plural too) → the kind.
pub fn route_kind(kind: &str) -> Option<RouteKind> {
    match kind.to_ascii_lowercase().trim_end_matches('s') {
        "httproute" => Some(RouteKind::Http),
        "grpcroute" => Some(RouteKind::Grpc),
        _ => None,
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RouteExplanation {
    route: String,
    kind: RouteKind,
    client_cluster: Option<String>,
    parents: Vec<meridian_core::route::ParentStatus>,
    matches: Vec<MatchExplanation>,
    words: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MatchExplanation {
    parent: String,
    port: u16,
    /// Where it stands among every match on that port (0: tried first).
    position: usize,
    rule: usize,
    rule_name: Option<String>,
    #[serde(rename = "match")]
    matches: meridian_core::route::Match,
    fails: bool,
    /// Percent of this match's requests that fail: the share of backends that did not
    /// resolve (100 when none did).
    failing_percent: f64,
    backends: Vec<BackendShare>,
    /// What the rule's filters do besides sending the request.
    #[serde(skip_serializing_if = "Actions::is_empty")]
    actions: Actions,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct BackendShare {
    service: String,
    port: u16,
    /// Percent of this match's requests.
    percent: f64,
    clusters: Vec<ClusterShare>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterShare {
    cluster: String,
    /// Percent of this match's requests while the first tier serves.
    percent: f64,
    tier: String,
}

pub fn explain_route(
    seen: Seen<'_>,
    kind: RouteKind,
    namespace: &str,
    name: &str,
    from_cluster: Option<&str>,
) -> Result<Value> {
    let snap = seen.snap;
    let key = ObjectKey::new(namespace, name);
    let parents = snap
        .routes
        .statuses
        .get(&(kind, key.clone()))
        .map(|s| s.parents.clone())
        .ok_or_else(|| anyhow!("no {kind} {namespace}/{name} with a Service parent on the hub"))?;
    let mut words = vec![format!(
        "{kind} {namespace}/{name} for a proxyless client in {}",
        from_cluster.unwrap_or("an unknown cluster")
    )];
    for p in &parents {
        words.push(format!(
            "parent {}: Accepted={} ({}){}, ResolvedRefs={} ({}){}",
            p.parent,
            p.accepted.status,
            p.accepted.reason,
            said(&p.accepted.message),
            p.resolved_refs.status,
            p.resolved_refs.reason,
            said(&p.resolved_refs.message),
        ));
    }
    let mut matches = Vec::new();
    for (parent, port, attached) in snap.routes.parents() {
        for (position, a) in attached.iter().enumerate() {
            if a.kind != kind || a.route != key {
                continue;
            }
            let explained = explain_match(seen, parent, port, position, a, from_cluster);
            words.extend(match_words(&explained));
            matches.push(explained);
        }
    }
    if matches.is_empty() {
        words.push("no parent takes the route: it applies to no client".into());
    }
    Ok(serde_json::to_value(RouteExplanation {
        route: key.to_string(),
        kind,
        client_cluster: from_cluster.map(str::to_owned),
        parents,
        matches,
        words,
    })?)
}

fn said(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

fn explain_match(
    seen: Seen<'_>,
    parent: &ObjectKey,
    port: u16,
    position: usize,
    a: &Attached,
    from_cluster: Option<&str>,
) -> MatchExplanation {
    let total: u64 =
        a.backends.iter().map(|b| u64::from(b.weight)).sum::<u64>() + u64::from(a.failing);
    let backends = a
        .backends
        .iter()
        .filter(|b| b.weight > 0)
        .map(|b| {
            let percent = 100.0 * f64::from(b.weight) / total as f64;
            BackendShare {
                service: b.service.to_string(),
                port: b.port,
                percent,
                clusters: cluster_shares(seen, &b.service, percent, from_cluster),
            }
        })
        .collect();
    MatchExplanation {
        parent: parent.to_string(),
        port,
        position,
        rule: a.rule,
        rule_name: a.rule_name.clone(),
        matches: a.matches.clone(),
        fails: a.fails(),
        failing_percent: a.failing_percent(),
        backends,
        actions: a.actions.clone(),
    }
}

/// How a backend's share divides between clusters for a proxyless client in `from_cluster`:
/// the first tier of the service's decision, by weight (the later tiers take over only when
/// it has no healthy endpoint).
fn cluster_shares(
    seen: Seen<'_>,
    service: &ObjectKey,
    percent: f64,
    from_cluster: Option<&str>,
) -> Vec<ClusterShare> {
    let snap: &Snapshot = seen.snap;
    let Some(view) = snap.service(&service.namespace, &service.name) else {
        return Vec::new();
    };
    let client = from_cluster.and_then(|c| snap.cluster_index(c));
    let decider = Client::in_cluster(snap, client).without_gateways();
    let selection = select_for(snap, view, &decider, seen.instant());
    let Some(first) = selection.tiers.first() else {
        return Vec::new();
    };
    let tier = first
        .reasons
        .iter()
        .map(tier_words)
        .collect::<Vec<_>>()
        .join(" + ");
    let weights: u64 = first.members.iter().map(|m| u64::from(m.weight)).sum();
    first
        .members
        .iter()
        .map(|m| ClusterShare {
            cluster: snap.clusters[m.cluster].spec.id.to_string(),
            percent: percent * f64::from(m.weight) / weights.max(1) as f64,
            tier: tier.clone(),
        })
        .collect()
}

fn match_words(m: &MatchExplanation) -> Vec<String> {
    let rule = match &m.rule_name {
        Some(n) => format!("rule {} ({n})", m.rule),
        None => format!("rule {}", m.rule),
    };
    let mut words = vec![format!(
        "{}:{} #{} {rule}, {}:",
        m.parent,
        m.port,
        m.position,
        match_text(&m.matches)
    )];
    words.extend(action_words(&m.actions));
    if m.fails {
        words.push(
            "  no backend with a weight resolves: these requests fail (500, UNAVAILABLE for gRPC)"
                .into(),
        );
    } else if m.failing_percent > 0.0 {
        words.push(format!(
            "  {:.1}% → backends that do not resolve: these requests fail (503, UNAVAILABLE for gRPC)",
            m.failing_percent
        ));
    }
    for b in &m.backends {
        words.push(format!("  {:.1}% → {}:{}", b.percent, b.service, b.port));
        if b.clusters.is_empty() {
            words.push("    no cluster has traffic for this client".into());
        }
        for c in &b.clusters {
            words.push(format!(
                "    {:.1}% in {} ({})",
                c.percent, c.cluster, c.tier
            ));
        }
    }
    words
}

/// What a match's filters do, one line each.
fn action_words(a: &Actions) -> Vec<String> {
    let mut words = Vec::new();
    let headers = |way: &str, e: &HeaderEdits, words: &mut Vec<String>| {
        let set = e.set.iter().map(|(n, v)| format!("{n}: {v}"));
        let add = e.add.iter().map(|(n, v)| format!("+{n}: {v}"));
        let remove = e.remove.iter().map(|n| format!("-{n}"));
        let all: Vec<String> = set.chain(add).chain(remove).collect();
        if !all.is_empty() {
            words.push(format!("  {way} headers: {}", all.join(", ")));
        }
    };
    headers("request", &a.request_headers, &mut words);
    headers("response", &a.response_headers, &mut words);
    let path = |p: &PathModifier| match p {
        PathModifier::ReplaceFullPath(v) => format!("path {v}"),
        PathModifier::ReplacePrefixMatch(v) => format!("matched prefix → {v}"),
    };
    if let Some(r) = &a.redirect {
        let mut parts = vec![format!("{}", r.status)];
        parts.extend(r.scheme.iter().map(|s| format!("scheme {s}")));
        parts.extend(r.hostname.iter().map(|h| format!("host {h}")));
        parts.extend(r.port.iter().map(|p| format!("port {p}")));
        parts.extend(r.path.iter().map(path));
        words.push(format!(
            "  redirect ({}): nothing is sent (gRPC clients fail these calls: they follow no redirect)",
            parts.join(", ")
        ));
    }
    if let Some(r) = &a.rewrite {
        let mut parts: Vec<String> = r.hostname.iter().map(|h| format!("host {h}")).collect();
        parts.extend(r.path.iter().map(path));
        words.push(format!("  rewritten: {}", parts.join(", ")));
    }
    for m in &a.mirrors {
        let share = m.fraction.map_or_else(
            || "every request".to_owned(),
            |(n, d)| {
                format!(
                    "{:.1}% of requests",
                    100.0 * f64::from(n) / f64::from(d.max(1))
                )
            },
        );
        words.push(format!(
            "  mirrored ({share}) to {}:{}",
            m.backend.service, m.backend.port
        ));
    }
    words
}

fn match_text(m: &meridian_core::route::Match) -> String {
    let mut parts = vec![match &m.path {
        None => "every path".to_owned(),
        Some(PathMatch::Exact(p)) => format!("path = {p}"),
        Some(PathMatch::Prefix(p)) => format!("path prefix {p}"),
        Some(PathMatch::Regex(r)) => format!("path ~ {r}"),
    }];
    let value = |what: &str, v: &ValueMatch| {
        let op = if v.regex { "~" } else { "=" };
        format!("{what} {} {op} {}", v.name, v.value)
    };
    parts.extend(m.headers.iter().map(|h| value("header", h)));
    parts.extend(m.query.iter().map(|q| value("query", q)));
    if let Some(method) = &m.method {
        parts.push(format!("method {method}"));
    }
    parts.join(", ")
}
