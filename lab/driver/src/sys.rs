//! What the kernel itself says, read straight from `/sys`: the oracle every check compares
//! gpuslice's answers with. Deliberately small and independent of the gpuslice crates.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where the kernel's sysfs is mounted in the guest.
pub const SYS: &str = "/sys";

/// Reads a sysfs attribute, trimmed.
pub fn read(path: impl AsRef<Path>) -> Result<String, String> {
    let path = path.as_ref();
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("read {}: {e}", path.display()))
}

/// The last component of a symlink's target (`driver` -> `bochs-drm`), `None` when absent.
pub fn link_name(path: impl AsRef<Path>) -> Option<String> {
    fs::read_link(path.as_ref())
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Names of a directory's entries, sorted; an absent directory is empty.
pub fn list(path: impl AsRef<Path>) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(path.as_ref())
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn parse_hex(text: &str, what: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim_start_matches("0x"), 16)
        .map_err(|e| format!("{what} {text:?}: {e}"))
}

/// One PCI function as the kernel shows it.
#[derive(Debug, Clone)]
pub struct PciFunction {
    /// `dddd:bb:dd.f`.
    pub address: String,
    /// 24-bit class code.
    pub class: u32,
    /// Vendor ID.
    pub vendor: u32,
    /// Bound driver, if any.
    pub driver: Option<String>,
    /// IOMMU group, if the function has one.
    pub group: Option<u32>,
    /// `driver_override` as read (`(null)` when unset).
    pub driver_override: String,
}

impl PciFunction {
    /// Display controller (class 0x03xxxx).
    pub fn is_display(&self) -> bool {
        self.class >> 16 == 0x03
    }

    /// PCI-to-PCI bridge (class 0x0604xx).
    pub fn is_bridge(&self) -> bool {
        self.class >> 8 == 0x0604
    }

    /// `dddd:bb:dd`, the slot shared by the functions of one card.
    pub fn slot(&self) -> &str {
        self.address
            .rsplit_once('.')
            .map_or(self.address.as_str(), |(s, _)| s)
    }
}

/// `Ok` when `ok`, else the error `why` says.
pub fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

/// The PCI function at `address`, required to be bound to `driver` (`after` says when, for the
/// error).
pub fn bound_to(address: &str, driver: &str, after: &str) -> Result<PciFunction, String> {
    let f = pci_function(address)?;
    ensure(f.driver.as_deref() == Some(driver), || {
        format!(
            "after {after} {address} is bound to {:?}, expected {driver}",
            f.driver
        )
    })?;
    Ok(f)
}

/// Reads one PCI function.
pub fn pci_function(address: &str) -> Result<PciFunction, String> {
    let dir = PathBuf::from(SYS).join("bus/pci/devices").join(address);
    Ok(PciFunction {
        address: address.to_owned(),
        class: parse_hex(&read(dir.join("class"))?, "class")?,
        vendor: parse_hex(&read(dir.join("vendor"))?, "vendor")?,
        driver: link_name(dir.join("driver")),
        group: link_name(dir.join("iommu_group")).and_then(|g| g.parse().ok()),
        driver_override: read(dir.join("driver_override")).unwrap_or_default(),
    })
}

/// Every PCI function, in the kernel's (address) order.
pub fn pci_functions() -> Result<Vec<PciFunction>, String> {
    list(PathBuf::from(SYS).join("bus/pci/devices"))
        .iter()
        .map(|a| pci_function(a))
        .collect()
}

/// Addresses of the members of an IOMMU group.
pub fn group_members(group: u32) -> Vec<String> {
    list(format!("{SYS}/kernel/iommu_groups/{group}/devices"))
}

/// Whole-GPU state per the project's rules, derived from the kernel's view only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectedState {
    /// Can be handed to a VM.
    Free,
    /// Bound to vfio-pci.
    InUse,
    /// No IOMMU group at all.
    NoIommu,
    /// Its group holds these endpoints of other cards.
    SharedGroup(Vec<String>),
}

/// What the GPU at `f` must be reported as, given all functions.
pub fn expected_state(f: &PciFunction, all: &[PciFunction]) -> ExpectedState {
    let members = f.group.map(group_members).unwrap_or_default();
    expected_state_in(f, all, &members)
}

/// [`expected_state`] with the members of `f`'s IOMMU group given: a GPU bound to vfio-pci is in
/// use; one without a group is blocked for lack of an IOMMU; one whose group holds endpoints of
/// other cards (bridges excepted) is blocked by them; any other is free.
pub fn expected_state_in(
    f: &PciFunction,
    all: &[PciFunction],
    members: &[String],
) -> ExpectedState {
    if f.driver.as_deref() == Some("vfio-pci") {
        return ExpectedState::InUse;
    }
    if f.group.is_none() {
        return ExpectedState::NoIommu;
    }
    let offenders: Vec<String> = all
        .iter()
        .filter(|o| members.contains(&o.address) && o.address != f.address)
        .filter(|o| !o.is_bridge())
        .filter(|o| !(o.slot() == f.slot() && o.vendor == f.vendor))
        .map(|o| o.address.clone())
        .collect();
    if offenders.is_empty() {
        ExpectedState::Free
    } else {
        ExpectedState::SharedGroup(offenders)
    }
}

/// One mdev type of one parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevType {
    /// `name` attribute.
    pub name: String,
    /// `available_instances`.
    pub available: u32,
    /// `device_api`.
    pub device_api: String,
}

/// parent -> type directory -> type, from `/sys/class/mdev_bus`.
pub type MdevTypes = BTreeMap<String, BTreeMap<String, MdevType>>;

