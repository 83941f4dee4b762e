//! The geo source: CIDR ranges mapped to a region and zone, for DNS clients outside the fleet
//! (core's `geo` module says how they are used). Ranges come from the config (`geo.ranges`)
//! and from a file (`geo.file`) of `network,region[,zone]` lines, as a user exports from a
//! MaxMind-style database; they are merged (config first), built once into a `GeoTable`, and
//! sent to the writer as one `Event::Geo`.
//!
//! ```text
//!  geo.ranges (config) ─┐
//!  geo.file ── stat every reloadSeconds ── changed and settled? ── manifest::file::read
//!     (regular files only, geo.maxFileBytes, readTimeoutSeconds; on a blocking thread)
//!     ── parse: one Problem per bad line (file, line, reason), the good lines kept ──┐
//!                                                                                   ▼
//!      GeoBuilder (config ranges, then the file's) ── finish ── conflicts → Problems
//!      ── Event::Geo { table: Arc<GeoTable>, problems } ──► Fleet ──► every Snapshot
//! ```
//!
//! A file that cannot be read (gone, not a regular file, too large) keeps the last good table
//! serving, and the reason is reported with it; a file changing while it is read is read
//! again at the next look.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use meridian_core::problem::{Bounded, MAX_PER_SOURCE, Origin, Problem, Source, Subject};
use meridian_core::{GeoBuilder, GeoConflict, GeoTable, Locality};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::SourceEvent;
use crate::manifest::file::{self, ReadError};
use crate::manifest::settle::Stamp;
use crate::manifest::{Limits, OpenWrites};

/// Ranges of one locality given in the config (`geo.ranges[]`, or `--geo-range`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigRange {
    pub cidrs: Vec<IpNet>,
    pub locality: Locality,
}

/// What the geo source reads, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeoSettings {
    /// Served first; a file line giving one of these CIDRs another locality is a conflict.
    pub ranges: Vec<ConfigRange>,
    /// Where `ranges` were given (the config file), for problems naming them.
    pub config_file: Option<PathBuf>,
    /// The ranges file, watched for changes.
    pub file: Option<PathBuf>,
    /// How often the file is looked at (a stat: size, mtime, inode).
    pub reload: Duration,
    /// A larger file is not read (the last good table keeps serving).
    pub max_file_bytes: u64,
    /// How long one read may take.
    pub read_timeout: Duration,
    /// A file modified less than this long ago is read at the next look (a write in progress).
    pub settle: Duration,
}

impl GeoSettings {
    pub const DEFAULT_RELOAD: Duration = Duration::from_secs(1);
    /// A MaxMind-style country or region export is some tens of MiB.
    pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 << 20;

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.file.is_none()
    }
}

/// `meridian_geo_*`: what is loaded, read at scrape time from gauges set once per build.
#[derive(Clone, Debug, Default)]
pub struct GeoMetrics {
    /// Ranges served (config and file, conflicts left out).
    pub ranges: Gauge,
    /// Distinct localities among them.
    pub localities: Gauge,
    /// Bad lines, conflicts and read failures currently reported.
    pub problems: Gauge,
}

impl GeoMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "ranges",
            "Geo ranges loaded (config and file; CIDRs given two localities are not)",
            m.ranges.clone(),
        );
        registry.register(
            "localities",
            "Distinct localities the geo ranges map to",
            m.localities.clone(),
        );
        registry.register(
            "problems",
            "Geo ranges rejected (bad lines, conflicting localities) and file read failures",
            m.problems.clone(),
        );
        m
    }

    fn record(&self, table: &GeoTable, problems: usize) {
        self.ranges.set(table.len() as i64);
        self.localities.set(table.localities().len() as i64);
        self.problems.set(problems as i64);
    }
}

/// A range read from the file, before the table is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// 1-based.
    pub number: usize,
    pub net: IpNet,
    pub locality: Locality,
}

