//! Health verdicts.

use serde::{Deserialize, Serialize};

use crate::CoreError;

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

    /// Whether the GPU `gpu` with this verdict may be handed to a VM whole (bound to
    /// vfio-pci), the one rule the CLI's `gpu bind` and the agent's bind route share: an
    /// Unhealthy GPU is refused unless `force`; a Degraded one, or an Unhealthy one forced,
    /// goes ahead with the warning returned. `force_hint` names how the caller's front-end
    /// forces (`--force`, `?force=true`) for the refusal's message.
    ///
    /// # Errors
    /// [`CoreError::Unhealthy`] for an Unhealthy GPU without `force`.
    pub fn check_handout(
        &self,
        gpu: &str,
        force: bool,
        force_hint: &'static str,
    ) -> Result<Option<String>, CoreError> {
        let reasons = if self.reasons.is_empty() {
            "no reason recorded".to_owned()
        } else {
            self.reasons.join(", ")
        };
        match self.state {
            HealthState::Unhealthy if !force => Err(CoreError::Unhealthy {
                gpu: gpu.to_owned(),
                reasons,
                force: force_hint,
            }),
            HealthState::Unhealthy | HealthState::Degraded => Ok(Some(format!(
                "{gpu} is {} ({reasons})",
                self.state.as_str()
            ))),
            HealthState::Healthy | HealthState::Unknown => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graded(state: HealthState) -> Health {
        Health {
            state,
            reasons: vec!["AER fatal 3".to_owned()],
        }
    }

    #[test]
    fn an_unhealthy_gpu_is_refused_unless_forced() {
        let e = graded(HealthState::Unhealthy)
            .check_handout("0000:01:00.0", false, "--force")
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Unhealthy);
        assert_eq!(
            e.to_string(),
            "0000:01:00.0 is Unhealthy (AER fatal 3); a VM would get a failing GPU; nothing was \
             changed (--force binds it anyway)"
        );
        assert_eq!(
            graded(HealthState::Unhealthy)
                .check_handout("0000:01:00.0", true, "--force")
                .unwrap(),
            Some("0000:01:00.0 is Unhealthy (AER fatal 3)".to_owned())
        );
    }

    #[test]
    fn a_degraded_gpu_goes_with_a_warning_and_a_healthy_or_unknown_one_without() {
        assert_eq!(
            graded(HealthState::Degraded)
                .check_handout("0000:01:00.0", false, "--force")
                .unwrap(),
            Some("0000:01:00.0 is Degraded (AER fatal 3)".to_owned())
        );
        for s in [HealthState::Healthy, HealthState::Unknown] {
            assert_eq!(
                graded(s).check_handout("g", false, "--force").unwrap(),
                None
            );
        }
    }
}
