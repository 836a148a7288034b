//! What the node's writer did, as people read it (what `gpuslice vgpu|gpu|sriov|realize`
//! print): every front-end shows one rendering.

use gpu_sysfs::actuate::handoff::Handoff;
use gpu_sysfs::actuate::{Created, GpuBinding, SriovDisabled, SriovEnabled, VgpuListing};

use crate::{ClearScope, Cleared, Realized, RealizedDevice, Removed};

/// A device's hand-off: the QEMU and libvirt snippets and the device nodes, indented.
#[must_use]
pub fn handoff(h: &Handoff) -> String {
    let mut s = format!("  qemu:    {}\n  libvirt: {}\n", h.qemu, h.libvirt);
    if !h.device_nodes.is_empty() {
        s.push_str(&format!("  devices: {}\n", h.device_nodes.join(" ")));
    }
    s
}

/// A created vGPU (or one found already there) with its hand-off.
#[must_use]
pub fn created(created: &Created) -> String {
    let (what, changed, h) = match created {
        Created::Mdev(m) => (
            format!(
                "mdev {} ({} on {})",
                m.uuid,
                m.type_name.as_deref().unwrap_or(m.type_id.as_str()),
                m.parent
            ),
            m.changed,
            &m.handoff,
        ),
        Created::VendorVfio(v) => (
            format!(
                "VF {} (type {}{})",
                v.vf,
                v.type_id,
                v.type_name
                    .as_deref()
                    .map(|n| format!(", {n}"))
                    .unwrap_or_default()
            ),
            v.changed,
            &v.handoff,
        ),
    };
    let verb = if changed {
        "created"
    } else {
        "already present:"
    };
    format!("{verb} {what}\n{}", handoff(h))
}

/// A removal in one line, and the warning to show beside it (an mdev that cannot be reached).
#[must_use]
pub fn removed(removed: &Removed) -> (String, Option<&str>) {
    match removed {
        Removed::Mdev(r) => match &r.warning {
            _ if r.changed => (format!("removed mdev {}", r.uuid), None),
            Some(w) => (
                format!("mdev {} cannot be reached (nothing removed)", r.uuid),
                Some(w),
            ),
            None => (format!("no mdev {} (nothing to remove)", r.uuid), None),
        },
        Removed::Vf(r) => match &r.previous {
            Some(p) if r.changed => (format!("cleared VF {} (had type {p})", r.vf), None),
            _ => (
                format!("VF {} has no vGPU type (nothing to clear)", r.vf),
                None,
            ),
        },
    }
}

/// The vGPU instances of a host: mdevs, then vendor-VFIO VFs with a type.
#[must_use]
pub fn vgpu_list(listing: &VgpuListing) -> String {
    let row = |instance: String, parent: String, ty: &str, name: Option<&str>, held: String| {
        format!(
            "{instance:<38} {parent:<14} {ty:<14} {:<24} {held}\n",
            name.unwrap_or("-")
        )
    };
    let held = |h: Option<&gpu_sysfs::actuate::Holder>| h.map_or("-".to_owned(), |h| h.to_string());
    let mut s = format!(
        "{:<38} {:<14} {:<14} {:<24} IN USE\n",
        "INSTANCE", "PARENT", "TYPE", "NAME"
    );
    for m in &listing.mdevs {
        s.push_str(&row(
            m.uuid.to_string(),
            m.parent.to_string(),
            m.type_id.as_str(),
            m.type_name.as_deref(),
            held(m.held_by.as_ref()),
        ));
    }
    for v in &listing.vendor_vfio {
        s.push_str(&row(
            v.vf.to_string(),
            v.pf.map_or("-".to_owned(), |p| p.to_string()),
            v.type_id.as_str(),
            v.type_name.as_deref(),
            held(v.held_by.as_ref()),
        ));
    }
    s
}

/// What a clear of `scope` removed (or, in a dry run, would remove).
#[must_use]
pub fn cleared(cleared: &Cleared, scope: &ClearScope) -> String {
    if cleared.devices.is_empty() {
        return format!("no vGPUs on {scope} (nothing to clear)\n");
    }
    let verb = if cleared.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let mut s: String = cleared
        .devices
        .iter()
        .map(|d| format!("{verb} {d}\n"))
        .collect();
    if cleared.dry_run {
        let n = cleared.devices.len();
        s.push_str(&format!(
            "dry run: {n} vGPU(s) to clear on {scope}; nothing written\n"
        ));
    } else {
        let n = cleared.removed.len();
        s.push_str(&format!("cleared {n} vGPU(s) on {scope}\n"));
    }
    s
}

