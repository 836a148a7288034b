//! Is this node ready to give GPUs to VMs? A list of checks, each with a verdict and a fix.
//!
//! A newcomer who sees "no IOMMU group: IOMMU disabled" needs the next step, not the symptom.
//! [`diagnose`] looks at what the kernel and NVIDIA's host driver expose — the kernel command line
//! (`proc/cmdline`), the IOMMU units (`sys/class/iommu`) and the groups' DMA domain type, the
//! loaded modules (`proc/modules`), the vGPU manager's files and daemons, `sriov-manage`, SR-IOV
//! VFs, MIG mode, the types the VFs can still take, IOMMU groups shared with other devices, and
//! KubeVirt's virt-handler — and says for each: `ok`, `warn` (works, but look) or `fail` (a VM
//! will not get the device until it is fixed), with the fix in one line.
//!
//! Everything is read through [`Host`], so a `--root` tree, a replayed recording or the fake
//! kernel is diagnosed the same way as `/`. What a root does not contain (a recording has no
//! `proc/`) is said to be unknown, never guessed.

use std::collections::BTreeSet;

use gpu_core::{Gpu, GpuState, NodeTopology, Vendor, VgpuFramework};
use serde::{Deserialize, Serialize};

use crate::Host;
use crate::discover::{DiscoverOptions, discover};

mod text;
mod vfs;

/// Where NVIDIA's vGPU host driver installs `sriov-manage`.
pub const SRIOV_MANAGE: &str = "usr/lib/nvidia/sriov-manage";

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Ready.
    Ok,
    /// Works, but something is worth a look (or cannot be known from this root).
    Warn,
    /// A VM will not get the device until this is fixed.
    Fail,
}

impl Verdict {
    /// `ok`, `warn` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// The check's stable name (`iommu`, `vfio-pci`, `sriov-vfs`, ...).
    pub check: String,
    /// What it is about when not the whole node: a GPU (`nvidia0 (0000:26:00.0)`), a daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The verdict.
    pub verdict: Verdict,
    /// What was found, in one line.
    pub message: String,
    /// What to do about it, in one line (`None` when nothing is to be done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Every check's outcome, in a fixed order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The node diagnosed.
    pub node: String,
    /// The worst verdict.
    pub verdict: Verdict,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Diagnosis {
    /// True when any check failed.
    pub fn failed(&self) -> bool {
        self.verdict == Verdict::Fail
    }
}

/// Collects checks.
struct Checks(Vec<Check>);

impl Checks {
    fn push(
        &mut self,
        check: &str,
        subject: Option<String>,
        verdict: Verdict,
        message: impl Into<String>,
        fix: Option<&str>,
    ) {
        self.0.push(Check {
            check: check.to_owned(),
            subject,
            verdict,
            message: message.into(),
            fix: fix.map(str::to_owned),
        });
    }
    fn ok(&mut self, check: &str, subject: Option<String>, message: impl Into<String>) {
        self.push(check, subject, Verdict::Ok, message, None);
    }
}

/// The words of the kernel command line, when the root has one.
fn cmdline(host: &dyn Host) -> Option<Vec<String>> {
    host.read_string("proc/cmdline")
        .ok()
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
}

/// The value of `key=value` on the command line (the last one wins, as in the kernel).
fn param<'a>(words: &'a [String], key: &str) -> Option<&'a str> {
    words
        .iter()
        .rev()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// The names of the loaded modules (`proc/modules`), when the root has it.
fn modules(host: &dyn Host) -> Option<BTreeSet<String>> {
    host.read_string("proc/modules").ok().map(|s| {
        s.lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    })
}

/// The `comm` and first `cmdline` word of every process under `proc/`.
fn processes(host: &dyn Host) -> Vec<String> {
    let Ok(entries) = host.list("proc") else {
        return vec![];
    };
    let mut out = Vec::new();
    for pid in entries
        .iter()
        .filter(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()))
    {
        if let Ok(comm) = host.read_string(&format!("proc/{pid}/comm")) {
            out.push(comm);
        }
        if let Ok(cmd) = host.read(&format!("proc/{pid}/cmdline")) {
            let first = cmd.split(|b| *b == 0).next().unwrap_or_default();
            let text = String::from_utf8_lossy(first);
            if let Some(base) = text.rsplit('/').next().filter(|b| !b.is_empty()) {
                out.push(base.to_owned());
            }
        }
    }
    out
}

