//! Resource templates on a Kubernetes hub: the objects of the kinds the served
//! ClusterSchedulingPolicies select, discovered through the API and watched as
//! `DynamicObject`s, one watch per kind, started and stopped as the selected kinds change.
//!
//! ```text
//!  policies' template selectors ──reconcile──► discovery (apiVersion + kind → ApiResource)
//!       │                                        └─ not served / cluster-scoped: a problem
//!       │                                           of each policy selecting it (retried)
//!       └─ one watcher task per kind ──(id, Event<DynamicObject>)──► hub loop ──► Table
//! ```
//! Each object is converted at the edge to the JSON the directory hub reads from files
//! (`apiVersion`/`kind` set, `managedFields` dropped), so both hubs validate templates by the
//! same `add_template`. What meridian writes itself (`app.kubernetes.io/managed-by=meridian`)
//! is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::{self, Scope};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use meridian_core::{ObjectRef, Origin, Policy, Problem};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::state::{Applied, Table};
use super::{AbortOnDrop, MANAGED_BY_SELECTOR_EXCLUDED};
use crate::hub::{Hub, ReadFrom, Summaries};

/// How often kinds that could not be resolved are looked up again (a CRD may be installed
/// later, discovery may have failed for a moment).
pub(crate) const RETRY: Duration = Duration::from_secs(10);

/// A kind as a policy selects it: `apiVersion` (None: any group serving the kind) and kind.
pub(crate) type Wanted = (Option<String>, String);
/// A kind as the hub serves it: `apiVersion` and kind.
type Served = (String, String);

/// One event of one kind's watch; `id` tells a stopped watch's late events apart.
pub(crate) type TemplateEvent = (u64, Result<Event<DynamicObject>, String>);

/// A template object as the hub served it, converted; equal when the API says it is the same
/// version.
#[derive(Clone, Debug)]
pub(crate) struct TemplateObject {
    uid: Option<String>,
    resource_version: Option<String>,
    object: ObjectRef,
    value: Arc<serde_json::Value>,
}

impl TemplateObject {
    /// What a hub's template list holds of it.
    pub(crate) fn into_parts(self) -> (ObjectRef, Arc<serde_json::Value>) {
        (self.object, self.value)
    }
}

impl PartialEq for TemplateObject {
    fn eq(&self, other: &Self) -> bool {
        self.uid == other.uid && self.resource_version == other.resource_version
    }
}

/// The JSON of a hub object as a manifest file would hold it.
pub(crate) fn template_object(ar: &ApiResource, o: &DynamicObject) -> TemplateObject {
    let mut value = serde_json::to_value(o).unwrap_or_else(|_| serde_json::json!({}));
    if !value.is_object() {
        value = serde_json::json!({});
    }
    // Items of a list come without their type; the template keeps it.
    value["apiVersion"] = ar.api_version.clone().into();
    value["kind"] = ar.kind.clone().into();
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("managedFields");
    }
    TemplateObject {
        uid: o.metadata.uid.clone(),
        resource_version: o.metadata.resource_version.clone(),
        object: ObjectRef {
            kind: ar.kind.clone(),
            namespace: o.metadata.namespace.clone(),
            name: o.metadata.name.clone().unwrap_or_else(|| "?".into()),
        },
        value: Arc::new(value),
    }
}

/// One kind's watch and what it has seen.
struct KindWatch {
    id: u64,
    resource: ApiResource,
    table: Table<TemplateObject>,
    /// The watch's last error, until it delivers again: a problem of the selecting policies.
    failure: Option<String>,
    _task: AbortOnDrop<()>,
}

/// The template watches of a hub.
pub(crate) struct Templates {
    client: Client,
    config: watcher::Config,
    tx: mpsc::Sender<TemplateEvent>,
    /// What each selected kind resolved to (the kinds the hub serves for it), or why not.
    resolved: BTreeMap<Wanted, (Result<Vec<ApiResource>, String>, Instant)>,
    watches: BTreeMap<Served, KindWatch>,
    next_id: u64,
}

