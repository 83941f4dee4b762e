//! The kubeconfig `meridian gateway kubeconfig` prints: one context per member
//! (`/clusters/<name>`), `fleet` for every member at once (`/clusters/*`) and `hub` for the
//! hub's own API, all for one user of the gateway, `fleet` current.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// How the user authenticates in the kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A file holding an ID token (kubectl reads it on every request).
    TokenFile(String),
    /// None: the user entry is left for an OIDC plugin to fill in.
    None,
}

/// The kubeconfig for `user` at `server` (the gateway's base URL), trusting `ca_pem` when
/// given, with a context for each of `clusters`.
pub fn render(
    server: &str,
    ca_pem: Option<&[u8]>,
    clusters: &[String],
    user: &str,
    credential: &Credential,
) -> Value {
    let server = server.trim_end_matches('/');
    let entry = |name: &str, url: String| {
        let mut cluster = json!({"server": url});
        if let Some(ca) = ca_pem {
            cluster["certificate-authority-data"] = json!(STANDARD.encode(ca));
        }
        json!({"name": name, "cluster": cluster})
    };
    let mut named: Vec<(String, String)> = vec![
        ("fleet".into(), format!("{server}/clusters/*")),
        ("hub".into(), server.to_string()),
    ];
    named.extend(
        clusters
            .iter()
            .map(|c| (c.clone(), format!("{server}/clusters/{c}"))),
    );
    let user_entry = match credential {
        Credential::TokenFile(path) => json!({"name": user, "user": {"tokenFile": path}}),
        Credential::None => json!({"name": user, "user": {}}),
    };
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": named.iter().map(|(n, url)| entry(n, url.clone())).collect::<Vec<_>>(),
        "users": [user_entry],
        "contexts": named.iter().map(|(n, _)| json!({"name": n, "context": {"cluster": n, "user": user}}))
            .collect::<Vec<_>>(),
        "current-context": "fleet",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_the_fleet_and_the_hub_get_a_context() {
        let k = render(
            "https://gw.example:9443/",
            Some(b"PEM"),
            &["m1".into(), "m3".into()],
            "ana",
            &Credential::TokenFile("/home/ana/.token".into()),
        );
        let servers: Vec<(&str, &str)> = k["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap(),
                    c["cluster"]["server"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            servers,
            [
                ("fleet", "https://gw.example:9443/clusters/*"),
                ("hub", "https://gw.example:9443"),
                ("m1", "https://gw.example:9443/clusters/m1"),
                ("m3", "https://gw.example:9443/clusters/m3"),
            ]
        );
        assert_eq!(
            k["clusters"][0]["cluster"]["certificate-authority-data"],
            "UEVN"
        );
        assert_eq!(k["users"][0]["user"]["tokenFile"], "/home/ana/.token");
        assert_eq!(
            k["contexts"][2]["context"],
            json!({"cluster": "m1", "user": "ana"})
        );
        assert_eq!(k["current-context"], "fleet");
    }
}
