#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Applying layouts on the fake kernel: the diff is what gets written, a second apply writes
//! nothing, a failure at any write leaves the host as it was, instances in use are left alone,
//! and two applies at once take turns.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use gpu_core::layout::{LayoutFile, Mode};
use gpu_core::{MdevUuid, NodeTopology, ParentId, PciAddress};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::error::errno;
use gpu_sysfs::actuate::{MdevCreate, create_mdev};
use gpu_sysfs::apply::{
    ApplyError, ApplyEvent, ApplyOptions, ApplyReport, ApplyStatus, LayoutLock, apply_layout,
    assert_config, observe,
};
use gpu_sysfs::testing::{FakeKernel, FakePool, MdevTypeSpec, PciSpec, TreeBuilder};

const A2_LAYOUTS: &str = "version: v1
vgpu-configs:
  A2-2Q:
    - devices: all
      vgpu-devices:
        A2-2Q: 8
  A2-4Q:
    - devices: all
      vgpu-devices:
        A2-4Q: 4
  too-big:
    - devices: all
      vgpu-devices:
        A2-8Q: 3
";

const L40S_LAYOUTS: &str = "version: v1
vgpu-configs:
  L40S-24Q:
    - devices: all
      device-filter: \"0x26B910DE\"
      vgpu-devices:
        L40S-24Q: 2
";

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

/// The fake A2 with three live vGPUs, as on the real capture: a 4C and two 4Q.
fn a2_with_live_vgpus() -> FakeKernel {
    let k = FakeKernel::a2_mdev_host().unwrap();
    for (uuid, vf, ty) in [
        (
            "f715f63c-0d00-4007-9c5a-b07b0c6c05de",
            "0000:08:00.4",
            "nvidia-754",
        ),
        (
            "3deab9a4-200a-4c54-99b1-5eb0722d1d81",
            "0000:08:00.6",
            "nvidia-746",
        ),
        (
            "c728e022-f16f-434b-ad2c-9665ee634d3d",
            "0000:08:02.0",
            "nvidia-746",
        ),
    ] {
        create_mdev(
            &k,
            &MdevCreate {
                parent: ParentId::Pci(addr(vf)),
                type_id: ty.parse().unwrap(),
                uuid: uuid.parse().unwrap(),
            },
        )
        .unwrap();
    }
    k
}

fn options() -> ApplyOptions {
    ApplyOptions::new("a2host")
}

fn apply(
    host: &dyn Host,
    text: &str,
    name: &str,
    opts: &ApplyOptions,
) -> Result<ApplyReport, ApplyError> {
    let file = LayoutFile::parse(text).unwrap();
    apply_layout(host, file.select(Some(name)).unwrap(), opts, &mut |_| {})
}

/// The host's vGPU state as discovery sees it.
fn state(host: &dyn Host) -> NodeTopology {
    observe(host, &options().discover).unwrap()
}

fn instances(t: &NodeTopology) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = t
        .mediated_devices
        .parents
        .iter()
        .flat_map(|p| {
            p.instances.iter().map(move |i| {
                (
                    p.id.to_string(),
                    i.uuid.map(|u| u.to_string()).unwrap_or_default(),
                    i.profile.to_string(),
                )
            })
        })
        .collect();
    v.sort();
    v
}

#[test]
fn applying_writes_exactly_the_diff_and_a_second_apply_writes_nothing() {
    let k = a2_with_live_vgpus();
    let before = k.writes().len();
    let report = apply(&k, A2_LAYOUTS, "A2-4Q", &options()).unwrap();
    assert_eq!(report.status, ApplyStatus::Applied);
    let writes: Vec<String> = k.writes()[before..]
        .iter()
        .map(|w| format!("{} <- {}", w.path, w.data))
        .collect();
    let pf = addr("0000:08:00.0");
    let slot = |i| MdevUuid::for_layout_slot("a2host", &pf, i);
    assert_eq!(
        writes,
        [
            "sys/bus/mdev/devices/f715f63c-0d00-4007-9c5a-b07b0c6c05de/remove <- 1".to_owned(),
            format!(
                "sys/class/mdev_bus/0000:08:00.4/mdev_supported_types/nvidia-746/create <- {}",
                slot(0)
            ),
            format!(
                "sys/class/mdev_bus/0000:08:00.5/mdev_supported_types/nvidia-746/create <- {}",
                slot(1)
            ),
        ]
    );
    let after = k.writes().len();
    let again = apply(&k, A2_LAYOUTS, "A2-4Q", &options()).unwrap();
    assert_eq!(again.status, ApplyStatus::Unchanged);
    assert_eq!(k.writes().len(), after, "an applied layout writes nothing");
    let file = LayoutFile::parse(A2_LAYOUTS).unwrap();
    let a = assert_config(&k, file.select(Some("A2-4Q")).unwrap(), &options().discover).unwrap();
    assert!(a.applied, "{:?}", a.diff);
}

