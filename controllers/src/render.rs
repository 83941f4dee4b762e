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

use std::collections::BTreeMap;
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
pub fn sync_dir(root: &Path, files: &BTreeMap<PathBuf, String>) -> io::Result<Synced> {
    RenderedDir::scan(root)?.sync(files)
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
        let files = ours(root)?
            .into_iter()
            .filter_map(|rel| {
                let text = std::fs::read_to_string(root.join(&rel)).ok()?;
                Some((rel, text))
            })
            .collect();
        Ok(Self {
            root: root.to_path_buf(),
            files,
        })
    }

    /// See [`sync_dir`]. On an error the record may be behind the disk: scan again.
    pub fn sync(mut self, files: &BTreeMap<PathBuf, String>) -> io::Result<Synced> {
        self.sync_in_place(files)
    }

    fn sync_in_place(&mut self, files: &BTreeMap<PathBuf, String>) -> io::Result<Synced> {
        let root = self.root.clone();
        let mut synced = Synced::default();
        for (rel, text) in files {
            if self.files.get(rel) == Some(text) {
                synced.unchanged += 1;
                continue;
            }
            write_atomically(&root.join(rel), text)?;
            self.files.insert(rel.clone(), text.clone());
            synced.written.push(rel.clone());
        }
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|rel| !files.contains_key(*rel))
            .cloned()
            .collect();
        for rel in gone {
            match std::fs::remove_file(root.join(&rel)) {
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

fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.meridian-tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The YAML files under `root` that meridian rendered, relative to it.
fn ours(root: &Path) -> io::Result<Vec<PathBuf>> {
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
                && is_rendered_by_meridian(&path)
                && let Ok(rel) = path.strip_prefix(root)
            {
                out.push(rel.to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether a file is one meridian rendered: its label and annotation, as `to_yaml` prints
/// them (sorted keys, one document).
fn is_rendered_by_meridian(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    let Ok(value) = serde_yaml_ng::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    let meta = &value["metadata"];
    meta["labels"][render::MANAGED_BY_LABEL] == render::MANAGED_BY
        && meta["annotations"][render::TEMPLATE_ANNOTATION].is_string()
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
) -> io::Result<Synced> {
    let mut dir = match dirs.remove(root) {
        Some(dir) => dir,
        None => RenderedDir::scan(root)?,
    };
    let synced = dir.sync_in_place(files)?;
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
    for (cluster, root) in members {
        match sync_member(dirs, root, &files_of(&rendered, cluster)) {
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
        let first = sync_dir(root, &files).unwrap();
        assert_eq!(first.written, [a.clone(), b.clone()]);
        let again = sync_dir(root, &files).unwrap();
        assert_eq!((again.written.len(), again.unchanged), (0, 2));
        let only_a = BTreeMap::from([(a.clone(), ours_yaml("a"))]);
        let third = sync_dir(root, &only_a).unwrap();
        assert_eq!(third.removed, std::slice::from_ref(&b));
        assert!(!root.join(&b).exists());
        assert!(root.join("shop/README.yaml").exists(), "not meridian's");
        assert!(root.join("notes.txt").exists());
        let none = sync_dir(root, &BTreeMap::new()).unwrap();
        assert_eq!(none.removed, [a]);
        assert!(
            root.join("shop").exists(),
            "still holds a file of someone else's"
        );
    }
}
