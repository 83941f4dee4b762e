//! meridian-dns: the authoritative DNS server for the fleet (DESIGN §4).
//!
//! ```text
//!   Snapshot (watch) ──► Answerer::respond(request, client) ──► Response
//!                               ▲                                  │
//!          names::parse(qname) ─┘                   wire::encode ──┤──► UDP hot path (+ moka cache)
//!                                                    hickory-server ┘──► TCP
//! ```
//!
//! `dns` never sees a Kubernetes type: it reads `meridian_core::Snapshot` and asks
//! `meridian_core::select` where traffic goes.

pub mod answer;
pub mod config;
pub mod explain;
pub mod metrics;
mod names;
pub mod server;
pub mod wire;

pub use answer::{Answerer, Client, Response, Transport};
pub use config::{DnsConfig, Style, ZoneConfig, ZoneError};
pub use server::{Dns, Listeners, serve};
