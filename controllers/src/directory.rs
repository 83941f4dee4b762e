//! Directory sources: a hub directory of MemberCluster manifests, and one directory per member
//! holding its Services, EndpointSlices, ServiceExports and ServiceImports. Changes on disk are
//! picked up by inotify (with a short debounce) and, as a backstop, by a poll every heartbeat.
//!
//! ```text
//!  hub dir ──load──► MemberClusters ──► SourceEvent::Members ──► (wiring: Registry)
//!                        │ one task per directory member
//!                        ▼
//!  member dir ──load──► ClusterObjects ──► SourceEvent::Reset + Heartbeat ──► (wiring: Index)
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meridian_core::{ClusterId, ClusterObjects, ClusterSpec, Policy};
use notify::{RecursiveMode, Watcher};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::SourceEvent;
use crate::convert::{self, MemberSource};
use crate::crd::{ClusterSchedulingPolicy, MemberCluster};
use crate::manifest::{self, Loaded, Manifest, ManifestError};

/// How long to wait after a change on disk before reading, so an editor's burst of writes is
/// read once.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// How often the hub directory is re-checked without an inotify event.
const HUB_POLL: Duration = Duration::from_secs(2);

/// A member cluster read from the hub, with where its objects come from.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberEntry {
    pub spec: ClusterSpec,
    pub source: MemberSource,
}

/// What a hub directory holds.
#[derive(Debug, Default)]
pub struct Hub {
    pub members: Vec<MemberEntry>,
    pub policies: Vec<Policy>,
    pub errors: Vec<ManifestError>,
    pub warnings: Vec<ManifestError>,
}

/// Reads the MemberClusters and ClusterSchedulingPolicies of a hub directory.
pub fn read_hub(dir: &Path) -> std::io::Result<Hub> {
    let loaded = manifest::load_dir(dir)?;
    let mut hub = Hub {
        errors: loaded.errors,
        warnings: loaded.warnings,
        ..Hub::default()
    };
    for (file, m) in loaded.manifests {
        match m {
            Manifest::MemberCluster(mc) => add_member(&mut hub, dir, file, &mc),
            Manifest::ClusterSchedulingPolicy(csp) => add_policy(&mut hub, file, &csp),
            other => hub.warnings.push(ManifestError {
                file,
                object: other.describe(),
                reason:
                    "the hub directory holds MemberClusters and ClusterSchedulingPolicies; ignored"
                        .into(),
            }),
        }
    }
    Ok(hub)
}

fn add_member(hub: &mut Hub, dir: &Path, file: PathBuf, mc: &MemberCluster) {
    let base = file.parent().unwrap_or(dir).to_path_buf();
    let object = format!(
        "MemberCluster {}",
        mc.metadata.name.as_deref().unwrap_or("?")
    );
    match convert::member_cluster(mc, &base) {
        Ok((spec, _)) if hub.members.iter().any(|m| m.spec.id == spec.id) => {
            hub.errors.push(ManifestError {
                file,
                object,
                reason: format!(
                    "a MemberCluster named {} is defined twice; the first wins",
                    spec.id
                ),
            });
        }
        Ok((spec, source)) => hub.members.push(MemberEntry { spec, source }),
        Err(problems) => hub
            .errors
            .extend(problems.into_iter().map(|reason| ManifestError {
                file: file.clone(),
                object: object.clone(),
                reason,
            })),
    }
}

fn add_policy(hub: &mut Hub, file: PathBuf, csp: &ClusterSchedulingPolicy) {
    let object = format!(
        "ClusterSchedulingPolicy {}/{}",
        csp.metadata.namespace.as_deref().unwrap_or("default"),
        csp.metadata.name.as_deref().unwrap_or("?")
    );
    match crate::policy::scheduling_policy(csp) {
        Ok(p) if hub.policies.iter().any(|q| q.key == p.key) => hub.errors.push(ManifestError {
            file,
            object,
            reason: "defined twice; the first wins".into(),
        }),
        Ok(p) => hub.policies.push(p),
        Err(problems) => hub
            .errors
            .extend(problems.into_iter().map(|reason| ManifestError {
                file: file.clone(),
                object: object.clone(),
                reason: format!("{reason}; the policy is not used"),
            })),
    }
}

