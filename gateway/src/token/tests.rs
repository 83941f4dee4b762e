use super::*;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair, RsaKeyPair};
use serde_json::json;

/// A 2048-bit RSA key made for these tests only (openssl genpkey, PKCS#8 DER).
const RSA_PKCS8: &[u8] = include_bytes!("test-rsa.pk8");
const NOW: u64 = 1_800_000_000;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn config() -> OidcConfig {
    OidcConfig {
        issuer: "https://issuer.example".into(),
        audiences: vec!["meridian".into()],
        username_claim: "email".into(),
        groups_claim: "groups".into(),
        tenant_claim: Some("tenant".into()),
        username_prefix: "oidc:".into(),
        groups_prefix: "oidc:".into(),
        clock_skew: Duration::from_secs(30),
    }
}

fn claims() -> Value {
    json!({"iss": "https://issuer.example", "aud": ["other", "meridian"], "exp": NOW + 600,
           "nbf": NOW - 10, "email": "ana@shop.example", "groups": ["dev", "ops"], "tenant": "shop"})
}

struct Signers {
    rsa: RsaKeyPair,
    ec: EcdsaKeyPair,
    keys: Keys,
}

fn signers() -> Signers {
    let rng = SystemRandom::new();
    let rsa = RsaKeyPair::from_pkcs8(RSA_PKCS8).unwrap();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let ec =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = ec.public_key().as_ref();
    let public: RsaPublicKeyComponents<Vec<u8>> = rsa.public().into();
    let jwks = json!({"keys": [
        {"kty": "RSA", "kid": "r1", "use": "sig",
         "n": b64(&public.n), "e": b64(&public.e)},
        {"kty": "EC", "kid": "e1", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..])},
        {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
        {"kty": "oct", "kid": "h1", "k": "c2VjcmV0"},
    ]});
    let keys = Keys::from_jwks(jwks.to_string().as_bytes()).unwrap();
    Signers { rsa, ec, keys }
}

fn token(s: &Signers, alg: &str, kid: &str, claims: &Value) -> String {
    let head = b64(json!({"alg": alg, "kid": kid, "typ": "JWT"})
        .to_string()
        .as_bytes());
    let signed = format!("{head}.{}", b64(claims.to_string().as_bytes()));
    let rng = SystemRandom::new();
    let sig = match alg {
        "RS256" => {
            let mut sig = vec![0; s.rsa.public().modulus_len()];
            s.rsa
                .sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signed.as_bytes(),
                    &mut sig,
                )
                .unwrap();
            sig
        }
        "ES256" => {
            s.ec.sign(&rng, signed.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec()
        }
        _ => Vec::new(),
    };
    format!("{signed}.{}", b64(&sig))
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn keys_for_signing_of_known_types_are_kept() {
    assert_eq!(signers().keys.len(), 2);
    let bad =
        json!({"keys": [{"kty": "EC", "kid": "e", "crv": "P-256", "x": "AQAB", "y": "AQAB"}]});
    assert!(matches!(
        Keys::from_jwks(bad.to_string().as_bytes()),
        Err(KeysError::Key { .. })
    ));
    assert!(matches!(
        Keys::from_jwks(b"not json"),
        Err(KeysError::Json(_))
    ));
}

#[test]
fn rs256_and_es256_tokens_name_the_user_groups_and_tenant_with_prefixes() {
    let s = signers();
    for (alg, kid) in [("RS256", "r1"), ("ES256", "e1")] {
        let id = verify(&token(&s, alg, kid, &claims()), &s.keys, &config(), at(NOW)).unwrap();
        assert_eq!(
            id,
            Identity {
                user: "oidc:ana@shop.example".into(),
                groups: vec!["oidc:dev".into(), "oidc:ops".into()],
                tenant: Some("shop".into()),
            },
            "{alg}"
        );
    }
}

#[test]
fn unsigned_hmac_and_mismatched_algorithms_are_refused() {
    let s = signers();
    let none = token(&s, "none", "r1", &claims());
    assert_eq!(
        verify(&none, &s.keys, &config(), at(NOW)),
        Err(TokenError::Algorithm("none".into()))
    );
    // Refused for its algorithm before any key is looked for (an unsigned token names none).
    let keyless = token(&s, "none", "", &claims());
    assert_eq!(
        verify(&keyless, &s.keys, &config(), at(NOW)),
        Err(TokenError::Algorithm("none".into()))
    );
    let hs = token(&s, "HS256", "r1", &claims());
    assert_eq!(
        verify(&hs, &s.keys, &config(), at(NOW)),
        Err(TokenError::Algorithm("HS256".into()))
    );
    // An ES256 header over the RSA key, and an unknown kid.
    let mixed = token(&s, "ES256", "r1", &claims());
    assert_eq!(
        verify(&mixed, &s.keys, &config(), at(NOW)),
        Err(TokenError::Signature)
    );
    let unknown = token(&s, "RS256", "r9", &claims());
    assert_eq!(
        verify(&unknown, &s.keys, &config(), at(NOW)),
        Err(TokenError::UnknownKey("r9".into()))
    );
}

#[test]
fn a_changed_payload_breaks_the_signature() {
    let s = signers();
    let good = token(&s, "RS256", "r1", &claims());
    let mut forged = claims();
    forged["email"] = json!("admin@shop.example");
    let parts: Vec<&str> = good.split('.').collect();
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64(forged.to_string().as_bytes()),
        parts[2]
    );
    assert_eq!(
        verify(&tampered, &s.keys, &config(), at(NOW)),
        Err(TokenError::Signature)
    );
    assert_eq!(
        verify("a.b", &s.keys, &config(), at(NOW)),
        Err(TokenError::Malformed)
    );
}

#[test]
fn issuer_audience_and_times_are_checked_with_the_skew() {
    let s = signers();
    let check = |claims: &Value, now: u64| {
        verify(
            &token(&s, "ES256", "e1", claims),
            &s.keys,
            &config(),
            at(now),
        )
    };
    let mut c = claims();
    c["iss"] = json!("https://elsewhere");
    assert_eq!(
        check(&c, NOW),
        Err(TokenError::Issuer("https://elsewhere".into()))
    );
    let mut c = claims();
    c["aud"] = json!("kubernetes");
    assert_eq!(check(&c, NOW), Err(TokenError::Audience));
    // exp NOW+600 with 30 s of skew.
    assert!(check(&claims(), NOW + 629).is_ok());
    assert_eq!(check(&claims(), NOW + 631), Err(TokenError::Expired));
    // nbf NOW-10 with 30 s of skew.
    assert!(check(&claims(), NOW - 39).is_ok());
    assert_eq!(check(&claims(), NOW - 41), Err(TokenError::NotYetValid));
    let mut c = claims();
    c.as_object_mut().unwrap().remove("exp");
    assert_eq!(check(&c, NOW), Err(TokenError::NoExpiry));
    let mut c = claims();
    c["email"] = json!("");
    assert_eq!(check(&c, NOW), Err(TokenError::NoUser("email".into())));
}
