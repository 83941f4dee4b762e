//! The cluster Registry: which members exist and how healthy each one is.
//!
//! ```text
//!   heartbeat ok + watches ok ──► Healthy
//!   heartbeat ok, a watch failing/stalled, or heartbeats failing but recent ──► Degraded
//!   no good heartbeat for unreachableAfterSeconds ──► Unreachable
//!   Unreachable for withdrawAfterSeconds ──► withdrawn (endpoints leave DNS and xDS)
//! ```
//!
//! With several replicas "no good heartbeat" is only this replica's view: until a
//! majority of the live replicas confirm it ([`Registry::confirm`], `shard::confirm`), a member
//! this replica cannot reach stays Degraded — its last endpoints served, never withdrawn. A
//! single replica's members are always confirmed: today's behaviour.
//!
//! Time is passed in (`now`), so the machine is tested with a fake clock.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::model::{ClusterId, ClusterSpec};
use crate::shard::Confirmation;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Health {
    Healthy,
    Degraded,
    Unreachable,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Degraded => "Degraded",
            Health::Unreachable => "Unreachable",
        }
    }
}

/// The health record of one member.
#[derive(Clone, Debug)]
pub struct MemberHealth {
    pub health: Health,
    /// When `health` last changed.
    pub since: Instant,
    /// Last successful heartbeat; starts at registration so a new member gets its full grace.
    pub last_ok: Instant,
    /// Set once the member has synced or failed at least once: readiness waits for all of them.
    pub settled: bool,
    pub synced_once: bool,
    /// The reason of the last failure (heartbeat or watch), cleared when both are fine again.
    pub reason: Option<String>,
    /// Endpoints are withdrawn from DNS and xDS.
    pub withdrawn: bool,
    /// When the member last came back from Unreachable (failback waits from here).
    pub recovered_at: Option<Instant>,
    /// No good heartbeat for unreachableAfterSeconds, as this replica sees it (whether or not
    /// the other replicas confirm it): what this replica reports to them.
    pub unreachable_here: bool,
    /// What the other replicas say of `unreachable_here`.
    pub confirmation: Confirmation,
    heartbeat_failing: bool,
    watch_failing: bool,
    /// A transition of this member was told (the first one is `Transition::first`).
    told: bool,
    /// The reason of the newest failure, kept after it clears (a recovery says what ended).
    last_failure: Option<String>,
}

/// How the problem of a member that never synced starts (`Registry::never_synced`).
pub const NEVER_SYNCED: &str = "never synced: ";

/// A change of health, for logs, metrics and status conditions; `from == to` when only the
/// reason shown changed (a member lost from this replica alone, sharded writers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub cluster: ClusterId,
    pub from: Health,
    pub to: Health,
    pub withdrawn: bool,
    /// Whether the member was withdrawn before this transition.
    pub was_withdrawn: bool,
    pub reason: Option<String>,
    /// The member's first transition: its health was not known before (it had neither synced
    /// nor failed), so `from` is only the placeholder a new member starts with.
    pub first: bool,
    /// For a member coming back to Healthy: why it was not.
    pub recovered_from: Option<String>,
    /// How long the member was `from`.
    pub lasted: Duration,
}

#[derive(Debug, Default)]
pub struct Registry {
    specs: BTreeMap<ClusterId, ClusterSpec>,
    health: BTreeMap<ClusterId, MemberHealth>,
    /// Members need the other replicas' confirmation to be Unreachable (sharded writers).
    quorum: bool,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on a member this replica cannot reach is Unreachable only once the other
    /// replicas confirm it ([`Registry::confirm`]); until asked, it is `Pending`.
    pub fn require_confirmation(&mut self) {
        self.quorum = true;
        for h in self.health.values_mut() {
            h.confirmation = Confirmation::Pending;
        }
    }

    /// Adds or updates a member. A new member starts Degraded ("not yet synced") until its first
    /// heartbeat.
    pub fn upsert(&mut self, spec: ClusterSpec, now: Instant) -> bool {
        let id = spec.id.clone();
        let quorum = self.quorum;
        self.health
            .entry(id.clone())
            .or_insert_with(|| MemberHealth {
                health: Health::Degraded,
                since: now,
                last_ok: now,
                settled: false,
                synced_once: false,
                reason: Some("not yet synced".into()),
                withdrawn: false,
                recovered_at: None,
                unreachable_here: false,
                confirmation: if quorum {
                    Confirmation::Pending
                } else {
                    Confirmation::Confirmed
                },
                heartbeat_failing: false,
                watch_failing: false,
                told: false,
                last_failure: None,
            });
        match self.specs.get(&id) {
            Some(current) if *current == spec => false,
            _ => {
                self.specs.insert(id, spec);
                true
            }
        }
    }

