//! Resolving requested type names on one GPU: the GPU's view (parents, instances, known types).

use super::*;

/// A type a GPU knows: listed by a parent, or held by an instance.
#[derive(Debug, Clone)]
pub(super) struct Known {
    pub(super) id: VgpuTypeId,
    pub(super) name: String,
    pub(super) profile: Profile,
}

/// A requested type resolved on one GPU.
#[derive(Debug, Clone)]
pub(super) struct Resolved {
    pub(super) requested: String,
    pub(super) count: u32,
    pub(super) id: Option<VgpuTypeId>,
    pub(super) name: String,
    pub(super) profile: Profile,
}

/// One GPU (or one virtual mdev parent) with its parents, instances and known types.
pub(super) struct View<'a> {
    /// The physical GPU; `None` for a virtual parent such as `mbochs`.
    pub(super) gpu: Option<&'a Gpu>,
    /// The pool key: the GPU's address or the virtual parent's name.
    pub(super) key: ParentId,
    /// The GPU's per-node name, or the virtual parent's name.
    pub(super) name: String,
    pub(super) label: String,
    pub(super) parents: Vec<&'a Parent>,
    pub(super) known: Vec<Known>,
    /// Vendor-VFIO types other sources name (remembered names, NVML) that neither a listing
    /// nor an instance of this GPU does.
    pub(super) named_elsewhere: Vec<Known>,
}

