//! One xDS stream as a state machine with no I/O: a request in → responses out, a
//! new view of the fleet in → responses out. The tonic services in `server` only move
//! messages; every protocol rule lives here and is unit-tested without a socket.
//!
//! Rules kept, per resource type:
//! - nothing is sent before the first synced view;
//! - a request whose nonce is not the last one sent for its type is stale: SotW ignores it
//!   (the next request repeats the full subscription), delta applies its subscription changes
//!   but not its ACK/NACK;
//! - a NACK keeps the client on its last accepted version, and the content it refused is never
//!   sent to it again (SotW: that response version; delta: that resource version);
//! - a SotW request that changes the subscription is answered at once, absent names left out;
//!   otherwise a response goes out only when the content for that client changed;
//! - empty `resource_names` on LDS/CDS is a wildcard subscription;
//! - a request for a type meridian does not serve (SDS, ECDS, a typo) is ignored, as
//!   go-control-plane does: no response, the stream stays open and the other types keep
//!   flowing. An empty SotW response would be worse: Envoy NACKs an SDS response without the
//!   secret it asked for, and for a wildcard type it means "delete everything". Ignored, the
//!   client's own `initial_fetch_timeout` lets it go on. The request shows in the stream's
//!   status (`unsupported`) and in an event for the metric;
//! - responses to one view are ordered CDS → EDS → LDS → RDS.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use xds_api::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as DeltaResource,
};

use crate::node::NodeInfo;
use crate::resources::{Kind, Resource, Resources};

/// Why a stream is ended; `server` maps these onto gRPC status codes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StreamError {
    #[error("the first request of a stream must carry a node")]
    MissingNode,
    #[error("a stream may subscribe to at most {limit} names of one type")]
    TooManyNames { limit: usize },
}

/// The names one stream may subscribe to per type: far above any real proxy's (an Envoy asks
/// for the clusters it routes to), and the bound on what a subscription can make one stream
/// hold and compute.
pub const MAX_NAMES_PER_TYPE: usize = 100_000;

/// What happened, for metrics and logs; the server turns these into counters.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The stream asked for this type for the first time.
    Subscribed {
        kind: Kind,
    },
    Ack {
        kind: Kind,
        latency: Duration,
    },
    Nack {
        kind: Kind,
        error: String,
    },
    StaleNonce {
        kind: Kind,
    },
    /// A request for a type meridian does not serve, ignored.
    Unsupported {
        /// The type URL if it is a well-known one, else "other" (a bounded label).
        label: &'static str,
        /// The type URL as sent, cut short.
        type_url: String,
        /// The first request of this type on the stream (worth a log line).
        first: bool,
    },
}

/// Type URLs meridian does not serve that a real client may ask for; anything else is
/// "other" in the metric, so clients cannot grow its label set.
const WELL_KNOWN_UNSUPPORTED: &[&str] = &[
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
    "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration",
    "type.googleapis.com/envoy.config.route.v3.VirtualHost",
    "type.googleapis.com/envoy.service.runtime.v3.Runtime",
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
    "type.googleapis.com/envoy.api.v2.Cluster",
    "type.googleapis.com/envoy.api.v2.ClusterLoadAssignment",
    "type.googleapis.com/envoy.api.v2.Listener",
    "type.googleapis.com/envoy.api.v2.RouteConfiguration",
    "type.googleapis.com/envoy.api.v2.auth.Secret",
];

/// The metric label of an unsupported type URL (pure; bounded).
pub fn unsupported_label(type_url: &str) -> &'static str {
    WELL_KNOWN_UNSUPPORTED
        .iter()
        .find(|known| **known == type_url)
        .copied()
        .unwrap_or("other")
}

/// Distinct unsupported types a stream remembers (each type URL cut to
/// [`TYPE_URL_LIMIT`] bytes); later ones are only counted.
const UNSUPPORTED_MEMORY: usize = 16;
const TYPE_URL_LIMIT: usize = 256;
/// Names remembered per unsupported type, for `/debug/xds`.
const UNSUPPORTED_NAMES: usize = 16;

