//! kube → model conversion. Nothing past this module sees a Kubernetes type. Each function
//! rejects only the object (or endpoint) that is wrong, with a reason that names the field.
//!
//! Names and addresses are checked as the API server checks them ([`crate::validate`]): a
//! directory member's manifests never met one, and what they name ends up in DNS and xDS.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use meridian_core as core;
use meridian_core::{ClusterId, ClusterSpec, HealthTimings, Locality, ObjectKey};

use crate::crd::{MemberCluster, ServiceImport, ServiceImportType, TaintEffectSpec};
use crate::validate::{self, Invalid, Loopback, NameRule};

pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Where a member's objects come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberSource {
    /// A directory of manifests (a relative path resolved as [`member_cluster`] says).
    Directory(PathBuf),
    /// A Kubernetes API (connected by the Kubernetes source).
    Kubernetes(KubeAccess),
    /// The member connects in.
    Agent,
}

/// Which of the API server's rules a conversion applies: where the object was read decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validation {
    /// An object a Kubernetes API served (its API server checked it already): every rule,
    /// loopback endpoint addresses refused as that server refuses them.
    Kubernetes,
    /// A manifest of a directory member, which no API server has seen: every rule, except
    /// that loopback endpoint addresses are served, because a fleet on one machine (the
    /// quickstart, the tests) runs its backends on loopback.
    Directory,
}

impl Validation {
    fn loopback(self) -> Loopback {
        match self {
            Validation::Kubernetes => Loopback::Refused,
            Validation::Directory => Loopback::Allowed,
        }
    }
}

/// How to reach a member's Kubernetes API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeAccess {
    /// Overrides the server of the kubeconfig.
    pub api_endpoint: Option<String>,
    pub credentials: Credentials,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    /// A kubeconfig file (a relative path resolved as [`member_cluster`] says) and optionally
    /// one of its contexts.
    Kubeconfig {
        path: PathBuf,
        context: Option<String>,
    },
    /// A kubeconfig held in a Secret on the hub.
    Secret {
        namespace: String,
        name: String,
        key: String,
    },
}

/// Why an object cannot be converted (it is rejected whole).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("metadata.name is required")]
    NameRequired,
    #[error("unknown protocol {0:?}")]
    UnknownProtocol(String),
    #[error("port {0} is out of range")]
    PortOutOfRange(i32),
    #[error("label {SERVICE_NAME_LABEL} is required")]
    ServiceNameLabelRequired,
    #[error("unknown addressType {0:?}")]
    UnknownAddressType(String),
    #[error("FQDN EndpointSlices are not supported (deprecated in Kubernetes)")]
    FqdnSlice,
    #[error("spec.ips: {ip:?} is not an IP address")]
    ImportIp {
        ip: String,
        #[source]
        source: std::net::AddrParseError,
    },
    /// A name (of the object, its namespace or a port) the API server would refuse.
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn key_of(meta: &ObjectMeta) -> Result<ObjectKey> {
    let name = meta
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(Error::NameRequired)?;
    let ns = meta.namespace.as_deref().unwrap_or("default");
    Ok(ObjectKey::new(ns, name))
}

/// The key of an object whose name must follow `rule` and whose namespace, as every
/// namespace, must be a DNS-1123 label (`ValidateNamespaceName`).
fn checked_key(meta: &ObjectMeta, rule: NameRule) -> Result<ObjectKey> {
    let key = key_of(meta)?;
    validate::name(rule, "metadata.name", &key.name)?;
    validate::name(NameRule::Dns1123Label, "metadata.namespace", &key.namespace)?;
    Ok(key)
}

pub(crate) fn taint_effect(e: TaintEffectSpec) -> core::TaintEffect {
    match e {
        TaintEffectSpec::NoSchedule => core::TaintEffect::NoSchedule,
        TaintEffectSpec::PreferNoSchedule => core::TaintEffect::PreferNoSchedule,
        TaintEffectSpec::NoExecute => core::TaintEffect::NoExecute,
    }
}

pub(crate) fn created_secs(meta: &ObjectMeta) -> i64 {
    meta.creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second())
}

fn protocol(p: Option<&str>) -> Result<core::Protocol> {
    match p.unwrap_or("TCP") {
        "TCP" => Ok(core::Protocol::Tcp),
        "UDP" => Ok(core::Protocol::Udp),
        "SCTP" => Ok(core::Protocol::Sctp),
        other => Err(Error::UnknownProtocol(other.to_owned())),
    }
}

fn port_number(n: i32) -> Result<u16> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(Error::PortOutOfRange(n))
}

