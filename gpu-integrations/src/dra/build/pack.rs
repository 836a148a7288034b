//! Packing the planned counter sets and devices into ResourceSlices under the version's limits:
//! from 1.35 counter sets and devices go in slices of their own; under 1.34 a GPU's devices
//! sit in one slice with its counter set.

use crate::error::{Result, fail};

use super::parts::{GpuPlan, consumed_counters, limited};
use crate::dra::model::*;
use crate::dra::version::*;

/// A slice being filled.
#[derive(Debug, Default)]
pub(super) struct Draft {
    pub(super) sets: Vec<CounterSet>,
    pub(super) devices: Vec<Device>,
}

impl Draft {
    pub(super) fn counters(&self) -> usize {
        self.sets.iter().map(|s| s.counters.len()).sum()
    }
    pub(super) fn device_limit(&self, more: &[Device]) -> usize {
        if self.devices.iter().chain(more).any(limited) {
            MAX_DEVICES_WITH_COUNTERS
        } else {
            MAX_DEVICES
        }
    }
    pub(super) fn consumed(&self) -> usize {
        self.devices.iter().map(consumed_counters).sum()
    }
    pub(super) fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.devices.is_empty()
    }
}

/// The contents of a node's slices: `plans` (each named as warnings and errors name it) packed
/// under `version`'s limits; one empty slice when there is nothing, so the scheduler still sees
/// that the driver has seen the node.
///
/// # Errors
/// Under Kubernetes 1.34, one plan's devices and counters that do not fit one slice.
pub(super) fn pack(plans: Vec<(String, GpuPlan)>, version: K8sVersion) -> Result<Vec<Draft>> {
    let mut drafts: Vec<Draft> = Vec::new();
    if version.splits_counters() {
        let sets: Vec<CounterSet> = plans
            .iter()
            .filter_map(|(_, p)| p.counter_set.clone())
            .collect();
        for chunk in sets.chunks(MAX_COUNTER_SETS) {
            drafts.push(Draft {
                sets: chunk.to_vec(),
                devices: vec![],
            });
        }
        let mut current = Draft::default();
        for d in plans.into_iter().flat_map(|(_, p)| p.devices) {
            if current.devices.len() + 1 > current.device_limit(std::slice::from_ref(&d)) {
                drafts.push(std::mem::take(&mut current));
            }
            current.devices.push(d);
        }
        if !current.is_empty() {
            drafts.push(current);
        }
    } else {
        let mut current = Draft::default();
        for (who, plan) in plans {
            let fits = |d: &Draft| {
                d.sets.len() + usize::from(plan.counter_set.is_some()) <= MAX_COUNTER_SETS
                    && d.counters() + plan.counter_count() <= MAX_COUNTERS
                    && d.devices.len() + plan.devices.len() <= d.device_limit(&plan.devices)
                    && d.consumed() + plan.consumed_count() <= MAX_CONSUMED_COUNTERS_PER_SLICE
            };
            if !fits(&current) {
                if !fits(&Draft::default()) {
                    fail!(
                        Refused, who;
                        "{who} has {} devices and {} counters, more than one ResourceSlice holds under Kubernetes 1.34; use --k8s-version 1.35 or later",
                        plan.devices.len(),
                        plan.counter_count()
                    );
                }
                drafts.push(std::mem::take(&mut current));
            }
            current.sets.extend(plan.counter_set);
            current.devices.extend(plan.devices);
        }
        if !current.is_empty() {
            drafts.push(current);
        }
    }
    if drafts.is_empty() {
        // An empty pool still tells the scheduler the node has been seen by the driver.
        drafts.push(Draft::default());
    }
    Ok(drafts)
}