/// Why a type gets no response, for `/debug/xds`.
pub const UNSUPPORTED_REASON: &str = "meridian serves CDS, EDS, LDS and RDS only; requests for this type are ignored (no response, as go-control-plane does) and the stream stays open";

/// Requests for one unsupported type on a stream.
#[derive(Debug, Default, Clone, Serialize)]
pub struct UnsupportedType {
    pub requests: u64,
    /// The first names asked for (at most [`UNSUPPORTED_NAMES`]).
    pub names: BTreeSet<String>,
    pub reason: &'static str,
}

/// How many refused versions (SotW) or resource versions (delta) a stream remembers per type.
const NACK_MEMORY: usize = 4096;
/// A NACK's error detail is kept for CSDS and `/debug/xds` up to this many bytes.
const ERROR_DETAIL_LIMIT: usize = 1024;

/// What the client has been told about one type and how it answered.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeStatus {
    /// Set once the client asked for this type.
    pub requested: bool,
    pub wildcard: bool,
    pub names: BTreeSet<String>,
    /// Version and nonce of the last response sent.
    pub sent_version: Option<String>,
    pub sent_nonce: Option<String>,
    /// Resources (name → version) in the last response, or the client's known set (delta).
    pub sent: BTreeMap<String, String>,
    pub acked_version: Option<String>,
    pub last_error: Option<String>,
    pub acks: u64,
    pub nacks: u64,
    #[serde(skip)]
    sent_at: Option<Instant>,
    #[serde(skip)]
    refused: Refused,
}

/// Content a client refused, oldest forgotten first once [`NACK_MEMORY`] is reached.
#[derive(Debug, Default, Clone)]
struct Refused {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl TypeStatus {
    fn remember_refused(&mut self, key: String) {
        let refused = &mut self.refused;
        if !refused.set.insert(key.clone()) {
            return;
        }
        refused.order.push_back(key);
        if refused.order.len() > NACK_MEMORY
            && let Some(oldest) = refused.order.pop_front()
        {
            refused.set.remove(&oldest);
        }
    }

    fn was_refused(&self, key: &str) -> bool {
        self.refused.set.contains(key)
    }
}

/// State shared by both protocols: the node, the latest view (served once it is synced), the
/// nonce counter and what each type was sent.
#[derive(Debug, Default)]
struct Common {
    node: Option<NodeInfo>,
    view: Option<Arc<Resources>>,
    nonce: u64,
    types: [TypeStatus; 4],
    /// Requests for types meridian does not serve, by type URL (bounded).
    unsupported: BTreeMap<String, UnsupportedType>,
    /// Unsupported requests beyond [`UNSUPPORTED_MEMORY`] distinct types.
    unsupported_other: u64,
}

impl Common {
    /// Checks the node (first request only) and the type URL: `None` for a type meridian
    /// does not serve, recorded and reported in `events`.
    fn admit<'n>(
        &mut self,
        node: Option<&xds_api::pb::envoy::config::core::v3::Node>,
        type_url: &str,
        names: impl Iterator<Item = &'n String>,
        events: &mut Vec<Event>,
    ) -> Result<Option<Kind>, StreamError> {
        if self.node.is_none() {
            let node = node.ok_or(StreamError::MissingNode)?;
            self.node = Some(NodeInfo::from_node(node.clone()));
        }
        if let Some(kind) = Kind::from_type_url(type_url) {
            return Ok(Some(kind));
        }
        let type_url = truncate(type_url, TYPE_URL_LIMIT);
        let first = !self.unsupported.contains_key(&type_url);
        if first && self.unsupported.len() >= UNSUPPORTED_MEMORY {
            self.unsupported_other += 1;
        } else {
            let entry =
                self.unsupported
                    .entry(type_url.clone())
                    .or_insert_with(|| UnsupportedType {
                        reason: UNSUPPORTED_REASON,
                        ..UnsupportedType::default()
                    });
            entry.requests += 1;
            for name in names {
                if entry.names.len() >= UNSUPPORTED_NAMES {
                    break;
                }
                entry.names.insert(truncate(name, TYPE_URL_LIMIT));
            }
        }
        events.push(Event::Unsupported {
            label: unsupported_label(&type_url),
            type_url,
            first,
        });
        Ok(None)
    }

