//! The meridian binary's library: CLI, config, wiring and the admin server. Everything that
//! decides anything lives in the crates below; this is only wiring, kept as a library so the
//! integration tests can start the whole app in-process (`App::start`).
//!
//! ```text
//!  config + flags ─► App::start ─► sources ─► Store (feeds core's Fleet) ─► Snapshot watch
//!                                                                       ├─► DNS listeners
//!                                                                       └─► admin HTTP
//! ```

pub mod admin;
pub mod app;
pub mod cli;
pub mod commands;
pub mod config;
pub mod explain;
pub mod store;
