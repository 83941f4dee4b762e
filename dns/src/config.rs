//! DNS settings, as the wiring hands them over (already validated).

use std::net::IpAddr;
use std::time::Duration;

use hickory_proto::rr::{LowerName, Name};
use ipnet::IpNet;

/// How names in a zone are formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Style {
    /// `<svc>.<ns>.global`, `<cluster>.<svc>.<ns>.global`, …
    Global,
    /// The MCS DNS specification: `<svc>.<ns>.svc.clusterset.local`.
    Clusterset,
}

#[derive(Clone, Debug)]
pub struct ZoneConfig {
    /// The zone apex, lower-cased and fully qualified.
    pub name: LowerName,
    pub style: Style,
    /// `<svc>.<zone>` means namespace X (global style only).
    pub namespace: Option<String>,
}

/// Why a zone cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ZoneError {
    #[error("zone {name:?}")]
    Name {
        name: String,
        #[source]
        source: hickory_proto::ProtoError,
    },
    #[error("zone {name:?}: namespace applies to the global style only")]
    NamespaceOutsideGlobal { name: String },
}

impl ZoneConfig {
    pub fn new(name: &str, style: Style, namespace: Option<String>) -> Result<Self, ZoneError> {
        let mut parsed = Name::from_ascii(name).map_err(|source| ZoneError::Name {
            name: name.to_owned(),
            source,
        })?;
        parsed.set_fqdn(true);
        if style == Style::Clusterset && namespace.is_some() {
            return Err(ZoneError::NamespaceOutsideGlobal {
                name: name.to_owned(),
            });
        }
        Ok(Self {
            name: LowerName::new(&parsed),
            style,
            namespace,
        })
    }
}

#[derive(Clone, Debug)]
pub struct DnsConfig {
    pub zones: Vec<ZoneConfig>,
    /// TTL of positive answers unless a policy sets one; also the SOA minimum.
    pub ttl: u32,
    /// Cap on A/AAAA answers unless a policy sets one; 0 means no cap.
    pub max_answers: u32,
    /// Who may AXFR (default: nobody).
    pub allow_transfer: Vec<IpNet>,
    /// A TCP query must arrive whole within this long of the previous answer (or of the
    /// connection), and each reply be taken within it; else the connection is closed.
    pub tcp_idle_timeout: Duration,
    /// The address `ns.<zone>` resolves to (the listen address when it is specific).
    pub ns_address: Option<IpAddr>,
    /// Threads serving the UDP socket.
    pub udp_workers: usize,
    /// Answer-cache capacity (entries).
    pub cache_entries: u64,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            zones: vec![
                ZoneConfig::new("global.", Style::Global, None).expect("valid zone"),
                ZoneConfig::new("clusterset.local.", Style::Clusterset, None).expect("valid zone"),
            ],
            ttl: 5,
            max_answers: 0,
            allow_transfer: Vec::new(),
            tcp_idle_timeout: Duration::from_secs(10),
            ns_address: None,
            udp_workers: 1,
            cache_entries: 100_000,
        }
    }
}
