//! meridian-controllers: the edge between Kubernetes-shaped input and meridian's model.
//!
//! ```text
//!  YAML on disk / kube API ──► crd + k8s-openapi types ──► convert (TryFrom-style, per object)
//!                                                            │ model types only
//!                                                            ▼
//!                                 SourceEvent (mpsc) ──► wiring feeds meridian_core::fleet::Fleet
//! ```
//!
//! Kubernetes types never cross this crate's boundary; bad input rejects only itself and is
//! reported with file, object and reason.

pub mod convert;
pub mod crd;
pub mod directory;
pub mod kubernetes;
pub mod manifest;
pub mod members;
pub mod policy;

pub use manifest::ManifestError;
/// What sources tell the wiring: the fleet's events, under the name the sources know them by.
pub use meridian_core::fleet::{Change, Event as SourceEvent};

/// An error with its sources as one line (`what: why: root cause`), for errors that become
/// data: a heartbeat's reason, a status condition's message.
pub fn reason_of(error: &(dyn std::error::Error + 'static)) -> String {
    let mut reason = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    reason
}
