//! What one node has: GPUs, vGPU parents with their profiles and instances, and framebuffer pools.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::address::PciAddress;
use crate::error::CoreError;
use crate::health::Health;
use crate::ids::{MdevUuid, ParentId, VgpuTypeId};
use crate::vendor::Vendor;

/// A 16-bit PCI ID (vendor, device, subsystem). JSON: four lowercase hex digits, `"10de"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PciId(pub u16);

impl FromStr for PciId {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let hex = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if hex.is_empty() || hex.len() > 4 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CoreError::InvalidName {
                input: s.to_owned(),
                why: "expected a 16-bit hex PCI ID",
            });
        }
        u16::from_str_radix(hex, 16)
            .map(PciId)
            .map_err(|_| CoreError::InvalidName {
                input: s.to_owned(),
                why: "expected a 16-bit hex PCI ID",
            })
    }
}
impl fmt::Display for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}", self.0)
    }
}
impl Serialize for PciId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for PciId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A 24-bit PCI class code. JSON: `"0x030000"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ClassCode(pub u32);

impl ClassCode {
    /// Display controllers (`0x03xxxx`: VGA, 3D, other).
    pub fn is_display(self) -> bool {
        self.0 >> 16 == 0x03
    }
    /// Processing accelerators (`0x12xxxx`).
    pub fn is_accelerator(self) -> bool {
        self.0 >> 16 == 0x12
    }
    /// A GPU for gpuslice: display controller or processing accelerator.
    pub fn is_gpu(self) -> bool {
        self.is_display() || self.is_accelerator()
    }
    /// Headless compute: 3D controllers (`0x0302xx`) and processing accelerators.
    pub fn is_compute(self) -> bool {
        self.0 >> 8 == 0x0302 || self.is_accelerator()
    }
    /// A PCI-to-PCI bridge (`0x0604xx`).
    pub fn is_bridge(self) -> bool {
        self.0 >> 8 == 0x0604 || self.0 >> 16 == 0x06
    }
    /// HD audio (`0x0403xx`).
    pub fn is_audio(self) -> bool {
        self.0 >> 8 == 0x0403
    }
}
impl FromStr for ClassCode {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let hex = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if hex.is_empty() || hex.len() > 6 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CoreError::InvalidName {
                input: s.to_owned(),
                why: "expected a 24-bit hex PCI class",
            });
        }
        u32::from_str_radix(hex, 16)
            .map(ClassCode)
            .map_err(|_| CoreError::InvalidName {
                input: s.to_owned(),
                why: "expected a 24-bit hex PCI class",
            })
    }
}
impl fmt::Display for ClassCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:06x}", self.0)
    }
}
impl Serialize for ClassCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
impl<'de> Deserialize<'de> for ClassCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Whether a GPU can be handed to a VM whole. JSON: `free`, `in-use`, `blocked`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuState {
    /// Can be passed through whole.
    Free,
    /// Bound to vfio-pci, held by an instance, or hosting vGPUs.
    InUse,
    /// Cannot be passed through (IOMMU group shared with another device, no IOMMU, ...).
    Blocked,
}

impl GpuState {
    /// The JSON/table spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuState::Free => "free",
            GpuState::InUse => "in-use",
            GpuState::Blocked => "blocked",
        }
    }
}
impl fmt::Display for GpuState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The vGPU framework a GPU uses. JSON: `mdev`, `vendor-vfio`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VgpuFramework {
    /// The kernel's mediated-device framework (`/sys/class/mdev_bus`).
    Mdev,
    /// NVIDIA's vendor-specific VFIO framework (per-VF `nvidia/current_vgpu_type`).
    VendorVfio,
}
impl VgpuFramework {
    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VgpuFramework::Mdev => "mdev",
            VgpuFramework::VendorVfio => "vendor-vfio",
        }
    }
}

/// A companion function of a GPU (HD audio, USB-C, UCSI in the same slot, same vendor).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Function {
    /// Its address.
    pub address: PciAddress,
    /// Its class.
    pub class: ClassCode,
    /// Its PCI device ID.
    pub device_id: PciId,
    /// Its bound driver, if any.
    #[serde(default)]
    pub driver: Option<String>,
}

/// SR-IOV facts of a physical function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Sriov {
    /// `sriov_totalvfs`.
    pub total_vfs: u32,
    /// `sriov_numvfs` (VFs enabled now).
    pub num_vfs: u32,
    /// VF addresses in `virtfnN` order.
    #[serde(default)]
    pub vfs: Vec<PciAddress>,
    /// The PCI device ID the VFs report (`sriov_vf_device`), which may differ from the PF's;
    /// `None` when not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf_device_id: Option<PciId>,
    /// VFs bound to a driver other than NVIDIA's host driver (`nvidia`), which therefore hold
    /// no vGPU: `vfio-pci.ids=10de:26b9` on the kernel command line claims the VFs of an L40S,
    /// which share the PF's device ID. Read for NVIDIA GPUs only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_driver_vfs: Vec<VfDriver>,
    /// VFs whose vGPU state (`nvidia/current_vgpu_type`) cannot be read: neither offered nor
    /// planned until it can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable_vfs: Vec<UnreadableVf>,
}

/// A VF and the driver it is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VfDriver {
    /// The VF.
    pub address: PciAddress,
    /// Its driver.
    pub driver: String,
}

/// A VF whose vGPU state cannot be read, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreadableVf {
    /// The VF.
    pub address: PciAddress,
    /// What reading it answered.
    pub error: String,
}

impl Sriov {
    /// Why the VFs bound to other drivers hold no vGPU, and the fix, for the GPU whose device
    /// ID is `device_id` (the VFs' own when recorded). `None` when every VF is on `nvidia`.
    pub fn other_driver_diagnosis(
        &self,
        vendor_id: PciId,
        device_id: PciId,
    ) -> Option<VfDriverDiagnosis> {
        let first = self.other_driver_vfs.first()?;
        let vf_id = self.vf_device_id.unwrap_or(device_id);
        let ids = format!("{:04x}:{:04x}", vendor_id.0, vf_id.0);
        let mut drivers: Vec<&str> = self
            .other_driver_vfs
            .iter()
            .map(|v| v.driver.as_str())
            .collect();
        drivers.sort_unstable();
        drivers.dedup();
        let count = self.other_driver_vfs.len();
        let named = if count == 1 {
            format!("VF {}", first.address)
        } else {
            let last = self.other_driver_vfs.last().map_or(first, |l| l);
            format!("{count} VFs ({} ... {})", first.address, last.address)
        };
        let shared = if self.vf_device_id == Some(device_id) {
            format!(" (the VFs share the PF's device ID {ids})")
        } else {
            String::new()
        };
        let rebind = "clear each VF's driver_override (echo > driver_override), unbind it and \
                      write its address to /sys/bus/pci/drivers_probe so that nvidia takes it"
            .to_owned();
        let fix = if drivers.contains(&"vfio-pci") {
            format!(
                "vfio-pci claims them through `vfio-pci.ids={ids}` (kernel command line or \
                 modprobe.d){shared} or a `driver_override`: remove {ids} from vfio-pci.ids, \
                 then {rebind}"
            )
        } else {
            rebind.clone()
        };
        Some(VfDriverDiagnosis {
            problem: format!(
                "{named} bound to {}, not to the NVIDIA vGPU host driver (nvidia): no vGPU can \
                 be made on them",
                drivers.join(", ")
            ),
            fix,
            rebind,
            shared,
            ids,
        })
    }
}

/// Why a GPU's VFs hold no vGPU because another driver has them, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfDriverDiagnosis {
    /// The VFs and their driver.
    pub problem: String,
    /// The fix (`vfio-pci.ids`, `driver_override`, rebinding).
    pub fix: String,
    /// How to give the VFs back to nvidia now (`driver_override`, unbind, `drivers_probe`).
    pub rebind: String,
    /// ` (the VFs share the PF's device ID 10de:26b9)` when they do, else empty.
    pub shared: String,
    /// The VFs' `vendor:device` as `vfio-pci.ids` spells it (`10de:26b9`).
    pub ids: String,
}

