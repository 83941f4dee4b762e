//! `meridian diagnose`: checks a user runs when traffic goes wrong, each with pass or fail and
//! the fix. The server's side (`/debug/diagnose`) checks each member as meridian reaches it:
//! its API, what its identity there may do, its CoreDNS's forwarding, its clock, its gateway,
//! its xDS clients. The client's side asks the probe name through the member's own resolver: whether
//! the resolver forwards the zones to meridian, and which cluster meridian takes its queries
//! for (its source address against `dnsClientCIDRs`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use meridian_controllers::kubernetes::diagnose::{self, Check, Identity};
use meridian_core::{ClusterView, Health};
use serde_json::{Value, json};

use crate::admin::AdminState;
use crate::cli::DiagnoseArgs;
use crate::out::outln;

/// How long a gateway gets to accept a connection.
const GATEWAY_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the member's resolver gets to answer the probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one member's API checks may take (tens of access reviews, one ConfigMap read).
const MEMBER_TIMEOUT: Duration = Duration::from_secs(10);
/// Members checked by one request when none is named: a request must not send tens of
/// thousands of reviews to a large fleet's API servers. The rest are counted, not checked.
const MEMBERS_PER_REQUEST: usize = 50;

/// `/debug/diagnose`: every member's checks, or one's.
pub async fn server_checks(s: &AdminState, only: Option<&str>) -> Result<Value> {
    let snap = s.snapshots.borrow().clone();
    let zones: Vec<String> = s
        .dns
        .answerer()
        .config()
        .zones
        .iter()
        .map(|z| z.name.to_string().trim_end_matches('.').to_owned())
        .collect();
    let members: Vec<&ClusterView> = snap
        .clusters
        .iter()
        .filter(|c| only.is_none_or(|name| c.spec.id.as_str() == name))
        .collect();
    if let Some(name) = only
        && members.is_empty()
    {
        bail!("no member cluster {name:?} on the hub");
    }
    let unchecked = members.len().saturating_sub(MEMBERS_PER_REQUEST);
    let mut clusters = Vec::new();
    for c in members.into_iter().take(MEMBERS_PER_REQUEST) {
        let checks = member_checks(s, c, &zones).await;
        clusters.push(json!({"cluster": c.spec.id, "checks": checks}));
    }
    let mut report = json!({"zones": zones, "clusters": clusters});
    if unchecked > 0 {
        report["unchecked"] = json!(format!(
            "{unchecked} more member(s) not checked: at most {MEMBERS_PER_REQUEST} per request; name one with --cluster"
        ));
    }
    Ok(report)
}

async fn member_checks(s: &AdminState, c: &ClusterView, zones: &[String]) -> Vec<Check> {
    let id = &c.spec.id;
    let (client, version, agent) = s.fleet.get(id, |f| {
        (
            f.client.clone(),
            f.kubernetes_version.clone(),
            f.agent.is_some(),
        )
    });
    let mut checks = vec![api_check(c, version.as_deref(), client.is_some())];
    match &client {
        Some(client) => {
            let api_checks = api_checks(client, agent, zones);
            match tokio::time::timeout(MEMBER_TIMEOUT, api_checks).await {
                Ok(api) => checks.extend(api),
                Err(_) => checks.push(Check::fail(
                    "permissions",
                    format!(
                        "the member's API did not answer within {}s",
                        MEMBER_TIMEOUT.as_secs()
                    ),
                    "check the member's API address and the network between meridian and it",
                )),
            }
        }
        None => checks.push(Check::info(
            "permissions",
            "no API client for this member (a directory member, or not connected yet)",
        )),
    }
    if let Some(gateway) = &c.spec.gateway {
        checks.push(gateway_check(SocketAddr::new(gateway.address, gateway.port)).await);
    }
    checks.push(xds_check(s, id.as_str()));
    checks
}

/// What meridian's identity in the member may do, the member's Corefile, and its clock.
async fn api_checks(client: &kube::Client, agent: bool, zones: &[String]) -> Vec<Check> {
    let identity = match agent {
        true => Identity::Agent,
        false => Identity::Hub { propagation: false },
    };
    let permissions = diagnose::permissions(client, identity).await;
    let coredns = match agent {
        true => Check::info(
            "coredns",
            "not read through an agent: ask the member's resolver with --resolver",
        ),
        false => diagnose::coredns(client, zones).await,
    };
    vec![permissions, coredns, diagnose::clock(client).await]
}

