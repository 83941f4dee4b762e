//! What a tenant's user may ask the gateway, decided from the route, the method and
//! the API path before anything is forwarded — the members' RBAC still decides within it.
//!
//! ```text
//!  discovery, /version, /openapi (reads)        allowed
//!  self reviews (whoami, can-i)                 allowed
//!  /clusters/<c>/…  c not the tenant's          403
//!  a namespace of the request (…/namespaces/<ns>/…, or the Namespace <ns> itself)
//!    not the tenant's there                     403   (on `*`: in none of its clusters)
//!  no namespace: a write (cluster-scoped)       403
//!                a read on one cluster or hub   403   (read across namespaces through `*`)
//!                a read through `*`             allowed, each item filtered (`visible`)
//! ```

use http::Method;
use meridian_core::tenant::Reach;
use serde_json::Value;

use crate::path::ApiPath;

/// Where a request goes, as the tenant check sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination<'a> {
    Hub,
    Member(&'a str),
    Every,
}

/// Why a tenant's user is refused (403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("cluster {cluster} is not one of tenant {tenants}'s clusters")]
    Cluster { cluster: String, tenants: String },
    #[error("namespace {namespace} is not one of tenant {tenants}'s namespaces{place}")]
    Namespace {
        namespace: String,
        tenants: String,
        place: String,
    },
    #[error("tenant {tenants}'s users may not write cluster-scoped objects")]
    ClusterScopedWrite { tenants: String },
    #[error(
        "tenant {tenants}'s users read one namespace at a time here; across namespaces, read through /clusters/*/ (which shows only the tenant's namespaces)"
    )]
    AcrossNamespaces { tenants: String },
    #[error("tenant {tenants}'s users may not read every member's metrics")]
    Metrics { tenants: String },
}

/// Checks a request of a user bounded by `tenants` (their names, for messages) reaching `reach`.
pub fn check(
    reach: &Reach,
    tenants: &str,
    target: Destination<'_>,
    method: &Method,
    path: &str,
) -> Result<(), Refused> {
    let tenants = tenants.to_string();
    let read = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if let Destination::Member(cluster) = target
        && !reach.spans(cluster)
    {
        return Err(Refused::Cluster {
            cluster: cluster.to_string(),
            tenants,
        });
    }
    let Some(api) = ApiPath::parse(path) else {
        // Discovery, /version, /openapi: the same for everyone.
        return if read {
            Ok(())
        } else {
            Err(Refused::ClusterScopedWrite { tenants })
        };
    };
    if is_self_review(&api) {
        return Ok(());
    }
    if let Some(namespace) = namespace_of(&api) {
        let (mine, place) = match target {
            Destination::Hub => (reach.namespace(None, namespace), " on the hub".to_string()),
            Destination::Member(c) => (reach.namespace(Some(c), namespace), format!(" in {c}")),
            Destination::Every => (
                reach.clusters.values().any(|n| n.contains(namespace)),
                " in any cluster".to_string(),
            ),
        };
        if !mine {
            return Err(Refused::Namespace {
                namespace: namespace.to_string(),
                tenants,
                place,
            });
        }
        // The Namespace object itself is cluster-scoped: it is read, never written.
        let namespace_object = api.namespace.is_none();
        return if read || !namespace_object {
            Ok(())
        } else {
            Err(Refused::ClusterScopedWrite { tenants })
        };
    }
    match (read, target) {
        (false, _) => Err(Refused::ClusterScopedWrite { tenants }),
        (true, Destination::Every) => Ok(()),
        (true, _) => Err(Refused::AcrossNamespaces { tenants }),
    }
}

/// The members a tenant's request through `*` asks: its clusters, and of those only the ones
/// where the request's namespace (if it names one) is the tenant's.
pub fn asks(reach: &Reach, path: &str, cluster: &str) -> bool {
    let Some(spans) = reach.clusters.get(cluster) else {
        return false;
    };
    match ApiPath::parse(path).as_ref().and_then(namespace_of) {
        Some(namespace) => spans.contains(namespace),
        None => true,
    }
}

/// Whether an object a member answered through `*` (for `path`) is the tenant's to see: in
/// one of its namespaces there, or one of those Namespaces itself (list items carry no kind:
/// the path says what they are).
pub fn visible(reach: &Reach, cluster: &str, path: &str, object: &Value) -> bool {
    let metadata = &object["metadata"];
    visible_named(
        reach,
        cluster,
        path,
        metadata["namespace"].as_str(),
        metadata["name"].as_str(),
    )
}

/// [`visible`] for an object known by its namespace and name (a list's entry, read as it is
/// copied: `merge::page`).
pub fn visible_named(
    reach: &Reach,
    cluster: &str,
    path: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    let namespace = match namespace {
        Some(ns) if !ns.is_empty() => ns,
        _ if lists_namespaces(path) => name.unwrap_or_default(),
        _ => return false,
    };
    reach.namespace(Some(cluster), namespace)
}

/// The path is of Namespaces (the collection or one of them).
fn lists_namespaces(path: &str) -> bool {
    ApiPath::parse(path).is_some_and(|a| {
        a.group_version == "v1" && a.resource == "namespaces" && a.namespace.is_none()
    })
}

/// The namespace a request is about: the one in its path, or the Namespace it names.
fn namespace_of(api: &ApiPath) -> Option<&str> {
    match (
        &api.namespace,
        api.group_version.as_str(),
        api.resource.as_str(),
    ) {
        (Some(ns), _, _) => Some(ns),
        (None, "v1", "namespaces") => api.name.as_deref(),
        _ => None,
    }
}