/// Converts what a member directory held into the cluster's objects; problems name the object.
pub fn member_objects(loaded: Loaded) -> (ClusterObjects, Vec<ManifestError>) {
    let mut objects = ClusterObjects::default();
    let mut errors = loaded.errors;
    for (file, m) in loaded.manifests {
        let err = |object: String, reason: String| ManifestError {
            file: file.clone(),
            object,
            reason,
        };
        match m {
            Manifest::Service(s) => match convert::service(&s) {
                Ok(v) => objects.services.push(v),
                Err(e) => errors.push(err(name_of("Service", &s.metadata), e)),
            },
            Manifest::EndpointSlice(es) => match convert::slice(&es) {
                Ok((key, slice, problems)) => {
                    errors.extend(
                        problems
                            .into_iter()
                            .map(|p| err(name_of("EndpointSlice", &es.metadata), p)),
                    );
                    objects.slices.push((key, slice));
                }
                Err(e) => errors.push(err(name_of("EndpointSlice", &es.metadata), e)),
            },
            Manifest::ServiceExport(se) => match convert::export(&se) {
                Ok(v) => objects.exports.push(v),
                Err(e) => errors.push(err(name_of("ServiceExport", &se.metadata), e)),
            },
            Manifest::ServiceImport(si) => match convert::import(&si) {
                Ok(v) => objects.imports.push(v),
                Err(e) => errors.push(err(name_of("ServiceImport", &si.metadata), e)),
            },
            hub_kind @ (Manifest::MemberCluster(_) | Manifest::ClusterSchedulingPolicy(_)) => {
                errors.push(err(
                    hub_kind.describe(),
                    "this kind belongs in the hub directory, not in a member's".into(),
                ))
            }
        }
    }
    (objects, errors)
}

fn name_of(
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("?")
    )
}

/// A cheap fingerprint of a directory tree (paths, sizes, mtimes), to notice changes that
/// inotify missed (e.g. a directory replaced by a rename).
fn fingerprint(dir: &Path) -> Option<Vec<(PathBuf, u64, SystemTime)>> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64, SystemTime)>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                walk(&entry.path(), out)?;
            } else {
                out.push((entry.path(), meta.len(), meta.modified()?));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, &mut out).ok()?;
    out.sort();
    Some(out)
}

/// An inotify watch on a directory that may not exist yet; `arm` retries until it does.
struct DirWatch {
    dir: PathBuf,
    changed: Arc<Notify>,
    watcher: Option<notify::RecommendedWatcher>,
}

