//! Which GPUs (or virtual parents) a config's entries select, and what each should hold.

use super::*;

/// What one selected GPU should hold.
pub(super) enum Target {
    Counts(Vec<TypeCount>),
    Pins(Vec<(PciAddress, Option<TypeRef>)>),
}

/// What an entry selected: a physical GPU, or a virtual mdev parent.
#[derive(Clone, Copy)]
pub(super) enum Subject<'a> {
    Gpu(&'a Gpu),
    Named(&'a Parent),
}

pub(super) struct Selected<'a> {
    pub(super) subject: Subject<'a>,
    pub(super) index: Option<u32>,
    pub(super) entry: String,
    pub(super) target: Target,
}

pub(super) fn select<'a>(
    config: &LayoutConfig,
    topology: &'a NodeTopology,
    mode: Mode,
    names: &TypeNames,
    warnings: &mut Vec<String>,
) -> Result<Vec<Selected<'a>>, LayoutError> {
    let indices = nvidia_indices(&topology.gpus);
    let at = |i: usize| format!("vgpu-configs.{}[{i}]", config.name);
    let mut by_gpu: BTreeMap<PciAddress, Vec<(usize, &Want)>> = BTreeMap::new();
    let mut pins: BTreeMap<PciAddress, Vec<(PciAddress, Option<TypeRef>)>> = BTreeMap::new();
    let mut direct: BTreeMap<PciAddress, Vec<TypeCount>> = BTreeMap::new();
    let mut named: BTreeMap<ParentId, (&'a Parent, Vec<TypeCount>)> = BTreeMap::new();
    for (n, e) in config.entries.iter().enumerate() {
        match &e.selector {
            Selector::Parent { parent } => {
                let here = format!("vgpu-configs.{}.{parent}", config.name);
                let Some(p) = topology.parent(parent) else {
                    let mut there: Vec<String> = topology
                        .mediated_devices
                        .parents
                        .iter()
                        .filter(|p| p.gpu.is_none())
                        .map(|p| p.id.to_string())
                        .collect();
                    there.sort();
                    let there = if there.is_empty() {
                        "none".to_owned()
                    } else {
                        there.join(", ")
                    };
                    return Err(LayoutError::UnknownDevice {
                        at: here,
                        address: parent.to_string(),
                        why: format!(
                            "is not an mdev parent of this host (is its driver loaded?); \
                             virtual parents here: {there}"
                        ),
                    });
                };
                let Want::Counts { types } = &e.want else {
                    continue;
                };
                named.insert(parent.clone(), (p, types.clone()));
            }
            Selector::Indexed { devices, filters } => {
                for (addr, i) in &indices {
                    let Some(gpu) = topology.gpu_by_address(addr) else {
                        continue;
                    };
                    if devices.contains(*i)
                        && (filters.is_empty() || filters.iter().any(|f| f.matches(gpu)))
                    {
                        by_gpu.entry(*addr).or_default().push((n, &e.want));
                    }
                }
                if let crate::layout::Devices::Indices(list) = devices {
                    for i in list.iter().filter(|i| **i as usize >= indices.len()) {
                        warnings.push(format!(
                            "{}: GPU index {i} does not exist (the node has {} NVIDIA GPUs); \
                             ignored, as NVIDIA's tool does",
                            at(n),
                            indices.len()
                        ));
                    }
                }
            }
            Selector::Gpu { address } => {
                let here = format!("vgpu-configs.{}.{address}", config.name);
                if topology.gpu_by_address(address).is_none() {
                    let why = if topology.parent(&ParentId::Pci(*address)).is_some() {
                        "is a VF, not a GPU: give it a type ID or name instead of vgpu-devices"
                    } else {
                        "is not a GPU of this host"
                    };
                    return Err(LayoutError::UnknownDevice {
                        at: here,
                        address: address.to_string(),
                        why: why.to_owned(),
                    });
                }
                let Want::Counts { types } = &e.want else {
                    continue;
                };
                direct.insert(*address, types.clone());
            }
            Selector::Vf { address } => {
                let here = format!("vgpu-configs.{}.{address}", config.name);
                let Some(gpu) = topology
                    .parent(&ParentId::Pci(*address))
                    .filter(|p| single_instance(p))
                    .and_then(|p| p.gpu)
                else {
                    let why = if topology.gpu_by_address(address).is_some() {
                        "is a GPU, not a VF: give it vgpu-devices (type name → count)"
                    } else {
                        "is not a vGPU virtual function of this host (is SR-IOV enabled?)"
                    };
                    return Err(LayoutError::UnknownDevice {
                        at: here,
                        address: address.to_string(),
                        why: why.to_owned(),
                    });
                };
                let Want::VfType { ty } = &e.want else {
                    continue;
                };
                pins.entry(gpu).or_default().push((*address, ty.clone()));
            }
        }
    }
    let mut out = Vec::new();
    let mut gpus: Vec<&Gpu> = topology.gpus.iter().collect();
    gpus.sort_by_key(|g| g.address);
    for gpu in gpus {
        let index = indices.get(&gpu.address).copied();
        let view_label = || format!("{} ({})", gpu.name, gpu.address);
        if let Some(types) = direct.remove(&gpu.address) {
            if pins.contains_key(&gpu.address) {
                return Err(LayoutError::Conflict {
                    gpu: view_label(),
                    why: "both vgpu-devices for the GPU and types for some of its VFs are given"
                        .to_owned(),
                });
            }
            out.push(Selected {
                subject: Subject::Gpu(gpu),
                index,
                entry: format!("vgpu-configs.{}.{}", config.name, gpu.address),
                target: Target::Counts(if mode == Mode::Clear { vec![] } else { types }),
            });
            continue;
        }
        if let Some(list) = pins.remove(&gpu.address) {
            let entry = format!("vgpu-configs.{}", config.name);
            let target = list
                .into_iter()
                .map(|(vf, ty)| (vf, if mode == Mode::Clear { None } else { ty }))
                .collect();
            out.push(Selected {
                subject: Subject::Gpu(gpu),
                index,
                entry,
                target: Target::Pins(target),
            });
            continue;
        }
        let Some(cands) = by_gpu.remove(&gpu.address) else {
            continue;
        };
        let (n, types) = choose_entry(topology, gpu, &cands, &at, names)?;
        out.push(Selected {
            subject: Subject::Gpu(gpu),
            index,
            entry: at(n),
            target: Target::Counts(if mode == Mode::Clear { vec![] } else { types }),
        });
    }
    for (id, (parent, types)) in named {
        out.push(Selected {
            subject: Subject::Named(parent),
            index: None,
            entry: format!("vgpu-configs.{}.{id}", config.name),
            target: Target::Counts(if mode == Mode::Clear { vec![] } else { types }),
        });
    }
    Ok(out)
}