impl<'a> View<'a> {
    pub(super) fn new(topology: &'a NodeTopology, gpu: &'a Gpu) -> Self {
        let parents: Vec<&Parent> = topology
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(gpu.address))
            .collect();
        Self::with_parents(
            Some(gpu),
            ParentId::Pci(gpu.address),
            gpu.name.clone(),
            format!("{} ({})", gpu.name, gpu.address),
            parents,
        )
    }

    /// A virtual mdev parent: its own pool, its driver's own type names.
    pub(super) fn named(parent: &'a Parent) -> Self {
        let name = parent.id.to_string();
        Self::with_parents(None, parent.id.clone(), name.clone(), name, vec![parent])
    }

    pub(super) fn with_parents(
        gpu: Option<&'a Gpu>,
        key: ParentId,
        name: String,
        label: String,
        mut parents: Vec<&'a Parent>,
    ) -> Self {
        parents.sort_by(|a, b| a.id.cmp(&b.id));
        let mut known: Vec<Known> = Vec::new();
        for p in &parents {
            for pr in &p.profiles {
                if !known.iter().any(|k| k.id == pr.id) {
                    known.push(Known {
                        id: pr.id.clone(),
                        name: pr.name.clone(),
                        profile: complete(pr.clone()),
                    });
                }
            }
        }
        for p in &parents {
            for i in &p.instances {
                if known.iter().any(|k| k.id == i.profile) {
                    continue;
                }
                if let Some(name) = &i.profile_name {
                    known.push(Known {
                        id: i.profile.clone(),
                        name: name.clone(),
                        profile: synth_profile(&i.profile, name, i.framebuffer_mib),
                    });
                }
            }
        }
        View {
            gpu,
            key,
            name,
            label,
            parents,
            known,
            named_elsewhere: Vec::new(),
        }
    }

    /// Adds the names other sources know, for a vendor-VFIO GPU (type numbers are the driver's,
    /// one numbering per host, so a name for another board never resolves here: see
    /// [`View::boards`]).
    pub(super) fn with_names(mut self, names: &TypeNames) -> Self {
        if self.gpu.is_none() || self.framework() != Some(VgpuFramework::VendorVfio) {
            return self;
        }
        for (n, name) in names {
            let id = VgpuTypeId::vendor_vfio(*n);
            if self.known.iter().any(|k| k.id == id) {
                continue;
            }
            self.named_elsewhere.push(Known {
                profile: synth_profile(&id, name, None),
                id,
                name: name.clone(),
            });
        }
        self
    }

    /// The boards this GPU's types are named for: from the names it lists or holds, else (a
    /// full GPU nothing names) from its PCI device ID; empty when neither says.
    pub(super) fn boards(&self) -> Vec<String> {
        if self.known.is_empty() {
            self.gpu
                .and_then(|g| vgpu_board(g.device_id.0))
                .map(|b| vec![b.to_owned()])
                .unwrap_or_default()
        } else {
            self.known
                .iter()
                .filter_map(|k| VgpuTypeName::parse(&k.name).ok().map(|n| n.board))
                .collect()
        }
    }

    pub(super) fn framework(&self) -> Option<VgpuFramework> {
        self.gpu
            .and_then(|g| g.vgpu_framework)
            .or_else(|| self.parents.first().map(|p| p.framework))
    }

    pub(super) fn instances(&self) -> impl Iterator<Item = (&'a Parent, &'a Instance)> + '_ {
        self.parents
            .iter()
            .flat_map(|p| p.instances.iter().map(move |i| (*p, i)))
    }

    /// Why no layout may touch this GPU, if so: NVIDIA's vGPU manager lives in the PF's
    /// `nvidia` driver, so an NVIDIA GPU on `vfio-pci` (passed through to a VM), another driver
    /// or none gets no `sriov-manage` and no vGPU write.
    pub(super) fn ineligible(&self) -> Option<String> {
        let g = self.gpu?;
        if g.vendor != Vendor::Nvidia || g.driver.as_deref() == Some("nvidia") {
            return None;
        }
        Some(match g.driver.as_deref() {
            Some(d) => format!(
                "{} is bound to {d}, not to nvidia (passed through to a VM?); vGPUs are set up \
                 only on GPUs the nvidia host driver holds",
                g.address
            ),
            None => format!(
                "{} is bound to no driver, not to nvidia; vGPUs are set up only on GPUs the \
                 nvidia host driver holds",
                g.address
            ),
        })
    }

    pub(super) fn needs_sriov(&self) -> bool {
        self.parents.is_empty()
            && self
                .gpu
                .and_then(|g| g.sriov.as_ref())
                .is_some_and(|s| s.total_vfs > 0 && s.num_vfs == 0)
    }

    pub(super) fn offered(&self) -> String {
        if self.known.is_empty() {
            return "nothing".to_owned();
        }
        if self.gpu.is_none() {
            let names: Vec<String> = self
                .known
                .iter()
                .map(|k| {
                    if k.name == k.id.as_str() {
                        k.name.clone()
                    } else {
                        format!("{} ({})", k.name, k.id)
                    }
                })
                .collect();
            return names.join(", ");
        }
        let mut names: Vec<&str> = self.known.iter().map(|k| strip_prefix(&k.name)).collect();
        names.sort_unstable();
        names.dedup();
        names.join(", ")
    }

    /// Resolves a requested name: the exact name first, then the base name without a MIG suffix
    /// (drivers that list only the base type). A vendor-VFIO GPU whose instances fill it lists no
    /// creatable types at all; a name for the same board is then accepted and resolved to an ID
    /// by the executor right before the write.
    pub(super) fn resolve(&self, requested: &str, count: u32) -> Result<Resolved, LayoutError> {
        if self.gpu.is_none() {
            return self.resolve_driver_name(requested, count);
        }
        // Exact names first across every source; a MIG suffix is stripped only when no source
        // knows the exact name (a stripped type is another device: no media engines, no
        // graphics).
        let parsed_board = VgpuTypeName::parse(requested).ok().map(|n| n.board);
        let boards = self.boards();
        let this_board = |b: &Option<String>| {
            b.as_ref().is_some_and(|b| {
                !boards.is_empty() && boards.iter().all(|x| x.eq_ignore_ascii_case(b))
            })
        };
        let found = self
            .known
            .iter()
            .find(|k| names_match(&k.name, requested))
            .or_else(|| {
                self.named_elsewhere
                    .iter()
                    .find(|k| names_match(&k.name, requested) && this_board(&parsed_board))
            })
            .or_else(|| {
                let base = VgpuTypeName::parse(requested).ok()?.base().to_string();
                self.known.iter().find(|k| names_match(&k.name, &base))
            });
        if let Some(k) = found {
            return Ok(Resolved {
                requested: requested.to_owned(),
                count,
                id: Some(k.id.clone()),
                name: k.name.clone(),
                profile: k.profile.clone(),
            });
        }
        let unknown = || LayoutError::UnknownType {
            gpu: self.label.clone(),
            name: requested.to_owned(),
            offered: self.offered(),
        };
        let listing_incomplete = self.framework() == Some(VgpuFramework::VendorVfio)
            && self.instances().next().is_some();
        if !listing_incomplete {
            return Err(unknown());
        }
        let parsed = VgpuTypeName::parse(requested).map_err(|_| unknown())?;
        // A full GPU lists nothing and nothing names its types: its board comes from its PCI
        // device ID, or it cannot be established and the name is refused.
        let same_board =
            !boards.is_empty() && boards.iter().all(|b| b.eq_ignore_ascii_case(&parsed.board));
        if !same_board {
            return Err(LayoutError::WrongBoard {
                gpu: self.label.clone(),
                name: requested.to_owned(),
                board: parsed.board,
                gpu_board: match boards.first() {
                    Some(b) => b.clone(),
                    None => "unknown: no source names its types; pin the type by ID".to_owned(),
                },
            });
        }
        // A MIG-backed name needs a GPU-instance profile of its slice count on this product:
        // one the product does not have can never be written, so nothing is cleared to try.
        let geometry = self
            .gpu
            .and_then(|g| MigGeometry::for_device(g.device_id.0))
            .or_else(|| MigGeometry::for_vgpu_board(&parsed.board));
        if let (Some(slices), Some(g)) = (parsed.mig_slices, geometry) {
            // A name whose memory is not that of the product's instance of its slice count
            // (`H200X-3-40C`: the H200's 3-slice instance holds 71 GB) is no type of this
            // board; refused before anything is cleared to make room for it.
            let gb = parsed.framebuffer_mib() / 1024;
            if let Some(p) = g
                .profile_for(slices, parsed.framebuffer_mib())
                .filter(|p| u64::from(p.memory_gb).abs_diff(gb) * 8 > u64::from(p.memory_gb))
            {
                return Err(LayoutError::Conflict {
                    gpu: self.label.clone(),
                    why: format!(
                        "vGPU type {requested:?} is not a type of the {}: its {slices}-slice GPU \
                         instance is {} ({} GB), not {gb} GB; nothing was changed",
                        g.product, p.name, p.memory_gb
                    ),
                });
            }
            if g.profile_for(slices, parsed.framebuffer_mib()).is_none() {
                let profiles: Vec<&str> = g.profiles.iter().map(|p| p.name).collect();
                return Err(LayoutError::Conflict {
                    gpu: self.label.clone(),
                    why: format!(
                        "vGPU type {requested:?} needs a {slices}-slice MIG GPU instance, which \
                         the {} does not have (its profiles: {}); nothing was changed",
                        g.product,
                        profiles.join(", ")
                    ),
                });
            }
        }
        let mut profile = synth_profile(
            &VgpuTypeId::vendor_vfio(0),
            requested,
            Some(parsed.framebuffer_mib()),
        );
        profile.mig_slices = parsed.mig_slices;
        Ok(Resolved {
            requested: requested.to_owned(),
            count,
            id: None,
            name: requested.to_owned(),
            profile,
        })
    }

    /// A virtual parent's type: its driver's `name` or its type ID, exactly as the driver spells
    /// them (mtty's `mtty-1` is named `Single port serial`).
    pub(super) fn resolve_driver_name(
        &self,
        requested: &str,
        count: u32,
    ) -> Result<Resolved, LayoutError> {
        let t = requested.trim();
        self.known
            .iter()
            .find(|k| k.name == t)
            .or_else(|| self.known.iter().find(|k| k.id.as_str() == t))
            .map(|k| Resolved {
                requested: requested.to_owned(),
                count,
                id: Some(k.id.clone()),
                name: k.name.clone(),
                profile: k.profile.clone(),
            })
            .ok_or_else(|| LayoutError::UnknownType {
                gpu: self.label.clone(),
                name: requested.to_owned(),
                offered: self.offered(),
            })
    }

    pub(super) fn resolve_all(&self, types: &[TypeCount]) -> Result<Vec<Resolved>, LayoutError> {
        let mut out: Vec<Resolved> = Vec::with_capacity(types.len());
        for t in types {
            let r = self.resolve(&t.name, t.count)?;
            if let Some(prev) = out
                .iter()
                .find(|p| p.id.is_some() && p.id == r.id || names_match(&p.name, &r.name))
            {
                return Err(LayoutError::DuplicateType {
                    at: self.label.clone(),
                    first: prev.requested.clone(),
                    second: r.requested,
                    resolved: strip_prefix(&prev.name).to_owned(),
                });
            }
            out.push(r);
        }
        Ok(out)
    }

    pub(super) fn resolve_ref(&self, r: &TypeRef) -> Result<Resolved, LayoutError> {
        match r {
            TypeRef::Name(n) => self.resolve(n, 1),
            TypeRef::Id(id) => self
                .known
                .iter()
                .find(|k| k.id.as_str() == id)
                .map(|k| Resolved {
                    requested: id.clone(),
                    count: 1,
                    id: Some(k.id.clone()),
                    name: k.name.clone(),
                    profile: k.profile.clone(),
                })
                .or_else(|| {
                    // Comparing IDs needs no names: an ID a live vGPU of this GPU holds is
                    // known to exist even when nothing names it.
                    let (_, i) = self.instances().find(|(_, i)| i.profile.as_str() == id)?;
                    Some(Resolved {
                        requested: id.clone(),
                        count: 1,
                        id: Some(i.profile.clone()),
                        name: id.clone(),
                        profile: self.profile_of(i),
                    })
                })
                .map(Ok)
                .or_else(|| {
                    // An ID another source names (NVML, the remembered names) is the request
                    // its name is: resolved, checked and placed as that name, with its ID.
                    let k = self.named_elsewhere.iter().find(|k| k.id.as_str() == id)?;
                    Some(self.resolve(&k.name, 1).map(|mut r| {
                        r.requested = id.clone();
                        r.id = Some(k.id.clone());
                        r
                    }))
                })
                .unwrap_or_else(|| {
                    let offered = self
                        .known
                        .iter()
                        .map(|k| format!("{} = {}", k.id, strip_prefix(&k.name)))
                        .collect::<Vec<_>>()
                        .join(", ");
                    // A full GPU lists nothing: the ID may exist, but nothing says its board
                    // or size, so it is refused with what would name it.
                    let full = self.framework() == Some(VgpuFramework::VendorVfio)
                        && self.parents.iter().all(|p| p.profiles.is_empty());
                    let why = "no VF lists more types and no source (NVML, the names gpuslice \
                               remembered) names this ID, so its board and size cannot be known; \
                               pin it by name";
                    Err(LayoutError::UnknownType {
                        gpu: self.label.clone(),
                        name: id.clone(),
                        offered: match (full, offered.is_empty()) {
                            (false, _) => offered,
                            (true, true) => why.to_owned(),
                            (true, false) => format!("{offered} held; {why}"),
                        },
                    })
                }),
        }
    }

    pub(super) fn profile_of(&self, i: &Instance) -> Profile {
        self.known
            .iter()
            .find(|k| k.id == i.profile)
            .map(|k| k.profile.clone())
            .unwrap_or_else(|| {
                synth_profile(
                    &i.profile,
                    i.profile_name.as_deref().unwrap_or(""),
                    i.framebuffer_mib,
                )
            })
    }

    pub(super) fn name_of(&self, i: &Instance) -> Option<String> {
        i.profile_name.clone().or_else(|| {
            self.known
                .iter()
                .find(|k| k.id == i.profile)
                .map(|k| k.name.clone())
        })
    }

    pub(super) fn planned(&self, p: &Parent, i: &Instance) -> PlannedInstance {
        PlannedInstance {
            framework: p.framework,
            parent: p.id.clone(),
            uuid: i.uuid,
            type_id: Some(i.profile.clone()),
            type_name: self.name_of(i),
            framebuffer_mib: i
                .framebuffer_mib
                .or_else(|| self.profile_of(i).framebuffer_mib),
            in_use: i.in_use,
        }
    }
}

