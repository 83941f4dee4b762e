//! Which templates a propagation pass looks at: a pass costs what changed, not what is placed.
//!
//! A template is looked at again when one of its inputs changed since the pass that last
//! looked at it:
//! - its decision (placement keeps an unchanged decision as the same `Arc`), its body (the
//!   same `Arc`, or the same fingerprint of what a render reads: not its status) or its
//!   generation;
//! - the OverridePolicies or any policy's propagation settings (everything is looked at);
//! - a copy of it in a member (the member's watches name the templates whose copies they saw
//!   change);
//! - a member it is placed in or held by: reachable or not, written by this replica or not,
//!   listed, its health, its HPAs, a watch that listed again, a new
//!   connection;
//! - it was not settled last time: a rollout under way, a deadline, a write sent, an error, a
//!   conflict, a copy not yet applied.
//!
//! What each member holds is kept here too, updated from the same watch events: who holds a
//! template's copies is a lookup, not a walk over every member's objects.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use meridian_core::placement::{Decision, PlacedReason, Placements, TemplateKey};
use meridian_core::{ClusterId, OverridePolicy, Snapshot, Template};
use meridian_federation::render;
use serde_json::Value;

use super::super::apply;
use super::copies::LiveCopy;

/// Per template, the members holding a copy of it and the copy.
pub(super) type Holders = HashMap<TemplateKey, BTreeMap<ClusterId, Arc<LiveCopy>>>;

/// What a member's watches saw since the last pass (the watch tasks fill it in).
#[derive(Debug, Default)]
pub(super) struct Events {
    /// Templates one of whose copies was added, changed or deleted.
    pub(super) templates: HashSet<TemplateKey>,
    /// A watch listed (again) or failed: what the member holds is read whole.
    pub(super) relisted: bool,
    /// An HPA changed (what the member's HPAs scale is read again).
    pub(super) hpas: bool,
}

/// What one template was last looked at with.
struct Stamp {
    decision: Option<Arc<Decision>>,
    body: Option<(Arc<Value>, u64)>,
    generation: i64,
}

/// The inputs each template was last looked at with, and what each member holds.
#[derive(Default)]
pub(super) struct Dirty {
    placements: Option<Arc<Placements>>,
    templates: Option<Arc<[Template]>>,
    overrides: Option<Arc<[OverridePolicy]>>,
    stamps: HashMap<TemplateKey, Stamp>,
    /// Per template, its place in the snapshot's template list.
    at: HashMap<TemplateKey, usize>,
    /// Per member, the templates its decisions place there.
    placed_in: HashMap<ClusterId, HashSet<TemplateKey>>,
    /// Per member, the templates it holds a copy of.
    held_in: HashMap<ClusterId, HashSet<TemplateKey>>,
    holders: Holders,
    /// Templates that follow other templates' workloads.
    followers: Vec<TemplateKey>,
    /// Looked at again next pass whatever changes.
    unsettled: HashSet<TemplateKey>,
}

impl Dirty {
    /// Forgets everything: the next pass looks at every template and member afresh.
    pub(super) fn forget(&mut self) {
        *self = Self::default();
    }

    pub(super) fn holders(&self) -> &Holders {
        &self.holders
    }

