//! meridian-federation: resource templates as JSON values (DESIGN §9). Pure and synchronous.
//!
//! ```text
//!  hub object (JSON) ──template::summarize──► core::placement::Template (replicas, requests,
//!                                             dependencies; the JSON rides along)
//!  core::placement::Decision + Template + OverridePolicies
//!        ──render::manifest──► per-cluster object: replica field set, overrides applied
//!                              (overrides::apply), meridian's label and annotations
//!        ──render::path──► <cluster>/<namespace>/<Kind>.<name>.yaml
//! ```

pub mod overrides;
pub mod quantity;
pub mod render;
pub mod template;
