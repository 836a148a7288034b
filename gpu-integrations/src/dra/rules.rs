//! The rules of ResourceSlices that a JSON schema cannot check, as the API server and the
//! scheduler apply them, plus gpuslice's own promise that a whole GPU and a vGPU on the same card
//! can never be allocated together.
//!
//! [`check`] returns every violation it finds, one sentence each; an empty list means the slices
//! hold.

use std::collections::{BTreeMap, BTreeSet};

use super::model::*;
use super::names::*;
use super::version::*;

fn attr<'a>(d: &'a Device, name: &str) -> Option<&'a DeviceAttribute> {
    d.attributes.get(name)
}

fn is_exclusive_kind(d: &Device) -> bool {
    // Whole GPUs and time-sliced vGPU devices must exclude everything else on their card; MIG
    // placements and mixed-size placements (slot counters) only exclude what overlaps them.
    attr(d, "migSlices").is_none() && attr(d, "placementId").is_none()
}

/// Two single time-sliced vGPUs of one size (the one-size-per-instance encoding): they may share
/// a card, as long as its counters hold both.
fn same_size_instances(a: &Device, b: &Device) -> bool {
    let single_vgpu = |d: &Device| {
        d.allow_multiple_allocations != Some(true)
            && attr(d, "migSlices").is_none()
            && attr(d, "type") == Some(&DeviceAttribute::String("vgpu".into()))
    };
    single_vgpu(a)
        && single_vgpu(b)
        && attr(a, "framebufferMiB").is_some()
        && attr(a, "framebufferMiB") == attr(b, "framebufferMiB")
}

/// Checks slices (of any number of pools) against the rules of `version`.
pub fn check(slices: &[ResourceSlice], version: K8sVersion) -> Vec<String> {
    let mut v = Vec::new();
    let mut pools: BTreeMap<(&str, &str), Vec<&ResourceSlice>> = BTreeMap::new();
    for s in slices {
        pools
            .entry((s.spec.driver.as_str(), s.spec.pool.name.as_str()))
            .or_default()
            .push(s);
    }
    for ((driver, pool), members) in &pools {
        check_pool(driver, pool, members, version, &mut v);
    }
    v
}

