//! Directory sources: a hub directory of MemberCluster and ClusterSchedulingPolicy manifests,
//! and one directory per member holding its Services, EndpointSlices, ServiceExports and
//! ServiceImports. Changes on disk are picked up by inotify (with a short debounce) and, as a
//! backstop, by a poll (the hub every 2 s, a member every `heartbeatSeconds`).
//!
//! Reads never run on the async runtime: each goes to the blocking pool (at most
//! [`READS`] at once, one per directory), within the [`Limits`]; a file is read once it is
//! stable, and a half-written one keeps its last good content for a grace
//! (`manifest::DirReader`). A read that overruns its budget is reported, and the directory's
//! last content keeps serving while it finishes.
//!
//! ```text
//!  hub dir ──load──► MemberClusters, policies ──► SourceEvent::Members ──► (store: Registry)
//!                        │ one task per member (MemberTasks)
//!                        ▼
//!  member dir ──load──► ClusterObjects ──► SourceEvent::Reset + Heartbeat ──► (store: Index)
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use meridian_core::fleet::Change;
use meridian_core::{
    Capacity, ClusterId, ClusterObjects, Kind, Object, ObjectKey, ObjectRef, Origin, Problem,
    Quota, Resources, Source,
};
use notify::{RecursiveMode, Watcher};
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::SourceEvent;
use crate::convert::{self, Validation};
use crate::manifest::{
    self, DirRead, DirReader, DocKey, Limits, Loaded, Manifest, ManifestError, OpenWrites,
    ServedFile,
};
mod hub;
pub use hub::{not_a_directory, read_hub, run_hub};

/// How long to wait after a change on disk before reading, so an editor's burst of writes is
/// read once.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// What a member directory holds, converted: its objects, its capacity (from Node and Pod
/// manifests; None without Nodes) and the problems, each naming file and object.
#[derive(Debug, Default)]
pub struct MemberRead {
    pub objects: ClusterObjects,
    pub capacity: Option<Capacity>,
    pub problems: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

/// Converts what a member directory held into the cluster's objects; problems name the file
/// and the object.
pub fn member_objects(cluster: &ClusterId, loaded: Loaded) -> MemberRead {
    let converted = convert_manifests(cluster, &loaded);
    MemberRead {
        capacity: converted.capacity(),
        objects: converted.objects,
        problems: converted.problems,
        warnings: converted.warnings,
    }
}

/// Manifests converted: the cluster's objects, what its capacity is summed from, and the
/// problems and warnings, each naming file and object.
#[derive(Debug, Default)]
struct Converted {
    objects: ClusterObjects,
    nodes: Vec<Resources>,
    pods: Vec<crate::capacity::PodUse>,
    quotas: Vec<(String, Quota)>,
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
}

impl Converted {
    fn capacity(&self) -> Option<Capacity> {
        capacity_of([self])
    }

    /// Nothing but objects (which callers move out first).
    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
            && self.pods.is_empty()
            && self.quotas.is_empty()
            && self.problems.is_empty()
            && self.warnings.is_empty()
    }

    /// Adds `more`'s capacity inputs, problems and warnings.
    fn add(&mut self, more: &Converted) {
        self.nodes.extend_from_slice(&more.nodes);
        self.pods.extend(more.pods.iter().cloned());
        self.quotas.extend_from_slice(&more.quotas);
        self.problems.extend_from_slice(&more.problems);
        self.warnings.extend_from_slice(&more.warnings);
    }
}

/// The capacity of a member whose manifests were converted in `parts` (one per file).
fn capacity_of<'a>(parts: impl IntoIterator<Item = &'a Converted> + Clone) -> Option<Capacity> {
    let quotas = crate::capacity::by_namespace(
        parts
            .clone()
            .into_iter()
            .flat_map(|c| c.quotas.iter().map(|(ns, q)| (ns.as_str(), *q))),
    );
    crate::capacity::of(
        parts
            .clone()
            .into_iter()
            .flat_map(|c| c.nodes.iter().copied()),
        parts.into_iter().flat_map(|c| c.pods.iter()),
        quotas,
    )
}

fn convert_manifests(cluster: &ClusterId, loaded: &Loaded) -> Converted {
    convert_read(cluster, &loaded.manifests, &loaded.errors, &loaded.warnings)
}

