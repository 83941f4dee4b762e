use std::time::{Duration, SystemTime};

use x509_parser::extensions::ParsedExtension;
use x509_parser::pem::parse_x509_pem;

use super::*;

fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// (subject CN, issuer CN, not before, not after, client auth, signed by the CA's key)
fn read(cert_pem: &str, ca_pem: &str) -> (String, String, i64, i64, bool, bool) {
    let (_, pem) = parse_x509_pem(cert_pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    let (_, ca_pem) = parse_x509_pem(ca_pem.as_bytes()).unwrap();
    let ca = ca_pem.parse_x509().unwrap();
    let cn = |name: &x509_parser::x509::X509Name<'_>| {
        name.iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let client_auth = cert.extensions().iter().any(|e| {
        matches!(e.parsed_extension(), ParsedExtension::ExtendedKeyUsage(u) if u.client_auth && !u.server_auth)
    });
    (
        cn(cert.subject()),
        cn(cert.issuer()),
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
        client_auth,
        cert.verify_signature(Some(ca.public_key())).is_ok(),
    )
}

#[test]
fn an_admitted_request_gets_a_client_certificate_naming_its_cluster_for_its_lifetime() {
    let (ca, _key) = AgentCa::generate(now()).unwrap();
    let eu = ClusterId::new("eu-1");
    let (_agent_key, request) = key_and_request(&eu).unwrap();
    let issued = ca
        .sign(&request, &eu, Duration::from_secs(60), now())
        .unwrap();
    let (subject, issuer, from, until, client_auth, signed) = read(&issued.cert_pem, ca.cert_pem());
    assert_eq!(subject, "meridian:agent:eu-1");
    assert_eq!(issuer, "meridian agent CA");
    assert!(client_auth && signed);
    let epoch = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert_eq!((from, until), (epoch(now()) - 60, epoch(now()) + 60));
    assert_eq!(
        (issued.not_before, issued.not_after),
        (
            now() - Duration::from_secs(60),
            now() + Duration::from_secs(60)
        )
    );
}

#[test]
fn the_hub_names_the_subject_whatever_the_request_asks() {
    let (ca, _) = AgentCa::generate(now()).unwrap();
    // us-1's agent asks with its own name, but its token admitted eu-1.
    let (_, request) = key_and_request(&ClusterId::new("us-1")).unwrap();
    let issued = ca
        .sign(
            &request,
            &ClusterId::new("eu-1"),
            Duration::from_secs(60),
            now(),
        )
        .unwrap();
    assert_eq!(
        read(&issued.cert_pem, ca.cert_pem()).0,
        "meridian:agent:eu-1"
    );
}

#[test]
fn a_kept_ca_signs_as_the_new_one_did_and_another_cas_signature_does_not_verify() {
    let (ca, key) = AgentCa::generate(now()).unwrap();
    let kept = AgentCa::from_pem(ca.cert_pem(), &key).unwrap();
    let eu = ClusterId::new("eu-1");
    let (_, request) = key_and_request(&eu).unwrap();
    let issued = kept
        .sign(&request, &eu, Duration::from_secs(3600), now())
        .unwrap();
    assert!(read(&issued.cert_pem, ca.cert_pem()).5);
    let (other, _) = AgentCa::generate(now()).unwrap();
    assert!(!read(&issued.cert_pem, other.cert_pem()).5);
}

#[test]
fn a_garbage_or_tampered_request_is_refused() {
    let (ca, _) = AgentCa::generate(now()).unwrap();
    let eu = ClusterId::new("eu-1");
    let one_hour = Duration::from_secs(3600);
    for garbage in [
        "",
        "not a request",
        "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
    ] {
        assert!(
            matches!(
                ca.sign(garbage, &eu, one_hour, now()),
                Err(CaError::Request(_))
            ),
            "{garbage:?}"
        );
    }
    // One byte of the signed part changed: the request's own signature no longer holds.
    let (_, request) = key_and_request(&eu).unwrap();
    let mut lines: Vec<String> = request.lines().map(str::to_string).collect();
    let body = &mut lines[2];
    let flipped = if body.as_bytes()[10] == b'A' {
        "B"
    } else {
        "A"
    };
    body.replace_range(10..11, flipped);
    let tampered = lines.join("\n") + "\n";
    assert!(matches!(
        ca.sign(&tampered, &eu, one_hour, now()),
        Err(CaError::Request(_))
    ));
    assert!(AgentCa::from_pem("nope", "nope").is_err());
}