fn check_pool(
    driver: &str,
    pool: &str,
    slices: &[&ResourceSlice],
    version: K8sVersion,
    v: &mut Vec<String>,
) {
    if !is_dns_subdomain(driver) {
        v.push(format!("driver {driver:?} is not a DNS subdomain"));
    }
    if !is_dns_subdomain(pool) {
        v.push(format!("pool {pool:?} is not a DNS subdomain"));
    }
    let mut device_names = BTreeSet::new();
    let mut pool_sets: BTreeMap<&str, &CounterSet> = BTreeMap::new();
    for s in slices {
        let name = &s.metadata.name;
        if !is_dns_subdomain(name) {
            v.push(format!("slice {name:?}: name is not a DNS subdomain"));
        }
        if s.spec.pool.resource_slice_count != slices.len() as i64 {
            v.push(format!(
                "slice {name}: resourceSliceCount {} but the pool has {} slices",
                s.spec.pool.resource_slice_count,
                slices.len()
            ));
        }
        if s.spec.pool.generation != slices[0].spec.pool.generation {
            v.push(format!(
                "slice {name}: generation differs within pool {pool}"
            ));
        }
        match s.spec.node_name.as_deref() {
            Some(n) if n == pool => {}
            Some(n) => v.push(format!(
                "slice {name}: nodeName {n} is not the pool's node {pool}"
            )),
            None => v.push(format!("slice {name}: nodeName is not set")),
        }
        if version.splits_counters()
            && !s.spec.shared_counters.is_empty()
            && !s.spec.devices.is_empty()
        {
            v.push(format!(
                "slice {name}: holds both sharedCounters and devices, which Kubernetes {version} forbids"
            ));
        }
        if s.spec.shared_counters.len() > MAX_COUNTER_SETS {
            v.push(format!(
                "slice {name}: {} counter sets, more than {MAX_COUNTER_SETS}",
                s.spec.shared_counters.len()
            ));
        }
        let total_counters: usize = s
            .spec
            .shared_counters
            .iter()
            .map(|c| c.counters.len())
            .sum();
        if !version.splits_counters() && total_counters > MAX_COUNTERS {
            v.push(format!(
                "slice {name}: {total_counters} counters in all sets, more than {MAX_COUNTERS}"
            ));
        }
        let mut slice_sets = BTreeSet::new();
        for set in &s.spec.shared_counters {
            if !is_dns_label(&set.name) {
                v.push(format!(
                    "slice {name}: counter set {:?} is not a DNS label",
                    set.name
                ));
            }
            if set.counters.len() > MAX_COUNTERS {
                v.push(format!(
                    "slice {name}: counter set {} has {} counters, more than {MAX_COUNTERS}",
                    set.name,
                    set.counters.len()
                ));
            }
            for (c, q) in &set.counters {
                if !is_dns_label(c) {
                    v.push(format!(
                        "counter set {}: counter {c:?} is not a DNS label",
                        set.name
                    ));
                }
                if parse_quantity(&q.value).is_none() {
                    v.push(format!(
                        "counter set {}: {c} has no valid quantity",
                        set.name
                    ));
                }
            }
            if !slice_sets.insert(set.name.as_str()) {
                v.push(format!(
                    "slice {name}: counter set {} appears twice",
                    set.name
                ));
            }
            if pool_sets.insert(set.name.as_str(), set).is_some() && version.splits_counters() {
                v.push(format!(
                    "pool {pool}: counter set {} appears twice",
                    set.name
                ));
            }
        }
        let limit = if s
            .spec
            .devices
            .iter()
            .any(|d| !d.consumes_counters.is_empty() || !d.taints.is_empty())
        {
            MAX_DEVICES_WITH_COUNTERS
        } else {
            MAX_DEVICES
        };
        if s.spec.devices.len() > limit {
            v.push(format!(
                "slice {name}: {} devices, more than {limit}",
                s.spec.devices.len()
            ));
        }
        let consumed: usize = s
            .spec
            .devices
            .iter()
            .flat_map(|d| &d.consumes_counters)
            .map(|c| c.counters.len())
            .sum();
        if !version.splits_counters() && consumed > MAX_CONSUMED_COUNTERS_PER_SLICE {
            v.push(format!(
                "slice {name}: devices consume {consumed} counters, more than {MAX_CONSUMED_COUNTERS_PER_SLICE}"
            ));
        }
        for d in &s.spec.devices {
            check_device(name, d, version, v);
            if !device_names.insert(d.name.as_str()) {
                v.push(format!("pool {pool}: device {} appears twice", d.name));
            }
        }
    }
    // References and exclusivity.
    for s in slices {
        let visible: BTreeMap<&str, &CounterSet> = if version.splits_counters() {
            pool_sets.clone()
        } else {
            s.spec
                .shared_counters
                .iter()
                .map(|c| (c.name.as_str(), c))
                .collect()
        };
        for d in &s.spec.devices {
            for c in &d.consumes_counters {
                let Some(set) = visible.get(c.counter_set.as_str()) else {
                    v.push(format!(
                        "device {}: consumes from counter set {} that is not {}",
                        d.name,
                        c.counter_set,
                        if version.splits_counters() {
                            "in the pool"
                        } else {
                            "in its slice"
                        }
                    ));
                    continue;
                };
                for (counter, q) in &c.counters {
                    match (set.counters.get(counter), parse_quantity(&q.value)) {
                        (None, _) => v.push(format!(
                            "device {}: counter {counter} is not in set {}",
                            d.name, set.name
                        )),
                        (Some(have), Some(want))
                            if parse_quantity(&have.value).is_some_and(|h| want > h) =>
                        {
                            v.push(format!(
                                "device {}: consumes {} of {counter}, the set has only {}",
                                d.name, q.value, have.value
                            ))
                        }
                        (_, None) => v.push(format!(
                            "device {}: {counter} has no valid quantity",
                            d.name
                        )),
                        _ => {}
                    }
                }
            }
        }
    }
    check_exclusivity(slices, &pool_sets, v);
    if !version.counts_committed_shares() {
        check_uncounted_shares(slices, version, v);
    }
}

