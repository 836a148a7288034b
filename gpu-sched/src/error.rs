//! The one error type of the scheduler.

use crate::refusal::Refusal;

/// Why a placement or plan could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    /// No node can hold the Machine; the refusal says why, node by node.
    #[error("{0}")]
    Unsatisfiable(Refusal),
    /// The Machine or one of its requests is malformed, names an unknown template, or clashes
    /// with the fleet (a Machine of that name is already placed).
    #[error("invalid request {machine:?}: {why}")]
    InvalidRequest {
        /// The Machine concerned.
        machine: String,
        /// What is wrong.
        why: String,
    },
    /// No allocation of that Machine exists.
    #[error("no Machine {machine:?} is placed in the fleet{}", placed_hint(.nearest))]
    UnknownMachine {
        /// The Machine asked for.
        machine: String,
        /// The placed Machines whose names come nearest (empty when none does, or not looked).
        nearest: Vec<String>,
    },
    /// No node of that name is in the fleet.
    #[error("no node {node:?} in the fleet")]
    UnknownNode {
        /// The node asked for.
        node: String,
    },
    /// The fleet itself is inconsistent (duplicate node or Machine names, a bad node name).
    #[error("invalid fleet: {why}")]
    InvalidFleet {
        /// What is wrong.
        why: String,
    },
    /// A policy name other than `binpack`, `spread` or `firstfit`.
    #[error("unknown placement policy {input:?} (use binpack, spread or firstfit)")]
    InvalidPolicy {
        /// The text given.
        input: String,
    },
}

/// ` (nearest placed: a, b)` after an unknown Machine's name, when some placed name is near it.
fn placed_hint(nearest: &[String]) -> String {
    if nearest.is_empty() {
        String::new()
    } else {
        format!(" (nearest placed: {})", nearest.join(", "))
    }
}

impl SchedError {
    /// The kind of this error: `unsatisfiable`, `not-found` for an unknown Machine or node,
    /// `invalid-config` for an inconsistent fleet, `invalid-request` otherwise.
    pub fn kind(&self) -> gpu_core::ErrorKind {
        use gpu_core::ErrorKind as K;
        match self {
            SchedError::Unsatisfiable(_) => K::Unsatisfiable,
            SchedError::UnknownMachine { .. } | SchedError::UnknownNode { .. } => K::NotFound,
            SchedError::InvalidFleet { .. } => K::InvalidConfig,
            SchedError::InvalidRequest { .. } | SchedError::InvalidPolicy { .. } => {
                K::InvalidRequest
            }
        }
    }

    /// The refusal, when the error is [`SchedError::Unsatisfiable`].
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            SchedError::Unsatisfiable(r) => Some(r),
            _ => None,
        }
    }
}

impl gpu_core::ClassifiedError for SchedError {
    fn kind(&self) -> gpu_core::ErrorKind {
        self.kind()
    }

    /// The refusal of an unsatisfiable Machine; the Machine or node that is not there.
    fn detail(&self) -> gpu_core::ErrorDetail {
        use gpu_core::ErrorDetail as D;
        match self {
            SchedError::Unsatisfiable(refusal) => {
                D::Refusal(serde_json::to_value(refusal).unwrap_or_default())
            }
            SchedError::UnknownMachine { machine, .. } => D::Missing {
                what: "machine",
                name: machine.clone(),
            },
            SchedError::UnknownNode { node } => D::Missing {
                what: "node",
                name: node.clone(),
            },
            _ => D::None,
        }
    }
}

/// The scheduler's error type (or the model's), when `e` is one: see
/// [`gpu_core::classify::as_classified`].
pub fn as_classified<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn gpu_core::ClassifiedError> {
    match e.downcast_ref::<SchedError>() {
        Some(s) => Some(s),
        None => gpu_core::classify::as_classified(e),
    }
}
