//! A member's capacity for placement: its Nodes' allocatable, minus the requests of the pods
//! bound to them ("divide by available capacity"), and its ResourceQuotas' use per
//! namespace (the ResourceBalance score). Read from Node, Pod and ResourceQuota manifests in a
//! directory member, and from the same watches of a Kubernetes member. Pod requests are counted
//! as the scheduler counts them, by the same function that sizes a template's replicas
//! (meridian-federation).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use meridian_core::{Capacity, Quota, Resources, Workload};
use meridian_federation::template::TemplateError;
use meridian_federation::{describe, quantity, template};

/// Why a Node, Pod or ResourceQuota adds nothing to its member's capacity.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// A quantity at `field` that does not read.
    #[error("{field}: {}", describe(.source))]
    Quantity {
        field: String,
        #[source]
        source: quantity::QuantityError,
    },
    /// Requests or allocatable that do not read as a template's would.
    #[error("{}", describe(.0))]
    Amounts(#[source] TemplateError),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

/// What a ResourceQuota allows and what is used of it: `status.hard` and `status.used` (a
/// quota the API has not counted yet: `spec.hard`, none used). CPU and memory are its
/// `requests.cpu` (else `cpu`) and `requests.memory` (else `memory`).
pub fn quota(q: &ResourceQuota) -> Result<Quota, CapacityError> {
    let status = q.status.as_ref();
    let hard = status
        .and_then(|s| s.hard.as_ref())
        .or_else(|| q.spec.as_ref().and_then(|s| s.hard.as_ref()));
    let used = status.and_then(|s| s.used.as_ref());
    Ok(Quota {
        hard: quota_amounts("hard", hard)?,
        used: quota_amounts("used", used)?,
    })
}

fn quota_amounts(
    at: &str,
    map: Option<&BTreeMap<String, Quantity>>,
) -> Result<Resources, CapacityError> {
    let Some(map) = map else {
        return Ok(Resources::default());
    };
    let parse = |keys: [&'static str; 2], f: fn(&str) -> Result<u64, quantity::QuantityError>| {
        let Some((k, q)) = keys.into_iter().find_map(|k| Some((k, map.get(k)?))) else {
            return Ok(0);
        };
        f(&q.0).map_err(|source| CapacityError::Quantity {
            field: format!("{at}.{k}"),
            source,
        })
    };
    Ok(Resources {
        cpu_millis: parse(["requests.cpu", "cpu"], quantity::cpu_millis)?,
        memory_bytes: parse(["requests.memory", "memory"], quantity::whole)?,
        gpus: 0,
        pods: parse(["pods", "count/pods"], quantity::whole)?,
    })
}

/// Quotas by namespace, from `(namespace, quota)` pairs.
pub fn by_namespace<'q>(
    quotas: impl IntoIterator<Item = (&'q str, Quota)>,
) -> Arc<BTreeMap<String, Vec<Quota>>> {
    let mut out: BTreeMap<String, Vec<Quota>> = BTreeMap::new();
    for (namespace, q) in quotas {
        out.entry(namespace.to_owned()).or_default().push(q);
    }
    Arc::new(out)
}

/// What a Node adds to its cluster's allocatable (nothing when cordoned).
pub fn node(n: &Node) -> Result<Resources, CapacityError> {
    if schedulable(n) {
        node_allocatable(n)
    } else {
        Ok(Resources::default())
    }
}

/// What a Pod holds of its Node, and the workload it belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodUse {
    /// Nothing unless the pod is bound and unfinished.
    pub requests: Resources,
    /// Its controller ([`workload_of`]); None for a pod no workload controls.
    pub workload: Option<Workload>,
}

/// What a Pod holds of its Node (nothing unless bound and unfinished), and whose it is.
pub fn pod(p: &Pod) -> Result<PodUse, CapacityError> {
    if !occupies_a_node(p) {
        return Ok(PodUse::default());
    }
    Ok(PodUse {
        requests: pod_requests(p)?,
        workload: workload_of(p),
    })
}

/// The workload a pod belongs to: its controller (ownerReference with `controller: true`),
/// except that a ReplicaSet named `<deployment>-<pod-template-hash>` stands for its
/// Deployment — the object meridian places.
pub fn workload_of(p: &Pod) -> Option<Workload> {
    let owner = p
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    let hash = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"));
    let deployment = (owner.kind == "ReplicaSet")
        .then(|| hash.and_then(|h| owner.name.strip_suffix(h)?.strip_suffix('-')))
        .flatten();
    let (kind, name) = match deployment {
        Some(d) => ("Deployment", d),
        None => (owner.kind.as_str(), owner.name.as_str()),
    };
    Some(Workload {
        namespace: p.metadata.namespace.as_deref().unwrap_or("default").into(),
        kind: kind.into(),
        name: name.into(),
    })
}

