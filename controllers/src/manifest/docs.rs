//! Reading a file again after an edit parses only the documents that changed. A large member
//! file (thousands of Services and EndpointSlices in one multi-document file, as sync tools
//! write them) changes a few documents at a time; parsing all of it again on every edit cost
//! tens of milliseconds before the edit could reach DNS and xDS.
//!
//! A document is known by where it stands (its number and first line, which its problems
//! name) and by its text (length and a hash). A document equal in all of these to one of the
//! previous read gives the same manifests, errors and warnings (parsing a document looks at
//! nothing else), so those are copied instead of parsed. The hash is 64 bits: two different
//! texts of one length at one position colliding is about 2⁻⁶⁴ per edited document.
//!
//! A member directory's reader does not keep the typed manifests once its source has
//! converted them ([`Spans::release`]): at a million endpoints they were half of meridian's
//! memory. A released document copied into a new read stays released — the source keeps its
//! conversion under the document's [`DocKey`] and uses that instead.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::split::{self, Document};
use super::{Loaded, Manifest, parse_document};

/// Which part of a file's [`Loaded`] each document gave.
#[derive(Debug, Default)]
pub(crate) struct Spans(Vec<Span>);

#[derive(Debug)]
struct Span {
    key: DocKey,
    /// How many manifests the document gave (kept when they are released).
    objects: usize,
    /// Where they are in the file's `Loaded::manifests`; None once released.
    manifests: Option<Range<usize>>,
    errors: Range<usize>,
    warnings: Range<usize>,
}

/// One document of a file: unchanged documents have equal keys in every read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct DocKey {
    number: usize,
    first_line: usize,
    len: usize,
    hash: u64,
}

impl DocKey {
    fn of(doc: &Document<'_>) -> Self {
        // DefaultHasher::new() has fixed keys: equal texts hash equal in every read.
        let mut hasher = DefaultHasher::new();
        doc.text.hash(&mut hasher);
        DocKey {
            number: doc.number,
            first_line: doc.first_line,
            len: doc.text.len(),
            hash: hasher.finish(),
        }
    }
}

/// What one document of a served file gave: its manifests, or None when they were released
/// after the source converted them (it keeps that conversion under the key).
pub(crate) type DocManifests<'a> = (DocKey, Option<&'a [(PathBuf, Manifest)]>);

impl Spans {
    /// How many objects the file's documents gave, released or not.
    pub(crate) fn objects(&self) -> usize {
        self.0.iter().map(|s| s.objects).sum()
    }

    /// Each document of the file `loaded` was read from, in file order.
    pub(crate) fn documents<'a>(
        &'a self,
        loaded: &'a Loaded,
    ) -> impl Iterator<Item = DocManifests<'a>> + 'a {
        (self.0.iter()).map(|s| (s.key, s.manifests.clone().map(|r| &loaded.manifests[r])))
    }

    /// Drops the file's manifests (its source converted them); errors and warnings stay.
    pub(crate) fn release(&mut self, loaded: &mut Loaded) {
        loaded.manifests = Vec::new();
        for span in &mut self.0 {
            span.manifests = None;
        }
    }
}

/// Parses `text` (the content of `file`), copying what each unchanged document gave in
/// `previous` (the last read of this file and its spans) instead of parsing it again.
/// Returns what the file holds and its spans, for the next read.
pub(crate) fn parse_reusing(
    file: &Path,
    text: &str,
    max_depth: usize,
    previous: Option<(&Loaded, &Spans)>,
) -> (Loaded, Spans) {
    let before: HashMap<DocKey, &Span> = previous
        .map(|(_, spans)| spans.0.iter().map(|s| (s.key, s)).collect())
        .unwrap_or_default();
    let mut out = Loaded::default();
    let mut spans = Vec::new();
    for doc in split::split(text) {
        let key = DocKey::of(&doc);
        let start = (out.manifests.len(), out.errors.len(), out.warnings.len());
        let released = match (previous, before.get(&key)) {
            (Some((loaded, _)), Some(span)) => copy_span(loaded, span, &mut out),
            _ => {
                parse_document(file, &doc, max_depth, &mut out);
                None
            }
        };
        let manifests = start.0..out.manifests.len();
        spans.push(Span {
            key,
            objects: released.unwrap_or(manifests.len()),
            manifests: released.is_none().then_some(manifests),
            errors: start.1..out.errors.len(),
            warnings: start.2..out.warnings.len(),
        });
    }
    (out, Spans(spans))
}

