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
