//! The one error type of the pure model.

/// Errors from parsing or validating model values.
///
/// Every variant names the input that was wrong, so a message can be shown to an operator as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// A PCI address did not have the form `DOMAIN:BUS:DEVICE.FUNCTION`.
    #[error("invalid PCI address {input:?}: {why}")]
    InvalidPciAddress {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An mdev UUID was malformed.
    #[error("invalid mdev UUID {input:?}: expected 8-4-4-4-12 hexadecimal digits")]
    InvalidUuid {
        /// The text that was given.
        input: String,
    },
    /// A vGPU type ID was empty or held characters that could escape a sysfs path.
    #[error("invalid vGPU type ID {input:?}: {why}")]
    InvalidTypeId {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A memory size could not be parsed.
    #[error("invalid memory size {input:?}: {why}")]
    InvalidSize {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A vGPU parent ID was neither a PCI address nor a plain device name.
    #[error("invalid vGPU parent {input:?}: {why}")]
    InvalidParent {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An NVIDIA vGPU type name did not follow NVIDIA's naming grammar.
    #[error("invalid NVIDIA vGPU type name {input:?}: {why}")]
    InvalidTypeName {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A GPU reference was neither a per-node name, a family nor a PCI address.
    #[error(
        "{input:?} is neither a GPU name (nvidia0), a family (nvidia, radeon, intel, matrox, aspeed, gpu) nor a PCI address"
    )]
    InvalidGpu {
        /// The text that was given.
        input: String,
    },
    /// A node or machine name was not acceptable.
    #[error("invalid name {input:?}: {why}")]
    InvalidName {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A request was inconsistent (for example `profile` together with `gpus`).
    #[error("invalid request {request:?}: {why}")]
    InvalidRequest {
        /// The request (machine or device request) concerned.
        request: String,
        /// What is wrong with it.
        why: String,
    },
    /// A GPU graded Unhealthy was asked for a VM without forcing it ([`crate::Health::check_handout`]).
    #[error(
        "{gpu} is Unhealthy ({reasons}); a VM would get a failing GPU; nothing was changed ({force} binds it anyway)"
    )]
    Unhealthy {
        /// The GPU (its PCI address).
        gpu: String,
        /// The verdict's reasons, comma-separated.
        reasons: String,
        /// How this front-end forces it (`--force`, `?force=true`).
        force: &'static str,
    },
    /// A document is larger than the cap on what is read ([`crate::limits::check_document_max`]).
    #[error(
        "document {}; at most {} MiB are read (raise the cap with --max-document-mib or \
         GPUSLICE_MAX_DOCUMENT_MIB)",
        size_of_document(*.len, *.max_bytes),
        .max_bytes >> 20
    )]
    DocumentTooLarge {
        /// Its size in bytes, when known (a stream is refused at the first byte past the cap).
        len: Option<usize>,
        /// The cap.
        max_bytes: usize,
    },
    /// A document nests sequences and mappings deeper than the bound
    /// (`gpu_core::limits::MAX_NESTING`).
    #[error("line {line}: nested more than {max} levels deep")]
    NestedTooDeep {
        /// The 1-based line where the bound was broken.
        line: usize,
        /// The bound.
        max: usize,
    },
    /// A node of a fleet document cannot be read as written (a `shape` it names is missing, or
    /// it gives its own topology besides one).
    #[error("nodes[{index}] (node {node:?}): {why}")]
    FleetNode {
        /// Its index in `nodes`.
        index: usize,
        /// Its name.
        node: String,
        /// What is wrong with it.
        why: String,
    },
    /// A device of a fleet document's allocation, in the short shape, cannot be completed from
    /// its node's topology.
    #[error("allocations: Machine {machine:?}: device {index} ({device}): {why}")]
    ShortDevice {
        /// The Machine the allocation is for.
        machine: String,
        /// The device's index in the allocation.
        index: usize,
        /// The device as written: `parent P, profile "T"`.
        device: String,
        /// Why it cannot be completed.
        why: String,
    },
    /// No GPU of this per-node name on the host ([`crate::NodeTopology::gpu_address_by_name`]).
    #[error("no GPU named {name:?} on this host; GPUs: {known}")]
    UnknownGpuName {
        /// The name asked for.
        name: String,
        /// The host's GPUs (`name (address)`, comma-separated), or `none`.
        known: String,
    },
    /// A PCI device filter of a layout was not `0xDDDDVVVV[:0xSSSSVVVV]`.
    #[error(
        "invalid device-filter {input:?}: expected 0xDDDDVVVV (device and vendor ID) with an \
         optional :0xSSSSVVVV (subsystem device and vendor ID)"
    )]
    InvalidDeviceFilter {
        /// The text that was given.
        input: String,
    },
    /// A node's NVSwitch fabric lists a partition that cannot be (an ID twice, no member, a
    /// member twice, names and addresses of different lengths).
    #[error("fabric partition {partition}: {why}")]
    InvalidFabric {
        /// The partition's ID.
        partition: u32,
        /// What is wrong with it.
        why: String,
    },
    /// A JSON or YAML document could not be decoded into the model.
    #[error("cannot decode {what}: {message}")]
    Decode {
        /// What was being decoded (`fleet`, `machine`, ...).
        what: String,
        /// The decoder's message, with line and column where known.
        message: String,
    },
}

