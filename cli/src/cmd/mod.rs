//! One module per area; each owns its arguments and handlers.

pub mod actuate;
pub mod agent;
pub mod doctor;
pub mod dra;
pub mod export;
pub mod export_vm;
pub mod handoff;
pub mod health;
pub mod inventory;
pub mod layout;
pub mod metrics;
pub mod place;
pub mod sandbox;
