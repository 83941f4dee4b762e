use std::time::{Duration, SystemTime};

use super::*;

const HOUR: Duration = Duration::from_secs(3600);

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
}

fn token(cluster: &str, expires: SystemTime) -> BootstrapToken {
    BootstrapToken {
        id: "abc123".into(),
        secret: "0123456789abcdef".into(),
        cluster: ClusterId::new(cluster),
        expires,
        used: false,
        request: None,
        approved: false,
    }
}

const KEY: &str = "5f1c";

/// Admits as a hub with automatic approval does, with the key [`KEY`].
fn admit_now(
    tokens: &mut Tokens,
    presented: &str,
    cluster: &ClusterId,
    now: SystemTime,
) -> Result<Admitted, JoinRefused> {
    tokens.admit(presented, cluster, KEY, Approval::Automatic, now)
}

#[test]
fn a_token_admits_its_own_cluster_once_before_it_expires() {
    let eu = ClusterId::new("eu-1");
    let mut tokens = Tokens::new([token("eu-1", at(3600))]);
    let Admitted::Sign(admitted) =
        admit_now(&mut tokens, "abc123.0123456789abcdef", &eu, at(10)).unwrap()
    else {
        panic!("automatic approval signs at once")
    };
    assert_eq!(admitted.cluster, eu);
    assert!(admitted.used);
    assert_eq!(
        admit_now(&mut tokens, "abc123.0123456789abcdef", &eu, at(11)),
        Err(JoinRefused::Used("abc123".into()))
    );
}

#[test]
fn a_wrong_secret_another_cluster_expiry_and_garbage_are_refused_and_spend_nothing() {
    let eu = ClusterId::new("eu-1");
    let us = ClusterId::new("us-1");
    let mut tokens = Tokens::new([token("eu-1", at(3600))]);
    assert_eq!(
        admit_now(&mut tokens, "abc123.0123456789abcdeX", &eu, at(10)),
        Err(JoinRefused::Malformed)
    );
    assert_eq!(
        admit_now(&mut tokens, "abc123.0123456789abcdee", &eu, at(10)),
        Err(JoinRefused::Secret("abc123".into()))
    );
    assert_eq!(
        admit_now(&mut tokens, "zzz999.0123456789abcdef", &eu, at(10)),
        Err(JoinRefused::Unknown("zzz999".into()))
    );
    assert!(matches!(
        admit_now(&mut tokens, "abc123.0123456789abcdef", &us, at(10)),
        Err(JoinRefused::OtherCluster { .. })
    ));
    assert_eq!(
        admit_now(&mut tokens, "abc123.0123456789abcdef", &eu, at(3600)),
        Err(JoinRefused::Expired("abc123".into()))
    );
    for garbage in [
        "",
        ".",
        "abc123",
        "abc123.",
        "ABC123.0123456789abcdef",
        "abc123.0123456789abcdef.x",
    ] {
        assert_eq!(
            admit_now(&mut tokens, garbage, &eu, at(10)),
            Err(JoinRefused::Malformed),
            "{garbage:?}"
        );
    }
    // None of those spent it.
    assert!(admit_now(&mut tokens, "abc123.0123456789abcdef", &eu, at(10)).is_ok());
    assert_eq!(tokens.expired(at(3599)).count(), 0);
    assert_eq!(tokens.expired(at(3600)).count(), 1);
}

#[test]
fn a_new_token_has_the_form_it_is_checked_against_and_never_shows_its_secret() {
    let random: Vec<u8> = (0u8..22).map(|b| b.wrapping_mul(37)).collect();
    let t = new_token(ClusterId::new("edge-7"), at(HOUR.as_secs()), &random);
    let presented = t.presented();
    let mut tokens = Tokens::new([t.clone()]);
    assert!(
        admit_now(&mut tokens, &presented, &ClusterId::new("edge-7"), at(0)).is_ok(),
        "{presented}"
    );
    assert!(!t.to_string().contains(&t.secret), "{t}");
}

