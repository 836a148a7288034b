//! Fabric Manager's vGPU mode: vGPUs on the VFs of a partition's GPUs handed out together with
//! the partition activated for those VFs (`fmActivateFabricPartitionWithVFs`).
//!
//! NVIDIA lets only some vGPUs use NVLink (each rule cited in `docs/fabric.md`): only
//! time-sliced vGPUs, never MIG-backed ones, on NVSwitch systems; each vGPU using all of its
//! GPU's framebuffer for NVLink peer-to-peer; and all peer vGPUs in one VM. So
//! [`create_vgpu_set`] refuses, before anything is written, a MIG-backed type or one that takes
//! part of the framebuffer, a set of GPUs that is no partition, and a Fabric Manager in another
//! mode; then, under the node's lock and with its intent recorded, it gives each GPU's VF the
//! type and activates the partition with those VFs, in the order of the partition's GPUs
//! (the order FM's header asks). A failure undoes what was made. [`remove_vgpu_set`]
//! deactivates the partition, then clears the VFs' types.

use gpu_core::nvidia::VgpuTypeName;
use gpu_core::{GpuRef, NodeTopology, ParentId, PciAddress};
use serde::Serialize;

use super::{FabricError, FabricMode, FabricNode, Partition, PartitionChange, record, relisted};
use crate::intent::{self, Intent, Planned};
use crate::{Removed, Target, VgpuId};

const CHECK: &str = "`gpuslice fabric list` and `gpuslice vgpu list` (a partition may be active, or VFs typed, that no VM owns)";

/// NVIDIA's rule on MIG-backed vGPUs and NVSwitch.
const MIG_RULE: &str = "it is MIG-backed, and on NVSwitch systems only time-sliced vGPUs may \
     use NVLink (NVIDIA vGPU for Compute, \"NVIDIA NVSwitch\" limitations)";

/// What [`create_vgpu_set`] or [`remove_vgpu_set`] did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VgpuSet {
    /// The partition, as Fabric Manager lists it afterwards.
    pub partition: PartitionChange,
    /// The VF of each GPU, in the partition's order.
    pub vfs: Vec<PciAddress>,
    /// The vGPU type given (empty for a removal).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub profile: String,
}

impl VgpuSet {
    /// How people read it: the partition, then each VF.
    pub fn describe(&self, verb: &str) -> String {
        let mut out = format!(
            "{} {} with VFs {}\n",
            if self.partition.changed {
                verb
            } else {
                "unchanged"
            },
            self.partition.partition.describe(),
            list(&self.vfs)
        );
        if !self.profile.is_empty() {
            for vf in &self.vfs {
                out.push_str(&format!("created {} on VF {vf}\n", self.profile));
            }
        }
        out
    }
}

