//! A layout's creations on a GPU land where `gpuslice vgpu create` and the agent would put
//! them: right before each write, the parent is chosen again by the node's one chooser
//! ([`super::ApplyOptions::choose`], `gpu_node::target::choose_on_gpu`), keeping the parents the
//! plan's later creations on the same GPU hold and the VFs the layout names. This holds for an
//! mdev instance on a VF of an SR-IOV card and for a vendor-VFIO VF's type alike. The planner
//! simulates the same rule over the whole plan, so the answer is the planned parent unless the
//! host moved (a VF a VM holds open is passed over, as `vgpu create` passes it over); when it
//! did, the step is rewritten and the report shows where the instance went.

use std::collections::BTreeSet;

use gpu_core::layout::{LayoutConfig, Selector, Step};
use gpu_core::{ParentId, PciAddress, VgpuFramework};

use super::Chooser;
use crate::actuate::{ActuateError, mdev_parent_on_gpu};
use crate::host::Host;

/// The VFs `config` names itself (the vendor-VFIO form): a creation there stays where it is.
pub(super) fn pinned(config: &LayoutConfig) -> BTreeSet<PciAddress> {
    let vf = |e: &gpu_core::layout::Entry| match &e.selector {
        Selector::Vf { address } => Some(*address),
        _ => None,
    };
    config.entries.iter().filter_map(vf).collect()
}

/// Chooses the parent of step `at` again when it is a creation on a parent of a physical GPU
/// other than the GPU itself (a VF) that the layout does not name: with `choose` (the node's
/// chooser), for mdev and vendor-VFIO creations; without it, for mdev ones by
/// [`mdev_parent_on_gpu`]. Other steps are left as planned.
///
/// # Errors
/// The chooser's errors (no parent of the GPU has room now).
pub(super) fn rechoose(
    host: &dyn Host,
    choose: Option<Chooser>,
    pinned: &BTreeSet<PciAddress>,
    steps: &mut [Step],
    at: usize,
) -> Result<(), ActuateError> {
    let Some(Step::Create {
        gpu: ParentId::Pci(pf),
        instance,
    }) = steps.get(at)
    else {
        return Ok(());
    };
    let pf = *pf;
    if instance.parent == ParentId::Pci(pf) {
        return Ok(());
    }
    let vendor = instance.framework == VgpuFramework::VendorVfio;
    if vendor && (choose.is_none() || instance.parent.pci().is_some_and(|v| pinned.contains(&v))) {
        return Ok(());
    }
    // The type as the chooser takes it: its ID, else (a vendor-VFIO type named for write time)
    // its name.
    let profile = match (&instance.type_id, &instance.type_name) {
        (Some(id), _) => id.as_str().to_owned(),
        (None, Some(name)) if vendor => name.clone(),
        _ => return Ok(()),
    };
    let kept: Vec<ParentId> = steps
        .iter()
        .skip(at + 1)
        .filter_map(|s| match s {
            Step::Create { gpu, instance } if *gpu == ParentId::Pci(pf) => {
                Some(instance.parent.clone())
            }
            _ => None,
        })
        .chain(pinned.iter().map(|v| ParentId::Pci(*v)))
        .collect();
    let uuid = instance.uuid;
    let parent = match choose {
        Some(choose) => choose(host, &pf, &profile, uuid.as_ref(), &kept)?,
        None => mdev_parent_on_gpu(host, &pf, &profile, uuid.as_ref(), &kept)?.0,
    };
    if let Some(Step::Create { instance, .. }) = steps.get_mut(at) {
        instance.parent = parent;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use gpu_core::layout::PlannedInstance;
    use gpu_core::{MdevUuid, PciAddress};

    use super::*;
    use crate::testing::FakeKernel;

    fn create(parent: &str, n: u32) -> Step {
        Step::Create {
            gpu: ParentId::Pci("0000:08:00.0".parse().unwrap()),
            instance: PlannedInstance {
                framework: VgpuFramework::Mdev,
                parent: ParentId::Pci(parent.parse().unwrap()),
                uuid: Some(MdevUuid::for_machine("vm", "gpu", n)),
                type_id: Some("nvidia-746".parse().unwrap()),
                type_name: Some("NVIDIA A2-4Q".to_owned()),
                framebuffer_mib: Some(4096),
                in_use: None,
            },
        }
    }

    fn parent(s: &Step) -> PciAddress {
        match s {
            Step::Create { instance, .. } => instance.parent.pci().unwrap(),
            other => panic!("not a creation: {other:?}"),
        }
    }

    #[test]
    fn a_layout_creation_goes_where_vgpu_create_would_keeping_the_vfs_of_later_ones() {
        let k = FakeKernel::a2_mdev_host().unwrap();
        // The first creation was planned further on; the first VF with room, 08:00.4, is kept
        // for the second, so the first goes to 08:00.5.
        let mut steps = vec![create("0000:08:00.6", 0), create("0000:08:00.4", 1)];
        rechoose(&k, None, &BTreeSet::new(), &mut steps, 0).unwrap();
        assert_eq!(parent(&steps[0]), "0000:08:00.5".parse().unwrap());
        assert_eq!(parent(&steps[1]), "0000:08:00.4".parse().unwrap());
        // The choice is the one `vgpu create --parent 0000:08:00.0` makes.
        let (by_create, _) = mdev_parent_on_gpu(
            &k,
            &"0000:08:00.0".parse().unwrap(),
            "A2-4Q",
            None,
            &[ParentId::Pci("0000:08:00.4".parse().unwrap())],
        )
        .unwrap();
        assert_eq!(by_create, ParentId::Pci(parent(&steps[0])));
    }
}