    fn next_nonce(&mut self) -> String {
        self.nonce += 1;
        self.nonce.to_string()
    }

    /// Applies the ACK or NACK a request carries for the response it names.
    fn acknowledge(
        &mut self,
        kind: Kind,
        version_info: &str,
        error: Option<&str>,
        refused_keys: Vec<String>,
        now: Instant,
        events: &mut Vec<Event>,
    ) {
        let status = &mut self.types[kind.index()];
        match error {
            Some(message) => {
                status.nacks += 1;
                status.last_error = Some(truncate(message, ERROR_DETAIL_LIMIT));
                for key in refused_keys {
                    status.remember_refused(key);
                }
                events.push(Event::Nack {
                    kind,
                    error: truncate(message, ERROR_DETAIL_LIMIT),
                });
            }
            None => {
                status.acks += 1;
                status.acked_version = Some(version_info.to_owned());
                status.last_error = None;
                let latency = status
                    .sent_at
                    .take()
                    .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                events.push(Event::Ack { kind, latency });
            }
        }
    }

    pub(crate) fn view(&self) -> Option<&Resources> {
        self.view.as_deref().filter(|v| v.synced)
    }
}

fn truncate(s: &str, limit: usize) -> String {
    if s.len() <= limit {
        return s.to_owned();
    }
    let mut end = limit;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// What a stream reports to CSDS and `/debug/xds`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamStatus {
    pub node: Option<NodeInfo>,
    pub protocol: &'static str,
    pub snapshot_version: Option<u64>,
    pub types: BTreeMap<&'static str, TypeStatus>,
    /// Types asked for that meridian does not serve, and why they get no response.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unsupported: BTreeMap<String, UnsupportedType>,
    /// Requests for further unsupported types, beyond the ones listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub unsupported_other: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn status_of(common: &Common, protocol: &'static str) -> StreamStatus {
    StreamStatus {
        node: common.node.clone(),
        protocol,
        snapshot_version: common.view().map(|v| v.snapshot_version),
        types: Kind::ALL
            .into_iter()
            .filter(|k| common.types[k.index()].requested)
            .map(|k| (k.short(), common.types[k.index()].clone()))
            .collect(),
        unsupported: common.unsupported.clone(),
        unsupported_other: common.unsupported_other,
    }
}

/// Output of one step: responses to send, in order, and what happened.
#[derive(Debug, Default)]
pub struct Step<R> {
    pub responses: Vec<R>,
    pub events: Vec<Event>,
}

// ---------------------------------------------------------------------------------------
// State of the world
// ---------------------------------------------------------------------------------------

/// A `StreamAggregatedResources` stream.
#[derive(Debug, Default)]
pub struct SotwStream {
    common: Common,
}

impl SotwStream {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn node(&self) -> Option<&NodeInfo> {
        self.common.node.as_ref()
    }

    pub fn status(&self) -> StreamStatus {
        status_of(&self.common, "sotw")
    }

