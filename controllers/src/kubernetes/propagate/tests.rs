use super::*;

#[test]
fn template_labels_are_bounded_label_values() {
    let key = TemplateKey::new("apps/v1", "Deployment", "shop", "web");
    assert_eq!(template_label(&key), "deployment.apps.web");
    let key = TemplateKey::new("v1", "ConfigMap", "shop", "settings");
    assert_eq!(template_label(&key), "configmap.core.settings");
    let long = TemplateKey::new("apps/v1", "Deployment", "shop", &"x".repeat(80));
    let label = template_label(&long);
    assert_eq!(label.len(), 63);
    assert!(label.starts_with("deployment.apps.xxx"));
    assert_ne!(
        label,
        template_label(&TemplateKey::new(
            "apps/v1",
            "Deployment",
            "shop",
            &"x".repeat(81)
        ))
    );
}

#[test]
fn nulls_are_left_out_of_what_is_applied() {
    let v = strip_nulls(json!({"a": null, "b": {"c": null, "d": 1}, "e": [{"f": null}]}));
    assert_eq!(v, json!({"b": {"d": 1}, "e": [{}]}));
}

// Requests against an API server in the test process (kubernetes::mock): conflicts, the
// handover of retained fields, and the namespace lifecycle.

use crate::kubernetes::mock::{ApiServer, Reply, Seen, status};

fn member(client: Client) -> Slot<Member> {
    Slot::writing(
        Applier::new(client, Leadership::always("test"), ClusterId::new("m1")),
        RESYNC,
        Member::new(),
    )
}

fn web() -> (TemplateKey, ObjectId, Value) {
    let key = TemplateKey::new("apps/v1", "Deployment", "shop", "web");
    let body = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop",
                     "labels": {MANAGED_BY.0: MANAGED_BY.1}},
        "spec": {"replicas": 3},
    });
    (key.clone(), object_id(&key), body)
}

fn apply_job(check_foreign: bool, abort_on_foreign: bool, handover: Option<Value>) -> Job {
    let (key, id, body) = web();
    Job::Apply {
        key,
        id,
        body,
        check_foreign,
        abort_on_foreign,
        drifted: Vec::new(),
        handover,
        template_generation: 1,
        live_version: None,
    }
}

/// The Deployment `web` as it is in the member, with `labels`.
fn existing(labels: Value) -> Reply {
    (
        200,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "shop", "labels": labels,
                            "resourceVersion": "5", "uid": "u1"},
               "spec": {"replicas": 1}}),
    )
}

fn summary(calls: &[Seen]) -> Vec<String> {
    calls
        .iter()
        .map(|r| {
            let manager = r.param("fieldManager").unwrap_or("-");
            let force = r.param("force").unwrap_or("-");
            format!("{} {} {manager} {force}", r.method, r.path)
        })
        .collect()
}

const WEB: &str = "/apis/apps/v1/namespaces/shop/deployments/web";

#[tokio::test]
async fn an_object_meridian_did_not_create_is_left_alone_under_abort() {
    let (client, server) = ApiServer::start(|r| {
        (r.method == "GET" && r.path == WEB).then(|| existing(json!({"app": "web"})))
    });
    let m = member(client);
    let got = execute(&m.applier, &apply_job(true, true, None)).await;
    assert!(matches!(got, Ok(None)), "a conflict, not an apply");
    assert_eq!(summary(&server.calls()), [format!("GET {WEB} - -")]);
}

#[tokio::test]
async fn an_object_meridian_did_not_create_is_adopted_under_overwrite() {
    let (client, server) = ApiServer::start(|r| {
        (r.method == "GET" && r.path == WEB).then(|| existing(json!({"app": "web"})))
    });
    let m = member(client);
    let stored = execute(&m.applier, &apply_job(true, false, None))
        .await
        .ok()
        .flatten()
        .expect("the stored object");
    assert_eq!(stored["spec"]["replicas"], 3);
    assert_eq!(
        summary(&server.calls()),
        [
            format!("GET {WEB} - -"),
            format!("PATCH {WEB} meridian true")
        ]
    );
}

#[tokio::test]
async fn an_object_meridian_labelled_is_applied_under_abort() {
    let (client, server) = ApiServer::start(|r| {
        (r.method == "GET" && r.path == WEB).then(|| existing(json!({MANAGED_BY.0: MANAGED_BY.1})))
    });
    let m = member(client);
    let got = execute(&m.applier, &apply_job(true, true, None)).await;
    assert!(matches!(got, Ok(Some(_))));
    assert_eq!(
        summary(&server.calls()),
        [
            format!("GET {WEB} - -"),
            format!("PATCH {WEB} meridian true")
        ]
    );
}