fn api_check(c: &ClusterView, version: Option<&str>, has_client: bool) -> Check {
    let reason = c.reason.as_deref().unwrap_or("no reason given");
    match c.health {
        Health::Healthy => Check::pass(
            "api",
            match (has_client, version) {
                (true, Some(v)) => format!("Healthy: the API answers (Kubernetes {v})"),
                (true, None) => "Healthy: the API answers".to_owned(),
                (false, _) => "Healthy".to_owned(),
            },
        ),
        health => Check::fail(
            "api",
            format!("{}: {reason}", health.as_str()),
            "check the member's API address, meridian's credential for it (the kubeconfig its MemberCluster names) and the network between them",
        ),
    }
}

async fn gateway_check(address: SocketAddr) -> Check {
    match tokio::time::timeout(GATEWAY_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(_)) => Check::pass("gateway", format!("{address} accepts connections")),
        Ok(Err(e)) => Check::fail(
            "gateway",
            format!("{address}: {e}"),
            "the east-west gateway must accept connections at the address its MemberCluster gives (spec.gateway)",
        ),
        Err(_) => Check::fail(
            "gateway",
            format!("{address}: no answer within {}s", GATEWAY_TIMEOUT.as_secs()),
            "the east-west gateway must accept connections at the address its MemberCluster gives (spec.gateway)",
        ),
    }
}

/// The xDS clients of a cluster: connected, and whether one refuses what it was sent.
fn xds_check(s: &AdminState, cluster: &str) -> Check {
    let streams: Vec<_> = s
        .xds
        .stream_statuses()
        .into_iter()
        .filter(|st| {
            st.node
                .as_ref()
                .is_some_and(|n| n.group.cluster.as_deref() == Some(cluster))
        })
        .collect();
    if streams.is_empty() {
        return Check::info("xds", "no xDS client of this cluster is connected");
    }
    let refusing: Vec<String> = streams
        .iter()
        .flat_map(|st| {
            let node = st.node.as_ref().map_or("?", |n| n.id.as_str()).to_owned();
            st.types.iter().filter_map(move |(kind, t)| {
                let current = t.acked_version.is_some() && t.acked_version == t.sent_version;
                t.last_error
                    .as_ref()
                    .filter(|_| !current)
                    .map(|e| format!("{node} refuses {kind}: {e}"))
            })
        })
        .collect();
    if refusing.is_empty() {
        return Check::pass(
            "xds",
            format!(
                "{} client stream(s) connected, each ACKing what it was sent",
                streams.len()
            ),
        );
    }
    Check::fail(
        "xds",
        refusing.join("; "),
        "see `meridian xds clients` and the client's own log for why it refuses",
    )
}

/// Asks `_meridian-whoami.<zone>` TXT of `resolver` (the member's CoreDNS, or whatever its
/// pods use), for each zone: forwarded at all, and taken for which cluster.
async fn probe_checks(resolver: SocketAddr, cluster: &str, zones: &[String]) -> Vec<Check> {
    let mut checks = Vec::new();
    for zone in zones {
        let name = format!("_meridian-whoami.{zone}.");
        let (forwarding, source) = match probe(resolver, &name).await {
            Ok(text) => {
                let said = |key: &str| {
                    text.split_whitespace()
                        .find_map(|w| w.strip_prefix(key))
                        .unwrap_or("")
                        .to_owned()
                };
                let (seen_as, from) = (said("cluster="), said("source="));
                let forwarding = Check::pass(
                    "dns-forwarding",
                    format!("{resolver} forwards {zone} to meridian"),
                );
                let source = if seen_as == cluster {
                    Check::pass(
                        "dns-source",
                        format!(
                            "meridian sees {zone} queries through {resolver} from {from}, in {cluster}'s dnsClientCIDRs"
                        ),
                    )
                } else {
                    let taken_for = if seen_as.is_empty() {
                        "no cluster".to_owned()
                    } else {
                        seen_as
                    };
                    Check::fail(
                        "dns-source",
                        format!(
                            "meridian sees {zone} queries through {resolver} from {from}, which it takes for {taken_for}: its clients get answers for {taken_for}, not for {cluster}"
                        ),
                        format!(
                            "add {from} (the resolver's address range) to MemberCluster {cluster}'s spec.network.dnsClientCIDRs"
                        ),
                    )
                };
                (forwarding, Some(source))
            }
            Err(why) => (
                Check::fail(
                    "dns-forwarding",
                    format!("{resolver} does not answer {name} TXT from meridian: {why}"),
                    "forward the zone to meridian in the member's Corefile (deploy/coredns/Corefile)",
                ),
                None,
            ),
        };
        checks.push(forwarding);
        checks.extend(source);
    }
    checks
}