/// Converts `manifests`; `errors` and `warnings` are what reading them found.
fn convert_read(
    cluster: &ClusterId,
    manifests: &[(PathBuf, Manifest)],
    errors: &[ManifestError],
    warnings: &[ManifestError],
) -> Converted {
    let origin = Origin::Member(cluster.clone());
    let mut objects = ClusterObjects::default();
    let mut errors: Vec<Problem> = (errors.iter().cloned())
        .map(|e| e.into_problem(origin.clone()))
        .collect();
    let mut warnings: Vec<Problem> = (warnings.iter().cloned())
        .map(|e| e.into_problem(origin.clone()))
        .collect();
    let (mut nodes, mut pods, mut quotas) = (Vec::new(), Vec::new(), Vec::new());
    for (file, m) in manifests {
        let err = |object: ObjectRef, reason: String| {
            Problem::in_file(origin.clone(), file.clone(), object, reason)
        };
        match m {
            Manifest::Service(s) => match convert::service(s) {
                Ok(v) => objects.services.push(v),
                Err(e) => errors.push(err(named("Service", &s.metadata), e.to_string())),
            },
            Manifest::EndpointSlice(es) => match convert::slice(es, Validation::Directory) {
                Ok((key, slice, problems)) => {
                    errors.extend(
                        problems
                            .into_iter()
                            .map(|p| err(named("EndpointSlice", &es.metadata), p)),
                    );
                    objects.slices.push((key, slice));
                }
                Err(e) => errors.push(err(named("EndpointSlice", &es.metadata), e.to_string())),
            },
            Manifest::ServiceExport(se) => match convert::export(&se.metadata) {
                Ok(v) => objects.exports.push(v),
                Err(e) => errors.push(err(named("ServiceExport", &se.metadata), e.to_string())),
            },
            Manifest::ServiceImport(si) => match convert::import(si) {
                Ok(v) => objects.imports.push(v),
                Err(e) => errors.push(err(named("ServiceImport", &si.metadata), e.to_string())),
            },
            Manifest::Node(n) => match crate::capacity::node(n) {
                Ok(r) => nodes.push(r),
                Err(e) => errors.push(err(
                    ObjectRef::cluster_scoped("Node", n.metadata.name.as_deref().unwrap_or("?")),
                    format!("{e}; not counted in the capacity"),
                )),
            },
            Manifest::Pod(p) => match crate::capacity::pod(p) {
                Ok(r) => pods.push(r),
                Err(e) => errors.push(err(
                    named("Pod", &p.metadata),
                    format!("{e}; not counted in the capacity"),
                )),
            },
            Manifest::ResourceQuota(q) => match crate::capacity::quota(q) {
                Ok(r) => quotas.push((
                    q.metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                    r,
                )),
                Err(e) => errors.push(err(
                    named("ResourceQuota", &q.metadata),
                    format!("{e}; not counted"),
                )),
            },
            Manifest::Other(o) => warnings.push(err(
                o.object.clone(),
                format!(
                    "{} {} is not a kind meridian reads; ignored",
                    o.api_version, o.object.kind
                ),
            )),
            hub_kind @ (Manifest::MemberCluster(_)
            | Manifest::ClusterSchedulingPolicy(_)
            | Manifest::OverridePolicy(_)
            | Manifest::Tenant(_)
            | Manifest::HttpRoute(_)
            | Manifest::GrpcRoute(_)
            | Manifest::ReferenceGrant(_)) => errors.push(err(
                hub_kind.describe(),
                "this kind belongs in the hub directory, not in a member's".into(),
            )),
        }
    }
    Converted {
        objects,
        nodes,
        pods,
        quotas,
        problems: errors,
        warnings,
    }
}

/// A namespaced object as problems name it (`default` and `?` stand in for what is missing).
fn named(
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> ObjectRef {
    ObjectRef {
        kind: kind.to_string(),
        namespace: Some(meta.namespace.clone().unwrap_or_else(|| "default".into())),
        name: meta.name.clone().unwrap_or_else(|| "?".into()),
    }
}

/// At most this many directory reads run at once, so parsing never takes every core from the
/// runtime that answers DNS, xDS and the admin API.
static READS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Arc::new(Semaphore::new((cores / 2).max(1)))
});

/// How one read of a directory on the blocking pool ended.
enum Outcome {
    Read(manifest::Result<DirRead>),
    /// Still running after the budget: the directory's last content keeps serving, and the
    /// next round waits for this read instead of starting another.
    Overran(Duration),
    /// The reader panicked (a bug): reported like an unreadable directory.
    Failed(String),
}

/// One directory's reader and the read in flight, if one overran.
struct Reading {
    reader: Arc<Mutex<DirReader>>,
    budget: Duration,
    in_flight: Option<JoinHandle<manifest::Result<DirRead>>>,
}

impl Reading {
    fn new(limits: Limits) -> Self {
        Self::with(DirReader::new(limits))
    }

    /// A reader of a watched directory: files being written are read once closed.
    fn with(reader: DirReader) -> Self {
        let reader = reader.watching_writes(OPEN_WRITES.clone());
        // A file has `read_timeout`; the whole directory gets twice that before it is reported.
        let budget = reader.limits().read_timeout * 2;
        Self {
            reader: Arc::new(Mutex::new(reader)),
            budget,
            in_flight: None,
        }
    }

    async fn read(&mut self, dir: &Path) -> Outcome {
        // The permit is ours, not the blocking thread's: a read stuck in the kernel (a hung
        // FUSE file) must not hold back every other directory once it overran.
        let _permit = READS.clone().acquire_owned().await;
        let mut job = match self.in_flight.take() {
            Some(job) => job,
            None => {
                let reader = self.reader.clone();
                let dir = dir.to_path_buf();
                tokio::task::spawn_blocking(move || reader.lock().read(&dir, Instant::now()))
            }
        };
        match tokio::time::timeout(self.budget, &mut job).await {
            Ok(Ok(read)) => Outcome::Read(read),
            Ok(Err(e)) => Outcome::Failed(format!("reading the directory failed: {e}")),
            Err(_) => {
                self.in_flight = Some(job);
                Outcome::Overran(self.budget)
            }
        }
    }
}

