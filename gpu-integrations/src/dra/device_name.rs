//! The grammar of the device names gpuslice publishes in ResourceSlices, in one place: the
//! exporter writes them with [`Display`](std::fmt::Display) and the node side of DRA reads them
//! back with [`FromStr`](std::str::FromStr).
//!
//! - `gpu-0000-41-00-0`: a whole GPU (also the name of the GPU's counter set);
//! - `vgpu-0000-41-00-0-4096mi`: the time-sliced vGPUs of one framebuffer size on a GPU;
//! - `vgpu-0000-41-00-0-4096mi-2`: one time-sliced vGPU of one size on a GPU (the encoding for
//!   Kubernetes before 1.36.2, one device per instance);
//! - `vgpu-0000-41-00-0-mixed`: the vGPUs of a mixed-size GPU;
//! - `mig-0000-41-00-0-1g-16384mi-s3`: one MIG placement (slices, framebuffer, start slot).
//!
//! An mdev parent that is not a function of a PCI GPU (a virtual parent such as the kernel's
//! sample display driver `mbochs`, `/sys/class/mdev_bus/mbochs`) has no address: its devices are
//! named by the parent's *label* ([`parent_label`]) and read back by [`VirtualDeviceName`]:
//! - `mdev-mbochs`: the parent's counter set;
//! - `vgpu-mdev-mbochs-64mi-2`: one vGPU of one size on the parent (instance `n`, the encoding for
//!   Kubernetes before 1.36.2);
//! - `vgpu-mdev-mbochs-mixed`: the parent's vGPUs of every size (1.36.2 and later).
//!
//! The label is the parent's name when that is already a DNS label of at most 30 characters
//! (`mbochs`); otherwise the name lowercased with every other character turned into `-`, cut to
//! 20 characters, and `-` plus 8 hex digits of a hash (FNV-1a, 32 bits) of the exact name, so two
//! names that read the same once lowercased never share a label (`My_Disp` → `my-disp-…`). It
//! depends on the name only, so it is stable across restarts and nodes. The two forms cannot be
//! mistaken for a GPU's: `mdev` is not a hexadecimal PCI domain.

use std::fmt;
use std::str::FromStr;

use gpu_core::{NodeTopology, Parent, ParentId, PciAddress};

use crate::error::IntegrationError;

/// A device gpuslice publishes, named by the GPU that backs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceName {
    /// A whole GPU.
    Gpu(PciAddress),
    /// Time-sliced vGPUs of one size (MiB) on a GPU.
    Vgpu(PciAddress, u64),
    /// One time-sliced vGPU of one size (MiB) on a GPU: instance `n` of that size.
    VgpuInstance(PciAddress, u64, u32),
    /// vGPUs of a mixed-size GPU.
    Mixed(PciAddress),
    /// One MIG placement.
    Mig {
        /// The GPU.
        gpu: PciAddress,
        /// Slices.
        slices: u8,
        /// Framebuffer.
        size_mib: u64,
        /// Start slot.
        start: u8,
    },
}

impl DeviceName {
    /// The GPU backing the device.
    pub fn gpu(&self) -> PciAddress {
        match self {
            DeviceName::Gpu(a)
            | DeviceName::Vgpu(a, _)
            | DeviceName::VgpuInstance(a, _, _)
            | DeviceName::Mixed(a) => *a,
            DeviceName::Mig { gpu, .. } => *gpu,
        }
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::Gpu(a) => write!(f, "gpu-{}", a.dns_label()),
            DeviceName::Vgpu(a, size) => write!(f, "vgpu-{}-{size}mi", a.dns_label()),
            DeviceName::VgpuInstance(a, size, n) => {
                write!(f, "vgpu-{}-{size}mi-{n}", a.dns_label())
            }
            DeviceName::Mixed(a) => write!(f, "vgpu-{}-mixed", a.dns_label()),
            DeviceName::Mig {
                gpu,
                slices,
                size_mib,
                start,
            } => write!(f, "mig-{}-{slices}g-{size_mib}mi-s{start}", gpu.dns_label()),
        }
    }
}

