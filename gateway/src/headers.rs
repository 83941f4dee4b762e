//! The headers a forwarded request carries: what the client sent, minus anything that could
//! speak for an identity (credentials, impersonation, tenant and front-proxy headers) and the
//! hop-by-hop headers (an upgrade's own `Connection`/`Upgrade` pair put back), plus the
//! caller's identity as impersonation headers. The member's RBAC
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
        || n == header::UPGRADE
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
    if let Some(protocol) = upgrade(client) {
        out.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        out.insert(header::UPGRADE, protocol.clone());
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

/// The protocol a request asks to switch to (`Connection: upgrade` and `Upgrade: …`: exec,
/// attach and port-forward over WebSocket or SPDY), which goes on to the member; None for
/// every other request (a lone `Upgrade` header is hop-by-hop and dropped).
pub fn upgrade(client: &HeaderMap) -> Option<&HeaderValue> {
    let asked = client
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    asked.then(|| client.get(header::UPGRADE)).flatten()
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
    fn an_upgrade_goes_on_with_its_protocol_and_a_lone_upgrade_header_does_not() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(*k, HeaderValue::from_static(v));
            }
            h
        };
        let exec = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-protocol", "v5.channel.k8s.io"),
        ]);
        assert_eq!(upgrade(&exec).unwrap(), "websocket");
        let out = forwarded(&exec, &who()).unwrap();
        assert_eq!(out["connection"], "Upgrade");
        assert_eq!(out["upgrade"], "websocket");
        assert_eq!(out["sec-websocket-protocol"], "v5.channel.k8s.io");
        let spdy = headers(&[("connection", "upgrade"), ("upgrade", "SPDY/3.1")]);
        assert_eq!(forwarded(&spdy, &who()).unwrap()["upgrade"], "SPDY/3.1");
        for plain in [
            headers(&[("upgrade", "h2c")]),
            headers(&[("connection", "keep-alive"), ("upgrade", "websocket")]),
            headers(&[("connection", "upgrade")]),
        ] {
            assert_eq!(upgrade(&plain), None);
            let out = forwarded(&plain, &who()).unwrap();
            assert!(out.get("upgrade").is_none() && out.get("connection").is_none());
        }
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