/// A GPU bound (`verb` "bound", with each function's hand-off) or released ("released").
#[must_use]
pub fn binding(verb: &str, b: &GpuBinding) -> String {
    let groups: Vec<String> = b.iommu_groups.iter().map(u32::to_string).collect();
    let mut s = format!(
        "{} {} (IOMMU group {})\n",
        if b.changed() { verb } else { "unchanged" },
        b.gpu,
        groups.join(", ")
    );
    for f in &b.functions {
        s.push_str(&format!(
            "{}  {} -> {}{}\n",
            f.address,
            f.driver_before.as_deref().unwrap_or("none"),
            f.driver_after.as_deref().unwrap_or("none"),
            if f.changed { "" } else { " (unchanged)" }
        ));
        if verb == "bound" {
            s.push_str(&handoff(&f.handoff));
        }
    }
    for w in &b.warnings {
        s.push_str(&format!("warning: {w}\n"));
    }
    s
}

/// SR-IOV enabled on a GPU (or found enabled), with its VFs.
#[must_use]
pub fn sriov_enabled(r: &SriovEnabled) -> String {
    let mut s = if r.changed {
        format!("enabled {} VFs on {}\n", r.numvfs, r.pf)
    } else {
        format!("{} already has {} VFs\n", r.pf, r.numvfs)
    };
    for vf in &r.vfs {
        s.push_str(&format!("  {vf}\n"));
    }
    s
}

/// SR-IOV disabled on a GPU (or found without VFs).
#[must_use]
pub fn sriov_disabled(r: &SriovDisabled) -> String {
    if r.changed {
        format!(
            "disabled SR-IOV on {} ({} VFs removed)\n",
            r.pf,
            r.vfs.len()
        )
    } else {
        format!("{} has no VFs (nothing to disable)\n", r.pf)
    }
}

/// What a realize made (or found), then the QEMU arguments.
#[must_use]
pub fn realized(r: &Realized) -> String {
    let verb = if r.changed {
        "realized"
    } else {
        "already realized:"
    };
    let mut out = format!("{verb} Machine {} on node {}\n", r.machine, r.node);
    for d in &r.devices {
        let what = match d {
            RealizedDevice::Vgpu { created, .. } => match created {
                Created::Mdev(m) => format!("mdev {} ({} on {})", m.uuid, m.type_id, m.parent),
                Created::VendorVfio(v) => format!("VF {} (type {})", v.vf, v.type_id),
            },
            RealizedDevice::Gpu { binding, .. } => format!("GPU {} on vfio-pci", binding.gpu),
        };
        let how = if d.changed() { "made" } else { "there" };
        out.push_str(&format!("  {how:<6}{what}\n"));
    }
    out.push_str(&format!("  qemu:    {}\n", r.handoff.qemu.join(" ")));
    out
}

/// What a set's bind or release did ([`crate::fabric::SetBinding`]), as `gpuslice gpu bind` and
/// `release` print it: the partition activated or deactivated, then each GPU's [`binding`].
pub fn set_binding(verb: &str, set: &crate::fabric::SetBinding) -> String {
    let mut s = String::new();
    if let Some(p) = &set.partition {
        let state = if p.partition.active {
            "activated"
        } else {
            "deactivated"
        };
        let how = if p.changed { state } else { "unchanged" };
        s.push_str(&format!("{how} {}\n", p.partition.describe()));
    }
    for b in &set.gpus {
        s.push_str(&binding(verb, b));
    }
    s
}

/// The fabric as text: Fabric Manager's state, then one row per partition.
pub fn fabric(f: &gpu_core::fabric::Fabric) -> String {
    let fm = &f.fabric_manager;
    let mut out = match (fm.is_reachable(), fm.mode) {
        (true, Some(mode)) => format!(
            "Fabric Manager: reachable, {mode} mode; {} NVSwitches\n",
            f.nvswitches.len()
        ),
        _ => format!(
            "Fabric Manager: cannot be reached ({}); {} NVSwitches: no multi-GPU set is handed out\n",
            fm.reason.as_deref().unwrap_or("no reason given"),
            f.nvswitches.len()
        ),
    };
    if f.partitions.is_empty() {
        return out;
    }
    let rows: Vec<Vec<String>> = f
        .partitions
        .iter()
        .map(|p| {
            vec![
                p.id.to_string(),
                p.size().to_string(),
                p.gpus.join(","),
                if p.active { "yes" } else { "no" }.to_owned(),
                p.degraded.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    out.push_str(&gpu_core::text::render_table(
        &["ID", "SIZE", "GPUS", "ACTIVE", "DEGRADED"],
        &rows,
    ));
    out
}
