use serde_json::{Value, json};

use super::*;

fn everything(_: &EntryKey<'_>) -> bool {
    true
}

fn merged(pages: Vec<Page>, rv: &str, next: Option<&str>) -> Value {
    let mut out = open(pages.first(), rv, next);
    let mut joiner = Joiner::default();
    for page in pages {
        out.extend_from_slice(&joiner.next(page));
    }
    out.extend_from_slice(CLOSE);
    serde_json::from_slice(&out).expect("the merged list is JSON")
}

fn page_of(cluster: &str, list: Value) -> Page {
    read(&serde_json::to_vec(&list).unwrap(), cluster, everything).unwrap()
}

fn pods(rv: &str, items: Value) -> Value {
    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items})
}

#[test]
fn items_are_copied_whole_and_marked_in_their_own_order() {
    let spec = json!({"containers": [{"name": "c", "image": "x", "args": ["a\"b", "\u{e9}"]}]});
    let page = page_of(
        "m1",
        pods(
            "10",
            json!([
                {"metadata": {"namespace": "shop", "name": "web", "labels": {"a": "b"}}, "spec": spec},
                {"metadata": {"namespace": "a", "name": "z", "annotations": {"x": "y", CLUSTER_ANNOTATION: "forged"}}},
            ]),
        ),
    );
    assert_eq!(
        (page.sent, page.kept, page.resource_version.as_deref()),
        (2, 2, Some("10"))
    );
    assert_eq!(page.kind().as_deref(), Some("PodList"));
    let list = merged(vec![page], "mrv1.x", None);
    let items = list["items"].as_array().unwrap();
    assert_eq!(items[0]["spec"], spec);
    assert_eq!(items[0]["metadata"]["labels"], json!({"a": "b"}));
    assert_eq!(
        items[0]["metadata"]["annotations"],
        json!({CLUSTER_ANNOTATION: "m1"})
    );
    // The member's order stays (a member answers in its own key order); a forged mark goes.
    assert_eq!(items[1]["metadata"]["name"], "z");
    assert_eq!(
        items[1]["metadata"]["annotations"],
        json!({"x": "y", CLUSTER_ANNOTATION: "m1"})
    );
    assert_eq!(list["metadata"], json!({"resourceVersion": "mrv1.x"}));
    assert_eq!(
        (list["kind"].as_str(), list["apiVersion"].as_str()),
        (Some("PodList"), Some("v1"))
    );
}

