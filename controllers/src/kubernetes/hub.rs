//! The Kubernetes hub: MemberClusters and ClusterSchedulingPolicies watched on the hub's API.
//! Each relist is buffered until it is complete, so the member list never shrinks for a moment;
//! the store gets the whole hub again after every change (it is small), and the member sources
//! are started and stopped to match.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use meridian_core::ObjectKey;
use tracing::{info, warn};

use super::connect::WatchTimeout;
use super::state::{Applied, Table};
use crate::SourceEvent;
use crate::crd::{ClusterSchedulingPolicy, MemberCluster};
use crate::directory::{Hub, ReadFrom, Served, add_member, add_policy, keep_last_valid_policies};
use crate::members::{MemberTasks, Sources};

#[expect(
    clippy::large_enum_variant,
    reason = "an event lives for one loop iteration; boxing would cost an allocation per object"
)]
enum HubEvent {
    Member(Event<MemberCluster>),
    Policy(Event<ClusterSchedulingPolicy>),
}

/// Watches the hub until the store goes away.
pub async fn run(client: Client, sources: Sources) {
    let tx = sources.tx.clone();
    let mut tasks = MemberTasks::new(sources);
    let config = watcher::Config::default().timeout(WatchTimeout::default().0);
    let members = watcher::watcher(Api::<MemberCluster>::all(client.clone()), config.clone())
        .default_backoff()
        .map(|r| r.map(HubEvent::Member));
    let policies = watcher::watcher(Api::<ClusterSchedulingPolicy>::all(client), config)
        .default_backoff()
        .map(|r| r.map(HubEvent::Policy));
    let mut events = futures::stream::select(members.boxed(), policies.boxed());
    let mut member_list = Table::<Stored<MemberCluster>>::default();
    let mut policy_list = Table::<Stored<ClusterSchedulingPolicy>>::default();
    let mut served = Served::default();
    let mut failing = false;
    // Relative kubeconfig paths in MemberClusters resolve against the working directory.
    let base = std::env::current_dir().unwrap_or_default();
    while let Some(first) = events.next().await {
        let mut changed = false;
        let mut next = Some(first);
        while let Some(item) = next {
            match item {
                Ok(HubEvent::Member(e)) => {
                    changed |= changes(member_list.apply(e, |m| &m.metadata, Stored::of));
                }
                Ok(HubEvent::Policy(e)) => {
                    changed |= changes(policy_list.apply(e, |p| &p.metadata, Stored::of));
                }
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "hub watch failing; serving the last known hub");
                    }
                    failing = true;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            next = events.next().now_or_never().flatten();
        }
        if !changed || !member_list.listed || !policy_list.listed {
            continue;
        }
        if failing {
            info!("hub watch recovered");
            failing = false;
        }
        let hub = keep_last_valid_policies(
            read(&member_list.live, &policy_list.live, &base),
            &mut served,
        );
        for e in &hub.errors {
            warn!(object = %e.subject, reason = %e.reason, "hub object rejected");
        }
        let event = SourceEvent::Members {
            specs: hub.members.iter().map(|m| m.spec.clone()).collect(),
            policies: hub.policies,
            problems: hub.errors,
            warnings: hub.warnings,
        };
        if tx.send(event).await.is_err() {
            return;
        }
        tasks.reconcile(&hub.members);
    }
}

/// A hub object as the hub served it; equal when the API says it is the same version.
#[derive(Clone, Debug)]
struct Stored<K>(K);

impl<K: Clone> Stored<K> {
    fn of(k: &K) -> Result<Self, Infallible> {
        Ok(Self(k.clone()))
    }
}

impl<K: kube::Resource> PartialEq for Stored<K> {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.0.meta(), other.0.meta());
        a.uid == b.uid && a.resource_version == b.resource_version
    }
}

fn changes<T>(applied: Applied<T>) -> bool {
    !matches!(applied, Applied::Nothing)
}

fn read(
    members: &BTreeMap<ObjectKey, Stored<MemberCluster>>,
    policies: &BTreeMap<ObjectKey, Stored<ClusterSchedulingPolicy>>,
    base: &Path,
) -> Hub {
    let mut hub = Hub::default();
    for Stored(mc) in members.values() {
        add_member(&mut hub, base, &ReadFrom::Api, mc);
    }
    for Stored(csp) in policies.values() {
        add_policy(&mut hub, &ReadFrom::Api, csp);
    }
    hub
}
