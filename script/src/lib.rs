//! Lua placement policies (`placement.script.lua`), run in a sandbox: the [`Programs`] of
//! `Program::Script` ([`ScriptRunner`], run by the caller; [`ScriptPool`], run on worker
//! threads with verdicts cached by input, so the writer never runs a script), and [`check`]
//! for policy validation.
//!
//! ```text
//!  decide (core) ── judge(Program::Script, template, candidates) ──► ScriptRunner
//!                                                                      │ cache by source text
//!                                                                      │ (≤ Limits::scripts, LRU)
//!                                                                      ▼
//!   Sandbox (one Lua 5.4 state per script, one decision at a time)
//!     candidates ─► cluster tables (read-only views, cached per cluster, updated in place)
//!     template ───► workload table (read-only view, once per decision)
//!     prelude.lua `run`: fresh globals ─► the chunk's top level ─► per candidate:
//!       filter(cluster, workload) ─► score(cluster, workload) (if kept) ─► checked answer
//!     ─► one Verdict per candidate, or Judgement::Failed(reason)
//! ```
//!
//! # The script
//! A Lua 5.4 chunk, loaded as text only (bytecode is refused), that defines the globals
//! `filter(cluster, workload)` and/or `score(cluster, workload)`; [`check`] refuses one that
//! defines neither. Every decision runs the chunk's top level again in fresh globals, so nothing
//! a script stores survives a decision, and a decision depends on its inputs alone.
//! - `filter` returns `true` (kept), `false` or `false, "reason"` (filtered out); anything else
//!   fails the decision. No `filter`: every candidate is kept.
//! - `score` returns a number in [0, 100], rounded to the nearest integer; NaN, out of range or
//!   not a number fails the decision (`score() returned 140 for cluster eu-1, outside [0, 100]`).
//!   It is not called for a cluster `filter` rejected. No `score`: no score (`score: None`).
//!
//! # Inputs
//! `cluster`: `name`, `labels` (table), `region`, `zone`, `network` (strings or nil), `health`
//! (`"Healthy"`, `"Degraded"`, `"Unreachable"`), `endpoints` (integer), `taints` (list of
//! `{key, value, effect}`), `capacity` (nil when unknown; else the free `cpu_millis`,
//! `memory_bytes`, `gpus`, `pods` — allocatable less requested — plus `allocatable` and
//! `requested` tables of the same four), `cost` (nil, or `cpu_core_hour`, `memory_gib_hour`,
//! `egress_gib`, `spot_ratio`). `workload`: `api_version`, `kind`, `namespace`, `name`,
//! `labels`, `annotations` (string values of `metadata.annotations`), `replicas` (nil for a kind
//! placed whole), `requests` (`cpu_millis`, `memory_bytes`, `gpus`, `pods` of one replica).
//! Both are read-only (writing raises `the cluster and workload tables are read-only`): a
//! cluster's table is built once and shared by the decisions that follow — its health,
//! endpoints and capacity are updated in place, anything else builds it again — which is what
//! keeps a decision over 255 clusters under a millisecond (`examples/score_bench.rs`).
//! `pairs`, `ipairs`, `next`, `#`, `rawget`, `rawlen` read them as plain tables.
//!
//! # The sandbox
//! Only these globals exist: `assert error getmetatable ipairs next pairs pcall rawequal rawget
//! rawlen rawset select setmetatable tonumber tostring type _VERSION _G`, and the libraries
//! `string` (without `dump`), `table`, `math` (without `random`, `randomseed`: decisions are
//! deterministic) and `utf8`. No `os`, `io`, `require`, `package`, `debug`, `coroutine`, `load`,
//! `dofile`, `loadfile`, `collectgarbage`, `print`. And, to keep decisions deterministic and
//! every limit enforceable:
//! - `pairs` visits keys in a fixed order: numbers, strings in byte order, `false`, `true`, then
//!   other keys. (Lua seeds its string hash per state, so hash order — `next`'s — differs between
//!   two states of the same script: a script should not depend on `next`'s order, nor on
//!   `tostring` of a table or `%p`, which show addresses.)
//! - `setmetatable` refuses a metatable with `__gc` or `__close`: finalizers, and to-be-closed
//!   variables closed while an error unwinds, run where no hook can stop them. It sets a copy
//!   the script cannot reach (`getmetatable` answers the table it passed), so neither can be
//!   added afterwards.
//! - `pcall` does not catch a limit: once one is hit, the decision ends.
//! - `getmetatable("")` is `false`; the strings' methods are the decision's `string` table.
//!
//! # Limits ([`Limits`])
//! - **Instructions**: each decision — the top level, every `filter` and `score` call, and
//!   `run`'s checks of their answers (≈ 25 instructions per candidate) — may run
//!   [`Limits::instructions`] VM instructions (default 1,000,000, counted by a hook every 128;
//!   a simple filter and score over 255 clusters take ≈ 15,000). Exceeded: `script exceeded its
//!   budget of 1000000 instructions in score() for cluster eu-1`.
//! - **Memory**: while the script runs (and compiles), its state may hold
//!   [`Limits::memory_bytes`] (default 16 MiB, the inputs included); `string.rep` past it is
//!   refused before it allocates. Exceeded: `script exceeded its memory limit of 16 MiB in …`
//!   (a script may `pcall` an allocation that fails, as in plain Lua).
//! - **Time**: a decision past [`Limits::time`] (default 250 ms) stops at the next hook or
//!   guarded call. This is the backstop for work done inside C, where the hook does not fire:
//!   pattern matching is bounded before each call (`pattern.rs`; a hopeless pattern is refused
//!   outright), as are `table.sort`, `move`, `insert` and `remove` (at most 2^24 elements); the
//!   rest (`..`, `string.format`, `table.concat`) is bounded by the memory limit.
//! - A runtime error fails the decision with the script's message and line: `in score() for
//!   cluster eu-1: script:3: attempt to index a nil value (field 'cost')`.
//!
//! After any failure the state is collected and used again by the next decision.
//!
//! [`Programs`]: meridian_core::placement::Programs

