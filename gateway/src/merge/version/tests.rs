use super::*;

fn composite(pairs: &[(&str, &str)]) -> Composite {
    Composite(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// `m0000`…: a fleet's names, as the fake fleet's.
fn fleet(members: usize) -> Vec<String> {
    (0..members).map(|i| format!("m{i:04}")).collect()
}

fn strs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

#[derive(Default)]
struct Case {
    name: &'static str,
    roster: &'static [&'static str],
    versions: &'static [(&'static str, &'static str)],
}

#[test]
fn tokens_round_trip_whatever_the_versions_are() {
    let cases = [
        Case {
            name: "no member listed yet",
            roster: &["m1", "m2"],
            ..Default::default()
        },
        Case {
            name: "etcd revisions, one member absent (down when listed)",
            roster: &["m1", "m2", "m3"],
            versions: &[("m1", "5"), ("m3", "18446744073709")],
        },
        Case {
            name: "versions that are not a number as written: kept as text",
            roster: &["a", "b", "c", "d", "e", "f"],
            versions: &[
                ("a", "0"),
                ("b", "007"),
                ("c", ""),
                ("d", "12abc"),
                ("e", "18446744073709551615"),
                ("f", "é/+ ="),
            ],
        },
        Case {
            name: "a member the roster lacks is carried by name",
            roster: &["m1"],
            versions: &[("m1", "3"), ("m9", "4"), ("zz", "x")],
        },
        Case {
            name: "an empty fleet",
            roster: &[],
            versions: &[],
        },
    ];
    for case in cases {
        let rosters = Rosters::default();
        let roster = rosters.current(case.roster);
        let c = composite(case.versions);
        let token = encode(&c, &roster);
        assert!(token.starts_with("mrv2."), "{}", case.name);
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
            "{}: {token} needs no escaping in a URL",
            case.name
        );
        assert_eq!(decode(&token, &rosters), Ok(c.clone()), "{}", case.name);
        assert_eq!(Live::new(c, roster).token(), token, "{}", case.name);
    }
}

#[test]
fn the_format_is_fixed() {
    // A token issued today must read after an upgrade: this pins the format. Fingerprint
    // of ["m1","m2","m3"], 3 places: m1 = 5 (vlq 12 = "M"), m2 absent ("A"), m3 = "abc"
    // (vlq 7 = "H", then "YWJj"), no extras ("A").
    let rosters = Rosters::default();
    let roster = rosters.current(&["m1", "m2", "m3"]);
    let token = encode(&composite(&[("m1", "5"), ("m3", "abc")]), &roster);
    let fingerprint = &roster.fingerprint;
    assert_eq!(token, format!("mrv2.{fingerprint}DMAHYWJjA"));
    // A revision past one digit: 1000 is vlq 2002 = 18 + 30·32 + 1·1024, least significant
    // first, the sixth bit saying more follows: "y" (18 | 32), "-" (30 | 32), "B" (1).
    let mut out = String::new();
    vlq(&mut out, 2002);
    assert_eq!(out, "y-B");
}

#[test]
fn a_thousand_members_fit_a_url_and_a_header() {
    // Bounds: 1,000 members of etcd revisions below 10^7 (5 digits each) fit in 5,100
    // bytes; of 10-digit revisions (7 digits each, to ~1.7e10) in 7,100 — under the 8 KiB
    // many proxies allow a request line or header, and under hyper's and Go's 16 KiB.
    // The `mrv1.` token of the same state is ~4x that.
    let names = fleet(1000);
    let rosters = Rosters::default();
    let roster = rosters.current(&strs(&names));
    for (revision, bound) in [(9_999_000_u64, 5_100), (4_000_000_000, 7_100)] {
        let c = Composite(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), (revision - 7 * i as u64).to_string()))
                .collect(),
        );
        let token = encode(&c, &roster);
        assert!(token.len() <= bound, "{} bytes at {revision}", token.len());
        let old = format!(
            "mrv1.{}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&c.0).unwrap())
        );
        assert!(
            old.len() > 3 * token.len(),
            "{} vs {}",
            old.len(),
            token.len()
        );
        assert_eq!(Composite::decode(&token, &rosters), Ok(c.clone()));
        assert_eq!(Composite::decode(&old, &rosters), Ok(c));
    }
}

