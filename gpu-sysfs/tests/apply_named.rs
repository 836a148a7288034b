#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Layouts for virtual mdev parents (the kernel's sample drivers mbochs, mtty, mdpy) on the fake
//! kernel: the parent is named, its types share one pool that only the driver's counts describe,
//! and the instances get stable UUIDs derived from node, parent and slot.

use std::collections::BTreeMap;

use gpu_core::layout::{LayoutError, LayoutFile, Mode};
use gpu_core::{MdevUuid, ParentId};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::error::errno;
use gpu_sysfs::actuate::{MdevCreate, create_mdev};
use gpu_sysfs::apply::{
    ApplyError, ApplyOptions, ApplyReport, ApplyStatus, apply_layout, assert_config, observe,
};
use gpu_sysfs::testing::FakeKernel;

/// The layout the real-kernel lab applies (lab/driver/src/checks.rs), plus misfits.
const LAYOUTS: &str = "version: v1
vgpu-configs:
  lab:
    mbochs: {mbochs-medium: 2, mbochs-small: 3}
  serial:
    mtty: {Single port serial: 2, mtty-2: 1}
  too-big:
    mbochs: {mbochs-large: 3, mbochs-medium: 5}
  four-large:
    mbochs: {mbochs-small: 1, mbochs-large: 4}
  medium-reshape:
    mbochs: {mbochs-large: 2, mbochs-medium: 8}
  unknown-type:
    mbochs: {mbochs-huge: 1}
  no-such-parent:
    mbochs2: {mbochs-small: 1}
";

fn options() -> ApplyOptions {
    ApplyOptions::new("lab")
}

fn run(host: &dyn Host, name: &str, mode: Mode) -> Result<ApplyReport, ApplyError> {
    let file = LayoutFile::parse(LAYOUTS).unwrap();
    let opts = ApplyOptions { mode, ..options() };
    apply_layout(host, file.select(Some(name)).unwrap(), &opts, &mut |_| {})
}

fn apply(host: &dyn Host, name: &str) -> Result<ApplyReport, ApplyError> {
    run(host, name, Mode::Apply)
}

/// Instances of `parent` by type, as discovery sees them.
fn held(host: &dyn Host, parent: &str) -> BTreeMap<String, usize> {
    let t = observe(host, &options().discover).unwrap();
    let p = t.parent(&ParentId::Named(parent.into())).unwrap();
    let mut m = BTreeMap::new();
    for i in &p.instances {
        *m.entry(i.profile.to_string()).or_default() += 1;
    }
    m
}

/// `available_instances` of every type of `parent`, read straight from the tree.
fn counts(k: &FakeKernel, parent: &str) -> BTreeMap<String, u32> {
    let dir = format!("sys/class/mdev_bus/{parent}/mdev_supported_types");
    k.list(&dir)
        .unwrap()
        .into_iter()
        .map(|t| {
            let n = k
                .read_string(&format!("{dir}/{t}/available_instances"))
                .unwrap();
            (t, n.trim().parse().unwrap())
        })
        .collect()
}

fn slot(i: u32) -> MdevUuid {
    MdevUuid::for_named_parent_slot("lab", "mbochs", i)
}

fn add_mbochs(k: &FakeKernel, uuid: &str, ty: &str) {
    create_mdev(
        k,
        &MdevCreate {
            parent: ParentId::Named("mbochs".into()),
            type_id: ty.parse().unwrap(),
            uuid: uuid.parse().unwrap(),
        },
    )
    .unwrap();
}

