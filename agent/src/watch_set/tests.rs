use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;
use meridian_controllers::kubernetes::member::WatchError;
use meridian_controllers::kubernetes::state::MemberEvent;

use super::*;
use crate::proto::Phase;

fn web(version: usize) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            resource_version: Some(version.to_string()),
            ..ObjectMeta::default()
        },
        ..Service::default()
    }
}

fn watched(set: &WatchSet, event: Event<Service>) {
    set.watched(Ok(MemberEvent::Service(event)));
}

#[tokio::test]
async fn a_stalled_stream_does_not_delay_the_others_and_holds_no_more_than_its_bound() {
    let side = AgentSide::default();
    let set = WatchSet::with_bound(side.clone(), 8);
    watched(&set, Event::Init);
    watched(&set, Event::InitDone);
    let mut reading = set.subscribe();
    let mut stalled = set.subscribe();
    assert!(reading.next().await.snapshot);
    assert!(
        stalled.next().await.snapshot,
        "its first take; it reads no more for now"
    );

    let mut got = 0;
    for i in 0..1000 {
        watched(&set, Event::Apply(web(i)));
        // The reading stream has each event at once, whatever the stalled one does.
        let taken = tokio::time::timeout(Duration::from_secs(1), reading.next())
            .await
            .expect("the reading stream waited on the stalled one");
        got += taken.events.len();
        assert!(set.waiting(stalled.id) <= 8, "after event {i}");
    }
    assert_eq!(got, 1000);
    assert_eq!(side.resyncs.get(), 0);

    // The stalled stream, reading again at last, is given the state: one object, not the
    // 1000 events it missed.
    let caught_up = stalled.next().await;
    assert!(caught_up.snapshot);
    let phases: Vec<Phase> = caught_up.events.iter().map(|e| e.phase).collect();
    assert_eq!(phases, [Phase::Init, Phase::InitApply, Phase::InitDone]);
    let object = String::from_utf8_lossy(&caught_up.events[1].object).into_owned();
    assert!(object.contains(r#""resourceVersion":"999""#), "{object}");
    assert_eq!(
        side.resyncs.get(),
        1,
        "counted as a resync (the first snapshot is not one)"
    );
}

#[tokio::test]
async fn objects_are_kept_and_sent_without_their_managed_fields() {
    let set = WatchSet::new(AgentSide::default());
    let mut service = web(1);
    service.metadata.managed_fields = Some(vec![Default::default()]);
    watched(&set, Event::Init);
    watched(&set, Event::InitApply(service));
    watched(&set, Event::InitDone);
    let taken = set.subscribe().next().await;
    let json = String::from_utf8_lossy(&taken.events[1].object).into_owned();
    assert!(json.contains(r#""name":"web""#), "{json}");
    assert!(!json.contains("managedFields"), "{json}");
}

#[test]
fn a_failing_watch_is_reported_until_its_resource_is_heard_again_and_pods_degrade_nothing() {
    let set = WatchSet::new(AgentSide::default());
    let error = |kind| {
        Err(WatchError {
            kind,
            code: Some(403),
            message: "forbidden".into(),
        })
    };
    set.watched(error("pods"));
    assert_eq!(set.failure(), "");
    set.watched(error("services"));
    assert_eq!(set.failure(), "watch services: forbidden");
    watched(&set, Event::Init);
    assert_eq!(set.failure(), "");
}