/// Before 1.36.2 the scheduler does not count a multi-allocatable device's counters in later
/// scheduling cycles (kubernetes#139034): another device consuming the same counter set is
/// still allocated beside its committed shares, so the two can be over-allocated.
fn check_uncounted_shares(slices: &[&ResourceSlice], version: K8sVersion, v: &mut Vec<String>) {
    let devices: Vec<&Device> = slices.iter().flat_map(|s| &s.spec.devices).collect();
    let sets = |d: &Device| -> BTreeSet<String> {
        d.consumes_counters
            .iter()
            .map(|c| c.counter_set.clone())
            .collect()
    };
    for d in devices
        .iter()
        .filter(|d| d.allow_multiple_allocations == Some(true))
    {
        let mine = sets(d);
        if let Some(other) = devices
            .iter()
            .find(|o| o.name != d.name && !sets(o).is_disjoint(&mine))
        {
            v.push(format!(
                "devices {} and {}: {} is multi-allocatable and consumes counters another device \
                 consumes, which the Kubernetes {version} scheduler does not count across \
                 scheduling cycles (kubernetes#139034, fixed in 1.36.2)",
                d.name, other.name, d.name
            ));
        }
    }
}

fn check_device(slice: &str, d: &Device, version: K8sVersion, v: &mut Vec<String>) {
    let who = format!("slice {slice}: device {:?}", d.name);
    if !is_dns_label(&d.name) {
        v.push(format!("{who}: name is not a DNS label"));
    }
    if d.attributes.len() + d.capacity.len() > MAX_ATTRIBUTES {
        v.push(format!(
            "{who}: {} attributes and capacities, more than {MAX_ATTRIBUTES}",
            d.attributes.len() + d.capacity.len()
        ));
    }
    for (k, a) in &d.attributes {
        if !is_qualified_name(k) {
            v.push(format!(
                "{who}: attribute {k:?} is not a C identifier (or domain/identifier)"
            ));
        }
        if let DeviceAttribute::String(s) = a {
            if s.len() > MAX_STRING_ATTRIBUTE {
                v.push(format!(
                    "{who}: attribute {k} is longer than {MAX_STRING_ATTRIBUTE} characters"
                ));
            }
        }
    }
    if d.capacity.keys().any(|k| d.attributes.contains_key(k)) {
        v.push(format!("{who}: an attribute and a capacity share a name"));
    }
    for (k, c) in &d.capacity {
        if !is_qualified_name(k) {
            v.push(format!(
                "{who}: capacity {k:?} is not a C identifier (or domain/identifier)"
            ));
        }
        let Some(value) = parse_quantity(&c.value) else {
            v.push(format!("{who}: capacity {k} has no valid quantity"));
            continue;
        };
        if let Some(p) = &c.request_policy {
            let vals: Vec<Option<u128>> =
                p.valid_values.iter().map(|q| parse_quantity(q)).collect();
            if vals.len() > 10 {
                v.push(format!("{who}: capacity {k} has more than 10 valid values"));
            }
            if vals.iter().any(Option::is_none) || !vals.windows(2).all(|w| w[0] < w[1]) {
                v.push(format!(
                    "{who}: capacity {k}: valid values are not ascending quantities"
                ));
            }
            if vals.iter().flatten().any(|x| *x > value) {
                v.push(format!(
                    "{who}: capacity {k}: a valid value exceeds the capacity"
                ));
            }
            if (!p.valid_values.is_empty() || p.valid_range.is_some()) && p.default.is_none() {
                v.push(format!(
                    "{who}: capacity {k}: a policy with values or a range needs a default"
                ));
            }
            if let Some(def) = &p.default {
                if !p.valid_values.is_empty() && !p.valid_values.contains(def) {
                    v.push(format!(
                        "{who}: capacity {k}: default {def} is not a valid value"
                    ));
                }
            }
        }
    }
    if d.consumes_counters.len() > MAX_CONSUMPTIONS_PER_DEVICE {
        v.push(format!(
            "{who}: {} consumesCounters entries, more than {MAX_CONSUMPTIONS_PER_DEVICE}",
            d.consumes_counters.len()
        ));
    }
    let mut sets = BTreeSet::new();
    for c in &d.consumes_counters {
        if !sets.insert(&c.counter_set) {
            v.push(format!(
                "{who}: two consumesCounters entries for set {}",
                c.counter_set
            ));
        }
        if c.counters.len() > MAX_COUNTERS {
            v.push(format!(
                "{who}: consumes more than {MAX_COUNTERS} counters of one set"
            ));
        }
    }
    for t in &d.taints {
        let (prefix, name) = t.key.split_once('/').unwrap_or(("", t.key.as_str()));
        if (!prefix.is_empty() && !is_dns_subdomain(prefix))
            || !is_label_value(name)
            || name.is_empty()
        {
            v.push(format!("{who}: taint key {:?} is not a label name", t.key));
        }
        if t.value.as_deref().is_some_and(|x| !is_label_value(x)) {
            v.push(format!("{who}: taint value is not a label value"));
        }
        let ok = match t.effect.as_str() {
            "NoSchedule" | "NoExecute" => true,
            "None" => version.has_none_effect(),
            _ => false,
        };
        if !ok {
            v.push(format!(
                "{who}: taint effect {} is not valid in Kubernetes {version}",
                t.effect
            ));
        }
    }
    if d.allow_multiple_allocations == Some(true) {
        if d.capacity.is_empty() {
            v.push(format!(
                "{who}: a multi-allocatable device declares no capacity, so the scheduler charges \
                 its counters twice (kubernetes#140433)"
            ));
        }
        for (k, c) in &d.capacity {
            if c.request_policy.is_none() {
                v.push(format!(
                    "{who}: capacity {k} of a multi-allocatable device has no request policy, so one allocation would take all of it"
                ));
            }
        }
    }
}

