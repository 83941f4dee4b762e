//! Rollout: the order in which a template's decision reaches the members. A
//! decision says where replicas should run; the members say what they run now. Moving from
//! one to the other never takes capacity away before its replacement is ready:
//!
//! ```text
//!  growth    every placed cluster that does not shrink: a first copy, more replicas, or
//!            a new spec ─► written at once; "ready" when each runs its count, ready
//!  shrink    clusters the decision gives fewer replicas than they hold
//!            ─► Graceful: keep the count they hold until every growth is ready, or
//!               gracePeriodSeconds passed since the shrink was first seen
//!  drain     clusters that hold a copy the decision no longer places
//!            ─► Graceful: kept (not written, not deleted) until every growth is ready or
//!               the grace passed, then deleted; Immediately: deleted at once; Never: kept,
//!               no longer updated
//!  deleted   the template has no decision (deleted or unselected): every copy is deleted,
//!            unless the policy preserves them
//! ```
//!
//! Traffic follows the decision, not the rollout: a Service the same policy governs sends
//! its traffic to a drained cluster only when no placed cluster has ready endpoints
//! (`select`'s `NotPlaced` tier), so nothing waits for the deletion to stop sending there.
//!
//! Pure and deterministic: the caller reports what each member holds ([`Held`]) and `now`;
//! [`Rollout`] keeps only since when each cluster has been waiting.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::ClusterId;

use super::{Decision, PlacementFilter, Propagation, PurgeMode};

/// What a member holds of a template, as it reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// The replica count of the copy there (None for an object without replicas).
    pub replicas: Option<u32>,
    /// The member has observed the copy's latest spec and runs all its replicas ready.
    pub ready: bool,
}

/// A copy to write into a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Write {
    pub cluster: ClusterId,
    /// The replica count to write: the decision's, or the count held while a shrink waits.
    pub replicas: Option<u32>,
    /// A shrink waiting for the growth elsewhere to be ready: `replicas` is what it holds.
    pub held_back: bool,
}

/// A copy the decision no longer places, kept for now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    pub cluster: ClusterId,
    /// Why the decision left the cluster out (None: the decision names no reason, e.g.
    /// the template is unschedulable elsewhere or no longer selects it).
    pub reason: Option<PlacementFilter>,
    pub replicas: Option<u32>,
    /// How long it has been draining.
    pub waited_seconds: u64,
    /// `purgeMode: Never`: it stays for good, no longer updated.
    pub orphaned: bool,
}

/// What to do now for one template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Step {
    /// Clusters to write, in name order.
    pub writes: Vec<Write>,
    /// Copies kept, neither written nor deleted.
    pub draining: Vec<Drain>,
    /// Clusters whose copy is deleted.
    pub deletes: Vec<ClusterId>,
    /// Copies meridian stops managing (the template is gone and the policy preserves them).
    pub released: Vec<ClusterId>,
    /// When this step changes with time alone (a grace period ends).
    #[serde(skip)]
    pub deadline: Option<Instant>,
    /// Every placed cluster runs what the decision gives it, ready: what the old copies of
    /// the templates that follow this one wait for (make before break).
    pub growth_ready: bool,
}

impl Step {
    /// Every placed cluster is written with the decision's count and nothing is left to
    /// drain or delete.
    pub fn is_settled(&self) -> bool {
        self.draining.iter().all(|d| d.orphaned)
            && self.deletes.is_empty()
            && self.writes.iter().all(|w| !w.held_back)
    }
}

/// One template's rollout memory: since when each cluster has been waiting (a drain, or a
/// shrink held back).
#[derive(Clone, Debug, Default)]
pub struct Rollout {
    waiting: BTreeMap<ClusterId, Instant>,
}

