//! The decision itself (filled in by the placement work).

use std::time::Instant;

use super::{Decision, Inputs, Placements};

/// The memory placement keeps between rounds.
#[derive(Debug, Default)]
pub struct Placer {}

impl Placer {
    pub fn new() -> Self {
        Self::default()
    }

    /// One round: a decision for every template a policy selects, and for the dependencies
    /// of the workloads placed.
    pub fn place(&mut self, inputs: Inputs<'_>, now: Instant) -> Placements {
        let _ = (inputs, now);
        todo!("placement")
    }
}

/// Placeholder.
pub fn decide() -> Option<Decision> {
    None
}
