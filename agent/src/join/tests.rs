//! Joining over real gRPC and TLS on loopback (`test_hub`).

use super::*;
use meridian_core::agent::Approval;

use crate::test_hub::{Recorded, serve, serve_with};

/// A new key asking for `cluster`.
fn asking(cluster: &ClusterId) -> Asking {
    Asking::new(cluster).unwrap()
}

fn refusal(e: JoinError) -> (tonic::Code, String) {
    let JoinError::Refused(status) = e;
    (status.code(), status.message().to_string())
}

#[tokio::test]
async fn an_agent_joins_once_with_its_token_and_gets_a_certificate_for_its_cluster() {
    let spent = Recorded::default();
    let hub = serve(spent.clone()).await;
    let (channel, ca) = (hub.channel(None).await, hub.ca.clone());
    let eu = ClusterId::new("eu-1");
    let joined = join(channel.clone(), &asking(&eu), "euone1.0123456789abcdef")
        .await
        .unwrap();
    assert_eq!(joined.ca_pem, ca.cert_pem());
    assert!(
        joined
            .certificate_pem
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
    assert!(joined.key_pem.contains("PRIVATE KEY"));
    let lifetime = joined.not_after.duration_since(joined.not_before).unwrap();
    assert_eq!(
        lifetime,
        Duration::from_secs(120),
        "60 s backdated, 60 s ahead"
    );
    assert_eq!(spent.spent(), ["euone1"]);

    let (code, message) = refusal(
        join(channel, &asking(&eu), "euone1.0123456789abcdef")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert!(message.contains("already used"), "{message}");
}

#[tokio::test]
async fn another_clusters_token_an_expired_one_a_bad_request_and_a_failed_record_are_refused() {
    let spent = Recorded::default();
    let channel = serve(spent.clone()).await.channel(None).await;
    let eu = ClusterId::new("eu-1");
    let (code, message) = refusal(
        join(channel.clone(), &asking(&eu), "usone1.0123456789abcdef")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert!(message.contains("is for cluster us-1"), "{message}");
    let (_, message) = refusal(
        join(channel.clone(), &asking(&eu), "old001.0123456789abcdef")
            .await
            .unwrap_err(),
    );
    assert!(message.contains("expired"), "{message}");
    let (code, _) = refusal(
        join(
            channel.clone(),
            &asking(&ClusterId::new("EU 1")),
            "euone1.0123456789abcdef",
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    let garbage = proto::join(
        channel.clone(),
        JoinRequest {
            cluster: "eu-1".into(),
            token: "euone1.0123456789abcdef".into(),
            csr_pem: "not a request".into(),
        },
    )
    .await
    .unwrap_err();
    assert_eq!(garbage.code(), tonic::Code::InvalidArgument);
    // None of that spent eu-1's token.
    assert!(spent.spent().is_empty());
    assert!(
        join(channel, &asking(&eu), "euone1.0123456789abcdef")
            .await
            .is_ok()
    );

    // A hub that cannot record the token spent admits nobody, and the token stays unspent.
    let channel = serve(Recorded::read_only()).await.channel(None).await;
    let (code, _) = refusal(
        join(channel, &asking(&eu), "euone1.0123456789abcdef")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::Unavailable);
}

#[tokio::test]
async fn with_approval_by_the_operator_a_join_waits_until_its_key_is_approved() {
    let store = Recorded::default();
    let hub = serve_with(store.clone(), 100, Approval::ByOperator).await;
    let channel = hub.channel(None).await;
    let eu = ClusterId::new("eu-1");
    let token = "euone1.0123456789abcdef";
    let asking = Asking::new(&eu).unwrap();
    let (code, message) = refusal(join(channel.clone(), &asking, token).await.unwrap_err());
    assert_eq!(code, tonic::Code::FailedPrecondition);
    assert!(message.contains("meridian approve eu-1"), "{message}");
    // Asking again with the same key waits as well; another key is refused outright.
    let (code, _) = refusal(join(channel.clone(), &asking, token).await.unwrap_err());
    assert_eq!(code, tonic::Code::FailedPrecondition);
    let thief = Asking::new(&eu).unwrap();
    let (code, message) = refusal(join(channel.clone(), &thief, token).await.unwrap_err());
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert!(message.contains("another key"), "{message}");
    assert!(store.spent().is_empty());

    // What `meridian approve eu-1` does to the store.
    let mut tokens = store.tokens().await.unwrap();
    let read = tokens.clone();
    for approved in tokens.approve(&eu, SystemTime::now()).unwrap() {
        store
            .replace(read.get(&approved.id).unwrap(), &approved)
            .await
            .unwrap();
    }
    let joined = join(channel.clone(), &asking, token).await.unwrap();
    assert_eq!(joined.key_pem, asking.key_pem);
    assert_eq!(store.spent(), ["euone1"]);
    let (code, _) = refusal(join(channel, &thief, token).await.unwrap_err());
    assert_eq!(code, tonic::Code::PermissionDenied);
}
