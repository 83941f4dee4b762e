//! The meridian binary's library: CLI, config, wiring and the admin server. Everything that
//! decides anything lives in the crates below; this is only wiring, kept as a library so the
//! integration tests can start the whole app in-process (`App::start`).
//!
//! ```text
//!  config file + flags (config, cli) ─► App::start (app)
//!
//!  hub: directory or Kubernetes API ────────┐ (a Kubernetes hub also runs leader election)
//!  members: directories, Kubernetes APIs ───┴─► SourceEvent (mpsc) ─► Store (store): feeds
//!                                                 core's Fleet, publishes its snapshots
//!                                                          │ publish
//!                                                          ▼
//!                                           tokio::sync::watch<Arc<Snapshot>>
//!        ┌──────────────┬────────────────────┬─────────────┴────────┬──────────────────┐
//!        ▼              ▼                    ▼                      ▼                  ▼
//!   DNS listeners   xDS: debounce,     write-back into the   MemberCluster status   admin HTTP
//!   (meridian-dns)  ADS, CSDS          Kubernetes members    (Kubernetes hub)       (admin,
//!                   (meridian-xds)     (leader only)         (leader only)          explain,
//!                                                                                 whatif, ui)
//! ```

pub mod admin;
pub mod app;
pub mod cli;
pub mod commands;
pub mod config;
pub mod diagnose;
pub mod explain;
pub mod out;
pub mod programs;
pub mod rollouts;
pub mod store;
pub mod telemetry;
pub mod whatif;
pub mod xds_watch;