    /// The template of `key` in the snapshot last given to [`Dirty::inputs`].
    pub(super) fn template<'a>(
        &self,
        snapshot: &'a Snapshot,
        key: &TemplateKey,
    ) -> Option<&'a Template> {
        self.at.get(key).and_then(|&i| snapshot.templates.get(i))
    }

    /// The fingerprint of `key`'s body as last looked at.
    pub(super) fn body_print(&self, key: &TemplateKey) -> Option<u64> {
        self.stamps.get(key)?.body.as_ref().map(|(_, print)| *print)
    }

    /// Templates that follow other templates' workloads.
    pub(super) fn followers(&self) -> &[TemplateKey] {
        &self.followers
    }

    /// The templates whose decision, body or generation changed since the last pass (every
    /// template when the overrides or a policy's propagation settings changed).
    pub(super) fn inputs(&mut self, snapshot: &Snapshot) -> HashSet<TemplateKey> {
        let placements_moved = !same(&self.placements, &snapshot.placements);
        let templates_moved = !same(&self.templates, &snapshot.templates);
        let overrides_moved = !same(&self.overrides, &snapshot.overrides);
        if !(placements_moved || templates_moved || overrides_moved) {
            return HashSet::new();
        }
        let everything = (overrides_moved
            && self.overrides.as_deref() != Some(&*snapshot.overrides))
            || (placements_moved
                && self
                    .placements
                    .as_ref()
                    .is_none_or(|p| p.propagation != snapshot.placements.propagation));
        if templates_moved {
            self.at = snapshot
                .templates
                .iter()
                .enumerate()
                .map(|(i, t)| (t.key.clone(), i))
                .collect();
        }
        if placements_moved {
            self.followers = snapshot
                .placements
                .decisions
                .iter()
                .filter(|(_, d)| {
                    d.placed
                        .iter()
                        .any(|p| matches!(p.reason, PlacedReason::Follows(_)))
                })
                .map(|(k, _)| k.clone())
                .collect();
        }
        self.placements = Some(snapshot.placements.clone());
        self.templates = Some(snapshot.templates.clone());
        self.overrides = Some(snapshot.overrides.clone());
        let mut changed = HashSet::new();
        let keys: HashSet<&TemplateKey> = snapshot
            .placements
            .decisions
            .keys()
            .chain(snapshot.templates.iter().map(|t| &t.key))
            .collect();
        for key in keys {
            if self.restamp(snapshot, key) {
                changed.insert(key.clone());
            }
        }
        let gone: Vec<TemplateKey> = self
            .stamps
            .keys()
            .filter(|k| {
                !snapshot.placements.decisions.contains_key(*k) && !self.at.contains_key(*k)
            })
            .cloned()
            .collect();
        for key in gone {
            if let Some(old) = self.stamps.remove(&key) {
                self.unplace(&key, old.decision.as_deref());
            }
            changed.insert(key);
        }
        if everything {
            changed.extend(self.everything(snapshot));
        }
        changed
    }

    /// Takes `key`'s inputs from the snapshot; true when they changed.
    fn restamp(&mut self, snapshot: &Snapshot, key: &TemplateKey) -> bool {
        let decision = snapshot.placements.decisions.get(key);
        let template = self.template(snapshot, key);
        let old = self.stamps.get(key);
        let same_decision = match (old.and_then(|s| s.decision.as_ref()), decision) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        let old_body = old.and_then(|s| s.body.as_ref());
        // A hub that reads its templates again (a directory) hands on equal bodies in new
        // `Arc`s: comparing them costs less than fingerprinting what a render reads.
        let body = template.map(|t| match old_body {
            Some((b, print)) if Arc::ptr_eq(b, &t.body) || **b == *t.body => {
                (t.body.clone(), *print)
            }
            _ => (t.body.clone(), body_print(&t.body)),
        });
        let generation = template.map_or(0, |t| t.generation);
        let same_template = old.is_some_and(|s| {
            s.generation == generation && s.body.as_ref().map(|b| b.1) == body.as_ref().map(|b| b.1)
        });
        if old.is_some() && same_decision && same_template {
            // Keep the newest body so the next pass compares pointers again.
            if let (Some(s), Some(b)) = (self.stamps.get_mut(key), body) {
                s.body = Some(b);
            }
            return false;
        }
        let old_decision = self.stamps.remove(key).and_then(|s| s.decision);
        if !same_decision {
            self.unplace(key, old_decision.as_deref());
            if let Some(d) = decision {
                for p in &d.placed {
                    self.placed_in
                        .entry(p.cluster.clone())
                        .or_default()
                        .insert(key.clone());
                }
            }
        }
        self.stamps.insert(
            key.clone(),
            Stamp {
                decision: decision.cloned(),
                body,
                generation,
            },
        );
        true
    }

    fn unplace(&mut self, key: &TemplateKey, decision: Option<&Decision>) {
        for p in decision.iter().flat_map(|d| &d.placed) {
            if let Some(keys) = self.placed_in.get_mut(&p.cluster) {
                keys.remove(key);
            }
        }
    }

    /// Takes in what `cluster`'s watches saw: with `whole`, what it holds is read again
    /// from `holdings` and every template placed in or held by it is looked at; otherwise
    /// only the templates its events name, their copies read with `live`. Returns the
    /// templates to look at.
    pub(super) fn member(
        &mut self,
        cluster: &ClusterId,
        whole: bool,
        events: HashSet<TemplateKey>,
        live: impl Fn(&TemplateKey) -> Option<Arc<LiveCopy>>,
        holdings: impl FnOnce() -> BTreeMap<TemplateKey, Arc<LiveCopy>>,
    ) -> HashSet<TemplateKey> {
        if !whole {
            for key in &events {
                match live(key) {
                    Some(copy) => self.hold(cluster, key, copy),
                    None => self.unhold(cluster, key),
                }
            }
            return events;
        }
        let mut touched = self.drop_member(cluster);
        for (key, copy) in holdings() {
            self.hold(cluster, &key, copy);
            touched.insert(key);
        }
        touched.extend(events);
        touched
    }

    /// Forgets what `cluster` holds (its slot is gone, or it is read whole again); returns
    /// the templates placed in or held by it.
    pub(super) fn drop_member(&mut self, cluster: &ClusterId) -> HashSet<TemplateKey> {
        let mut touched: HashSet<TemplateKey> = self
            .placed_in
            .get(cluster)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default();
        for key in self.held_in.remove(cluster).unwrap_or_default() {
            if let Some(holders) = self.holders.get_mut(&key) {
                holders.remove(cluster);
                if holders.is_empty() {
                    self.holders.remove(&key);
                }
            }
            touched.insert(key);
        }
        touched
    }

    /// The members whose holdings are kept, for finding those whose slot is gone.
    pub(super) fn members(&self) -> Vec<ClusterId> {
        self.held_in.keys().cloned().collect()
    }

    fn hold(&mut self, cluster: &ClusterId, key: &TemplateKey, copy: Arc<LiveCopy>) {
        self.holders
            .entry(key.clone())
            .or_default()
            .insert(cluster.clone(), copy);
        self.held_in
            .entry(cluster.clone())
            .or_default()
            .insert(key.clone());
    }

    fn unhold(&mut self, cluster: &ClusterId, key: &TemplateKey) {
        if let Some(holders) = self.holders.get_mut(key) {
            holders.remove(cluster);
            if holders.is_empty() {
                self.holders.remove(key);
            }
        }
        if let Some(keys) = self.held_in.get_mut(cluster) {
            keys.remove(key);
        }
    }

    /// Every template placed or held anywhere.
    pub(super) fn everything(&self, snapshot: &Snapshot) -> HashSet<TemplateKey> {
        snapshot
            .placements
            .decisions
            .keys()
            .chain(self.holders.keys())
            .cloned()
            .collect()
    }

    /// The templates last pass left unsettled (looked at again now).
    pub(super) fn take_unsettled(&mut self) -> HashSet<TemplateKey> {
        std::mem::take(&mut self.unsettled)
    }

    /// `key` is looked at again next pass whatever changes.
    pub(super) fn unsettled(&mut self, key: TemplateKey) {
        self.unsettled.insert(key);
    }
}

