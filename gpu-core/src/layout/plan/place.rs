//! Placement: simulating a GPU's pool over the planned removals and creations.

use super::*;

/// Simulates the GPU's pool (removals first, then creations largest framebuffer first) and picks a
/// parent for each creation that has no fixed one.
pub(super) fn place(
    view: &View<'_>,
    gp: &mut GpuLayoutPlan,
    pool: Option<&Pool>,
) -> Result<(), LayoutError> {
    let mut pool = pool.cloned();
    // Without NVML the MIG slice total is inferred from what the VFs still list: a lower bound.
    // Where the product's geometry is known, the card's own count holds, and the slot check
    // below is the real limit.
    if let (Some(p), Some(g)) = (
        pool.as_mut(),
        view.gpu
            .and_then(|g| MigGeometry::for_device(g.device_id.0)),
    ) {
        if p.mig_slices_total.is_some() {
            p.mig_slices_total = Some(g.compute_slices);
        }
    }
    let mut occupied: BTreeSet<ParentId> = BTreeSet::new();
    let removed: BTreeSet<(ParentId, Option<MdevUuid>)> = gp
        .remove
        .iter()
        .map(|r| (r.parent.clone(), r.uuid))
        .collect();
    for (p, i) in view.instances() {
        if !removed.contains(&(p.id.clone(), i.uuid)) {
            occupied.insert(p.id.clone());
        }
    }
    for r in &gp.remove {
        if let (Some(pool), Some(id)) = (pool.as_mut(), &r.type_id) {
            let inst = Instance {
                uuid: r.uuid,
                address: None,
                profile: id.clone(),
                profile_name: r.type_name.clone(),
                framebuffer_mib: r.framebuffer_mib,
                in_use: None,
                placement_id: None,
            };
            pool.release(&view.profile_of(&inst));
        }
    }
    // Pinned creations have their VF already; count it as taken before placing the others.
    for c in &gp.create {
        if c.parent != view.key {
            occupied.insert(c.parent.clone());
        }
    }
    let profile_for = |c: &PlannedInstance| -> Profile {
        match &c.type_id {
            Some(id) => view
                .known
                .iter()
                .find(|k| k.id == *id)
                .map(|k| k.profile.clone())
                .unwrap_or_else(|| {
                    synth_profile(id, c.type_name.as_deref().unwrap_or(""), c.framebuffer_mib)
                }),
            None => {
                let mut p = synth_profile(
                    &VgpuTypeId::vendor_vfio(0),
                    c.type_name.as_deref().unwrap_or(""),
                    c.framebuffer_mib,
                );
                p.mig_slices = c
                    .type_name
                    .as_deref()
                    .and_then(|n| VgpuTypeName::parse(n).ok())
                    .and_then(|n| n.mig_slices);
                p
            }
        }
    };
    let size = |c: &PlannedInstance| {
        let p = profile_for(c);
        (p.mig_slices.unwrap_or(0), p.framebuffer_mib.unwrap_or(0))
    };
    gp.create.sort_by_key(|c| std::cmp::Reverse(size(c)));
    // MIG-backed vGPUs hold GPU-instance slots at allowed starts, not just a slice count. Where
    // the pool has slots (`migSlots`: NVML's starts, or each instance held wherever it may sit,
    // and the new ones pending wherever the driver may put them), its check above is the slot
    // check. Without them, the kept ones are placed here first (largest first, lowest start:
    // where the driver puts them when nothing says), then each new one needs a free start.
    let pool_has_slots = pool.as_ref().is_some_and(|p| p.mig_slots.is_some());
    let mig_of = |pr: &Profile| -> Option<(&'static MigGeometry, &'static MigProfile)> {
        if pool_has_slots {
            return None;
        }
        let slices = pr.mig_slices?;
        let geometry = view
            .gpu
            .and_then(|g| MigGeometry::for_device(g.device_id.0))
            .or_else(|| {
                let board = VgpuTypeName::parse(&pr.name).ok()?.board;
                MigGeometry::for_vgpu_board(&board)
            })?;
        Some((
            geometry,
            geometry.profile_for(slices, pr.framebuffer_mib.unwrap_or(0))?,
        ))
    };
    // MIG-backed creations are placed as a whole: some placement of all of them beside what the
    // GPU holds (existing instances of unknown start held wherever they may sit, the worst case)
    // must exist, and they are created in an order under which the driver's own placement
    // (lowest free start) reaches one. Past this, the per-instance slot checks below are moot.
    let mut slots_checked = false;
    // A refusal the per-instance checks below may give first, with their own numbers.
    let mut mig_refusal: Option<LayoutError> = None;
    if let Some(g) = view
        .gpu
        .and_then(|g| MigGeometry::for_device(g.device_id.0))
    {
        let wanted: Vec<(usize, &'static MigProfile)> = gp
            .create
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let pr = profile_for(c);
                let slices = pr.mig_slices?;
                Some((i, g.profile_for(slices, pr.framebuffer_mib.unwrap_or(0))?))
            })
            .collect();
        if !wanted.is_empty() {
            let occupancies = match pool.as_ref().and_then(|p| p.mig_slots.as_ref()) {
                Some(slots) => slots.occupancies().ok().map(|(_, o)| o),
                None => {
                    let kept: Vec<&'static MigProfile> = view
                        .instances()
                        .filter(|(p, i)| !removed.contains(&(p.id.clone(), i.uuid)))
                        .filter_map(|(_, i)| {
                            let pr = view.profile_of(i);
                            g.profile_for(pr.mig_slices?, pr.framebuffer_mib.unwrap_or(0))
                        })
                        .collect();
                    Some(g.placements_of(MigOccupancy::empty(), &kept, &[]))
                }
            };
            if let Some(occupancies) = occupancies {
                let profiles: Vec<&MigProfile> = wanted.iter().map(|(_, m)| *m).collect();
                match g.creation_order(&occupancies, &profiles) {
                    Some(order) => {
                        // The MIG creations, in the order found, where they stood in the list.
                        let mut reordered = gp.create.clone();
                        for (slot, k) in wanted.iter().map(|(i, _)| *i).zip(order) {
                            if let (Some(dst), Some(src)) = (
                                reordered.get_mut(slot),
                                wanted.get(k).and_then(|(i, _)| gp.create.get(*i)),
                            ) {
                                *dst = src.clone();
                            }
                        }
                        gp.create = reordered;
                        slots_checked = true;
                    }
                    None => {
                        let first = gp.create.get(wanted[0].0);
                        let type_name =
                            strip_prefix(first.and_then(|c| c.type_name.as_deref()).unwrap_or("?"))
                                .to_owned();
                        let want = gp
                            .create
                            .iter()
                            .filter(|c| {
                                c.type_name.as_deref().map(strip_prefix) == Some(type_name.as_str())
                            })
                            .count();
                        let names: Vec<&str> = profiles.iter().map(|m| m.name).collect();
                        mig_refusal = Some(LayoutError::DoesNotFit {
                            gpu: view.label.clone(),
                            type_name,
                            want: u32::try_from(want).unwrap_or(u32::MAX),
                            fit: 0,
                            why: format!(
                                "no placement of the GPU instances {} fits the {}'s slots beside \
                                 what it holds ({}); existing instances whose slots are not known \
                                 are taken where they block the most",
                                names.join(", "),
                                g.product,
                                if occupancies.is_empty() {
                                    "its existing instances have no valid placement".to_owned()
                                } else {
                                    let worst =
                                        occupancies.iter().map(|o| o.held()).max().unwrap_or(0);
                                    format!(
                                        "up to {worst} of {} memory slices held",
                                        g.memory_slices
                                    )
                                }
                            ),
                        });
                    }
                }
            }
        }
    }
    if slots_checked {
        if let Some(p) = pool.as_mut() {
            p.mig_slots = None;
        }
    }
    let mut mig: Option<(&'static MigGeometry, MigOccupancy)> = None;
    let mut kept: Vec<(&'static MigGeometry, &'static MigProfile)> = view
        .instances()
        .filter(|(p, i)| !removed.contains(&(p.id.clone(), i.uuid)))
        .filter_map(|(_, i)| mig_of(&view.profile_of(i)))
        .collect();
    kept.sort_by_key(|(_, m)| std::cmp::Reverse((m.memory_slices, m.compute_slices)));
    for (g, m) in kept {
        let occ = mig.map_or(MigOccupancy::empty(), |(_, o)| o);
        let mut occ = occ;
        if let Some(s) = g.fits(occ, m) {
            occ.hold(s, m);
        }
        mig = Some((g, occ));
    }
    // Per (parent, type): what a multi-instance parent may still take when no pool is known.
    let mut spare: BTreeMap<(ParentId, VgpuTypeId), u32> = BTreeMap::new();
    let mut placed_of: BTreeMap<String, u32> = BTreeMap::new();
    let creates = std::mem::take(&mut gp.create);
    let mut out = Vec::with_capacity(creates.len());
    let mut totals: BTreeMap<String, u32> = BTreeMap::new();
    for c in &creates {
        *totals
            .entry(c.type_name.clone().unwrap_or_default())
            .or_default() += 1;
    }
    let total_of = |name: &str| totals.get(name).copied().unwrap_or(0);
    for mut c in creates {
        let profile = profile_for(&c);
        let type_name = strip_prefix(c.type_name.as_deref().unwrap_or("?")).to_owned();
        let misfit = |why: String, placed: &BTreeMap<String, u32>| LayoutError::DoesNotFit {
            gpu: view.label.clone(),
            type_name: type_name.clone(),
            want: total_of(c.type_name.as_deref().unwrap_or_default()),
            fit: placed.get(&type_name).copied().unwrap_or(0),
            why,
        };
        if let Some(pool) = pool.as_mut() {
            if let Err(m) = pool.check(&profile) {
                return Err(misfit(
                    format!("{m} ({} MiB total)", pool.total_mib),
                    &placed_of,
                ));
            }
            pool.charge(&profile);
        }
        if let Some((g, m)) = mig_of(&profile).filter(|_| !slots_checked) {
            let mut occ = mig.map_or(MigOccupancy::empty(), |(_, o)| o);
            match g.fits(occ, m) {
                Some(start) => occ.hold(start, m),
                None => {
                    return Err(misfit(
                        format!(
                            "no free start slot for a {} GPU instance ({} memory slices from \
                             slot {:?}) on the {}: {} of {} memory slices are held",
                            m.name,
                            m.memory_slices,
                            m.starts,
                            g.product,
                            occ.held(),
                            g.memory_slices
                        ),
                        &placed_of,
                    ));
                }
            }
            mig = Some((g, occ));
        }
        if c.parent == view.key {
            let offers = |p: &Parent| match &c.type_id {
                Some(id) => p.profiles.iter().any(|pr| pr.id == *id),
                None => p.framework == VgpuFramework::VendorVfio,
            };
            // A VF takes the type only when its own list offers it; a VF listing nothing is
            // skipped. Only where the lists cannot say yet (the type is named for write time, or
            // this plan frees capacity first) is any free vendor-VFIO VF taken: the executor
            // re-reads the VF's list right before the write.
            let free_vf = |p: &&&Parent| single_instance(p) && !occupied.contains(&p.id);
            let listed = view.parents.iter().find(|p| {
                free_vf(p)
                    && c.type_id
                        .as_ref()
                        .is_some_and(|id| p.profiles.iter().any(|pr| pr.id == *id))
            });
            let stale = c.type_id.is_none() || !gp.remove.is_empty();
            let vf = listed.or_else(|| {
                stale
                    .then(|| {
                        view.parents
                            .iter()
                            .find(|p| free_vf(p) && p.framework == VgpuFramework::VendorVfio)
                    })
                    .flatten()
            });
            let mut chosen = None;
            if let Some(p) = vf {
                occupied.insert(p.id.clone());
                chosen = Some(*p);
            }
            for p in view.parents.iter().filter(|_| chosen.is_none()) {
                if single_instance(p) {
                    continue;
                }
                if !offers(p) {
                    continue;
                }
                if pool.is_none() {
                    let Some(id) = &c.type_id else { continue };
                    let left = spare.entry((p.id.clone(), id.clone())).or_insert_with(|| {
                        let freed = gp
                            .remove
                            .iter()
                            .filter(|r| r.parent == p.id && r.type_id.as_ref() == Some(id))
                            .count();
                        let avail = p
                            .profiles
                            .iter()
                            .find(|pr| pr.id == *id)
                            .map_or(0, |pr| pr.available_instances);
                        avail.saturating_add(u32::try_from(freed).unwrap_or(u32::MAX))
                    });
                    if *left == 0 {
                        continue;
                    }
                    *left -= 1;
                }
                chosen = Some(*p);
                break;
            }
            let Some(p) = chosen else {
                let free = view
                    .parents
                    .iter()
                    .filter(|p| single_instance(p) && !occupied.contains(&p.id))
                    .count();
                return Err(misfit(
                    format!("no free vGPU parent offers it ({free} free VFs)"),
                    &placed_of,
                ));
            };
            c.parent = p.id.clone();
            c.framework = p.framework;
        }
        *placed_of.entry(type_name).or_default() += 1;
        out.push(c);
    }
    if let Some(e) = mig_refusal {
        return Err(e);
    }
    gp.create = out;
    Ok(())
}