#[test]
fn a_full_reshape_removes_everything_and_creates_smaller_vgpus() {
    let k = a2_with_live_vgpus();
    let report = apply(&k, A2_LAYOUTS, "A2-2Q", &options()).unwrap();
    assert_eq!(
        report.changes.iter().filter(|c| c.op == "remove").count(),
        3
    );
    assert_eq!(
        report.changes.iter().filter(|c| c.op == "create").count(),
        8
    );
    let now = instances(&state(&k));
    assert_eq!(now.len(), 8);
    assert!(
        now.iter().all(|(_, _, t)| t == "nvidia-745"),
        "A2-2Q: {now:?}"
    );
}

#[test]
fn a_layout_that_does_not_fit_changes_nothing() {
    let k = a2_with_live_vgpus();
    let before = k.writes().len();
    let e = apply(&k, A2_LAYOUTS, "too-big", &options()).unwrap_err();
    assert!(matches!(e, ApplyError::Layout(_)), "{e}");
    assert!(e.to_string().contains("do not fit"), "{e}");
    assert_eq!(k.writes().len(), before);
}

#[test]
fn a_dry_run_plans_without_writing() {
    let k = a2_with_live_vgpus();
    let before = k.writes().len();
    let opts = ApplyOptions {
        dry_run: true,
        ..options()
    };
    let report = apply(&k, A2_LAYOUTS, "A2-2Q", &opts).unwrap();
    assert_eq!(report.status, ApplyStatus::DryRun);
    assert_eq!(report.plan.steps.len(), 11);
    assert_eq!(k.writes().len(), before);
}

/// Runs `scenario` once to count its writes, then once per write with that write failing, and
/// checks that each failed apply leaves the host exactly as discovery saw it before.
fn fails_cleanly_at_every_write(setup: &(dyn Fn() -> FakeKernel + Sync), text: &str, name: &str) {
    let clean = setup();
    let start = clean.writes().len();
    // Every setup builds the same host, so it discovers the same.
    let before = state(&clean);
    apply(&clean, text, name, &options()).unwrap();
    let n = clean.writes().len() - start;
    assert!(n >= 2, "a realistic apply makes several writes");
    let check = |k: usize| {
        let host = setup();
        let offset = host.writes().len();
        let host = host.failing_at(offset + k, errno::EIO);
        let e = apply(&host, text, name, &options()).unwrap_err();
        let ApplyError::Failed { report } = &e else {
            panic!("write {k}: {e}")
        };
        let rb = report.rollback.as_ref().unwrap();
        assert!(rb.complete, "write {k}: {:?}", rb.leftover);
        assert_eq!(report.status, ApplyStatus::RolledBack);
        assert!(report.failure.as_deref().unwrap().contains("EIO"), "{e}");
        assert!(e.to_string().contains("rolled back"), "{e}");
        assert_eq!(state(&host), before, "write {k} of {n}: the host changed");
    };
    // Each failing write gets its own fake host, so the cases run side by side.
    let workers = std::thread::available_parallelism()
        .map_or(2, |p| p.get())
        .min(n);
    std::thread::scope(|s| {
        for w in 0..workers {
            let check = &check;
            s.spawn(move || {
                for k in (1..=n).filter(|k| k % workers == w) {
                    check(k);
                }
            });
        }
    });
}

#[test]
fn a_failure_at_any_write_of_a_reshape_leaves_the_host_as_before() {
    fails_cleanly_at_every_write(&a2_with_live_vgpus, A2_LAYOUTS, "A2-2Q");
}

#[test]
fn a_failure_at_any_write_of_a_vendor_vfio_apply_turns_sriov_back_off() {
    let setup = || FakeKernel::l40s_vendor_vfio_host(0).unwrap();
    fails_cleanly_at_every_write(&setup, L40S_LAYOUTS, "L40S-24Q");
}