fn gpu_subject(g: &Gpu) -> Option<String> {
    Some(format!("{} ({})", g.name, g.address))
}

/// NVIDIA GPUs with MIG (A100, A30, H100, H200, GH200, B200), by PCI device ID.
const MIG_CAPABLE: [u16; 16] = [
    0x20b0, 0x20b2, 0x20b5, 0x20f1, 0x20f3, 0x20f5, // A100
    0x20b7, // A30
    0x2321, 0x2330, 0x2331, 0x2339, // H100
    0x2335, 0x233b, // H200
    0x2342, // GH200
    0x2901, 0x2941, // B200, GB200
];

/// Diagnoses the node behind `host`.
///
/// # Errors
/// Only when the root cannot be discovered at all ([`crate::SysfsError::InvalidRoot`]); every
/// other problem is a check's verdict.
pub fn diagnose(host: &dyn Host, node: &str) -> Result<Diagnosis, crate::SysfsError> {
    let topology = discover(host, &DiscoverOptions::new(node))?;
    let mut c = Checks(Vec::new());
    let words = cmdline(host);
    let mods = modules(host);
    iommu(host, words.as_deref(), &mut c);
    vfio_pci(host, mods.as_ref(), &mut c);
    let procs = processes(host);
    vgpu_manager(host, &topology, mods.as_ref(), &procs, &mut c);
    sriov(host, &topology, &mut c);
    vfs::vf_drivers(&topology, words.as_deref(), &mut c);
    vfs::vf_state(&topology, &mut c);
    mig(&topology, &mut c);
    vgpu_types(&topology, &mut c);
    iommu_groups(&topology, &mut c);
    kubevirt(&procs, &mut c);
    let verdict = c.0.iter().map(|k| k.verdict).max().unwrap_or(Verdict::Ok);
    Ok(Diagnosis {
        node: topology.node,
        verdict,
        checks: c.0,
    })
}

fn iommu(host: &dyn Host, words: Option<&[String]>, c: &mut Checks) {
    let units = host.list("sys/class/iommu").unwrap_or_default();
    let groups = host.list("sys/kernel/iommu_groups").unwrap_or_default();
    // VFIO's emulated groups exist without an IOMMU; they do not count.
    let real_groups: Vec<&String> = groups
        .iter()
        .filter(|g| {
            host.read_string(&format!("sys/kernel/iommu_groups/{g}/name"))
                .map_or(true, |n| n != "vfio-noiommu")
        })
        .collect();
    let noiommu = words.is_some_and(|w| param(w, "vfio.enable_unsafe_noiommu_mode") == Some("1"))
        || host
            .read_string("sys/module/vfio/parameters/enable_unsafe_noiommu_mode")
            .is_ok_and(|v| v == "Y" || v == "1");
    let off = words.and_then(|w| {
        ["intel_iommu", "amd_iommu", "iommu"]
            .into_iter()
            .find(|k| param(w, k) == Some("off"))
    });
    let on = !units.is_empty() || !real_groups.is_empty();
    if !on {
        let why = match (off, words) {
            (Some(k), _) => format!("IOMMU off: the kernel command line says {k}=off"),
            (None, Some(_)) => "IOMMU off: no IOMMU unit in /sys/class/iommu, no IOMMU group".into(),
            (None, None) => "IOMMU off: no IOMMU unit in /sys/class/iommu, no IOMMU group (no proc/cmdline under this root)".into(),
        };
        let fix = "enable VT-d / AMD-Vi in the firmware, add intel_iommu=on (Intel) or amd_iommu=on (AMD) and iommu=pt to the kernel command line, reboot";
        c.push("iommu", None, Verdict::Fail, why, Some(fix));
        if noiommu {
            c.push(
                "iommu-mode",
                None,
                Verdict::Warn,
                "VFIO runs in unsafe no-IOMMU mode: devices can DMA anywhere in host memory; \
                 whole GPUs cannot go to VMs",
                Some("for testing only; enable the IOMMU and drop vfio.enable_unsafe_noiommu_mode"),
            );
        }
        return;
    }
    let what = if units.is_empty() {
        format!("{} IOMMU groups", real_groups.len())
    } else {
        format!("{} ({} groups)", units.join(", "), real_groups.len())
    };
    c.ok("iommu", None, format!("IOMMU on: {what}"));
    // The DMA domain type of the groups tells the mode; the command line says what was asked.
    let types: BTreeSet<String> = real_groups
        .iter()
        .filter_map(|g| {
            host.read_string(&format!("sys/kernel/iommu_groups/{g}/type"))
                .ok()
        })
        .collect();
    let asked_pt = words.is_some_and(|w| {
        param(w, "iommu") == Some("pt") || param(w, "iommu.passthrough") == Some("1")
    });
    let fix_pt = Some(
        "add iommu=pt to the kernel command line (host DMA skips the IOMMU; VMs are still isolated) and reboot",
    );
    if types.contains("identity") || (types.is_empty() && asked_pt) {
        c.ok(
            "iommu-mode",
            None,
            "passthrough mode (iommu=pt): host devices DMA without translation",
        );
    } else if !types.is_empty() {
        let list: Vec<&str> = types.iter().map(String::as_str).collect();
        c.push(
            "iommu-mode",
            None,
            Verdict::Warn,
            format!(
                "translated mode (domain type {}): every host DMA goes through the IOMMU",
                list.join(", ")
            ),
            fix_pt,
        );
    } else if words.is_some() {
        c.push(
            "iommu-mode",
            None,
            Verdict::Warn,
            "translated mode (no iommu=pt on the kernel command line)",
            fix_pt,
        );
    } else {
        c.push(
            "iommu-mode",
            None,
            Verdict::Warn,
            "mode unknown: this root has no proc/cmdline and the groups no type file",
            Some("run gpuslice doctor on the host itself"),
        );
    }
}

