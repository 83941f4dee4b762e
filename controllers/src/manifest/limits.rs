//! How much a directory source reads, how deep a document may nest, and how long a file may
//! take or stay half-written: the bounds that keep one hostile file from taking the process
//! with it.

use std::time::Duration;

/// The bounds of one directory source (hub or member).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes read from one file at most; a larger file is skipped and reported (reads stop at
    /// this many bytes plus one, so a file that grows while read cannot grow memory).
    pub max_file_bytes: u64,
    /// Bytes read from one directory at most, all files together; files past it are skipped.
    pub max_member_bytes: u64,
    /// Nesting depth (flow `[`/`{` plus block indentation levels) a document may reach
    /// before the YAML parser, whose time grows with the square of the depth, sees it.
    pub max_depth: usize,
    /// How long reading one file may take; a read that takes longer is abandoned and the
    /// file's last good content keeps serving.
    pub read_timeout: Duration,
    /// A file is read once its size and mtime have stayed the same this long (or its mtime is
    /// this old), so a write in progress is not read half-way.
    pub settle: Duration,
    /// A file that was good and now reads broken keeps its last good content this long (a
    /// write in progress), and is reported only if it is still broken after it.
    pub grace: Duration,
}

impl Limits {
    pub const DEFAULT_MAX_FILE_BYTES: u64 = 16 << 20;
    pub const DEFAULT_MAX_MEMBER_BYTES: u64 = 64 << 20;
    pub const DEFAULT_MAX_DEPTH: usize = 64;
    pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(5);
    pub const DEFAULT_SETTLE: Duration = Duration::from_millis(100);
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

    /// For one-off reads (`meridian validate`): nobody is writing, nothing to wait for.
    pub fn once(&self) -> Self {
        Self {
            settle: Duration::ZERO,
            grace: Duration::ZERO,
            ..self.clone()
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_file_bytes: Self::DEFAULT_MAX_FILE_BYTES,
            max_member_bytes: Self::DEFAULT_MAX_MEMBER_BYTES,
            max_depth: Self::DEFAULT_MAX_DEPTH,
            read_timeout: Self::DEFAULT_READ_TIMEOUT,
            settle: Self::DEFAULT_SETTLE,
            grace: Self::DEFAULT_GRACE,
        }
    }
}
