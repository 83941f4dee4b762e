//! A rule's filters: what it does to a request besides choosing its backends — header edits
//! both ways, a redirect, a rewrite of the path or host, mirrors — as the spec defines them,
//! checked here so that a rule the spec says cannot stand (a redirect with backends, say) is
//! not accepted, and resolved here (a mirror's backend is a fleet service like the others).

use serde::Serialize;

use super::{Backend, BackendRef, Match, PathMatch, Rule};

/// One filter of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "value")]
pub enum Filter {
    RequestHeaderModifier(HeaderEdits),
    ResponseHeaderModifier(HeaderEdits),
    RequestRedirect(Redirect),
    #[serde(rename = "URLRewrite")]
    UrlRewrite(Rewrite),
    RequestMirror(Mirror),
    /// A filter meridian does not apply (ExtensionRef, CORS, a backend's own filters …),
    /// described: the rule is not accepted, as the spec forbids ignoring a filter.
    Unsupported(String),
}

/// Headers set (replacing any value), added (beside any value) and removed, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HeaderEdits {
    pub set: Vec<(String, String)>,
    pub add: Vec<(String, String)>,
    pub remove: Vec<String>,
}

impl HeaderEdits {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// How a redirect or a rewrite changes the path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "value")]
pub enum PathModifier {
    /// The whole path becomes this.
    ReplaceFullPath(String),
    /// The prefix the request matched becomes this.
    ReplacePrefixMatch(String),
}

/// A redirect answered instead of sending the request anywhere: each part unset keeps the
/// request's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u16>,
    /// 301 or 302 (the spec's core codes; 302 unless set).
    pub status: u16,
}

/// The request's host and path as its backend receives them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

/// A copy of each request (or of a share of them) sent to another backend, its answer
/// dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mirror {
    pub backend: BackendRef,
    /// The share of requests mirrored, as numerator / denominator (None: every request).
    pub fraction: Option<(u32, u32)>,
}

/// A mirror whose backend the fleet resolved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MirrorTo {
    pub backend: Backend,
    pub fraction: Option<(u32, u32)>,
}

/// What an attached match does besides sending the request to its backends.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Actions {
    #[serde(skip_serializing_if = "HeaderEdits::is_empty")]
    pub request_headers: HeaderEdits,
    #[serde(skip_serializing_if = "HeaderEdits::is_empty")]
    pub response_headers: HeaderEdits,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<MirrorTo>,
}

impl Actions {
    pub fn is_empty(&self) -> bool {
        *self == Actions::default()
    }
}

impl Filter {
    fn name(&self) -> &str {
        match self {
            Filter::RequestHeaderModifier(_) => "RequestHeaderModifier",
            Filter::ResponseHeaderModifier(_) => "ResponseHeaderModifier",
            Filter::RequestRedirect(_) => "RequestRedirect",
            Filter::UrlRewrite(_) => "URLRewrite",
            Filter::RequestMirror(_) => "RequestMirror",
            Filter::Unsupported(what) => what,
        }
    }
}

/// Why the filters of `rule` cannot stand as written, if they cannot: a filter meridian does
/// not apply, a filter type twice (only mirrors may repeat), a redirect beside backends or a
/// rewrite, a prefix replacement on a match that is not a path prefix.
pub(super) fn unsupported(rule: &Rule) -> Option<String> {
    let filters = &rule.filters;
    if let Some(Filter::Unsupported(what)) =
        filters.iter().find(|f| matches!(f, Filter::Unsupported(_)))
    {
        return Some(format!("filter {what} is not supported by meridian"));
    }
    for (i, f) in filters.iter().enumerate() {
        let repeated = !matches!(f, Filter::RequestMirror(_))
            && filters[..i]
                .iter()
                .any(|g| std::mem::discriminant(f) == std::mem::discriminant(g));
        if repeated {
            return Some(format!(
                "filter {} appears twice (only RequestMirror may repeat)",
                f.name()
            ));
        }
    }
    let redirect = filters.iter().find_map(|f| match f {
        Filter::RequestRedirect(r) => Some(r),
        _ => None,
    });
    let rewrite = filters.iter().find_map(|f| match f {
        Filter::UrlRewrite(r) => Some(r),
        _ => None,
    });
    if redirect.is_some() && rewrite.is_some() {
        return Some("RequestRedirect and URLRewrite cannot be used on the same rule".into());
    }
    if redirect.is_some() && !rule.backends.is_empty() {
        return Some("a rule with a RequestRedirect filter cannot have backendRefs".into());
    }
    let prefix_replaced = redirect
        .and_then(|r| r.path.as_ref())
        .or(rewrite.and_then(|r| r.path.as_ref()))
        .is_some_and(|p| matches!(p, PathModifier::ReplacePrefixMatch(_)));
    let on_prefix = |m: &Match| matches!(m.path, None | Some(PathMatch::Prefix(_)));
    if prefix_replaced && !rule.matches.iter().all(on_prefix) {
        return Some(
            "ReplacePrefixMatch needs every match of its rule to be a PathPrefix match".into(),
        );
    }
    None
}

/// The actions of `rule` with its mirrors' backends resolved by `resolve`; a mirror whose
/// backend does not resolve is left out (and `resolve` said why).
pub(super) fn actions<E>(
    rule: &Rule,
    mut resolve: impl FnMut(&BackendRef) -> Result<Backend, E>,
) -> (Actions, Vec<E>) {
    let mut actions = Actions::default();
    let mut errors = Vec::new();
    for filter in &rule.filters {
        match filter {
            Filter::RequestHeaderModifier(e) => actions.request_headers = e.clone(),
            Filter::ResponseHeaderModifier(e) => actions.response_headers = e.clone(),
            Filter::RequestRedirect(r) => actions.redirect = Some(r.clone()),
            Filter::UrlRewrite(r) => actions.rewrite = Some(r.clone()),
            Filter::RequestMirror(m) => match resolve(&m.backend) {
                Ok(backend) => actions.mirrors.push(MirrorTo {
                    backend,
                    fraction: m.fraction,
                }),
                Err(e) => errors.push(e),
            },
            Filter::Unsupported(_) => {}
        }
    }
    (actions, errors)
}
