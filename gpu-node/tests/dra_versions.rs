//! The DRA encoding per Kubernetes version, as a property: for random hosts on the fake kernel and
//! random sequences of claims that the slices published for version V allow under V's scheduler
//! (modelled here from the allocator's counter rules, `shared/DRA-FACTS.md`), `prepare_claim` of
//! each allowed claim succeeds, a repeat answers the same without a write, and unprepare undoes it.
//!
//! The scheduler model, for a multi-allocatable device that consumes counters:
//! - 1.34: counters charged per share inside one claim; committed shares not counted later;
//! - 1.35.0–1.36.1: charged once per device inside one claim; committed shares not counted later;
//! - 1.36.2+: charged once per device, inside a claim and across scheduling cycles.
//!
//! Devices that are not multi-allocatable are allocated once and always charged; each allocation
//! of a multi-allocatable device takes every capacity it declares (its request policy's default).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use gpu_core::{NodeTopology, ParentId, PciAddress, nvidia};
use gpu_integrations::dra::model::{Object, PrepareInput, ResourceSlice};
use gpu_integrations::dra::names::parse_quantity;
use gpu_integrations::dra::{
    Claim, ClaimStore, DraNode, DraOptions, K8sVersion, PrepareOptions, export,
};
use gpu_node::dra::{prepare_claim, unprepare_claim};
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::testing::fake_kernel::L40S_TYPES;
use proptest::prelude::*;
use serde_json::json;

const NODE: &str = "node-a";
const DRIVER: &str = "gpu.gpuslice.dev";

const VERSIONS: [K8sVersion; 5] = [
    K8sVersion::V1_34,
    K8sVersion::V1_35,
    K8sVersion::V1_36,
    K8sVersion::V1_36_2,
    K8sVersion::V1_37,
];

/// A host to start from.
#[derive(Debug, Clone)]
enum HostSpec {
    /// An L40S in the vendor-VFIO framework with `vfs` VFs, the first `typed` of them holding a
    /// vGPU of `size_gb` made outside Kubernetes.
    L40s { vfs: u32, typed: u32, size_gb: u64 },
    /// An A2 whose 16 VFs are mdev parents.
    A2,
    /// Whole GPUs for passthrough.
    Passthrough,
}

fn host_spec() -> impl Strategy<Value = HostSpec> {
    prop_oneof![
        (
            1u32..8,
            0u32..3,
            prop::sample::select(vec![4u64, 8, 12, 24])
        )
            .prop_map(|(vfs, typed, size_gb)| HostSpec::L40s {
                vfs,
                typed: typed.min(vfs),
                size_gb
            }),
        Just(HostSpec::A2),
        Just(HostSpec::Passthrough),
    ]
}

fn topology(k: &FakeKernel) -> NodeTopology {
    discover(k, &DiscoverOptions::new(NODE)).unwrap()
}

fn build(spec: &HostSpec) -> FakeKernel {
    match spec {
        HostSpec::L40s {
            vfs,
            typed,
            size_gb,
        } => {
            let k = FakeKernel::l40s_vendor_vfio_host(*vfs).unwrap();
            let name = format!("NVIDIA L40S-{size_gb}Q");
            let (num, _) = L40S_TYPES.iter().find(|(_, n)| *n == name).unwrap();
            let t = topology(&k);
            let mut vfs: Vec<PciAddress> = t
                .mediated_devices
                .parents
                .iter()
                .filter_map(|p| match p.id {
                    ParentId::Pci(a) => Some(a),
                    ParentId::Named(_) => None,
                })
                .collect();
            vfs.sort();
            for vf in vfs.iter().take(*typed as usize) {
                gpu_sysfs::actuate::set_vf_type(&k, vf, *num, false).unwrap();
            }
            k
        }
        HostSpec::A2 => FakeKernel::a2_mdev_host().unwrap(),
        HostSpec::Passthrough => FakeKernel::passthrough_host().unwrap(),
    }
}

/// The fake kernel's node, as a front-end opens it.
fn dra_node<'a>(k: &'a FakeKernel, t: &'a NodeTopology) -> DraNode<'a> {
    DraNode {
        host: k,
        topology: t,
        recording: false,
    }
}

/// A prepare that writes.
fn prepare_options() -> PrepareOptions {
    PrepareOptions {
        driver: DRIVER.into(),
        dry_run: false,
    }
}

