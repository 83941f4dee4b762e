//! Leader election on a `coordination.k8s.io/v1` Lease in the hub. Every replica watches and
//! serves; only the leader writes what is hub-wide, and — unless writes are sharded
//! (`shard`) — every member.
//!
//! A replica counts itself leader until `renew_deadline` after it *sent* its last successful
//! acquire or renew, measured on its own monotonic clock. Another replica takes the lease over
//! only after it has seen the lease unchanged for `lease_duration` on its clock; since
//! `renew_deadline < lease_duration` and the other's observation starts no earlier than our
//! send, we stop writing before the lease can be taken over — also when this process was
//! frozen (SIGSTOP) and wakes up late: the monotonic clock kept running.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use meridian_core::ClusterId;
use tokio::sync::watch;
use tracing::{info, warn};

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Whether this replica may write now, and where. Cheap to clone and to ask.
///
/// Hub-wide writes ask the leader-election Lease ([`Leadership::is_leader`]). With sharded
/// writers (`shard`), a member's writes ask whether this replica holds that member
/// ([`Leadership::may_write_to`]); without, the leader writes every member. A handle can be
/// scoped ([`Leadership::for_member`], [`Leadership::for_shard`]) so that an applier or a
/// fenced connection asks the right question with [`Leadership::may_write`].
#[derive(Clone, Debug)]
pub struct Leadership {
    /// Leader until this instant (None inside: not leader); no receiver: always leader.
    until: Option<watch::Receiver<Option<Instant>>>,
    identity: Arc<str>,
    /// The members this replica holds (sharded writers); None: the leader writes them all.
    shards: Option<watch::Receiver<Arc<Held>>>,
    scope: Scope,
}

/// What a scoped [`Leadership`] answers for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Scope {
    /// Hub-wide writes: the leader's.
    Hub,
    /// Writes into (or about) one member: its holder's.
    Member(ClusterId),
    /// Writes about any member this replica holds (the hub's status writer connection; each
    /// request asks for its member).
    Shard,
}

/// The members a replica holds, and until when (its shard Lease's renew deadline).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub until: Option<Instant>,
    pub members: BTreeSet<ClusterId>,
}

impl Held {
    fn valid(&self) -> bool {
        self.until.is_some_and(|t| Instant::now() < t)
    }
}

impl Leadership {
    /// Always leader: a single replica with no Lease (a directory hub).
    pub fn always(identity: &str) -> Self {
        Self {
            until: None,
            identity: Arc::from(identity),
            shards: None,
            scope: Scope::Hub,
        }
    }

    /// Leader until the instant `until` holds (none: not leader), for tests that take
    /// leadership away.
    #[cfg(test)]
    pub(crate) fn following(until: watch::Receiver<Option<Instant>>) -> Self {
        Self {
            until: Some(until),
            identity: Arc::from("test"),
            shards: None,
            scope: Scope::Hub,
        }
    }

    /// Members are written by the replica that holds them, as `held` says, not by the leader.
    pub fn sharded(mut self, held: watch::Receiver<Arc<Held>>) -> Self {
        self.shards = Some(held);
        self
    }

    /// Hub-wide writes: this replica holds the leader-election Lease.
    pub fn is_leader(&self) -> bool {
        match &self.until {
            None => true,
            Some(until) => until.borrow().is_some_and(|t| Instant::now() < t),
        }
    }

    /// Writes into or about `cluster`: this replica holds it (or leads, when not sharded).
    pub fn may_write_to(&self, cluster: &ClusterId) -> bool {
        match &self.shards {
            None => self.is_leader(),
            Some(held) => {
                let held = held.borrow();
                held.valid() && held.members.contains(cluster)
            }
        }
    }

    /// The same, scoped to one member's writes.
    pub fn for_member(&self, cluster: &ClusterId) -> Self {
        Self {
            scope: Scope::Member(cluster.clone()),
            ..self.clone()
        }
    }

