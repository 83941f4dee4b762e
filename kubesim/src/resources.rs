//! The kinds a simulated member serves, and the discovery documents that describe them
//! (`/api`, `/api/v1`, `/apis`, `/apis/{group}/{version}`, and the aggregated v2 form).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// One served resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// "" for the core group.
    pub group: String,
    pub version: String,
    /// The plural, as in URLs: `deployments`.
    pub resource: String,
    pub kind: String,
    pub namespaced: bool,
    /// Writes to the main resource leave `status` alone; `/status` writes only `status`.
    pub status: bool,
    /// A `/scale` subresource (`spec.replicas`).
    pub scale: bool,
    /// Only `create` is served, and nothing is stored (access reviews).
    pub review: bool,
}

impl ResourceType {
    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        match self.group.is_empty() {
            true => self.version.clone(),
            false => format!("{}/{}", self.group, self.version),
        }
    }

    /// `deployments.apps`, `pods`: how stats and the control API name it.
    pub fn display(&self) -> String {
        match self.group.is_empty() {
            true => self.resource.clone(),
            false => format!("{}.{}", self.resource, self.group),
        }
    }

    /// Workloads the member's tiny controller makes ready.
    pub fn is_workload(&self) -> bool {
        self.group == "apps"
            && matches!(
                self.resource.as_str(),
                "deployments" | "statefulsets" | "replicasets" | "daemonsets"
            )
    }
}

/// What every member serves from the start: (group, version, resource, kind, namespaced,
/// status, scale).
const BUILTIN: &[(&str, &str, &str, &str, bool, bool, bool)] = &[
    ("", "v1", "namespaces", "Namespace", false, true, false),
    ("", "v1", "nodes", "Node", false, true, false),
    ("", "v1", "pods", "Pod", true, true, false),
    ("", "v1", "services", "Service", true, true, false),
    ("", "v1", "endpoints", "Endpoints", true, false, false),
    ("", "v1", "configmaps", "ConfigMap", true, false, false),
    ("", "v1", "secrets", "Secret", true, false, false),
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        false,
        false,
    ),
    ("", "v1", "events", "Event", true, false, false),
    (
        "",
        "v1",
        "resourcequotas",
        "ResourceQuota",
        true,
        true,
        false,
    ),
    ("", "v1", "limitranges", "LimitRange", true, false, false),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        true,
        false,
    ),
    ("apps", "v1", "deployments", "Deployment", true, true, true),
    (
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        true,
        true,
        true,
    ),
    ("apps", "v1", "daemonsets", "DaemonSet", true, true, false),
    ("apps", "v1", "replicasets", "ReplicaSet", true, true, true),
    (
        "apps",
        "v1",
        "controllerrevisions",
        "ControllerRevision",
        true,
        false,
        false,
    ),
    ("batch", "v1", "jobs", "Job", true, true, false),
    ("batch", "v1", "cronjobs", "CronJob", true, true, false),
    (
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        true,
        true,
        false,
    ),
    (
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        true,
        false,
    ),
    (
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        false,
        false,
    ),
    (
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        false,
        false,
    ),
    (
        "networking.k8s.io",
        "v1",
        "ingresses",
        "Ingress",
        true,
        true,
        false,
    ),
    (
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        false,
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        false,
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        false,
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        false,
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        false,
        false,
    ),
    (
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "PriorityClass",
        false,
        false,
        false,
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        true,
        false,
    ),
    (
        "multicluster.x-k8s.io",
        "v1alpha1",
        "serviceexports",
        "ServiceExport",
        true,
        true,
        false,
    ),
    (
        "multicluster.x-k8s.io",
        "v1alpha1",
        "serviceimports",
        "ServiceImport",
        true,
        true,
        false,
    ),
];

/// Access reviews: created and answered, never stored.
const REVIEWS: &[(&str, &str)] = &[
    ("selfsubjectaccessreviews", "SelfSubjectAccessReview"),
    ("selfsubjectrulesreviews", "SelfSubjectRulesReview"),
];

/// The resources of one member, by (group, version, resource).
#[derive(Debug, Clone)]
pub struct Registry {
    types: BTreeMap<(String, String, String), Arc<ResourceType>>,
}

impl Default for Registry {
    fn default() -> Self {
        let mut registry = Self {
            types: BTreeMap::new(),
        };
        for &(group, version, resource, kind, namespaced, status, scale) in BUILTIN {
            registry.add(ResourceType {
                group: group.into(),
                version: version.into(),
                resource: resource.into(),
                kind: kind.into(),
                namespaced,
                status,
                scale,
                review: false,
            });
        }
        for &(resource, kind) in REVIEWS {
            registry.add(ResourceType {
                group: "authorization.k8s.io".into(),
                version: "v1".into(),
                resource: resource.into(),
                kind: kind.into(),
                namespaced: false,
                status: false,
                scale: false,
                review: true,
            });
        }
        registry
    }
}

impl Registry {
    pub fn add(&mut self, t: ResourceType) -> Arc<ResourceType> {
        let key = (t.group.clone(), t.version.clone(), t.resource.clone());
        let t = Arc::new(t);
        self.types.insert(key, t.clone());
        t
    }

