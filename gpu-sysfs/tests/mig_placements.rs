#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Existing MIG-backed vGPUs hold their real GPU-instance slots when the type-name source
//! (NVML on a real host; an in-memory one here) reports the placements and they agree with
//! sysfs; otherwise each is held wherever it may sit, and a disagreement is said on the GPU.

use std::sync::Arc;

use gpu_core::{MigPlaced, NodeTopology, ParentId, PciAddress, Pool, Profile};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::resolver::{GpuInstancePlacement, GpuInstances, InMemoryResolver};
use gpu_sysfs::testing::fixtures::{h200_mig_host, h200_pf, h200_vf};

/// Two VFs each hold an `H200X-1-18C` (type 1414).
const TWO_1G: &[(u32, u32)] = &[(0, 1414), (1, 1414)];

fn pf() -> PciAddress {
    h200_pf(0).parse().unwrap()
}

fn gi(id: u32, compute_slices: u32, start: u32, size: u32) -> GpuInstancePlacement {
    GpuInstancePlacement {
        id,
        compute_slices,
        start,
        size,
    }
}

fn discover_with(listed: &[u32], instances: Option<GpuInstances>) -> NodeTopology {
    let tree = h200_mig_host(TWO_1G, listed).unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let mut opts = DiscoverOptions::new("h200");
    if let Some(i) = instances {
        opts = opts.with_resolver(Arc::new(
            InMemoryResolver::new().with_gpu_instances(pf(), i),
        ));
    }
    discover(&host, &opts).unwrap()
}

fn pool(t: &NodeTopology) -> Pool {
    t.pool(&ParentId::Pci(pf())).unwrap().clone()
}

/// The type `id` as a free VF lists it.
fn listed_profile(t: &NodeTopology, id: &str) -> Profile {
    let free = t
        .parent(&ParentId::Pci(h200_vf(0, 2).parse().unwrap()))
        .unwrap();
    free.profiles
        .iter()
        .find(|p| p.id.as_str() == id)
        .unwrap()
        .clone()
}

fn mig_notes(t: &NodeTopology) -> Vec<String> {
    let g = t.gpus.iter().find(|g| g.address == pf()).unwrap();
    g.warnings
        .iter()
        .filter(|w| w.starts_with("MIG slots:"))
        .cloned()
        .collect()
}

fn placed(profile: &str, start: u8) -> MigPlaced {
    MigPlaced {
        profile: profile.into(),
        start,
    }
}

/// With 1g at slots 0 and 1 the driver lists every 1g, the 1g.35gb, the 2g and the 3g (at 4).
const LISTED_BESIDE_0_AND_1: &[u32] = &[1414, 1415, 1416, 1417, 1418];

#[test]
fn reported_placements_hold_exactly_the_slots_their_instances_occupy() {
    let t = discover_with(
        LISTED_BESIDE_0_AND_1,
        Some(GpuInstances::Known(vec![gi(1, 1, 0, 1), gi(2, 1, 1, 1)])),
    );
    let slots = pool(&t).mig_slots.unwrap();
    assert_eq!(slots.placed, [placed("1g.18gb", 0), placed("1g.18gb", 1)]);
    assert!(slots.unplaced.is_empty(), "{slots:?}");
    assert!(mig_notes(&t).is_empty(), "{:?}", mig_notes(&t));
}

#[test]
fn with_exact_slots_a_3g_at_4_leaves_room_for_a_2g_the_conservative_rule_refuses() {
    let exact = discover_with(
        LISTED_BESIDE_0_AND_1,
        Some(GpuInstances::Known(vec![gi(1, 1, 0, 1), gi(2, 1, 1, 1)])),
    );
    let guessed = discover_with(LISTED_BESIDE_0_AND_1, None);
    let three = listed_profile(&exact, "1418");
    let two = listed_profile(&exact, "1417");
    for (t, fits) in [(&exact, true), (&guessed, false)] {
        let mut p = pool(t);
        p.check(&three).unwrap();
        p.charge(&three);
        // The 3g takes slots 4-7 and the 2g slots 2-3 beside the 1g at 0 and 1; held wherever
        // they may sit, the two 1g may be at 4 and 5, and then the 3g at 0 leaves no 2g start.
        let slots = p.mig_slots.as_deref().cloned().unwrap();
        let two_g = slots.geometry().unwrap().profile_named("2g.35gb").unwrap();
        assert_eq!(slots.check(two_g).is_ok(), fits, "{slots:?}");
        assert_eq!(p.check(&two).is_ok(), fits, "{slots:?}");
    }
}

