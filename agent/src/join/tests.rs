//! Joining over real gRPC and TLS on loopback (`test_hub`).

use super::*;
use crate::test_hub::{Recorded, serve};

fn refusal(e: JoinError) -> (tonic::Code, String) {
    match e {
        JoinError::Refused(status) => (status.code(), status.message().to_string()),
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn an_agent_joins_once_with_its_token_and_gets_a_certificate_for_its_cluster() {
    let spent = Recorded::default();
    let hub = serve(spent.clone()).await;
    let (channel, ca) = (hub.channel(None).await, hub.ca.clone());
    let eu = ClusterId::new("eu-1");
    let joined = join(channel.clone(), &eu, "euone1.0123456789abcdef")
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
    assert_eq!(*spent.0.lock(), ["euone1"]);

    let (code, message) = refusal(
        join(channel, &eu, "euone1.0123456789abcdef")
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
        join(channel.clone(), &eu, "usone1.0123456789abcdef")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert!(message.contains("is for cluster us-1"), "{message}");
    let (_, message) = refusal(
        join(channel.clone(), &eu, "old001.0123456789abcdef")
            .await
            .unwrap_err(),
    );
    assert!(message.contains("expired"), "{message}");
    let (code, _) = refusal(
        join(
            channel.clone(),
            &ClusterId::new("EU 1"),
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
    assert!(spent.0.lock().is_empty());
    assert!(join(channel, &eu, "euone1.0123456789abcdef").await.is_ok());

    // A hub that cannot record the token spent admits nobody, and the token stays unspent.
    let channel = serve(Recorded(Arc::default(), true))
        .await
        .channel(None)
        .await;
    let (code, _) = refusal(
        join(channel, &eu, "euone1.0123456789abcdef")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::Unavailable);
}
