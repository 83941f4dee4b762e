//! `meridian explain SERVICE --from-cluster C` and `/debug/explain` (and, for a workload,
//! `meridian explain KIND/NAME -n NS`, in `placement`; for a Gateway API route,
//! `explain httproute/NAME`, in `route`): one decision of the
//! scheduling core, and what DNS and xDS make of it, side by side — in words and as JSON.
//! Both halves are asked of the running answer function and resource builders, so the
//! explanation is what clients get, not a re-derivation.

mod placement;
mod route;

pub use placement::{explain_template, placements_json};
pub use route::{explain_route, route_kind};

use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use meridian_core::{FilterReason, Mode, Snapshot, TierReason};
use meridian_dns::Answerer;
use meridian_dns::explain::{Decision, explain_at as explain_dns};
use meridian_xds::{Group, Kind, Role, Xds};
use serde::Serialize;
use serde_json::Value;

/// `svc.ns`, `svc.ns.global` or `ns/svc` → (namespace, name).
fn parse_service(service: &str) -> Option<(String, String)> {
    if let Some((ns, name)) = service.split_once('/') {
        return Some((ns.to_owned(), name.to_owned()));
    }
    let trimmed = service.trim_end_matches('.').trim_end_matches(".global");
    let (name, ns) = trimmed.split_once('.')?;
    (!ns.contains('.')).then(|| (ns.to_owned(), name.to_owned()))
}

/// The fleet an explanation reads: the published snapshot now, or an imagined one (a what-if)
/// at the instant it is imagined at, decided apart from every cache.
#[derive(Clone, Copy)]
pub struct Seen<'a> {
    pub snap: &'a Snapshot,
    pub imagined_at: Option<Instant>,
}

impl<'a> Seen<'a> {
    pub fn now(snap: &'a Snapshot) -> Self {
        Self {
            snap,
            imagined_at: None,
        }
    }

    fn instant(&self) -> Instant {
        self.imagined_at.unwrap_or_else(Instant::now)
    }

    fn resources(&self, xds: &Xds, group: &Group) -> Value {
        match self.imagined_at {
            None => meridian_xds::describe::describe(&xds.resources_for(self.snap, group)),
            Some(at) => {
                meridian_xds::describe::describe(&xds.resources_imagined(self.snap, group, at))
            }
        }
    }
}

/// What `explain SERVICE` answers: the policy, the decision, the DNS answer and the EDS
/// resources a client in `client_cluster` gets, and all of it in words.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ServiceExplanation<'a> {
    service: String,
    client_cluster: Option<&'a str>,
    policy: PolicySummary<'a>,
    decision: Option<Decision>,
    dns: DnsAnswer,
    /// As `describe` shows them (`meridian xds dump`).
    eds: Vec<Value>,
    /// Whose EDS: an Envoy's (a proxyless client's leaves out what needs a gateway).
    eds_client: &'static str,
    words: Vec<String>,
}

/// The traffic settings of the policy that governs the service.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PolicySummary<'a> {
    source: Option<&'a str>,
    mode: Mode,
    min_healthy_endpoints: u32,
    withdraw_after_seconds: Option<u64>,
    failback_after_seconds: u64,
    ttl: Option<u32>,
    max_answers: Option<u32>,
}

#[derive(Debug, Serialize)]
struct DnsAnswer {
    name: String,
    rcode: String,
    answers: Vec<String>,
}

pub fn explain(
    answerer: &Answerer,
    xds: &Xds,
    seen: Seen<'_>,
    service: &str,
    from_cluster: Option<&str>,
) -> Result<Value> {
    let snap = seen.snap;
    let (ns, name) = parse_service(service).with_context(|| {
        format!("{service:?}: name a service as NAME.NAMESPACE or NAMESPACE/NAME")
    })?;
    let view = snap
        .service(&ns, &name)
        .ok_or_else(|| anyhow!("no exported service {ns}/{name}"))?;
    let dns = explain_dns(
        answerer,
        snap,
        &format!("{name}.{ns}.global"),
        "A",
        from_cluster,
        seen.instant(),
    )?;
    let group = Group {
        cluster: from_cluster.map(str::to_owned),
        network: None,
        role: Role::Envoy,
    };
    let feed = seen.resources(xds, &group);
    let eds = service_assignments(&feed, &ns, &name);
    let policy = &view.policy;
    let policy_summary = PolicySummary {
        source: policy.source.as_deref(),
        mode: policy.mode,
        min_healthy_endpoints: policy.min_healthy_endpoints,
        withdraw_after_seconds: policy.withdraw_after_seconds,
        failback_after_seconds: policy.failback_after_seconds,
        ttl: policy.ttl,
        max_answers: policy.max_answers,
    };
    let mut words = vec![format!(
        "{ns}/{name} for a client in {}: {}",
        from_cluster.unwrap_or("an unknown cluster"),
        match &policy.source {
            Some(p) => format!(
                "policy {p} (mode {:?}, minHealthyEndpoints {}, failback {} s)",
                policy.mode, policy.min_healthy_endpoints, policy.failback_after_seconds
            ),
            None => format!(
                "no policy selects it: the default (mode {:?}, minHealthyEndpoints {})",
                policy.mode, policy.min_healthy_endpoints
            ),
        }
    )];
    for (cluster, percent) in &policy.ramping {
        words.push(format!(
            "ramping: {cluster} takes {percent}% of its share while a staged rollout brings its \
             traffic back (`rampSeconds`); a tier it alone holds shares that traffic with the next"
        ));
    }
    if let Some(decision) = &dns.decision {
        words.extend(decision_words(decision));
    }
    words.push(format!(
        "DNS A: {} ({})",
        if dns.answers.is_empty() {
            "no addresses".to_owned()
        } else {
            dns.answers
                .iter()
                .filter_map(|r| r.split_whitespace().last())
                .collect::<Vec<_>>()
                .join(", ")
        },
        dns.rcode
    ));
    if !eds.is_empty() {
        words.push(format!(
            "EDS as an Envoy in {} receives it; a proxyless gRPC client there cannot use a \
             gateway, so clusters reached only through one are left out of its priorities \
             (`meridian xds dump --role proxyless` shows its own)",
            from_cluster.unwrap_or("no member cluster")
        ));
    }
    for assignment in &eds {
        words.push(format!(
            "EDS {}:",
            assignment["name"].as_str().unwrap_or("?")
        ));
        for l in assignment["detail"]["localities"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let endpoints = l["endpoints"].as_array().map_or(0, Vec::len);
            words.push(format!(
                "  priority {} {} weight {} ({} endpoint{}{})",
                l["priority"],
                l["cluster"].as_str().unwrap_or("?"),
                l["weight"],
                endpoints,
                if endpoints == 1 { "" } else { "s" },
                if l["endpoints"][0]["viaGateway"] == true {
                    ", through its gateway"
                } else {
                    ""
                }
            ));
        }
    }
    let explained = ServiceExplanation {
        service: format!("{ns}/{name}"),
        client_cluster: from_cluster,
        policy: policy_summary,
        decision: dns.decision,
        dns: DnsAnswer {
            name: dns.name,
            rcode: dns.rcode,
            answers: dns.answers,
        },
        eds,
        eds_client: "envoy",
        words,
    };
    Ok(serde_json::to_value(explained)?)
}

