//! Python bindings of gpuslice: the `gpuslice._native` extension module.
//!
//! An adapter only: it converts Python values to the model's types and back, holds the
//! scheduler's state behind a lock, maps each core error kind to its own exception class, and
//! releases the GIL around work that reads the host or searches the fleet. Every decision is made
//! by the Rust crates (`gpu-core`, `gpu-sched`, `gpu-sysfs`, `gpu-health`, `gpu-integrations`), shared with the CLI
//! and the Node package.

mod convert;
mod errors;
mod fleet;
mod host;
mod integrations;
mod layout;
mod pyde;
mod pyserde;
mod refusal;
mod repr;

use pyo3::prelude::*;

// The scheduler allocates and frees many small objects per placement. Inside a Python process
// glibc's allocator interleaves them with the interpreter's and spends much of a `place` call
// consolidating free lists; mimalloc keeps the extension's allocations apart and fast (as
// pydantic-core and polars do).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The native part of the `gpuslice` package; import `gpuslice` instead.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    refusal::register(m)?;
    m.add_class::<fleet::Fleet>()?;
    m.add_function(wrap_pyfunction!(host::discover, m)?)?;
    m.add_function(wrap_pyfunction!(host::health, m)?)?;
    m.add_function(wrap_pyfunction!(layout::plan_vgpu_config, m)?)?;
    m.add_function(wrap_pyfunction!(integrations::export_dra, m)?)?;
    m.add_function(wrap_pyfunction!(integrations::metrics_text, m)?)?;
    m.add_function(wrap_pyfunction!(integrations::export_kubevirt, m)?)?;
    m.add_function(wrap_pyfunction!(integrations::qemu_args, m)?)?;
    Ok(())
}
