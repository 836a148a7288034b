//! One module per area; each owns its arguments and handlers.

pub mod agent;
pub mod doctor;
pub mod dra;
pub mod export;
pub mod export_vm;
pub mod fabric;
pub mod gpu;
pub mod handoff;
pub mod health;
pub mod layout;
pub mod metrics;
pub mod mig;
pub mod place;
pub mod realize;
pub mod sandbox;
pub mod sriov;
pub mod topology;
pub mod vgpu;
