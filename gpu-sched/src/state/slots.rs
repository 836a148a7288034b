//! The fleet's slot policy ([`SlotPolicy`]): how GPU-instance starts are chosen.

use super::FleetState;
use crate::slots::SlotPolicy;

impl FleetState {
    /// How GPU-instance starts are chosen from now on (default [`SlotPolicy::KeepMost`]).
    pub fn set_slot_policy(&mut self, policy: SlotPolicy) {
        self.slot_policy = policy;
    }

    /// How GPU-instance starts are chosen.
    pub fn slot_policy(&self) -> SlotPolicy {
        self.slot_policy
    }
}
