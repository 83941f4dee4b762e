//! Kubernetes' own validation of the names and addresses meridian serves, for objects that no
//! API server has checked: a directory member's manifests go straight from disk into DNS and
//! xDS, so meridian refuses what the API server would refuse (and a little more, below).
//! Pure functions; the rules and their wording follow upstream
//! (`k8s.io/apimachinery/pkg/util/validation`, `pkg/apis/core/validation`,
//! `pkg/apis/discovery/validation`), the code does not.
//!
//! ```text
//!  convert::service / slice / export / import ──► name(rule, field, value)   ──► Invalid
//!  convert::slice, per endpoint address        ──► endpoint_ip(ip, loopback) ──► reasons
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The longest value shown in a message (a 300-character hostname is shown cut).
const SHOWN_CHARS: usize = 64;

/// A value Kubernetes would refuse: where it is, what it is, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Invalid {
    /// The field path as the API server names it (`metadata.name`, `endpoints[2].hostname`).
    pub field: String,
    /// The value as shown in the message: quoted with escapes, cut when long, empty when the
    /// value is missing.
    pub value: String,
    /// Why, as a phrase that follows the value (`is not a DNS-1123 label (…)`).
    pub why: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value.is_empty() {
            true => write!(f, "{} {}", self.field, self.why),
            false => write!(f, "{}: {} {}", self.field, self.value, self.why),
        }
    }
}

impl Invalid {
    pub fn new(field: impl Into<String>, value: &str, why: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            value: show(value),
            why: why.into(),
        }
    }

    /// A value that is required here and missing.
    pub fn required(field: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            value: String::new(),
            why: why.into(),
        }
    }
}

/// A value for a message: quoted and escaped (no NUL, newline or terminal control reaches a
/// log line), and cut after [`SHOWN_CHARS`] characters with the full length given.
pub fn show(value: &str) -> String {
    let chars = value.chars().count();
    match chars > SHOWN_CHARS {
        true => {
            let cut: String = value.chars().take(SHOWN_CHARS).collect();
            format!("{cut:?}… ({chars} characters)")
        }
        false => format!("{value:?}"),
    }
}

/// The syntax rules Kubernetes applies to names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1035 label (`IsDNS1035Label`): Service names (`ValidateServiceName`).
    Dns1035Label,
    /// RFC 1123 label (`IsDNS1123Label`): namespaces, endpoint hostnames, port names of
    /// Services and EndpointSlices.
    Dns1123Label,
    /// RFC 1123 subdomain (`IsDNS1123Subdomain`): EndpointSlice names
    /// (`ValidateEndpointSliceName`).
    Dns1123Subdomain,
}

impl NameRule {
    fn title(self) -> &'static str {
        match self {
            NameRule::Dns1035Label => "DNS-1035 label",
            NameRule::Dns1123Label => "DNS-1123 label",
            NameRule::Dns1123Subdomain => "DNS-1123 subdomain",
        }
    }

    fn max_len(self) -> usize {
        match self {
            NameRule::Dns1035Label | NameRule::Dns1123Label => 63,
            NameRule::Dns1123Subdomain => 253,
        }
    }

    /// Upstream's description of the syntax (its regex error, without the regex).
    fn syntax(self) -> &'static str {
        match self {
            NameRule::Dns1035Label => {
                "must consist of lower case alphanumeric characters or '-', start with an \
                 alphabetic character, and end with an alphanumeric character (e.g. 'my-name', \
                 or 'abc-123')"
            }
            NameRule::Dns1123Label => {
                "must consist of lower case alphanumeric characters or '-', and must start and \
                 end with an alphanumeric character (e.g. 'my-name', or '123-abc')"
            }
            NameRule::Dns1123Subdomain => {
                "must consist of lower case alphanumeric characters, '-' or '.', and must start \
                 and end with an alphanumeric character (e.g. 'example.com')"
            }
        }
    }

    fn matches(self, value: &str) -> bool {
        match self {
            NameRule::Dns1035Label => {
                label_syntax(value) && value.starts_with(|c: char| c.is_ascii_lowercase())
            }
            NameRule::Dns1123Label => label_syntax(value),
            NameRule::Dns1123Subdomain => value.split('.').all(label_syntax),
        }
    }

    /// Every way `value` breaks this rule (none: it is valid), as upstream lists them.
    pub fn check(self, value: &str) -> Vec<String> {
        let mut why = Vec::new();
        if value.len() > self.max_len() {
            why.push(format!(
                "must be no more than {} characters",
                self.max_len()
            ));
        }
        if !self.matches(value) {
            why.push(self.syntax().to_owned());
        }
        why
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, with no length limit (the rule checks that).
fn label_syntax(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&b| alnum(b) || b == b'-')
        }
        _ => false,
    }
}

/// Checks a name against its rule; the error names the field and every reason.
pub fn name(rule: NameRule, field: &str, value: &str) -> Result<(), Invalid> {
    let why = rule.check(value);
    match why.is_empty() {
        true => Ok(()),
        false => Err(Invalid::new(
            field,
            value,
            format!("is not a {} ({})", rule.title(), why.join("; ")),
        )),
    }
}

/// Whether a loopback endpoint address is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loopback {
    /// No, as the API server says (`ValidateEndpointIP`).
    Refused,
    /// Yes: a fleet on one machine (the quickstart, the tests) runs its backends on loopback.
    Allowed,
}

/// Every reason Kubernetes (`ValidateEndpointIP`) or meridian refuses `ip` as an endpoint
/// address; none means it is served. Upstream refuses unspecified, loopback, link-local and
/// link-local multicast addresses; meridian also refuses every other multicast address, the
/// IPv4 broadcast address and IPv4-mapped IPv6 addresses (upstream's `IsValidIPv6Address`
/// refuses those too, as not IPv6).
pub fn endpoint_ip(ip: IpAddr, loopback: Loopback) -> Vec<String> {
    let mut why = Vec::new();
    if ip.is_unspecified() {
        why.push(format!("may not be unspecified ({ip})"));
    }
    if ip.is_loopback() && loopback == Loopback::Refused {
        why.push("may not be in the loopback range (127.0.0.0/8, ::1/128)".to_owned());
    }
    if is_link_local_unicast(ip) {
        why.push("may not be in the link-local range (169.254.0.0/16, fe80::/10)".to_owned());
    }
    if is_link_local_multicast(ip) {
        why.push(
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/16)".to_owned(),
        );
    } else if ip.is_multicast() {
        why.push("may not be multicast (224.0.0.0/4, ff00::/8)".to_owned());
    }
    if ip == IpAddr::V4(Ipv4Addr::BROADCAST) {
        why.push("may not be the broadcast address (255.255.255.255)".to_owned());
    }
    if let IpAddr::V6(v6) = ip
        && v6.to_ipv4_mapped().is_some()
    {
        why.push(
            "may not be an IPv4-mapped IPv6 address (::ffff:0:0/96; list the IPv4 address in \
             an IPv4 slice)"
                .to_owned(),
        );
    }
    why
}

/// 169.254.0.0/16 and fe80::/10, as Go's `IP.IsLinkLocalUnicast`.
fn is_link_local_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// 224.0.0.0/24 and ff02::/16 with any flags (ffX2::), as Go's `IP.IsLinkLocalMulticast`.
fn is_link_local_multicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => is_v6_link_local_multicast(v6),
    }
}

fn is_v6_link_local_multicast(v6: Ipv6Addr) -> bool {
    let [first, second, ..] = v6.octets();
    first == 0xff && second & 0x0f == 0x02
}

#[cfg(test)]
mod tests;