/// The heartbeat of a directory whose read overran its budget.
fn overran(cluster: &ClusterId, dir: &Path, budget: Duration) -> SourceEvent {
    let reason = format!(
        "reading directory {} takes longer than {budget:?} (directory.readTimeoutSeconds); its last content keeps serving",
        dir.display()
    );
    warn!(dir = %dir.display(), "{reason}");
    SourceEvent::Heartbeat {
        cluster: cluster.clone(),
        result: Err(reason),
    }
}

/// How long to wait before the next round: the poll, or sooner if a file is settling.
fn next_round(poll: Duration, again_in: Option<Duration>) -> Duration {
    again_in.map_or(poll, |d| d.min(poll))
}
/// One inotify instance for every watched directory, shared by all sources: the kernel allows
/// 128 instances per user by default, and a fleet can have more members than that (beyond it,
/// members would fall back to polling every heartbeat).
struct SharedWatcher {
    /// The one inotify instance (none if the kernel refused one: then directories are polled).
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
    /// Who wants to hear about changes under which directory.
    subscribers: Arc<Mutex<Vec<Subscriber>>>,
}

/// A directory and the source waiting on it (gone when the source ends).
type Subscriber = (PathBuf, Weak<Notify>);

static SHARED_WATCHER: LazyLock<SharedWatcher> = LazyLock::new(SharedWatcher::new);

/// The files being written under every watched directory (see [`OpenWrites`]).
static OPEN_WRITES: LazyLock<Arc<OpenWrites>> = LazyLock::new(Arc::default);

/// Keeps [`OPEN_WRITES`] up to date; false for an event that changes nothing a reader sees.
fn note_writes(event: &notify::Event) -> bool {
    use notify::EventKind::{Access, Create, Modify, Remove};
    use notify::event::{AccessKind, AccessMode, ModifyKind};
    match event.kind {
        Modify(ModifyKind::Data(_)) => {
            let now = Instant::now();
            event.paths.iter().for_each(|p| OPEN_WRITES.written(p, now));
            true
        }
        // A writer done, or another file renamed onto the path: what is there is whole.
        Access(AccessKind::Close(AccessMode::Write)) | Modify(ModifyKind::Name(_)) | Remove(_) => {
            event.paths.iter().for_each(|p| OPEN_WRITES.closed(p));
            true
        }
        // Our own reads open the files and directories (inotify IN_OPEN, IN_ACCESS,
        // IN_CLOSE_NOWRITE): those must not count, or every read would schedule the next.
        Access(_) => false,
        Create(_) | Modify(_) | notify::EventKind::Any | notify::EventKind::Other => true,
    }
}

impl SharedWatcher {
    fn new() -> Self {
        let subscribers: Arc<Mutex<Vec<Subscriber>>> = Arc::default();
        let routes = subscribers.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if !note_writes(&event) {
                return;
            }
            let mut routes = routes.lock();
            routes.retain(|(_, n)| n.strong_count() > 0);
            for (dir, notify) in routes.iter() {
                if event.paths.iter().any(|p| p.starts_with(dir))
                    && let Some(n) = notify.upgrade()
                {
                    n.notify_one();
                }
            }
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(error = %e, "cannot create an inotify watcher; directories are polled only");
                None
            }
        };
        Self {
            watcher: Mutex::new(watcher),
            subscribers,
        }
    }

    /// Watches `dir` (recursively) for `notify`; false if it cannot.
    fn watch(&self, dir: &Path, notify: &Arc<Notify>) -> bool {
        let mut watcher = self.watcher.lock();
        let Some(w) = watcher.as_mut() else {
            return false;
        };
        // A directory that was removed and created again needs a new watch.
        let _ = w.unwatch(dir);
        if let Err(e) = w.watch(dir, RecursiveMode::Recursive) {
            debug!(dir = %dir.display(), error = %e, "cannot watch directory");
            // A recursive watch that failed half-way keeps the watches it took.
            let _ = w.unwatch(dir);
            return false;
        }
        let mut subscribers = self.subscribers.lock();
        if !subscribers
            .iter()
            .any(|(d, n)| d == dir && n.upgrade().is_some_and(|n| Arc::ptr_eq(&n, notify)))
        {
            subscribers.push((dir.to_path_buf(), Arc::downgrade(notify)));
        }
        true
    }

    /// `notify` no longer listens under `dir`; the watch goes with its last listener, so a
    /// removed member gives its watches back to the others.
    fn forget(&self, dir: &Path, notify: &Arc<Notify>) {
        let mut watcher = self.watcher.lock();
        let last = {
            let mut subscribers = self.subscribers.lock();
            subscribers.retain(|(d, n)| {
                n.upgrade()
                    .is_some_and(|n| !(d == dir && Arc::ptr_eq(&n, notify)))
            });
            !subscribers.iter().any(|(d, _)| d == dir)
        };
        // Not under the subscribers' lock: unwatching waits on the event thread, whose
        // callback takes that lock.
        if last && let Some(w) = watcher.as_mut() {
            let _ = w.unwatch(dir);
        }
    }
}

