//! Placeholder until rendering lands (merge takes the real module).