#[test]
fn a_gpu_instance_without_a_vgpu_falls_back_with_a_warning() {
    // 1g at 0 and 1 and a 2g at 2 with no vGPU on it (created ahead): a new 2g may take it, or
    // need slots of its own, as the driver decides.
    let t = discover_with(
        &[1414, 1415, 1416, 1417, 1418],
        Some(GpuInstances::Known(vec![
            gi(1, 1, 0, 1),
            gi(2, 1, 1, 1),
            gi(3, 2, 2, 2),
        ])),
    );
    let slots = pool(&t).mig_slots.unwrap();
    assert!(slots.placed.is_empty());
    assert_eq!(slots.unplaced, ["1g.18gb", "1g.18gb"]);
    let notes = mig_notes(&t);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("NVML 3 GPU instance(s) [1g.18gb at 0, 1g.18gb at 1, 2g.35gb at 2]")
            && notes[0].contains("1 GPU instance(s) hold no MIG-backed vGPU"),
        "{notes:?}"
    );
}

#[test]
fn fewer_placements_than_mig_backed_vgpus_fall_back_with_a_warning() {
    let t = discover_with(
        LISTED_BESIDE_0_AND_1,
        Some(GpuInstances::Known(vec![gi(1, 1, 0, 1)])),
    );
    let slots = pool(&t).mig_slots.unwrap();
    assert!(slots.placed.is_empty());
    assert_eq!(slots.unplaced, ["1g.18gb", "1g.18gb"]);
    let notes = mig_notes(&t);
    assert_eq!(
        notes,
        [
            "MIG slots: NVML's GPU-instance placements disagree with sysfs (sysfs shows 2 \
          MIG-backed vGPU(s) [1g.18gb, 1g.18gb], NVML 1 GPU instance(s) [1g.18gb at 0]); \
          each MIG-backed vGPU is held wherever it may sit"
        ]
    );
}

#[test]
fn placements_the_drivers_lists_contradict_fall_back_with_a_warning() {
    // 1g at 0 and 4 leave no 3g start, yet the driver lists the 3g.
    let t = discover_with(
        LISTED_BESIDE_0_AND_1,
        Some(GpuInstances::Known(vec![gi(1, 1, 0, 1), gi(2, 1, 4, 1)])),
    );
    assert!(pool(&t).mig_slots.unwrap().placed.is_empty());
    let notes = mig_notes(&t);
    assert!(
        notes[0].contains("the driver still lists a 3g.71gb type"),
        "{notes:?}"
    );
}

#[test]
fn overlapping_or_foreign_placements_fall_back_with_a_warning() {
    for (instances, says) in [
        (vec![gi(1, 1, 0, 1), gi(2, 1, 0, 1)], "overlaps another"),
        (vec![gi(1, 1, 0, 1), gi(2, 3, 1, 4)], "not an allowed start"),
        (
            vec![gi(1, 1, 0, 1), gi(2, 5, 0, 5)],
            "which no H200 SXM5 141GB profile has",
        ),
    ] {
        let t = discover_with(LISTED_BESIDE_0_AND_1, Some(GpuInstances::Known(instances)));
        assert!(pool(&t).mig_slots.unwrap().placed.is_empty());
        let notes = mig_notes(&t);
        assert!(notes[0].contains(says), "{says}: {notes:?}");
    }
}

#[test]
fn a_source_that_cannot_tell_falls_back_quietly_and_one_that_failed_says_so() {
    let quiet = discover_with(
        LISTED_BESIDE_0_AND_1,
        Some(GpuInstances::Unsupported("no MIG calls".into())),
    );
    assert_eq!(pool(&quiet).mig_slots.unwrap().unplaced.len(), 2);
    assert!(mig_notes(&quiet).is_empty());
    let failed = discover_with(
        LISTED_BESIDE_0_AND_1,
        Some(GpuInstances::Failed("NVML: Unknown Error".into())),
    );
    assert_eq!(pool(&failed).mig_slots.unwrap().unplaced.len(), 2);
    assert_eq!(
        mig_notes(&failed),
        [
            "MIG slots: NVML could not list the GPU instances (NVML: Unknown Error); each \
          MIG-backed vGPU is held wherever it may sit"
        ]
    );
}
