//! Core errors as JavaScript `Error` objects with a stable `code`.
//!
//! The crates' error enums are sorted into a [`Failure`] first (a plain Rust value that can be
//! computed on a worker thread), which becomes a JS `Error` once back on the JS thread. Each kind
//! has its own `code`; structured data travels as properties: `reasons` and `refusal` on
//! `UNSATISFIABLE`, `path` and `errno` on `HOST_ERROR`, `kind` and `machine` or `node` on `NOT_FOUND`.

use gpu_core::CoreError;
use napi::bindgen_prelude::{JsValue, Object};
use napi::{Env, Status};

/// A core error sorted into the JS error it becomes.
#[derive(Debug, Clone)]
pub enum Failure {
    /// `UNSATISFIABLE`, with the refusal document.
    Unsatisfiable {
        /// The rendered message.
        message: String,
        /// The refusal as JSON (`{machine, nodesTotal, nodes: [{node, reasons}]}`).
        refusal: serde_json::Value,
    },
    /// `INVALID_REQUEST`.
    InvalidRequest(String),
    /// `NOT_FOUND`.
    NotFound {
        /// The rendered message.
        message: String,
        /// `machine` or `node`.
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// `HOST_ERROR`.
    Host {
        /// The rendered message.
        message: String,
        /// The path concerned, when known.
        path: Option<String>,
        /// The errno, when the failure was an I/O error.
        errno: Option<i32>,
    },
    /// `CONFIG_ERROR`.
    Config(String),
    /// `CONFIG_ERROR` from a vGPU layout file, with the layout error's kind (`unknown-config`,
    /// `does-not-fit`, ...) as `kind`.
    Layout {
        /// The rendered message.
        message: String,
        /// `LayoutError::code`.
        kind: &'static str,
    },
    /// `INTERNAL`, for failures of the binding itself.
    Other(String),
}

/// Which kind of document a model error concerns: it decides between `INVALID_REQUEST` (what the
/// caller asks for) and `CONFIG_ERROR` (documents describing the fleet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A Machine, a name, or another argument of a call.
    Request,
    /// A fleet, a node topology or another configuration document.
    Config,
}

impl Failure {
    /// Sorts a model error: requests are the caller's input, documents are configuration.
    pub fn core(e: &CoreError, input: Input) -> Self {
        match (e, input) {
            (CoreError::InvalidRequest { .. }, _) | (_, Input::Request) => {
                Failure::InvalidRequest(e.to_string())
            }
            (_, Input::Config) => Failure::Config(e.to_string()),
        }
    }

    /// The stable `code` of the JS error.
    pub fn code(&self) -> &'static str {
        match self {
            Failure::Unsatisfiable { .. } => "UNSATISFIABLE",
            Failure::InvalidRequest(_) => "INVALID_REQUEST",
            Failure::NotFound { .. } => "NOT_FOUND",
            Failure::Host { .. } => "HOST_ERROR",
            Failure::Config(_) | Failure::Layout { .. } => "CONFIG_ERROR",
            Failure::Other(_) => "INTERNAL",
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Unsatisfiable { message, .. }
            | Failure::NotFound { message, .. }
            | Failure::Host { message, .. }
            | Failure::InvalidRequest(message)
            | Failure::Layout { message, .. }
            | Failure::Config(message)
            | Failure::Other(message) => message,
        }
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
        let mut obj: Object<'_> = env.create_error(napi::Error::new(
            Status::GenericFailure,
            self.message().to_owned(),
        ))?;
        obj.set("code", self.code())?;
        match self {
            Failure::Unsatisfiable { refusal, .. } => {
                let reasons = refusal
                    .get("nodes")
                    .cloned()
                    .unwrap_or(serde_json::Value::Array(vec![]));
                obj.set("reasons", env.to_js_value(&reasons)?)?;
                obj.set("refusal", env.to_js_value(refusal)?)?;
            }
            Failure::NotFound { kind, name, .. } => {
                // `name` is taken by `Error.prototype.name`: the name goes under the kind.
                obj.set("kind", *kind)?;
                obj.set(*kind, name.as_str())?;
            }
            Failure::Host { path, errno, .. } => {
                obj.set("path", path.as_deref())?;
                obj.set("errno", *errno)?;
            }
            Failure::Layout { kind, .. } => obj.set("kind", *kind)?,
            Failure::InvalidRequest(_) | Failure::Config(_) | Failure::Other(_) => {}
        }
        Ok(napi::Error::from(obj.to_unknown()))
    }
}

impl Failure {
    /// Sorts a scheduler error.
    pub fn sched(e: gpu_sched::SchedError) -> Self {
        use gpu_sched::SchedError as S;
        let message = e.to_string();
        match e {
            S::Unsatisfiable(refusal) => Failure::Unsatisfiable {
                message,
                refusal: serde_json::to_value(&refusal).unwrap_or_default(),
            },
            S::InvalidRequest { .. } | S::InvalidPolicy { .. } => Failure::InvalidRequest(message),
            S::UnknownMachine { machine } => Failure::NotFound {
                message,
                kind: "machine",
                name: machine,
            },
            S::UnknownNode { node } => Failure::NotFound {
                message,
                kind: "node",
                name: node,
            },
            S::InvalidFleet { .. } => Failure::Config(message),
            _ => Failure::Other(message),
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
        Failure::Host {
            message: error_chain(e),
            path,
            errno: e.errno(),
        }
    }

    /// Sorts a health error.
    pub fn health(e: &gpu_health::HealthError) -> Self {
        use gpu_health::HealthError as H;
        match e {
            H::Discovery(d) => Failure::sysfs(d),
            H::PolicyRead { path, source } | H::BaselineWrite { path, source } => Failure::Host {
                message: error_chain(e),
                path: Some(path.display().to_string()),
                errno: source.raw_os_error(),
            },
            H::Policy { .. } => Failure::Config(e.to_string()),
        }
    }

    /// A root that cannot be opened.
    pub fn root(root: &str, e: &std::io::Error) -> Self {
        // The host adapter rewraps the error with the root in its message, which drops the
        // errno; ask the OS again for it (only on this failure path).
        let errno = e
            .raw_os_error()
            .or_else(|| std::fs::metadata(root).err().and_then(|m| m.raw_os_error()));
        Failure::Host {
            message: e.to_string(),
            path: Some(root.to_owned()),
            errno,
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
