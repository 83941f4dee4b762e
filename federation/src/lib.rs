//! meridian-federation: resource templates as JSON values. Pure and synchronous.
//!
//! ```text
//!  hub object (JSON) ──template::summarize──► core::placement::Template (replicas, requests,
//!                                             dependencies; the JSON rides along)
//!  core::placement::Decision + Template + OverridePolicies
//!        ──render::manifest──► per-cluster object: status and server fields dropped, replica
//!                              field set, overrides applied (overrides::apply_all),
//!                              meridian's label and annotations
//!        ──render::path──► <cluster>/<namespace>/<Kind>.<name>.yaml
//!        ──render::to_yaml──► one YAML document, keys sorted
//!  core::placement::Placements ──render::render_all──► every file, and every problem
//!
//!  for the propagation task, which applies objects to members and watches them there:
//!  apply body + member's live object ──retain::retain──► body without the member's fields
//!                                     (an HPA's spec.replicas), and a handover apply of those
//!                                     meridian still owns
//!  apply body + the apply's answer ──drift::admitted──► what the member admitted of the body
//!  that + member's live object ──drift::drifted──► pointers the member no longer holds
//!  live copies in the members ──status::aggregate──► the hub template's status (counters,
//!                                                    conditions, gated observedGeneration)
//!                             ──status::ready──► whether a copy may replace another
//! ```
//!
//! Helpers: [`quantity`] reads Kubernetes quantities, [`image`] image references.
//! Errors display their own message only; [`describe`] joins an error with its sources.

pub mod drift;
pub mod image;
pub mod overrides;
pub mod quantity;
pub mod render;
pub mod retain;
pub mod status;
pub mod template;

/// An error and its sources, joined by `": "` (the errors here never repeat their source in
/// their own message, so nothing is said twice).
pub fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        text.push_str(": ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    text
}