impl std::fmt::Display for VfDriverDiagnosis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.problem, self.fix)
    }
}

/// PCIe link state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    /// `current_link_width` (lanes).
    #[serde(default)]
    pub current_width: Option<u32>,
    /// `max_link_width`.
    #[serde(default)]
    pub max_width: Option<u32>,
    /// `current_link_speed` in GT/s.
    #[serde(default)]
    pub current_speed_gts: Option<f64>,
    /// `max_link_speed` in GT/s.
    #[serde(default)]
    pub max_speed_gts: Option<f64>,
}

/// A physical GPU (never a VF).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Per-node name: `nvidia0`, `radeon1`, ...
    pub name: String,
    /// PCI address.
    pub address: PciAddress,
    /// PCI vendor ID.
    pub vendor_id: PciId,
    /// PCI device ID.
    pub device_id: PciId,
    /// Subsystem vendor ID.
    #[serde(default)]
    pub subsystem_vendor_id: Option<PciId>,
    /// Subsystem device ID.
    #[serde(default)]
    pub subsystem_device_id: Option<PciId>,
    /// PCI class.
    pub class: ClassCode,
    /// Vendor family.
    pub vendor: Vendor,
    /// Model name (from pci.ids or the driver), empty when unknown.
    #[serde(default)]
    pub model: String,
    /// Bound driver.
    #[serde(default)]
    pub driver: Option<String>,
    /// NUMA node; `None` when the kernel reports `-1` or nothing.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// IOMMU group; `None` without an IOMMU.
    #[serde(default)]
    pub iommu_group: Option<u32>,
    /// Companion functions that travel with the GPU.
    #[serde(default)]
    pub functions: Vec<Function>,
    /// Whole-GPU state.
    pub state: GpuState,
    /// Why the state is not `free` (names the offending device when blocked).
    #[serde(default)]
    pub state_reason: Option<String>,
    /// Memory in MiB, when known (NVML, or the vGPU pool size).
    #[serde(default, rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
    /// `memoryMiB` is only a lower bound: the vGPU pool size inferred from the types still
    /// creatable on a partly used GPU, with no source of its exact size.
    #[serde(
        default,
        rename = "memoryIsLowerBound",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub memory_is_lower_bound: bool,
    /// SR-IOV facts, when the GPU is a PF with SR-IOV capability.
    #[serde(default)]
    pub sriov: Option<Sriov>,
    /// The vGPU framework this GPU uses now, if any.
    #[serde(default)]
    pub vgpu_framework: Option<VgpuFramework>,
    /// Health verdict.
    #[serde(default)]
    pub health: Health,
    /// PCIe link state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
    /// The host console runs on this device (`boot_vga` = 1).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub boot_vga: bool,
    /// The MIG-backed vGPU types the GPU supports, each marked when it needs a GPU instance
    /// made first (MIG mode off, or no free instance of its profile); on a GPU with MIG only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_backed_types: Option<crate::mig_types::MigBackedTypes>,
    /// Problems met while reading this device (the scan went on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Gpu {
    /// A minimal GPU with the given identity, `free`, Unknown health; for builders and tests.
    pub fn new(
        name: impl Into<String>,
        address: PciAddress,
        vendor_id: u16,
        device_id: u16,
        class: u32,
    ) -> Self {
        Gpu {
            name: name.into(),
            address,
            vendor_id: PciId(vendor_id),
            device_id: PciId(device_id),
            subsystem_vendor_id: None,
            subsystem_device_id: None,
            class: ClassCode(class),
            vendor: Vendor::from_pci_id(vendor_id),
            model: String::new(),
            driver: None,
            numa_node: None,
            iommu_group: None,
            functions: vec![],
            state: GpuState::Free,
            state_reason: None,
            memory_mib: None,
            memory_is_lower_bound: false,
            sriov: None,
            vgpu_framework: None,
            health: Health::unknown(),
            link: None,
            boot_vga: false,
            mig_backed_types: None,
            warnings: vec![],
        }
    }
}

