//! How the solver chooses where a MIG-backed vGPU's GPU instance starts, on the one slot model
//! ([`gpu_core::slots`]): the choice is made in `node/fit.rs`, held in the GPU's slots so the
//! next placement sees it taken, recorded in the allocation (`gpuInstanceStart`, which the node
//! makes the instance at) and freed on release; `state/slots.rs` sets it for a fleet.

use std::fmt;
use std::str::FromStr;

use gpu_core::slots::SlotChoice;

use crate::error::SchedError;

/// How the solver chooses a GPU-instance start. JSON and command line: `keepmost`,
/// `firstfit`, `driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SlotPolicy {
    /// The start that leaves the most room for the profiles that may come later
    /// ([`SlotChoice::KeepMost`]): on an empty H200 a 1g goes to slot 6 and a 4g still fits.
    #[default]
    KeepMost,
    /// The lowest free legal start ([`SlotChoice::FirstFit`]), chosen and recorded.
    FirstFit,
    /// No choice: the instance is held at an unknown start and the driver picks it at
    /// creation (gpuslice before the solver chose starts).
    Driver,
}

impl SlotPolicy {
    /// The choice to make, `None` for [`SlotPolicy::Driver`].
    pub(crate) fn choice(self) -> Option<SlotChoice> {
        match self {
            SlotPolicy::KeepMost => Some(SlotChoice::KeepMost),
            SlotPolicy::FirstFit => Some(SlotChoice::FirstFit),
            SlotPolicy::Driver => None,
        }
    }

    /// The spelling: `keepmost`, `firstfit`, `driver`.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotPolicy::KeepMost => "keepmost",
            SlotPolicy::FirstFit => "firstfit",
            SlotPolicy::Driver => "driver",
        }
    }
}

impl fmt::Display for SlotPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SlotPolicy {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "keepmost" => Ok(SlotPolicy::KeepMost),
            "firstfit" => Ok(SlotPolicy::FirstFit),
            "driver" => Ok(SlotPolicy::Driver),
            _ => Err(SchedError::InvalidPolicy {
                input: s.to_owned(),
            }),
        }
    }
}
