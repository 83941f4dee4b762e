//! Agents' streams over real gRPC and mutual TLS on loopback (`test_hub`): the certificate
//! from `Join` is the identity.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;

use super::*;
use crate::events::encode;
use crate::join::{Asking, join};
use crate::proto::{self, Heartbeat, RenewRequest, agent_message::Body};
use crate::test_hub::{Recorded, TestHub, next_where, serve};
use meridian_controllers::SourceEvent;
use meridian_controllers::kubernetes::state::MemberEvent;
use meridian_core::agent::Approval;

/// eu-1 joined: its certificate and key.
async fn joined_eu(hub: &TestHub) -> (String, String) {
    let joined = join(
        hub.channel(None).await,
        &Asking::new(&ClusterId::new("eu-1")).unwrap(),
        "euone1.0123456789abcdef",
    )
    .await
    .unwrap();
    (joined.certificate_pem, joined.key_pem)
}

fn service_event_object() -> MemberEvent {
    let svc = Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            ..ObjectMeta::default()
        },
        ..Service::default()
    };
    MemberEvent::Service(Event::Apply(svc))
}

fn heartbeat(cluster: &str) -> AgentMessage {
    AgentMessage {
        cluster: cluster.into(),
        body: Some(Body::Heartbeat(Heartbeat {
            member_ready: true,
            ..Heartbeat::default()
        })),
    }
}

fn wire(cluster: &str, event: MemberEvent) -> AgentMessage {
    AgentMessage {
        cluster: cluster.into(),
        body: Some(Body::Event(encode(&event).unwrap())),
    }
}

/// A full relist of `cluster` with one Service, shop/web.
fn relist(cluster: &str) -> Vec<AgentMessage> {
    let MemberEvent::Service(Event::Apply(web)) = service_event_object() else {
        unreachable!()
    };
    vec![
        wire(cluster, MemberEvent::Service(Event::Init)),
        wire(cluster, MemberEvent::Service(Event::InitApply(web))),
        wire(cluster, MemberEvent::Service(Event::InitDone)),
        wire(cluster, MemberEvent::Slice(Event::Init)),
        wire(cluster, MemberEvent::Slice(Event::InitDone)),
        wire(cluster, MemberEvent::Export(Event::Init)),
        wire(cluster, MemberEvent::Export(Event::InitDone)),
        wire(cluster, MemberEvent::Import(Event::Init)),
        wire(cluster, MemberEvent::Import(Event::InitDone)),
    ]
}

/// eu-1's agent joined and connected: what it sends up, what the hub sends down.
async fn connected_eu(
    hub: &TestHub,
) -> (
    tokio::sync::mpsc::Sender<AgentMessage>,
    tonic::Streaming<proto::HubMessage>,
) {
    let (cert, key) = joined_eu(hub).await;
    connected(hub, &cert, &key).await.unwrap()
}

async fn connected(
    hub: &TestHub,
    cert: &str,
    key: &str,
) -> Result<
    (
        tokio::sync::mpsc::Sender<AgentMessage>,
        tonic::Streaming<proto::HubMessage>,
    ),
    Status,
> {
    let channel = hub.channel(Some((cert, key))).await;
    let (up, up_rx) = tokio::sync::mpsc::channel(16);
    let down = proto::connect(channel, tokio_stream::wrappers::ReceiverStream::new(up_rx)).await?;
    Ok((up, down))
}

fn is_heartbeat(event: &SourceEvent, ok: bool) -> bool {
    matches!(event, SourceEvent::Heartbeat { result, .. } if result.is_ok() == ok)
}

#[tokio::test]
async fn an_agents_relist_and_heartbeats_reach_the_store_as_its_certificates_cluster() {
    let mut hub = serve(Recorded::default()).await;
    let (up, mut down) = connected_eu(&hub).await;
    let hello = down.next().await.unwrap().unwrap();
    assert!(hello.hub_time_unix > 0);
    assert_eq!(hello.heartbeat_seconds, 1, "the member's heartbeatSeconds");
    up.send(heartbeat("eu-1")).await.unwrap();
    for message in relist("eu-1") {
        up.send(message).await.unwrap();
    }
    let reset = next_where(&mut hub, "eu-1", |e| matches!(e, SourceEvent::Reset { .. })).await;
    let SourceEvent::Reset { objects, .. } = reset else {
        unreachable!()
    };
    let names: Vec<&str> = objects.services.iter().map(|(k, _)| &*k.name).collect();
    assert_eq!(names, ["web"]);
    // The heartbeat held back until the list was in comes right after it.
    next_where(&mut hub, "eu-1", |e| is_heartbeat(e, true)).await;
    drop(up);
    let closed = next_where(&mut hub, "eu-1", |e| is_heartbeat(e, false)).await;
    assert!(
        matches!(&closed, SourceEvent::Heartbeat { result: Err(r), .. } if r == "the agent's stream closed"),
        "{closed:?}"
    );
}

