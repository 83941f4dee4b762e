//! `meridian diagnose`, the checks that need a member's API: whether meridian's identity
//! there may do what meridian does (SelfSubjectAccessReview, one per permission of the role
//! it needs), whether the member's CoreDNS forwards the fleet zones (its Corefile), and how
//! far its clock is from meridian's (the `Date` of its answers).
//! Each check says pass or fail, what it saw and, when it fails, the fix.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use serde::Serialize;

use super::rbac::{self, Permission};

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    /// Nothing wrong, nothing proved: e.g. no xDS client of the cluster is connected.
    Info,
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub outcome: Outcome,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            outcome: Outcome::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            outcome: Outcome::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn info(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            outcome: Outcome::Info,
            detail: detail.into(),
            fix: None,
        }
    }
}

/// Which role meridian's identity in the member needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// The hub's credential for the member (deploy/rbac/member.yaml, and with placements
    /// member-propagation.yaml).
    Hub { propagation: bool },
    /// A pull-mode agent (deploy/rbac/agent.yaml).
    Agent,
}

/// Asks the member, as meridian's identity there, whether it may do each thing its role
/// grants; fails naming each refusal.
pub async fn permissions(client: &Client, identity: Identity) -> Check {
    let (files, role_file): (Vec<&str>, &str) = match identity {
        Identity::Hub { propagation: false } => (vec![rbac::MEMBER], "deploy/rbac/member.yaml"),
        Identity::Hub { propagation: true } => (
            vec![rbac::MEMBER, rbac::PROPAGATION],
            "deploy/rbac/member.yaml and member-propagation.yaml",
        ),
        Identity::Agent => (vec![rbac::AGENT], "deploy/rbac/agent.yaml"),
    };
    let wanted: Vec<Permission> = files.into_iter().flat_map(rbac::permissions).collect();
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut denied = Vec::new();
    for permission in &wanted {
        match reviews
            .create(&PostParams::default(), &review(permission))
            .await
        {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => denied.push(permission.to_string()),
            Err(e) => {
                return Check::fail(
                    "permissions",
                    format!("cannot ask the member what meridian may do: {e}"),
                    "check the member's API address and meridian's credential for it",
                );
            }
        }
    }
    if denied.is_empty() {
        return Check::pass(
            "permissions",
            format!("all {} permissions of {role_file} allowed", wanted.len()),
        );
    }
    Check::fail(
        "permissions",
        format!("denied: {}", denied.join(", ")),
        format!(
            "apply {role_file} in the member, bound to meridian's identity there (`meridian join` does both)"
        ),
    )
}

fn review(permission: &Permission) -> SelfSubjectAccessReview {
    let spec = match permission {
        Permission::Resource {
            group,
            resource,
            subresource,
            verb,
        } => SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.clone()),
                resource: Some(resource.clone()),
                subresource: subresource.clone(),
                verb: Some(verb.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        Permission::Path { path, verb } => SelfSubjectAccessReviewSpec {
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.clone()),
                verb: Some(verb.clone()),
            }),
            ..Default::default()
        },
    };
    SelfSubjectAccessReview {
        spec,
        ..Default::default()
    }
}

/// A member clock this far from meridian's fails the check: leases, tokens and certificates
/// are judged by the clocks on both sides.
const CLOCK_SKEW_LIMIT: Duration = Duration::from_secs(10);

/// The member's clock against meridian's, from the `Date` header of its `/version` answer
/// (to the second; the request's own time is taken off).
pub async fn clock(client: &Client) -> Check {
    let request = match http::Request::get("/version").body(kube::client::Body::from(Vec::new())) {
        Ok(request) => request,
        Err(e) => return Check::info("clock", format!("cannot ask: {e}")),
    };
    let sent = SystemTime::now();
    let answer = match client.send(request).await {
        Ok(answer) => answer,
        Err(e) => return Check::info("clock", format!("the member did not answer /version: {e}")),
    };
    let received = SystemTime::now();
    let Some(date) = answer
        .headers()
        .get(http::header::DATE)
        .and_then(|d| d.to_str().ok())
    else {
        return Check::info("clock", "the member's answer carries no Date header");
    };
    let midpoint = sent + received.duration_since(sent).unwrap_or_default() / 2;
    clock_check(date, midpoint)
}

