//! Gateway API kinds as meridian reads them — HTTPRoute and GRPCRoute (`v1`) and
//! ReferenceGrant (`v1beta1`), the standard channel's fields plus HTTPRoute's `retry` — and
//! their conversion into core's one route model (`meridian_core::route`).
//!
//! The types are the upstream CRDs' shape, not meridian's: meridian never generates or
//! installs these CRDs (they come from `sigs.k8s.io/gateway-api`). A GRPCRoute's method match
//! becomes a path match here (`/service/method`, as gRPC sends it), so core and xDS see one
//! kind of route. The spec's size limits (16 rules, 64 matches, 16 backends, 16 headers) are
//! enforced here, as the API server's validation would.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use meridian_core::ObjectKey;
use meridian_core::problem::Source;
use meridian_core::route::{
    self, BackendRef, GATEWAY_GROUP, GrantFrom, GrantTo, Match, ParentRef, PathMatch, Retry, Route,
    RouteKind, Rule, ValueMatch,
};
use serde::{Deserialize, Serialize};

mod filters;

pub use filters::{FilterSpec, HeaderModifierSpec, HeaderSpec, MirrorSpec, PathModifierSpec};

const MAX_RULES: usize = 16;
const MAX_MATCHES: usize = 64;
const MAX_BACKENDS: usize = 16;
const MAX_VALUES: usize = 16;
const MAX_PARENTS: usize = 32;

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "HTTPRoute",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentReference>,
    #[serde(default)]
    pub hostnames: Vec<String>,
    #[serde(default)]
    pub rules: Vec<HTTPRouteRule>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "GRPCRoute",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct GRPCRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentReference>,
    #[serde(default)]
    pub hostnames: Vec<String>,
    #[serde(default)]
    pub rules: Vec<GRPCRouteRule>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1beta1",
    kind = "ReferenceGrant",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<ReferenceGrantFrom>,
    #[serde(default)]
    pub to: Vec<ReferenceGrantTo>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantFrom {
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantTo {
    pub group: String,
    pub kind: String,
    pub name: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub section_name: Option<String>,
    pub port: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackendReference {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub port: Option<i32>,
    pub weight: Option<i32>,
    #[serde(default)]
    pub filters: Vec<FilterSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteRule {
    pub name: Option<String>,
    #[serde(default)]
    pub matches: Vec<HTTPRouteMatch>,
    #[serde(default)]
    pub filters: Vec<FilterSpec>,
    #[serde(default)]
    pub backend_refs: Vec<BackendReference>,
    pub timeouts: Option<HTTPRouteTimeouts>,
    pub retry: Option<HTTPRouteRetry>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteMatch {
    pub path: Option<HTTPPathMatch>,
    #[serde(default)]
    pub headers: Vec<ValueMatchSpec>,
    #[serde(default)]
    pub query_params: Vec<ValueMatchSpec>,
    pub method: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPPathMatch {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub value: Option<String>,
}

/// A header or query parameter match (`type` Exact, the default, or RegularExpression).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValueMatchSpec {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteTimeouts {
    pub request: Option<String>,
    pub backend_request: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteRetry {
    #[serde(default)]
    pub codes: Vec<i32>,
    pub attempts: Option<i32>,
    pub backoff: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GRPCRouteRule {
    pub name: Option<String>,
    #[serde(default)]
    pub matches: Vec<GRPCRouteMatch>,
    #[serde(default)]
    pub filters: Vec<FilterSpec>,
    #[serde(default)]
    pub backend_refs: Vec<BackendReference>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GRPCRouteMatch {
    pub method: Option<GRPCMethodMatch>,
    #[serde(default)]
    pub headers: Vec<ValueMatchSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GRPCMethodMatch {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub service: Option<String>,
    pub method: Option<String>,
}

/// An HTTPRoute as core's route.
pub fn http_route(r: &HTTPRoute, source: Source) -> Result<Route, String> {
    route_of(
        RouteKind::Http,
        &r.metadata,
        &r.spec.parent_refs,
        &r.spec.rules,
        http_rule,
        source,
    )
}

/// A GRPCRoute as core's route.
pub fn grpc_route(r: &GRPCRoute, source: Source) -> Result<Route, String> {
    route_of(
        RouteKind::Grpc,
        &r.metadata,
        &r.spec.parent_refs,
        &r.spec.rules,
        grpc_rule,
        source,
    )
}

/// What both kinds share: the key, the parents and the bounded rules, each converted by `rule`.
fn route_of<R>(
    kind: RouteKind,
    meta: &ObjectMeta,
    parent_refs: &[ParentReference],
    rules: &[R],
    rule: fn(&R, &ObjectKey) -> Result<Rule, String>,
    source: Source,
) -> Result<Route, String> {
    let key = key_of(meta)?;
    let parents = parents(parent_refs, &key)?;
    bounded("rules", rules.len(), MAX_RULES)?;
    let rules = rules
        .iter()
        .enumerate()
        .map(|(i, r)| rule(r, &key).map_err(|e| format!("rules[{i}]: {e}")))
        .collect::<Result<_, _>>()?;
    Ok(Route {
        kind,
        created: created(meta),
        generation: meta.generation,
        key,
        parents,
        rules,
        source,
    })
}

/// A ReferenceGrant as core's.
pub fn reference_grant(g: &ReferenceGrant) -> Result<route::ReferenceGrant, String> {
    Ok(route::ReferenceGrant {
        key: key_of(&g.metadata)?,
        from: g
            .spec
            .from
            .iter()
            .map(|f| GrantFrom {
                group: f.group.clone(),
                kind: f.kind.clone(),
                namespace: f.namespace.clone(),
            })
            .collect(),
        to: g
            .spec
            .to
            .iter()
            .map(|t| GrantTo {
                group: t.group.clone(),
                kind: t.kind.clone(),
                name: t.name.clone(),
            })
            .collect(),
    })
}

fn key_of(meta: &ObjectMeta) -> Result<ObjectKey, String> {
    let name = meta.name.as_deref().ok_or("metadata.name is required")?;
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    Ok(ObjectKey::new(namespace, name))
}

fn created(meta: &ObjectMeta) -> Option<i64> {
    meta.creation_timestamp.as_ref().map(|t| t.0.as_second())
}

fn bounded(what: &str, n: usize, max: usize) -> Result<(), String> {
    if n > max {
        return Err(format!("{n} {what} (the Gateway API allows at most {max})"));
    }
    Ok(())
}

fn port_of(port: Option<i32>, what: &str) -> Result<Option<u16>, String> {
    port.map(|p| {
        u16::try_from(p)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{what} port {p} is not a port (1-65535)"))
    })
    .transpose()
}

fn parents(refs: &[ParentReference], route: &ObjectKey) -> Result<Vec<ParentRef>, String> {
    bounded("parentRefs", refs.len(), MAX_PARENTS)?;
    refs.iter()
        .map(|p| {
            Ok(ParentRef {
                group: p.group.clone().unwrap_or_else(|| GATEWAY_GROUP.to_owned()),
                kind: p.kind.clone().unwrap_or_else(|| "Gateway".to_owned()),
                namespace: p
                    .namespace
                    .as_deref()
                    .map_or_else(|| route.namespace.clone(), Arc::from),
                name: Arc::from(p.name.as_str()),
                port: port_of(p.port, "parentRef")?,
            })
        })
        .collect()
}

fn backends(refs: &[BackendReference], route: &ObjectKey) -> Result<Vec<BackendRef>, String> {
    bounded("backendRefs", refs.len(), MAX_BACKENDS)?;
    refs.iter()
        .map(|b| {
            let weight = b.weight.unwrap_or(1);
            let weight = u32::try_from(weight)
                .ok()
                .filter(|w| *w <= 1_000_000)
                .ok_or_else(|| {
                    format!(
                        "backendRef {}: weight {weight} is outside 0-1000000",
                        b.name
                    )
                })?;
            Ok(BackendRef {
                group: b.group.clone().unwrap_or_default(),
                kind: b.kind.clone().unwrap_or_else(|| "Service".to_owned()),
                namespace: b
                    .namespace
                    .as_deref()
                    .map_or_else(|| route.namespace.clone(), Arc::from),
                name: Arc::from(b.name.as_str()),
                port: port_of(b.port, "backendRef")?,
                weight,
            })
        })
        .collect()
}

fn http_rule(rule: &HTTPRouteRule, route: &ObjectKey) -> Result<Rule, String> {
    bounded("matches", rule.matches.len(), MAX_MATCHES)?;
    let matches = rule
        .matches
        .iter()
        .map(http_match)
        .collect::<Result<_, _>>()?;
    let timeout = rule
        .timeouts
        .as_ref()
        .and_then(|t| t.request.as_deref().or(t.backend_request.as_deref()))
        .map(|d| duration(d).map_err(|e| format!("timeouts: {e}")))
        .transpose()?
        // "0s" is the spec's "no timeout".
        .filter(|d| !d.is_zero());
    Ok(Rule {
        name: rule.name.clone(),
        matches,
        backends: backends(&rule.backend_refs, route)?,
        timeout,
        retry: rule.retry.as_ref().map(retry).transpose()?,
        filters: filters::filters(&rule.filters, &rule.backend_refs, route, false)?,
    })
}

fn http_match(m: &HTTPRouteMatch) -> Result<Match, String> {
    let path = match &m.path {
        None => None,
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".to_owned());
            if !value.starts_with('/') && p.kind.as_deref() != Some("RegularExpression") {
                return Err(format!("path {value:?} must start with /"));
            }
            Some(match p.kind.as_deref().unwrap_or("PathPrefix") {
                "Exact" => PathMatch::Exact(value),
                "PathPrefix" => PathMatch::Prefix(value),
                "RegularExpression" => PathMatch::Regex(value),
                other => {
                    return Err(format!(
                        "path type {other:?} is not Exact, PathPrefix or RegularExpression"
                    ));
                }
            })
        }
    };
    Ok(Match {
        path,
        headers: values("headers", &m.headers)?,
        query: values("queryParams", &m.query_params)?,
        method: m.method.clone(),
    })
}

fn values(what: &str, specs: &[ValueMatchSpec]) -> Result<Vec<ValueMatch>, String> {
    bounded(what, specs.len(), MAX_VALUES)?;
    specs
        .iter()
        .map(|v| {
            let regex = match v.kind.as_deref().unwrap_or("Exact") {
                "Exact" => false,
                "RegularExpression" => true,
                other => {
                    return Err(format!(
                        "{what} {}: type {other:?} is not Exact or RegularExpression",
                        v.name
                    ));
                }
            };
            if v.name.is_empty() {
                return Err(format!("{what}: a match needs a name"));
            }
            Ok(ValueMatch {
                name: v.name.clone(),
                value: v.value.clone(),
                regex,
            })
        })
        .collect()
}

fn retry(r: &HTTPRouteRetry) -> Result<Retry, String> {
    let attempts = r.attempts.unwrap_or(1);
    let attempts = u32::try_from(attempts)
        .ok()
        .filter(|a| *a <= 10)
        .ok_or_else(|| format!("retry: attempts {attempts} is outside 0-10"))?;
    let codes = r
        .codes
        .iter()
        .map(|c| {
            u16::try_from(*c)
                .ok()
                .filter(|c| (400..600).contains(c))
                .ok_or_else(|| format!("retry: code {c} is not an HTTP error status"))
        })
        .collect::<Result<_, _>>()?;
    Ok(Retry {
        attempts,
        codes,
        backoff: r
            .backoff
            .as_deref()
            .map(|b| duration(b).map_err(|e| format!("retry backoff: {e}")))
            .transpose()?,
    })
}

fn grpc_rule(rule: &GRPCRouteRule, route: &ObjectKey) -> Result<Rule, String> {
    bounded("matches", rule.matches.len(), MAX_MATCHES)?;
    let matches = rule
        .matches
        .iter()
        .map(|m| {
            Ok(Match {
                path: m.method.as_ref().map(method_path).transpose()?,
                headers: values("headers", &m.headers)?,
                ..Match::default()
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(Rule {
        name: rule.name.clone(),
        matches,
        backends: backends(&rule.backend_refs, route)?,
        timeout: None,
        retry: None,
        filters: filters::filters(&rule.filters, &rule.backend_refs, route, true)?,
    })
}

/// A gRPC method match as the path gRPC sends (`/package.Service/Method`).
fn method_path(m: &GRPCMethodMatch) -> Result<PathMatch, String> {
    let service = m.service.as_deref().filter(|s| !s.is_empty());
    let method = m.method.as_deref().filter(|s| !s.is_empty());
    match m.kind.as_deref().unwrap_or("Exact") {
        "Exact" => {
            for name in service.iter().chain(method.iter()) {
                if !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                {
                    return Err(format!(
                        "method match {name:?}: an Exact match names a service or method ([A-Za-z0-9_.])"
                    ));
                }
            }
            Ok(match (service, method) {
                (Some(s), Some(m)) => PathMatch::Exact(format!("/{s}/{m}")),
                (Some(s), None) => PathMatch::Prefix(format!("/{s}/")),
                (None, Some(m)) => PathMatch::Regex(format!("/[^/]+/{m}")),
                (None, None) => return Err("method match: service or method is required".into()),
            })
        }
        "RegularExpression" => Ok(PathMatch::Regex(format!(
            "/{}/{}",
            service.unwrap_or("[^/]+"),
            method.unwrap_or("[^/]+")
        ))),
        other => Err(format!(
            "method match type {other:?} is not Exact or RegularExpression"
        )),
    }
}

/// A Gateway API duration: up to four parts of 1-5 digits and a unit (h, m, s, ms), as
/// `1h30m` or `500ms`.
pub fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a Gateway API duration (e.g. 10s, 1m30s, 500ms)");
    let mut rest = text;
    let mut total = Duration::ZERO;
    let mut parts = 0;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else {
            return Err(bad());
        };
        rest = &rest[len..];
        total += unit * u32::try_from(n).map_err(|_| bad())?;
        parts += 1;
    }
    if parts == 0 || parts > 4 {
        return Err(bad());
    }
    Ok(total)
}

#[cfg(test)]
mod tests;
