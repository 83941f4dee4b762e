//! The Kubernetes hub: MemberClusters, ClusterSchedulingPolicies, OverridePolicies, Tenants and
//! Gateway API routes (HTTPRoutes, GRPCRoutes, ReferenceGrants, when the hub serves their CRDs)
//! watched on the hub's API, and the resource templates of the kinds the policies select
//! ([`super::templates`]). Each relist is buffered until it is complete, so the member list
//! never shrinks for a moment; the store gets the whole hub again after every change (it is
//! small): `Members`, then `Templates`, as the directory hub sends them; and the member sources
//! are started and stopped to match.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use meridian_core::problem::Source;
use meridian_core::{ClusterId, Drain, ObjectKey, ObjectRef, Tenants};
use tracing::{debug, info, warn};

use super::connect::{WatchTimeout, hub_backoff};
use super::secrets::NamedSecrets;
use super::state::{Applied, Table};
use super::templates::{self, TemplateEvent, Templates};
use crate::SourceEvent;
use crate::crd::{ClusterSchedulingPolicy, MemberCluster, OverridePolicy, Tenant};
use crate::hub::{
    Hub, ReadFrom, Served, Summaries, add_grant, add_member, add_override, add_policy, add_route,
    add_tenant, check_overrides, keep_last_valid_policies,
};
use crate::members::{MemberTasks, Sources};
use crate::routes::{self, GRPCRoute, HTTPRoute, ReferenceGrant};

// One event at a time passes through the loop: its size is not worth a box per event.
#[allow(clippy::large_enum_variant)]
enum HubEvent {
    Member(Event<MemberCluster>),
    Policy(Event<ClusterSchedulingPolicy>),
    Override(Event<OverridePolicy>),
    Tenant(Event<Tenant>),
    HttpRoute(Event<HTTPRoute>),
    GrpcRoute(Event<GRPCRoute>),
    Grant(Event<ReferenceGrant>),
    /// A template kind's watch event.
    Template(TemplateEvent),
    /// Time to look up again the selected kinds that could not be resolved.
    Retry,
}

/// Which hub watch failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watched {
    Members,
    Policies,
    Overrides,
    Tenants,
    HttpRoutes,
    GrpcRoutes,
    Grants,
}

