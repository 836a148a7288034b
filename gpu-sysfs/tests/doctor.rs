//! `doctor` on modelled hosts: every check reaches each verdict it can give, and the fix names
//! what to do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_sysfs::RealHost;
use gpu_sysfs::doctor::{Check, Diagnosis, Verdict, diagnose};
use gpu_sysfs::testing::doctor_hosts;

fn diagnosis(tree: &gpu_sysfs::testing::builder::Tree) -> Diagnosis {
    let host = RealHost::new(tree.root()).unwrap();
    diagnose(&host, "n1").unwrap()
}

fn find<'a>(d: &'a Diagnosis, check: &str, subject: Option<&str>) -> &'a Check {
    d.checks
        .iter()
        .find(|c| c.check == check && c.subject.as_deref() == subject)
        .unwrap_or_else(|| panic!("no check {check} {subject:?} in {:#?}", d.checks))
}

#[test]
fn a_ready_node_passes_every_check() {
    let t = doctor_hosts::ready().unwrap();
    let d = diagnosis(&t);
    for c in &d.checks {
        assert_eq!(c.verdict, Verdict::Ok, "{c:?}");
        assert!(c.fix.is_none());
    }
    assert!(!d.failed());
    assert_eq!(
        find(&d, "iommu", None).message,
        "IOMMU on: dmar0 (6 groups)"
    );
    assert!(
        find(&d, "iommu-mode", None)
            .message
            .starts_with("passthrough mode")
    );
    assert_eq!(
        find(&d, "vgpu-daemon", Some("nvidia-vgpu-mgr")).message,
        "nvidia-vgpu-mgr is running"
    );
    assert_eq!(
        find(&d, "sriov-vfs", Some("nvidia1 (0000:26:00.0)")).message,
        "2 of 32 SR-IOV VFs enabled"
    );
    assert!(
        find(&d, "mig-mode", Some("nvidia0 (0000:18:00.0)"))
            .message
            .starts_with("MIG mode on")
    );
    assert!(
        d.checks.iter().all(|c| c.check != "kubevirt-mdev-gate"),
        "no virt-handler, no reminder"
    );
}

#[test]
fn a_broken_node_fails_with_the_fix_for_each_problem() {
    let t = doctor_hosts::broken().unwrap();
    let d = diagnosis(&t);
    assert!(d.failed());
    let iommu = find(&d, "iommu", None);
    assert_eq!(iommu.verdict, Verdict::Fail);
    assert_eq!(
        iommu.message,
        "IOMMU off: the kernel command line says intel_iommu=off"
    );
    assert!(iommu.fix.as_deref().unwrap().contains("intel_iommu=on"));
    let mode = find(&d, "iommu-mode", None);
    assert_eq!(mode.verdict, Verdict::Warn);
    assert!(mode.message.contains("unsafe no-IOMMU mode"));
    let vfio = find(&d, "vfio-pci", None);
    assert_eq!(vfio.verdict, Verdict::Fail);
    assert!(vfio.fix.as_deref().unwrap().contains("CONFIG_VFIO_PCI"));
    let manager = find(&d, "vgpu-manager", None);
    assert_eq!(manager.verdict, Verdict::Warn);
    assert!(manager.message.contains("SR-IOV VFs are off"));
    let mgr = find(&d, "vgpu-daemon", Some("nvidia-vgpu-mgr"));
    assert_eq!(mgr.verdict, Verdict::Fail);
    assert_eq!(
        mgr.fix.as_deref(),
        Some("systemctl enable --now nvidia-vgpu-mgr.service")
    );
    assert_eq!(
        find(&d, "vgpu-daemon", Some("nvidia-vgpud")).verdict,
        Verdict::Warn
    );
    assert_eq!(find(&d, "sriov-manage", None).verdict, Verdict::Warn);
    let vfs = find(&d, "sriov-vfs", Some("nvidia0 (0000:26:00.0)"));
    assert_eq!(vfs.verdict, Verdict::Warn);
    assert_eq!(
        vfs.fix.as_deref(),
        Some("gpuslice sriov enable 0000:26:00.0")
    );
    let gate = find(&d, "kubevirt-mdev-gate", Some("virt-handler"));
    assert_eq!(gate.verdict, Verdict::Warn);
    assert!(
        gate.fix
            .as_deref()
            .unwrap()
            .contains("DisableMDEVConfiguration")
    );
}

#[test]
fn a_degraded_node_warns_and_fails_per_gpu() {
    let t = doctor_hosts::degraded().unwrap();
    let d = diagnosis(&t);
    assert_eq!(
        find(&d, "iommu", None).message,
        "IOMMU on: ivhd0 (5 groups)"
    );
    let mode = find(&d, "iommu-mode", None);
    assert_eq!(mode.verdict, Verdict::Warn);
    assert!(mode.message.contains("DMA-FQ"));
    assert!(mode.fix.as_deref().unwrap().contains("iommu=pt"));
    let vfio = find(&d, "vfio-pci", None);
    assert_eq!(vfio.verdict, Verdict::Warn);
    assert!(
        vfio.fix
            .as_deref()
            .unwrap()
            .starts_with("modprobe vfio-pci")
    );
    let types = find(&d, "vgpu-types", Some("nvidia0 (0000:18:00.0)"));
    assert_eq!(types.verdict, Verdict::Fail);
    assert_eq!(
        types.fix.as_deref(),
        Some("systemctl restart nvidia-vgpud, then check again")
    );
    assert_eq!(
        find(&d, "mig-mode", Some("nvidia0 (0000:18:00.0)")).verdict,
        Verdict::Warn
    );
    let t4 = find(&d, "iommu-group", Some("nvidia1 (0000:5e:00.0)"));
    assert_eq!(t4.verdict, Verdict::Fail);
    assert!(
        t4.message
            .contains("IOMMU group 94 also holds 0000:5e:00.1 (8086:1572, driver i40e)")
    );
    let bmc = find(&d, "iommu-group", Some("matrox0 (0000:01:00.1)"));
    assert_eq!(
        bmc.verdict,
        Verdict::Warn,
        "a BMC VGA is rarely meant for a VM"
    );
    assert!(d.failed());
}

#[test]
fn a_recording_without_proc_says_what_it_cannot_know() {
    let tree = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/a2-sriov-mdev-host.umockdev"),
    )
    .unwrap();
    let rec = gpu_sysfs::umockdev::parse(&text, "a2").unwrap();
    rec.write_tree(tree.path(), "a2").unwrap();
    let host = RealHost::new(tree.path()).unwrap();
    let d = diagnose(&host, "a2").unwrap();
    let mode = find(&d, "iommu-mode", None);
    assert_eq!(mode.verdict, Verdict::Warn);
    assert!(mode.message.starts_with("mode unknown"));
    assert!(find(&d, "vfio-pci", None).message.starts_with("unknown"));
    assert_eq!(find(&d, "iommu", None).verdict, Verdict::Ok);
}