    pub fn on_request(
        &mut self,
        req: &DiscoveryRequest,
        now: Instant,
    ) -> Result<Step<DiscoveryResponse>, StreamError> {
        let mut step = Step::default();
        let Some(kind) = self.common.admit(
            req.node.as_ref(),
            &req.type_url,
            req.resource_names.iter(),
            &mut step.events,
        )?
        else {
            return Ok(step);
        };
        if req.resource_names.len() > MAX_NAMES_PER_TYPE {
            return Err(StreamError::TooManyNames {
                limit: MAX_NAMES_PER_TYPE,
            });
        }
        let status = &self.common.types[kind.index()];
        if !req.response_nonce.is_empty() {
            if status.sent_nonce.as_deref() != Some(req.response_nonce.as_str()) {
                step.events.push(Event::StaleNonce { kind });
                return Ok(step);
            }
            let error = req.error_detail.as_ref().map(|e| e.message.as_str());
            let refused = status.sent_version.iter().cloned().collect();
            self.common.acknowledge(
                kind,
                &req.version_info,
                error,
                refused,
                now,
                &mut step.events,
            );
        }
        let status = &mut self.common.types[kind.index()];
        let wildcard = (req.resource_names.is_empty() && kind.wildcard_when_empty())
            || req.resource_names.iter().any(|n| n == "*");
        let names: BTreeSet<String> = req
            .resource_names
            .iter()
            .filter(|n| *n != "*")
            .cloned()
            .collect();
        let changed = !status.requested || status.wildcard != wildcard || status.names != names;
        if !status.requested {
            step.events.push(Event::Subscribed { kind });
        }
        status.requested = true;
        status.wildcard = wildcard;
        status.names = names;
        if let Some(response) = self.respond(kind, changed, now) {
            step.responses.push(response);
        }
        Ok(step)
    }

    /// A new view for this node; responses for every type whose content changed.
    pub fn on_view(&mut self, view: Arc<Resources>, now: Instant) -> Step<DiscoveryResponse> {
        let first_sync = self.common.view().is_none();
        self.common.view = Some(view);
        let mut step = Step::default();
        for kind in Kind::ALL {
            if self.common.types[kind.index()].requested
                && let Some(r) = self.respond(kind, first_sync, now)
            {
                step.responses.push(r);
            }
        }
        step
    }

    /// The response for `kind` if one is due: `force` when the subscription changed (or on the
    /// first sync), else only when the content changed; never content the client refused.
    fn respond(&mut self, kind: Kind, force: bool, now: Instant) -> Option<DiscoveryResponse> {
        let view = self.common.view()?;
        let status = &self.common.types[kind.index()];
        // Both in name order: the set's version must not depend on how it was found.
        let all = view.of(kind);
        let chosen: Vec<&Arc<Resource>> = if status.wildcard {
            all.values().collect()
        } else {
            status
                .names
                .iter()
                .filter_map(|n| all.get(n.as_str()))
                .collect()
        };
        let version = set_version(&chosen);
        let unchanged = status.sent_version.as_deref() == Some(version.as_str());
        if status.was_refused(&version) || (unchanged && !force) {
            return None;
        }
        let resources = chosen.iter().map(|r| r.body.clone()).collect();
        let sent = chosen
            .iter()
            .map(|r| (r.name.to_string(), r.version.clone()))
            .collect();
        let nonce = self.common.next_nonce();
        let status = &mut self.common.types[kind.index()];
        status.sent_version = Some(version.clone());
        status.sent_nonce = Some(nonce.clone());
        status.sent = sent;
        status.sent_at = Some(now);
        Some(DiscoveryResponse {
            version_info: version,
            resources,
            type_url: kind.type_url().to_owned(),
            nonce,
            ..Default::default()
        })
    }
}

