//! The fleet: the one state machine that turns what sources report into snapshots. It owns
//! the Index, the Registry, the policies and the problems; it decides what an event changes,
//! when readiness is reached, and what the next snapshot holds. The serving process feeds it
//! from a channel and `meridian validate` feeds it the same events from disk, so both run the
//! same decisions.
//!
//! ```text
//!  Event::Members ─► registry upsert/remove, policies, hub problems ─┐
//!  Event::Reset | Changes ─► Index, member problems ─────────────────┤ Outcome { changed,
//!  Event::Heartbeat | WatchHealth | Confirmations ─► Registry ───────┤  transitions, … }
//!  Event::Geo ─► the geo table (shared by every snapshot), geo problems ┤
//!  Event::Tenants ─► the tenants (shared by every snapshot) ─────────┤
//!  Event::Routes ─► routes, grants; resolved per build when they or ──┤
//!                   a service they name changed (route::RouteTable)   │
//!  tick(now) ─► Registry transitions, sync deadline, decision windows ┘
//!                  build_snapshot(prev, now) ─► Snapshot (synced, problems, warnings)
//! ```
//!
//! Time is passed in (`now`), so every rule is tested with a fake clock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checks;
use crate::geo::GeoTable;
use crate::index::{Dirty, Index, Kind, Object};
use crate::model::{ClusterId, ClusterObjects, ClusterSpec, ObjectKey};
use crate::placement::{
    self, Capacity, Decider, Inputs, OverridePolicy, Placements, Placer, Runner, Template,
};
use crate::policy::{Drain, Policies, Policy};
use crate::problem::Problem;
use crate::problem::{ObjectRef, Origin};
use crate::registry::{Registry, Transition};
use crate::route::{ReferenceGrant, Route, RouteTable};
use crate::shard::Confirmation;
use crate::snapshot::Snapshot;
use crate::tenant::Tenants;

/// What sources report. One writer applies these, so sources never take a lock.
#[derive(Debug)]
pub enum Event {
    /// The full list of members on the hub.
    Members {
        specs: Vec<ClusterSpec>,
        /// The ClusterSchedulingPolicies on the hub (those that passed validation).
        policies: Vec<Policy>,
        /// Hub objects that were rejected.
        problems: Vec<Problem>,
        /// Hub objects served with a caveat (or ignored: kinds the hub does not hold).
        warnings: Vec<Problem>,
    },
    /// A member's full object list (a relist): replaces its slice of the Index in one step.
    Reset {
        cluster: ClusterId,
        objects: ClusterObjects,
        /// Objects (or parts of them) that were rejected.
        problems: Vec<Problem>,
        /// Objects served with a caveat (e.g. unknown fields ignored).
        warnings: Vec<Problem>,
    },
    /// Changes to a member's objects since its last Reset or Changes (a watch event batch).
    Changes {
        cluster: ClusterId,
        changes: Vec<Change>,
        /// The member's rejected objects, all of them (replaces the previous list).
        problems: Vec<Problem>,
    },
    /// A heartbeat result: `Err(reason)` when the member could not be reached or read.
    Heartbeat {
        cluster: ClusterId,
        result: Result<(), String>,
    },
    /// A member's watches: `Some(reason)` while one fails or stalls, `None` once all are fine.
    WatchHealth {
        cluster: ClusterId,
        failure: Option<String>,
    },
    /// A member's capacity for placement (None: unknown, e.g. no Nodes).
    Capacity {
        cluster: ClusterId,
        capacity: Option<Capacity>,
    },
    /// The hub's resource templates and OverridePolicies (those that passed validation; the
    /// rejected ones are in the `Members` event's problems of the same read).
    Templates {
        templates: Vec<Template>,
        overrides: Vec<OverridePolicy>,
    },
    /// What the other replicas say of members this replica sees: whether a
    /// member unreachable from here is unreachable for a majority of them. Members left out
    /// keep what they had.
    Confirmations(Vec<(ClusterId, Confirmation)>),
    /// A policy's program (a scoring webhook) answered, or its answer expired: placement
    /// decides again.
    ProgramsAnswered,
    /// The geo ranges for DNS clients outside the fleet (config and file merged, built once
    /// by the source) and the ranges it rejected; replaces the previous table and problems.
    Geo {
        table: Arc<GeoTable>,
        problems: Vec<Problem>,
    },
    /// The hub's Tenants (those that passed validation; the rejected ones are in the `Members`
    /// event's problems of the same read). Replaces the previous set.
    Tenants(Tenants),
    /// Per ClusterSchedulingPolicy, the clusters its staged rollouts hold out of its traffic
    /// (as its status on the hub says). Replaces the previous map.
    Drained(BTreeMap<ObjectKey, Drain>),
    /// The hub's HTTPRoutes, GRPCRoutes and ReferenceGrants (those that converted; the
    /// rejected ones are in the `Members` event's problems of the same read). Replaces the
    /// previous set.
    Routes {
        routes: Vec<Route>,
        grants: Vec<ReferenceGrant>,
    },
}

