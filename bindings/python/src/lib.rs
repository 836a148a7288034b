//! Python bindings of gpuslice.

use pyo3::prelude::*;

/// The native part of the `gpuslice` package.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
