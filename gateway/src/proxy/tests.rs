//! The fan-out's lists and the fleet watch against fake members on loopback (`testing`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::BodyExt;
use meridian_core::tenant::Reach;
use prometheus_client::registry::Registry;
use serde_json::Value;

use super::list::{MEMBER_PAGE, MEMBERS_AT_ONCE, list};
use super::state::{Call, GatewayView, Shared};
use crate::continues::{LIST_IDLE, LISTS_BYTES, Lists};
use crate::jwks::KeyRing;
use crate::merge::{CLUSTER_ANNOTATION, Composite, Continue};
use crate::metrics::ClusterLabels;
use crate::testing::FakeFleet;
use crate::{GatewayConfig, GatewayMetrics, JwksSource, Keys, OidcConfig, Targets};

const PATH: &str = "/api/v1/configmaps";

fn shared(targets: Targets) -> Arc<Shared> {
    let mut registry = Registry::default();
    Arc::new(Shared {
        config: GatewayConfig {
            cert: "unused".into(),
            key: "unused".into(),
            client_ca: None,
            oidc: OidcConfig {
                issuer: "https://issuer.test".into(),
                audiences: vec!["meridian".into()],
                username_claim: "email".into(),
                groups_claim: "groups".into(),
                tenant_claim: None,
                username_prefix: String::new(),
                groups_prefix: String::new(),
                clock_skew: Duration::from_secs(30),
            },
            jwks: JwksSource::File("unused".into()),
            jwks_refresh: Duration::from_secs(300),
            max_body_bytes: 1 << 20,
            member_timeout: Duration::from_secs(10),
            max_connections: 100,
        },
        keys: Arc::new(KeyRing::new(Arc::new(Keys::default()))),
        targets,
        metrics: GatewayMetrics::new(&mut registry),
        view: GatewayView::default(),
        own_metrics: Arc::new(Registry::default()),
        connections: Arc::new(tokio::sync::Semaphore::new(100)),
        lists: Lists::new(LIST_IDLE, LISTS_BYTES),
        rosters: crate::merge::Rosters::default(),
    })
}

fn call(reach: Option<Reach>) -> Call {
    Call {
        method: Method::GET,
        headers: HeaderMap::new(),
        body: Bytes::new(),
        reach: reach.map(Arc::new),
    }
}

/// A fake fleet (a member for each entry: its objects) and a gateway's state reaching it.
async fn fleet(objects: &[usize]) -> (FakeFleet, Arc<Shared>) {
    let fake = FakeFleet::start_with(objects, 16).await.unwrap();
    let (targets, sender) = fake.targets();
    // The snapshot stays as built: its sender lives as long as the test.
    std::mem::forget(sender);
    let shared = shared(targets);
    (fake, shared)
}

/// The body, or the error that ended it.
async fn read(response: Response) -> Result<Value, String> {
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))
}

