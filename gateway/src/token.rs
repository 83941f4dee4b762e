//! OIDC ID tokens (JWTs) checked against the issuer's keys: RS256 and ES256 only (`none` and
//! the HMAC algorithms are refused whatever the header says, so a public key is never used
//! as a shared secret), the issuer, an audience, expiry and not-before within a bounded
//! clock skew. Pure: the caller passes the time.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::Value;

/// How tokens are checked and read (`gateway.oidc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcConfig {
    pub issuer: String,
    /// A token is for the gateway when its `aud` names one of these.
    pub audiences: Vec<String>,
    pub username_claim: String,
    pub groups_claim: String,
    /// The claim naming the caller's tenant; none: tokens carry no tenant.
    pub tenant_claim: Option<String>,
    pub username_prefix: String,
    pub groups_prefix: String,
    /// How far apart the issuer's clock and ours may be.
    pub clock_skew: Duration,
}

/// Who the caller is, as the token says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub tenant: Option<String>,
}

/// Why a token is refused (the gateway answers 401 with this, before forwarding anything).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is not a signed JWT (three base64url parts)")]
    Malformed,
    #[error("the token's algorithm {0:?} is not accepted (RS256, ES256)")]
    Algorithm(String),
    #[error("no key {0:?} among the issuer's keys")]
    UnknownKey(String),
    #[error("the token's signature does not verify")]
    Signature,
    #[error("the token was issued by {0:?}, not the configured issuer")]
    Issuer(String),
    #[error("the token is not for this gateway (audience)")]
    Audience,
    #[error("the token expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token has no expiry")]
    NoExpiry,
    #[error("the token has no {0:?} claim naming the user")]
    NoUser(String),
}

/// Why a key set cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error("the key set is not JSON Web Keys")]
    Json(#[source] serde_json::Error),
    #[error("key {kid:?}: {reason}")]
    Key { kid: String, reason: &'static str },
}

/// The issuer's public keys, by `kid`.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    keys: BTreeMap<String, Key>,
}

#[derive(Debug, Clone)]
enum Key {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed P-256 point (0x04 ‖ x ‖ y).
    P256(Vec<u8>),
}

#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(default)]
    kid: String,
    #[serde(rename = "use")]
    use_: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

impl Keys {
    /// A JWKS document (`{"keys": [...]}`); keys for other uses (`use` not `sig`) and of other
    /// types are skipped, a malformed RSA or P-256 key is an error.
    pub fn from_jwks(json: &[u8]) -> Result<Self, KeysError> {
        let set: JwkSet = serde_json::from_slice(json).map_err(KeysError::Json)?;
        let mut keys = BTreeMap::new();
        for jwk in set.keys {
            if jwk.use_.as_deref().is_some_and(|u| u != "sig") {
                continue;
            }
            let bad = |reason| KeysError::Key {
                kid: jwk.kid.clone(),
                reason,
            };
            let bytes = |v: &Option<String>, reason| {
                v.as_deref()
                    .and_then(|v| URL_SAFE_NO_PAD.decode(v).ok())
                    .ok_or_else(|| bad(reason))
            };
            let key = match jwk.kty.as_str() {
                "RSA" => Key::Rsa {
                    n: bytes(&jwk.n, "no base64url modulus n")?,
                    e: bytes(&jwk.e, "no base64url exponent e")?,
                },
                "EC" if jwk.crv.as_deref() == Some("P-256") => {
                    let (x, y) = (bytes(&jwk.x, "no x")?, bytes(&jwk.y, "no y")?);
                    if x.len() != 32 || y.len() != 32 {
                        return Err(bad("x and y must be 32 bytes each"));
                    }
                    Key::P256([&[4u8][..], &x, &y].concat())
                }
                _ => continue,
            };
            keys.insert(jwk.kid.clone(), key);
        }
        Ok(Self { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: String,
}

/// Checks `token` and reads who it names.
pub fn verify(
    token: &str,
    keys: &Keys,
    config: &OidcConfig,
    now: SystemTime,
) -> Result<Identity, TokenError> {
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let decode = |p: &str| URL_SAFE_NO_PAD.decode(p).map_err(|_| TokenError::Malformed);
    let head: Header =
        serde_json::from_slice(&decode(header)?).map_err(|_| TokenError::Malformed)?;
    let signed = &token[..header.len() + 1 + payload.len()];
    check_signature(&head, keys, signed.as_bytes(), &decode(signature)?)?;
    let claims: Value =
        serde_json::from_slice(&decode(payload)?).map_err(|_| TokenError::Malformed)?;
    check_claims(&claims, config, now)?;
    identity(&claims, config)
}

fn check_signature(
    head: &Header,
    keys: &Keys,
    message: &[u8],
    sig: &[u8],
) -> Result<(), TokenError> {
    // Before the key: an unsigned or HMAC token is refused for what it is, and never makes
    // the gateway look for (or refresh) keys.
    if !matches!(head.alg.as_str(), "RS256" | "ES256") {
        return Err(TokenError::Algorithm(head.alg.clone()));
    }
    let key = || {
        keys.keys
            .get(&head.kid)
            .or_else(|| {
                (keys.keys.len() == 1 && head.kid.is_empty()).then(|| keys.keys.values().next())?
            })
            .ok_or_else(|| TokenError::UnknownKey(head.kid.clone()))
    };
    let verified = match (head.alg.as_str(), key()?) {
        ("RS256", Key::Rsa { n, e }) => RsaPublicKeyComponents { n, e }
            .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
            .is_ok(),
        ("ES256", Key::P256(point)) => {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, sig)
                .is_ok()
        }
        _ => false,
    };
    verified.then_some(()).ok_or(TokenError::Signature)
}

fn check_claims(claims: &Value, config: &OidcConfig, now: SystemTime) -> Result<(), TokenError> {
    let iss = claims["iss"].as_str().unwrap_or_default();
    if iss != config.issuer {
        return Err(TokenError::Issuer(iss.to_string()));
    }
    let audiences: Vec<&str> = match &claims["aud"] {
        Value::String(a) => vec![a.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !audiences
        .iter()
        .any(|a| config.audiences.iter().any(|c| c == a))
    {
        return Err(TokenError::Audience);
    }
    let now = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let skew = config.clock_skew.as_secs_f64();
    let exp = claims["exp"].as_f64().ok_or(TokenError::NoExpiry)?;
    if now > exp + skew {
        return Err(TokenError::Expired);
    }
    if claims["nbf"].as_f64().is_some_and(|nbf| now + skew < nbf) {
        return Err(TokenError::NotYetValid);
    }
    Ok(())
}

fn identity(claims: &Value, config: &OidcConfig) -> Result<Identity, TokenError> {
    let user = claims[&config.username_claim]
        .as_str()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| TokenError::NoUser(config.username_claim.clone()))?;
    let groups = match &claims[&config.groups_claim] {
        Value::String(g) => vec![g.clone()],
        Value::Array(g) => g
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => Vec::new(),
    };
    let tenant = config
        .tenant_claim
        .as_ref()
        .and_then(|c| claims[c].as_str())
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    Ok(Identity {
        user: format!("{}{user}", config.username_prefix),
        groups: groups
            .into_iter()
            .map(|g| format!("{}{g}", config.groups_prefix))
            .collect(),
        tenant,
    })
}

#[cfg(test)]
mod tests;
