//! meridian-listen: TCP listeners that a hostile client cannot starve.
//!
//! ```text
//!  TcpListener ─► Listener::accept ─┬─ EMFILE/ENFILE/ENOBUFS: count, warn (rate-limited),
//!                                   │   back off 100 ms, keep the listener; /readyz and
//!                                   │   meridian_listener_accepting tell while it lasts
//!                                   ├─ over max_connections: accepted and closed at once
//!                                   │   (counted), so the backlog cannot pile up either
//!                                   └─► Conn: holds its permit; closed when it sends too
//!                                       little at first (handshake) or nothing for long (idle)
//! ```
//!
//! The bounds come from the descriptor limit (`limits`): every listener together stays below
//! the soft RLIMIT_NOFILE minus a reserve, so meridian never runs out of descriptors for its
//! own member connections and files because of the clients of its listeners.
//!
//! The decisions (what a failing accept means, which deadline applies, how the limit is split)
//! are plain functions with plain `#[test]`s; the async parts only move sockets.

pub mod accept;
pub mod conn;
pub mod limits;
pub mod metrics;

pub use accept::{Health, Listener, ListenerSettings, Stuck};
pub use conn::Conn;
pub use limits::{Bounds, DescriptorLimit, LimitError, Requested};
pub use metrics::ListenerMetrics;