impl Rollout {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next step of the template whose decision is `decision` (None: deleted or
    /// unselected), with `held` what each member holds of it now.
    pub fn step(
        &mut self,
        decision: Option<&Decision>,
        held: &BTreeMap<ClusterId, Held>,
        propagation: &Propagation,
        now: Instant,
    ) -> Step {
        self.step_after(decision, held, propagation, now, true)
    }

    /// [`Rollout::step`] of a template that follows workloads (its Service, its ConfigMaps):
    /// its old copies also wait until `leaders_ready`, every workload it follows running
    /// ready where it now goes. A planned move keeps the old cluster's Service, and so its
    /// endpoints and traffic, until the new cluster can answer.
    pub fn step_after(
        &mut self,
        decision: Option<&Decision>,
        held: &BTreeMap<ClusterId, Held>,
        propagation: &Propagation,
        now: Instant,
        leaders_ready: bool,
    ) -> Step {
        let Some(decision) = decision else {
            self.waiting.clear();
            return removed(held, propagation.preserve_on_deletion);
        };
        let graceful = propagation.purge_mode == PurgeMode::Graceful;
        // Nowhere placed (an unschedulable template with no earlier placement) is no
        // replacement: nothing it holds is deleted for it.
        let growth_ready = !decision.placed.is_empty()
            && decision.is_scheduled()
            && decision
                .placed
                .iter()
                .filter(|p| !shrinks(held.get(&p.cluster), p.replicas))
                .all(|p| settled(held.get(&p.cluster), p.replicas));
        let mut clock = Waits {
            before: &self.waiting,
            now: BTreeMap::new(),
            at: now,
            grace: Duration::from_secs(propagation.grace_period_seconds),
            growth_ready: growth_ready && leaders_ready,
            deadline: None,
        };
        let mut step = Step {
            growth_ready,
            ..Step::default()
        };
        for p in &decision.placed {
            let held_count = held.get(&p.cluster).and_then(|h| h.replicas);
            let held_back = shrinks(held.get(&p.cluster), p.replicas)
                && graceful
                && clock.wait(&p.cluster).is_some();
            step.writes.push(Write {
                cluster: p.cluster.clone(),
                replicas: if held_back { held_count } else { p.replicas },
                held_back,
            });
        }
        for (cluster, h) in held {
            if decision.replicas_in(cluster).is_some() {
                continue;
            }
            let drain = |waited: Duration, orphaned| Drain {
                cluster: cluster.clone(),
                reason: decision
                    .excluded
                    .iter()
                    .find(|e| &e.cluster == cluster)
                    .map(|e| e.reason.clone()),
                replicas: h.replicas,
                waited_seconds: waited.as_secs(),
                orphaned,
            };
            match propagation.purge_mode {
                PurgeMode::Immediately if decision.is_scheduled() => {
                    step.deletes.push(cluster.clone())
                }
                PurgeMode::Immediately => step.draining.push(drain(clock.keep(cluster), false)),
                PurgeMode::Never => step.draining.push(drain(clock.keep(cluster), true)),
                PurgeMode::Graceful => match clock.wait(cluster) {
                    Some(waited) => step.draining.push(drain(waited, false)),
                    None => step.deletes.push(cluster.clone()),
                },
            }
        }
        step.deadline = clock.deadline;
        self.waiting = clock.now;
        step
    }
}

/// The waiting clocks of one step.
struct Waits<'a> {
    before: &'a BTreeMap<ClusterId, Instant>,
    now: BTreeMap<ClusterId, Instant>,
    at: Instant,
    grace: Duration,
    growth_ready: bool,
    deadline: Option<Instant>,
}

impl Waits<'_> {
    /// Whether `cluster` still waits for the growth elsewhere: how long it has waited, or
    /// None when the growth is ready or the grace has passed.
    fn wait(&mut self, cluster: &ClusterId) -> Option<Duration> {
        let since = *self.before.get(cluster).unwrap_or(&self.at);
        // A grace too long to represent never ends.
        let ends = since.checked_add(self.grace);
        if self.growth_ready || ends.is_some_and(|e| self.at >= e) {
            return None;
        }
        if let Some(ends) = ends {
            self.deadline = Some(self.deadline.map_or(ends, |d| d.min(ends)));
        }
        Some(self.keep(cluster))
    }

    /// Keeps `cluster` waiting with no end; how long it has waited.
    fn keep(&mut self, cluster: &ClusterId) -> Duration {
        let since = *self.before.get(cluster).unwrap_or(&self.at);
        self.now.insert(cluster.clone(), since);
        self.at.saturating_duration_since(since)
    }
}

