//! `meridian simulate --assume …`, `meridian explain … --assume …` and `/debug/simulate`: the
//! scenario read from what the client sent (assumption strings, removed members, policy files
//! validated as the hub validates them), decided by `meridian_core::whatif`, and told in words
//! and JSON — with the DNS answers each changed client would get, asked of the same answer
//! function DNS serves with. Nothing is written or pushed.

use std::path::Path;
use std::time::{Duration, Instant};

use meridian_core::whatif::Base;
use meridian_core::whatif::{Assumption, ClientChange, Route, Scenario, Simulated, WorkloadChange};
use meridian_core::{ClusterId, Snapshot};
use meridian_dns::Answerer;
use meridian_dns::explain::explain_at;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A scenario as clients send it (JSON body, or the query of a GET).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioRequest {
    /// `eu-1=Unreachable`, `eu-1:taint=maint:NoExecute`, `eu-1:untaint=maint`.
    #[serde(default)]
    pub assume: Vec<String>,
    /// Members assumed gone.
    #[serde(default)]
    pub remove: Vec<String>,
    /// Policy files, each as its name and text.
    #[serde(default)]
    pub policies: Vec<PolicyFile>,
    /// Compare this long after now (default: once every timer has run out).
    pub after_seconds: Option<u64>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    pub file: String,
    pub text: String,
}

impl ScenarioRequest {
    pub fn is_empty(&self) -> bool {
        self.assume.is_empty() && self.remove.is_empty() && self.policies.is_empty()
    }

    /// The scenario, or every reason it is not one (then nothing is simulated).
    pub fn scenario(&self) -> Result<Scenario, Vec<String>> {
        let mut errors = Vec::new();
        let mut assumptions = Vec::new();
        for text in &self.assume {
            match text.parse::<Assumption>() {
                Ok(a) => assumptions.push(a),
                Err(e) => errors.push(format!("--assume {e}")),
            }
        }
        assumptions.extend(
            self.remove
                .iter()
                .map(|c| Assumption::Remove(ClusterId::new(c))),
        );
        for policy in &self.policies {
            match meridian_controllers::hub::policies_in(Path::new(&policy.file), &policy.text) {
                Ok(policies) => assumptions.extend(policies.into_iter().map(Assumption::Policy)),
                Err(problems) => {
                    errors.extend(problems.iter().map(|p| format!("--assume-policy {p}")))
                }
            }
        }
        if self.after_seconds.is_some_and(|a| a > MAX_AFTER_SECONDS) {
            errors.push(format!(
                "after: at most {MAX_AFTER_SECONDS} seconds (ten years); every timer has run out long before"
            ));
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Scenario {
            assumptions,
            after: self.after_seconds.map(Duration::from_secs),
        })
    }
}

/// `simulate --rollout`: the plan as JSON, with `words`.
pub fn rollout(base: &Base, policy: &str) -> Result<Value, String> {
    let plan = meridian_core::whatif::rollout::rollout_plan(
        &base.snapshot,
        &base.decider,
        policy,
        Instant::now(),
    )
    .map_err(|e| e.to_string())?;
    let mut value = serde_json::to_value(&plan).map_err(|e| e.to_string())?;
    value["words"] = json!(rollout_words(&plan));
    Ok(value)
}

