//! What a member's watches of placed copies (and of its HPAs) hold: each object as its JSON
//! text, parsed again only when a pass reads it.
//!
//! kube's reflector keeps each object as a parsed tree — a `serde_json::Value` of maps and
//! strings costs about eight times the object's text (~21 KB a Deployment copy against
//! ~2.5 KB), and at 1,000 members × 127 copies that was the largest part of meridian's
//! memory. A pass reads a copy only when its template is looked at, and what it reads of
//! every copy (the resourceVersion, the template it was placed from) is read out once here.
//!
//! ```text
//!  watcher events ─► CopyStore::apply ─► Init: a new list starts (buffered)
//!                                        InitApply: into the buffer
//!                                        InitDone: the buffer becomes the store
//!                                        Apply / Delete: into / out of the store
//!  a pass ─► get(namespace, name) ─► Arc<LiveCopy> ─► json() when it reads the object
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use kube::api::DynamicObject;
use kube::runtime::watcher;
use parking_lot::RwLock;
use serde_json::Value;

use meridian_federation::render;

/// A namespace (None: cluster-scoped) and a name.
type Key = (Option<String>, String);

/// One object as the watch last showed it.
#[derive(Debug)]
pub(crate) struct LiveCopy {
    pub resource_version: Option<String>,
    /// The template it says it was placed from (`meridian.io/template`).
    pub template: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    /// The object (metadata included) as JSON text.
    text: Box<str>,
}

impl LiveCopy {
    pub(crate) fn of(o: &DynamicObject) -> Self {
        let text = serde_json::to_string(o).unwrap_or_else(|_| "null".into());
        Self {
            resource_version: o.metadata.resource_version.clone(),
            template: o
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(render::TEMPLATE_ANNOTATION))
                .cloned(),
            namespace: o.metadata.namespace.clone(),
            name: o.metadata.name.clone().unwrap_or_default(),
            text: text.into_boxed_str(),
        }
    }

    /// The object as JSON, metadata included.
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
}

/// The objects of one watch, by namespace and name; shared between the watch's task (which
/// writes) and the passes (which read).
#[derive(Clone, Default)]
pub(crate) struct CopyStore {
    inner: Arc<RwLock<Inner>>,
}

#[derive(Default)]
struct Inner {
    objects: HashMap<Key, Arc<LiveCopy>>,
    /// A relist under way: what it has brought so far, replacing `objects` when it is done.
    listing: Option<HashMap<Key, Arc<LiveCopy>>>,
}

impl CopyStore {
    /// Takes in one watch event; returns the copy it named, if it named one.
    pub(crate) fn apply(&self, event: &watcher::Event<DynamicObject>) -> Option<Arc<LiveCopy>> {
        let mut inner = self.inner.write();
        match event {
            watcher::Event::Init => {
                inner.listing = Some(HashMap::new());
                None
            }
            watcher::Event::InitApply(o) => {
                let copy = Arc::new(LiveCopy::of(o));
                inner
                    .listing
                    .get_or_insert_with(HashMap::new)
                    .insert(key_of(&copy), copy.clone());
                Some(copy)
            }
            watcher::Event::InitDone => {
                if let Some(listed) = inner.listing.take() {
                    inner.objects = listed;
                }
                None
            }
            watcher::Event::Apply(o) => {
                let copy = Arc::new(LiveCopy::of(o));
                inner.objects.insert(key_of(&copy), copy.clone());
                Some(copy)
            }
            watcher::Event::Delete(o) => {
                let copy = Arc::new(LiveCopy::of(o));
                inner.objects.remove(&key_of(&copy));
                Some(copy)
            }
        }
    }

    pub(crate) fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<LiveCopy>> {
        self.inner
            .read()
            .objects
            .get(&(namespace.map(str::to_string), name.to_string()))
            .cloned()
    }

    /// Every object held.
    pub(crate) fn state(&self) -> Vec<Arc<LiveCopy>> {
        self.inner.read().objects.values().cloned().collect()
    }
}

fn key_of(copy: &LiveCopy) -> Key {
    (copy.namespace.clone(), copy.name.clone())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(name: &str, rv: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": name,
                "namespace": "shop",
                "resourceVersion": rv,
                "annotations": {render::TEMPLATE_ANNOTATION: format!("apps/v1/Deployment/shop/{name}")},
            },
            "spec": {"replicas": 3},
            "status": {"readyReplicas": 2},
        }))
        .unwrap()
    }

    fn names(store: &CopyStore) -> Vec<String> {
        let mut v: Vec<String> = store.state().iter().map(|c| c.name.clone()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_copy_is_read_back_whole_with_its_metadata_read_out() {
        let store = CopyStore::default();
        let copy = store
            .apply(&watcher::Event::Apply(object("web", "7")))
            .unwrap();
        assert_eq!(copy.resource_version.as_deref(), Some("7"));
        assert_eq!(
            copy.template.as_deref(),
            Some("apps/v1/Deployment/shop/web")
        );
        let got = store.get(Some("shop"), "web").unwrap();
        let json = got.json();
        assert_eq!(json["spec"]["replicas"], 3);
        assert_eq!(json["status"]["readyReplicas"], 2);
        assert_eq!(json["metadata"]["name"], "web");
        assert_eq!(json["kind"], "Deployment");
        assert!(store.get(None, "web").is_none());
    }

    #[test]
    fn a_relist_replaces_what_was_held_only_when_it_is_done() {
        let store = CopyStore::default();
        store.apply(&watcher::Event::Apply(object("old", "1")));
        store.apply(&watcher::Event::Init);
        store.apply(&watcher::Event::InitApply(object("new", "2")));
        // Until the relist is done, the store still says what it held.
        assert_eq!(names(&store), ["old"]);
        store.apply(&watcher::Event::InitDone);
        assert_eq!(names(&store), ["new"]);
        store.apply(&watcher::Event::Delete(object("new", "3")));
        assert!(names(&store).is_empty());
    }
}