fn vfio_pci(host: &dyn Host, mods: Option<&BTreeSet<String>>, c: &mut Checks) {
    let registered = host.exists("sys/bus/pci/drivers/vfio-pci");
    if registered || mods.is_some_and(|m| m.contains("vfio_pci")) {
        c.ok("vfio-pci", None, "vfio-pci is loaded");
        return;
    }
    let release = host.read_string("proc/sys/kernel/osrelease").ok();
    let shipped = release.as_ref().is_some_and(|r| {
        host.list(&format!("lib/modules/{r}/kernel/drivers/vfio/pci"))
            .is_ok_and(|files| files.iter().any(|f| f.starts_with("vfio-pci.ko")))
    });
    match (mods, shipped) {
        (_, true) => c.push(
            "vfio-pci",
            None,
            Verdict::Warn,
            "vfio-pci is installed but not loaded",
            Some("modprobe vfio-pci (and list it in /etc/modules-load.d/ to load it at boot)"),
        ),
        (Some(_), false) => c.push(
            "vfio-pci",
            None,
            Verdict::Fail,
            "vfio-pci is neither loaded nor installed for this kernel",
            Some("install the kernel's VFIO modules (CONFIG_VFIO_PCI), then modprobe vfio-pci"),
        ),
        (None, false) => c.push(
            "vfio-pci",
            None,
            Verdict::Warn,
            "unknown: no vfio-pci driver registered and no proc/modules under this root",
            Some("run gpuslice doctor on the host itself, or modprobe vfio-pci"),
        ),
    }
}

/// A GPU the NVIDIA vGPU manager could serve: NVIDIA, not handed to vfio-pci whole.
fn nvidia_gpus(t: &NodeTopology) -> Vec<&Gpu> {
    t.gpus
        .iter()
        .filter(|g| g.vendor == Vendor::Nvidia && g.driver.as_deref() != Some("vfio-pci"))
        .collect()
}

