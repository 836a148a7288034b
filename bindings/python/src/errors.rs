//! One Python exception class per core error kind, and the mapping of every core error to one.
//!
//! The crates' error enums are sorted into a [`Failure`] first (a plain Rust value that can cross
//! `Python::detach`), which becomes a Python exception only once the GIL is held again. Structured
//! data travels as attributes: `Unsatisfiable.reasons`, `HostError.path` / `.errno`.

use gpu_core::{Classified, ClassifiedError, CoreError, ErrorDetail, ErrorFamily, ErrorKind};

pub use gpu_core::Input;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

pyo3::create_exception!(
    gpuslice,
    Error,
    PyException,
    "Base class of every error gpuslice raises."
);
pyo3::create_exception!(
    gpuslice,
    Unsatisfiable,
    Error,
    "No node can hold the Machine. `.reasons` lists each refused node with its structured \
     reasons; `.refusal` is the whole refusal document."
);
pyo3::create_exception!(
    gpuslice,
    InvalidRequest,
    Error,
    "The Machine, a name, a policy or another argument is malformed or clashes with the fleet."
);
pyo3::create_exception!(
    gpuslice,
    NotFound,
    Error,
    "No Machine or node of that name is in the fleet. `.kind` is `machine` or `node`, `.name` \
     the name asked for."
);
pyo3::create_exception!(
    gpuslice,
    HostError,
    Error,
    "Reading the host failed. `.path` is the path concerned (relative to the root), `.errno` the \
     kernel's error number when there is one."
);
pyo3::create_exception!(
    gpuslice,
    ConfigError,
    Error,
    "A configuration document (fleet, topology, vGPU layout file, health policy) is malformed \
     or cannot be applied. For layout files `.kind` says how (`unknown-config`, `unknown-type`, \
     `does-not-fit`, ...)."
);

/// A library error on its way to Python: classified by gpuslice's one extractor
/// ([`Classified::of`]); its kind decides the exception class, its detail the attributes.
#[derive(Debug, Clone)]
pub enum Failure {
    /// An error of gpuslice's libraries.
    Typed(Classified),
    /// A refusal of the solver, kept as its value: the grouped summary is attached at once and
    /// the per-node detail only when read ([`crate::refusal`]), so a refusal on a large fleet
    /// costs what it says, not what the fleet holds.
    Refused {
        /// The error's kind.
        kind: ErrorKind,
        /// The message (the grouped summary).
        message: String,
        /// The refusal.
        refusal: std::sync::Arc<gpu_sched::Refusal>,
    },
    /// The base [`Error`], for failures of the binding itself.
    Other(String),
}

impl Failure {
    /// An error of `kind` with nothing but its message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure::Typed(Classified::new(kind, message))
    }

    /// Any library error.
    pub fn of(e: &dyn ClassifiedError) -> Self {
        Failure::Typed(Classified::of(e))
    }

    /// A model error: requests are the caller's input, documents are configuration.
    pub fn core(e: &CoreError, input: Input) -> Self {
        Failure::Typed(Classified::of_model(e, input))
    }

    /// A scheduler error; a refusal keeps the solver's value (see [`Failure::Refused`]).
    pub fn sched(e: gpu_sched::SchedError) -> Self {
        let kind = e.kind();
        match e {
            gpu_sched::SchedError::Unsatisfiable(refusal) => Failure::Refused {
                kind,
                message: refusal.to_string(),
                refusal: std::sync::Arc::new(refusal),
            },
            other => Failure::of(&other),
        }
    }

    #[allow(clippy::type_complexity)]
    fn parts(
        self,
    ) -> (
        ErrorKind,
        String,
        ErrorDetail,
        Option<std::sync::Arc<gpu_sched::Refusal>>,
    ) {
        match self {
            Failure::Typed(c) => (c.kind, c.message, c.detail, None),
            Failure::Refused {
                kind,
                message,
                refusal,
            } => (kind, message, ErrorDetail::None, Some(refusal)),
            Failure::Other(message) => (ErrorKind::Other, message, ErrorDetail::None, None),
        }
    }

    /// Converts to the Python exception, attaching the structured attributes.
    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let (kind, message, detail, refusal) = self.parts();
        // The one table: the kind's family decides the class.
        let err = match kind.family() {
            ErrorFamily::Unsatisfiable => PyErr::new::<Unsatisfiable, _>(message),
            ErrorFamily::InvalidRequest => PyErr::new::<InvalidRequest, _>(message),
            ErrorFamily::NotFound => PyErr::new::<NotFound, _>(message),
            ErrorFamily::Host => PyErr::new::<HostError, _>(message),
            ErrorFamily::Config => PyErr::new::<ConfigError, _>(message),
            ErrorFamily::Other => PyErr::new::<Error, _>(message),
        };
        set_attr(py, &err, "error_kind", &kind.as_str());
        if kind.is_layout() {
            set_attr(py, &err, "kind", &kind.as_str());
        }
        match detail {
            ErrorDetail::None => {}
            ErrorDetail::Refusal(refusal) => {
                let reasons = ErrorDetail::refused_nodes(&refusal);
                set_attr(py, &err, "reasons", &reasons);
                set_attr(py, &err, "refusal", &refusal);
            }
            ErrorDetail::Missing { what, name } => {
                set_attr(py, &err, "kind", &what);
                set_attr(py, &err, "name", &name);
            }
            ErrorDetail::Host { path, errno } => {
                set_attr(py, &err, "path", &path);
                set_attr(py, &err, "errno", &errno);
            }
        }
        if let Some(refusal) = refusal {
            crate::refusal::attach(py, &err, refusal);
        }
        err
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> Self {
        Python::attach(|py| f.into_pyerr(py))
    }
}

/// Sets an attribute on the exception value; a failure here leaves the attribute at the class
/// default rather than replacing the error being raised.
fn set_attr<T: serde::Serialize>(py: Python<'_>, err: &PyErr, name: &str, value: &T) {
    if let Ok(v) = crate::pyserde::to_py(py, value) {
        let _ = err.value(py).setattr(name, v);
    }
}

/// Registers the exception classes on the module, with the defaults of their attributes on the
/// class so that instances raised by Python code have them too.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let none = py.None();
    py.get_type::<Error>().setattr("error_kind", "error")?;
    let unsat = py.get_type::<Unsatisfiable>();
    unsat.setattr("reasons", ())?;
    unsat.setattr("refusal", none.clone_ref(py))?;
    let nf = py.get_type::<NotFound>();
    nf.setattr("kind", none.clone_ref(py))?;
    nf.setattr("name", none.clone_ref(py))?;
    let host = py.get_type::<HostError>();
    host.setattr("path", none.clone_ref(py))?;
    host.setattr("errno", none)?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("Unsatisfiable", unsat)?;
    m.add("InvalidRequest", py.get_type::<InvalidRequest>())?;
    m.add("NotFound", nf)?;
    m.add("HostError", host)?;
    let config = py.get_type::<ConfigError>();
    config.setattr("kind", py.None())?;
    m.add("ConfigError", config)?;
    Ok(())
}