/// Watches the hub until the store goes away.
pub async fn run(client: Client, sources: Sources) {
    let tx = sources.tx.clone();
    let mut tasks = MemberTasks::new(sources);
    let config = watcher::Config::default().timeout(WatchTimeout::default().0);
    let members = watcher::watcher(Api::<MemberCluster>::all(client.clone()), config.clone())
        .backoff(hub_backoff())
        .map(|r| r.map(HubEvent::Member).map_err(|e| (Watched::Members, e)));
    let policies = watcher::watcher(
        Api::<ClusterSchedulingPolicy>::all(client.clone()),
        config.clone(),
    )
    .backoff(hub_backoff())
    .map(|r| r.map(HubEvent::Policy).map_err(|e| (Watched::Policies, e)));
    let overrides = watcher::watcher(Api::<OverridePolicy>::all(client.clone()), config.clone())
        .backoff(hub_backoff())
        .map(|r| {
            r.map(HubEvent::Override)
                .map_err(|e| (Watched::Overrides, e))
        });
    let tenants = watcher::watcher(Api::<Tenant>::all(client.clone()), config.clone())
        .backoff(hub_backoff())
        .map(|r| r.map(HubEvent::Tenant).map_err(|e| (Watched::Tenants, e)));
    let http_routes = watcher::watcher(Api::<HTTPRoute>::all(client.clone()), config.clone())
        .backoff(hub_backoff())
        .map(|r| {
            r.map(HubEvent::HttpRoute)
                .map_err(|e| (Watched::HttpRoutes, e))
        });
    let grpc_routes = watcher::watcher(Api::<GRPCRoute>::all(client.clone()), config.clone())
        .backoff(hub_backoff())
        .map(|r| {
            r.map(HubEvent::GrpcRoute)
                .map_err(|e| (Watched::GrpcRoutes, e))
        });
    let grants = watcher::watcher(Api::<ReferenceGrant>::all(client.clone()), config.clone())
        .backoff(hub_backoff())
        .map(|r| r.map(HubEvent::Grant).map_err(|e| (Watched::Grants, e)));
    let (template_tx, template_rx) = tokio::sync::mpsc::channel::<TemplateEvent>(1024);
    let template_events = futures::stream::unfold(template_rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok(HubEvent::Template(e)), rx))
    });
    let retries = futures::stream::unfold((), |()| async {
        tokio::time::sleep(templates::RETRY).await;
        Some((Ok(HubEvent::Retry), ()))
    });
    let mut secrets = NamedSecrets::new(client.clone());
    let mut templates = Templates::new(client, config, template_tx);
    let mut events = futures::stream::select_all([
        members.boxed(),
        policies.boxed(),
        overrides.boxed(),
        tenants.boxed(),
        http_routes.boxed(),
        grpc_routes.boxed(),
        grants.boxed(),
        template_events.boxed(),
        retries.boxed(),
    ]);
    let mut member_list = Table::<Stored<MemberCluster>>::default();
    let mut policy_list = Table::<Stored<ClusterSchedulingPolicy>>::default();
    let mut override_list = Table::<Stored<OverridePolicy>>::default();
    let mut tenant_list = Table::<Stored<Tenant>>::default();
    // OverridePolicies the hub will not list (an older CRD set or RBAC): the hub serves
    // without them rather than not at all.
    let mut overrides_unavailable = false;
    // Likewise Tenants: without the kind there are none (nobody is bounded by one).
    let mut tenants_unavailable = false;
    // The Gateway API kinds are optional too: a hub without their CRDs has no routes.
    let mut routes = RouteLists::default();
    let mut served = Served::default();
    let mut summaries = Summaries::default();
    let mut failing = false;
    // Relative kubeconfig paths in MemberClusters resolve against the working directory.
    let base = std::env::current_dir().unwrap_or_default();
    while let Some(first) = events.next().await {
        let mut changed = false;
        let mut next = Some(first);
        while let Some(item) = next {
            match item {
                Ok(HubEvent::Member(e)) => {
                    changed |= changes(member_list.apply(e, |m| &m.metadata, Stored::of));
                }
                Ok(HubEvent::Policy(e)) => {
                    changed |= changes(policy_list.apply(e, |p| &p.metadata, Stored::of));
                }
                Ok(HubEvent::Override(e)) => {
                    changed |= changes(override_list.apply(e, |p| &p.metadata, Stored::of));
                }
                Ok(HubEvent::Tenant(e)) => {
                    changed |= changes(tenant_list.apply(e, |t| &t.metadata, Stored::of));
                }
                Ok(HubEvent::HttpRoute(e)) => {
                    changed |= changes(routes.http.apply(e, |r| &r.metadata, Stored::of));
                }
                Ok(HubEvent::GrpcRoute(e)) => {
                    changed |= changes(routes.grpc.apply(e, |r| &r.metadata, Stored::of));
                }
                Ok(HubEvent::Grant(e)) => {
                    changed |= changes(routes.grants.apply(e, |g| &g.metadata, Stored::of));
                }
                Ok(HubEvent::Template(e)) => changed |= templates.apply(e),
                Ok(HubEvent::Retry) => {
                    if templates.retry_due() {
                        // Looked up again for the policies last served; sent only if it changed.
                        changed |= templates.reconcile(&served.policies).await;
                    }
                    changed |= secrets.refresh_if_due().await;
                }
                Err((which, e)) => {
                    if let Some(new) = routes.unavailable(which, &e) {
                        changed |= new;
                    } else if which == Watched::Overrides && !override_list.listed {
                        if !overrides_unavailable {
                            warn!(error = %e, "cannot list OverridePolicies on the hub; serving without them");
                            changed = true;
                        }
                        overrides_unavailable = true;
                    } else if which == Watched::Tenants && !tenant_list.listed {
                        if !tenants_unavailable {
                            warn!(error = %e, "cannot list Tenants on the hub; serving without them");
                            changed = true;
                        }
                        tenants_unavailable = true;
                    } else {
                        if !failing {
                            warn!(error = %e, ?which, "hub watch failing; serving the last known hub");
                        }
                        failing = true;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            next = events.next().now_or_never().flatten();
        }
        let overrides_in = override_list.listed || overrides_unavailable;
        let tenants_in = tenant_list.listed || tenants_unavailable;
        if !changed
            || !member_list.listed
            || !policy_list.listed
            || !overrides_in
            || !tenants_in
            || !routes.listed()
        {
            continue;
        }
        if failing {
            info!("hub watch recovered");
            failing = false;
        }
        let mut hub = read(
            &member_list.live,
            &policy_list.live,
            &override_list.live,
            &tenant_list.live,
            &base,
        );
        routes.read_into(&mut hub);
        let hub = keep_last_valid_policies(hub, &mut served);
        // The kinds the served policies select are watched; a kind just started adds its
        // templates once listed (another round).
        templates.reconcile(&hub.policies).await;
        // Summarizing every template (and trying every override on it) is CPU work: the
        // blocking pool does it, as the directory hub's read.
        let served_templates = templates.snapshot();
        let started = std::time::Instant::now();
        let mut summarized = std::mem::take(&mut summaries);
        let built = tokio::task::spawn_blocking(move || {
            let mut hub = hub;
            templates::add_templates(&mut hub, served_templates, &mut summarized);
            check_overrides(&mut hub);
            (hub, summarized)
        })
        .await;
        let mut hub = match built {
            Ok((hub, summarized)) => {
                summaries = summarized;
                hub
            }
            Err(e) => {
                warn!(error = %e, "reading the hub's templates failed; keeping the last known hub");
                continue;
            }
        };
        debug!(
            templates = hub.templates.len(),
            elapsed = ?started.elapsed(),
            "hub read"
        );
        // The Secrets the templates name, read one by one (not watched), follow them too.
        secrets.sync(&hub).await;
        templates::add_each(&mut hub, secrets.templates(), &mut summaries);
        summaries.read_done();
        hub.warnings.extend(secrets.problems());
        let problems = templates.problems(&hub.policies);
        hub.errors.extend(problems);
        for e in &hub.errors {
            warn!(object = %e.subject, reason = %e.reason, "hub object rejected");
        }
        let Hub {
            members,
            policies,
            templates: placed,
            overrides,
            tenants,
            routes: served_routes,
            grants,
            errors,
            warnings,
            ..
        } = hub;
        let event = SourceEvent::Members {
            specs: members.iter().map(|m| m.spec.clone()).collect(),
            policies,
            problems: errors,
            warnings,
        };
        // The member list goes first, so the store knows a member before its objects arrive.
        let templates_event = SourceEvent::Templates {
            templates: placed,
            overrides,
        };
        let drained = SourceEvent::Drained(drained_by_rollouts(&policy_list.live));
        if tx.send(event).await.is_err()
            || tx.send(drained).await.is_err()
            || tx.send(templates_event).await.is_err()
            || tx
                .send(SourceEvent::Tenants(Tenants::listed(tenants)))
                .await
                .is_err()
            || tx
                .send(SourceEvent::Routes {
                    routes: served_routes,
                    grants,
                })
                .await
                .is_err()
        {
            return;
        }
        tasks.reconcile(&members);
    }
}

/// A hub object as the hub served it; equal when the API says it is the same version.
#[derive(Clone, Debug)]
struct Stored<K>(K);

impl<K: Clone> Stored<K> {
    fn of(k: &K) -> Result<Self, Infallible> {
        Ok(Self(k.clone()))
    }
}

impl<K: kube::Resource> PartialEq for Stored<K> {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.0.meta(), other.0.meta());
        a.uid == b.uid && a.resource_version == b.resource_version
    }
}