/// The template is gone: delete every copy, or release them all.
fn removed(held: &BTreeMap<ClusterId, Held>, preserve: bool) -> Step {
    let clusters = held.keys().cloned().collect();
    if preserve {
        Step {
            released: clusters,
            ..Step::default()
        }
    } else {
        Step {
            deletes: clusters,
            ..Step::default()
        }
    }
}

/// The decision gives the cluster fewer replicas than it holds.
fn shrinks(held: Option<&Held>, decided: Option<u32>) -> bool {
    matches!((held.and_then(|h| h.replicas), decided), (Some(h), Some(d)) if h > d)
}

/// The cluster runs what the decision gives it, ready.
fn settled(held: Option<&Held>, decided: Option<u32>) -> bool {
    held.is_some_and(|h| h.ready && (decided.is_none() || h.replicas == decided))
}

#[cfg(test)]
mod tests {
    use super::super::{Excluded, Outcome, Placed, PlacedReason, TemplateKey};
    use super::*;

    fn decision(placed: &[(&str, u32)], excluded: &[(&str, PlacementFilter)]) -> Decision {
        Decision {
            template: TemplateKey::new("apps/v1", "Deployment", "shop", "web"),
            policy: None,
            outcome: Outcome::Scheduled,
            tier: None,
            standby_tier: None,
            placed: placed
                .iter()
                .map(|(c, r)| Placed {
                    cluster: ClusterId::new(c),
                    replicas: Some(*r),
                    reason: PlacedReason::Weight(1),
                    overrides: Vec::new(),
                })
                .collect(),
            excluded: excluded
                .iter()
                .map(|(c, reason)| Excluded {
                    cluster: ClusterId::new(c),
                    reason: reason.clone(),
                })
                .collect(),
            scores: None,
        }
    }

    fn held(copies: &[(&str, u32, bool)]) -> BTreeMap<ClusterId, Held> {
        copies
            .iter()
            .map(|(c, r, ready)| {
                (
                    ClusterId::new(c),
                    Held {
                        replicas: Some(*r),
                        ready: *ready,
                    },
                )
            })
            .collect()
    }

    fn graceful(seconds: u64) -> Propagation {
        Propagation {
            grace_period_seconds: seconds,
            ..Propagation::default()
        }
    }

    fn writes(step: &Step) -> Vec<(&str, Option<u32>, bool)> {
        step.writes
            .iter()
            .map(|w| (w.cluster.as_str(), w.replicas, w.held_back))
            .collect()
    }

    fn names(clusters: &[ClusterId]) -> Vec<&str> {
        clusters.iter().map(ClusterId::as_str).collect()
    }

    fn failed_over() -> PlacementFilter {
        PlacementFilter::FailedOver {
            unreachable_seconds: 30,
        }
    }

    #[test]
    fn a_failed_over_cluster_drains_until_its_replacement_is_ready() {
        let now = Instant::now();
        let mut rollout = Rollout::new();
        let d = decision(&[("m2", 9)], &[("m1", failed_over())]);
        // m2 grew from 6 to 9 and is not ready yet: m1 keeps its copy.
        let step = rollout.step(
            Some(&d),
            &held(&[("m1", 3, true), ("m2", 6, true)]),
            &graceful(600),
            now,
        );
        assert_eq!(writes(&step), vec![("m2", Some(9), false)]);
        assert_eq!(step.draining.len(), 1);
        assert_eq!(step.draining[0].cluster.as_str(), "m1");
        assert_eq!(step.draining[0].reason, Some(failed_over()));
        assert!(step.deletes.is_empty());
        assert_eq!(step.deadline, Some(now + Duration::from_secs(600)));
        // Written, not ready: still draining, and the wait counts from the first step.
        let later = now + Duration::from_secs(5);
        let step = rollout.step(
            Some(&d),
            &held(&[("m1", 3, true), ("m2", 9, false)]),
            &graceful(600),
            later,
        );
        assert_eq!(step.draining[0].waited_seconds, 5);
        assert_eq!(step.deadline, Some(now + Duration::from_secs(600)));
        // Ready: m1 is deleted.
        let step = rollout.step(
            Some(&d),
            &held(&[("m1", 3, true), ("m2", 9, true)]),
            &graceful(600),
            later,
        );
        assert!(step.draining.is_empty());
        assert_eq!(names(&step.deletes), vec!["m1"]);
    }

