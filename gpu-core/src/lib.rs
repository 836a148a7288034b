//! The pure model of gpuslice.
//!
//! A host exposes GPUs as PCI functions. Each can be handed to a virtual machine whole (through
//! vfio-pci, together with the companion functions of its slot such as HD audio) or shared as
//! vGPUs. Sharing uses one of two frameworks: the kernel's mediated devices (mdev: a *parent*
//! offers *types*, each instance is named by a UUID) or NVIDIA's vendor-specific VFIO on
//! Ada/Hopper/Blackwell (each SR-IOV virtual function takes one type and goes to the VM itself).
//! In both, the types of one physical GPU draw from one framebuffer *pool*: NVIDIA counts per
//! VF overstate what fits, and time-sliced vGPUs on one GPU must all have the same size.
//!
//! This crate holds the model of all that, with validated identities ([`PciAddress`],
//! [`MdevUuid`], [`VgpuTypeId`], [`MiB`]), and its JSON/YAML wire format (camelCase keys). It never
//! touches the filesystem: discovery (`gpu-sysfs`), health (`gpu-health`) and placement
//! (`gpu-sched`) build on it.

pub mod address;
pub mod allocation;
pub mod classify;
pub mod error;
pub mod explain;
pub mod fabric;
pub mod fleet;
pub mod health;
pub mod ids;
pub mod kind;
pub mod layout;
pub mod limits;
pub mod mig;
pub mod mig_types;
pub mod nvidia;
pub mod pool;
pub mod request;
pub mod slots;
pub mod text;
pub mod topology;
pub mod usage;
pub mod vendor;
pub mod vgpu_types;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use address::PciAddress;
pub use allocation::{AllocatedDevice, Allocation, AllocationStatus};
pub use error::{
    Classified, ClassifiedError, ConfigDocError, CoreError, ErrorDetail, Input, error_chain,
};
pub use fabric::{
    Fabric, FabricManager, FabricManagerState, FabricMode, Partition, hgx8_default_partitions,
};
pub use fleet::{Fleet, FleetNode, HostShape, SharedFleet};
pub use health::{Health, HealthState};
pub use ids::{MdevUuid, MiB, ParentId, VgpuTypeId};
pub use kind::{ErrorFamily, ErrorKind};
pub use mig::{MigGeometry, MigOccupancy, MigPlaced, MigProfile, MigSlots, SlotMisfit};
pub use request::{Alignment, DeviceClass, DeviceRequest, GpuRef, Machine};
pub use topology::{
    ClassCode, Function, Gpu, GpuState, Instance, Link, MediatedDevices, NodeTopology, Parent,
    PciId, Pool, Profile, Sriov, UnreadableVf, VfDriver, VfDriverDiagnosis, VgpuFramework,
};
pub use vendor::{Vendor, VendorRef};

/// Decodes JSON or YAML text into `T`, naming `what` in the error.
///
/// The text's size and nesting are checked first ([`limits::check_document`]); a decode error
/// names the field path and what was wrong with its value (`devices[0].count: invalid value:
/// integer `-1`, expected u32 at line 2 column 24`).
///
/// # Errors
/// [`CoreError::Decode`] with the field path and the decoder's message (line and column included).
pub fn decode_text<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, CoreError> {
    decode_text_max(what, text, limits::MAX_DOCUMENT_BYTES)
}

/// [`decode_text`] with a size cap of `max_bytes` ([`limits::check_document_max`]).
///
/// # Errors
/// As [`decode_text`].
pub fn decode_text_max<T: serde::de::DeserializeOwned>(
    what: &str,
    text: &str,
    max_bytes: usize,
) -> Result<T, CoreError> {
    let fail = |message| CoreError::Decode {
        what: what.to_owned(),
        message,
    };
    limits::check_document_max(text, max_bytes).map_err(|e| fail(e.to_string()))?;
    let trimmed = text.trim_start();
    let res = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut de).map_err(located)
    } else {
        serde_path_to_error::deserialize(serde_yaml_ng::Deserializer::from_str(text))
            .map_err(located)
    };
    res.map_err(fail)
}