/// A common multiple of `values` (zeros skipped), or `None` past 2^64, where the sums of counts
/// times costs could no longer be added up exactly.
pub(super) fn common_multiple(values: impl Iterator<Item = u32>) -> Option<u128> {
    let mut l: u128 = 1;
    for v in values.filter(|v| *v > 0) {
        let v = u128::from(v);
        let (mut a, mut b) = (l, v);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        l = (l / a)
            .checked_mul(v)
            .filter(|x| *x <= u128::from(u64::MAX))?;
    }
    Some(l)
}

/// Checks the creations on a virtual mdev parent whose types have no known size (the kernel's
/// sample drivers): the driver's `availableInstances` are the only truth, and its types share
/// one pool (mbochs: 64 small, 16 medium or 4 large; 63/15/3 after one small).
///
/// With the free capacity taken as `L` units (a common multiple of every count `a` and `a + 1`),
/// one more instance of a type offered `a` times costs more than `L / (a + 1)` and at most
/// `L / a` units, and removing one frees as much (an unknown amount when `a` is 0). On a parent
/// with no instances the cost is read as exactly `L / a`: the types' sizes divide the empty
/// pool, as they do for every sample driver, and the scheduler reads the counts the same way.
///
/// A layout that fits at the upper bounds is accepted; one that cannot fit even at the lower
/// bounds (the exact reading on an empty parent) is refused with the driver's numbers, nothing
/// written. In between, it is accepted with a warning: the executor re-reads the counts before
/// each create and rolls back on a misfit.
pub(super) fn place_by_driver_counts(
    view: &View<'_>,
    gp: &mut GpuLayoutPlan,
) -> Result<Option<String>, LayoutError> {
    let Some(parent) = view.parents.first() else {
        return Ok(None);
    };
    if gp.create.is_empty() {
        return Ok(None);
    }
    let avail = |id: Option<&VgpuTypeId>| {
        id.and_then(|id| parent.profiles.iter().find(|p| p.id == *id))
            .map_or(0, |p| p.available_instances)
    };
    let counts = parent.profiles.iter().flat_map(|p| {
        [
            p.available_instances,
            p.available_instances.saturating_add(1),
        ]
    });
    let unit = common_multiple(counts);
    let lower = |a: u32, l: u128| l / (u128::from(a) + 1);
    let upper = |a: u32, l: u128| (a > 0).then(|| l / u128::from(a));
    let size = |c: &PlannedInstance| unit.map_or(0, |l| lower(avail(c.type_id.as_ref()), l));
    gp.create.sort_by_key(|c| std::cmp::Reverse(size(c)));

    let mut totals: BTreeMap<String, u32> = BTreeMap::new();
    for c in &gp.create {
        *totals.entry(c.type_label()).or_default() += 1;
    }
    let offered: Vec<String> = parent
        .profiles
        .iter()
        .map(|p| format!("{} {}", p.available_instances, p.name))
        .collect();
    let misfit = |c: &PlannedInstance, placed: &BTreeMap<String, u32>| {
        let ty = c.type_label();
        let freed = if gp.remove.is_empty() {
            String::new()
        } else {
            format!(" before the {} removals", gp.remove.len())
        };
        LayoutError::DoesNotFit {
            gpu: view.label.clone(),
            want: totals.get(&ty).copied().unwrap_or(0),
            fit: placed.get(&ty).copied().unwrap_or(0),
            type_name: ty,
            why: format!(
                "the pool is full (the driver reports {} available{freed}; the types of {} \
                 share one pool)",
                offered.join(", "),
                view.name
            ),
        }
    };
    let mut placed: BTreeMap<String, u32> = BTreeMap::new();
    let mut uncertain = false;
    match unit {
        Some(l) => {
            let mut free_lo = l;
            let mut free_hi = Some(l);
            for r in &gp.remove {
                let a = avail(r.type_id.as_ref());
                let known = parent
                    .profiles
                    .iter()
                    .any(|p| Some(&p.id) == r.type_id.as_ref());
                if known {
                    free_lo += lower(a, l);
                }
                free_hi = free_hi
                    .zip(upper(a, l).filter(|_| known))
                    .map(|(f, u)| f + u);
            }
            let empty = parent.instances.is_empty();
            let (mut used_lo, mut used_hi, mut strict) = (0u128, 0u128, false);
            for c in &gp.create {
                let a = avail(c.type_id.as_ref());
                match upper(a, l) {
                    Some(u) if empty => used_lo += u,
                    _ => {
                        used_lo += lower(a, l);
                        strict = true;
                    }
                }
                // The true use exceeds a strict lower bound, so reaching the free room is a misfit.
                if free_hi.is_some_and(|f| used_lo > f || (strict && used_lo >= f)) {
                    return Err(misfit(c, &placed));
                }
                used_hi = used_hi.saturating_add(upper(a, l).unwrap_or(u128::MAX));
                uncertain |= used_hi > free_lo;
                *placed.entry(c.type_label()).or_default() += 1;
            }
        }
        None => {
            // Counts too irregular for exact sums: each type on its own, the rest left to the
            // executor's re-reads.
            uncertain = true;
            for c in &gp.create {
                let freed = gp.remove.iter().filter(|r| r.type_id == c.type_id).count();
                let room = avail(c.type_id.as_ref())
                    .saturating_add(u32::try_from(freed).unwrap_or(u32::MAX));
                let n = placed.entry(c.type_label()).or_default();
                if *n >= room {
                    return Err(misfit(c, &placed));
                }
                *n += 1;
            }
        }
    }
    if !uncertain {
        return Ok(None);
    }
    let wanted: Vec<String> = totals.iter().map(|(t, n)| format!("{n} × {t}")).collect();
    Ok(Some(format!(
        "{}: the driver's counts cannot tell whether {} fit together (its types share one pool of \
         unknown size); the counts are re-read before each create, and a misfit is rolled back",
        view.label,
        wanted.join(" and ")
    )))
}