#[tokio::test]
async fn retained_fields_are_handed_over_without_force_before_the_body_leaves_them_out() {
    let (client, server) = ApiServer::start(|_| None);
    let m = member(client);
    let handover = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "web", "namespace": "shop"},
                          "spec": {"replicas": 7}});
    let job = apply_job(false, true, Some(handover.clone()));
    assert!(matches!(execute(&m.applier, &job).await, Ok(Some(_))));
    let calls = server.calls();
    assert_eq!(
        summary(&calls),
        [
            format!("PATCH {WEB} {} -", retain::HANDOVER_MANAGER),
            format!("PATCH {WEB} meridian true"),
        ]
    );
    assert_eq!(calls[0].body, handover);
}

#[tokio::test]
async fn a_handover_that_meets_another_writer_is_theirs_and_the_body_still_goes() {
    let (client, server) = ApiServer::start(|r| {
        (r.param("fieldManager") == Some(retain::HANDOVER_MANAGER))
            .then(|| status(409, "Conflict", "conflict with \"kube-controller-manager\""))
    });
    let m = member(client);
    let handover = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "web", "namespace": "shop"},
                          "spec": {"replicas": 7}});
    let job = apply_job(false, true, Some(handover));
    assert!(matches!(execute(&m.applier, &job).await, Ok(Some(_))));
    assert_eq!(server.calls().len(), 2);
    // Any other refusal of the handover stops the apply: the body would drop the field.
    let (client, server) = ApiServer::start(|r| {
        (r.param("fieldManager") == Some(retain::HANDOVER_MANAGER))
            .then(|| status(403, "Forbidden", "no"))
    });
    let m = member(client);
    let job = apply_job(false, true, Some(json!({"spec": {"replicas": 7}})));
    assert!(
        matches!(execute(&m.applier, &job).await, Err(JobError::Api(e)) if e.code() == Some(403))
    );
    assert_eq!(server.calls().len(), 1);
}

const NAMESPACES: &str = "/api/v1/namespaces";

#[tokio::test]
async fn a_namespace_is_created_never_adopted() {
    let (client, server) = ApiServer::start(|r| {
        (r.method == "POST" && r.path == NAMESPACES).then(|| (201, r.body.clone()))
    });
    let mut m = member(client);
    ensure_namespace(&mut m, "shop").await.unwrap();
    let calls = server.calls();
    assert_eq!(summary(&calls), [format!("POST {NAMESPACES} - -")]);
    assert_eq!(
        calls[0].body["metadata"]["labels"][MANAGED_BY.0],
        MANAGED_BY.1
    );
    assert!(m.namespaces.contains("shop"));
    // Known now: no second request.
    ensure_namespace(&mut m, "shop").await.unwrap();
    assert_eq!(server.calls().len(), 1);

    // One that exists is someone else's: known, not taken over.
    let (client, server) = ApiServer::start(|r| {
        (r.method == "POST")
            .then(|| status(409, "AlreadyExists", "namespaces \"shop\" already exists"))
    });
    let mut m = member(client);
    ensure_namespace(&mut m, "shop").await.unwrap();
    assert!(m.namespaces.contains("shop"));
    assert!(server.calls().iter().all(|r| r.method == "POST"));

    // A refusal is the error of the copies that need it.
    let (client, _server) =
        ApiServer::start(|r| (r.method == "POST").then(|| status(403, "Forbidden", "no")));
    let mut m = member(client);
    let e = ensure_namespace(&mut m, "shop").await.unwrap_err();
    assert!(e.contains("cannot create namespace shop"), "{e}");
    assert!(!m.namespaces.contains("shop"));
}

