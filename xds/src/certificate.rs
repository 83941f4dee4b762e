//! When the xDS server's certificate stops being valid: the `notAfter` of the first certificate
//! in a PEM file, read from its DER by hand — the one field an expiry metric needs, without a
//! certificate-parsing dependency (rustls checks the certificate itself when it loads it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertificateError {
    #[error("no PEM CERTIFICATE block")]
    NoCertificate,
    #[error("the certificate's DER is malformed ({0})")]
    Malformed(&'static str),
}

/// The `notAfter` of the first certificate in `pem`.
pub fn not_after(pem: &[u8]) -> Result<SystemTime, CertificateError> {
    not_after_der(&first_certificate(pem)?)
}

fn not_after_der(der: &[u8]) -> Result<SystemTime, CertificateError> {
    let (certificate, _) = element(der, SEQUENCE)?;
    let (mut tbs, _) = element(certificate, SEQUENCE)?;
    // version [0] EXPLICIT is optional (absent means v1).
    if tbs.first() == Some(&0xa0) {
        tbs = element(tbs, 0xa0)?.1;
    }
    let (_, rest) = element(tbs, INTEGER)?; // serialNumber
    let (_, rest) = element(rest, SEQUENCE)?; // signature
    let (_, rest) = element(rest, SEQUENCE)?; // issuer
    let (validity, _) = element(rest, SEQUENCE)?;
    let (_, after) = any_element(validity)?; // notBefore
    let (tag, time, _) = tlv(after)?;
    parse_time(tag, time)
}

fn first_certificate(pem: &[u8]) -> Result<Vec<u8>, CertificateError> {
    let mut reader = pem;
    loop {
        match rustls_pemfile::read_one(&mut reader) {
            Ok(Some(rustls_pemfile::Item::X509Certificate(der))) => return Ok(der.to_vec()),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return Err(CertificateError::NoCertificate),
        }
    }
}

const INTEGER: u8 = 0x02;
const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// One DER element: (tag, contents, what follows).
fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), CertificateError> {
    let short = CertificateError::Malformed("an element runs past its end");
    let (&tag, rest) = input.split_first().ok_or(short.clone())?;
    let (&first, rest) = rest.split_first().ok_or(short.clone())?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(CertificateError::Malformed("a length of unsupported form"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(short);
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

fn element(input: &[u8], want: u8) -> Result<(&[u8], &[u8]), CertificateError> {
    match tlv(input)? {
        (tag, contents, rest) if tag == want => Ok((contents, rest)),
        _ => Err(CertificateError::Malformed(
            "an element of an unexpected type",
        )),
    }
}

fn any_element(input: &[u8]) -> Result<(&[u8], &[u8]), CertificateError> {
    tlv(input).map(|(_, contents, rest)| (contents, rest))
}

/// UTCTime `YYMMDDHHMMSSZ` (years 1950–2049, RFC 5280) or GeneralizedTime `YYYYMMDDHHMMSSZ`.
fn parse_time(tag: u8, text: &[u8]) -> Result<SystemTime, CertificateError> {
    let bad = CertificateError::Malformed("a validity time not in RFC 5280's form");
    let digits = match (tag, text.split_last()) {
        (UTC_TIME | GENERALIZED_TIME, Some((b'Z', digits))) => digits,
        _ => return Err(bad),
    };
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad);
    }
    let number = |s: &[u8]| s.iter().fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy = number(&digits[..2]);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        (GENERALIZED_TIME, 14) => (number(&digits[..4]), &digits[4..]),
        _ => return Err(bad),
    };
    let field = |i: usize| number(&rest[i * 2..i * 2 + 2]);
    let (month, day, hour, minute, second) = (field(0), field(1), field(2), field(3), field(4));
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad);
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let seconds = u64::try_from(seconds).map_err(|_| bad)?;
    Ok(UNIX_EPOCH + Duration::from_secs(seconds))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=meridian-test
    /// -days 30`, made on 2026-12-02: notAfter=Jan  1 05:38:22 2027 GMT.
    const CERT: &str = include_str!("certificate/test-cert.pem");

    fn unix(t: SystemTime) -> u64 {
        t.duration_since(UNIX_EPOCH).unwrap().as_secs()
    }

    #[test]
    fn the_not_after_of_a_real_certificate() {
        assert_eq!(unix(not_after(CERT.as_bytes()).unwrap()), 1_798_781_902);
    }

    #[test]
    fn both_time_forms_and_the_epoch_arithmetic() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        let utc = parse_time(UTC_TIME, b"491231235959Z").unwrap();
        assert_eq!(unix(utc), 2_524_607_999);
        let generalized = parse_time(GENERALIZED_TIME, b"20491231235959Z").unwrap();
        assert_eq!(utc, generalized);
        assert_eq!(unix(parse_time(UTC_TIME, b"700101000000Z").unwrap()), 0);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert_eq!(
            not_after(b"not a pem"),
            Err(CertificateError::NoCertificate)
        );
        assert!(parse_time(UTC_TIME, b"491331235959Z").is_err());
        assert!(parse_time(UTC_TIME, b"4912312359Z").is_err());
        assert!(parse_time(INTEGER, b"491231235959Z").is_err());
        // Every prefix of the real DER fails cleanly.
        let der = first_certificate(CERT.as_bytes()).unwrap();
        for end in 0..der.len() {
            assert!(not_after_der(&der[..end]).is_err(), "prefix of {end} bytes");
        }
    }
}