impl Templates {
    pub(crate) fn new(
        client: Client,
        config: watcher::Config,
        tx: mpsc::Sender<TemplateEvent>,
    ) -> Self {
        Self {
            client,
            config: config.labels(MANAGED_BY_SELECTOR_EXCLUDED),
            tx,
            resolved: BTreeMap::new(),
            watches: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// Resolves the kinds `policies` select (looking up again those that failed more than
    /// [`RETRY`] ago) and starts and stops watches to match; true if anything changed.
    pub(crate) async fn reconcile(&mut self, policies: &[Policy]) -> bool {
        let wanted = wanted(policies);
        let mut changed = false;
        let before = self.resolved.len();
        self.resolved.retain(|w, _| wanted.contains(w));
        changed |= before != self.resolved.len();
        for w in &wanted {
            let due = match self.resolved.get(w) {
                None => true,
                Some((Err(_), at)) => at.elapsed() >= RETRY,
                Some((Ok(_), _)) => false,
            };
            if !due {
                continue;
            }
            let result = resolve(&self.client, w).await;
            if let Err(reason) = &result {
                warn!(api_version = ?w.0, kind = %w.1, %reason, "a selected kind cannot be watched");
            }
            let same = self
                .resolved
                .get(w)
                .is_some_and(|(r, _)| same_resolution(r, &result));
            changed |= !same;
            self.resolved.insert(w.clone(), (result, Instant::now()));
        }
        let served: BTreeMap<Served, ApiResource> = self
            .resolved
            .values()
            .filter_map(|(r, _)| r.as_ref().ok())
            .flatten()
            .map(|ar| ((ar.api_version.clone(), ar.kind.clone()), ar.clone()))
            .collect();
        let before = self.watches.len();
        self.watches.retain(|k, w| {
            let keep = served.contains_key(k);
            if !keep {
                info!(api_version = %k.0, kind = %k.1, id = w.id, "no policy selects this kind any more: watch stopped");
            }
            keep
        });
        changed |= before != self.watches.len();
        for (k, ar) in served {
            if self.watches.contains_key(&k) {
                continue;
            }
            info!(api_version = %k.0, kind = %k.1, "watching resource templates");
            let id = self.next_id;
            self.next_id += 1;
            let task = self.start(id, &ar);
            self.watches.insert(
                k,
                KindWatch {
                    id,
                    resource: ar,
                    table: Table::default(),
                    failure: None,
                    _task: task,
                },
            );
        }
        changed
    }

    /// Whether a kind that could not be resolved is due for another look.
    pub(crate) fn retry_due(&self) -> bool {
        self.resolved
            .values()
            .any(|(r, at)| r.is_err() && at.elapsed() >= RETRY)
    }

    fn start(&self, id: u64, ar: &ApiResource) -> AbortOnDrop<()> {
        let api = Api::<DynamicObject>::all_with(self.client.clone(), ar);
        let stream =
            watcher::watcher(api, self.config.clone()).backoff(super::connect::hub_backoff());
        let tx = self.tx.clone();
        AbortOnDrop(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(e) = stream.next().await {
                if tx.send((id, e.map_err(|e| e.to_string()))).await.is_err() {
                    return;
                }
            }
        }))
    }

    /// Applies one watch event; true if the templates (or the watch's failure) changed.
    pub(crate) fn apply(&mut self, (id, event): TemplateEvent) -> bool {
        let Some(w) = self.watches.values_mut().find(|w| w.id == id) else {
            return false; // a stopped watch's last words
        };
        match event {
            Ok(e) => {
                let was_failing = w.failure.take().is_some();
                let ar = w.resource.clone();
                let applied = w.table.apply(
                    e,
                    |o| &o.metadata,
                    |o| Ok::<_, Infallible>(template_object(&ar, o)),
                );
                was_failing || !matches!(applied, Applied::Nothing)
            }
            Err(e) => {
                let first = w.failure.is_none();
                if first {
                    warn!(api_version = %w.resource.api_version, kind = %w.resource.kind, error = %e, "template watch failing");
                }
                w.failure = Some(e);
                first
            }
        }
    }

