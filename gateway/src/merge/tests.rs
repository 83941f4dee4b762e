use super::*;

/// The gateway's rosters holding `names`, and that roster.
fn roster(names: &[&str]) -> (Rosters, std::sync::Arc<Roster>) {
    let rosters = Rosters::default();
    let roster = rosters.current(names);
    (rosters, roster)
}

fn pod(ns: &str, name: &str, rv: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}})
}

#[test]
fn equal_states_encode_equally_and_tokens_round_trip() {
    let mut a = Composite::default();
    a.set("m3", "7");
    a.set("m1", "5");
    let mut b = Composite::default();
    b.set("m1", "5");
    b.set("m3", "7");
    let (rosters, r) = roster(&["m1", "m2", "m3"]);
    assert_eq!(a.encode(&r), b.encode(&r));
    assert_eq!(Composite::decode(&a.encode(&r), &rosters), Ok(a.clone()));
    let c = Continue {
        list: "id".into(),
        cluster: "m3".into(),
        member: "abc".into(),
    };
    assert_eq!(Continue::decode(&c.encode()), Ok(c));
    // An earlier gateway's token (every version inside) is known for one.
    assert!(Continue::is_old("mct1.eyJjbHVzdGVyIjoibTMifQ"));
    assert!(Continue::decode("mct1.eyJjbHVzdGVyIjoibTMifQ").is_err());
}

#[test]
fn tokens_of_others_are_refused() {
    let (rosters, _) = roster(&["m1"]);
    for bad in [
        "12345",
        "mrv1.!!",
        "mrv1.bm90IGpzb24",
        "mct2.e30",
        "mrv2.",
        "mrv2.!!",
    ] {
        let rv = Composite::decode(bad, &rosters);
        let ct = Continue::decode(bad);
        assert!(rv.is_err() || ct.is_err(), "{bad}");
    }
    assert!(Composite::decode("12345", &rosters).is_err());
    // A continue token is not a resourceVersion, nor the reverse.
    let c = Continue::default().encode();
    assert!(Composite::decode(&c, &rosters).is_err());
}

#[test]
fn a_member_is_asked_for_its_own_version() {
    let mut c = Composite::default();
    c.set("m1", "5");
    let c = Some(c);
    assert_eq!(Composite::for_member(Some("x"), &c, "m1"), Some("5"));
    assert_eq!(Composite::for_member(Some("x"), &c, "m2"), None);
    assert_eq!(Composite::for_member(Some("0"), &None, "m2"), Some("0"));
}

#[test]
fn watch_events_carry_the_composite_after_their_own_change() {
    let (rosters, r) = roster(&["m1", "m2", "m3"]);
    let mut composite = Composite::default();
    composite.set("m1", "5");
    let mut composite = Live::new(composite, r.clone());
    let event = json!({"type": "ADDED", "object": pod("shop", "web", "12")});
    let out = fleet_event(event, "m3", &mut composite);
    assert_eq!(composite.composite().0["m3"], "12");
    assert_eq!(
        out["object"]["metadata"]["resourceVersion"],
        composite.composite().encode(&r)
    );
    assert_eq!(
        out["object"]["metadata"]["annotations"][CLUSTER_ANNOTATION],
        "m3"
    );
    // Resuming from it asks m1 for 5 and m3 for 12.
    let resumed = Some(
        Composite::decode(
            out["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap(),
            &rosters,
        )
        .unwrap(),
    );
    assert_eq!(Composite::for_member(None, &resumed, "m3"), Some("12"));
    assert_eq!(Composite::for_member(None, &resumed, "m1"), Some("5"));
    // A bookmark moves the version without a mark; an error passes untouched.
    let bookmark = json!({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "15"}}});
    let out = fleet_event(bookmark, "m1", &mut composite);
    assert_eq!(composite.composite().0["m1"], "15");
    assert!(out["object"]["metadata"]["annotations"].is_null());
    let error = json!({"type": "ERROR", "object": status(410, "Expired", "too old")});
    assert_eq!(fleet_event(error.clone(), "m1", &mut composite), error);
}

#[test]
fn the_initial_events_end_is_recognised_and_made() {
    let (_, r) = roster(&["m1"]);
    let mut live = Live::new(Composite::default(), r);
    let end = initial_events_end(&json!("Pod"), &json!("v1"), &mut live);
    assert!(ends_initial_events(&end));
    assert!(!ends_initial_events(
        &json!({"type": "BOOKMARK", "object": {"metadata": {}}})
    ));
}

#[test]
fn a_requested_version_is_a_composite_only_when_it_says_so() {
    let (rosters, r) = roster(&["m1"]);
    let mut c = Composite::default();
    c.set("m1", "5");
    assert_eq!(
        Composite::requested(Some(&c.encode(&r)), &rosters),
        Ok(Some(c))
    );
    for passed_on in [None, Some("0"), Some(""), Some("12345")] {
        assert_eq!(
            Composite::requested(passed_on, &rosters),
            Ok(None),
            "{passed_on:?}"
        );
    }
    assert!(Composite::requested(Some("mrv1.!!"), &rosters).is_err());
    assert!(Composite::requested(Some("mrv2.!!"), &rosters).is_err());
}
