use std::sync::Arc;

use super::*;

fn parse(text: &str) -> Loaded {
    let mut out = Loaded::default();
    parse_str(Path::new("m.yaml"), text, &mut out);
    out
}

const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  ports: [{port: 80}]\n";

#[test]
fn multi_document_files_and_lists_are_read() {
    let text = format!(
        "{SERVICE}---\n---\napiVersion: v1\nkind: List\nitems:\n  - apiVersion: multicluster.x-k8s.io/v1alpha1\n    kind: ServiceExport\n    metadata: {{name: web, namespace: shop}}\n  - apiVersion: discovery.k8s.io/v1\n    kind: EndpointSlice\n    metadata: {{name: web-1, namespace: shop, labels: {{kubernetes.io/service-name: web}}}}\n    addressType: IPv4\n    endpoints: []\n"
    );
    let out = parse(&text);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let kinds: Vec<&str> = out
        .manifests
        .iter()
        .map(|(_, m)| match m {
            Manifest::Service(_) => "Service",
            Manifest::ServiceExport(_) => "ServiceExport",
            Manifest::EndpointSlice(_) => "EndpointSlice",
            Manifest::ServiceImport(_) => "ServiceImport",
            Manifest::MemberCluster(_) => "MemberCluster",
            Manifest::ClusterSchedulingPolicy(_) => "ClusterSchedulingPolicy",
            Manifest::OverridePolicy(_) => "OverridePolicy",
            Manifest::Tenant(_) => "Tenant",
            Manifest::Node(_) => "Node",
            Manifest::Pod(_) => "Pod",
            Manifest::ResourceQuota(_) => "ResourceQuota",
            Manifest::HttpRoute(_) => "HTTPRoute",
            Manifest::GrpcRoute(_) => "GRPCRoute",
            Manifest::ReferenceGrant(_) => "ReferenceGrant",
            Manifest::Other(_) => "other",
        })
        .collect();
    assert_eq!(kinds, ["Service", "ServiceExport", "EndpointSlice"]);
}

#[test]
fn malformed_yaml_names_the_file_and_document() {
    let out = parse(&format!("{SERVICE}---\nkind: [unclosed\n"));
    assert_eq!(
        out.manifests.len(),
        1,
        "the good document before it is kept"
    );
    assert_eq!(out.errors.len(), 1);
    let e = &out.errors[0];
    assert_eq!(e.file, Path::new("m.yaml"));
    assert_eq!(e.object.to_string(), "document 2");
    assert!(e.reason.starts_with("malformed YAML"), "{}", e.reason);
}

#[test]
fn unknown_fields_warn_in_kubernetes_kinds_and_fail_in_meridian_kinds() {
    let out = parse(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec: {ports: [{port: 80}], colour: blue}\n",
    );
    assert_eq!(out.manifests.len(), 1);
    assert_eq!(out.warnings.len(), 1);
    assert!(
        out.warnings[0].reason.contains("spec.colour"),
        "{}",
        out.warnings[0].reason
    );
    let out = parse(
        "apiVersion: meridian.io/v1alpha1\nkind: MemberCluster\nmetadata: {name: eu-1}\nspec: {source: {directory: {path: x}}, colour: blue}\n",
    );
    assert!(out.manifests.is_empty());
    assert_eq!(out.errors[0].object.to_string(), "MemberCluster eu-1");
    assert!(
        out.errors[0].reason.contains("spec.colour"),
        "{}",
        out.errors[0].reason
    );
}

#[test]
fn type_errors_and_missing_identity_are_errors() {
    let out = parse(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: eighty}]}\n",
    );
    assert_eq!(out.errors.len(), 1);
    assert_eq!(out.errors[0].object.to_string(), "Service web");
    assert!(
        out.errors[0].reason.starts_with("invalid Service"),
        "{}",
        out.errors[0].reason
    );
    let out = parse("metadata: {name: x}\n");
    assert!(
        out.errors[0]
            .reason
            .contains("apiVersion and kind are required")
    );
}

