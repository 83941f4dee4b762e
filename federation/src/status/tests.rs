use proptest::prelude::*;
use serde_json::json;

use super::*;

/// A member copy current with template generation `gen`: applied from it, and observed.
fn current<'a>(cluster: &'a str, object: &'a Value, generation: i64) -> MemberCopy<'a> {
    MemberCopy {
        cluster,
        object,
        applied_generation: int(object.pointer("/metadata/generation")),
        applied_from: Some(generation),
    }
}

fn deployment(generation: i64, observed: i64, status: Value) -> Value {
    let mut status = status;
    status["observedGeneration"] = observed.into();
    json!({"metadata": {"generation": generation}, "status": status})
}

fn condition(kind: &str, status: &str, reason: &str, message: &str, time: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": time})
}

#[test]
fn deployment_counters_are_summed() {
    let m1 = deployment(
        2,
        2,
        json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "availableReplicas": 3}),
    );
    let m2 = deployment(
        1,
        1,
        json!({"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "availableReplicas": 1,
               "unavailableReplicas": 1}),
    );
    let status = aggregate(
        "Deployment",
        7,
        &[current("m1", &m1, 7), current("m2", &m2, 7)],
    );
    assert_eq!(
        status,
        Some(json!({
            "replicas": 5, "readyReplicas": 4, "updatedReplicas": 5, "availableReplicas": 4,
            "unavailableReplicas": 1, "observedGeneration": 7
        }))
    );
}

#[test]
fn a_counter_no_copy_reports_is_left_out_and_one_reported_zero_is_kept() {
    let m1 = deployment(1, 1, json!({"replicas": 0}));
    let m2 = deployment(1, 1, json!({}));
    let status = aggregate(
        "Deployment",
        1,
        &[current("m1", &m1, 1), current("m2", &m2, 1)],
    )
    .unwrap();
    assert_eq!(status, json!({"replicas": 0, "observedGeneration": 1}));
}

#[test]
fn counters_per_kind() {
    struct Case {
        kind: &'static str,
        status: Value,
    }
    let cases = [
        Case {
            kind: "ReplicaSet",
            status: json!({"replicas": 1, "readyReplicas": 2, "availableReplicas": 3,
                           "fullyLabeledReplicas": 4}),
        },
        Case {
            kind: "StatefulSet",
            status: json!({"replicas": 1, "readyReplicas": 2, "currentReplicas": 3,
                           "updatedReplicas": 4, "availableReplicas": 5}),
        },
        Case {
            kind: "DaemonSet",
            status: json!({"currentNumberScheduled": 1, "numberMisscheduled": 2,
                           "desiredNumberScheduled": 3, "numberReady": 4,
                           "updatedNumberScheduled": 5, "numberAvailable": 6,
                           "numberUnavailable": 7}),
        },
        Case {
            kind: "Job",
            status: json!({"active": 1, "succeeded": 2, "failed": 3, "ready": 4}),
        },
    ];
    for case in cases {
        let object = json!({"metadata": {"generation": 1}, "status": case.status});
        let copies = [current("m1", &object, 1), current("m2", &object, 1)];
        let status = aggregate(case.kind, 1, &copies).unwrap();
        for (field, value) in case.status.as_object().unwrap() {
            let doubled = value.as_i64().unwrap() * 2;
            assert_eq!(status[field], doubled, "{} {field}", case.kind);
        }
    }
}

#[test]
fn kinds_without_aggregated_status() {
    let object = json!({"status": {"loadBalancer": {}}});
    for kind in ["ConfigMap", "Service", "CronJob", "Pod"] {
        assert_eq!(
            aggregate(kind, 1, &[current("m1", &object, 1)]),
            None,
            "{kind}"
        );
    }
}

#[test]
fn no_copies_is_an_empty_status() {
    assert_eq!(aggregate("Deployment", 3, &[]), Some(json!({})));
}

#[test]
fn odd_counters_are_read_as_absent() {
    let m1 = deployment(1, 1, json!({"replicas": "three", "readyReplicas": 1}));
    let m2 = deployment(1, 1, json!({"replicas": 2}));
    let status = aggregate(
        "Deployment",
        1,
        &[current("m1", &m1, 1), current("m2", &m2, 1)],
    )
    .unwrap();
    assert_eq!(status["replicas"], 2);
    assert_eq!(status["readyReplicas"], 1);
}

