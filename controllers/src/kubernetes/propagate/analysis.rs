//! The health gate of staged rollouts (`rollout.analysis`): while a stage verifies, its
//! Prometheus instant query is asked every [`EVERY`], off the writer's loop — one request in
//! flight per rollout, bounded by [`TIMEOUT`] and [`MAX_ANSWER_BYTES`]. Each answer is one
//! verdict for the stage machine, taken once; until the next one the gate is Pending. A query
//! that fails (unreachable, refused, malformed) stays Pending and says why: the stage waits,
//! it does not pass.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use meridian_core::ClusterId;
use meridian_core::placement::TemplateKey;
use meridian_core::stages::{Analysis, Gate};
use parking_lot::Mutex;
use serde_json::Value;

use crate::https::{HttpsClient, client_for};
use crate::kubernetes::AbortOnDrop;

/// How often a verifying stage's query is asked.
pub(super) const EVERY: Duration = Duration::from_secs(2);
/// The longest one query may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The most of an answer read (a query returning more series than this is refused).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// What the last query said.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Answer {
    /// The samples, and the verdict on them.
    Verdict(Gate, Vec<f64>),
    Failed(String),
}

/// One rollout's stage being verified.
struct Probe {
    /// (generation, stage): a new stage asks afresh.
    stage: (i64, usize),
    asked: Option<Instant>,
    answer: Arc<Mutex<Option<Answer>>>,
    /// The last answer, for `rollout status`.
    last: Option<Answer>,
    _task: Option<AbortOnDrop<()>>,
}

#[derive(Default)]
pub(super) struct Analyses {
    client: Option<HttpsClient>,
    probes: HashMap<TemplateKey, Probe>,
}

impl Analyses {
    /// The gate's verdict for `key`'s stage `(generation, stage)` of `clusters`: a fresh
    /// answer once, Pending otherwise (asking again when due).
    pub(super) fn verdict(
        &mut self,
        key: &TemplateKey,
        analysis: &Analysis,
        stage: (i64, usize),
        clusters: &[ClusterId],
        now: Instant,
    ) -> Gate {
        let probe = self.probes.entry(key.clone()).or_insert_with(|| Probe {
            stage,
            asked: None,
            answer: Arc::default(),
            last: None,
            _task: None,
        });
        if probe.stage != stage {
            *probe = Probe {
                stage,
                asked: None,
                answer: Arc::default(),
                last: None,
                _task: None,
            };
        }
        let fresh = probe.answer.lock().take();
        if let Some(answer) = &fresh {
            probe.last = Some(answer.clone());
            probe._task = None;
        }
        let in_flight = probe._task.is_some();
        if !in_flight
            && probe
                .asked
                .is_none_or(|a| now.saturating_duration_since(a) >= EVERY)
        {
            let client = match &self.client {
                Some(c) => c.clone(),
                None => match client_for(None) {
                    Ok(c) => self.client.insert(c).clone(),
                    Err(e) => {
                        probe.last = Some(Answer::Failed(format!("no HTTPS client: {e}")));
                        return Gate::Pending;
                    }
                },
            };
            let url = query_url(&analysis.prometheus_url, &analysis.query_for(clusters));
            let answer = probe.answer.clone();
            let analysis = analysis.clone();
            probe.asked = Some(now);
            probe._task = Some(AbortOnDrop(tokio::spawn(async move {
                let said = match ask(&client, &url).await {
                    Ok(samples) => Answer::Verdict(analysis.judge(&samples), samples),
                    Err(e) => Answer::Failed(e),
                };
                *answer.lock() = Some(said);
            })));
        }
        match fresh {
            Some(Answer::Verdict(gate, _)) => gate,
            _ => Gate::Pending,
        }
    }

    /// The last answer for `key`, in words.
    pub(super) fn said(&self, key: &TemplateKey, analysis: &Analysis) -> Option<String> {
        Some(match self.probes.get(key)?.last.as_ref()? {
            Answer::Verdict(gate, samples) => {
                let worst = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                match (gate, samples.is_empty()) {
                    (_, true) => "the gate's query returned no sample: holds".to_string(),
                    (Gate::Fails, _) => format!(
                        "the gate's query returned {worst}, above {}",
                        analysis.threshold.0
                    ),
                    _ => format!(
                        "the gate's query returned at most {worst} (threshold {})",
                        analysis.threshold.0
                    ),
                }
            }
            Answer::Failed(why) => format!("the gate's query fails: {why}"),
        })
    }

    /// Keeps the probes of the templates `placed` says are still placed.
    pub(super) fn retain(&mut self, placed: impl Fn(&TemplateKey) -> bool) {
        self.probes.retain(|k, _| placed(k));
    }

    /// Stops asking for `key` (its stage no longer verifies).
    pub(super) fn forget(&mut self, key: &TemplateKey) {
        self.probes.remove(key);
    }
}

fn query_url(base: &str, query: &str) -> String {
    let encoded: String = form_urlencoded::byte_serialize(query.as_bytes()).collect();
    format!("{base}/api/v1/query?query={encoded}")
}

/// One instant query: the value of every sample it returned.
async fn ask(client: &HttpsClient, url: &str) -> Result<Vec<f64>, String> {
    let request = http::Request::get(url)
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("bad URL: {e}"))?;
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("cannot reach Prometheus: {}", crate::reason_of(&e)))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        let value: Value = serde_json::from_slice(&body)
            .map_err(|_| format!("Prometheus answered HTTP {status}, not JSON"))?;
        samples(&value)
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {} s", TIMEOUT.as_secs()))?
}

/// The values of an instant query's answer (a vector or a scalar).
fn samples(answer: &Value) -> Result<Vec<f64>, String> {
    if answer["status"] != "success" {
        return Err(format!(
            "Prometheus refused the query: {}",
            answer["error"].as_str().unwrap_or("no reason given")
        ));
    }
    let value = |v: &Value| -> Result<f64, String> {
        v.get(1)
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| format!("a sample is not [time, \"number\"]: {v}"))
    };
    let data = &answer["data"];
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| value(&s["value"]))
            .collect(),
        Some("scalar") => Ok(vec![value(&data["result"])?]),
        other => Err(format!(
            "the query returns {}, not an instant vector or scalar",
            other.unwrap_or("nothing")
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_vector_a_scalar_an_error_and_a_range_are_read_as_prometheus_answers_them() {
        let vector = json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"cluster": "m2"}, "value": [1.7e9, "0.25"]},
            {"metric": {"cluster": "m3"}, "value": [1.7e9, "NaN"]}]}});
        let got = samples(&vector).unwrap();
        assert_eq!(got[0], 0.25);
        assert!(got[1].is_nan());
        let scalar =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.7e9, "3"]}});
        assert_eq!(samples(&scalar).unwrap(), [3.0]);
        let refused =
            json!({"status": "error", "errorType": "bad_data", "error": "parse error at char 5"});
        assert_eq!(
            samples(&refused).unwrap_err(),
            "Prometheus refused the query: parse error at char 5"
        );
        let range = json!({"status": "success", "data": {"resultType": "matrix", "result": []}});
        assert!(samples(&range).unwrap_err().contains("matrix"));
        assert_eq!(
            query_url("http://p:9090", r#"up{cluster=~"m2|m3"} > 0"#),
            "http://p:9090/api/v1/query?query=up%7Bcluster%3D%7E%22m2%7Cm3%22%7D+%3E+0"
        );
    }
}
