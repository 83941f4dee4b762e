//! meridian's pull-mode agent: members the hub cannot reach, or holds no
//! credential for, join with a bootstrap token and speak for themselves over mutual TLS.
//!
//! ```text
//!  agent (member)                                   hub (leader)
//!   join::Asking (key kept) ──── CSR + token ──►  core::agent::Tokens::admit
//!                                                    (agent.autoApprove: false: waits for
//!                                                     `meridian approve <cluster>`)
//!                                                    AgentCa::sign: CN=meridian:agent:<cluster>,
//!                                                      client auth, the configured lifetime
//!   ◄──────────────── certificate + CA ─────────────
//!   Connect (mTLS): watch events, heartbeats ──────►  controllers::agents (MemberState, health)
//!   api::carry (the agent's own credentials) ◄─────  requests for the member's API: the hub's
//!     answers, streamed ──────────────────────────►   client of the member (agents::Tunnel),
//!                                                    used by write-back, propagation, gateway
//!   renews at core::agent::renew_at (20–25 % left)
//! ```
//!
//! The parts: the agent CA ([`ca`]), joining ([`join`]), a member's watch events on the
//! wire ([`events`]) and the member's API carried for the hub ([`api`]), the protocol ([`proto`]),
//! the hub's state ([`store`]: the CA and the tokens), the hub's side of a stream ([`stream`])
//! and its listener ([`hub`]), the member's side ([`member`], `meridian agent`: one set of
//! watches of the member ([`watch_set`]) fanned out to a stream per hub replica
//! ([`fanout`])) and both sides' metrics ([`metrics`]). What the hub does with what agents send is
//! `meridian_controllers::agents`: the same MemberState and store events as push members.

pub mod api;
pub mod ca;
pub mod events;
pub mod fanout;
pub mod hub;
pub mod join;
pub mod member;
pub mod metrics;
pub mod proto;
pub mod state;
pub mod store;
pub mod stream;
#[cfg(test)]
mod test_hub;
#[cfg(test)]
mod test_member;
pub mod watch_set;

pub use ca::{AgentCa, CaError, Issued, key_and_request};
pub use hub::{HubError, HubSettings, PreparedHub, prepare};
pub use join::{Asking, JoinError, Joined, Joins, join};
pub use member::{AgentError, AgentSettings};
pub use metrics::AgentMetrics;
pub use state::AgentState;
pub use store::{HubStore, StoreError, TokenStore};
pub use stream::{HubService, Streams};
