//! `meridian join` and `meridian unjoin`: from the hub's and a member's kubeconfigs to a
//! registered member in one command, and back.
//!
//! ```text
//!  join NAME
//!   member: Namespace meridian-system, ServiceAccount meridian,     (each created when missing;
//!           ClusterRoles meridian-member[-propagation] (deploy/rbac)  one that is there is kept)
//!           ClusterRoleBindings meridian-join-member[-propagation] → the ServiceAccount
//!           a token for the ServiceAccount (TokenRequest)
//!   hub:    Secret <hub ns>/meridian-member-NAME: a kubeconfig of the member's server, its CA
//!             and the token
//!           MemberCluster NAME: source.kubernetes.secretRef to it; region and zone labels
//!             (the member's Nodes' unless given); network
//!  unjoin NAME
//!   hub:    MemberCluster deleted, and waited for: meridian's finalizer holds it until the
//!           member's copies have moved out the graceful way; then the Secret
//!   member: what join made (label meridian.io/joined-by=meridian-join), newest first
//! ```
//!
//! Everything is written through [`Applier`] as field manager `meridian-join`, so running
//! join again changes only what differs (a new token, a new region) and unjoin finds exactly
//! what join made by its label. An object of the same name that join did not make — a
//! ClusterRole from the member chart, a namespace that was there — is used and left alone.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::config::Kubeconfig;
use kube::{Api, Client};
use meridian_core::ClusterId;
use serde_json::{Value, json};

use super::apply::{self, Applier, ApplyOptions, ObjectId};
use super::leader::Leadership;
use super::rbac;

/// The label on everything join makes; its value is [`MANAGER`].
pub const JOINED_BY: &str = "meridian.io/joined-by";
/// The field manager of join's writes.
const MANAGER: &str = "meridian-join";
/// The member namespace and ServiceAccount meridian reads and writes the member as.
const MEMBER_NAMESPACE: &str = "meridian-system";
const ACCOUNT: &str = "meridian";
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the member's kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("{0}")]
    Write(#[from] apply::Error),
    #[error("listing the member's Nodes")]
    Nodes(#[source] kube::Error),
    #[error("a token for ServiceAccount {MEMBER_NAMESPACE}/{ACCOUNT} in the member")]
    Token(#[source] kube::Error),
    #[error(
        "MemberCluster {cluster} is still on the hub after {waited}s (finalizers {finalizers:?}): \
         meridian lets go of it once the member's copies have moved out; is it running? The \
         member's credentials are kept until then"
    )]
    StillRetiring {
        cluster: ClusterId,
        waited: u64,
        finalizers: Vec<String>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to join, and how.
#[derive(Debug, Clone)]
pub struct Join {
    pub cluster: ClusterId,
    /// The hub namespace the kubeconfig Secret goes to (meridian's own).
    pub hub_namespace: String,
    /// Labels of the MemberCluster; the member's Nodes' when None.
    pub region: Option<String>,
    pub zone: Option<String>,
    pub network: Option<String>,
    pub dns_client_cidrs: Vec<String>,
    /// Also the roles to place workloads (deploy/rbac/member-propagation.yaml).
    pub propagation: bool,
    /// The member's objects come from an agent: nothing is made in the member.
    pub agent: bool,
    /// Lifetime of the member token the hub's Secret holds.
    pub token_seconds: i64,
}

/// How the hub reaches the member's API: its kubeconfig's cluster entry, CA embedded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberServer {
    pub server: String,
    /// Base64 of the CA's PEM.
    pub ca_data: Option<String>,
    pub tls_server_name: Option<String>,
    pub insecure: bool,
}

impl MemberServer {
    /// The cluster of `context` (default: the current one) in `config`; a CA file is read
    /// (relative to `dir`, the kubeconfig's) and embedded, since the hub has no such file.
    pub fn from_kubeconfig(config: &Kubeconfig, context: Option<&str>, dir: &Path) -> Result<Self> {
        let context_name = context
            .map(str::to_owned)
            .or_else(|| config.current_context.clone())
            .ok_or_else(|| Error::Kubeconfig("no context given and no current-context".into()))?;
        let cluster_name = config
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone())
            .ok_or_else(|| Error::Kubeconfig(format!("no context {context_name:?}")))?;
        let cluster = config
            .clusters
            .iter()
            .find(|c| c.name == cluster_name)
            .and_then(|c| c.cluster.clone())
            .ok_or_else(|| Error::Kubeconfig(format!("no cluster {cluster_name:?}")))?;
        let server = cluster
            .server
            .ok_or_else(|| Error::Kubeconfig(format!("cluster {cluster_name:?} has no server")))?;
        let ca_data = match (
            cluster.certificate_authority_data,
            cluster.certificate_authority,
        ) {
            (Some(data), _) => Some(data),
            (None, Some(file)) => {
                let file = dir.join(file);
                let pem = std::fs::read(&file)
                    .map_err(|e| Error::Kubeconfig(format!("{}: {e}", file.display())))?;
                Some(base64::engine::general_purpose::STANDARD.encode(pem))
            }
            (None, None) => None,
        };
        Ok(Self {
            server,
            ca_data,
            tls_server_name: cluster.tls_server_name,
            insecure: cluster.insecure_skip_tls_verify.unwrap_or(false),
        })
    }
}