/// Whether `a` and `b` can both hold their counters of one set at once.
fn co_fit(a: &DeviceCounterConsumption, b: &DeviceCounterConsumption, set: &CounterSet) -> bool {
    set.counters.iter().all(|(name, have)| {
        let get = |c: &DeviceCounterConsumption| {
            c.counters
                .get(name)
                .and_then(|q| parse_quantity(&q.value))
                .unwrap_or(0)
        };
        parse_quantity(&have.value).is_some_and(|h| get(a) + get(b) <= h)
    })
}

fn check_exclusivity(
    slices: &[&ResourceSlice],
    sets: &BTreeMap<&str, &CounterSet>,
    v: &mut Vec<String>,
) {
    let mut on_set: BTreeMap<&str, Vec<(&Device, &DeviceCounterConsumption)>> = BTreeMap::new();
    for d in slices.iter().flat_map(|s| &s.spec.devices) {
        for c in &d.consumes_counters {
            on_set
                .entry(c.counter_set.as_str())
                .or_default()
                .push((d, c));
        }
    }
    for (set_name, users) in on_set {
        let Some(set) = sets.get(set_name) else {
            continue;
        };
        for (i, (a, ca)) in users.iter().enumerate() {
            for (b, cb) in users.iter().skip(i + 1) {
                if (is_exclusive_kind(a) || is_exclusive_kind(b))
                    && !same_size_instances(a, b)
                    && co_fit(ca, cb, set)
                {
                    v.push(format!(
                        "devices {} and {} can be allocated together on counter set {set_name}",
                        a.name, b.name
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gpu_core::{
        Gpu, GpuState, Health, HealthState, Instance, NodeTopology, Parent, ParentId, PciAddress,
        Pool, Profile, VgpuFramework, VgpuTypeId,
    };
    use proptest::prelude::*;

    use super::super::build::{DraOptions, Prepared, node_slices};
    use super::super::version::K8sVersion;
    use super::check;

    const SIZES: [u64; 5] = [1024, 2048, 4096, 8192, 24576];

    fn profile(id: u32, size: u64, mig: Option<u8>) -> Profile {
        let name = match mig {
            Some(s) => format!("NVIDIA X-{s}-{}C", size / 1024),
            None => format!("NVIDIA X-{}Q", size / 1024),
        };
        Profile {
            id: VgpuTypeId::from_str_unchecked(&id.to_string()),
            name,
            framebuffer_mib: Some(size),
            max_instances: None,
            available_instances: 1,
            reported_instances: None,
            device_api: "vfio-pci".into(),
            mig_slices: mig,
            mig_memory_gib: None,
            description: None,
        }
    }

    /// One GPU: (health, state, mixed, MIG, sizes offered, VFs, foreign instances of size index).
    type GpuSpec = (u8, u8, bool, bool, Vec<usize>, u8, Vec<usize>);

    fn gpu_spec() -> impl Strategy<Value = GpuSpec> {
        (
            0u8..4,
            0u8..3,
            any::<bool>(),
            any::<bool>(),
            proptest::collection::vec(0usize..SIZES.len(), 0..4),
            0u8..6,
            proptest::collection::vec(0usize..SIZES.len(), 0..3),
        )
    }

    /// A node of GPUs with unique addresses, each with VFs offering time-sliced (and maybe
    /// MIG-backed) profiles and perhaps vGPUs made outside Kubernetes.
    fn node(specs: &[GpuSpec]) -> NodeTopology {
        let mut t = NodeTopology::new("node-a");
        for (i, (health, state, mixed, mig, sizes, vfs, foreign)) in specs.iter().enumerate() {
            let bus = u8::try_from(0x10 + i).unwrap_or(0xff);
            let addr = PciAddress::new(0, bus, 0, 0).unwrap_or_else(|_| unreachable!());
            let mut g = Gpu::new(format!("nvidia{i}"), addr, 0x10de, 0x2335, 0x030200);
            g.memory_mib = Some(49152);
            g.numa_node = Some(u32::from(bus % 2));
            g.health = Health {
                state: [
                    HealthState::Healthy,
                    HealthState::Degraded,
                    HealthState::Unhealthy,
                    HealthState::Unknown,
                ][usize::from(*health)],
                reasons: vec![],
            };
            g.state = [GpuState::Free, GpuState::InUse, GpuState::Blocked][usize::from(*state)];
            let mut profiles: Vec<Profile> = sizes
                .iter()
                .map(|s| profile(1000 + *s as u32, SIZES[*s], None))
                .collect();
            if *mig {
                profiles.push(profile(2001, 6144, Some(1)));
                profiles.push(profile(2002, 12288, Some(2)));
                profiles.push(profile(2007, 49152, Some(7)));
            }
            if !profiles.is_empty() || *vfs > 0 {
                g.vgpu_framework = Some(VgpuFramework::VendorVfio);
            }
            let foreign: Vec<usize> = if *mixed {
                foreign.clone()
            } else {
                foreign
                    .first()
                    .map(|f| vec![*f; foreign.len()])
                    .unwrap_or_default()
            };
            let mut used = 0;
            for n in 0..*vfs {
                let vf = PciAddress::new(0, bus, 0, 1 + n).unwrap_or_else(|_| unreachable!());
                let instances = match foreign.get(usize::from(n)) {
                    Some(s) if used + SIZES[*s] <= 49152 => {
                        used += SIZES[*s];
                        vec![Instance {
                            uuid: None,
                            address: Some(vf),
                            profile: VgpuTypeId::from_str_unchecked(
                                &(1000 + *s as u32).to_string(),
                            ),
                            profile_name: None,
                            framebuffer_mib: Some(SIZES[*s]),
                            in_use: None,
                            placement_id: None,
                        }]
                    }
                    _ => vec![],
                };
                t.mediated_devices.parents.push(Parent {
                    id: ParentId::Pci(vf),
                    gpu: Some(addr),
                    framework: VgpuFramework::VendorVfio,
                    health: g.health.clone(),
                    profiles: profiles.clone(),
                    instances,
                    warnings: vec![],
                });
            }
            t.mediated_devices.pools.push(Pool {
                gpu: ParentId::Pci(addr),
                parents: vec![],
                total_mib: 49152,
                used_mib: used,
                size_locked_mib: (used > 0 && !*mixed)
                    .then(|| foreign.first().map_or(0, |f| SIZES[*f])),
                mixed_size: *mixed,
                mig_slices_total: mig.then_some(7),
                mig_slices_used: mig.then_some(0),
                mig_slots: None,
            });
            t.gpus.push(g);
        }
        t
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_export_holds_the_rules_of_its_version(
            specs in proptest::collection::vec(gpu_spec(), 0..12)
        ) {
            let t = node(&specs);
            for version in [K8sVersion::V1_34, K8sVersion::V1_35, K8sVersion::V1_36, K8sVersion::V1_36_2, K8sVersion::V1_37] {
                let opts = DraOptions { version, ..DraOptions::default() };
                match node_slices(&t, &opts) {
                    Ok(s) => {
                        let v = check(&s.slices, version);
                        prop_assert!(v.is_empty(), "{version}: {v:?}");
                        // Never more vGPUs of a size than gpu-core's pool accounting allows
                        // (one device per vGPU before 1.36.2, an `instances` capacity after).
                        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
                        for d in s.slices.iter().flat_map(|x| &x.spec.devices) {
                            if !d.name.starts_with("vgpu-") || d.name.ends_with("-mixed") {
                                continue;
                            }
                            match d.name.rsplit_once("mi-") {
                                Some((base, _)) => {
                                    prop_assert!(!version.counts_committed_shares(), "{version}: {}", d.name);
                                    *counts.entry(format!("{base}mi")).or_default() += 1;
                                }
                                None => {
                                    prop_assert!(version.counts_committed_shares(), "{version}: {}", d.name);
                                    let n = d.capacity["instances"].value.parse::<u32>().unwrap_or(0);
                                    *counts.entry(d.name.clone()).or_default() += n;
                                }
                            }
                        }
                        for (name, n) in counts {
                            let rest = name.trim_start_matches("vgpu-");
                            let Some(size) = rest
                                .rsplit('-')
                                .next()
                                .and_then(|x| x.strip_suffix("mi"))
                                .and_then(|x| x.parse::<u64>().ok())
                            else {
                                continue;
                            };
                            let label = &rest[..rest.len() - size.to_string().len() - 3];
                            let pool = t
                                .mediated_devices
                                .pools
                                .iter()
                                .find(|p| p.gpu.to_string().replace([':', '.'], "-") == label)
                                .unwrap_or_else(|| unreachable!());
                            let allowed = pool.creatable(&profile(0, size, None));
                            prop_assert!(n <= allowed, "{name}: {n} > {allowed}");
                        }
                    }
                    Err(e) => prop_assert!(
                        version == K8sVersion::V1_34 && e.to_string().contains("more than one ResourceSlice"),
                        "{version}: {e}"
                    ),
                }
            }
        }

        #[test]
        fn export_ignores_gpu_order_and_prepared_instances_only_add_capacity(
            specs in proptest::collection::vec(gpu_spec(), 1..6)
        ) {
            let t = node(&specs);
            let mut reversed = t.clone();
            reversed.gpus.reverse();
            let opts = DraOptions::default();
            let a = node_slices(&t, &opts).map(|s| s.slices).map_err(|e| e.to_string());
            let b = node_slices(&reversed, &opts).map(|s| s.slices).map_err(|e| e.to_string());
            prop_assert_eq!(&a, &b);

            // Declaring every existing vGPU as the scheduler's own never shrinks a counter.
            let mut prepared = Prepared::default();
            for p in &t.mediated_devices.parents {
                for i in &p.instances {
                    if let Some(addr) = i.address {
                        prepared.instances.insert(addr.to_string());
                    }
                }
            }
            let owned = DraOptions {
                prepared: BTreeMap::from([("node-a".to_owned(), prepared)]),
                ..DraOptions::default()
            };
            let counters = |slices: &[super::ResourceSlice]| -> BTreeMap<String, u128> {
                slices
                    .iter()
                    .flat_map(|s| &s.spec.shared_counters)
                    .map(|c| {
                        let fb = c.counters.get("framebuffer")
                            .and_then(|q| super::parse_quantity(&q.value))
                            .unwrap_or(0);
                        (c.name.clone(), fb)
                    })
                    .collect()
            };
            if let (Ok(base), Ok(mine)) = (a, node_slices(&t, &owned)) {
                let (base, mine) = (counters(&base), counters(&mine.slices));
                for (set, fb) in &base {
                    prop_assert!(mine.get(set).is_some_and(|m| m >= fb), "{set}");
                }
            }
        }
    }
}
