//! Gateway API routes over fleet services: HTTPRoutes and GRPCRoutes whose parent is a Service
//! (GAMMA — the route applies to every client of that service), with Services and
//! ServiceImports of the fleet as backends.
//!
//! ```text
//!  sources ──convert──► Route, ReferenceGrant ──Event::Routes──► Fleet
//!  RouteTable::resolve(routes, grants, the fleet's service ports)
//!     ─► per parent service port: the matches of every accepted rule, in the spec's precedence
//!        order, each with its backends resolved to fleet service ports and weights
//!     ─► per route and parent: Accepted and ResolvedRefs, with the spec's reasons
//!  xds/ encodes the table as RDS for that port's proxyless clients; `explain` reads it
//! ```
//!
//! Sources convert the upstream kinds (a GRPCRoute's method match becomes a path match, as
//! gRPC sends `/service/method`), so everything here is one model for both kinds. An invalid
//! route rejects itself only: the others on the same parent keep serving.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::model::ObjectKey;
use crate::problem::{ObjectRef, Origin, Problem, Source, clip};

mod filter;

pub use filter::{Actions, Filter, HeaderEdits, Mirror, MirrorTo, PathModifier, Redirect, Rewrite};

/// The Gateway API group.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// The MCS API group (ServiceImport backends).
pub const MCS_GROUP: &str = "multicluster.x-k8s.io";
/// The longest regular expression a route may hold: a pattern is compiled by every client.
pub const MAX_REGEX_BYTES: usize = 1024;

/// Which Gateway API kind a route was written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum RouteKind {
    #[serde(rename = "HTTPRoute")]
    Http,
    #[serde(rename = "GRPCRoute")]
    Grpc,
}

impl RouteKind {
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
        }
    }
}

impl fmt::Display for RouteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A route: which parents it attaches to and its rules.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub kind: RouteKind,
    pub key: ObjectKey,
    /// `metadata.creationTimestamp` in seconds: the older route wins a precedence tie.
    pub created: Option<i64>,
    /// `metadata.generation`, for the status's `observedGeneration`.
    pub generation: Option<i64>,
    pub parents: Vec<ParentRef>,
    pub rules: Vec<Rule>,
    /// Where it was read, for its problems.
    pub source: Source,
}

/// A `parentRef`, with the namespace defaulted to the route's.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ParentRef {
    pub group: String,
    pub kind: String,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port: Option<u16>,
}

impl ParentRef {
    fn is_service(&self) -> bool {
        is_core(&self.group) && self.kind == "Service"
    }

    fn is_gateway(&self) -> bool {
        self.group == GATEWAY_GROUP && self.kind == "Gateway"
    }
}

impl fmt::Display for ParentRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)?;
        if let Some(port) = self.port {
            write!(f, " port {port}")?;
        }
        Ok(())
    }
}

/// One rule of a route.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rule {
    pub name: Option<String>,
    /// Empty: every request.
    pub matches: Vec<Match>,
    pub backends: Vec<BackendRef>,
    /// The whole request's deadline (`timeouts.request`).
    pub timeout: Option<Duration>,
    pub retry: Option<Retry>,
    /// In the order written (a filter meridian does not apply rejects the rule: the spec
    /// forbids ignoring one).
    pub filters: Vec<Filter>,
}

/// One match: every condition must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Match {
    /// None: every path (a prefix of `/`).
    pub path: Option<PathMatch>,
    pub headers: Vec<ValueMatch>,
    pub query: Vec<ValueMatch>,
    pub method: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "value")]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
}

/// A header or query parameter that must equal a value or match a regular expression.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ValueMatch {
    pub name: String,
    pub value: String,
    pub regex: bool,
}

/// A `backendRef`, with the namespace defaulted to the route's and the weight to 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendRef {
    pub group: String,
    pub kind: String,
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    pub port: Option<u16>,
    pub weight: u32,
}

impl fmt::Display for BackendRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// Retries of a rule (HTTPRoute `retry`): how many, on which HTTP status codes (a gRPC
/// client maps them to its status codes: 503, 502, 504 and 429 are UNAVAILABLE, 500 INTERNAL).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Retry {
    pub attempts: u32,
    pub codes: Vec<u16>,
    pub backoff: Option<Duration>,
}

