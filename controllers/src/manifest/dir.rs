//! Reading a directory of manifests again and again as it changes: each file is looked at
//! (a stat), read only once stable and changed, and served through its [`Track`]. Blocking:
//! run it on a blocking thread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use meridian_core::Subject;
use tracing::debug;

use super::docs::{DocManifests, Spans, parse_reusing};
use super::file::{self, ReadError};
use super::settle::{Look, Stamp, Summary, Track};
use super::writes::OpenWrites;
use super::{Error, Limits, Loaded, ManifestError, Result};

/// A file a reader serves: its path, the version of its content (a new version whenever it
/// changes) and what its documents gave.
pub struct ServedFile<'a> {
    pub path: &'a Path,
    pub version: u64,
    read: &'a FileRead,
}

impl<'a> ServedFile<'a> {
    /// Each document's manifests, in file order; None for a document whose manifests were
    /// released (see [`DirReader::release_manifests`]).
    pub(crate) fn documents(&self) -> impl Iterator<Item = DocManifests<'a>> + 'a {
        self.read.spans.documents(&self.read.loaded)
    }

    /// What the file's documents could not give (malformed, refused) and their caveats.
    pub fn errors(&self) -> &'a [ManifestError] {
        &self.read.loaded.errors
    }

    pub fn warnings(&self) -> &'a [ManifestError] {
        &self.read.loaded.warnings
    }
}

/// One directory's files and what each serves; kept from one read to the next.
#[derive(Debug)]
pub struct DirReader {
    limits: Limits,
    files: BTreeMap<PathBuf, Track<FileRead>>,
    /// The versions the previous read served, to tell the source whether anything changed.
    last: Option<Vec<(PathBuf, u64)>>,
    /// `DirRead::loaded` holds every file's manifests (else the caller takes what changed
    /// from `served_files`).
    assemble: bool,
    /// Files being written under the directory, when a watch tells (else timing alone).
    writes: Option<Arc<OpenWrites>>,
}

/// What one file served.
#[derive(Debug, Default)]
struct FileRead {
    loaded: Loaded,
    /// The bytes actually read (0 for a file skipped or refused): what counts against the
    /// directory's byte limit.
    bytes: u64,
    /// What each document gave, so that the next read parses only the documents that changed.
    spans: Spans,
}

/// One read of a directory.
#[derive(Debug, Default)]
pub struct DirRead {
    /// Everything the directory serves now.
    pub loaded: Loaded,
    /// Whether it differs from the previous read's.
    pub changed: bool,
    /// Some file is being written (or broken within its grace): read again after this long.
    pub again_in: Option<Duration>,
    /// Nothing was served yet and some file is still settling (a fleet copied just before
    /// start-up): the first read is not complete, so the source sends nothing yet rather than
    /// a directory without those files.
    pub first_read_pending: bool,
}

