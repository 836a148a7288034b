//! Placement policies.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::SchedError;

/// How to choose among nodes and GPUs that can all hold a Machine. JSON: `binpack`, `spread`,
/// `firstfit`.
///
/// All rank Degraded GPUs after all others and break remaining ties by node order and PCI
/// address, so the same fleet and request always give the same answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Fill what is already partly used. For a vGPU, first the nodes whose GPUs already hosting
    /// vGPUs (on NVIDIA, locked to its size) can take it, the one with the least such room
    /// first; else the node with the least room of the kind asked for (free instances of the
    /// profile, free whole GPUs) that still fits. On the node, partly used GPUs first, the one
    /// with the fewest instances left first, so fresh cards stay whole; whole GPUs avoid those
    /// offering the Machine's vGPU types.
    ///
    /// Under churn up to the fleet's capacity this accepts the most Machines of the three, and at
    /// every load the most GPU capacity and the fewest Machines refused only by fragmentation.
    /// Asked for more than the fleet holds, it accepts a few Machines fewer *by count* than
    /// `firstfit`: the room it keeps goes to whole-card vGPUs and multi-GPU Machines, each worth
    /// several small ones (`benches/RESULTS-churn.md`).
    #[default]
    Binpack,
    /// Use the emptiest node and the emptiest GPUs first.
    Spread,
    /// No scoring, as the Kubernetes DRA allocator: the first node in node order that fits, and
    /// on it the first GPUs (in PCI address order) that fit.
    #[serde(rename = "firstfit")]
    FirstFit,
}

impl Policy {
    /// The JSON and command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
            Policy::FirstFit => "firstfit",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Policy {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "binpack" => Ok(Policy::Binpack),
            "spread" => Ok(Policy::Spread),
            "firstfit" => Ok(Policy::FirstFit),
            _ => Err(SchedError::InvalidPolicy {
                input: s.to_owned(),
            }),
        }
    }
}
