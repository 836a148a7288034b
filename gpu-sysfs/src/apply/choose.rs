//! A layout's mdev creations on a GPU land where `gpuslice vgpu create` and the agent would put
//! them: right before each write, the parent is chosen again by the one rule
//! ([`crate::actuate::mdev_parent_on_gpu`]), keeping the parents the plan's later creations on
//! the same GPU hold. The planner simulates the same rule over the whole plan, so the answer is
//! the planned parent unless the host moved; when it did, the step is rewritten and the report
//! shows where the instance went.

use gpu_core::layout::Step;
use gpu_core::{ParentId, VgpuFramework};

use crate::actuate::{ActuateError, mdev_parent_on_gpu};
use crate::host::Host;

/// Chooses the parent of step `at` again when it is an mdev creation on a parent of a physical
/// GPU other than the GPU itself (a VF of an SR-IOV card); other steps are left as planned (a
/// vendor-VFIO VF may be pinned by the layout).
///
/// # Errors
/// The errors of [`mdev_parent_on_gpu`] (no parent of the GPU has room now).
pub(super) fn rechoose(host: &dyn Host, steps: &mut [Step], at: usize) -> Result<(), ActuateError> {
    let Some(Step::Create {
        gpu: ParentId::Pci(pf),
        instance,
    }) = steps.get(at)
    else {
        return Ok(());
    };
    if instance.framework != VgpuFramework::Mdev || instance.parent == ParentId::Pci(*pf) {
        return Ok(());
    }
    let (Some(type_id), pf) = (instance.type_id.clone(), *pf) else {
        return Ok(());
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
        .collect();
    let (parent, _) =
        mdev_parent_on_gpu(host, &pf, type_id.as_str(), instance.uuid.as_ref(), &kept)?;
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
        rechoose(&k, &mut steps, 0).unwrap();
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
