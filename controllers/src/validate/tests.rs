//! The accept/refuse cases of upstream's own tests (`validation_test.go` in apimachinery and
//! `pkg/apis/discovery/validation`), plus hostile values.

use super::*;

struct NameCase {
    name: &'static str,
    value: String,
    valid: bool,
}

fn case(name: &'static str, value: impl Into<String>, valid: bool) -> NameCase {
    NameCase {
        name,
        value: value.into(),
        valid,
    }
}

fn check_all(rule: NameRule, cases: &[NameCase]) {
    for c in cases {
        let why = rule.check(&c.value);
        assert_eq!(
            why.is_empty(),
            c.valid,
            "{}: {:?} gave {why:?}",
            c.name,
            c.value
        );
    }
}

#[test]
fn dns1123_labels_as_upstream() {
    let mut cases = vec![
        case("accept: one letter", "a", true),
        case("accept: letters and digits", "a1", true),
        case("accept: inner dashes, even doubled", "a--1--2--b", true),
        case("accept: digits only (unlike DNS-1035)", "012", true),
        case("accept: starts with a digit", "1-a", true),
        case("accept: 63 characters", "a".repeat(63), true),
        case("refuse: empty", "", false),
        case("refuse: 64 characters", "a".repeat(64), false),
        case("refuse: a 300-character hostname", "h".repeat(300), false),
        case("refuse: upper case", "aBc", false),
        case("refuse: leading dash", "-a", false),
        case("refuse: trailing dash", "a-", false),
        case("refuse: a lone dash", "-", false),
        case("refuse: underscore", "a_b", false),
        case("refuse: a dot (two DNS labels, not one)", "a.b", false),
        case("refuse: space inside", "a b", false),
        case("refuse: trailing space", "a ", false),
        case("refuse: NUL", "a\0b", false),
        case("refuse: wildcard", "*", false),
        case("refuse: non-ASCII", "café", false),
    ];
    cases.push(case("refuse: leading space", " 1", false));
    check_all(NameRule::Dns1123Label, &cases);
}

#[test]
fn dns1035_labels_as_upstream() {
    check_all(
        NameRule::Dns1035Label,
        &[
            case("accept: one letter", "a", true),
            case("accept: letter then digits and dashes", "a--1--2--b", true),
            case("accept: 63 characters", "a".repeat(63), true),
            case("refuse: starts with a digit", "1a", false),
            case("refuse: digits only", "012", false),
            case("refuse: empty", "", false),
            case("refuse: 64 characters", "a".repeat(64), false),
            case(
                "refuse: upper case and underscore (Bad_Name)",
                "Bad_Name",
                false,
            ),
            case("refuse: a dot", "a.b", false),
            case("refuse: wildcard", "*", false),
            case("refuse: trailing dash", "a-", false),
        ],
    );
}

#[test]
fn dns1123_subdomains_as_upstream() {
    let long_ok = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    let too_long = format!("{long_ok}e");
    assert_eq!(long_ok.len(), 253);
    check_all(
        NameRule::Dns1123Subdomain,
        &[
            case("accept: one label", "web-1", true),
            case("accept: dotted labels", "a.b.c.d.e", true),
            case("accept: digit labels", "1.2.3.4.5", true),
            case("accept: 253 characters", long_ok, true),
            case("refuse: 254 characters", too_long, false),
            case("refuse: empty", "", false),
            case("refuse: empty label", "a..b", false),
            case("refuse: leading dot", ".a", false),
            case("refuse: trailing dot", "a.", false),
            case("refuse: label ending in a dash", "a-.a", false),
            case("refuse: label starting with a dash", "a.-a", false),
            case("refuse: upper case label", "a.A", false),
            case("refuse: underscore", "a_b", false),
        ],
    );
}

