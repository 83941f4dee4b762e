//! Tenants: which namespaces of which clusters a user may reach through the
//! gateway, and which namespaces meridian keeps in each member for them.
//!
//! ```text
//!  Tenant {subjects {users, groups}, namespaces[] | namespaceSelector, clusters, labels}
//!    Tenants::bound(user, groups)  ─► Bound: every tenant naming the caller (None: no tenant
//!                                     bounds it; the members' RBAC alone decides)
//!    Bound::reach(clusters, namespace labels) ─► Reach: per cluster, the namespaces it may use
//!                                     (named ones, and the member's namespaces a selector picks)
//!    Tenants::namespaces_in(cluster) ─► the named namespaces a member should hold, with labels
//!    namespace_steps(desired, existing) ─► create / relabel / delete (only meridian's own)
//! ```
//!
//! A caller named by several tenants may reach the union of theirs. Only named namespaces are
//! created in members: a selector picks among namespaces that exist, it names none.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::ClusterSpec;
use crate::policy::{ClusterSet, LabelSelector};

/// On a namespace meridian created for a tenant: the tenant's name.
pub const TENANT_LABEL: &str = "meridian.io/tenant";

pub type Labels = BTreeMap<String, String>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    pub users: BTreeSet<String>,
    pub groups: BTreeSet<String>,
    pub namespaces: TenantNamespaces,
    pub clusters: ClusterSet,
    /// The Tenant object's own labels, given to the namespaces meridian creates for it.
    pub labels: Labels,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantNamespaces {
    /// Created in each of the tenant's clusters (and removed when dropped).
    Named(BTreeSet<String>),
    /// The namespaces of its clusters whose labels match (never created).
    Selected(LabelSelector),
}

/// Every Tenant on the hub, by name. `listed` is false until the hub's Tenants were read (or
/// found not to be served): until then nobody can say whom they bound.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenants {
    pub listed: bool,
    tenants: Vec<Tenant>,
}

impl Tenants {
    pub fn listed(mut tenants: Vec<Tenant>) -> Self {
        tenants.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            listed: true,
            tenants,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Tenant> {
        self.tenants.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The tenants naming `user` or one of its `groups`; None when none does.
    pub fn bound(&self, user: &str, groups: &[String]) -> Option<Bound<'_>> {
        let tenants: Vec<&Tenant> = self
            .tenants
            .iter()
            .filter(|t| t.users.contains(user) || groups.iter().any(|g| t.groups.contains(g)))
            .collect();
        (!tenants.is_empty()).then_some(Bound { tenants })
    }

    /// The namespaces meridian keeps in `cluster` for its tenants, with their labels: the
    /// tenant's own labels and [`TENANT_LABEL`] (the first tenant by name, when several name
    /// one namespace; their labels merge in name order).
    pub fn namespaces_in(&self, cluster: &ClusterSpec) -> BTreeMap<String, Labels> {
        let mut out: BTreeMap<String, Labels> = BTreeMap::new();
        for tenant in self.tenants.iter().filter(|t| t.clusters.contains(cluster)) {
            let TenantNamespaces::Named(names) = &tenant.namespaces else {
                continue;
            };
            for name in names {
                let labels = out.entry(name.clone()).or_default();
                for (k, v) in &tenant.labels {
                    labels.entry(k.clone()).or_insert_with(|| v.clone());
                }
                labels
                    .entry(TENANT_LABEL.to_string())
                    .or_insert_with(|| tenant.name.clone());
            }
        }
        out
    }
}

/// The tenants that bound one caller.
#[derive(Clone, Debug)]
pub struct Bound<'a> {
    tenants: Vec<&'a Tenant>,
}

impl Bound<'_> {
    /// The tenants' names, in name order (what goes on as the caller's tenant).
    pub fn names(&self) -> Vec<&str> {
        self.tenants.iter().map(|t| t.name.as_str()).collect()
    }

    /// What the caller may reach: per cluster of `clusters` any of its tenants spans, the
    /// namespaces there (named, or picked by a selector from `namespaces_of` the cluster —
    /// the member's namespaces and their labels, None when not known); on the hub, the named
    /// ones only (the hub's namespaces are not watched).
    pub fn reach<'c>(
        &self,
        clusters: impl IntoIterator<Item = &'c ClusterSpec>,
        namespaces_of: impl Fn(&ClusterSpec) -> Option<BTreeMap<String, Labels>>,
    ) -> Reach {
        let mut reach = Reach::default();
        for tenant in &self.tenants {
            if let TenantNamespaces::Named(names) = &tenant.namespaces {
                reach.hub.extend(names.iter().cloned());
            }
        }
        for cluster in clusters {
            let spanning: Vec<&Tenant> = self
                .tenants
                .iter()
                .copied()
                .filter(|t| t.clusters.contains(cluster))
                .collect();
            if spanning.is_empty() {
                continue;
            }
            let mut namespaces = BTreeSet::new();
            let mut existing = None;
            for tenant in spanning {
                match &tenant.namespaces {
                    TenantNamespaces::Named(names) => namespaces.extend(names.iter().cloned()),
                    TenantNamespaces::Selected(selector) => {
                        let existing = existing.get_or_insert_with(|| namespaces_of(cluster));
                        namespaces.extend(
                            existing
                                .iter()
                                .flatten()
                                .filter(|(_, labels)| selector.matches(labels))
                                .map(|(name, _)| name.clone()),
                        );
                    }
                }
            }
            reach
                .clusters
                .insert(cluster.id.as_str().to_string(), namespaces);
        }
        reach
    }
}

