#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Eligibility is checked before anything runs: a GPU not bound to `nvidia` is reported and
//! skipped (no `sriov-manage`, no write), and a type named for another board is refused before
//! the first write, also on a full GPU whose creatable lists are empty.

use gpu_core::PciAddress;
use gpu_core::layout::LayoutFile;
use gpu_sysfs::Host;
use gpu_sysfs::actuate::error::errno;
use gpu_sysfs::actuate::set_vf_type;
use gpu_sysfs::apply::{
    ApplyError, ApplyOptions, ApplyReport, ApplyStatus, apply_layout, assert_config,
};
use gpu_sysfs::testing::{Entry, FakeKernel};

const LAYOUTS: &str = "version: v1
vgpu-configs:
  L40S-24Q:
    - devices: all
      vgpu-devices:
        L40S-24Q: 2
  A100-40C:
    - devices: all
      vgpu-devices:
        A100-40C: 1
";

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

/// The kernel's side of the tree (`sys/`, `dev/`): gpuslice's own lock file under `run/` is not
/// a change to the host.
fn kernel_state(k: &FakeKernel) -> Vec<(String, Entry)> {
    k.snapshot()
        .unwrap()
        .into_iter()
        .filter(|(p, _)| p.starts_with("sys/") || p.starts_with("dev/"))
        .collect()
}

fn apply(host: &dyn Host, name: &str) -> Result<ApplyReport, ApplyError> {
    let file = LayoutFile::parse(LAYOUTS).unwrap();
    apply_layout(
        host,
        file.select(Some(name)).unwrap(),
        &ApplyOptions::new("l40s"),
        &mut |_| {},
    )
}

#[test]
fn a_layout_never_enables_sriov_on_a_gpu_passed_through_to_a_vm() {
    let k = FakeKernel::l40s_vendor_vfio_host_on(0, "vfio-pci").unwrap();
    let before = kernel_state(&k);
    let report = apply(&k, "L40S-24Q").unwrap();
    assert_eq!(report.status, ApplyStatus::Incomplete);
    assert!(k.runs().is_empty(), "sriov-manage ran: {:?}", k.runs());
    assert!(k.writes().is_empty(), "wrote: {:?}", k.writes());
    assert!(kernel_state(&k) == before, "the host changed");
    let why = report.plan.warnings.join("\n");
    assert!(
        why.contains("0000:26:00.0") && why.contains("vfio-pci"),
        "the report names the GPU and its driver: {why}"
    );
}

#[test]
fn a_gpu_whose_pf_left_nvidia_is_skipped_even_with_its_vfs_enabled() {
    let k = FakeKernel::l40s_vendor_vfio_host_on(4, "vfio-pci").unwrap();
    let report = apply(&k, "L40S-24Q").unwrap();
    assert_eq!(report.status, ApplyStatus::Incomplete);
    assert!(k.writes().is_empty(), "wrote: {:?}", k.writes());
}

#[test]
fn the_fake_driver_takes_no_type_on_a_vf_of_a_pf_not_bound_to_nvidia() {
    let k = FakeKernel::l40s_vendor_vfio_host_on(2, "vfio-pci").unwrap();
    let e = k
        .write(
            "sys/bus/pci/devices/0000:26:00.4/nvidia/current_vgpu_type",
            b"1155",
        )
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(errno::ENODEV));
}

#[test]
fn current_vgpu_type_reads_back_what_was_written() {
    let k = FakeKernel::l40s_vendor_vfio_host(2).unwrap();
    let path = "sys/bus/pci/devices/0000:26:00.4/nvidia/current_vgpu_type";
    k.write(path, b"1155\n").unwrap();
    assert_eq!(k.read_string(path).unwrap().trim(), "1155");
    k.write(path, b"0").unwrap();
    assert_eq!(k.read_string(path).unwrap().trim(), "0");
}

#[test]
fn a_type_for_another_board_is_refused_before_any_write_on_a_full_gpu() {
    // Another tool filled the card; nothing names its types (no NVML, no remembered names, and
    // the creatable lists of a full GPU are empty).
    let k = FakeKernel::l40s_vendor_vfio_host(2).unwrap();
    for vf in ["0000:26:00.4", "0000:26:00.5"] {
        set_vf_type(&k, &addr(vf), 1155, false).unwrap();
    }
    let before = kernel_state(&k);
    let writes = k.writes().len();
    let e = apply(&k, "A100-40C").unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ApplyError::Layout(_)), "{msg}");
    assert!(
        msg.contains("A100-40C") && msg.contains("0000:26:00.0") && msg.contains("L40S"),
        "names the type, the GPU and its board: {msg}"
    );
    assert_eq!(k.writes().len(), writes, "nothing written");
    assert!(kernel_state(&k) == before, "the host changed");
}

/// An L40S filled by another tool: two VFs hold type 1155 and nothing names it (no NVML, no
/// remembered names, and a full GPU's creatable lists are empty).
fn l40s_full_without_names() -> FakeKernel {
    let k = FakeKernel::l40s_vendor_vfio_host(2).unwrap();
    for vf in ["0000:26:00.4", "0000:26:00.5"] {
        set_vf_type(&k, &addr(vf), 1155, false).unwrap();
    }
    k
}

#[test]
fn apply_leaves_a_gpu_whose_live_type_has_no_known_name_unchanged_and_says_why() {
    let k = l40s_full_without_names();
    let before = kernel_state(&k);
    let writes = k.writes().len();
    let report = apply(&k, "L40S-24Q").unwrap();
    assert_eq!(report.status, ApplyStatus::Incomplete);
    assert_eq!(k.writes().len(), writes, "nothing written");
    assert!(kernel_state(&k) == before, "the host changed");
    let why = report.plan.warnings.join("\n");
    assert!(
        why.contains("VF 0000:26:00.4 holds type 1155") && why.contains("name is unknown"),
        "{why}"
    );
}

#[test]
fn assert_reports_a_live_type_with_no_known_name() {
    let k = l40s_full_without_names();
    let file = LayoutFile::parse(LAYOUTS).unwrap();
    let a = assert_config(
        &k,
        file.select(Some("L40S-24Q")).unwrap(),
        &ApplyOptions::new("l40s").discover,
    )
    .unwrap();
    assert!(!a.applied);
    let diff = a.diff.join("\n");
    assert!(diff.contains("VF 0000:26:00.4 holds type 1155"), "{diff}");
}

#[test]
fn id_pins_work_without_any_names() {
    let k = l40s_full_without_names();
    let text = "version: v1\nvgpu-configs:\n  pins:\n    \"0000:26:00.4\": 1155\n    \"0000:26:00.5\": 1155\n";
    let file = LayoutFile::parse(text).unwrap();
    let writes = k.writes().len();
    let report = apply_layout(
        &k,
        file.select(Some("pins")).unwrap(),
        &ApplyOptions::new("l40s"),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.status, ApplyStatus::Unchanged);
    assert_eq!(k.writes().len(), writes);
}
