//! A member's capacity for placement: its Nodes' allocatable, minus the requests of the pods
//! bound to them (DESIGN §9, "divide by available capacity"). Read from Node and Pod
//! manifests in a directory member. Pod requests are counted as the scheduler counts them,
//! by the same function that sizes a template's replicas (meridian-federation).

use k8s_openapi::api::core::v1::{Node, Pod};
use meridian_core::{Capacity, Resources};
use meridian_federation::template;

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
) -> Option<Capacity> {
    let mut nodes = nodes.into_iter().peekable();
    nodes.peek()?;
    Some(Capacity {
        allocatable: nodes.fold(Resources::default(), Resources::saturating_add),
        requested: pods
            .into_iter()
            .fold(Resources::default(), Resources::saturating_add),
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
        assert_eq!(of([], []), None);
    }
}