/// One change to one object of a member.
#[derive(Debug, Clone)]
pub enum Change {
    Upsert(Object),
    Delete(Kind, ObjectKey),
}

/// What applying an event (or a tick) did, for the caller to log and count.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The snapshot must be rebuilt.
    pub changed: bool,
    /// Health changes and withdrawals, in the order they happened.
    pub transitions: Vec<Transition>,
    /// The scheduling policies changed; how many there are now.
    pub policies_changed: Option<usize>,
    /// Members that left the hub (their objects and problems went with them).
    pub removed: Vec<ClusterId>,
}

/// A snapshot ready to publish, and what making it took (for the publisher's metrics and
/// log line).
#[derive(Debug)]
pub struct Published {
    pub snapshot: Snapshot,
    /// Services re-merged because their objects changed.
    pub services_changed: usize,
    /// Every service was merged again (a member left, or the policies changed).
    pub full: bool,
    /// How long the build took (merging services, readiness, problems).
    pub build: Duration,
    /// How long placement took, when something it reads changed and it decided again; None
    /// when the previous snapshot's decisions were kept.
    pub placement: Option<Duration>,
    /// What decided `snapshot.placements`: what a what-if on this snapshot decides again with.
    pub decider: Decider,
}

/// A snapshot and what its build re-merged (before placement and stamping).
#[derive(Debug)]
pub struct Built {
    pub snapshot: Snapshot,
    /// Services re-merged because their objects changed.
    pub services_changed: usize,
    /// Every service was merged again (a member left, or the policies changed).
    pub full: bool,
}

#[derive(Debug)]
pub struct Fleet {
    index: Index,
    registry: Registry,
    /// The hub's policies with the rollouts' drains applied to their traffic.
    policies: Policies,
    /// The policies as the hub has them, and what the rollouts drain of each.
    hub_policies: Vec<Policy>,
    drained: BTreeMap<ObjectKey, Drain>,
    /// The version of the last snapshot built: every build takes the next one.
    version: u64,
    /// The hub has been read once: until then the member list is unknown, so nothing is synced.
    hub_read: bool,
    /// After this instant readiness no longer waits for members that have neither synced nor
    /// failed: one silent member must not keep DNS at SERVFAIL for ever.
    sync_deadline: Instant,
    /// The sync deadline has been acted on once (so a tick after it republishes once, not on
    /// every tick while some member stays unsettled).
    sync_deadline_seen: bool,
    /// The policies changed since the last snapshot: every service is merged again, once.
    policies_changed: bool,
    /// When a decision changes with no event (a failback or withdraw window ends).
    decision_deadline: Option<Instant>,
    /// Rejected hub objects; replaced with every hub read.
    hub_problems: Vec<Problem>,
    /// Services their policy leaves with no cluster for traffic (`checks::no_traffic`),
    /// updated per build for the services it changed.
    no_traffic: BTreeMap<ObjectKey, Problem>,
    /// Hub objects served with a caveat; replaced with every hub read.
    hub_warnings: Vec<Problem>,
    /// Per member, so a member that leaves takes its problems with it.
    member_problems: BTreeMap<ClusterId, Vec<Problem>>,
    /// Per member, for the same reason.
    member_warnings: BTreeMap<ClusterId, Vec<Problem>>,
    /// Templates, overrides, capacities and the placement memory.
    federation: Federation,
    /// The geo table every snapshot carries (the same `Arc` until the ranges change).
    geo: Arc<GeoTable>,
    /// Geo ranges that were rejected (bad lines, conflicting localities, an unreadable file).
    geo_problems: Vec<Problem>,
    /// The tenants every snapshot carries (the same `Arc` until they change).
    tenants: Arc<Tenants>,
    /// The hub's routes and what they decide.
    routes: Routes,
}