/// A member whose namespace `shop` carries `labels` and holds `pods`; the requests clean_namespaces
/// made of it.
async fn cleanup(labels: Value, pods: usize, placed_here: bool) -> Vec<String> {
    let (client, server) = ApiServer::start(move |r| match (r.method.as_str(), r.path.as_str()) {
        ("GET", p) if p == format!("{NAMESPACES}/shop") => Some((
            200,
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "shop", "labels": labels.clone()}}),
        )),
        ("GET", p) if p == format!("{NAMESPACES}/shop/pods") => Some((
            200,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"resourceVersion": "1"},
                   "items": (0..pods).map(|i| json!({"metadata": {"name": format!("p{i}")}})).collect::<Vec<_>>()}),
        )),
        _ => None,
    });
    let mut m = member(client);
    m.namespaces.insert("shop".into());
    m.cleanup.insert("shop".into());
    let snapshot = if placed_here {
        placed_in_m1()
    } else {
        Snapshot::default()
    };
    let pass = Pass {
        snapshot: &snapshot,
        templates: BTreeMap::new(),
        body_prints: HashMap::new(),
        now: Instant::now(),
        overrides_print: 0,
    };
    clean_namespaces(&mut m, &pass).await;
    let deleted = summary(&server.calls())
        .iter()
        .any(|c| c.starts_with("DELETE"));
    assert_eq!(
        m.namespaces.contains("shop"),
        !deleted,
        "a deleted namespace is no longer known"
    );
    summary(&server.calls())
}

/// A snapshot placing shop/web in m1.
fn placed_in_m1() -> Snapshot {
    let (key, _, _) = web();
    let mut snapshot = Snapshot::default();
    let decision = Decision {
        template: key.clone(),
        policy: None,
        outcome: meridian_core::placement::Outcome::Scheduled,
        tier: None,
        standby_tier: None,
        placed: vec![Placed {
            cluster: ClusterId::new("m1"),
            replicas: Some(3),
            reason: meridian_core::placement::PlacedReason::Duplicated,
            overrides: Vec::new(),
        }],
        excluded: Arc::default(),
        scores: None,
    };
    Arc::make_mut(&mut snapshot.placements)
        .decisions
        .insert(key, Arc::new(decision));
    snapshot
}

#[tokio::test]
async fn a_namespace_meridian_created_goes_once_nothing_remains_in_it() {
    let ours = json!({MANAGED_BY.0: MANAGED_BY.1});
    let calls = cleanup(ours.clone(), 0, false).await;
    assert_eq!(
        calls,
        [
            format!("GET {NAMESPACES}/shop - -"),
            format!("GET {NAMESPACES}/shop/pods - -"),
            format!("GET {NAMESPACES}/shop/persistentvolumeclaims - -"),
            format!("DELETE {NAMESPACES}/shop - -"),
        ]
    );
    // Pods of someone else's keep it.
    let calls = cleanup(ours.clone(), 1, false).await;
    assert!(!calls.iter().any(|c| c.starts_with("DELETE")), "{calls:?}");
    // Not meridian's: kept, whatever it holds.
    let calls = cleanup(json!({"team": "shop"}), 0, false).await;
    assert_eq!(calls, [format!("GET {NAMESPACES}/shop - -")]);
    // Still placed there: not even looked at.
    assert!(cleanup(ours, 0, true).await.is_empty());
}

#[test]
fn drift_that_keeps_coming_back_is_held_off_longer_each_time() {
    let t0 = Instant::now();
    let mut r = None;
    for i in 0..FIGHT_REVERTS - 1 {
        let next = Reverts::revert(r, t0 + Duration::from_secs(10 * u64::from(i)));
        assert_eq!(next.held(next.last), None, "revert {} is not held", i + 1);
        r = Some(next);
    }
    let at = t0 + Duration::from_secs(40);
    let held = Reverts::revert(r, at);
    assert_eq!(held.count, FIGHT_REVERTS);
    assert_eq!(held.held(at), Some(HOLD_FIRST));
    assert_eq!(held.held(at + HOLD_FIRST), None, "the hold ends");
    let again = Reverts::revert(Some(held), at + HOLD_FIRST);
    assert_eq!(again.held(at + HOLD_FIRST), Some(HOLD_FIRST * 2));
    let mut long = again;
    for _ in 0..20 {
        long = Reverts::revert(Some(long), long.last + Duration::from_secs(1));
    }
    assert_eq!(long.held(long.last), Some(HOLD_MAX));
    // A revert long after the last one starts counting again.
    let later = long.last + FIGHT_WINDOW + Duration::from_secs(1);
    let fresh = Reverts::revert(Some(long), later);
    assert_eq!((fresh.count, fresh.held(later)), (1, None));
}

mod policy_status {
    use meridian_core::placement::{Outcome, PlacementPolicy};
    use meridian_core::policy::Policies;
    use meridian_core::problem::{Origin, Problem};
    use meridian_core::testing::{placing, tier};
    use meridian_core::{ObjectKey, TrafficPolicy};