#[test]
fn a_refused_name_names_its_field_rule_and_reasons() {
    let e = name(NameRule::Dns1035Label, "metadata.name", "Bad_Name").unwrap_err();
    assert_eq!(e.field, "metadata.name");
    let text = e.to_string();
    assert!(
        text.starts_with("metadata.name: \"Bad_Name\" is not a DNS-1035 label (must consist of"),
        "{text}"
    );
    let long = name(
        NameRule::Dns1123Label,
        "endpoints[0].hostname",
        &"h".repeat(300),
    )
    .unwrap_err();
    let text = long.to_string();
    assert!(text.contains("(300 characters)"), "{text}");
    assert!(
        text.contains("must be no more than 63 characters"),
        "{text}"
    );
    assert!(text.len() < 400, "the value is cut: {text}");
    let nul = name(NameRule::Dns1123Label, "endpoints[0].hostname", "a\0b").unwrap_err();
    assert!(!nul.to_string().contains('\0'), "NUL is escaped: {nul}");
    assert!(nul.to_string().contains(r#""a\0b""#), "{nul}");
    assert_eq!(
        name(NameRule::Dns1123Label, "metadata.namespace", "shop"),
        Ok(())
    );
}

struct IpCase {
    name: &'static str,
    ip: &'static str,
    loopback: Loopback,
    /// A phrase every refusal carries; none: the address is served.
    refused_because: Option<&'static str>,
}

#[test]
fn endpoint_addresses_as_the_api_server_and_meridian_refuse_them() {
    use Loopback::{Allowed, Refused};
    let cases = [
        IpCase {
            name: "accept: private IPv4",
            ip: "10.1.2.3",
            loopback: Refused,
            refused_because: None,
        },
        IpCase {
            name: "accept: public IPv4",
            ip: "8.8.8.8",
            loopback: Refused,
            refused_because: None,
        },
        IpCase {
            name: "accept: ULA IPv6",
            ip: "fd00::1",
            loopback: Refused,
            refused_because: None,
        },
        IpCase {
            name: "accept: documentation IPv6",
            ip: "2001:db8::1",
            loopback: Refused,
            refused_because: None,
        },
        IpCase {
            name: "accept: 169.253.255.255 sits just below link-local",
            ip: "169.253.255.255",
            loopback: Refused,
            refused_because: None,
        },
        IpCase {
            name: "accept: 223.255.255.255 sits just below multicast",
            ip: "223.255.255.255",
            loopback: Refused,
            refused_because: None,
        },
        IpCase {
            name: "accept: 255.255.255.254 is not the broadcast address",
            ip: "255.255.255.254",
            loopback: Refused,
            refused_because: None,
        },
        IpCase {
            name: "accept: fec0::1 sits just above link-local",
            ip: "fec0::1",
            loopback: Refused,
            refused_because: None,
        },
        IpCase {
            name: "refuse: unspecified IPv4",
            ip: "0.0.0.0",
            loopback: Allowed,
            refused_because: Some("may not be unspecified (0.0.0.0)"),
        },
        IpCase {
            name: "refuse: unspecified IPv6",
            ip: "::",
            loopback: Allowed,
            refused_because: Some("may not be unspecified (::)"),
        },
        IpCase {
            name: "refuse: loopback from a Kubernetes API",
            ip: "127.0.0.1",
            loopback: Refused,
            refused_because: Some("loopback range"),
        },
        IpCase {
            name: "refuse: anywhere in 127/8 from a Kubernetes API",
            ip: "127.1.2.3",
            loopback: Refused,
            refused_because: Some("loopback range"),
        },
        IpCase {
            name: "refuse: IPv6 loopback from a Kubernetes API",
            ip: "::1",
            loopback: Refused,
            refused_because: Some("loopback range"),
        },
        IpCase {
            name: "accept: loopback in a directory member",
            ip: "127.1.1.1",
            loopback: Allowed,
            refused_because: None,
        },
        IpCase {
            name: "accept: IPv6 loopback in a directory member",
            ip: "::1",
            loopback: Allowed,
            refused_because: None,
        },
        IpCase {
            name: "refuse: the cloud metadata address (link-local)",
            ip: "169.254.169.254",
            loopback: Allowed,
            refused_because: Some("link-local range"),
        },
        IpCase {
            name: "refuse: IPv6 link-local",
            ip: "fe80::1",
            loopback: Allowed,
            refused_because: Some("link-local range"),
        },
        IpCase {
            name: "refuse: top of fe80::/10",
            ip: "febf::1",
            loopback: Allowed,
            refused_because: Some("link-local range"),
        },
        IpCase {
            name: "refuse: IPv4 link-local multicast",
            ip: "224.0.0.1",
            loopback: Allowed,
            refused_because: Some("link-local multicast"),
        },
        IpCase {
            name: "refuse: IPv6 all-nodes link-local multicast",
            ip: "ff02::1",
            loopback: Allowed,
            refused_because: Some("link-local multicast"),
        },
        IpCase {
            name: "refuse: IPv6 transient link-local multicast (ff12::)",
            ip: "ff12::1",
            loopback: Allowed,
            refused_because: Some("link-local multicast"),
        },
        IpCase {
            name: "refuse: other IPv4 multicast (meridian)",
            ip: "239.1.1.1",
            loopback: Allowed,
            refused_because: Some("may not be multicast"),
        },
        IpCase {
            name: "refuse: other IPv6 multicast (meridian)",
            ip: "ff05::2",
            loopback: Allowed,
            refused_because: Some("may not be multicast"),
        },
        IpCase {
            name: "refuse: IPv4 broadcast (meridian)",
            ip: "255.255.255.255",
            loopback: Allowed,
            refused_because: Some("broadcast"),
        },
        IpCase {
            name: "refuse: IPv4-mapped loopback even where loopback is allowed",
            ip: "::ffff:127.0.0.1",
            loopback: Allowed,
            refused_because: Some("IPv4-mapped"),
        },
        IpCase {
            name: "refuse: IPv4-mapped private address",
            ip: "::ffff:10.0.0.1",
            loopback: Allowed,
            refused_because: Some("IPv4-mapped"),
        },
    ];
    for c in cases {
        let ip: IpAddr = c.ip.parse().unwrap();
        let why = endpoint_ip(ip, c.loopback);
        match c.refused_because {
            None => assert!(why.is_empty(), "{}: {why:?}", c.name),
            Some(phrase) => assert!(
                why.iter().any(|w| w.contains(phrase)),
                "{}: expected {phrase:?} in {why:?}",
                c.name
            ),
        }
    }
}

#[test]
fn shown_values_are_quoted_and_cut() {
    assert_eq!(show("web"), r#""web""#);
    assert_eq!(show("a b"), r#""a b""#);
    assert_eq!(show("x\ny"), r#""x\ny""#);
    let cut = show(&"é".repeat(100));
    assert!(cut.ends_with("… (100 characters)"), "{cut}");
}