/// The hub's routes and grants, and the table they resolved to against the last build.
#[derive(Debug, Default)]
struct Routes {
    routes: Vec<Route>,
    grants: Vec<ReferenceGrant>,
    /// Shared by every snapshot until it changes.
    table: Arc<RouteTable>,
    /// The routes or grants changed since the table was resolved.
    dirty: bool,
}

/// What placement decides from, beside the registry and the policies.
#[derive(Debug, Default)]
struct Federation {
    templates: Arc<[Template]>,
    overrides: Arc<[OverridePolicy]>,
    /// Shared with every snapshot until one changes.
    capacities: Arc<BTreeMap<ClusterId, Capacity>>,
    placer: Placer,
    /// A copy of `placer` as of the last round, for snapshots (a what-if continues from it).
    remembered: Arc<Placer>,
    /// Something placement reads changed since the last round.
    dirty: bool,
    /// When a decision changes with time alone.
    deadline: Option<Instant>,
    /// The next round is one to let the last one's decisions settle (`Placements::settled`).
    settle_pending: bool,
    /// Settling rounds in a row: at most [`placement::SETTLING_ROUNDS`], so decisions that
    /// keep moving wait for the next change instead of spinning.
    settle_rounds: u8,
    /// Policies that select a template an older policy places.
    conflicts: Vec<Problem>,
    /// Placed templates naming a dependency the hub does not hold (warnings).
    missing: Vec<Problem>,
    /// Runs the policies' scripts and scoring webhooks.
    programs: Runner,
}

impl Fleet {
    /// Sets what runs the policies' scripts and scoring webhooks (none until then).
    pub fn set_programs(&mut self, programs: Arc<dyn crate::placement::Programs>) {
        self.federation.programs = Runner(programs);
        self.federation.dirty = true;
    }

