//! One script's Lua state: the prelude's sandbox, the compiled chunk, the instruction hook and
//! the cluster tables, and [`Sandbox::decide`], one decision.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use meridian_core::placement::{ClusterInput, Verdict};
use meridian_core::{ClusterId, Template};
use mlua::{ChunkMode, Function, HookTriggers, Lua, LuaOptions, StdLib, Table, Value, VmState};

use crate::inputs::{self, Proto};
use crate::meter::{HOOK_EVERY, Meter, Trip};
use crate::{Error, Limits, pattern};

const PRELUDE: &str = include_str!("prelude.lua");

/// The longest rejection reason kept from a script (it ends up in status and explain).
const MAX_REASON: usize = 256;
/// Calls to the guarded table functions may touch at most this many elements.
const MAX_ELEMENTS: f64 = 16_777_216.0;
/// Above this many elements (or bytes for `string.rep`), a guarded call looks at the clock first.
const SLOW_ELEMENTS: f64 = 65_536.0;
/// More cached cluster tables than this and those the last decision did not use go.
const MAX_PROTOS: usize = 1024;

/// Where in a decision a script was when it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum At {
    TopLevel,
    Inputs,
    Filter(ClusterId),
    Score(ClusterId),
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::TopLevel => f.write_str("in the script's top level"),
            At::Inputs => f.write_str("while building its inputs"),
            At::Filter(c) => write!(f, "in filter() for cluster {c}"),
            At::Score(c) => write!(f, "in score() for cluster {c}"),
        }
    }
}

/// A compiled script in its own Lua state, reused across decisions.
pub(crate) struct Sandbox {
    lua: Lua,
    /// Shared with the hook and the library's guards.
    meter: Arc<Meter>,
    limits: Limits,
    /// The script's main chunk; run at the start of every decision, in a fresh environment.
    chunk: Function,
    /// The prelude's `new_env`.
    new_env: Function,
    /// The prelude's `freeze`.
    freeze: Function,
    /// The prelude's `run`.
    run: Function,
    /// The prelude's `st`: the phase and candidate index `run` is at, read on failures.
    st: Table,
    /// This decision's candidates' tables, 1..=n (kept between decisions, not reallocated).
    protos: Table,
    /// `run`'s answers, 1..=n (kept the same way).
    out: Table,
    /// How many of `protos` the last decision set (the rest are cleared).
    last_n: usize,
    /// Cluster tables by cluster, rebuilt when the cluster's inputs change.
    clusters: HashMap<ClusterId, Proto>,
    /// Decisions so far: the stamp of the cluster tables a decision uses.
    decisions: u64,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("limits", &self.limits)
            .field("clusters", &self.clusters.len())
            .field("decisions", &self.decisions)
            .field("memory", &self.lua.used_memory())
            .finish()
    }
}

impl Sandbox {
    /// A new state with the sandbox, and `source` compiled in it (as text only).
    pub(crate) fn new(source: &str, limits: Limits) -> Result<Self, Error> {
        let libs = StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::UTF8;
        // A panic in one of our callbacks is a bug: let it through any pcall to crash.
        let lua = Lua::new_with(libs, LuaOptions::new().catch_rust_panics(false))?;
        let meter = Arc::new(Meter::new());
        let prelude: Table = lua
            .load(PRELUDE)
            .set_name("=meridian")
            .set_mode(ChunkMode::Text)
            .call(helpers(&lua, &meter, limits)?)?;
        // Compiling is the script's work: under its memory limit (and only that, limited()).
        lua.set_memory_limit(limits.memory_bytes)?;
        let chunk = lua
            .load(source)
            .set_name("=script")
            .set_mode(ChunkMode::Text)
            .into_function()
            .map_err(|e| match e {
                mlua::Error::SyntaxError { message, .. } => Error::Compile(message),
                mlua::Error::MemoryError(_) => Error::Compile(format!(
                    "the script does not compile within its memory limit of {}",
                    mib(limits.memory_bytes)
                )),
                other => Error::Compile(other.to_string()),
            })?;
        lua.set_memory_limit(0)?;
        let hook_meter = Arc::clone(&meter);
        lua.set_hook(
            HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            move |_, _| match hook_meter.tick(u64::from(HOOK_EVERY)) {
                Ok(()) => Ok(VmState::Continue),
                Err(trip) => Err(mlua::Error::runtime(format!("{trip:?} limit"))),
            },
        )?;
        Ok(Self {
            new_env: prelude.raw_get("new_env")?,
            freeze: prelude.raw_get("freeze")?,
            run: prelude.raw_get("run")?,
            st: prelude.raw_get("st")?,
            protos: lua.create_table()?,
            out: lua.create_table()?,
            last_n: 0,
            clusters: HashMap::new(),
            decisions: 0,
            chunk,
            meter,
            limits,
            lua,
        })
    }

