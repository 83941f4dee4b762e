//! What a query name means, relative to the zone it falls in.
//!
//! ```text
//!  global:      [<host>.<cluster>. | <cluster>. | _<port>._<proto>. | _<proto>.] <svc>.<ns>.<zone>
//!  clusterset:  [<host>.<cluster>. | _<port>._<proto>. | _<proto>.] <svc>.<ns>.svc.<zone>
//! ```

use crate::config::Style;

/// The label of the probe name (`Named::WhoAmI`).
pub(crate) const WHOAMI: &str = "_meridian-whoami";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Named<'a> {
    Apex,
    /// `dns-version.<zone>` (clusterset).
    DnsVersion,
    /// `_meridian-whoami.<zone>`: TXT, who meridian takes the asker for (`meridian diagnose`
    /// asks it through a member's resolver). No namespace or service can have this name.
    WhoAmI,
    /// `svc.<zone>` (clusterset): an empty non-terminal while any service exists.
    ServicesRoot,
    /// `<ns>.<zone>`: an empty non-terminal while the namespace has an exported service. Also
    /// `ns.<zone>`, the name server, when no namespace is called `ns`.
    Namespace {
        ns: &'a str,
    },
    Service {
        ns: &'a str,
        svc: &'a str,
    },
    /// `<cluster>.<svc>.<ns>`: that cluster only (global), or an empty non-terminal above
    /// headless hostnames (clusterset).
    Cluster {
        ns: &'a str,
        svc: &'a str,
        cluster: &'a str,
    },
    Endpoint {
        ns: &'a str,
        svc: &'a str,
        cluster: &'a str,
        host: &'a str,
    },
    /// `_<proto>.<svc>.<ns>`: an empty non-terminal above the SRV names.
    SrvProto {
        ns: &'a str,
        svc: &'a str,
        proto: &'a str,
    },
    Srv {
        ns: &'a str,
        svc: &'a str,
        port: &'a str,
        proto: &'a str,
    },
    /// Nothing meridian serves can live here.
    Unknown,
}

impl<'a> Named<'a> {
    /// The service (`namespace`, `name`) a name is about, if any.
    pub(crate) fn service(&self) -> Option<(&'a str, &'a str)> {
        match *self {
            Named::Service { ns, svc }
            | Named::Cluster { ns, svc, .. }
            | Named::Endpoint { ns, svc, .. }
            | Named::SrvProto { ns, svc, .. }
            | Named::Srv { ns, svc, .. } => Some((ns, svc)),
            _ => None,
        }
    }
}

/// Parses the labels left of the zone apex (leftmost first, lower-case).
pub(crate) fn parse<'a>(labels: &[&'a str], style: Style, fixed_ns: Option<&'a str>) -> Named<'a> {
    let n = labels.len();
    if n == 0 {
        return Named::Apex;
    }
    if labels == [WHOAMI] {
        return Named::WhoAmI;
    }
    let (ns, rest) = match (style, fixed_ns) {
        (Style::Global, Some(ns)) => (ns, labels),
        (Style::Global, None) if n == 1 => return Named::Namespace { ns: labels[0] },
        (Style::Global, None) => (labels[n - 1], &labels[..n - 1]),
        (Style::Clusterset, _) => {
            if n == 1 {
                return match labels[0] {
                    "dns-version" => Named::DnsVersion,
                    "svc" => Named::ServicesRoot,
                    "ns" => Named::Namespace { ns: "ns" },
                    _ => Named::Unknown,
                };
            }
            if labels[n - 1] != "svc" {
                return Named::Unknown;
            }
            if n == 2 {
                return Named::Namespace { ns: labels[0] };
            }
            (labels[n - 2], &labels[..n - 2])
        }
    };
    let r = rest.len();
    let svc = rest[r - 1];
    let underscored = |s: &'a str| s.strip_prefix('_');
    match r {
        1 => Named::Service { ns, svc },
        2 => match underscored(rest[0]) {
            Some(proto) => Named::SrvProto { ns, svc, proto },
            None => Named::Cluster {
                ns,
                svc,
                cluster: rest[0],
            },
        },
        3 => match (underscored(rest[0]), underscored(rest[1])) {
            (Some(port), Some(proto)) => Named::Srv {
                ns,
                svc,
                port,
                proto,
            },
            (None, None) => Named::Endpoint {
                ns,
                svc,
                cluster: rest[1],
                host: rest[0],
            },
            _ => Named::Unknown,
        },
        _ => Named::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_names() {
        use Named::*;
        let g = |l: &[&'static str]| parse(l, Style::Global, None);
        assert_eq!(g(&[]), Apex);
        assert_eq!(g(&["shop"]), Namespace { ns: "shop" });
        assert_eq!(
            g(&["payments", "shop"]),
            Service {
                ns: "shop",
                svc: "payments"
            }
        );
        assert_eq!(
            g(&["eu-1", "payments", "shop"]),
            Cluster {
                ns: "shop",
                svc: "payments",
                cluster: "eu-1"
            }
        );
        assert_eq!(
            g(&["web-0", "eu-1", "payments", "shop"]),
            Endpoint {
                ns: "shop",
                svc: "payments",
                cluster: "eu-1",
                host: "web-0"
            }
        );
        assert_eq!(
            g(&["_http", "_tcp", "payments", "shop"]),
            Srv {
                ns: "shop",
                svc: "payments",
                port: "http",
                proto: "tcp"
            }
        );
        assert_eq!(
            g(&["_tcp", "payments", "shop"]),
            SrvProto {
                ns: "shop",
                svc: "payments",
                proto: "tcp"
            }
        );
        assert_eq!(g(&["_http", "x", "payments", "shop"]), Unknown);
        assert_eq!(g(&["a", "b", "c", "d", "e"]), Unknown);
    }

    #[test]
    fn fixed_namespace_shifts_by_one() {
        let g = |l: &[&'static str]| parse(l, Style::Global, Some("shop"));
        assert_eq!(
            g(&["payments"]),
            Named::Service {
                ns: "shop",
                svc: "payments"
            }
        );
        assert_eq!(
            g(&["eu-1", "payments"]),
            Named::Cluster {
                ns: "shop",
                svc: "payments",
                cluster: "eu-1"
            }
        );
    }

    #[test]
    fn clusterset_names() {
        use Named::*;
        let c = |l: &[&'static str]| parse(l, Style::Clusterset, None);
        assert_eq!(c(&["dns-version"]), DnsVersion);
        assert_eq!(c(&["svc"]), ServicesRoot);
        assert_eq!(c(&["shop", "svc"]), Namespace { ns: "shop" });
        assert_eq!(
            c(&["payments", "shop", "svc"]),
            Service {
                ns: "shop",
                svc: "payments"
            }
        );
        assert_eq!(
            c(&["web-0", "eu-1", "payments", "shop", "svc"]),
            Endpoint {
                ns: "shop",
                svc: "payments",
                cluster: "eu-1",
                host: "web-0"
            }
        );
        assert_eq!(c(&["payments", "shop", "pod"]), Unknown);
        assert_eq!(c(&["other"]), Unknown);
    }
}