fn changes<T>(applied: Applied<T>) -> bool {
    !matches!(applied, Applied::Nothing)
}

/// Per policy, the clusters its status says a staged rollout holds out of its traffic.
fn drained_by_rollouts(
    policies: &BTreeMap<ObjectKey, Stored<ClusterSchedulingPolicy>>,
) -> BTreeMap<ObjectKey, Drain> {
    policies
        .iter()
        .filter_map(|(key, Stored(p))| {
            let rollout = p.status.as_ref()?.rollout.as_ref()?;
            let drain = Drain {
                drained: rollout.drained.iter().map(ClusterId::new).collect(),
                ramping: rollout
                    .ramping
                    .iter()
                    .map(|(c, p)| (ClusterId::new(c), *p))
                    .collect(),
            };
            (!drain.drained.is_empty() || !drain.ramping.is_empty()).then(|| (key.clone(), drain))
        })
        .collect()
}

/// The hub's Gateway API routes and grants as watched, each kind optional: a hub that does
/// not serve its CRD (or lets meridian list it) has none of it.
#[derive(Default)]
struct RouteLists {
    http: Table<Stored<HTTPRoute>>,
    grpc: Table<Stored<GRPCRoute>>,
    grants: Table<Stored<ReferenceGrant>>,
    /// The kinds meridian could not list before they were ever listed.
    unavailable: BTreeSet<&'static str>,
}