/// What join did or would do, one line each, and with `dry_run` the objects as YAML.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    pub objects: Vec<Value>,
}

/// The region and zone most of the member's Nodes carry.
pub fn topology<'a>(
    labels: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
) -> (Option<String>, Option<String>) {
    let mut counts: [BTreeMap<&str, usize>; 2] = Default::default();
    for node in labels {
        for (count, key) in counts.iter_mut().zip([REGION_LABEL, ZONE_LABEL]) {
            if let Some(value) = node.get(key) {
                *count.entry(value.as_str()).or_default() += 1;
            }
        }
    }
    let most = |count: &BTreeMap<&str, usize>| {
        // Ties go to the first name in order, so the answer does not depend on list order.
        let top = count.values().copied().max()?;
        count
            .iter()
            .find(|(_, n)| **n == top)
            .map(|(v, _)| (*v).to_owned())
    };
    (most(&counts[0]), most(&counts[1]))
}

fn labelled(mut body: Value) -> Value {
    body["metadata"]["labels"][JOINED_BY] = json!(MANAGER);
    body
}

/// The ClusterRoles meridian needs in the member (with `propagation`, those to place
/// workloads too), each with the name of join's binding to it.
fn roles(propagation: bool) -> Vec<(Value, String)> {
    // The files' bindings name User `meridian`; join binds the ServiceAccount instead.
    let mut files = vec![rbac::MEMBER];
    if propagation {
        files.push(rbac::PROPAGATION);
    }
    files
        .into_iter()
        .flat_map(rbac::roles)
        .map(|role| {
            let name = role["metadata"]["name"].as_str().unwrap_or_default();
            let binding = format!("meridian-join-{}", name.trim_start_matches("meridian-"));
            (role, binding)
        })
        .collect()
}

/// Objects join keeps as they are when they exist (it made them, or someone else did).
fn member_base() -> Vec<Value> {
    vec![
        labelled(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MEMBER_NAMESPACE}}),
        ),
        labelled(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": ACCOUNT, "namespace": MEMBER_NAMESPACE},
        })),
    ]
}

/// Join's binding `name` of `role` (a ClusterRole, or a Role in its namespace) to meridian's
/// ServiceAccount.
fn binding(name: &str, role: &Value) -> Value {
    let role_kind = role["kind"].as_str().unwrap_or("ClusterRole");
    let mut metadata = json!({"name": name});
    let kind = match role["metadata"]["namespace"].as_str() {
        Some(namespace) if role_kind == "Role" => {
            metadata["namespace"] = json!(namespace);
            "RoleBinding"
        }
        _ => "ClusterRoleBinding",
    };
    labelled(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": MEMBER_NAMESPACE}],
    }))
}

/// The kubeconfig the hub reads the member with.
pub fn kubeconfig_text(cluster: &ClusterId, server: &MemberServer, token: &str) -> String {
    let mut entry = json!({"server": server.server});
    if let Some(ca) = &server.ca_data {
        entry["certificate-authority-data"] = json!(ca);
    }
    if let Some(name) = &server.tls_server_name {
        entry["tls-server-name"] = json!(name);
    }
    if server.insecure {
        entry["insecure-skip-tls-verify"] = json!(true);
    }
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": cluster.as_str(), "cluster": entry}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": cluster.as_str(), "context": {"cluster": cluster.as_str(), "user": ACCOUNT}}],
        "current-context": cluster.as_str(),
    });
    serde_yaml_ng::to_string(&config).unwrap_or_default()
}

fn secret_name(cluster: &ClusterId) -> String {
    format!("meridian-member-{cluster}")
}

