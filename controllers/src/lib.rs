//! meridian-controllers: the edge between Kubernetes and meridian's model, in both directions.
//!
//! ```text
//!  in:  hub dir / hub API ──► directory::run_hub | kubernetes::hub::run ──► SourceEvent::Members
//!                                 └─ members::MemberTasks: one source task per member
//!       member dir ──► directory::run_member ──┐  crd + k8s-openapi types ──► convert::*
//!       member API ──► kubernetes::member::run ┘  (per object; model types only from here on;
//!                                                   names and addresses checked by validate::*)
//!                                                   ──► SourceEvent (mpsc) ──► the one writer
//!                                                       (meridian_core::fleet::Fleet)
//!  out: Snapshot (watch) ──► kubernetes::status::run     MemberCluster status on the hub
//!                        ──► kubernetes::writeback::run  ServiceExport conditions, ServiceImports,
//!                                                        derived Services and EndpointSlices,
//!                                                        every write through kubernetes::apply
//!       both only while kubernetes::leader says this replica leads
//! ```
//!
//! Kubernetes object types never leave this crate: sources hand model types to the writer,
//! and the writers read Snapshots. Bad input rejects only itself and is reported with file,
//! object and reason.

pub mod agents;
pub mod capacity;
pub mod convert;
pub mod crd;
pub mod directory;
pub mod geo;
pub mod https;
pub mod hub;
pub mod kubernetes;
pub mod manifest;
pub mod members;
pub mod metrics;
pub mod overrides;
pub mod policy;
pub mod render;
pub mod routes;
pub mod scoring;
pub mod tenants;
pub mod validate;

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

/// Whether an error comes from meridian's own process running out of file descriptors
/// (EMFILE, or the system's ENFILE) rather than from what it talked to: a member is never
/// held responsible for it (its heartbeat is not failed), and the reason says so.
pub fn out_of_descriptors(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The reason given when meridian itself is out of descriptors.
pub const OUT_OF_DESCRIPTORS: &str = "meridian is out of file descriptors (not the member's fault: raise meridian's limit, or lower its listeners' connection bounds)";

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connecting failed")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn descriptor_exhaustion_is_found_anywhere_in_the_chain() {
        let emfile = Wrapped(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert!(out_of_descriptors(&emfile));
        let refused = Wrapped(std::io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert!(!out_of_descriptors(&refused));
        assert!(out_of_descriptors(&std::io::Error::from_raw_os_error(
            libc::ENFILE
        )));
    }
}
