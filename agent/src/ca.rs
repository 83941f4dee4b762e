//! The agent CA: it signs an agent's certificate request once its bootstrap token admitted it,
//! with the subject the hub decides (`CN=meridian:agent:<cluster>`, whatever the request
//! asked) and client authentication only. The agent makes its own key: the hub never sees it.

use std::time::{Duration, SystemTime};

use meridian_core::ClusterId;
use meridian_core::agent::CERTIFICATE_BACKDATE as BACKDATE;
use meridian_core::agent::agent_subject;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;

/// The CA's own lifetime, when meridian makes it.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Why a certificate cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("the certificate request is not a signed PKCS#10 request in PEM")]
    Request(#[source] rcgen::Error),
    #[error("the agent CA's certificate or key")]
    Ca(#[source] rcgen::Error),
    #[error("cannot make the certificate")]
    Sign(#[source] rcgen::Error),
    #[error("a time outside what a certificate can carry")]
    Time,
}

/// The CA that signs agent certificates (its certificate and key, PEM).
pub struct AgentCa {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate issued to an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub cert_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl AgentCa {
    /// A new CA (P-256), valid for ten years from `now`; keep its PEMs (`cert_pem`,
    /// `key_pem`) where the hub keeps secrets.
    pub fn generate(now: SystemTime) -> Result<(Self, String), CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(CaError::Ca)?;
        let key_pem = key.serialize_pem();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "meridian agent CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = at(now - BACKDATE)?;
        params.not_after = at(now + CA_LIFETIME)?;
        let cert = params.self_signed(&key).map_err(CaError::Ca)?;
        let ca = Self::from_pem(&cert.pem(), &key_pem)?;
        Ok((ca, key_pem))
    }

    /// The CA kept from before (or configured by the operator).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CaError> {
        let key = KeyPair::from_pem(key_pem).map_err(CaError::Ca)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(CaError::Ca)?;
        Ok(Self {
            cert_pem: cert_pem.to_string(),
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Signs `request_pem` for `cluster` (already admitted by its token, or by its current
    /// certificate when renewing), valid `lifetime` from `now`.
    pub fn sign(
        &self,
        request_pem: &str,
        cluster: &ClusterId,
        lifetime: Duration,
        now: SystemTime,
    ) -> Result<Issued, CaError> {
        // Parsing checks the request's own signature: its sender holds the key.
        let request =
            CertificateSigningRequestParams::from_pem(request_pem).map_err(CaError::Request)?;
        let not_before = now - BACKDATE;
        let not_after = now + lifetime;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, agent_subject(cluster));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = at(not_before)?;
        params.not_after = at(not_after)?;
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&request.public_key, &self.issuer)
            .map_err(CaError::Sign)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            not_before: truncated(not_before),
            not_after: truncated(not_after),
        })
    }

    /// The hub's serving certificate and key (PEM) for `names` (DNS names or IP addresses),
    /// valid `lifetime` from `now`: agents trust the hub by this CA, as the hub trusts them.
    pub fn serving(
        &self,
        names: &[String],
        lifetime: Duration,
        now: SystemTime,
    ) -> Result<(String, String), CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(CaError::Sign)?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(CaError::Sign)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "meridian agent hub");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = at(now - BACKDATE)?;
        params.not_after = at(now + lifetime)?;
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(CaError::Sign)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// Which key a certificate request is for: the SHA-256 of its SubjectPublicKeyInfo, hex (what
/// `meridian approve` approves). Parsing checks the request's own signature.
pub fn request_key(request_pem: &str) -> Result<String, CaError> {
    use rcgen::PublicKeyData;
    let request =
        CertificateSigningRequestParams::from_pem(request_pem).map_err(CaError::Request)?;
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        &request.public_key.subject_public_key_info(),
    );
    Ok(digest.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// The agent's side: a new key (P-256) and a request for `cluster`'s certificate, both PEM.
pub fn key_and_request(cluster: &ClusterId) -> Result<(String, String), CaError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(CaError::Sign)?;
    Ok((key.serialize_pem(), request(cluster, &key)?))
}

/// A request for `cluster`'s certificate with a key kept from before (PEM), so that a join
/// waiting for approval asks with the same key after a restart.
pub fn request_with_key(cluster: &ClusterId, key_pem: &str) -> Result<String, CaError> {
    let key = KeyPair::from_pem(key_pem).map_err(CaError::Sign)?;
    request(cluster, &key)
}

fn request(cluster: &ClusterId, key: &KeyPair) -> Result<String, CaError> {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, agent_subject(cluster));
    let request = params.serialize_request(key).map_err(CaError::Sign)?;
    request.pem().map_err(CaError::Sign)
}

fn at(t: SystemTime) -> Result<OffsetDateTime, CaError> {
    let since = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| CaError::Time)?;
    let seconds = i64::try_from(since.as_secs()).map_err(|_| CaError::Time)?;
    OffsetDateTime::from_unix_timestamp(seconds).map_err(|_| CaError::Time)
}

/// Certificates carry whole seconds.
fn truncated(t: SystemTime) -> SystemTime {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs())
}

#[cfg(test)]
mod tests;