/// A vGPU profile (type) offered by a parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// Type ID: mdev type directory (`nvidia-746`) or vendor-VFIO number (`1155`).
    pub id: VgpuTypeId,
    /// Human name (`NVIDIA A2-4Q`, `mbochs-small`).
    pub name: String,
    /// Framebuffer per instance in MiB, when known.
    #[serde(default, rename = "framebufferMiB")]
    pub framebuffer_mib: Option<u64>,
    /// Most instances of this type a GPU can hold, when known.
    #[serde(default)]
    pub max_instances: Option<u32>,
    /// Instances that can truly still be created on this parent (driver count, capped by the pool).
    pub available_instances: u32,
    /// What the driver itself reported, before pool capping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_instances: Option<u32>,
    /// `device_api` (`vfio-pci` for GPUs); only `vfio-pci` types go to VMs as PCI devices.
    #[serde(default = "default_device_api")]
    pub device_api: String,
    /// MIG slices of a MIG-backed type.
    #[serde(default)]
    pub mig_slices: Option<u8>,
    /// MIG memory in GiB of a MIG-backed type.
    #[serde(default, rename = "migMemoryGiB")]
    pub mig_memory_gib: Option<u32>,
    /// Raw description, when the driver gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

fn default_device_api() -> String {
    "vfio-pci".to_owned()
}