    /// Every watched template, as served (cheap: the objects are shared).
    pub(crate) fn snapshot(&self) -> Vec<(ObjectRef, Arc<serde_json::Value>)> {
        self.watches
            .values()
            .flat_map(|w| w.table.live.values())
            .map(|t| (t.object.clone(), t.value.clone()))
            .collect()
    }

    /// The problems of `policies` with the kinds they select: not served by the hub, or
    /// failing to be watched.
    pub(crate) fn problems(&self, policies: &[Policy]) -> Vec<Problem> {
        let mut out = Vec::new();
        for p in policies {
            let object = ObjectRef::namespaced("ClusterSchedulingPolicy", &p.key);
            let mut seen = BTreeSet::new();
            for w in p.templates.iter().filter_map(wanted_of) {
                if !seen.insert(w.clone()) {
                    continue;
                }
                match self.resolved.get(&w) {
                    Some((Err(reason), _)) => out.push(Problem::in_api(
                        Origin::Hub,
                        object.clone(),
                        format!("spec.resourceSelectors: {reason}; nothing of that kind is placed"),
                    )),
                    Some((Ok(resources), _)) => {
                        for ar in resources {
                            let key = (ar.api_version.clone(), ar.kind.clone());
                            if let Some(f) = self.watches.get(&key).and_then(|w| w.failure.as_ref())
                            {
                                out.push(Problem::in_api(
                                    Origin::Hub,
                                    object.clone(),
                                    format!(
                                        "spec.resourceSelectors: cannot watch kind {} in apiVersion {} on the hub: {f}",
                                        ar.kind, ar.api_version
                                    ),
                                ));
                            }
                        }
                    }
                    None => {}
                }
            }
        }
        out.extend(self.dependency_problems(policies));
        out
    }

    /// The dependency kinds no policy selects itself that cannot be watched: the workloads
    /// are placed, their ConfigMaps or Secrets do not follow them.
    fn dependency_problems(&self, policies: &[Policy]) -> Vec<Problem> {
        let selected: BTreeSet<Wanted> = policies
            .iter()
            .flat_map(|p| p.templates.iter().filter_map(wanted_of))
            .collect();
        let mut out = Vec::new();
        for kind in DEPENDENCY_KINDS {
            let w = (Some("v1".to_owned()), kind.to_owned());
            if selected.contains(&w) {
                continue;
            }
            let failure = match self.resolved.get(&w) {
                Some((Err(reason), _)) => Some(reason.clone()),
                Some((Ok(_), _)) => self
                    .watches
                    .get(&("v1".to_owned(), kind.to_owned()))
                    .and_then(|w| w.failure.clone()),
                None => None,
            };
            if let Some(f) = failure {
                out.push(Problem::in_api(
                    Origin::Hub,
                    ObjectRef::cluster_scoped("Kind", kind),
                    format!(
                        "cannot watch {kind}s on the hub, so those placed workloads name do not follow them: {f}"
                    ),
                ));
            }
        }
        out
    }
}

fn wanted_of(s: &meridian_core::TemplateSelector) -> Option<Wanted> {
    Some((s.api_version.clone(), s.kind.clone()?))
}

/// The kinds whose templates carry a pod template, and so may name dependencies.
const WORKLOAD_KINDS: [&str; 6] = [
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
];

/// What a pod template may name, placed where its workload goes: watched on the
/// hub whenever a policy selects a workload kind, kept only when a template names them.
/// Not Secrets: the hub role lists none outside meridian-system; those a template names are
/// read one by one (`secrets.rs`), with a grant of `get` apart.
pub(crate) const DEPENDENCY_KINDS: [&str; 3] =
    ["ConfigMap", "ServiceAccount", "PersistentVolumeClaim"];