#[test]
fn conditions_all_true() {
    let t = "2025-01-01T00:00:0";
    let m1 = json!({"status": {"conditions": [
        condition("Available", "True", "MinimumReplicasAvailable", "ok", &format!("{t}1Z")),
        condition("Progressing", "True", "NewReplicaSetAvailable", "done", &format!("{t}5Z")),
    ]}});
    let m2 = json!({"status": {"conditions": [
        condition("Progressing", "True", "NewReplicaSetAvailable", "done", &format!("{t}2Z")),
        condition("Available", "True", "MinimumReplicasAvailable", "ok", &format!("{t}3Z")),
    ]}});
    let status = aggregate(
        "Deployment",
        1,
        &[current("m2", &m2, 1), current("m1", &m1, 1)],
    )
    .unwrap();
    assert_eq!(
        status["conditions"],
        json!([
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
             "message": "m1, m2: ok", "lastTransitionTime": "2025-01-01T00:00:03Z"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
             "message": "m1, m2: done", "lastTransitionTime": "2025-01-01T00:00:05Z"},
        ])
    );
}

#[test]
fn conditions_false_when_any_copy_says_false() {
    let time = "2025-01-01T00:00:00Z";
    let m1 = json!({"status": {"conditions": [condition("Available", "True", "Ok", "ok", time)]}});
    let m2 = json!({"status": {"conditions": [
        condition("Available", "Unknown", "Waiting", "no word yet", time)
    ]}});
    let m3 = json!({"status": {"conditions": [
        condition("Available", "False", "MinimumReplicasUnavailable", "1 of 3", time)
    ]}});
    let copies = [
        current("m3", &m3, 1),
        current("m1", &m1, 1),
        current("m2", &m2, 1),
    ];
    let c = &aggregate("Deployment", 1, &copies).unwrap()["conditions"][0];
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "MinimumReplicasUnavailable");
    assert_eq!(c["message"], "m2: no word yet; m3: 1 of 3");
}

#[test]
fn conditions_unknown_when_not_all_true_and_none_false() {
    let time = "2025-01-01T00:00:00Z";
    let m1 = json!({"status": {"conditions": [condition("Available", "True", "Ok", "ok", time)]}});
    let m2 = json!({"status": {"conditions": [{"type": "Available", "reason": "Starting"}]}});
    let c = &aggregate(
        "Deployment",
        1,
        &[current("m1", &m1, 1), current("m2", &m2, 1)],
    )
    .unwrap()["conditions"][0];
    assert_eq!(c["status"], "Unknown");
    assert_eq!(c["reason"], "Starting");
    assert_eq!(c["message"], "m2: Starting");
    assert_eq!(c["lastTransitionTime"], time);
}

#[test]
fn a_copy_without_the_type_does_not_count() {
    let time = "2025-01-01T00:00:00Z";
    let m1 = json!({"status": {"conditions": [condition("Available", "True", "Ok", "ok", time)]}});
    let m2 = json!({"status": {}});
    let c = &aggregate(
        "Deployment",
        1,
        &[current("m1", &m1, 1), current("m2", &m2, 1)],
    )
    .unwrap()["conditions"][0];
    assert_eq!(c["status"], "True");
    assert_eq!(c["message"], "m1: ok");
}

#[test]
fn failure_conditions_are_true_when_any_copy_fails() {
    let time = "2025-01-01T00:00:00Z";
    let m1 = json!({"status": {"conditions": [
        condition("ReplicaFailure", "False", "Recovered", "", time)
    ]}});
    let m2 = json!({"status": {"conditions": [
        condition("ReplicaFailure", "True", "FailedCreate", "quota exceeded", time)
    ]}});
    let c = &aggregate(
        "Deployment",
        1,
        &[current("m1", &m1, 1), current("m2", &m2, 1)],
    )
    .unwrap()["conditions"][0];
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "FailedCreate");
    assert_eq!(c["message"], "m2: quota exceeded");
}