#[test]
fn vendor_vfio_apply_enables_sriov_first_then_sets_types() {
    let k = FakeKernel::l40s_vendor_vfio_host(0).unwrap();
    let report = apply(&k, L40S_LAYOUTS, "L40S-24Q", &options()).unwrap();
    let ops: Vec<(&str, String)> = report
        .changes
        .iter()
        .map(|c| (c.op, c.device.clone()))
        .collect();
    assert_eq!(
        ops,
        [
            ("enable-sriov", "0000:26:00.0".to_owned()),
            ("create", "0000:26:00.4".to_owned()),
            ("create", "0000:26:00.5".to_owned())
        ]
    );
    assert_eq!(k.runs().len(), 1, "sriov-manage ran once");
    let now = instances(&state(&k));
    assert_eq!(
        now.iter().map(|i| i.2.as_str()).collect::<Vec<_>>(),
        ["1155", "1155"]
    );
    let writes = k.writes().len();
    let again = apply(&k, L40S_LAYOUTS, "L40S-24Q", &options()).unwrap();
    assert_eq!(again.status, ApplyStatus::Unchanged);
    assert_eq!(k.writes().len(), writes);
    assert_eq!(k.runs().len(), 1);
}

#[test]
fn instances_open_by_a_vm_are_left_alone_unless_forced() {
    let k = a2_with_live_vgpus();
    k.open_device("sys/bus/mdev/devices/f715f63c-0d00-4007-9c5a-b07b0c6c05de")
        .unwrap();
    let before = k.writes().len();
    let report = apply(&k, A2_LAYOUTS, "A2-4Q", &options()).unwrap();
    assert_eq!(report.status, ApplyStatus::Incomplete);
    let why = report.plan.gpus[0].refused.clone().unwrap();
    assert!(
        why.contains("f715f63c-0d00-4007-9c5a-b07b0c6c05de"),
        "{why}"
    );
    assert_eq!(k.writes().len(), before);
    let forced = ApplyOptions {
        force: true,
        ..options()
    };
    let report = apply(&k, A2_LAYOUTS, "A2-4Q", &forced).unwrap();
    assert_eq!(report.status, ApplyStatus::Applied);
}

#[test]
fn clearing_removes_the_instances_of_the_selected_gpus() {
    let k = a2_with_live_vgpus();
    let opts = ApplyOptions {
        mode: Mode::Clear,
        ..options()
    };
    let report = apply(&k, A2_LAYOUTS, "A2-4Q", &opts).unwrap();
    assert_eq!(report.changes.len(), 3);
    assert!(instances(&state(&k)).is_empty());
}

#[test]
fn two_concurrent_applies_take_turns_and_write_the_layout_once() {
    let k = Arc::new(a2_with_live_vgpus());
    let before = k.writes().len();
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let k = Arc::clone(&k);
            std::thread::spawn(move || {
                apply(k.as_ref(), A2_LAYOUTS, "A2-2Q", &options())
                    .unwrap()
                    .status
            })
        })
        .collect();
    let mut statuses: Vec<ApplyStatus> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    statuses.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(statuses, [ApplyStatus::Applied, ApplyStatus::Unchanged]);
    assert_eq!(
        k.writes().len() - before,
        11,
        "3 removals and 8 creations, once"
    );
}