/// The version of a set of resources: a hash of their names and versions.
fn set_version(chosen: &[&Arc<Resource>]) -> String {
    let mut bytes = Vec::with_capacity(chosen.len() * 48);
    for r in chosen {
        bytes.extend_from_slice(r.name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(r.version.as_bytes());
        bytes.push(0);
    }
    crate::resources::content_version(&bytes)
}

// ---------------------------------------------------------------------------------------
// Delta
// ---------------------------------------------------------------------------------------

/// Unanswered responses a delta stream remembers per type, so that a NACK can name what it
/// refused. Clients answer in order, so an answer retires every older response of its type.
const DELTA_IN_FLIGHT: usize = 32;

/// A `DeltaAggregatedResources` stream. `TypeStatus::sent` is what the client holds, as far as
/// the server knows: `initial_resource_versions`, then everything sent since.
#[derive(Debug, Default)]
pub struct DeltaStream {
    common: Common,
    /// Responses sent and not yet answered, oldest first (at most [`DELTA_IN_FLIGHT`] per
    /// type).
    in_flight: VecDeque<InFlight>,
    /// Names newly subscribed per type that must be answered even if absent.
    pending_absent: [BTreeSet<String>; 4],
    /// Removals the client refused: it still holds those names, so they are removed again
    /// with the next view (not at once, which would repeat the refused response).
    refused_removals: [BTreeSet<String>; 4],
}

/// A delta response not yet answered.
#[derive(Debug)]
struct InFlight {
    nonce: String,
    kind: Kind,
    /// `name@version` of every resource in it.
    keys: Vec<String>,
    removed: Vec<String>,
}

impl DeltaStream {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn node(&self) -> Option<&NodeInfo> {
        self.common.node.as_ref()
    }

    pub fn status(&self) -> StreamStatus {
        status_of(&self.common, "delta")
    }

    pub fn on_request(
        &mut self,
        req: &DeltaDiscoveryRequest,
        now: Instant,
    ) -> Result<Step<DeltaDiscoveryResponse>, StreamError> {
        let mut step = Step::default();
        let Some(kind) = self.common.admit(
            req.node.as_ref(),
            &req.type_url,
            req.resource_names_subscribe.iter(),
            &mut step.events,
        )?
        else {
            return Ok(step);
        };
        if !req.response_nonce.is_empty() {
            self.acknowledge(kind, req, now, &mut step.events);
        }
        let first = !self.common.types[kind.index()].requested;
        if first {
            step.events.push(Event::Subscribed { kind });
        }
        self.apply_subscription(kind, req, first);
        if self.common.types[kind.index()].names.len() > MAX_NAMES_PER_TYPE {
            return Err(StreamError::TooManyNames {
                limit: MAX_NAMES_PER_TYPE,
            });
        }
        if let Some(r) = self.respond(kind, first, now) {
            step.responses.push(r);
        }
        Ok(step)
    }

    pub fn on_view(&mut self, view: Arc<Resources>, now: Instant) -> Step<DeltaDiscoveryResponse> {
        let first_sync = self.common.view().is_none();
        self.common.view = Some(view);
        for kind in Kind::ALL {
            let status = &mut self.common.types[kind.index()];
            for name in std::mem::take(&mut self.refused_removals[kind.index()]) {
                // An empty version matches nothing: sent again if it exists, removed if not.
                status.sent.entry(name).or_default();
            }
        }
        let mut step = Step::default();
        for kind in Kind::ALL {
            if self.common.types[kind.index()].requested
                && let Some(r) = self.respond(kind, first_sync, now)
            {
                step.responses.push(r);
            }
        }
        step
    }

    fn acknowledge(
        &mut self,
        kind: Kind,
        req: &DeltaDiscoveryRequest,
        now: Instant,
        events: &mut Vec<Event>,
    ) {
        let Some(at) = self
            .in_flight
            .iter()
            .position(|f| f.kind == kind && f.nonce == req.response_nonce)
        else {
            events.push(Event::StaleNonce { kind });
            return;
        };
        let answered = self.in_flight.remove(at).expect("position is in range");
        let mut seen = 0;
        self.in_flight.retain(|f| {
            seen += 1;
            f.kind != kind || seen > at
        });
        let error = req.error_detail.as_ref().map(|e| e.message.as_str());
        if error.is_some() {
            self.refused_removals[kind.index()].extend(answered.removed);
        }
        let keys = answered.keys;
        let version = self.common.types[kind.index()]
            .sent_version
            .clone()
            .unwrap_or_default();
        self.common
            .acknowledge(kind, &version, error, keys, now, events);
    }

    fn apply_subscription(&mut self, kind: Kind, req: &DeltaDiscoveryRequest, first: bool) {
        let status = &mut self.common.types[kind.index()];
        if first {
            status.requested = true;
            status.wildcard = req.resource_names_subscribe.is_empty() && kind.wildcard_when_empty();
            status.sent = req
                .initial_resource_versions
                .iter()
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
        }
        for name in &req.resource_names_subscribe {
            if name == "*" {
                status.wildcard = true;
            } else if status.names.insert(name.clone()) {
                self.pending_absent[kind.index()].insert(name.clone());
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                status.wildcard = false;
            } else {
                status.names.remove(name);
                self.pending_absent[kind.index()].remove(name);
            }
        }
        // The client forgets what it no longer subscribes to.
        let (wildcard, names) = (status.wildcard, &status.names);
        status
            .sent
            .retain(|name, _| wildcard || names.contains(name));
    }

    /// The changes for `kind` the client has not been sent: new or changed resources in its
    /// subscription, removals of ones it holds that are gone, and newly subscribed names that
    /// do not exist. `force` answers even when there is nothing (a type's first request).
    fn respond(&mut self, kind: Kind, force: bool, now: Instant) -> Option<DeltaDiscoveryResponse> {
        let view = self.common.view()?;
        let all = view.of(kind);
        let status = &self.common.types[kind.index()];
        let mut resources = Vec::new();
        let mut keys = Vec::new();
        let candidates: Box<dyn Iterator<Item = &Arc<Resource>>> = if status.wildcard {
            Box::new(all.values())
        } else {
            Box::new(status.names.iter().filter_map(|n| all.get(n.as_str())))
        };
        for r in candidates {
            let key = format!("{}@{}", r.name, r.version);
            if status.sent.get(&*r.name) == Some(&r.version) || status.was_refused(&key) {
                continue;
            }
            keys.push(key);
            resources.push(r.clone());
        }
        // A set: newly subscribed absent names are many at once (linear, not quadratic).
        let mut removed: BTreeSet<String> = status
            .sent
            .keys()
            .filter(|n| !all.contains_key(n.as_str()))
            .cloned()
            .collect();
        for name in std::mem::take(&mut self.pending_absent[kind.index()]) {
            if !all.contains_key(name.as_str()) {
                removed.insert(name);
            }
        }
        let removed: Vec<String> = removed.into_iter().collect();
        if resources.is_empty() && removed.is_empty() && !force {
            return None;
        }
        let system_version = view.snapshot_version.to_string();
        let nonce = self.common.next_nonce();
        let status = &mut self.common.types[kind.index()];
        for r in &resources {
            status.sent.insert(r.name.to_string(), r.version.clone());
        }
        for name in &removed {
            status.sent.remove(name);
        }
        status.sent_version = Some(system_version.clone());
        status.sent_nonce = Some(nonce.clone());
        status.sent_at = Some(now);
        if self.in_flight.iter().filter(|f| f.kind == kind).count() == DELTA_IN_FLIGHT
            && let Some(oldest) = self.in_flight.iter().position(|f| f.kind == kind)
        {
            self.in_flight.remove(oldest);
        }
        self.in_flight.push_back(InFlight {
            nonce: nonce.clone(),
            kind,
            keys,
            removed: removed.clone(),
        });
        Some(DeltaDiscoveryResponse {
            system_version_info: system_version,
            resources: resources
                .into_iter()
                .map(|r| DeltaResource {
                    name: r.name.to_string(),
                    version: r.version.clone(),
                    resource: Some(r.body.clone()),
                    ..Default::default()
                })
                .collect(),
            type_url: kind.type_url().to_owned(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests;
