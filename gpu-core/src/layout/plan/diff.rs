//! The diff from what a GPU holds to what it should hold: keep, remove, create.

use super::*;

pub(super) fn build(
    config: &LayoutConfig,
    topology: &NodeTopology,
    options: PlanOptions,
    check_capacity: bool,
    names: &TypeNames,
) -> Result<Plan, LayoutError> {
    let mut warnings = Vec::new();
    let selected = select(config, topology, options.mode, names, &mut warnings)?;
    // UUIDs of instances anywhere on the host: a new layout slot never takes one of these, except
    // those this plan removes first.
    let mut taken: BTreeSet<MdevUuid> = topology
        .mediated_devices
        .parents
        .iter()
        .flat_map(|p| p.instances.iter().filter_map(|i| i.uuid))
        .collect();
    let mut gpus = Vec::with_capacity(selected.len());
    for s in selected {
        let view = match s.subject {
            Subject::Gpu(gpu) => View::new(topology, gpu).with_names(names),
            Subject::Named(parent) => View::named(parent),
        };
        let wants_something = match &s.target {
            Target::Counts(types) => !types.is_empty(),
            Target::Pins(pins) => !pins.is_empty(),
        } || view.instances().next().is_some();
        if let Some(g) = view.gpu {
            for u in g.sriov.iter().flat_map(|s| &s.unreadable_vfs) {
                warnings.push(format!(
                    "{}: VF {}: its vGPU type cannot be read ({}); it is left out of the plan",
                    view.label, u.address, u.error
                ));
            }
        }
        let mut gp = match (view.ineligible(), &s.target) {
            (Some(why), target) if wants_something => {
                let mut gp = empty_plan(&view);
                if let Target::Counts(types) = target {
                    gp.types = types
                        .iter()
                        .map(|t| TypeDiff {
                            name: t.name.clone(),
                            type_id: None,
                            have: 0,
                            want: t.count,
                        })
                        .collect();
                }
                gp.refused = Some(why);
                gp
            }
            (_, Target::Counts(types)) => plan_counts(&view, types, options)?,
            (_, Target::Pins(pins)) => plan_pins(&view, pins, options)?,
        };
        gp.index = s.index;
        gp.entry = s.entry;
        if gp.refused.is_none() && !gp.enable_sriov {
            for r in &gp.remove {
                if let Some(u) = r.uuid {
                    taken.remove(&u);
                }
            }
            if check_capacity {
                let pool = topology.pool(&view.key);
                if view.gpu.is_none() && pool.is_none() {
                    if let Some(w) = place_by_driver_counts(&view, &mut gp)? {
                        warnings.push(w);
                    }
                } else {
                    place(&view, &mut gp, pool)?;
                }
            }
            let mut slot = 0u32;
            for c in gp
                .create
                .iter_mut()
                .filter(|c| c.framework == VgpuFramework::Mdev)
            {
                let uuid = loop {
                    let u = match &view.key {
                        ParentId::Pci(a) => MdevUuid::for_layout_slot(&topology.node, a, slot),
                        ParentId::Named(n) => {
                            MdevUuid::for_named_parent_slot(&topology.node, n, slot)
                        }
                    };
                    slot += 1;
                    if !taken.contains(&u) {
                        break u;
                    }
                };
                taken.insert(uuid);
                c.uuid = Some(uuid);
            }
        }
        gpus.push(gp);
    }
    let mut steps = Vec::new();
    for g in gpus.iter().filter(|g| g.refused.is_none()) {
        for r in &g.remove {
            steps.push(Step::Remove {
                gpu: g.gpu.clone(),
                instance: r.clone(),
            });
        }
    }
    for g in gpus.iter().filter(|g| g.enable_sriov) {
        if let Some(gpu) = g.gpu.pci() {
            steps.push(Step::EnableSriov { gpu });
        }
    }
    for g in gpus.iter().filter(|g| g.refused.is_none()) {
        for c in &g.create {
            steps.push(Step::Create {
                gpu: g.gpu.clone(),
                instance: c.clone(),
            });
        }
    }
    for g in gpus.iter().filter(|g| g.refused.is_some()) {
        if let Some(why) = &g.refused {
            warnings.push(format!("{}: left unchanged: {why}", g.label()));
        }
    }
    Ok(Plan {
        node: topology.node.clone(),
        config: config.name.clone(),
        mode: options.mode,
        gpus,
        steps,
        warnings,
    })
}