/// Directories one member's watch may take at most: inotify watches are counted per user
/// (`fs.inotify.max_user_watches`) and shared by every member, so one member pointed at a
/// large tree must not leave the others polling. A larger tree is polled.
const MAX_WATCHED_DIRECTORIES: usize = 1024;

/// Keeps a directory watched for as long as it lives, so that [`open_writes`] knows which of
/// its files are being written (a file read on its own, like the geo ranges).
pub(crate) struct WritesWatch(DirWatch);

impl WritesWatch {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self(DirWatch::new(dir))
    }

    pub(crate) fn arm(&mut self) {
        self.0.arm();
    }
}

/// The files being written under every watched directory.
pub(crate) fn open_writes() -> Arc<OpenWrites> {
    OPEN_WRITES.clone()
}

/// A watch on a directory that may not exist yet; `arm` retries until it does.
struct DirWatch {
    dir: PathBuf,
    changed: Arc<Notify>,
    /// The canonical path watched, while watching.
    watching: Option<PathBuf>,
    warned: bool,
}

impl DirWatch {
    fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            changed: Arc::new(Notify::new()),
            watching: None,
            warned: false,
        }
    }

    fn arm(&mut self) {
        if !self.dir.is_dir() {
            self.unwatch();
            return;
        }
        if self.watching.is_some() {
            return;
        }
        if let Err(e) = manifest::directories_within(&self.dir, MAX_WATCHED_DIRECTORIES) {
            self.warn_once(&format!("not watched, polled: {e}"));
            return;
        }
        // Events name paths under the watched path as given: watch the canonical one.
        let dir = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        if SHARED_WATCHER.watch(&dir, &self.changed) {
            self.watching = Some(dir);
        } else {
            self.warn_once("cannot watch directory; polling only");
        }
    }

    fn warn_once(&mut self, what: &str) {
        if !self.warned {
            self.warned = true;
            warn!(dir = %self.dir.display(), "{what}");
        }
    }

    fn unwatch(&mut self) {
        if let Some(dir) = self.watching.take() {
            SHARED_WATCHER.forget(&dir, &self.changed);
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

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.unwatch();
    }
}

/// The file a problem names, for log lines.
fn file_of(p: &Problem) -> std::path::Display<'_> {
    match &p.source {
        Source::File { path } => path.display(),
        _ => Path::new("").display(),
    }
}

/// The events one read of a member directory produces: its objects with their problems and
/// warnings, and a heartbeat saying whether the directory could be read. `meridian validate`
/// feeds these to the fleet as the running source does.
pub fn read_member(cluster: &ClusterId, dir: &Path, limits: &Limits) -> Vec<SourceEvent> {
    let read = DirReader::new(limits.once()).read(dir, Instant::now());
    member_events(cluster, dir, read)
}

/// The events of one read: a reset when what the directory serves changed, and a heartbeat.
fn member_events(
    cluster: &ClusterId,
    dir: &Path,
    read: manifest::Result<DirRead>,
) -> Vec<SourceEvent> {
    let read = match read {
        Ok(read) if read.first_read_pending => return vec![],
        Ok(read) => read,
        // Not the member's fault: no heartbeat either way, so its health stands as it was.
        Err(e) if crate::out_of_descriptors(&e) => {
            warn!(cluster = %cluster, dir = %dir.display(), "{}", crate::OUT_OF_DESCRIPTORS);
            return vec![];
        }
        Err(e) => return vec![missing(cluster, dir, &e)],
    };
    let heartbeat = SourceEvent::Heartbeat {
        cluster: cluster.clone(),
        result: Ok(()),
    };
    if !read.changed {
        return vec![heartbeat];
    }
    let read = member_objects(cluster, read.loaded);
    vec![
        SourceEvent::Reset {
            cluster: cluster.clone(),
            objects: read.objects,
            problems: read.problems,
            warnings: read.warnings,
        },
        SourceEvent::Capacity {
            cluster: cluster.clone(),
            capacity: read.capacity,
        },
        heartbeat,
    ]
}

/// One object's identity in a member.
type ObjectId = (Kind, ObjectKey);

fn id_of(object: &Object) -> ObjectId {
    match object {
        Object::Service(key, _) => (Kind::Service, key.clone()),
        Object::Export(key, _) => (Kind::Export, key.clone()),
        Object::Slice(key, _) => (Kind::Slice, key.clone()),
        Object::Import(key, _) => (Kind::Import, key.clone()),
    }
}

/// One document of a member file, converted.
struct DocObjects {
    key: DocKey,
    objects: Vec<Object>,
    /// Its capacity inputs and problems; None for most documents, which have none.
    rest: Option<Box<Converted>>,
}

impl DocObjects {
    fn convert(cluster: &ClusterId, key: DocKey, manifests: &[(PathBuf, Manifest)]) -> Self {
        let mut rest = convert_read(cluster, manifests, &[], &[]);
        let objects = objects_of(std::mem::take(&mut rest.objects));
        Self {
            key,
            objects,
            rest: (!rest.is_empty()).then(|| Box::new(rest)),
        }
    }
}

