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
//! Built so far, on the pure rules in `meridian_core::agent`: the agent CA ([`ca`]), joining
//! ([`join`], the `Join` call of [`proto`]), a member's watch events on the wire ([`events`])
//! and the hub's side of an agent's stream ([`stream`], `Connect` over mutual TLS). The
//! hub-side member source, desired objects down and the `meridian agent` loop come next
//! (ARCHITECTURE.md, "Where the coming parts go").

pub mod ca;
pub mod events;
pub mod join;
pub mod proto;
pub mod stream;
#[cfg(test)]
mod test_hub;

pub use ca::{AgentCa, CaError, Issued, key_and_request};
pub use join::{JoinError, Joined, Joins, SpentTokens, join};
pub use stream::{Hub, Inbound, Streams};
