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

/// A supported Kubernetes minor version of the v1 DRA API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum K8sVersion {
    /// 1.34: DRA GA; a slice may hold counter sets and the devices that use them.
    V1_34,
    /// 1.35: counter sets and devices in separate slices; taint effect `None`.
    V1_35,
    /// 1.36.
    V1_36,
    /// 1.37.
    #[default]
    V1_37,
}

impl K8sVersion {
    /// From 1.35 a slice holds either `sharedCounters` or `devices`, and counter sets are
    /// referenced across the pool.
    pub fn splits_counters(self) -> bool {
        self >= Self::V1_35
    }

    /// From 1.35 a taint may have effect `None`.
    pub fn has_none_effect(self) -> bool {
        self >= Self::V1_35
    }

    /// `1.34`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1_34 => "1.34",
            Self::V1_35 => "1.35",
            Self::V1_36 => "1.36",
            Self::V1_37 => "1.37",
        }
    }
}

impl fmt::Display for K8sVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for K8sVersion {
    type Err = IntegrationError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().trim_start_matches('v');
        let minor = t
            .strip_prefix("1.")
            .map(|m| m.split('.').next().unwrap_or(""));
        match minor {
            Some("34") => Ok(Self::V1_34),
            Some("35") => Ok(Self::V1_35),
            Some("36") => Ok(Self::V1_36),
            Some("37") => Ok(Self::V1_37),
            _ => fail!(
                Invalid, "Kubernetes version";
                "unsupported Kubernetes version {s:?}: use 1.34, 1.35, 1.36 or 1.37"
            ),
        }
    }
}