/// NVIDIA's tool applies every matching entry in turn, so with two entries for one PCI ID (RTX
/// 8000 and RTX 6000 share 0x1E78) the last one wins and fails on the other board. Here the entry
/// whose types the GPU offers is chosen; two that both fit it are an error.
pub(super) fn choose_entry(
    topology: &NodeTopology,
    gpu: &Gpu,
    cands: &[(usize, &Want)],
    at: &dyn Fn(usize) -> String,
    names: &TypeNames,
) -> Result<(usize, Vec<TypeCount>), LayoutError> {
    let types_of = |w: &Want| match w {
        Want::Counts { types } => types.clone(),
        Want::VfType { .. } => vec![],
    };
    if let [(n, w)] = cands {
        return Ok((*n, types_of(w)));
    }
    let view = View::new(topology, gpu).with_names(names);
    let mut fitting: Vec<(usize, Vec<TypeCount>)> = Vec::new();
    let mut first_err = None;
    for (n, w) in cands {
        let types = types_of(w);
        match view.resolve_all(&types) {
            Ok(_) => {
                if let Some((m, t)) = fitting.first() {
                    if *t != types {
                        return Err(LayoutError::AmbiguousEntries {
                            gpu: view.label.clone(),
                            first: at(*m),
                            second: at(*n),
                        });
                    }
                } else {
                    fitting.push((*n, types));
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match (fitting.into_iter().next(), first_err) {
        (Some(found), _) => Ok(found),
        (None, Some(e)) => Err(e),
        (None, None) => Ok((cands[0].0, vec![])),
    }
}