/// The TXT answer to `name` from `resolver`, or why there is none.
async fn probe(resolver: SocketAddr, name: &str) -> Result<String, String> {
    let mut query = Message::new(rand_id(), MessageType::Query, OpCode::Query);
    query.metadata.recursion_desired = true;
    let qname = Name::from_ascii(name).map_err(|e| e.to_string())?;
    query.add_query(Query::query(qname, RecordType::TXT));
    let bytes = query.to_vec().map_err(|e| e.to_string())?;
    let bind: SocketAddr = if resolver.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .map_err(|e: std::net::AddrParseError| e.to_string())?;
    let socket = tokio::net::UdpSocket::bind(bind)
        .await
        .map_err(|e| e.to_string())?;
    socket
        .send_to(&bytes, resolver)
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0; 4096];
    let len = tokio::time::timeout(PROBE_TIMEOUT, socket.recv(&mut buf))
        .await
        .map_err(|_| format!("no answer within {}s", PROBE_TIMEOUT.as_secs()))?
        .map_err(|e| e.to_string())?;
    let answer = Message::from_vec(&buf[..len]).map_err(|e| e.to_string())?;
    if answer.metadata.response_code != ResponseCode::NoError {
        return Err(format!("{}", answer.metadata.response_code));
    }
    answer
        .answers
        .iter()
        .find_map(|r| match &r.data {
            RData::TXT(txt) => Some(txt.to_string()),
            _ => None,
        })
        .ok_or_else(|| "no TXT record in the answer".to_owned())
}

fn rand_id() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    (nanos % u32::from(u16::MAX)) as u16
}

/// `meridian diagnose`: the server's checks, and with `--resolver` the probe's; exits 1
/// when any fails.
pub async fn run(args: &DiagnoseArgs) -> Result<ExitCode> {
    if args.resolver.is_some() && args.cluster.is_none() {
        bail!("--resolver needs --cluster: the cluster whose resolver it is");
    }
    let mut path = "/debug/diagnose".to_owned();
    if let Some(c) = &args.cluster {
        path.push_str(&format!("?cluster={}", crate::commands::encode(c)));
    }
    let mut body = crate::commands::AdminClient::new(&args.client.admin)?
        .get_json(&path)
        .await?;
    if let Some(err) = body.get("error") {
        bail!(
            "{}",
            err.as_str().unwrap_or("the server could not diagnose")
        );
    }
    if let (Some(resolver), Some(cluster)) = (args.resolver, &args.cluster) {
        let zones: Vec<String> = serde_json::from_value(body["zones"].clone()).unwrap_or_default();
        let probed = probe_checks(resolver, cluster, &zones).await;
        if let Some(checks) = body["clusters"][0]["checks"].as_array_mut() {
            checks.extend(probed.iter().map(|c| json!(c)));
        }
    }
    let failed = body["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["checks"].as_array().into_iter().flatten())
        .filter(|c| c["outcome"] == "fail")
        .count();
    if args.client.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&body).context("the report")?
        );
    } else {
        print_report(&body);
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_report(body: &Value) {
    if let Some(unchecked) = body["unchecked"].as_str() {
        outln!("{unchecked}");
    }
    for cluster in body["clusters"].as_array().into_iter().flatten() {
        let name = cluster["cluster"].as_str().unwrap_or("?");
        outln!("{name}");
        for check in cluster["checks"].as_array().into_iter().flatten() {
            let mark = check["outcome"]
                .as_str()
                .unwrap_or("info")
                .to_ascii_uppercase();
            outln!(
                "  {mark}  {:<15} {}",
                check["name"].as_str().unwrap_or("?"),
                check["detail"].as_str().unwrap_or("")
            );
            if let Some(fix) = check["fix"].as_str() {
                outln!("        {:<15} fix: {fix}", "");
            }
        }
    }
}
