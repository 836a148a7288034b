//! Realizing an allocation: a Machine that `gpu-sched` placed on this node (an [`Allocation`]
//! from a fleet file, `gpuslice place --save`) becomes devices here, in one call.
//!
//! [`Node::realize`] checks everything before the first write: the allocation is for this node,
//! every GPU and vGPU parent it names is here in the framework it says ([`handoff::check_allocation`]),
//! every profile is offered where it goes, every whole GPU is free for a VM (not blocked, not
//! open, hosting no vGPU or VF), every vGPU identity is free or already what the allocation says,
//! and each parent has room for what it is asked. Then, under the host-wide lock and with its
//! intent recorded ([`crate::intent`]), it makes the devices through the steps `vgpu create` and
//! `gpu bind` take ([`choose_target`] and the node's create and bind), re-reads the node and
//! checks the hand-off ([`handoff::allocation_handoff`]), and answers with what it did and the
//! hand-off (QEMU arguments, libvirt XML). When a step or the re-read fails, what the call made
//! is undone, in reverse. Asking again for an allocation already realized writes nothing.

use std::collections::BTreeMap;

use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, ClassifiedError, ErrorDetail, ErrorKind,
    MdevUuid, NodeTopology, ParentId, PciAddress, VgpuFramework,
};
use gpu_integrations::IntegrationError;
use gpu_integrations::handoff::{self, VmDevice, VmHandoff};
use gpu_sysfs::actuate::{ActuateError, Created, GpuBinding};
use gpu_sysfs::{Host, SysfsError};
use serde::Serialize;

use crate::intent::{self, Intent, Planned};
use crate::mig::realize::{self as mig_realize, InstanceStarts, TodoRefusal};
use crate::node::{bind_at, create_at, release_at, remove_at};
use crate::probe::Probe;
use crate::{Node, NodeError, VgpuId, choose_target};

/// What [`Node::realize`] did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Realized {
    /// The Machine.
    pub machine: String,
    /// The node.
    pub node: String,
    /// True when this call changed the host (false: every device was there already).
    pub changed: bool,
    /// Each device of the allocation, in its order, with what was made or found.
    pub devices: Vec<RealizedDevice>,
    /// The QEMU arguments and libvirt XML that hand the devices to the VM.
    pub handoff: VmHandoff,
    /// What the hand-off check warns about.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One device of a realized allocation.
#[derive(Debug, Clone, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "lowercase",
    rename_all_fields = "camelCase"
)]
pub enum RealizedDevice {
    /// A vGPU: the mdev instance or the VF's type, as `vgpu create` answers.
    Vgpu {
        /// The device request.
        request: String,
        /// The index within the request.
        index: u32,
        /// What was made (or found).
        created: Created,
    },
    /// A whole GPU bound to vfio-pci, as `gpu bind` answers.
    Gpu {
        /// The device request.
        request: String,
        /// The binding.
        binding: GpuBinding,
    },
}

impl RealizedDevice {
    /// Whether this call changed it.
    pub fn changed(&self) -> bool {
        match self {
            RealizedDevice::Vgpu { created, .. } => match created {
                Created::Mdev(m) => m.changed,
                Created::VendorVfio(v) => v.changed,
            },
            RealizedDevice::Gpu { binding, .. } => binding.changed(),
        }
    }
}