    pub fn get(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceType>> {
        self.types
            .get(&(group.to_owned(), version.to_owned(), resource.to_owned()))
            .cloned()
    }

    /// The resource for an apiVersion and kind (seeding objects by their own type).
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceType>> {
        self.types
            .values()
            .find(|t| t.api_version() == api_version && t.kind == kind)
            .cloned()
    }

    /// A resource named as the control API takes it: `deployments`, `deployments.apps`.
    pub fn by_name(&self, name: &str) -> Option<Arc<ResourceType>> {
        self.types
            .values()
            .find(|t| t.display() == name || t.resource == name)
            .cloned()
    }

    /// A CRD's served versions become resources (its `spec.names`, `spec.scope`, and whether
    /// it has a status subresource).
    pub fn register_crd(&mut self, crd: &Value) {
        let spec = &crd["spec"];
        let (Some(group), Some(plural), Some(kind)) = (
            spec["group"].as_str(),
            spec["names"]["plural"].as_str(),
            spec["names"]["kind"].as_str(),
        ) else {
            return;
        };
        for v in spec["versions"].as_array().into_iter().flatten() {
            let Some(version) = v["name"].as_str() else {
                continue;
            };
            if v["served"] == json!(false) {
                continue;
            }
            self.add(ResourceType {
                group: group.into(),
                version: version.into(),
                resource: plural.into(),
                kind: kind.into(),
                namespaced: spec["scope"].as_str() != Some("Cluster"),
                status: v.pointer("/subresources/status").is_some(),
                scale: v.pointer("/subresources/scale").is_some(),
                review: false,
            });
        }
    }

    fn groups(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (group, version, _) in self.types.keys() {
            let versions = out.entry(group.as_str()).or_default();
            if !versions.contains(&version.as_str()) {
                versions.push(version.as_str());
            }
        }
        out
    }

    fn of(&self, group: &str, version: &str) -> impl Iterator<Item = &Arc<ResourceType>> {
        self.types
            .iter()
            .filter(move |((g, v, _), _)| g == group && v == version)
            .map(|(_, t)| t)
    }

    /// `/api`: APIVersions.
    pub fn core_versions(&self, address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        })
    }

    /// `/apis`: APIGroupList.
    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .into_iter()
            .filter(|(g, _)| !g.is_empty())
            .map(|(g, versions)| group_json(g, &versions))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/apis/{group}`: APIGroup.
    pub fn group(&self, group: &str) -> Option<Value> {
        let groups = self.groups();
        let versions = groups.get(group).filter(|_| !group.is_empty())?;
        let mut out = group_json(group, versions);
        out["kind"] = json!("APIGroup");
        out["apiVersion"] = json!("v1");
        Some(out)
    }

    /// `/api/v1`, `/apis/{group}/{version}`: APIResourceList, subresources included.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let mut resources = Vec::new();
        for t in self.of(group, version) {
            let verbs = match t.review {
                true => json!(["create"]),
                false => json!([
                    "create",
                    "delete",
                    "deletecollection",
                    "get",
                    "list",
                    "patch",
                    "update",
                    "watch"
                ]),
            };
            resources.push(json!({
                "name": t.resource,
                "singularName": t.kind.to_lowercase(),
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": verbs,
            }));
            if t.status {
                resources.push(json!({
                    "name": format!("{}/status", t.resource),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": ["get", "patch", "update"],
                }));
            }
            if t.scale {
                resources.push(json!({
                    "name": format!("{}/scale", t.resource),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }));
            }
        }
        if resources.is_empty() {
            return None;
        }
        let group_version = match group.is_empty() {
            true => version.to_owned(),
            false => format!("{group}/{version}"),
        };
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }))
    }

    /// The aggregated discovery (apidiscovery.k8s.io/v2 APIGroupDiscoveryList) of the core
    /// group (`core`) or of every other group.
    pub fn aggregated(&self, core: bool) -> Value {
        let items: Vec<Value> = self
            .groups()
            .into_iter()
            .filter(|(g, _)| g.is_empty() == core)
            .map(|(g, versions)| {
                let versions: Vec<Value> = versions
                    .iter()
                    .map(|v| {
                        let resources: Vec<Value> =
                            self.of(g, v).map(|t| aggregated_resource(t)).collect();
                        json!({"version": v, "resources": resources, "freshness": "Current"})
                    })
                    .collect();
                json!({"metadata": {"name": g}, "versions": versions})
            })
            .collect();
        json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
    }
}

fn group_json(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": versions, "preferredVersion": versions[0]})
}

fn aggregated_resource(t: &ResourceType) -> Value {
    let kind = |k: &str| json!({"group": t.group, "version": t.version, "kind": k});
    let mut subresources = Vec::new();
    if t.status {
        subresources.push(json!({"subresource": "status", "responseKind": kind(&t.kind), "verbs": ["get", "patch", "update"]}));
    }
    if t.scale {
        subresources.push(json!({"subresource": "scale", "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}, "verbs": ["get", "patch", "update"]}));
    }
    let verbs = match t.review {
        true => json!(["create"]),
        false => json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ]),
    };
    json!({
        "resource": t.resource,
        "responseKind": kind(&t.kind),
        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": t.kind.to_lowercase(),
        "verbs": verbs,
        "subresources": subresources,
    })
}
