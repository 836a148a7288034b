//! Moving a whole GPU, with the companion functions of its card, to `vfio-pci` and back.
//!
//! The functions of one card are those in the GPU's slot with the GPU's vendor ID (HD audio, and
//! USB-C controllers on some NVIDIA boards), minus SR-IOV VFs. Each function moves the way the
//! kernel expects: `driver_override` ← `vfio-pci`, `driver/unbind` ← address, `drivers_probe` ←
//! address, then the `driver` link is checked, because `drivers_probe` reports success even when
//! no driver took the device. When a step fails, every function already touched is put back as
//! it was (driver and override), so a failure leaves the host unchanged.
//!
//! A VM can only take a whole IOMMU group, so binding is refused when the group holds endpoints
//! that are not part of the card (a bridge without a driver, or bound to `pcieport`, is fine).

use serde::{Deserialize, Serialize};

use gpu_core::PciAddress;

use super::handoff::Handoff;
use super::inuse::refuse_if_open;
use super::{ActuateError, Result, link_name, pci_dir, pci_driver, read_opt, require_pci, write};
use crate::host::Host;

const VFIO_PCI: &str = "vfio-pci";

/// What happened to one function of the card.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionChange {
    /// The function.
    pub address: PciAddress,
    /// Its class code (`0x030000`), when readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Its driver before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_before: Option<String>,
    /// Its driver after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_after: Option<String>,
    /// True when this call changed it.
    pub changed: bool,
    /// How to hand it to a VM.
    pub handoff: Handoff,
}

/// The outcome of [`bind_gpu`] or [`release_gpu`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuBinding {
    /// The GPU asked for.
    pub gpu: PciAddress,
    /// The IOMMU groups of the card's functions.
    pub iommu_groups: Vec<u32>,
    /// Every function of the card, in address order.
    pub functions: Vec<FunctionChange>,
    /// Things an operator should know (the host console ran on this GPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl GpuBinding {
    /// True when any function changed.
    pub fn changed(&self) -> bool {
        self.functions.iter().any(|f| f.changed)
    }
}

/// A function's driver and `driver_override` (`None` for `(null)`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FnState {
    driver: Option<String>,
    override_: Option<String>,
}

fn override_path(a: &PciAddress) -> String {
    format!("{}/driver_override", pci_dir(a))
}

fn state(host: &dyn Host, a: &PciAddress) -> Result<FnState> {
    let ov = read_opt(host, &override_path(a))?.filter(|s| s != "(null)" && !s.is_empty());
    Ok(FnState {
        driver: pci_driver(host, a),
        override_: ov,
    })
}

fn vendor_of(host: &dyn Host, a: &PciAddress) -> Option<String> {
    host.read_string(&format!("{}/vendor", pci_dir(a)))
        .ok()
        .map(|s| s.to_ascii_lowercase())
}

fn class_of(host: &dyn Host, a: &PciAddress) -> Option<String> {
    host.read_string(&format!("{}/class", pci_dir(a))).ok()
}

fn is_vf(host: &dyn Host, a: &PciAddress) -> bool {
    host.read_link(&format!("{}/physfn", pci_dir(a))).is_ok()
}

/// The functions of the card `gpu` belongs to: same slot, same vendor, not a VF; in address order.
///
/// # Errors
/// [`ActuateError::NotFound`] when `gpu` does not exist; [`ActuateError::Unsupported`] for a VF.
pub fn card_functions(host: &dyn Host, gpu: &PciAddress) -> Result<Vec<PciAddress>> {
    require_pci(host, gpu)?;
    if is_vf(host, gpu) {
        return Err(ActuateError::Unsupported {
            device: gpu.to_string(),
            why: "is an SR-IOV virtual function, not a whole GPU; give VFs to VMs with `gpuslice vgpu create`".to_owned(),
        });
    }
    let vendor = vendor_of(host, gpu);
    let dir = "sys/bus/pci/devices";
    let mut fns: Vec<PciAddress> = host
        .list(dir)
        .map_err(|e| ActuateError::read(dir, e))?
        .into_iter()
        .filter_map(|e| e.parse::<PciAddress>().ok())
        .filter(|a| a.same_slot(gpu) && !is_vf(host, a) && vendor_of(host, a) == vendor)
        .collect();
    if !fns.contains(gpu) {
        fns.push(*gpu);
    }
    fns.sort();
    Ok(fns)
}