/// The hub's objects: the member's kubeconfig Secret (none for an agent member) and its
/// MemberCluster.
pub fn hub_objects(join: &Join, kubeconfig: Option<&str>) -> Vec<Value> {
    let mut labels = json!({});
    if let Some(region) = &join.region {
        labels[REGION_LABEL] = json!(region);
    }
    if let Some(zone) = &join.zone {
        labels[ZONE_LABEL] = json!(zone);
    }
    let source = match join.agent {
        true => json!({"agent": {}}),
        false => json!({"kubernetes": {"secretRef": {
            "namespace": join.hub_namespace, "name": secret_name(&join.cluster), "key": "kubeconfig",
        }}}),
    };
    let mut spec = json!({"source": source});
    if join.network.is_some() || !join.dns_client_cidrs.is_empty() {
        let mut network = json!({});
        if let Some(name) = &join.network {
            network["name"] = json!(name);
        }
        if !join.dns_client_cidrs.is_empty() {
            network["dnsClientCIDRs"] = json!(join.dns_client_cidrs);
        }
        spec["network"] = network;
    }
    let mut objects = Vec::new();
    if let Some(text) = kubeconfig.filter(|_| !join.agent) {
        objects.push(labelled(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret_name(&join.cluster), "namespace": join.hub_namespace},
            "stringData": {"kubeconfig": text},
        })));
    }
    objects.push(labelled(json!({
        "apiVersion": "meridian.io/v1alpha1", "kind": "MemberCluster",
        "metadata": {"name": join.cluster.as_str(), "labels": labels},
        "spec": spec,
    })));
    objects
}

fn options() -> ApplyOptions {
    ApplyOptions {
        force: true,
        manager: Some(MANAGER),
    }
}

fn applier(client: &Client, cluster: &ClusterId) -> Applier {
    Applier::new(client.clone(), Leadership::always(MANAGER), cluster.clone())
}

fn id_of(body: &Value) -> ObjectId {
    ObjectId::of(body).expect("join's own objects name their kind and name")
}

fn made_by_join(object: &kube::api::DynamicObject) -> bool {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(JOINED_BY))
        .is_some_and(|v| v == MANAGER)
}

/// Applies `body` unless an object of its name is there that join did not make (kept).
async fn ensure(applier: &Applier, body: &Value, report: &mut Report, place: &str) -> Result<()> {
    let id = id_of(body);
    match applier.get(&id).await? {
        Some(found) if !made_by_join(&found) => {
            report
                .lines
                .push(format!("{place}: {id} is there (not made by join): kept"));
        }
        found => {
            applier.apply(&id, body, options()).await?;
            let verb = if found.is_some() {
                "applied"
            } else {
                "created"
            };
            report.lines.push(format!("{place}: {id} {verb}"));
        }
    }
    Ok(())
}

/// Reads the region and zone of `join` from the member's Nodes where not given.
pub async fn fill_topology(member: &Client, join: &mut Join, report: &mut Report) -> Result<()> {
    if join.region.is_some() && join.zone.is_some() {
        return Ok(());
    }
    let nodes = Api::<Node>::all(member.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(Error::Nodes)?;
    let labels: Vec<BTreeMap<String, String>> = nodes
        .items
        .into_iter()
        .map(|n| n.metadata.labels.unwrap_or_default())
        .collect();
    let (region, zone) = topology(&labels);
    for (given, found, label) in [
        (&mut join.region, region, REGION_LABEL),
        (&mut join.zone, zone, ZONE_LABEL),
    ] {
        if given.is_some() {
            continue;
        }
        match found {
            Some(value) => {
                report
                    .lines
                    .push(format!("member: {label}={value}, from its Nodes"));
                *given = Some(value);
            }
            None => report.lines.push(format!(
                "member: no Node carries {label}: the MemberCluster has none (give it with --{})",
                label.rsplit('/').next().unwrap_or(label)
            )),
        }
    }
    Ok(())
}

/// Joins the member: its objects, a token, then the hub's; with `dry_run`, only says what
/// it would write.
pub async fn join(
    hub: &Client,
    member: Option<(&Client, &MemberServer)>,
    join: &Join,
    dry_run: bool,
) -> Result<Report> {
    let mut report = Report::default();
    let kubeconfig = match (member, join.agent) {
        (Some((client, server)), false) => {
            Some(join_member(client, server, join, dry_run, &mut report).await?)
        }
        _ => None,
    };
    let hub_applier = applier(hub, &join.cluster);
    for body in hub_objects(join, kubeconfig.as_deref()) {
        if dry_run {
            report.objects.push(body);
            continue;
        }
        let id = id_of(&body);
        hub_applier.apply(&id, &body, options()).await?;
        report.lines.push(format!("hub: {id} applied"));
    }
    Ok(report)
}

/// The member's side of a join: the kubeconfig the hub will read it with.
async fn join_member(
    client: &Client,
    server: &MemberServer,
    join: &Join,
    dry_run: bool,
    report: &mut Report,
) -> Result<String> {
    let member = applier(client, &join.cluster);
    let roles = roles(join.propagation);
    let mut kept = member_base();
    kept.extend(roles.iter().map(|(role, _)| labelled(role.clone())));
    let bindings: Vec<Value> = roles
        .iter()
        .map(|(role, name)| binding(name, role))
        .collect();
    if dry_run {
        report.objects.extend(kept);
        report.objects.extend(bindings);
        return Ok(kubeconfig_text(
            &join.cluster,
            server,
            "<a token for ServiceAccount meridian-system/meridian>",
        ));
    }
    for body in &kept {
        ensure(&member, body, report, "member").await?;
    }
    for body in &bindings {
        member.apply(&id_of(body), body, options()).await?;
        report
            .lines
            .push(format!("member: {} applied", id_of(body)));
    }
    let token = service_account_token(client, join.token_seconds).await?;
    report.lines.push(format!(
        "member: a token for ServiceAccount {MEMBER_NAMESPACE}/{ACCOUNT}, valid {}h (join again to renew it)",
        join.token_seconds / 3600
    ));
    Ok(kubeconfig_text(&join.cluster, server, &token))
}

/// A token for meridian's ServiceAccount from the TokenRequest API (a token Secret needs the
/// controller manager's token controller, which a member need not run for this).
async fn service_account_token(client: &Client, seconds: i64) -> Result<String> {
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), MEMBER_NAMESPACE);
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    });
    let answer: k8s_openapi::api::authentication::v1::TokenRequest = accounts
        .create_subresource(
            "token",
            ACCOUNT,
            &kube::api::PostParams::default(),
            &request,
        )
        .await
        .map_err(Error::Token)?;
    Ok(answer.status.map(|s| s.token).unwrap_or_default())
}