#[test]
fn job_completes_only_when_every_copy_completed() {
    let done = |start: &str, end: &str| {
        json!({"status": {"startTime": start, "completionTime": end, "succeeded": 1,
                          "conditions": [condition("Complete", "True", "Done", "", end)]}})
    };
    let m1 = done("2025-01-01T00:00:05Z", "2025-01-01T00:10:00Z");
    let m2 = done("2025-01-01T00:00:01Z", "2025-01-01T00:20:00Z");
    let running = json!({"status": {"startTime": "2025-01-01T00:00:03Z", "active": 1}});

    let status = aggregate("Job", 1, &[current("m1", &m1, 1), current("m2", &m2, 1)]).unwrap();
    assert_eq!(status["startTime"], "2025-01-01T00:00:01Z");
    assert_eq!(status["completionTime"], "2025-01-01T00:20:00Z");
    assert_eq!(status["succeeded"], 2);
    assert_eq!(status["conditions"][0]["type"], "Complete");
    assert_eq!(status["conditions"][0]["status"], "True");
    assert_eq!(status["conditions"][0]["message"], "m1, m2: Done");
    assert!(
        status.get("observedGeneration").is_none(),
        "a Job's status has none"
    );

    let copies = [
        current("m1", &m1, 1),
        current("m2", &m2, 1),
        current("m3", &running, 1),
    ];
    let status = aggregate("Job", 1, &copies).unwrap();
    assert_eq!(status["startTime"], "2025-01-01T00:00:01Z");
    assert!(status.get("completionTime").is_none(), "{status}");
    assert!(status.get("conditions").is_none(), "{status}");
}

#[test]
fn job_fails_when_any_copy_failed() {
    let failed = json!({"status": {"failed": 6, "conditions": [
        condition("Failed", "True", "BackoffLimitExceeded", "too many failures",
                  "2025-01-01T00:05:00Z")
    ]}});
    let running = json!({"status": {"active": 1}});
    let status = aggregate(
        "Job",
        1,
        &[current("m1", &running, 1), current("m2", &failed, 1)],
    )
    .unwrap();
    assert_eq!(
        status["conditions"],
        json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                "message": "m2: too many failures", "lastTransitionTime": "2025-01-01T00:05:00Z"}])
    );
}

#[test]
fn long_messages_are_cut() {
    let long = "é".repeat(MAX_MESSAGE);
    let m1 = json!({"status": {"conditions": [
        condition("Available", "False", "R", &long, "2025-01-01T00:00:00Z")
    ]}});
    let c = &aggregate("Deployment", 1, &[current("m1", &m1, 1)]).unwrap()["conditions"][0];
    let message = c["message"].as_str().unwrap();
    assert!(message.len() <= MAX_MESSAGE, "{}", message.len());
    assert!(message.starts_with("m1: éé") && message.ends_with('…'));
}

/// A copy with the given bookkeeping, its member object at generation 5.
fn copy<'a>(
    object: &'a Value,
    applied_generation: Option<i64>,
    applied_from: Option<i64>,
) -> MemberCopy<'a> {
    MemberCopy {
        cluster: "m1",
        object,
        applied_generation,
        applied_from,
    }
}

#[test]
fn observed_generation_gate() {
    let observed_5 = json!({"metadata": {"generation": 5}, "status": {"observedGeneration": 5}});
    let observed_4 = json!({"metadata": {"generation": 5}, "status": {"observedGeneration": 4}});
    let no_status = json!({"metadata": {"generation": 5}});
    struct Case<'a> {
        name: &'static str,
        copies: Vec<MemberCopy<'a>>,
        expect: Option<i64>,
    }
    let cases = [
        Case {
            name: "open: every copy observed an apply from the current template",
            copies: vec![
                copy(&observed_5, Some(5), Some(9)),
                copy(&observed_5, Some(4), Some(9)),
            ],
            expect: Some(9),
        },
        Case {
            name: "closed: a member has not observed meridian's last apply",
            copies: vec![
                copy(&observed_5, Some(5), Some(9)),
                copy(&observed_4, Some(5), Some(9)),
            ],
            expect: None,
        },
        Case {
            name: "closed: the last apply came from an older template",
            copies: vec![
                copy(&observed_5, Some(5), Some(9)),
                copy(&observed_5, Some(5), Some(8)),
            ],
            expect: None,
        },
        Case {
            name: "closed: meridian has not applied to a member",
            copies: vec![copy(&observed_5, None, None)],
            expect: None,
        },
        Case {
            name: "closed: a member reports no observedGeneration",
            copies: vec![copy(&no_status, Some(5), Some(9))],
            expect: None,
        },
        Case {
            name: "closed: placed nowhere",
            copies: vec![],
            expect: None,
        },
    ];
    for case in cases {
        assert_eq!(
            observed_generation(9, &case.copies),
            case.expect,
            "{}",
            case.name
        );
        let status = aggregate("Deployment", 9, &case.copies).unwrap();
        assert_eq!(
            status.get("observedGeneration").and_then(Value::as_i64),
            case.expect,
            "{}",
            case.name
        );
    }
}