/// Why an allocation was not realized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RealizeError {
    /// The allocation is for another node (`invalid-request`).
    #[error(
        "the allocation of Machine {machine} is for node {node}, but this host is node {this} \
         (pass --node {node} if that is this host's name)"
    )]
    OtherNode {
        /// The Machine.
        machine: String,
        /// The allocation's node.
        node: String,
        /// This node's name.
        this: String,
    },
    /// The node could not be read.
    #[error("cannot read node {node} to realize Machine {machine}")]
    Discover {
        /// The Machine.
        machine: String,
        /// The node.
        node: String,
        /// Discovery's error.
        #[source]
        source: Box<SysfsError>,
    },
    /// A device is not on the node as the allocation says, or is not free for a VM.
    #[error("Machine {machine}: nothing was changed")]
    Check {
        /// The Machine.
        machine: String,
        /// The check's refusal.
        #[source]
        source: Box<IntegrationError>,
    },
    /// A vGPU parent does not offer the profile (`unknown-profile`).
    #[error(
        "Machine {machine}, request {request}: {parent} offers no vGPU type {profile}; nothing \
         was changed"
    )]
    UnknownProfile {
        /// The Machine.
        machine: String,
        /// The device request.
        request: String,
        /// The parent.
        parent: ParentId,
        /// The profile asked for.
        profile: String,
    },
    /// A vGPU identity is taken by another device (`in-use`).
    #[error("Machine {machine}, request {request}: {why}; nothing was changed")]
    Taken {
        /// The Machine.
        machine: String,
        /// The device request.
        request: String,
        /// What holds it.
        why: String,
    },
    /// A parent has no room for what the allocation puts on it (`exhausted`).
    #[error(
        "Machine {machine}: {parent} has room for {free} more {profile} vGPU(s), the allocation \
         asks {wanted}; nothing was changed"
    )]
    NoRoom {
        /// The Machine.
        machine: String,
        /// The parent.
        parent: ParentId,
        /// The profile.
        profile: String,
        /// How many more it can take.
        free: u32,
        /// How many are asked.
        wanted: u32,
    },
    /// A write failed; what the call had made was undone (`left` says what the undo could not
    /// remove).
    #[error("cannot realize Machine {machine}: request {request}{}", undo_text(.left))]
    Write {
        /// The Machine.
        machine: String,
        /// The device request whose step failed.
        request: String,
        /// The step's error.
        #[source]
        source: Box<NodeError>,
        /// What is still on the host although the call should have undone it.
        left: Vec<String>,
    },
    /// The devices were made, but the node read afterwards does not hand them off; what the
    /// call made was undone.
    #[error("Machine {machine}: the devices made do not check out on the node read afterwards{}", undo_text(.left))]
    Readback {
        /// The Machine.
        machine: String,
        /// The check's refusal.
        #[source]
        source: Box<IntegrationError>,
        /// What the undo could not remove.
        left: Vec<String>,
    },
    /// A GPU the allocation puts a device on is graded Unhealthy (`unhealthy`); nothing was
    /// changed.
    #[error("Machine {machine}")]
    Unhealthy {
        /// The Machine.
        machine: String,
        /// The health rule's refusal.
        #[source]
        source: gpu_core::CoreError,
    },
    /// A MIG-backed vGPU's GPU instance cannot be made (MIG mode, the start asked, no room);
    /// nothing was changed.
    #[error("Machine {machine}: nothing was changed")]
    Mig {
        /// The Machine.
        machine: String,
        /// MIG's refusal.
        #[source]
        source: Box<crate::mig::MigError>,
    },
    /// The lock or the intent record.
    #[error(transparent)]
    Node(#[from] NodeError),
}

fn undo_text(left: &[String]) -> String {
    match left.is_empty() {
        true => "; what this call made was undone".to_owned(),
        false => format!("; undoing it failed, still there: {}", left.join(", ")),
    }
}

impl RealizeError {
    fn left(&self) -> Vec<String> {
        match self {
            RealizeError::Write { left, .. } | RealizeError::Readback { left, .. } => left.clone(),
            _ => Vec::new(),
        }
    }

    fn inner(&self) -> Option<&dyn ClassifiedError> {
        match self {
            RealizeError::Discover { source, .. } => Some(source.as_ref()),
            RealizeError::Check { source, .. } | RealizeError::Readback { source, .. } => {
                Some(source.as_ref())
            }
            RealizeError::Write { source, .. } => Some(source.as_ref()),
            RealizeError::Mig { source, .. } => Some(source.as_ref()),
            RealizeError::Node(e) => Some(e),
            _ => None,
        }
    }
}