fn located<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    let inner = e.inner().to_string();
    // The YAML decoder names the path itself; JSON's does not.
    if path == "." || inner.starts_with(&format!("{path}: ")) {
        inner
    } else {
        format!("{path}: {inner}")
    }
}

/// The syntax a document was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// JSON (the text starts with `{` or `[`).
    Json,
    /// YAML.
    Yaml,
}

/// Decodes JSON or YAML read from `reader` into `T`, naming `what` in the error, with a size cap
/// of `max_bytes`: [`decode_text_max`] without holding the text.
///
/// JSON is decoded as it is read (its size and nesting checked on the bytes as they pass,
/// [`limits::JsonBounds`]), so memory stays near the decoded value's size whatever the text's.
/// YAML cannot be: its decoder (libyaml's event stream, loaded whole before `serde` sees a value)
/// takes the whole text, so a YAML document is read up to the cap and then decoded. Which one it
/// is shows from the first byte that is not white space, as in [`decode_text_max`].
///
/// # Errors
/// As [`decode_text_max`]; a read error or a broken bound is a [`CoreError::Decode`] with its
/// message (a caller that capped the reader itself can tell its own refusal apart first).
pub fn decode_reader_max<T: serde::de::DeserializeOwned>(
    what: &str,
    reader: impl std::io::Read,
    max_bytes: usize,
) -> Result<(T, Syntax), CoreError> {
    use std::io::{BufRead, Read};
    let fail = |message: String| CoreError::Decode {
        what: what.to_owned(),
        message,
    };
    let mut bounds = limits::JsonBounds::new(reader, max_bytes);
    // The decoder takes the buffered reader by value: std reads a `BufReader` byte by byte
    // from its buffer, a `&mut BufReader` through a whole `read` call per byte.
    let mut input = std::io::BufReader::with_capacity(64 << 10, &mut bounds);
    // The white space before the first byte that says which syntax it is; YAML keeps it.
    let mut lead: Vec<u8> = Vec::new();
    let first = loop {
        let buf = input.fill_buf().map_err(|e| fail(e.to_string()))?;
        if buf.is_empty() {
            break None;
        }
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) => {
                let first = buf[i];
                lead.extend_from_slice(&buf[..i]);
                input.consume(i);
                break Some(first);
            }
            None => {
                let n = buf.len();
                lead.extend_from_slice(buf);
                input.consume(n);
            }
        }
    };
    if matches!(first, Some(b'{' | b'[')) {
        let buffered = input.buffer().to_vec();
        input
            .get_mut()
            .check_nesting(&buffered)
            .map_err(|e| fail(e.to_string()))?;
        let mut de = serde_json::Deserializer::from_reader(input);
        let res = serde_path_to_error::deserialize(&mut de)
            .map_err(located)
            .and_then(|v| de.end().map(|()| v).map_err(|e| e.to_string()));
        drop(de);
        return match (res, bounds.failure()) {
            (Ok(v), _) => Ok((v, Syntax::Json)),
            (Err(_), Some(bound)) => Err(fail(bound.to_string())),
            (Err(m), None) => Err(fail(m)),
        };
    }
    let mut bytes = lead;
    input
        .read_to_end(&mut bytes)
        .map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        fail(format!(
            "not UTF-8 text (byte {})",
            e.utf8_error().valid_up_to()
        ))
    })?;
    decode_text_max(what, &text, max_bytes).map(|v| (v, Syntax::Yaml))
}

/// Checks a node, machine or request name: 1–253 characters of `[A-Za-z0-9._-]`, not starting
/// with `.` or `-`, without `..` (so never a path, a control character or a quote). Every command
/// and binding checks names with this one function.
///
/// # Errors
/// [`CoreError::InvalidName`] naming the input.
pub fn validate_name(name: &str) -> Result<(), CoreError> {
    let bad = |why| CoreError::InvalidName {
        input: name.to_owned(),
        why,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > 253 {
        return Err(bad("longer than 253 characters"));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Err(bad("must not start with '.' or '-'"));
    }
    if name.contains("..") {
        return Err(bad("must not contain '..'"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(bad("only letters, digits, '-', '_' and '.' are allowed"));
    }
    Ok(())
}
