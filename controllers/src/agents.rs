//! Agent members: members that speak for themselves over an agent's stream
//! instead of being watched by the hub. The hub holds no credential for them; what their
//! agent sends becomes the same `SourceEvent`s a push member's watches and `/readyz` give.
//!
//! ```text
//!  agent stream (meridian-agent) ── AgentRoutes::open(cluster) ── Inbound ──►
//!     run (one task per agent member, started by MemberTasks)
//!       AgentLink: MemberState (relists buffered) + which stream is current + heartbeats
//!         ──► Reset | Changes | Heartbeat | WatchHealth | Capacity ──► store
//! ```
//!
//! Only the newest stream of a cluster counts: an agent that reconnects before the hub saw
//! its old stream end is heard on the new one, and the old one's leftovers are dropped. A
//! stream that opens is a relist: the last known objects serve until the agent's full list is
//! in, then replace the member's slice in one step (as a push member's reconnect does).

use std::time::{Duration, Instant, SystemTime};

use meridian_core::{ClusterId, HealthTimings};
use tokio::sync::mpsc;

use crate::SourceEvent;
use crate::kubernetes::Facts;
use crate::kubernetes::connect::{Connected, Writer};
use crate::kubernetes::member::publish_facts;
use crate::kubernetes::state::MemberState;

pub use crate::kubernetes::tunnel::{
    AgentRoutes, AgentStream, ApiCall, Connection, Inbound, MAX_QUEUED_BYTES, NotAnAgentMember,
    Respond, ResponsePart, Tunnel, TunnelBody, TunnelError, Undeliverable,
};

/// How many waiting messages of one agent are folded into one batch for the store.
const BATCH: usize = 4096;
/// An agent is silent for this many heartbeats before the hub counts its heartbeat failed.
const SILENT_HEARTBEATS: u32 = 2;

/// What the hub knows of a member's agent (for `/debug/agents` and `meridian status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFacts {
    pub connected: bool,
    /// When the current stream opened, or the last one closed.
    pub since: SystemTime,
    pub peer: String,
    pub certificate_expires: Option<SystemTime>,
    pub last_heartbeat: Option<SystemTime>,
}

