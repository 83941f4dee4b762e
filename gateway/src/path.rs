//! Where a gateway request goes, from its path alone.
//!
//! ```text
//! /clusters/<name>/<api path>   one member         (Route::Member)
//! /clusters/*/<api path>        every member, merged (Route::Every; GET only)
//! /clusters/metrics             every member's /metrics, labelled by cluster (Route::Metrics)
//! anything else                 the hub            (Route::Hub)
//! ```
//!
//! A cluster name is a DNS-1123 subdomain, as a MemberCluster's name is; anything else in
//! that place (`..`, an escaped slash, an empty segment) is not a cluster and answers 404.
//! The API path after it is parsed as Kubernetes lays out its URLs, so an aggregated request
//! knows whether it names a collection or one object.

use meridian_core::is_cluster_name;

/// Where the request goes, and the API path (with its query) to send there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Member {
        cluster: String,
        path: String,
    },
    Every {
        path: String,
    },
    /// Every member's /metrics and meridian's own (so no member can be named `metrics`).
    Metrics,
    Hub {
        path: String,
    },
}

/// Why a path is not routed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("{0:?} is not a cluster name")]
    BadCluster(String),
    #[error("the path is not a Kubernetes API path")]
    NotApi,
}

pub const CLUSTERS_PREFIX: &str = "/clusters/";

/// Routes `path_and_query` (as the request line carries it, still percent-encoded).
pub fn route(path_and_query: &str) -> Result<Route, RouteError> {
    let Some(rest) = path_and_query.strip_prefix(CLUSTERS_PREFIX) else {
        return Ok(Route::Hub {
            path: path_and_query.to_string(),
        });
    };
    if rest == "metrics" || rest.starts_with("metrics?") {
        return Ok(Route::Metrics);
    }
    let (cluster, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'?' => (&rest[..i], format!("/{}", &rest[i..])),
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    // Clients may escape the star (Go's URL handling does): `%2A` is `*`.
    let cluster = if cluster.eq_ignore_ascii_case("%2a") {
        "*"
    } else {
        cluster
    };
    if cluster != "*" && !is_cluster_name(cluster) {
        return Err(RouteError::BadCluster(cluster.to_string()));
    }
    if !is_api_path(&path) {
        return Err(RouteError::NotApi);
    }
    Ok(match cluster {
        "*" => Route::Every { path },
        c => Route::Member {
            cluster: c.to_string(),
            path,
        },
    })
}

/// The paths a member's API serves to the gateway: discovery, resources and the version, never
/// a dot segment.
fn is_api_path(path_and_query: &str) -> bool {
    let path = path_and_query.split('?').next().unwrap_or_default();
    let api = path == "/"
        || path == "/version"
        || ["/api", "/apis", "/openapi"]
            .iter()
            .any(|p| path == *p || path.starts_with(&format!("{p}/")));
    api && !path.split('/').any(|s| s == ".." || s == ".")
}

/// A Kubernetes resource URL, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPath {
    /// `v1` for the core group, `group/version` otherwise.
    pub group_version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl ApiPath {
    /// The URL of a resource (without query); None for discovery and other non-resource paths.
    pub fn parse(path: &str) -> Option<Self> {
        let path = path.split('?').next()?;
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (group_version, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => (version.to_string(), rest),
            ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
            _ => return None,
        };
        // The legacy watch URLs (`/api/v1/watch/namespaces/…`) name the same resources.
        let rest = match rest {
            ["watch", rest @ ..] => rest,
            rest => rest,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, resource, rest @ ..] => (Some(ns.to_string()), {
                let mut v = vec![*resource];
                v.extend_from_slice(rest);
                v
            }),
            rest => (None, rest.to_vec()),
        };
        let mut rest = rest.into_iter().filter(|s| !s.is_empty());
        let resource = rest.next()?.to_string();
        let name = rest.next().map(str::to_string);
        let subresource = rest.next().map(str::to_string);
        if rest.next().is_some() {
            return None;
        }
        Some(Self {
            group_version,
            namespace,
            resource,
            name,
            subresource,
        })
    }

    /// `/api/v1/namespaces` itself with a name is the Namespace object, not a scope.
    pub fn is_collection(&self) -> bool {
        self.name.is_none()
    }
}

/// The value of query parameter `key` (undecoded; the parameters the gateway reads are
/// plain tokens).
pub fn query_param<'a>(path_and_query: &'a str, key: &str) -> Option<&'a str> {
    let (_, query) = path_and_query.split_once('?')?;
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// `path_and_query` with each `(key, value)` set (None: removed), the other parameters kept
/// in their order.
pub fn with_params(path_and_query: &str, set: &[(&str, Option<&str>)]) -> String {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let mut params: Vec<String> = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .filter(|kv| {
            let k = kv.split('=').next().unwrap_or_default();
            !set.iter().any(|(key, _)| *key == k)
        })
        .map(str::to_string)
        .collect();
    params.extend(
        set.iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={v}"))),
    );
    if params.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", params.join("&"))
    }
}

#[cfg(test)]
mod tests;
