use super::*;

use std::sync::Arc;

use crate::model::ClusterSpec;
use crate::testing::{FleetBuilder, geo_table, ip};

fn loc(region: &str, zone: Option<&str>) -> Locality {
    Locality {
        region: Some(region.into()),
        zone: zone.map(str::to_string),
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// A snapshot of clusters `(name, dnsClientCIDRs)` with `geo` ranges `(cidr, region, zone)`.
fn fleet(clusters: &[(&str, &[&str])], geo: &[(&str, &str, &str)]) -> crate::Snapshot {
    let mut fleet = FleetBuilder::new();
    for (name, cidrs) in clusters {
        let mut spec = ClusterSpec::named(name);
        spec.dns_client_cidrs = cidrs.iter().map(|c| net(c)).collect();
        fleet.join(spec);
    }
    let mut snap = fleet.snapshot();
    snap.geo = geo_table(geo);
    snap
}

/// The place as text: a cluster's name, `geo:<region>`, or `unknown`.
fn place(snap: &crate::Snapshot, addr: &str) -> String {
    match snap.locate(ip(addr)) {
        Some(ClientPlace::Cluster(c)) => snap.clusters[c].spec.id.to_string(),
        Some(ClientPlace::Geo(g)) => {
            let l = snap.geo.locality(g).unwrap();
            format!("geo:{}", l.region.as_deref().unwrap())
        }
        None => "unknown".into(),
    }
}

#[test]
fn the_longest_prefix_wins_across_cluster_cidrs_and_geo_ranges() {
    let snap = fleet(
        &[
            ("a", &["10.0.0.0/8", "192.0.2.0/24"]),
            ("b", &["10.0.0.0/8", "198.51.100.0/24"]),
            ("c", &["10.9.0.0/16", "fd00::/16"]),
            ("d", &["10.10.0.0/16"]),
            ("e", &["10.10.0.0/16"]),
        ],
        &[
            ("10.1.0.0/16", "eu", ""),         // longer than the a/b tie at /8
            ("10.9.0.0/16", "us", ""),         // equal to c's /16: c wins
            ("10.9.9.0/24", "ap", ""),         // longer than c's /16
            ("192.0.0.0/16", "us", ""),        // shorter than a's /24: a wins
            ("10.10.0.0/15", "eu", ""),        // shorter than the d/e tie: still the fallback
            ("203.0.113.0/24", "eu", "eu-1a"), // no cluster at all
            ("fd00:1::/32", "ap", ""),         // v6, longer than c's /16
        ],
    );
    let cases = [
        (
            "10.1.2.3",
            "geo:eu",
            "a geo /16 beats a tie between clusters at /8",
        ),
        (
            "10.2.0.1",
            "unknown",
            "a tie between clusters and no geo range",
        ),
        (
            "10.9.1.1",
            "c",
            "equal length: the cluster wins over the geo range",
        ),
        (
            "10.9.9.9",
            "geo:ap",
            "a longer geo range beats a cluster's CIDR",
        ),
        (
            "192.0.2.1",
            "a",
            "a cluster's longer CIDR beats a geo range",
        ),
        ("192.0.3.1", "geo:us", "only the geo range holds it"),
        (
            "10.10.0.1",
            "geo:eu",
            "a tie between clusters falls back to a shorter geo range",
        ),
        ("203.0.113.77", "geo:eu", "outside every cluster"),
        ("198.51.100.5", "b", "a cluster only"),
        ("8.8.8.8", "unknown", "nowhere"),
        (
            "fd00:1::1",
            "geo:ap",
            "v6 geo beats a shorter v6 cluster CIDR",
        ),
        ("fd00:2::1", "c", "v6 cluster only"),
        (
            "::ffff:203.0.113.77",
            "unknown",
            "a v6 address never matches a v4 range",
        ),
    ];
    for (addr, expected, why) in cases {
        assert_eq!(place(&snap, addr), expected, "{addr}: {why}");
    }
}

#[test]
fn without_geo_ranges_the_cluster_rule_is_unchanged() {
    let snap = fleet(&[("a", &["10.0.0.0/8"]), ("b", &["10.0.0.0/8"])], &[]);
    assert_eq!(snap.locate(ip("10.0.0.1")), None);
    let snap = fleet(&[("a", &["10.0.0.0/8"])], &[]);
    assert_eq!(snap.locate(ip("10.0.0.1")), Some(ClientPlace::Cluster(0)));
}

#[test]
fn a_cidr_given_two_localities_is_a_conflict_and_is_not_served() {
    let mut b = GeoBuilder::default();
    b.add(net("203.0.113.0/24"), &loc("eu", None), 0);
    b.add(net("203.0.0.0/16"), &loc("ap", None), 1);
    // Host bits set: the same network as origin 0.
    b.add(net("203.0.113.9/24"), &loc("us", None), 2);
    // The same locality again is no conflict.
    b.add(net("198.51.100.0/24"), &loc("us", Some("us-1")), 3);
    b.add(net("198.51.100.0/24"), &loc("us", Some("us-1")), 4);
    let (table, conflicts) = b.finish();
    assert_eq!(
        conflicts,
        vec![GeoConflict {
            net: net("203.0.113.0/24"),
            ranges: vec![(0, loc("eu", None)), (2, loc("us", None))],
        }]
    );
    assert_eq!(table.len(), 2);
    // The conflicting /24 is ignored: the /16 answers for it.
    assert_eq!(table.lookup(ip("203.0.113.1")), Some(&loc("ap", None)));
    assert_eq!(
        table.lookup(ip("198.51.100.1")),
        Some(&loc("us", Some("us-1")))
    );
    // Each distinct locality once, whatever the number of ranges.
    assert_eq!(table.localities().len(), 4);
}

#[test]
fn snapshots_share_the_table() {
    let table = geo_table(&[("203.0.113.0/24", "eu", "")]);
    let mut snap = fleet(&[], &[]);
    snap.geo = table.clone();
    assert!(Arc::ptr_eq(&snap.geo, &table));
}
