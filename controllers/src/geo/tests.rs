use super::*;

use std::io::Write;

fn loc(region: &str, zone: Option<&str>) -> Locality {
    Locality {
        region: Some(region.into()),
        zone: zone.map(str::to_string),
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

const PATH: &str = "/etc/meridian/geo.csv";

/// `(line, reason)` of each problem, for readable assertions.
fn reasons(problems: &[Problem]) -> Vec<(String, String)> {
    problems
        .iter()
        .map(|p| {
            assert_eq!(p.origin, Origin::Geo);
            assert_eq!(
                p.source,
                Source::File {
                    path: PathBuf::from(PATH)
                }
            );
            (p.subject.to_string(), p.reason.clone())
        })
        .collect()
}

#[test]
fn good_lines_with_a_header_comments_blank_lines_quotes_and_ipv6() {
    let text = "\
# exported from a MaxMind-style database
network,region,zone

203.0.113.0/24,eu,eu-1a
198.51.100.0/24, us  # trailing comment
\"2001:db8::/32\",\"ap\",\"\"
192.0.2.7/24,eu\r
";
    let (lines, problems) = parse(Path::new(PATH), text);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        lines,
        vec![
            Line {
                number: 4,
                net: net("203.0.113.0/24"),
                locality: loc("eu", Some("eu-1a")),
            },
            Line {
                number: 5,
                net: net("198.51.100.0/24"),
                locality: loc("us", None),
            },
            Line {
                number: 6,
                net: net("2001:db8::/32"),
                locality: loc("ap", None),
            },
            // Host bits are kept here and ignored by the table, as for cluster CIDRs.
            Line {
                number: 7,
                net: net("192.0.2.7/24"),
                locality: loc("eu", None),
            },
        ]
    );
}

#[test]
fn every_bad_line_is_reported_with_its_number_and_the_good_ones_serve() {
    let text = "\
203.0.113.0/24,eu
not-a-cidr,eu
10.0.0.1,eu
198.51.100.0/24
198.51.100.0/24,,z
,eu
2001:db8::/129,ap
192.0.2.0/24,eu,eu-1a,extra
192.0.2.0/24,e u
fd00::/8,ap,ap-1
network,region,zone
";
    let (lines, problems) = parse(Path::new(PATH), text);
    assert_eq!(lines.iter().map(|l| l.number).collect::<Vec<_>>(), [1, 10]);
    let got = reasons(&problems);
    let expected: [(&str, &str); 9] = [
        ("line 2", "bad CIDR \"not-a-cidr\""),
        ("line 3", "needs its prefix length"),
        ("line 4", "missing region"),
        ("line 5", "missing region"),
        ("line 6", "missing network"),
        ("line 7", "bad CIDR \"2001:db8::/129\""),
        ("line 8", "4 fields"),
        ("line 9", "no spaces"),
        // A header is tolerated only as the first line.
        ("line 11", "bad CIDR \"network\""),
    ];
    assert_eq!(got.len(), expected.len(), "{got:#?}");
    for ((line, reason), (want_line, want)) in got.iter().zip(expected) {
        assert_eq!(line, want_line);
        assert!(
            reason.contains(want),
            "{line}: {reason:?} should say {want:?}"
        );
    }
    // Problems read as the rest of meridian's: file, line, reason.
    assert_eq!(
        problems[0].to_string(),
        format!("{PATH}: line 2: bad CIDR \"not-a-cidr\" (expected e.g. 203.0.113.0/24)")
    );
}

fn settings(ranges: Vec<ConfigRange>) -> GeoSettings {
    GeoSettings {
        ranges,
        config_file: Some(PathBuf::from("/etc/meridian/meridian.yaml")),
        file: Some(PathBuf::from(PATH)),
        reload: GeoSettings::DEFAULT_RELOAD,
        max_file_bytes: 1 << 20,
        read_timeout: Duration::from_secs(5),
        settle: Duration::ZERO,
    }
}

#[test]
fn config_ranges_and_file_ranges_merge_and_a_cidr_with_two_localities_is_reported_where_given() {
    let s = settings(vec![ConfigRange {
        cidrs: vec![net("203.0.113.0/24"), net("10.0.0.0/8")],
        locality: loc("eu", None),
    }]);
    let (lines, problems) = parse(
        Path::new(PATH),
        "198.51.100.0/24,us\n203.0.113.0/24,us,us-1a\n10.0.0.0/8,eu\n198.51.100.0/24,ap\n",
    );
    assert!(problems.is_empty());
    let (table, problems) = build(&s, &lines);
    // 10.0.0.0/8 agrees with the config; the other two are given two localities each.
    assert_eq!(table.len(), 1);
    assert_eq!(
        table.lookup("10.1.1.1".parse().unwrap()),
        Some(&loc("eu", None))
    );
    assert_eq!(table.lookup("203.0.113.1".parse().unwrap()), None);
    assert_eq!(table.lookup("198.51.100.1".parse().unwrap()), None);
    let got: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "/etc/meridian/meridian.yaml: geo.ranges[0]: 203.0.113.0/24 (region eu) is also given another locality: region us, zone us-1a (line 2); the range is not used",
            "/etc/meridian/geo.csv: line 2: 203.0.113.0/24 (region us, zone us-1a) is also given another locality: region eu (geo.ranges[0]); the range is not used",
            "/etc/meridian/geo.csv: line 1: 198.51.100.0/24 (region us) is also given another locality: region ap (line 4); the range is not used",
            "/etc/meridian/geo.csv: line 4: 198.51.100.0/24 (region ap) is also given another locality: region us (line 1); the range is not used",
        ]
    );
}