/// The Q profile of `size_mib` on `gpu` (each claim names its profile).
fn q_profile(t: &NodeTopology, gpu: PciAddress, size_mib: u64) -> Option<String> {
    t.mediated_devices
        .parents
        .iter()
        .filter(|p| p.gpu == Some(gpu))
        .flat_map(|p| &p.profiles)
        .map(|p| nvidia::strip_prefix(&p.name).to_owned())
        .find(|n| {
            n.ends_with('Q')
                && nvidia::VgpuTypeName::parse(n).is_ok_and(|x| x.framebuffer_mib() == size_mib)
        })
}

/// A published device, as the scheduler model sees it.
#[derive(Debug, Clone)]
struct Dev {
    name: String,
    multi: bool,
    /// Counter set → counter → amount consumed.
    consumes: BTreeMap<String, BTreeMap<String, u128>>,
    /// Capacity → (value, taken per allocation).
    capacity: BTreeMap<String, (u128, u128)>,
    gpu: Option<PciAddress>,
    size_mib: Option<u64>,
}

/// The published devices and counter sets of the slices.
fn model(slices: &[ResourceSlice]) -> (Vec<Dev>, BTreeMap<String, BTreeMap<String, u128>>) {
    let q = |s: &str| parse_quantity(s).unwrap();
    let mut sets = BTreeMap::new();
    let mut devs = vec![];
    for s in slices {
        for c in &s.spec.shared_counters {
            sets.insert(
                c.name.clone(),
                c.counters
                    .iter()
                    .map(|(k, v)| (k.clone(), q(&v.value)))
                    .collect(),
            );
        }
        for d in &s.spec.devices {
            let mut consumes: BTreeMap<String, BTreeMap<String, u128>> = BTreeMap::new();
            for c in &d.consumes_counters {
                let e = consumes.entry(c.counter_set.clone()).or_default();
                for (k, v) in &c.counters {
                    *e.entry(k.clone()).or_default() += q(&v.value);
                }
            }
            let capacity = d
                .capacity
                .iter()
                .map(|(k, c)| {
                    let value = q(&c.value);
                    let per = c
                        .request_policy
                        .as_ref()
                        .and_then(|p| p.default.as_deref())
                        .map_or(value, q);
                    (k.clone(), (value, per))
                })
                .collect();
            let parsed = d.name.parse::<gpu_integrations::dra::DeviceName>().unwrap();
            let size_mib = match parsed {
                gpu_integrations::dra::DeviceName::Vgpu(_, s)
                | gpu_integrations::dra::DeviceName::VgpuInstance(_, s, _) => Some(s),
                _ => None,
            };
            devs.push(Dev {
                name: d.name.clone(),
                multi: d.allow_multiple_allocations == Some(true),
                consumes,
                capacity,
                gpu: Some(parsed.gpu()),
                size_mib,
            });
        }
    }
    (devs, sets)
}

/// Whether version `v`'s scheduler allocates `claim` (device indices) beside `committed`.
fn allows(
    v: K8sVersion,
    devs: &[Dev],
    sets: &BTreeMap<String, BTreeMap<String, u128>>,
    committed: &[Vec<usize>],
    claim: &[usize],
) -> bool {
    let all: Vec<usize> = committed.iter().flatten().chain(claim).copied().collect();
    // A device that is not multi-allocatable goes to one request at a time.
    let mut once = BTreeSet::new();
    for &i in &all {
        if !devs[i].multi && !once.insert(i) {
            return false;
        }
    }
    // Every allocation takes every capacity the device declares.
    let mut taken: BTreeMap<(usize, &str), u128> = BTreeMap::new();
    for &i in &all {
        for (k, (value, per)) in &devs[i].capacity {
            let t = taken.entry((i, k.as_str())).or_default();
            *t += per;
            if *t > *value {
                return false;
            }
        }
    }
    // Counters.
    let mut charged: Vec<usize> = vec![];
    let committed_multi: BTreeSet<usize> = committed
        .iter()
        .flatten()
        .copied()
        .filter(|i| devs[*i].multi)
        .collect();
    for &i in committed.iter().flatten() {
        if !devs[i].multi {
            charged.push(i);
        }
    }
    if v.counts_committed_shares() {
        charged.extend(committed_multi.iter().copied());
    }
    let mut in_claim = BTreeSet::new();
    for &i in claim {
        if !devs[i].multi || v < K8sVersion::V1_35 {
            charged.push(i); // per share on 1.34
        } else if in_claim.insert(i)
            && !(v.counts_committed_shares() && committed_multi.contains(&i))
        {
            charged.push(i);
        }
    }
    let mut used: BTreeMap<(&str, &str), u128> = BTreeMap::new();
    for i in charged {
        for (set, counters) in &devs[i].consumes {
            for (c, n) in counters {
                let u = used.entry((set.as_str(), c.as_str())).or_default();
                *u += n;
                let have = sets.get(set).and_then(|s| s.get(c)).copied().unwrap_or(0);
                if *u > have {
                    return false;
                }
            }
        }
    }
    true
}

