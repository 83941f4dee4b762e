//! A member's watch events on the wire: the agent encodes what its watches see, the hub
//! decodes them into the same [`MemberEvent`]s a push-mode member's watches give, so the
//! same `MemberState` buffers relists and converts objects for both.

use kube::Resource;
use kube::runtime::watcher::Event;
use meridian_controllers::kubernetes::state::MemberEvent;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::fanout::Item;
use crate::proto::{Phase, WatchEvent};

/// Why an event from an agent cannot be read (the stream is refused with it).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("no resource {0:?} is sent by agents")]
    Resource(String),
    #[error("unknown event phase {0}")]
    Phase(i32),
    #[error("a {resource} object that is not one")]
    Object {
        resource: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot encode a {resource} object")]
    Encode {
        resource: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// The wire form of `event`.
pub fn encode(event: &MemberEvent) -> Result<WatchEvent, DecodeError> {
    Ok(item(event)?.wire())
}

/// `event` as the agent keeps and sends it: encoded once, with the key it is kept by.
pub fn item(event: &MemberEvent) -> Result<Item, DecodeError> {
    let resource = event.resource();
    let (phase, object) = match event {
        MemberEvent::Service(e) => parts(e),
        MemberEvent::Slice(e) => parts(e),
        MemberEvent::Export(e) => parts(e),
        MemberEvent::Import(e) => parts(e),
        MemberEvent::Node(e) => parts(e),
        MemberEvent::Namespace(e) => parts(e),
        MemberEvent::Pod(e) => parts(e),
        MemberEvent::Quota(e) => parts(e),
    };
    let (key, object) = match object {
        Some((key, json)) => (
            key,
            json.map_err(|source| DecodeError::Encode { resource, source })?,
        ),
        None => (String::new(), Vec::new()),
    };
    Ok(Item {
        resource,
        phase,
        key,
        object: object.into(),
    })
}

/// `event` without its object's `managedFields`: the hub reads none of them, and they are
/// often the larger half of an object's bytes (the agent keeps every object it sends).
pub fn without_managed_fields(event: MemberEvent) -> MemberEvent {
    fn strip<K: Resource>(event: Event<K>) -> Event<K> {
        event.modify(|k| k.meta_mut().managed_fields = None)
    }
    match event {
        MemberEvent::Service(e) => MemberEvent::Service(strip(e)),
        MemberEvent::Slice(e) => MemberEvent::Slice(strip(e)),
        MemberEvent::Export(e) => MemberEvent::Export(strip(e)),
        MemberEvent::Import(e) => MemberEvent::Import(strip(e)),
        MemberEvent::Node(e) => MemberEvent::Node(strip(e)),
        MemberEvent::Namespace(e) => MemberEvent::Namespace(strip(e)),
        MemberEvent::Pod(e) => MemberEvent::Pod(strip(e)),
        MemberEvent::Quota(e) => MemberEvent::Quota(strip(e)),
    }
}

/// The event `wire` carries.
pub fn decode(wire: &WatchEvent) -> Result<MemberEvent, DecodeError> {
    let phase = Phase::try_from(wire.phase).map_err(|_| DecodeError::Phase(wire.phase))?;
    let event = match wire.resource.as_str() {
        "services" => MemberEvent::Service(event(phase, wire)?),
        "endpointslices" => MemberEvent::Slice(event(phase, wire)?),
        "serviceexports" => MemberEvent::Export(event(phase, wire)?),
        "serviceimports" => MemberEvent::Import(event(phase, wire)?),
        "nodes" => MemberEvent::Node(event(phase, wire)?),
        "namespaces" => MemberEvent::Namespace(event(phase, wire)?),
        "pods" => MemberEvent::Pod(event(phase, wire)?),
        "resourcequotas" => MemberEvent::Quota(event(phase, wire)?),
        other => return Err(DecodeError::Resource(other.to_string())),
    };
    Ok(event)
}

/// An object's key (`namespace/name`, or `name`) and its JSON.
type Encoded = Option<(String, Result<Vec<u8>, serde_json::Error>)>;

fn parts<K: Serialize + Resource>(event: &Event<K>) -> (Phase, Encoded) {
    let json = |k: &K| {
        let meta = k.meta();
        let name = meta.name.as_deref().unwrap_or_default();
        let key = match meta.namespace.as_deref() {
            Some(namespace) => format!("{namespace}/{name}"),
            None => name.to_string(),
        };
        Some((key, serde_json::to_vec(k)))
    };
    match event {
        Event::Apply(k) => (Phase::Apply, json(k)),
        Event::Delete(k) => (Phase::Delete, json(k)),
        Event::Init => (Phase::Init, None),
        Event::InitApply(k) => (Phase::InitApply, json(k)),
        Event::InitDone => (Phase::InitDone, None),
    }
}

fn event<K: DeserializeOwned>(phase: Phase, wire: &WatchEvent) -> Result<Event<K>, DecodeError> {
    let object = || {
        serde_json::from_slice::<K>(&wire.object_json).map_err(|source| DecodeError::Object {
            resource: wire.resource.clone(),
            source,
        })
    };
    Ok(match phase {
        Phase::Apply => Event::Apply(object()?),
        Phase::Delete => Event::Delete(object()?),
        Phase::Init => Event::Init,
        Phase::InitApply => Event::InitApply(object()?),
        Phase::InitDone => Event::InitDone,
    })
}

#[cfg(test)]
mod tests;