/// A ReferenceGrant: routes of the `from` namespaces may name the `to` objects of the
/// grant's own namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceGrant {
    pub key: ObjectKey,
    pub from: Vec<GrantFrom>,
    pub to: Vec<GrantTo>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantFrom {
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantTo {
    pub group: String,
    pub kind: String,
    /// None: every object of that kind in the namespace.
    pub name: Option<String>,
}

impl ReferenceGrant {
    /// Whether this grant lets a `kind` route of `from_ns` name `to`.
    fn permits(&self, kind: RouteKind, from_ns: &str, to: &BackendRef) -> bool {
        *self.key.namespace == *to.namespace
            && self.from.iter().any(|f| {
                f.group == GATEWAY_GROUP && f.kind == kind.name() && f.namespace == from_ns
            })
            && self.to.iter().any(|t| {
                same_group(&t.group, &to.group)
                    && t.kind == to.kind
                    && t.name.as_deref().is_none_or(|n| n == &*to.name)
            })
    }
}

/// "" and "core" both name the core API group.
fn is_core(group: &str) -> bool {
    group.is_empty() || group == "core"
}

fn same_group(a: &str, b: &str) -> bool {
    a == b || is_core(a) && is_core(b)
}

/// A condition of a route's status for one parent, as the spec names them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Condition {
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Condition {
    fn yes(reason: &'static str) -> Self {
        Self {
            status: true,
            reason,
            message: String::new(),
        }
    }

    fn no(reason: &'static str, message: String) -> Self {
        Self {
            status: false,
            reason,
            message,
        }
    }
}

/// A route's status for one of its parents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentStatus {
    pub parent: ParentRef,
    pub accepted: Condition,
    pub resolved_refs: Condition,
}

/// A route's status: for each of its parents that is meridian's, the conditions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// The generation these conditions were decided from.
    pub observed_generation: Option<i64>,
    /// Read from a Kubernetes hub (its status is written there).
    pub from_api: bool,
    pub parents: Vec<ParentStatus>,
}

/// A backend as the fleet resolved it: a fleet service port and its share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Backend {
    pub service: ObjectKey,
    pub port: u16,
    pub weight: u32,
}

/// One match of an accepted rule on one parent port, with what it does.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Attached {
    pub kind: RouteKind,
    pub route: ObjectKey,
    /// Index of the rule in the route, and its name if it has one.
    pub rule: usize,
    pub rule_name: Option<String>,
    #[serde(rename = "match")]
    pub matches: Match,
    /// The resolvable backends.
    pub backends: Vec<Backend>,
    /// The summed weight of the backends that did not resolve: their share of requests fails
    /// (a 500, as the spec says), beside the others'.
    pub failing: u32,
    pub timeout: Option<Duration>,
    pub retry: Option<Retry>,
    /// What its filters do (headers, a redirect, a rewrite, mirrors).
    #[serde(skip_serializing_if = "Actions::is_empty")]
    pub actions: Actions,
}

impl Attached {
    /// Whether every request this match takes fails: it redirects nowhere and has no
    /// resolvable backend with a weight.
    pub fn fails(&self) -> bool {
        self.actions.redirect.is_none() && self.backends.iter().all(|b| b.weight == 0)
    }

    /// The share of this match's requests that fail, in percent: those the weights send to
    /// backends that did not resolve (all of them when none resolved).
    pub fn failing_percent(&self) -> f64 {
        if self.fails() {
            return 100.0;
        }
        let resolved: u64 = self.backends.iter().map(|b| u64::from(b.weight)).sum();
        let failing = u64::from(self.failing);
        if failing == 0 {
            return 0.0; // a redirect has no backends at all
        }
        failing as f64 * 100.0 / (resolved + failing) as f64
    }
}

/// What the routes decide, for the whole fleet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteTable {
    /// Per parent service port, the matches in precedence order (first match wins).
    by_parent: BTreeMap<(ObjectKey, u16), Arc<[Attached]>>,
    /// Per route, its status for each parent it names that is meridian's (a Service).
    pub statuses: BTreeMap<(RouteKind, ObjectKey), RouteStatus>,
    /// Routes that failed for some parent, as problems (`/debug/problems`, `validate`).
    pub problems: Vec<Problem>,
    /// Parents meridian does not serve (a Gateway of another implementation), as warnings.
    pub warnings: Vec<Problem>,
    /// Every service the routes named (parents and backends) and what the fleet said of it
    /// then (its ports; None: no such service): the table holds until one of these changes.
    seen: BTreeMap<ObjectKey, Option<Vec<u16>>>,
}