/// Parses a ranges file: one `network,region[,zone]` per line; `#` starts a comment, blank
/// lines are skipped, fields may be double-quoted (as CSV exports quote them), and a header
/// line (first field `network`) is tolerated. Every bad line is a problem naming `path`, the
/// line number and the reason; the good lines are returned.
pub fn parse(path: &Path, text: &str) -> (Vec<Line>, Vec<Problem>) {
    let mut lines = Vec::new();
    // A million bad lines are a hundred problems and a count, not a million problems.
    let mut problems = Bounded::default();
    let mut seen_content = false;
    for (i, raw) in text.lines().enumerate() {
        let number = i + 1;
        let content = raw.split('#').next().unwrap_or_default().trim();
        if content.is_empty() {
            continue;
        }
        let first = !seen_content;
        seen_content = true;
        let fields: Vec<&str> = content.split(',').map(unquote).collect();
        if first && fields[0].eq_ignore_ascii_case("network") {
            continue;
        }
        match parse_fields(&fields) {
            Ok((net, locality)) => lines.push(Line {
                number,
                net,
                locality,
            }),
            Err(reason) => {
                if problems.kept.len() < MAX_PER_SOURCE {
                    problems.push(line_problem(path, number, reason));
                } else {
                    problems.more += 1;
                }
            }
        }
    }
    (lines, problems.finish())
}

/// A field as a reason quotes it: at most 64 characters of it.
fn quoted(field: &str) -> String {
    match field.char_indices().nth(64) {
        Some((end, _)) => format!("{:?}…", &field[..end]),
        None => format!("{field:?}"),
    }
}

fn unquote(field: &str) -> &str {
    let field = field.trim();
    field
        .strip_prefix('"')
        .and_then(|f| f.strip_suffix('"'))
        .unwrap_or(field)
        .trim()
}

fn parse_fields(fields: &[&str]) -> Result<(IpNet, Locality), String> {
    if fields.len() > 3 {
        return Err(format!(
            "{} fields, expected network,region[,zone]",
            fields.len()
        ));
    }
    let net = parse_net(fields[0])?;
    let region = fields.get(1).copied().unwrap_or_default();
    if region.is_empty() {
        return Err(format!("{net}: missing region (network,region[,zone])"));
    }
    let zone = fields.get(2).copied().filter(|z| !z.is_empty());
    for value in std::iter::once(region).chain(zone) {
        if value.chars().any(char::is_whitespace) {
            return Err(format!("{}: a region or zone has no spaces", quoted(value)));
        }
    }
    Ok((
        net,
        Locality {
            region: Some(region.to_string()),
            zone: zone.map(str::to_string),
        },
    ))
}

fn parse_net(field: &str) -> Result<IpNet, String> {
    if field.is_empty() {
        return Err("missing network (network,region[,zone])".into());
    }
    match field.parse::<IpNet>() {
        Ok(net) => Ok(net),
        Err(_) if field.parse::<IpAddr>().is_ok() => Err(format!(
            "bad CIDR {field:?}: a network needs its prefix length (e.g. {field}/32)"
        )),
        Err(_) => Err(format!(
            "bad CIDR {} (expected e.g. 203.0.113.0/24)",
            quoted(field)
        )),
    }
}

fn line_problem(path: &Path, number: usize, reason: impl Into<String>) -> Problem {
    Problem::in_file(
        Origin::Geo,
        path,
        Subject::Input(format!("line {number}")),
        reason,
    )
}

fn describe(locality: &Locality) -> String {
    match (&locality.region, &locality.zone) {
        (Some(r), Some(z)) => format!("region {r}, zone {z}"),
        (Some(r), None) => format!("region {r}"),
        (None, Some(z)) => format!("zone {z}"),
        (None, None) => "no locality".into(),
    }
}

/// Where a range was given: a config range (its index in `geo.ranges`) or a file line.
enum Given {
    Config(usize),
    Line(usize),
}

impl Given {
    fn text(&self) -> String {
        match self {
            Given::Config(i) => format!("geo.ranges[{i}]"),
            Given::Line(n) => format!("line {n}"),
        }
    }
}

