//! Agents' streams over real gRPC and mutual TLS on loopback (`test_hub`): the certificate
//! from `Join` is the identity.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;

use super::*;
use crate::events::encode;
use crate::join::join;
use crate::proto::{self, Heartbeat, agent_message::Body};
use crate::test_hub::{Recorded, TestHub, serve};

/// eu-1 joined: its certificate and key.
async fn joined_eu(hub: &TestHub) -> (String, String) {
    let joined = join(
        hub.channel(None).await,
        &ClusterId::new("eu-1"),
        "euone1.0123456789abcdef",
    )
    .await
    .unwrap();
    (joined.certificate_pem, joined.key_pem)
}

fn service_event(cluster: &str) -> AgentMessage {
    let svc = Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("shop".into()),
            ..ObjectMeta::default()
        },
        ..Service::default()
    };
    AgentMessage {
        cluster: cluster.into(),
        body: Some(Body::Event(
            encode(&MemberEvent::Service(Event::Apply(svc))).unwrap(),
        )),
    }
}

fn heartbeat(cluster: &str) -> AgentMessage {
    AgentMessage {
        cluster: cluster.into(),
        body: Some(Body::Heartbeat(Heartbeat {
            member_ready: true,
            error: String::new(),
        })),
    }
}

/// eu-1's agent joined and connected: what it sends up, what the hub sends down.
async fn connected_eu(
    hub: &TestHub,
) -> (
    tokio::sync::mpsc::Sender<AgentMessage>,
    tonic::Streaming<proto::HubMessage>,
) {
    let (cert, key) = joined_eu(hub).await;
    let channel = hub.channel(Some((&cert, &key))).await;
    let (up, up_rx) = tokio::sync::mpsc::channel(8);
    let down = proto::connect(channel, tokio_stream::wrappers::ReceiverStream::new(up_rx))
        .await
        .unwrap();
    (up, down)
}

async fn next(hub: &mut TestHub) -> (ClusterId, Inbound) {
    tokio::time::timeout(Duration::from_secs(10), hub.inbound.recv())
        .await
        .expect("the hub delivered nothing within 10 s")
        .expect("the hub's sink closed")
}

#[tokio::test]
async fn an_agents_events_and_heartbeats_reach_the_hub_as_its_certificates_cluster() {
    let mut hub = serve(Recorded::default()).await;
    let (up, mut down) = connected_eu(&hub).await;
    let hello = down.next().await.unwrap().unwrap();
    assert!(hello.hub_time_unix > 0);
    up.send(heartbeat("eu-1")).await.unwrap();
    up.send(service_event("eu-1")).await.unwrap();
    let (cluster, beat) = next(&mut hub).await;
    assert_eq!(cluster, ClusterId::new("eu-1"));
    assert!(
        matches!(
            beat,
            Inbound::Heartbeat {
                member_ready: true,
                ..
            }
        ),
        "{beat:?}"
    );
    match next(&mut hub).await {
        (c, Inbound::Event(event)) => {
            assert_eq!(c, ClusterId::new("eu-1"));
            let MemberEvent::Service(Event::Apply(svc)) = *event else {
                panic!("{event:?}");
            };
            assert_eq!(svc.metadata.name.as_deref(), Some("web"));
        }
        other => panic!("{other:?}"),
    }
    drop(up);
    assert!(matches!(next(&mut hub).await, (_, Inbound::Closed)));
}

#[tokio::test]
async fn a_certificate_for_one_cluster_speaking_for_another_ends_the_stream() {
    let mut hub = serve(Recorded::default()).await;
    let (up, mut down) = connected_eu(&hub).await;
    assert!(down.next().await.unwrap().is_ok());
    up.send(service_event("us-1")).await.unwrap();
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
    // Nothing of us-1's reached the hub: the stream just closed.
    assert!(matches!(next(&mut hub).await, (c, Inbound::Closed) if c == ClusterId::new("eu-1")));
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