/// Reads the DNS-label form of a PCI address (`0000-41-00-0`) at the start of `s`; returns the
/// address and what follows it.
fn split_label(s: &str) -> Option<(PciAddress, &str)> {
    let mut fields = s.splitn(5, '-');
    let domain = fields.next()?;
    let bus = fields.next()?;
    let device = fields.next()?;
    let function = fields.next()?;
    let rest = fields.next().unwrap_or("");
    let all_hex = |f: &str, n: usize| f.len() == n && f.bytes().all(|b| b.is_ascii_hexdigit());
    if !(all_hex(domain, 4) && all_hex(bus, 2) && all_hex(device, 2) && all_hex(function, 1)) {
        return None;
    }
    let address = format!("{domain}:{bus}:{device}.{function}").parse().ok()?;
    Some((address, rest))
}

fn parse(s: &str) -> Option<DeviceName> {
    if let Some(label) = s.strip_prefix("gpu-") {
        let (a, rest) = split_label(label)?;
        return rest.is_empty().then_some(DeviceName::Gpu(a));
    }
    if let Some(label) = s.strip_prefix("vgpu-") {
        let (a, rest) = split_label(label)?;
        if rest == "mixed" {
            return Some(DeviceName::Mixed(a));
        }
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if let Some((size, n)) = rest.split_once("mi-") {
            if !(digits(size) && digits(n)) {
                return None;
            }
            return Some(DeviceName::VgpuInstance(
                a,
                size.parse().ok()?,
                n.parse().ok()?,
            ));
        }
        let size = rest.strip_suffix("mi")?;
        if !digits(size) {
            return None;
        }
        return Some(DeviceName::Vgpu(a, size.parse().ok()?));
    }
    let (gpu, rest) = split_label(s.strip_prefix("mig-")?)?;
    let (slices, rest) = rest.split_once("g-")?;
    let (size, start) = rest.split_once("mi-s")?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !(digits(slices) && digits(size) && digits(start)) {
        return None;
    }
    Some(DeviceName::Mig {
        gpu,
        slices: slices.parse().ok()?,
        size_mib: size.parse().ok()?,
        start: start.parse().ok()?,
    })
}

impl FromStr for DeviceName {
    type Err = IntegrationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s).ok_or_else(|| {
            crate::error::error!(Invalid, s;
                "{s:?} is not a gpuslice device name (gpu-DDDD-BB-DD-F, vgpu-DDDD-BB-DD-F-<MiB>mi, vgpu-DDDD-BB-DD-F-<MiB>mi-<n>, vgpu-DDDD-BB-DD-F-mixed or mig-DDDD-BB-DD-F-<n>g-<MiB>mi-s<start>)"
            )
        })
    }
}

/// The longest parent name used as its label unchanged.
const MAX_PLAIN_LABEL: usize = 30;
/// How much of a name that is not a plain label is kept before its hash.
const HASHED_PREFIX: usize = 20;

/// FNV-1a, 32 bits: small, stable across releases and platforms (unlike std's hasher).
fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The DNS-label form of a virtual mdev parent's name (see the module doc): the name itself when
/// it is a DNS label of at most 30 characters, else a cleaned prefix and a hash of the name.
pub fn parent_label(name: &str) -> String {
    if name.len() <= MAX_PLAIN_LABEL && super::names::is_dns_label(name) {
        return name.to_owned();
    }
    let cleaned: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(HASHED_PREFIX)
        .collect();
    let cleaned = cleaned.trim_matches('-');
    if cleaned.is_empty() {
        format!("{:08x}", fnv1a(name))
    } else {
        format!("{cleaned}-{:08x}", fnv1a(name))
    }
}

/// The counter set of a virtual mdev parent: `mdev-<label>`.
pub fn virtual_counter_set_name(parent: &str) -> String {
    format!("mdev-{}", parent_label(parent))
}

