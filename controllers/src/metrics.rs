//! Propagation metrics, registered under `meridian_propagation_`, write-back metrics under
//! `meridian_writeback_`, and the tenant namespace writes under `meridian_tenants_`. Labels are member names (bounded by the hub's MemberClusters) and a
//! fixed result, never an object name.

use meridian_core::ClusterId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    pub cluster: String,
    /// ok, error.
    pub result: &'static str,
}

/// A staged rollout's policy (bounded by the hub's policies) and phase (a fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutLabels {
    pub policy: String,
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Clone, Debug)]
pub struct PropagationMetrics {
    pub applies: Family<ApplyLabels, Counter>,
    pub conflicts: Counter,
    pub drift_reverted: Counter,
    pub evictions: Counter,
    /// From a template generation first seen to every copy of it applied and ready.
    pub converge_seconds: Histogram,
    /// One pass's deciding before any request: finding the templates whose inputs changed,
    /// and their rollout steps, renders, retain and drift checks.
    pub plan_seconds: Histogram,
    /// The templates one pass looked at (those whose inputs changed, and those unsettled).
    pub looked_templates: Histogram,
    /// Staged rollouts per policy and phase.
    pub rollout_phase: Family<RolloutLabels, Gauge>,
    /// 1 while one of a policy's staged rollouts is paused.
    pub rollout_paused: Family<PolicyLabels, Gauge>,
    /// How long each stage of a staged rollout took, approval and waits included.
    pub rollout_stage_seconds: Histogram,
}

impl Default for PropagationMetrics {
    fn default() -> Self {
        Self {
            applies: Family::default(),
            conflicts: Counter::default(),
            drift_reverted: Counter::default(),
            evictions: Counter::default(),
            converge_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            plan_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            looked_templates: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            rollout_phase: Family::default(),
            rollout_paused: Family::default(),
            rollout_stage_seconds: Histogram::new(exponential_buckets(1.0, 2.0, 16)),
        }
    }
}

impl PropagationMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "applies",
            "Server-side applies of placed objects into members, by member and result",
            m.applies.clone(),
        );
        registry.register(
            "conflicts",
            "Objects found in a member without meridian's label and left alone (conflictResolution Abort)",
            m.conflicts.clone(),
        );
        registry.register(
            "drift_reverted",
            "Placed objects changed in a member on fields meridian owns, applied again",
            m.drift_reverted.clone(),
        );
        registry.register(
            "evictions",
            "Copies deleted from a member because placement dropped it (after their replacements were ready, or the grace period)",
            m.evictions.clone(),
        );
        registry.register(
            "converge_seconds",
            "From a template change to every placed copy applied and ready",
            m.converge_seconds.clone(),
        );
        registry.register(
            "plan_seconds",
            "One propagation pass's deciding (what changed, then its rollout steps and renders), before its requests",
            m.plan_seconds.clone(),
        );
        registry.register(
            "looked_templates",
            "The templates one propagation pass looked at: those whose inputs changed, and those not yet settled",
            m.looked_templates.clone(),
        );
        registry.register(
            "rollouts",
            "Staged rollouts (placement.rollout) per policy and phase",
            m.rollout_phase.clone(),
        );
        registry.register(
            "rollout_paused",
            "1 while one of the policy's staged rollouts is paused (a failure, or an operator)",
            m.rollout_paused.clone(),
        );
        registry.register(
            "rollout_stage_seconds",
            "How long each stage of a staged rollout took, approval and waits included",
            m.rollout_stage_seconds.clone(),
        );
        m
    }

    pub fn applied(&self, cluster: &ClusterId, result: &'static str) {
        self.applies
            .get_or_create(&ApplyLabels {
                cluster: cluster.to_string(),
                result,
            })
            .inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    pub cluster: String,
}

