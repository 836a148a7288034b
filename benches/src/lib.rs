//! Shared helpers for the benches.

pub mod fleetgen;