#[test]
fn ready_per_kind() {
    struct Case {
        name: &'static str,
        kind: &'static str,
        object: Value,
        desired: Option<u32>,
        expect: bool,
    }
    let obj = |generation: i64, spec: Value, status: Value| json!({"metadata": {"generation": generation}, "spec": spec, "status": status});
    let cases = [
        Case {
            name: "Deployment: observed, available as desired",
            kind: "Deployment",
            object: obj(
                2,
                json!({"replicas": 3}),
                json!({"observedGeneration": 2, "availableReplicas": 3}),
            ),
            desired: None,
            expect: true,
        },
        Case {
            name: "Deployment: ready but not yet available",
            kind: "Deployment",
            object: obj(
                2,
                json!({"replicas": 3}),
                json!({"observedGeneration": 2, "readyReplicas": 3, "availableReplicas": 2}),
            ),
            desired: None,
            expect: false,
        },
        Case {
            name: "Deployment: the controller has not seen the latest spec",
            kind: "Deployment",
            object: obj(
                3,
                json!({"replicas": 3}),
                json!({"observedGeneration": 2, "availableReplicas": 3}),
            ),
            desired: None,
            expect: false,
        },
        Case {
            name: "Deployment: the argument overrides spec.replicas",
            kind: "Deployment",
            object: obj(
                1,
                json!({"replicas": 1}),
                json!({"observedGeneration": 1, "availableReplicas": 1}),
            ),
            desired: Some(2),
            expect: false,
        },
        Case {
            name: "Deployment: no spec.replicas means 1",
            kind: "Deployment",
            object: obj(
                1,
                json!({}),
                json!({"observedGeneration": 1, "availableReplicas": 1}),
            ),
            desired: None,
            expect: true,
        },
        Case {
            name: "Deployment: no status yet",
            kind: "Deployment",
            object: json!({"metadata": {"generation": 1}, "spec": {"replicas": 1}}),
            desired: None,
            expect: false,
        },
        Case {
            name: "Deployment: zero desired is ready once observed",
            kind: "Deployment",
            object: obj(1, json!({"replicas": 0}), json!({"observedGeneration": 1})),
            desired: None,
            expect: true,
        },
        Case {
            name: "StatefulSet: ready replicas as desired",
            kind: "StatefulSet",
            object: obj(
                1,
                json!({"replicas": 2}),
                json!({"observedGeneration": 1, "readyReplicas": 2}),
            ),
            desired: None,
            expect: true,
        },
        Case {
            name: "StatefulSet: available is not enough",
            kind: "StatefulSet",
            object: obj(
                1,
                json!({"replicas": 2}),
                json!({"observedGeneration": 1, "readyReplicas": 1, "availableReplicas": 2}),
            ),
            desired: None,
            expect: false,
        },
        Case {
            name: "ReplicaSet: ready replicas as desired",
            kind: "ReplicaSet",
            object: obj(
                4,
                json!({"replicas": 2}),
                json!({"observedGeneration": 4, "readyReplicas": 2}),
            ),
            desired: Some(2),
            expect: true,
        },
        Case {
            name: "ReplicaSet: not observed",
            kind: "ReplicaSet",
            object: obj(4, json!({"replicas": 2}), json!({"readyReplicas": 2})),
            desired: Some(2),
            expect: false,
        },
        Case {
            name: "DaemonSet: every scheduled pod ready",
            kind: "DaemonSet",
            object: obj(
                1,
                json!({}),
                json!({"observedGeneration": 1, "desiredNumberScheduled": 3, "numberReady": 3}),
            ),
            desired: None,
            expect: true,
        },
        Case {
            name: "DaemonSet: a pod not ready",
            kind: "DaemonSet",
            object: obj(
                1,
                json!({}),
                json!({"observedGeneration": 1, "desiredNumberScheduled": 3, "numberReady": 2}),
            ),
            desired: None,
            expect: false,
        },
        Case {
            name: "DaemonSet: no node to run on",
            kind: "DaemonSet",
            object: obj(
                1,
                json!({}),
                json!({"observedGeneration": 1, "desiredNumberScheduled": 0}),
            ),
            desired: None,
            expect: true,
        },
        Case {
            name: "DaemonSet: nodes not counted yet",
            kind: "DaemonSet",
            object: obj(1, json!({}), json!({"observedGeneration": 1})),
            desired: None,
            expect: false,
        },
        Case {
            name: "Job: a pod ready",
            kind: "Job",
            object: json!({"status": {"active": 1, "ready": 1}}),
            desired: Some(1),
            expect: true,
        },
        Case {
            name: "Job: pods created, none ready",
            kind: "Job",
            object: json!({"status": {"active": 1, "ready": 0}}),
            desired: None,
            expect: false,
        },
        Case {
            name: "Job: complete",
            kind: "Job",
            object: json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}),
            desired: None,
            expect: true,
        },
        Case {
            name: "Job: failed, though some pods succeeded",
            kind: "Job",
            object: json!({"status": {"succeeded": 1, "conditions": [{"type": "Failed", "status": "True"}]}}),
            desired: None,
            expect: false,
        },
        Case {
            name: "ConfigMap: exists",
            kind: "ConfigMap",
            object: json!({"data": {}}),
            desired: None,
            expect: true,
        },
        Case {
            name: "Service: exists, no status needed",
            kind: "Service",
            object: json!({"spec": {}}),
            desired: Some(3),
            expect: true,
        },
    ];
    for case in cases {
        assert_eq!(
            ready(case.kind, &case.object, case.desired),
            case.expect,
            "{}",
            case.name
        );
    }
}

