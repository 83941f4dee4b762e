use super::*;

fn member(cluster: &str, path: &str) -> Result<Route, RouteError> {
    Ok(Route::Member {
        cluster: cluster.into(),
        path: path.into(),
    })
}

#[test]
fn a_cluster_prefix_routes_to_that_member_with_the_rest_of_the_path() {
    assert_eq!(
        route("/clusters/m1/api/v1/namespaces/shop/services?limit=5"),
        member("m1", "/api/v1/namespaces/shop/services?limit=5")
    );
    assert_eq!(
        route("/clusters/eu.m-2/version"),
        member("eu.m-2", "/version")
    );
    assert_eq!(route("/clusters/m1/api"), member("m1", "/api"));
    assert_eq!(route("/clusters/m1"), member("m1", "/"));
    assert_eq!(
        route("/clusters/m1?timeout=32s"),
        member("m1", "/?timeout=32s")
    );
}

#[test]
fn the_star_is_every_member_and_other_paths_are_the_hub() {
    assert_eq!(
        route("/clusters/*/api/v1/pods?watch=1"),
        Ok(Route::Every {
            path: "/api/v1/pods?watch=1".into()
        })
    );
    assert_eq!(route("/clusters/metrics"), Ok(Route::Metrics));
    assert_eq!(route("/clusters/metrics/api"), member("metrics", "/api"));
    assert_eq!(
        route("/clusters/%2A/api"),
        Ok(Route::Every {
            path: "/api".into()
        })
    );
    assert_eq!(
        route("/apis/meridian.io/v1alpha1/memberclusters"),
        Ok(Route::Hub {
            path: "/apis/meridian.io/v1alpha1/memberclusters".into()
        })
    );
}

#[test]
fn traversal_and_odd_names_are_not_clusters() {
    for path in [
        "/clusters/../api/v1/secrets",
        "/clusters/%2e%2e/api/v1/secrets",
        "/clusters/M1/api",
        "/clusters//api",
        "/clusters/-m1/api",
        "/clusters/m1%2fapi/v1",
    ] {
        assert!(
            matches!(route(path), Err(RouteError::BadCluster(_))),
            "{path}: {:?}",
            route(path)
        );
    }
    assert_eq!(
        route("/clusters/m1/api/../../secrets"),
        Err(RouteError::NotApi)
    );
    assert_eq!(route("/clusters/m1/metrics"), Err(RouteError::NotApi));
}

#[test]
fn resource_urls_are_taken_apart() {
    let p = ApiPath::parse("/api/v1/namespaces/shop/pods/web-1/log?follow=1").unwrap();
    assert_eq!(
        (
            p.group_version.as_str(),
            p.namespace.as_deref(),
            p.resource.as_str(),
            p.name.as_deref(),
            p.subresource.as_deref()
        ),
        ("v1", Some("shop"), "pods", Some("web-1"), Some("log"))
    );
    let p = ApiPath::parse("/apis/apps/v1/deployments").unwrap();
    assert_eq!(p.group_version, "apps/v1");
    assert!(p.is_collection() && p.namespace.is_none());
    let p = ApiPath::parse("/api/v1/namespaces/shop").unwrap();
    assert_eq!(
        (p.resource.as_str(), p.name.as_deref()),
        ("namespaces", Some("shop"))
    );
    assert_eq!(ApiPath::parse("/api"), None);
    assert_eq!(ApiPath::parse("/apis/apps/v1"), None);
    assert_eq!(ApiPath::parse("/version"), None);
}

#[test]
fn query_parameters_are_found_by_key() {
    let p = "/api/v1/pods?watch=true&resourceVersion=abc&allowWatchBookmarks";
    assert_eq!(query_param(p, "watch"), Some("true"));
    assert_eq!(query_param(p, "resourceVersion"), Some("abc"));
    assert_eq!(query_param(p, "allowWatchBookmarks"), Some(""));
    assert_eq!(query_param(p, "limit"), None);
}

#[test]
fn parameters_are_set_and_removed_keeping_the_others() {
    assert_eq!(
        with_params(
            "/api/v1/pods?limit=5&watch=1&continue=x",
            &[("limit", Some("2")), ("continue", None)]
        ),
        "/api/v1/pods?watch=1&limit=2"
    );
    assert_eq!(
        with_params("/api/v1/pods?continue=x", &[("continue", None)]),
        "/api/v1/pods"
    );
    assert_eq!(
        with_params("/api/v1/pods", &[("resourceVersion", Some("5"))]),
        "/api/v1/pods?resourceVersion=5"
    );
}