/// The EDS resources of service `ns/name` (one per port) in a described feed.
pub(crate) fn service_assignments(feed: &Value, ns: &str, name: &str) -> Vec<Value> {
    let prefix = meridian_xds::resources::service_name_prefix(ns, name);
    feed["resources"][Kind::Endpoint.short()]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["name"].as_str().is_some_and(|n| n.starts_with(&prefix)))
        .cloned()
        .collect()
}

fn decision_words(d: &Decision) -> Vec<String> {
    let mut words = Vec::new();
    for f in &d.filtered {
        words.push(format!(
            "filtered: {} — {}",
            f.cluster,
            filter_words(&f.reason)
        ));
    }
    for t in &d.tiers {
        let members: Vec<String> = t
            .clusters
            .iter()
            .map(|m| {
                format!(
                    "{} weight {}{}",
                    m.cluster,
                    m.weight,
                    if m.via_gateway { " (via gateway)" } else { "" }
                )
            })
            .collect();
        let reasons: Vec<String> = t.reasons.iter().map(tier_words).collect();
        words.push(format!(
            "priority {} ({}; {} ready): {}",
            t.priority,
            reasons.join(" + "),
            t.ready,
            members.join(", ")
        ));
    }
    if d.spills > 0 {
        words.push(format!(
            "{} tier(s) had fewer ready endpoints than minHealthyEndpoints and spilled into the next",
            d.spills
        ));
    }
    words.extend(d.conflicts.iter().map(|c| format!("export conflict: {c}")));
    words
}

pub(crate) fn filter_words(reason: &FilterReason) -> String {
    match reason {
        FilterReason::Withdrawn => "unreachable past its withdraw time".into(),
        FilterReason::Draining => {
            "drained by a staged rollout while its copies change (`meridian rollout status`)".into()
        }
        FilterReason::NoExecuteTaint(key) => {
            format!("NoExecute taint {key:?} that the policy does not tolerate")
        }
        FilterReason::NoReadyEndpoints => "no ready endpoints".into(),
        FilterReason::OtherNetworkNoGateway => {
            "on another network than the client, without a gateway".into()
        }
        FilterReason::GatewayUnusable => {
            "on another network, and the client cannot use a gateway (proxyless gRPC)".into()
        }
        FilterReason::DuplicateAddresses(by) => {
            format!("every ready address it reports is answered by {by}, which comes first")
        }
        FilterReason::NotInAffinities => "in none of the policy's clusterAffinities".into(),
        FilterReason::WeightZero => "the policy gives it weight 0".into(),
    }
}

pub(crate) fn tier_words(reason: &TierReason) -> String {
    match reason {
        TierReason::ClientCluster => "the client's own cluster".into(),
        TierReason::SameZone => "same zone".into(),
        TierReason::SameRegion => "same region".into(),
        TierReason::Remote => "other regions".into(),
        TierReason::Everyone => "every cluster (client unknown)".into(),
        TierReason::Affinity(name) => format!("affinity {name:?}"),
        TierReason::Weighted => "every cluster, by weight".into(),
        TierReason::FailingBack => "recovered, waiting out failbackAfterSeconds".into(),
        TierReason::PreferNoSchedule => "PreferNoSchedule taint".into(),
        TierReason::NotPlaced => {
            "the policy places the workload elsewhere (a draining copy)".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_service;

    #[test]
    fn service_names_in_three_spellings() {
        let want = Some(("shop".to_owned(), "payments".to_owned()));
        assert_eq!(parse_service("payments.shop"), want);
        assert_eq!(parse_service("payments.shop.global"), want);
        assert_eq!(parse_service("payments.shop.global."), want);
        assert_eq!(parse_service("shop/payments"), want);
        assert_eq!(parse_service("payments"), None);
        assert_eq!(parse_service("a.b.c"), None);
    }
}