/// Every kind the policies select, and the dependency kinds when they select workloads.
pub(crate) fn wanted(policies: &[Policy]) -> BTreeSet<Wanted> {
    let mut wanted: BTreeSet<Wanted> = policies
        .iter()
        .flat_map(|p| p.templates.iter().filter_map(wanted_of))
        .collect();
    if wanted
        .iter()
        .any(|(_, kind)| WORKLOAD_KINDS.contains(&kind.as_str()))
    {
        wanted.extend(
            DEPENDENCY_KINDS
                .iter()
                .map(|kind| (Some("v1".to_owned()), (*kind).to_owned())),
        );
    }
    wanted
}

/// Drops the objects of dependency kinds that no policy selects and no template names:
/// the hub's other ConfigMaps and Secrets are none of meridian's business.
pub(crate) fn keep_named_dependencies(hub: &mut Hub) {
    let named: std::collections::HashSet<meridian_core::TemplateKey> = hub
        .templates
        .iter()
        .flat_map(|t| t.dependencies.iter().cloned())
        .collect();
    let policies = &hub.policies;
    hub.templates.retain(|t| {
        !(t.key.api_version.as_ref() == "v1" && DEPENDENCY_KINDS.contains(&t.key.kind.as_ref()))
            || named.contains(&t.key)
            || policies.iter().any(|p| p.places(t))
    });
}

fn same_resolution(
    a: &Result<Vec<ApiResource>, String>,
    b: &Result<Vec<ApiResource>, String>,
) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a == b,
        _ => false,
    }
}

/// Adds templates to `hub` as the directory hub adds a file's objects (the same validation
/// and problems). Summarizing every template is work for the blocking pool.
pub(crate) fn add_templates(
    hub: &mut Hub,
    templates: Vec<(ObjectRef, Arc<serde_json::Value>)>,
    summaries: &mut Summaries,
) {
    add_each(hub, templates, summaries);
    keep_named_dependencies(hub);
}

/// Adds templates of no dependency kind (the Secrets read by name): no pass over the others.
/// Each template shares its body with the watch's table (no copy per hub read).
pub(crate) fn add_each(
    hub: &mut Hub,
    templates: Vec<(ObjectRef, Arc<serde_json::Value>)>,
    summaries: &mut Summaries,
) {
    for template in templates {
        crate::hub::add_template(hub, &ReadFrom::Api, template, Some(summaries));
    }
}

/// The namespaced kinds the hub serves for what a policy selects, or why there are none.
async fn resolve(
    client: &Client,
    (api_version, kind): &Wanted,
) -> Result<Vec<ApiResource>, String> {
    match api_version {
        Some(v) => {
            let (group, version) = v.rsplit_once('/').unwrap_or(("", v));
            let gvk = GroupVersionKind::gvk(group, version, kind);
            match discovery::pinned_kind(client, &gvk).await {
                Ok((ar, caps)) => namespaced(ar, caps.scope).map(|ar| vec![ar]),
                Err(e) if not_found(&e) => Err(format!(
                    "kind {kind} in apiVersion {v} is not served by the hub"
                )),
                Err(e) => Err(format!(
                    "cannot look up kind {kind} in apiVersion {v} on the hub: {}",
                    crate::reason_of(&e)
                )),
            }
        }
        None => {
            let found = discovery::Discovery::new(client.clone())
                .run()
                .await
                .map_err(|e| {
                    format!(
                        "cannot look up kind {kind} on the hub: {}",
                        crate::reason_of(&e)
                    )
                })?;
            let mut out = Vec::new();
            let mut scoped = None;
            for g in found.groups() {
                if let Some((ar, caps)) = g.recommended_kind(kind) {
                    match namespaced(ar, caps.scope) {
                        Ok(ar) => out.push(ar),
                        Err(e) => scoped = Some(e),
                    }
                }
            }
            match (out.is_empty(), scoped) {
                (false, _) => Ok(out),
                (true, Some(e)) => Err(e),
                (true, None) => Err(format!("kind {kind} is not served by the hub")),
            }
        }
    }
}

