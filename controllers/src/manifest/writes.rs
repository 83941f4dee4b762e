//! Files a process is writing right now, as the kernel tells (inotify: modified, not yet
//! closed). A slow writer that pauses where the YAML still parses leaves a file that is
//! stable and valid, and only a prefix: timing cannot tell it from a finished file, and
//! under CPU load any pause is long. A file written and not closed is not read until its
//! writer closes it (or stops writing for `grace`: a descriptor left open must not hide a
//! file for good).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Paths written to and not closed since, with the time of the latest write.
#[derive(Debug, Default)]
pub struct OpenWrites {
    open: Mutex<HashMap<PathBuf, Instant>>,
}

/// Entries kept at most: past it the oldest writes are forgotten (a file forgotten is read
/// on the timing rules alone, as in a polled directory).
const MAX_OPEN: usize = 4096;

impl OpenWrites {
    /// `path` was written to (inotify IN_MODIFY, truncation included).
    pub fn written(&self, path: &Path, now: Instant) {
        let mut open = self.open.lock();
        if open.len() >= MAX_OPEN && !open.contains_key(path) {
            let oldest = open
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(p, _)| p.clone());
            if let Some(oldest) = oldest {
                open.remove(&oldest);
            }
        }
        open.insert(path.to_path_buf(), now);
    }

    /// `path` was closed after writing, renamed onto, or removed: what is there is whole.
    pub fn closed(&self, path: &Path) {
        self.open.lock().remove(path);
    }

    /// Whether `path` is being written: written to less than `grace` ago and not closed.
    pub fn writing(&self, path: &Path, now: Instant, grace: Duration) -> bool {
        self.open
            .lock()
            .get(path)
            .is_some_and(|at| now.saturating_duration_since(*at) < grace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_counts_until_closed_or_quiet_for_the_grace() {
        let writes = OpenWrites::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(5);
        let file = Path::new("/m/a.yaml");
        assert!(!writes.writing(file, t0, grace));
        writes.written(file, t0);
        assert!(writes.writing(file, t0 + Duration::from_secs(4), grace));
        assert!(
            !writes.writing(file, t0 + grace, grace),
            "an idle open descriptor"
        );
        writes.written(file, t0 + Duration::from_secs(6));
        assert!(
            writes.writing(file, t0 + Duration::from_secs(7), grace),
            "writing again"
        );
        writes.closed(file);
        assert!(!writes.writing(file, t0 + Duration::from_secs(7), grace));
    }

    #[test]
    fn the_map_is_bounded() {
        let writes = OpenWrites::default();
        let t0 = Instant::now();
        for i in 0..MAX_OPEN + 10 {
            writes.written(
                &PathBuf::from(format!("/m/{i}")),
                t0 + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(writes.open.lock().len(), MAX_OPEN);
        assert!(!writes.writing(Path::new("/m/0"), t0, Duration::from_secs(60)));
    }
}
