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
fn kinds_meridian_does_not_read_are_ignored_with_a_warning() {
    let out =
        parse("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\n");
    assert!(out.manifests.is_empty() && out.errors.is_empty());
    assert!(out.warnings[0].reason.contains("not a kind meridian reads"));
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
