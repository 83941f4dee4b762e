use meridian_controllers::SourceEvent;
use meridian_core::fleet::Change;
use meridian_core::index::Object;

use super::*;
use crate::test_hub::{HubIdentity, next_where, replica};
use crate::test_member::{FakeMember, service};

#[tokio::test]
async fn the_hub_is_every_address_its_entries_resolve_to_each_with_the_name_it_was_reached_by() {
    let resolved = resolve("127.0.0.1:9443, localhost:9444,127.0.0.1:9443")
        .await
        .unwrap();
    let expected: BTreeMap<SocketAddr, String> = [
        (
            "127.0.0.1:9443".parse().unwrap(),
            "127.0.0.1:9443".to_string(),
        ),
        (
            "127.0.0.1:9444".parse().unwrap(),
            "localhost:9444".to_string(),
        ),
    ]
    .into_iter()
    .chain(
        // Where localhost is IPv6 too, that address is a stream of its own.
        tokio::net::lookup_host("localhost:9444")
            .await
            .unwrap()
            .map(|a| (a, "localhost:9444".to_string())),
    )
    .collect();
    assert_eq!(resolved, expected);
    assert_eq!(
        first_entry(" hub-0.example:9443 ,hub-1.example:9443"),
        "hub-0.example:9443"
    );
    let none = resolve(" , ").await.unwrap_err();
    assert!(none.contains("resolves to no address"), "{none}");
}

/// Every resource `watch_all` watches in a member.
const WATCHED: [&str; 8] = [
    "endpointslices",
    "namespaces",
    "nodes",
    "pods",
    "resourcequotas",
    "serviceexports",
    "serviceimports",
    "services",
];

/// One of each resource `watch_all` watches.
fn one_each() -> BTreeMap<String, usize> {
    WATCHED.iter().map(|r| (r.to_string(), 1)).collect()
}

/// An agent's files in a directory of its own, removed when dropped.
struct Files(PathBuf);

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// eu-1's agent on `member`, streaming to the replicas at `ports` (joined with token euone1
/// through the first); it runs until the test ends.
fn start_agent(identity: &HubIdentity, ports: &[u16], member: &FakeMember) -> Files {
    let root = std::env::temp_dir().join(format!(
        "meridian-agent-test-{}-{}",
        std::process::id(),
        ports[0]
    ));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("token"), "euone1.0123456789abcdef\n").unwrap();
    std::fs::write(root.join("hub-ca.pem"), identity.serving_ca()).unwrap();
    let hub = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let settings = AgentSettings {
        hub,
        cluster: ClusterId::new("eu-1"),
        token_file: Some(root.join("token")),
        hub_ca_file: Some(root.join("hub-ca.pem")),
        state: AgentState::Directory(root.join("state")),
        watch_timeout: WatchTimeout::default(),
    };
    tokio::spawn(run(settings, member.client(), AgentSide::default()));
    Files(root)
}

async fn bound() -> (tokio::net::TcpListener, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// The names of the services of a Reset.
fn reset_services(event: &SourceEvent) -> Option<Vec<String>> {
    let SourceEvent::Reset { objects, .. } = event else {
        return None;
    };
    Some(
        objects
            .services
            .iter()
            .map(|(k, _)| k.name.to_string())
            .collect(),
    )
}

/// Whether `event` brings the service `name` (new or changed).
fn upserts_service(event: &SourceEvent, name: &str) -> bool {
    matches!(event, SourceEvent::Changes { changes, .. } if changes.iter().any(|c| {
        matches!(c, Change::Upsert(Object::Service(k, _)) if &*k.name == name)
    }))
}

#[tokio::test]
async fn an_agent_streaming_to_three_replicas_watches_its_member_once_and_each_replica_hears_it() {
    let member = FakeMember::default();
    member.change("services", "ADDED", service("shop", "web"));
    let identity = HubIdentity::of_agent_ca();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let (listener, _) = bound().await;
        replicas.push(replica(&identity, listener).await);
    }
    let ports: Vec<u16> = replicas.iter().map(|r| r.port).collect();
    let _files = start_agent(&identity, &ports, &member);

    for hub in &mut replicas {
        let reset = next_where(hub, "eu-1", |e| reset_services(e).is_some()).await;
        assert_eq!(reset_services(&reset).unwrap(), ["web"]);
    }
    assert_eq!(
        member.watches(),
        one_each(),
        "one watch per resource, not per replica"
    );
    assert_eq!(member.lists(), one_each(), "one list per resource");

    // A change is watched once and heard by every replica.
    member.change("services", "ADDED", service("shop", "api"));
    for hub in &mut replicas {
        next_where(hub, "eu-1", |e| upserts_service(e, "api")).await;
    }
    assert_eq!(member.watches(), one_each());
}

#[tokio::test]
async fn a_replica_that_comes_late_is_given_the_state_then_the_events_after_it_and_nothing_is_watched_again()
 {
    let member = FakeMember::default();
    member.change("services", "ADDED", service("shop", "web"));
    let identity = HubIdentity::of_agent_ca();
    let (listener_a, port_a) = bound().await;
    // B's address is bound (the agent is told it) but serves nothing yet.
    let (listener_b, port_b) = bound().await;
    let mut a = replica(&identity, listener_a).await;
    let _files = start_agent(&identity, &[port_a, port_b], &member);
    let reset = next_where(&mut a, "eu-1", |e| reset_services(e).is_some()).await;
    assert_eq!(reset_services(&reset).unwrap(), ["web"]);

    // While B is away, web goes and api comes.
    member.change("services", "DELETED", service("shop", "web"));
    member.change("services", "ADDED", service("shop", "api"));
    next_where(&mut a, "eu-1", |e| upserts_service(e, "api")).await;

    let mut b = replica(&identity, listener_b).await;
    let reset = next_where(&mut b, "eu-1", |e| reset_services(e).is_some()).await;
    assert_eq!(
        reset_services(&reset).unwrap(),
        ["api"],
        "the state now, as a list would give it"
    );
    member.change("services", "ADDED", service("shop", "db"));
    for hub in [&mut a, &mut b] {
        next_where(hub, "eu-1", |e| upserts_service(e, "db")).await;
    }
    assert_eq!(member.watches(), one_each(), "B cost the member nothing");
    assert_eq!(member.lists(), one_each());
}
