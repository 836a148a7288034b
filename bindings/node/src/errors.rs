//! Core errors as JavaScript `Error` objects with a stable `code`.
//!
//! The crates' error enums are sorted into a [`Failure`] first (a plain Rust value that can be
//! computed on a worker thread), which becomes a JS `Error` once back on the JS thread. Each kind
//! has its own `code`; structured data travels as properties: `reasons` and `refusal` on
//! `UNSATISFIABLE`, `path` and `errno` on `HOST_ERROR`, `kind` and `machine` or `node` on `NOT_FOUND`.

use gpu_core::{CoreError, ErrorFamily, ErrorKind};
use napi::bindgen_prelude::{JsValue, Object};
use napi::{Env, Status};

/// A library error on its way to JavaScript: its kind (from gpuslice's one vocabulary) decides
/// the `code`; the structured data it carries becomes properties.
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
    /// `INTERNAL`, for failures of the binding itself.
    Other(String),
}

/// Structured data an exception carries besides its message.
#[derive(Debug, Clone)]
pub enum Detail {
    /// Nothing more.
    None,
    /// `refusal` / `reasons` / `groups` of `UNSATISFIABLE` ([`crate::refusal`]).
    Refusal(std::sync::Arc<gpu_sched::Refusal>),
    /// `kind` (`machine` or `node`) of `NOT_FOUND`, and the name under that key.
    Missing {
        /// `machine` or `node`.
        what: &'static str,
        /// The name asked for.
        name: String,
    },
    /// `path` and `errno` of `HOST_ERROR`.
    Host {
        /// The path concerned, when known.
        path: Option<String>,
        /// The errno, when the failure was an I/O error.
        errno: Option<i32>,
    },
}

/// Which kind of document a model error concerns: it decides between `INVALID_REQUEST` (what
/// the caller asks for) and `CONFIG_ERROR` (documents describing the fleet).
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

    /// A vGPU layout error (`CONFIG_ERROR` with `kind`).
    pub fn layout(e: &gpu_core::layout::LayoutError) -> Self {
        Failure::new(e.kind(), e.to_string())
    }

    /// An integrations error (DRA, metrics, KubeVirt, QEMU hand-off).
    pub fn integration(e: &gpu_integrations::IntegrationError) -> Self {
        Failure::new(e.kind(), e.to_string())
    }

    fn parts(&self) -> (ErrorKind, &str, Option<&Detail>) {
        match self {
            Failure::Typed {
                kind,
                message,
                detail,
            } => (*kind, message, Some(detail)),
            Failure::Other(message) => (ErrorKind::Other, message, None),
        }
    }

    /// The stable `code` of the JS error: the one table from the kind's family.
    pub fn code(&self) -> &'static str {
        match self.parts().0.family() {
            ErrorFamily::Unsatisfiable => "UNSATISFIABLE",
            ErrorFamily::InvalidRequest => "INVALID_REQUEST",
            ErrorFamily::NotFound => "NOT_FOUND",
            ErrorFamily::Host => "HOST_ERROR",
            ErrorFamily::Config => "CONFIG_ERROR",
            ErrorFamily::Other => "INTERNAL",
        }
    }

    fn message(&self) -> &str {
        self.parts().1
    }

    /// Builds the JS `Error` (with `code` and the structured properties) as a `napi::Error` that
    /// throws exactly that object.
    pub fn into_js(self, env: &Env) -> napi::Error {
        match self.build(env) {
            Ok(e) => e,
            // Creating the object failed (the VM is out of memory or terminating): fall back to
            // a plain error that still carries the message.
            Err(_) => napi::Error::new(Status::GenericFailure, self.message().to_owned()),
        }
    }

    fn build(&self, env: &Env) -> napi::Result<napi::Error> {
        let (kind, message, detail) = self.parts();
        let mut obj: Object<'_> =
            env.create_error(napi::Error::new(Status::GenericFailure, message.to_owned()))?;
        obj.set("code", self.code())?;
        obj.set("errorKind", kind.as_str())?;
        if kind.is_layout() {
            obj.set("kind", kind.as_str())?;
        }
        match detail {
            Some(Detail::Refusal(refusal)) => crate::refusal::attach(env, &mut obj, refusal)?,
            Some(Detail::Missing { what, name }) => {
                // `name` is taken by `Error.prototype.name`: the name goes under the kind.
                obj.set("kind", *what)?;
                obj.set(*what, name.as_str())?;
            }
            Some(Detail::Host { path, errno }) => {
                obj.set("path", path.as_deref())?;
                obj.set("errno", *errno)?;
            }
            Some(Detail::None) | None => {}
        }
        Ok(napi::Error::from(obj.to_unknown()))
    }
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

    /// Sorts a discovery error: everything that went wrong reading the host is `HOST_ERROR`.
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
