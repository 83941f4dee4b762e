//! The Secrets placed workloads name, read from a Kubernetes hub one by one, so that they
//! follow their workload as the ConfigMaps, ServiceAccounts and PVCs do.
//!
//! Not watched: a watch needs `list` on every Secret of the hub, a read by name only `get`,
//! which the hub is granted apart (`deploy/rbac/hub-secrets.yaml`, the chart's
//! `hub.propagateSecrets`). Without that grant each named Secret is a problem on the hub and
//! its workloads are placed without it. Read again every [`REFRESH`] (one that could not be
//! read, at the hub's retry tick): a Secret edited on the hub reaches the members within that.
//!
//! ```text
//!  hub templates ─ dependencies of kind Secret, no template themselves ─► named (≤ MAX_NAMED)
//!     ─► GET each new name (CONCURRENT at once, GET_TIMEOUT each, ROUND_BUDGET in all)
//!     ─► templates + problems
//!  every REFRESH: GET every name again; changed (resourceVersion, or its error) ─► hub round
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use meridian_core::{ObjectRef, Origin, Problem};

use super::templates::{TemplateObject, template_object};
use crate::hub::Hub;

/// How often every named Secret is read again.
pub(crate) const REFRESH: Duration = Duration::from_secs(30);
/// Secrets read at most (the others named are a problem): one read each per [`REFRESH`].
const MAX_NAMED: usize = 1000;
/// Reads in flight at once.
const CONCURRENT: usize = 8;
const GET_TIMEOUT: Duration = Duration::from_secs(10);
/// All the reads of one round together.
const ROUND_BUDGET: Duration = Duration::from_secs(15);

/// A Secret by namespace and name.
type Named = (String, String);

/// What the last read of one Secret gave.
#[derive(Clone, Debug, PartialEq)]
enum Read {
    Found(TemplateObject),
    Missing,
    Failed(String),
}

/// The Secrets read for the hub's templates.
pub(crate) struct NamedSecrets {
    client: Client,
    read: BTreeMap<Named, Read>,
    /// More were named than are read.
    left_out: usize,
    refreshed: Instant,
}

impl NamedSecrets {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            read: BTreeMap::new(),
            left_out: 0,
            refreshed: Instant::now(),
        }
    }

    /// Reads the Secrets `hub`'s templates name that were not read yet, and forgets those no
    /// longer named; true when what is served changed.
    pub(crate) async fn sync(&mut self, hub: &Hub) -> bool {
        let (named, left_out) = named(hub);
        let before = self.read.len();
        self.read.retain(|k, _| named.contains(k));
        let mut changed = self.read.len() != before || left_out != self.left_out;
        self.left_out = left_out;
        let new: Vec<Named> = named
            .into_iter()
            .filter(|k| !self.read.contains_key(k))
            .collect();
        if !new.is_empty() {
            changed = true;
            self.read.extend(read_all(&self.client, new).await);
        }
        changed
    }

    /// Reads every named Secret again every [`REFRESH`], and those that could not be read
    /// at every call (the hub's retry tick: a grant given is noticed soon); true when one
    /// changed.
    pub(crate) async fn refresh_if_due(&mut self) -> bool {
        let all = self.refreshed.elapsed() >= REFRESH;
        let keys: Vec<Named> = self
            .read
            .iter()
            .filter(|(_, r)| all || matches!(r, Read::Failed(_)))
            .map(|(k, _)| k.clone())
            .collect();
        if all {
            self.refreshed = Instant::now();
        }
        if keys.is_empty() {
            return false;
        }
        let again = read_all(&self.client, keys).await;
        let mut changed = false;
        for (key, read) in again {
            if self.read.get(&key) != Some(&read) {
                changed = true;
                self.read.insert(key, read);
            }
        }
        changed
    }

    /// The Secrets found, as templates of the hub.
    pub(crate) fn templates(&self) -> Vec<(ObjectRef, Arc<serde_json::Value>)> {
        self.read
            .values()
            .filter_map(|r| match r {
                Read::Found(t) => Some(t.clone().into_parts()),
                _ => None,
            })
            .collect()
    }

    /// The Secrets that could not be read, and how many were left out (warnings: the
    /// workloads are placed without them).
    pub(crate) fn problems(&self) -> Vec<Problem> {
        let mut out: Vec<Problem> = self
            .read
            .iter()
            .filter_map(|((ns, name), r)| {
                let reason = match r {
                    // A missing dependency is the fleet's warning already, as on a directory hub.
                    Read::Found(_) | Read::Missing => return None,
                    Read::Failed(e) => format!(
                        "a placed workload names it and the hub cannot read it: grant `get` on Secrets (deploy/rbac/hub-secrets.yaml, the chart's propagateSecrets) for it to follow; until then its workloads are placed without it ({e})"
                    ),
                };
                Some(Problem::in_api(
                    Origin::Hub,
                    ObjectRef {
                        kind: "Secret".into(),
                        namespace: Some(ns.clone()),
                        name: name.clone(),
                    },
                    reason,
                ))
            })
            .collect();
        if self.left_out > 0 {
            out.push(Problem::in_api(
                Origin::Hub,
                ObjectRef::cluster_scoped("Kind", "Secret"),
                format!(
                    "placed workloads name more than {MAX_NAMED} Secrets; {} are not read and do not follow them",
                    self.left_out
                ),
            ));
        }
        out
    }
}

