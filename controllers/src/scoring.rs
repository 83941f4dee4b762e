//! Scoring webhooks (`placement.webhooks`): the [`Programs`] placement asks for a webhook's
//! verdicts, answered from a cache and filled by calls made off the decision's thread.
//!
//! ```text
//!  Fleet::place (blocking pool) ─ judge(webhook, template, candidates)
//!     request body (workload + candidates) ─ fingerprint ─► cache
//!        answered:   the cached verdicts (asked again in the background once stale)
//!        not asked:  queued for the caller task ─► Pending (the template waits)
//!  caller task ─ at most `concurrency` calls at once, 2 per webhook (one that hangs starves
//!     only itself), each bounded by its timeoutMillis
//!     POST JSON ─► 200 + {"clusters": [{"name", "score"?, "filter"?, "reason"?}]}
//!        ─► cache ─► SourceEvent::ProgramsAnswered ─► the fleet decides again (a cache hit)
//! ```
//!
//! The cache is keyed by what the call would send, so a decision whose inputs did not change
//! reuses its answer, and any change (a cluster's capacity, a label, the template) asks again.
//! Answers are refreshed after [`Settings::refresh_after`], failures retried after
//! [`Settings::retry_after`]; the stale answer serves meanwhile. A timeout, a refused
//! connection, a non-200 status, or a malformed or out-of-range answer is a
//! `Judgement::Failed` that the policy's `failurePolicy` handles in core.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use meridian_core::placement::{
    ClusterInput, Judgement, Program, Programs, Template, Verdict, Webhook,
};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};

use crate::SourceEvent;
use crate::https::{HttpsClient, client_for};

/// Calls to one webhook (URL) at once, of [`Settings::concurrency`] in all.
const PER_WEBHOOK: usize = 2;

/// The largest answer read from a webhook.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// How many calls run at once, how long answers are kept and reused.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub concurrency: usize,
    /// Calls waiting for a slot; beyond it a decision fails the webhook at once.
    pub queue: usize,
    /// Cached answers (different inputs) kept; the least recently used go first.
    pub max_entries: usize,
    /// An answer older than this is asked for again (and serves until the new one comes).
    pub refresh_after: Duration,
    /// A failure older than this is asked for again.
    pub retry_after: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            queue: 1024,
            max_entries: 4096,
            refresh_after: Duration::from_secs(60),
            retry_after: Duration::from_secs(5),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    /// ok, timeout, unreachable, status, malformed.
    result: &'static str,
}

/// `meridian_placement_webhook_*`.
#[derive(Clone, Debug)]
struct Metrics {
    calls: Family<CallLabels, Counter>,
    seconds: Histogram,
    cache_hits: Counter,
}

impl Metrics {
    fn new(registry: &mut Registry) -> Self {
        let m = Self {
            calls: Family::default(),
            seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            cache_hits: Counter::default(),
        };
        registry.register(
            "webhook_calls",
            "Scoring webhook calls by result",
            m.calls.clone(),
        );
        registry.register(
            "webhook_call_seconds",
            "Scoring webhook call duration",
            m.seconds.clone(),
        );
        registry.register(
            "webhook_cache_hits",
            "Decisions answered from the scoring webhook cache",
            m.cache_hits.clone(),
        );
        m
    }
}

/// One queued call.
struct Call {
    key: u64,
    webhook: Arc<Webhook>,
    body: Bytes,
    /// The candidates' names, in the order the verdicts must come back.
    names: Vec<String>,
}

#[derive(Debug)]
struct Entry {
    answer: Option<(Judgement, Instant)>,
    asking: bool,
    used: Instant,
}

#[derive(Debug, Default)]
struct Cache {
    entries: HashMap<u64, Entry>,
}

/// The scoring webhooks' [`Programs`]: cheap to clone, shared by the fleet and the caller task.
#[derive(Clone, Debug)]
pub struct Webhooks {
    cache: Arc<Mutex<Cache>>,
    calls: mpsc::Sender<Call>,
    settings: Settings,
    metrics: Metrics,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Call({})", self.webhook.url)
    }
}

impl Webhooks {
    /// The programs for the fleet, and the task that makes the calls (answers go to
    /// `events`, so the fleet decides again).
    pub fn new(
        settings: Settings,
        events: mpsc::Sender<SourceEvent>,
        registry: &mut Registry,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + use<>) {
        let (calls, queued) = mpsc::channel(settings.queue.max(1));
        let webhooks = Self {
            cache: Arc::default(),
            calls,
            settings,
            metrics: Metrics::new(registry),
        };
        let task = caller(webhooks.clone(), queued, events);
        (webhooks, task)
    }

