//! The namespaces members hold for Tenants (DESIGN §11): each named namespace of a Tenant is
//! created in every Kubernetes member of its clusters — labelled as meridian's, with the
//! Tenant's labels and `meridian.io/tenant` — and deleted there when the Tenant drops it, the
//! Tenant goes, or the member leaves its clusters; only namespaces meridian created, and never
//! one that holds what meridian places.
//!
//! ```text
//!  snapshot (tenants, clusters, health, placements) + the member's namespaces (its watch)
//!    ─► core::tenant::namespace_steps per member this replica may write
//!    ─► Applier: create (never an apply: a namespace that exists is someone else's),
//!       merge-patch of labels, delete
//! ```
//!
//! Nothing is written before the hub's Tenants were read, to a member that is Unreachable, or
//! before the member's namespaces were listed: an unknown set of namespaces is never "none".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use meridian_core::registry::Health;
use meridian_core::tenant::{NamespaceStep, namespace_steps};
use meridian_core::{ClusterId, ClusterView, Snapshot};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

use super::apply::{Applier, ObjectId};
use super::leader::Leadership;
use super::{Fleet, MANAGED_BY, MemberFacts};
use crate::metrics::TenantMetrics;

const DEBOUNCE: Duration = Duration::from_millis(100);
/// Failed writes are tried again this often (a member's namespace watch ticks otherwise).
const RETRY: Duration = Duration::from_secs(10);

/// Keeps every member's tenant namespaces until the snapshots end.
pub async fn run(
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    fleet: Fleet,
    leadership: Leadership,
    metrics: TenantMetrics,
) {
    let mut facts_changed = fleet.subscribe();
    // Per member: its applier, for the connection it was made for (kept for its discovery).
    let mut appliers: BTreeMap<ClusterId, (u64, Applier)> = BTreeMap::new();
    loop {
        tokio::select! {
            r = snapshots.changed() => if r.is_err() { return },
            _ = facts_changed.changed() => {}
            _ = tokio::time::sleep(RETRY) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        let snapshot = snapshots.borrow_and_update().clone();
        if !snapshot.tenants.listed {
            continue;
        }
        let facts = fleet.all();
        appliers.retain(|id, (connection, _)| {
            facts
                .get(id)
                .is_some_and(|f| f.client.is_some() && f.connection == *connection)
        });
        for view in &snapshot.clusters {
            let id = &view.spec.id;
            let Some(f) = facts.get(id) else { continue };
            if !writable(view, f, &leadership) {
                continue;
            }
            if !appliers.contains_key(id) {
                let Some(a) = f.applier(leadership.for_member(id), id) else {
                    continue;
                };
                appliers.insert(id.clone(), (f.connection, a));
            }
            let Some((_, applier)) = appliers.get(id) else {
                continue;
            };
            let desired = snapshot.tenants.namespaces_in(&view.spec);
            let steps = namespace_steps(&desired, &f.namespace_labels, MANAGED_BY, |ns| {
                snapshot.placements.places_in(id, ns)
            });
            for step in steps {
                write(applier, step, &metrics).await;
            }
        }
    }
}

/// This replica may write the member now, and knows what namespaces it has.
fn writable(view: &ClusterView, facts: &MemberFacts, leadership: &Leadership) -> bool {
    view.health != Health::Unreachable
        && !facts.retired
        && facts.listed
        && leadership.may_write_to(&view.spec.id)
}

async fn write(applier: &Applier, step: NamespaceStep, metrics: &TenantMetrics) {
    let cluster = applier.cluster().clone();
    let (op, namespace, result) = match step {
        NamespaceStep::Create { name, mut labels } => {
            labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
            let body = json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels},
            });
            let result = applier.create(&namespace_id(&name), &body).await.map(drop);
            ("create", name, result)
        }
        NamespaceStep::Relabel { name, labels } => {
            let patch = json!({"metadata": {"labels": labels}});
            let result = applier
                .merge_patch(&namespace_id(&name), &patch)
                .await
                .map(drop);
            ("relabel", name, result)
        }
        NamespaceStep::Delete { name } => {
            let result = applier.delete(&namespace_id(&name)).await;
            ("delete", name, result)
        }
    };
    metrics.record(&cluster, op, result.is_ok());
    match result {
        Ok(()) => info!(%cluster, %namespace, op, "tenant namespace written"),
        Err(e) => warn!(%cluster, %namespace, op, error = %e, "cannot write a tenant namespace"),
    }
}

fn namespace_id(name: &str) -> ObjectId {
    ObjectId::new("v1", "Namespace", None, name)
}