    use super::*;

    fn by_type(body: &Value) -> BTreeMap<String, (String, String, String)> {
        body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let s = |k: &str| c[k].as_str().unwrap().to_string();
                (s("type"), (s("status"), s("reason"), s("message")))
            })
            .collect()
    }

    #[test]
    fn a_policy_reports_its_problems_conflicts_and_how_its_templates_fare() {
        let mut snapshot = placed_in_m1();
        let first = placing(
            "first",
            1,
            vec![tier("eu", &["m1"])],
            PlacementPolicy::default(),
        );
        let second = placing(
            "second",
            2,
            vec![tier("eu", &["m1"])],
            PlacementPolicy::default(),
        );
        snapshot.policies = Arc::new(Policies::new(
            Arc::new(TrafficPolicy::default()),
            vec![first, second],
        ));
        let placements = Arc::make_mut(&mut snapshot.placements);
        let (web, _, _) = web();
        Arc::make_mut(placements.decisions.get_mut(&web).unwrap()).policy =
            Some(ObjectKey::new("shop", "first"));
        let db = TemplateKey::new("apps/v1", "Deployment", "shop", "db");
        let mut unschedulable = (*placements.decisions[&web]).clone();
        unschedulable.template = db.clone();
        unschedulable.placed.clear();
        unschedulable.outcome = Outcome::Unschedulable {
            reason: "no cluster has 5 free replicas".into(),
        };
        placements.decisions.insert(db, Arc::new(unschedulable));
        let loser = meridian_core::problem::ObjectRef::namespaced(
            "ClusterSchedulingPolicy",
            &ObjectKey::new("shop", "second"),
        );
        snapshot.problems = vec![
            Problem::in_merge(
                Origin::Hub,
                loser.clone(),
                "Conflict: it selects template apps/v1/Deployment/shop/web, which the older policy shop/first places",
            ),
            Problem::in_merge(
                Origin::Hub,
                loser,
                "placement.gracePeriodSeconds: not a number",
            ),
        ];
        let mut views = BTreeMap::new();
        views.insert(
            web.clone(),
            TemplateView {
                step: Step::default(),
                copies: BTreeMap::from([(
                    ClusterId::new("m1"),
                    CopyView {
                        error: Some("422 Invalid: bad label".into()),
                        ..CopyView::default()
                    },
                )]),
                conflicts: vec![ClusterId::new("m2")],
            },
        );
        let pass = Pass {
            snapshot: &snapshot,
            templates: BTreeMap::new(),
            body_prints: HashMap::new(),
            now: Instant::now(),
            overrides_print: 0,
        };
        let statuses = policies::statuses(&pass, &views, &staged::Staged::default(), None);
        let names: Vec<&str> = statuses.iter().map(|(id, _)| id.name.as_str()).collect();
        assert_eq!(names, ["first", "second"]);
        let first = by_type(&statuses[0].1);
        assert_eq!(first["Valid"].0, "True");
        assert_eq!(first["Conflict"].0, "True");
        assert_eq!(first["Conflict"].1, "NotCreatedByMeridian");
        assert!(
            first["Conflict"].2.contains("exists in m2"),
            "{:?}",
            first["Conflict"]
        );
        assert_eq!(first["Scheduled"].0, "False");
        assert!(
            first["Scheduled"].2.contains("shop/db")
                && first["Scheduled"].2.contains("5 free replicas"),
            "{:?}",
            first["Scheduled"]
        );
        assert_eq!(first["Applied"].0, "False");
        assert!(
            first["Applied"].2.contains("in m1: 422 Invalid: bad label"),
            "{:?}",
            first["Applied"]
        );
        assert_eq!(first["Ready"].0, "False");
        let second = by_type(&statuses[1].1);
        assert_eq!(
            (second["Valid"].0.as_str(), second["Valid"].1.as_str()),
            ("False", "Invalid")
        );
        assert!(second["Valid"].2.contains("gracePeriodSeconds"));
        assert!(
            !second["Valid"].2.contains("older policy"),
            "a conflict is not a fault of the policy"
        );
        assert_eq!(
            (second["Conflict"].0.as_str(), second["Conflict"].1.as_str()),
            ("True", "OlderPolicy")
        );
        assert!(
            second["Conflict"].2.starts_with("it selects template"),
            "{:?}",
            second["Conflict"]
        );
        assert_eq!(second["Scheduled"].1, "NothingSelected");
        assert_eq!(
            statuses[1].1["metadata"],
            json!({"name": "second", "namespace": "shop"})
        );
    }

    #[test]
    fn long_lists_are_cut_with_a_count() {
        let items: Vec<String> = (0..25).map(|i| format!("t{i}")).collect();
        let s = policies::listed(&items, ", ");
        assert!(
            s.starts_with("t0, t1") && s.ends_with("t9, and 15 more"),
            "{s}"
        );
        assert_eq!(policies::listed(&items[..2], "; "), "t0; t1");
    }
}

