//! Core errors as JavaScript `Error` objects with a stable `code`.
//!
//! The crates' error enums are sorted into a [`Failure`] first (a plain Rust value that can be
//! computed on a worker thread), which becomes a JS `Error` once back on the JS thread. Each kind
//! has its own `code`; structured data travels as properties: `reasons` and `refusal` on
//! `UNSATISFIABLE`, `path` and `errno` on `HOST_ERROR`, `kind` and `machine` or `node` on `NOT_FOUND`.

use gpu_core::{Classified, ClassifiedError, CoreError, ErrorDetail, ErrorFamily, ErrorKind};

pub use gpu_core::Input;
use napi::bindgen_prelude::{JsValue, Object};
use napi::{Env, Status};

/// A library error on its way to JavaScript: classified by gpuslice's one extractor
/// ([`Classified::of`]); its kind decides the `code`, its detail the properties.
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
    /// `INTERNAL`, for failures of the binding itself.
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

    fn parts(self) -> (ErrorKind, String, ErrorDetail) {
        match self {
            Failure::Typed(c) => (c.kind, c.message, c.detail),
            Failure::Refused { kind, message, .. } => (kind, message, ErrorDetail::None),
            Failure::Other(message) => (ErrorKind::Other, message, ErrorDetail::None),
        }
    }

    /// The stable `code` of the JS error: the one table from the kind's family.
    pub fn code(&self) -> &'static str {
        let kind = match self {
            Failure::Typed(c) => c.kind,
            Failure::Refused { kind, .. } => *kind,
            Failure::Other(_) => ErrorKind::Other,
        };
        match kind.family() {
            ErrorFamily::Unsatisfiable => "UNSATISFIABLE",
            ErrorFamily::InvalidRequest => "INVALID_REQUEST",
            ErrorFamily::NotFound => "NOT_FOUND",
            ErrorFamily::Host => "HOST_ERROR",
            ErrorFamily::Config => "CONFIG_ERROR",
            ErrorFamily::Other => "INTERNAL",
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Typed(c) => &c.message,
            Failure::Refused { message, .. } => message,
            Failure::Other(message) => message,
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
        let code = self.code();
        let (kind, message, detail) = self.clone().parts();
        let mut obj: Object<'_> =
            env.create_error(napi::Error::new(Status::GenericFailure, message))?;
        obj.set("code", code)?;
        obj.set("errorKind", kind.as_str())?;
        if kind.is_layout() {
            obj.set("kind", kind.as_str())?;
        }
        match detail {
            ErrorDetail::Refusal(refusal) => {
                let reasons = ErrorDetail::refused_nodes(&refusal);
                obj.set("reasons", env.to_js_value(&reasons)?)?;
                obj.set("refusal", env.to_js_value(&refusal)?)?;
            }
            ErrorDetail::Missing { what, name } => {
                // `name` is taken by `Error.prototype.name`: the name goes under the kind.
                obj.set("kind", what)?;
                obj.set(what, name.as_str())?;
            }
            ErrorDetail::Host { path, errno } => {
                obj.set("path", path.as_deref())?;
                obj.set("errno", errno)?;
            }
            ErrorDetail::None => {}
        }
        if let Failure::Refused { refusal, .. } = self {
            crate::refusal::attach(env, &mut obj, refusal)?;
        }
        Ok(napi::Error::from(obj.to_unknown()))
    }
}
