//! A rule's `filters` as the upstream CRDs write them, converted into core's
//! (`meridian_core::route::Filter`): the spec's shape checks (header names and counts, a
//! redirect's scheme and code, a path modifier's type and value) are made here, as the API
//! server's validation would; what a filter means for its rule is core's to check.

use meridian_core::ObjectKey;
use meridian_core::route::{Filter, HeaderEdits, Mirror, PathModifier, Redirect, Rewrite};
use serde::{Deserialize, Serialize};

use super::{BackendReference, MAX_VALUES, backends};

/// The filter types a GRPCRoute may name (the others are HTTPRoute's alone).
const GRPC_FILTERS: [&str; 4] = [
    "RequestHeaderModifier",
    "ResponseHeaderModifier",
    "RequestMirror",
    "ExtensionRef",
];

/// A filter as written: its type and the field of that type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FilterSpec {
    #[serde(rename = "type")]
    pub kind: String,
    pub request_header_modifier: Option<HeaderModifierSpec>,
    pub response_header_modifier: Option<HeaderModifierSpec>,
    pub request_redirect: Option<RedirectSpec>,
    #[serde(rename = "urlRewrite")]
    pub url_rewrite: Option<RewriteSpec>,
    pub request_mirror: Option<MirrorSpec>,
    pub extension_ref: Option<serde_json::Value>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeaderModifierSpec {
    #[serde(default)]
    pub set: Vec<HeaderSpec>,
    #[serde(default)]
    pub add: Vec<HeaderSpec>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HeaderSpec {
    pub name: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RedirectSpec {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifierSpec>,
    pub port: Option<i32>,
    pub status_code: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RewriteSpec {
    pub hostname: Option<String>,
    pub path: Option<PathModifierSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PathModifierSpec {
    #[serde(rename = "type")]
    pub kind: String,
    pub replace_full_path: Option<String>,
    pub replace_prefix_match: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MirrorSpec {
    pub backend_ref: BackendReference,
    pub percent: Option<i32>,
    pub fraction: Option<FractionSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct FractionSpec {
    pub numerator: i32,
    pub denominator: Option<i32>,
}

/// The filters of a rule and of its backends (`grpc`: a GRPCRoute's). A backend's own
/// filters are not applied by meridian: each becomes `Filter::Unsupported`, which rejects
/// the rule.
pub(super) fn filters(
    rule: &[FilterSpec],
    backend_refs: &[BackendReference],
    route: &ObjectKey,
    grpc: bool,
) -> Result<Vec<Filter>, String> {
    let mut out = Vec::with_capacity(rule.len());
    for (i, f) in rule.iter().enumerate() {
        out.push(filter(f, route, grpc).map_err(|e| format!("filters[{i}] ({}): {e}", f.kind))?);
    }
    for b in backend_refs {
        for f in &b.filters {
            out.push(Filter::Unsupported(format!(
                "{} on backendRef {}",
                f.kind, b.name
            )));
        }
    }
    Ok(out)
}

fn filter(f: &FilterSpec, route: &ObjectKey, grpc: bool) -> Result<Filter, String> {
    if grpc && !GRPC_FILTERS.contains(&f.kind.as_str()) {
        return Err(format!(
            "a GRPCRoute's filters are {}",
            GRPC_FILTERS.join(", ")
        ));
    }
    let missing = |field: &str| format!("type {} needs the field {field}", f.kind);
    Ok(match f.kind.as_str() {
        "RequestHeaderModifier" => Filter::RequestHeaderModifier(header_edits(
            f.request_header_modifier
                .as_ref()
                .ok_or_else(|| missing("requestHeaderModifier"))?,
        )?),
        "ResponseHeaderModifier" => Filter::ResponseHeaderModifier(header_edits(
            f.response_header_modifier
                .as_ref()
                .ok_or_else(|| missing("responseHeaderModifier"))?,
        )?),
        "RequestRedirect" => Filter::RequestRedirect(redirect(
            f.request_redirect
                .as_ref()
                .ok_or_else(|| missing("requestRedirect"))?,
        )?),
        "URLRewrite" => {
            let r = f
                .url_rewrite
                .as_ref()
                .ok_or_else(|| missing("urlRewrite"))?;
            Filter::UrlRewrite(Rewrite {
                hostname: r.hostname.as_deref().map(hostname).transpose()?,
                path: r.path.as_ref().map(path_modifier).transpose()?,
            })
        }
        "RequestMirror" => Filter::RequestMirror(mirror(
            f.request_mirror
                .as_ref()
                .ok_or_else(|| missing("requestMirror"))?,
            route,
        )?),
        // Named by the spec, applied by meridian never: the rule is not accepted.
        "ExtensionRef" | "CORS" | "ExternalAuth" => Filter::Unsupported(f.kind.clone()),
        other => return Err(format!("unknown filter type {other:?}")),
    })
}

fn header_edits(h: &HeaderModifierSpec) -> Result<HeaderEdits, String> {
    let pairs = |what: &str, headers: &[HeaderSpec]| -> Result<Vec<(String, String)>, String> {
        if headers.len() > MAX_VALUES {
            return Err(format!(
                "{} headers to {what} (at most {MAX_VALUES})",
                headers.len()
            ));
        }
        let mut seen: Vec<String> = Vec::new();
        headers
            .iter()
            .map(|h| {
                let name = header_name(&h.name)?;
                if seen.contains(&name) {
                    return Err(format!("header {} named twice in {what}", h.name));
                }
                seen.push(name.clone());
                if h.value.len() > 4096 || h.value.chars().any(|c| c.is_control()) {
                    return Err(format!(
                        "header {}: a value of at most 4096 bytes without control characters",
                        h.name
                    ));
                }
                Ok((name, h.value.clone()))
            })
            .collect()
    };
    if h.remove.len() > MAX_VALUES {
        return Err(format!(
            "{} headers to remove (at most {MAX_VALUES})",
            h.remove.len()
        ));
    }
    Ok(HeaderEdits {
        set: pairs("set", &h.set)?,
        add: pairs("add", &h.add)?,
        remove: h
            .remove
            .iter()
            .map(|n| header_name(n))
            .collect::<Result<_, _>>()?,
    })
}

/// A header name as HTTP/2 carries it (lower case), if it is one: a token of at most 256
/// bytes, not a pseudo-header.
fn header_name(name: &str) -> Result<String, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || name.len() > 256 || !name.chars().all(token) {
        return Err(format!("{name:?} is not a header name"));
    }
    Ok(name.to_ascii_lowercase())
}

fn redirect(r: &RedirectSpec) -> Result<Redirect, String> {
    let scheme = match r.scheme.as_deref() {
        None => None,
        Some(s @ ("http" | "https")) => Some(s.to_owned()),
        Some(other) => return Err(format!("scheme {other:?} is neither http nor https")),
    };
    let status = match r.status_code.unwrap_or(302) {
        code @ (301 | 302) => code as u16,
        other => return Err(format!("statusCode {other} is neither 301 nor 302")),
    };
    Ok(Redirect {
        scheme,
        hostname: r.hostname.as_deref().map(hostname).transpose()?,
        path: r.path.as_ref().map(path_modifier).transpose()?,
        port: super::port_of(r.port, "redirect")?,
        status,
    })
}

/// A hostname as the spec allows it (RFC 1123, no wildcard).
fn hostname(h: &str) -> Result<String, String> {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if h.len() > 253 || !h.split('.').all(label) {
        return Err(format!("{h:?} is not a hostname"));
    }
    Ok(h.to_ascii_lowercase())
}

fn path_modifier(p: &PathModifierSpec) -> Result<PathModifier, String> {
    let value = |v: &Option<String>, field: &str| -> Result<String, String> {
        let v = v
            .clone()
            .ok_or_else(|| format!("path type {} needs {field}", p.kind))?;
        if !v.starts_with('/') || v.len() > 1024 {
            return Err(format!("path {v:?} must start with / (at most 1024 bytes)"));
        }
        Ok(v)
    };
    match p.kind.as_str() {
        "ReplaceFullPath" => Ok(PathModifier::ReplaceFullPath(value(
            &p.replace_full_path,
            "replaceFullPath",
        )?)),
        "ReplacePrefixMatch" => Ok(PathModifier::ReplacePrefixMatch(value(
            &p.replace_prefix_match,
            "replacePrefixMatch",
        )?)),
        other => Err(format!(
            "path type {other:?} is neither ReplaceFullPath nor ReplacePrefixMatch"
        )),
    }
}

fn mirror(m: &MirrorSpec, route: &ObjectKey) -> Result<Mirror, String> {
    let backend = backends(std::slice::from_ref(&m.backend_ref), route)?
        .pop()
        .expect("one backend in, one out");
    let fraction = match (m.percent, &m.fraction) {
        (Some(_), Some(_)) => return Err("percent and fraction cannot both be set".into()),
        (Some(p), None) => {
            if !(0..=100).contains(&p) {
                return Err(format!("percent {p} is outside 0-100"));
            }
            Some((p as u32, 100))
        }
        (None, Some(f)) => {
            let denominator = f.denominator.unwrap_or(100);
            if denominator < 1 || f.numerator < 0 || f.numerator > denominator {
                return Err(format!(
                    "fraction {}/{denominator}: need 0 ≤ numerator ≤ denominator, denominator ≥ 1",
                    f.numerator
                ));
            }
            Some((f.numerator as u32, denominator as u32))
        }
        (None, None) => None,
    };
    Ok(Mirror { backend, fraction })
}