impl DirReader {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            files: BTreeMap::new(),
            last: None,
            assemble: true,
            writes: None,
        }
    }

    /// Reads no file while its writer has it open, as `writes` (fed by a watch on the
    /// directory, by canonical path) tells.
    pub fn watching_writes(mut self, writes: Arc<OpenWrites>) -> Self {
        self.writes = Some(writes);
        self
    }

    /// A reader whose reads leave `DirRead::loaded` empty: the caller looks at each file
    /// through `served_files` and converts only those whose version changed.
    pub fn per_file(limits: Limits) -> Self {
        Self {
            assemble: false,
            ..Self::new(limits)
        }
    }

    /// What each file serves now, in path order.
    pub fn served_files(&self) -> impl Iterator<Item = ServedFile<'_>> {
        self.files.iter().filter_map(|(path, t)| {
            Some(ServedFile {
                path,
                version: t.version(),
                read: t.served()?,
            })
        })
    }

    /// Drops the typed manifests of every served file: the caller converted them and keeps
    /// the conversions by document. A later read copies an unchanged document as released
    /// (see [`ServedFile::documents`]). Only for a per-file reader.
    pub fn release_manifests(&mut self) {
        debug_assert!(
            !self.assemble,
            "an assembling reader's reads need their manifests"
        );
        for read in self.files.values_mut().filter_map(Track::served_mut) {
            read.spans.release(&mut read.loaded);
        }
    }

    /// Forgets what `path` served, so the next read parses it from scratch.
    pub fn forget_file(&mut self, path: &Path) {
        self.files.remove(path);
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Looks at every file under `dir`, reads those that changed, and returns what the
    /// directory serves. Fails only when a directory itself cannot be listed.
    pub fn read(&mut self, dir: &Path, now: Instant) -> Result<DirRead> {
        let paths = match list(dir) {
            Ok(paths) => paths,
            Err(e) => {
                // Back again, the directory is served in full (the fleet relists it in one step).
                self.last = None;
                return Err(e);
            }
        };
        self.files.retain(|p, _| paths.binary_search(p).is_ok());
        let mut again_in: Option<Duration> = None;
        let mut wake = |d: Duration| again_in = Some(again_in.map_or(d, |a| a.min(d)));
        let mut used = 0u64;
        // The kernel names files by the canonical path of the directory watched.
        let writes_under = self
            .writes
            .as_ref()
            .and_then(|w| Some((w, std::fs::canonicalize(dir).ok()?)));
        for path in paths {
            let writing = writes_under.as_ref().is_some_and(|(writes, canonical)| {
                let relative = path.strip_prefix(dir).unwrap_or(&path);
                writes.writing(&canonical.join(relative), now, self.limits.grace)
            });
            let track = self.files.entry(path.clone()).or_default();
            if let Some(d) = look_and_read(&self.limits, &path, track, used, writing, now) {
                wake(d);
            }
            used += track.served().map_or(0, |f| f.bytes);
        }
        if self.last.is_none() && self.files.values().any(|t| t.served().is_none()) {
            return Ok(DirRead {
                first_read_pending: true,
                again_in,
                ..DirRead::default()
            });
        }
        let versions: Vec<(PathBuf, u64)> = self
            .files
            .iter()
            .map(|(p, t)| (p.clone(), t.version()))
            .collect();
        let changed = self.last.as_ref() != Some(&versions);
        self.last = Some(versions);
        let mut loaded = Loaded::default();
        if changed && self.assemble {
            for served in self
                .files
                .values()
                .filter_map(Track::served)
                .map(|f| &f.loaded)
            {
                loaded.manifests.extend(served.manifests.iter().cloned());
                loaded.errors.extend(served.errors.iter().cloned());
                loaded.warnings.extend(served.warnings.iter().cloned());
            }
        }
        Ok(DirRead {
            loaded,
            changed,
            again_in,
            first_read_pending: false,
        })
    }
}

/// One file: a look, and a read if it is due (and no process is `writing` it). Returns
/// when to look again, if sooner than the next change or poll.
fn look_and_read(
    limits: &Limits,
    path: &Path,
    track: &mut Track<FileRead>,
    used: u64,
    writing: bool,
    now: Instant,
) -> Option<Duration> {
    let expires = track.expire(now, limits.grace);
    // metadata() follows a symlink: a link is read only if it leads to a regular file.
    let (stamp, meta) = match std::fs::metadata(path) {
        Ok(meta) => (Stamp::of(&meta), Some(meta)),
        // Nothing to stamp: a fixed stamp, so the problem is reported once, not every read.
        Err(_) => (unstamped(), None),
    };
    let age = SystemTime::now()
        .duration_since(stamp.modified)
        .unwrap_or(Duration::ZERO);
    match track.look(stamp, age, now, limits.settle) {
        Look::Unchanged => return expires,
        Look::Wait(d) => return Some(expires.map_or(d, |e| e.min(d))),
        Look::Read if writing => {
            debug!(file = %path.display(), "the file is open for writing; read once it is closed");
            return Some(expires.map_or(limits.settle, |e| e.min(limits.settle)));
        }
        Look::Read => {}
    }
    let read = match read_file(limits, path, meta.as_ref(), stamp, used, track.served()) {
        Ok(read) => read,
        Err(ReadError::Moved(now_stamp)) => {
            track.moved(now_stamp, now);
            return Some(limits.settle);
        }
        // meridian's own shortage, not the file's: what it served keeps serving, and it is
        // read again soon.
        Err(e) if crate::out_of_descriptors(&e) => {
            tracing::warn!(file = %path.display(), "{}", crate::OUT_OF_DESCRIPTORS);
            return Some(limits.settle);
        }
        Err(e) => FileRead {
            loaded: one_error(path, crate::reason_of(&e)),
            bytes: 0,
            spans: Spans::default(),
        },
    };
    let summary = Summary {
        objects: read.spans.objects(),
        problems: read.loaded.errors.len() + read.loaded.warnings.len(),
    };
    track.offer(stamp, read, summary, now, limits.grace);
    if track.holding() {
        debug!(file = %path.display(), "the file reads half-written; its last good content keeps serving for the grace");
    }
    track.expire(now, limits.grace)
}