/// Converts a Service: its name must be a DNS-1035 label (`ValidateServiceName`), its port
/// names DNS-1123 labels, unique, and given whenever there is more than one port
/// (`validateServicePort`).
pub fn service(svc: &Service) -> Result<(ObjectKey, core::Service)> {
    let key = checked_key(&svc.metadata, NameRule::Dns1035Label)?;
    let spec = svc.spec.clone().unwrap_or_default();
    let ports = service_ports(spec.ports.as_deref().unwrap_or_default())?;
    let cluster_ips = spec
        .cluster_ips
        .clone()
        .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    Ok((
        key,
        core::Service {
            headless: spec.cluster_ip.as_deref() == Some("None"),
            external_name: spec.type_.as_deref() == Some("ExternalName"),
            publish_not_ready: spec.publish_not_ready_addresses.unwrap_or(false),
            ports,
            cluster_ips,
        },
    ))
}

fn service_ports(ports: &[k8s_openapi::api::core::v1::ServicePort]) -> Result<Vec<core::Port>> {
    let mut names = std::collections::BTreeSet::new();
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let name = p.name.clone().filter(|n| !n.is_empty());
            let field = format!("spec.ports[{i}].name");
            match &name {
                None if ports.len() > 1 => Err(Invalid::required(
                    field,
                    "is required when a Service has more than one port",
                ))?,
                None => {}
                Some(n) => {
                    validate::name(NameRule::Dns1123Label, &field, n)?;
                    if !names.insert(n.clone()) {
                        Err(Invalid::new(
                            field,
                            n,
                            "is a duplicate (port names must be unique)",
                        ))?;
                    }
                }
            }
            Ok(core::Port {
                name,
                port: port_number(p.port)?,
                protocol: protocol(p.protocol.as_deref())?,
                app_protocol: p.app_protocol.clone(),
            })
        })
        .collect()
}

/// Converts a slice: its name must be a DNS-1123 subdomain (`ValidateEndpointSliceName`), its
/// `kubernetes.io/service-name` label a Service name, its port names DNS-1123 labels and
/// unique. An endpoint the API server would refuse (no address, an address that is not one
/// of the slice's family or that [`validate::endpoint_ip`] refuses, a hostname that is not a
/// DNS-1123 label) is left out and reported: the reasons are returned beside the slice, which
/// still serves.
pub fn slice(
    es: &EndpointSlice,
    validation: Validation,
) -> Result<(ObjectKey, core::Slice, Vec<String>)> {
    let key = checked_key(&es.metadata, NameRule::Dns1123Subdomain)?;
    let service = es
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .ok_or(Error::ServiceNameLabelRequired)?;
    validate::name(
        NameRule::Dns1035Label,
        &format!("metadata.labels[{SERVICE_NAME_LABEL}]"),
        service,
    )?;
    let family = match es.address_type.as_str() {
        "IPv4" => Some(false),
        "IPv6" => Some(true),
        "FQDN" => None,
        other => return Err(Error::UnknownAddressType(other.to_owned())),
    };
    let Some(v6) = family else {
        return Err(Error::FqdnSlice);
    };
    let ports = slice_ports(es.ports.as_deref().unwrap_or_default())?;
    let mut problems = Vec::new();
    let mut endpoints = Vec::new();
    for (i, ep) in es.endpoints.iter().enumerate() {
        let addresses = match endpoint_checked(i, ep, v6, &es.address_type, validation) {
            Ok(a) => a,
            Err(why) => {
                let why: Vec<String> = why.iter().map(Invalid::to_string).collect();
                problems.push(format!("{}; endpoint left out", why.join("; ")));
                continue;
            }
        };
        let cond = ep.conditions.clone().unwrap_or_default();
        let ready = cond.ready.unwrap_or(true);
        endpoints.push(core::Endpoint {
            addresses,
            hostname: ep.hostname.clone(),
            ready,
            serving: cond.serving.unwrap_or(true),
            terminating: cond.terminating.unwrap_or(false),
            zone: ep.zone.clone(),
            ports: ports.clone(),
        });
    }
    Ok((
        key,
        core::Slice {
            service: Arc::from(service.as_str()),
            endpoints,
        },
        problems,
    ))
}

