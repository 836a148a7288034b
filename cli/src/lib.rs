//! The `gpuslice` command's code, shared by its two binaries.
//!
//! - `gpuslice` runs every one-shot command (inventory, health, vGPUs, layouts, placement,
//!   export, doctor) and leaves the servers' stacks out, so it starts quickly.
//! - `gpuslice-agent` runs the long-running servers as well ([`Served`]: `gpuslice agent`,
//!   `gpuslice metrics --listen`, `gpuslice dra publish`), with the agent's HTTP, gRPC, TLS
//!   and Kubernetes client. `gpuslice` hands those commands to it (`exec`), so users and
//!   service files keep writing `gpuslice agent`.

mod app;
mod cmd;
mod common;

pub use app::{AGENT_BINARY, Served, command, main, serve_here, serve_in_agent_binary};