/// An existing vGPU instance: an mdev (by UUID) or a vendor-VFIO VF with a type set (by address).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// mdev UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<MdevUuid>,
    /// VF address (vendor-VFIO).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<PciAddress>,
    /// Its type.
    pub profile: VgpuTypeId,
    /// Its type's name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_name: Option<String>,
    /// Framebuffer in MiB, when known.
    #[serde(
        default,
        rename = "framebufferMiB",
        skip_serializing_if = "Option::is_none"
    )]
    pub framebuffer_mib: Option<u64>,
    /// The VFIO device is open by a process (a VM is using it), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use: Option<bool>,
    /// Its placement ID on a GPU in mixed-size mode (the slot its run starts at, as the driver
    /// reports it in the VF's `nvidia/placement_id`), when it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_id: Option<u32>,
}

/// A vGPU parent: an mdev parent (PCI function or virtual device) or a vendor-VFIO VF.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Parent {
    /// Parent ID: PCI address or device name (`mbochs`).
    pub id: ParentId,
    /// The physical GPU this parent belongs to (the PF for a VF); `None` for virtual parents.
    #[serde(default)]
    pub gpu: Option<PciAddress>,
    /// Framework.
    pub framework: VgpuFramework,
    /// Health: the physical GPU's.
    #[serde(default)]
    pub health: Health,
    /// Offered profiles.
    #[serde(default)]
    pub profiles: Vec<Profile>,
    /// Existing instances.
    #[serde(default)]
    pub instances: Vec<Instance>,
    /// Problems met while reading this parent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Parent {
    /// The pool key of this parent: its physical GPU, or itself for a virtual parent.
    pub fn pool_key(&self) -> ParentId {
        match self.gpu {
            Some(g) => ParentId::Pci(g),
            None => self.id.clone(),
        }
    }
}

/// The shared capacity of one physical GPU (or virtual parent) across all its parents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// The physical GPU (address) or virtual parent (name).
    pub gpu: ParentId,
    /// The parents drawing from this pool.
    pub parents: Vec<ParentId>,
    /// Total framebuffer in MiB.
    #[serde(rename = "totalMiB")]
    pub total_mib: u64,
    /// Framebuffer used by existing instances.
    #[serde(rename = "usedMiB")]
    pub used_mib: u64,
    /// When the same-size rule applies and instances exist: the size every new time-sliced
    /// instance must have.
    #[serde(default, rename = "sizeLockedMiB")]
    pub size_locked_mib: Option<u64>,
    /// The GPU runs in mixed-size mode (no same-size rule).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mixed_size: bool,
    /// MIG slices of the GPU (7 on A100/H100/H200), when MIG-backed types exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_slices_total: Option<u8>,
    /// MIG slices used by existing MIG-backed instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_slices_used: Option<u8>,
    /// GPU-instance slots, on a MIG-capable GPU whose geometry gpuslice knows: where
    /// MIG-backed vGPUs may still start. Without it only slice counts are checked. Shared by
    /// the copies of a pool (every node of a fleet of one host keeps its pools), copied when
    /// one of them charges or releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_slots: Option<std::sync::Arc<crate::mig::MigSlots>>,
}

