//! The hub as meridian reads it: its MemberClusters, ClusterSchedulingPolicies, resource
//! templates, OverridePolicies and Tenants, each converted and checked, with every problem
//! naming the object (and file) it is about. Whichever source reads the hub — a directory
//! (`directory`) or a Kubernetes API server (`kubernetes::hub`, `kubernetes::templates`) —
//! feeds this one model, so a hub object means the same wherever it was written.
//!
//! Two rules hold for every source: the first definition of a name wins (a second is an
//! error), and a policy edited into an invalid one keeps its last valid version serving
//! ([`keep_last_valid_policies`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use meridian_core::route::{ReferenceGrant, Route};
use meridian_core::{
    ClusterSpec, ObjectRef, Origin, OverridePolicy, Policy, Problem, Template, Tenant,
};

use crate::convert::{self, MemberSource};
use crate::crd::{ClusterSchedulingPolicy, MemberCluster};
use crate::manifest::{self, Loaded, Manifest};

/// A member cluster read from the hub, with where its objects come from.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberEntry {
    pub spec: ClusterSpec,
    pub source: MemberSource,
}

/// What a hub directory holds.
#[derive(Debug, Default)]
pub struct Hub {
    pub members: Vec<MemberEntry>,
    pub policies: Vec<Policy>,
    /// Resource templates: every namespaced object that is not a meridian.io kind.
    pub templates: Vec<Template>,
    pub overrides: Vec<OverridePolicy>,
    pub tenants: Vec<Tenant>,
    /// HTTPRoutes and GRPCRoutes (whose parent is a Service: what meridian serves).
    pub routes: Vec<Route>,
    pub grants: Vec<ReferenceGrant>,
    /// The keys of `templates`, so a second definition is found without a scan.
    template_keys: std::collections::HashSet<meridian_core::TemplateKey>,
    pub errors: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

/// Where a hub object was read, so its problems say so.
#[derive(Clone, Debug)]
pub(crate) enum ReadFrom {
    File(PathBuf),
    Api,
}

impl ReadFrom {
    /// Where core's objects (routes) say they were read.
    pub(crate) fn source(&self) -> meridian_core::problem::Source {
        match self {
            ReadFrom::File(path) => meridian_core::problem::Source::File { path: path.clone() },
            ReadFrom::Api => meridian_core::problem::Source::Api,
        }
    }