/// Where a tenant's user may go: per member cluster it spans, its namespaces there; on the hub,
/// its named namespaces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    pub clusters: BTreeMap<String, BTreeSet<String>>,
    pub hub: BTreeSet<String>,
}

impl Reach {
    pub fn spans(&self, cluster: &str) -> bool {
        self.clusters.contains_key(cluster)
    }

    /// Whether `namespace` of `cluster` (None: the hub) is the caller's.
    pub fn namespace(&self, cluster: Option<&str>, namespace: &str) -> bool {
        match cluster {
            None => self.hub.contains(namespace),
            Some(c) => self.clusters.get(c).is_some_and(|n| n.contains(namespace)),
        }
    }
}

/// One write to a member's namespaces for its tenants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceStep {
    /// Absent: created, labelled as meridian's and with these labels.
    Create { name: String, labels: Labels },
    /// meridian's, missing some of these labels (or with other values): they are set (labels
    /// someone else added stay).
    Relabel { name: String, labels: Labels },
    /// meridian created it for a tenant that no longer names it here: deleted.
    Delete { name: String },
}

/// What to write so a member's namespaces (`existing`, with their labels) hold `desired`
/// ([`Tenants::namespaces_in`]). A namespace is meridian's when it carries `managed_by`; one that
/// is not is never touched (not labelled, not deleted), and one meridian made for a tenant is
/// deleted only when `in_use` says nothing meridian places is in it.
pub fn namespace_steps(
    desired: &BTreeMap<String, Labels>,
    existing: &BTreeMap<String, Labels>,
    managed_by: (&str, &str),
    in_use: impl Fn(&str) -> bool,
) -> Vec<NamespaceStep> {
    let ours = |labels: &Labels| labels.get(managed_by.0).map(String::as_str) == Some(managed_by.1);
    let mut steps = Vec::new();
    for (name, labels) in desired {
        match existing.get(name) {
            None => steps.push(NamespaceStep::Create {
                name: name.clone(),
                labels: labels.clone(),
            }),
            Some(has) if ours(has) && labels.iter().any(|(k, v)| has.get(k) != Some(v)) => {
                steps.push(NamespaceStep::Relabel {
                    name: name.clone(),
                    labels: labels.clone(),
                });
            }
            Some(_) => {}
        }
    }
    for (name, labels) in existing {
        if !desired.contains_key(name)
            && ours(labels)
            && labels.contains_key(TENANT_LABEL)
            && !in_use(name)
        {
            steps.push(NamespaceStep::Delete { name: name.clone() });
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, labels: &[(&str, &str)]) -> ClusterSpec {
        ClusterSpec {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..ClusterSpec::named(name)
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn tenant(name: &str, users: &[&str], groups: &[&str], namespaces: &[&str]) -> Tenant {
        Tenant {
            name: name.into(),
            users: set(users),
            groups: set(groups),
            namespaces: TenantNamespaces::Named(set(namespaces)),
            clusters: ClusterSet {
                names: vec!["m1".into()],
                selector: None,
            },
            labels: [("team".to_string(), name.to_string())].into(),
        }
    }

    fn selector(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: [(k.to_string(), v.to_string())].into(),
            match_expressions: Vec::new(),
        }
    }

    #[test]
    fn a_caller_is_bound_by_the_tenants_naming_it_or_its_groups() {
        let tenants = Tenants::listed(vec![
            tenant("shop", &["ana"], &[], &["shop"]),
            tenant("ads", &[], &["ads-devs"], &["ads"]),
        ]);
        assert_eq!(tenants.bound("ana", &[]).unwrap().names(), ["shop"]);
        let both = tenants.bound("ana", &["ads-devs".into()]).unwrap();
        assert_eq!(both.names(), ["ads", "shop"]);
        assert!(tenants.bound("bob", &["ops".into()]).is_none());
        assert!(!Tenants::default().listed);
    }

    #[test]
    fn reach_is_the_named_namespaces_in_the_tenants_clusters_only() {
        let mut shop = tenant("shop", &["ana"], &[], &["shop", "shop-dev"]);
        shop.clusters = ClusterSet {
            names: vec!["m1".into()],
            selector: Some(selector("env", "prod")),
        };
        let tenants = Tenants::listed(vec![shop]);
        let clusters = [
            cluster("m1", &[]),
            cluster("m2", &[("env", "prod")]),
            cluster("m3", &[("env", "dev")]),
        ];
        let reach = tenants
            .bound("ana", &[])
            .unwrap()
            .reach(&clusters, |_| None);
        assert_eq!(reach.clusters.keys().collect::<Vec<_>>(), ["m1", "m2"]);
        assert!(reach.namespace(Some("m2"), "shop-dev"));
        assert!(!reach.namespace(Some("m2"), "default"));
        assert!(!reach.namespace(Some("m3"), "shop"));
        assert!(reach.namespace(None, "shop"));
        assert!(!reach.spans("m3"));
    }

    #[test]
    fn a_selector_picks_the_members_namespaces_by_their_labels() {
        let mut t = tenant("shop", &["ana"], &[], &[]);
        t.namespaces = TenantNamespaces::Selected(selector("team", "shop"));
        let tenants = Tenants::listed(vec![t]);
        let existing: BTreeMap<String, Labels> = [
            (
                "a".to_string(),
                [("team".to_string(), "shop".to_string())].into(),
            ),
            ("b".to_string(), Labels::new()),
        ]
        .into();
        let reach = tenants
            .bound("ana", &[])
            .unwrap()
            .reach(&[cluster("m1", &[])], |_| Some(existing.clone()));
        assert_eq!(reach.clusters["m1"], set(&["a"]));
        // Nothing named: nothing on the hub, and nothing for meridian to create.
        assert!(reach.hub.is_empty());
        assert!(tenants.namespaces_in(&cluster("m1", &[])).is_empty());
    }

    #[test]
    fn members_hold_the_named_namespaces_of_the_tenants_spanning_them_labelled() {
        let tenants = Tenants::listed(vec![
            tenant("shop", &["ana"], &[], &["shop", "shared"]),
            tenant("ads", &["bob"], &[], &["shared"]),
        ]);
        let held = tenants.namespaces_in(&cluster("m1", &[]));
        assert_eq!(held.keys().collect::<Vec<_>>(), ["shared", "shop"]);
        assert_eq!(held["shop"][TENANT_LABEL], "shop");
        assert_eq!(held["shop"]["team"], "shop");
        // Two tenants name one namespace: the first by name labels it.
        assert_eq!(held["shared"][TENANT_LABEL], "ads");
        assert!(tenants.namespaces_in(&cluster("m2", &[])).is_empty());
    }
}

#[cfg(test)]
mod steps {
    use super::*;

    const OURS: (&str, &str) = ("app.kubernetes.io/managed-by", "meridian");

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn missing_namespaces_are_created_and_meridians_own_relabelled() {
        let desired: BTreeMap<String, Labels> = [
            ("a".to_string(), labels(&[(TENANT_LABEL, "shop")])),
            (
                "b".to_string(),
                labels(&[(TENANT_LABEL, "shop"), ("team", "x")]),
            ),
            ("c".to_string(), labels(&[(TENANT_LABEL, "shop")])),
        ]
        .into();
        let existing: BTreeMap<String, Labels> = [
            // meridian's, a label short: relabelled (the extra label someone added stays).
            (
                "b".to_string(),
                labels(&[OURS, (TENANT_LABEL, "shop"), ("pss", "restricted")]),
            ),
            // someone else's: left alone, not adopted.
            ("c".to_string(), labels(&[])),
        ]
        .into();
        let steps = namespace_steps(&desired, &existing, OURS, |_| false);
        assert_eq!(
            steps,
            [
                NamespaceStep::Create {
                    name: "a".into(),
                    labels: desired["a"].clone()
                },
                NamespaceStep::Relabel {
                    name: "b".into(),
                    labels: desired["b"].clone()
                },
            ]
        );
    }

    #[test]
    fn only_namespaces_meridian_made_for_a_tenant_are_deleted_and_not_while_in_use() {
        let existing: BTreeMap<String, Labels> = [
            (
                "dropped".to_string(),
                labels(&[OURS, (TENANT_LABEL, "shop")]),
            ),
            ("placed".to_string(), labels(&[OURS])),
            ("theirs".to_string(), labels(&[(TENANT_LABEL, "shop")])),
            ("busy".to_string(), labels(&[OURS, (TENANT_LABEL, "shop")])),
        ]
        .into();
        let steps = namespace_steps(&BTreeMap::new(), &existing, OURS, |n| n == "busy");
        assert_eq!(
            steps,
            [NamespaceStep::Delete {
                name: "dropped".into()
            }]
        );
    }
}
