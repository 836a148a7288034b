//! The VFs of NVIDIA GPUs: bound to another driver (no vGPU can be made on them; the fix names
//! `vfio-pci.ids` when the kernel command line carries the VFs' ID), and VFs whose vGPU state
//! cannot be read.

use gpu_core::NodeTopology;

use super::{Checks, Verdict, gpu_subject, nvidia_gpus, param};

/// Whether some NVIDIA GPU's VFs are held by another driver (then the vGPU manager is not what
/// is missing).
pub(super) fn held_elsewhere(t: &NodeTopology) -> bool {
    nvidia_gpus(t).iter().any(|g| {
        g.sriov
            .as_ref()
            .is_some_and(|s| !s.other_driver_vfs.is_empty())
    })
}

pub(super) fn vf_drivers(t: &NodeTopology, words: Option<&[String]>, c: &mut Checks) {
    for g in nvidia_gpus(t) {
        let Some(d) = g
            .sriov
            .as_ref()
            .and_then(|s| s.other_driver_diagnosis(g.vendor_id, g.device_id))
        else {
            continue;
        };
        let claimed = words
            .and_then(|w| param(w, "vfio-pci.ids"))
            .filter(|ids| ids.split(',').any(|i| i.eq_ignore_ascii_case(&d.ids)));
        let fix = match claimed {
            Some(ids) => format!(
                "the kernel command line has vfio-pci.ids={ids}, which claims the VFs{}: \
                 remove {} from it (and from /etc/modprobe.d) and reboot; until then {}",
                d.shared, d.ids, d.rebind
            ),
            None => d.fix,
        };
        c.push(
            "vf-drivers",
            gpu_subject(g),
            Verdict::Fail,
            d.problem,
            Some(&fix),
        );
    }
}

pub(super) fn vf_state(t: &NodeTopology, c: &mut Checks) {
    for g in nvidia_gpus(t) {
        for u in g.sriov.iter().flat_map(|s| &s.unreadable_vfs) {
            c.push(
                "vf-state",
                gpu_subject(g),
                Verdict::Warn,
                format!(
                    "VF {}: its vGPU type (nvidia/current_vgpu_type) cannot be read ({}); it \
                     is neither offered nor planned until it can",
                    u.address, u.error
                ),
                Some("look at the nvidia driver's messages for this VF (dmesg); a reload of the vGPU manager usually clears it"),
            );
        }
    }
}