// Sharded writers: a member another replica writes is planned for by nobody here.

fn web_template() -> Template {
    let (key, _, body) = web();
    Template {
        key,
        labels: Default::default(),
        generation: 4,
        replicas: Some(3),
        requests: Default::default(),
        dependencies: Vec::new(),
        body: Arc::new(body),
    }
}

/// What `plan` does for one write of web into m1 (which the snapshot does not know, so it is
/// not reachable): the jobs, and the error it leaves on the copy.
fn plan_write_into_m1(writing: bool) -> (usize, Option<String>) {
    let (client, _server) = ApiServer::start(|_| None);
    let mut members = BTreeMap::from([(ClusterId::new("m1"), member(client))]);
    members.get_mut(&ClusterId::new("m1")).unwrap().writing = writing;
    let snapshot = placed_in_m1();
    let template = web_template();
    let pass = Pass {
        snapshot: &snapshot,
        templates: BTreeMap::from([(&template.key, &template)]),
        body_prints: HashMap::new(),
        now: Instant::now(),
        overrides_print: 0,
    };
    let step = Step {
        writes: vec![meridian_core::placement::Write {
            cluster: ClusterId::new("m1"),
            replicas: Some(3),
            held_back: false,
        }],
        deletes: vec![ClusterId::new("m1")],
        ..Step::default()
    };
    let mut jobs = BTreeMap::new();
    plan(
        &pass,
        &mut members,
        &template.key,
        &step,
        &Propagation::default(),
        None,
        &mut jobs,
    );
    let m = &members[&ClusterId::new("m1")];
    (
        jobs.values().map(Vec::len).sum(),
        m.errors.get(&object_id(&template.key)).cloned(),
    )
}

#[tokio::test]
async fn a_member_another_replica_writes_gets_no_job_and_no_verdict_here() {
    let (jobs, error) = plan_write_into_m1(false);
    assert_eq!((jobs, error), (0, None));
    // The same step for a member this replica writes: it is judged (here: not reachable).
    let (jobs, error) = plan_write_into_m1(true);
    assert_eq!(jobs, 0);
    assert!(error.is_some_and(|e| e.starts_with("Unreachable")));
}

#[test]
fn a_copy_written_by_another_replica_tells_its_generations() {
    let live = json!({"metadata": {"generation": 7,
        "annotations": {render::GENERATION_ANNOTATION: "4"}}});
    assert_eq!(applied_by_another(&live), Some((7, 4)));
    // Not written by meridian (no annotation), or an odd one: unknown.
    assert_eq!(
        applied_by_another(&json!({"metadata": {"generation": 7}})),
        None
    );
    let odd = json!({"metadata": {"generation": 7,
        "annotations": {render::GENERATION_ANNOTATION: "four"}}});
    assert_eq!(applied_by_another(&odd), None);
}

#[test]
fn a_copy_tells_the_revision_it_holds_generation_or_not() {
    // A ConfigMap has no metadata.generation: its template digest says which edit it holds.
    let config = json!({"metadata": {"annotations": {
        render::GENERATION_ANNOTATION: "0",
        render::TEMPLATE_DIGEST_ANNOTATION: "00000000000000ff",
        render::OVERRIDES_ANNOTATION: "0a"}}});
    let expected = Received {
        generation: 0,
        body: Some(255),
        overrides: Some(10),
    };
    assert_eq!(received(&config), Some(expected));
    let deployment = json!({"metadata": {"generation": 3,
        "annotations": {render::GENERATION_ANNOTATION: "4"}}});
    let expected = Received {
        generation: 4,
        body: None,
        overrides: None,
    };
    assert_eq!(received(&deployment), Some(expected));
    assert_eq!(received(&json!({"metadata": {"generation": 3}})), None);
}