/// A device gpuslice publishes for a virtual mdev parent (one that is not a PCI function), named
/// by the parent's label ([`parent_label`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VirtualDeviceName {
    /// One vGPU of one size (MiB) on the parent: instance `n` of that size.
    Instance {
        /// The parent's label.
        label: String,
        /// Framebuffer (video memory) in MiB.
        size_mib: u64,
        /// Which one.
        n: u32,
    },
    /// The parent's vGPUs of every size (a consumable `framebuffer` capacity).
    Mixed {
        /// The parent's label.
        label: String,
    },
}

impl VirtualDeviceName {
    /// The parent's label.
    pub fn label(&self) -> &str {
        match self {
            VirtualDeviceName::Instance { label, .. } | VirtualDeviceName::Mixed { label } => label,
        }
    }

    /// The virtual mdev parent of `node` whose label the device names.
    pub fn parent<'n>(&self, node: &'n NodeTopology) -> Option<&'n Parent> {
        node.mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu.is_none())
            .find(|p| matches!(&p.id, ParentId::Named(n) if parent_label(n) == self.label()))
    }
}

impl fmt::Display for VirtualDeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VirtualDeviceName::Instance { label, size_mib, n } => {
                write!(f, "vgpu-mdev-{label}-{size_mib}mi-{n}")
            }
            VirtualDeviceName::Mixed { label } => write!(f, "vgpu-mdev-{label}-mixed"),
        }
    }
}

fn parse_virtual(s: &str) -> Option<VirtualDeviceName> {
    let rest = s.strip_prefix("vgpu-mdev-")?;
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let good_label = |l: &str| super::names::is_dns_label(l);
    // The instance form first: its last field is a number, which `mixed` is not.
    if let Some((head, n)) = rest.rsplit_once('-') {
        if digits(n) {
            let (label, size) = head.rsplit_once('-')?;
            let size = size.strip_suffix("mi")?;
            if !(digits(size) && good_label(label)) {
                return None;
            }
            return Some(VirtualDeviceName::Instance {
                label: label.to_owned(),
                size_mib: size.parse().ok()?,
                n: n.parse().ok()?,
            });
        }
    }
    let label = rest.strip_suffix("-mixed")?;
    good_label(label).then(|| VirtualDeviceName::Mixed {
        label: label.to_owned(),
    })
}

impl FromStr for VirtualDeviceName {
    type Err = IntegrationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_virtual(s).ok_or_else(|| {
            crate::error::error!(Invalid, s;
                "{s:?} is not a gpuslice device name of a virtual mdev parent (vgpu-mdev-<label>-<MiB>mi-<n> or vgpu-mdev-<label>-mixed)"
            )
        })
    }
}

/// The counter set name of a GPU (the same text as its whole-GPU device name).
pub fn counter_set_name(gpu: &PciAddress) -> String {
    DeviceName::Gpu(*gpu).to_string()
}

/// The device name of a whole GPU.
pub fn gpu_device_name(gpu: &PciAddress) -> String {
    DeviceName::Gpu(*gpu).to_string()
}

/// The device name of a GPU's time-sliced vGPUs of one framebuffer size.
pub fn vgpu_device_name(gpu: &PciAddress, size_mib: u64) -> String {
    DeviceName::Vgpu(*gpu, size_mib).to_string()
}

/// The device name of instance `n` of a GPU's time-sliced vGPUs of one framebuffer size.
pub fn vgpu_instance_device_name(gpu: &PciAddress, size_mib: u64, n: u32) -> String {
    DeviceName::VgpuInstance(*gpu, size_mib, n).to_string()
}

/// The device name of a mixed-size GPU's vGPUs.
pub fn mixed_device_name(gpu: &PciAddress) -> String {
    DeviceName::Mixed(*gpu).to_string()
}