impl RouteLists {
    /// Takes a failing watch of a route kind never listed as "the hub has none" (saying so
    /// once): Some(true) the first time, Some(false) after. None for any other failure
    /// (another kind, or a route kind listed before: the hub's failure, as for any kind).
    fn unavailable(&mut self, which: Watched, error: &watcher::Error) -> Option<bool> {
        let (kind, listed) = match which {
            Watched::HttpRoutes => ("HTTPRoute", self.http.listed),
            Watched::GrpcRoutes => ("GRPCRoute", self.grpc.listed),
            Watched::Grants => ("ReferenceGrant", self.grants.listed),
            _ => return None,
        };
        if listed {
            return None;
        }
        let new = self.unavailable.insert(kind);
        if new {
            info!(kind, error = %error, "cannot list this Gateway API kind on the hub (no CRD, or no permission); serving without it");
        }
        Some(new)
    }

    /// Every kind listed, or known unavailable.
    fn listed(&self) -> bool {
        (self.http.listed || self.unavailable.contains("HTTPRoute"))
            && (self.grpc.listed || self.unavailable.contains("GRPCRoute"))
            && (self.grants.listed || self.unavailable.contains("ReferenceGrant"))
    }

    fn read_into(&self, hub: &mut Hub) {
        for Stored(r) in self.http.live.values() {
            let object = ObjectRef::namespaced("HTTPRoute", &key_of(&r.metadata));
            add_route(
                hub,
                &ReadFrom::Api,
                object,
                routes::http_route(r, Source::Api),
            );
        }
        for Stored(r) in self.grpc.live.values() {
            let object = ObjectRef::namespaced("GRPCRoute", &key_of(&r.metadata));
            add_route(
                hub,
                &ReadFrom::Api,
                object,
                routes::grpc_route(r, Source::Api),
            );
        }
        for Stored(g) in self.grants.live.values() {
            add_grant(hub, &ReadFrom::Api, g);
        }
    }
}

fn key_of(meta: &ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or("?"),
    )
}

fn read(
    members: &BTreeMap<ObjectKey, Stored<MemberCluster>>,
    policies: &BTreeMap<ObjectKey, Stored<ClusterSchedulingPolicy>>,
    overrides: &BTreeMap<ObjectKey, Stored<OverridePolicy>>,
    tenants: &BTreeMap<ObjectKey, Stored<Tenant>>,
    base: &Path,
) -> Hub {
    let mut hub = Hub::default();
    for Stored(mc) in members.values() {
        add_member(&mut hub, base, &ReadFrom::Api, mc);
    }
    for Stored(csp) in policies.values() {
        add_policy(&mut hub, &ReadFrom::Api, csp);
    }
    for Stored(op) in overrides.values() {
        add_override(&mut hub, &ReadFrom::Api, op);
    }
    for Stored(t) in tenants.values() {
        add_tenant(&mut hub, &ReadFrom::Api, t);
    }
    hub
}

#[cfg(test)]
mod tests;
