//! vGPU parents: mdev parents with their types and instances, and NVIDIA vendor-specific VFIO VFs.

use std::collections::{BTreeMap, BTreeSet};

use gpu_core::{Gpu, Instance, MdevUuid, ParentId, PciAddress, Profile, VgpuFramework, VgpuTypeId};

use super::parse;
use super::pci::{self, PciTable};
use super::read;
use crate::resolver::TypeNameResolver;

/// The class view of mdev parents.
pub(crate) const MDEV_BUS: &str = "sys/class/mdev_bus";
/// The bus view of mdev instances.
pub(crate) const MDEV_DEVICES: &str = "sys/bus/mdev/devices";

/// What one mdev type directory says, shared by every parent of the same driver: a type
/// directory name identifies the type for the whole loaded driver, so `name`, `description` and
/// `device_api` are read once per driver and type, and only `available_instances` per parent.
#[derive(Debug, Clone)]
pub(crate) struct TypeFacts {
    name: String,
    description: Option<String>,
    device_api: String,
    framebuffer_mib: Option<u64>,
    max_instances: Option<u32>,
    mig_slices: Option<u8>,
    mig_memory_gib: Option<u32>,
}

/// Type facts already read, by driver key (a host has one or two) and type directory name.
#[derive(Debug, Default)]
pub(crate) struct FactsCache(Vec<(String, BTreeMap<String, TypeFacts>)>);

impl FactsCache {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The facts of type `t` of `driver`, when read.
    fn get(&self, driver: &str, t: &str) -> Option<&TypeFacts> {
        self.0.iter().find(|(d, _)| d == driver)?.1.get(t)
    }

    /// The facts of type `t` of `driver`, read with `read` the first time they are asked for
    /// (the keys are allocated only then).
    fn get_or_read(
        &mut self,
        driver: &str,
        t: &str,
        read: impl FnOnce() -> TypeFacts,
    ) -> &TypeFacts {
        let i = match self.0.iter().position(|(d, _)| d == driver) {
            Some(i) => i,
            None => {
                self.0.push((driver.to_owned(), BTreeMap::new()));
                self.0.len() - 1
            }
        };
        let types = &mut self.0[i].1;
        if !types.contains_key(t) {
            types.insert(t.to_owned(), read());
        }
        &types[t]
    }
}

/// Parents found on the host, before filtering and pool capping.
#[derive(Debug, Default)]
pub(crate) struct VgpuScan {
    pub parents: Vec<gpu_core::Parent>,
    pub node_warnings: Vec<String>,
    /// Per NVIDIA GPU, its VFs bound to another driver than `nvidia`.
    pub other_driver_vfs: BTreeMap<PciAddress, Vec<gpu_core::VfDriver>>,
    /// Per NVIDIA GPU, its VFs whose vGPU state cannot be read.
    pub unreadable_vfs: BTreeMap<PciAddress, Vec<gpu_core::UnreadableVf>>,
}

fn profile_from_facts(id: VgpuTypeId, f: &TypeFacts, reported: u32) -> Profile {
    Profile {
        id,
        name: f.name.clone(),
        framebuffer_mib: f.framebuffer_mib,
        max_instances: f.max_instances,
        available_instances: reported,
        reported_instances: Some(reported),
        device_api: f.device_api.clone(),
        mig_slices: f.mig_slices,
        mig_memory_gib: f.mig_memory_gib,
        description: f.description.clone(),
    }
}

/// The GPU a PCI parent belongs to: its PF for a VF, itself otherwise.
fn physical_gpu(pci: &mut PciTable<'_>, a: &PciAddress) -> PciAddress {
    pci.physfn(a).unwrap_or(*a)
}

/// A parent's physical GPU and the key its type directories are shared under: the driver of
/// the physical GPU (its VFs are served by the same driver), or the virtual parent's own name.
pub(crate) fn parent_identity(
    pci: &mut PciTable<'_>,
    id: &ParentId,
) -> (Option<PciAddress>, String) {
    match id {
        ParentId::Pci(a) => {
            let gpu = physical_gpu(pci, a);
            let driver = pci
                .driver(&gpu)
                .unwrap_or_else(|| format!("(no driver on {gpu})"));
            (Some(gpu), driver)
        }
        ParentId::Named(n) => (None, n.clone()),
    }
}