    #[test]
    fn a_follower_keeps_its_old_copy_until_the_workloads_it_follows_are_ready() {
        let now = Instant::now();
        let mut rollout = Rollout::new();
        // The Service moved from m1 to m2 with its Deployment: its own copy in m2 is ready at
        // once (no replicas), yet m1's stays while the Deployment is not ready in m2.
        let mut d = decision(&[("m2", 0)], &[("m1", failed_over())]);
        d.placed[0].replicas = None;
        let copies: BTreeMap<ClusterId, Held> = [("m1", true), ("m2", true)]
            .into_iter()
            .map(|(c, ready)| {
                let held = Held {
                    replicas: None,
                    ready,
                };
                (ClusterId::new(c), held)
            })
            .collect();
        let step = rollout.step_after(Some(&d), &copies, &graceful(600), now, false);
        assert!(step.growth_ready, "its own copies are ready");
        assert_eq!(names(&step.deletes), Vec::<&str>::new());
        assert_eq!(step.draining.len(), 1, "{step:?}");
        let later = now + Duration::from_secs(3);
        let step = rollout.step_after(Some(&d), &copies, &graceful(600), later, true);
        assert_eq!(names(&step.deletes), vec!["m1"], "the workloads are ready");
        // Without the wait (a template placed on its own) it would have gone at once.
        let step = Rollout::new().step(Some(&d), &copies, &graceful(600), now);
        assert_eq!(names(&step.deletes), vec!["m1"]);
    }

    #[test]
    fn the_grace_period_ends_a_drain_whose_replacement_never_gets_ready() {
        let now = Instant::now();
        let mut rollout = Rollout::new();
        let d = decision(&[("m2", 9)], &[("m1", failed_over())]);
        let copies = held(&[("m1", 3, true), ("m2", 9, false)]);
        let step = rollout.step(Some(&d), &copies, &graceful(60), now);
        assert_eq!(step.draining.len(), 1);
        let step = rollout.step(
            Some(&d),
            &copies,
            &graceful(60),
            now + Duration::from_secs(60),
        );
        assert_eq!(names(&step.deletes), vec!["m1"]);
        assert_eq!(step.deadline, None);
    }

    #[test]
    fn failback_adds_first_and_shrinks_after_the_new_copy_is_ready() {
        let now = Instant::now();
        let mut rollout = Rollout::new();
        // m1 is placed again (3) and m2 goes back from 9 to 6.
        let d = decision(&[("m1", 3), ("m2", 6)], &[]);
        let step = rollout.step(Some(&d), &held(&[("m2", 9, true)]), &graceful(600), now);
        assert_eq!(
            writes(&step),
            vec![("m1", Some(3), false), ("m2", Some(9), true)]
        );
        assert!(!step.is_settled());
        let step = rollout.step(
            Some(&d),
            &held(&[("m1", 3, false), ("m2", 9, true)]),
            &graceful(600),
            now,
        );
        assert_eq!(writes(&step)[1], ("m2", Some(9), true));
        let step = rollout.step(
            Some(&d),
            &held(&[("m1", 3, true), ("m2", 9, true)]),
            &graceful(600),
            now,
        );
        assert_eq!(
            writes(&step),
            vec![("m1", Some(3), false), ("m2", Some(6), false)]
        );
        assert!(step.is_settled());
    }