/// A slice's ports: names are DNS-1123 labels and unique (the empty name counts once, as
/// upstream's `validatePorts` counts it); a port without a number, out of range or with an
/// unknown protocol is left out, as before.
fn slice_ports(
    ports: &[k8s_openapi::api::discovery::v1::EndpointPort],
) -> Result<Arc<[core::Port]>> {
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let name = p.name.as_deref().unwrap_or_default();
        let field = format!("ports[{i}].name");
        if !name.is_empty() {
            validate::name(NameRule::Dns1123Label, &field, name)?;
        }
        if !names.insert(name) {
            Err(Invalid::new(
                field,
                name,
                "is a duplicate (port names must be unique)",
            ))?;
        }
    }
    Ok(ports
        .iter()
        .filter_map(|p| {
            Some(core::Port {
                name: p.name.clone().filter(|n| !n.is_empty()),
                port: u16::try_from(p.port?).ok()?,
                protocol: protocol(p.protocol.as_deref()).ok()?,
                app_protocol: p.app_protocol.clone(),
            })
        })
        .collect())
}

/// One endpoint's addresses, or every reason the endpoint is refused.
fn endpoint_checked(
    i: usize,
    ep: &k8s_openapi::api::discovery::v1::Endpoint,
    v6: bool,
    address_type: &str,
    validation: Validation,
) -> Result<Vec<IpAddr>, Vec<Invalid>> {
    let mut why = Vec::new();
    if ep.addresses.is_empty() {
        why.push(Invalid::required(
            format!("endpoints[{i}].addresses"),
            "must contain at least 1 address",
        ));
    }
    let mut addresses = Vec::with_capacity(ep.addresses.len());
    for (j, a) in ep.addresses.iter().enumerate() {
        let field = format!("endpoints[{i}].addresses[{j}]");
        match endpoint_address(a, v6, address_type, validation) {
            Ok(ip) => addresses.push(ip),
            Err((value, reason)) => why.push(Invalid {
                field,
                value,
                why: reason,
            }),
        }
    }
    if let Some(h) = &ep.hostname
        && let Err(e) = validate::name(
            NameRule::Dns1123Label,
            &format!("endpoints[{i}].hostname"),
            h,
        )
    {
        why.push(e);
    }
    match why.is_empty() {
        true => Ok(addresses),
        false => Err(why),
    }
}

/// One address of a slice: an IP of the slice's family that may be an endpoint; else the
/// value as shown and why.
fn endpoint_address(
    a: &str,
    v6: bool,
    address_type: &str,
    validation: Validation,
) -> Result<IpAddr, (String, String)> {
    let ip: IpAddr = a
        .parse()
        .map_err(|_| (validate::show(a), "is not an IP address".to_owned()))?;
    if ip.is_ipv6() != v6 {
        return Err((
            ip.to_string(),
            format!("does not match addressType {address_type}"),
        ));
    }
    match validate::endpoint_ip(ip, validation.loopback()) {
        why if why.is_empty() => Ok(ip),
        why => Err((ip.to_string(), why.join("; "))),
    }
}

/// A ServiceExport's metadata is all it says (its spec is empty). Its name must be that of a
/// Service (a DNS-1035 label): anything else could never export one.
pub fn export(meta: &ObjectMeta) -> Result<(ObjectKey, core::Export)> {
    Ok((
        checked_key(meta, NameRule::Dns1035Label)?,
        core::Export {
            created: created_secs(meta),
            labels: meta.labels.clone().unwrap_or_default(),
        },
    ))
}

/// A ServiceImport, named after the Service it imports (a DNS-1035 label, as an export).
pub fn import(si: &ServiceImport) -> Result<(ObjectKey, core::Import)> {
    let key = checked_key(&si.metadata, NameRule::Dns1035Label)?;
    let ips = si
        .spec
        .ips
        .iter()
        .map(|ip| {
            ip.parse().map_err(|source| Error::ImportIp {
                ip: ip.clone(),
                source,
            })
        })
        .collect::<Result<Vec<IpAddr>>>()?;
    Ok((
        key,
        core::Import {
            ips,
            headless: si.spec.type_ == ServiceImportType::Headless,
        },
    ))
}

