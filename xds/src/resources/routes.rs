//! RDS for a service port that routes attach to: each match of the route table (core
//! `route::RouteTable`, already in the spec's precedence order) becomes one Envoy route, its
//! backends weighted clusters of the fleet services they name. Nothing is decided here.

use meridian_core::route::{
    Attached, Backend, HeaderEdits, MirrorTo, PathMatch, PathModifier, Redirect, Retry, Rewrite,
    ValueMatch,
};
use xds_api::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, RuntimeFractionalPercent, header_value_option,
};
use xds_api::pb::envoy::config::route::v3::{
    self as xroute, header_matcher, query_parameter_matcher, redirect_action, route_action,
    route_match,
};
use xds_api::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher,
};
use xds_api::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use xds_api::pb::google::protobuf::{Duration, UInt32Value};

/// gRPC's retry back-off when the route names none (gRFC A44's default base interval).
const DEFAULT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(25);

/// The Envoy routes of one parent port, in order. `failing`: the name of the port's cluster
/// without endpoints, where the share of unresolved backends goes.
pub(super) fn routes(attached: &[Attached], failing: &str) -> Vec<xroute::Route> {
    attached.iter().map(|a| route(a, failing)).collect()
}

/// The CDS (and EDS) name of the cluster with no endpoints that a parent port's routes send
/// the share of unresolved backends to: Envoy answers those requests 503 (no healthy
/// upstream), gRPC fails them UNAVAILABLE.
pub(super) fn failing_cluster_name(port_cluster: &str) -> String {
    format!("{port_cluster}/unresolved-backends")
}

/// Whether some match of the port sends a share of its requests to unresolved backends
/// beside resolved ones (all unresolved is a direct 500, with no cluster).
pub(super) fn sends_to_failing(attached: &[Attached]) -> bool {
    attached.iter().any(|a| a.failing > 0 && !a.fails())
}

fn route(a: &Attached, failing: &str) -> xroute::Route {
    let (request, response) = (&a.actions.request_headers, &a.actions.response_headers);
    xroute::Route {
        name: format!(
            "{}/{}/{}/rule-{}",
            a.kind, a.route.namespace, a.route.name, a.rule
        ),
        r#match: Some(route_match_of(&a.matches)),
        action: Some(action(a, failing)),
        request_headers_to_add: header_options(request),
        request_headers_to_remove: request.remove.clone(),
        response_headers_to_add: header_options(response),
        response_headers_to_remove: response.remove.clone(),
        ..Default::default()
    }
}