/// Builds the table from the config ranges and the file's lines (config first), and reports
/// each range of a CIDR that was given two localities, at the place it was given.
pub fn build(settings: &GeoSettings, lines: &[Line]) -> (GeoTable, Vec<Problem>) {
    let mut builder = GeoBuilder::default();
    // Origins: config ranges by their index, then file lines after them.
    let configured = settings.ranges.len();
    for (i, range) in settings.ranges.iter().enumerate() {
        for net in &range.cidrs {
            builder.add(*net, &range.locality, i);
        }
    }
    for line in lines {
        builder.add(line.net, &line.locality, configured + line.number);
    }
    let (table, conflicts) = builder.finish();
    let given = |origin: usize| {
        if origin < configured {
            Given::Config(origin)
        } else {
            Given::Line(origin - configured)
        }
    };
    let problems = conflicts
        .iter()
        .flat_map(|c| conflict_problems(settings, c, given))
        .collect();
    (table, problems)
}

fn conflict_problems(
    settings: &GeoSettings,
    conflict: &GeoConflict,
    given: impl Fn(usize) -> Given,
) -> Vec<Problem> {
    conflict
        .ranges
        .iter()
        .enumerate()
        .map(|(i, (origin, locality))| {
            let others: Vec<String> = conflict
                .ranges
                .iter()
                .enumerate()
                .filter(|(j, (_, l))| *j != i && l != locality)
                .map(|(_, (o, l))| format!("{} ({})", describe(l), given(*o).text()))
                .collect();
            let reason = format!(
                "{} ({}) is also given another locality: {}; the range is not used",
                conflict.net,
                describe(locality),
                others.join(", ")
            );
            match given(*origin) {
                Given::Line(n) => line_problem(
                    settings.file.as_deref().unwrap_or(Path::new("geo.file")),
                    n,
                    reason,
                ),
                g @ Given::Config(_) => Problem {
                    origin: Origin::Geo,
                    subject: Subject::Input(g.text()),
                    source: Source::File {
                        path: settings
                            .config_file
                            .clone()
                            .unwrap_or_else(|| PathBuf::from("--geo-range")),
                    },
                    reason,
                },
            }
        })
        .collect()
}

/// The source's state between looks at the file: what was last served and why.
pub struct GeoSource {
    settings: Arc<GeoSettings>,
    /// The stamp of the file content last read (none: not read yet, or unreadable since).
    read: Option<Stamp>,
    /// The table last built from a good read (the config ranges alone before any).
    table: Arc<GeoTable>,
    /// Bad lines and conflicts of that build.
    problems: Vec<Problem>,
    /// Why the file cannot be read now (the last good table keeps serving).
    unreadable: Option<Problem>,
    /// Files being written, while `run` watches the file's directory: a writer pausing where
    /// the lines still parse is not read as a shorter table.
    writes: Option<Arc<OpenWrites>>,
}

/// What a look at the file found.
#[derive(Debug, PartialEq, Eq)]
enum Looked {
    Unchanged,
    /// Changed too recently, or changed while read: look again next time.
    Settling,
    Changed,
}

impl GeoSource {
    /// Reads the config ranges and the file once (blocking: call it off the runtime).
    pub fn new(settings: GeoSettings) -> Self {
        let settings = Arc::new(settings);
        let (table, problems) = build(&settings, &[]);
        for p in &problems {
            warn!(at = %p.subject, reason = %p.reason, "geo range rejected");
        }
        let mut source = Self {
            settings,
            read: None,
            table: Arc::new(table),
            problems,
            unreadable: None,
            writes: None,
        };
        // The first look reads whatever is there, settled or not: nobody waits on start-up.
        source.look(None);
        source
    }

    /// The event for what is served now.
    pub fn event(&self) -> SourceEvent {
        SourceEvent::Geo {
            table: self.table.clone(),
            problems: self.all_problems(),
        }
    }

    fn all_problems(&self) -> Vec<Problem> {
        self.problems
            .iter()
            .chain(&self.unreadable)
            .cloned()
            .collect()
    }

