use super::*;

fn event(resource: &'static str, phase: Phase, key: &str, object: &str) -> Item {
    Item {
        resource,
        phase,
        key: key.into(),
        object: Bytes::copy_from_slice(object.as_bytes()),
    }
}

fn apply(key: &str, object: &str) -> Item {
    event("services", Phase::Apply, key, object)
}

/// A complete list of services holding `objects` (key, JSON).
fn listed(objects: &[(&str, &str)]) -> Vec<Item> {
    let mut events = vec![Item::marker("services", Phase::Init)];
    events.extend(
        objects
            .iter()
            .map(|(k, o)| event("services", Phase::InitApply, k, o)),
    );
    events.push(Item::marker("services", Phase::InitDone));
    events
}

fn publish_all(fanout: &mut Fanout, events: Vec<Item>) {
    for e in events {
        fanout.publish(e);
    }
}

/// `(phase, key, object)` of each event, to compare sequences at a glance.
fn seen(events: &[Item]) -> Vec<(Phase, String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e.phase,
                e.key.clone(),
                String::from_utf8_lossy(&e.object).into_owned(),
            )
        })
        .collect()
}

#[test]
fn a_stream_that_subscribes_late_gets_the_state_as_a_list_then_only_the_events_after_it() {
    let mut fanout = Fanout::new(16);
    let early = fanout.subscribe();
    publish_all(
        &mut fanout,
        listed(&[("shop/web", "web v1"), ("shop/db", "db v1")]),
    );
    fanout.publish(apply("shop/web", "web v2"));
    fanout.publish(event("services", Phase::Delete, "shop/db", "db v1"));

    let late = fanout.subscribe();
    let first = fanout.take(late);
    assert!(first.snapshot);
    assert_eq!(
        seen(&first.events),
        seen(&listed(&[("shop/web", "web v2")])),
        "the state now, not its history"
    );
    fanout.publish(apply("shop/api", "api v1"));
    let next = fanout.take(late);
    assert!(!next.snapshot);
    assert_eq!(seen(&next.events), seen(&[apply("shop/api", "api v1")]));
    assert_eq!(fanout.take(late), Taken::default(), "nothing twice");

    // The early stream was given the snapshot at its first take too (nothing then), and
    // every event since.
    let all = fanout.take(early);
    assert!(
        all.snapshot,
        "a new stream starts with the state however early it came"
    );
    assert_eq!(
        seen(&all.events),
        seen(&listed(&[("shop/api", "api v1"), ("shop/web", "web v2")]))
    );
}

#[test]
fn a_stream_subscribing_during_a_list_gets_what_the_list_brought_and_the_list_completes_live() {
    let mut fanout = Fanout::new(16);
    publish_all(&mut fanout, listed(&[("shop/old", "old")]));
    // A relist (the watch's resourceVersion expired) is under way.
    fanout.publish(Item::marker("services", Phase::Init));
    fanout.publish(event("services", Phase::InitApply, "shop/web", "web"));
    let late = fanout.subscribe();
    assert_eq!(
        seen(&fanout.take(late).events),
        seen(&[
            Item::marker("services", Phase::Init),
            event("services", Phase::InitApply, "shop/web", "web"),
        ]),
        "no InitDone yet: the hub must not replace the member's services with half a list"
    );
    fanout.publish(Item::marker("services", Phase::InitDone));
    assert_eq!(
        seen(&fanout.take(late).events),
        seen(&[Item::marker("services", Phase::InitDone)])
    );
    assert_eq!(
        seen(&fanout.snapshot()),
        seen(&listed(&[("shop/web", "web")])),
        "the relist replaced the old objects"
    );
}

#[test]
fn resources_never_listed_are_left_out_of_the_snapshot_and_each_listed_one_is_whole() {
    let mut fanout = Fanout::new(16);
    publish_all(&mut fanout, listed(&[("shop/web", "web")]));
    fanout.publish(Item::marker("nodes", Phase::Init));
    fanout.publish(Item::marker("nodes", Phase::InitDone));
    let resources: Vec<(&str, Phase)> = fanout
        .snapshot()
        .iter()
        .map(|e| (e.resource, e.phase))
        .collect();
    assert_eq!(
        resources,
        [
            ("nodes", Phase::Init),
            ("nodes", Phase::InitDone),
            ("services", Phase::Init),
            ("services", Phase::InitApply),
            ("services", Phase::InitDone),
        ]
    );
    assert_eq!(fanout.objects(), 1);
}

#[test]
fn a_stalled_stream_holds_at_most_its_bound_and_the_others_get_every_event() {
    let mut fanout = Fanout::new(4);
    publish_all(&mut fanout, listed(&[]));
    let (reading, stalled) = (fanout.subscribe(), fanout.subscribe());
    fanout.take(reading);
    fanout.take(stalled);
    let mut got = Vec::new();
    let mut fell_behind = Vec::new();
    for i in 0..100 {
        fell_behind.extend(fanout.publish(apply("shop/web", &format!("web v{i}"))));
        assert!(fanout.waiting(stalled) <= 4, "after event {i}");
        if i % 3 == 0 {
            got.extend(fanout.take(reading).events);
        }
    }
    got.extend(fanout.take(reading).events);
    assert_eq!(got.len(), 100, "the reading stream missed nothing");
    assert_eq!(
        fell_behind,
        [stalled],
        "the stalled one fell behind once, then waits"
    );
    assert_eq!(fanout.waiting(stalled), 0, "its queue was let go");

    // When it reads again it is given the state, not the 100 events it missed.
    let caught_up = fanout.take(stalled);
    assert!(caught_up.snapshot);
    assert_eq!(
        seen(&caught_up.events),
        seen(&listed(&[("shop/web", "web v99")]))
    );
    fanout.publish(apply("shop/web", "web v100"));
    assert_eq!(
        seen(&fanout.take(stalled).events),
        seen(&[apply("shop/web", "web v100")]),
        "then live again"
    );
}

#[test]
fn a_stream_that_is_gone_is_given_nothing_and_queues_nothing() {
    let mut fanout = Fanout::new(4);
    let gone = fanout.subscribe();
    fanout.unsubscribe(gone);
    fanout.publish(apply("shop/web", "web"));
    assert_eq!(fanout.take(gone), Taken::default());
    assert_eq!(fanout.streams(), 0);
}