#[test]
fn an_earlier_gateways_token_still_reads() {
    // {"m1":"5","m3":"7"}, as the `mrv1.` encoder wrote it.
    let rosters = Rosters::default();
    assert_eq!(
        Composite::decode("mrv1.eyJtMSI6IjUiLCJtMyI6IjcifQ", &rosters),
        Ok(composite(&[("m1", "5"), ("m3", "7")]))
    );
}

#[test]
fn a_token_reads_while_its_members_are_known_and_is_expired_after() {
    let before = fleet(3);
    let rosters = Rosters::default();
    let roster = rosters.current(&strs(&before));
    let c = composite(&[("m0000", "5"), ("m0001", "6"), ("m0002", "7")]);
    let token = encode(&c, &roster);

    // Another replica, or this gateway restarted, with the same members reads it.
    let restarted = Rosters::default();
    restarted.current(&strs(&before));
    assert_eq!(decode(&token, &restarted), Ok(c.clone()));

    // m0001 left and m0003 joined: the token still says what it said (mrv1.'s meaning: the
    // caller asks m0003 from now, or answers 410 for a watch, and no longer asks m0001).
    rosters.current(&["m0000", "m0002", "m0003"]);
    assert_eq!(decode(&token, &rosters), Ok(c.clone()));

    // Many changes later its roster is no longer held: Expired, never a guess.
    for i in 0..ROSTERS_KEPT {
        let changed = fleet(4 + i);
        rosters.current(&strs(&changed));
    }
    assert!(matches!(
        decode(&token, &rosters),
        Err(VersionError::Expired(_))
    ));
    // A gateway that never had these members: Expired too.
    let other = Rosters::default();
    other.current(&["m0000", "m0001", "m0003"]);
    assert!(matches!(
        decode(&token, &other),
        Err(VersionError::Expired(_))
    ));
}

#[test]
fn places_are_never_read_against_the_wrong_members() {
    // What a short name hash would risk (two names, one hash) cannot happen: places are read
    // only against the roster of the fingerprint, which covers every name and its bounds.
    assert_ne!(
        Roster::new(vec!["ab".into(), "c".into()]).fingerprint,
        Roster::new(vec!["a".into(), "bc".into()]).fingerprint
    );
    let rosters = Rosters::default();
    let roster = rosters.current(&["m1", "m2"]);
    let token = encode(&composite(&[("m1", "5"), ("m2", "6")]), &roster);
    // A fingerprint altered: no roster of it (Expired).
    let forged = token.replacen(&roster.fingerprint, "AAAAAAAAAAA", 1);
    assert!(matches!(
        decode(&forged, &rosters),
        Err(VersionError::Expired(_))
    ));
    // The count altered (3 for 2): not this roster's token (Expired), not read short.
    let body = &token[PREFIX.len() + FINGERPRINT_CHARS..];
    let recounted = format!("{PREFIX}{}D{}", roster.fingerprint, &body[1..]);
    assert!(matches!(
        decode(&recounted, &rosters),
        Err(VersionError::Expired(_))
    ));
    // Cut short, or with more after its end: not a token.
    for broken in [
        &token[..token.len() - 1],
        &format!("{token}A"),
        &format!("{token}="),
    ] {
        assert!(
            matches!(decode(broken, &rosters), Err(VersionError::Bad(_))),
            "{broken}"
        );
    }
    // A number past 64 bits.
    let huge = format!("{PREFIX}{}C{}A", roster.fingerprint, "_".repeat(14));
    assert!(matches!(decode(&huge, &rosters), Err(VersionError::Bad(_))));
}

#[test]
fn a_live_token_is_the_whole_encoding_after_every_change() {
    // 300 members (several blocks), versions changing length up and down, members joining
    // the composite, one the roster lacks, and versions that are text.
    let names = fleet(300);
    let rosters = Rosters::default();
    let roster = rosters.current(&strs(&names));
    let mut live = Live::new(composite(&[("m0002", "9")]), roster.clone());
    let mut seed = 7u64;
    for step in 0..3000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let member = match step % 97 {
            0 => "zz-not-in-roster".to_string(),
            _ => names[(seed >> 33) as usize % names.len()].clone(),
        };
        let rv = match step % 11 {
            0 => format!("v{}", seed % 1000),
            _ => ((seed >> 13) % 10u64.pow((step % 9) as u32 + 1)).to_string(),
        };
        live.set(&member, &rv);
        let whole = encode(live.composite(), &roster);
        assert_eq!(live.token(), whole, "step {step}");
        assert_eq!(decode(&whole, &rosters).as_ref(), Ok(live.composite()));
    }
}