    pub fn remove(&mut self, id: &ClusterId) -> bool {
        self.health.remove(id);
        self.specs.remove(id).is_some()
    }

    pub fn spec(&self, id: &ClusterId) -> Option<&ClusterSpec> {
        self.specs.get(id)
    }

    pub fn health(&self, id: &ClusterId) -> Option<&MemberHealth> {
        self.health.get(id)
    }

    pub fn ids(&self) -> impl Iterator<Item = &ClusterId> {
        self.specs.keys()
    }

    pub fn members(&self) -> impl Iterator<Item = (&ClusterSpec, &MemberHealth)> {
        self.specs
            .iter()
            .filter_map(|(id, spec)| Some((spec, self.health.get(id)?)))
    }

    /// Every member has synced or failed once (readiness, and DNS stops answering SERVFAIL).
    pub fn all_settled(&self) -> bool {
        self.health.values().all(|h| h.settled)
    }

    /// A heartbeat (API `/readyz`, or a directory read) succeeded. It settles the member and
    /// marks it synced once (`synced_once`), whatever its watches have listed by then.
    pub fn heartbeat_ok(&mut self, id: &ClusterId, now: Instant) -> Option<Transition> {
        let h = self.health.get_mut(id)?;
        h.last_ok = now;
        h.heartbeat_failing = false;
        h.settled = true;
        h.synced_once = true;
        if !h.watch_failing {
            h.reason = None;
        }
        self.evaluate(id, now)
    }

    pub fn heartbeat_failed(
        &mut self,
        id: &ClusterId,
        now: Instant,
        reason: impl Into<String>,
    ) -> Option<Transition> {
        let reason = reason.into();
        let h = self.health.get_mut(id)?;
        // A new failure, or a new reason for it, is news even when the health stays
        // (Degraded before the first sync): said at once, not after unreachableAfterSeconds.
        let news = !h.heartbeat_failing || h.reason.as_deref() != Some(reason.as_str());
        h.heartbeat_failing = true;
        h.settled = true;
        h.reason = Some(reason);
        self.evaluate(id, now)
            .or_else(|| news.then(|| self.unchanged(id)).flatten())
    }

    /// A transition that changes no health: only its reason is news.
    fn unchanged(&mut self, id: &ClusterId) -> Option<Transition> {
        let h = self.health.get_mut(id)?;
        let first = !std::mem::replace(&mut h.told, true);
        Some(Transition {
            cluster: id.clone(),
            from: h.health,
            to: h.health,
            withdrawn: h.withdrawn,
            was_withdrawn: h.withdrawn,
            reason: h.shown_reason(),
            first,
            recovered_from: None,
            lasted: Duration::ZERO,
        })
    }

    /// Members that have never synced and whose heartbeats fail, with the reason: nothing of
    /// theirs is served, so each is a problem at once (a directory that does not exist, a
    /// credential refused), not only a health after `unreachableAfterSeconds`.
    pub fn never_synced(&self) -> impl Iterator<Item = (&ClusterId, &str)> {
        self.health.iter().filter_map(|(id, h)| {
            (h.heartbeat_failing && !h.synced_once)
                .then_some((id, h.reason.as_deref().unwrap_or("not yet synced")))
        })
    }

    /// A watch failed or stalled (`Some(reason)`), or recovered (`None`).
    pub fn watch_status(
        &mut self,
        id: &ClusterId,
        now: Instant,
        failure: Option<String>,
    ) -> Option<Transition> {
        let h = self.health.get_mut(id)?;
        h.watch_failing = failure.is_some();
        // A failing watch is a member that failed once: it settles readiness as a failed
        // heartbeat does, so one broken watch cannot hold DNS in SERVFAIL until the deadline.
        h.settled |= failure.is_some();
        if failure.is_some() || !h.heartbeat_failing {
            h.reason = failure;
        }
        self.evaluate(id, now)
    }

    /// What the other replicas say of a member this replica may not reach.
    pub fn confirm(
        &mut self,
        id: &ClusterId,
        now: Instant,
        confirmation: Confirmation,
    ) -> Option<Transition> {
        let h = self.health.get_mut(id)?;
        if h.confirmation == confirmation {
            return None;
        }
        let before = h.served_stale();
        h.confirmation = confirmation;
        self.evaluate_from(id, now, before)
    }

