//! Render (TODO)