/// The capacity of a cluster's Nodes and Pods ([`node`], [`pod`]); None without Nodes (the
/// capacity is then unknown, not zero).
pub fn of<'p>(
    nodes: impl IntoIterator<Item = Resources>,
    pods: impl IntoIterator<Item = &'p PodUse>,
    quotas: Arc<BTreeMap<String, Vec<Quota>>>,
) -> Option<Capacity> {
    let mut nodes = nodes.into_iter().peekable();
    nodes.peek()?;
    let mut requested = Resources::default();
    let mut workloads: BTreeMap<Workload, Resources> = BTreeMap::new();
    for pod in pods {
        requested = requested.saturating_add(pod.requests);
        if let Some(w) = pod
            .workload
            .as_ref()
            .filter(|_| pod.requests != Resources::default())
        {
            let held = workloads.entry(w.clone()).or_default();
            *held = held.saturating_add(pod.requests);
        }
    }
    Some(Capacity {
        allocatable: nodes.fold(Resources::default(), Resources::saturating_add),
        requested,
        workloads: Arc::new(workloads),
        quotas,
    })
}

/// A cordoned Node takes no new pods.
fn schedulable(n: &Node) -> bool {
    !n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Bound to a Node and not finished: its requests hold that Node's resources.
fn occupies_a_node(p: &Pod) -> bool {
    let bound = p.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    bound && !matches!(phase, Some("Succeeded" | "Failed"))
}

fn node_allocatable(n: &Node) -> Result<Resources, CapacityError> {
    let Some(allocatable) = n.status.as_ref().and_then(|s| s.allocatable.as_ref()) else {
        return Ok(Resources::default());
    };
    let value = serde_json::to_value(allocatable)?;
    let mut r = template::amounts("status.allocatable", &value).map_err(CapacityError::Amounts)?;
    r.pods = match allocatable.get("pods") {
        Some(q) => quantity::whole(&q.0).map_err(|source| CapacityError::Quantity {
            field: "status.allocatable.pods".into(),
            source,
        })?,
        None => 0,
    };
    Ok(r)
}

fn pod_requests(p: &Pod) -> Result<Resources, CapacityError> {
    let spec = serde_json::to_value(&p.spec)?;
    match spec {
        serde_json::Value::Object(spec) => {
            template::pod_requests("spec".into(), &spec).map_err(CapacityError::Amounts)
        }
        _ => Ok(Resources {
            pods: 1,
            ..Resources::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cpu: &str, memory: &str, pods: &str, cordoned: bool) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"unschedulable": cordoned},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods}}
        }))
        .unwrap()
    }

    fn pod(node: Option<&str>, phase: &str, cpu: &str, init_cpu: Option<&str>) -> Pod {
        let mut spec = serde_json::json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "100m"}}}
            ]
        });
        if let Some(n) = node {
            spec["nodeName"] = n.into();
        }
        if let Some(c) = init_cpu {
            spec["initContainers"] =
                serde_json::json!([{"name": "i", "resources": {"requests": {"cpu": c}}}]);
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": spec, "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn allocatable_minus_bound_running_pods() {
        let nodes = [
            node("4", "16Gi", "110", false),
            node("2", "8Gi", "110", false),
            node("64", "1Ti", "110", true),
        ];
        let pods = [
            pod(Some("n"), "Running", "500m", None),
            pod(Some("n"), "Succeeded", "8", None),
            pod(None, "Pending", "8", None),
            pod(Some("n"), "Pending", "250m", Some("2")),
        ];
        let pods: Vec<PodUse> = pods.iter().map(|p| super::pod(p).unwrap()).collect();
        let c = of(
            nodes.iter().map(|n| super::node(n).unwrap()),
            &pods,
            Arc::default(),
        )
        .unwrap();
        assert_eq!(
            c.allocatable.cpu_millis, 6000,
            "the cordoned node is left out"
        );
        assert_eq!(c.allocatable.memory_bytes, 24 << 30);
        assert_eq!(c.allocatable.pods, 220);
        // 500m + 100m (limit as request), and max(250m + 100m, 2) for the one with an init.
        assert_eq!(c.requested.cpu_millis, 600 + 2000);
        assert_eq!(c.requested.memory_bytes, 2 << 30);
        assert_eq!(c.requested.pods, 2);
        let per = Resources {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            gpus: 0,
            pods: 1,
        };
        assert_eq!(c.free_replicas(&per), 3, "3.4 cores free");
    }

    fn owned(mut p: Pod, kind: &str, name: &str, hash: Option<&str>) -> Pod {
        p.metadata.namespace = Some("shop".into());
        p.metadata.owner_references =
            Some(vec![serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u", "controller": true
        }))
        .unwrap()]);
        if let Some(h) = hash {
            p.metadata.labels = Some([("pod-template-hash".into(), h.into())].into());
        }
        p
    }

    #[test]
    fn pods_are_counted_per_workload_a_replica_set_standing_for_its_deployment() {
        let nodes = [node("8", "32Gi", "110", false)];
        let pods: Vec<PodUse> = [
            owned(
                pod(Some("n"), "Running", "500m", None),
                "ReplicaSet",
                "web-7f9c",
                Some("7f9c"),
            ),
            owned(
                pod(Some("n"), "Running", "500m", None),
                "ReplicaSet",
                "web-7f9c",
                Some("7f9c"),
            ),
            owned(
                pod(Some("n"), "Running", "1", None),
                "ReplicaSet",
                "bare",
                Some("x1"),
            ),
            owned(
                pod(Some("n"), "Running", "1", None),
                "StatefulSet",
                "db",
                None,
            ),
            owned(pod(Some("n"), "Succeeded", "1", None), "Job", "done", None),
            pod(Some("n"), "Running", "1", None),
        ]
        .iter()
        .map(|p| super::pod(p).unwrap())
        .collect();
        let c = of(
            nodes.iter().map(|n| super::node(n).unwrap()),
            &pods,
            Arc::default(),
        )
        .unwrap();
        let held = |kind: &str, name: &str| {
            c.held_by(&Workload {
                namespace: "shop".into(),
                kind: kind.into(),
                name: name.into(),
            })
            .cpu_millis
        };
        assert_eq!(held("Deployment", "web"), 1200, "two pods of 500m + 100m");
        assert_eq!(
            held("ReplicaSet", "bare"),
            1100,
            "a hash that is not its suffix"
        );
        assert_eq!(held("StatefulSet", "db"), 1100);
        assert_eq!(held("Job", "done"), 0, "a finished pod holds nothing");
        assert_eq!(c.workloads.len(), 3);
        assert_eq!(c.requested.cpu_millis, 1200 + 1100 * 3);
    }

    #[test]
    fn an_unreadable_quantity_is_named() {
        let bad = node("lots", "1Gi", "1", false);
        let e = super::node(&bad).unwrap_err().to_string();
        assert!(e.contains("status.allocatable.cpu"), "{e}");
    }

    #[test]
    fn no_nodes_is_unknown_capacity() {
        assert_eq!(of([], [], Arc::default()), None);
    }

    fn resource_quota(v: serde_json::Value) -> ResourceQuota {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_quota_counts_requests_else_the_plain_names_and_its_status_first() {
        let q = quota(&resource_quota(serde_json::json!({
            "metadata": {"name": "q", "namespace": "shop"},
            "spec": {"hard": {"cpu": "100"}},
            "status": {
                "hard": {"requests.cpu": "4", "cpu": "64", "memory": "8Gi", "pods": "10"},
                "used": {"requests.cpu": "1500m", "memory": "2Gi", "pods": "3"}
            }
        })))
        .unwrap();
        assert_eq!(
            (q.hard.cpu_millis, q.hard.memory_bytes, q.hard.pods),
            (4000, 8 << 30, 10)
        );
        assert_eq!(
            (q.used.cpu_millis, q.used.memory_bytes, q.used.pods),
            (1500, 2 << 30, 3)
        );
        // Not yet counted by the API: the spec, nothing used.
        let fresh = quota(&resource_quota(serde_json::json!({
            "metadata": {"name": "q"}, "spec": {"hard": {"requests.memory": "1Gi"}}
        })))
        .unwrap();
        assert_eq!(
            (fresh.hard.memory_bytes, fresh.used),
            (1 << 30, Resources::default())
        );
        let bad = quota(&resource_quota(serde_json::json!({
            "metadata": {"name": "q"}, "status": {"hard": {"cpu": "lots"}}
        })))
        .unwrap_err()
        .to_string();
        assert!(bad.contains("hard.cpu"), "{bad}");
    }
}
