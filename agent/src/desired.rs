//! The objects an agent member should hold, on the wire (`HubMessage.desired_json`): the hub's
//! write-back set for the member (`DesiredSet`: derived Services, ServiceImports, derived
//! EndpointSlices, ServiceExport conditions), which the agent writes with the member's own
//! applier (`LocalWriteback`), as the hub writes a push member.

use meridian_controllers::kubernetes::writeback::{
    Desired, DesiredSet, ExportConditions, WrittenKind,
};
use meridian_core::ObjectKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Why a desired set from the hub cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum DesiredError {
    #[error("the desired objects are not JSON of the expected form")]
    Json(#[from] serde_json::Error),
    #[error("{0:?} is not a kind the write-back writes")]
    Kind(String),
}

#[derive(Serialize, Deserialize)]
struct Wire {
    objects: Vec<WireObject>,
    conditions: Vec<WireConditions>,
}

#[derive(Serialize, Deserialize)]
struct WireObject {
    kind: String,
    namespace: String,
    name: String,
    service_namespace: String,
    service_name: String,
    body: Value,
}

#[derive(Serialize, Deserialize)]
struct WireConditions {
    namespace: String,
    name: String,
    valid: (bool, String, String),
    conflict: (bool, String, String),
}

pub fn encode(set: &DesiredSet) -> Vec<u8> {
    let wire = Wire {
        objects: set
            .desired
            .iter()
            .map(|d| WireObject {
                kind: d.kind.kind().to_string(),
                namespace: d.id.namespace.clone().unwrap_or_default(),
                name: d.id.name.clone(),
                service_namespace: d.service.namespace.to_string(),
                service_name: d.service.name.to_string(),
                body: d.body.clone(),
            })
            .collect(),
        conditions: set
            .conditions
            .iter()
            .map(|c| WireConditions {
                namespace: c.key.namespace.to_string(),
                name: c.key.name.to_string(),
                valid: c.valid.clone(),
                conflict: c.conflict.clone(),
            })
            .collect(),
    };
    // Plain structs of strings and JSON values always serialize.
    serde_json::to_vec(&wire).unwrap_or_default()
}

pub fn decode(generation: u64, json: &[u8]) -> Result<DesiredSet, DesiredError> {
    let wire: Wire = serde_json::from_slice(json)?;
    let desired = wire
        .objects
        .into_iter()
        .map(|o| {
            let kind = WrittenKind::ALL
                .into_iter()
                .find(|k| k.kind() == o.kind)
                .ok_or_else(|| DesiredError::Kind(o.kind.clone()))?;
            Ok(Desired {
                kind,
                id: kind.id(&o.namespace, &o.name),
                service: ObjectKey::new(&o.service_namespace, &o.service_name),
                body: o.body,
            })
        })
        .collect::<Result<Vec<_>, DesiredError>>()?;
    let conditions = wire
        .conditions
        .into_iter()
        .map(|c| ExportConditions {
            key: ObjectKey::new(&c.namespace, &c.name),
            valid: c.valid,
            conflict: c.conflict,
        })
        .collect();
    Ok(DesiredSet {
        generation,
        desired,
        conditions,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_set_comes_back_as_it_went_and_a_foreign_kind_is_refused() {
        let service = ObjectKey::new("shop", "cart");
        let set = DesiredSet {
            generation: 7,
            desired: vec![Desired {
                kind: WrittenKind::ServiceImport,
                id: WrittenKind::ServiceImport.id("shop", "cart"),
                service: service.clone(),
                body: json!({"spec": {"type": "ClusterSetIP"}}),
            }],
            conditions: vec![ExportConditions {
                key: service,
                valid: (true, "Exported".into(), String::new()),
                conflict: (false, "NoConflict".into(), String::new()),
            }],
        };
        assert_eq!(decode(7, &encode(&set)).unwrap(), set);
        let foreign = br#"{"objects": [{"kind": "Secret", "namespace": "shop", "name": "x", "service_namespace": "shop", "service_name": "x", "body": {}}], "conditions": []}"#;
        assert!(matches!(decode(1, foreign), Err(DesiredError::Kind(k)) if k == "Secret"));
        assert!(matches!(decode(1, b"[1, 2"), Err(DesiredError::Json(_))));
    }
}