fn namespaced(ar: ApiResource, scope: Scope) -> Result<ApiResource, String> {
    match scope {
        Scope::Namespaced => Ok(ar),
        Scope::Cluster => Err(format!(
            "kind {} in apiVersion {} is cluster-scoped; templates are namespaced objects",
            ar.kind, ar.api_version
        )),
    }
}

fn not_found(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 404,
        kube::Error::Discovery(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_object_becomes_the_json_a_manifest_file_holds() {
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", "Deployment"));
        let o: DynamicObject = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"replicas": 3}
        }))
        .unwrap();
        let t = template_object(&ar, &o);
        assert_eq!(t.value["apiVersion"], "apps/v1");
        assert_eq!(t.value["kind"], "Deployment");
        assert_eq!(t.value["spec"]["replicas"], 3);
        assert!(t.value["metadata"].get("managedFields").is_none());
        assert_eq!(t.object.namespace.as_deref(), Some("shop"));
        let mut hub = Hub::default();
        let mut summaries = Summaries::default();
        let read = (t.object.clone(), t.value.clone());
        crate::hub::add_template(&mut hub, &ReadFrom::Api, read.clone(), Some(&mut summaries));
        assert_eq!(hub.templates.len(), 1, "{:?}", hub.errors);
        // The template shares the watch table's body: a hub read copies no object, and the
        // fleet compares an unchanged template by pointer.
        assert!(Arc::ptr_eq(&hub.templates[0].body, &t.value));
        assert_eq!(&*hub.templates[0].key.name, "web");
        // The next read of the same body takes the same template (key and labels shared);
        // a new body is summarized again.
        summaries.read_done();
        let mut again = Hub::default();
        crate::hub::add_template(
            &mut again,
            &ReadFrom::Api,
            read.clone(),
            Some(&mut summaries),
        );
        assert!(Arc::ptr_eq(
            &again.templates[0].labels,
            &hub.templates[0].labels
        ));
        assert_eq!(again.templates[0].key, hub.templates[0].key);
        summaries.read_done();
        let edited = Arc::new((*t.value).clone());
        let mut third = Hub::default();
        crate::hub::add_template(
            &mut third,
            &ReadFrom::Api,
            (read.0, edited),
            Some(&mut summaries),
        );
        assert!(!Arc::ptr_eq(
            &third.templates[0].labels,
            &hub.templates[0].labels
        ));
    }

    #[test]
    fn the_selected_kinds_are_those_of_every_policy_once() {
        use meridian_core::TemplateSelector;
        let p = Policy {
            key: meridian_core::ObjectKey::new("shop", "a"),
            created: 0,
            selectors: vec![],
            traffic: Arc::default(),
            placement: None,
            templates: vec![
                TemplateSelector {
                    api_version: Some("apps/v1".into()),
                    kind: Some("Deployment".into()),
                    ..TemplateSelector::default()
                },
                TemplateSelector {
                    api_version: Some("apps/v1".into()),
                    kind: Some("Deployment".into()),
                    name: Some("web".into()),
                    ..TemplateSelector::default()
                },
            ],
        };
        let w = wanted(&[p]);
        let v1 = |k: &str| (Some("v1".to_string()), k.to_string());
        assert_eq!(
            w.into_iter().collect::<Vec<_>>(),
            [
                (Some("apps/v1".to_string()), "Deployment".to_string()),
                v1("ConfigMap"),
                v1("PersistentVolumeClaim"),
                v1("ServiceAccount"),
            ],
            "a workload kind brings the kinds its pods may name"
        );
    }
}