/// The device name of one MIG placement.
pub fn mig_device_name(gpu: &PciAddress, slices: u8, size_mib: u64, start: u8) -> String {
    DeviceName::Mig {
        gpu: *gpu,
        slices,
        size_mib,
        start,
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> PciAddress {
        "0000:41:00.0".parse().unwrap()
    }

    #[test]
    fn every_form_reads_back_as_written() {
        let a = gpu();
        for d in [
            DeviceName::Gpu(a),
            DeviceName::Vgpu(a, 4096),
            DeviceName::VgpuInstance(a, 4096, 11),
            DeviceName::Mixed(a),
            DeviceName::Mig {
                gpu: a,
                slices: 1,
                size_mib: 16384,
                start: 3,
            },
        ] {
            let text = d.to_string();
            assert_eq!(text.parse::<DeviceName>().ok(), Some(d), "{text}");
        }
        assert_eq!(
            DeviceName::Vgpu(a, 4096).to_string(),
            "vgpu-0000-41-00-0-4096mi"
        );
    }

    #[test]
    fn virtual_parents_are_named_by_a_stable_dns_label() {
        assert_eq!(parent_label("mbochs"), "mbochs");
        assert_eq!(virtual_counter_set_name("mbochs"), "mdev-mbochs");
        let odd = parent_label("My_Display.0");
        assert!(odd.starts_with("my-display-0-"), "{odd}");
        assert_eq!(odd, parent_label("My_Display.0"), "stable");
        assert_ne!(
            odd,
            parent_label("my-display-0"),
            "a plain name keeps its own label"
        );
        assert_ne!(parent_label("a_b"), parent_label("a.b"));
        for name in ["___", &"x".repeat(200), "Ünïcode"] {
            let l = parent_label(name);
            assert!(
                crate::dra::names::is_dns_label(&l) && l.len() <= 29,
                "{name}: {l}"
            );
        }
        for d in [
            VirtualDeviceName::Instance {
                label: "mbochs".into(),
                size_mib: 64,
                n: 3,
            },
            VirtualDeviceName::Mixed {
                label: "mbochs".into(),
            },
            // A label that ends like a size or like `mixed` still reads back.
            VirtualDeviceName::Instance {
                label: "x-64mi".into(),
                size_mib: 4,
                n: 0,
            },
            VirtualDeviceName::Mixed {
                label: "x-4mi-0".into(),
            },
            VirtualDeviceName::Instance {
                label: "x-mixed".into(),
                size_mib: 4,
                n: 0,
            },
        ] {
            let text = d.to_string();
            assert_eq!(text.parse::<VirtualDeviceName>().ok(), Some(d), "{text}");
            assert!(text.parse::<DeviceName>().is_err(), "{text}");
        }
        assert_eq!(
            VirtualDeviceName::Instance {
                label: "mbochs".into(),
                size_mib: 64,
                n: 3
            }
            .to_string(),
            "vgpu-mdev-mbochs-64mi-3"
        );
        for bad in [
            "vgpu-mdev-",
            "vgpu-mdev-mbochs",
            "vgpu-mdev--mixed",
            "vgpu-mdev-mbochs-64-3",
            "vgpu-mdev-MBOCHS-64mi-3",
            "vgpu-0000-41-00-0-4096mi",
        ] {
            assert!(bad.parse::<VirtualDeviceName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn malformed_names_are_refused_with_the_grammar() {
        for bad in [
            "",
            "gpu-0000-41-00",
            "gpu-0000-41-00-0-x",
            "vgpu-0000-41-00-0-mi",
            "vgpu-0000-41-00-0-+4mi",
            "vgpu-0000-41-00-0-4096mi-",
            "vgpu-0000-41-00-0-4096mi-x",
            "mig-0000-41-00-0-1g-16384mi",
            "tpu-0000-41-00-0",
        ] {
            let e = bad.parse::<DeviceName>().err().map(|e| e.to_string());
            assert!(
                e.is_some_and(|m| m.contains("not a gpuslice device name")),
                "{bad}"
            );
        }
    }
}