#[test]
fn kinds_without_a_type_are_kept_as_json_for_the_reader_to_judge() {
    let out = parse(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec: {replicas: 3}\n",
    );
    assert!(out.errors.is_empty() && out.warnings.is_empty());
    let [(_, Manifest::Other(o))] = &out.manifests[..] else {
        panic!("one other object expected: {:?}", out.manifests);
    };
    assert_eq!(o.object.to_string(), "Deployment shop/web");
    assert_eq!(o.value["spec"]["replicas"], 3);
    let cut = parse("apiVersion: discovery.k8s.io/v1\nkind: En\n");
    assert!(
        cut.errors[0].reason.contains("metadata.name is required"),
        "a document cut short is an error, not an object: {:?}",
        cut.errors
    );
    let out = parse("apiVersion: meridian.io/v1alpha1\nkind: Placement\nmetadata: {name: p}\n");
    assert!(out.errors[0].reason.contains("not a meridian.io kind"));
}

#[test]
fn load_dir_reads_nested_yaml_and_skips_hidden_and_other_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/a.yaml"), SERVICE).unwrap();
    std::fs::write(dir.path().join(".hidden.yaml"), "garbage: [").unwrap();
    std::fs::write(dir.path().join("notes.txt"), "garbage: [").unwrap();
    let out = load_dir(dir.path()).unwrap();
    assert_eq!(out.manifests.len(), 1);
    assert!(out.errors.is_empty());
    assert!(load_dir(&dir.path().join("missing")).is_err());
}

#[test]
fn a_malformed_document_rejects_only_itself() {
    let dup = "apiVersion: v1\nkind: Service\nmetadata: {name: dup, namespace: shop}\nmetadata: {name: again}\n";
    let out = parse(&format!(
        "{dup}---\n{SERVICE}---\nkind: [unclosed\n---\n{SERVICE}"
    ));
    assert_eq!(
        out.manifests.len(),
        2,
        "the documents after the bad ones are kept"
    );
    let objects: Vec<String> = out.errors.iter().map(|e| e.object.to_string()).collect();
    assert_eq!(objects, ["document 1", "document 3"]);
    assert!(
        out.errors[0].reason.contains("duplicate"),
        "{}",
        out.errors[0].reason
    );
    // Line numbers are the file's, not the document's.
    assert!(
        out.errors[1].reason.contains("line 12"),
        "{}",
        out.errors[1].reason
    );
}

#[test]
fn a_deeply_nested_document_is_rejected_before_parsing() {
    let deep = format!("a: {}\n", "[".repeat(100_000));
    let started = std::time::Instant::now();
    let out = parse(&format!("{SERVICE}---\n{deep}"));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(out.manifests.len(), 1);
    assert_eq!(out.errors[0].object.to_string(), "document 2");
    assert!(
        out.errors[0]
            .reason
            .contains("nesting deeper than 64 levels at line 7"),
        "{}",
        out.errors[0].reason
    );
}

#[test]
fn only_regular_files_within_the_limits_are_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), SERVICE).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yaml")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("a.yaml"), dir.path().join("link.yaml")).unwrap();
    let fifo = dir.path().join("fifo.yaml");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let big = std::fs::File::create(dir.path().join("big.yaml")).unwrap();
    big.set_len(Limits::DEFAULT_MAX_FILE_BYTES + 1).unwrap();
    let out = load_dir(dir.path()).unwrap();
    assert_eq!(out.manifests.len(), 2, "a.yaml and the link to it");
    let mut reasons: Vec<String> = out
        .errors
        .iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.file.file_name().unwrap().to_string_lossy(),
                e.reason
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            "big.yaml: is larger than 16777216 bytes (directory.maxFileBytes); skipped",
            "fifo.yaml: is a FIFO, not a regular file; skipped",
            "zero.yaml: is a character device, not a regular file; skipped",
        ]
    );
    let file = dir.path().join("a.yaml");
    assert!(matches!(
        load_dir(&file),
        Err(Error::NotADirectory { path }) if path == file
    ));
}

#[test]
fn the_directory_limit_skips_the_files_past_it() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a.yaml", "b.yaml", "c.yaml"] {
        std::fs::write(dir.path().join(name), SERVICE).unwrap();
    }
    // A file refused for its size reads nothing, so it takes nothing from the others.
    let big = std::fs::File::create(dir.path().join("0-big.yaml")).unwrap();
    big.set_len(Limits::DEFAULT_MAX_FILE_BYTES + 1).unwrap();
    let limits = Limits {
        max_member_bytes: 2 * SERVICE.len() as u64,
        ..Limits::default().once()
    };
    let read = DirReader::new(limits)
        .read(dir.path(), std::time::Instant::now())
        .unwrap();
    assert_eq!(read.loaded.manifests.len(), 2);
    assert_eq!(read.loaded.errors.len(), 2);
    assert!(read.loaded.errors[0].file.ends_with("0-big.yaml"));
    assert!(read.loaded.errors[1].file.ends_with("c.yaml"));
    assert!(
        read.loaded.errors[1]
            .reason
            .contains("directory.maxMemberBytes")
    );
}

