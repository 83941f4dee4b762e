//! The hub directory as a source: MemberClusters, policies, templates, OverridePolicies,
//! Tenants and Gateway API routes read into the hub model (`crate::hub`) on every change,
//! sent to the store, and one source task per member kept running (`MemberTasks`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use meridian_core::Tenants;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{DirWatch, Outcome, Reading, file_of, next_round};
use crate::SourceEvent;
use crate::hub::{Hub, Served, hub_objects, keep_last_valid_policies};
use crate::manifest;
use crate::members::{MemberTasks, Sources};

/// How often the hub directory is re-checked without an inotify event.
const HUB_POLL: Duration = Duration::from_secs(2);

/// Reads the MemberClusters and ClusterSchedulingPolicies of a hub directory (once, as
/// `meridian validate` does).
pub fn read_hub(dir: &Path) -> manifest::Result<Hub> {
    Ok(hub_objects(dir, manifest::load_dir(dir)?))
}

/// Why `dir` cannot be a hub directory, if it cannot: `does not exist`, `is not a directory`.
pub fn not_a_directory(dir: &Path) -> Option<String> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => None,
        Ok(_) => Some("is not a directory".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist".into()),
        Err(e) => Some(format!("cannot be read: {e}")),
    }
}

/// Watches the hub directory: sends the member list on every change and runs one source task
/// per member. Runs until the channel closes.
pub async fn run_hub(dir: PathBuf, sources: Sources) {
    let tx = sources.tx.clone();
    let mut watch = DirWatch::new(dir.clone());
    let mut reading = Reading::new(sources.limits.clone());
    let mut tasks = MemberTasks::new(sources);
    let mut served = Served::default();
    loop {
        watch.arm();
        let mut again_in = None;
        match reading.read(&dir).await {
            Outcome::Read(Ok(read)) => {
                again_in = read.again_in;
                if read.changed {
                    // Thousands of templates take a while to summarise: off the runtime.
                    let started = Instant::now();
                    let d = dir.clone();
                    let Ok(hub) =
                        tokio::task::spawn_blocking(move || hub_objects(&d, read.loaded)).await
                    else {
                        warn!(dir = %dir.display(), "reading the hub directory failed; keeping the last known members");
                        continue;
                    };
                    let hub = keep_last_valid_policies(hub, &mut served);
                    debug!(
                        members = hub.members.len(),
                        templates = hub.templates.len(),
                        took_ms = started.elapsed().as_secs_f64() * 1000.0,
                        "hub directory read"
                    );
                    if !send_hub(&tx, &mut tasks, hub).await {
                        break;
                    }
                }
            }
            Outcome::Read(Err(e)) => {
                warn!(dir = %dir.display(), error = %crate::reason_of(&e), "cannot read the hub directory; keeping the last known members");
            }
            Outcome::Overran(budget) => {
                warn!(dir = %dir.display(), ?budget, "reading the hub directory takes longer than its budget; keeping the last known members");
            }
            Outcome::Failed(reason) => {
                warn!(dir = %dir.display(), %reason, "keeping the last known members");
            }
        }
        if tx.is_closed() {
            break;
        }
        watch.wait(next_round(HUB_POLL, again_in)).await;
    }
}

/// Logs what the hub read rejected, sends the member list and reconciles the member tasks;
/// false once the channel closed.
async fn send_hub(tx: &mpsc::Sender<SourceEvent>, tasks: &mut MemberTasks, hub: Hub) -> bool {
    let Hub {
        members,
        policies,
        templates,
        overrides,
        tenants,
        routes,
        grants,
        errors,
        warnings,
        ..
    } = hub;
    for e in &errors {
        warn!(file = %file_of(e), object = %e.subject, reason = %e.reason, "hub manifest rejected");
    }
    for w in &warnings {
        info!(file = %file_of(w), object = %w.subject, reason = %w.reason, "hub manifest warning");
    }
    let event = SourceEvent::Members {
        specs: members.iter().map(|m| m.spec.clone()).collect(),
        policies,
        problems: errors,
        warnings,
    };
    // The member list goes first, so the store knows a member before its objects arrive.
    if tx.send(event).await.is_err()
        || tx
            .send(SourceEvent::Templates {
                templates,
                overrides,
            })
            .await
            .is_err()
        || tx
            .send(SourceEvent::Tenants(Tenants::listed(tenants)))
            .await
            .is_err()
        || tx
            .send(SourceEvent::Routes { routes, grants })
            .await
            .is_err()
    {
        return false;
    }
    tasks.reconcile(&members);
    true
}