    /// The same, scoped to writes about whichever members this replica holds.
    pub fn for_shard(&self) -> Self {
        Self {
            scope: Scope::Shard,
            ..self.clone()
        }
    }

    /// Whether a write in this handle's scope may go out now.
    pub fn may_write(&self) -> bool {
        match (&self.scope, &self.shards) {
            (Scope::Member(cluster), _) => self.may_write_to(cluster),
            (Scope::Shard, Some(held)) => held.borrow().valid(),
            (Scope::Hub, _) | (Scope::Shard, None) => self.is_leader(),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }
}

/// What this replica last saw of the lease, to time a takeover on our own clock.
struct Observed {
    holder: Option<String>,
    renew: Option<MicroTime>,
    at: Instant,
}

/// Starts the election; the returned Leadership follows it.
pub fn start(client: Client, config: LeaseConfig) -> (Leadership, tokio::task::JoinHandle<()>) {
    let (tx, until) = watch::channel(None);
    let leadership = Leadership {
        until: Some(until),
        identity: Arc::from(config.identity.as_str()),
        shards: None,
        scope: Scope::Hub,
    };
    let task = tokio::spawn(run(Api::namespaced(client, &config.namespace), config, tx));
    (leadership, task)
}

async fn run(api: Api<Lease>, config: LeaseConfig, tx: watch::Sender<Option<Instant>>) {
    let mut observed: Option<Observed> = None;
    let mut leading = false;
    loop {
        let sent = Instant::now();
        match try_acquire_or_renew(&api, &config, &mut observed, sent).await {
            Ok(true) => {
                let until = sent + config.renew_deadline;
                tx.send_replace(Some(until));
                if !leading {
                    info!(lease = %config.name, identity = %config.identity, "became leader");
                    leading = true;
                }
            }
            Ok(false) => {
                if leading {
                    warn!(lease = %config.name, "lost the lease to another replica");
                    leading = false;
                }
                tx.send_replace(None);
            }
            Err(e) => {
                warn!(lease = %config.name, error = %e, "cannot reach the lease; leadership lapses at its renew deadline");
            }
        }
        // A leader whose renew deadline passed stops leading (the writers check the instant).
        if leading && tx.borrow().is_some_and(|t| Instant::now() >= t) {
            warn!(lease = %config.name, "renew deadline passed: no longer leader");
            leading = false;
        }
        tokio::time::sleep(config.retry_period).await;
    }
}

/// Returns whether we hold the lease now.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &mut Option<Observed>,
    now: Instant,
) -> Result<bool, kube::Error> {
    let current = api.get_opt(&config.name).await?;
    let stamp = MicroTime(Timestamp::now());
    let seconds = i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let Some(mut lease) = current else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(stamp.clone()),
                renew_time: Some(stamp),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let ours = holder.as_deref() == Some(config.identity.as_str());
    if !ours && holder.is_some() {
        // Someone else holds it: take over only once it went unrenewed for a whole lease
        // duration on our clock.
        let same = observed
            .as_ref()
            .is_some_and(|o| o.holder == holder && o.renew == spec.renew_time);
        if !same {
            *observed = Some(Observed {
                holder,
                renew: spec.renew_time.clone(),
                at: now,
            });
            return Ok(false);
        }
        let their_duration = spec
            .lease_duration_seconds
            .map_or(config.lease_duration, |s| {
                Duration::from_secs(s.max(0) as u64)
            });
        if observed
            .as_ref()
            .is_some_and(|o| now < o.at + their_duration)
        {
            return Ok(false);
        }
        info!(previous = ?spec.holder_identity, "lease expired; taking it over");
    }
    if !ours {
        spec.acquire_time = Some(stamp.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.holder_identity = Some(config.identity.clone());
    spec.lease_duration_seconds = Some(seconds);
    spec.renew_time = Some(stamp);
    // The resourceVersion we read makes this a compare-and-swap: a concurrent taker gets 409.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