fn vgpu_manager(
    host: &dyn Host,
    t: &NodeTopology,
    mods: Option<&BTreeSet<String>>,
    procs: &[String],
    c: &mut Checks,
) {
    let gpus = nvidia_gpus(t);
    if gpus.is_empty() {
        c.ok(
            "vgpu-manager",
            None,
            "no NVIDIA GPU on the host driver: nothing to check",
        );
        return;
    }
    let mdev_bus = host.list("sys/class/mdev_bus").is_ok_and(|p| !p.is_empty());
    let vendor_vfio = t
        .mediated_devices
        .parents
        .iter()
        .any(|p| p.framework == VgpuFramework::VendorVfio);
    let vgpu_module = mods.is_some_and(|m| m.contains("nvidia_vgpu_vfio"));
    if mdev_bus || vendor_vfio || vgpu_module {
        let how = match (mdev_bus, vendor_vfio) {
            (true, _) => "mdev parents in /sys/class/mdev_bus",
            (false, true) => "vendor-VFIO files on the VFs",
            (false, false) => "module nvidia_vgpu_vfio loaded",
        };
        c.ok(
            "vgpu-manager",
            None,
            format!("NVIDIA vGPU manager present: {how}"),
        );
    } else {
        let sriov_off = gpus.iter().any(|g| {
            g.sriov
                .as_ref()
                .is_some_and(|s| s.num_vfs == 0 && s.total_vfs > 0)
        });
        let (why, fix) = if vfs::held_elsewhere(t) {
            (
                "no vGPU parent: the VFs are bound to another driver, not to nvidia (see vf-drivers)",
                "give the VFs back to nvidia (see vf-drivers); the vGPU manager itself need not be reinstalled",
            )
        } else if sriov_off {
            (
                "no vGPU parent yet: no /sys/class/mdev_bus and no VF with vendor-VFIO files (SR-IOV VFs are off)",
                "enable the VFs (gpuslice sriov enable BDF); if still none, install the NVIDIA vGPU manager (host driver)",
            )
        } else {
            (
                "no NVIDIA vGPU manager: no /sys/class/mdev_bus, no vendor-VFIO files",
                "install NVIDIA's vGPU manager (the host driver package), or use the GPUs whole through vfio-pci",
            )
        };
        c.push("vgpu-manager", None, Verdict::Warn, why, Some(fix));
    }
    // The daemons only where systemd runs them.
    if !host.exists("run/systemd/system") {
        return;
    }
    for (daemon, needed) in [("nvidia-vgpu-mgr", true), ("nvidia-vgpud", false)] {
        let unit = [
            "usr/lib/systemd/system",
            "lib/systemd/system",
            "etc/systemd/system",
        ]
        .iter()
        .any(|d| host.exists(&format!("{d}/{daemon}.service")));
        let running = procs.iter().any(|p| p == daemon);
        let subject = Some(daemon.to_owned());
        match (running, unit) {
            (true, _) => c.ok("vgpu-daemon", subject, format!("{daemon} is running")),
            (false, true) => c.push(
                "vgpu-daemon",
                subject,
                if needed { Verdict::Fail } else { Verdict::Warn },
                format!("{daemon}.service is installed but not running"),
                Some(&format!("systemctl enable --now {daemon}.service")),
            ),
            (false, false) if mdev_bus || vendor_vfio || vgpu_module => c.push(
                "vgpu-daemon",
                subject,
                Verdict::Warn,
                format!("no {daemon}.service and no {daemon} process"),
                Some("reinstall the NVIDIA vGPU manager, which ships the unit"),
            ),
            (false, false) => {}
        }
    }
}

fn sriov(host: &dyn Host, t: &NodeTopology, c: &mut Checks) {
    let capable: Vec<&Gpu> = nvidia_gpus(t)
        .into_iter()
        .filter(|g| g.sriov.as_ref().is_some_and(|s| s.total_vfs > 0))
        .collect();
    if capable.is_empty() {
        return;
    }
    if host.exists(SRIOV_MANAGE) {
        c.ok("sriov-manage", None, format!("/{SRIOV_MANAGE} is present"));
    } else {
        c.push(
            "sriov-manage",
            None,
            Verdict::Warn,
            format!("/{SRIOV_MANAGE} is missing: gpuslice sriov enable cannot enable VFs"),
            Some("install the NVIDIA vGPU manager, which ships sriov-manage (in a container: mount the host's /usr/lib/nvidia)"),
        );
    }
    for g in capable {
        let Some(s) = &g.sriov else { continue };
        if s.num_vfs == 0 {
            c.push(
                "sriov-vfs",
                gpu_subject(g),
                Verdict::Warn,
                format!(
                    "SR-IOV VFs off (0 of {}): no vGPU can be made on it",
                    s.total_vfs
                ),
                Some(&format!("gpuslice sriov enable {}", g.address)),
            );
        } else {
            c.ok(
                "sriov-vfs",
                gpu_subject(g),
                format!("{} of {} SR-IOV VFs enabled", s.num_vfs, s.total_vfs),
            );
        }
    }
}