#[test]
fn pages_of_several_members_join_into_one_list_with_the_first_head() {
    let a = page_of(
        "m1",
        pods("1", json!([{"metadata": {"name": "a", "namespace": "n"}}])),
    );
    let empty = page_of("m2", pods("2", json!([])));
    let b = page_of(
        "m3",
        pods(
            "3",
            json!([{"metadata": {"name": "b", "namespace": "n", "annotations": null}}, {"metadata": {"name": "c", "namespace": "n"}}]),
        ),
    );
    let list = merged(vec![a, empty, b], "mrv1.y", Some("mct2.z"));
    let names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["annotations"][CLUSTER_ANNOTATION]
                    .as_str()
                    .unwrap(),
                i["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(names, ["m1/a", "m3/b", "m3/c"]);
    assert_eq!(list["metadata"]["continue"], "mct2.z");
}

#[test]
fn a_member_continue_token_is_read_and_an_empty_one_is_none() {
    let more = page_of(
        "m1",
        json!({"kind": "List", "metadata": {"resourceVersion": "5", "continue": "abc", "remainingItemCount": 3}, "items": []}),
    );
    assert_eq!(more.continue_token.as_deref(), Some("abc"));
    let last = page_of(
        "m1",
        json!({"kind": "List", "metadata": {"resourceVersion": "5", "continue": ""}, "items": null}),
    );
    assert_eq!((last.continue_token, last.sent), (None, 0));
}

#[test]
fn entries_the_filter_refuses_are_left_out_but_counted_as_sent() {
    let list = pods(
        "1",
        json!([
            {"metadata": {"namespace": "shop", "name": "a"}},
            {"metadata": {"namespace": "other", "name": "b"}},
            {"metadata": {"namespace": "shop", "name": "c"}},
        ]),
    );
    let page = read(&serde_json::to_vec(&list).unwrap(), "m1", |k| {
        k.namespace.as_deref() == Some("shop")
    })
    .unwrap();
    assert_eq!((page.sent, page.kept), (3, 2));
    let merged = merged(vec![page], "rv", None);
    assert_eq!(merged["items"].as_array().unwrap().len(), 2);
    assert_eq!(merged["items"][1]["metadata"]["name"], "c");
}

#[test]
fn a_filter_that_refuses_the_first_entry_leaves_no_stray_comma() {
    let list = pods(
        "1",
        json!([{"metadata": {"namespace": "x", "name": "a"}}, {"metadata": {"namespace": "shop", "name": "b"}}]),
    );
    let page = read(&serde_json::to_vec(&list).unwrap(), "m1", |k| {
        k.namespace.as_deref() == Some("shop")
    })
    .unwrap();
    assert_eq!(
        merged(vec![page], "rv", None)["items"][0]["metadata"]["name"],
        "b"
    );
}

#[test]
fn table_rows_mark_their_objects_and_keep_the_first_columns() {
    let table = |names: &[&str]| {
        json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": "4"},
               "columnDefinitions": [{"name": "Name", "type": "string"}],
               "rows": names.iter().map(|n| json!({"cells": [n],
                   "object": {"kind": "PartialObjectMetadata", "metadata": {"namespace": "shop", "name": n}}}))
                   .collect::<Vec<_>>()})
    };
    let list = merged(
        vec![
            page_of("m1", table(&["a", "c"])),
            page_of("m2", table(&["b"])),
        ],
        "rv",
        None,
    );
    assert_eq!(list["kind"], "Table");
    assert_eq!(list["columnDefinitions"][0]["name"], "Name");
    assert!(list.get("items").is_none());
    let rows: Vec<String> = list["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["object"]["metadata"]["annotations"][CLUSTER_ANNOTATION]
                    .as_str()
                    .unwrap(),
                r["cells"][0].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(rows, ["m1/a", "m1/c", "m2/b"]);
}

#[test]
fn a_row_without_its_object_passes_unmarked() {
    let table =
        json!({"kind": "Table", "rows": [{"cells": ["a"], "object": null}, {"cells": ["b"]}]});
    let page = page_of("m1", table);
    let list = merged(vec![page], "rv", None);
    assert_eq!(list["rows"][0], json!({"cells": ["a"], "object": null}));
    assert_eq!(list["rows"][1], json!({"cells": ["b"]}));
}

#[test]
fn escaped_keys_and_names_survive() {
    let list = pods(
        "1",
        json!([{"metadata": {"namespace": "n", "name": "a\"b\\c", "annotations": {"k\"ey": "v\n"}}, "odd\"field": 1}]),
    );
    let page = read(&serde_json::to_vec(&list).unwrap(), "m\"1", |k| {
        k.name.as_deref() == Some("a\"b\\c")
    })
    .unwrap();
    let merged = merged(vec![page], "rv", None);
    let item = &merged["items"][0];
    assert_eq!(item["odd\"field"], 1);
    assert_eq!(
        item["metadata"]["annotations"],
        json!({"k\"ey": "v\n", CLUSTER_ANNOTATION: "m\"1"})
    );
}

#[test]
fn no_page_opens_a_plain_list() {
    let mut out = open(None, "mrv1.e30", None);
    out.extend_from_slice(CLOSE);
    let list: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        list,
        json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "mrv1.e30"}, "items": []})
    );
}

#[test]
fn what_is_not_a_list_is_an_error() {
    for bad in [
        &b"[1,2]"[..],
        b"not json",
        b"{\"items\": [1]}",
        b"{\"items\": []} x",
    ] {
        assert!(read(bad, "m1", everything).is_err(), "{bad:?}");
    }
}
