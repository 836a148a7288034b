//! The limits and version rules of the Kubernetes DRA API (`resource.k8s.io/v1`) that both the
//! exporter ([`super::build`]) and the checker ([`super::rules`]) follow.

use std::fmt;
use std::str::FromStr;

use crate::error::{IntegrationError, Result, fail};

/// The default driver name.
pub const DEFAULT_DRIVER: &str = "gpu.gpuslice.dev";
/// The standard attribute of a device's PCI address.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The attribute of a device's NUMA node.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
/// Most devices in a slice.
pub const MAX_DEVICES: usize = 128;
/// Most devices in a slice when any of them consumes counters or has taints.
pub const MAX_DEVICES_WITH_COUNTERS: usize = 64;
/// Most counter sets in a slice.
pub const MAX_COUNTER_SETS: usize = 8;
/// Most counters in one set (1.35+), and in all sets of a slice together (1.34).
pub const MAX_COUNTERS: usize = 32;
/// Most `consumesCounters` entries of one device.
pub const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// Most counters consumed by all devices of a slice together (1.34).
pub const MAX_CONSUMED_COUNTERS_PER_SLICE: usize = 1024;
/// Most attributes and capacities of one device together.
pub const MAX_ATTRIBUTES: usize = 32;
/// Longest string attribute value.
pub const MAX_STRING_ATTRIBUTE: usize = 64;

/// A supported Kubernetes release of the v1 DRA API: a minor version (1.34–1.37) and, when given,
/// a patch release. A minor alone means its oldest patch (`1.36` is 1.36.0), so that it gets the
/// encoding every patch of that minor is safe with.
#[derive(Debug, Clone, Copy)]
pub struct K8sVersion {
    minor: u8,
    /// `None` when only the minor was named (compared as patch 0, shown without a patch).
    patch: Option<u16>,
}

impl K8sVersion {
    /// 1.34: DRA GA; a slice may hold counter sets and the devices that use them.
    pub const V1_34: Self = Self::minor(34);
    /// 1.35: counter sets and devices in separate slices; taint effect `None`.
    pub const V1_35: Self = Self::minor(35);
    /// 1.36 (1.36.0).
    pub const V1_36: Self = Self::minor(36);
    /// 1.36.2: the first release whose scheduler charges a multi-allocatable device's counters
    /// once while any share of it is allocated, across scheduling cycles too (kubernetes#139034,
    /// fixed by #139040).
    pub const V1_36_2: Self = Self {
        minor: 36,
        patch: Some(2),
    };
    /// 1.37.
    pub const V1_37: Self = Self::minor(37);

    const fn minor(minor: u8) -> Self {
        K8sVersion { minor, patch: None }
    }

    fn key(self) -> (u8, u16) {
        (self.minor, self.patch.unwrap_or(0))
    }

    /// From 1.35 a slice holds either `sharedCounters` or `devices`, and counter sets are
    /// referenced across the pool.
    pub fn splits_counters(self) -> bool {
        self >= Self::V1_35
    }

    /// From 1.35 a taint may have effect `None`.
    pub fn has_none_effect(self) -> bool {
        self >= Self::V1_35
    }

    /// From 1.36.2 the scheduler counts a multi-allocatable device's counters once while any
    /// share of it is allocated, in later scheduling cycles too; before, committed shares are not
    /// counted, so another device on the same counters is still allocated (kubernetes#139034).
    pub fn counts_committed_shares(self) -> bool {
        self >= Self::V1_36_2
    }

    /// The encoding of time-sliced vGPUs this version's scheduler cannot over-allocate.
    pub fn encoding(self) -> Encoding {
        if self.counts_committed_shares() {
            Encoding::SizeLock
        } else {
            Encoding::OneSizePerInstance
        }
    }

    /// `1.34`, `1.36.2`, ...: as named (a minor alone without its patch).
    pub fn as_string(self) -> String {
        match self.patch {
            Some(p) => format!("1.{}.{p}", self.minor),
            None => format!("1.{}", self.minor),
        }
    }
}

impl Default for K8sVersion {
    fn default() -> Self {
        Self::V1_37
    }
}

impl PartialEq for K8sVersion {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for K8sVersion {}

impl PartialOrd for K8sVersion {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for K8sVersion {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl std::hash::Hash for K8sVersion {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl fmt::Display for K8sVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_string())
    }
}

impl FromStr for K8sVersion {
    type Err = IntegrationError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().trim_start_matches('v');
        let mut parts = t.split('.');
        let digits =
            |p: &str| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit());
        let parsed = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("1"), Some(m), patch, None) if digits(m) && patch.is_none_or(digits) => m
                .parse::<u8>()
                .ok()
                .filter(|m| (34..=37).contains(m))
                .map(|minor| K8sVersion {
                    minor,
                    patch: patch.and_then(|p| p.parse().ok()),
                }),
            _ => None,
        };
        match parsed {
            Some(v) => Ok(v),
            None => fail!(
                Invalid, s;
                "unsupported Kubernetes version {s:?}: use 1.34, 1.35, 1.36 or 1.37, or a patch \
                 release of one (1.36.2); a minor alone means its oldest patch"
            ),
        }
    }
}

/// How time-sliced vGPUs are published, by what the scheduler of a version counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// From 1.36.2: per GPU and framebuffer size one multi-allocatable device consuming the whole
    /// framebuffer counter, so the first vGPU locks the GPU to its size.
    SizeLock,
    /// Before 1.36.2: per GPU one size (the size it is locked to, or the one the operator chose),
    /// as one device per instance consuming its share of the framebuffer; the whole GPU is
    /// excluded through the counters.
    OneSizePerInstance,
}

impl Encoding {
    /// `size-lock` or `one-size-per-instance`.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::SizeLock => "size-lock",
            Encoding::OneSizePerInstance => "one-size-per-instance",
        }
    }

    /// One line saying which encoding a version gets, and why.
    pub fn describe(self, version: K8sVersion) -> String {
        match self {
            Encoding::SizeLock => format!(
                "Kubernetes {version}: size-lock encoding (one multi-allocatable device per GPU \
                 and vGPU size; its scheduler charges a device's counters once across scheduling \
                 cycles)"
            ),
            Encoding::OneSizePerInstance => format!(
                "Kubernetes {version}: one-size-per-instance encoding (one vGPU size per GPU, one \
                 device per instance; before 1.36.2 the scheduler does not count committed shares \
                 across scheduling cycles, kubernetes#139034)"
            ),
        }
    }
}
