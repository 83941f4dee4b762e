//! The manifest reader of directory sources, on arbitrary bytes: text → documents (split on
//! `---`) → depth scan → YAML → typed manifests (`manifest::parse_str_within`, with the
//! default nesting limit) → model objects, both as a member directory
//! (`directory::member_objects`) and as a hub directory (`directory::hub_objects`).
//!
//! Nothing may panic or hang (libFuzzer's -timeout catches a parse that the depth scan let
//! through and that takes too long). Every problem names the file it came from; a read is
//! deterministic (the same input twice gives the same problems); every manifest read is
//! either converted or reported.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use meridian_controllers::directory;
use meridian_controllers::manifest::{Limits, Loaded, parse_str_within};
use meridian_core::ClusterId;

const FILE: &str = "/fuzz/m.yaml";

fn read(text: &str) -> Loaded {
    let mut loaded = Loaded::default();
    parse_str_within(Path::new(FILE), text, Limits::DEFAULT_MAX_DEPTH, &mut loaded);
    loaded
}

fuzz_target!(|data: &[u8]| {
    // Files that are not UTF-8 are refused before parsing; the lossy text still exercises
    // the parser with what such a file's valid parts would be.
    let text = String::from_utf8_lossy(data);
    let loaded = read(&text);
    for e in loaded.errors.iter().chain(&loaded.warnings) {
        assert_eq!(e.file, Path::new(FILE), "a problem names another file: {e}");
        assert!(!e.reason.is_empty());
    }
    let again = read(&text);
    assert_eq!(loaded.errors, again.errors, "the same input read twice differs");
    assert_eq!(loaded.manifests.len(), again.manifests.len());

    let manifests = loaded.manifests.len();
    let errors = loaded.errors.len();
    let directory::MemberRead { objects, problems, .. } = directory::member_objects(&ClusterId::new("eu-1"), loaded);
    let converted = objects.services.len() + objects.slices.len() + objects.exports.len() + objects.imports.len();
    assert!(problems.len() >= errors, "the reader's errors are all reported");
    assert!(converted <= manifests, "more objects than manifests");

    let hub = directory::hub_objects(Path::new("/fuzz"), again);
    assert!(hub.errors.len() >= errors);
});
