use meridian_core::route::{Condition as Decided, ParentRef};

use super::*;

fn status(accepted: bool) -> RouteStatus {
    RouteStatus {
        observed_generation: Some(3),
        from_api: true,
        parents: vec![ParentStatus {
            parent: ParentRef {
                group: String::new(),
                kind: "Service".into(),
                namespace: "demo".into(),
                name: "greeter".into(),
                port: Some(50051),
            },
            accepted: Decided {
                status: accepted,
                reason: if accepted {
                    "Accepted"
                } else {
                    "NoMatchingParent"
                },
                message: String::new(),
            },
            resolved_refs: Decided {
                status: true,
                reason: "ResolvedRefs",
                message: String::new(),
            },
        }],
    }
}

#[test]
fn an_entry_names_its_parent_and_both_conditions_at_the_observed_generation() {
    let e = &entries_of(&status(false))[0];
    assert_eq!(
        e.parent,
        json!({"group": "", "kind": "Service", "namespace": "demo", "name": "greeter", "port": 50051})
    );
    let types: Vec<_> = e
        .conditions
        .iter()
        .map(|c| {
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_str(),
                c.observed_generation,
            )
        })
        .collect();
    assert_eq!(
        types,
        [
            ("Accepted", "False", "NoMatchingParent", Some(3)),
            ("ResolvedRefs", "True", "ResolvedRefs", Some(3))
        ]
    );
}

#[test]
fn other_controllers_entries_are_kept_and_ours_replaced() {
    let current = json!([
        {"parentRef": {"name": "edge"}, "controllerName": "example.com/other", "conditions": []},
        {"parentRef": {"name": "old"}, "controllerName": CONTROLLER_NAME, "conditions": []},
    ]);
    let merged = merged_parents(Some(&current), &entries_of(&status(true)));
    let names: Vec<_> = merged
        .iter()
        .map(|p| {
            (
                p["controllerName"].as_str().unwrap(),
                p["parentRef"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [("example.com/other", "edge"), (CONTROLLER_NAME, "greeter")]
    );
    // Ours removed: only the other controller's entry is left.
    assert_eq!(merged_parents(Some(&current), &Vec::new()).len(), 1);
    assert!(merged_parents(None, &Vec::new()).is_empty());
}
