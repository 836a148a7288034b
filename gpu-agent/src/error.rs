//! The agent's error documents: `{"error": {"kind", "message", "errno"?, "errnoName"?}}`, with the
//! same `kind` strings as the CLI's `-o json` errors and the HTTP status that fits the kind.

use gpu_core::{Classified, ClassifiedError, ErrorKind};
use gpu_sysfs::SysfsError;
use gpu_sysfs::actuate::ActuateError;
use gpu_sysfs::apply::ApplyError;
use serde::Serialize;

/// An API failure: what went wrong, in a form a program can branch on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiError {
    /// The HTTP status the kind maps to.
    #[serde(skip)]
    pub status: u16,
    /// Stable kind, from gpuslice's one vocabulary ([`ErrorKind`], serialized by name): the
    /// actuation kinds of `gpuslice -o json` (`exists`, `exhausted`, `in-use`,
    /// `exists-other-type`, ...), a layout kind, `invalid-request`, `not-found`, `host-error`,
    /// and those only the agent answers: `unknown-route`, `method-not-allowed`, `too-large`,
    /// `unauthorized`, `read-only`.
    pub kind: ErrorKind,
    /// One line for people.
    pub message: String,
    /// The kernel errno, when the failure came from a sysfs write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// The errno's symbolic name (`ENOSPC`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno_name: Option<String>,
}

/// The document an error is sent as.
#[derive(Debug, Serialize)]
struct ErrorDocument<'a> {
    error: &'a ApiError,
}

impl ApiError {
    /// An error of `kind` with its usual status.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            status: status_of(kind),
            kind,
            message: message.into(),
            errno: None,
            errno_name: None,
        }
    }

    /// A malformed or unacceptable request (400).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// Something the request names does not exist (404).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// The error document as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&ErrorDocument { error: self }).unwrap_or_else(|_| {
            r#"{"error":{"kind":"error","message":"cannot render the error"}}"#.to_owned()
        })
    }

    /// Prefixes the message with context (`cannot create mdev ...: `).
    pub fn context(mut self, what: impl std::fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// A library error, classified as every front-end classifies it ([`Classified::of`]).
    pub fn from_error(e: &dyn ClassifiedError) -> Self {
        let c = Classified::of(e);
        ApiError {
            status: status_of(c.kind),
            kind: c.kind,
            message: c.message,
            errno: c.errno,
            errno_name: c.errno.map(gpu_sysfs::actuate::error::errno::name),
        }
    }

    /// An actuation failure.
    pub fn from_actuate(e: &ActuateError) -> Self {
        Self::from_error(e)
    }

    /// A host read failure, or an actuation failure wrapped in one.
    pub fn from_sysfs(e: &SysfsError) -> Self {
        Self::from_error(e)
    }

    /// A layout apply that did not happen or did not finish: a layout that cannot be planned is
    /// the request's fault (400), whatever its kind.
    pub fn from_apply(e: &ApplyError) -> Self {
        match e {
            ApplyError::Discover(s) => Self::from_sysfs(s),
            ApplyError::Layout(l) => Self::from_error(l).with_status(400),
            _ => Self::from_error(e),
        }
    }

    /// A discovery or health failure.
    pub fn from_health(e: &gpu_health::HealthError) -> Self {
        use gpu_health::HealthError as H;
        match e {
            H::Root(s) => Self::from_sysfs(s).context("cannot discover the host"),
            H::Discovery(s) => Self::from_sysfs(s).context("cannot discover the host"),
            _ => Self::from_error(e),
        }
    }

    /// A metrics text that could not be rendered: `500 other`, whatever the cause (a scrape
    /// cannot fix it), the message naming it.
    pub fn from_render(e: &RenderError) -> Self {
        Self::new(ErrorKind::Other, gpu_core::error_chain(e))
    }

    /// An invalid identity (UUID, address, name) or request given in `field`: the model error's
    /// kind (`invalid-argument` for a malformed value).
    pub fn from_core(field: &str, e: &gpu_core::CoreError) -> Self {
        Self::from_error(e).context(field)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind)
    }
}

impl std::error::Error for ApiError {}

impl From<gpu_node::mig::MigError> for ApiError {
    fn from(e: gpu_node::mig::MigError) -> Self {
        Self::from_error(&e)
    }
}

impl From<ActuateError> for ApiError {
    fn from(e: ActuateError) -> Self {
        Self::from_actuate(&e)
    }
}

/// Why a metrics text could not be rendered: the renderer's own error (an embedder's hook, the
/// fleet file `gpuslice metrics --listen` reads on each scrape), kept as the source.
#[derive(Debug)]
pub struct RenderError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl RenderError {
    /// The renderer failed with `e`.
    pub fn new(e: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        RenderError(e.into())
    }

    /// The renderer's error.
    pub fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.0.as_ref()
    }
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for RenderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// An [`ApiError`] as the cause of another error (the daemon's, which names what failed): shown
/// as its message alone, so a chain does not say it twice, and classified by its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiCause(pub ApiError);