impl VgpuScan {
    /// Reads the mdev parents, their types and all mdev instances.
    pub fn mdev(&mut self, pci: &mut PciTable<'_>) {
        let host = pci.host;
        let mut facts = FactsCache::new();
        let mut by_entry: BTreeMap<String, usize> = BTreeMap::new();
        let mut driver_of: Vec<String> = Vec::new();
        for entry in read::list(host, MDEV_BUS, &mut self.node_warnings) {
            let Some(id) = read::name_as::<ParentId>(
                &entry,
                format_args!("{MDEV_BUS}/{entry}"),
                &mut self.node_warnings,
            ) else {
                continue;
            };
            let (gpu, driver_key) = parent_identity(pci, &id);
            let parent = read_mdev_parent(host, &entry, id, gpu, &driver_key, &mut facts);
            by_entry.insert(entry, self.parents.len());
            driver_of.push(driver_key);
            self.parents.push(parent);
        }

        for u in read::list(host, MDEV_DEVICES, &mut self.node_warnings) {
            let Some(uuid) = read::name_as::<MdevUuid>(
                &u,
                format_args!("{MDEV_DEVICES}/{u}"),
                &mut self.node_warnings,
            ) else {
                continue;
            };
            let path = format!("{MDEV_DEVICES}/{u}");
            let Some(target) = read::link_target(host, &path, &mut self.node_warnings) else {
                continue;
            };
            let mut comps = target.trim_end_matches('/').rsplit('/');
            let _self_name = comps.next();
            let Some(parent_entry) = comps.next().map(str::to_owned) else {
                self.node_warnings
                    .push(format!("{path}: link target {target:?} names no parent"));
                continue;
            };
            let idx = match by_entry.get(&parent_entry) {
                Some(i) => *i,
                None => {
                    // An instance whose parent is missing from the class view: keep it, so the
                    // pool still counts what it uses.
                    let Some(id) =
                        read::name_as::<ParentId>(&parent_entry, &path, &mut self.node_warnings)
                    else {
                        continue;
                    };
                    let (gpu, driver_key) = parent_identity(pci, &id);
                    self.parents.push(gpu_core::Parent {
                        id,
                        gpu,
                        framework: VgpuFramework::Mdev,
                        health: gpu_core::Health::unknown(),
                        profiles: vec![],
                        instances: vec![],
                        warnings: vec![format!(
                            "{MDEV_BUS}/{parent_entry}: missing, although mdev {uuid} has it as parent"
                        )],
                    });
                    driver_of.push(driver_key);
                    by_entry.insert(parent_entry.clone(), self.parents.len() - 1);
                    self.parents.len() - 1
                }
            };
            let parent = &mut self.parents[idx];
            if let Some(i) = read_instance(host, parent, uuid, &path, &driver_of[idx], &facts) {
                parent.instances.push(i);
            }
        }
    }