/// The fingerprint of what a render reads of `body` (not its status: the hub's aggregated
/// status written onto a template changes no copy).
pub(super) fn body_print(body: &Value) -> u64 {
    apply::fingerprint(&render::rendered_part(body))
}

fn same<T: ?Sized>(last: &Option<Arc<T>>, now: &Arc<T>) -> bool {
    last.as_ref().is_some_and(|l| Arc::ptr_eq(l, now))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use meridian_core::placement::{Outcome, Placed};
    use serde_json::json;

    use super::*;

    fn key(name: &str) -> TemplateKey {
        TemplateKey::new("apps/v1", "Deployment", "shop", name)
    }

    fn template(name: &str, image: &str) -> Template {
        Template {
            key: key(name),
            labels: Default::default(),
            generation: 1,
            replicas: Some(1),
            requests: Default::default(),
            dependencies: Vec::new(),
            body: Arc::new(json!({"kind": "Deployment", "metadata": {"name": name},
                                  "spec": {"image": image}})),
        }
    }

    fn decision(name: &str, clusters: &[&str]) -> Arc<Decision> {
        Arc::new(Decision {
            template: key(name),
            policy: None,
            outcome: Outcome::Scheduled,
            tier: None,
            standby_tier: None,
            placed: clusters
                .iter()
                .map(|c| Placed {
                    cluster: ClusterId::new(c),
                    replicas: Some(1),
                    reason: PlacedReason::Duplicated,
                    overrides: Vec::new(),
                })
                .collect(),
            excluded: Arc::default(),
            scores: None,
        })
    }

    /// web in m1 and m2, api in m2 and m3.
    fn snapshot() -> Snapshot {
        let mut s = Snapshot::default();
        s.templates = vec![template("web", "v1"), template("api", "v1")].into();
        let p = Arc::make_mut(&mut s.placements);
        p.decisions
            .insert(key("web"), decision("web", &["m1", "m2"]));
        p.decisions
            .insert(key("api"), decision("api", &["m2", "m3"]));
        s
    }

    /// A new snapshot sharing `s`'s templates, decisions and overrides.
    fn like(s: &Snapshot) -> Snapshot {
        let mut out = Snapshot::default();
        out.templates = s.templates.clone();
        out.placements = s.placements.clone();
        out.overrides = s.overrides.clone();
        out
    }

    fn names(keys: &HashSet<TemplateKey>) -> Vec<String> {
        let mut v: Vec<String> = keys.iter().map(|k| k.name.to_string()).collect();
        v.sort();
        v
    }

    fn copy(name: &str) -> Arc<LiveCopy> {
        Arc::new(LiveCopy::of(&kube::api::DynamicObject {
            types: None,
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            data: json!({}),
        }))
    }

    #[test]
    fn the_first_pass_looks_at_everything_and_the_next_at_nothing() {
        let s = snapshot();
        let mut d = Dirty::default();
        assert_eq!(names(&d.inputs(&s)), ["api", "web"]);
        assert!(d.inputs(&s).is_empty());
        // A snapshot made again with the same decisions and bodies (other Arcs of the lists).
        let mut again = like(&s);
        again.templates = s.templates.iter().cloned().collect::<Vec<_>>().into();
        again.placements = Arc::new((*s.placements).clone());
        assert!(d.inputs(&again).is_empty());
    }

    #[test]
    fn an_edited_body_or_decision_marks_only_its_template() {
        let s = snapshot();
        let mut d = Dirty::default();
        d.inputs(&s);
        let mut edited = like(&s);
        edited.templates = vec![template("web", "v2"), s.templates[1].clone()].into();
        assert_eq!(names(&d.inputs(&edited)), ["web"]);
        let mut moved = like(&edited);
        Arc::make_mut(&mut moved.placements)
            .decisions
            .insert(key("api"), decision("api", &["m3"]));
        assert_eq!(names(&d.inputs(&moved)), ["api"]);
        // The policy edit moved api out of m2: m2 read whole now looks at web only.
        assert_eq!(
            names(&d.member(
                &ClusterId::new("m2"),
                true,
                HashSet::new(),
                |_| None,
                BTreeMap::new
            )),
            ["web"]
        );
    }

    #[test]
    fn a_status_written_onto_a_template_marks_nothing() {
        let s = snapshot();
        let mut d = Dirty::default();
        d.inputs(&s);
        let mut with_status = template("web", "v1");
        with_status.body = Arc::new(json!({"kind": "Deployment", "metadata": {"name": "web",
            "resourceVersion": "77"}, "spec": {"image": "v1"}, "status": {"readyReplicas": 3}}));
        let mut written = like(&s);
        written.templates = vec![with_status, s.templates[1].clone()].into();
        assert!(d.inputs(&written).is_empty());
    }

    #[test]
    fn a_copy_changing_in_one_member_marks_its_template_and_holders_follow() {
        let s = snapshot();
        let mut d = Dirty::default();
        d.inputs(&s);
        let m1 = ClusterId::new("m1");
        let events = HashSet::from([key("web")]);
        let touched = d.member(&m1, false, events, |_| Some(copy("web")), BTreeMap::new);
        assert_eq!(names(&touched), ["web"]);
        assert_eq!(d.holders()[&key("web")].keys().collect::<Vec<_>>(), [&m1]);
        // Deleted: no longer held.
        let events = HashSet::from([key("web")]);
        d.member(&m1, false, events, |_| None, BTreeMap::new);
        assert!(!d.holders().contains_key(&key("web")));
    }

    #[test]
    fn a_member_seen_whole_marks_what_is_placed_in_or_held_by_it_and_nothing_else() {
        let s = snapshot();
        let mut d = Dirty::default();
        d.inputs(&s);
        let m3 = ClusterId::new("m3");
        // m3 holds an old copy of web (placed elsewhere now) and is placed api.
        let touched = d.member(
            &m3,
            true,
            HashSet::new(),
            |_| None,
            || BTreeMap::from([(key("web"), copy("web"))]),
        );
        assert_eq!(names(&touched), ["api", "web"]);
        let m1 = ClusterId::new("m1");
        assert_eq!(
            names(&d.member(&m1, true, HashSet::new(), |_| None, BTreeMap::new)),
            ["web"]
        );
        // m3's slot is gone: what it held is no longer held.
        assert_eq!(names(&d.drop_member(&m3)), ["api", "web"]);
        assert!(!d.holders().contains_key(&key("web")));
    }

    #[test]
    fn a_template_deleted_is_looked_at_once_more() {
        let s = snapshot();
        let mut d = Dirty::default();
        d.inputs(&s);
        let mut gone = like(&s);
        gone.templates = vec![s.templates[1].clone()].into();
        Arc::make_mut(&mut gone.placements)
            .decisions
            .remove(&key("web"));
        assert_eq!(names(&d.inputs(&gone)), ["web"]);
        assert!(d.inputs(&gone).is_empty());
        assert_eq!(
            names(&d.member(
                &ClusterId::new("m1"),
                true,
                HashSet::new(),
                |_| None,
                BTreeMap::new
            )),
            Vec::<String>::new()
        );
    }

    #[test]
    fn new_overrides_look_at_everything() {
        let s = snapshot();
        let mut d = Dirty::default();
        d.inputs(&s);
        let mut same = like(&s);
        same.overrides = Vec::new().into();
        assert!(d.inputs(&same).is_empty(), "equal overrides in a new list");
        let mut other = like(&s);
        other.overrides = vec![OverridePolicy {
            key: meridian_core::ObjectKey::new("shop", "canary"),
            selectors: Vec::new(),
            rules: Vec::new(),
        }]
        .into();
        assert_eq!(names(&d.inputs(&other)), ["api", "web"]);
    }
}
