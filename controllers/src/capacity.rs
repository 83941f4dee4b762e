//! A member's capacity for placement: its Nodes' allocatable, minus the requests of the pods
//! bound to them (DESIGN §9, "divide by available capacity"). Read from Node and Pod
//! manifests in a directory member, and from the Node watch of a Kubernetes member.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use meridian_core::{Capacity, Resources};

use crate::kubernetes::state::parse_milli;

/// The fleet's capacity summary of `nodes` and `pods`; None when there are no Nodes (the
/// cluster's capacity is then unknown, not zero).
pub fn of(nodes: &[&Node], pods: &[&Pod]) -> Option<Capacity> {
    if nodes.is_empty() {
        return None;
    }
    let allocatable = nodes
        .iter()
        .filter(|n| schedulable(n))
        .map(|n| resources(n.status.as_ref().and_then(|s| s.allocatable.as_ref()), None))
        .fold(Resources::default(), Resources::saturating_add);
    let requested = pods
        .iter()
        .filter(|p| occupies_a_node(p))
        .map(|p| pod_requests(p))
        .fold(Resources::default(), Resources::saturating_add);
    Some(Capacity {
        allocatable,
        requested,
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

/// What a pod requests, as the scheduler counts it: the larger of its containers' sum and
/// its largest init container, one pod.
pub fn pod_requests(p: &Pod) -> Resources {
    let Some(spec) = &p.spec else {
        return Resources {
            pods: 1,
            ..Resources::default()
        };
    };
    let sum = spec
        .containers
        .iter()
        .map(container_requests)
        .fold(Resources::default(), Resources::saturating_add);
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(container_requests)
        .fold(Resources::default(), max_of);
    Resources {
        pods: 1,
        ..max_of(sum, init)
    }
}

fn container_requests(c: &Container) -> Resources {
    let r = c.resources.as_ref();
    resources(
        r.and_then(|r| r.requests.as_ref()),
        r.and_then(|r| r.limits.as_ref()),
    )
}

/// cpu, memory, `nvidia.com/gpu` and pods of a resource list; a resource missing from
/// `primary` is taken from `fallback` (requests default to limits).
fn resources(
    primary: Option<&BTreeMap<String, Quantity>>,
    fallback: Option<&BTreeMap<String, Quantity>>,
) -> Resources {
    let milli = |name: &str| {
        primary
            .and_then(|m| m.get(name))
            .or_else(|| fallback.and_then(|m| m.get(name)))
            .and_then(|q| parse_milli(&q.0))
            .map_or(0, |v| u64::try_from(v.max(0)).unwrap_or(u64::MAX))
    };
    let whole = |name: &str| milli(name).div_ceil(1000);
    Resources {
        cpu_millis: milli("cpu"),
        memory_bytes: whole("memory"),
        gpus: whole("nvidia.com/gpu"),
        pods: whole("pods"),
    }
}

fn max_of(a: Resources, b: Resources) -> Resources {
    Resources {
        cpu_millis: a.cpu_millis.max(b.cpu_millis),
        memory_bytes: a.memory_bytes.max(b.memory_bytes),
        gpus: a.gpus.max(b.gpus),
        pods: a.pods.max(b.pods),
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
            &nodes.iter().collect::<Vec<_>>(),
            &pods.iter().collect::<Vec<_>>(),
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
    fn no_nodes_is_unknown_capacity() {
        assert_eq!(of(&[], &[]), None);
    }
}
