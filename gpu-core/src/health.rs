//! Health verdicts.

use serde::{Deserialize, Serialize};

/// The graded state of a GPU or vGPU parent. JSON: `Healthy`, `Degraded`, `Unhealthy`, `Unknown`.
///
/// Ordered from best to worst for placement ranking: Healthy < Unknown < Degraded < Unhealthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum HealthState {
    /// Every signal that could be read is fine.
    Healthy,
    /// Usable, but a signal is off (link below its trained width, correctable errors climbing).
    Degraded,
    /// Must not be handed out (fatal AER, uncorrectable ECC, row-remap failure, overheating).
    Unhealthy,
    /// No signal could be read.
    #[default]
    Unknown,
}

impl HealthState {
    /// Rank for placement: lower is better.
    pub fn rank(self) -> u8 {
        match self {
            HealthState::Healthy => 0,
            HealthState::Unknown => 1,
            HealthState::Degraded => 2,
            HealthState::Unhealthy => 3,
        }
    }

    /// The name used in JSON and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "Healthy",
            HealthState::Degraded => "Degraded",
            HealthState::Unhealthy => "Unhealthy",
            HealthState::Unknown => "Unknown",
        }
    }

    /// The worse of two states (Unknown only wins over Healthy when nothing else is known).
    pub fn worst(self, other: HealthState) -> HealthState {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }
}

impl std::fmt::Display for HealthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A health verdict with the reasons that led to it (`"link x8 of x16"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Health {
    /// The graded state.
    pub state: HealthState,
    /// Why, one short phrase per signal that was off; empty when Healthy.
    #[serde(default)]
    pub reasons: Vec<String>,
}

impl Health {
    /// A Healthy verdict.
    pub fn healthy() -> Self {
        Health {
            state: HealthState::Healthy,
            reasons: vec![],
        }
    }
    /// An Unknown verdict with no reasons.
    pub fn unknown() -> Self {
        Health {
            state: HealthState::Unknown,
            reasons: vec![],
        }
    }
    /// True when the GPU may be handed out at all.
    pub fn is_usable(&self) -> bool {
        self.state != HealthState::Unhealthy
    }
}