    /// An empty fleet started at `now`; readiness waits at most `sync_deadline` for members.
    pub fn new(now: Instant, sync_deadline: Duration) -> Self {
        Self {
            index: Index::new(),
            registry: Registry::new(),
            policies: Policies::default(),
            hub_policies: Vec::new(),
            drained: BTreeMap::new(),
            version: 0,
            hub_read: false,
            sync_deadline: now + sync_deadline,
            sync_deadline_seen: false,
            policies_changed: false,
            decision_deadline: None,
            hub_problems: Vec::new(),
            no_traffic: BTreeMap::new(),
            hub_warnings: Vec::new(),
            member_problems: BTreeMap::new(),
            member_warnings: BTreeMap::new(),
            federation: Federation::default(),
            geo: Arc::default(),
            geo_problems: Vec::new(),
            tenants: Arc::default(),
            routes: Routes::default(),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// Writes are sharded over replicas: members unreachable from here need the others'
    /// confirmation (`Event::Confirmations`) to be Unreachable.
    pub fn require_confirmation(&mut self) {
        self.registry.require_confirmation();
    }

    /// DNS may answer (instead of SERVFAIL): the hub was read, and every member has synced or
    /// failed once, or the sync deadline passed.
    pub fn synced(&self, now: Instant) -> bool {
        self.hub_read && (self.registry.all_settled() || now >= self.sync_deadline)
    }

    /// Applies one event.
    pub fn apply(&mut self, event: Event, now: Instant) -> Outcome {
        let outcome = self.apply_event(event, now);
        // Health and membership decide placement as they decide traffic.
        self.federation.dirty |= !outcome.transitions.is_empty()
            || !outcome.removed.is_empty()
            || outcome.policies_changed.is_some();
        outcome
    }

    fn apply_event(&mut self, event: Event, now: Instant) -> Outcome {
        match event {
            Event::Members {
                specs,
                policies,
                problems,
                warnings,
            } => self.apply_members(specs, policies, problems, warnings, now),
            Event::Drained(drained) => self.apply_drained(drained),
            Event::Routes { routes, grants } => {
                // Routes decide answers (RDS), not placement or services: no re-merge.
                let r = &mut self.routes;
                let changed = r.routes != routes || r.grants != grants;
                if changed {
                    r.routes = routes;
                    r.grants = grants;
                    r.dirty = true;
                }
                Outcome {
                    changed,
                    ..Outcome::default()
                }
            }
            Event::Reset {
                cluster,
                objects,
                problems,
                warnings,
            } => self.apply_reset(&cluster, objects, problems, warnings),
            Event::Changes {
                cluster,
                changes,
                problems,
            } => self.apply_changes(&cluster, changes, problems),
            Event::WatchHealth { cluster, failure } => {
                let transitions: Vec<Transition> = self
                    .registry
                    .watch_status(&cluster, now, failure)
                    .into_iter()
                    .collect();
                Outcome {
                    changed: !transitions.is_empty(),
                    transitions,
                    ..Outcome::default()
                }
            }
            Event::Confirmations(confirmations) => {
                let transitions: Vec<Transition> = confirmations
                    .into_iter()
                    .filter_map(|(cluster, c)| self.registry.confirm(&cluster, now, c))
                    .collect();
                Outcome {
                    changed: !transitions.is_empty(),
                    transitions,
                    ..Outcome::default()
                }
            }
            Event::ProgramsAnswered => {
                self.federation.dirty = true;
                Outcome {
                    changed: true,
                    ..Outcome::default()
                }
            }
            Event::Capacity { cluster, capacity } => {
                let f = &mut self.federation;
                let changed = match capacity {
                    Some(c) if f.capacities.get(&cluster) != Some(&c) => {
                        Arc::make_mut(&mut f.capacities).insert(cluster, c);
                        true
                    }
                    Some(_) => false,
                    None if f.capacities.contains_key(&cluster) => {
                        Arc::make_mut(&mut f.capacities).remove(&cluster);
                        true
                    }
                    None => false,
                };
                f.dirty |= changed;
                Outcome {
                    changed,
                    ..Outcome::default()
                }
            }
            Event::Templates {
                templates,
                overrides,
            } => {
                let f = &mut self.federation;
                let changed = *f.templates != *templates || *f.overrides != *overrides;
                if changed {
                    f.templates = templates.into();
                    f.overrides = overrides.into();
                    f.dirty = true;
                }
                Outcome {
                    changed,
                    ..Outcome::default()
                }
            }
            Event::Tenants(tenants) => {
                // Tenants decide what the gateway lets through, not answers or placement.
                let changed = *self.tenants != tenants;
                if changed {
                    self.tenants = Arc::new(tenants);
                }
                Outcome {
                    changed,
                    ..Outcome::default()
                }
            }
            Event::Geo { table, problems } => {
                // Geo decides answers, not placement or services: no re-merge, only a new
                // snapshot version (the DNS answer cache is per version).
                let changed = !(Arc::ptr_eq(&self.geo, &table) || *self.geo == *table)
                    || self.geo_problems != problems;
                self.geo = table;
                self.geo_problems = problems;
                Outcome {
                    changed,
                    ..Outcome::default()
                }
            }
            Event::Heartbeat { cluster, result } => {
                let was_settled = self.registry.all_settled();
                let transition = match result {
                    Ok(()) => self.registry.heartbeat_ok(&cluster, now),
                    Err(reason) => self.registry.heartbeat_failed(&cluster, now, reason),
                };
                let transitions: Vec<Transition> = transition.into_iter().collect();
                Outcome {
                    // The last member settling makes the fleet synced, a change in itself.
                    changed: !transitions.is_empty() || was_settled != self.registry.all_settled(),
                    transitions,
                    ..Outcome::default()
                }
            }
        }
    }

    /// A drain changes which clusters a policy's Services answer with, not where its templates
    /// go: every service is merged again, placement keeps its decisions.
    fn apply_drained(&mut self, drained: BTreeMap<ObjectKey, Drain>) -> Outcome {
        if drained == self.drained {
            return Outcome::default();
        }
        self.drained = drained;
        self.policies = Policies::new(
            self.policies.default.clone(),
            with_drains(&self.hub_policies, &self.drained),
        );
        self.policies_changed = true;
        Outcome {
            changed: true,
            ..Outcome::default()
        }
    }

    fn apply_members(
        &mut self,
        specs: Vec<ClusterSpec>,
        policies: Vec<Policy>,
        problems: Vec<Problem>,
        warnings: Vec<Problem>,
        now: Instant,
    ) -> Outcome {
        let mut outcome = Outcome {
            changed: !self.hub_read,
            ..Outcome::default()
        };
        self.hub_read = true;
        self.hub_policies = policies;
        let policies = Policies::new(
            self.policies.default.clone(),
            with_drains(&self.hub_policies, &self.drained),
        );
        if !self.policies.same_as(&policies) {
            outcome.policies_changed = Some(policies.iter().count());
            self.policies = policies;
            self.policies_changed = true;
            outcome.changed = true;
        }
        outcome.changed |= self.hub_problems != problems || self.hub_warnings != warnings;
        self.hub_problems = problems;
        self.hub_warnings = warnings;
        let gone: Vec<ClusterId> = self
            .registry
            .ids()
            .filter(|id| !specs.iter().any(|s| &s.id == *id))
            .cloned()
            .collect();
        for id in gone {
            self.remove_member(&id);
            outcome.removed.push(id);
            outcome.changed = true;
        }
        for spec in specs {
            let changed = self.registry.upsert(spec, now);
            self.federation.dirty |= changed;
            outcome.changed |= changed;
        }
        outcome
    }

    /// A member left the hub: its health, objects and problems go.
    fn remove_member(&mut self, id: &ClusterId) {
        self.registry.remove(id);
        self.index.remove_cluster(id);
        self.member_problems.remove(id);
        self.member_warnings.remove(id);
        if self.federation.capacities.contains_key(id) {
            Arc::make_mut(&mut self.federation.capacities).remove(id);
        }
    }

    fn apply_reset(
        &mut self,
        cluster: &ClusterId,
        objects: ClusterObjects,
        problems: Vec<Problem>,
        warnings: Vec<Problem>,
    ) -> Outcome {
        // A member the hub does not (or no longer) list: a source that lags behind its stop.
        if self.registry.spec(cluster).is_none() {
            return Outcome::default();
        }
        let problems_changed = self.replace_problems(cluster, problems)
            | replace(&mut self.member_warnings, cluster, warnings);
        // Both, always: the problem list alone changing must publish too.
        let objects_changed = self.index.reset(cluster, objects);
        Outcome {
            changed: objects_changed | problems_changed,
            ..Outcome::default()
        }
    }

    fn apply_changes(
        &mut self,
        cluster: &ClusterId,
        changes: Vec<Change>,
        problems: Vec<Problem>,
    ) -> Outcome {
        if self.registry.spec(cluster).is_none() {
            return Outcome::default();
        }
        let mut changed = self.replace_problems(cluster, problems);
        for change in changes {
            changed |= match change {
                Change::Upsert(object) => self.index.apply(cluster, object),
                Change::Delete(kind, key) => self.index.delete(cluster, kind, &key),
            };
        }
        Outcome {
            changed,
            ..Outcome::default()
        }
    }

    fn replace_problems(&mut self, cluster: &ClusterId, problems: Vec<Problem>) -> bool {
        replace(&mut self.member_problems, cluster, problems)
    }

    /// Re-evaluates health against the clock, and notices the sync deadline and decision
    /// windows passing.
    pub fn tick(&mut self, now: Instant) -> Outcome {
        let transitions = self.registry.tick(now);
        let sync_deadline_passed = !self.sync_deadline_seen && now >= self.sync_deadline;
        if sync_deadline_passed {
            self.sync_deadline_seen = true;
        }
        let decisions_due = self.decision_deadline.is_some_and(|d| d <= now);
        let placements_due = self.federation.deadline.is_some_and(|d| d <= now);
        self.federation.dirty |= placements_due || !transitions.is_empty();
        Outcome {
            changed: !transitions.is_empty()
                || (sync_deadline_passed && !self.registry.all_settled())
                || decisions_due
                || placements_due,
            transitions,
            ..Outcome::default()
        }
    }

    /// The earliest instant at which `tick` could change something; `None` when nothing is
    /// pending (the caller waits for the next event).
    pub fn next_deadline(&self) -> Option<Instant> {
        let sync = (!self.sync_deadline_seen && !self.registry.all_settled())
            .then_some(self.sync_deadline);
        [
            self.registry.next_deadline(),
            sync,
            self.decision_deadline,
            self.federation.deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The next snapshot after `prev` (the one last published) at `now`: built (re-merging
    /// only what changed since), placed (decided again only when something placement reads
    /// changed), and stamped against `prev` for the caches of `prev`'s readers — in that
    /// order, so a snapshot is complete when it is returned and never changed after. Whoever
    /// makes a snapshot (the store, `validate`, `render`, what-if) calls this.
    pub fn publish(&mut self, prev: &Snapshot, now: Instant) -> Published {
        let started = Instant::now();
        let Built {
            mut snapshot,
            services_changed,
            full,
        } = self.build_snapshot(prev, now);
        let build = started.elapsed();
        let placing = Instant::now();
        let placement = self
            .place(prev, &mut snapshot, now)
            .then(|| placing.elapsed());
        // Last: it retires what the readers of `prev` cache.
        snapshot.restamp(prev, now);
        Published {
            snapshot,
            services_changed,
            full,
            build,
            placement,
            decider: Decider {
                placer: self.federation.remembered.clone(),
                programs: self.federation.programs.clone(),
            },
        }
    }

    /// Builds the next snapshot after `prev` (the one last published), re-merging only what
    /// changed since, with the fleet's readiness, problems and warnings.
    pub(crate) fn build_snapshot(&mut self, prev: &Snapshot, now: Instant) -> Built {
        self.version += 1;
        let mut dirty = self.index.take_dirty();
        dirty.all |= std::mem::take(&mut self.policies_changed);
        let mut snapshot = Snapshot::rebuild(
            prev,
            &dirty,
            self.version,
            &self.index,
            &self.registry,
            &self.policies,
            now,
        );
        self.decision_deadline = snapshot.next_deadline(now);
        snapshot.synced = self.synced(now);
        snapshot.geo = self.geo.clone();
        snapshot.tenants = self.tenants.clone();
        self.resolve_routes(&snapshot, &dirty);
        snapshot.routes = self.routes.table.clone();
        snapshot
            .problems
            .extend(self.routes.table.problems.iter().cloned());
        snapshot
            .warnings
            .extend(self.routes.table.warnings.iter().cloned());
        snapshot.problems.extend(
            self.hub_problems
                .iter()
                .chain(&self.geo_problems)
                .chain(self.member_problems.values().flatten())
                .cloned(),
        );
        snapshot
            .problems
            .extend(self.registry.never_synced().map(|(id, reason)| {
                Problem::in_merge(
                    Origin::Member(id.clone()),
                    ObjectRef::cluster_scoped("MemberCluster", id.to_string()),
                    format!("{}{reason}", crate::registry::NEVER_SYNCED),
                )
            }));
        snapshot.warnings.extend(
            self.hub_warnings
                .iter()
                .chain(self.member_warnings.values().flatten())
                .cloned(),
        );
        snapshot.warnings.extend(checks::unknown_clusters(
            &self.policies,
            snapshot.clusters.iter().map(|c| &c.spec),
        ));
        self.refresh_traffic_checks(prev, &snapshot, &dirty);
        snapshot.problems.extend(self.no_traffic.values().cloned());
        Built {
            snapshot,
            services_changed: dirty.services.len(),
            full: dirty.all,
        }
    }
}

impl Fleet {
    /// Resolves the routes again when they changed, or a service they name appeared, left or
    /// changed its ports (not for endpoint changes); the table keeps its `Arc` when the
    /// result is the same (xDS rebuilds on a new one).
    fn resolve_routes(&mut self, snapshot: &Snapshot, dirty: &Dirty) {
        let r = &mut self.routes;
        let ports = |key: &ObjectKey| {
            let view = snapshot.service(&key.namespace, &key.name)?;
            Some(view.ports.iter().map(|p| p.port).collect::<Vec<_>>())
        };
        let affected =
            r.dirty || dirty.all || dirty.services.iter().any(|k| r.table.stale(k, ports(k)));
        if !affected {
            return;
        }
        r.dirty = false;
        let table = RouteTable::resolve(&r.routes, &r.grants, ports);
        if table != *r.table {
            r.table = Arc::new(table);
        }
    }

    /// Keeps `no_traffic` in step with a build: every service again when the policies or the
    /// clusters changed, else only those the build changed (a snapshot is built for every
    /// endpoint change: the check must not walk every service each time).
    fn refresh_traffic_checks(&mut self, prev: &Snapshot, snapshot: &Snapshot, dirty: &Dirty) {
        if dirty.all || !snapshot.same_clusters_as(prev) {
            self.no_traffic = snapshot
                .services()
                .filter_map(|v| Some((v.key.clone(), checks::no_traffic(snapshot, v)?)))
                .collect();
            return;
        }
        for key in &dirty.services {
            self.no_traffic.remove(key);
            if let Some(v) = snapshot.service(&key.namespace, &key.name)
                && let Some(p) = checks::no_traffic(snapshot, v)
            {
                self.no_traffic.insert(key.clone(), p);
            }
        }
    }

    /// Adds the placement decisions to a snapshot `build_snapshot` just built after `prev`:
    /// decided again when something placement reads changed (returns true then), else the
    /// previous snapshot's.
    pub(crate) fn place(&mut self, prev: &Snapshot, snapshot: &mut Snapshot, now: Instant) -> bool {
        let decided = self.federation.dirty;
        snapshot.templates = self.federation.templates.clone();
        snapshot.overrides = self.federation.overrides.clone();
        snapshot.capacities = self.federation.capacities.clone();
        snapshot.placements = self.placements(prev, snapshot, now);
        snapshot.workloads = workload_clusters(prev, snapshot);
        snapshot
            .problems
            .extend(unschedulable(&snapshot.placements));
        if decided {
            // With no templates the placer did not run: what it holds is the last round's.
            self.federation.conflicts = if self.federation.templates.is_empty() {
                Vec::new()
            } else {
                template_conflicts(&self.federation.placer).collect()
            };
            self.federation.missing =
                missing_dependencies(&self.federation.templates, &snapshot.placements);
        }
        snapshot
            .problems
            .extend(self.federation.conflicts.iter().cloned());
        snapshot
            .warnings
            .extend(self.federation.missing.iter().cloned());
        decided
    }

    fn placements(
        &mut self,
        prev: &Snapshot,
        snapshot: &Snapshot,
        now: Instant,
    ) -> Arc<Placements> {
        let f = &mut self.federation;
        if !std::mem::take(&mut f.dirty) {
            return prev.placements.clone();
        }
        if f.templates.is_empty() {
            f.deadline = None;
            return Arc::new(Placements::default());
        }
        let clusters = snapshot.cluster_inputs();
        let placements = f.placer.place(
            Inputs {
                templates: &f.templates,
                policies: self.policies.as_slice(),
                overrides: &f.overrides,
                clusters: &clusters,
                programs: &*f.programs.0,
            },
            now,
        );
        f.deadline = placements.next_deadline;
        let settling = std::mem::take(&mut f.settle_pending);
        f.settle_rounds = if settling { f.settle_rounds + 1 } else { 0 };
        if !placements.settled && f.settle_rounds < placement::SETTLING_ROUNDS {
            f.settle_pending = true;
            f.deadline = Some(now);
        }
        f.remembered = Arc::new(f.placer.clone());
        Arc::new(placements)
    }
}

/// Per policy, the clusters its workloads (templates with replicas) are placed in: the
/// previous snapshot's, with the policies whose workloads moved gathered again (all of them
/// when the clusters changed, since they are indices).
fn workload_clusters(prev: &Snapshot, snapshot: &Snapshot) -> Arc<HashMap<String, Vec<usize>>> {
    if !snapshot.same_clusters_as(prev) {
        return Arc::new(placed_workloads(snapshot));
    }
    if Arc::ptr_eq(&prev.placements, &snapshot.placements) {
        return prev.workloads.clone();
    }
    let moved = policies_moved(&prev.placements, &snapshot.placements);
    if moved.is_empty() {
        return prev.workloads.clone();
    }
    let mut by_policy = (*prev.workloads).clone();
    by_policy.retain(|policy, _| !moved.contains(policy.as_str()));
    gather_workloads(snapshot, &mut by_policy, |policy| {
        moved.contains(policy.to_string().as_str())
    });
    Arc::new(by_policy)
}

/// The policies some of whose workloads run elsewhere in `next` than in `prev` (both maps in
/// key order: one walk; a decision kept from the last round is the same `Arc`).
fn policies_moved(prev: &Placements, next: &Placements) -> std::collections::HashSet<String> {
    let workloads = |d: &placement::Decision| -> Vec<ClusterId> {
        d.placed
            .iter()
            .filter(|p| p.replicas.is_some())
            .map(|p| p.cluster.clone())
            .collect()
    };
    let mut moved = std::collections::HashSet::new();
    let mut mark = |d: &placement::Decision| {
        if let Some(policy) = &d.policy {
            moved.insert(policy.to_string());
        }
    };
    let mut a = prev.decisions.iter().peekable();
    let mut b = next.decisions.iter().peekable();
    loop {
        match (a.peek(), b.peek()) {
            (Some((ka, da)), Some((kb, db))) if ka == kb => {
                if !Arc::ptr_eq(da, db)
                    && (da.policy != db.policy || workloads(da) != workloads(db))
                {
                    mark(da);
                    mark(db);
                }
                a.next();
                b.next();
            }
            (Some((ka, da)), Some((kb, _))) if ka < kb => {
                mark(da);
                a.next();
            }
            (_, Some((_, db))) => {
                mark(db);
                b.next();
            }
            (Some((_, da)), None) => {
                mark(da);
                a.next();
            }
            (None, None) => break,
        }
    }
    moved
}

/// Per policy, the clusters (indices into `snapshot.clusters`, sorted) where
/// `snapshot.placements` runs its workloads.
pub(crate) fn placed_workloads(snapshot: &Snapshot) -> HashMap<String, Vec<usize>> {
    let mut by_policy = HashMap::new();
    gather_workloads(snapshot, &mut by_policy, |_| true);
    by_policy
}

/// Adds to `by_policy` where the workloads of the policies `wanted` selects run.
fn gather_workloads(
    snapshot: &Snapshot,
    by_policy: &mut HashMap<String, Vec<usize>>,
    wanted: impl Fn(&ObjectKey) -> bool,
) {
    let mut gathered: HashMap<String, Vec<usize>> = HashMap::new();
    for d in snapshot.placements.decisions.values() {
        let Some(policy) = d.policy.as_ref().filter(|p| wanted(p)) else {
            continue;
        };
        let placed = d
            .placed
            .iter()
            .filter(|p| p.replicas.is_some())
            .filter_map(|p| snapshot.cluster_by_id(&p.cluster));
        let clusters = gathered.entry(policy.to_string()).or_default();
        clusters.extend(placed);
    }
    gathered.retain(|_, clusters| {
        clusters.sort_unstable();
        clusters.dedup();
        !clusters.is_empty()
    });
    by_policy.extend(gathered);
}

/// `policies` with each one's traffic holding out the clusters its drain names, and bringing
/// back those ramping at their share.
fn with_drains(policies: &[Policy], drains: &BTreeMap<ObjectKey, Drain>) -> Vec<Policy> {
    policies
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if let Some(drain) = drains.get(&p.key) {
                let traffic = Arc::make_mut(&mut p.traffic);
                traffic.drained.clone_from(&drain.drained);
                traffic.ramping.clone_from(&drain.ramping);
            }
            p
        })
        .collect()
}

/// A template two policies select is placed by the older one (policies are oldest first);
/// each younger one is a problem naming both, as for Services.
fn template_conflicts(placer: &placement::Placer) -> impl Iterator<Item = Problem> + '_ {
    placer.conflicts().flat_map(|c| {
        c.losers.into_iter().map(move |loser| {
            Problem::in_merge(
                Origin::Hub,
                ObjectRef::namespaced("ClusterSchedulingPolicy", loser),
                format!(
                    "Conflict: it selects template {}, which the older policy {} places",
                    c.template, c.placing
                ),
            )
        })
    })
}

/// An unschedulable template is a problem of the hub's, with the decision's numbers.
/// A placed workload naming a ConfigMap, Secret, ServiceAccount or PVC the hub does not
/// hold: its copies start without it (the workload is placed all the same).
fn missing_dependencies(templates: &[Template], placements: &Placements) -> Vec<Problem> {
    if templates.iter().all(|t| t.dependencies.is_empty()) {
        return Vec::new();
    }
    let on_hub: std::collections::HashSet<&placement::TemplateKey> =
        templates.iter().map(|t| &t.key).collect();
    templates
        .iter()
        .filter(|t| placements.decisions.contains_key(&t.key))
        .flat_map(|t| {
            let on_hub = &on_hub;
            t.dependencies
                .iter()
                .filter(move |d| !on_hub.contains(d))
                .map(move |d| {
                    Problem::in_merge(
                        Origin::Hub,
                        ObjectRef {
                            kind: t.key.kind.to_string(),
                            namespace: Some(t.key.namespace.to_string()),
                            name: t.key.name.to_string(),
                        },
                        format!(
                            "uses {} {}/{}, which meridian does not have from the hub: its copies start without it",
                            d.kind, d.namespace, d.name
                        ),
                    )
                })
        })
        .collect()
}

fn unschedulable(placements: &Placements) -> impl Iterator<Item = Problem> + '_ {
    placements
        .decisions
        .values()
        .filter_map(|d| match &d.outcome {
            placement::Outcome::Unschedulable { reason } => Some(Problem::in_merge(
                Origin::Hub,
                ObjectRef {
                    kind: d.template.kind.to_string(),
                    namespace: Some(d.template.namespace.to_string()),
                    name: d.template.name.to_string(),
                },
                format!("unschedulable: {reason}"),
            )),
            placement::Outcome::Scheduled => None,
        })
}

/// Replaces a member's list; returns whether it differs from the one it replaces.
fn replace(
    by_cluster: &mut BTreeMap<ClusterId, Vec<Problem>>,
    cluster: &ClusterId,
    list: Vec<Problem>,
) -> bool {
    let changed = by_cluster.get(cluster) != Some(&list);
    by_cluster.insert(cluster.clone(), list);
    changed
}

#[cfg(test)]
mod tests;
