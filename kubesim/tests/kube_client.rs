//! Simulated members driven by the workspace's kube client exactly as meridian drives a
//! member: a kubeconfig per member, discovery, server-side apply with force as `meridian`,
//! status patches, watchers that relist after a 410, and deletion held by finalizers.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{GroupVersionKind, ResourceExt};
use kube::discovery::{self, Discovery, Scope};
use kube::runtime::watcher;
use kube::{Client, Config};
use meridian_kubesim::{Fleet, FleetConfig, Options};
use serde_json::json;

async fn fleet(members: usize) -> Arc<Fleet> {
    meridian_kubesim::start(Options {
        members: meridian_kubesim::numbered("m", members),
        nodes_per_member: 2,
        config: FleetConfig::default(),
        ..Options::default()
    })
    .await
    .expect("the fleet starts")
}

/// The config of the member's written kubeconfig (TLS with the fleet's CA, its token).
async fn config(dir: &Path, name: &str) -> Config {
    let path = dir.join("kubeconfigs").join(format!("{name}.kubeconfig"));
    let kubeconfig = Kubeconfig::read_from(&path).expect("a kubeconfig");
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a config")
}

/// A client from the member's written kubeconfig, as meridian builds one.
async fn client(dir: &Path, name: &str) -> Client {
    Client::try_from(config(dir, name).await).expect("a client")
}

fn deployment(replicas: i64, rev: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "labels": {"app.kubernetes.io/managed-by": "meridian"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"bench.meridian.io/rev": rev}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    })
}

