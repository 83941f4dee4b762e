//! Builders shared by this crate's unit tests.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::model::{Endpoint, Port, Protocol, Service};

pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A named TCP port.
pub(crate) fn port(name: &str, port: u16) -> Port {
    Port {
        name: Some(name.to_owned()),
        port,
        protocol: Protocol::Tcp,
        app_protocol: None,
    }
}

/// A Service with named TCP ports.
pub(crate) fn svc(headless: bool, ports: &[(&str, u16)]) -> Service {
    Service {
        headless,
        external_name: false,
        publish_not_ready: false,
        ports: ports.iter().map(|&(n, p)| port(n, p)).collect(),
        cluster_ips: Vec::new(),
    }
}

/// A one-address, not terminating endpoint without ports; `serving` follows `ready`.
pub(crate) fn ep(address: IpAddr, ready: bool) -> Endpoint {
    Endpoint {
        addresses: vec![address],
        hostname: None,
        ready,
        serving: ready,
        terminating: false,
        zone: None,
        ports: Arc::from(Vec::new()),
    }
}
