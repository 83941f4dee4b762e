//! The directory applier: keeps rendered objects on disk in step with the placement decisions
//! (`meridian render --out DIR`, and a directory member's `renderPath` while serving).
//!
//! ```text
//!  Snapshot (placements, templates, overrides) ──federation::render::render_all──► files
//!     ──sync_dir (blocking pool)──► write what changed (atomically: temp file + rename),
//!                                   remove files meridian wrote that are no longer placed
//! ```
//!
//! A file is meridian's when it carries the `app.kubernetes.io/managed-by: meridian` label and
//! a `meridian.io/template` annotation; nothing else in the directory is ever touched, so an
//! output directory can be a GitOps repository with files of its own.
//!
//! A template that is unschedulable now keeps the files rendered for it before (and those of
//! the dependencies it names): committed to a GitOps repository, removing them would delete
//! what runs ([`Keep`]). A template gone from the hub, or no longer placed, is removed.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use meridian_core::{ClusterId, Snapshot};
use meridian_federation::render::{self, Rendered};
use tokio::sync::watch;
use tracing::{info, warn};

/// What one sync did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub written: Vec<PathBuf>,
    pub unchanged: usize,
    pub removed: Vec<PathBuf>,
    /// Files no longer rendered that stay, with the template they were rendered from: it is
    /// unschedulable now ([`Keep`]).
    pub kept: Vec<(PathBuf, String)>,
}

/// The templates whose earlier files stay when they are not rendered now: those whose
/// decision is unschedulable, and the dependencies they name (as `meridian.io/template`
/// annotations, `<apiVersion>/<Kind>/<namespace>/<name>`).
#[derive(Clone, Debug, Default)]
pub struct Keep(HashSet<String>);

impl Keep {
    pub fn of(snapshot: &Snapshot) -> Self {
        let mut keep = HashSet::new();
        for (key, d) in &snapshot.placements.decisions {
            if d.is_scheduled() {
                continue;
            }
            keep.insert(key.to_string());
            if let Some(t) = snapshot.templates.iter().find(|t| &t.key == key) {
                keep.extend(t.dependencies.iter().map(ToString::to_string));
            }
        }
        Self(keep)
    }

    /// The template a file of meridian's was rendered from, when it is one to keep.
    fn template_kept(&self, text: &str) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        let template = template_of(text)?;
        self.0.contains(&template).then_some(template)
    }
}

/// Everything rendered from a snapshot's decisions.
pub fn render_snapshot(snapshot: &Snapshot) -> Rendered {
    render::render_all(
        &snapshot.placements,
        &snapshot.templates,
        &snapshot.overrides,
    )
}

/// The files of one cluster, relative to that cluster's own directory (`<namespace>/…`).
pub fn files_of(rendered: &Rendered, cluster: &ClusterId) -> BTreeMap<PathBuf, String> {
    rendered
        .files
        .iter()
        .filter_map(|(path, text)| {
            let rest = path.strip_prefix(cluster.as_str()).ok()?;
            Some((rest.to_path_buf(), text.clone()))
        })
        .collect()
}

/// Makes `root` hold exactly `files` among the files meridian wrote there: writes new and
/// changed ones, removes meridian's files that are not in `files` (and directories that
/// leaves empty), leaves everything else alone. Paths in `files` are relative and were built
/// by `federation::render::path`, which refuses any component that could leave `root`.
pub fn sync_dir(root: &Path, files: &BTreeMap<PathBuf, String>, keep: &Keep) -> io::Result<Synced> {
    RenderedDir::scan(root)?.sync(files, keep)
}

/// A directory meridian renders into, and what it last wrote there: a server keeps one per
/// `renderPath`, so a change re-reads no file (the first sync scans the directory once).
#[derive(Debug)]
pub struct RenderedDir {
    root: PathBuf,
    /// Meridian's files under `root`, relative, with their content.
    files: BTreeMap<PathBuf, String>,
}

impl RenderedDir {
    /// Reads which files under `root` meridian rendered (creating `root` if missing).
    pub fn scan(root: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(root)?;
        let files = ours(root)?.into_iter().collect();
        Ok(Self {
            root: root.to_path_buf(),
            files,
        })
    }