fn list(a: &[PciAddress]) -> String {
    a.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The GPUs named (gpuslice names or PCI addresses) on `t`.
fn resolve(t: &NodeTopology, gpus: &[String]) -> Result<Vec<PciAddress>, FabricError> {
    gpus.iter()
        .map(|n| match GpuRef::parse_one(n) {
            Ok(GpuRef::Address(a)) => Ok(a),
            Ok(named) => t
                .gpu_address_by_name(&named.to_string())
                .map_err(|e| FabricError::UnknownGpu(e.to_string())),
            Err(e) => Err(FabricError::UnknownGpu(e.to_string())),
        })
        .collect()
}

/// Refuses `profile` on `gpu` when NVIDIA does not let it use NVLink: MIG-backed, or not
/// taking all of the GPU's framebuffer (one per GPU).
///
/// # Errors
/// [`FabricError::NvlinkVgpu`] naming the rule.
pub fn check_nvlink_type(
    t: &NodeTopology,
    gpu: &PciAddress,
    profile: &str,
) -> Result<(), FabricError> {
    let refuse = |why: String| FabricError::NvlinkVgpu {
        profile: profile.to_owned(),
        gpu: super::name_in(t, gpu),
        why,
    };
    let bare = profile.strip_prefix("NVIDIA ").unwrap_or(profile);
    if VgpuTypeName::parse(bare).is_ok_and(|n| n.is_mig()) {
        return Err(refuse(MIG_RULE.to_owned()));
    }
    let parents: Vec<&gpu_core::Parent> = t
        .mediated_devices
        .parents
        .iter()
        .filter(|p| p.gpu == Some(*gpu))
        .collect();
    let offered = parents
        .iter()
        .flat_map(|p| &p.profiles)
        .find(|p| p.name == profile || p.name.strip_prefix("NVIDIA ") == Some(bare));
    let Some(p) = offered else {
        return Err(refuse(format!(
            "no VF of {} offers it",
            super::name_in(t, gpu)
        )));
    };
    if p.mig_slices.is_some() {
        return Err(refuse(MIG_RULE.to_owned()));
    }
    let whole = match p.max_instances {
        Some(n) => n == 1,
        // Without NVML's count: a free GPU's VFs list every type it offers, and the largest
        // time-sliced one is the one that takes the whole framebuffer (`docs/fabric.md`).
        None => {
            if parents.iter().any(|p| !p.instances.is_empty()) {
                return Err(refuse(format!(
                    "{} already holds vGPUs, and a vGPU using NVLink takes all of its GPU's \
                     framebuffer",
                    super::name_in(t, gpu)
                )));
            }
            let largest = parents
                .iter()
                .flat_map(|p| &p.profiles)
                .filter(|p| p.mig_slices.is_none())
                .filter_map(|p| p.framebuffer_mib)
                .max();
            p.framebuffer_mib.is_some() && p.framebuffer_mib == largest
        }
    };
    if whole {
        return Ok(());
    }
    Err(refuse(
        "it takes part of the GPU's framebuffer, and NVLink peer-to-peer needs each vGPU to use \
         all of its GPU's framebuffer (NVIDIA vGPU for Compute, \"Peer-To-Peer CUDA Transfers\"): \
         ask for the type that takes the whole framebuffer"
            .to_owned(),
    ))
}

/// Gives each of `gpus` (names or addresses; exactly one partition's members) a vGPU of
/// `profile` on one of its VFs and activates the partition with those VFs, on a node whose
/// Fabric Manager runs in vGPU mode.
///
/// # Errors
/// Before any write: [`FabricError::UnknownGpu`], [`FabricError::Mode`],
/// [`FabricError::NvlinkVgpu`], [`FabricError::NotAPartition`], [`FabricError::Degraded`],
/// [`FabricError::Unreachable`], [`FabricError::InUse`] and the target's refusals
/// ([`FabricError::Node`]); then [`FabricError::Fm`] and [`FabricError::Node`], with what was
/// made undone.
pub fn create_vgpu_set<'h>(
    on: impl Into<FabricNode<'h>>,
    gpus: &[String],
    profile: &str,
) -> Result<VgpuSet, FabricError> {
    let f = &on.into();
    let r = f.read()?;
    let addrs = resolve(&r.topology, gpus)?;
    let p = vgpu_partition(&r, &addrs)?;
    for g in &p.addresses {
        check_nvlink_type(&r.topology, g, profile)?;
    }
    if p.active {
        return Err(FabricError::InUse {
            partition: p.describe(),
            gpu: super::name_in(&r.topology, &p.addresses[0]),
            holder: "the partition itself, already active".to_owned(),
        });
    }
    r.check_members(f.node.host(), p, true)?;
    let fm = r.fm()?;
    let node = f.node;
    let host = node.host();
    let locked = node.lock()?;
    // Where each vGPU goes, chosen under the lock, in the partition's order (reads only).
    let mut targets = Vec::with_capacity(p.size());
    for g in &p.addresses {
        let t = locked.choose_target(&ParentId::Pci(*g), profile, None, |n: &str| {
            Err(FabricError::UnknownGpu(n.to_owned()))
        })?;
        match t {
            Target::VendorVfio { vf, type_num } => targets.push((vf, type_num)),
            Target::Mdev { .. } => {
                return Err(FabricError::NvlinkVgpu {
                    profile: profile.to_owned(),
                    gpu: super::name_in(&r.topology, g),
                    why: "its vGPUs are mdev devices; gpuslice hands out NVLink vGPU sets on \
                          vendor-specific VFIO VFs only"
                        .to_owned(),
                });
            }
        }
    }
    let vfs: Vec<PciAddress> = targets.iter().map(|(vf, _)| *vf).collect();
    let mut creates: Vec<Planned> = vfs.iter().map(|vf| Planned::VfType { vf: *vf }).collect();
    creates.push(Planned::FabricPartition { id: p.id });
    let what = format!(
        "create {profile} on VFs {} and activate partition {} with them",
        list(&vfs),
        p.id
    );
    let intent = Intent::new("create-vgpu-set", what, CHECK).creating(creates);
    intent::around(
        host,
        intent,
        |_| Vec::new(),
        || {
            let mut made: Vec<PciAddress> = Vec::new();
            let undo = |made: &[PciAddress]| {
                for vf in made {
                    let _ = locked.remove_vgpu(&VgpuId::Vf(*vf), false);
                }
            };
            for (vf, type_num) in &targets {
                let target = Target::VendorVfio {
                    vf: *vf,
                    type_num: *type_num,
                };
                if let Err(e) = locked.create_vgpu(&target, None, false) {
                    undo(&made);
                    return Err(FabricError::Node(e));
                }
                made.push(*vf);
            }
            if let Err(source) = fm.activate_with_vfs(p.id, &vfs) {
                undo(&made);
                return Err(FabricError::Fm {
                    action: "activate",
                    id: p.id,
                    source,
                });
            }
            record::note(host, p.id, true);
            Ok(())
        },
    )?;
    drop(locked);
    Ok(VgpuSet {
        partition: relisted(f, p.id, true)?,
        vfs,
        profile: profile.to_owned(),
    })
}

