//! The member source tasks a hub runs: one per member, of the kind its MemberCluster names,
//! started, restarted and stopped to match the hub's list.

use std::collections::HashMap;

use meridian_core::ClusterId;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span};

use crate::SourceEvent;
use crate::agents::{self, AgentRoutes};
use crate::convert::MemberSource;
use crate::directory;
use crate::hub::MemberEntry;
use crate::kubernetes::connect::WatchTimeout;
use crate::kubernetes::{Facts, member};
use crate::manifest::Limits;

/// What member sources need from whoever starts them.
#[derive(Clone)]
pub struct Sources {
    pub tx: mpsc::Sender<SourceEvent>,
    /// The hub's client, when the hub is a Kubernetes API (reads kubeconfig Secrets).
    pub hub: Option<kube::Client>,
    pub fleet: Facts,
    pub watch_timeout: WatchTimeout,
    /// The bounds of directory sources (the hub's and every directory member's).
    pub limits: Limits,
    /// Where agents' streams reach their agent member's task.
    pub agents: AgentRoutes,
}

impl Sources {
    pub fn new(tx: mpsc::Sender<SourceEvent>) -> Self {
        Self {
            tx,
            hub: None,
            fleet: Facts::default(),
            watch_timeout: WatchTimeout::default(),
            limits: Limits::default(),
            agents: AgentRoutes::default(),
        }
    }
}

/// The running member sources.
pub struct MemberTasks {
    sources: Sources,
    tasks: HashMap<ClusterId, (MemberEntry, JoinHandle<()>)>,
}

impl MemberTasks {
    pub fn new(sources: Sources) -> Self {
        Self {
            sources,
            tasks: HashMap::new(),
        }
    }

    /// Starts, restarts and stops member source tasks so they match the hub.
    pub fn reconcile(&mut self, members: &[MemberEntry]) {
        let fleet = &self.sources.fleet;
        self.tasks.retain(|id, (entry, task)| {
            let current = members.iter().find(|m| m.spec.id == *id);
            let keep = current
                .is_some_and(|m| m.source == entry.source && m.spec.health == entry.spec.health);
            if !keep {
                info!(cluster = %id, "stopping member source");
                task.abort();
                match current {
                    // Restarted with its new settings below.
                    Some(_) => fleet.remove(id),
                    None => fleet.retire(id),
                }
            }
            keep
        });
        for member in members {
            if self.tasks.contains_key(&member.spec.id) {
                continue;
            }
            let id = member.spec.id.clone();
            let span = info_span!("member", cluster = %id);
            let tx = self.sources.tx.clone();
            let task = match &member.source {
                MemberSource::Directory(path) => {
                    info!(cluster = %id, dir = %path.display(), "starting directory member source");
                    tokio::spawn(
                        directory::run_member(
                            id.clone(),
                            path.clone(),
                            member.spec.health.heartbeat_seconds,
                            self.sources.limits.clone(),
                            tx,
                        )
                        .instrument(span),
                    )
                }
                MemberSource::Kubernetes(access) => {
                    info!(cluster = %id, "starting Kubernetes member source");
                    tokio::spawn(
                        member::run(
                            id.clone(),
                            access.clone(),
                            member.spec.health,
                            self.sources.hub.clone(),
                            fleet.clone(),
                            tx,
                            self.sources.watch_timeout,
                        )
                        .instrument(span),
                    )
                }
                MemberSource::Agent => {
                    info!(cluster = %id, "starting agent member source");
                    tokio::spawn(
                        agents::run(
                            id.clone(),
                            member.spec.health,
                            self.sources.agents.clone(),
                            fleet.clone(),
                            tx,
                        )
                        .instrument(span),
                    )
                }
            };
            self.tasks.insert(id, (member.clone(), task));
        }
    }
}

impl Drop for MemberTasks {
    fn drop(&mut self) {
        for (_, (_, task)) in self.tasks.drain() {
            task.abort();
        }
    }
}
