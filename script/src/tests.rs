use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use meridian_core::placement::{
    ClusterInput, Judgement, Program, Programs, Script, Verdict, Webhook,
};
use meridian_core::testing::{cluster, deployment, healthy, pods_free, tainted};
use meridian_core::{Capacity, ClusterView, Cost, Health, TaintEffect, Template};

use super::*;

/// A candidate cluster as a test holds it.
struct Member {
    view: ClusterView,
    capacity: Option<Capacity>,
}

fn inputs(members: &[Member]) -> Vec<ClusterInput<'_>> {
    members
        .iter()
        .map(|m| ClusterInput {
            view: &m.view,
            capacity: m.capacity.as_ref(),
        })
        .collect()
}

fn member(name: &str, region: &str, labels: &[(&str, &str)]) -> Member {
    let mut spec = cluster(name, region, &format!("{region}-a"));
    spec.labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Member {
        view: healthy(spec),
        capacity: None,
    }
}

/// Four clusters: eu-1 (gold, cheap), eu-2 (silver, cheapest, half spot), us-1 (gold, dear,
/// tainted, on its own network), ap-1 (no labels, no cost, no capacity, Degraded).
fn fleet() -> Vec<Member> {
    let mut eu1 = member("eu-1", "eu", &[("tier", "gold"), ("env", "prod")]);
    eu1.view.spec.cost = Some(Cost::new(0.04, 0.004, 0.01, 0.0));
    eu1.view.endpoints = 3;
    eu1.capacity = Some(pods_free(10));
    let mut eu2 = member("eu-2", "eu", &[("tier", "silver")]);
    eu2.view.spec.cost = Some(Cost::new(0.02, 0.002, 0.01, 0.5));
    eu2.capacity = Some(pods_free(5));
    let mut us1 = member("us-1", "us", &[("tier", "gold")]);
    us1.view.spec = tainted(us1.view.spec, "gpu", TaintEffect::NoSchedule);
    us1.view.spec.network = Some("us-net".to_owned());
    us1.view.spec.cost = Some(Cost::new(0.2, 0.02, 0.05, 0.0));
    let mut ap1 = member("ap-1", "ap", &[]);
    ap1.view.health = Health::Degraded;
    vec![eu1, eu2, us1, ap1]
}

/// `shop/<name>`, 3 replicas of 100m and 128 MiB, labelled tier=gold, with an annotation.
fn workload(name: &str) -> Template {
    let mut t = deployment(name, Some(3));
    std::sync::Arc::make_mut(&mut t.labels).insert("tier".to_owned(), "gold".to_owned());
    let mut body = (*t.body).clone();
    body["metadata"]["annotations"]["meridian.io/egress-gib-hour"] = "2".into();
    body["metadata"]["annotations"]["not-a-string"] = 7.into();
    t.body = Arc::new(body);
    t
}

fn script(lua: &str) -> Program {
    Program::Script(Arc::new(Script { lua: lua.into() }))
}

fn judge(runner: &ScriptRunner, lua: &str, template: &Template, members: &[Member]) -> Judgement {
    runner.judge(&script(lua), template, &inputs(members))
}

