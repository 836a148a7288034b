//! VFs another driver holds are named with their driver and the fix (`vfio-pci.ids`,
//! `driver_override`), never as "is the vGPU host driver loaded?"; a VF whose vGPU state cannot
//! be read is a warning naming it in discovery, in a layout's plan and in `doctor`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::PciAddress;
use gpu_core::layout::LayoutFile;
use gpu_sysfs::RealHost;
use gpu_sysfs::apply::{ApplyError, ApplyOptions, apply_layout};
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::doctor::{Verdict, diagnose};
use gpu_sysfs::testing::doctor_hosts;

const LAYOUT: &str = "version: v1
vgpu-configs:
  first:
    - devices: [0]
      vgpu-devices:
        L40S-24Q: 1
  second:
    - devices: [1]
      vgpu-devices:
        L40S-24Q: 1
";

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn dry_run(host: &RealHost, config: &str) -> Result<gpu_sysfs::apply::ApplyReport, ApplyError> {
    let mut opts = ApplyOptions::new("n1");
    opts.dry_run = true;
    let file = LayoutFile::parse(LAYOUT).unwrap();
    apply_layout(host, file.select(Some(config)).unwrap(), &opts, &mut |_| {})
}

#[test]
fn discovery_names_the_vfs_vfio_pci_took_and_the_fix() {
    let t = doctor_hosts::vfs_elsewhere().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let topo = discover(&host, &DiscoverOptions::new("n1")).unwrap();
    let g = topo
        .gpus
        .iter()
        .find(|g| g.address == addr("0000:26:00.0"))
        .unwrap();
    let s = g.sriov.as_ref().unwrap();
    let held: Vec<(String, &str)> = s
        .other_driver_vfs
        .iter()
        .map(|v| (v.address.to_string(), v.driver.as_str()))
        .collect();
    assert_eq!(
        held,
        [
            ("0000:26:00.4".to_owned(), "vfio-pci"),
            ("0000:26:00.5".to_owned(), "vfio-pci"),
            ("0000:26:00.6".to_owned(), "vfio-pci"),
        ]
    );
    let w = g.warnings.join("\n");
    assert!(
        w.contains("3 VFs (0000:26:00.4 ... 0000:26:00.6) bound to vfio-pci"),
        "{w}"
    );
    assert!(w.contains("vfio-pci.ids=10de:26b9"), "{w}");
    assert!(w.contains("driver_override"), "{w}");
    assert!(w.contains("share the PF's device ID"), "{w}");
    // The other L40S's VFs are on nvidia: nothing said about drivers there.
    let other = topo
        .gpus
        .iter()
        .find(|g| g.address == addr("0000:27:00.0"))
        .unwrap();
    assert!(other.sriov.as_ref().unwrap().other_driver_vfs.is_empty());
}

#[test]
fn an_unreadable_vf_state_is_recorded_and_named() {
    let t = doctor_hosts::vfs_elsewhere().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let topo = discover(&host, &DiscoverOptions::new("n1")).unwrap();
    let g = topo
        .gpus
        .iter()
        .find(|g| g.address == addr("0000:27:00.0"))
        .unwrap();
    let u = &g.sriov.as_ref().unwrap().unreadable_vfs;
    assert_eq!(u.len(), 1, "{u:?}");
    assert_eq!(u[0].address, addr("0000:27:00.5"));
    assert!(u[0].error.contains("current_vgpu_type"), "{u:?}");
    assert!(
        topo.warnings.iter().any(|w| w.contains("0000:27:00.5")),
        "{:?}",
        topo.warnings
    );
}

#[test]
fn a_layout_on_a_gpu_whose_vfs_vfio_pci_took_is_refused_naming_the_driver_and_the_fix() {
    let t = doctor_hosts::vfs_elsewhere().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let e = dry_run(&host, "first").unwrap_err();
    let msg = gpu_core::error_chain(&e);
    assert!(msg.contains("bound to vfio-pci"), "{msg}");
    assert!(msg.contains("vfio-pci.ids=10de:26b9"), "{msg}");
    assert!(
        !msg.contains("is the NVIDIA vGPU host driver loaded"),
        "{msg}"
    );
}

#[test]
fn a_layout_plan_warns_of_a_vf_whose_state_cannot_be_read() {
    let t = doctor_hosts::vfs_elsewhere().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let report = dry_run(&host, "second").unwrap();
    assert!(
        report
            .plan
            .warnings
            .iter()
            .any(|w| w.contains("VF 0000:27:00.5") && w.contains("cannot be read")),
        "{:?}",
        report.plan.warnings
    );
    // The readable VF still takes the vGPU.
    assert_eq!(report.plan.steps.len(), 1, "{:?}", report.plan.steps);
}

#[test]
fn doctor_names_the_vfs_driver_and_does_not_say_to_install_the_vgpu_manager() {
    let t = doctor_hosts::vfs_elsewhere().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let d = diagnose(&host, "n1").unwrap();
    let held = d
        .checks
        .iter()
        .find(|c| c.check == "vf-drivers")
        .unwrap_or_else(|| panic!("no vf-drivers check in {:#?}", d.checks));
    assert_eq!(held.verdict, Verdict::Fail);
    assert_eq!(held.subject.as_deref(), Some("nvidia0 (0000:26:00.0)"));
    assert!(held.message.contains("bound to vfio-pci"), "{held:?}");
    let fix = held.fix.as_deref().unwrap();
    assert!(
        fix.contains("vfio-pci.ids=10de:26b9") && fix.contains("remove 10de:26b9"),
        "{fix}"
    );
    assert!(fix.contains("driver_override"), "{fix}");
    for c in &d.checks {
        let text = format!("{} {}", c.message, c.fix.as_deref().unwrap_or(""));
        assert!(!text.contains("install NVIDIA's vGPU manager"), "{c:?}");
        assert!(
            !text.contains("is the NVIDIA vGPU host driver loaded"),
            "{c:?}"
        );
    }
    let state = d
        .checks
        .iter()
        .find(|c| c.check == "vf-state")
        .unwrap_or_else(|| panic!("no vf-state check in {:#?}", d.checks));
    assert_eq!(state.verdict, Verdict::Warn);
    assert_eq!(state.subject.as_deref(), Some("nvidia1 (0000:27:00.0)"));
    assert!(state.message.contains("VF 0000:27:00.5"), "{state:?}");
}

#[test]
fn a_vgpu_asked_of_a_gpu_whose_vfs_vfio_pci_took_names_the_driver_and_the_fix() {
    let t = doctor_hosts::vfs_elsewhere().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let e =
        gpu_sysfs::actuate::mdev_parent_on_gpu(&host, &addr("0000:26:00.0"), "L40S-24Q", None, &[])
            .unwrap_err();
    let msg = gpu_core::error_chain(&e);
    assert!(msg.contains("(vfio-pci)"), "{msg}");
    assert!(msg.contains("vfio-pci.ids="), "{msg}");
    assert!(!msg.contains("is the vGPU host driver loaded"), "{msg}");
}