/// The partition `addrs` are, on a node whose Fabric Manager runs in vGPU mode.
fn vgpu_partition<'r>(
    r: &'r super::Read,
    addrs: &[PciAddress],
) -> Result<&'r Partition, FabricError> {
    let fabric = r.fabric()?;
    r.fm()?;
    let mode = fabric.fabric_manager.mode.unwrap_or(FabricMode::BareMetal);
    if mode != FabricMode::Vgpu {
        return Err(FabricError::Mode {
            what: "vGPUs using NVLink",
            needs: FabricMode::Vgpu,
            mode,
        });
    }
    super::claim_partition(&r.topology, addrs)?.ok_or_else(|| FabricError::NotAPartition {
        gpus: "no GPU".to_owned(),
        would_do: "none".to_owned(),
    })
}

/// Deactivates the partition whose members are `gpus` (names or addresses), then clears the
/// vGPU type of each of their VFs that has one: the reverse of [`create_vgpu_set`]. A VF a
/// process (a VM) holds is refused unless `force`.
///
/// # Errors
/// [`FabricError::UnknownGpu`], [`FabricError::Mode`], [`FabricError::NotAPartition`] before any
/// write; [`FabricError::Fm`], [`FabricError::Node`].
pub fn remove_vgpu_set<'h>(
    on: impl Into<FabricNode<'h>>,
    gpus: &[String],
    force: bool,
) -> Result<VgpuSet, FabricError> {
    let f = &on.into();
    let r = f.read()?;
    let addrs = resolve(&r.topology, gpus)?;
    let p = vgpu_partition(&r, &addrs)?;
    let typed: Vec<PciAddress> = r
        .topology
        .mediated_devices
        .parents
        .iter()
        .filter(|par| par.gpu.is_some_and(|g| p.contains(&g)) && !par.instances.is_empty())
        .filter_map(|par| match par.id {
            ParentId::Pci(vf) if !p.contains(&vf) => Some(vf),
            _ => None,
        })
        .collect();
    let fm = r.fm()?;
    let host = f.node.host();
    let locked = f.node.lock()?;
    let what = format!(
        "deactivate partition {} and clear VFs {}",
        p.id,
        list(&typed)
    );
    let intent = Intent::new("remove-vgpu-set", what, CHECK);
    intent::around(
        host,
        intent,
        |_| Vec::new(),
        || {
            if p.active {
                super::set_active(fm.as_ref(), p.id, false)?;
                record::note(host, p.id, false);
            }
            for vf in &typed {
                let removed: Removed = locked.remove_vgpu(&VgpuId::Vf(*vf), force)?;
                let _ = removed;
            }
            Ok::<_, FabricError>(())
        },
    )?;
    drop(locked);
    Ok(VgpuSet {
        partition: relisted(f, p.id, p.active)?,
        vfs: typed,
        profile: String::new(),
    })
}