impl ClassifiedError for RealizeError {
    fn kind(&self) -> ErrorKind {
        match self {
            RealizeError::OtherNode { .. } => ErrorKind::InvalidRequest,
            RealizeError::UnknownProfile { .. } => ErrorKind::UnknownProfile,
            RealizeError::Taken { .. } => ErrorKind::InUse,
            RealizeError::NoRoom { .. } => ErrorKind::Exhausted,
            RealizeError::Unhealthy { source, .. } => source.kind(),
            _ => self.inner().map_or(ErrorKind::Other, |e| e.kind()),
        }
    }

    fn errno(&self) -> Option<i32> {
        self.inner().and_then(|e| e.errno())
    }

    fn detail(&self) -> ErrorDetail {
        self.inner().map_or(ErrorDetail::None, |e| e.detail())
    }
}

/// The one health rule for realizing `allocation`, the rule of a bind
/// ([`gpu_core::Health::check_handout`]) applied to each GPU it holds whole and to the GPU of
/// each of its vGPUs, as `graded` (the node with its health graded) grades them: an Unhealthy
/// GPU is refused unless `force` (`force_hint` says how the front-end forces); a Degraded one,
/// or an Unhealthy one forced, gives a warning. A GPU `graded` does not list is not judged.
///
/// # Errors
/// [`RealizeError::Unhealthy`] for an Unhealthy GPU without `force`.
pub fn check_health(
    allocation: &Allocation,
    graded: &NodeTopology,
    force: bool,
    force_hint: &'static str,
) -> Result<Vec<String>, RealizeError> {
    let mut gpus: Vec<PciAddress> = Vec::new();
    for d in &allocation.devices {
        let gpu = match d {
            AllocatedDevice::Gpu { address, .. } => Some(*address),
            AllocatedDevice::Vgpu { gpu, parent, .. } => {
                gpu.or_else(|| graded.parent(parent).and_then(|p| p.gpu))
            }
        };
        gpus.extend(gpu.filter(|g| !gpus.contains(g)));
    }
    let mut warnings = Vec::new();
    for gpu in &gpus {
        let verdict = graded.check_gpu_handout(gpu, force, force_hint);
        let warning = verdict.map_err(|source| RealizeError::Unhealthy {
            machine: allocation.machine.clone(),
            source,
        })?;
        warnings.extend(warning);
    }
    Ok(warnings)
}

/// What every front-end's realize answers ([`Node::realize_graded`]): what [`Node::realize`]
/// did, its warnings led by the health rule's, and the allocation as realized (`status:
/// created`, what a scheduler records, as `gpu-sched`'s `mark_created` does).
#[derive(Debug, Clone, Serialize)]
pub struct RealizedAllocation {
    /// What the realize did (`machine`, `node`, `changed`, `devices`, `handoff`, `warnings`).
    #[serde(flatten)]
    pub done: Realized,
    /// The allocation, `status: created`.
    pub allocation: Allocation,
}

impl Node<'_> {
    /// The realize of `gpuslice realize` and of the agent's `POST /v1/realize` alike: the health
    /// rule of a bind ([`check_health`], on `graded`, this node with its health graded; `force`
    /// uses an Unhealthy GPU with a warning, `force_hint` says how the front-end forces), then
    /// [`Node::realize`]. Another node's allocation is refused by the realize itself, whatever
    /// the health here.
    ///
    /// # Errors
    /// [`RealizeError::Unhealthy`] (nothing changed); what [`Node::realize`] returns.
    pub fn realize_graded(
        &self,
        allocation: &Allocation,
        graded: &NodeTopology,
        force: bool,
        force_hint: &'static str,
    ) -> Result<RealizedAllocation, RealizeError> {
        let mut warnings = match allocation.node == graded.node {
            true => check_health(allocation, graded, force, force_hint)?,
            false => Vec::new(),
        };
        let mut done = self.realize(allocation)?;
        warnings.append(&mut done.warnings);
        done.warnings = warnings;
        let status = AllocationStatus::Created;
        let allocation = Allocation {
            status,
            ..allocation.clone()
        };
        Ok(RealizedAllocation { done, allocation })
    }
}

