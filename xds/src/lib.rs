//! meridian-xds: the fleet as an xDS feed — ADS state-of-the-world and delta for
//! CDS, EDS, LDS and RDS, and CSDS.
//!
//! ```text
//!  Snapshot (watch) ─► debounce ─► resources::build_from(snapshot, node group, previous build)
//!                                          │ Resources: encoded Any + content-hash versions
//!                                          │ (moka: one per canonical group and snapshot version)
//!                         request ─► stream::{SotwStream, DeltaStream} ─► responses
//!                                          ▲ pure state machines, no I/O
//!                              server: tonic ADS + CSDS services move messages only
//! ```
//!
//! `xds` never sees a Kubernetes type: it reads `meridian_core::Snapshot` and asks
//! `meridian_core::select_for` where traffic goes and what each cluster resolves to for the
//! node (endpoints or gateway), the same decision DNS reads; it only encodes that result.

pub mod certificate;
pub mod csds;
pub mod describe;
pub mod extra;
pub mod metrics;
pub mod node;
pub mod resources;
pub mod server;
pub mod stream;

pub use node::{Group, NodeInfo, Role};
pub use resources::{Kind, Resources};
pub use server::{TlsFiles, Xds, XdsConfig, XdsError};
pub use stream::{DeltaStream, SotwStream, StreamStatus};