/// Copies what `span` gave; returns its object count if its manifests were released (the
/// copy is released too).
fn copy_span(from: &Loaded, span: &Span, out: &mut Loaded) -> Option<usize> {
    if let Some(manifests) = &span.manifests {
        out.manifests
            .extend_from_slice(&from.manifests[manifests.clone()]);
    }
    out.errors
        .extend_from_slice(&from.errors[span.errors.clone()]);
    out.warnings
        .extend_from_slice(&from.warnings[span.warnings.clone()]);
    span.manifests.is_none().then_some(span.objects)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse_str_within;

    const MAX_DEPTH: usize = 64;

    fn service(name: &str, port: u16) -> String {
        format!(
            "---\n{{apiVersion: v1, kind: Service, metadata: {{name: {name}, namespace: ns}}, spec: {{ports: [{{port: {port}}}]}}}}\n"
        )
    }

    fn described(loaded: &Loaded) -> Vec<String> {
        let mut out: Vec<String> = loaded
            .manifests
            .iter()
            .map(|(_, m)| format!("{:?}", m))
            .collect();
        out.extend(loaded.errors.iter().map(ToString::to_string));
        out.extend(loaded.warnings.iter().map(ToString::to_string));
        out
    }

    /// Parses `text` after `first` was read, and checks that reusing gives exactly what a
    /// parse from scratch gives; returns how many documents were parsed anew.
    fn reread(first: &str, text: &str) -> usize {
        let path = Path::new("/m/services.yaml");
        let (loaded, spans) = parse_reusing(path, first, MAX_DEPTH, None);
        let (again, _) = parse_reusing(path, text, MAX_DEPTH, Some((&loaded, &spans)));
        let mut scratch = Loaded::default();
        parse_str_within(path, text, MAX_DEPTH, &mut scratch);
        assert_eq!(described(&again), described(&scratch), "{text}");
        let before: std::collections::HashSet<DocKey> = spans.0.iter().map(|s| s.key).collect();
        split::split(text)
            .iter()
            .filter(|d| !before.contains(&DocKey::of(d)))
            .count()
    }

    #[test]
    fn an_append_parses_only_the_new_documents_and_gives_what_a_full_parse_gives() {
        let first = service("a", 80) + &service("b", 81);
        assert_eq!(reread(&first, &(first.clone() + &service("c", 82))), 1);
    }

    #[test]
    fn an_edit_parses_the_edited_document_and_those_it_moved() {
        let first = service("a", 80) + &service("b", 81) + &service("c", 82);
        // Same length, same place: only the edited one.
        let edited = service("a", 80) + &service("b", 91) + &service("c", 82);
        assert_eq!(reread(&first, &edited), 1);
        // A document removed renumbers every later one: their problems name new numbers.
        let removed = service("a", 80) + &service("c", 82);
        assert_eq!(reread(&first, &removed), 1);
        // An inserted line moves every later document's lines.
        let longer = service("a", 80) + "# note\n" + &service("b", 81) + &service("c", 82);
        assert_eq!(reread(&first, &longer), 3);
    }

    #[test]
    fn broken_documents_keep_their_errors_when_copied() {
        let first = service("a", 80) + "---\n{kind: Service, metadata: [\n" + &service("b", 81);
        let appended = first.clone() + &service("c", 82);
        assert_eq!(reread(&first, &appended), 1);
        let path = Path::new("/m/services.yaml");
        let (loaded, spans) = parse_reusing(path, &first, MAX_DEPTH, None);
        let (again, _) = parse_reusing(path, &appended, MAX_DEPTH, Some((&loaded, &spans)));
        assert_eq!(again.errors.len(), 1, "{:?}", again.errors);
        assert!(
            again.errors[0].to_string().contains("document 2"),
            "{}",
            again.errors[0]
        );
    }

    #[test]
    fn released_documents_stay_released_in_the_next_read_and_only_edited_ones_are_parsed() {
        let path = Path::new("/m/services.yaml");
        let first = service("a", 80) + &service("b", 81) + &service("c", 82);
        let (mut loaded, mut spans) = parse_reusing(path, &first, MAX_DEPTH, None);
        spans.release(&mut loaded);
        assert!(loaded.manifests.is_empty());
        assert_eq!(spans.objects(), 3, "the counts outlive the manifests");
        let edited = service("a", 80) + &service("b", 91) + &service("c", 82);
        let (again, spans_again) = parse_reusing(path, &edited, MAX_DEPTH, Some((&loaded, &spans)));
        let parsed: Vec<Option<usize>> = spans_again
            .documents(&again)
            .map(|(_, manifests)| manifests.map(<[_]>::len))
            .collect();
        assert_eq!(parsed, [None, Some(1), None], "only b is parsed (and held)");
        assert_eq!(spans_again.objects(), 3);
        let keys = |s: &Spans| s.0.iter().map(|s| s.key).collect::<Vec<_>>();
        assert_eq!(keys(&spans)[0], keys(&spans_again)[0]);
        assert_ne!(keys(&spans)[1], keys(&spans_again)[1]);
    }
}
