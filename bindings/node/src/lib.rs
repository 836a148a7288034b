//! Node.js bindings of gpuslice (napi-rs).
//!
//! An adapter only: it converts JavaScript values to the model's types and back, holds the
//! scheduler's state behind a lock, maps each core error kind to a JS `Error` with its own
//! `code`, and runs discovery and placement on the libuv thread pool for the `...Async`
//! variants. Every decision is made by the Rust crates (`gpu-core`, `gpu-sched`, `gpu-sysfs`,
//! `gpu-health`, `gpu-integrations`), shared with the CLI and the Python package.

// napi registers the exported items only outside Rust test builds.
#![cfg_attr(test, allow(dead_code))]

mod convert;
mod errors;
mod fleet;
mod host;
mod integrations;
mod layout;
mod refusal;

use napi_derive::napi;

/// The version of the gpuslice core this addon was built from.
#[napi]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}
