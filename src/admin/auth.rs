//! The admin token: when `admin.tokenFile` is set, `/debug/*` and `/ui*` answer only requests
//! that carry it — as `Authorization: Bearer TOKEN` (the CLI, scripts) or as the password of
//! HTTP Basic (a browser, which asks for it once; the answer sets an HttpOnly, SameSite=Strict
//! cookie holding it, which the page's own requests carry).
//! `/healthz`, `/readyz` and `/metrics` stay open for probes and scrapers.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use prometheus_client::metrics::counter::Counter;

/// Tokens shorter than this are refused at start-up: a guessable token is no protection.
const MIN_LENGTH: usize = 16;

/// The cookie a browser carries the token in after its first admitted request.
const COOKIE: &str = "meridian_admin_token";

/// The admin token and the count of requests refused for want of it.
#[derive(Clone)]
pub struct AdminToken {
    token: Arc<[u8]>,
    /// The `Set-Cookie` value an admitted browser gets, made once.
    cookie: HeaderValue,
    refused: Counter,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// Reads the token from `path`: its content without the surrounding whitespace.
    pub fn read(path: &Path, refused: Counter) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!("admin.tokenFile {}: cannot read it: {e}", path.display())
        })?;
        Self::new(text.trim(), refused)
            .map_err(|why| anyhow::anyhow!("admin.tokenFile {}: {why}", path.display()))
    }

    fn new(token: &str, refused: Counter) -> Result<Self, String> {
        if token.len() < MIN_LENGTH {
            return Err(format!(
                "the token is {} characters; at least {MIN_LENGTH} (e.g. `openssl rand -hex 24`)",
                token.len()
            ));
        }
        // The token travels in a header and a cookie: printable ASCII, no separators.
        if !token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b';' | b',' | b'"' | b'\\'))
        {
            return Err(
                "the token holds whitespace, a separator (; , \" \\) or a character that is not ASCII"
                    .into(),
            );
        }
        let cookie = HeaderValue::from_str(&format!(
            "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
        ))
        .map_err(|e| format!("the token cannot be a cookie: {e}"))?;
        Ok(Self {
            token: token.as_bytes().into(),
            cookie,
            refused,
        })
    }

    /// Whether the request carries the token: in its Authorization header, or in the cookie
    /// a browser got with its first admitted page.
    #[cfg(test)]
    fn admits(&self, headers: &HeaderMap) -> bool {
        self.in_authorization(headers) || self.in_cookie(headers)
    }

    fn in_cookie(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .any(|(name, value)| name == COOKIE && same(value.as_bytes(), &self.token))
    }

    fn in_authorization(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let (scheme, credential) = value.split_once(' ').unwrap_or((value, ""));
        let credential = credential.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return same(credential.as_bytes(), &self.token);
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(credential) else {
                return false;
            };
            // Any user name: the password is the token.
            let password = match decoded.iter().position(|&b| b == b':') {
                Some(colon) => &decoded[colon + 1..],
                None => &decoded[..],
            };
            return same(password, &self.token);
        }
        false
    }
}

/// Compares in time that depends on the lengths only, not on where the bytes differ.
fn same(given: &[u8], token: &[u8]) -> bool {
    given.len() == token.len() && given.iter().zip(token).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

/// The middleware: the request goes on if it carries the token, else 401 with both challenges.
/// A request admitted by its Authorization header but without the cookie gets the cookie, so
/// that a browser's own requests (the page's fetches, its event stream) carry the token too:
/// browsers do not send the credentials typed into a sign-in prompt with those everywhere.
pub async fn require(State(token): State<AdminToken>, request: Request, next: Next) -> Response {
    if token.in_cookie(request.headers()) {
        return next.run(request).await;
    }
    if token.in_authorization(request.headers()) {
        let mut response = next.run(request).await;
        response
            .headers_mut()
            .append(header::SET_COOKIE, token.cookie.clone());
        return response;
    }
    token.refused.inc();
    tracing::debug!(path = %request.uri().path(), "admin request without the admin token refused");
    let mut response = (
        StatusCode::UNAUTHORIZED,
        "this meridian's /debug and /ui need its admin token: `Authorization: Bearer TOKEN` \
         (the CLI: --admin-token-file or MERIDIAN_ADMIN_TOKEN_FILE), or any user name with the \
         token as password\n",
    )
        .into_response();
    let challenges = response.headers_mut();
    challenges.append(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"meridian\""),
    );
    challenges.append(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"meridian\", charset=\"UTF-8\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn the_token_is_admitted_as_bearer_or_as_a_basic_password_and_nothing_else() {
        let t = AdminToken::new("0123456789abcdef0123", Counter::default()).unwrap();
        assert!(t.admits(&headers("Bearer 0123456789abcdef0123")));
        assert!(t.admits(&headers("bearer 0123456789abcdef0123")));
        let basic = |user_pass: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(user_pass)
            )
        };
        assert!(t.admits(&headers(&basic("ana:0123456789abcdef0123"))));
        assert!(t.admits(&headers(&basic(":0123456789abcdef0123"))));
        for wrong in [
            "Bearer 0123456789abcdef012",
            "Bearer 0123456789abcdef01234",
            "Bearer 0123456789abcdef0124",
            "0123456789abcdef0123",
            "Token 0123456789abcdef0123",
            "Basic !!!",
        ] {
            assert!(!t.admits(&headers(wrong)), "{wrong}");
        }
        assert!(!t.admits(&headers(&basic("0123456789abcdef0123:x"))));
        assert!(!t.admits(&HeaderMap::new()));
        let cookie = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::COOKIE, HeaderValue::from_str(value).unwrap());
            h
        };
        assert!(t.admits(&cookie("a=b; meridian_admin_token=0123456789abcdef0123")));
        assert!(!t.admits(&cookie("meridian_admin_token=0123456789abcdef0124")));
        assert!(!t.admits(&cookie("other=0123456789abcdef0123")));
    }

    #[test]
    fn a_short_or_spaced_token_is_refused_with_the_reason() {
        let short = AdminToken::new("abc", Counter::default()).unwrap_err();
        assert!(short.contains("at least 16"), "{short}");
        let spaced = AdminToken::new("0123456789 abcdef0123", Counter::default()).unwrap_err();
        assert!(spaced.contains("whitespace"), "{spaced}");
        assert!(AdminToken::new("0123456789abcdef;0123", Counter::default()).is_err());
        assert_eq!(
            format!(
                "{:?}",
                AdminToken::new("0123456789abcdef0123", Counter::default()).unwrap()
            ),
            "AdminToken(<redacted>)"
        );
    }
}