#[tokio::test]
async fn meridian_style_client_against_simulated_members() {
    let fleet = fleet(2).await;
    let dir = tempfile::tempdir().unwrap();
    meridian_kubesim::write_kubeconfigs(&fleet, dir.path()).unwrap();
    let client = client(dir.path(), "m0001").await;

    // Discovery, the full run and the pinned lookup meridian's applier makes.
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let gvk = GroupVersionKind::gvk("apps", "v1", "Deployment");
    let (ar, caps) = discovery.resolve_gvk(&gvk).expect("deployments served");
    assert_eq!(caps.scope, Scope::Namespaced);
    assert!(caps.subresources.iter().any(|(r, _)| r.plural == "status"));
    let mcs = GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ServiceExport");
    assert!(discovery.resolve_gvk(&mcs).is_some());
    let (pinned, _) = discovery::pinned_kind(&client, &gvk).await.unwrap();
    assert_eq!(pinned.plural, "deployments");
    let ns_ar = discovery
        .resolve_gvk(&GroupVersionKind::gvk("", "v1", "Namespace"))
        .unwrap()
        .0;

    let nodes: Api<Node> = Api::all(client.clone());
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    // The namespace must exist first (meridian creates it).
    let deployments: Api<DynamicObject> = Api::namespaced_with(client.clone(), "shop", &ar);
    let apply = PatchParams::apply("meridian").force();
    let refused = deployments
        .patch("web", &apply, &Patch::Apply(deployment(2, "1")))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 404),
        "{refused:?}"
    );
    let namespaces: Api<DynamicObject> = Api::all_with(client.clone(), &ns_ar);
    namespaces
        .patch(
            "shop",
            &apply,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
            ),
        )
        .await
        .unwrap();

    // A watcher on every namespace, as meridian's placed-object watch.
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut events = watcher::watcher(all.clone(), watcher::Config::default()).boxed();
    let first = next_event(&mut events).await;
    assert!(matches!(first, watcher::Event::Init), "{first:?}");
    assert!(matches!(
        next_event(&mut events).await,
        watcher::Event::InitDone
    ));

    let applied = deployments
        .patch("web", &apply, &Patch::Apply(deployment(2, "1")))
        .await
        .unwrap();
    assert_eq!(applied.metadata.generation, Some(1));
    let managed = applied.metadata.managed_fields.clone().unwrap_or_default();
    assert!(managed.iter().any(
        |m| m.manager.as_deref() == Some("meridian") && m.operation.as_deref() == Some("Apply")
    ));
    let seen = next_event(&mut events).await;
    assert!(
        matches!(seen, watcher::Event::Apply(ref o) if o.name_any() == "web"),
        "{seen:?}"
    );

    // The member's controller reports it ready.
    let live = deployments.get("web").await.unwrap();
    assert_eq!(live.data["status"]["readyReplicas"], 2);
    assert_eq!(live.data["status"]["observedGeneration"], 1);

    // Another manager's apply that changes meridian's field conflicts.
    let other = deployments
        .patch(
            "web",
            &PatchParams::apply("someone"),
            &Patch::Apply(deployment(5, "1")),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(other, kube::Error::Api(ref s) if s.code == 409 && s.message.contains("meridian")),
        "{other:?}"
    );

    // An edit bumps the generation.
    let edited = deployments
        .patch("web", &apply, &Patch::Apply(deployment(2, "2")))
        .await
        .unwrap();
    assert_eq!(edited.metadata.generation, Some(2));

    // A status patch changes status only.
    let status = json!({"status": {"conditions": [{"type": "Meridian", "status": "True"}]}, "spec": {"replicas": 9}});
    let patched = deployments
        .patch_status("web", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["conditions"][0]["type"], "Meridian");
    assert_eq!(patched.data["spec"]["replicas"], 2);

    // Metadata-only pages, as the applier's list_versions reads.
    let page = all
        .list_metadata(
            &ListParams::default()
                .labels("app.kubernetes.io/managed-by=meridian")
                .limit(1),
        )
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert!(page.items[0].metadata.resource_version.is_some());

    // A full resync: the watch ends, resumes with a 410, and relists.
    let member = fleet.member("m0001").unwrap().clone();
    drain(&mut events).await;
    member.expire();
    let relisted = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match events.next().await {
                Some(Ok(watcher::Event::InitDone)) => return true,
                Some(_) => continue,
                None => return false,
            }
        }
    })
    .await
    .expect("the watcher relists after the 410");
    assert!(relisted);

    // Deletion held by a finalizer until it is removed.
    let mut held = deployment(2, "2");
    held["metadata"]["finalizers"] = json!(["meridian.io/test"]);
    deployments
        .patch("web", &apply, &Patch::Apply(held))
        .await
        .unwrap();
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    let marked = deployments.get("web").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(deployments.get_opt("web").await.unwrap().is_none());

    // Stats counted what was asked.
    let stats = fleet.stats(true);
    assert!(
        stats["members"]["m0001"]["requests"]["apply"]["deployments.apps"]
            .as_u64()
            .unwrap()
            >= 3
    );
    assert!(stats["totals"]["writes"].as_u64().unwrap() >= 5);
}

#[tokio::test]
async fn a_wrong_token_is_refused_and_a_member_down_refuses_connections() {
    let fleet = fleet(1).await;
    let dir = tempfile::tempdir().unwrap();
    meridian_kubesim::write_kubeconfigs(&fleet, dir.path()).unwrap();
    let member = fleet.member("m0001").unwrap().clone();
    let mut config = config(dir.path(), "m0001").await;
    config.auth_info.token = Some("wrong".to_owned().into());
    let stranger = Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(stranger);
    let refused = nodes.list(&ListParams::default()).await.unwrap_err();
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 401),
        "{refused:?}"
    );

    let client = client(dir.path(), "m0001").await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.list(&ListParams::default()).await.unwrap();
    member.set_up(false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(nodes.list(&ListParams::default()).await.is_err());
    member.set_up(true);
    let back = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if nodes.list(&ListParams::default()).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(back.is_ok(), "listening again on the same port");
}

async fn next_event(
    events: &mut (
             impl futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>> + Unpin
         ),
) -> watcher::Event<DynamicObject> {
    tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .expect("an event in time")
        .expect("no watch error")
        .expect("the stream goes on")
}

/// Takes whatever events are ready now.
async fn drain(
    events: &mut (
             impl futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>> + Unpin
         ),
) {
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), events.next()).await {}
}
