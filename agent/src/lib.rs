//! meridian's pull-mode agent (DESIGN §12): members the hub cannot reach, or holds no
//! credential for, join with a bootstrap token and speak for themselves over mutual TLS.
//!
//! ```text
//!  agent (member)                                   hub (leader)
//!   ca::key_and_request(cluster) ── CSR + token ──►  core::agent::Tokens::admit
//!                                                    AgentCa::sign: CN=meridian:agent:<cluster>,
//!                                                      client auth, the configured lifetime
//!   ◄──────────────── certificate + CA ─────────────
//!   renews at core::agent::renew_at (20–25 % left)
//! ```
//!
//! Built so far: the agent CA ([`ca`]) and joining ([`join`], over the `Join` call of
//! [`proto`]) on the pure rules in `meridian_core::agent`. The stream
//! (objects up, desired objects down), the hub-side source and the `meridian agent` loop come
//! next (ARCHITECTURE.md, "Agent").

pub mod ca;
pub mod events;
pub mod join;
pub mod proto;

pub use ca::{AgentCa, CaError, Issued, key_and_request};
pub use join::{JoinError, Joined, Joins, SpentTokens, join};