impl RouteTable {
    /// The matches that apply to clients of `service` port `port`, in precedence order;
    /// None when no route attaches to it (clients get the service itself).
    pub fn for_port(&self, service: &ObjectKey, port: u16) -> Option<&Arc<[Attached]>> {
        self.by_parent.get(&(service.clone(), port))
    }

    /// The parent services whose matches differ between `self` and `other` (on some port,
    /// in either table): what a client of any other service receives is the same under both.
    pub fn services_rerouted(&self, other: &RouteTable) -> Vec<ObjectKey> {
        let mut rerouted: Vec<ObjectKey> = Vec::new();
        let mut note = |key: &ObjectKey| {
            if rerouted.last() != Some(key) {
                rerouted.push(key.clone());
            }
        };
        let (mut a, mut b) = (
            self.by_parent.iter().peekable(),
            other.by_parent.iter().peekable(),
        );
        loop {
            match (a.peek(), b.peek()) {
                (Some((ka, va)), Some((kb, vb))) if ka == kb => {
                    if !Arc::ptr_eq(va, vb) && va != vb {
                        note(&ka.0);
                    }
                    a.next();
                    b.next();
                }
                (Some((ka, _)), Some((kb, _))) if ka < kb => {
                    note(&ka.0);
                    a.next();
                }
                (_, Some((kb, _))) => {
                    note(&kb.0);
                    b.next();
                }
                (Some((ka, _)), None) => {
                    note(&ka.0);
                    a.next();
                }
                (None, None) => break,
            }
        }
        rerouted.dedup();
        rerouted
    }

    /// Every parent port with routes.
    pub fn parents(&self) -> impl Iterator<Item = (&ObjectKey, u16, &Arc<[Attached]>)> {
        self.by_parent.iter().map(|((k, p), a)| (k, *p, a))
    }

    /// Whether the table was resolved against something else than `ports` for `service` (a
    /// service the routes name appeared, left, or changed its ports): resolve again. An
    /// endpoint change leaves the ports as they were, and costs no resolution.
    pub fn stale(&self, service: &ObjectKey, ports: Option<Vec<u16>>) -> bool {
        self.seen.get(service).is_some_and(|seen| *seen != ports)
    }

    /// Resolves `routes` against the fleet: `ports_of` gives a fleet service's port numbers
    /// (None: the fleet has no such service).
    pub fn resolve(
        routes: &[Route],
        grants: &[ReferenceGrant],
        ports_of: impl Fn(&ObjectKey) -> Option<Vec<u16>>,
    ) -> Self {
        let seen = std::cell::RefCell::new(BTreeMap::new());
        let ports_of = |key: &ObjectKey| {
            let ports = ports_of(key);
            seen.borrow_mut().insert(key.clone(), ports.clone());
            ports
        };
        let mut table = RouteTable::default();
        let mut by_parent: BTreeMap<(ObjectKey, u16), Vec<(SortKey, Attached)>> = BTreeMap::new();
        for route in routes {
            let mut statuses = Vec::new();
            for parent in &route.parents {
                if !parent.is_service() {
                    table.warnings.push(route_problem(
                        route,
                        if parent.is_gateway() {
                            format!("parent {parent}: meridian serves routes whose parent is a Service; Gateways are not served yet, so this parent is left to its own implementation")
                        } else {
                            format!("parent {parent}: meridian serves routes whose parent is a Service; this parent is not meridian's")
                        },
                    ));
                    continue;
                }
                let status = attach(route, parent, grants, &ports_of, &mut by_parent);
                for (kind, condition) in [
                    ("Accepted", &status.accepted),
                    ("ResolvedRefs", &status.resolved_refs),
                ] {
                    if !condition.status {
                        table.problems.push(route_problem(
                            route,
                            format!(
                                "parent {parent}: {kind}=False ({}): {}",
                                condition.reason, condition.message
                            ),
                        ));
                    }
                }
                statuses.push(status);
            }
            if !statuses.is_empty() {
                table.statuses.insert(
                    (route.kind, route.key.clone()),
                    RouteStatus {
                        observed_generation: route.generation,
                        from_api: route.source == Source::Api,
                        parents: statuses,
                    },
                );
            }
        }
        table.seen = seen.into_inner();
        table.by_parent = by_parent
            .into_iter()
            .map(|(parent, mut matches)| {
                matches.sort_by(|a, b| a.0.cmp(&b.0));
                (parent, matches.into_iter().map(|(_, a)| a).collect())
            })
            .collect();
        table
    }
}

fn route_problem(route: &Route, reason: String) -> Problem {
    Problem {
        origin: Origin::Hub,
        subject: ObjectRef::namespaced(route.kind.name(), &route.key).into(),
        source: route.source.clone(),
        reason: clip(reason),
    }
}