    /// The cached judgement for `key`, asking (again) when there is none or it is stale.
    fn lookup(
        &self,
        key: u64,
        webhook: &Arc<Webhook>,
        request: impl FnOnce() -> (Bytes, Vec<String>),
    ) -> Judgement {
        let now = Instant::now();
        let mut cache = self.cache.lock();
        let entry = cache.entries.entry(key).or_insert(Entry {
            answer: None,
            asking: false,
            used: now,
        });
        entry.used = now;
        let stale = entry.answer.as_ref().is_none_or(|(j, at)| {
            let keep = match j {
                Judgement::Failed(_) => self.settings.retry_after,
                _ => self.settings.refresh_after,
            };
            now.duration_since(*at) >= keep
        });
        let answer = entry.answer.as_ref().map(|(j, _)| j.clone());
        if stale && !entry.asking {
            let (body, names) = request();
            let call = Call {
                key,
                webhook: Arc::clone(webhook),
                body,
                names,
            };
            match self.calls.try_send(call) {
                Ok(()) => entry.asking = true,
                Err(_) if answer.is_none() => {
                    return Judgement::Failed(format!(
                        "more than {} webhook calls are waiting",
                        self.settings.queue
                    ));
                }
                Err(_) => {}
            }
        }
        evict(&mut cache, self.settings.max_entries);
        match answer {
            Some(j) => {
                self.metrics.cache_hits.inc();
                j
            }
            None => Judgement::Pending,
        }
    }

    /// Calls asked for and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.cache
            .lock()
            .entries
            .values()
            .filter(|e| e.asking)
            .count()
    }

    fn store(&self, key: u64, judgement: Judgement) -> bool {
        let mut cache = self.cache.lock();
        let Some(entry) = cache.entries.get_mut(&key) else {
            return false;
        };
        entry.asking = false;
        let changed = entry.answer.as_ref().is_none_or(|(j, _)| *j != judgement);
        entry.answer = Some((judgement, Instant::now()));
        changed
    }
}

/// Drops the least recently used entries beyond `max` (never one being asked).
fn evict(cache: &mut Cache, max: usize) {
    if cache.entries.len() <= max {
        return;
    }
    let mut by_use: Vec<(Instant, u64)> = cache
        .entries
        .iter()
        .filter(|(_, e)| !e.asking)
        .map(|(k, e)| (e.used, *k))
        .collect();
    by_use.sort_unstable();
    let excess = cache.entries.len() - max;
    for (_, k) in by_use.into_iter().take(excess) {
        cache.entries.remove(&k);
    }
}

