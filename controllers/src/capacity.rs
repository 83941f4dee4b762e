//! A member's capacity for placement: its Nodes' allocatable, minus the requests of the pods
//! bound to them (DESIGN §9, "divide by available capacity"), and its ResourceQuotas' use per
//! namespace (the ResourceBalance score). Read from Node, Pod and ResourceQuota manifests in a
//! directory member, and from the same watches of a Kubernetes member. Pod requests are counted
//! as the scheduler counts them, by the same function that sizes a template's replicas
//! (meridian-federation).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use meridian_core::{Capacity, Quota, Resources};
use meridian_federation::{quantity, template};

/// What a ResourceQuota allows and what is used of it: `status.hard` and `status.used` (a
/// quota the API has not counted yet: `spec.hard`, none used). CPU and memory are its
/// `requests.cpu` (else `cpu`) and `requests.memory` (else `memory`).
pub fn quota(q: &ResourceQuota) -> Result<Quota, String> {
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

fn quota_amounts(at: &str, map: Option<&BTreeMap<String, Quantity>>) -> Result<Resources, String> {
    let Some(map) = map else {
        return Ok(Resources::default());
    };
    let parse = |keys: [&'static str; 2], f: fn(&str) -> Result<u64, quantity::QuantityError>| {
        let Some((k, q)) = keys.into_iter().find_map(|k| Some((k, map.get(k)?))) else {
            return Ok(0);
        };
        f(&q.0).map_err(|e| format!("{at}.{k}: {}", meridian_federation::describe(&e)))
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
pub fn node(n: &Node) -> Result<Resources, String> {
    if schedulable(n) {
        node_allocatable(n)
    } else {
        Ok(Resources::default())
    }
}

/// What a Pod holds of its Node (nothing unless bound and unfinished).
pub fn pod(p: &Pod) -> Result<Resources, String> {
    if occupies_a_node(p) {
        pod_requests(p)
    } else {
        Ok(Resources::default())
    }
}

/// The capacity of a cluster's Nodes and Pods ([`node`], [`pod`]); None without Nodes (the
/// capacity is then unknown, not zero).
pub fn of(
    nodes: impl IntoIterator<Item = Resources>,
    pods: impl IntoIterator<Item = Resources>,
    quotas: Arc<BTreeMap<String, Vec<Quota>>>,
) -> Option<Capacity> {
    let mut nodes = nodes.into_iter().peekable();
    nodes.peek()?;
    Some(Capacity {
        allocatable: nodes.fold(Resources::default(), Resources::saturating_add),
        requested: pods
            .into_iter()
            .fold(Resources::default(), Resources::saturating_add),
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

fn node_allocatable(n: &Node) -> Result<Resources, String> {
    let Some(allocatable) = n.status.as_ref().and_then(|s| s.allocatable.as_ref()) else {
        return Ok(Resources::default());
    };
    let value = serde_json::to_value(allocatable).map_err(|e| e.to_string())?;
    let mut r = template::amounts("status.allocatable", &value)
        .map_err(|e| meridian_federation::describe(&e))?;
    r.pods = match allocatable.get("pods") {
        Some(q) => meridian_federation::quantity::whole(&q.0).map_err(|e| {
            format!(
                "status.allocatable.pods: {}",
                meridian_federation::describe(&e)
            )
        })?,
        None => 0,
    };
    Ok(r)
}

fn pod_requests(p: &Pod) -> Result<Resources, String> {
    let spec = serde_json::to_value(&p.spec).map_err(|e| e.to_string())?;
    match spec {
        serde_json::Value::Object(spec) => template::pod_requests("spec".into(), &spec)
            .map_err(|e| meridian_federation::describe(&e)),
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
        let c = of(
            nodes.iter().map(|n| super::node(n).unwrap()),
            pods.iter().map(|p| super::pod(p).unwrap()),
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

    #[test]
    fn an_unreadable_quantity_is_named() {
        let bad = node("lots", "1Gi", "1", false);
        let e = super::node(&bad).unwrap_err();
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
        .unwrap_err();
        assert!(bad.contains("hard.cpu"), "{bad}");
    }
}