impl DirWatch {
    fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            changed: Arc::new(Notify::new()),
            watcher: None,
        }
    }

    fn arm(&mut self) {
        if self.watcher.is_some() && self.dir.is_dir() {
            return;
        }
        self.watcher = None;
        let changed = self.changed.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // Our own reads open the files and directories (inotify IN_OPEN, IN_ACCESS): those
            // must not count, or every read would schedule the next one.
            if event.is_ok_and(|e| !matches!(e.kind, notify::EventKind::Access(_))) {
                changed.notify_one();
            }
        });
        match watcher {
            Ok(mut w) => {
                if w.watch(&self.dir, RecursiveMode::Recursive).is_ok() {
                    self.watcher = Some(w);
                }
            }
            Err(e) => {
                warn!(dir = %self.dir.display(), error = %e, "cannot watch directory; polling only")
            }
        }
    }

    /// Waits for a change (debounced) or the poll interval.
    async fn wait(&self, poll: Duration) {
        tokio::select! {
            _ = self.changed.notified() => {
                tokio::time::sleep(DEBOUNCE).await;
            }
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

/// Watches the hub directory: sends the member list on every change and runs one source task
/// per member. Runs until the channel closes.
pub async fn run_hub(dir: PathBuf, tx: mpsc::Sender<SourceEvent>) {
    let mut watch = DirWatch::new(dir.clone());
    let mut tasks: HashMap<ClusterId, (MemberEntry, JoinHandle<()>)> = HashMap::new();
    let mut last: Option<Vec<(PathBuf, u64, SystemTime)>> = None;
    let mut first = true;
    loop {
        watch.arm();
        let print = fingerprint(&dir);
        if first || print != last {
            first = false;
            last = print;
            match read_hub(&dir) {
                Ok(Hub {
                    members,
                    policies,
                    errors,
                    warnings,
                }) => {
                    for e in &errors {
                        warn!(file = %e.file.display(), object = %e.object, reason = %e.reason, "hub manifest rejected");
                    }
                    for w in &warnings {
                        info!(file = %w.file.display(), object = %w.object, reason = %w.reason, "hub manifest warning");
                    }
                    let event = SourceEvent::Members {
                        specs: members.iter().map(|m| m.spec.clone()).collect(),
                        policies,
                        problems: errors,
                    };
                    // The member list goes first, so the store knows a member before its objects arrive.
                    if tx.send(event).await.is_err() {
                        break;
                    }
                    reconcile_members(&members, &mut tasks, &tx);
                }
                Err(e) => {
                    warn!(dir = %dir.display(), error = %e, "cannot read the hub directory; keeping the last known members");
                }
            }
        }
        if tx.is_closed() {
            break;
        }
        watch.wait(HUB_POLL).await;
    }
    for (_, (_, task)) in tasks {
        task.abort();
    }
}

/// Starts, restarts and stops member source tasks so they match the hub.
fn reconcile_members(
    members: &[MemberEntry],
    tasks: &mut HashMap<ClusterId, (MemberEntry, JoinHandle<()>)>,
    tx: &mpsc::Sender<SourceEvent>,
) {
    tasks.retain(|id, (entry, task)| {
        let keep = members.iter().any(|m| {
            m.spec.id == *id && m.source == entry.source && m.spec.health == entry.spec.health
        });
        if !keep {
            info!(cluster = %id, "stopping member source");
            task.abort();
        }
        keep
    });
    for member in members {
        if tasks.contains_key(&member.spec.id) {
            continue;
        }
        let id = member.spec.id.clone();
        let task = match &member.source {
            MemberSource::Directory(path) => {
                info!(cluster = %id, dir = %path.display(), "starting directory member source");
                let span = info_span!("member", cluster = %id);
                tokio::spawn(
                    run_member(
                        id.clone(),
                        path.clone(),
                        member.spec.health.heartbeat_seconds,
                        tx.clone(),
                    )
                    .instrument(span),
                )
            }
            other => {
                let reason = match other {
                    MemberSource::Kubernetes { .. } => {
                        "kubernetes member sources are not available in this build"
                    }
                    _ => "agent member sources are not available in this build",
                };
                let tx = tx.clone();
                let id2 = id.clone();
                tokio::spawn(async move {
                    let _ = tx
                        .send(SourceEvent::Heartbeat {
                            cluster: id2,
                            result: Err(reason.to_string()),
                        })
                        .await;
                })
            }
        };
        tasks.insert(id, (member.clone(), task));
    }
}

/// A member directory's objects, its problems and its warnings, each logged once.
fn objects_and_problems(
    mut loaded: Loaded,
) -> (ClusterObjects, Vec<ManifestError>, Vec<ManifestError>) {
    let warnings = std::mem::take(&mut loaded.warnings);
    let (objects, problems) = member_objects(loaded);
    for p in &problems {
        warn!(file = %p.file.display(), object = %p.object, reason = %p.reason, "member manifest rejected");
    }
    for w in &warnings {
        warn!(file = %w.file.display(), object = %w.object, reason = %w.reason, "member manifest warning");
    }
    (objects, problems, warnings)
}

/// One directory member: reads it on every change, heartbeats every `heartbeat_seconds`.
pub async fn run_member(
    cluster: ClusterId,
    dir: PathBuf,
    heartbeat_seconds: u64,
    tx: mpsc::Sender<SourceEvent>,
) {
    let mut watch = DirWatch::new(dir.clone());
    let mut last: Option<Vec<(PathBuf, u64, SystemTime)>> = None;
    let poll = Duration::from_secs(heartbeat_seconds.max(1));
    loop {
        watch.arm();
        let print = fingerprint(&dir);
        let events = match &print {
            None => vec![SourceEvent::Heartbeat {
                cluster: cluster.clone(),
                result: Err(format!(
                    "directory {} is missing or unreadable",
                    dir.display()
                )),
            }],
            Some(_) if print == last => vec![SourceEvent::Heartbeat {
                cluster: cluster.clone(),
                result: Ok(()),
            }],
            Some(_) => match manifest::load_dir(&dir) {
                Ok(loaded) => {
                    let (objects, problems, warnings) = objects_and_problems(loaded);
                    debug!(
                        services = objects.services.len(),
                        slices = objects.slices.len(),
                        "member directory read"
                    );
                    vec![
                        SourceEvent::Reset {
                            cluster: cluster.clone(),
                            objects,
                            problems,
                            warnings,
                        },
                        SourceEvent::Heartbeat {
                            cluster: cluster.clone(),
                            result: Ok(()),
                        },
                    ]
                }
                Err(e) => vec![SourceEvent::Heartbeat {
                    cluster: cluster.clone(),
                    result: Err(format!("cannot read {}: {e}", dir.display())),
                }],
            },
        };
        // A missing directory must be read again in full once it is back.
        last = print;
        for event in events {
            if tx.send(event).await.is_err() {
                return;
            }
        }
        watch.wait(poll).await;
    }
}
