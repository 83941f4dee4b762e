//! The namespaces members hold for Tenants: each named namespace of a Tenant is
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

use std::sync::Arc;
use std::time::Duration;

use meridian_core::registry::Health;
use meridian_core::tenant::{NamespaceStep, namespace_steps};
use meridian_core::{ClusterView, Snapshot};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

use super::apply::{Applier, ObjectId};
use super::leader::Leadership;
use super::reconcile::{self, Round, Slots, Wake};
use super::{Facts, MANAGED_BY, MemberFacts};
use crate::metrics::TenantMetrics;

/// Failed writes are tried again this often (a member's namespace watch ticks otherwise).
const RETRY: Duration = Duration::from_secs(10);

/// Keeps every member's tenant namespaces until the snapshots end.
pub async fn run(
    snapshots: watch::Receiver<Arc<Snapshot>>,
    fleet: Facts,
    leadership: Leadership,
    metrics: TenantMetrics,
) {
    let mut wake = Wake::new(snapshots, &fleet, RETRY);
    // What a member holds is read from its namespace watch each round: nothing to remember
    // besides the applier (kept for its discovery).
    let mut slots: Slots<()> = Slots::new();
    while let Some(Round { snapshot, facts }) = wake.next(None).await {
        if !snapshot.tenants.listed {
            continue;
        }
        reconcile::sync(
            &mut slots,
            &facts,
            &leadership,
            RETRY,
            |id, f, _| {
                snapshot
                    .cluster_view(id)
                    .is_some_and(|view| writable(view, f, &leadership))
            },
            |_| (),
        );
        for view in &snapshot.clusters {
            let id = &view.spec.id;
            let (Some(f), Some(slot)) = (facts.get(id), slots.get(id)) else {
                continue;
            };
            if !writable(view, f, &leadership) {
                continue;
            }
            let desired = snapshot.tenants.namespaces_in(&view.spec);
            let steps = namespace_steps(&desired, &f.namespace_labels, MANAGED_BY, |ns| {
                snapshot.placements.places_in(id, ns)
            });
            for step in steps {
                write(&slot.applier, step, &metrics).await;
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