#[test]
fn an_mbochs_layout_is_created_with_slot_uuids_largest_first() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let report = apply(&k, "lab").unwrap();
    assert_eq!(report.status, ApplyStatus::Applied);
    let writes: Vec<String> = k
        .writes()
        .iter()
        .map(|w| format!("{} <- {}", w.path, w.data))
        .collect();
    let create = |ty: &str, i| {
        format!(
            "sys/class/mdev_bus/mbochs/mdev_supported_types/{ty}/create <- {}",
            slot(i)
        )
    };
    assert_eq!(
        writes,
        [
            create("mbochs-medium", 0),
            create("mbochs-medium", 1),
            create("mbochs-small", 2),
            create("mbochs-small", 3),
            create("mbochs-small", 4),
        ]
    );
    assert_eq!(
        held(&k, "mbochs"),
        BTreeMap::from([("mbochs-medium".into(), 2), ("mbochs-small".into(), 3)])
    );
    assert_eq!(
        counts(&k, "mbochs"),
        BTreeMap::from([
            ("mbochs-large".into(), 3),
            ("mbochs-medium".into(), 13),
            ("mbochs-small".into(), 53),
        ]),
        "2 × 16 MB + 3 × 4 MB of the 256 MB pool are taken"
    );
    assert!(report.changes.iter().all(|c| c.gpu.to_string() == "mbochs"));
}

#[test]
fn a_second_apply_writes_nothing_and_assert_passes() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let file = LayoutFile::parse(LAYOUTS).unwrap();
    let lab = file.select(Some("lab")).unwrap();
    let before = assert_config(&k, lab, &options().discover).unwrap();
    assert!(!before.applied);
    assert_eq!(
        before.diff,
        [
            "mbochs: mbochs-medium: have 0, want 2",
            "mbochs: mbochs-small: have 0, want 3"
        ]
    );
    apply(&k, "lab").unwrap();
    let written = k.writes().len();
    let again = apply(&k, "lab").unwrap();
    assert_eq!(again.status, ApplyStatus::Unchanged);
    assert!(again.plan.is_noop());
    assert_eq!(
        k.writes().len(),
        written,
        "an applied layout writes nothing"
    );
    let after = assert_config(&k, lab, &options().discover).unwrap();
    assert!(after.applied, "{:?}", after.diff);
}

#[test]
fn clearing_removes_the_parents_instances_and_restores_the_counts() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let initial = counts(&k, "mbochs");
    apply(&k, "lab").unwrap();
    let report = run(&k, "lab", Mode::Clear).unwrap();
    assert_eq!(report.status, ApplyStatus::Applied);
    assert_eq!(
        report.changes.iter().filter(|c| c.op == "remove").count(),
        5
    );
    assert!(held(&k, "mbochs").is_empty());
    assert_eq!(counts(&k, "mbochs"), initial);
    let file = LayoutFile::parse(LAYOUTS).unwrap();
    let a = assert_config(&k, file.select(Some("lab")).unwrap(), &options().discover).unwrap();
    assert!(!a.applied, "a cleared layout no longer asserts");
}

#[test]
fn a_layout_past_the_mbochs_pool_is_refused_with_the_numbers_and_nothing_written() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let e = apply(&k, "too-big").unwrap_err();
    let ApplyError::Layout(LayoutError::DoesNotFit {
        gpu,
        type_name,
        want,
        fit,
        why,
    }) = &e
    else {
        panic!("expected does-not-fit, got {e}");
    };
    // 3 × 64 MB leave 64 MB: four of the five 16 MB instances fit.
    assert_eq!(
        (gpu.as_str(), type_name.as_str(), *want, *fit),
        ("mbochs", "mbochs-medium", 5, 4)
    );
    // The pool's size is read from the types' descriptions (4/16/64 MB video memory).
    assert!(
        why.contains("needs 16 MiB framebuffer, 0 MiB free (256 MiB total)"),
        "{why}"
    );
    assert!(k.writes().is_empty(), "{:?}", k.writes());
}

#[test]
fn four_large_after_one_small_are_refused_as_the_driver_counts_say() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    add_mbochs(&k, "11111111-2222-4333-8444-555555555555", "mbochs-small");
    let before = k.writes().len();
    let e = apply(&k, "four-large").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("4 × mbochs-large do not fit: 3 fit") && msg.contains("60 MiB free"),
        "{msg}"
    );
    assert_eq!(k.writes().len(), before);
}