/// The vGPU side of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct MediatedDevices {
    /// Parents (mdev parents and vendor-VFIO VFs).
    #[serde(default)]
    pub parents: Vec<Parent>,
    /// Pools per physical GPU.
    #[serde(default)]
    pub pools: Vec<Pool>,
}

/// Everything one node offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTopology {
    /// Node name.
    pub node: String,
    /// Physical GPUs in address order.
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// vGPU parents and pools.
    #[serde(default)]
    pub mediated_devices: MediatedDevices,
    /// Node-level problems met during discovery.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The NVSwitch fabric joining the GPUs, `None` on a node without NVSwitches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<crate::fabric::Fabric>,
}

impl NodeTopology {
    /// An empty topology for `node`.
    pub fn new(node: impl Into<String>) -> Self {
        NodeTopology {
            node: node.into(),
            gpus: vec![],
            mediated_devices: MediatedDevices::default(),
            warnings: vec![],
            fabric: None,
        }
    }

    /// Every warning of the node, its GPUs and its vGPU parents, in that order, each prefixed
    /// with what it concerns (`node-1: ...`, `nvidia0: ...`, `0000:08:00.4: ...`).
    pub fn warning_lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .warnings
            .iter()
            .map(|w| format!("{}: {w}", self.node))
            .collect();
        for g in &self.gpus {
            out.extend(g.warnings.iter().map(|w| format!("{}: {w}", g.name)));
        }
        for p in &self.mediated_devices.parents {
            out.extend(p.warnings.iter().map(|w| format!("{}: {w}", p.id)));
        }
        out
    }

    /// The GPU with this per-node name.
    pub fn gpu_by_name(&self, name: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.name == name)
    }

    /// The address of the GPU named `name`; otherwise an error naming it and listing the GPUs
    /// this node has (what the CLI and the agent answer for an unknown GPU name).
    ///
    /// # Errors
    /// [`CoreError::UnknownGpuName`] when no GPU has that name.
    pub fn gpu_address_by_name(&self, name: &str) -> Result<PciAddress, CoreError> {
        if let Some(g) = self.gpu_by_name(name) {
            return Ok(g.address);
        }
        let known: Vec<String> = self
            .gpus
            .iter()
            .map(|g| format!("{} ({})", g.name, g.address))
            .collect();
        Err(CoreError::UnknownGpuName {
            name: name.to_owned(),
            known: if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            },
        })
    }

    /// The GPU at this address.
    pub fn gpu_by_address(&self, address: &PciAddress) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.address == *address)
    }

    /// Whether the GPU at `address` may be handed to a VM whole, by its graded health
    /// ([`crate::Health::check_handout`]); a GPU this topology does not list is not judged.
    ///
    /// # Errors
    /// [`crate::CoreError::Unhealthy`] for an Unhealthy GPU without `force`.
    pub fn check_gpu_handout(
        &self,
        address: &PciAddress,
        force: bool,
        force_hint: &'static str,
    ) -> Result<Option<String>, crate::CoreError> {
        self.gpu_by_address(address).map_or(Ok(None), |g| {
            g.health
                .check_handout(&address.to_string(), force, force_hint)
        })
    }

    /// The parent with this ID.
    pub fn parent(&self, id: &ParentId) -> Option<&Parent> {
        self.mediated_devices.parents.iter().find(|p| p.id == *id)
    }

    /// The pool with this key.
    pub fn pool(&self, key: &ParentId) -> Option<&Pool> {
        self.mediated_devices.pools.iter().find(|p| p.gpu == *key)
    }

    /// Parses JSON or YAML (JSON is YAML; the YAML parser handles both).
    ///
    /// # Errors
    /// [`CoreError::Decode`] with the decoder's message.
    pub fn from_text(text: &str) -> Result<Self, CoreError> {
        crate::decode_text("node topology", text)
    }
}