fn member_status() -> impl Strategy<Value = Value> {
    let status = prop_oneof![Just("True"), Just("False"), Just("Unknown")];
    (
        prop::option::of(0i64..10),
        prop::option::of(0i64..10),
        prop::option::of(status),
    )
        .prop_map(|(replicas, ready, available)| {
            let mut s = Map::new();
            if let Some(r) = replicas {
                s.insert("replicas".into(), r.into());
            }
            if let Some(r) = ready {
                s.insert("readyReplicas".into(), r.into());
            }
            if let Some(a) = available {
                s.insert(
                    "conditions".into(),
                    json!([{"type": "Available", "status": a, "reason": a,
                            "lastTransitionTime": "2025-01-01T00:00:00Z"}]),
                );
            }
            json!({"metadata": {"generation": 1}, "status": s})
        })
}

proptest! {
    /// The order members are listed in never shows in the aggregated status.
    #[test]
    fn input_order_does_not_matter(
        objects in prop::collection::vec(member_status(), 0..6),
        rotate in 0usize..6,
    ) {
        let names: Vec<String> = (0..objects.len()).map(|i| format!("m{i}")).collect();
        let copies: Vec<MemberCopy<'_>> = names
            .iter()
            .zip(&objects)
            .map(|(n, o)| current(n, o, 1))
            .collect();
        let mut shuffled = copies.clone();
        shuffled.reverse();
        if !shuffled.is_empty() {
            let by = rotate % shuffled.len();
            shuffled.rotate_left(by);
        }
        prop_assert_eq!(aggregate("Deployment", 1, &copies), aggregate("Deployment", 1, &shuffled));
    }

    /// A summed counter is the sum of what the copies report.
    #[test]
    fn replicas_are_the_sum(objects in prop::collection::vec(member_status(), 1..6)) {
        let copies: Vec<MemberCopy<'_>> = objects.iter().map(|o| current("m", o, 1)).collect();
        let status = aggregate("Deployment", 1, &copies).unwrap();
        let reported: Vec<i64> = objects
            .iter()
            .filter_map(|o| o.pointer("/status/replicas").and_then(Value::as_i64))
            .collect();
        let expect = (!reported.is_empty()).then(|| reported.iter().sum::<i64>());
        prop_assert_eq!(status.get("replicas").and_then(Value::as_i64), expect);
    }
}