pub(super) fn empty_plan(view: &View<'_>) -> GpuLayoutPlan {
    GpuLayoutPlan {
        gpu: view.key.clone(),
        name: view.name.clone(),
        index: None,
        entry: String::new(),
        framework: view.framework(),
        types: vec![],
        keep: vec![],
        remove: vec![],
        create: vec![],
        enable_sriov: false,
        refused: None,
    }
}

/// Orders instances for keeping: in use first (never disturb a VM), then gpuslice's own layout
/// slots, then by parent and UUID so the choice is deterministic.
pub(super) fn keep_order(a: &(&Parent, &Instance), b: &(&Parent, &Instance)) -> std::cmp::Ordering {
    let rank = |x: &(&Parent, &Instance)| (x.1.in_use != Some(true), x.0.id.clone(), x.1.uuid);
    rank(a).cmp(&rank(b))
}

pub(super) fn plan_counts(
    view: &View<'_>,
    types: &[TypeCount],
    options: PlanOptions,
) -> Result<GpuLayoutPlan, LayoutError> {
    let mut gp = empty_plan(view);
    let instances: Vec<(&Parent, &Instance)> = view.instances().collect();
    if view.needs_sriov() {
        if !types.is_empty() {
            gp.enable_sriov = true;
            gp.types = types
                .iter()
                .map(|t| TypeDiff {
                    name: t.name.clone(),
                    type_id: None,
                    have: 0,
                    want: t.count,
                })
                .collect();
        }
        return Ok(gp);
    }
    // Without a vGPU interface nothing can be read or written: even "no vGPUs" (`{}`) cannot
    // be asserted of such a GPU, only that it cannot hold any, which is refused the same way.
    // Clearing it is true as it stands (it holds none).
    if view.parents.is_empty()
        && view.gpu.is_some()
        && instances.is_empty()
        && (options.mode != Mode::Clear || !types.is_empty())
    {
        let other_drivers = view.gpu.and_then(|g| {
            g.sriov
                .as_ref()
                .and_then(|s| s.other_driver_diagnosis(g.vendor_id, g.device_id))
        });
        let why = match (view.gpu.and_then(|g| g.driver.as_deref()), other_drivers) {
            (Some("nvidia"), Some(d)) => format!("it has no vGPU parents: {d}"),
            (Some("nvidia") | None, _) => {
                "it has no vGPU parents (is the NVIDIA vGPU host driver loaded?)".to_owned()
            }
            (Some(d), _) => format!("it is bound to {d}, not to the NVIDIA vGPU host driver"),
        };
        return Err(LayoutError::NotVgpuCapable {
            gpu: view.label.clone(),
            why,
        });
    }
    let wanted = view.resolve_all(types)?;
    let mut used = vec![false; instances.len()];
    for w in &wanted {
        let mut matching: Vec<(usize, &(&Parent, &Instance))> = instances
            .iter()
            .enumerate()
            .filter(|(_, (_, i))| match &w.id {
                Some(id) => i.profile == *id,
                None => view.name_of(i).is_some_and(|n| names_match(&n, &w.name)),
            })
            .collect();
        matching.sort_by(|a, b| keep_order(a.1, b.1));
        let have = u32::try_from(matching.len()).unwrap_or(u32::MAX);
        for (k, (p, i)) in matching.iter().take(w.count as usize) {
            used[*k] = true;
            gp.keep.push(view.planned(p, i));
        }
        gp.types.push(TypeDiff {
            name: w.requested.clone(),
            type_id: w.id.clone(),
            have,
            want: w.count,
        });
        for _ in have..w.count {
            gp.create.push(PlannedInstance {
                framework: view.framework().unwrap_or(VgpuFramework::Mdev),
                parent: view.key.clone(),
                uuid: None,
                type_id: w.id.clone(),
                type_name: Some(w.name.clone()),
                framebuffer_mib: w.profile.framebuffer_mib,
                in_use: None,
            });
        }
    }
    let mut unwanted: BTreeMap<VgpuTypeId, (String, u32)> = BTreeMap::new();
    for (k, (p, i)) in instances.iter().enumerate() {
        if used[k] {
            continue;
        }
        gp.remove.push(view.planned(p, i));
        let matched = wanted.iter().any(|w| w.id.as_ref() == Some(&i.profile));
        if !matched {
            let e = unwanted
                .entry(i.profile.clone())
                .or_insert_with(|| (view.name_of(i).unwrap_or_else(|| i.profile.to_string()), 0));
            e.1 += 1;
        }
    }
    for (id, (name, have)) in unwanted {
        gp.types.push(TypeDiff {
            name: strip_prefix(&name).to_owned(),
            type_id: Some(id),
            have,
            want: 0,
        });
    }
    refuse_unknown(&mut gp, options);
    refuse_in_use(&mut gp, options);
    Ok(gp)
}