#[test]
fn a_reshape_of_a_full_mbochs_pool_is_planned_from_the_sizes_its_descriptions_state() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    for i in 0..4 {
        add_mbochs(
            &k,
            &format!("00000000-0000-4000-8000-00000000000{i}"),
            "mbochs-large",
        );
    }
    // A full pool shows 0 of every type, but the descriptions give each type's size: what two
    // removals free is known before any write.
    let report = apply(&k, "medium-reshape").unwrap();
    assert_eq!(report.status, ApplyStatus::Applied);
    assert!(
        !report.plan.warnings.iter().any(|w| w.contains("re-read")),
        "{:?}",
        report.plan.warnings
    );
    assert_eq!(
        held(&k, "mbochs"),
        BTreeMap::from([("mbochs-large".into(), 2), ("mbochs-medium".into(), 8)])
    );
}

#[test]
fn a_misfit_the_sizes_show_is_refused_before_anything_is_removed() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    for i in 0..4 {
        add_mbochs(
            &k,
            &format!("00000000-0000-4000-8000-00000000000{i}"),
            "mbochs-large",
        );
    }
    let before = observe(&k, &options().discover).unwrap();
    let writes = k.writes().len();
    // One large removed frees 64 MB: four mediums fit, the fifth does not, and the sizes the
    // descriptions state say so before the first removal.
    let e = apply(&k, "too-big").unwrap_err();
    assert!(matches!(e, ApplyError::Layout(_)), "{e}");
    assert!(
        e.to_string()
            .contains("5 × mbochs-medium do not fit: 4 fit"),
        "{e}"
    );
    assert_eq!(k.writes().len(), writes, "{:?}", k.writes());
    assert_eq!(
        observe(&k, &options().discover).unwrap(),
        before,
        "the host is as before"
    );
}

#[test]
fn a_failure_at_any_write_of_an_mbochs_reshape_leaves_the_host_as_before() {
    let setup = || {
        let k = FakeKernel::sample_mdev_drivers().unwrap();
        add_mbochs(&k, "00000000-0000-4000-8000-000000000000", "mbochs-large");
        add_mbochs(&k, "00000000-0000-4000-8000-000000000001", "mbochs-small");
        k
    };
    let clean = setup();
    let start = clean.writes().len();
    let before = observe(&clean, &options().discover).unwrap();
    apply(&clean, "lab").unwrap();
    let n = clean.writes().len() - start;
    assert_eq!(
        n, 5,
        "one large removed, two medium and two more small created"
    );
    for at in 1..=n {
        let host = setup();
        let offset = host.writes().len();
        let host = host.failing_at(offset + at, errno::EIO);
        let e = apply(&host, "lab").unwrap_err();
        let ApplyError::Failed { report } = &e else {
            panic!("write {at}: {e}")
        };
        assert_eq!(report.status, ApplyStatus::RolledBack, "write {at}: {e}");
        assert_eq!(
            observe(&host, &options().discover).unwrap(),
            before,
            "write {at} of {n}: the host changed"
        );
    }
}

#[test]
fn mtty_types_are_named_by_the_drivers_name_or_type_id() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    apply(&k, "serial").unwrap();
    assert_eq!(
        held(&k, "mtty"),
        BTreeMap::from([("mtty-1".into(), 2), ("mtty-2".into(), 1)])
    );
    assert_eq!(
        counts(&k, "mtty"),
        BTreeMap::from([("mtty-1".into(), 20), ("mtty-2".into(), 10)])
    );
    let written = k.writes().len();
    assert_eq!(apply(&k, "serial").unwrap().status, ApplyStatus::Unchanged);
    assert_eq!(k.writes().len(), written);
}

#[test]
fn an_unknown_type_or_parent_is_refused_naming_what_there_is() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let e = apply(&k, "unknown-type").unwrap_err().to_string();
    assert!(
        e.contains("\"mbochs-huge\"") && e.contains("mbochs-large, mbochs-medium, mbochs-small"),
        "{e}"
    );
    let e = apply(&k, "no-such-parent").unwrap_err().to_string();
    assert!(
        e.contains("mbochs2") && e.contains("mbochs, mdpy, mtty"),
        "{e}"
    );
    assert!(k.writes().is_empty());
}
