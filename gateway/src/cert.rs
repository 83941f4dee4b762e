//! A client certificate as an identity (the Kubernetes convention): the subject's common name
//! is the user, each organization a group. The TLS layer has already verified the chain
//! against `gateway.tls.clientCA`; this only reads the subject out of the DER.
//!
//! ```text
//! Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
//! TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer,
//!                               validity, subject, … }
//! Name ::= SEQUENCE OF SET OF SEQUENCE { type OBJECT IDENTIFIER, value ANY }
//! ```

use crate::token::Identity;

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xa0;
/// 2.5.4.3 and 2.5.4.10.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

/// Why a verified certificate names nobody.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("the client certificate cannot be read (malformed DER)")]
    Malformed,
    #[error("the client certificate's subject has no common name (the user)")]
    NoCommonName,
}

/// The identity a client certificate (DER) names.
pub fn identity(der: &[u8]) -> Result<Identity, CertError> {
    let (tag, certificate, _) = tlv(der)?;
    expect(tag, SEQUENCE)?;
    let (tag, mut tbs, _) = tlv(certificate)?;
    expect(tag, SEQUENCE)?;
    if tbs.first() == Some(&VERSION) {
        tbs = tlv(tbs)?.2;
    }
    // serialNumber, signature, issuer, validity
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (tag, mut subject, _) = tlv(tbs)?;
    expect(tag, SEQUENCE)?;
    let mut user = None;
    let mut groups = Vec::new();
    while !subject.is_empty() {
        let (tag, mut rdn, rest) = tlv(subject)?;
        expect(tag, SET)?;
        subject = rest;
        while !rdn.is_empty() {
            let (tag, attribute, rest) = tlv(rdn)?;
            expect(tag, SEQUENCE)?;
            rdn = rest;
            let (tag, oid, value) = tlv(attribute)?;
            expect(tag, OID)?;
            let (_, value, _) = tlv(value)?;
            let text = std::str::from_utf8(value).map_err(|_| CertError::Malformed)?;
            if oid == COMMON_NAME {
                user.get_or_insert_with(|| text.to_string());
            } else if oid == ORGANIZATION {
                groups.push(text.to_string());
            }
        }
    }
    let user = user
        .filter(|u| !u.is_empty())
        .ok_or(CertError::NoCommonName)?;
    Ok(Identity {
        user,
        groups,
        tenant: None,
    })
}

fn expect(tag: u8, want: u8) -> Result<(), CertError> {
    (tag == want).then_some(()).ok_or(CertError::Malformed)
}

/// One DER element: (tag, contents, what follows it).
fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), CertError> {
    let (&tag, rest) = input.split_first().ok_or(CertError::Malformed)?;
    let (&first, mut rest) = rest.split_first().ok_or(CertError::Malformed)?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let bytes = usize::from(first & 0x7f);
        if bytes == 0 || bytes > 4 || rest.len() < bytes {
            return Err(CertError::Malformed);
        }
        let len = rest[..bytes]
            .iter()
            .fold(0usize, |n, b| (n << 8) | usize::from(*b));
        rest = &rest[bytes..];
        len
    };
    if rest.len() < len {
        return Err(CertError::Malformed);
    }
    let (contents, after) = rest.split_at(len);
    Ok((tag, contents, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650
    ///  -subj "/O=ads-devs/O=oncall/CN=dave"` (the key thrown away).
    const DAVE: &str = include_str!("cert/dave.pem");

    fn der(pem: &str) -> Vec<u8> {
        rustls_pemfile::certs(&mut pem.as_bytes())
            .next()
            .unwrap()
            .unwrap()
            .to_vec()
    }

    #[test]
    fn the_common_name_is_the_user_and_each_organization_a_group() {
        let who = identity(&der(DAVE)).unwrap();
        assert_eq!(who.user, "dave");
        assert_eq!(who.groups, ["ads-devs", "oncall"]);
        assert_eq!(who.tenant, None);
    }

    #[test]
    fn malformed_or_truncated_der_is_refused_not_a_panic() {
        let good = der(DAVE);
        for cut in [0, 1, 2, 10, good.len() / 2, good.len() - 1] {
            assert!(identity(&good[..cut]).is_err(), "{cut}");
        }
        assert_eq!(
            identity(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            Err(CertError::Malformed)
        );
        assert_eq!(identity(&[0x02, 0x01, 0x00]), Err(CertError::Malformed));
    }
}