    fn problem(&self, object: ObjectRef, reason: String) -> Problem {
        match self {
            ReadFrom::File(path) => Problem::in_file(Origin::Hub, path.clone(), object, reason),
            ReadFrom::Api => Problem::in_api(Origin::Hub, object, reason),
        }
    }
}

/// The hub objects of what a hub directory held.
pub fn hub_objects(dir: &Path, loaded: Loaded) -> Hub {
    let on_hub = |e: manifest::ManifestError| e.into_problem(Origin::Hub);
    let mut hub = Hub {
        errors: loaded.errors.into_iter().map(on_hub).collect(),
        warnings: loaded.warnings.into_iter().map(on_hub).collect(),
        ..Hub::default()
    };
    let mut manifests = loaded.manifests;
    // Two MemberClusters of one name: the oldest wins (creationTimestamp, as for exports),
    // so a new file sorting first never displaces a running member that says when it was
    // made. Without timestamps, file order decides, as before.
    manifests.sort_by_key(|(_, m)| match m {
        Manifest::MemberCluster(mc) => mc
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
        _ => i64::MAX,
    });
    for (file, m) in manifests {
        let base = file.parent().unwrap_or(dir).to_path_buf();
        let from = ReadFrom::File(file);
        match m {
            Manifest::MemberCluster(mc) => add_member(&mut hub, &base, &from, &mc),
            Manifest::ClusterSchedulingPolicy(csp) => add_policy(&mut hub, &from, &csp),
            Manifest::OverridePolicy(op) => add_override(&mut hub, &from, &op),
            Manifest::Tenant(t) => add_tenant(&mut hub, &from, &t),
            Manifest::HttpRoute(r) => add_route(
                &mut hub,
                &from,
                named("HTTPRoute", &r.metadata),
                crate::routes::http_route(&r, from.source()),
            ),
            Manifest::GrpcRoute(r) => add_route(
                &mut hub,
                &from,
                named("GRPCRoute", &r.metadata),
                crate::routes::grpc_route(&r, from.source()),
            ),
            Manifest::ReferenceGrant(g) => add_grant(&mut hub, &from, &g),
            Manifest::Other(o) => {
                add_template(&mut hub, &from, (o.object, Arc::new(o.value)), None)
            }
            Manifest::Service(s) => add_typed_template(&mut hub, &from, s.as_ref()),
            Manifest::ServiceExport(s) => add_typed_template(&mut hub, &from, s.as_ref()),
            other => {
                let object = other.describe();
                let why =
                    crate::policy::unplaceable(None, &object.kind).unwrap_or("not a template kind");
                hub.warnings.push(from.problem(
                    object,
                    format!("the hub directory holds MemberClusters, policies, Tenants and resource templates; this is not a template ({why}); ignored"),
                ))
            }
        }
    }
    check_overrides(&mut hub);
    let unstaged =
        meridian_core::checks::rollouts_without_generations(&hub.policies, &hub.templates);
    hub.warnings.extend(unstaged);
    hub
}

/// The ClusterSchedulingPolicies of one file's text (what `--assume-policy FILE` sends),
/// validated as the hub validates them; every problem of the file, or anything in it that
/// is not a policy, refuses the whole file.
pub fn policies_in(file: &Path, text: &str) -> Result<Vec<Policy>, Vec<Problem>> {
    let mut loaded = Loaded::default();
    manifest::parse_str_within(file, text, manifest::Limits::DEFAULT_MAX_DEPTH, &mut loaded);
    let mut hub = hub_objects(file.parent().unwrap_or(Path::new(".")), loaded);
    let from = ReadFrom::File(file.to_path_buf());
    let others = hub.members.len()
        + hub.templates.len()
        + hub.overrides.len()
        + hub.tenants.len()
        + hub.routes.len()
        + hub.grants.len();
    if others > 0 {
        hub.errors.push(from.problem(
            ObjectRef {
                kind: "file".into(),
                namespace: None,
                name: file.display().to_string(),
            },
            format!("holds {others} object(s) that are not ClusterSchedulingPolicies"),
        ));
    }
    if hub.errors.is_empty() && hub.policies.is_empty() {
        hub.errors.push(from.problem(
            ObjectRef {
                kind: "file".into(),
                namespace: None,
                name: file.display().to_string(),
            },
            "holds no ClusterSchedulingPolicy".into(),
        ));
    }
    if hub.errors.is_empty() {
        Ok(hub.policies)
    } else {
        Err(hub.errors)
    }
}

/// Applies every rule of every OverridePolicy to each template it selects, so a rule that
/// cannot apply (a JSON patch to a missing path, a container that is not there) is reported
/// when the hub is read, not only when a cluster is rendered. The rule still serves: the
/// object is then not placed where the rule applies (never half-overridden).
pub(crate) fn check_overrides(hub: &mut Hub) {
    for t in &hub.templates {
        for op in hub.overrides.iter().filter(|op| op.selects(t).is_some()) {
            for (i, rule) in op.rules.iter().enumerate() {
                let mut body = (*t.body).clone();
                if let Err(e) = meridian_federation::overrides::apply(&mut body, &rule.overriders) {
                    hub.errors.push(Problem::in_merge(
                        Origin::Hub,
                        ObjectRef::namespaced("OverridePolicy", &op.key),
                        format!(
                            "spec.overrideRules[{i}] cannot apply to {} {}: {}; the object is not placed where this rule applies",
                            t.key.kind,
                            t.key.object_key(),
                            meridian_federation::describe(&e)
                        ),
                    ));
                }
            }
        }
    }
}

/// A typed Kubernetes object of the hub (a Service, a ServiceExport) is a template too.
fn add_typed_template<K: kube::Resource<DynamicType = ()> + serde::Serialize>(
    hub: &mut Hub,
    from: &ReadFrom,
    k: &K,
) {
    let object = ObjectRef {
        kind: K::kind(&()).into_owned(),
        namespace: k.meta().namespace.clone(),
        name: k.meta().name.clone().unwrap_or_else(|| "?".into()),
    };
    match serde_json::to_value(k) {
        Ok(mut value) => {
            // The typed object serializes without its type; the template keeps it.
            value["apiVersion"] = K::api_version(&()).into_owned().into();
            value["kind"] = object.kind.clone().into();
            add_template(hub, from, (object, Arc::new(value)), None)
        }
        Err(e) => hub.errors.push(from.problem(object, e.to_string())),
    }
}

/// The templates a hub read summarized, by object: a read that finds an object's body
/// unchanged (the watch table's same `Arc`) takes the same template again — its key, labels
/// and dependencies shared, so the fleet compares it with the last one by pointer and a read
/// summarizes only what changed.
#[derive(Default)]
pub(crate) struct Summaries {
    last: std::collections::HashMap<ObjectRef, Template>,
    next: std::collections::HashMap<ObjectRef, Template>,
}

impl Summaries {
    fn summarize(
        &mut self,
        object: &ObjectRef,
        value: Arc<serde_json::Value>,
    ) -> Result<Template, meridian_federation::template::TemplateError> {
        let t = match self.last.remove(object) {
            Some(t) if Arc::ptr_eq(&t.body, &value) => t,
            _ => meridian_federation::template::summarize_shared(value)?,
        };
        self.next.insert(object.clone(), t.clone());
        Ok(t)
    }