fn write(path: &Path, text: &str) {
    // A rename onto the path, as editors save: a new inode, so a new stamp.
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.sync_all().unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn region_of(source: &GeoSource, ip: &str) -> Option<String> {
    source
        .table
        .lookup(ip.parse().unwrap())
        .and_then(|l| l.region.clone())
}

#[test]
fn an_edit_is_picked_up_and_an_unreadable_file_keeps_the_last_good_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("geo.csv");
    write(&path, "203.0.113.0/24,eu\n");
    let s = GeoSettings {
        file: Some(path.clone()),
        ..settings(vec![])
    };
    let mut source = GeoSource::new(s);
    assert_eq!(region_of(&source, "203.0.113.9").as_deref(), Some("eu"));
    assert!(!source.look(None), "nothing changed");

    write(&path, "203.0.113.0/24,us\nbad,eu\n");
    assert!(source.look(None));
    assert_eq!(region_of(&source, "203.0.113.9").as_deref(), Some("us"));
    assert_eq!(reasons_at(&source), ["line 2"]);

    // Gone: the last good table keeps serving, and the file's problem is reported with it.
    std::fs::remove_file(&path).unwrap();
    assert!(source.look(None));
    assert_eq!(region_of(&source, "203.0.113.9").as_deref(), Some("us"));
    let SourceEvent::Geo { table, problems } = source.event() else {
        unreachable!()
    };
    assert!(Arc::ptr_eq(&table, &source.table));
    let unreadable = problems.last().unwrap();
    assert_eq!(unreadable.subject.to_string(), "file");
    assert!(
        unreadable.reason.contains("cannot read") && unreadable.reason.contains("keep serving"),
        "{unreadable}"
    );
    assert!(!source.look(None), "the same failure is reported once");

    // A directory in its place is not a regular file.
    std::fs::create_dir(&path).unwrap();
    assert!(source.look(None));
    assert!(source.event_reason().contains("not a regular file"));
    std::fs::remove_dir(&path).unwrap();

    // Too large.
    write(&path, &"203.0.113.0/24,eu\n".repeat(100_000));
    assert!(source.look(None));
    assert!(source.event_reason().contains("geo.maxFileBytes"));
    assert_eq!(region_of(&source, "203.0.113.9").as_deref(), Some("us"));

    // Back: read again, the file problem gone.
    write(&path, "203.0.113.0/24,ap\n");
    assert!(source.look(None));
    assert_eq!(region_of(&source, "203.0.113.9").as_deref(), Some("ap"));
    assert!(source.all_problems().is_empty());
}

#[test]
fn a_file_modified_within_the_settle_time_waits_for_the_next_look() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("geo.csv");
    write(&path, "203.0.113.0/24,eu\n");
    let mut source = GeoSource::new(GeoSettings {
        file: Some(path.clone()),
        ..settings(vec![])
    });
    write(&path, "203.0.113.0/24,us\n");
    assert!(!source.look(Some(Duration::from_secs(3600))));
    assert_eq!(region_of(&source, "203.0.113.9").as_deref(), Some("eu"));
    assert!(source.look(Some(Duration::ZERO)));
    assert_eq!(region_of(&source, "203.0.113.9").as_deref(), Some("us"));
}

fn reasons_at(source: &GeoSource) -> Vec<String> {
    source
        .all_problems()
        .iter()
        .map(|p| p.subject.to_string())
        .collect()
}

impl GeoSource {
    /// The reason of the last problem served (the file's, when it cannot be read).
    fn event_reason(&self) -> String {
        self.all_problems()
            .last()
            .map(|p| p.reason.clone())
            .unwrap_or_default()
    }
}
