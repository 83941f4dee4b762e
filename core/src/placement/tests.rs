//! Placement tests: a small world (cluster views, capacities, templates, policies) decided on
//! a fake clock (`t0` plus seconds), with readable views of a decision.

use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::model::{ClusterSpec, Taint, TaintEffect};
use crate::policy::{AffinityTier, Toleration};
use crate::selector::{ClusterSet, WeightRule};
use crate::snapshot::ClusterView;
use crate::testing::{cluster, deployment, healthy, placing, secs};

mod capacity;
mod divide;
mod incremental;
mod props;
mod rules;
mod scoring;

/// Everything a round reads, owned.
#[derive(Clone)]
struct World {
    t0: Instant,
    views: Vec<ClusterView>,
    capacities: Vec<Option<Capacity>>,
    templates: Vec<Template>,
    policies: Vec<Policy>,
    overrides: Vec<OverridePolicy>,
    programs: Arc<dyn Programs>,
}

impl World {
    /// Healthy clusters `names` (region = the part before the first `-`, zone = the name),
    /// capacity unknown, no templates or policies.
    fn new(names: &[&str]) -> Self {
        let views = names
            .iter()
            .map(|n| {
                let region = n.split('-').next().unwrap_or(n);
                healthy(cluster(n, region, n))
            })
            .collect::<Vec<_>>();
        Self {
            t0: Instant::now(),
            capacities: vec![None; views.len()],
            views,
            templates: Vec::new(),
            policies: Vec::new(),
            overrides: Vec::new(),
            programs: Arc::new(NoPrograms),
        }
    }

    fn at(&self, s: u64) -> Instant {
        self.t0 + secs(s)
    }

    fn view(&mut self, name: &str) -> &mut ClusterView {
        self.views
            .iter_mut()
            .find(|v| v.spec.id.as_str() == name)
            .unwrap_or_else(|| panic!("no cluster {name}"))
    }

    fn spec(&mut self, name: &str) -> &mut ClusterSpec {
        &mut self.view(name).spec
    }

    /// Free pods per cluster, in the order of `new`.
    fn pods(mut self, free: &[u64]) -> Self {
        self.capacities = free
            .iter()
            .map(|&f| Some(crate::testing::pods_free(f)))
            .collect();
        self
    }

    fn policy(mut self, tiers: Vec<AffinityTier>, placement: PlacementPolicy) -> Self {
        self.policies = vec![placing("p", 0, tiers, placement)];
        self
    }

    /// A policy `name` placing only the template `template`, ahead of (older than) the
    /// others, so it governs that template whatever the others select.
    fn policy_for(
        mut self,
        name: &str,
        template: &str,
        tiers: Vec<AffinityTier>,
        placement: PlacementPolicy,
    ) -> Self {
        let mut policy = placing(name, -1, tiers, placement);
        policy.templates[0].name = Some(template.to_owned());
        self.policies.insert(0, policy);
        self
    }

    /// `name`'s capacity.
    fn capacity(mut self, name: &str, capacity: Capacity) -> Self {
        let at = self
            .views
            .iter()
            .position(|v| v.spec.id.as_str() == name)
            .unwrap_or_else(|| panic!("no cluster {name}"));
        self.capacities[at] = Some(capacity);
        self
    }

    /// The placement of policy `name`, to change between rounds.
    fn placement(&mut self, name: &str) -> &mut PlacementPolicy {
        let policy = self
            .policies
            .iter_mut()
            .find(|p| &*p.key.name == name)
            .unwrap_or_else(|| panic!("no policy {name}"));
        Arc::make_mut(policy.placement.as_mut().expect("a placing policy"))
    }

    fn template(&mut self, name: &str) -> &mut Template {
        self.templates
            .iter_mut()
            .find(|t| &*t.key.name == name)
            .unwrap_or_else(|| panic!("no template {name}"))
    }

    fn deployment(mut self, name: &str, replicas: Option<u32>) -> Self {
        self.templates.push(deployment(name, replicas));
        self
    }

    fn replicas(&mut self, name: &str, replicas: u32) {
        let t = self
            .templates
            .iter_mut()
            .find(|t| &*t.key.name == name)
            .expect("template");
        t.replicas = Some(replicas);
    }

    /// The policy's tolerations (tolerations live on the traffic half, read by both).
    fn tolerate(&mut self, tolerations: Vec<Toleration>) {
        let p = &mut self.policies[0];
        let mut traffic = (*p.traffic).clone();
        traffic.tolerations = tolerations;
        p.traffic = Arc::new(traffic);
    }

    fn place(&self, placer: &mut Placer, at: u64) -> Placements {
        let clusters: Vec<ClusterInput<'_>> = self
            .views
            .iter()
            .zip(&self.capacities)
            .map(|(view, capacity)| ClusterInput {
                view,
                capacity: capacity.as_ref(),
            })
            .collect();
        placer.place(
            Inputs {
                templates: &self.templates,
                policies: &self.policies,
                overrides: &self.overrides,
                clusters: &clusters,
                programs: &*self.programs,
            },
            self.at(at),
        )
    }

    /// The one decision of template `name` at `at`.
    fn decide(&self, placer: &mut Placer, at: u64, name: &str) -> Decision {
        let mut round = self.place(placer, at);
        let key = round
            .decisions
            .keys()
            .find(|k| &*k.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("no decision for {name}"));
        Arc::unwrap_or_clone(round.decisions.remove(&key).expect("decision"))
    }
}

/// `(cluster, replicas)` of every placed cluster, for assertions.
fn split(d: &Decision) -> Vec<(&str, Option<u32>)> {
    d.placed
        .iter()
        .map(|p| (p.cluster.as_str(), p.replicas))
        .collect()
}

/// `(cluster, replicas)` with replicas, for divided decisions.
fn counts(d: &Decision) -> Vec<(&str, u32)> {
    d.placed
        .iter()
        .map(|p| (p.cluster.as_str(), p.replicas.expect("replicas")))
        .collect()
}

fn excluded(d: &Decision) -> Vec<(&str, PlacementFilter)> {
    d.excluded
        .iter()
        .map(|e| (e.cluster.as_str(), e.reason.clone()))
        .collect()
}

fn reason_of(d: &Decision, cluster: &str) -> PlacementFilter {
    d.excluded
        .iter()
        .find(|e| e.cluster.as_str() == cluster)
        .map(|e| e.reason.clone())
        .unwrap_or_else(|| panic!("{cluster} is not excluded: {d:?}"))
}

fn taint(key: &str, effect: TaintEffect) -> Taint {
    Taint {
        key: key.into(),
        value: None,
        effect,
    }
}

fn weights(rules: &[(&[&str], u32)]) -> PlacementPolicy {
    PlacementPolicy {
        replicas: ReplicaScheduling::Divided(Division::Weights(
            rules
                .iter()
                .map(|(names, weight)| WeightRule {
                    clusters: ClusterSet {
                        names: names.iter().map(|n| n.to_string()).collect(),
                        selector: None,
                    },
                    weight: *weight,
                })
                .collect(),
        )),
        ..PlacementPolicy::default()
    }
}

fn divided(division: Division) -> PlacementPolicy {
    PlacementPolicy {
        replicas: ReplicaScheduling::Divided(division),
        ..PlacementPolicy::default()
    }
}