    /// The read is over: what it summarized is what the next one compares with (objects no
    /// longer read are forgotten).
    pub(crate) fn read_done(&mut self) {
        self.last = std::mem::take(&mut self.next);
    }
}

/// Adds a resource template; a kind that cannot be placed is a warning, a template that
/// cannot be read an error of its own. `summaries`: those of the last read of the same source
/// (a Kubernetes hub's watch tables); a directory's files are parsed anew on every read.
pub(crate) fn add_template(
    hub: &mut Hub,
    from: &ReadFrom,
    (object, value): (ObjectRef, Arc<serde_json::Value>),
    summaries: Option<&mut Summaries>,
) {
    let api_version = value.get("apiVersion").and_then(|v| v.as_str());
    if let Some(why) = crate::policy::unplaceable(api_version, &object.kind) {
        hub.warnings
            .push(from.problem(object, format!("not a resource template ({why}); ignored")));
        return;
    }
    let summarized = match summaries {
        Some(summaries) => summaries.summarize(&object, value),
        None => meridian_federation::template::summarize_shared(value),
    };
    match summarized {
        Ok(t) if !hub.template_keys.insert(t.key.clone()) => hub
            .errors
            .push(from.problem(object, "defined twice; the first wins".into())),
        Ok(t) => hub.templates.push(t),
        Err(e) => hub
            .errors
            .push(from.problem(object, format!("not a valid template: {e}"))),
    }
}

/// A namespaced hub object as its problems name it (`default` when it names no namespace).
fn namespaced(kind: &str, meta: &kube::api::ObjectMeta) -> ObjectRef {
    ObjectRef {
        kind: kind.into(),
        namespace: Some(meta.namespace.clone().unwrap_or_else(|| "default".into())),
        name: meta.name.clone().unwrap_or_else(|| "?".into()),
    }
}

pub(crate) fn add_override(hub: &mut Hub, from: &ReadFrom, op: &crate::crd::OverridePolicy) {
    let object = namespaced("OverridePolicy", &op.metadata);
    let converted = crate::overrides::override_policy(op);
    let same = |a: &OverridePolicy, b: &OverridePolicy| a.key == b.key;
    let (into, errors) = (&mut hub.overrides, &mut hub.errors);
    keep_first(into, errors, from, object, converted, same, "policy");
}

/// A namespaced hub object as problems name it.
fn named(
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> ObjectRef {
    ObjectRef {
        kind: kind.into(),
        namespace: Some(meta.namespace.clone().unwrap_or_else(|| "default".into())),
        name: meta.name.clone().unwrap_or_else(|| "?".into()),
    }
}

/// A route joins the hub unless one of its kind and name is there already.
pub(crate) fn add_route(
    hub: &mut Hub,
    from: &ReadFrom,
    object: ObjectRef,
    converted: Result<Route, String>,
) {
    let same = |a: &Route, b: &Route| a.kind == b.kind && a.key == b.key;
    keep_first(
        &mut hub.routes,
        &mut hub.errors,
        from,
        object,
        converted.map_err(|e| vec![e]),
        same,
        "route",
    );
}

pub(crate) fn add_grant(hub: &mut Hub, from: &ReadFrom, g: &crate::routes::ReferenceGrant) {
    let object = named("ReferenceGrant", &g.metadata);
    let converted = crate::routes::reference_grant(g).map_err(|e| vec![e]);
    let same = |a: &ReferenceGrant, b: &ReferenceGrant| a.key == b.key;
    keep_first(
        &mut hub.grants,
        &mut hub.errors,
        from,
        object,
        converted,
        same,
        "ReferenceGrant",
    );
}

pub(crate) fn add_tenant(hub: &mut Hub, from: &ReadFrom, t: &crate::crd::Tenant) {
    let name = t.metadata.name.clone().unwrap_or_else(|| "?".into());
    let object = ObjectRef::cluster_scoped("Tenant", &name);
    let converted = crate::tenants::tenant(t);
    let same = |a: &Tenant, b: &Tenant| a.name == b.name;
    keep_first(
        &mut hub.tenants,
        &mut hub.errors,
        from,
        object,
        converted,
        same,
        "tenant",
    );
}

/// A converted hub object joins `into` unless one the same (`same`) is there already (the
/// first wins); its problems, or the second definition, go to `errors` naming `object`.
fn keep_first<T>(
    into: &mut Vec<T>,
    errors: &mut Vec<Problem>,
    from: &ReadFrom,
    object: ObjectRef,
    converted: Result<T, Vec<String>>,
    same: impl Fn(&T, &T) -> bool,
    what: &str,
) {
    match converted {
        Ok(t) if into.iter().any(|u| same(u, &t)) => {
            errors.push(from.problem(object, "defined twice; the first wins".into()));
        }
        Ok(t) => into.push(t),
        Err(problems) => errors.extend(problems.into_iter().map(|reason| {
            from.problem(object.clone(), format!("{reason}; the {what} is not used"))
        })),
    }
}

/// Adds a MemberCluster to `hub`; relative paths in it resolve against `base`.
pub(crate) fn add_member(hub: &mut Hub, base: &Path, from: &ReadFrom, mc: &MemberCluster) {
    let object =
        ObjectRef::cluster_scoped("MemberCluster", mc.metadata.name.as_deref().unwrap_or("?"));
    match convert::member_cluster(mc, base) {
        Ok((spec, _)) if hub.members.iter().any(|m| m.spec.id == spec.id) => {
            let reason = format!(
                "a MemberCluster named {} is defined twice; the first wins",
                spec.id
            );
            hub.errors.push(from.problem(object, reason));
        }
        Ok((spec, source)) => hub.members.push(MemberEntry { spec, source }),
        Err(problems) => hub.errors.extend(
            problems
                .into_iter()
                .map(|reason| from.problem(object.clone(), reason)),
        ),
    }
}

pub(crate) fn add_policy(hub: &mut Hub, from: &ReadFrom, csp: &ClusterSchedulingPolicy) {
    let object = namespaced("ClusterSchedulingPolicy", &csp.metadata);
    let converted = crate::policy::scheduling_policy(csp);
    let same = |a: &Policy, b: &Policy| a.key == b.key;
    let (into, errors) = (&mut hub.policies, &mut hub.errors);
    keep_first(into, errors, from, object, converted, same, "policy");
}

/// What the previous hub read served, so an invalid edit keeps the last valid version.
#[derive(Debug, Default)]
pub struct Served {
    pub policies: Vec<Policy>,
    pub overrides: Vec<OverridePolicy>,
}

/// A policy (ClusterSchedulingPolicy or OverridePolicy) edited into an invalid one keeps its
/// last valid version serving (the edit is reported, and nothing moves until it is fixed); a
/// policy deleted from the hub goes. `served` is what the previous read served, updated to
/// what this one serves.
pub fn keep_last_valid_policies(mut hub: Hub, served: &mut Served) -> Hub {
    keep_last_valid(
        &mut hub.policies,
        &mut hub.errors,
        &mut served.policies,
        "ClusterSchedulingPolicy",
        |p| &p.key,
    );
    keep_last_valid(
        &mut hub.overrides,
        &mut hub.errors,
        &mut served.overrides,
        "OverridePolicy",
        |p| &p.key,
    );
    hub
}

fn keep_last_valid<T: Clone>(
    current: &mut Vec<T>,
    errors: &mut [Problem],
    served: &mut Vec<T>,
    kind: &str,
    key: fn(&T) -> &meridian_core::ObjectKey,
) {
    for previous in served.drain(..) {
        if current.iter().any(|p| key(p) == key(&previous)) {
            continue;
        }
        let mut rejected = false;
        for e in errors
            .iter_mut()
            .filter(|e| e.subject.is(kind, key(&previous)))
        {
            rejected = true;
            e.reason = format!(
                "{}; its last valid version keeps serving",
                e.reason.trim_end_matches("; the policy is not used")
            );
        }
        if rejected {
            current.push(previous);
        }
    }
    served.clone_from(current);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use meridian_core::{ObjectKey, Policy, TrafficPolicy};

    use super::*;

    fn policy(name: &str, ttl: u32) -> Policy {
        Policy {
            key: ObjectKey::new("shop", name),
            created: 0,
            selectors: vec![],
            templates: Vec::new(),
            traffic: Arc::new(TrafficPolicy {
                ttl: Some(ttl),
                ..TrafficPolicy::default()
            }),
            placement: None,
        }
    }

    fn rejected(name: &str) -> Problem {
        Problem::in_file(
            Origin::Hub,
            "hub/p.yaml",
            ObjectRef::namespaced("ClusterSchedulingPolicy", &ObjectKey::new("shop", name)),
            "unknown field(s): spec.traffic.minHealthyEndpoint",
        )
    }

    #[test]
    fn an_invalid_edit_keeps_the_last_valid_policy_and_a_deletion_removes_it() {
        let mut served = Served::default();
        let hub = |policies, errors| Hub {
            policies,
            errors,
            ..Hub::default()
        };
        let read = keep_last_valid_policies(
            hub(vec![policy("a", 5), policy("b", 5)], vec![]),
            &mut served,
        );
        assert_eq!(read.policies.len(), 2);
        // a is edited into something invalid; b is deleted.
        let read = keep_last_valid_policies(hub(vec![], vec![rejected("a")]), &mut served);
        assert_eq!(read.policies, [policy("a", 5)]);
        assert!(
            read.errors[0]
                .reason
                .ends_with("; its last valid version keeps serving")
        );
        // Still broken on the next read: still served.
        let read = keep_last_valid_policies(hub(vec![], vec![rejected("a")]), &mut served);
        assert_eq!(read.policies, [policy("a", 5)]);
        // Fixed: the new version serves.
        let read = keep_last_valid_policies(hub(vec![policy("a", 9)], vec![]), &mut served);
        assert_eq!(read.policies, [policy("a", 9)]);
        // Deleted: gone.
        let read = keep_last_valid_policies(hub(vec![], vec![]), &mut served);
        assert!(read.policies.is_empty());
    }
}