fn claim_doc(uid: &str, n: usize, picks: &[usize], devs: &[Dev], t: &NodeTopology) -> Claim {
    let mut results = vec![];
    let mut config = vec![];
    for (r, &i) in picks.iter().enumerate() {
        let d = &devs[i];
        let request = format!("r{r}");
        let mut result = json!({
            "request": request, "driver": DRIVER, "pool": NODE, "device": d.name,
        });
        if d.multi {
            result["shareID"] = json!(format!("00000000-0000-4000-8000-{:06x}{r:06x}", n));
        }
        results.push(result);
        if let (Some(gpu), Some(size)) = (d.gpu, d.size_mib) {
            if let Some(p) = q_profile(t, gpu, size) {
                config.push(json!({"requests": [request], "opaque": {
                    "driver": DRIVER, "parameters": {"profile": p}}}));
            }
        }
    }
    let doc = json!({
        "metadata": {"uid": uid, "name": uid, "namespace": "default"},
        "status": {"allocation": {"devices": {"results": results, "config": config}}},
    });
    let input: PrepareInput = serde_json::from_value(doc).unwrap();
    Claim::from_input(input, None).unwrap()
}

/// One step of a sequence: a claim of some devices, or the unprepare of an earlier claim.
#[derive(Debug, Clone)]
enum Step {
    Claim(Vec<usize>),
    Unprepare(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::collection::vec(0usize..64, 1..4).prop_map(Step::Claim),
        1 => (0usize..8).prop_map(Step::Unprepare),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn every_allocation_a_versions_slices_allow_prepares_on_the_node(
        spec in host_spec(),
        version in prop::sample::select(VERSIONS.to_vec()),
        size_for_gb in prop::option::weighted(0.8, prop::sample::select(vec![2u64, 4, 8, 12, 16, 24])),
        steps in prop::collection::vec(step(), 1..10),
    ) {
        let k = build(&spec);
        let t0 = topology(&k);
        let mut opts = DraOptions { version, ..DraOptions::default() };
        if let Some(gb) = size_for_gb {
            for g in &t0.gpus {
                if let Some(p) = q_profile(&t0, g.address, gb * 1024) {
                    opts.size_for.insert(g.address, p);
                }
            }
        }
        let exported = export(std::slice::from_ref(&t0), &opts).unwrap();
        let slices: Vec<ResourceSlice> = exported
            .objects
            .into_iter()
            .filter_map(|o| match o {
                Object::Slice(s) => Some(s),
                _ => None,
            })
            .collect();
        let (devs, sets) = model(&slices);
        prop_assume!(!devs.is_empty());
        let state = tempfile::tempdir().unwrap();
        let store = ClaimStore::open(state.path(), None).unwrap();
        let prepare = prepare_options();
        let mut committed: Vec<(String, Vec<usize>)> = vec![];
        for (n, s) in steps.iter().enumerate() {
            match s {
                Step::Claim(picks) => {
                    let picks: Vec<usize> = picks.iter().map(|p| p % devs.len()).collect();
                    let held: Vec<Vec<usize>> = committed.iter().map(|(_, p)| p.clone()).collect();
                    if !allows(version, &devs, &sets, &held, &picks) {
                        continue;
                    }
                    let uid = format!("claim-{n}");
                    let t = topology(&k);
                    let node = dra_node(&k, &t);
                    let claim = claim_doc(&uid, n, &picks, &devs, &t);
                    let names: Vec<&str> = picks.iter().map(|i| devs[*i].name.as_str()).collect();
                    let done = prepare_claim(&node, &store, &claim, &prepare);
                    prop_assert!(
                        done.is_ok(),
                        "{version}: {names:?} after {:?}: {}",
                        committed,
                        done.err().map(|e| e.to_string()).unwrap_or_default()
                    );
                    let done = done.unwrap();
                    prop_assert_eq!(done.devices.len(), picks.len());
                    let writes = k.writes().len();
                    let again = prepare_claim(&node, &store, &claim, &prepare).unwrap();
                    prop_assert!(again.unchanged);
                    prop_assert_eq!(&again.claim, &done.claim);
                    prop_assert_eq!(k.writes().len(), writes, "a repeat writes nothing");
                    committed.push((uid, picks));
                }
                Step::Unprepare(i) if !committed.is_empty() => {
                    let (uid, _) = committed.remove(i % committed.len());
                    let r = unprepare_claim(&k, false, &store, &uid, false);
                    prop_assert!(r.is_ok(), "{version}: unprepare {uid}: {:?}", r.err());
                }
                Step::Unprepare(_) => {}
            }
        }
        // An unknown claim unprepares as nothing.
        let none = unprepare_claim(&k, false, &store, "never-prepared", false).unwrap();
        prop_assert!(none.removed.is_empty());
    }
}

#[test]
fn a_claim_of_two_sizes_on_one_gpu_is_refused_naming_both_before_any_write() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let t = topology(&k);
    let doc = json!({
        "metadata": {"uid": "two-sizes"},
        "status": {"allocation": {"devices": {
            "results": [
                {"request": "a", "driver": DRIVER, "pool": NODE,
                 "device": "vgpu-0000-26-00-0-8192mi-0"},
                {"request": "b", "driver": DRIVER, "pool": NODE,
                 "device": "vgpu-0000-26-00-0-4096mi-0"},
            ],
            "config": [
                {"requests": ["a"], "opaque": {"driver": DRIVER, "parameters": {"profile": "L40S-8Q"}}},
                {"requests": ["b"], "opaque": {"driver": DRIVER, "parameters": {"profile": "L40S-4Q"}}},
            ],
        }}},
    });
    let claim = Claim::from_input(serde_json::from_value(doc).unwrap(), None).unwrap();
    let state = tempfile::tempdir().unwrap();
    let store = ClaimStore::open(state.path(), None).unwrap();
    let node = dra_node(&k, &t);
    let opts = prepare_options();
    let before = k.writes().len();
    let e = prepare_claim(&node, &store, &claim, &opts).unwrap_err();
    assert_eq!(e.kind(), gpu_core::ErrorKind::InvalidRequest);
    let m = e.to_string();
    assert!(
        m.contains("GPU 0000:26:00.0") && m.contains("4096 MiB") && m.contains("8192 MiB"),
        "{m}"
    );
    assert_eq!(k.writes().len(), before, "nothing was written");
    assert!(
        store.read("two-sizes").unwrap().is_none(),
        "nothing recorded"
    );
}

