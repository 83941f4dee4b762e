//! [`ScriptPool`]: placement scripts run off the writer. The decision asks for a script's
//! verdicts and gets them from a cache keyed by everything the script sees; a miss is queued
//! for a few worker threads and answered `Pending` (the template keeps its last placement),
//! and each answer wakes the fleet to decide again — the way scoring webhooks are asked.
//!
//! ```text
//!  Fleet::place ─ judge(script, template, candidates) ─ fingerprint ─► cache
//!     answered:  the verdicts (or the failure) of the same inputs
//!     missed:    a Job (owned inputs) ─► bounded queue ─► worker thread ─ ScriptRunner
//!                 (skipped when the template was asked again with newer inputs since)
//!                 (instruction hook, memory limit, deadline) ─► cache ─► wake()
//!                 ─► SourceEvent::ProgramsAnswered ─► the fleet decides again (a hit)
//! ```
//!
//! So the one writer never runs untrusted code: a script that burns its whole budget on
//! every template costs the workers' time, not DNS's or xDS's updates.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use meridian_core::placement::{ClusterInput, Judgement, Program, Programs, TemplateKey};
use meridian_core::{Capacity, ClusterView, Template};
use parking_lot::Mutex;
use tracing::warn;

use crate::ScriptRunner;

/// Decisions waiting for a worker; past this a template's script fails at once.
const QUEUE: usize = 1024;
/// Verdicts kept (different inputs); the least recently used go first.
const MAX_ENTRIES: usize = 4096;

/// What the pool calls when an answer lands: the fleet is woken to decide again.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// Scripts run on worker threads, their verdicts cached by input.
pub struct ScriptPool {
    runner: Arc<ScriptRunner>,
    cache: Arc<Mutex<Cache>>,
    jobs: mpsc::SyncSender<Job>,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<u64, Entry>,
    /// The inputs each template was last asked with: a queued decision on older inputs (the
    /// members were still syncing, a cluster changed since) is skipped, not run.
    latest: HashMap<TemplateKey, u64>,
}

#[derive(Clone)]
struct Entry {
    /// None while a worker runs it.
    answer: Option<Judgement>,
    used: Instant,
}

/// One decision, with what the script sees owned (the worker outlives the round).
struct Job {
    key: u64,
    program: Program,
    template: Template,
    candidates: Vec<(ClusterView, Option<Capacity>)>,
}

impl ScriptPool {
    /// A pool of `workers` threads running `runner`'s scripts; `wake` is called after each
    /// answer.
    pub fn new(runner: ScriptRunner, workers: usize, wake: Wake) -> Self {
        let runner = Arc::new(runner);
        let cache: Arc<Mutex<Cache>> = Arc::default();
        let (jobs, queued) = mpsc::sync_channel::<Job>(QUEUE);
        let queued = Arc::new(Mutex::new(queued));
        for i in 0..workers.max(1) {
            let (runner, cache, queued, wake) = (
                Arc::clone(&runner),
                Arc::clone(&cache),
                Arc::clone(&queued),
                Arc::clone(&wake),
            );
            let spawned = std::thread::Builder::new()
                .name(format!("meridian-script-{i}"))
                .spawn(move || work(&runner, &cache, &queued, &wake));
            if let Err(e) = spawned {
                warn!(error = %e, "a placement script worker could not start");
            }
        }
        Self {
            runner,
            cache,
            jobs,
        }
    }

    /// Decisions queued or running.
    pub fn in_flight(&self) -> usize {
        self.cache
            .lock()
            .entries
            .values()
            .filter(|e| e.answer.is_none())
            .count()
    }
}

impl std::fmt::Debug for ScriptPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptPool")
            .field("runner", &self.runner)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

fn work(
    runner: &ScriptRunner,
    cache: &Mutex<Cache>,
    queued: &Mutex<mpsc::Receiver<Job>>,
    wake: &Wake,
) {
    loop {
        let job = match queued.lock().recv() {
            Ok(job) => job,
            Err(_) => return, // the pool is gone
        };
        {
            let mut cache = cache.lock();
            if cache.latest.get(&job.template.key) != Some(&job.key) {
                cache.entries.remove(&job.key); // superseded: asked again if ever needed
                continue;
            }
        }
        let inputs: Vec<ClusterInput<'_>> = job
            .candidates
            .iter()
            .map(|(view, capacity)| ClusterInput {
                view,
                capacity: capacity.as_ref(),
            })
            .collect();
        let judgement = runner.judge(&job.program, &job.template, &inputs);
        if let Some(e) = cache.lock().entries.get_mut(&job.key) {
            e.answer = Some(judgement);
        }
        wake();
    }
}

impl Programs for ScriptPool {
    fn judge(
        &self,
        program: &Program,
        template: &Template,
        candidates: &[ClusterInput<'_>],
    ) -> Judgement {
        let key = fingerprint(program, template, candidates);
        let now = Instant::now();
        let mut cache = self.cache.lock();
        cache.latest.insert(template.key.clone(), key);
        if let Some(e) = cache.entries.get_mut(&key) {
            e.used = now;
            return e.answer.clone().unwrap_or(Judgement::Pending);
        }
        let job = Job {
            key,
            program: program.clone(),
            template: template.clone(),
            candidates: candidates
                .iter()
                .map(|c| (c.view.clone(), c.capacity.cloned()))
                .collect(),
        };
        if self.jobs.try_send(job).is_err() {
            return Judgement::Failed(format!(
                "more than {QUEUE} placement script decisions are waiting"
            ));
        }
        cache.entries.insert(
            key,
            Entry {
                answer: None,
                used: now,
            },
        );
        evict(&mut cache);
        Judgement::Pending
    }
}

/// Drops the least recently used answers past [`MAX_ENTRIES`] (never one being computed),
/// and forgets the inputs of templates none of the answers left is for.
fn evict(cache: &mut Cache) {
    if cache.entries.len() <= MAX_ENTRIES {
        return;
    }
    let mut answered: Vec<(Instant, u64)> = cache
        .entries
        .iter()
        .filter(|(_, e)| e.answer.is_some())
        .map(|(k, e)| (e.used, *k))
        .collect();
    answered.sort_unstable();
    let excess = cache.entries.len() - MAX_ENTRIES;
    for (_, k) in answered.into_iter().take(excess) {
        cache.entries.remove(&k);
    }
    let entries = &cache.entries;
    cache.latest.retain(|_, key| entries.contains_key(key));
}

/// A hash of everything the script sees: its source, the workload and each candidate as
/// `inputs.rs` builds their tables (serialized, so no field is forgotten).
fn fingerprint(program: &Program, template: &Template, candidates: &[ClusterInput<'_>]) -> u64 {
    let mut h = HashWriter(std::collections::hash_map::DefaultHasher::new());
    if let Program::Script(s) = program {
        h.0.write(s.lua.as_bytes());
    }
    h.0.write(template.key.to_string().as_bytes());
    let _ = serde_json::to_writer(
        &mut h,
        &(&template.labels, template.replicas, &template.requests),
    );
    let _ = serde_json::to_writer(&mut h, &template.body["metadata"]["annotations"]);
    for c in candidates {
        let _ = serde_json::to_writer(
            &mut h,
            &(&c.view.spec, c.view.health, c.view.endpoints, c.capacity),
        );
    }
    h.0.finish()
}

struct HashWriter<H>(H);

impl<H: Hasher> std::io::Write for HashWriter<H> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