/// A header modifier's `set` (replacing any value) and `add` (beside any value).
fn header_options(edits: &HeaderEdits) -> Vec<HeaderValueOption> {
    use header_value_option::HeaderAppendAction::{AppendIfExistsOrAdd, OverwriteIfExistsOrAdd};
    let option = |(name, value): &(String, String),
                  action: header_value_option::HeaderAppendAction| {
        HeaderValueOption {
            header: Some(HeaderValue {
                key: name.clone(),
                value: value.clone(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        }
    };
    edits
        .set
        .iter()
        .map(|h| option(h, OverwriteIfExistsOrAdd))
        .chain(edits.add.iter().map(|h| option(h, AppendIfExistsOrAdd)))
        .collect()
}

fn route_match_of(m: &meridian_core::route::Match) -> xroute::RouteMatch {
    let path = match &m.path {
        None => route_match::PathSpecifier::Prefix("/".to_owned()),
        Some(PathMatch::Exact(p)) => route_match::PathSpecifier::Path(p.clone()),
        Some(PathMatch::Prefix(p)) => route_match::PathSpecifier::Prefix(p.clone()),
        Some(PathMatch::Regex(r)) => route_match::PathSpecifier::SafeRegex(regex(r)),
    };
    let method = m.method.iter().map(|method| xroute::HeaderMatcher {
        name: ":method".to_owned(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::ExactMatch(
            method.clone(),
        )),
        ..Default::default()
    });
    xroute::RouteMatch {
        path_specifier: Some(path),
        headers: m.headers.iter().map(header).chain(method).collect(),
        query_parameters: m.query.iter().map(query).collect(),
        ..Default::default()
    }
}

fn header(v: &ValueMatch) -> xroute::HeaderMatcher {
    let specifier = if v.regex {
        header_matcher::HeaderMatchSpecifier::SafeRegexMatch(regex(&v.value))
    } else {
        header_matcher::HeaderMatchSpecifier::ExactMatch(v.value.clone())
    };
    xroute::HeaderMatcher {
        name: v.name.to_ascii_lowercase(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

fn query(v: &ValueMatch) -> xroute::QueryParameterMatcher {
    let pattern = if v.regex {
        string_matcher::MatchPattern::SafeRegex(regex(&v.value))
    } else {
        string_matcher::MatchPattern::Exact(v.value.clone())
    };
    xroute::QueryParameterMatcher {
        name: v.name.clone(),
        query_parameter_match_specifier: Some(
            query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(StringMatcher {
                match_pattern: Some(pattern),
                ..Default::default()
            }),
        ),
    }
}

fn regex(pattern: &str) -> RegexMatcher {
    RegexMatcher {
        regex: pattern.to_owned(),
        engine_type: None,
    }
}

/// Where a match sends a request: its weighted backends (and the unresolved backends'
/// share to the `failing` cluster), or — with no backend that has a weight — a 500, as the
/// spec says for requests to invalid backends (gRPC fails the call).
fn action(a: &Attached, failing: &str) -> xroute::route::Action {
    if let Some(redirect) = &a.actions.redirect {
        return xroute::route::Action::Redirect(redirect_action_of(redirect, &a.matches));
    }
    if a.fails() {
        return xroute::route::Action::DirectResponse(xroute::DirectResponseAction {
            status: 500,
            body: None,
        });
    }
    let mut weighted: Vec<(String, u32)> = a
        .backends
        .iter()
        .filter(|b| b.weight > 0)
        .map(|b| (cluster_name(b), b.weight))
        .collect();
    if a.failing > 0 {
        weighted.push((failing.to_owned(), a.failing));
    }
    let cluster = match weighted.as_slice() {
        [(one, _)] => route_action::ClusterSpecifier::Cluster(one.clone()),
        many => route_action::ClusterSpecifier::WeightedClusters(xroute::WeightedCluster {
            clusters: many
                .iter()
                .map(|(name, weight)| xroute::weighted_cluster::ClusterWeight {
                    name: name.clone(),
                    weight: Some(UInt32Value { value: *weight }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
    };
    xroute::route::Action::Route(xroute::RouteAction {
        cluster_specifier: Some(cluster),
        // Envoy reads `timeout`; gRPC reads `max_stream_duration` (gRFC A31).
        timeout: a.timeout.map(duration),
        max_stream_duration: a.timeout.map(|t| route_action::MaxStreamDuration {
            max_stream_duration: Some(duration(t)),
            ..Default::default()
        }),
        retry_policy: a.retry.as_ref().map(retry_policy),
        request_mirror_policies: a.actions.mirrors.iter().map(mirror_policy).collect(),
        regex_rewrite: a
            .actions
            .rewrite
            .as_ref()
            .and_then(|r| r.path.as_ref())
            .map(|p| path_rewrite(p, &a.matches)),
        host_rewrite_specifier: a
            .actions
            .rewrite
            .as_ref()
            .and_then(|r: &Rewrite| r.hostname.clone())
            .map(route_action::HostRewriteSpecifier::HostRewriteLiteral),
        ..Default::default()
    })
}

/// A RequestRedirect as Envoy's: each part unset keeps the request's.
fn redirect_action_of(r: &Redirect, m: &meridian_core::route::Match) -> xroute::RedirectAction {
    use redirect_action::RedirectResponseCode::{Found, MovedPermanently};
    xroute::RedirectAction {
        host_redirect: r.hostname.clone().unwrap_or_default(),
        port_redirect: r.port.map_or(0, u32::from),
        response_code: if r.status == 301 {
            MovedPermanently
        } else {
            Found
        } as i32,
        scheme_rewrite_specifier: r
            .scheme
            .clone()
            .map(redirect_action::SchemeRewriteSpecifier::SchemeRedirect),
        path_rewrite_specifier: r
            .path
            .as_ref()
            .map(|p| redirect_action::PathRewriteSpecifier::RegexRewrite(path_rewrite(p, m))),
        ..Default::default()
    }
}

/// A path modifier as one regular expression substitution on the path (the query is kept).
/// A prefix replacement replaces whole path segments, as the spec says: the match's prefix
/// `/foo` replaced by `/xyz` makes `/foo/bar` `/xyz/bar`, and replaced by `/` makes it `/bar`
/// (Envoy's own `prefix_rewrite` would make that `//bar`).
fn path_rewrite(p: &PathModifier, m: &meridian_core::route::Match) -> RegexMatchAndSubstitute {
    let (pattern, substitution) = match p {
        PathModifier::ReplaceFullPath(path) => ("^/.*$".to_owned(), path.clone()),
        PathModifier::ReplacePrefixMatch(with) => {
            let prefix = match &m.path {
                Some(PathMatch::Prefix(prefix)) => prefix.trim_end_matches('/'),
                _ => "",
            };
            let with = with.trim_end_matches('/');
            if with.is_empty() {
                (
                    format!("^{}/*(.*)$", meridian_core::regex_literal(prefix)),
                    "/\\1".to_owned(),
                )
            } else {
                (
                    format!("^{}(/.*)?$", meridian_core::regex_literal(prefix)),
                    format!("{with}\\1"),
                )
            }
        }
    };
    RegexMatchAndSubstitute {
        pattern: Some(regex(&pattern)),
        substitution,
    }
}

/// A mirror: the backend's own cluster, with the share of requests copied (in millionths).
fn mirror_policy(m: &MirrorTo) -> route_action::RequestMirrorPolicy {
    route_action::RequestMirrorPolicy {
        cluster: cluster_name(&m.backend),
        runtime_fraction: m
            .fraction
            .map(|(numerator, denominator)| RuntimeFractionalPercent {
                default_value: Some(FractionalPercent {
                    numerator: u32::try_from(
                        u64::from(numerator) * 1_000_000 / u64::from(denominator.max(1)),
                    )
                    .unwrap_or(1_000_000),
                    denominator: fractional_percent::DenominatorType::Million as i32,
                }),
                ..Default::default()
            }),
        ..Default::default()
    }
}

/// The CDS name of a backend: the fleet service port's own cluster.
fn cluster_name(b: &Backend) -> String {
    format!(
        "{}{}",
        super::service_name_prefix(&b.service.namespace, &b.service.name),
        b.port
    )
}

/// Retries as Envoy and gRPC both read them: Envoy retries the HTTP codes named; gRPC the
/// status codes those HTTP codes become (gRFC A44 names the ones it honours).
fn retry_policy(r: &Retry) -> xroute::RetryPolicy {
    let mut on: Vec<&str> = Vec::new();
    for code in &r.codes {
        let grpc = match code {
            500 => "internal",
            429 | 502 | 503 | 504 => "unavailable",
            _ => continue,
        };
        if !on.contains(&grpc) {
            on.push(grpc);
        }
    }
    on.push("retriable-status-codes");
    let base = r
        .backoff
        .unwrap_or(DEFAULT_BACKOFF)
        .max(std::time::Duration::from_millis(1));
    xroute::RetryPolicy {
        retry_on: on.join(","),
        num_retries: Some(UInt32Value { value: r.attempts }),
        retriable_status_codes: r.codes.iter().map(|c| u32::from(*c)).collect(),
        retry_back_off: Some(xroute::retry_policy::RetryBackOff {
            base_interval: Some(duration(base)),
            max_interval: Some(duration(base * 10)),
        }),
        ..Default::default()
    }
}

fn duration(d: std::time::Duration) -> Duration {
    Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
