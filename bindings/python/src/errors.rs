//! One Python exception class per core error kind, and the mapping of every core error to one.
//!
//! The crates' error enums are sorted into a [`Failure`] first (a plain Rust value that can cross
//! `Python::detach`), which becomes a Python exception only once the GIL is held again. Structured
//! data travels as attributes: `Unsatisfiable.reasons`, `HostError.path` / `.errno`.

use gpu_core::{CoreError, ErrorFamily, ErrorKind};
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

/// A library error on its way to Python: its kind (from gpuslice's one vocabulary) decides the
/// exception class; the structured data it carries becomes attributes.
#[derive(Debug, Clone)]
pub enum Failure {
    /// An error of gpuslice's libraries.
    Typed {
        /// The kind (`unsatisfiable`, `invalid-config`, `does-not-fit`, ...).
        kind: ErrorKind,
        /// The rendered message.
        message: String,
        /// Structured data for attributes.
        detail: Detail,
    },
    /// The base [`Error`], for failures of the binding itself.
    Other(String),
}

/// Structured data an exception carries besides its message.
#[derive(Debug, Clone)]
pub enum Detail {
    /// Nothing more.
    None,
    /// `Unsatisfiable.refusal` / `.reasons` / `.groups` ([`crate::refusal`]).
    Refusal(std::sync::Arc<gpu_sched::Refusal>),
    /// `NotFound.kind` (`machine` or `node`) and `.name`.
    Missing {
        /// `machine` or `node`.
        what: &'static str,
        /// The name asked for.
        name: String,
    },
    /// `HostError.path` and `.errno`.
    Host {
        /// The path concerned, when known.
        path: Option<String>,
        /// The errno, when the failure was an I/O error.
        errno: Option<i32>,
    },
}

/// Which kind of document a model error concerns: it decides between `InvalidRequest` (what the
/// caller asks for) and `ConfigError` (documents describing the fleet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A Machine, a name, or another argument of a call.
    Request,
    /// A fleet, a node topology or another configuration document.
    Config,
}

impl Failure {
    /// An error of `kind` with nothing but its message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure::Typed {
            kind,
            message: message.into(),
            detail: Detail::None,
        }
    }

    /// Sorts a model error: requests are the caller's input, documents are configuration.
    pub fn core(e: &CoreError, input: Input) -> Self {
        let kind = match input {
            Input::Request => e.kind(),
            Input::Config => e.kind_in_config(),
        };
        Failure::new(kind, e.to_string())
    }

    /// A vGPU layout error (`ConfigError` with `.kind`).
    pub fn layout(e: &gpu_core::layout::LayoutError) -> Self {
        Failure::new(e.kind(), e.to_string())
    }

    /// An integrations error (DRA, metrics, KubeVirt, QEMU hand-off).
    pub fn integration(e: &gpu_integrations::IntegrationError) -> Self {
        Failure::new(e.kind(), e.to_string())
    }

    /// Converts to the Python exception, attaching the structured attributes.
    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let (kind, message, detail) = match self {
            Failure::Typed {
                kind,
                message,
                detail,
            } => (kind, message, detail),
            Failure::Other(message) => (ErrorKind::Other, message, Detail::None),
        };
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
            Detail::None => {}
            Detail::Refusal(refusal) => crate::refusal::attach(py, &err, refusal),
            Detail::Missing { what, name } => {
                set_attr(py, &err, "kind", &what);
                set_attr(py, &err, "name", &name);
            }
            Detail::Host { path, errno } => {
                set_attr(py, &err, "path", &path);
                set_attr(py, &err, "errno", &errno);
            }
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

impl Failure {
    /// Sorts a scheduler error.
    pub fn sched(e: gpu_sched::SchedError) -> Self {
        use gpu_sched::SchedError as S;
        let kind = e.kind();
        let message = e.to_string();
        let detail = match e {
            S::Unsatisfiable(refusal) => Detail::Refusal(std::sync::Arc::new(refusal)),
            S::UnknownMachine { machine } => Detail::Missing {
                what: "machine",
                name: machine,
            },
            S::UnknownNode { node } => Detail::Missing {
                what: "node",
                name: node,
            },
            _ => Detail::None,
        };
        Failure::Typed {
            kind,
            message,
            detail,
        }
    }

    /// Sorts a discovery error: everything that went wrong reading the host is a `HostError`.
    pub fn sysfs(e: &gpu_sysfs::SysfsError) -> Self {
        use gpu_sysfs::SysfsError as S;
        let path = match e {
            S::Io { path, .. } | S::InvalidRoot { path, .. } | S::Model { path, .. } => {
                Some(path.clone())
            }
            S::Malformed { file, .. } => Some(file.clone()),
            _ => None,
        };
        Failure::Typed {
            kind: e.kind(),
            message: error_chain(e),
            detail: Detail::Host {
                path,
                errno: e.errno(),
            },
        }
    }

    /// Sorts a health error.
    pub fn health(e: &gpu_health::HealthError) -> Self {
        use gpu_health::HealthError as H;
        match e {
            H::Root(d) => Failure::sysfs(d),
            H::Discovery(d) => Failure::sysfs(d),
            H::PolicyRead { path, source } | H::BaselineWrite { path, source } => Failure::Typed {
                kind: e.kind(),
                message: error_chain(e),
                detail: Detail::Host {
                    path: Some(path.display().to_string()),
                    errno: source.raw_os_error(),
                },
            },
            H::NvmlLibrary { path, .. } => Failure::Typed {
                kind: e.kind(),
                message: e.to_string(),
                detail: Detail::Host {
                    path: Some(path.display().to_string()),
                    errno: None,
                },
            },
            H::Policy { .. } => Failure::new(e.kind(), e.to_string()),
        }
    }
}

/// The message of an error followed by its sources (`path: No such file or directory`): the
/// crates keep messages short and put the cause in `source()`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out
}
