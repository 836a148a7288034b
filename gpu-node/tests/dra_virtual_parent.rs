//! DRA on a virtual mdev parent (the kernel's sample `mbochs`, not a function of a PCI GPU), on
//! the fake kernel's sample drivers: its slices (its own counter set, devices named from the
//! parent; mtty's serial ports and mdpy's displays without a stated memory are not offered), a
//! prepare that makes the mdev with the derived UUID or the share ID, an unprepare that removes
//! it, and an mdev made by hand shrinking the counters.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use gpu_core::NodeTopology;
use gpu_integrations::dra::build::{DraOptions, node_slices};
use gpu_integrations::dra::model::{Device, Object, PrepareInput, ResourceSlice};
use gpu_integrations::dra::prepare::PrepareAction;
use gpu_integrations::dra::{Claim, ClaimStore, DraNode, K8sVersion, PrepareOptions, export};
use gpu_node::dra::{prepare_claim, unprepare_claim};
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::{Host, actuate};
use serde_json::json;

const NODE: &str = "node-a";
const DRIVER: &str = "gpu.gpuslice.dev";
const SHARE: &str = "5f0b4e3a-9c1d-4c7e-8a55-2f6d0b9e1a77";
const BY_HAND: &str = "0c0ffee0-0000-4000-8000-000000000001";

fn kernel() -> Arc<FakeKernel> {
    Arc::new(FakeKernel::sample_mdev_drivers().unwrap())
}

fn topology(host: &dyn Host) -> NodeTopology {
    discover(host, &DiscoverOptions::new(NODE)).unwrap()
}

fn options(version: K8sVersion, host: &Arc<FakeKernel>) -> DraOptions {
    let store = ClaimStore::on_host(Arc::clone(host) as Arc<dyn Host>);
    DraOptions {
        version,
        prepared: store.read_prepared().unwrap(),
        ..DraOptions::default()
    }
}

/// The node's slices, checked against the version's rules by the export.
fn slices(host: &Arc<FakeKernel>, version: K8sVersion) -> (Vec<ResourceSlice>, Vec<String>) {
    let t = topology(&**host);
    let opts = options(version, host);
    let e = export(std::slice::from_ref(&t), &opts).unwrap_or_else(|e| panic!("{version}: {e}"));
    let s = e
        .objects
        .into_iter()
        .filter_map(|o| match o {
            Object::Slice(s) => Some(s),
            _ => None,
        })
        .collect();
    (s, e.warnings)
}

fn devices(s: &[ResourceSlice]) -> Vec<&Device> {
    s.iter().flat_map(|s| &s.spec.devices).collect()
}

fn framebuffer(s: &[ResourceSlice], set: &str) -> Option<String> {
    s.iter()
        .flat_map(|s| &s.spec.shared_counters)
        .find(|c| c.name == set)
        .and_then(|c| c.counters.get("framebuffer"))
        .map(|c| c.value.clone())
}

fn claim(uid: &str, result: serde_json::Value, profile: Option<&str>) -> Claim {
    let mut devices = json!({"results": [result]});
    if let Some(p) = profile {
        devices["config"] = json!([{"opaque": {"driver": DRIVER, "parameters": {"profile": p}}}]);
    }
    let doc = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "vm-display", "namespace": "default", "uid": uid},
        "status": {"allocation": {"devices": devices}},
    });
    let input: PrepareInput = serde_json::from_value(doc).unwrap();
    Claim::from_input(input, None).unwrap()
}

fn prepare(
    host: &Arc<FakeKernel>,
    c: &Claim,
) -> gpu_integrations::Result<gpu_integrations::dra::ClaimResult> {
    let t = topology(&**host);
    let node = DraNode {
        host: &**host,
        topology: &t,
        recording: false,
    };
    let store = ClaimStore::on_host(Arc::clone(host) as Arc<dyn Host>);
    prepare_claim(
        &node,
        &store,
        c,
        &PrepareOptions {
            driver: DRIVER.into(),
            dry_run: false,
        },
    )
}

fn mdevs(host: &FakeKernel) -> Vec<String> {
    host.list("sys/bus/mdev/devices").unwrap_or_default()
}