#[tokio::test]
async fn a_certificate_for_one_cluster_speaking_for_another_is_refused_and_displaces_nothing() {
    let mut hub = serve(Recorded::default()).await;
    let (cert, key) = joined_eu(&hub).await;
    // eu-1's own agent is connected and listed.
    let (agent, mut agent_down) = connected(&hub, &cert, &key).await.unwrap();
    assert!(agent_down.next().await.unwrap().is_ok());
    agent.send(heartbeat("eu-1")).await.unwrap();
    for message in relist("eu-1") {
        agent.send(message).await.unwrap();
    }
    next_where(&mut hub, "eu-1", |e| matches!(e, SourceEvent::Reset { .. })).await;
    next_where(&mut hub, "eu-1", |e| is_heartbeat(e, true)).await;

    // The same certificate on another stream, speaking for us-1.
    let (impostor, mut down) = connected(&hub, &cert, &key).await.unwrap();
    assert!(down.next().await.unwrap().is_ok());
    for message in relist("us-1") {
        impostor.send(message).await.unwrap();
    }
    let refused = tokio::time::timeout(Duration::from_secs(10), down.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(
        refused
            .message()
            .contains("a certificate for cluster eu-1 sent objects of cluster us-1"),
        "{}",
        refused.message()
    );
    // Nothing of us-1's reached the store, and eu-1's own stream still counts.
    agent.send(heartbeat("eu-1")).await.unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, hub.inbound.recv()).await {
        seen.push(event);
    }
    assert!(
        seen.iter().any(|e| matches!(e, SourceEvent::Heartbeat { cluster, result: Ok(()) } if cluster.as_str() == "eu-1")),
        "{seen:?}"
    );
    // (This agent sends one heartbeat only: the hub calls it silent later, never closed.)
    assert!(
        !seen.iter().any(|e| matches!(e, SourceEvent::Heartbeat { cluster, result: Err(r) } if cluster.as_str() == "eu-1" && r.contains("closed"))),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, SourceEvent::Reset { .. } | SourceEvent::Changes { .. })),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_stream_without_an_agent_certificate_is_refused() {
    let hub = serve(Recorded::default()).await;
    let (_, up_rx) = tokio::sync::mpsc::channel::<AgentMessage>(1);
    let refused = proto::connect(
        hub.channel(None).await,
        tokio_stream::wrappers::ReceiverStream::new(up_rx),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
}

#[tokio::test]
async fn a_cluster_that_is_no_agent_member_is_refused_with_the_reason() {
    let hub = serve(Recorded::default()).await;
    let ap = ClusterId::new("ap-1");
    let (key, csr) = crate::ca::key_and_request(&ap).unwrap();
    let issued = hub
        .ca
        .sign(
            &csr,
            &ap,
            Duration::from_secs(60),
            std::time::SystemTime::now(),
        )
        .unwrap();
    let refused = connected(&hub, &issued.cert_pem, &key).await.err().unwrap();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains("no MemberCluster ap-1 with `source: {agent: {}}`"),
        "{}",
        refused.message()
    );
}

#[tokio::test]
async fn renew_gives_a_new_certificate_for_the_cluster_the_current_one_names() {
    let hub = serve(Recorded::default()).await;
    let (cert, key) = joined_eu(&hub).await;
    let (new_key, csr) = crate::ca::key_and_request(&ClusterId::new("us-1")).unwrap();
    let renewed = proto::renew(
        hub.channel(Some((&cert, &key))).await,
        RenewRequest { csr_pem: csr },
    )
    .await
    .unwrap();
    assert_ne!(renewed.certificate_pem, cert);
    // Whatever the request asked, the certificate names the cluster of the one renewing it.
    let (_, mut down) = connected(&hub, &renewed.certificate_pem, &new_key)
        .await
        .unwrap();
    assert!(down.next().await.unwrap().is_ok());
    let (_, csr) = crate::ca::key_and_request(&ClusterId::new("eu-1")).unwrap();
    let anonymous = proto::renew(hub.channel(None).await, RenewRequest { csr_pem: csr })
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated);
}

#[tokio::test]
async fn new_streams_are_admitted_at_the_configured_rate() {
    let hub = crate::test_hub::serve_with(Recorded::default(), 2, Approval::Automatic).await;
    let (cert, key) = joined_eu(&hub).await;
    let started = std::time::Instant::now();
    let mut streams = Vec::new();
    // A full bucket admits two at once; the next three wait half a second each.
    for _ in 0..5 {
        let (up, mut down) = connected(&hub, &cert, &key).await.unwrap();
        assert!(down.next().await.unwrap().is_ok());
        streams.push((up, down));
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}
