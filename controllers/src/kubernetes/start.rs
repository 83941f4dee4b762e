//! Starting the Kubernetes side, in two calls the binary makes: [`start_hub`] (the hub source,
//! leader election, the shards when asked for, the MemberCluster and route status writers) and
//! [`start_writers`] (write-back, propagation and tenant namespaces, which every replica runs
//! whatever its hub). The binary wires these, not the modules one by one.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use meridian_core::{ClusterId, Snapshot};
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::leader::{self, Leadership, LeaseConfig};
use super::propagate::{self, PropagationView};
use super::shard::{self, ShardConfig, ShardMetrics, ShardView};
use super::{Facts, connect, hub, route_status, status, tenants, writeback};
use crate::members::Sources;
use crate::metrics::{PropagationMetrics, RouteMetrics, TenantMetrics, WritebackMetrics};

/// Where the hub's API server is and how its replicas elect a leader.
#[derive(Clone, Debug)]
pub struct HubSettings {
    /// None: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Where the Leases live.
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// Each member written by the replica holding it (a Lease per replica), not the leader.
    pub shards: bool,
}

/// A running Kubernetes hub.
pub struct StartedHub {
    /// The sources, with the hub's client (for member credentials in Secrets).
    pub sources: Sources,
    pub leadership: Leadership,
    /// What the hub's fenced writer clients are made from.
    pub writer: connect::Writer,
    /// The sharded writers' view, with `shards`.
    pub shards: Option<ShardView>,
    pub tasks: Vec<JoinHandle<()>>,
}

/// Why the hub could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the hub")]
    Connect(#[source] connect::Error),
    #[error("the hub's writer client")]
    Writer(#[source] connect::Error),
}

/// Connects to the hub and starts its source, leader election, the shards (with
/// `settings.shards`) and the status writer.
pub async fn start_hub(
    settings: HubSettings,
    mut sources: Sources,
    snapshots: &watch::Receiver<Arc<Snapshot>>,
    unreachable_here: watch::Receiver<Arc<BTreeSet<ClusterId>>>,
    metrics: &mut Registry,
) -> Result<StartedHub, StartError> {
    let connected = match &settings.kubeconfig {
        Some(path) => connect::from_kubeconfig(path, settings.context.as_deref()).await,
        None => connect::in_cluster(),
    }
    .map_err(StartError::Connect)?;
    let client = connected.client;
    sources.hub = Some(client.clone());
    let mut tasks = vec![tokio::spawn(hub::run(client.clone(), sources.clone()))];
    let (leadership, election) = leader::start(
        client.clone(),
        LeaseConfig {
            namespace: settings.namespace.clone(),
            name: settings.lease_name.clone(),
            identity: settings.identity.clone(),
            lease_duration: settings.lease_duration,
            renew_deadline: settings.renew_deadline,
            retry_period: settings.retry_period,
        },
    );
    tasks.push(election);
    let namespace = settings.namespace.clone();
    let (leadership, shards) = if settings.shards {
        let (held, view, task) = shard::start(
            client,
            ShardConfig {
                namespace: settings.namespace,
                group: settings.lease_name,
                identity: settings.identity,
                lease_duration: settings.lease_duration,
                renew_deadline: settings.renew_deadline,
                retry_period: settings.retry_period,
            },
            unreachable_here,
            sources.tx.clone(),
            ShardMetrics::new(metrics.sub_registry_with_prefix("shard")),
        );
        tasks.push(task);
        (leadership.sharded(held), Some(view))
    } else {
        (leadership, None)
    };
    // The status writer only writes: through the fenced writer client.
    let writer = connected
        .writer
        .client(&leadership.for_shard())
        .map_err(StartError::Writer)?;
    tasks.push(tokio::spawn(status::run(
        writer,
        snapshots.clone(),
        sources.fleet.clone(),
        leadership.clone(),
        namespace,
    )));
    // Route status is hub-wide: the leader's, through a writer fenced by its Lease.
    let route_writer = connected
        .writer
        .client(&leadership)
        .map_err(StartError::Writer)?;
    tasks.push(tokio::spawn(route_status::run(
        route_writer,
        snapshots.clone(),
        leadership.clone(),
        RouteMetrics::new(metrics.sub_registry_with_prefix("routes")),
    )));
    Ok(StartedHub {
        sources,
        leadership,
        writer: connected.writer,
        shards,
        tasks,
    })
}

/// The member writers every replica runs.
pub struct Writers {
    /// What propagation last decided and saw, per template (for `/debug` and `status`).
    pub propagation: PropagationView,
    pub tasks: Vec<JoinHandle<()>>,
}

/// Starts write-back (MCS objects), propagation (placed copies; on a Kubernetes hub, given as
/// `hub`, also the Placements and the templates' and policies' status) and tenant namespaces.
pub fn start_writers(
    snapshots: &watch::Receiver<Arc<Snapshot>>,
    fleet: &Facts,
    leadership: &Leadership,
    hub: Option<(Client, connect::Writer)>,
    resync: Duration,
    metrics: &mut Registry,
) -> Writers {
    let propagation = PropagationView::default();
    let tasks = vec![
        tokio::spawn(writeback::run(
            snapshots.clone(),
            fleet.clone(),
            leadership.clone(),
            WritebackMetrics::new(metrics.sub_registry_with_prefix("writeback")),
            resync,
        )),
        tokio::spawn(propagate::run(
            snapshots.clone(),
            fleet.clone(),
            leadership.clone(),
            hub,
            propagation.clone(),
            PropagationMetrics::new(metrics.sub_registry_with_prefix("propagation")),
        )),
        tokio::spawn(tenants::run(
            snapshots.clone(),
            fleet.clone(),
            leadership.clone(),
            TenantMetrics::new(metrics.sub_registry_with_prefix("tenants")),
        )),
    ];
    Writers { propagation, tasks }
}