#[test]
fn a_rewrite_in_progress_keeps_serving_the_last_good_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.yaml");
    std::fs::write(&path, SERVICE).unwrap();
    let limits = Limits {
        settle: std::time::Duration::ZERO,
        ..Limits::default()
    };
    let mut reader = DirReader::new(limits);
    let t0 = std::time::Instant::now();
    let first = reader.read(dir.path(), t0).unwrap();
    assert!(first.changed && first.loaded.manifests.len() == 1);
    // Caught half-way through `open(path, 'w')` and a first write.
    std::fs::write(&path, &SERVICE[..40]).unwrap();
    let half = reader.read(dir.path(), t0).unwrap();
    assert!(!half.changed, "the good content keeps serving");
    assert!(
        half.again_in.is_some(),
        "a read again once the grace is over"
    );
    let later = reader.read(dir.path(), t0 + Limits::DEFAULT_GRACE).unwrap();
    assert!(
        later.changed,
        "still broken after the grace: served and reported"
    );
    assert!(later.loaded.manifests.is_empty() && !later.loaded.errors.is_empty());
}

#[test]
fn a_valid_prefix_is_not_read_while_its_writer_has_the_file_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.yaml");
    let two = format!("{SERVICE}---\n{}", SERVICE.replace("web", "api"));
    std::fs::write(&path, &two).unwrap();
    let limits = Limits {
        settle: std::time::Duration::ZERO,
        ..Limits::default()
    };
    let writes = Arc::new(OpenWrites::default());
    let mut reader = DirReader::new(limits).watching_writes(writes.clone());
    let t0 = std::time::Instant::now();
    assert_eq!(
        reader.read(dir.path(), t0).unwrap().loaded.manifests.len(),
        2
    );
    // A writer paused after the first document: one valid Service, nothing half-written.
    std::fs::write(&path, SERVICE).unwrap();
    let canonical = std::fs::canonicalize(&path).unwrap();
    writes.written(&canonical, t0);
    let paused = reader.read(dir.path(), t0).unwrap();
    assert!(
        !paused.changed && paused.again_in.is_some(),
        "not read while open"
    );
    std::fs::write(
        &path,
        format!("{SERVICE}---\n{}", SERVICE.replace("web", "db")),
    )
    .unwrap();
    writes.closed(&canonical);
    let done = reader.read(dir.path(), t0).unwrap();
    assert!(done.changed);
    assert_eq!(done.loaded.manifests.len(), 2);
}

#[test]
fn a_directory_written_just_now_is_served_whole_once_it_settled() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), SERVICE).unwrap();
    let mut reader = DirReader::new(Limits::default());
    let t0 = std::time::Instant::now();
    let first = reader.read(dir.path(), t0).unwrap();
    assert!(
        first.first_read_pending && !first.changed,
        "not a directory without a.yaml"
    );
    let settled = reader
        .read(dir.path(), t0 + Limits::DEFAULT_SETTLE)
        .unwrap();
    assert!(settled.changed && !settled.first_read_pending);
    assert_eq!(settled.loaded.manifests.len(), 1);
}

#[test]
fn a_tree_past_the_bounds_is_refused_not_walked_whole() {
    let dir = tempfile::tempdir().unwrap();
    for d in 0..5 {
        let sub = dir.path().join(format!("d{d}"));
        std::fs::create_dir(&sub).unwrap();
        std::fs::create_dir(sub.join(".hidden")).unwrap();
        std::fs::write(sub.join("a.yaml"), SERVICE).unwrap();
    }
    assert_eq!(
        directories_within(dir.path(), 5).unwrap(),
        6,
        "hidden ones aside"
    );
    let err = directories_within(dir.path(), 4).unwrap_err();
    assert!(matches!(err, Error::TooManyEntries { max: 4, .. }), "{err}");
    assert!(
        load_dir(dir.path()).is_ok(),
        "10 entries are far below the listing bound"
    );
}