/// Fills a profile's framebuffer and MIG slices from its NVIDIA name when the driver gave none.
pub(super) fn complete(mut p: Profile) -> Profile {
    if let Ok(n) = VgpuTypeName::parse(&p.name) {
        if p.framebuffer_mib.is_none() {
            p.framebuffer_mib = Some(n.framebuffer_mib());
        }
        if p.mig_slices.is_none() {
            p.mig_slices = n.mig_slices;
        }
    }
    p
}

pub(super) fn synth_profile(id: &VgpuTypeId, name: &str, fb: Option<u64>) -> Profile {
    complete(Profile {
        id: id.clone(),
        name: name.to_owned(),
        framebuffer_mib: fb,
        max_instances: None,
        available_instances: 0,
        reported_instances: None,
        device_api: "vfio-pci".to_owned(),
        mig_slices: None,
        mig_memory_gib: None,
        description: None,
    })
}

/// NVIDIA's SR-IOV VFs hold at most one vGPU each; PF and virtual mdev parents hold many.
pub(super) fn single_instance(p: &Parent) -> bool {
    match (p.framework, p.id.pci(), p.gpu) {
        (VgpuFramework::VendorVfio, _, _) => true,
        (VgpuFramework::Mdev, Some(a), Some(g)) => a != g,
        _ => false,
    }
}
