//! Where agents' streams meet their members' tasks: the hub's table of agent members, each
//! with its task's inbox and its newest open stream (where the tunnel sends API requests).
//! Only the newest stream of a cluster counts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use meridian_core::ClusterId;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::ApiCall;
use crate::kubernetes::state::MemberEvent;

/// Requests waiting to go down one stream.
const CALLS: usize = 256;

/// What one agent's stream brings.
#[derive(Debug)]
pub enum Inbound {
    /// A stream opened: the agent relists everything on it.
    Opened(Connection),
    /// One watch event of the member.
    Event(Box<MemberEvent>),
    /// The agent's heartbeat: whether it reaches its member's API, and its failing watch.
    Heartbeat {
        member_ready: bool,
        error: String,
        watch_failure: String,
    },
    /// The agent renewed its certificate: the stream keeps the connection, and so the
    /// certificate, it opened with; this is the one in use from now on.
    Renewed { certificate_expires: SystemTime },
    /// The stream ended (the agent went, or was refused).
    Closed,
}

/// Who is on a stream that opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The agent's address as the hub sees it.
    pub peer: String,
    /// When the agent's client certificate expires.
    pub certificate_expires: Option<SystemTime>,
}

/// Where agents' streams find their member's task, by cluster.
#[derive(Clone, Default)]
pub struct AgentRoutes {
    routes: Arc<Mutex<HashMap<ClusterId, Route>>>,
    streams: Arc<AtomicU64>,
}

#[derive(Clone)]
struct Route {
    /// Which registration: a restarted member task replaces its route, and only its own
    /// registration removes it.
    task: u64,
    tx: mpsc::Sender<(u64, Inbound)>,
    heartbeat: Duration,
    /// The newest open stream, and where requests for the member's API go down it.
    current: Option<(u64, mpsc::Sender<ApiCall>)>,
}

/// Why a stream cannot be opened for a cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no MemberCluster {0} with `source: {{agent: {{}}}}` on this hub (or its source has not started yet)"
)]
pub struct NotAnAgentMember(pub ClusterId);

impl AgentRoutes {
    /// Opens a stream for `cluster`'s agent: what it sends goes to the member's task.
    pub async fn open(
        &self,
        cluster: &ClusterId,
        connection: Connection,
    ) -> Result<AgentStream, NotAnAgentMember> {
        let route = self
            .routes
            .lock()
            .get(cluster)
            .cloned()
            .ok_or_else(|| NotAnAgentMember(cluster.clone()))?;
        let id = self.streams.fetch_add(1, Ordering::Relaxed) + 1;
        let (calls_tx, calls) = mpsc::channel(CALLS);
        let stream = AgentStream {
            id,
            tx: route.tx,
            heartbeat: route.heartbeat,
            calls,
            cluster: cluster.clone(),
            routes: self.clone(),
        };
        if !stream.send(Inbound::Opened(connection)).await {
            return Err(NotAnAgentMember(cluster.clone()));
        }
        if let Some(route) = self.routes.lock().get_mut(cluster) {
            route.current = Some((id, calls_tx));
        }
        Ok(stream)
    }

    /// Tells `cluster`'s task that its agent renewed its certificate, as of its open stream.
    /// Best effort: a full queue drops it, and the next stream's certificate says the same.
    pub fn renewed(&self, cluster: &ClusterId, certificate_expires: SystemTime) {
        let routes = self.routes.lock();
        if let Some(route) = routes.get(cluster)
            && let Some((stream, _)) = &route.current
        {
            let renewed = Inbound::Renewed {
                certificate_expires,
            };
            let _ = route.tx.try_send((*stream, renewed));
        }
    }

    /// Where requests for `cluster`'s API go: down its agent's newest open stream.
    pub fn calls_of(&self, cluster: &ClusterId) -> Option<mpsc::Sender<ApiCall>> {
        let routes = self.routes.lock();
        routes
            .get(cluster)?
            .current
            .as_ref()
            .map(|(_, tx)| tx.clone())
    }

    /// How often `cluster`'s heartbeat is due; None when it is no agent member here.
    pub fn heartbeat(&self, cluster: &ClusterId) -> Option<Duration> {
        self.routes.lock().get(cluster).map(|r| r.heartbeat)
    }

    /// The clusters agents may connect for now.
    pub fn members(&self) -> Vec<ClusterId> {
        let mut members: Vec<ClusterId> = self.routes.lock().keys().cloned().collect();
        members.sort();
        members
    }

    pub(crate) fn register(&self, cluster: &ClusterId, heartbeat: Duration) -> Registration {
        let (tx, rx) = mpsc::channel(1024);
        let task = self.streams.fetch_add(1, Ordering::Relaxed) + 1;
        let route = Route {
            task,
            tx,
            heartbeat,
            current: None,
        };
        self.routes.lock().insert(cluster.clone(), route);
        Registration {
            routes: self.clone(),
            cluster: cluster.clone(),
            task,
            rx,
        }
    }
}

/// A member task's place in the routes, removed when the task ends.
pub(crate) struct Registration {
    routes: AgentRoutes,
    cluster: ClusterId,
    task: u64,
    pub(crate) rx: mpsc::Receiver<(u64, Inbound)>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut routes = self.routes.routes.lock();
        if routes
            .get(&self.cluster)
            .is_some_and(|r| r.task == self.task)
        {
            routes.remove(&self.cluster);
        }
    }
}

/// One open stream of an agent, as its reader delivers what comes.
pub struct AgentStream {
    id: u64,
    tx: mpsc::Sender<(u64, Inbound)>,
    /// How often the member's heartbeat is due (the agent is told).
    pub heartbeat: Duration,
    /// Requests for the member's API, for the stream to send down.
    pub calls: mpsc::Receiver<ApiCall>,
    cluster: ClusterId,
    routes: AgentRoutes,
}

impl AgentStream {
    /// False when the member's task is gone (the member left or restarted): end the stream,
    /// so the agent connects again to whatever serves the member now.
    pub async fn send(&self, inbound: Inbound) -> bool {
        self.tx.send((self.id, inbound)).await.is_ok()
    }
}

impl Drop for AgentStream {
    fn drop(&mut self) {
        // Best effort: a full queue means the task is busy with this stream's events, and the
        // missing heartbeats say the same soon.
        let _ = self.tx.try_send((self.id, Inbound::Closed));
        if let Some(route) = self.routes.routes.lock().get_mut(&self.cluster)
            && route.current.as_ref().is_some_and(|(id, _)| *id == self.id)
        {
            route.current = None;
        }
    }
}