fn rollout_words(plan: &meridian_core::whatif::rollout::RolloutPlan) -> Vec<String> {
    use meridian_core::stages::TrafficDuring;
    let list = |c: &[ClusterId]| {
        c.iter()
            .map(ClusterId::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let traffic = match plan.traffic {
        TrafficDuring::Drain => format!(
            "traffic Drain ({} s before a stage's copies change; back {})",
            plan.drain_seconds,
            match plan.ramp_seconds {
                0 => "at once once ready".to_string(),
                s => format!("over {s} s once ready"),
            }
        ),
        TrafficDuring::Keep => "traffic Keep (copies change under their traffic)".to_string(),
    };
    let mut words = vec![format!(
        "rollout of {}: {} stage(s); {traffic}; shares over {}",
        plan.policy,
        plan.steps.len(),
        match plan.services.is_empty() {
            true => "no Service (the policy governs none)".to_string(),
            false => plan.services.join(", "),
        }
    )];
    words.push(format!("before: {}", shares_words(&plan.before)));
    for (i, step) in plan.steps.iter().enumerate() {
        let mut head = format!("stage {} {:?}: {}", i + 1, step.stage, list(&step.clusters));
        if step.approval_required {
            head.push_str("; approval required");
        }
        if !step.drained.is_empty() {
            head.push_str(&format!("; drains {}", list(&step.drained)));
        }
        if step.wait_seconds > 0 {
            head.push_str(&format!("; waits {} s once ready", step.wait_seconds));
        }
        words.push(head);
        words.push(format!("  {}", shares_words(&step.shares)));
        words.extend(step.stranded.iter().map(|s| format!("  would pause: {s}")));
        for r in &step.ramp {
            words.push(format!(
                "  coming back at {}% of its share: {}",
                r.percent,
                shares_words(&r.shares)
            ));
        }
    }
    words
}

/// `eu → eu-1 66.7%, eu-2 33.3%; us → us-1 100%`
fn shares_words(shares: &[meridian_core::whatif::rollout::RegionShare]) -> String {
    let mut by_region: Vec<(String, Vec<String>)> = Vec::new();
    for s in shares.iter().filter(|s| s.percent > 0.0) {
        let region = if s.region.is_empty() {
            "(no region)"
        } else {
            &s.region
        };
        let part = format!("{} {}%", s.cluster, s.percent);
        match by_region.last_mut() {
            Some((r, parts)) if r == region => parts.push(part),
            _ => by_region.push((region.to_string(), vec![part])),
        }
    }
    if by_region.is_empty() {
        return "no traffic".into();
    }
    by_region
        .iter()
        .map(|(r, parts)| format!("{r} → {}", parts.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The furthest a scenario looks ahead: a clock that far is past every timer, and an
/// `Instant` cannot hold much more.
const MAX_AFTER_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// At most this many changed (service, client) routes are told with their DNS answers; the
/// totals count them all.
const DETAILED: usize = 200;

/// The simulation as JSON, with `words`.
pub fn simulate(
    answerer: &Answerer,
    base: &Base,
    request: &ScenarioRequest,
) -> Result<Value, Vec<String>> {
    let scenario = request.scenario()?;
    let started = Instant::now();
    let snap = &*base.snapshot;
    let simulated = meridian_core::whatif::simulate(snap, &base.decider, &scenario, started)
        .map_err(|e| vec![e.to_string()])?;
    let took = started.elapsed();
    let mut words = summary_words(&simulated);
    let mut services = Vec::new();
    let mut detailed = 0;
    for change in &simulated.simulation.services {
        words.push(format!("service {}:", change.service));
        let mut clients = Vec::new();
        for client in &change.clients {
            let dns = (detailed < DETAILED)
                .then(|| dns_answers(answerer, &simulated, &change.service, client));
            detailed += 1;
            words.push(format!("  {}", client_words(client, dns.as_ref())));
            clients.push(json!({
                "clients": client.clients,
                "before": client.before,
                "after": client.after,
                "dns": dns.map(|(before, after)| json!({"before": before, "after": after})),
            }));
        }
        services.push(json!({"service": change.service, "clients": clients}));
    }
    if detailed > DETAILED {
        words.push(format!(
            "({} client routes told without their DNS answers; see the JSON)",
            detailed - DETAILED
        ));
    }
    words.extend(simulated.simulation.workloads.iter().map(workload_words));
    words.extend(simulated.simulation.notes.iter().cloned());
    let s = &simulated.simulation;
    Ok(json!({
        "assumptions": s.assumptions,
        "afterSeconds": s.after_seconds,
        "services": services,
        "workloads": s.workloads,
        "totals": s.totals,
        "notes": s.notes,
        "tookMilliseconds": took.as_secs_f64() * 1000.0,
        "words": words,
    }))
}

fn summary_words(sim: &Simulated) -> Vec<String> {
    let s = &sim.simulation;
    let t = &s.totals;
    let mut words = vec![assuming_words(&s.assumptions, s.after_seconds, sim.settled)];
    if t.services_changed == 0 && t.workloads_changed == 0 {
        words.push("  nothing changes: every answer, EDS priority and placement stays".into());
        return words;
    }
    words.push(format!(
        "  {} service(s) change where some client's traffic goes; {} of them the first tier (what DNS answers); {} client route(s) in all",
        t.services_changed, t.first_tier_changed, t.clients_changed
    ));
    words.push(format!(
        "  {} workload(s) move {} replica(s)",
        t.workloads_changed, t.replicas_moved
    ));
    for share in &t.shares {
        words.push(format!(
            "  {} would take {:.1} % of {} clients' traffic to these services (now {:.1} %)",
            share.cluster,
            share.after_percent,
            if share.region.is_empty() {
                "region-less"
            } else {
                &share.region
            },
            share.before_percent
        ));
    }
    words
}

/// What DNS would answer the client before and after: the A records' addresses.
fn dns_answers(
    answerer: &Answerer,
    sim: &Simulated,
    service: &str,
    client: &ClientChange,
) -> (Vec<String>, Vec<String>) {
    let (ns, name) = service.split_once('/').unwrap_or(("", service));
    let qname = format!("{name}.{ns}.global");
    // One client answers for its group: the clients of a group share their routes.
    let from = client
        .clients
        .first()
        .and_then(Option::as_ref)
        .map(ClusterId::as_str);
    let ask = |snap: &Snapshot| -> Vec<String> {
        match explain_at(answerer, snap, &qname, "A", from, sim.at) {
            Ok(e) if e.answers.is_empty() => vec![e.status],
            Ok(e) => e
                .answers
                .iter()
                .filter_map(|r| r.split_whitespace().last().map(str::to_owned))
                .collect(),
            Err(e) => vec![e.to_string()],
        }
    };
    (ask(&sim.baseline), ask(&sim.imagined))
}

fn client_words(client: &ClientChange, dns: Option<&(Vec<String>, Vec<String>)>) -> String {
    let names: Vec<&str> = client
        .clients
        .iter()
        .map(|c| c.as_ref().map_or("no cluster", ClusterId::as_str))
        .collect();
    let who = match names.as_slice() {
        [one] if *one == "no cluster" => "a client in no cluster".to_owned(),
        [one] => format!("from {one}"),
        [first, .., last] if names.len() > 6 => {
            format!("from {} clusters ({first} … {last})", names.len())
        }
        many => format!("from {}", many.join(", ")),
    };
    let tiers = |r: Option<&Route>| match r {
        None => "not served".to_owned(),
        Some(r) if r.tiers.is_empty() => "no cluster".to_owned(),
        Some(r) => r
            .tiers
            .iter()
            .map(|t| {
                let members: Vec<String> = t
                    .iter()
                    .map(|m| {
                        format!(
                            "{}{}",
                            m.cluster,
                            if m.via_gateway { " (gateway)" } else { "" }
                        )
                    })
                    .collect();
                format!("[{}]", members.join(" "))
            })
            .collect::<Vec<_>>()
            .join(" "),
    };
    let mut line = format!(
        "{who}: EDS priorities {} → {}",
        tiers(Some(&client.before)),
        tiers(client.after.as_ref())
    );
    if let Some((before, after)) = dns {
        line.push_str(&format!(
            "; DNS {} → {}",
            answer_words(before),
            answer_words(after)
        ));
    }
    line
}

/// The addresses, or for an answer without one, "no address" and its rcode: a bare
/// `NOERROR` reads as if all were well.
fn answer_words(answer: &[String]) -> String {
    match answer {
        [status] if status.parse::<std::net::IpAddr>().is_err() => {
            format!("no address ({status})")
        }
        addresses => addresses.join(", "),
    }
}

fn workload_words(w: &WorkloadChange) -> String {
    let spread = |s: &meridian_core::whatif::Spread, outcome: &str| {
        if s.is_empty() {
            return outcome.to_owned();
        }
        let placed: Vec<String> = s
            .iter()
            .map(|(c, r)| match r {
                Some(r) => format!("{c} {r}"),
                None => format!("{c} (whole)"),
            })
            .collect();
        if outcome == "scheduled" {
            placed.join(", ")
        } else {
            format!("{} ({outcome})", placed.join(", "))
        }
    };
    let moves = |m: &[(ClusterId, u32)]| {
        m.iter()
            .map(|(c, n)| format!("{n} in {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut line = format!(
        "workload {}: {} → {}",
        w.template,
        spread(&w.before, &w.outcome_before),
        spread(&w.after, &w.outcome_after)
    );
    if !w.evicted.is_empty() {
        line.push_str(&format!("; evicts {}", moves(&w.evicted)));
    }
    if !w.started.is_empty() {
        line.push_str(&format!("; starts {}", moves(&w.started)));
    }
    line
}

/// The imagined fleet of `request` for `explain --assume`, and the words that say so.
pub fn imagine(
    base: &Base,
    request: &ScenarioRequest,
) -> Result<(meridian_core::whatif::Imagined, String), Vec<String>> {
    let scenario = request.scenario()?;
    let now = Instant::now();
    let imagined = meridian_core::whatif::imagine(&base.snapshot, &base.decider, &scenario, now)
        .map_err(|e| vec![e.to_string()])?;
    let assumed: Vec<String> = scenario
        .assumptions
        .iter()
        .map(ToString::to_string)
        .collect();
    let after = imagined.at.saturating_duration_since(now).as_secs();
    let words = assuming_words(&assumed, after, scenario.after.is_none());
    Ok((imagined, words))
}

/// The line that says what a what-if assumes and when it looks.
fn assuming_words(assumptions: &[String], after_seconds: u64, settled: bool) -> String {
    format!(
        "assuming {}, {after_seconds} s from now{}:",
        if assumptions.is_empty() {
            "nothing".to_owned()
        } else {
            assumptions.join(", ")
        },
        if settled {
            " (once every window it starts has run out)"
        } else {
            ""
        }
    )
}
