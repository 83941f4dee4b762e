//! Joining over real gRPC and TLS on loopback: the hub's `Join` served by tonic with a server
//! certificate of a test CA, the agent's `join` trusting that CA.

use std::time::{Duration, SystemTime};

use meridian_core::agent::{BootstrapToken, Tokens};
use rcgen::{CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Server, ServerTlsConfig};

use super::*;
use crate::proto::AgentHubServer;

#[derive(Default, Clone)]
struct Recorded(Arc<Mutex<Vec<String>>>, bool);

impl SpentTokens for Recorded {
    fn spend(&self, id: &str) -> Result<(), String> {
        if self.1 {
            return Err("the hub's store is read-only".into());
        }
        self.0.lock().push(id.to_string());
        Ok(())
    }
}

/// A server certificate for 127.0.0.1 and the CA that signed it (PEM).
fn serving() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "hub test CA");
    ca.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (cert.pem(), key.serialize_pem(), ca_cert.pem())
}

fn token(id: &str, cluster: &str, expires: SystemTime) -> BootstrapToken {
    BootstrapToken {
        id: id.into(),
        secret: "0123456789abcdef".into(),
        cluster: ClusterId::new(cluster),
        expires,
        used: false,
    }
}

/// A hub serving `Join` on loopback; the channel to it.
async fn hub(spent: Recorded) -> (Channel, Arc<AgentCa>) {
    let (cert, key, serving_ca) = serving();
    let (ca, _) = AgentCa::generate(SystemTime::now()).unwrap();
    let ca = Arc::new(ca);
    let now = SystemTime::now();
    let tokens = Tokens::new([
        token("euone1", "eu-1", now + Duration::from_secs(3600)),
        token("usone1", "us-1", now + Duration::from_secs(3600)),
        token("old001", "eu-1", now - Duration::from_secs(1)),
    ]);
    let joins = Joins {
        ca: ca.clone(),
        tokens: Arc::new(Mutex::new(tokens)),
        spent,
        lifetime: Duration::from_secs(60),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(
        Server::builder()
            .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
            .unwrap()
            .add_service(AgentHubServer::new(joins))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let channel = Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(serving_ca))
                .domain_name("127.0.0.1"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    (channel, ca)
}

fn refusal(e: JoinError) -> (tonic::Code, String) {
    match e {
        JoinError::Refused(status) => (status.code(), status.message().to_string()),
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn an_agent_joins_once_with_its_token_and_gets_a_certificate_for_its_cluster() {
    let spent = Recorded::default();
    let (channel, ca) = hub(spent.clone()).await;
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
    let (channel, _) = hub(spent.clone()).await;
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
    let (channel, _) = hub(Recorded(Arc::default(), true)).await;
    let (code, _) = refusal(
        join(channel, &eu, "euone1.0123456789abcdef")
            .await
            .unwrap_err(),
    );
    assert_eq!(code, tonic::Code::Unavailable);
}
