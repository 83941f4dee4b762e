//! meridian-dns: the authoritative DNS server for the fleet.
//!
//! ```text
//!  UDP (dns.udpWorkers threads, recvmmsg/sendmmsg) ─► wire::hot_query: the cache key
//!      ├─ cache hit (cache.rs), still valid ─► cached bytes, ID and name case patched
//!      └─ miss, or not a plain query (ECS, …) ─► Request::from_bytes ─► Answerer::respond
//!                                               ─► wire::encode (TC past the size limit) ─► cache
//!  TCP ─► meridian_listen::Listener (bound, EMFILE backoff) ─► tcp::serve_conn (framing,
//!         pipelining, deadlines) ─► Request::from_bytes ─► Answerer::respond ─► wire::encode
//!
//!  Answerer::respond(Snapshot from the watch, request, source address):
//!      client cluster (ECS, else the source) ─► names::parse(qname) ─► meridian_core::select
//!      ─► Response (records, rcode; whether it may be cached, how many rotations it has)
//! ```
//!
//! `dns` never sees a Kubernetes type: it reads `meridian_core::Snapshot` and asks
//! `meridian_core::select` where traffic goes.

pub mod answer;
mod cache;
pub mod config;
pub mod explain;
pub mod metrics;
mod names;
pub mod server;
pub mod tcp;
pub mod wire;

pub use answer::{Answerer, Client, Response, Transport};
pub use config::{DnsConfig, Style, ZoneConfig, ZoneError};
pub use server::{Bound, Dns, Listeners, bind, serve};
