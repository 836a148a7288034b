//! Why a GPU takes no more vGPUs, said from gpuslice's own model of its pool
//! (`nvidia0's 16384 MiB pool holds 4 × 4096 MiB`) rather than from the kernel's errno alone:
//! what a refused create puts first, before the `ENOSPC` of the write that failed.

use std::collections::BTreeMap;

use crate::ids::ParentId;
use crate::nvidia::strip_prefix;
use crate::topology::{NodeTopology, Parent, Pool, Profile};

/// Why the pool that `target` (a parent, a VF or a physical GPU) draws from has no room for
/// one more vGPU of `profile` (a type ID or name), from what `topo` holds; `None` when the
/// model does not know the target or its pool.
///
/// `nvidia0's 16384 MiB pool holds 4 × 4096 MiB (16384 MiB used): A2-4Q needs 4096 MiB
/// framebuffer, 0 MiB free`; for vendor-VFIO GPUs the VFs are counted too (`16 of 16 VFs hold
/// a vGPU`).
pub fn why_full(topo: &NodeTopology, target: &ParentId, profile: &str) -> Option<String> {
    // A parent draws from its GPU's pool; a GPU is named by address or by its per-node name.
    let by_name = topo
        .gpus
        .iter()
        .find(|g| matches!(target, ParentId::Named(n) if *n == g.name))
        .map(|g| ParentId::Pci(g.address));
    let key = match by_name {
        Some(k) => k,
        None => topo
            .mediated_devices
            .parents
            .iter()
            .find(|p| p.id == *target)
            .map_or_else(|| target.clone(), Parent::pool_key),
    };
    let pool = topo.mediated_devices.pools.iter().find(|p| p.gpu == key)?;
    let parents: Vec<&Parent> = topo
        .mediated_devices
        .parents
        .iter()
        .filter(|p| p.pool_key() == key)
        .collect();
    let name = topo
        .gpus
        .iter()
        .find(|g| ParentId::Pci(g.address) == key)
        .map_or_else(|| key.to_string(), |g| g.name.clone());
    let mut out = format!(
        "{name}'s {} MiB pool holds {}",
        pool.total_mib,
        held(pool, &parents)
    );
    let vfs: Vec<&&Parent> = parents
        .iter()
        .filter(|p| p.gpu.is_some() && p.id.pci() != p.gpu)
        .collect();
    if !vfs.is_empty() {
        let taken = vfs.iter().filter(|p| !p.instances.is_empty()).count();
        out.push_str(&format!(", {taken} of {} VFs hold a vGPU", vfs.len()));
    }
    if let Some(p) = find_profile(&parents, profile) {
        let shown = strip_prefix(&p.name);
        match pool.check(p) {
            Err(misfit) => out.push_str(&format!(": {shown} {misfit}")),
            Ok(()) if !vfs.is_empty() && vfs.iter().all(|v| !v.instances.is_empty()) => {
                out.push_str(&format!(": no VF is free for {shown}"));
            }
            Ok(()) => {}
        }
    }
    Some(out)
}

/// What a pool holds: `4 × 4096 MiB` by instance size, or the MiB used when sizes are unknown.
fn held(pool: &Pool, parents: &[&Parent]) -> String {
    let mut sizes: BTreeMap<u64, u32> = BTreeMap::new();
    let mut unknown_size = 0u32;
    for p in parents {
        for i in &p.instances {
            let size = i.framebuffer_mib.or_else(|| {
                p.profiles
                    .iter()
                    .find(|t| t.id == i.profile)
                    .and_then(|t| t.framebuffer_mib)
            });
            match size {
                Some(s) => *sizes.entry(s).or_default() += 1,
                None => unknown_size += 1,
            }
        }
    }
    let mut parts: Vec<String> = sizes
        .iter()
        .rev()
        .map(|(size, n)| format!("{n} × {size} MiB"))
        .collect();
    if unknown_size > 0 {
        parts.push(format!("{unknown_size} of unknown size"));
    }
    if parts.is_empty() {
        return format!("no vGPU ({} MiB used)", pool.used_mib);
    }
    format!("{} ({} MiB used)", parts.join(" + "), pool.used_mib)
}

/// The profile `text` names (type ID, or name with or without its `NVIDIA ` prefix) among the
/// pool's parents.
fn find_profile<'a>(parents: &[&'a Parent], text: &str) -> Option<&'a Profile> {
    let t = strip_prefix(text.trim());
    parents.iter().flat_map(|p| &p.profiles).find(|p| {
        p.id.as_str().eq_ignore_ascii_case(t) || strip_prefix(&p.name).eq_ignore_ascii_case(t)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ids::VgpuTypeId;
    use crate::topology::{Instance, MediatedDevices, VgpuFramework};

    fn profile(id: &str, name: &str, mib: u64) -> Profile {
        Profile {
            id: VgpuTypeId::from_str_unchecked(id),
            name: name.into(),
            framebuffer_mib: Some(mib),
            max_instances: None,
            available_instances: 0,
            reported_instances: None,
            device_api: "vfio-pci".into(),
            mig_slices: None,
            mig_memory_gib: None,
            description: None,
        }
    }

    fn node_with(used: u32) -> NodeTopology {
        let mut t = NodeTopology::new("n");
        let instances = (0..used)
            .map(|_| Instance {
                uuid: None,
                address: None,
                profile: VgpuTypeId::from_str_unchecked("nvidia-746"),
                profile_name: None,
                framebuffer_mib: None,
                in_use: None,
                placement_id: None,
            })
            .collect();
        t.mediated_devices = MediatedDevices {
            parents: vec![Parent {
                id: ParentId::Named("gpu0".into()),
                gpu: None,
                framework: VgpuFramework::Mdev,
                health: Default::default(),
                profiles: vec![profile("nvidia-746", "NVIDIA A2-4Q", 4096)],
                instances,
                warnings: vec![],
            }],
            pools: vec![Pool {
                gpu: ParentId::Named("gpu0".into()),
                parents: vec![ParentId::Named("gpu0".into())],
                total_mib: 16384,
                used_mib: u64::from(used) * 4096,
                size_locked_mib: Some(4096),
                mixed_size: false,
                mig_slices_total: None,
                mig_slices_used: None,
                mig_slots: None,
            }],
        };
        t
    }

    #[test]
    fn a_full_pool_is_said_by_what_it_holds_and_what_the_profile_needs() {
        let t = node_with(4);
        let target = ParentId::Named("gpu0".into());
        assert_eq!(
            why_full(&t, &target, "A2-4Q").unwrap(),
            "gpu0's 16384 MiB pool holds 4 × 4096 MiB (16384 MiB used): A2-4Q needs 4096 MiB \
             framebuffer, 0 MiB free"
        );
        assert_eq!(
            why_full(&t, &target, "nvidia-746").unwrap(),
            why_full(&t, &target, "NVIDIA A2-4Q").unwrap()
        );
        assert!(why_full(&t, &ParentId::Named("other".into()), "A2-4Q").is_none());
    }
}