#[test]
fn a_certificate_speaks_for_the_cluster_its_subject_names_only() {
    let eu = ClusterId::new("eu-1");
    assert_eq!(agent_subject(&eu), "meridian:agent:eu-1");
    assert_eq!(cluster_of_subject("meridian:agent:eu-1"), Some(eu.clone()));
    for not_an_agent in [
        "meridian:agent:",
        "meridian:agent:EU",
        "meridian:agent:-x",
        "meridian:agent:a/b",
        "system:admin",
        "meridian:agenteu-1",
    ] {
        assert_eq!(cluster_of_subject(not_an_agent), None, "{not_an_agent}");
    }
    assert!(check_sender(&eu, &eu).is_ok());
    let e = check_sender(&eu, &ClusterId::new("us-1")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a certificate for cluster eu-1 sent objects of cluster us-1"
    );
}

#[test]
fn renewal_falls_when_a_fifth_to_a_quarter_of_the_lifetime_remains() {
    // A 60-second certificate (the end-to-end test's), signed at 60 and so valid from 0 (the
    // backdate) to 120: renewed 45 to 48 s after its signing.
    let (from, until) = (at(0), at(120));
    assert_eq!(renew_at(from, until, 0.0), at(105));
    assert_eq!(renew_at(from, until, 1.0), at(108));
    let middle = renew_at(from, until, 0.5);
    assert!(middle > at(105) && middle < at(108));
    // Out-of-range jitter is clamped; a certificate that ends before it starts (or before the
    // backdate has passed) renews at once.
    assert_eq!(renew_at(from, until, 7.0), at(108));
    assert_eq!(renew_at(until, from, 0.5), from);
    assert_eq!(renew_at(at(0), at(30), 0.5), at(30));
}

#[test]
fn with_approval_by_the_operator_the_first_key_waits_and_only_it_is_signed_once_approved() {
    let eu = ClusterId::new("eu-1");
    let presented = "abc123.0123456789abcdef";
    let mut tokens = Tokens::new([token("eu-1", at(3600))]);
    let by_operator = Approval::ByOperator;
    // Nothing asked yet: nothing to approve.
    assert_eq!(
        tokens.approve(&eu, at(5)),
        Err(NothingToApprove(eu.clone()))
    );
    // The first attempt records its key, the next ones wait without recording again.
    let Ok(Admitted::Pending {
        token: asked,
        recorded: true,
    }) = tokens.admit(presented, &eu, "k1", by_operator, at(10))
    else {
        panic!("the first join waits and is recorded")
    };
    assert_eq!(
        asked.request,
        Some(KeyRequest {
            key: "k1".into(),
            at: at(10)
        })
    );
    assert!(matches!(
        tokens.admit(presented, &eu, "k1", by_operator, at(20)),
        Ok(Admitted::Pending {
            recorded: false,
            ..
        })
    ));
    assert_eq!(tokens.pending(at(20)).len(), 1);
    // Another key holding the same token cannot take the place of the first.
    assert_eq!(
        tokens.admit(presented, &eu, "k2", by_operator, at(21)),
        Err(JoinRefused::OtherKey("abc123".into()))
    );
    // Approval for another cluster approves nothing here.
    assert!(tokens.approve(&ClusterId::new("us-1"), at(25)).is_err());
    let approved = tokens.approve(&eu, at(30)).unwrap();
    assert_eq!(approved.len(), 1);
    assert!(approved[0].approved && !approved[0].used);
    assert!(tokens.pending(at(30)).is_empty());
    // Still only the approved key; it is signed once.
    assert_eq!(
        tokens.admit(presented, &eu, "k2", by_operator, at(31)),
        Err(JoinRefused::OtherKey("abc123".into()))
    );
    assert!(matches!(
        tokens.admit(presented, &eu, "k1", by_operator, at(32)),
        Ok(Admitted::Sign(t)) if t.used
    ));
    assert_eq!(
        tokens.admit(presented, &eu, "k1", by_operator, at(33)),
        Err(JoinRefused::Used("abc123".into()))
    );
}

#[test]
fn an_expired_request_is_neither_approved_nor_signed() {
    let eu = ClusterId::new("eu-1");
    let presented = "abc123.0123456789abcdef";
    let mut tokens = Tokens::new([token("eu-1", at(100))]);
    assert!(matches!(
        tokens.admit(presented, &eu, "k1", Approval::ByOperator, at(10)),
        Ok(Admitted::Pending { .. })
    ));
    assert!(tokens.pending(at(100)).is_empty());
    assert!(tokens.approve(&eu, at(100)).is_err());
    assert_eq!(
        tokens.admit(presented, &eu, "k1", Approval::ByOperator, at(100)),
        Err(JoinRefused::Expired("abc123".into()))
    );
}
