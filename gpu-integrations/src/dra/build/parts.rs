//! The pieces every device is built from: profiles with their sizes resolved, attribute and
//! counter values within the API's limits, and one GPU's plan (its counter set and devices).

use std::collections::BTreeMap;

use gpu_core::{Profile, nvidia};

use crate::dra::model::*;
use crate::dra::version::*;

/// A profile with its sizes resolved from the model or, failing that, from its NVIDIA name.
#[derive(Debug, Clone)]
pub(super) struct Resolved<'a> {
    pub(super) profile: &'a Profile,
    pub(super) framebuffer_mib: Option<u64>,
    pub(super) mig_slices: Option<u8>,
}

pub(super) fn resolve(p: &Profile) -> Resolved<'_> {
    let parsed = nvidia::VgpuTypeName::parse(&p.name).ok();
    Resolved {
        profile: p,
        framebuffer_mib: p
            .framebuffer_mib
            .or_else(|| parsed.as_ref().map(|n| n.framebuffer_mib())),
        mig_slices: p
            .mig_slices
            .or_else(|| parsed.as_ref().and_then(|n| n.mig_slices)),
    }
}

pub(super) fn str_attr(v: &str) -> DeviceAttribute {
    let mut s = v.trim().to_owned();
    if s.len() > MAX_STRING_ATTRIBUTE {
        let mut cut = MAX_STRING_ATTRIBUTE;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    DeviceAttribute::String(s)
}

pub(super) fn int_attr(v: u64) -> DeviceAttribute {
    DeviceAttribute::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

pub(super) fn counters(
    pairs: impl IntoIterator<Item = (String, String)>,
) -> BTreeMap<String, Counter> {
    pairs
        .into_iter()
        .map(|(k, value)| (k, Counter { value }))
        .collect()
}

/// The devices and counter set of one GPU.
#[derive(Debug, Clone, Default)]
pub(super) struct GpuPlan {
    pub(super) counter_set: Option<CounterSet>,
    pub(super) devices: Vec<Device>,
}

impl GpuPlan {
    pub(super) fn counter_count(&self) -> usize {
        self.counter_set.as_ref().map_or(0, |c| c.counters.len())
    }
    pub(super) fn consumed_count(&self) -> usize {
        self.devices.iter().map(consumed_counters).sum()
    }
}

pub(super) fn consumed_counters(d: &Device) -> usize {
    d.consumes_counters.iter().map(|c| c.counters.len()).sum()
}

pub(super) fn limited(d: &Device) -> bool {
    !d.consumes_counters.is_empty() || !d.taints.is_empty()
}

/// Time-sliced profiles by framebuffer size.
pub(super) type BySize<'p> = BTreeMap<u64, Vec<&'p Resolved<'p>>>;
/// MIG-backed profiles by slices and framebuffer size.
pub(super) type MigGroups<'p> = BTreeMap<(u8, u64), Vec<&'p Resolved<'p>>>;