fn objects_of(objects: ClusterObjects) -> Vec<Object> {
    let ClusterObjects {
        services,
        exports,
        slices,
        imports,
    } = objects;
    (services.into_iter().map(|(k, v)| Object::Service(k, v)))
        .chain(exports.into_iter().map(|(k, v)| Object::Export(k, v)))
        .chain(slices.into_iter().map(|(k, v)| Object::Slice(k, v)))
        .chain(imports.into_iter().map(|(k, v)| Object::Import(k, v)))
        .collect()
}

/// One file of a member directory, converted document by document: the reader drops its
/// typed manifests once they are converted, so an unchanged document's conversion is taken
/// from here when the file is read again.
struct FileObjects {
    /// The reader's version of the content it was converted from.
    version: u64,
    docs: Vec<DocObjects>,
    /// Where each object is (document, position): of two documents defining one object, the
    /// later, as in a relist.
    at: HashMap<ObjectId, (u32, u32)>,
    /// The file's capacity inputs, problems and warnings, its documents' together.
    rest: Converted,
}

/// A served file's document was released by the reader but its conversion is not kept here
/// (a bug): the file's last conversion, given back to keep serving while the file is read
/// again from scratch.
struct ConversionMissing(Option<Box<FileObjects>>);

/// The version of a conversion no read has: the next read of its file converts it again.
const STALE: u64 = u64::MAX;

impl FileObjects {
    /// Converts what `served` holds, taking unchanged documents' conversions from `before`
    /// (this file's last conversion). Returns the file and the objects whose content
    /// differs from `before` — an edit of one object in a file of thousands is one change.
    fn convert(
        cluster: &ClusterId,
        served: &ServedFile<'_>,
        before: Option<FileObjects>,
    ) -> Result<(Self, Vec<ObjectId>), ConversionMissing> {
        let old_place: HashMap<DocKey, usize> = (before.iter())
            .flat_map(|b| b.docs.iter().enumerate().map(|(i, d)| (d.key, i)))
            .collect();
        let lost = |(key, manifests): (DocKey, Option<_>)| {
            manifests.is_none() && !old_place.contains_key(&key)
        };
        if served.documents().any(lost) {
            return Err(ConversionMissing(before.map(Box::new)));
        }
        let (mut kept, old_at) = match before {
            Some(b) => (b.docs.into_iter().map(Some).collect(), b.at),
            None => (Vec::new(), HashMap::new()),
        };
        // Each document: converted now, or its earlier conversion (by place in `kept`).
        let plan: Vec<Result<DocObjects, usize>> = (served.documents())
            .map(|(key, manifests)| match manifests {
                Some(manifests) => Ok(DocObjects::convert(cluster, key, manifests)),
                None => Err(old_place[&key]),
            })
            .collect();
        // Only objects of documents converted now or gone may differ: every other object is
        // defined by the same documents, in the same order, as before.
        let mut reused = vec![false; kept.len()];
        for place in plan.iter().filter_map(|p| p.as_ref().err()) {
            reused[*place] = true;
        }
        let gone = (kept.iter().zip(&reused))
            .filter(|(_, reused)| !**reused)
            .filter_map(|(doc, _)| doc.as_ref());
        let new = plan.iter().filter_map(|p| p.as_ref().ok());
        let candidates: HashSet<ObjectId> = (gone.chain(new))
            .flat_map(|d| d.objects.iter().map(id_of))
            .collect();
        let was: HashMap<ObjectId, Object> = (candidates.iter())
            .filter_map(|id| Some((id.clone(), object_at(&kept, *old_at.get(id)?)?.clone())))
            .collect();
        let docs: Vec<DocObjects> = (plan.into_iter())
            .map(|p| p.unwrap_or_else(|place| kept[place].take().expect("each place once")))
            .collect();
        let file = Self::assemble(cluster, served, docs);
        let changed = (candidates.into_iter())
            .filter(|id| file.get(id) != was.get(id))
            .collect();
        Ok((file, changed))
    }

    fn assemble(cluster: &ClusterId, served: &ServedFile<'_>, docs: Vec<DocObjects>) -> Self {
        let mut at = HashMap::new();
        let mut rest = convert_read(cluster, &[], served.errors(), served.warnings());
        for (d, doc) in docs.iter().enumerate() {
            for (o, object) in doc.objects.iter().enumerate() {
                at.insert(id_of(object), (d as u32, o as u32));
            }
            if let Some(more) = &doc.rest {
                rest.add(more);
            }
        }
        Self {
            version: served.version,
            docs,
            at,
            rest,
        }
    }

    fn get(&self, id: &ObjectId) -> Option<&Object> {
        let (d, o) = *self.at.get(id)?;
        self.docs.get(d as usize)?.objects.get(o as usize)
    }

    /// Every object the file defines (of two with one identity, the later).
    fn objects(&self) -> impl Iterator<Item = &Object> {
        self.at.keys().filter_map(|id| self.get(id))
    }
}