impl Programs for Webhooks {
    fn judge(
        &self,
        program: &Program,
        template: &Template,
        candidates: &[ClusterInput<'_>],
    ) -> Judgement {
        let Program::Webhook(webhook) = program else {
            return Judgement::Failed("not a webhook".into());
        };
        let body = request_body(template, candidates).to_string();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        webhook.hash(&mut hasher);
        body.hash(&mut hasher);
        let key = hasher.finish();
        self.lookup(key, webhook, || {
            let names = candidates
                .iter()
                .map(|c| c.view.spec.id.to_string())
                .collect();
            (Bytes::from(body), names)
        })
    }
}

/// What a webhook is sent: the workload and the candidates.
pub fn request_body(t: &Template, candidates: &[ClusterInput<'_>]) -> Value {
    let resources = |r: &meridian_core::Resources| json!({"cpuMillis": r.cpu_millis, "memoryBytes": r.memory_bytes, "gpus": r.gpus, "pods": r.pods});
    let clusters: Vec<Value> = candidates
        .iter()
        .map(|c| {
            let spec = &c.view.spec;
            json!({
                "name": spec.id.as_str(),
                "labels": spec.labels,
                "region": spec.locality.region,
                "zone": spec.locality.zone,
                "health": format!("{:?}", c.view.health),
                "endpoints": c.view.endpoints,
                "taints": spec.taints.iter().map(|t| json!({"key": t.key, "value": t.value, "effect": format!("{:?}", t.effect)})).collect::<Vec<_>>(),
                "capacity": c.capacity.map(|cap| json!({"allocatable": resources(&cap.allocatable), "requested": resources(&cap.requested)})),
                "cost": spec.cost.map(|k| json!({
                    "cpuCoreHour": k.cpu_core_hour(),
                    "memoryGiBHour": k.memory_gib_hour(),
                    "egressGiB": k.egress_gib(),
                    "spotRatio": k.spot_ratio(),
                })),
            })
        })
        .collect();
    let annotations = t
        .body
        .pointer("/metadata/annotations")
        .cloned()
        .unwrap_or(Value::Null);
    json!({
        "apiVersion": "meridian.io/v1alpha1",
        "kind": "ScoringRequest",
        "workload": {
            "apiVersion": &*t.key.api_version,
            "kind": &*t.key.kind,
            "namespace": &*t.key.namespace,
            "name": &*t.key.name,
            "labels": t.labels,
            "annotations": annotations,
            "replicas": t.replicas,
            "requests": resources(&t.requests),
        },
        "clusters": clusters,
    })
}

/// The verdicts in `answer` for `names` (in that order), or why the answer is malformed.
pub fn parse_answer(answer: &[u8], names: &[String]) -> Result<Vec<Verdict>, String> {
    let value: Value =
        serde_json::from_slice(answer).map_err(|e| format!("answer is not JSON: {e}"))?;
    let list = value
        .get("clusters")
        .and_then(Value::as_array)
        .ok_or("answer has no \"clusters\" list")?;
    let mut verdicts = vec![Verdict::default(); names.len()];
    let mut seen = vec![false; names.len()];
    for (i, item) in list.iter().enumerate() {
        let name = item
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("clusters[{i}] has no name"))?;
        let at = names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| format!("clusters[{i}]: {name:?} is not a candidate"))?;
        if std::mem::replace(&mut seen[at], true) {
            return Err(format!("clusters[{i}]: {name:?} is answered twice"));
        }
        verdicts[at].score = match item.get("score") {
            None | Some(Value::Null) => None,
            Some(v) => Some(score_of(v).ok_or_else(|| {
                format!("clusters[{i}] ({name}): score {v} is not a number in [0, 100]")
            })?),
        };
        match item.get("filter") {
            None | Some(Value::Null) | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => {
                let reason = item
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("filtered out by the webhook");
                verdicts[at].rejected = Some(reason.to_owned());
            }
            Some(v) => {
                return Err(format!(
                    "clusters[{i}] ({name}): filter {v} is not a boolean"
                ));
            }
        }
    }
    Ok(verdicts)
}

fn score_of(v: &Value) -> Option<u32> {
    let f = v.as_f64()?;
    (f.is_finite() && (0.0..=100.0).contains(&f)).then(|| f.round() as u32)
}

/// Makes the queued calls, at most `concurrency` at once.
async fn caller(
    webhooks: Webhooks,
    mut queued: mpsc::Receiver<Call>,
    events: mpsc::Sender<SourceEvent>,
) {
    let slots = Arc::new(Semaphore::new(webhooks.settings.concurrency.max(1)));
    // Each webhook's own share of the slots: one that hangs holds only its own, and the calls
    // of the others never queue behind it.
    let mut own_slots: HashMap<String, Arc<Semaphore>> = HashMap::new();
    let mut clients: HashMap<Option<String>, Result<HttpsClient, String>> = HashMap::new();
    while let Some(call) = queued.recv().await {
        let own = Arc::clone(
            own_slots
                .entry(call.webhook.url.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(PER_WEBHOOK))),
        );
        let slots = Arc::clone(&slots);
        let client = clients
            .entry(call.webhook.ca_bundle.clone())
            .or_insert_with(|| {
                client_for(call.webhook.ca_bundle.as_deref()).map_err(|e| e.to_string())
            })
            .clone();
        let webhooks = webhooks.clone();
        let events = events.clone();
        tokio::spawn(async move {
            let (Ok(_own), Ok(slot)) = (own.acquire_owned().await, slots.acquire_owned().await)
            else {
                return;
            };
            let started = Instant::now();
            let (judgement, result) = match client {
                Ok(client) => ask(&client, &call).await,
                Err(why) => (Judgement::Failed(why), "unreachable"),
            };
            webhooks
                .metrics
                .seconds
                .observe(started.elapsed().as_secs_f64());
            webhooks
                .metrics
                .calls
                .get_or_create(&CallLabels { result })
                .inc();
            if let Judgement::Failed(why) = &judgement {
                tracing::warn!(url = %call.webhook.url, %why, "scoring webhook failed");
            }
            if webhooks.store(call.key, judgement) {
                let _ = events.send(SourceEvent::ProgramsAnswered).await;
            }
            drop(slot);
        });
    }
}