#[test]
fn a_virtual_display_parent_is_its_own_counter_set_and_other_sample_parents_are_not_offered() {
    let k = kernel();
    let (s, warnings) = slices(&k, K8sVersion::V1_34);
    assert_eq!(framebuffer(&s, "mdev-mbochs").as_deref(), Some("256Mi"));
    let names: Vec<&str> = devices(&s).iter().map(|d| d.name.as_str()).collect();
    // Before 1.36.2: one device per vGPU of the largest type (mbochs-large, 64 MiB): 4 fit.
    assert_eq!(
        names,
        [
            "vgpu-mdev-mbochs-64mi-0",
            "vgpu-mdev-mbochs-64mi-1",
            "vgpu-mdev-mbochs-64mi-2",
            "vgpu-mdev-mbochs-64mi-3"
        ]
    );
    let d = devices(&s)[0];
    let attr = |k: &str| serde_json::to_value(&d.attributes[k]).unwrap();
    assert_eq!(attr("type"), json!({"string": "vgpu"}));
    assert_eq!(attr("mdevParent"), json!({"string": "mbochs"}));
    assert_eq!(attr("virtualParent"), json!({"bool": true}));
    assert_eq!(attr("framebufferMiB"), json!({"int": 64}));
    assert_eq!(attr("profile_mbochs_large"), json!({"bool": true}));
    assert_eq!(d.consumes_counters[0].counter_set, "mdev-mbochs");
    assert_eq!(d.consumes_counters[0].counters["framebuffer"].value, "64Mi");
    // mtty's serial ports and mdpy's displays state no memory: not offered, and said so.
    assert!(
        !names
            .iter()
            .any(|n| n.contains("mtty") || n.contains("mdpy"))
    );
    for p in ["mtty", "mdpy"] {
        assert!(
            warnings
                .iter()
                .any(|w| w.contains(&format!("mdev parent {p} not published"))),
            "{p}: {warnings:?}"
        );
    }

    // 1.36.2 and later: one multi-allocatable device of every size.
    let (s, _) = slices(&k, K8sVersion::V1_36_2);
    let names: Vec<&str> = devices(&s).iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["vgpu-mdev-mbochs-mixed"]);
    let d = devices(&s)[0];
    assert_eq!(d.allow_multiple_allocations, Some(true));
    let fb = &d.capacity["framebuffer"];
    assert_eq!(fb.value, "256Mi");
    assert_eq!(
        fb.request_policy.as_ref().unwrap().valid_values,
        ["4Mi", "16Mi", "64Mi"]
    );
}

#[test]
fn an_mdev_made_by_hand_shrinks_the_counters_and_its_removal_gives_them_back() {
    let k = kernel();
    let t = topology(&*k);
    let before = node_slices(&t, &options(K8sVersion::V1_34, &k)).unwrap();
    assert_eq!(
        framebuffer(&before.slices, "mdev-mbochs").as_deref(),
        Some("256Mi")
    );
    actuate::create_mdev(
        &*k,
        &actuate::MdevCreate {
            parent: "mbochs".parse().unwrap(),
            type_id: "mbochs-small".parse().unwrap(),
            uuid: BY_HAND.parse().unwrap(),
        },
    )
    .unwrap();
    let (s, _) = slices(&k, K8sVersion::V1_34);
    assert_eq!(framebuffer(&s, "mdev-mbochs").as_deref(), Some("252Mi"));
    assert_eq!(devices(&s).len(), 3, "252 MiB hold three 64 MiB vGPUs");
    let (s, _) = slices(&k, K8sVersion::V1_36_2);
    assert_eq!(devices(&s)[0].capacity["framebuffer"].value, "252Mi");
    actuate::remove_mdev(&*k, &BY_HAND.parse().unwrap(), false).unwrap();
    let (s, _) = slices(&k, K8sVersion::V1_34);
    assert_eq!(framebuffer(&s, "mdev-mbochs").as_deref(), Some("256Mi"));
    assert_eq!(devices(&s).len(), 4);
}