/// Judges a member's `Date` header against meridian's clock at the moment it was sent.
pub fn clock_check(date: &str, ours: SystemTime) -> Check {
    let parsed = k8s_openapi::jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(date);
    let Ok(theirs) = parsed else {
        return Check::info(
            "clock",
            format!("the member's Date header {date:?} does not parse"),
        );
    };
    let ours = k8s_openapi::jiff::Timestamp::try_from(ours).unwrap_or_default();
    let skew = theirs.as_second() - ours.as_second();
    let words = match skew {
        0 => "the member's clock agrees with meridian's (to the second)".to_owned(),
        s if s > 0 => format!("the member's clock is {s}s ahead of meridian's"),
        s => format!("the member's clock is {}s behind meridian's", -s),
    };
    if skew.unsigned_abs() < CLOCK_SKEW_LIMIT.as_secs() {
        Check::pass("clock", words)
    } else {
        Check::fail(
            "clock",
            words,
            "synchronise both clocks (NTP): leases, tokens and certificates are judged by them",
        )
    }
}

/// Reads the member's Corefile (ConfigMap kube-system/coredns) for a server block per zone
/// that forwards it.
pub async fn coredns(client: &Client, zones: &[String]) -> Check {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let fix = "add deploy/coredns/Corefile's server blocks, with meridian's DNS address, to the \
               member's Corefile (ConfigMap kube-system/coredns)";
    let corefile = match maps.get_opt("coredns").await {
        Ok(Some(map)) => map.data.and_then(|mut d| d.remove("Corefile")),
        Ok(None) => None,
        Err(e) => {
            return Check::fail(
                "coredns",
                format!("cannot read ConfigMap kube-system/coredns: {e}"),
                fix,
            );
        }
    };
    let Some(corefile) = corefile else {
        return Check::fail(
            "coredns",
            "no Corefile in ConfigMap kube-system/coredns",
            fix,
        );
    };
    let forwards = zone_forwards(&corefile);
    let mut seen = Vec::new();
    let mut missing = Vec::new();
    for zone in zones {
        match forwards.iter().find(|(z, _)| z == zone) {
            Some((_, to)) => seen.push(format!("{zone} → {to}")),
            None => missing.push(zone.as_str()),
        }
    }
    if missing.is_empty() {
        Check::pass(
            "coredns",
            format!("the Corefile forwards {}", seen.join(", ")),
        )
    } else {
        Check::fail(
            "coredns",
            format!(
                "the Corefile forwards no server block for {}",
                missing.join(", ")
            ),
            fix,
        )
    }
}

/// Each server block's zones and where its `forward .` goes, from a Corefile.
pub fn zone_forwards(corefile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut zones: Vec<String> = Vec::new();
    let mut depth = 0usize;
    for raw in corefile.lines() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if depth == 0 && line.ends_with('{') {
            zones = line
                .trim_end_matches('{')
                .split_whitespace()
                .map(|z| {
                    let z = z.trim_start_matches("dns://");
                    let z = z.rsplit_once(':').map_or(z, |(name, _)| name);
                    z.trim_end_matches('.').to_ascii_lowercase()
                })
                .collect();
        }
        if depth == 1 {
            let mut words = line.split_whitespace();
            if words.next() == Some("forward") && words.next() == Some(".") {
                let to: Vec<&str> = words.take_while(|w| *w != "{").collect();
                out.extend(zones.iter().map(|z| (z.clone(), to.join(" "))));
            }
        }
        depth += line.matches('{').count();
        depth = depth.saturating_sub(line.matches('}').count());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_clock_more_than_ten_seconds_off_fails() {
        let ours = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        // 784111777 is Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110's example).
        let same = clock_check("Sun, 06 Nov 1994 08:49:37 GMT", ours);
        assert_eq!(same.outcome, Outcome::Pass, "{same:?}");
        let ahead = clock_check("Sun, 06 Nov 1994 08:49:46 GMT", ours);
        assert_eq!(
            (ahead.outcome, ahead.detail.as_str()),
            (
                Outcome::Pass,
                "the member's clock is 9s ahead of meridian's"
            )
        );
        let behind = clock_check("Sun, 06 Nov 1994 08:48:37 GMT", ours);
        assert_eq!(
            (behind.outcome, behind.detail.as_str()),
            (Outcome::Fail, "the member's clock is 60s behind meridian's")
        );
        assert_eq!(clock_check("yesterday", ours).outcome, Outcome::Info);
    }

    #[test]
    fn the_corefile_s_forwarding_blocks_are_found_by_zone() {
        let corefile = "\
.:53 {
    errors
    forward . /etc/resolv.conf
}
# meridian
global:53 {
    forward . 10.0.0.53:1053
    cache 5
}
clusterset.local. {
    forward . 10.0.0.53:1053 10.0.0.54:1053 {
        max_fails 2
    }
}
";
        assert_eq!(
            zone_forwards(corefile),
            [
                ("".to_owned(), "/etc/resolv.conf".to_owned()),
                ("global".to_owned(), "10.0.0.53:1053".to_owned()),
                (
                    "clusterset.local".to_owned(),
                    "10.0.0.53:1053 10.0.0.54:1053".to_owned()
                ),
            ]
        );
    }
}
