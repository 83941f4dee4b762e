use super::*;

fn versions(pairs: &[(&str, &str)]) -> Composite {
    let mut c = Composite::default();
    for (k, v) in pairs {
        c.set(k, v);
    }
    c
}

fn token(list: &str, cluster: &str, member: &str) -> Continue {
    Continue {
        list: list.into(),
        cluster: cluster.into(),
        member: member.into(),
    }
}

const PATH: &str = "/api/v1/configmaps";

#[test]
fn a_token_resumes_with_the_members_done_before_it() {
    let lists = Lists::new(LIST_IDLE, LISTS_BYTES);
    let now = Instant::now();
    let id = lists
        .record(None, PATH, &versions(&[("m1", "10"), ("m2", "20")]), now)
        .unwrap();
    // m2's first page was listed: its own token goes on from its version.
    assert_eq!(
        lists.resume(&token(&id, "m2", "tok"), PATH, now),
        Ok(versions(&[("m1", "10"), ("m2", "20")]))
    );
    // m3 starts afresh: m1 and m2 are done.
    let id2 = lists
        .record(Some(&id), PATH, &versions(&[("m3", "30")]), now)
        .unwrap();
    assert_eq!(id2, id);
    assert_eq!(
        lists.resume(&token(&id, "m3", ""), PATH, now),
        Ok(versions(&[("m1", "10"), ("m2", "20")]))
    );
    // An earlier token, used again (a retry), sees only what was done when it was issued.
    assert_eq!(
        lists.resume(&token(&id, "m2", ""), PATH, now),
        Ok(versions(&[("m1", "10")]))
    );
    assert_eq!(lists.len(), 1);
}

#[test]
fn a_list_idle_too_long_or_unknown_is_expired() {
    let lists = Lists::new(Duration::from_secs(10), LISTS_BYTES);
    let now = Instant::now();
    let id = lists
        .record(None, PATH, &versions(&[("m1", "1")]), now)
        .unwrap();
    let later = now + Duration::from_secs(11);
    assert_eq!(
        lists.resume(&token(&id, "m2", ""), PATH, later),
        Err(ResumeError::Expired)
    );
    assert_eq!(
        lists.resume(&token("not-issued", "m2", ""), PATH, now),
        Err(ResumeError::Expired)
    );
    // Using a list keeps it: idle time counts from its last page.
    let id = lists
        .record(None, PATH, &versions(&[("m1", "1")]), now)
        .unwrap();
    let t = token(&id, "m2", "");
    assert!(lists.resume(&t, PATH, now + Duration::from_secs(8)).is_ok());
    assert!(
        lists
            .resume(&t, PATH, now + Duration::from_secs(16))
            .is_ok()
    );
}

#[test]
fn a_token_does_not_go_on_with_another_collection() {
    let lists = Lists::new(LIST_IDLE, LISTS_BYTES);
    let now = Instant::now();
    let id = lists
        .record(None, PATH, &Composite::default(), now)
        .unwrap();
    assert!(matches!(
        lists.resume(&token(&id, "m1", ""), "/api/v1/secrets", now),
        Err(ResumeError::OtherList(_))
    ));
}

#[test]
fn held_lists_are_bounded_by_bytes_the_least_recently_used_going_first() {
    let fleet: Vec<(String, String)> = (0..1000)
        .map(|i| (format!("member-{i:04}"), format!("{}", 1_000_000 + i)))
        .collect();
    let big = Composite(fleet.into_iter().collect());
    let one = {
        let lists = Lists::new(LIST_IDLE, usize::MAX);
        lists.record(None, PATH, &big, Instant::now()).unwrap();
        lists.held.lock().bytes
    };
    let lists = Lists::new(LIST_IDLE, one * 3);
    let t0 = Instant::now();
    let ids: Vec<String> = (0..5)
        .map(|i| {
            lists
                .record(None, PATH, &big, t0 + Duration::from_secs(i))
                .unwrap()
        })
        .collect();
    assert_eq!(lists.len(), 3);
    assert!(lists.held.lock().bytes <= one * 3);
    let now = t0 + Duration::from_secs(5);
    for (i, id) in ids.iter().enumerate() {
        let resumed = lists.resume(&token(id, "zz", ""), PATH, now);
        assert_eq!(resumed.is_ok(), i >= 2, "list {i}");
    }
}

#[test]
fn a_token_stays_small_at_a_thousand_members() {
    let lists = Lists::new(LIST_IDLE, LISTS_BYTES);
    let big = Composite(
        (0..1000)
            .map(|i| (format!("member-{i:04}"), format!("{}", 1_000_000 + i)))
            .collect(),
    );
    let id = lists.record(None, PATH, &big, Instant::now()).unwrap();
    // A member's own token: base64 of its key and revision (kube-apiserver's shape).
    let member_token = URL_SAFE_NO_PAD.encode(
        br#"{"v":"meta.k8s.io/v1","rv":1234567,"start":"a-rather-long-namespace-name/and-a-rather-long-object-name-too\u0000"}"#,
    );
    let encoded = token(&id, "member-0999", &member_token).encode();
    assert!(encoded.len() < 512, "{} bytes", encoded.len());
    assert_eq!(
        Continue::decode(&encoded),
        Ok(token(&id, "member-0999", &member_token))
    );
}