#[test]
fn an_instance_device_is_prepared_as_an_mdev_with_a_derived_uuid_and_unprepared() {
    let k = kernel();
    let result = json!({"request": "display", "driver": DRIVER, "pool": NODE,
                        "device": "vgpu-mdev-mbochs-64mi-1"});
    let done = prepare(&k, &claim("uid-1", result.clone(), None)).unwrap();
    let [
        PrepareAction::CreateMdev {
            parent,
            type_id,
            uuid,
            ..
        },
    ] = &done.claim.actions[..]
    else {
        panic!("{:?}", done.claim.actions);
    };
    assert_eq!(parent.to_string(), "mbochs");
    assert_eq!(type_id.as_str(), "mbochs-large");
    assert_eq!(mdevs(&k), [uuid.to_string()]);
    assert_eq!(done.devices.len(), 1);
    assert_eq!(done.devices[0].mdev_uuid, Some(*uuid));
    assert_eq!(done.devices[0].pci_address, None);
    // The UUID is the claim's: the same claim again is answered from its record, unchanged.
    let again = prepare(&k, &claim("uid-1", result.clone(), None)).unwrap();
    assert!(again.unchanged);
    assert_eq!(again.devices, done.devices);
    // Another claim gets another UUID for the same device name.
    let other = prepare(&k, &claim("uid-2", result, None)).unwrap();
    assert_ne!(other.devices[0].mdev_uuid, Some(*uuid));
    // What the claims hold is counted by the scheduler, not subtracted from the counters.
    let (s, _) = slices(&k, K8sVersion::V1_34);
    assert_eq!(framebuffer(&s, "mdev-mbochs").as_deref(), Some("256Mi"));
    assert_eq!(devices(&s).len(), 4);

    let store = ClaimStore::on_host(Arc::clone(&k) as Arc<dyn Host>);
    let gone = unprepare_claim(&*k, false, &store, "uid-1", false).unwrap();
    assert_eq!(gone.removed.len(), 1);
    assert!(!mdevs(&k).contains(&uuid.to_string()));
    unprepare_claim(&*k, false, &store, "uid-2", false).unwrap();
    assert!(mdevs(&k).is_empty());
}

#[test]
fn the_mixed_device_makes_the_type_the_reservation_names_with_the_share_id() {
    let k = kernel();
    let result = json!({"request": "display", "driver": DRIVER, "pool": NODE,
                        "device": "vgpu-mdev-mbochs-mixed", "shareID": SHARE,
                        "consumedCapacity": {"framebuffer": "16Mi"}});
    let done = prepare(&k, &claim("uid-1", result.clone(), None)).unwrap();
    let [PrepareAction::CreateMdev { type_id, uuid, .. }] = &done.claim.actions[..] else {
        panic!("{:?}", done.claim.actions);
    };
    assert_eq!(type_id.as_str(), "mbochs-medium");
    assert_eq!(uuid.to_string(), SHARE);
    assert_eq!(mdevs(&k), [SHARE]);

    // A profile that does not fit the reservation is refused, nothing made.
    let big = claim("uid-2", result.clone(), Some("mbochs-large"));
    let e = prepare(&k, &big).unwrap_err();
    assert!(e.to_string().contains("does not fit the 16Mi"), "{e}");
    assert_eq!(mdevs(&k), [SHARE]);
}

#[test]
fn unknown_parents_sizes_and_profiles_are_refused_with_nothing_made() {
    let k = kernel();
    for (device, profile, want) in [
        (
            "vgpu-mdev-nosuch-64mi-0",
            None,
            "names no virtual mdev parent",
        ),
        ("vgpu-mdev-mtty-64mi-0", None, "offers no display type"),
        ("vgpu-mdev-mbochs-32mi-0", None, "offers no display type"),
        (
            "vgpu-mdev-mbochs-64mi-0",
            Some("mbochs-small"),
            "does not offer profile mbochs-small",
        ),
        (
            "vgpu-mdev-mbochs-mixed",
            None,
            "name one in the claim's opaque config",
        ),
    ] {
        let result = json!({"request": "display", "driver": DRIVER, "pool": NODE,
                            "device": device});
        let e = prepare(&k, &claim("uid-x", result, profile)).unwrap_err();
        assert!(e.to_string().contains(want), "{device}: {e}");
        assert!(mdevs(&k).is_empty(), "{device}");
    }
}