impl std::fmt::Display for ApiCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for ApiCause {}

/// Renders an error and its sources on one line: gpuslice's one formatter.
pub use gpu_core::error_chain as chain;

impl ClassifiedError for ApiError {
    fn kind(&self) -> ErrorKind {
        self.kind
    }

    fn errno(&self) -> Option<i32> {
        self.errno
    }
}

impl ClassifiedError for crate::uevent::UeventError {
    /// A message on the kernel's uevent socket that is not a uevent.
    fn kind(&self) -> ErrorKind {
        ErrorKind::Unexpected
    }
}

/// The agent's error types, or those of the crates it builds on (health, discovery, the
/// scheduler, the model), when `e` is one: see [`gpu_core::classify::as_classified`].
pub fn as_classified<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn ClassifiedError> {
    if let Some(a) = e.downcast_ref::<ApiError>() {
        return Some(a);
    }
    if let Some(u) = e.downcast_ref::<crate::uevent::UeventError>() {
        return Some(u);
    }
    if let Some(c) = e.downcast_ref::<ApiCause>() {
        return Some(&c.0);
    }
    gpu_health::error::as_classified(e).or_else(|| gpu_sched::as_classified(e))
}

/// The HTTP status of an error kind: 400 for requests that can never succeed as written, 401
/// and 403 for requests the listener does not take, 404 for things that are not there, 409 for
/// conflicts with what is on the host, 503 for a host that cannot do it now.
pub fn status_of(kind: ErrorKind) -> u16 {
    use ErrorKind as K;
    match kind {
        K::InvalidRequest
        | K::InvalidArgument
        | K::UnknownProfile
        | K::Unsupported
        | K::Unsatisfiable => 400,
        K::Unauthorized => 401,
        K::ReadOnly => 403,
        K::NotFound | K::UnknownRoute | K::NoDevice => 404,
        K::MethodNotAllowed => 405,
        K::InUse
        | K::Exists
        | K::ExistsOtherType
        | K::Busy
        | K::NotPermitted
        | K::GroupNotViable
        | K::Unhealthy
        | K::Conflict => 409,
        K::TooLarge => 413,
        K::Other => 500,
        // exhausted, not-creatable, host-error, read-failed, driver-refused, timeout, ...
        _ => 503,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_the_statuses_the_api_promises() {
        assert_eq!(status_of(ErrorKind::InvalidRequest), 400);
        assert_eq!(status_of(ErrorKind::Unauthorized), 401);
        assert_eq!(status_of(ErrorKind::ReadOnly), 403);
        assert_eq!(status_of(ErrorKind::NotFound), 404);
        assert_eq!(status_of(ErrorKind::UnknownRoute), 404);
        assert_eq!(status_of(ErrorKind::MethodNotAllowed), 405);
        assert_eq!(status_of(ErrorKind::InUse), 409);
        assert_eq!(status_of(ErrorKind::ExistsOtherType), 409);
        assert_eq!(status_of(ErrorKind::Conflict), 409);
        assert_eq!(status_of(ErrorKind::TooLarge), 413);
        assert_eq!(status_of(ErrorKind::Exhausted), 503);
        assert_eq!(status_of(ErrorKind::HostError), 503);
    }

    #[test]
    fn an_invalid_field_keeps_the_model_errors_kind() {
        let unhealthy = gpu_core::CoreError::Unhealthy {
            gpu: "0000:01:00.0".into(),
            reasons: "AER fatal".into(),
            force: "?force=true",
        };
        let e = ApiError::from_core("gpu", &unhealthy);
        assert_eq!(e.kind, ErrorKind::Unhealthy);
        assert_eq!(e.status, 409);
        assert!(
            e.message.starts_with("gpu: 0000:01:00.0 is Unhealthy"),
            "{}",
            e.message
        );
        let bad = gpu_core::CoreError::InvalidUuid { input: "x".into() };
        let e = ApiError::from_core("uuid", &bad);
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(e.status, 400);
    }

    #[test]
    fn an_error_document_has_kind_message_and_errno() {
        let e = ApiError::from_actuate(&ActuateError::Exhausted {
            path: "/sys/x/create".to_owned(),
            errno: "ENOSPC".to_owned(),
        });
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap_or_default();
        assert_eq!(v["error"]["kind"], "exhausted");
        assert_eq!(v["error"]["errno"], 28);
        assert_eq!(v["error"]["errnoName"], "ENOSPC");
        assert_eq!(e.status, 503);
    }

    #[test]
    fn a_render_failure_is_a_500_naming_its_cause() {
        let e = RenderError::new(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "fleet.json: no such file",
        ));
        let a = ApiError::from_render(&e);
        assert_eq!(a.status, 500);
        assert_eq!(a.kind, ErrorKind::Other);
        assert_eq!(a.message, "fleet.json: no such file");
    }
}