impl CoreError {
    /// The kind of this error: `invalid-request` for an inconsistent request, `not-found` for a
    /// GPU name the host does not have, `invalid-argument` for any other malformed value. A front-end decoding a configuration document (a fleet, a
    /// topology) reports [`CoreError::kind_in_config`] instead.
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            CoreError::InvalidRequest { .. } => crate::ErrorKind::InvalidRequest,
            CoreError::Unhealthy { .. } => crate::ErrorKind::Unhealthy,
            CoreError::UnknownGpuName { .. } => crate::ErrorKind::NotFound,
            _ => crate::ErrorKind::InvalidArgument,
        }
    }

    /// The kind of this error when it came from a configuration document rather than a request:
    /// `invalid-config`, except for an inconsistent request, which stays `invalid-request`.
    pub fn kind_in_config(&self) -> crate::ErrorKind {
        match self {
            CoreError::InvalidRequest { .. } => crate::ErrorKind::InvalidRequest,
            CoreError::Unhealthy { .. } => crate::ErrorKind::Unhealthy,
            CoreError::UnknownGpuName { .. } => crate::ErrorKind::NotFound,
            _ => crate::ErrorKind::InvalidConfig,
        }
    }
}

/// A [`CoreError`] met while decoding a configuration document (a fleet, a topology) rather than
/// a request: its kind is [`CoreError::kind_in_config`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct ConfigDocError(pub CoreError);

impl ConfigDocError {
    /// The kind: `invalid-config` (or `invalid-request` for an inconsistent request).
    pub fn kind(&self) -> crate::ErrorKind {
        self.0.kind_in_config()
    }
}

/// Result type of this crate.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

/// An error that says what went wrong in gpuslice's one vocabulary: every library error type
/// implements it, so the CLI, the agent and both bindings report any of them with one extractor
/// ([`Classified::of`]).
pub trait ClassifiedError: std::error::Error {
    /// The kind, from [`crate::ErrorKind`].
    fn kind(&self) -> crate::ErrorKind;

    /// The kernel's errno, when the failure came from a system call that gave one.
    fn errno(&self) -> Option<i32> {
        None
    }

    /// Structured data a front-end exposes besides the message (a refusal, the name that was
    /// not found, the path concerned).
    fn detail(&self) -> ErrorDetail {
        ErrorDetail::None
    }
}

/// Structured data an error carries besides its kind and message.
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorDetail {
    /// Nothing more.
    None,
    /// Why no node can hold a Machine: the refusal document (`{"nodes": [...], ...}`).
    Refusal(serde_json::Value),
    /// What was asked for and is not there.
    Missing {
        /// `machine` or `node`.
        what: &'static str,
        /// The name asked for.
        name: String,
    },
    /// Where on the host the failure happened.
    Host {
        /// The path concerned, when known.
        path: Option<String>,
        /// The errno, when the failure was an I/O error.
        errno: Option<i32>,
    },
}

impl ErrorDetail {
    /// The refused nodes of a [`ErrorDetail::Refusal`] (its `nodes`; empty when it has none).
    pub fn refused_nodes(refusal: &serde_json::Value) -> serde_json::Value {
        refusal
            .get("nodes")
            .cloned()
            .unwrap_or(serde_json::Value::Array(vec![]))
    }
}

/// Which kind of document a model value came from: it decides between `invalid-request` /
/// `invalid-argument` (what a caller asks for) and `invalid-config` (documents describing the
/// fleet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A Machine, a name, or another argument of a call.
    Request,
    /// A fleet, a node topology or another configuration document.
    Config,
}

/// An error as every front-end reports it: the one extractor from a [`ClassifiedError`].
#[derive(Debug, Clone, PartialEq)]
pub struct Classified {
    /// The kind.
    pub kind: crate::ErrorKind,
    /// The message with its sources, on one line ([`error_chain`]).
    pub message: String,
    /// The kernel's errno, when there is one.
    pub errno: Option<i32>,
    /// Structured data besides the message.
    pub detail: ErrorDetail,
}

impl Classified {
    /// An error of `kind` with nothing but its message.
    pub fn new(kind: crate::ErrorKind, message: impl Into<String>) -> Self {
        Classified {
            kind,
            message: message.into(),
            errno: None,
            detail: ErrorDetail::None,
        }
    }

    /// Classifies a library error: its kind, errno and detail, and its message with its sources.
    pub fn of(e: &dyn ClassifiedError) -> Self {
        Classified {
            kind: e.kind(),
            message: error_chain(e),
            errno: e.errno(),
            detail: e.detail(),
        }
    }