/// `kubectl auth whoami` and `kubectl auth can-i`: about the caller, nothing stored.
fn is_self_review(api: &ApiPath) -> bool {
    api.group_version.starts_with("authentication.k8s.io/") && api.resource == "selfsubjectreviews"
        || api.group_version.starts_with("authorization.k8s.io/")
            && matches!(
                api.resource.as_str(),
                "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
            )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reach() -> Reach {
        Reach {
            clusters: [
                ("m1".to_string(), ["shop".to_string()].into()),
                (
                    "m2".to_string(),
                    ["shop".to_string(), "shop-dev".to_string()].into(),
                ),
            ]
            .into(),
            hub: ["shop".to_string()].into(),
        }
    }

    fn ask(target: Destination<'_>, method: Method, path: &str) -> Result<(), Refused> {
        check(&reach(), "shop", target, &method, path)
    }

    #[test]
    fn the_tenants_namespaces_in_its_clusters_pass() {
        let m1 = Destination::Member("m1");
        assert_eq!(ask(m1, Method::GET, "/api/v1/namespaces/shop/pods"), Ok(()));
        assert_eq!(
            ask(m1, Method::POST, "/api/v1/namespaces/shop/configmaps"),
            Ok(())
        );
        assert_eq!(ask(m1, Method::GET, "/api/v1/namespaces/shop"), Ok(()));
        assert_eq!(
            ask(m1, Method::GET, "/api/v1/watch/namespaces/shop/pods"),
            Ok(())
        );
        assert_eq!(
            ask(
                Destination::Hub,
                Method::GET,
                "/apis/meridian.io/v1alpha1/namespaces/shop/clusterschedulingpolicies"
            ),
            Ok(())
        );
        assert_eq!(
            ask(
                Destination::Every,
                Method::GET,
                "/api/v1/namespaces/shop-dev/pods"
            ),
            Ok(())
        );
        // Discovery and self reviews are everyone's.
        assert_eq!(ask(m1, Method::GET, "/apis"), Ok(()));
        assert_eq!(ask(m1, Method::GET, "/version"), Ok(()));
        assert_eq!(
            ask(
                m1,
                Method::POST,
                "/apis/authentication.k8s.io/v1/selfsubjectreviews"
            ),
            Ok(())
        );
        assert_eq!(
            ask(
                Destination::Hub,
                Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
            ),
            Ok(())
        );
    }

    #[test]
    fn other_clusters_and_namespaces_are_refused() {
        assert!(matches!(
            ask(
                Destination::Member("m3"),
                Method::GET,
                "/api/v1/namespaces/shop/pods"
            ),
            Err(Refused::Cluster { .. })
        ));
        let e = ask(
            Destination::Member("m1"),
            Method::GET,
            "/api/v1/namespaces/shop-dev/pods",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "namespace shop-dev is not one of tenant shop's namespaces in m1"
        );
        assert!(matches!(
            ask(
                Destination::Member("m1"),
                Method::GET,
                "/api/v1/watch/namespaces/kube-system/secrets"
            ),
            Err(Refused::Namespace { .. })
        ));
        assert!(matches!(
            ask(
                Destination::Every,
                Method::GET,
                "/api/v1/namespaces/default/pods"
            ),
            Err(Refused::Namespace { .. })
        ));
        assert!(matches!(
            ask(
                Destination::Hub,
                Method::GET,
                "/api/v1/namespaces/shop-dev/configmaps"
            ),
            Err(Refused::Namespace { .. })
        ));
    }

    #[test]
    fn cluster_scoped_writes_and_single_cluster_reads_across_namespaces_are_refused() {
        let m1 = Destination::Member("m1");
        for (method, path) in [
            (Method::POST, "/api/v1/namespaces"),
            (Method::DELETE, "/api/v1/namespaces/shop"),
            (Method::PATCH, "/api/v1/nodes/n1"),
            (
                Method::POST,
                "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            ),
            (Method::POST, "/api"),
        ] {
            assert!(
                matches!(
                    ask(m1, method.clone(), path),
                    Err(Refused::ClusterScopedWrite { .. })
                ),
                "{method} {path}"
            );
        }
        assert!(matches!(
            ask(m1, Method::GET, "/api/v1/pods"),
            Err(Refused::AcrossNamespaces { .. })
        ));
        assert!(matches!(
            ask(Destination::Hub, Method::GET, "/api/v1/secrets"),
            Err(Refused::AcrossNamespaces { .. })
        ));
        // Through `*` it is read, filtered.
        assert_eq!(ask(Destination::Every, Method::GET, "/api/v1/pods"), Ok(()));
    }

    #[test]
    fn star_asks_the_tenants_clusters_and_shows_only_its_objects() {
        let r = reach();
        assert!(asks(&r, "/api/v1/pods", "m1") && asks(&r, "/api/v1/pods", "m2"));
        assert!(!asks(&r, "/api/v1/pods", "m3"));
        assert!(!asks(&r, "/api/v1/namespaces/shop-dev/pods", "m1"));
        assert!(asks(&r, "/api/v1/namespaces/shop-dev/pods", "m2"));

        let pods = "/api/v1/pods";
        let pod = |ns: &str| json!({"metadata": {"namespace": ns, "name": "p"}});
        assert!(visible(&r, "m1", pods, &pod("shop")));
        assert!(!visible(&r, "m1", pods, &pod("shop-dev")));
        assert!(visible(&r, "m2", pods, &pod("shop-dev")));
        // List items name no kind: a namespace is one by the path.
        let ns = |name: &str| json!({"metadata": {"name": name}});
        let namespaces = "/api/v1/namespaces?limit=5";
        assert!(visible(&r, "m1", namespaces, &ns("shop")));
        assert!(!visible(&r, "m1", namespaces, &ns("default")));
        assert!(!visible(&r, "m1", "/api/v1/nodes", &ns("shop")));
    }
}
