//! The roles meridian needs in a member, as deploy/rbac ships them (the member chart holds
//! the same): `join` makes them, `diagnose` checks them.

use serde_json::Value;

/// meridian's reads and MCS writes in a member (bound to its identity there).
pub const MEMBER: &str = include_str!("../../../deploy/rbac/member.yaml");
/// Besides MEMBER, in a member that runs workloads meridian places.
pub const PROPAGATION: &str = include_str!("../../../deploy/rbac/member-propagation.yaml");
/// A pull-mode agent's, in its member.
pub const AGENT: &str = include_str!("../../../deploy/rbac/agent.yaml");

/// The roles of an RBAC file: its ClusterRoles and (namespaced) Roles.
pub fn roles(rbac: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(rbac)
        .filter_map(|doc| serde::Deserialize::deserialize(doc).ok())
        .filter(|doc: &Value| doc["kind"] == "ClusterRole" || doc["kind"] == "Role")
        .collect()
}

/// The ClusterRoles of an RBAC file.
pub fn cluster_roles(rbac: &str) -> Vec<Value> {
    roles(rbac)
        .into_iter()
        .filter(|doc| doc["kind"] == "ClusterRole")
        .collect()
}

/// One permission a role grants: a verb on a resource (group, resource, subresource) or on a
/// non-resource path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    Resource {
        group: String,
        resource: String,
        subresource: Option<String>,
        verb: String,
    },
    Path {
        path: String,
        verb: String,
    },
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Permission::Resource {
                group,
                resource,
                subresource,
                verb,
            } => {
                write!(f, "{verb} {resource}")?;
                if let Some(sub) = subresource {
                    write!(f, "/{sub}")?;
                }
                if !group.is_empty() {
                    write!(f, ".{group}")?;
                }
                Ok(())
            }
            Permission::Path { path, verb } => write!(f, "{verb} {path}"),
        }
    }
}

/// Every permission the ClusterRoles of `rbac` grant, one per verb and resource.
pub fn permissions(rbac: &str) -> Vec<Permission> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    let mut out = Vec::new();
    for role in cluster_roles(rbac) {
        for rule in role["rules"].as_array().into_iter().flatten() {
            let verbs = strings(&rule["verbs"]);
            for path in strings(&rule["nonResourceURLs"]) {
                out.extend(verbs.iter().map(|verb| Permission::Path {
                    path: path.clone(),
                    verb: verb.clone(),
                }));
            }
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    let (resource, subresource) = match resource.split_once('/') {
                        Some((r, sub)) => (r.to_owned(), Some(sub.to_owned())),
                        None => (resource, None),
                    };
                    out.extend(verbs.iter().map(|verb| Permission::Resource {
                        group: group.clone(),
                        resource: resource.clone(),
                        subresource: subresource.clone(),
                        verb: verb.clone(),
                    }));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_member_role_grants_reads_writes_and_the_health_paths() {
        let all: Vec<String> = permissions(MEMBER)
            .iter()
            .map(ToString::to_string)
            .collect();
        for want in [
            "list endpointslices.discovery.k8s.io",
            "patch serviceexports/status.multicluster.x-k8s.io",
            "get /readyz",
            "watch nodes",
        ] {
            assert!(all.iter().any(|p| p == want), "{want} not in {all:?}");
        }
        assert!(!permissions(AGENT).is_empty());
    }
}