    /// Runs the top level alone: Err when it fails, or defines neither function.
    pub(crate) fn probe(&mut self) -> Result<(), Error> {
        let answer = self.metered(&[], |s| {
            s.st.raw_set("phase", "inputs")?;
            s.limited(|s| {
                let env: Table = s.new_env.call(())?;
                s.chunk.set_environment(env.clone())?;
                s.run
                    .call((&s.chunk, env, &s.protos, 0, Value::Nil, &s.out))
            })
        })?;
        self.answered(answer, &[]).map(|_| ())
    }

    /// One decision: a verdict per candidate, in their order.
    pub(crate) fn decide(
        &mut self,
        template: &Template,
        candidates: &[ClusterInput<'_>],
    ) -> Result<Vec<Verdict>, Error> {
        self.decisions += 1;
        let answer = self.metered(candidates, |s| {
            s.st.raw_set("phase", "inputs")?;
            s.set_protos(candidates)?;
            let workload = inputs::workload(&s.lua, template)?;
            // Freezing new cluster tables is the sandbox's work, not the script's.
            s.meter.restart_count();
            s.limited(|s| {
                let env: Table = s.new_env.call(())?;
                s.chunk.set_environment(env.clone())?;
                s.run
                    .call((&s.chunk, env, &s.protos, candidates.len(), workload, &s.out))
            })
        })?;
        let verdicts = self.answered(answer, candidates)?;
        if self.clusters.len() > MAX_PROTOS {
            let now = self.decisions;
            self.clusters.retain(|_, p| p.seen == now);
        }
        Ok(verdicts)
    }

    /// Instructions the last decision ran (to the hook's granularity of 128).
    #[cfg(test)]
    pub(crate) fn instructions_used(&self) -> u64 {
        self.meter.used()
    }

    /// Runs `f` (the script's part of a decision) under the memory limit. The rest of the time
    /// the state has none: with one, mlua guards every table read and write against an
    /// allocation failure, which makes building the inputs and reading the answers 4 times
    /// slower, and those are the sandbox's own tables, sized by the fleet, not by the script.
    fn limited<T>(&mut self, f: impl FnOnce(&mut Self) -> mlua::Result<T>) -> mlua::Result<T> {
        self.lua.set_memory_limit(self.limits.memory_bytes)?;
        let result = f(self);
        self.lua.set_memory_limit(0)?;
        result
    }

    /// Runs `f` under the decision's limits, and turns what stopped it into an [`Error`].
    fn metered<T>(
        &mut self,
        candidates: &[ClusterInput<'_>],
        f: impl FnOnce(&mut Self) -> mlua::Result<T>,
    ) -> Result<T, Error> {
        self.meter.start(self.limits.instructions, self.limits.time);
        let result = f(self);
        self.meter.stop();
        result.map_err(|e| {
            let at = self.at(candidates);
            let error = match self.meter.tripped() {
                Some(Trip::Instructions) => Error::Instructions {
                    budget: self.limits.instructions,
                    at,
                },
                Some(Trip::Time) => Error::Time {
                    limit: self.limits.time,
                    at,
                },
                None if is_memory(&e) => Error::Memory {
                    limit: mib(self.limits.memory_bytes),
                    at,
                },
                None => Error::Runtime {
                    message: message(&e),
                    at,
                },
            };
            // What the failed decision left (a half-built string, its tables) goes now, so
            // the next decision starts with the memory it would have had.
            let _ = self.lua.gc_collect();
            let _ = self.lua.gc_collect();
            error
        })
    }

    /// Where the prelude's `run` was, from `st`.
    fn at(&self, candidates: &[ClusterInput<'_>]) -> At {
        let phase: Option<String> = self.st.raw_get("phase").ok();
        let i: usize = self.st.raw_get("i").unwrap_or(0);
        let cluster = || {
            i.checked_sub(1)
                .and_then(|i| candidates.get(i))
                .map(|c| c.view.spec.id.clone())
        };
        match (phase.as_deref(), cluster()) {
            (Some("top"), _) => At::TopLevel,
            (Some("filter"), Some(c)) => At::Filter(c),
            (Some("score"), Some(c)) => At::Score(c),
            _ => At::Inputs,
        }
    }

    /// The candidates' tables into `protos[1..=n]`, built for those whose inputs changed.
    fn set_protos(&mut self, candidates: &[ClusterInput<'_>]) -> mlua::Result<()> {
        let stamp = self.decisions;
        for (i, c) in candidates.iter().enumerate() {
            let id = &c.view.spec.id;
            let fresh = match self.clusters.get_mut(id) {
                Some(p) => p.is_for(c) || p.refresh(c)?,
                None => false,
            };
            if !fresh {
                let p = Proto::build(&self.lua, &self.freeze, c, stamp)?;
                self.clusters.insert(id.clone(), p);
            }
            let proto = self
                .clusters
                .get_mut(id)
                .expect("present or inserted above");
            proto.seen = stamp;
            self.protos.raw_set(i + 1, &proto.table)?;
        }
        for i in candidates.len()..self.last_n {
            self.protos.raw_set(i + 1, Value::Nil)?;
        }
        self.last_n = candidates.len();
        Ok(())
    }

    /// `run`'s answer and `out` as verdicts.
    fn answered(
        &self,
        answer: Value,
        candidates: &[ClusterInput<'_>],
    ) -> Result<Vec<Verdict>, Error> {
        match answer {
            Value::Nil => {}
            Value::Boolean(false) => return Err(Error::Neither),
            Value::String(why) => return Err(Error::Contract(why.to_string_lossy())),
            other => return Err(Error::Internal(format!("run answered {other:?}"))),
        }
        let mut verdicts = Vec::with_capacity(candidates.len());
        for i in 1..=candidates.len() {
            let verdict = match self.out.raw_get(i)? {
                Value::Boolean(true) => Verdict::default(),
                Value::Integer(s) => Verdict {
                    rejected: None,
                    score: Some(u32::try_from(s).unwrap_or(0)),
                },
                // `run` checked the range: rounding stays in [0, 100].
                Value::Number(s) => Verdict {
                    rejected: None,
                    score: Some(s.round() as u32),
                },
                Value::String(why) => Verdict {
                    rejected: Some(reason(&why.to_string_lossy())),
                    score: None,
                },
                other => return Err(Error::Internal(format!("run left {other:?} at {i}"))),
            };
            verdicts.push(verdict);
        }
        Ok(verdicts)
    }
}

/// The Rust side of the prelude's guards (pattern.rs, and the size of what a call builds or
/// moves). Each answers nil, or the reason the call is refused (the prelude raises it at the
/// script's line); a guard past the deadline trips the meter, so the refusal is final.
fn helpers(lua: &Lua, meter: &Arc<Meter>, limits: Limits) -> mlua::Result<Table> {
    let h = lua.create_table()?;
    let m = Arc::clone(meter);
    h.raw_set(
        "too_complex",
        lua.create_function(
            move |_, (len, p, anchorable): (usize, mlua::String, bool)| {
                let steps = pattern::steps(len, &p.as_bytes(), anchorable);
                Ok(refuse(
                    &m,
                    steps,
                    pattern::MAX_STEPS,
                    pattern::SLOW_STEPS,
                    || {
                        format!(
                            "pattern too complex for a subject of {len} bytes \
                         (up to {steps:.1e} matching steps; the limit is {:.1e})",
                            pattern::MAX_STEPS
                        )
                    },
                ))
            },
        )?,
    )?;
    let m = Arc::clone(meter);
    h.raw_set(
        "plain_too_complex",
        lua.create_function(move |_, (len, needle): (usize, usize)| {
            let steps = pattern::plain_steps(len, needle);
            Ok(refuse(
                &m,
                steps,
                pattern::MAX_STEPS,
                pattern::SLOW_STEPS,
                || {
                    format!(
                        "searching {len} bytes for {needle} bytes is too much work for one call"
                    )
                },
            ))
        })?,
    )?;
    let m = Arc::clone(meter);
    let memory = limits.memory_bytes as f64;
    h.raw_set(
        "rep_too_big",
        lua.create_function(move |_, (len, n, sep): (usize, f64, usize)| {
            let bytes = len as f64 * n + sep as f64 * (n - 1.0).max(0.0);
            Ok(refuse(&m, bytes, memory, SLOW_ELEMENTS * 16.0, || {
                format!(
                    "string.rep would build {bytes:.0} bytes, over the script's memory limit of {}",
                    mib(limits.memory_bytes)
                )
            }))
        })?,
    )?;
    let m = Arc::clone(meter);
    h.raw_set(
        "too_many",
        lua.create_function(move |_, count: f64| {
            Ok(refuse(&m, count, MAX_ELEMENTS, SLOW_ELEMENTS, || {
                format!(
                    "{count:.0} elements are too many for one call (the limit is {MAX_ELEMENTS:.0})"
                )
            }))
        })?,
    )?;
    let m = Arc::clone(meter);
    h.raw_set(
        "tripped",
        lua.create_function(move |_, ()| Ok(m.tripped().is_some()))?,
    )?;
    Ok(h)
}

/// None when `cost` is fine; the reason when it is over `max`, or when it is over `slow` and the
/// decision is out of time.
fn refuse(
    meter: &Meter,
    cost: f64,
    max: f64,
    slow: f64,
    why: impl FnOnce() -> String,
) -> Option<String> {
    if cost.is_nan() || cost > max {
        return Some(why());
    }
    if cost > slow && meter.check_time().is_err() {
        return Some("time limit".to_owned());
    }
    None
}

fn is_memory(e: &mlua::Error) -> bool {
    match e {
        mlua::Error::MemoryError(_) => true,
        mlua::Error::CallbackError { cause, .. } => is_memory(cause),
        mlua::Error::WithContext { cause, .. } => is_memory(cause),
        _ => false,
    }
}

/// A Lua error's own message, without mlua's traceback (it shows the prelude's frames). An
/// error a library function raised inside one of the prelude's wrappers is placed by Lua at the
/// wrapper's line (`meridian:80: bad argument #1 to 'rep'`): it gets the script's line that
/// called the wrapper instead, from the traceback.
fn message(e: &mlua::Error) -> String {
    let text = match e {
        mlua::Error::RuntimeError(m) => m.as_str(),
        mlua::Error::CallbackError { cause, .. } => return message(cause),
        other => return other.to_string(),
    };
    let (message, traceback) = text.split_once("\nstack traceback:").unwrap_or((text, ""));
    // error() with a table (or a function): Lua's own words, not an address.
    if let Some((kind, address)) = message.split_once(": 0x")
        && matches!(kind, "table" | "function" | "thread" | "userdata")
        && address.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return format!("(error object is a {kind} value)");
    }
    let Some(rest) = message.strip_prefix("meridian:") else {
        return message.to_owned();
    };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    let rest = rest.strip_prefix(": ").unwrap_or(rest);
    let caller = traceback
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("script:"))
        .and_then(|l| {
            let line = l["script:".len()..].split(':').next()?;
            line.parse::<u32>().ok()
        });
    match caller {
        Some(line) => format!("script:{line}: {rest}"),
        None => rest.to_owned(),
    }
}

/// A rejection reason as kept: the script's, cut to [`MAX_REASON`] bytes; a default if empty.
fn reason(why: &str) -> String {
    if why.is_empty() {
        return "rejected by the script's filter()".to_owned();
    }
    let mut end = why.len().min(MAX_REASON);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    why[..end].to_owned()
}

pub(crate) fn mib(bytes: usize) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}