/// Each entry as `cluster/namespace/name`, in order.
fn keys(list: &Value) -> Vec<String> {
    let field = if list["kind"] == "Table" {
        "rows"
    } else {
        "items"
    };
    list[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| if field == "rows" { &e["object"] } else { e })
        .map(|o| {
            let m = &o["metadata"];
            format!(
                "{}/{}/{}",
                m["annotations"][CLUSTER_ANNOTATION].as_str().unwrap(),
                m["namespace"].as_str().unwrap(),
                m["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn warnings(response: &Response) -> Vec<String> {
    response
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

fn param<'a>(path: &'a str, key: &str) -> Option<&'a str> {
    crate::path::query_param(path, key)
}

#[tokio::test]
async fn an_unpaged_list_streams_every_member_page_by_page_in_order() {
    // m0000: 3 objects, m0001: none, m0002: 1,200 (three member pages).
    let (fake, shared) = fleet(&[3, 0, 1200]).await;
    let response = list(&shared, PATH, &call(None)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(warnings(&response).is_empty());
    let merged = read(response).await.unwrap();
    let got = keys(&merged);
    assert_eq!(got.len(), 1203);
    let unique: BTreeSet<&String> = got.iter().collect();
    assert_eq!(unique.len(), 1203, "every object once");
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got, sorted, "in (cluster, namespace, name) order");
    assert_eq!(merged["kind"], "ConfigMapList");
    let composite = Composite::decode(
        merged["metadata"]["resourceVersion"].as_str().unwrap(),
        &shared.rosters,
    )
    .unwrap();
    assert_eq!(
        composite.0,
        BTreeMap::from([
            ("m0000".into(), "1000".into()),
            ("m0001".into(), "1001".into()),
            ("m0002".into(), "1002".into())
        ])
    );
    // The big member was paged: its first page, then MEMBER_PAGE at a time on its token.
    let asked = fake.member("m0002").lists();
    let limits: Vec<&str> = asked.iter().filter_map(|p| param(p, "limit")).collect();
    assert_eq!(limits, ["500", "500", "500"], "{asked:?}");
    assert_eq!(param(&asked[0], "continue"), None);
    assert_eq!(param(&asked[1], "continue"), Some("o500"));
    assert_eq!(param(&asked[2], "continue"), Some("o1000"));
    assert_eq!(MEMBER_PAGE, 500);
}

#[tokio::test]
async fn a_thousand_members_are_asked_a_few_entries_first_and_a_bounded_number_at_once() {
    let (fake, shared) = fleet(&[25; 1000]).await;
    let merged = read(list(&shared, PATH, &call(None)).await).await.unwrap();
    let got = keys(&merged);
    assert_eq!(got.len(), 25_000);
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), 25_000);
    // 10,000 entries held over the fleet before the head: 10 a member, then the rest.
    for m in [&fake.members[0], &fake.members[999]] {
        let asked = m.lists();
        assert_eq!(asked.len(), 2, "{asked:?}");
        assert_eq!(param(&asked[0], "limit"), Some("10"));
        assert_eq!(param(&asked[1], "continue"), Some("o10"));
    }
    let peak = fake.load.peak.load(Ordering::SeqCst);
    assert!(
        peak <= MEMBERS_AT_ONCE + 1,
        "{peak} requests at once to members"
    );
    let composite = Composite::decode(
        merged["metadata"]["resourceVersion"].as_str().unwrap(),
        &shared.rosters,
    )
    .unwrap();
    assert_eq!(composite.0.len(), 1000);
}

#[tokio::test]
async fn a_member_refusing_is_a_warning_and_one_failing_later_cuts_the_body() {
    let (fake, shared) = fleet(&[2, 2, 800]).await;
    fake.member("m0001").script.lock().refuse = Some(403);
    // Its first page (500 entries) is answered; the one after it fails.
    fake.member("m0002").script.lock().fail_after_pages = Some(1);
    let response = list(&shared, PATH, &call(None)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let warned = warnings(&response);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("m0001 left out: 403"), "{warned:?}");
    let read = read(response).await;
    assert!(
        read.is_err(),
        "a list missing m0002's objects must not parse"
    );
    let cut = shared
        .metrics
        .lists_cut
        .get_or_create(&ClusterLabels {
            cluster: "m0002".into(),
        })
        .get();
    assert_eq!(cut, 1);

    // Refused before the head: only a Warning, the rest of the fleet's list whole.
    fake.member("m0002").script.lock().fail_after_pages = None;
    fake.member("m0002").script.lock().refuse = Some(500);
    let response = list(&shared, PATH, &call(None)).await;
    assert_eq!(warnings(&response).len(), 2);
    assert_eq!(keys(&read_ok(response).await).len(), 2);
}

async fn read_ok(response: Response) -> Value {
    read(response).await.unwrap()
}

#[tokio::test]
async fn a_member_410_is_the_whole_answer() {
    let (fake, shared) = fleet(&[2, 2]).await;
    fake.member("m0001").script.lock().refuse = Some(410);
    let response = list(&shared, PATH, &call(None)).await;
    assert_eq!(response.status(), StatusCode::GONE);
    let response = list(&shared, &format!("{PATH}?limit=1"), &call(None)).await;
    // The first page is m0000's alone: m0001 is asked on the next.
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_tenants_caller_sees_only_its_namespaces_of_its_clusters() {
    let (_fake, shared) = fleet(&[8, 8, 8]).await;
    let reach = Reach {
        clusters: BTreeMap::from([
            ("m0000".into(), BTreeSet::from(["ns-1".into()])),
            ("m0001".into(), BTreeSet::from(["ns-2".into()])),
        ]),
        hub: BTreeSet::new(),
    };
    for path in [PATH.to_string(), format!("{PATH}?limit=3")] {
        let mut got = Vec::new();
        let mut next = None::<String>;
        loop {
            let p = match &next {
                Some(t) => format!("{path}&continue={t}"),
                None => path.clone(),
            };
            let page = read_ok(list(&shared, &p, &call(Some(reach.clone()))).await).await;
            got.extend(keys(&page));
            next = page["metadata"]["continue"].as_str().map(str::to_string);
            if next.is_none() {
                break;
            }
        }
        assert_eq!(
            got,
            [
                "m0000/ns-1/cm-00001",
                "m0000/ns-1/cm-00005",
                "m0001/ns-2/cm-00002",
                "m0001/ns-2/cm-00006"
            ],
            "{path}"
        );
    }
}

#[tokio::test]
async fn tables_merge_their_rows_under_the_first_columns() {
    let (fake, shared) = fleet(&[2, 3]).await;
    for m in &fake.members {
        m.script.lock().tables = true;
    }
    let merged = read_ok(list(&shared, PATH, &call(None)).await).await;
    assert_eq!(merged["kind"], "Table");
    assert_eq!(merged["columnDefinitions"][0]["name"], "Name");
    assert_eq!(keys(&merged).len(), 5);
    assert_eq!(keys(&merged)[2], "m0001/ns-0/cm-00000");
}

/// Every page of a paged list through `*`, and the tokens that led to them.
async fn every_page(shared: &Arc<Shared>, limit: usize) -> (Vec<Value>, Vec<String>) {
    let (mut pages, mut tokens) = (Vec::new(), Vec::new());
    loop {
        let path = match tokens.last() {
            Some(t) => format!("{PATH}?limit={limit}&continue={t}"),
            None => format!("{PATH}?limit={limit}"),
        };
        let response = list(shared, &path, &call(None)).await;
        assert_eq!(response.status(), StatusCode::OK);
        let page = read_ok(response).await;
        let next = page["metadata"]["continue"].as_str().map(str::to_string);
        pages.push(page);
        match next {
            Some(t) => tokens.push(t),
            None => return (pages, tokens),
        }
    }
}

#[tokio::test]
async fn pages_across_many_members_hold_every_object_once_with_small_tokens() {
    let objects: Vec<usize> = (0..300).map(|i| [7, 0, 1, 23][i % 4]).collect();
    let total: usize = objects.iter().sum();
    let (_fake, shared) = fleet(&objects).await;
    let (pages, tokens) = every_page(&shared, 10).await;
    let got: Vec<String> = pages.iter().flat_map(keys).collect();
    assert_eq!(got.len(), total);
    assert_eq!(got.iter().collect::<BTreeSet<_>>().len(), total);
    assert!(pages.iter().all(|p| keys(p).len() <= 10));
    let longest = tokens.iter().map(String::len).max().unwrap();
    assert!(longest < 512, "a continue token of {longest} bytes");
    // The last page carries every member's version: a watch from it starts each member.
    let last = pages.last().unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap();
    assert_eq!(
        Composite::decode(last, &shared.rosters).unwrap().0.len(),
        300
    );
    // One paged list is held, however many pages it took.
    assert_eq!(shared.lists.len(), 1);
}

#[tokio::test]
async fn a_token_whose_list_is_gone_is_410_expired_and_a_foreign_one_400() {
    let (_fake, shared) = fleet(&[3, 3]).await;
    let gone = Continue {
        list: "never-issued".into(),
        cluster: "m0001".into(),
        member: String::new(),
    }
    .encode();
    let old = "mct1.eyJjbHVzdGVyIjoibTAwMDEifQ";
    for token in [gone.as_str(), old] {
        let response = list(
            &shared,
            &format!("{PATH}?limit=2&continue={token}"),
            &call(None),
        )
        .await;
        assert_eq!(response.status(), StatusCode::GONE, "{token}");
        let status = read_ok(response).await;
        assert_eq!(status["reason"], "Expired");
    }
    let response = list(
        &shared,
        &format!("{PATH}?limit=2&continue=abc"),
        &call(None),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_fleet_watch_holds_one_watch_per_member() {
    let (fake, shared) = fleet(&[1; 200]).await;
    let response = crate::watch::every(&shared, &format!("{PATH}?watch=1"), &call(None)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(warnings(&response).is_empty());
    for m in &fake.members {
        assert_eq!(m.watches.load(Ordering::SeqCst), 1, "{}", m.name);
    }
    assert_eq!(shared.metrics.member_watches.get(), 200);
    drop(response);
    assert_eq!(shared.metrics.member_watches.get(), 0);
}

#[tokio::test]
async fn a_watch_opens_from_a_thousand_members_lists_version_each_member_from_its_own() {
    // What a reflector does: LIST, then WATCH with the list's resourceVersion in the URL.
    let (fake, shared) = fleet(&[1; 1000]).await;
    let merged = read(list(&shared, PATH, &call(None)).await).await.unwrap();
    let version = merged["metadata"]["resourceVersion"].as_str().unwrap();
    // The fake members' revisions are 1000…1999 (3 digits a member); `mrv1.` was ~20 KB.
    assert!(version.len() < 3_100, "{} bytes", version.len());
    let path = format!("{PATH}?watch=1&resourceVersion={version}");
    let response = crate::watch::every(&shared, &path, &call(None)).await;
    assert_eq!(response.status(), StatusCode::OK);
    for m in [&fake.members[0], &fake.members[999]] {
        let seen = m.seen.lock().clone();
        let watch = seen.iter().find(|p| p.contains("watch=")).unwrap();
        assert_eq!(
            param(watch, "resourceVersion"),
            Some(m.resource_version.as_str())
        );
    }
}

#[tokio::test]
async fn a_version_made_for_members_no_longer_known_is_410_expired() {
    let (_fake, shared) = fleet(&[1, 1]).await;
    // Made by a gateway whose members were others (or many member changes ago).
    let elsewhere = crate::merge::Rosters::default();
    let roster = elsewhere.current(&["m0000", "m0001", "m0002"]);
    let mut c = Composite::default();
    c.set("m0000", "1000");
    let token = c.encode(&roster);
    for path in [
        format!("{PATH}?resourceVersion={token}"),
        format!("{PATH}?watch=1&resourceVersion={token}"),
    ] {
        let response = if path.contains("watch=") {
            crate::watch::every(&shared, &path, &call(None)).await
        } else {
            list(&shared, &path, &call(None)).await
        };
        assert_eq!(response.status(), StatusCode::GONE, "{path}");
        assert_eq!(read_ok(response).await["reason"], "Expired");
    }
    // Not the gateway's at all: 400.
    let response = list(
        &shared,
        &format!("{PATH}?resourceVersion=mrv2.x"),
        &call(None),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
}