#[test]
fn a_claim_of_the_locked_size_is_prepared_and_one_of_another_size_refused() {
    // A VF already holds an L40S-24Q made outside Kubernetes: the GPU is locked to 24 GB.
    let k = build(&HostSpec::L40s {
        vfs: 4,
        typed: 1,
        size_gb: 24,
    });
    let t = topology(&k);
    let state = tempfile::tempdir().unwrap();
    let store = ClaimStore::open(state.path(), None).unwrap();
    let node = dra_node(&k, &t);
    let opts = prepare_options();
    let claim = |uid: &str, device: &str, profile: &str| {
        let doc = json!({
            "metadata": {"uid": uid},
            "status": {"allocation": {"devices": {
                "results": [{"request": "v", "driver": DRIVER, "pool": NODE, "device": device}],
                "config": [{"opaque": {"driver": DRIVER, "parameters": {"profile": profile}}}],
            }}},
        });
        Claim::from_input(serde_json::from_value(doc).unwrap(), None).unwrap()
    };
    let before = k.writes().len();
    let e = prepare_claim(
        &node,
        &store,
        &claim("small", "vgpu-0000-26-00-0-8192mi-0", "L40S-8Q"),
        &opts,
    )
    .unwrap_err();
    assert!(e.to_string().contains("8192 MiB and 24576 MiB"), "{e}");
    assert_eq!(k.writes().len(), before, "nothing was written");
    let done = prepare_claim(
        &node,
        &store,
        &claim("same", "vgpu-0000-26-00-0-24576mi-0", "L40S-24Q"),
        &opts,
    )
    .unwrap();
    let d = &done.devices[0];
    assert_eq!(d.device, "vgpu-0000-26-00-0-24576mi-0");
    assert_eq!(d.pool, NODE);
    assert!(d.pci_address.is_some() && d.mdev_uuid.is_none());
}