    /// See [`sync_dir`]. On an error the record may be behind the disk: scan again.
    pub fn sync(mut self, files: &BTreeMap<PathBuf, String>, keep: &Keep) -> io::Result<Synced> {
        self.sync_in_place(files, keep)
    }

    fn sync_in_place(
        &mut self,
        files: &BTreeMap<PathBuf, String>,
        keep: &Keep,
    ) -> io::Result<Synced> {
        let root = self.root.clone();
        let mut synced = Synced::default();
        for (rel, text) in files {
            if self.files.get(rel) == Some(text) {
                synced.unchanged += 1;
                continue;
            }
            write_confined(&root, rel, text)?;
            self.files.insert(rel.clone(), text.clone());
            synced.written.push(rel.clone());
        }
        let mut gone = Vec::new();
        for (rel, text) in &self.files {
            if files.contains_key(rel) {
                continue;
            }
            match keep.template_kept(text) {
                Some(template) => synced.kept.push((rel.clone(), template)),
                None => gone.push(rel.clone()),
            }
        }
        for rel in gone {
            let dir = confined_dir(&root, rel.parent(), false)?;
            let Some(name) = rel.file_name() else {
                continue;
            };
            match std::fs::remove_file(dir.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            self.files.remove(&rel);
            remove_empty_parents(&root, &rel);
            synced.removed.push(rel);
        }
        Ok(synced)
    }
}

/// Writes `root/rel` atomically without following a symlink anywhere under `root`: every
/// directory on the way must be a real one (created if missing), the temporary file is
/// created exclusively (a link planted at its name is removed, never written through), and
/// the rename replaces whatever is at the name itself.
fn write_confined(root: &Path, rel: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    let dir = confined_dir(root, rel.parent(), true)?;
    let name = rel
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{}: no file name", rel.display())))?;
    let tmp = dir.join(format!(".{}.meridian-tmp", name.to_string_lossy()));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    drop(file);
    let path = dir.join(name);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
        let _ = std::fs::remove_file(&tmp);
        return Err(in_the_way(&path, "a directory"));
    }
    std::fs::rename(&tmp, path)
}