    /// Re-evaluates every member against the clock; returns the transitions.
    pub fn tick(&mut self, now: Instant) -> Vec<Transition> {
        let ids: Vec<ClusterId> = self.specs.keys().cloned().collect();
        ids.iter().filter_map(|id| self.evaluate(id, now)).collect()
    }

    /// The earliest instant at which `tick` could change something, so the caller can sleep
    /// until then.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.members()
            .filter_map(|(spec, h)| match h.health {
                Health::Unreachable if !h.withdrawn => {
                    Some(h.since + secs(spec.health.withdraw_after_seconds))
                }
                Health::Unreachable => None,
                // Unreachable here, unconfirmed: the next confirmation decides, not the clock.
                _ if h.unreachable_here => None,
                _ if h.heartbeat_failing || !h.synced_once => {
                    Some(h.last_ok + secs(spec.health.unreachable_after_seconds))
                }
                _ => None,
            })
            .min()
    }

    fn evaluate(&mut self, id: &ClusterId, now: Instant) -> Option<Transition> {
        let before = self.health.get(id)?.served_stale();
        self.evaluate_from(id, now, before)
    }

    /// Evaluates a member whose `served_stale` was `before` the event being applied.
    fn evaluate_from(
        &mut self,
        id: &ClusterId,
        now: Instant,
        before: Option<Confirmation>,
    ) -> Option<Transition> {
        let timings = self.specs.get(id)?.health;
        let h = self.health.get_mut(id)?;
        let silent_for = now.saturating_duration_since(h.last_ok);
        h.unreachable_here = (h.heartbeat_failing || !h.synced_once)
            && silent_for >= secs(timings.unreachable_after_seconds);
        let unconfirmed = h.confirmation.why_served().filter(|_| h.unreachable_here);
        let next = if h.unreachable_here && unconfirmed.is_none() {
            Health::Unreachable
        } else if h.heartbeat_failing || h.watch_failing || !h.synced_once {
            Health::Degraded
        } else {
            Health::Healthy
        };
        let from = h.health;
        let lasted = now.saturating_duration_since(h.since);
        if h.reason.is_some() {
            h.last_failure.clone_from(&h.reason);
        }
        if next != from {
            h.health = next;
            h.since = now;
            if from == Health::Unreachable {
                h.recovered_at = Some(now);
            }
        }
        let withdrawn = next == Health::Unreachable
            && now.saturating_duration_since(h.since) >= secs(timings.withdraw_after_seconds);
        let was_withdrawn = h.withdrawn;
        let withdrawn_changed = withdrawn != was_withdrawn;
        h.withdrawn = withdrawn;
        // Lost or found from here, or told otherwise by the replicas, while the health shown
        // stays (sharded): the reason shown changed, worth a snapshot and a log line.
        let stale_changed = before != h.served_stale();
        if !(next != from || withdrawn_changed || stale_changed) {
            return None;
        }
        let first = !std::mem::replace(&mut h.told, true);
        let recovered = next == Health::Healthy && from != Health::Healthy && !first;
        Some(Transition {
            cluster: id.clone(),
            from,
            to: next,
            withdrawn,
            was_withdrawn,
            reason: h.shown_reason(),
            first,
            recovered_from: h.last_failure.clone().filter(|_| recovered),
            lasted,
        })
    }
}

impl MemberHealth {
    /// What the replicas say of this member while this replica cannot reach it (None: it can).
    fn served_stale(&self) -> Option<Confirmation> {
        self.unreachable_here.then_some(self.confirmation)
    }