    #[test]
    fn immediately_deletes_and_shrinks_at_once() {
        let mut rollout = Rollout::new();
        let d = decision(&[("m1", 3), ("m2", 6)], &[("m3", failed_over())]);
        let propagation = Propagation {
            purge_mode: PurgeMode::Immediately,
            ..Propagation::default()
        };
        let step = rollout.step(
            Some(&d),
            &held(&[("m2", 9, true), ("m3", 3, true)]),
            &propagation,
            Instant::now(),
        );
        assert_eq!(
            writes(&step),
            vec![("m1", Some(3), false), ("m2", Some(6), false)]
        );
        assert_eq!(names(&step.deletes), vec!["m3"]);
    }

    #[test]
    fn never_keeps_the_old_copy_for_good() {
        let now = Instant::now();
        let mut rollout = Rollout::new();
        let d = decision(&[("m2", 9)], &[("m1", failed_over())]);
        let propagation = Propagation {
            purge_mode: PurgeMode::Never,
            ..Propagation::default()
        };
        let copies = held(&[("m1", 3, true), ("m2", 9, true)]);
        let step = rollout.step(Some(&d), &copies, &propagation, now);
        assert!(step.draining[0].orphaned);
        let step = rollout.step(
            Some(&d),
            &copies,
            &propagation,
            now + Duration::from_secs(86_400),
        );
        assert!(step.deletes.is_empty());
        assert_eq!(step.draining[0].waited_seconds, 86_400);
        assert!(step.is_settled());
    }

    #[test]
    fn a_dropped_cluster_without_growth_elsewhere_is_deleted_at_once() {
        // The other clusters already run what they should: nothing to wait for.
        let mut rollout = Rollout::new();
        let d = decision(&[("m2", 6)], &[("m1", PlacementFilter::NotInAffinities)]);
        let step = rollout.step(
            Some(&d),
            &held(&[("m1", 3, true), ("m2", 6, true)]),
            &graceful(600),
            Instant::now(),
        );
        assert_eq!(names(&step.deletes), vec!["m1"]);
    }

    #[test]
    fn a_deleted_template_deletes_every_copy_unless_preserved() {
        let copies = held(&[("m1", 3, true), ("m2", 6, false)]);
        let step = Rollout::new().step(None, &copies, &graceful(600), Instant::now());
        assert_eq!(names(&step.deletes), vec!["m1", "m2"]);
        let preserve = Propagation {
            preserve_on_deletion: true,
            ..Propagation::default()
        };
        let step = Rollout::new().step(None, &copies, &preserve, Instant::now());
        assert!(step.deletes.is_empty());
        assert_eq!(names(&step.released), vec!["m1", "m2"]);
    }

    #[test]
    fn an_unschedulable_template_placed_nowhere_deletes_nothing() {
        let mut d = decision(&[], &[("m1", PlacementFilter::NoCapacity)]);
        d.outcome = Outcome::Unschedulable {
            reason: "no room".into(),
        };
        let copies = held(&[("m1", 3, true)]);
        for purge_mode in [PurgeMode::Graceful, PurgeMode::Immediately] {
            let propagation = Propagation {
                purge_mode,
                ..Propagation::default()
            };
            let step = Rollout::new().step(Some(&d), &copies, &propagation, Instant::now());
            assert!(step.deletes.is_empty(), "{purge_mode:?}: {step:?}");
            assert_eq!(step.draining.len(), 1);
        }
    }

    #[test]
    fn a_grace_period_too_long_to_represent_never_ends() {
        let d = decision(&[("m2", 9)], &[("m1", failed_over())]);
        let copies = held(&[("m1", 3, true), ("m2", 9, false)]);
        let step = Rollout::new().step(Some(&d), &copies, &graceful(u64::MAX), Instant::now());
        assert_eq!(step.draining.len(), 1);
        assert_eq!(step.deadline, None);
    }

    #[test]
    fn an_object_without_replicas_is_ready_once_it_exists() {
        let mut d = decision(&[("m1", 1)], &[]);
        d.placed[0].replicas = None;
        let whole = [(
            ClusterId::new("m1"),
            Held {
                replicas: None,
                ready: true,
            },
        )]
        .into_iter()
        .collect();
        let step = Rollout::new().step(Some(&d), &whole, &graceful(600), Instant::now());
        assert_eq!(writes(&step), vec![("m1", None, false)]);
        assert!(step.is_settled());
    }
}