/// Converts a MemberCluster; relative paths (directory, kubeconfig) resolve against `base`
/// (the directory of the manifest that names it). Returns every problem found, not just the
/// first.
pub fn member_cluster(
    mc: &MemberCluster,
    base: &Path,
) -> Result<(ClusterSpec, MemberSource), Vec<String>> {
    let mut problems = Vec::new();
    let name = mc.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        problems.push("metadata.name is required".to_string());
    } else if !is_dns_label(&name) {
        problems.push(format!(
            "metadata.name {name:?} must be a DNS label (it is used in DNS names)"
        ));
    }
    let labels: BTreeMap<String, String> = mc.metadata.labels.clone().unwrap_or_default();
    let spec = &mc.spec;
    let source = spec.source.clone();
    let sources = [
        source.kubernetes.is_some(),
        source.directory.is_some(),
        source.agent.is_some(),
    ];
    let source = match sources.iter().filter(|s| **s).count() {
        1 => {
            if let Some(dir) = &source.directory {
                Some(MemberSource::Directory(normalize(&base.join(&dir.path))))
            } else if let Some(k) = &source.kubernetes {
                kube_access(k, base, &mut problems).map(MemberSource::Kubernetes)
            } else {
                Some(MemberSource::Agent)
            }
        }
        n => {
            problems.push(format!(
                "spec.source must set exactly one of kubernetes, directory, agent (found {n})"
            ));
            None
        }
    };
    let network = spec.network.clone().unwrap_or_default();
    let cidrs = |field: &str, list: &[String], problems: &mut Vec<String>| -> Vec<IpNet> {
        list.iter()
            .filter_map(|c| match c.parse::<IpNet>() {
                Ok(n) => Some(n),
                Err(_) => {
                    problems.push(format!("spec.network.{field}: {c:?} is not a CIDR"));
                    None
                }
            })
            .collect()
    };
    let dns_client_cidrs = cidrs("dnsClientCIDRs", &network.dns_client_cidrs, &mut problems);
    let pod_cidrs = cidrs("podCIDRs", &network.pod_cidrs, &mut problems);
    let gateway = spec.gateway.as_ref().and_then(|g| match g.address.parse() {
        Ok(address) if g.port > 0 => Some(core::Gateway {
            address,
            port: g.port,
        }),
        _ => {
            problems.push(format!(
                "spec.gateway: {:?}:{} is not an IP address and port",
                g.address, g.port
            ));
            None
        }
    });
    let taints = spec
        .taints
        .iter()
        .map(|t| core::Taint {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: taint_effect(t.effect),
        })
        .collect();
    let defaults = HealthTimings::default();
    let health = spec.health.clone().map_or(defaults, |h| HealthTimings {
        heartbeat_seconds: h
            .heartbeat_seconds
            .unwrap_or(defaults.heartbeat_seconds)
            .max(1),
        unreachable_after_seconds: h
            .unreachable_after_seconds
            .unwrap_or(defaults.unreachable_after_seconds),
        withdraw_after_seconds: h
            .withdraw_after_seconds
            .unwrap_or(defaults.withdraw_after_seconds),
    });
    match source {
        Some(source) if problems.is_empty() => Ok((
            ClusterSpec {
                id: ClusterId::new(&name),
                locality: Locality {
                    region: labels.get(REGION_LABEL).cloned(),
                    zone: labels.get(ZONE_LABEL).cloned(),
                },
                labels,
                network: network.name.clone(),
                dns_client_cidrs,
                pod_cidrs,
                gateway,
                taints,
                health,
                cost: spec.cost.as_ref().map(|c| {
                    core::Cost::new(
                        c.cpu_core_hour.unwrap_or(0.0),
                        c.memory_gib_hour.unwrap_or(0.0),
                        c.egress_gib.unwrap_or(0.0),
                        c.spot_ratio.unwrap_or(0.0),
                    )
                }),
                render_path: spec
                    .source
                    .directory
                    .as_ref()
                    .and_then(|d| d.render_path.as_ref())
                    .map(|p| normalize(&base.join(p))),
                retiring: mc.metadata.deletion_timestamp.is_some(),
            },
            source,
        )),
        _ => Err(problems),
    }
}

fn kube_access(
    k: &crate::crd::KubernetesSource,
    base: &Path,
    problems: &mut Vec<String>,
) -> Option<KubeAccess> {
    let credentials = match (&k.kubeconfig, &k.secret_ref) {
        (Some(kc), None) => Credentials::Kubeconfig {
            path: normalize(&base.join(&kc.path)),
            context: kc.context.clone(),
        },
        (None, Some(s)) => Credentials::Secret {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            key: s.key.clone().unwrap_or_else(|| "kubeconfig".into()),
        },
        _ => {
            problems.push(
                "spec.source.kubernetes must set exactly one of kubeconfig, secretRef".into(),
            );
            return None;
        }
    };
    if let Some(e) = &k.api_endpoint
        && !(e.starts_with("https://") || e.starts_with("http://"))
    {
        problems.push(format!(
            "spec.source.kubernetes.apiEndpoint {e:?} must be an http(s) URL"
        ));
        return None;
    }
    Some(KubeAccess {
        api_endpoint: k.api_endpoint.clone(),
        credentials,
    })
}

/// Removes `.` and `..` components lexically, so paths in messages read as the user wrote them.
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// RFC 1123 label: what Kubernetes requires of names that appear in DNS.
pub fn is_dns_label(s: &str) -> bool {
    NameRule::Dns1123Label.check(s).is_empty()
}

#[cfg(test)]
mod tests;