    /// The reason to show: the last failure, and why the member is still served if this
    /// replica alone cannot reach it.
    pub fn shown_reason(&self) -> Option<String> {
        let unconfirmed = self
            .confirmation
            .why_served()
            .filter(|_| self.unreachable_here && self.health != Health::Unreachable);
        match (unconfirmed, &self.reason) {
            (Some(why), Some(failure)) => Some(format!("{why} (last failure: {failure})")),
            (Some(why), None) => Some(why),
            (None, failure) => failure.clone(),
        }
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> (Registry, ClusterId, Instant) {
        let mut reg = Registry::new();
        let t0 = Instant::now();
        let mut spec = ClusterSpec::named("eu-1");
        spec.health.unreachable_after_seconds = 15;
        spec.health.withdraw_after_seconds = 120;
        reg.upsert(spec, t0);
        (reg, ClusterId::new("eu-1"), t0)
    }

    #[test]
    fn with_sharded_writers_a_member_lost_here_waits_for_the_replicas_answer() {
        let (mut reg, id, t0) = fixture();
        reg.require_confirmation();
        let at = |s| t0 + Duration::from_secs(s);
        reg.heartbeat_ok(&id, t0);
        reg.heartbeat_failed(&id, at(1), "connection refused");
        let t = reg.tick(at(16));
        assert_eq!(
            (t[0].from, t[0].to),
            (Health::Degraded, Health::Degraded),
            "Unreachable before anyone was asked"
        );
        let h = reg.health(&id).unwrap();
        assert_eq!((h.health, h.unreachable_here), (Health::Degraded, true));
        assert!(
            h.shown_reason()
                .unwrap()
                .contains("asking the other replicas")
        );
        let t = reg.confirm(&id, at(17), Confirmation::Confirmed).unwrap();
        assert_eq!(t.to, Health::Unreachable);
        // A member registered later starts Pending too.
        reg.upsert(ClusterSpec::named("eu-2"), at(18));
        let h = reg.health(&ClusterId::new("eu-2")).unwrap();
        assert_eq!(h.confirmation, Confirmation::Pending);
    }

    #[test]
    fn a_member_unreachable_from_this_replica_alone_is_served_and_never_withdrawn() {
        let (mut reg, id, t0) = fixture();
        reg.heartbeat_ok(&id, t0);
        let at = |s| t0 + Duration::from_secs(s);
        reg.heartbeat_failed(&id, at(1), "connection refused");
        // The others still reach it: Degraded, saying why, with no deadline to wake for.
        let minority = Confirmation::Minority {
            unreachable: 1,
            live: 3,
        };
        reg.confirm(&id, at(2), minority);
        let t = reg.tick(at(16));
        let h = reg.health(&id).unwrap();
        // Only the reason shown changes: a transition from Degraded to Degraded, for a snapshot.
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(
            (t[0].from, t[0].to, t[0].withdrawn),
            (Health::Degraded, Health::Degraded, false)
        );
        assert!(
            t[0].reason.as_deref().unwrap().contains("only 1 of 3"),
            "{t:?}"
        );
        assert!(h.unreachable_here);
        assert_eq!(h.health, Health::Degraded);
        let reason = h.shown_reason().unwrap();
        assert!(
            reason.contains("only 1 of 3") && reason.contains("connection refused"),
            "{reason}"
        );
        assert_eq!(reg.next_deadline(), None);
        reg.tick(at(500));
        assert!(
            !reg.health(&id).unwrap().withdrawn,
            "withdrawn on this replica's view alone"
        );
        // Cut off from the hub too: still served, saying so.
        let t = reg
            .confirm(&id, at(501), Confirmation::HubUnreadable)
            .unwrap();
        assert_eq!(t.to, Health::Degraded);
        assert!(t.reason.unwrap().contains("hub"));
        assert_eq!(reg.health(&id).unwrap().health, Health::Degraded);
        // A majority confirms: Unreachable from then, withdrawn a grace later.
        let t = reg.confirm(&id, at(502), Confirmation::Confirmed).unwrap();
        assert_eq!(
            (t.from, t.to, t.withdrawn),
            (Health::Degraded, Health::Unreachable, false)
        );
        assert_eq!(reg.next_deadline(), Some(at(622)));
        let t = reg.tick(at(622));
        assert!(t[0].withdrawn);
        // The majority reaches it again (our view unchanged): served, not withdrawn.
        let t = reg.confirm(&id, at(630), minority).unwrap();
        assert_eq!((t.to, t.withdrawn), (Health::Degraded, false));
        // And our own heartbeat recovers it.
        reg.heartbeat_ok(&id, at(631));
        let h = reg.health(&id).unwrap();
        assert_eq!((h.health, h.unreachable_here), (Health::Healthy, false));
        assert_eq!(h.shown_reason(), None);
    }

    #[test]
    fn a_failing_watch_settles_readiness_and_a_healthy_one_does_not() {
        let (mut reg, id, t0) = fixture();
        reg.watch_status(&id, t0, None);
        assert!(!reg.all_settled(), "watches being fine is not a sync");
        reg.watch_status(&id, t0, Some("watch Service: 403 Forbidden".into()));
        assert!(
            reg.all_settled(),
            "a failed watch is a member that failed once"
        );
        assert_eq!(reg.health(&id).unwrap().health, Health::Degraded);
    }

    #[test]
    fn a_new_member_is_degraded_and_unsettled_until_first_heartbeat() {
        let (mut reg, id, t0) = fixture();
        assert_eq!(reg.health(&id).unwrap().health, Health::Degraded);
        assert!(!reg.all_settled());
        let t = reg.heartbeat_ok(&id, t0).unwrap();
        assert_eq!((t.from, t.to), (Health::Degraded, Health::Healthy));
        assert!(reg.all_settled());
    }

    #[test]
    fn the_first_transition_is_marked_and_a_recovery_says_what_ended() {
        let (mut reg, id, t0) = fixture();
        let at = |s| t0 + Duration::from_secs(s);
        let first = reg.heartbeat_ok(&id, t0).unwrap();
        assert!(first.first && first.recovered_from.is_none(), "{first:?}");
        reg.heartbeat_failed(&id, at(1), "connection refused");
        let lost = reg.tick(at(20));
        assert_eq!(lost[0].to, Health::Unreachable);
        assert!(!lost[0].first);
        let back = reg.heartbeat_ok(&id, at(32)).unwrap();
        assert_eq!((back.from, back.to), (Health::Unreachable, Health::Healthy));
        assert_eq!(back.recovered_from.as_deref(), Some("connection refused"));
        assert_eq!(back.lasted, Duration::from_secs(12));
        // A member whose first word is a failure: marked first too, and not a change of health.
        let (mut reg, id, t0) = fixture();
        let failed = reg.heartbeat_failed(&id, t0, "connection refused").unwrap();
        assert!(failed.first && failed.from == failed.to, "{failed:?}");
    }

    #[test]
    fn a_failed_first_heartbeat_settles_readiness() {
        let (mut reg, id, t0) = fixture();
        reg.heartbeat_failed(&id, t0, "connection refused");
        assert!(reg.all_settled());
        assert_eq!(
            reg.health(&id).unwrap().reason.as_deref(),
            Some("connection refused")
        );
    }

    #[test]
    fn silence_goes_degraded_then_unreachable_then_withdrawn() {
        let (mut reg, id, t0) = fixture();
        reg.heartbeat_ok(&id, t0);
        let t = reg
            .heartbeat_failed(&id, t0 + secs(1), "directory missing")
            .unwrap();
        assert_eq!(t.to, Health::Degraded);
        assert!(reg.tick(t0 + secs(14)).is_empty());
        let t = reg.tick(t0 + secs(15));
        assert_eq!(t[0].to, Health::Unreachable);
        assert!(!t[0].withdrawn);
        assert_eq!(reg.next_deadline(), Some(t0 + secs(135)));
        assert!(reg.tick(t0 + secs(134)).is_empty());
        let t = reg.tick(t0 + secs(135));
        assert!(t[0].withdrawn);
        assert!(reg.health(&id).unwrap().withdrawn);
    }

    #[test]
    fn recovery_restores_healthy_and_clears_withdrawal() {
        let (mut reg, id, t0) = fixture();
        reg.heartbeat_ok(&id, t0);
        reg.heartbeat_failed(&id, t0, "down");
        reg.tick(t0 + secs(200));
        reg.tick(t0 + secs(400));
        assert!(reg.health(&id).unwrap().withdrawn);
        let t = reg.heartbeat_ok(&id, t0 + secs(401)).unwrap();
        assert_eq!(t.to, Health::Healthy);
        assert!(!t.withdrawn);
        assert!(reg.health(&id).unwrap().reason.is_none());
    }

    #[test]
    fn a_failing_watch_degrades_a_member_with_good_heartbeats() {
        let (mut reg, id, t0) = fixture();
        reg.heartbeat_ok(&id, t0);
        let t = reg
            .watch_status(&id, t0, Some("watch stalled".into()))
            .unwrap();
        assert_eq!(t.to, Health::Degraded);
        assert!(
            reg.tick(t0 + secs(1000)).is_empty(),
            "heartbeats still answer"
        );
        let t = reg.watch_status(&id, t0, None).unwrap();
        assert_eq!(t.to, Health::Healthy);
    }

    #[test]
    fn a_member_never_heard_from_becomes_unreachable() {
        let (mut reg, id, t0) = fixture();
        let t = reg.tick(t0 + secs(15));
        assert_eq!(t[0].to, Health::Unreachable);
        assert_eq!(reg.health(&id).unwrap().health, Health::Unreachable);
    }
}
