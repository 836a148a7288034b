//! Shared helpers for the benches.

pub mod churn;
pub mod fabric;
pub mod fleetgen;
pub mod slot_churn;
pub mod solver_slot_churn;
