//! The headers a forwarded request carries: what the client sent, minus anything that could
//! speak for an identity (credentials, impersonation, tenant and front-proxy headers) and the
//! hop-by-hop headers, plus the caller's identity as impersonation headers. The member's RBAC
//! for that user then decides (delegated authorization).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::token::Identity;

/// The tenant header members and their admission see.
pub const TENANT_HEADER: &str = "x-tenant-id";
/// The impersonated user's extra carrying the tenant (`Impersonate-Extra-<key>`, the key
/// percent-encoded as Kubernetes requires).
pub const TENANT_EXTRA: &str = "impersonate-extra-meridian.io%2ftenant";

/// Whether the client may not send `name` on: identity headers and hop-by-hop headers.
pub fn is_stripped(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("impersonate-")
        || n.starts_with("x-remote-")
        || n == TENANT_HEADER
        || n == header::AUTHORIZATION
        || n == header::PROXY_AUTHORIZATION
        || n == header::HOST
        || n == header::CONNECTION
        || n == header::CONTENT_LENGTH
        || n == header::TRANSFER_ENCODING
        || n == header::TE
        || n == header::TRAILER
        || n == "keep-alive"
        || n == "proxy-connection"
}

/// The headers to send a member (or the hub) for a request from `who`.
pub fn forwarded(client: &HeaderMap, who: &Identity) -> Result<HeaderMap, InvalidIdentity> {
    let mut out = HeaderMap::with_capacity(client.len() + 4);
    for (name, value) in client {
        if !is_stripped(name) {
            out.append(name.clone(), value.clone());
        }
    }
    let value = |v: &str| HeaderValue::from_str(v).map_err(|_| InvalidIdentity(v.to_string()));
    out.insert("impersonate-user", value(&who.user)?);
    for group in &who.groups {
        out.append("impersonate-group", value(group)?);
    }
    if let Some(tenant) = &who.tenant {
        out.insert(TENANT_EXTRA, value(tenant)?);
        out.insert(TENANT_HEADER, value(tenant)?);
    }
    Ok(out)
}

/// A user, group or tenant name that cannot be a header value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} cannot be sent as a header value")]
pub struct InvalidIdentity(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn who() -> Identity {
        Identity {
            user: "oidc:ana".into(),
            groups: vec!["oidc:dev".into(), "oidc:ops".into()],
            tenant: Some("shop".into()),
        }
    }

    #[test]
    fn identity_headers_from_the_client_are_replaced_by_the_callers() {
        let mut client = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer t"),
            ("impersonate-user", "system:admin"),
            ("impersonate-group", "system:masters"),
            ("impersonate-extra-scopes", "all"),
            ("impersonate-uid", "0"),
            ("x-remote-user", "root"),
            ("x-remote-group", "system:masters"),
            ("x-tenant-id", "other"),
            ("connection", "close"),
            ("accept", "application/json"),
            ("user-agent", "kubectl"),
        ] {
            client.append(k, HeaderValue::from_static(v));
        }
        let out = forwarded(&client, &who()).unwrap();
        let all = |k: &str| {
            out.get_all(k)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(all("impersonate-user"), ["oidc:ana"]);
        assert_eq!(all("impersonate-group"), ["oidc:dev", "oidc:ops"]);
        assert_eq!(all(TENANT_EXTRA), ["shop"]);
        assert_eq!(all("x-tenant-id"), ["shop"]);
        for gone in [
            "authorization",
            "impersonate-extra-scopes",
            "impersonate-uid",
            "x-remote-user",
            "x-remote-group",
            "connection",
        ] {
            assert!(out.get(gone).is_none(), "{gone} passed");
        }
        assert_eq!(all("accept"), ["application/json"]);
        assert_eq!(all("user-agent"), ["kubectl"]);
    }

    #[test]
    fn no_tenant_no_tenant_headers_and_odd_names_are_refused() {
        let mut plain = who();
        plain.tenant = None;
        let out = forwarded(&HeaderMap::new(), &plain).unwrap();
        assert!(out.get("x-tenant-id").is_none() && out.get(TENANT_EXTRA).is_none());
        let mut odd = who();
        odd.user = "ana\nimpersonate-user: admin".into();
        assert!(forwarded(&HeaderMap::new(), &odd).is_err());
    }
}