    /// Classifies a model error by where the value came from ([`Input`]).
    pub fn of_model(e: &CoreError, input: Input) -> Self {
        match input {
            Input::Request => Self::of(e),
            Input::Config => Self::of(&ConfigDocError(e.clone())),
        }
    }

    /// Classifies an error chain whose types were erased (the CLI's `anyhow` errors): the kind,
    /// errno and detail of the first error in the chain that `find` recognises ([`Other`] when
    /// none is), and the message of the whole chain.
    ///
    /// [`Other`]: crate::ErrorKind::Other
    pub fn of_chain<'a>(
        e: &'a (dyn std::error::Error + 'static),
        find: impl Fn(&'a (dyn std::error::Error + 'static)) -> Option<&'a dyn ClassifiedError>,
    ) -> Self {
        let typed = std::iter::successors(Some(e), |c| c.source()).find_map(find);
        let message = error_chain(e);
        match typed {
            Some(t) => Classified {
                message,
                ..Self::of(t)
            },
            None => Self::new(crate::ErrorKind::Other, message),
        }
    }
}

/// The one rendering of an error and its sources on one line (`outer: inner: innermost`),
/// skipping a source whose text an earlier part already holds: gpuslice's errors keep their own
/// message short and put the cause in `source()`.
pub fn error_chain(e: &(dyn std::error::Error + '_)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(c) = cur {
        let s = c.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = c.source();
    }
    parts.join(": ")
}

impl ClassifiedError for CoreError {
    fn kind(&self) -> crate::ErrorKind {
        self.kind()
    }
}

impl ClassifiedError for ConfigDocError {
    fn kind(&self) -> crate::ErrorKind {
        self.kind()
    }
}

/// How a document's size reads in [`CoreError::DocumentTooLarge`].
fn size_of_document(len: Option<usize>, max_bytes: usize) -> String {
    match len {
        Some(n) => format!("is {n} bytes"),
        None => format!("is larger than {max_bytes} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    /// An error with a source, as the crates build them: a short message, the cause in `source()`.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot read {path}")]
    struct ReadFailed {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    impl ClassifiedError for ReadFailed {
        fn kind(&self) -> ErrorKind {
            ErrorKind::ReadFailed
        }
        fn errno(&self) -> Option<i32> {
            self.source.raw_os_error()
        }
    }

    /// A context layer of a front-end that knows no kinds (the CLI's `anyhow` context).
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Context(&'static str, #[source] ReadFailed);

    fn read_failed() -> ReadFailed {
        ReadFailed {
            path: "/sys/x",
            source: std::io::Error::from_raw_os_error(13),
        }
    }

    #[test]
    fn an_error_chain_is_one_line_without_repeating_a_source() {
        assert_eq!(
            error_chain(&read_failed()),
            "cannot read /sys/x: Permission denied (os error 13)"
        );
        let e = ConfigDocError(CoreError::InvalidName {
            input: "A".into(),
            why: "upper case",
        });
        // A transparent wrapper's source is its inner error's source: said once.
        assert_eq!(error_chain(&e), "invalid name \"A\": upper case");
    }

    #[test]
    fn a_classified_error_gives_its_kind_errno_and_whole_message() {
        let c = Classified::of(&read_failed());
        assert_eq!(c.kind, ErrorKind::ReadFailed);
        assert_eq!(c.errno, Some(13));
        assert_eq!(
            c.message,
            "cannot read /sys/x: Permission denied (os error 13)"
        );
        assert_eq!(c.detail, ErrorDetail::None);
    }

    #[test]
    fn a_model_error_is_a_request_or_a_configuration_by_where_it_came_from() {
        let e = CoreError::InvalidName {
            input: "A".into(),
            why: "upper case",
        };
        assert_eq!(
            Classified::of_model(&e, Input::Request).kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            Classified::of_model(&e, Input::Config).kind,
            ErrorKind::InvalidConfig
        );
    }

    fn find_read_failed<'a>(
        c: &'a (dyn std::error::Error + 'static),
    ) -> Option<&'a dyn ClassifiedError> {
        c.downcast_ref::<ReadFailed>()
            .map(|r| r as &dyn ClassifiedError)
    }

    #[test]
    fn an_erased_chain_takes_the_first_typed_error_and_keeps_the_context() {
        let e = Context("--root", read_failed());
        let c = Classified::of_chain(&e, find_read_failed);
        assert_eq!(c.kind, ErrorKind::ReadFailed);
        assert_eq!(c.errno, Some(13));
        assert_eq!(
            c.message,
            "--root: cannot read /sys/x: Permission denied (os error 13)"
        );
        let none = Classified::of_chain(&e, |_| None);
        assert_eq!(none.kind, ErrorKind::Other);
        assert_eq!(none.message, c.message);
    }
}