use std::time::Duration;

mod inputs;
mod meter;
mod pattern;
mod pool;
mod runner;
mod sandbox;

#[cfg(test)]
mod tests;

pub use pool::{ScriptPool, Wake};
pub use runner::ScriptRunner;

use sandbox::{At, Sandbox};

/// What one script may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// VM instructions per decision (the top level, every filter and score call).
    pub instructions: u64,
    /// Bytes one script's Lua state may hold (the sandbox itself takes about 100 KiB).
    pub memory_bytes: usize,
    /// Wall-clock time per decision: the backstop for work inside C functions.
    pub time: Duration,
    /// Scripts whose states a [`ScriptRunner`] keeps.
    pub scripts: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            instructions: 1_000_000,
            memory_bytes: 16 << 20,
            time: Duration::from_millis(250),
            scripts: 32,
        }
    }
}

/// Why a script failed a decision (or its check); the Display is the `Judgement::Failed` reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("{0}")]
    Compile(String),
    #[error("script defines neither filter nor score")]
    Neither,
    #[error("script exceeded its budget of {budget} instructions {at}")]
    Instructions { budget: u64, at: At },
    #[error("script exceeded its time limit of {} ms {at}", .limit.as_millis())]
    Time { limit: Duration, at: At },
    #[error("script exceeded its memory limit of {limit} {at}")]
    Memory { limit: String, at: At },
    #[error("{at}: {message}")]
    Runtime { message: String, at: At },
    /// A result outside the contract (a filter returning a string, a score of 140).
    #[error("{0}")]
    Contract(String),
    #[error("internal error in the script sandbox: {0}")]
    Internal(String),
    #[error("internal error in the script sandbox: {0}")]
    Lua(#[from] mlua::Error),
}

impl Error {
    /// The sandbox itself failed, not the script: its state is not to be trusted again.
    pub(crate) fn is_internal(&self) -> bool {
        matches!(self, Error::Internal(_) | Error::Lua(_))
    }
}

/// Compiles `source` in the sandbox and runs its top level there (under the default
/// [`Limits`]): Err with Lua's message (and line) when it does not compile or fails, or when it
/// defines neither `filter` nor `score`.
pub fn check(source: &str) -> Result<(), String> {
    Sandbox::new(source, Limits::default())
        .and_then(|mut s| s.probe())
        .map_err(|e| e.to_string())
}
