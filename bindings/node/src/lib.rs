//! Node.js bindings of gpuslice.

use napi_derive::napi;

/// The version of the gpuslice core this addon was built from.
#[napi]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}