/// Runs one agent member until the task is aborted (the member left the hub or changed).
pub async fn run(
    cluster: ClusterId,
    timings: HealthTimings,
    routes: AgentRoutes,
    fleet: Facts,
    tx: mpsc::Sender<SourceEvent>,
) {
    let heartbeat = Duration::from_secs(timings.heartbeat_seconds.max(1));
    let mut registration = routes.register(&cluster, heartbeat);
    // The hub's client for the member is its agent's stream: writers and watches use it as
    // they use a push member's (a request while no agent is connected fails at once).
    let tunnel = Tunnel::new(routes.clone(), cluster.clone());
    fleet.update(&cluster, |f| {
        f.connect(Connected {
            client: tunnel.client(),
            writer: Writer::agent(tunnel),
        })
    });
    let mut link = AgentLink::new(cluster.clone(), heartbeat);
    let mut tick = tokio::time::interval(heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let events = tokio::select! {
            first = registration.rx.recv() => {
                let Some(first) = first else { return };
                let mut batch = vec![first];
                while batch.len() < BATCH {
                    match registration.rx.try_recv() {
                        Ok(item) => batch.push(item),
                        Err(_) => break,
                    }
                }
                let now = Instant::now();
                let mut events = Vec::new();
                for (stream, inbound) in batch {
                    events.extend(link.receive(stream, inbound, now));
                }
                events.extend(link.flush());
                publish_facts(&fleet, &cluster, &link.state);
                events
            }
            _ = tick.tick() => link.tick(Instant::now()),
        };
        let facts = link.facts();
        if fleet.get(&cluster, |f| f.agent != facts) {
            let last_heartbeat = facts.as_ref().and_then(|a| a.last_heartbeat);
            fleet.update(&cluster, |f| {
                f.agent = facts;
                f.last_heartbeat = last_heartbeat;
            });
        }
        for event in events {
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}

/// One agent member as the hub hears it: a pure state machine (no I/O, the clock passed in).
pub struct AgentLink {
    cluster: ClusterId,
    heartbeat: Duration,
    state: MemberState,
    /// The stream that counts, and when it opened.
    current: Option<(u64, Instant)>,
    connection: Option<Connection>,
    since: SystemTime,
    last_heartbeat: Option<(Instant, SystemTime)>,
    /// A stream opened and its full list is not in yet: its heartbeats are held back, so the
    /// member counts healthy again only with fresh objects.
    relisting: bool,
    /// The member's API as the last heartbeat said (None: no heartbeat on this stream yet).
    member_ready: Option<Result<(), String>>,
    /// The watch failure last reported to the store.
    watch_failure: Option<String>,
}

impl AgentLink {
    pub fn new(cluster: ClusterId, heartbeat: Duration) -> Self {
        Self {
            state: MemberState::new(cluster.clone()),
            cluster,
            heartbeat,
            current: None,
            connection: None,
            since: SystemTime::now(),
            last_heartbeat: None,
            relisting: true,
            member_ready: None,
            watch_failure: None,
        }
    }

    /// Takes what stream `stream` brought; returns what the store must hear at once.
    pub fn receive(&mut self, stream: u64, inbound: Inbound, now: Instant) -> Vec<SourceEvent> {
        if let Inbound::Opened(connection) = inbound {
            tracing::info!(cluster = %self.cluster, peer = %connection.peer, "agent stream opened: relisting");
            self.current = Some((stream, now));
            self.connection = Some(connection);
            self.since = SystemTime::now();
            self.state.relist_all();
            self.relisting = true;
            self.member_ready = None;
            return Vec::new();
        }
        if self.current.map(|(id, _)| id) != Some(stream) {
            // A stream that was replaced: whatever it still says is stale.
            return Vec::new();
        }
        match inbound {
            Inbound::Opened(_) => Vec::new(),
            Inbound::Event(event) => {
                self.state.apply(*event);
                Vec::new()
            }
            Inbound::Heartbeat {
                member_ready,
                error,
                watch_failure,
            } => {
                self.last_heartbeat = Some((now, SystemTime::now()));
                let ready = match member_ready {
                    true => Ok(()),
                    false => Err(format!("the agent cannot reach its member's API: {error}")),
                };
                self.member_ready = Some(ready.clone());
                let mut events = self.watch_health(watch_failure);
                if ready.is_err() || !self.relisting {
                    events.push(self.heartbeat_event(ready));
                }
                events
            }
            Inbound::Renewed {
                certificate_expires,
            } => {
                if let Some(connection) = &mut self.connection {
                    connection.certificate_expires = Some(certificate_expires);
                }
                Vec::new()
            }
            Inbound::Closed => {
                tracing::info!(cluster = %self.cluster, "agent stream closed");
                self.current = None;
                self.since = SystemTime::now();
                vec![self.heartbeat_event(Err("the agent's stream closed".into()))]
            }
        }
    }

    /// The batch for the store after a round of `receive`: the member's objects (one Reset
    /// once a relist is in, else the changes), then the heartbeat the relist held back.
    pub fn flush(&mut self) -> Vec<SourceEvent> {
        let Some(event) = self.state.take_event() else {
            return Vec::new();
        };
        let relisted = matches!(event, SourceEvent::Reset { .. });
        let mut events = vec![event];
        if relisted && self.relisting && self.current.is_some() {
            self.relisting = false;
            if let Some(Ok(())) = self.member_ready {
                events.push(self.heartbeat_event(Ok(())));
            }
        }
        events
    }

    /// What the clock says: a heartbeat failed when no agent is connected or it fell silent,
    /// and the member's capacity when it changed.
    pub fn tick(&mut self, now: Instant) -> Vec<SourceEvent> {
        let silent_for = self.heartbeat * SILENT_HEARTBEATS;
        let failure = match (self.current, self.last_heartbeat) {
            (None, _) => Some(match self.connection {
                None => "no agent has connected for this member (meridian token create --cluster …, then meridian agent)".to_string(),
                Some(_) => "the agent's stream closed".to_string(),
            }),
            (Some((_, opened)), last) => {
                let heard = last.map_or(opened, |(at, _)| at.max(opened));
                (now.saturating_duration_since(heard) > silent_for).then(|| {
                    format!(
                        "no heartbeat from the agent for {}s",
                        now.saturating_duration_since(heard).as_secs()
                    )
                })
            }
        };
        let mut events: Vec<SourceEvent> = failure
            .map(|reason| self.heartbeat_event(Err(reason)))
            .into_iter()
            .collect();
        events.extend(self.state.take_capacity());
        events
    }

    /// The agent's state for the fleet's facts.
    pub fn facts(&self) -> Option<AgentFacts> {
        let connection = self.connection.as_ref()?;
        Some(AgentFacts {
            connected: self.current.is_some(),
            since: self.since,
            peer: connection.peer.clone(),
            certificate_expires: connection.certificate_expires,
            last_heartbeat: self.last_heartbeat.map(|(_, at)| at),
        })
    }

    fn watch_health(&mut self, failure: String) -> Vec<SourceEvent> {
        let failure = (!failure.is_empty()).then_some(failure);
        if failure == self.watch_failure {
            return Vec::new();
        }
        self.watch_failure.clone_from(&failure);
        vec![SourceEvent::WatchHealth {
            cluster: self.cluster.clone(),
            failure,
        }]
    }

    fn heartbeat_event(&self, result: Result<(), String>) -> SourceEvent {
        SourceEvent::Heartbeat {
            cluster: self.cluster.clone(),
            result,
        }
    }
}

#[cfg(test)]
mod tests;