fn object_at(docs: &[Option<DocObjects>], (d, o): (u32, u32)) -> Option<&Object> {
    docs.get(d as usize)?.as_ref()?.objects.get(o as usize)
}

/// A member directory's files, converted one by one and kept between reads, so that an edit
/// of one file converts that file only and reaches the fleet as the changes it makes, not as a
/// relist of the whole member (whose cost grows with the member, on every edit). The first
/// read, a read after the directory was missing, and any change of warnings (which only a
/// relist carries) are relists.
#[derive(Default)]
struct MemberFiles {
    /// Per file, in path order (as the reader serves them: of two files defining one object,
    /// the later wins, as in a relist).
    files: BTreeMap<PathBuf, FileObjects>,
    /// The warnings the fleet holds; None until a relist was sent.
    sent_warnings: Option<Vec<Problem>>,
}

impl MemberFiles {
    /// The events for what `reader` serves now (it just read the directory and found it
    /// changed). Releases the reader's manifests: their conversions are kept here.
    fn events(&mut self, cluster: &ClusterId, reader: &mut DirReader) -> Vec<SourceEvent> {
        let mut touched: HashSet<ObjectId> = HashSet::new();
        let mut files = BTreeMap::new();
        let mut read_again = Vec::new();
        for served in reader.served_files() {
            let file = match self.files.remove(served.path) {
                Some(same) if same.version == served.version => same,
                before => match FileObjects::convert(cluster, &served, before) {
                    Ok((file, changed)) => {
                        touched.extend(changed);
                        file
                    }
                    Err(ConversionMissing(before)) => {
                        read_again.push(served.path.to_path_buf());
                        let Some(mut before) = before else { continue };
                        before.version = STALE;
                        *before
                    }
                },
            };
            files.insert(served.path.to_path_buf(), file);
        }
        // What is left was removed.
        for old in std::mem::take(&mut self.files).values() {
            touched.extend(old.at.keys().cloned());
        }
        self.files = files;
        for path in read_again {
            tracing::error!(file = %path.display(), "a document's conversion was lost; its last content keeps serving and the file is read again from scratch");
            reader.forget_file(&path);
        }
        reader.release_manifests();
        let problems: Vec<Problem> = self.parts().flat_map(|c| c.problems.clone()).collect();
        let warnings: Vec<Problem> = self.parts().flat_map(|c| c.warnings.clone()).collect();
        let capacity = SourceEvent::Capacity {
            cluster: cluster.clone(),
            capacity: capacity_of(self.parts()),
        };
        let list = if self.sent_warnings.as_ref() == Some(&warnings) {
            SourceEvent::Changes {
                cluster: cluster.clone(),
                changes: self.changes(touched),
                problems,
            }
        } else {
            self.sent_warnings = Some(warnings.clone());
            SourceEvent::Reset {
                cluster: cluster.clone(),
                objects: self.objects(),
                problems,
                warnings,
            }
        };
        vec![list, capacity]
    }

    /// The directory could not be listed: it is relisted in full when it is back (the files'
    /// conversions stay, as the reader keeps what it read).
    fn relist_next(&mut self) {
        self.sent_warnings = None;
    }

    fn parts(&self) -> impl Iterator<Item = &Converted> + Clone {
        self.files.values().map(|f| &f.rest)
    }

    /// Each touched object as the files hold it now (the last file defining it), or deleted.
    fn changes(&self, touched: HashSet<ObjectId>) -> Vec<Change> {
        touched
            .into_iter()
            .map(
                |id| match self.files.values().rev().find_map(|f| f.get(&id)) {
                    Some(object) => Change::Upsert(object.clone()),
                    None => Change::Delete(id.0, id.1),
                },
            )
            .collect()
    }

    /// Everything, for a relist: later files win, as in the Index.
    fn objects(&self) -> ClusterObjects {
        let mut objects = ClusterObjects::default();
        for object in self.files.values().flat_map(FileObjects::objects) {
            match object.clone() {
                Object::Service(k, v) => objects.services.push((k, v)),
                Object::Export(k, v) => objects.exports.push((k, v)),
                Object::Slice(k, v) => objects.slices.push((k, v)),
                Object::Import(k, v) => objects.imports.push((k, v)),
            }
        }
        objects
    }
}

/// A heartbeat for a directory that is not there (or cannot be listed).
fn missing(cluster: &ClusterId, dir: &Path, e: &manifest::Error) -> SourceEvent {
    SourceEvent::Heartbeat {
        cluster: cluster.clone(),
        result: Err(format!(
            "directory {} is missing or unreadable: {}",
            dir.display(),
            crate::reason_of(e)
        )),
    }
}

/// Logs what a read rejected or served with a caveat, once per read.
fn log_read(event: &SourceEvent) {
    let (problems, warnings): (&[Problem], &[Problem]) = match event {
        SourceEvent::Reset {
            objects,
            problems,
            warnings,
            ..
        } => {
            debug!(
                services = objects.services.len(),
                slices = objects.slices.len(),
                "member directory read"
            );
            (problems, warnings)
        }
        SourceEvent::Changes {
            changes, problems, ..
        } => {
            debug!(changes = changes.len(), "member directory edited");
            (problems, &[])
        }
        _ => return,
    };
    for p in problems {
        warn!(file = %file_of(p), object = %p.subject, reason = %p.reason, "member manifest rejected");
    }
    for w in warnings {
        warn!(file = %file_of(w), object = %w.subject, reason = %w.reason, "member manifest warning");
    }
}