/// Every mdev parent and its types.
pub fn mdev_types() -> Result<MdevTypes, String> {
    let mut out = MdevTypes::new();
    for parent in list(format!("{SYS}/class/mdev_bus")) {
        let types_dir = PathBuf::from(format!(
            "{SYS}/class/mdev_bus/{parent}/mdev_supported_types"
        ));
        let mut types = BTreeMap::new();
        for t in list(&types_dir) {
            let d = types_dir.join(&t);
            let available = read(d.join("available_instances"))?;
            types.insert(
                t.clone(),
                MdevType {
                    name: read(d.join("name"))?,
                    available: available
                        .parse()
                        .map_err(|e| format!("{t} available_instances {available:?}: {e}"))?,
                    device_api: read(d.join("device_api"))?,
                },
            );
        }
        out.insert(parent, types);
    }
    Ok(out)
}

/// `available_instances` of every type, keyed `parent/type`, for compact comparisons.
pub fn counts(types: &MdevTypes) -> BTreeMap<String, u32> {
    types
        .iter()
        .flat_map(|(p, ts)| {
            ts.iter()
                .map(move |(t, v)| (format!("{p}/{t}"), v.available))
        })
        .collect()
}

/// An existing mdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevInstance {
    /// Parent device name (`mbochs`).
    pub parent: String,
    /// Type directory (`mbochs-small`).
    pub type_id: String,
    /// Inode of the device's sysfs directory: a removed and re-created device gets a new one.
    pub inode: u64,
}

/// uuid -> instance, from `/sys/bus/mdev/devices`.
pub fn mdev_instances() -> Result<BTreeMap<String, MdevInstance>, String> {
    let mut out = BTreeMap::new();
    for uuid in list(format!("{SYS}/bus/mdev/devices")) {
        let link = PathBuf::from(format!("{SYS}/bus/mdev/devices/{uuid}"));
        let real = fs::canonicalize(&link).map_err(|e| format!("{}: {e}", link.display()))?;
        let parent = real
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("{} has no parent directory", real.display()))?;
        let type_id = link_name(link.join("mdev_type"))
            .ok_or_else(|| format!("{} has no mdev_type link", link.display()))?;
        let inode = fs::metadata(&real)
            .map_err(|e| format!("{}: {e}", real.display()))?
            .ino();
        out.insert(
            uuid,
            MdevInstance {
                parent,
                type_id,
                inode,
            },
        );
    }
    Ok(out)
}

/// A fresh random UUID from the kernel.
pub fn new_uuid() -> Result<String, String> {
    read("/proc/sys/kernel/random/uuid")
}

/// Writes `value` to a sysfs file in one write (cleanup only; checks go through gpuslice).
pub fn write(path: impl AsRef<Path>, value: &str) -> Result<(), String> {
    let path = path.as_ref();
    fs::write(path, value).map_err(|e| format!("write {value:?} to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(
        address: &str,
        class: u32,
        vendor: u32,
        driver: Option<&str>,
        group: Option<u32>,
    ) -> PciFunction {
        PciFunction {
            address: address.into(),
            class,
            vendor,
            driver: driver.map(Into::into),
            group,
            driver_override: "(null)".into(),
        }
    }

    /// The lab's shared group: a bridge, two displays and a NIC.
    fn shared_group() -> (Vec<PciFunction>, Vec<String>) {
        let all = vec![
            f("0000:00:04.0", 0x060400, 0x1b36, None, Some(3)),
            f("0000:01:01.0", 0x038000, 0x1234, Some("bochs-drm"), Some(3)),
            f("0000:01:02.0", 0x020000, 0x8086, Some("e1000"), Some(3)),
            f("0000:01:03.0", 0x038000, 0x1234, Some("bochs-drm"), Some(3)),
        ];
        let members = all.iter().map(|x| x.address.clone()).collect();
        (all, members)
    }

    #[test]
    fn a_gpu_sharing_its_group_with_a_nic_is_blocked_by_the_nic_and_the_other_card() {
        let (all, members) = shared_group();
        assert_eq!(
            expected_state_in(&all[1], &all, &members),
            ExpectedState::SharedGroup(vec!["0000:01:02.0".into(), "0000:01:03.0".into()])
        );
    }

    #[test]
    fn a_bridge_and_functions_of_the_same_card_do_not_block() {
        let all = vec![
            f("0000:00:04.0", 0x060400, 0x1b36, None, Some(3)),
            f("0000:01:00.0", 0x030000, 0x10de, Some("nvidia"), Some(3)),
            f(
                "0000:01:00.1",
                0x040300,
                0x10de,
                Some("snd_hda_intel"),
                Some(3),
            ),
        ];
        let members: Vec<String> = all.iter().map(|x| x.address.clone()).collect();
        assert_eq!(
            expected_state_in(&all[1], &all, &members),
            ExpectedState::Free
        );
    }

    #[test]
    fn a_gpu_without_a_group_lacks_an_iommu_and_one_on_vfio_pci_is_in_use() {
        let alone = f("0000:00:02.0", 0x030000, 0x1234, Some("bochs-drm"), None);
        assert_eq!(
            expected_state_in(&alone, std::slice::from_ref(&alone), &[]),
            ExpectedState::NoIommu
        );
        let bound = f("0000:02:00.0", 0x038000, 0x1234, Some("vfio-pci"), Some(6));
        let members = vec![bound.address.clone()];
        assert_eq!(
            expected_state_in(&bound, std::slice::from_ref(&bound), &members),
            ExpectedState::InUse
        );
    }

    #[test]
    fn slots_and_classes_read_from_the_address_and_class_code() {
        let (all, _) = shared_group();
        assert_eq!(all[1].slot(), "0000:01:01");
        assert!(all[0].is_bridge() && !all[0].is_display());
        assert!(all[1].is_display() && !all[2].is_display());
    }
}