/// Unjoins the member: its MemberCluster (waiting up to `wait` for meridian to let go of it),
/// the hub's Secret, then what join made in the member.
pub async fn unjoin(
    hub: &Client,
    member: Option<&Client>,
    cluster: &ClusterId,
    hub_namespace: &str,
    wait: Duration,
) -> Result<Report> {
    let mut report = Report::default();
    let hub_applier = applier(hub, cluster);
    let member_cluster = ObjectId::new(
        "meridian.io/v1alpha1",
        "MemberCluster",
        None,
        cluster.as_str(),
    );
    if hub_applier.get(&member_cluster).await?.is_some() {
        hub_applier.delete(&member_cluster).await?;
        report.lines.push(format!(
            "hub: {member_cluster} deleted; waiting for meridian to let go of it"
        ));
        wait_gone(&hub_applier, &member_cluster, cluster, wait).await?;
        report.lines.push(format!("hub: {member_cluster} gone"));
    }
    let secret = ObjectId::new("v1", "Secret", Some(hub_namespace), &secret_name(cluster));
    delete_if_made_by_join(&hub_applier, &secret, &mut report, "hub").await?;
    if let Some(client) = member {
        let member = applier(client, cluster);
        let mut made: Vec<ObjectId> = member_base().iter().map(id_of).collect();
        for (role, binding_name) in roles(true) {
            made.push(id_of(&role));
            made.push(id_of(&binding(&binding_name, &role)));
        }
        // Bindings first, the namespace last: nothing is left bound to a deleted account.
        made.sort_by_key(|id| match id.kind.as_str() {
            "ClusterRoleBinding" | "RoleBinding" => 0,
            "ClusterRole" | "Role" => 1,
            "ServiceAccount" => 2,
            _ => 3,
        });
        for id in made {
            delete_if_made_by_join(&member, &id, &mut report, "member").await?;
        }
    }
    Ok(report)
}

async fn wait_gone(
    applier: &Applier,
    id: &ObjectId,
    cluster: &ClusterId,
    wait: Duration,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let Some(found) = applier.get(id).await? else {
            return Ok(());
        };
        if start.elapsed() >= wait {
            return Err(Error::StillRetiring {
                cluster: cluster.clone(),
                waited: wait.as_secs(),
                finalizers: found.metadata.finalizers.unwrap_or_default(),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn delete_if_made_by_join(
    applier: &Applier,
    id: &ObjectId,
    report: &mut Report,
    place: &str,
) -> Result<()> {
    match applier.get(id).await? {
        Some(found) if made_by_join(&found) => {
            applier.delete(id).await?;
            report.lines.push(format!("{place}: {id} deleted"));
        }
        Some(_) => report
            .lines
            .push(format!("{place}: {id} was not made by join: kept")),
        None => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests;