    /// Looks at the file; true when what is served (table or problems) changed. `settle`:
    /// a file modified more recently than this is left for the next look.
    fn look(&mut self, settle: Option<Duration>) -> bool {
        let Some(path) = self.settings.file.clone() else {
            return false;
        };
        match self.try_read(&path, settle) {
            Ok(Looked::Unchanged | Looked::Settling) => false,
            Ok(Looked::Changed) => true,
            Err(reason) => {
                let problem = Problem::in_file(
                    Origin::Geo,
                    &path,
                    Subject::Input("file".into()),
                    format!("{reason}; the last good ranges keep serving"),
                );
                self.read = None;
                let changed = self.unreadable.as_ref() != Some(&problem);
                if changed {
                    warn!(file = %path.display(), %reason, "geo ranges file cannot be read; the last good ranges keep serving");
                }
                self.unreadable = Some(problem);
                changed
            }
        }
    }

    fn try_read(&mut self, path: &Path, settle: Option<Duration>) -> Result<Looked, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
        if let Some(kind) = file::kind_of(&meta) {
            return Err(format!("{}", ReadError::NotRegular(kind)));
        }
        let stamp = Stamp::of(&meta);
        if self.read == Some(stamp) {
            return Ok(Looked::Unchanged);
        }
        if let Some(settle) = settle {
            let age = SystemTime::now()
                .duration_since(stamp.modified)
                .unwrap_or_default();
            if age < settle {
                return Ok(Looked::Settling);
            }
        }
        if self.writes.as_ref().is_some_and(|w| {
            let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
            w.writing(&path, std::time::Instant::now(), Limits::DEFAULT_GRACE)
        }) {
            return Ok(Looked::Settling);
        }
        let s = &self.settings;
        let bytes = match file::read(path, stamp, s.max_file_bytes, s.read_timeout) {
            Ok(bytes) => bytes,
            Err(ReadError::Moved(_)) => return Ok(Looked::Settling),
            Err(ReadError::TooLarge { limit }) => {
                return Err(format!("is larger than {limit} bytes (geo.maxFileBytes)"));
            }
            Err(e) => return Err(crate::reason_of(&e)),
        };
        let text = String::from_utf8(bytes).map_err(|e| format!("is not UTF-8 text: {e}"))?;
        let (lines, mut problems) = parse(path, &text);
        let (table, conflicts) = build(s, &lines);
        problems.extend(meridian_core::problem::bounded(conflicts));
        info!(
            file = %path.display(),
            ranges = table.len(),
            localities = table.localities().len(),
            problems = problems.len(),
            "geo ranges read"
        );
        for p in &problems {
            warn!(file = %path.display(), at = %p.subject, reason = %p.reason, "geo range rejected");
        }
        self.read = Some(stamp);
        self.unreadable = None;
        self.table = Arc::new(table);
        self.problems = problems;
        Ok(Looked::Changed)
    }

    /// Watches the file (a stat every `reload`), sending the table whenever it changes; ends
    /// when the channel closes or there is no file to watch.
    pub async fn run(mut self, tx: mpsc::Sender<SourceEvent>, metrics: GeoMetrics) {
        metrics.record(&self.table, self.all_problems().len());
        let Some(file) = self.settings.file.clone() else {
            return;
        };
        let mut watch = file
            .parent()
            .map(|dir| crate::directory::WritesWatch::new(dir.to_path_buf()));
        self.writes = Some(crate::directory::open_writes());
        loop {
            if let Some(watch) = &mut watch {
                watch.arm();
            }
            tokio::time::sleep(self.settings.reload).await;
            let settle = self.settings.settle;
            // Parsing hundreds of thousands of lines takes a while: off the runtime.
            let looked = tokio::task::spawn_blocking(move || {
                let changed = self.look(Some(settle));
                (self, changed)
            })
            .await;
            let Ok((source, changed)) = looked else {
                warn!("reading the geo ranges file failed; it is no longer watched");
                return;
            };
            self = source;
            if changed {
                metrics.record(&self.table, self.all_problems().len());
                debug!(ranges = self.table.len(), "geo ranges changed");
                if tx.send(self.event()).await.is_err() {
                    return;
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
