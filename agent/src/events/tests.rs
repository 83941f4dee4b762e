use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ObjectMeta;
use meridian_controllers::kubernetes::state::MemberState;
use meridian_core::ClusterId;

use super::*;

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        resource_version: Some("7".into()),
        ..ObjectMeta::default()
    }
}

fn roundtrip(event: MemberEvent) -> MemberEvent {
    let wire = encode(&event).unwrap();
    let bytes = prost::Message::encode_to_vec(&wire);
    decode(&<WatchEvent as prost::Message>::decode(bytes.as_slice()).unwrap()).unwrap()
}

#[test]
fn every_phase_comes_back_as_it_went_with_its_object() {
    let svc = Service {
        metadata: meta("web", Some("shop")),
        ..Service::default()
    };
    for event in [
        Event::Init,
        Event::InitApply(svc.clone()),
        Event::InitDone,
        Event::Apply(svc.clone()),
        Event::Delete(svc.clone()),
    ] {
        let expected = format!("{event:?}");
        match roundtrip(MemberEvent::Service(event)) {
            MemberEvent::Service(back) => assert_eq!(format!("{back:?}"), expected),
            other => panic!("came back as {}", other.resource()),
        }
    }
    let ns = Namespace {
        metadata: meta("shop", None),
        ..Namespace::default()
    };
    assert_eq!(
        roundtrip(MemberEvent::Namespace(Event::Apply(ns))).resource(),
        "namespaces"
    );
}

#[test]
fn what_the_hub_decodes_feeds_member_state_as_a_push_members_watches_do() {
    // A relist of services and slices sent by an agent, decoded on the hub: the member lists.
    let svc = Service {
        metadata: meta("web", Some("shop")),
        ..Service::default()
    };
    let slice = EndpointSlice {
        metadata: meta("web-1", Some("shop")),
        address_type: "IPv4".into(),
        ..EndpointSlice::default()
    };
    let mut state = MemberState::new(ClusterId::new("edge-1"));
    state.relist_all();
    let sent = [
        MemberEvent::Service(Event::Init),
        MemberEvent::Service(Event::InitApply(svc)),
        MemberEvent::Service(Event::InitDone),
        MemberEvent::Slice(Event::Init),
        MemberEvent::Slice(Event::InitApply(slice)),
        MemberEvent::Slice(Event::InitDone),
    ];
    for event in sent {
        state.apply(roundtrip(event));
    }
    let objects = state.objects();
    assert_eq!(objects.services.len(), 1, "{objects:?}");
}

#[test]
fn an_unknown_resource_or_phase_or_a_bad_object_is_an_error() {
    let wire = |resource: &str, phase: i32, json: &[u8]| WatchEvent {
        resource: resource.into(),
        phase,
        object_json: json.to_vec().into(),
    };
    assert!(matches!(
        decode(&wire("secrets", 0, b"{}")),
        Err(DecodeError::Resource(r)) if r == "secrets"
    ));
    assert!(matches!(
        decode(&wire("services", 9, b"{}")),
        Err(DecodeError::Phase(9))
    ));
    let bad = decode(&wire("services", Phase::Apply as i32, b"[1, 2]")).unwrap_err();
    assert!(bad.to_string().contains("services object"), "{bad}");
    // Init and InitDone carry no object, and need none.
    assert!(decode(&wire("nodes", Phase::Init as i32, b"")).is_ok());
}