/// One write of the allocation, checked.
struct Step<'a> {
    device: &'a AllocatedDevice,
    /// Already there as the allocation says: nothing to write.
    there: bool,
    /// A MIG-backed type its parent does not list yet: its GPU instance is made first.
    unlisted: bool,
}

/// A change this call made, to undo.
enum Made {
    Vgpu(VgpuId),
    Gpu(PciAddress),
    /// A GPU instance made for a MIG-backed vGPU (GPU, ID).
    Instance(PciAddress, u32),
}

impl std::fmt::Display for Made {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Made::Vgpu(VgpuId::Mdev(u)) => write!(f, "mdev {u}"),
            Made::Vgpu(VgpuId::Vf(vf)) => write!(f, "the vGPU type of VF {vf}"),
            Made::Gpu(g) => write!(f, "{g} on vfio-pci"),
            Made::Instance(g, id) => write!(f, "GPU instance {id} of {g}"),
        }
    }
}

impl Node<'_> {
    /// Makes the devices of `allocation` on this node and hands them off; see the [module
    /// documentation](crate::realize). A refusal, or an allocation already realized, writes
    /// nothing and takes no lock.
    ///
    /// # Errors
    /// [`RealizeError::OtherNode`], [`RealizeError::Discover`], [`RealizeError::Check`],
    /// [`RealizeError::UnknownProfile`], [`RealizeError::Taken`], [`RealizeError::NoRoom`]
    /// before anything is written; [`RealizeError::Node`] for the lock or the intent record;
    /// [`RealizeError::Write`] and [`RealizeError::Readback`] after an undo.
    pub fn realize(&self, allocation: &Allocation) -> Result<Realized, RealizeError> {
        self.realize_starting(allocation, &InstanceStarts::of(allocation))
    }

    /// [`Node::realize`] with the GPU-instance start of some MIG-backed devices given
    /// (`starts`): their instances are made there, or the realize is refused naming the start.
    ///
    /// # Errors
    /// As [`Node::realize`]; [`RealizeError::Mig`] before anything is written.
    pub fn realize_starting(
        &self,
        allocation: &Allocation,
        starts: &InstanceStarts,
    ) -> Result<Realized, RealizeError> {
        let this = &self.discover.node;
        if allocation.node != *this {
            return Err(RealizeError::OtherNode {
                machine: allocation.machine.clone(),
                node: allocation.node.clone(),
                this: this.clone(),
            });
        }
        let steps = checked_steps(self.host, allocation, &self.read(allocation)?)?;
        self.check_mig(allocation, &steps, starts)?;
        if steps.iter().all(|s| s.there) {
            return self.answer(allocation, Vec::new(), &mut Vec::new());
        }
        let _lock = self.acquire()?;
        // Checked again under the lock: another writer may have changed the node meanwhile.
        let steps = checked_steps(self.host, allocation, &self.read(allocation)?)?;
        self.check_mig(allocation, &steps, starts)?;
        let what = steps.iter().map(|s| describe(s.device)).collect::<Vec<_>>();
        let what = format!(
            "realize Machine {}: {}",
            allocation.machine,
            what.join(", ")
        );
        let check = "`gpuslice topology` and `gpuslice vgpu list` (a device of the Machine may be \
                     there without its VM); `gpuslice realize` again finishes it";
        let creates = steps
            .iter()
            .filter(|s| !s.there)
            .filter_map(|s| planned(s.device));
        let intent = Intent::new("realize", what, check).creating(creates.collect());
        intent::around(self.host, intent, RealizeError::left, || {
            let mut made = Vec::new();
            let devices = self.write_steps(allocation, &steps, starts, &mut made)?;
            self.answer(allocation, devices, &mut made)
        })
    }

    fn read(&self, allocation: &Allocation) -> Result<NodeTopology, RealizeError> {
        gpu_sysfs::discover::discover(self.host, self.discover).map_err(|e| {
            RealizeError::Discover {
                machine: allocation.machine.clone(),
                node: self.discover.node.clone(),
                source: Box::new(e),
            }
        })
    }

    /// Makes each device in order; on a failure undoes what `made` holds.
    fn write_steps(
        &self,
        allocation: &Allocation,
        steps: &[Step<'_>],
        starts: &InstanceStarts,
        made: &mut Vec<Made>,
    ) -> Result<Vec<RealizedDevice>, RealizeError> {
        let mut out = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let instance = match step.there {
                true => Ok(None),
                false => mig_realize::before_device(self, allocation, i, starts)
                    .map_err(|e| NodeError::Mig(Box::new(e))),
            };
            let written = instance.and_then(|gi| {
                if let Some((gpu, gi)) = gi {
                    made.push(Made::Instance(gpu, gi.id));
                }
                write_one(self.host, step.device, made)
            });
            match written {
                Ok(d) => out.push(d),
                Err(source) => {
                    return Err(RealizeError::Write {
                        machine: allocation.machine.clone(),
                        request: step.device.request().to_owned(),
                        source: Box::new(source),
                        left: undo(self, made),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Re-reads the node, checks the hand-off and answers; a hand-off refused undoes `made`.
    /// `devices` empty: nothing was written, each device is reported as found.
    fn answer(
        &self,
        allocation: &Allocation,
        mut devices: Vec<RealizedDevice>,
        made: &mut Vec<Made>,
    ) -> Result<Realized, RealizeError> {
        let after = self.read(allocation)?;
        let checked = handoff::allocation_handoff(allocation, &after, Some(self.host), false);
        let (vm, warnings) = checked.map_err(|source| RealizeError::Readback {
            machine: allocation.machine.clone(),
            source: Box::new(source),
            left: undo(self, made),
        })?;
        if devices.is_empty() {
            // Already there: the answers the create and bind give, on a probe that refuses
            // every change (none is needed; one tried means the node changed meanwhile).
            let (probe, mut none) = (Probe::new(self.host), Vec::new());
            devices = allocation
                .devices
                .iter()
                .map(|d| write_one(&probe, d, &mut none))
                .collect::<Result<_, _>>()
                .map_err(RealizeError::Node)?;
        }
        Ok(Realized {
            machine: allocation.machine.clone(),
            node: allocation.node.clone(),
            changed: devices.iter().any(RealizedDevice::changed),
            devices,
            handoff: VmHandoff::of(&vm),
            warnings,
        })
    }
}

/// What a device's step creates, as the intent record names it for an undo.
fn planned(d: &AllocatedDevice) -> Option<Planned> {
    match d {
        AllocatedDevice::Gpu { address, .. } => Some(Planned::GpuBind { gpu: *address }),
        AllocatedDevice::Vgpu {
            uuid,
            framework: VgpuFramework::Mdev,
            ..
        } => Some(Planned::Mdev { uuid: *uuid }),
        AllocatedDevice::Vgpu { parent, .. } => match parent {
            ParentId::Pci(vf) => Some(Planned::VfType { vf: *vf }),
            _ => None,
        },
    }
}

/// How a device's step reads in the intent record.
fn describe(d: &AllocatedDevice) -> String {
    match d {
        AllocatedDevice::Gpu { address, .. } => format!("bind {address} to vfio-pci"),
        AllocatedDevice::Vgpu {
            parent,
            profile_name,
            uuid,
            framework: VgpuFramework::Mdev,
            ..
        } => format!("create {profile_name} mdev {uuid} on {parent}"),
        AllocatedDevice::Vgpu {
            parent,
            profile_name,
            ..
        } => format!("set {profile_name} on VF {parent}"),
    }
}

/// The checks before the first write, on `node` as read now: every device there as the
/// allocation says ([`handoff::check_allocation`]), each whole GPU free for a VM, each profile
/// offered, each vGPU identity free (or already what the allocation says), room on each parent.
fn checked_steps<'a>(
    host: &dyn Host,
    allocation: &'a Allocation,
    node: &NodeTopology,
) -> Result<Vec<Step<'a>>, RealizeError> {
    let machine = || allocation.machine.clone();
    let refused = |source| RealizeError::Check {
        machine: machine(),
        source: Box::new(source),
    };
    handoff::check_allocation(allocation, node).map_err(refused)?;
    let mut wanted: BTreeMap<(ParentId, String), u32> = BTreeMap::new();
    let mut steps = Vec::new();
    for device in &allocation.devices {
        let there = match device {
            AllocatedDevice::Gpu { address, .. } => {
                // Blocked, open, or hosting vGPUs or VFs: refused. Still on its host driver is
                // what the bind is for.
                let gpu = [VmDevice::Pci { address: *address }];
                handoff::check_devices(node, &gpu, Some(host), false).map_err(refused)?;
                let driver = node
                    .gpu_by_address(address)
                    .and_then(|g| g.driver.as_deref());
                driver == Some("vfio-pci")
            }
            AllocatedDevice::Vgpu {
                request,
                parent,
                profile,
                uuid,
                framework,
                ..
            } => {
                let p = node
                    .mediated_devices
                    .parents
                    .iter()
                    .find(|p| &p.id == parent);
                let offered = p.and_then(|p| p.profiles.iter().find(|x| &x.id == profile));
                let taken = |why| RealizeError::Taken {
                    machine: machine(),
                    request: request.clone(),
                    why,
                };
                if offered.is_none() && mig_realize::is_mig_backed(device) {
                    // Its GPU instance does not exist yet: made first (checked by check_mig).
                    let there =
                        vgpu_there(node, parent, profile, uuid, *framework).map_err(taken)?;
                    steps.push(Step {
                        device,
                        there,
                        unlisted: !there,
                    });
                    continue;
                }
                let Some(offered) = offered else {
                    return Err(RealizeError::UnknownProfile {
                        machine: machine(),
                        request: request.clone(),
                        parent: parent.clone(),
                        profile: profile.to_string(),
                    });
                };
                let there = vgpu_there(node, parent, profile, uuid, *framework).map_err(taken)?;
                if !there {
                    let n = wanted
                        .entry((parent.clone(), profile.to_string()))
                        .or_default();
                    *n += 1;
                    if *n > offered.available_instances {
                        return Err(RealizeError::NoRoom {
                            machine: machine(),
                            parent: parent.clone(),
                            profile: offered.name.clone(),
                            free: offered.available_instances,
                            wanted: *n,
                        });
                    }
                }
                there
            }
        };
        steps.push(Step {
            device,
            there,
            unlisted: false,
        });
    }
    Ok(steps)
}

/// Whether the vGPU is already on the node as the allocation says; `Err` naming what holds its
/// identity otherwise.
fn vgpu_there(
    node: &NodeTopology,
    parent: &ParentId,
    profile: &gpu_core::VgpuTypeId,
    uuid: &MdevUuid,
    framework: VgpuFramework,
) -> Result<bool, String> {
    let parents = &node.mediated_devices.parents;
    if framework == VgpuFramework::VendorVfio {
        let Some(held) = parents
            .iter()
            .find(|p| &p.id == parent)
            .and_then(|p| p.instances.first())
        else {
            return Ok(false);
        };
        return match &held.profile == profile {
            true => Ok(true),
            false => Err(format!(
                "VF {parent} already holds vGPU type {}",
                held.profile
            )),
        };
    }
    for p in parents {
        if let Some(i) = p.instances.iter().find(|i| i.uuid.as_ref() == Some(uuid)) {
            return match &p.id == parent && &i.profile == profile {
                true => Ok(true),
                false => Err(format!("mdev {uuid} exists as {} on {}", i.profile, p.id)),
            };
        }
    }
    Ok(false)
}

/// Makes one device as `vgpu create` and `gpu bind` do; a change made is pushed on `made`.
fn write_one(
    host: &dyn Host,
    device: &AllocatedDevice,
    made: &mut Vec<Made>,
) -> Result<RealizedDevice, NodeError> {
    match device {
        AllocatedDevice::Gpu {
            request, address, ..
        } => {
            let binding = bind_at(host, address)?;
            if binding.changed() {
                made.push(Made::Gpu(*address));
            }
            Ok(RealizedDevice::Gpu {
                request: request.clone(),
                binding,
            })
        }
        AllocatedDevice::Vgpu {
            request,
            index,
            parent,
            profile,
            uuid,
            framework,
            ..
        } => {
            let mdev = (*framework == VgpuFramework::Mdev).then_some(*uuid);
            // The parent is the one discovery found: never a GPU name to look up.
            let not_a_parent = |gpu: &str| {
                Err(NodeError::Choose(Box::new(ActuateError::NotAParent {
                    parent: parent.to_string(),
                    gpu: gpu.to_owned(),
                })))
            };
            let target =
                choose_target(host, parent, profile.as_str(), mdev.as_ref(), not_a_parent)?;
            let target = target.for_uuid(host, mdev.as_ref())?;
            let created = create_at(host, &target, mdev, false)?;
            match &created {
                Created::Mdev(m) if m.changed => made.push(Made::Vgpu(VgpuId::Mdev(m.uuid))),
                Created::VendorVfio(v) if v.changed => made.push(Made::Vgpu(VgpuId::Vf(v.vf))),
                _ => {}
            }
            Ok(RealizedDevice::Vgpu {
                request: request.clone(),
                index: *index,
                created,
            })
        }
    }
}

/// Undoes `made` in reverse; what could not be undone, named.
fn undo(node: &Node<'_>, made: &mut Vec<Made>) -> Vec<String> {
    let host = node.host;
    let mut left = Vec::new();
    while let Some(m) = made.pop() {
        let undone = match &m {
            Made::Vgpu(id) => remove_at(host, id, false).map(|_| ()),
            Made::Gpu(g) => release_at(host, g, false).map(|_| ()),
            Made::Instance(g, id) => match node.nvml_handle() {
                Some(nvml) => node.mig(nvml).unmake(g, *id),
                None => Ok(()),
            }
            .map_err(|e| NodeError::Mig(Box::new(e))),
        };
        if let Err(e) = undone {
            left.push(format!("{m} ({})", gpu_core::error_chain(&e)));
        }
    }
    left
}

impl Node<'_> {
    /// What MIG needs for the MIG-backed vGPUs still to be made, checked before any write
    /// ([`mig_realize::check_todo`]).
    fn check_mig(
        &self,
        allocation: &Allocation,
        steps: &[Step<'_>],
        starts: &InstanceStarts,
    ) -> Result<(), RealizeError> {
        let todo = steps.iter().enumerate().filter(|(_, s)| !s.there);
        let todo: Vec<(usize, bool)> = todo.map(|(i, s)| (i, s.unlisted)).collect();
        let machine = allocation.machine.clone();
        mig_realize::check_todo(self, allocation, &todo, starts).map_err(|r| match r {
            TodoRefusal::Mig(e) => RealizeError::Mig {
                machine,
                source: Box::new(e),
            },
            TodoRefusal::Unlisted {
                request,
                parent,
                profile,
            } => RealizeError::UnknownProfile {
                machine,
                request,
                parent,
                profile,
            },
        })
    }
}