/// Reads and parses one file within the limits; `used` is what the directory's files before
/// it already take, `served` what the file serves now (its unchanged documents are copied).
fn read_file(
    limits: &Limits,
    path: &Path,
    meta: Option<&std::fs::Metadata>,
    stamp: Stamp,
    used: u64,
    served: Option<&FileRead>,
) -> std::result::Result<FileRead, ReadError> {
    let meta = meta.ok_or_else(|| {
        ReadError::Io(
            std::fs::metadata(path)
                .err()
                .unwrap_or_else(|| std::io::Error::other("vanished")),
        )
    })?;
    if let Some(kind) = file::kind_of(meta) {
        return Err(ReadError::NotRegular(kind));
    }
    if stamp.len > limits.max_file_bytes {
        return Err(ReadError::TooLarge {
            limit: limits.max_file_bytes,
        });
    }
    if used + stamp.len > limits.max_member_bytes {
        return Ok(FileRead {
            bytes: 0,
            spans: Spans::default(),
            loaded: one_error(
                path,
                format!(
                    "the directory's files exceed {} bytes together (directory.maxMemberBytes); skipped",
                    limits.max_member_bytes
                ),
            ),
        });
    }
    let bytes = file::read(path, stamp, limits.max_file_bytes, limits.read_timeout)?;
    let read = bytes.len() as u64;
    let (loaded, spans) = match String::from_utf8(bytes) {
        Ok(text) => parse_reusing(
            path,
            &text,
            limits.max_depth,
            served.map(|s| (&s.loaded, &s.spans)),
        ),
        Err(e) => (
            one_error(path, format!("is not UTF-8 text: {}", e.utf8_error())),
            Spans::default(),
        ),
    };
    Ok(FileRead {
        loaded,
        bytes: read,
        spans,
    })
}

fn one_error(path: &Path, reason: String) -> Loaded {
    Loaded {
        errors: vec![ManifestError {
            file: path.to_path_buf(),
            object: Subject::Input("file".into()),
            reason,
        }],
        ..Loaded::default()
    }
}

fn unstamped() -> Stamp {
    Stamp {
        len: 0,
        modified: SystemTime::UNIX_EPOCH,
        inode: 0,
    }
}

/// Entries one listing of a directory walks at most: a member pointed at `/` or a home
/// directory is refused at this size instead of walked whole on every round.
pub const MAX_LISTED_ENTRIES: usize = 100_000;

/// The manifest files under `dir`, sorted. Hidden files and directories are skipped; so are
/// symlinked directories (no loops).
fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => {
            return Err(Error::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        _ => {}
    }
    let mut files = Vec::new();
    let mut walk = Walk::new(dir, MAX_LISTED_ENTRIES);
    walk.visit(dir, &mut |path, is_dir| {
        if !is_dir
            && matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
        {
            files.push(path);
        }
    })?;
    files.sort();
    Ok(files)
}

/// The directories under `dir` (itself included) a recursive watch would take, if there
/// are at most `max` of them; each takes one of the inotify watches all members share.
pub fn directories_within(dir: &Path, max: usize) -> Result<usize> {
    let mut dirs = 1;
    let mut walk = Walk::new(dir, max);
    walk.dirs_only = true;
    walk.visit(dir, &mut |_, is_dir| dirs += usize::from(is_dir))?;
    Ok(dirs)
}

/// A bounded walk under one directory, as [`list`] reads it: hidden entries and symlinked
/// directories skipped.
struct Walk<'a> {
    root: &'a Path,
    left: usize,
    max: usize,
    /// Count (and descend into) directories only: files cost a watch nothing.
    dirs_only: bool,
}

impl<'a> Walk<'a> {
    fn new(root: &'a Path, max: usize) -> Self {
        Self {
            root,
            left: max,
            max,
            dirs_only: false,
        }
    }

    fn visit(&mut self, dir: &Path, seen: &mut impl FnMut(PathBuf, bool)) -> Result<()> {
        let unreadable = |source| Error::ReadDir {
            path: dir.to_path_buf(),
            source,
        };
        for entry in std::fs::read_dir(dir).map_err(unreadable)? {
            let entry = entry.map_err(unreadable)?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let is_dir = entry.file_type().map_err(unreadable)?.is_dir();
            if self.dirs_only && !is_dir {
                continue;
            }
            self.left = self.left.checked_sub(1).ok_or(Error::TooManyEntries {
                path: self.root.to_path_buf(),
                max: self.max,
            })?;
            let path = entry.path();
            if is_dir {
                self.visit(&path, seen)?;
            }
            seen(path, is_dir);
        }
        Ok(())
    }
}
