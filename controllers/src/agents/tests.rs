//! AgentLink fed with synthetic streams: relists on a new stream, stale streams, heartbeats
//! held until the relist is in, silence and closed streams on a fake clock.

use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;
use crate::kubernetes::state::MemberEvent;

const BEAT: Duration = Duration::from_secs(5);

fn service(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap()
}

fn opened() -> Inbound {
    Inbound::Opened(Connection {
        peer: "127.0.0.1:5555".into(),
        certificate_expires: None,
    })
}

fn ready() -> Inbound {
    Inbound::Heartbeat {
        member_ready: true,
        error: String::new(),
        watch_failure: String::new(),
    }
}

/// A whole relist of the four kinds the Index needs, with `services`.
fn relist(services: &[&str]) -> Vec<Inbound> {
    let mut out = vec![Inbound::Event(Box::new(MemberEvent::Service(Event::Init)))];
    for name in services {
        out.push(Inbound::Event(Box::new(MemberEvent::Service(
            Event::InitApply(service(name)),
        ))));
    }
    out.push(Inbound::Event(Box::new(MemberEvent::Service(
        Event::InitDone,
    ))));
    out.push(Inbound::Event(Box::new(MemberEvent::Slice(Event::Init))));
    out.push(Inbound::Event(Box::new(MemberEvent::Slice(
        Event::InitDone,
    ))));
    out.push(Inbound::Event(Box::new(MemberEvent::Export(Event::Init))));
    out.push(Inbound::Event(Box::new(MemberEvent::Export(
        Event::InitDone,
    ))));
    out.push(Inbound::Event(Box::new(MemberEvent::Import(Event::Init))));
    out.push(Inbound::Event(Box::new(MemberEvent::Import(
        Event::InitDone,
    ))));
    out
}

fn feed(link: &mut AgentLink, stream: u64, items: Vec<Inbound>, now: Instant) -> Vec<SourceEvent> {
    let mut events: Vec<SourceEvent> = items
        .into_iter()
        .flat_map(|i| link.receive(stream, i, now))
        .collect();
    events.extend(link.flush());
    events
}

fn service_names(event: &SourceEvent) -> Vec<String> {
    match event {
        SourceEvent::Reset { objects, .. } => objects
            .services
            .iter()
            .map(|(k, _)| k.name.to_string())
            .collect(),
        other => panic!("not a Reset: {other:?}"),
    }
}

fn heartbeat(event: &SourceEvent) -> Result<(), String> {
    match event {
        SourceEvent::Heartbeat { result, .. } => result.clone(),
        other => panic!("not a Heartbeat: {other:?}"),
    }
}

fn link() -> AgentLink {
    AgentLink::new(ClusterId::new("edge-1"), BEAT)
}

#[test]
fn a_heartbeat_before_the_relist_is_held_and_sent_with_the_reset() {
    let mut l = link();
    let t = Instant::now();
    assert!(feed(&mut l, 1, vec![opened(), ready()], t).is_empty());
    let mut items = relist(&["cart"]);
    items.truncate(5); // services and slices listed, exports and imports not yet
    assert!(
        feed(&mut l, 1, items, t).is_empty(),
        "half a relist reaches nobody"
    );
    let rest: Vec<Inbound> = relist(&["cart"]).into_iter().skip(5).collect();
    let events = feed(&mut l, 1, rest, t);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(service_names(&events[0]), ["cart"]);
    assert_eq!(heartbeat(&events[1]), Ok(()));
    let later = feed(&mut l, 1, vec![ready()], t);
    assert_eq!(
        heartbeat(&later[0]),
        Ok(()),
        "after the relist, heartbeats pass at once"
    );
}

#[test]
fn a_renewal_replaces_the_certificate_the_stream_opened_with() {
    let mut l = link();
    let t = Instant::now();
    let expires = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
    let opened_with = Inbound::Opened(Connection {
        peer: "127.0.0.1:5555".into(),
        certificate_expires: Some(expires(1_000)),
    });
    feed(&mut l, 1, vec![opened_with], t);
    let renewed = |s| Inbound::Renewed {
        certificate_expires: expires(s),
    };
    assert!(feed(&mut l, 1, vec![renewed(1_060)], t).is_empty());
    assert_eq!(l.facts().unwrap().certificate_expires, Some(expires(1_060)));
    // A renewal told for a stream since replaced says nothing of the new one's.
    feed(&mut l, 2, vec![opened()], t);
    feed(&mut l, 1, vec![renewed(1_120)], t);
    assert_eq!(l.facts().unwrap().certificate_expires, None);
}