/// One directory member: reads it on every change, heartbeats every `heartbeat_seconds`.
pub async fn run_member(
    cluster: ClusterId,
    dir: PathBuf,
    heartbeat_seconds: u64,
    limits: Limits,
    tx: mpsc::Sender<SourceEvent>,
) {
    let mut watch = DirWatch::new(dir.clone());
    let mut reading = Reading::with(DirReader::per_file(limits.clone()));
    let mut files = MemberFiles::default();
    let poll = Duration::from_secs(heartbeat_seconds.max(1));
    loop {
        watch.arm();
        let mut again_in = None;
        let events = match reading.read(&dir).await {
            Outcome::Read(read) => {
                again_in = read.as_ref().ok().and_then(|r| r.again_in);
                match read {
                    Ok(read) if read.changed && !read.first_read_pending => {
                        let mut events = files.events(&cluster, &mut reading.reader.lock());
                        events.push(SourceEvent::Heartbeat {
                            cluster: cluster.clone(),
                            result: Ok(()),
                        });
                        events
                    }
                    read => {
                        if read.is_err() {
                            files.relist_next();
                        }
                        member_events(&cluster, &dir, read)
                    }
                }
            }
            Outcome::Overran(budget) => vec![overran(&cluster, &dir, budget)],
            Outcome::Failed(reason) => {
                // What the reader held may be half-updated: both start over.
                reading = Reading::with(DirReader::per_file(limits.clone()));
                files = MemberFiles::default();
                vec![SourceEvent::Heartbeat {
                    cluster: cluster.clone(),
                    result: Err(reason),
                }]
            }
        };
        for event in events {
            log_read(&event);
            if tx.send(event).await.is_err() {
                return;
            }
        }
        watch.wait(next_round(poll, again_in)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::MemberSource;

    #[test]
    fn of_two_members_of_one_name_the_oldest_wins_whatever_the_file_order() {
        let dir = tempfile::tempdir().unwrap();
        let member = |created: &str, path: &str| {
            format!(
                "apiVersion: meridian.io/v1alpha1\nkind: MemberCluster\nmetadata: {{name: eu-1, creationTimestamp: \"{created}\"}}\nspec: {{source: {{directory: {{path: {path}}}}}}}\n"
            )
        };
        std::fs::write(
            dir.path().join("b-running.yaml"),
            member("2026-01-01T00:00:00Z", "running"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("a-new.yaml"),
            member("2026-06-01T00:00:00Z", "newcomer"),
        )
        .unwrap();
        let hub = read_hub(dir.path()).unwrap();
        assert_eq!(hub.members.len(), 1);
        let MemberSource::Directory(path) = &hub.members[0].source else {
            panic!("a directory member: {:?}", hub.members[0].source);
        };
        assert!(path.ends_with("running"), "{path:?}");
        assert!(
            hub.errors[0].to_string().contains("a-new.yaml")
                && hub.errors[0].reason.contains("defined twice"),
            "{:?}",
            hub.errors
        );
    }

    fn service_yaml(name: &str, address: &str, slice: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n---\n\
             apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ServiceExport\nmetadata: {{name: {name}, namespace: shop}}\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {slice}, namespace: shop, labels: {{kubernetes.io/service-name: {name}}}}}\n\
             addressType: IPv4\nports: [{{name: http, port: 80}}]\nendpoints: [{{addresses: [{address}]}}]\n"
        )
    }

    /// What the fleet serves of member `m` after `events`, beside what a relist of the
    /// directory serves: they must be equal.
    fn served_after(
        fleet: &mut meridian_core::testing::FleetBuilder,
        events: &[SourceEvent],
    ) -> String {
        for event in events {
            match event {
                SourceEvent::Reset { objects, .. } => {
                    fleet.reset("m", objects.clone());
                }
                SourceEvent::Changes { changes, .. } => {
                    for change in changes {
                        match change.clone() {
                            Change::Upsert(object) => {
                                fleet.apply("m", object);
                            }
                            Change::Delete(kind, key) => {
                                fleet.index.delete(&ClusterId::new("m"), kind, &key);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        format!("{:?}", fleet.snapshot().services().collect::<Vec<_>>())
    }

    fn relisted(dir: &Path) -> String {
        let mut fleet = meridian_core::testing::FleetBuilder::with_members(&["m"]);
        let read = member_objects(
            &ClusterId::new("m"),
            DirReader::new(Limits::default().once())
                .read(dir, Instant::now())
                .unwrap()
                .loaded,
        );
        fleet.reset("m", read.objects);
        format!("{:?}", fleet.snapshot().services().collect::<Vec<_>>())
    }

    fn changed_ids(events: &[SourceEvent]) -> Option<Vec<String>> {
        let SourceEvent::Changes { changes, .. } = &events[0] else {
            return None;
        };
        let mut ids: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Upsert(o) => format!("upsert {:?} {}", id_of(o).0, id_of(o).1),
                Change::Delete(kind, key) => format!("delete {kind:?} {key}"),
            })
            .collect();
        ids.sort();
        Some(ids)
    }

    #[test]
    fn an_edit_of_one_file_reaches_the_fleet_as_its_changes_and_serves_what_a_relist_would() {
        let dir = tempfile::tempdir().unwrap();
        let write = |file: &str, text: String| std::fs::write(dir.path().join(file), text).unwrap();
        write("a.yaml", service_yaml("s1", "10.0.0.1", "s1-a"));
        write("b.yaml", service_yaml("s2", "10.0.0.2", "s2-b"));
        // c.yaml defines s1's slice again, later in path order: it wins, as in a relist.
        write("c.yaml", service_yaml("s1", "10.0.0.3", "s1-a"));
        let cluster = ClusterId::new("m");
        let mut reader = DirReader::per_file(Limits::default().once());
        let mut files = MemberFiles::default();
        let mut fleet = meridian_core::testing::FleetBuilder::with_members(&["m"]);
        let mut step = |reader: &mut DirReader, files: &mut MemberFiles| {
            let read = reader.read(dir.path(), Instant::now()).unwrap();
            assert!(read.changed && read.loaded.manifests.is_empty());
            let events = files.events(&cluster, reader);
            assert!(
                reader
                    .served_files()
                    .all(|f| f.documents().all(|(_, m)| m.is_none())),
                "the reader keeps no manifests once they are converted"
            );
            assert_eq!(served_after(&mut fleet, &events), relisted(dir.path()));
            events
        };
        let first = step(&mut reader, &mut files);
        assert!(
            matches!(first[0], SourceEvent::Reset { .. }),
            "the first read is a relist"
        );
        assert!(matches!(first[1], SourceEvent::Capacity { .. }));

        write("b.yaml", service_yaml("s2", "10.0.0.9", "s2-b"));
        let events = step(&mut reader, &mut files);
        assert_eq!(
            changed_ids(&events).expect("an edit is a change, not a relist"),
            ["upsert Slice shop/s2-b"],
            "only the edited object changes, not everything its file holds"
        );

        // An edit that drops an object from its file deletes it.
        let s2 = service_yaml("s2", "10.0.0.9", "s2-b");
        let without_slice = &s2[..s2.find("---\napiVersion: discovery.k8s.io/v1").unwrap()];
        write("b.yaml", without_slice.to_string());
        let events = step(&mut reader, &mut files);
        assert_eq!(changed_ids(&events).unwrap(), ["delete Slice shop/s2-b"]);
        write("b.yaml", service_yaml("s2", "10.0.0.9", "s2-b"));
        step(&mut reader, &mut files);

        std::fs::remove_file(dir.path().join("c.yaml")).unwrap();
        let events = step(&mut reader, &mut files);
        assert_eq!(
            changed_ids(&events).unwrap(),
            [
                "upsert Export shop/s1",
                "upsert Service shop/s1",
                "upsert Slice shop/s1-a"
            ],
            "a.yaml's s1 serves again"
        );

        std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
        let events = step(&mut reader, &mut files);
        assert_eq!(
            changed_ids(&events).unwrap(),
            [
                "delete Export shop/s2",
                "delete Service shop/s2",
                "delete Slice shop/s2-b"
            ]
        );

        // A warning appears (a kind meridian does not read): only a relist carries warnings.
        write(
            "d.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: shop}\n".into(),
        );
        let events = step(&mut reader, &mut files);
        assert!(matches!(&events[0], SourceEvent::Reset { warnings, .. } if warnings.len() == 1));
    }

    #[test]
    fn a_lost_conversion_keeps_the_file_serving_and_the_file_is_read_again_from_scratch() {
        let dir = tempfile::tempdir().unwrap();
        let write = |text: String| std::fs::write(dir.path().join("a.yaml"), text).unwrap();
        write(service_yaml("s1", "10.0.0.1", "s1-a"));
        let cluster = ClusterId::new("m");
        let mut reader = DirReader::per_file(Limits::default().once());
        let mut files = MemberFiles::default();
        let mut fleet = meridian_core::testing::FleetBuilder::with_members(&["m"]);
        let mut step = |reader: &mut DirReader, files: &mut MemberFiles| {
            assert!(reader.read(dir.path(), Instant::now()).unwrap().changed);
            let events = files.events(&cluster, reader);
            served_after(&mut fleet, &events)
        };
        let before = step(&mut reader, &mut files);
        // A bug loses the documents' conversions; the Service and its export stay unchanged
        // in the edit, so the reader offers them as released.
        let file = files.files.values_mut().next().unwrap();
        file.docs.clear();
        write(service_yaml("s1", "10.0.0.9", "s1-a"));
        assert_eq!(
            step(&mut reader, &mut files),
            before,
            "what the file served keeps serving"
        );
        assert_eq!(files.files.values().next().unwrap().version, STALE);
        let after = step(&mut reader, &mut files);
        assert_eq!(after, relisted(dir.path()), "read again from scratch");
        assert!(after.contains("10.0.0.9"), "{after}");
    }
}
