//! The programs placement runs for a policy (scores from webhooks and scripts):
//! each kind to its runner.

use meridian_controllers::SourceEvent;
use meridian_controllers::scoring::{Settings, Webhooks};
use meridian_core::placement::{ClusterInput, Judgement, Program, Programs, Template};
use meridian_script::{ScriptPool, ScriptRunner};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

/// Threads running placement scripts: scripts are CPU work, and one core stays for serving.
const SCRIPT_WORKERS: usize = 1;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JudgementLabels {
    /// script, webhook.
    program: &'static str,
    /// answered, pending, failed.
    result: &'static str,
}

/// Where scripts run: in the caller (validate, which only checks), or on the pool's workers
/// (serve and render: never on the writer).
#[derive(Debug)]
enum Scripts {
    Inline(ScriptRunner),
    Pool(ScriptPool),
}

/// Webhooks to the scoring webhook client, scripts to the Lua sandbox.
#[derive(Debug)]
pub struct Runners {
    webhooks: Option<Webhooks>,
    scripts: Scripts,
    /// `meridian_placement_program_judgements_total{program, result}`.
    judgements: Family<JudgementLabels, Counter>,
}

impl Runners {
    /// Scripts only: for commands that make no calls (validate).
    pub fn offline() -> Self {
        Self {
            webhooks: None,
            scripts: Scripts::Inline(ScriptRunner::default()),
            judgements: Family::default(),
        }
    }

    /// Scripts and webhooks; the returned task makes the webhook calls, and each answer that
    /// changes something is sent as an event so the fleet decides again.
    pub fn serving(
        events: mpsc::Sender<SourceEvent>,
        registry: &mut Registry,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + use<>) {
        let wake = {
            let events = events.clone();
            std::sync::Arc::new(move || {
                // Full: a wake is queued already, and the fleet decides again anyway.
                let _ = events.try_send(SourceEvent::ProgramsAnswered);
            })
        };
        let (webhooks, task) = Webhooks::new(Settings::default(), events, registry);
        let runners = Self {
            webhooks: Some(webhooks),
            scripts: Scripts::Pool(ScriptPool::new(
                ScriptRunner::default(),
                SCRIPT_WORKERS,
                wake,
            )),
            judgements: Family::default(),
        };
        registry.register(
            "program_judgements",
            "Answers of placement scripts and scoring webhooks, by result",
            runners.judgements.clone(),
        );
        (runners, task)
    }
}

impl Runners {
    /// Webhook calls asked for and not answered yet (0 offline).
    pub fn calls_in_flight(&self) -> usize {
        let scripts = match &self.scripts {
            Scripts::Inline(_) => 0,
            Scripts::Pool(pool) => pool.in_flight(),
        };
        self.webhooks.as_ref().map_or(0, Webhooks::in_flight) + scripts
    }
}

impl Programs for Runners {
    fn judge(
        &self,
        program: &Program,
        template: &Template,
        candidates: &[ClusterInput<'_>],
    ) -> Judgement {
        let judgement = match (program, &self.webhooks) {
            (Program::Script(_), _) => match &self.scripts {
                Scripts::Inline(runner) => runner.judge(program, template, candidates),
                Scripts::Pool(pool) => pool.judge(program, template, candidates),
            },
            (Program::Webhook(_), Some(webhooks)) => webhooks.judge(program, template, candidates),
            (Program::Webhook(_), None) => {
                Judgement::Failed("scoring webhooks are not called by validate".into())
            }
        };
        let labels = JudgementLabels {
            program: match program {
                Program::Script(_) => "script",
                Program::Webhook(_) => "webhook",
            },
            result: match &judgement {
                Judgement::Answered(_) => "answered",
                Judgement::Pending => "pending",
                Judgement::Failed(_) => "failed",
            },
        };
        self.judgements.get_or_create(&labels).inc();
        judgement
    }
}