#[test]
fn a_second_apply_waits_for_the_lock_and_can_give_up() {
    let k = Arc::new(a2_with_live_vgpus());
    let held = LayoutLock::acquire(k.root(), None, &mut |_| {}).unwrap();
    assert!(held.path().ends_with("run/gpuslice/vgpu.lock"));
    let impatient = ApplyOptions {
        lock_timeout: Some(Duration::from_millis(200)),
        ..options()
    };
    let e = apply(k.as_ref(), A2_LAYOUTS, "A2-4Q", &impatient).unwrap_err();
    assert!(matches!(e, ApplyError::LockTimeout { .. }), "{e}");
    let (tx, rx) = mpsc::channel();
    let k2 = Arc::clone(&k);
    let waiter = std::thread::spawn(move || {
        let file = LayoutFile::parse(A2_LAYOUTS).unwrap();
        apply_layout(
            k2.as_ref(),
            file.select(Some("A2-4Q")).unwrap(),
            &options(),
            &mut |e| {
                if let ApplyEvent::WaitingForLock { .. } = e {
                    let _ = tx.send(());
                }
            },
        )
        .unwrap()
        .status
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the second apply says it waits");
    drop(held);
    assert_eq!(waiter.join().unwrap(), ApplyStatus::Applied);
}

#[test]
fn clearing_leaves_vgpus_a_vm_uses_unless_forced() {
    let k = a2_with_live_vgpus();
    k.open_device("sys/bus/mdev/devices/c728e022-f16f-434b-ad2c-9665ee634d3d")
        .unwrap();
    let before = k.writes().len();
    let opts = ApplyOptions {
        mode: Mode::Clear,
        ..options()
    };
    let report = apply(&k, A2_LAYOUTS, "A2-4Q", &opts).unwrap();
    assert_eq!(report.status, ApplyStatus::Incomplete);
    assert_eq!(k.writes().len(), before);
    assert_eq!(instances(&state(&k)).len(), 3);
}

/// Two T4s (pre-Ampere: the PF itself is the mdev parent and holds many vGPUs), the second one
/// first in the bus listing, behind a Matrox BMC VGA that NVIDIA's numbering skips.
fn two_t4s() -> FakeKernel {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:03:00.0",
        PciSpec::new(0x102b, 0x0536, 0x030000).group(3),
    );
    let types: Vec<MdevTypeSpec> = [
        ("nvidia-222", "GRID T4-1Q", 1024u64, 16u32),
        ("nvidia-223", "GRID T4-2Q", 2048, 8),
        ("nvidia-224", "GRID T4-4Q", 4096, 4),
        ("nvidia-225", "GRID T4-8Q", 8192, 2),
        ("nvidia-226", "GRID T4-16Q", 16384, 1),
    ]
    .iter()
    .map(|(id, name, fb, max)| {
        let d = format!(
            "num_heads=4, frl_config=60, framebuffer={fb}M, max_resolution=7680x4320, max_instance={max}"
        );
        MdevTypeSpec::new(id, name, *max, Some(&d))
    })
    .collect();
    for (pf, group) in [("0000:af:00.0", 40), ("0000:3b:00.0", 41)] {
        b.pci(
            pf,
            PciSpec::new(0x10de, 0x1eb8, 0x030200)
                .driver("nvidia")
                .group(group),
        )
        .mdev_parent(pf, &types);
    }
    let k = FakeKernel::new(b.finish().unwrap()).unwrap();
    k.with_pool(FakePool::NvidiaMdev {
        parents: vec!["0000:3b:00.0".into()],
        per_parent: None,
        types: Vec::new(),
    })
    .with_pool(FakePool::NvidiaMdev {
        parents: vec!["0000:af:00.0".into()],
        per_parent: None,
        types: Vec::new(),
    })
}

const T4_LAYOUTS: &str = "version: v1
vgpu-configs:
  T4-small:
    - devices: [0]
      vgpu-devices:
        \"T4-1Q\": 16
    - devices: [1]
      vgpu-devices:
        \"T4-2Q\": 8
";

#[test]
fn per_index_t4_layouts_fill_each_pf_with_slot_uuids() {
    let k = two_t4s();
    let report = apply(&k, T4_LAYOUTS, "T4-small", &options()).unwrap();
    assert_eq!(report.status, ApplyStatus::Applied);
    let now = instances(&state(&k));
    let on = |pf: &str, ty: &str| now.iter().filter(|i| i.0 == pf && i.2 == ty).count();
    assert_eq!(
        on("0000:3b:00.0", "nvidia-222"),
        16,
        "index 0 is the lower address"
    );
    assert_eq!(on("0000:af:00.0", "nvidia-223"), 8);
    let pf = addr("0000:3b:00.0");
    let expected: Vec<String> = (0..16)
        .map(|i| MdevUuid::for_layout_slot("a2host", &pf, i).to_string())
        .collect();
    let mut got: Vec<String> = now
        .iter()
        .filter(|i| i.0 == "0000:3b:00.0")
        .map(|i| i.1.clone())
        .collect();
    got.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(got, expected_sorted);
    let writes = k.writes().len();
    assert_eq!(
        apply(&k, T4_LAYOUTS, "T4-small", &options())
            .unwrap()
            .status,
        ApplyStatus::Unchanged
    );
    assert_eq!(k.writes().len(), writes);
}
