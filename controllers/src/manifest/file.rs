//! Reading one manifest file without trusting it: only regular files, at most a byte limit,
//! within a time budget. Blocking: callers run it on a blocking thread, never on the runtime.

use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use super::settle::Stamp;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("is {0}, not a regular file; skipped")]
    NotRegular(&'static str),
    #[error("is larger than {limit} bytes (directory.maxFileBytes); skipped")]
    TooLarge { limit: u64 },
    #[error("took longer than {0:?} to read; abandoned")]
    TimedOut(Duration),
    /// The file changed while it was read (a write in progress): read it again later.
    #[error("changed while it was read")]
    Moved(Stamp),
    #[error("cannot read")]
    Io(#[source] std::io::Error),
}

impl Stamp {
    pub(crate) fn of(meta: &Metadata) -> Self {
        Stamp {
            len: meta.len(),
            modified: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
            inode: meta.ino(),
        }
    }
}

/// What a non-regular file is, for messages.
pub(crate) fn kind_of(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_dir() {
        Some("a directory")
    } else {
        Some("not a file")
    }
}

/// Why a file a user names cannot be read (said of "it", the file the caller names).
#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    #[error("{0}")]
    Stat(#[source] std::io::Error),
    #[error("it is {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("it is larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("it {}", crate::reason_of(&**.0))]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("it kept changing while it was read")]
    KeptChanging,
}

/// Reads a small file a user names (the config): a regular file only (a FIFO or a device is
/// refused, never waited on), at most `limit` bytes, within `budget`. Blocking.
pub fn read_bounded(
    path: &Path,
    limit: u64,
    budget: Duration,
) -> Result<Vec<u8>, BoundedReadError> {
    for _ in 0..3 {
        let meta = std::fs::metadata(path).map_err(BoundedReadError::Stat)?;
        if let Some(kind) = kind_of(&meta) {
            return Err(BoundedReadError::NotRegular(kind));
        }
        match read(path, Stamp::of(&meta), limit, budget) {
            Ok(bytes) => return Ok(bytes),
            Err(ReadError::Moved(_)) => continue,
            Err(ReadError::TooLarge { limit }) => return Err(BoundedReadError::TooLarge { limit }),
            Err(e) => return Err(BoundedReadError::Read(Box::new(e))),
        }
    }
    Err(BoundedReadError::KeptChanging)
}

/// Reads `path` if it is still the regular file stamped `expected`, at most `limit` bytes,
/// giving up after `budget`.
pub(crate) fn read(
    path: &Path,
    expected: Stamp,
    limit: u64,
    budget: Duration,
) -> Result<Vec<u8>, ReadError> {
    let started = Instant::now();
    // O_NONBLOCK: if the path was swapped for a FIFO since it was looked at, opening it must
    // not wait for a writer; the fstat below then refuses it.
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if let Some(kind) = kind_of(&meta) {
        return Err(ReadError::NotRegular(kind));
    }
    let stamp = Stamp::of(&meta);
    if stamp != expected {
        return Err(ReadError::Moved(stamp));
    }
    if stamp.len > limit {
        return Err(ReadError::TooLarge { limit });
    }
    // take(limit + 1): a file that grows while read (or lies about its size) cannot make us
    // hold more than the limit.
    let mut bytes = Vec::with_capacity(stamp.len as usize);
    let mut reader = (&mut file).take(limit + 1);
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e)),
        };
        bytes.extend_from_slice(&chunk[..n]);
        if started.elapsed() > budget {
            return Err(ReadError::TimedOut(budget));
        }
    }
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let after = Stamp::of(&file.metadata().map_err(ReadError::Io)?);
    if after != stamp || bytes.len() as u64 != stamp.len {
        return Err(ReadError::Moved(after));
    }
    Ok(bytes)
}