#[track_caller]
fn answered(j: Judgement) -> Vec<Verdict> {
    match j {
        Judgement::Answered(v) => v,
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[track_caller]
fn failed(j: Judgement) -> String {
    match j {
        Judgement::Failed(why) => why,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn kept(score: Option<u32>) -> Verdict {
    Verdict {
        rejected: None,
        score,
    }
}

fn rejected(why: &str) -> Verdict {
    Verdict {
        rejected: Some(why.to_owned()),
        score: None,
    }
}

/// Limits whose clock never decides, so the instruction budget and the memory limit are what
/// a case meets (debug builds run Lua unoptimised).
fn patient() -> Limits {
    Limits {
        time: Duration::from_secs(30),
        ..Limits::default()
    }
}

const BY_TIER: &str = r#"
-- Only clusters of the workload's tier.
function filter(cluster, workload)
  local want = workload.labels.tier
  if cluster.labels.tier ~= want then
    return false, "tier " .. tostring(cluster.labels.tier) .. " is not " .. want
  end
  return true
end
"#;

const BY_COST: &str = r#"
-- The cheaper one replica is, the higher; clusters without a price in the middle.
function score(cluster, workload)
  local cost = cluster.cost
  if cost == nil then return 50 end
  local r = workload.requests
  local hourly = r.cpu_millis / 1000 * cost.cpu_core_hour
    + r.memory_bytes / 2^30 * cost.memory_gib_hour
  return math.max(0, 100 - hourly * 400)
end
"#;

#[test]
fn a_filter_places_by_label() {
    let runner = ScriptRunner::default();
    let verdicts = answered(judge(&runner, BY_TIER, &workload("web"), &fleet()));
    assert_eq!(
        verdicts,
        vec![
            kept(None),
            rejected("tier silver is not gold"),
            kept(None),
            rejected("tier nil is not gold"),
        ]
    );
}

#[test]
fn a_score_orders_by_cost() {
    let runner = ScriptRunner::default();
    // One replica per hour: eu-1 0.0045, eu-2 0.00225, us-1 0.0225; ×400 off 100.
    let verdicts = answered(judge(&runner, BY_COST, &workload("web"), &fleet()));
    assert_eq!(
        verdicts,
        vec![
            kept(Some(98)),
            kept(Some(99)),
            kept(Some(91)),
            kept(Some(50))
        ]
    );
}

#[test]
fn score_runs_only_for_clusters_the_filter_keeps() {
    let runner = ScriptRunner::default();
    let lua = format!(
        "{BY_TIER}\n{}",
        r#"
function score(cluster, workload)
  if cluster.labels.tier ~= "gold" then error("scored a filtered cluster") end
  return cluster.name == "eu-1" and 80 or 20
end
"#
    );
    let verdicts = answered(judge(&runner, &lua, &workload("web"), &fleet()));
    assert_eq!(
        verdicts,
        vec![
            kept(Some(80)),
            rejected("tier silver is not gold"),
            kept(Some(20)),
            rejected("tier nil is not gold"),
        ]
    );
}

#[test]
fn scores_round_and_plain_false_has_a_reason() {
    let runner = ScriptRunner::default();
    let lua = r#"
function filter(c) return c.name ~= "ap-1" end
function score(c)
  if c.name == "eu-1" then return 49.6 end
  if c.name == "eu-2" then return 0.4 end
  return 100
end
"#;
    let verdicts = answered(judge(&runner, lua, &workload("web"), &fleet()));
    assert_eq!(
        verdicts,
        vec![
            kept(Some(50)),
            kept(Some(0)),
            kept(Some(100)),
            rejected("rejected by the script's filter()"),
        ]
    );
}

#[test]
fn long_reasons_are_cut() {
    let runner = ScriptRunner::default();
    let lua = r#"function filter() return false, string.rep("é", 200) end"#;
    let verdicts = answered(judge(&runner, lua, &workload("web"), &fleet()));
    let why = verdicts[0].rejected.as_deref().expect("rejected");
    assert_eq!(why, "é".repeat(128));
}

#[test]
fn the_script_sees_its_inputs() {
    let runner = ScriptRunner::default();
    let lua = r#"
local function s(v) return v == nil and "-" or tostring(v) end
function filter(c, w)
  local t = c.taints[1]
  return false, table.concat({
    c.name, s(c.region), s(c.zone), c.health, s(c.endpoints), s(c.network), s(c.labels.tier),
    s(#c.taints), t and (t.key .. "=" .. s(t.value) .. ":" .. t.effect) or "-",
    c.capacity and (c.capacity.pods .. "/" .. c.capacity.allocatable.pods .. "/"
      .. c.capacity.requested.pods .. "/" .. c.capacity.cpu_millis) or "-",
    c.cost and (c.cost.cpu_core_hour .. "/" .. c.cost.spot_ratio .. "/" .. c.cost.egress_gib) or "-",
    w.api_version, w.kind, w.namespace, w.name, s(w.labels.tier), s(w.replicas),
    w.requests.cpu_millis .. "/" .. w.requests.memory_bytes .. "/" .. w.requests.pods,
    s(w.annotations["meridian.io/egress-gib-hour"]), s(w.annotations["not-a-string"]),
  }, " ")
end
"#;
    let verdicts = answered(judge(&runner, lua, &workload("web"), &fleet()));
    let reasons: Vec<&str> = verdicts
        .iter()
        .map(|v| v.rejected.as_deref().expect("rejected"))
        .collect();
    let w = "apps/v1 Deployment shop web gold 3 100/134217728/1 2 -";
    assert_eq!(
        reasons,
        vec![
            format!("eu-1 eu eu-a Healthy 3 - gold 0 - 10/10/0/1000000 0.04/0.0/0.01 {w}"),
            format!("eu-2 eu eu-a Healthy 0 - silver 0 - 5/5/0/1000000 0.02/0.5/0.01 {w}"),
            format!("us-1 us us-a Healthy 0 us-net gold 1 gpu=-:NoSchedule - 0.2/0.0/0.05 {w}"),
            format!("ap-1 ap ap-a Degraded 0 - - 0 - - - {w}"),
        ]
    );
}

#[test]
fn a_placed_whole_kind_has_no_replicas() {
    let runner = ScriptRunner::default();
    let lua = r#"function score(c, w) return w.replicas == nil and 7 or 0 end"#;
    let t = meridian_core::testing::config_map("settings");
    let verdicts = answered(judge(&runner, lua, &t, &fleet()[..1]));
    assert_eq!(verdicts, vec![kept(Some(7))]);
}

#[test]
fn a_changed_cluster_is_seen_by_the_next_decision() {
    let runner = ScriptRunner::default();
    let lua = r#"
function filter(c)
  local cap = c.capacity
  return false, table.concat({ tostring(c.labels.tier), c.health, c.endpoints,
    cap and (cap.pods .. "/" .. cap.allocatable.pods .. "/" .. cap.requested.pods) or "-" }, " ")
end
"#;
    let mut members = fleet();
    let first = answered(judge(&runner, lua, &workload("web"), &members));
    assert_eq!(first[1], rejected("silver Healthy 0 5/5/0"));
    // Health, endpoints and capacity: written into the cached table in place.
    members[1].view.health = Health::Unreachable;
    members[1].view.endpoints = 7;
    members[1].capacity = Some(Capacity {
        requested: meridian_core::Resources {
            pods: 2,
            ..Default::default()
        },
        ..pods_free(5)
    });
    let second = answered(judge(&runner, lua, &workload("web"), &members));
    assert_eq!(second[1], rejected("silver Unreachable 7 3/5/2"));
    // A label (and capacity gone): the table is built again.
    members[1]
        .view
        .spec
        .labels
        .insert("tier".into(), "gold".into());
    members[1].capacity = None;
    let third = answered(judge(&runner, lua, &workload("web"), &members));
    assert_eq!(third[1], rejected("gold Unreachable 7 -"));
    // The other clusters did not move.
    assert_eq!(first[0], third[0]);
}

#[test]
fn nothing_a_script_writes_outlives_its_decision() {
    let runner = ScriptRunner::default();
    // A global counter, and a method added to strings: both start over each time.
    let lua = r#"
calls = (calls or 0) + 1
function score(c)
  string.shout = string.upper
  return calls * 10 + (c.name:shout() == "EU-1" and 1 or 0)
end
"#;
    for _ in 0..3 {
        let verdicts = answered(judge(&runner, lua, &workload("web"), &fleet()));
        assert_eq!(
            verdicts,
            vec![
                kept(Some(11)),
                kept(Some(10)),
                kept(Some(10)),
                kept(Some(10))
            ]
        );
    }
    // The string methods a script adds are its own decision's.
    let other = r#"function score(c) return c.name.shout == nil and 1 or 0 end"#;
    let verdicts = answered(judge(&runner, other, &workload("web"), &fleet()));
    assert_eq!(verdicts, vec![kept(Some(1)); 4]);
}

#[test]
fn the_inputs_are_read_only() {
    let runner = ScriptRunner::default();
    let cases = [
        (
            "c.labels.tier = 'x'",
            "script:3: the cluster and workload tables are read-only",
        ),
        (
            "c.name = 'x'",
            "script:3: the cluster and workload tables are read-only",
        ),
        (
            "w.requests.pods = 0",
            "script:3: the cluster and workload tables are read-only",
        ),
        (
            "rawset(c, 'name', 'x')",
            "script:3: the cluster and workload tables are read-only",
        ),
        // Raised inside table.insert, a C function: Lua gives no line.
        (
            "table.insert(c.taints, {})",
            "the cluster and workload tables are read-only",
        ),
        (
            "setmetatable(c, {})",
            "script:3: cannot change a protected metatable",
        ),
    ];
    for (body, expect) in cases {
        let why = failed(judge(
            &runner,
            &hostile_script(body),
            &workload("evil"),
            &fleet(),
        ));
        assert_eq!(
            why,
            format!("in score() for cluster eu-1: {expect}"),
            "{body}"
        );
    }
    // Reading works as on plain tables: next, rawget, #, ipairs, pairs.
    let lua = r#"
function filter(c, w)
  local keys = {}
  for k, v in pairs(c.labels) do keys[#keys + 1] = k .. "=" .. v end
  for i, t in ipairs(c.taints) do keys[#keys + 1] = i .. ":" .. t.key end
  return false, table.concat(keys, ",") .. " next:" .. tostring(next(c.labels) ~= nil)
    .. " rawget:" .. tostring(rawget(c, "name")) .. " #taints:" .. #c.taints
    .. " rawlen:" .. rawlen(c.taints) .. " w:" .. w.labels.tier
end
"#;
    let verdicts = answered(judge(&runner, lua, &workload("web"), &fleet()));
    assert_eq!(
        verdicts[0],
        rejected("env=prod,tier=gold next:true rawget:eu-1 #taints:0 rawlen:0 w:gold")
    );
    assert_eq!(
        verdicts[2],
        rejected("tier=gold,1:gpu next:true rawget:us-1 #taints:1 rawlen:1 w:gold")
    );
}

#[test]
fn pairs_visits_keys_in_a_fixed_order() {
    let runner = ScriptRunner::default();
    let lua = r#"
function filter(c)
  local t = { zeta = 1, alpha = 2, [3] = "c", [1] = "a", mid = 3, [true] = 4, [2.5] = 5 }
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  for k in pairs(c.labels) do keys[#keys + 1] = k end
  return false, table.concat(keys, ",")
end
"#;
    let verdicts = answered(judge(&runner, lua, &workload("web"), &fleet()[..1]));
    assert_eq!(
        verdicts,
        vec![rejected("1,2.5,3,alpha,mid,zeta,true,env,tier")]
    );
}

#[test]
fn only_a_filter_gives_no_scores_only_a_score_rejects_nothing() {
    let runner = ScriptRunner::default();
    let only_filter = answered(judge(
        &runner,
        "function filter() return true end",
        &workload("web"),
        &fleet(),
    ));
    assert!(only_filter.iter().all(|v| *v == kept(None)));
    let only_score = answered(judge(
        &runner,
        "function score() return 3 end",
        &workload("web"),
        &fleet(),
    ));
    assert!(only_score.iter().all(|v| *v == kept(Some(3))));
}

#[test]
fn no_candidates_no_verdicts() {
    let runner = ScriptRunner::default();
    assert_eq!(
        answered(judge(&runner, BY_COST, &workload("web"), &[])),
        Vec::new()
    );
}

#[test]
fn a_webhook_is_not_a_script() {
    let runner = ScriptRunner::default();
    let webhook = Program::Webhook(Arc::new(Webhook {
        url: "https://scorer.example/score".into(),
        ca_bundle: None,
        timeout_millis: 100,
        failure_policy: Default::default(),
    }));
    let why = failed(runner.judge(&webhook, &workload("web"), &inputs(&fleet())));
    assert!(why.contains("is not a script"), "{why}");
}

#[test]
fn a_script_that_does_not_compile_fails_every_decision_with_its_line() {
    let runner = ScriptRunner::default();
    let lua = "function score(c)\n  return c.\nend\n";
    for _ in 0..2 {
        let why = failed(judge(&runner, lua, &workload("web"), &fleet()));
        assert_eq!(why, "script:3: <name> expected near 'end'");
    }
}

#[test]
fn check_compiles_and_runs_the_top_level() {
    struct Case {
        name: &'static str,
        lua: &'static str,
        expect: Result<(), &'static str>,
    }
    let cases = [
        Case {
            name: "a filter",
            lua: BY_TIER,
            expect: Ok(()),
        },
        Case {
            name: "a score",
            lua: BY_COST,
            expect: Ok(()),
        },
        Case {
            name: "a syntax error names its line",
            lua: "function score(c)\n  return 1 +\nend",
            expect: Err("script:3: unexpected symbol near 'end'"),
        },
        Case {
            name: "neither function",
            lua: "local x = 1",
            expect: Err("script defines neither filter nor score"),
        },
        Case {
            name: "local functions are not the script's answer",
            lua: "local function score() return 1 end",
            expect: Err("script defines neither filter nor score"),
        },
        Case {
            name: "score must be a function",
            lua: "score = 50",
            expect: Err("score is a number, not a function"),
        },
        Case {
            name: "a top level that fails",
            lua: "local t\nlocal x = t.field\nfunction score() return 1 end",
            expect: Err(
                "in the script's top level: script:2: attempt to index a nil value (local 't')",
            ),
        },
        Case {
            name: "a top level that never ends",
            lua: "while true do end",
            expect: Err(
                "script exceeded its budget of 1000000 instructions in the script's top level",
            ),
        },
        Case {
            name: "bytecode is refused",
            lua: "\x1bLua\x54\x00\x19\r\n\x1a\n",
            expect: Err("attempt to load a binary chunk (mode is 't')"),
        },
    ];
    for c in cases {
        assert_eq!(check(c.lua), c.expect.map_err(str::to_owned), "{}", c.name);
    }
}

/// A hostile body, run inside `score` when the workload is named "evil"; every other
/// workload gets 42, from the same script's state.
struct Hostile {
    name: &'static str,
    body: &'static str,
    /// The whole failure reason.
    expect: &'static str,
    limits: Limits,
}

impl Default for Hostile {
    fn default() -> Self {
        Self {
            name: "",
            body: "",
            expect: "",
            limits: patient(),
        }
    }
}

fn hostile_cases() -> Vec<Hostile> {
    let budget = "script exceeded its budget of 1000000 instructions in score() for cluster eu-1";
    let memory = "script exceeded its memory limit of 16 MiB in score() for cluster eu-1";
    vec![
        Hostile {
            name: "an endless loop stops at the instruction budget",
            body: "while true do end",
            expect: budget,
            ..Default::default()
        },
        Hostile {
            name: "pcall does not catch the budget",
            body: "while true do pcall(function() while true do end end) end",
            expect: budget,
            ..Default::default()
        },
        Hostile {
            name: "nor does a pcall of pcall",
            body: "local function f() while true do end end\n\
                   while true do pcall(pcall, f) end",
            expect: budget,
            ..Default::default()
        },
        Hostile {
            name: "a 1 GiB string is refused before it is built",
            body: r#"local s = string.rep("x", 2^30)"#,
            expect: "in score() for cluster eu-1: script:3: string.rep would build 1073741824 \
                     bytes, over the script's memory limit of 16 MiB",
            ..Default::default()
        },
        Hostile {
            name: "the same through the string method",
            body: r#"local s = ("x"):rep(2^30)"#,
            expect: "in score() for cluster eu-1: script:3: string.rep would build 1073741824 \
                     bytes, over the script's memory limit of 16 MiB",
            ..Default::default()
        },
        Hostile {
            name: "a string.rep bomb in a loop meets the memory limit",
            body: r#"local keep = {}
                     for i = 1, 64 do keep[i] = string.rep("x", 2^20) .. i end"#,
            expect: memory,
            ..Default::default()
        },
        Hostile {
            name: "doubling a string meets the memory limit",
            body: r#"local s = "x" while true do s = s .. s end"#,
            expect: memory,
            ..Default::default()
        },
        Hostile {
            name: "a string.rep bomb that keeps nothing meets the clock",
            body: r#"while true do local s = string.rep("x", 2^22) end"#,
            expect: "script exceeded its time limit of 250 ms in score() for cluster eu-1",
            limits: Limits::default(),
        },
        Hostile {
            name: "a backtracking pattern is refused",
            body: r#"local s = string.rep("a", 5000) return s:find(".-.-.-.-b") and 1 or 0"#,
            expect: "in score() for cluster eu-1: script:3: pattern too complex for a subject \
                     of 5000 bytes (up to 6.5e17 matching steps; the limit is 1.7e7)",
            ..Default::default()
        },
        Hostile {
            name: "so is a table.move over 10^15 slots",
            body: "table.move({}, 1, 1e15, 1)",
            expect: "in score() for cluster eu-1: script:3: 1000000000000000 elements are too \
                     many for one call (the limit is 16777216)",
            ..Default::default()
        },
        Hostile {
            // Each frame holds stack slots and a CallInfo: 16 MiB go before 10^6 instructions.
            name: "deep recursion meets the memory limit",
            body: "local function f(n) return 1 + f(n + 1) end return f(1)",
            expect: memory,
            ..Default::default()
        },
        Hostile {
            name: "no os",
            body: r#"os.execute("touch /tmp/meridian-script-was-here")"#,
            expect: "in score() for cluster eu-1: script:3: attempt to index a nil value \
                     (global 'os')",
            ..Default::default()
        },
        Hostile {
            name: "no io",
            body: r#"io.open("/etc/passwd")"#,
            expect: "in score() for cluster eu-1: script:3: attempt to index a nil value \
                     (global 'io')",
            ..Default::default()
        },
        Hostile {
            name: "no require",
            body: r#"require("os")"#,
            expect: "in score() for cluster eu-1: script:3: attempt to call a nil value \
                     (global 'require')",
            ..Default::default()
        },
        Hostile {
            name: "no string.dump, so no bytecode",
            body: r#"load(string.dump(function() return 1 end))()"#,
            expect: "in score() for cluster eu-1: script:3: attempt to call a nil value \
                     (field 'dump')",
            ..Default::default()
        },
        Hostile {
            name: "no load",
            body: r#"load("\27Lua")"#,
            expect: "in score() for cluster eu-1: script:3: attempt to call a nil value \
                     (global 'load')",
            ..Default::default()
        },
        Hostile {
            name: "no debug, collectgarbage or coroutine",
            body: r#"local x = debug or collectgarbage or coroutine or dofile or loadfile
                     x()"#,
            expect: "in score() for cluster eu-1: script:4: attempt to call a nil value \
                     (local 'x')",
            ..Default::default()
        },
        Hostile {
            name: "no random numbers",
            body: "return math.random(100)",
            expect: "in score() for cluster eu-1: script:3: attempt to call a nil value \
                     (field 'random')",
            ..Default::default()
        },
        Hostile {
            name: "the strings' metatable is not reachable",
            body: r#"getmetatable("").__index.rep = nil"#,
            expect: "in score() for cluster eu-1: script:3: attempt to index a boolean value",
            ..Default::default()
        },
        Hostile {
            name: "no finalizers",
            body: "setmetatable({}, { __gc = function() while true do end end })",
            expect: "in score() for cluster eu-1: script:3: __gc metamethods are not allowed \
                     in a placement script",
            ..Default::default()
        },
        Hostile {
            name: "a runtime error names its line",
            body: "local price = c.cost.per_hour\n  return price.value",
            expect: "in score() for cluster eu-1: script:4: attempt to index a nil value \
                     (local 'price')",
            ..Default::default()
        },
        Hostile {
            name: "a score of 140",
            body: "return 140",
            expect: "score() returned 140 for cluster eu-1, outside [0, 100]",
            ..Default::default()
        },
        Hostile {
            name: "a negative score",
            body: "return -0.5",
            expect: "score() returned -0.5 for cluster eu-1, outside [0, 100]",
            ..Default::default()
        },
        Hostile {
            name: "a score of NaN",
            body: "return 0/0",
            expect: "score() returned NaN for cluster eu-1, outside [0, 100]",
            ..Default::default()
        },
        Hostile {
            name: "a score that is not a number",
            body: r#"return "50""#,
            expect: "score() returned a string for cluster eu-1; it must return a number in \
                     [0, 100]",
            ..Default::default()
        },
    ]
}

fn hostile_script(body: &str) -> String {
    format!(
        "function score(c, w)\n  if w.name == \"evil\" then\n  {body}\n  end\n  return 42\nend\n"
    )
}

#[test]
fn hostile_scripts_are_stopped_and_the_state_answers_again() {
    for case in hostile_cases() {
        let runner = ScriptRunner::new(case.limits);
        let lua = hostile_script(case.body);
        let why = failed(judge(&runner, &lua, &workload("evil"), &fleet()));
        assert_eq!(why, case.expect, "{}", case.name);
        // The same script's state answers the next decision …
        let verdicts = answered(judge(&runner, &lua, &workload("web"), &fleet()));
        assert_eq!(
            verdicts,
            vec![kept(Some(42)); 4],
            "{}: afterwards",
            case.name
        );
        // … and so does another script.
        let verdicts = answered(judge(&runner, BY_COST, &workload("web"), &fleet()));
        assert_eq!(verdicts[0], kept(Some(98)), "{}: another script", case.name);
    }
}

#[test]
fn a_filter_must_return_a_boolean() {
    let runner = ScriptRunner::default();
    let cases = [
        (
            r#"function filter() return "yes" end"#,
            "filter() returned a string for cluster eu-1; it must return a boolean (and \
             optionally a reason)",
        ),
        (
            "function filter() end",
            "filter() returned nil for cluster eu-1; it must return a boolean (and optionally \
             a reason)",
        ),
        (
            "function filter() return false, {} end",
            "filter() returned false and a table for cluster eu-1; a reason must be a string",
        ),
    ];
    for (lua, expect) in cases {
        assert_eq!(
            failed(judge(&runner, lua, &workload("web"), &fleet())),
            expect
        );
        let verdicts = answered(judge(&runner, BY_TIER, &workload("web"), &fleet()));
        assert_eq!(verdicts[0], kept(None));
    }
}

#[test]
fn the_limits_hold_within_time() {
    // Under the default limits (the clock included), every endless case returns.
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let runner = ScriptRunner::default();
        for body in [
            "while true do end",
            "while true do pcall(function() while true do end end) end",
            r#"while true do local s = string.rep("x", 2^22) end"#,
            r#"local s = "x" while true do s = s .. s end"#,
            r#"local s = string.rep("a", 300) while true do s:find("a-a-b") end"#,
            r#"local t = {} for i = 1, 1e6 do t[i] = i end while true do table.sort(t) end"#,
            "local function f(n) return 1 + f(n + 1) end return f(1)",
            // A to-be-closed variable whose __close never returns: run as the error unwinds.
            "local x <close> = setmetatable({}, {__close = function() while true do end end}) while true do end",
            "local x <close> = setmetatable({}, {__close = function() while true do end end}) return 1",
            "local x <close> = setmetatable({}, {__close = function() while true do pcall(function() while true do end end) end end}) error('x')",
            // Added after setmetatable, or to what getmetatable answers: neither is the real one.
            "local mt = {} local t = setmetatable({}, mt) mt.__close = function() while true do end end local x <close> = t while true do end",
            "local t = setmetatable({}, {}) getmetatable(t).__close = function() while true do end end local x <close> = t while true do end",
        ] {
            let why = failed(judge(
                &runner,
                &hostile_script(body),
                &workload("evil"),
                &fleet(),
            ));
            tx.send((body, why)).expect("the test waits");
        }
    });
    for _ in 0..12 {
        let (body, why) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("every endless script returns");
        assert!(why.contains("script"), "{body}: {why}");
    }
    handle.join().expect("no panic");
}

#[test]
fn the_cache_keeps_at_most_its_bound() {
    let runner = ScriptRunner::new(Limits {
        scripts: 2,
        ..Limits::default()
    });
    for i in 0..5 {
        let lua = format!("function score() return {i} end");
        let verdicts = answered(judge(&runner, &lua, &workload("web"), &fleet()));
        assert_eq!(verdicts[0], kept(Some(i)));
        assert!(runner.cached() <= 2);
    }
    // An evicted script is compiled again.
    let verdicts = answered(judge(
        &runner,
        "function score() return 0 end",
        &workload("web"),
        &fleet(),
    ));
    assert_eq!(verdicts[0], kept(Some(0)));
}

#[test]
fn decisions_run_in_parallel_threads() {
    let runner = Arc::new(ScriptRunner::default());
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let runner = Arc::clone(&runner);
            std::thread::spawn(move || {
                let lua = if i % 2 == 0 { BY_COST } else { BY_TIER };
                for _ in 0..20 {
                    let verdicts = answered(judge(&runner, lua, &workload("web"), &fleet()));
                    assert_eq!(verdicts.len(), 4);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("no panic");
    }
    assert_eq!(runner.cached(), 2);
}

/// `n` clusters `c000`…, in four regions, with prices and capacity, every other one gold.
fn big_fleet(n: usize) -> Vec<Member> {
    (0..n)
        .map(|i| {
            let tier = if i % 2 == 0 { "gold" } else { "silver" };
            let region = ["eu", "us", "ap", "sa"][i % 4];
            let mut m = member(
                &format!("c{i:03}"),
                region,
                &[("tier", tier), ("env", "prod")],
            );
            m.view.spec.cost = Some(Cost::new(0.02 + i as f64 * 0.001, 0.003, 0.01, 0.25));
            m.capacity = Some(pods_free(100));
            m
        })
        .collect()
}

#[test]
fn a_decision_over_255_clusters_uses_a_fraction_of_the_budget() {
    let runner = ScriptRunner::default();
    let lua = format!("{BY_TIER}\n{BY_COST}");
    let members = big_fleet(255);
    // The first decision builds the cluster tables, the second reuses them: same budget.
    for _ in 0..2 {
        let verdicts = answered(judge(&runner, &lua, &workload("web"), &members));
        assert_eq!(
            verdicts.iter().filter(|v| v.rejected.is_none()).count(),
            128
        );
        let used = runner
            .sandbox(&Arc::from(lua.as_str()))
            .expect("compiled")
            .lock()
            .instructions_used();
        // Both functions and run's checks: ≈ 60 per cluster, so a decision over 255 clusters
        // leaves the script 50 times what these simple functions take.
        assert!(used > 0 && used < 20_000, "{used} instructions");
    }
}

#[test]
fn library_errors_name_the_scripts_line() {
    let runner = ScriptRunner::new(patient());
    let cases = [
        (
            "string.rep()",
            "script:3: bad argument #1 to 'rep' (string expected, got nil)",
        ),
        (
            r#"("x"):rep({})"#,
            "script:3: bad argument #2 to 'rep' (number expected, got table)",
        ),
        (
            r#"string.find(nil, "x")"#,
            "script:3: bad argument #1 to 'find' (string expected, got nil)",
        ),
        (
            "table.sort(5)",
            "script:3: bad argument #1 to 'sort' (table expected, got number)",
        ),
        (
            "setmetatable(5, {})",
            "script:3: bad argument #1 to 'setmetatable' (table expected, got number)",
        ),
        (
            "next(5)",
            "script:3: bad argument #1 to 'next' (table expected, got number)",
        ),
        (
            "for k in pairs(nil) do end",
            "script:3: bad argument #1 to 'for iterator' (table expected, got nil)",
        ),
        (
            r#"local ok, e = pcall(string.rep) error(e, 0)"#,
            "script:3: bad argument #1 to 'rep' (string expected, got nil)",
        ),
        (r#"error("plain", 0)"#, "plain"),
        ("error({})", "(error object is a table value)"),
    ];
    for (body, expect) in cases {
        let why = failed(judge(
            &runner,
            &hostile_script(body),
            &workload("evil"),
            &fleet(),
        ));
        assert_eq!(
            why,
            format!("in score() for cluster eu-1: {expect}"),
            "{body}"
        );
    }
}

#[test]
fn getmetatable_answers_the_table_the_script_set() {
    let runner = ScriptRunner::default();
    let lua = r#"
        local Class = {}
        Class.__index = Class
        function Class.weight() return 7 end
        local o = setmetatable({}, Class)
        function score(c, w)
          assert(getmetatable(o) == Class, "getmetatable shows the table passed")
          return o.weight()
        end
    "#;
    let verdicts = answered(judge(&runner, lua, &workload("web"), &fleet()));
    assert_eq!(verdicts, vec![kept(Some(7)); 4]);
}

#[test]
fn the_pool_answers_pending_at_once_and_wakes_the_fleet_with_the_verdicts() {
    let (tx, rx) = mpsc::channel();
    let tx = parking_lot::Mutex::new(tx);
    let wake: Wake = Arc::new(move || {
        let _ = tx.lock().send(());
    });
    let pool = ScriptPool::new(ScriptRunner::default(), 1, wake);
    let members = fleet();
    let by_tier = script(BY_TIER);
    // A script that burns its whole budget: the caller (the writer) is not the one who waits.
    let hog = script("function score(c, w) while true do end end");
    for i in 0..20 {
        let j = pool.judge(&hog, &workload(&format!("evil-{i}")), &inputs(&members));
        assert!(matches!(j, Judgement::Pending), "{j:?}");
    }
    assert!(matches!(
        pool.judge(&by_tier, &workload("web"), &inputs(&members)),
        Judgement::Pending
    ));
    assert!(pool.in_flight() >= 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pool.in_flight() > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        rx.recv_timeout(left).expect("every decision is answered");
    }
    // Answered from the cache now, the same as the runner answers it.
    let direct = ScriptRunner::default().judge(&by_tier, &workload("web"), &inputs(&members));
    let cached = pool.judge(&by_tier, &workload("web"), &inputs(&members));
    assert_eq!(format!("{cached:?}"), format!("{direct:?}"));
    let failed = pool.judge(&hog, &workload("evil-3"), &inputs(&members));
    assert!(
        matches!(&failed, Judgement::Failed(why) if why.contains("exceeded its budget")),
        "{failed:?}"
    );
    // Another input is another decision.
    let mut other = fleet();
    other[0].view.endpoints = 99;
    assert!(matches!(
        pool.judge(&by_tier, &workload("web"), &inputs(&other)),
        Judgement::Pending
    ));
}

/// Generated hostile scripts (a `__close` handler that looped froze the writer for
/// good): whatever a script does — loops in handlers, metamethods, coroutines, patterns,
/// recursion, growth — a decision returns within its deadline (plus a margin for a loaded
/// machine and unoptimised Lua), and the runner serves the next script as before.
mod generated {
    use std::time::Instant;

    use proptest::prelude::*;

    use super::*;

    /// Statements a score function's body is assembled from; `N` is a generated number.
    const FRAGMENTS: &[&str] = &[
        "while true do end",
        "for i = 1, N * 100000 do local t = {i} end",
        "local s = 'x' for i = 1, 40 do s = s .. s end",
        "local t = {} for i = 1, N * 1000000 do t[i] = i end",
        "local function f(n) return f(n + 1) + 1 end f(1)",
        "local x <close> = setmetatable({}, {__close = function() while true do end end})",
        "setmetatable({}, {__gc = function() while true do end end}) collectgarbage()",
        "local t = setmetatable({}, {__index = function(t, k) return t[k .. 'x'] end}) local _ = t.a",
        "pcall(function() while true do end end)",
        "local ok = pcall(error, setmetatable({}, {__tostring = function() while true do end end}))",
        "local co = coroutine.wrap(function() while true do coroutine.yield() end end) for i = 1, N * 100000 do co() end",
        "local _ = string.rep('a', N * 1000000)",
        "local _ = string.find(string.rep('a', 5000), '.-.-.-.-.-.-b')",
        "local _ = string.gsub(string.rep('a', 100000), 'a', function() while true do end end)",
        "for i = 1, N do local t = setmetatable({}, {__gc = function() end}) end",
        "local t = setmetatable({}, {__len = function() while true do end end}) local _ = #t",
        "local _ = tostring(setmetatable({}, {__tostring = function(t) return tostring(t) end}))",
        "local t = {} t[1] = t local _ = table.concat({string.rep('ab', N)}, ',')",
        "error(string.rep('e', N * 1000))",
        "do return N end",
        "goto done ::done::",
        "local _ = math.huge // 1",
    ];

    fn script_of(parts: &[(usize, u16)]) -> String {
        let body: Vec<String> = parts
            .iter()
            .map(|(i, n)| FRAGMENTS[i % FRAGMENTS.len()].replace('N', &n.to_string()))
            .collect();
        format!(
            "function score(cluster, workload)\n  {}\n  return 50\nend\n",
            body.join("\n  ")
        )
    }

    #[test]
    fn every_fragment_compiles_and_ends_by_a_limit_or_an_answer() {
        let limits = Limits {
            time: Duration::from_millis(100),
            ..Limits::default()
        };
        let runner = ScriptRunner::new(limits);
        let members = fleet();
        for i in 0..FRAGMENTS.len() {
            let lua = script_of(&[(i, 7)]);
            assert!(check(&lua).is_ok(), "does not compile:\n{lua}");
            let started = Instant::now();
            let judged = judge(&runner, &lua, &workload("w"), &members);
            assert!(started.elapsed() < Duration::from_secs(3), "{lua}");
            if let Judgement::Failed(why) = judged {
                assert!(!why.contains("internal error"), "{why}\n{lua}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn every_generated_script_returns_within_its_deadline(
            parts in proptest::collection::vec((0usize..64, 1u16..50), 1..5),
        ) {
            let limits = Limits { time: Duration::from_millis(100), ..Limits::default() };
            let runner = ScriptRunner::new(limits);
            let members = fleet();
            let lua = script_of(&parts);
            let started = Instant::now();
            let _ = judge(&runner, &lua, &workload("w"), &members);
            let took = started.elapsed();
            prop_assert!(took < Duration::from_secs(3), "{took:?} for\n{lua}");
            // The runner is not poisoned: a plain script answers next.
            let next = answered(judge(&runner, BY_COST, &workload("w"), &members));
            prop_assert_eq!(next.len(), members.len());
        }
    }
}