    /// Reads the vendor-specific VFIO VFs of NVIDIA GPUs: per VF the creatable types and the
    /// current type. Returns the GPUs (PF addresses) found using the framework.
    pub fn vendor_vfio(
        &mut self,
        pci: &mut PciTable<'_>,
        gpus: &[Gpu],
        resolver: Option<&dyn TypeNameResolver>,
    ) -> BTreeSet<PciAddress> {
        let host = pci.host;
        let mdev_parents: BTreeSet<ParentId> = self.parents.iter().map(|p| p.id.clone()).collect();
        let mut found = BTreeSet::new();
        let mut names: BTreeMap<u32, String> = BTreeMap::new();
        let mut pending: Vec<(usize, PciAddress, u32)> = Vec::new();
        for g in gpus {
            if g.vendor != gpu_core::Vendor::Nvidia {
                continue;
            }
            let Some(sriov) = &g.sriov else { continue };
            for vf in &sriov.vfs {
                if mdev_parents.contains(&ParentId::Pci(*vf)) {
                    continue;
                }
                let d = pci::dir(vf);
                let mut warnings = Vec::new();
                let cur_path = format!("{d}/nvidia/current_vgpu_type");
                let cur_text = read::text(host, &cur_path, &mut warnings);
                if cur_text.is_none() && warnings.is_empty() {
                    // No vendor-VFIO files: not this framework, or a VF another driver holds
                    // (the nvidia driver makes those files when it binds the VF).
                    if let Some(driver) = pci.driver(vf).filter(|d| d != "nvidia") {
                        self.other_driver_vfs.entry(g.address).or_default().push(
                            gpu_core::VfDriver {
                                address: *vf,
                                driver,
                            },
                        );
                    }
                    continue;
                }
                found.insert(g.address);
                let current = match cur_text.map(|t| parse::parse_current_vgpu_type(&t, &cur_path))
                {
                    Some(Ok(c)) => Some(c),
                    Some(Err(e)) => {
                        warnings.push(e.to_string());
                        None
                    }
                    None => None,
                };
                let Some(current) = current else {
                    // Whether it holds a vGPU cannot be told: not a free VF, not an instance.
                    // Reported and left out, so no consumer offers it or plans a type on it.
                    self.unreadable_vfs.entry(g.address).or_default().push(
                        gpu_core::UnreadableVf {
                            address: *vf,
                            error: warnings.join("; "),
                        },
                    );
                    self.node_warnings.push(format!(
                        "VF {vf} of GPU {}: skipped, its vGPU type cannot be read ({}); it is \
                         neither offered nor planned until it can",
                        g.address,
                        warnings.join("; ")
                    ));
                    continue;
                };
                let current = Some(current);
                let list_path = format!("{d}/nvidia/creatable_vgpu_types");
                let listed = read::parsed(
                    host,
                    &list_path,
                    &mut warnings,
                    parse::parse_creatable_vgpu_types,
                )
                .unwrap_or_default();
                // A VF that already holds a type (or whose type could not be read) takes no other.
                let reported = u32::from(current == Some(0));
                let mut profiles = Vec::new();
                for (id, name) in &listed {
                    names.entry(*id).or_insert_with(|| name.clone());
                    let (fb, slices, mig_gib) = match parse::facts_from_type_name(name) {
                        Some((fb, s, m)) => (Some(fb), s, m),
                        None => (None, None, None),
                    };
                    let max_instances = resolver
                        .and_then(|r| r.resolve(&g.address, *id))
                        .and_then(|i| i.max_instances);
                    profiles.push(Profile {
                        id: VgpuTypeId::vendor_vfio(*id),
                        name: name.clone(),
                        framebuffer_mib: fb,
                        max_instances,
                        available_instances: reported,
                        reported_instances: Some(reported),
                        device_api: "vfio-pci".to_owned(),
                        mig_slices: slices,
                        mig_memory_gib: mig_gib,
                        description: None,
                    });
                }
                let idx = self.parents.len();
                self.parents.push(gpu_core::Parent {
                    id: ParentId::Pci(*vf),
                    gpu: Some(g.address),
                    framework: VgpuFramework::VendorVfio,
                    health: gpu_core::Health::unknown(),
                    profiles,
                    instances: vec![],
                    warnings,
                });
                if let Some(c) = current.filter(|c| *c != 0) {
                    pending.push((idx, g.address, c));
                }
            }
        }
        // Instances last: their type may be listed only by another VF of the host.
        for (idx, gpu, id) in pending {
            let vf = self.parents[idx].id.pci();
            let info = match names.get(&id) {
                Some(n) => Some(crate::resolver::TypeInfo {
                    name: n.clone(),
                    framebuffer_mib: parse::facts_from_type_name(n).map(|f| f.0),
                    max_instances: None,
                }),
                None => resolver.and_then(|r| r.resolve(&gpu, id)),
            };
            let placement_id = vf.and_then(|a| crate::actuate::vendor::placement_id(host, &a));
            let parent = &mut self.parents[idx];
            if info.is_none() {
                parent.warnings.push(format!(
                    "vGPU type {id} is set but no VF lists it and no resolver knows it; its name and size are unknown"
                ));
            }
            parent.instances.push(Instance {
                uuid: None,
                address: vf,
                profile: VgpuTypeId::vendor_vfio(id),
                profile_name: info.as_ref().map(|i| i.name.clone()),
                framebuffer_mib: info.as_ref().and_then(|i| {
                    i.framebuffer_mib
                        .or_else(|| parse::facts_from_type_name(&i.name).map(|f| f.0))
                }),
                in_use: None,
                placement_id,
            });
        }
        found
    }
}