#[test]
fn a_new_stream_relists_and_the_old_streams_leftovers_are_dropped() {
    let mut l = link();
    let t = Instant::now();
    let mut first = vec![opened()];
    first.extend(relist(&["cart", "pay"]));
    assert_eq!(
        service_names(&feed(&mut l, 1, first, t)[0]),
        ["cart", "pay"]
    );
    // The agent reconnected before the hub saw stream 1 end.
    assert!(feed(&mut l, 2, vec![opened()], t).is_empty());
    let stale = vec![
        Inbound::Event(Box::new(MemberEvent::Service(Event::Delete(service(
            "cart",
        ))))),
        Inbound::Closed,
    ];
    assert!(
        feed(&mut l, 1, stale, t).is_empty(),
        "stream 1 was replaced: its delete and close count for nothing"
    );
    let events = feed(&mut l, 2, relist(&["pay", "shipping"]), t);
    assert_eq!(
        service_names(&events[0]),
        ["pay", "shipping"],
        "one Reset replaces all"
    );
}

#[test]
fn a_member_the_agent_cannot_reach_fails_its_heartbeat_with_the_agents_reason() {
    let mut l = link();
    let t = Instant::now();
    let mut items = vec![opened()];
    items.extend(relist(&[]));
    feed(&mut l, 1, items, t);
    let down = Inbound::Heartbeat {
        member_ready: false,
        error: "/readyz: connection refused".into(),
        watch_failure: "watch services: 500".into(),
    };
    let events = feed(&mut l, 1, vec![down], t);
    assert!(
        matches!(&events[0], SourceEvent::WatchHealth { failure: Some(f), .. } if f == "watch services: 500"),
        "{events:?}"
    );
    let reason = heartbeat(&events[1]).unwrap_err();
    assert!(reason.contains("connection refused"), "{reason}");
    let back = feed(&mut l, 1, vec![ready()], t);
    assert!(matches!(
        &back[0],
        SourceEvent::WatchHealth { failure: None, .. }
    ));
    assert_eq!(heartbeat(&back[1]), Ok(()));
}

#[test]
fn silence_closed_streams_and_no_agent_at_all_fail_the_heartbeat_on_the_clock() {
    let mut l = link();
    let t = Instant::now();
    let never = heartbeat(&l.tick(t)[0]).unwrap_err();
    assert!(never.contains("no agent has connected"), "{never}");
    let mut items = vec![opened(), ready()];
    items.extend(relist(&["cart"]));
    feed(&mut l, 1, items, t);
    assert!(l.tick(t + BEAT).is_empty(), "one missed beat is no failure");
    let silent = heartbeat(&l.tick(t + BEAT * 3)[0]).unwrap_err();
    assert!(
        silent.contains("no heartbeat from the agent for 15s"),
        "{silent}"
    );
    feed(&mut l, 1, vec![ready()], t + BEAT * 3);
    assert!(l.tick(t + BEAT * 4).is_empty());
    let closed = feed(&mut l, 1, vec![Inbound::Closed], t + BEAT * 4);
    assert_eq!(
        heartbeat(&closed[0]),
        Err("the agent's stream closed".into())
    );
    assert!(heartbeat(&l.tick(t + BEAT * 5)[0]).is_err());
    let facts = l.facts().expect("an agent connected once");
    assert!(!facts.connected);
    assert_eq!(facts.peer, "127.0.0.1:5555");
}

#[test]
fn a_reconnect_keeps_serving_the_last_objects_until_the_new_list_is_in() {
    let mut l = link();
    let t = Instant::now();
    let mut items = vec![opened(), ready()];
    items.extend(relist(&["cart"]));
    feed(&mut l, 1, items, t);
    feed(&mut l, 1, vec![Inbound::Closed], t);
    // Back: heartbeats are held (the member is not healthy again) until the relist is in.
    assert!(feed(&mut l, 2, vec![opened(), ready()], t).is_empty());
    let events = feed(&mut l, 2, relist(&["cart"]), t);
    assert_eq!(service_names(&events[0]), ["cart"]);
    assert_eq!(heartbeat(&events[1]), Ok(()));
}

#[tokio::test]
async fn routes_reach_the_registered_task_and_refuse_other_clusters() {
    let routes = AgentRoutes::default();
    let edge = ClusterId::new("edge-1");
    let mut registration = routes.register(&edge, BEAT);
    let connection = Connection {
        peer: "p".into(),
        certificate_expires: None,
    };
    let refused = routes
        .open(&ClusterId::new("edge-2"), connection.clone())
        .await
        .err()
        .expect("no task for edge-2");
    assert!(
        refused.to_string().contains("no MemberCluster edge-2"),
        "{refused}"
    );
    let stream = routes.open(&edge, connection).await.unwrap();
    assert_eq!(stream.heartbeat, BEAT);
    assert!(matches!(
        registration.rx.recv().await,
        Some((_, Inbound::Opened(_)))
    ));
    drop(stream);
    assert!(matches!(
        registration.rx.recv().await,
        Some((_, Inbound::Closed))
    ));
    // A restarted task replaces the route; the old registration's end leaves it in place.
    let newer = routes.register(&edge, BEAT);
    drop(registration);
    assert_eq!(routes.members(), std::slice::from_ref(&edge));
    drop(newer);
    assert!(routes.members().is_empty());
}