/// MCS write-back metrics, registered under `meridian_writeback_`: per member, how its rounds
/// end, and whether its last round failed (what an alert watches).
#[derive(Clone, Debug, Default)]
pub struct WritebackMetrics {
    pub rounds: Family<ApplyLabels, Counter>,
    pub failing: Family<MemberLabels, Gauge>,
    /// Services whose objects a round built: every one in a full round, else those that
    /// changed since the member's last complete round.
    pub services: Family<ScopeLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    pub cluster: String,
    /// full, changed.
    pub scope: &'static str,
}

impl WritebackMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "rounds",
            "Write-back rounds into a member (ServiceImports, derived Services and EndpointSlices, export conditions), by member and result",
            m.rounds.clone(),
        );
        registry.register(
            "failing",
            "1 while the member's last write-back round failed (it is retried), else 0",
            m.failing.clone(),
        );
        registry.register(
            "services",
            "Services whose objects a write-back round built, by member and scope (full: every service; changed: those whose views changed since the member's last complete round)",
            m.services.clone(),
        );
        m
    }

    /// A round is about to build the objects of `services` services.
    pub fn scope(&self, cluster: &ClusterId, full: bool, services: usize) {
        for scope in ["full", "changed"] {
            let counter = self.services.get_or_create(&ScopeLabels {
                cluster: cluster.to_string(),
                scope,
            });
            if scope == if full { "full" } else { "changed" } {
                counter.inc_by(services as u64);
            }
        }
    }

    pub fn round(&self, cluster: &ClusterId, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        for r in ["ok", "error"] {
            // Both series exist from a member's first round, so a rate sees the first error.
            let counter = self.rounds.get_or_create(&ApplyLabels {
                cluster: cluster.to_string(),
                result: r,
            });
            if r == result {
                counter.inc();
            }
        }
        self.failing
            .get_or_create(&MemberLabels {
                cluster: cluster.to_string(),
            })
            .set(i64::from(!ok));
    }

    /// A member gone from the hub: its series go too.
    pub fn forget(&self, cluster: &ClusterId) {
        for result in ["ok", "error"] {
            self.rounds.remove(&ApplyLabels {
                cluster: cluster.to_string(),
                result,
            });
        }
        self.failing.remove(&MemberLabels {
            cluster: cluster.to_string(),
        });
        for scope in ["full", "changed"] {
            self.services.remove(&ScopeLabels {
                cluster: cluster.to_string(),
                scope,
            });
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceWriteLabels {
    pub cluster: String,
    /// create, relabel, delete.
    pub op: &'static str,
    /// ok, error.
    pub result: &'static str,
}

/// Tenant namespace writes, registered under `meridian_tenants_`.
#[derive(Clone, Debug, Default)]
pub struct TenantMetrics {
    pub namespace_writes: Family<NamespaceWriteLabels, Counter>,
}

impl TenantMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "namespace_writes",
            "Writes of the namespaces members hold for Tenants, by member, operation and result",
            m.namespace_writes.clone(),
        );
        m
    }

    pub fn record(&self, cluster: &ClusterId, op: &'static str, ok: bool) {
        self.namespace_writes
            .get_or_create(&NamespaceWriteLabels {
                cluster: cluster.to_string(),
                op,
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteWriteLabels {
    /// HTTPRoute, GRPCRoute.
    pub kind: &'static str,
    /// ok, error.
    pub result: &'static str,
}

/// Writes of HTTPRoute and GRPCRoute `status.parents` on the hub, registered under
/// `meridian_routes_`.
#[derive(Clone, Debug, Default)]
pub struct RouteMetrics {
    pub status_writes: Family<RouteWriteLabels, Counter>,
}

impl RouteMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "status_writes",
            "Writes of routes' status.parents on the hub (the leader's), by route kind and result",
            m.status_writes.clone(),
        );
        m
    }

    pub fn record(&self, kind: &'static str, ok: bool) {
        self.status_writes
            .get_or_create(&RouteWriteLabels {
                kind,
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }
}