fn mig(t: &NodeTopology, c: &mut Checks) {
    for g in nvidia_gpus(t) {
        let profiles: Vec<&gpu_core::Profile> = t
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(g.address))
            .flat_map(|p| p.profiles.iter())
            .collect();
        let mig_backed = profiles.iter().any(|p| p.mig_slices.is_some());
        if !MIG_CAPABLE.contains(&g.device_id.0) && !mig_backed {
            continue;
        }
        let subject = gpu_subject(g);
        if mig_backed {
            c.ok(
                "mig-mode",
                subject,
                "MIG mode on: MIG-backed vGPU types offered",
            );
        } else if !profiles.is_empty() {
            c.ok(
                "mig-mode",
                subject,
                "MIG mode off: time-sliced vGPU types only (for MIG-backed ones: nvidia-smi -mig 1 before enabling VFs)",
            );
        } else {
            c.push(
                "mig-mode",
                subject,
                Verdict::Warn,
                "MIG mode unknown: the GPU lists no vGPU type",
                Some(&format!(
                    "nvidia-smi -i {} --query-gpu=mig.mode.current --format=csv",
                    g.address
                )),
            );
        }
    }
}

fn vgpu_types(t: &NodeTopology, c: &mut Checks) {
    for g in nvidia_gpus(t) {
        let parents: Vec<&gpu_core::Parent> = t
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(g.address) && p.framework == VgpuFramework::VendorVfio)
            .collect();
        if parents.is_empty() {
            continue;
        }
        let instances: usize = parents.iter().map(|p| p.instances.len()).sum();
        let listed = parents.iter().any(|p| !p.profiles.is_empty());
        let subject = gpu_subject(g);
        if listed {
            c.ok(
                "vgpu-types",
                subject,
                format!(
                    "{} VFs, {instances} with a vGPU type; types still creatable",
                    parents.len()
                ),
            );
        } else if instances > 0 {
            c.ok(
                "vgpu-types",
                subject,
                format!("full: {instances} vGPUs, no VF can take another type"),
            );
        } else {
            c.push(
                "vgpu-types",
                subject,
                Verdict::Fail,
                "no VF lists a creatable vGPU type though the GPU holds no vGPU (seen after a live MIG mode change)",
                Some("systemctl restart nvidia-vgpud, then check again"),
            );
        }
    }
}

fn iommu_groups(t: &NodeTopology, c: &mut Checks) {
    for g in &t.gpus {
        if g.state != GpuState::Blocked {
            continue;
        }
        let Some(why) = g.state_reason.as_deref() else {
            continue;
        };
        // "no IOMMU group" is the iommu check's business.
        let Some(rest) = why.strip_prefix("IOMMU group ") else {
            continue;
        };
        let (group, others) = rest
            .split_once(" shared with ")
            .unwrap_or((rest, "other devices"));
        // A server's BMC VGA or the host console is rarely meant for a VM: worth knowing only.
        let console = g.boot_vga || matches!(g.vendor, Vendor::Matrox | Vendor::Aspeed);
        c.push(
            "iommu-group",
            gpu_subject(g),
            if console { Verdict::Warn } else { Verdict::Fail },
            format!("cannot go to a VM whole: IOMMU group {group} also holds {others}"),
            Some(&format!(
                "move the GPU (or those devices) to a slot with its own IOMMU group, or hand every device of group {group} to vfio-pci too"
            )),
        );
    }
}

fn kubevirt(procs: &[String], c: &mut Checks) {
    if procs.iter().any(|p| p == "virt-handler") {
        c.push(
            "kubevirt-mdev-gate",
            Some("virt-handler".to_owned()),
            Verdict::Warn,
            "KubeVirt's virt-handler runs here: it removes mdev instances it did not create",
            Some("enable the DisableMDEVConfiguration feature gate in the KubeVirt CR (spec.configuration.developerConfiguration.featureGates)"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_parameters_take_the_last_value() {
        let w: Vec<String> = "BOOT_IMAGE=/vmlinuz iommu=off intel_iommu=on iommu=pt"
            .split(' ')
            .map(str::to_owned)
            .collect();
        assert_eq!(param(&w, "iommu"), Some("pt"));
        assert_eq!(param(&w, "intel_iommu"), Some("on"));
        assert_eq!(param(&w, "amd_iommu"), None);
    }

    #[test]
    fn verdicts_order_from_ok_to_fail() {
        assert!(Verdict::Ok < Verdict::Warn && Verdict::Warn < Verdict::Fail);
    }
}