fn read_type_facts(
    host: &dyn crate::host::Host,
    tdir: &str,
    dir_name: &str,
    warnings: &mut Vec<String>,
) -> TypeFacts {
    let name = read::text(host, &format!("{tdir}/name"), warnings)
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| dir_name.to_owned());
    let description = read::text(host, &format!("{tdir}/description"), warnings);
    let device_api =
        read::text(host, &format!("{tdir}/device_api"), warnings).unwrap_or_else(|| {
            warnings.push(format!("{tdir}/device_api: missing"));
            String::new()
        });
    let desc = match &description {
        Some(d) => match parse::parse_description(d, &format!("{tdir}/description")) {
            Ok(v) => v,
            Err(e) => {
                warnings.push(e.to_string());
                Default::default()
            }
        },
        None => Default::default(),
    };
    let from_name = parse::facts_from_type_name(&name);
    TypeFacts {
        framebuffer_mib: desc.instance_mib().or(from_name.map(|f| f.0)),
        max_instances: desc.max_instance,
        mig_slices: from_name.and_then(|f| f.1),
        mig_memory_gib: from_name.and_then(|f| f.2),
        name,
        description,
        device_api,
    }
}

/// Reads one mdev parent of the class view (`entry`): its types, with the facts shared per
/// driver and type read once into `facts`, and each type's own `available_instances`.
pub(crate) fn read_mdev_parent(
    host: &dyn crate::host::Host,
    entry: &str,
    id: ParentId,
    gpu: Option<PciAddress>,
    driver_key: &str,
    facts: &mut FactsCache,
) -> gpu_core::Parent {
    let mut parent = gpu_core::Parent {
        id,
        gpu,
        framework: VgpuFramework::Mdev,
        health: gpu_core::Health::unknown(),
        profiles: vec![],
        instances: vec![],
        warnings: vec![],
    };
    let types_dir = format!("{MDEV_BUS}/{entry}/mdev_supported_types");
    let types = match host.list(&types_dir) {
        Ok(t) => t,
        Err(e) => {
            parent.warnings.push(format!("{types_dir}: {e}"));
            Vec::new()
        }
    };
    parent.profiles.reserve(types.len());
    // One path for every type's files: `<types_dir>/<type>` and the file below it.
    let mut path = types_dir.clone();
    for t in types {
        let Some(tid) =
            read::name_as::<VgpuTypeId>(&t, format_args!("{types_dir}/{t}"), &mut parent.warnings)
        else {
            continue;
        };
        path.truncate(types_dir.len());
        path.push('/');
        path.push_str(&t);
        let f = facts.get_or_read(driver_key, &t, || {
            read_type_facts(host, &path, &t, &mut parent.warnings)
        });
        path.push_str("/available_instances");
        let reported = read::parsed(host, &path, &mut parent.warnings, parse::parse_u32);
        let Some(reported) = reported else {
            if !parent.warnings.iter().any(|w| w.starts_with(path.as_str())) {
                parent.warnings.push(format!("{path}: missing"));
            }
            parent.profiles.push(profile_from_facts(tid, f, 0));
            continue;
        };
        parent.profiles.push(profile_from_facts(tid, f, reported));
    }
    parent
}

/// Reads one mdev instance at `path` (its directory, through any view) of `parent`: the type
/// its `mdev_type` link names, sized from the facts of the parent's driver. `None` (with a
/// warning on the parent) when the type cannot be read.
pub(crate) fn read_instance(
    host: &dyn crate::host::Host,
    parent: &mut gpu_core::Parent,
    uuid: MdevUuid,
    path: &str,
    driver_key: &str,
    facts: &FactsCache,
) -> Option<Instance> {
    let type_path = format!("{path}/mdev_type");
    let Some(t) = read::link_name(host, &type_path, &mut parent.warnings) else {
        parent.warnings.push(format!(
            "{type_path}: missing; the instance's type is unknown"
        ));
        return None;
    };
    let tid = read::name_as::<VgpuTypeId>(&t, &type_path, &mut parent.warnings)?;
    // Keyed by driver, not parent: the type is found even when this parent's own type
    // directory is missing (a partial recording).
    let f = facts.get(driver_key, &t);
    if f.is_none() {
        parent.warnings.push(format!(
            "mdev {uuid}: type {t} is not listed by any parent of driver {driver_key}; its size is unknown"
        ));
    }
    Some(Instance {
        uuid: Some(uuid),
        address: None,
        profile: tid,
        profile_name: f.map(|f| f.name.clone()),
        framebuffer_mib: f.and_then(|f| f.framebuffer_mib),
        in_use: None,
        placement_id: None,
    })
}