fn group_of(host: &dyn Host, a: &PciAddress) -> Result<u32> {
    link_name(host, &format!("{}/iommu_group", pci_dir(a)))
        .and_then(|g| g.parse().ok())
        .ok_or_else(|| ActuateError::NoIommu {
            device: a.to_string(),
        })
}

/// Checks that the IOMMU groups of `fns` hold nothing but `fns` and tolerated bridges.
fn check_groups(host: &dyn Host, gpu: &PciAddress, fns: &[PciAddress]) -> Result<Vec<u32>> {
    let mut groups: Vec<u32> = Vec::new();
    for f in fns {
        let g = group_of(host, f)?;
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups.sort_unstable();
    for g in &groups {
        let dir = format!("sys/kernel/iommu_groups/{g}/devices");
        let members = host.list(&dir).map_err(|e| ActuateError::read(&dir, e))?;
        let mut others: Vec<String> = Vec::new();
        for m in members {
            let Ok(a) = m.parse::<PciAddress>() else {
                continue;
            };
            if fns.contains(&a) {
                continue;
            }
            let driver = pci_driver(host, &a);
            let bridge = class_of(host, &a)
                .and_then(|c| u32::from_str_radix(c.trim_start_matches("0x"), 16).ok())
                .is_some_and(|c| c >> 8 == 0x0604);
            if bridge && matches!(driver.as_deref(), None | Some("pcieport")) {
                continue;
            }
            others.push(match driver {
                Some(d) => format!("{a} (driver {d})"),
                None => format!("{a} (no driver)"),
            });
        }
        if !others.is_empty() {
            return Err(ActuateError::GroupNotViable {
                device: gpu.to_string(),
                group: g.to_string(),
                others: others.join(", "),
            });
        }
    }
    Ok(groups)
}

/// Refuses a function that is shared as vGPUs: mdev instances on it or its VFs, or SR-IOV VFs
/// enabled. Unbinding its driver would destroy them under the VMs using them.
fn refuse_if_sharing(host: &dyn Host, a: &PciAddress) -> Result<()> {
    let dir = pci_dir(a);
    let mut parents = vec![*a];
    parents.extend(super::vendor::vfs_of(host, a));
    let mut instances: Vec<String> = Vec::new();
    for p in &parents {
        let pdir = pci_dir(p);
        for e in host.list(&pdir).unwrap_or_default() {
            if e.parse::<gpu_core::MdevUuid>().is_ok()
                && host.exists(&format!("{pdir}/{e}/mdev_type"))
            {
                instances.push(e);
            }
        }
    }
    if !instances.is_empty() {
        return Err(ActuateError::Shared {
            device: a.to_string(),
            why: format!(
                "is shared as vGPUs ({} mdev instance(s): {}); remove them before binding the GPU to vfio-pci",
                instances.len(),
                instances.join(", ")
            ),
        });
    }
    let numvfs: u32 = read_opt(host, &format!("{dir}/sriov_numvfs"))?
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if numvfs > 0 {
        return Err(ActuateError::Shared {
            device: a.to_string(),
            why: format!(
                "has {numvfs} SR-IOV VFs enabled (vGPU host); clear their vGPUs and disable SR-IOV before binding the GPU to vfio-pci"
            ),
        });
    }
    Ok(())
}

/// Puts a function back to `want` (driver and override), as far as the kernel lets it.
fn restore(host: &dyn Host, a: &PciAddress, want: &FnState) -> Result<()> {
    let addr = a.to_string();
    let now = state(host, a)?;
    if now == *want {
        return Ok(());
    }
    if let Some(d) = &now.driver {
        if now.driver != want.driver {
            write(
                host,
                &format!("sys/bus/pci/drivers/{d}/unbind"),
                addr.as_bytes(),
            )?;
        }
    }
    if now.override_ != want.override_ {
        let v = want.override_.clone().unwrap_or_else(|| "\n".to_owned());
        write(host, &override_path(a), v.as_bytes())?;
    }
    if let Some(d) = &want.driver {
        if pci_driver(host, a).is_none() {
            write(host, "sys/bus/pci/drivers_probe", addr.as_bytes())?;
            if pci_driver(host, a).is_none() {
                write(
                    host,
                    &format!("sys/bus/pci/drivers/{d}/bind"),
                    addr.as_bytes(),
                )?;
            }
        }
    }
    let after = state(host, a)?;
    if after != *want {
        return Err(ActuateError::NotApplied {
            path: format!("/{}", pci_dir(a)),
            wrote: format!("driver {}", want.driver.as_deref().unwrap_or("none")),
            found: format!("driver {}", after.driver.as_deref().unwrap_or("none")),
        });
    }
    Ok(())
}

/// Undoes what was done to `touched` (in reverse) and returns the error to report.
fn roll_back(
    host: &dyn Host,
    touched: &[(PciAddress, FnState)],
    err: ActuateError,
) -> ActuateError {
    let mut leftover = Vec::new();
    for (a, s) in touched.iter().rev() {
        if let Err(e) = restore(host, a, s) {
            leftover.push(format!("{a} ({e})"));
        }
    }
    if leftover.is_empty() {
        err
    } else {
        ActuateError::RollbackIncomplete {
            source: Box::new(err),
            leftover: leftover.join(", "),
        }
    }
}

fn bind_one(host: &dyn Host, a: &PciAddress, before: &FnState) -> Result<()> {
    let addr = a.to_string();
    if before.override_.as_deref() != Some(VFIO_PCI) {
        write(host, &override_path(a), VFIO_PCI.as_bytes())?;
    }
    if before.driver.is_some() {
        write(
            host,
            &format!("{}/driver/unbind", pci_dir(a)),
            addr.as_bytes(),
        )?;
    }
    write(host, "sys/bus/pci/drivers_probe", addr.as_bytes())?;
    let found = pci_driver(host, a);
    if found.as_deref() != Some(VFIO_PCI) {
        return Err(ActuateError::ProbeFailed {
            device: addr,
            driver: VFIO_PCI.to_owned(),
            found: found.unwrap_or_else(|| "none".to_owned()),
        });
    }
    Ok(())
}

/// Binds the GPU `gpu` and its companion functions to `vfio-pci`.
///
/// Idempotent: functions already on `vfio-pci` are left alone (`changed: false`).
///
/// # Errors
/// - [`ActuateError::NotFound`], [`ActuateError::Unsupported`] (a VF), [`ActuateError::Shared`] (a vGPU host), [`ActuateError::NoIommu`],
///   [`ActuateError::GroupNotViable`]: checked before anything is written;
/// - [`ActuateError::ProbeFailed`] and write errors: after every touched function was restored;
/// - [`ActuateError::RollbackIncomplete`]: restoring failed too.
pub fn bind_gpu(host: &dyn Host, gpu: &PciAddress) -> Result<GpuBinding> {
    let fns = card_functions(host, gpu)?;
    let groups = check_groups(host, gpu, &fns)?;
    for a in &fns {
        refuse_if_sharing(host, a)?;
    }
    let warnings: Vec<String> = fns
        .iter()
        .filter(|a| {
            host.read_string(&format!("{}/boot_vga", pci_dir(a)))
                .is_ok_and(|v| v == "1")
                && pci_driver(host, a).as_deref() != Some(VFIO_PCI)
        })
        .map(|a| format!("{a} is the boot VGA device: the host console on it goes away"))
        .collect();
    let mut touched: Vec<(PciAddress, FnState)> = Vec::new();
    let mut out = Vec::new();
    for a in &fns {
        let before = state(host, a)?;
        let changed = before.driver.as_deref() != Some(VFIO_PCI);
        if changed {
            touched.push((*a, before.clone()));
            if let Err(e) = bind_one(host, a, &before) {
                return Err(roll_back(host, &touched, e));
            }
        }
        out.push(FunctionChange {
            address: *a,
            class: class_of(host, a),
            driver_before: before.driver,
            driver_after: pci_driver(host, a),
            changed,
            handoff: Handoff::pci_on(host, a),
        });
    }
    Ok(GpuBinding {
        gpu: *gpu,
        iommu_groups: groups,
        functions: out,
        warnings,
    })
}

fn release_one(host: &dyn Host, a: &PciAddress, before: &FnState) -> Result<()> {
    let addr = a.to_string();
    if before.override_.is_some() {
        // An empty write leaves the override in place; only "\n" clears it.
        write(host, &override_path(a), b"\n")?;
    }
    if before.driver.as_deref() == Some(VFIO_PCI) {
        write(
            host,
            &format!("{}/driver/unbind", pci_dir(a)),
            addr.as_bytes(),
        )?;
    }
    if pci_driver(host, a).is_none() {
        write(host, "sys/bus/pci/drivers_probe", addr.as_bytes())?;
    }
    match pci_driver(host, a) {
        Some(d) if d != VFIO_PCI => Ok(()),
        found => Err(ActuateError::ProbeFailed {
            device: addr,
            driver: "a host driver".to_owned(),
            found: found.unwrap_or_else(|| "none; is the host driver loaded?".to_owned()),
        }),
    }
}

/// Returns the GPU `gpu` and its companion functions from `vfio-pci` to their host drivers:
/// `driver_override` cleared with `"\n"`, unbound, reprobed, and the result checked.
///
/// Idempotent: functions not on `vfio-pci` and without an override are left alone. A function
/// whose VFIO node a process holds open is refused unless `force` (the kernel would block the
/// unbind until the VM lets go).
///
/// # Errors
/// [`ActuateError::NotFound`], [`ActuateError::Unsupported`], [`ActuateError::InUse`] before any
/// write; [`ActuateError::ProbeFailed`] and write errors after restoring every touched function;
/// [`ActuateError::RollbackIncomplete`].
pub fn release_gpu(host: &dyn Host, gpu: &PciAddress, force: bool) -> Result<GpuBinding> {
    let fns = card_functions(host, gpu)?;
    let mut befores = Vec::new();
    for a in &fns {
        let s = state(host, a)?;
        if s.driver.as_deref() == Some(VFIO_PCI) {
            refuse_if_open(host, &a.to_string(), &pci_dir(a), force)?;
        }
        befores.push(s);
    }
    let mut groups: Vec<u32> = fns.iter().filter_map(|a| group_of(host, a).ok()).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut touched: Vec<(PciAddress, FnState)> = Vec::new();
    let mut out = Vec::new();
    for (a, before) in fns.iter().zip(befores) {
        let changed = before.driver.as_deref() == Some(VFIO_PCI) || before.override_.is_some();
        if changed {
            touched.push((*a, before.clone()));
            if let Err(e) = release_one(host, a, &before) {
                return Err(roll_back(host, &touched, e));
            }
        }
        out.push(FunctionChange {
            address: *a,
            class: class_of(host, a),
            driver_before: before.driver,
            driver_after: pci_driver(host, a),
            changed,
            handoff: Handoff::pci_on(host, a),
        });
    }
    Ok(GpuBinding {
        gpu: *gpu,
        iommu_groups: groups,
        functions: out,
        warnings: Vec::new(),
    })
}