/// `root/parent`, checked one component at a time: each a directory, none a symlink
/// (created when `create` and missing).
fn confined_dir(root: &Path, parent: Option<&Path>, create: bool) -> io::Result<PathBuf> {
    let mut dir = root.to_path_buf();
    for part in parent.into_iter().flat_map(Path::components) {
        let std::path::Component::Normal(part) = part else {
            return Err(io::Error::other(format!(
                "{}: a path component that could leave the directory",
                dir.display()
            )));
        };
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(in_the_way(&dir, "a symlink (never followed)"));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(in_the_way(&dir, "not a directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                std::fs::create_dir(&dir)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(dir)
}

fn in_the_way(path: &Path, what: &str) -> io::Error {
    io::Error::other(format!("{} is in the way: {what}", path.display()))
}

/// The largest file meridian renders: an object the API server takes (1.5 MiB in etcd) as
/// YAML. A larger file is someone else's and is never read whole.
const LARGEST_RENDERED: u64 = 4 << 20;

/// The YAML files under `root` that meridian rendered, relative to it, with their text.
/// Symlinks are never followed (neither to files nor to directories).
fn ours(root: &Path) -> io::Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file()
                && path.extension().is_some_and(|e| e == "yaml")
                && let Some(text) = rendered_by_meridian(&path)
                && let Ok(rel) = path.strip_prefix(root)
            {
                out.push((rel.to_path_buf(), text));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The text of a file meridian rendered: its label and annotation, as `to_yaml` prints
/// them (sorted keys, one document). None for anything else, read no further than
/// [`LARGEST_RENDERED`].
fn rendered_by_meridian(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    if file.metadata().ok()?.len() > LARGEST_RENDERED {
        return None;
    }
    let mut text = String::new();
    file.take(LARGEST_RENDERED + 1)
        .read_to_string(&mut text)
        .ok()?;
    if text.len() as u64 > LARGEST_RENDERED {
        return None;
    }
    template_of(&text).is_some().then_some(text)
}

/// The template a file meridian rendered was rendered from (None: not meridian's).
fn template_of(text: &str) -> Option<String> {
    let value = serde_yaml_ng::from_str::<serde_json::Value>(text).ok()?;
    let meta = &value["metadata"];
    if meta["labels"][render::MANAGED_BY_LABEL] != render::MANAGED_BY {
        return None;
    }
    Some(
        meta["annotations"][render::TEMPLATE_ANNOTATION]
            .as_str()?
            .to_owned(),
    )
}

fn remove_empty_parents(root: &Path, rel: &Path) {
    let mut dir = rel.parent();
    while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
        if std::fs::remove_dir(root.join(d)).is_err() {
            break;
        }
        dir = d.parent();
    }
}

/// Keeps every directory member's `renderPath` in step with the decisions, until the
/// snapshot channel closes. Rendering runs on the blocking pool.
pub async fn run(mut snapshots: watch::Receiver<Arc<Snapshot>>) {
    let mut last: Option<Arc<Snapshot>> = None;
    let mut dirs = Dirs::default();
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        if last.as_ref().is_none_or(|l| decisions_differ(l, &snapshot)) {
            let s = snapshot.clone();
            let job = tokio::task::spawn_blocking(move || {
                render_members(&s, &mut dirs);
                dirs
            });
            match job.await {
                Ok(kept) => dirs = kept,
                Err(e) => {
                    warn!(error = %e, "rendering failed");
                    dirs = Dirs::default();
                }
            }
            last = Some(snapshot);
        }
        if snapshots.changed().await.is_err() {
            return;
        }
    }
}

/// What the server last wrote, per `renderPath`.
type Dirs = std::collections::HashMap<PathBuf, RenderedDir>;

/// Syncs one member's directory from what was last written there (scanned the first time,
/// and again after a failure).
fn sync_member(
    dirs: &mut Dirs,
    root: &Path,
    files: &BTreeMap<PathBuf, String>,
    keep: &Keep,
) -> io::Result<Synced> {
    let mut dir = match dirs.remove(root) {
        Some(dir) => dir,
        None => RenderedDir::scan(root)?,
    };
    let synced = dir.sync_in_place(files, keep)?;
    dirs.insert(root.to_path_buf(), dir);
    Ok(synced)
}

/// Whether what is rendered could differ between two snapshots.
fn decisions_differ(a: &Snapshot, b: &Snapshot) -> bool {
    let paths = |s: &Snapshot| -> Vec<(ClusterId, Option<PathBuf>)> {
        s.clusters
            .iter()
            .map(|c| (c.spec.id.clone(), c.spec.render_path.clone()))
            .collect()
    };
    !Arc::ptr_eq(&a.placements, &b.placements)
        || !Arc::ptr_eq(&a.templates, &b.templates)
        || !Arc::ptr_eq(&a.overrides, &b.overrides)
        || paths(a) != paths(b)
}

fn render_members(snapshot: &Snapshot, dirs: &mut Dirs) {
    let members: Vec<(&ClusterId, &Path)> = snapshot
        .clusters
        .iter()
        .filter_map(|c| Some((&c.spec.id, c.spec.render_path.as_deref()?)))
        .collect();
    dirs.retain(|root, _| members.iter().any(|(_, r)| r == root));
    if members.is_empty() {
        return;
    }
    let rendered = render::render_clusters(
        &snapshot.placements,
        &snapshot.templates,
        &snapshot.overrides,
        |c| members.iter().any(|(m, _)| *m == c),
    );
    for p in &rendered.problems {
        warn!(template = %p.template, cluster = ?p.cluster, reason = %p.reason, "not rendered");
    }
    let keep = Keep::of(snapshot);
    for (cluster, root) in members {
        match sync_member(dirs, root, &files_of(&rendered, cluster), &keep) {
            Ok(s) if s.written.is_empty() && s.removed.is_empty() => {}
            Ok(s) => info!(
                cluster = %cluster,
                dir = %root.display(),
                written = s.written.len(),
                removed = s.removed.len(),
                "rendered placed objects"
            ),
            Err(e) => {
                warn!(cluster = %cluster, dir = %root.display(), error = %e, "cannot write the rendered objects")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours_yaml(name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  annotations:\n    meridian.io/template: v1/ConfigMap/shop/{name}\n  labels:\n    app.kubernetes.io/managed-by: meridian\n  name: {name}\n  namespace: shop\n"
        )
    }

    #[test]
    fn sync_writes_changes_and_removes_only_its_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("shop")).unwrap();
        std::fs::write(root.join("shop/README.yaml"), "kind: NotOurs\n").unwrap();
        std::fs::write(root.join("notes.txt"), "hand-written").unwrap();
        let a = PathBuf::from("shop/ConfigMap.a.yaml");
        let b = PathBuf::from("shop/ConfigMap.b.yaml");
        let files = BTreeMap::from([(a.clone(), ours_yaml("a")), (b.clone(), ours_yaml("b"))]);
        let first = sync_dir(root, &files, &Keep::default()).unwrap();
        assert_eq!(first.written, [a.clone(), b.clone()]);
        let again = sync_dir(root, &files, &Keep::default()).unwrap();
        assert_eq!((again.written.len(), again.unchanged), (0, 2));
        let only_a = BTreeMap::from([(a.clone(), ours_yaml("a"))]);
        let third = sync_dir(root, &only_a, &Keep::default()).unwrap();
        assert_eq!(third.removed, std::slice::from_ref(&b));
        assert!(!root.join(&b).exists());
        assert!(root.join("shop/README.yaml").exists(), "not meridian's");
        assert!(root.join("notes.txt").exists());
        let none = sync_dir(root, &BTreeMap::new(), &Keep::default()).unwrap();
        assert_eq!(none.removed, [a]);
        assert!(
            root.join("shop").exists(),
            "still holds a file of someone else's"
        );
    }

    #[test]
    fn nothing_is_written_through_a_symlink_under_the_output_directory() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim.txt");
        std::fs::write(&victim, "keep me").unwrap();
        let root = dir.path();
        let a = PathBuf::from("shop/ConfigMap.a.yaml");
        std::fs::create_dir_all(root.join("shop")).unwrap();
        // A link planted at the temporary name: removed, never written through.
        std::os::unix::fs::symlink(&victim, root.join("shop/.ConfigMap.a.yaml.meridian-tmp"))
            .unwrap();
        let files = BTreeMap::from([(a.clone(), ours_yaml("a"))]);
        sync_dir(root, &files, &Keep::default()).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
        assert_eq!(
            std::fs::read_to_string(root.join(&a)).unwrap(),
            ours_yaml("a")
        );
        // An output subdirectory that is a link: refused, naming it.
        std::os::unix::fs::symlink(outside.path(), root.join("eu")).unwrap();
        let b = PathBuf::from("eu/ConfigMap.b.yaml");
        let files = BTreeMap::from([(b, ours_yaml("b"))]);
        let e = sync_dir(root, &files, &Keep::default()).unwrap_err();
        assert!(e.to_string().contains("is in the way: a symlink"), "{e}");
        assert!(!outside.path().join("ConfigMap.b.yaml").exists());
        // A link to a file of ours outside is not ours: never read, never removed.
        std::fs::write(outside.path().join("ours.yaml"), ours_yaml("c")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("ours.yaml"),
            root.join("shop/ConfigMap.c.yaml"),
        )
        .unwrap();
        sync_dir(root, &BTreeMap::new(), &Keep::default()).unwrap();
        assert!(outside.path().join("ours.yaml").exists());
    }

    #[test]
    fn files_of_an_unschedulable_template_and_its_dependencies_stay() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let a = PathBuf::from("shop/ConfigMap.a.yaml");
        let b = PathBuf::from("shop/ConfigMap.b.yaml");
        let files = BTreeMap::from([(a.clone(), ours_yaml("a")), (b.clone(), ours_yaml("b"))]);
        sync_dir(root, &files, &Keep::default()).unwrap();
        let keep = Keep(HashSet::from(["v1/ConfigMap/shop/a".to_owned()]));
        let synced = sync_dir(root, &BTreeMap::new(), &keep).unwrap();
        assert_eq!(synced.kept, [(a.clone(), "v1/ConfigMap/shop/a".to_owned())]);
        assert_eq!(synced.removed, std::slice::from_ref(&b));
        assert!(root.join(&a).exists() && !root.join(&b).exists());
    }
}