/// One call, bounded by the webhook's timeout: the judgement and the metric's result.
async fn ask(client: &HttpsClient, call: &Call) -> (Judgement, &'static str) {
    let timeout = Duration::from_millis(call.webhook.timeout_millis);
    let request = match http::Request::post(&call.webhook.url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(call.body.clone()))
    {
        Ok(r) => r,
        Err(e) => return (Judgement::Failed(format!("bad URL: {e}")), "unreachable"),
    };
    let exchange = async {
        let response = client.request(request).await.map_err(|e| {
            (
                format!("cannot reach it: {}", crate::reason_of(&e)),
                "unreachable",
            )
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| (format!("reading the answer: {e}"), "malformed"))?
            .to_bytes();
        if status != http::StatusCode::OK {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            return Err((format!("answered HTTP {status}: {text}"), "status"));
        }
        parse_answer(&body, &call.names).map_err(|why| (why, "malformed"))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(verdicts)) => (Judgement::Answered(verdicts), "ok"),
        Ok(Err((why, result))) => (Judgement::Failed(why), result),
        Err(_) => (
            Judgement::Failed(format!(
                "no answer within {} ms",
                call.webhook.timeout_millis
            )),
            "timeout",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn answers_map_to_the_candidates_order() {
        let got = parse_answer(
            br#"{"clusters":[{"name":"b","score":70.4},{"name":"a","filter":false,"reason":"no GPUs"}]}"#,
            &names(&["a", "b", "c"]),
        )
        .unwrap();
        assert_eq!(got[0].rejected.as_deref(), Some("no GPUs"));
        assert_eq!(got[0].score, None);
        assert_eq!(got[1].score, Some(70));
        assert_eq!(got[2], Verdict::default());
    }

    #[test]
    fn malformed_answers_say_what_is_wrong() {
        let n = names(&["a"]);
        let cases: &[(&[u8], &str)] = &[
            (b"not json", "not JSON"),
            (br#"{"scores":{}}"#, "no \"clusters\" list"),
            (br#"{"clusters":[{"score":1}]}"#, "has no name"),
            (
                br#"{"clusters":[{"name":"z","score":1}]}"#,
                "not a candidate",
            ),
            (
                br#"{"clusters":[{"name":"a","score":140}]}"#,
                "not a number in [0, 100]",
            ),
            (
                br#"{"clusters":[{"name":"a","score":-1}]}"#,
                "not a number in [0, 100]",
            ),
            (
                br#"{"clusters":[{"name":"a","score":"high"}]}"#,
                "not a number",
            ),
            (
                br#"{"clusters":[{"name":"a","filter":"no"}]}"#,
                "not a boolean",
            ),
            (
                br#"{"clusters":[{"name":"a"},{"name":"a"}]}"#,
                "answered twice",
            ),
        ];
        for (body, want) in cases {
            let err = parse_answer(body, &n).unwrap_err();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        }
    }

    #[tokio::test]
    async fn a_decision_waits_then_reads_the_cached_answer() {
        let mut registry = Registry::default();
        let (events, mut answered) = mpsc::channel(8);
        let (webhooks, _task) = Webhooks::new(Settings::default(), events, &mut registry);
        let hook = Arc::new(Webhook {
            url: "http://127.0.0.1:1/".into(),
            ca_bundle: None,
            timeout_millis: 100,
            failure_policy: Default::default(),
        });
        let ask = || webhooks.lookup(7, &hook, || (Bytes::from_static(b"{}"), names(&["a"])));
        assert_eq!(ask(), Judgement::Pending);
        // Asked once: a second decision before the answer waits without asking again.
        assert_eq!(ask(), Judgement::Pending);
        assert!(webhooks.store(7, Judgement::Answered(vec![Verdict::default()])));
        assert_eq!(ask(), Judgement::Answered(vec![Verdict::default()]));
        assert!(answered.try_recv().is_err(), "store alone sends nothing");
    }

    #[test]
    fn eviction_keeps_the_recent_and_the_asked() {
        let now = Instant::now();
        let mut cache = Cache::default();
        for k in 0..10u64 {
            cache.entries.insert(
                k,
                Entry {
                    answer: None,
                    asking: k == 0,
                    used: now + Duration::from_millis(k),
                },
            );
        }
        evict(&mut cache, 5);
        let mut kept: Vec<u64> = cache.entries.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![0, 6, 7, 8, 9]);
    }
}