/// The Secrets `hub`'s templates name and no template is (a policy may select Secrets
/// itself), at most [`MAX_NAMED`], and how many more there were.
fn named(hub: &Hub) -> (BTreeSet<Named>, usize) {
    let present: BTreeSet<Named> = hub
        .templates
        .iter()
        .filter(|t| is_secret(&t.key))
        .map(|t| (t.key.namespace.to_string(), t.key.name.to_string()))
        .collect();
    let all: BTreeSet<Named> = hub
        .templates
        .iter()
        .flat_map(|t| t.dependencies.iter())
        .filter(|k| is_secret(k))
        .map(|k| (k.namespace.to_string(), k.name.to_string()))
        .filter(|k| !present.contains(k))
        .collect();
    let left_out = all.len().saturating_sub(MAX_NAMED);
    (all.into_iter().take(MAX_NAMED).collect(), left_out)
}

fn is_secret(key: &meridian_core::TemplateKey) -> bool {
    key.api_version.as_ref() == "v1" && key.kind.as_ref() == "Secret"
}

/// Reads `keys`, within [`ROUND_BUDGET`] all together: the hub's loop waits for them, and a
/// slow hub must not hold it for a thousand timeouts. Those not read by then fail, and are
/// read again at the next retry tick.
async fn read_all(client: &Client, keys: Vec<Named>) -> Vec<(Named, Read)> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Secret"));
    let mut read: BTreeMap<Named, Read> = keys
        .iter()
        .map(|k| {
            let late = format!("not read within {ROUND_BUDGET:?}; read again shortly");
            (k.clone(), Read::Failed(late))
        })
        .collect();
    let done: Vec<(Named, Read)> = futures::stream::iter(keys)
        .map(|key| {
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), &key.0, &resource);
            let resource = resource.clone();
            async move {
                let read = match tokio::time::timeout(GET_TIMEOUT, api.get_opt(&key.1)).await {
                    Ok(Ok(Some(o))) => Read::Found(template_object(&resource, &o)),
                    Ok(Ok(None)) => Read::Missing,
                    Ok(Err(kube::Error::Api(status))) => {
                        Read::Failed(format!("{} {}", status.code, status.reason))
                    }
                    Ok(Err(e)) => Read::Failed(crate::reason_of(&e)),
                    Err(_) => Read::Failed(format!("no answer within {GET_TIMEOUT:?}")),
                };
                (key, read)
            }
        })
        .buffer_unordered(CONCURRENT)
        .take_until(tokio::time::sleep(ROUND_BUDGET))
        .collect()
        .await;
    read.extend(done);
    read.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use meridian_core::TemplateKey;
    use meridian_core::testing::deployment;

    use super::*;

    fn secret_key(name: &str) -> TemplateKey {
        TemplateKey::new("v1", "Secret", "shop", name)
    }

    #[test]
    fn the_named_secrets_are_those_no_template_is_and_at_most_the_bound() {
        let mut web = deployment("web", Some(1));
        web.dependencies = vec![
            secret_key("token"),
            secret_key("selected"),
            TemplateKey::new("v1", "ConfigMap", "shop", "settings"),
        ];
        let mut selected = deployment("selected", None);
        selected.key = secret_key("selected");
        let mut hub = Hub::default();
        hub.templates = vec![web, selected];
        let (named_now, left_out) = named(&hub);
        assert_eq!(
            named_now,
            BTreeSet::from([("shop".to_owned(), "token".to_owned())]),
            "a Secret a policy selects is a template already; ConfigMaps are watched"
        );
        assert_eq!(left_out, 0);

        let mut many = deployment("many", Some(1));
        many.dependencies = (0..MAX_NAMED + 3)
            .map(|i| secret_key(&format!("s{i}")))
            .collect();
        hub.templates = vec![many];
        let (named_now, left_out) = named(&hub);
        assert_eq!((named_now.len(), left_out), (MAX_NAMED, 3));
    }
}