/// A live vendor-VFIO type whose name no source knows (not NVML, not the remembered names, not
/// the creatable lists) cannot be compared with names: the GPU is left as it is, naming the VF
/// and the type ID. Clearing, and layouts that pin types by ID, need no names.
pub(super) fn refuse_unknown(gp: &mut GpuLayoutPlan, options: PlanOptions) {
    if options.mode == Mode::Clear {
        return;
    }
    let unknown: Vec<String> = gp
        .remove
        .iter()
        .filter(|r| r.framework == VgpuFramework::VendorVfio && r.type_name.is_none())
        .map(|r| {
            let id = r.type_id.as_ref().map_or("?", VgpuTypeId::as_str);
            format!("VF {} holds type {id}", r.parent)
        })
        .collect();
    if !unknown.is_empty() && gp.refused.is_none() {
        gp.refused = Some(format!(
            "{}, whose name is unknown (no NVML, no remembered name, not listed by the driver); \
             left unchanged (pin the VF by type ID to change it)",
            unknown.join(", ")
        ));
    }
}

pub(super) fn plan_pins(
    view: &View<'_>,
    pins: &[(PciAddress, Option<TypeRef>)],
    options: PlanOptions,
) -> Result<GpuLayoutPlan, LayoutError> {
    let mut gp = empty_plan(view);
    let mut tally: BTreeMap<String, (Option<VgpuTypeId>, u32, u32)> = BTreeMap::new();
    for (vf, want) in pins {
        let Some(parent) = view.parents.iter().find(|p| p.id == ParentId::Pci(*vf)) else {
            continue;
        };
        let want = want.as_ref().map(|r| view.resolve_ref(r)).transpose()?;
        let current = parent.instances.first();
        if let Some(i) = current {
            let name = view.name_of(i).unwrap_or_else(|| i.profile.to_string());
            let e = tally.entry(strip_prefix(&name).to_owned()).or_insert((
                Some(i.profile.clone()),
                0,
                0,
            ));
            e.1 += 1;
        }
        if let Some(w) = &want {
            let e = tally
                .entry(strip_prefix(&w.name).to_owned())
                .or_insert((w.id.clone(), 0, 0));
            e.2 += 1;
        }
        let same = match (current, &want) {
            (Some(i), Some(w)) => w.id.as_ref() == Some(&i.profile),
            (None, None) => true,
            _ => false,
        };
        if same {
            if let Some(i) = current {
                gp.keep.push(view.planned(parent, i));
            }
            continue;
        }
        if let Some(i) = current {
            gp.remove.push(view.planned(parent, i));
        }
        if let Some(w) = want {
            gp.create.push(PlannedInstance {
                framework: parent.framework,
                parent: parent.id.clone(),
                uuid: None,
                type_id: w.id,
                type_name: Some(w.name),
                framebuffer_mib: w.profile.framebuffer_mib,
                in_use: None,
            });
        }
    }
    gp.types = tally
        .into_iter()
        .map(|(name, (type_id, have, want))| TypeDiff {
            name,
            type_id,
            have,
            want,
        })
        .collect();
    refuse_in_use(&mut gp, options);
    Ok(gp)
}

pub(super) fn refuse_in_use(gp: &mut GpuLayoutPlan, options: PlanOptions) {
    if options.force {
        return;
    }
    let busy: Vec<String> = gp
        .remove
        .iter()
        .filter(|r| r.in_use == Some(true))
        .map(|r| format!("{} {}", r.type_label(), r.label()))
        .collect();
    if !busy.is_empty() {
        gp.refused = Some(format!(
            "in use by a VM, not removed without --force: {}",
            busy.join(", ")
        ));
    }
}
