//! Overrides (TODO)
