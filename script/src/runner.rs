//! [`ScriptRunner`]: the [`Programs`] of scripts, with their compiled states cached by source.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use meridian_core::Template;
use meridian_core::placement::{ClusterInput, Judgement, Program, Programs};
use parking_lot::Mutex;
use tracing::debug;

use crate::Limits;
use crate::sandbox::Sandbox;

/// Runs `placement.script` programs ([`Programs`]): each distinct source gets one Lua state,
/// created on its first decision and reused by the next ones (one decision at a time per
/// script; different scripts run in parallel). At most [`Limits::scripts`] states are kept; the
/// least recently used goes first.
pub struct ScriptRunner {
    limits: Limits,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    /// By source text, so every policy with the same script shares one state.
    scripts: HashMap<Arc<str>, Cached>,
    /// Lookups so far: the clock of `Cached::used`.
    clock: u64,
}

struct Cached {
    /// Err: the script does not compile, with Lua's message (kept, so it is not compiled again
    /// for every decision).
    sandbox: Result<Arc<Mutex<Sandbox>>, String>,
    /// The lookup that last used it, for least-recently-used eviction.
    used: u64,
}

impl ScriptRunner {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            cache: Mutex::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// How many scripts' states are cached.
    pub fn cached(&self) -> usize {
        self.cache.lock().scripts.len()
    }

    /// The state of `source`: cached, or compiled now (outside the cache's lock, so other
    /// scripts' decisions go on meanwhile).
    pub(crate) fn sandbox(&self, source: &Arc<str>) -> Result<Arc<Mutex<Sandbox>>, String> {
        {
            let mut cache = self.cache.lock();
            cache.clock += 1;
            let now = cache.clock;
            if let Some(c) = cache.scripts.get_mut(&**source) {
                c.used = now;
                return c.sandbox.clone();
            }
        }
        let compiled = Sandbox::new(source, self.limits)
            .map(|s| Arc::new(Mutex::new(s)))
            .map_err(|e| e.to_string());
        let mut cache = self.cache.lock();
        let now = cache.clock;
        // Another decision may have compiled it meanwhile: keep the first.
        let sandbox = cache
            .scripts
            .entry(Arc::clone(source))
            .or_insert(Cached {
                sandbox: compiled,
                used: now,
            })
            .sandbox
            .clone();
        while cache.scripts.len() > self.limits.scripts.max(1) {
            let Some(oldest) = cache
                .scripts
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| Arc::clone(k))
            else {
                break;
            };
            cache.scripts.remove(&oldest);
        }
        sandbox
    }

    /// Drops the state of `source` (it is rebuilt by its next decision).
    fn forget(&self, source: &str) {
        self.cache.lock().scripts.remove(source);
    }
}

impl Default for ScriptRunner {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl fmt::Debug for ScriptRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptRunner")
            .field("limits", &self.limits)
            .field("cached", &self.cached())
            .finish()
    }
}

impl Programs for ScriptRunner {
    fn judge(
        &self,
        program: &Program,
        template: &Template,
        candidates: &[ClusterInput<'_>],
    ) -> Judgement {
        let Program::Script(script) = program else {
            return Judgement::Failed(format!(
                "{program} is not a script: the script runner runs only placement.script"
            ));
        };
        let sandbox = match self.sandbox(&script.lua) {
            Ok(s) => s,
            Err(why) => {
                debug!(template = %template.key, error = %why, "placement script does not compile");
                return Judgement::Failed(why);
            }
        };
        let result = sandbox.lock().decide(template, candidates);
        match result {
            Ok(verdicts) => Judgement::Answered(verdicts),
            Err(e) => {
                debug!(
                    template = %template.key,
                    candidates = candidates.len(),
                    error = %e,
                    "placement script failed"
                );
                if e.is_internal() {
                    self.forget(&script.lua);
                }
                Judgement::Failed(e.to_string())
            }
        }
    }
}