/// Checks `route` against one Service parent and, when accepted, adds its matches to every
/// port of that parent it attaches to.
fn attach(
    route: &Route,
    parent: &ParentRef,
    grants: &[ReferenceGrant],
    ports_of: &impl Fn(&ObjectKey) -> Option<Vec<u16>>,
    by_parent: &mut BTreeMap<(ObjectKey, u16), Vec<(SortKey, Attached)>>,
) -> ParentStatus {
    let service = ObjectKey {
        namespace: parent.namespace.clone(),
        name: parent.name.clone(),
    };
    let (ports, accepted) = accept(route, parent, &service, ports_of);
    let mut rules = Vec::new();
    let mut unresolved = Vec::new();
    for rule in &route.rules {
        let mut backends = Vec::new();
        let mut failing = 0u32;
        for backend in &rule.backends {
            match resolve_backend(route, backend, grants, ports_of) {
                Ok(b) => backends.push(b),
                Err((reason, message)) => {
                    failing = failing.saturating_add(backend.weight);
                    unresolved.push((reason, message));
                }
            }
        }
        let (actions, mirrors_unresolved) = filter::actions(rule, |backend| {
            resolve_backend(route, backend, grants, ports_of)
                .map_err(|(reason, message)| (reason, format!("mirror {message}")))
        });
        unresolved.extend(mirrors_unresolved);
        rules.push((backends, failing, actions));
    }
    let resolved_refs = match unresolved.first() {
        None => Condition::yes("ResolvedRefs"),
        Some((reason, _)) => Condition::no(
            reason,
            unresolved
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    if accepted.status {
        for port in ports {
            let attached = by_parent.entry((service.clone(), port)).or_default();
            for (index, (rule, (backends, failing, actions))) in
                route.rules.iter().zip(&rules).enumerate()
            {
                let every = [Match::default()];
                let matches = if rule.matches.is_empty() {
                    &every[..]
                } else {
                    &rule.matches
                };
                for (nth, m) in matches.iter().enumerate() {
                    attached.push((
                        SortKey::of(route, m, index, nth),
                        Attached {
                            kind: route.kind,
                            route: route.key.clone(),
                            rule: index,
                            rule_name: rule.name.clone(),
                            matches: m.clone(),
                            backends: backends.clone(),
                            failing: *failing,
                            timeout: rule.timeout,
                            retry: rule.retry.clone(),
                            actions: actions.clone(),
                        },
                    ));
                }
            }
        }
    }
    ParentStatus {
        parent: parent.clone(),
        accepted,
        resolved_refs,
    }
}

/// Whether `route` may attach to Service `service`, and to which of its ports.
fn accept(
    route: &Route,
    parent: &ParentRef,
    service: &ObjectKey,
    ports_of: &impl Fn(&ObjectKey) -> Option<Vec<u16>>,
) -> (Vec<u16>, Condition) {
    if parent.namespace != route.key.namespace {
        return (
            Vec::new(),
            Condition::no(
                "UnsupportedValue",
                format!(
                    "a route in namespace {} for a Service of namespace {} is a consumer route; meridian serves producer routes only (the route in the Service's namespace), as its proxyless clients carry no namespace",
                    route.key.namespace, parent.namespace
                ),
            ),
        );
    }
    let Some(ports) = ports_of(service) else {
        return (
            Vec::new(),
            Condition::no(
                "NoMatchingParent",
                format!("no member cluster exports Service {service}"),
            ),
        );
    };
    let ports = match parent.port {
        None => ports,
        Some(p) if ports.contains(&p) => vec![p],
        Some(p) => {
            return (
                Vec::new(),
                Condition::no(
                    "NoMatchingParent",
                    format!("Service {service} has no port {p}"),
                ),
            );
        }
    };
    if let Some(problem) = route.rules.iter().find_map(rule_unsupported) {
        return (Vec::new(), Condition::no("UnsupportedValue", problem));
    }
    (ports, Condition::yes("Accepted"))
}

/// Why a rule cannot be served as written, if it cannot.
fn rule_unsupported(rule: &Rule) -> Option<String> {
    let named = |r: &Rule| {
        r.name
            .as_deref()
            .map_or_else(String::new, |n| format!("rule {n}: "))
    };
    if let Some(problem) = filter::unsupported(rule) {
        return Some(format!("{}{problem}", named(rule)));
    }
    for m in &rule.matches {
        let patterns = m
            .path
            .iter()
            .filter_map(|p| match p {
                PathMatch::Regex(r) => Some(r.as_str()),
                _ => None,
            })
            .chain(
                m.headers
                    .iter()
                    .chain(&m.query)
                    .filter(|v| v.regex)
                    .map(|v| v.value.as_str()),
            );
        for pattern in patterns {
            if let Err(e) = check_regex(pattern) {
                return Some(format!("{}{e}", named(rule)));
            }
        }
    }
    None
}

/// A pattern every client compiles: bounded, and in the syntax RE2 (Envoy, gRPC) shares.
fn check_regex(pattern: &str) -> Result<(), String> {
    if pattern.len() > MAX_REGEX_BYTES {
        return Err(format!(
            "a regular expression of {} bytes (at most {MAX_REGEX_BYTES})",
            pattern.len()
        ));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map(drop)
        .map_err(|e| {
            let first = e.to_string();
            let first = first.lines().last().unwrap_or_default().trim().to_owned();
            format!("invalid regular expression {pattern:?}: {first}")
        })
}

/// A backend resolved to a fleet service port, or the spec's reason it is not.
fn resolve_backend(
    route: &Route,
    backend: &BackendRef,
    grants: &[ReferenceGrant],
    ports_of: &impl Fn(&ObjectKey) -> Option<Vec<u16>>,
) -> Result<Backend, (&'static str, String)> {
    let service_kind = is_core(&backend.group) && backend.kind == "Service";
    let import_kind = backend.group == MCS_GROUP && backend.kind == "ServiceImport";
    if !service_kind && !import_kind {
        return Err((
            "InvalidKind",
            format!(
                "backend {backend}: group {:?} kind {} is neither a Service nor a ServiceImport",
                backend.group, backend.kind
            ),
        ));
    }
    if *backend.namespace != *route.key.namespace
        && !grants
            .iter()
            .any(|g| g.permits(route.kind, &route.key.namespace, backend))
    {
        return Err((
            "RefNotPermitted",
            format!(
                "backend {backend}: no ReferenceGrant in namespace {} lets {}s of namespace {} name it",
                backend.namespace, route.kind, route.key.namespace
            ),
        ));
    }
    let service = ObjectKey {
        namespace: backend.namespace.clone(),
        name: backend.name.clone(),
    };
    let Some(ports) = ports_of(&service) else {
        return Err((
            "BackendNotFound",
            format!("backend {backend}: no member cluster exports {service}"),
        ));
    };
    let port = match backend.port {
        Some(p) if ports.contains(&p) => p,
        Some(p) => {
            return Err((
                "BackendNotFound",
                format!("backend {backend}: {service} has no port {p}"),
            ));
        }
        None if ports.len() == 1 => ports[0],
        None => {
            return Err((
                "BackendNotFound",
                format!(
                    "backend {backend}: {service} has {} ports; name one",
                    ports.len()
                ),
            ));
        }
    };
    Ok(Backend {
        service,
        port,
        weight: backend.weight,
    })
}

/// The spec's precedence between matches: an exact path, then the longest prefix, then a
/// method, then the most headers, then the most query parameters; ties go to the oldest
/// route, then by namespace and name, then by rule and match order. A regular expression
/// path (its precedence is the implementation's) comes after every prefix.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SortKey {
    path_rank: u8,
    /// Longer prefixes first.
    prefix_len: std::cmp::Reverse<usize>,
    no_method: bool,
    headers: std::cmp::Reverse<usize>,
    query: std::cmp::Reverse<usize>,
    created: (bool, i64),
    route: ObjectKey,
    rule: usize,
    nth: usize,
}

impl SortKey {
    fn of(route: &Route, m: &Match, rule: usize, nth: usize) -> Self {
        let (path_rank, prefix_len) = match &m.path {
            Some(PathMatch::Exact(_)) => (0, 0),
            Some(PathMatch::Prefix(p)) => (1, p.len()),
            None => (1, 1),
            Some(PathMatch::Regex(_)) => (2, 0),
        };
        Self {
            path_rank,
            prefix_len: std::cmp::Reverse(prefix_len),
            no_method: m.method.is_none(),
            headers: std::cmp::Reverse(m.headers.len()),
            query: std::cmp::Reverse(m.query.len()),
            created: (route.created.is_none(), route.created.unwrap_or_default()),
            route: route.key.clone(),
            rule,
            nth,
        }
    }
}

#[cfg(test)]
mod tests;
