use gpu_core::PciAddress;
use gpu_core::mig::MigGeometry;
use gpu_core::mig::parted::MigPartedFile;
use gpu_nvml::fake::{FakeGpu, FakeNvml};
use gpu_nvml::{MigMode, NvmlDevices, NvmlErrorKind};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::{PciSpec, TreeBuilder};

use super::*;

const PF: &str = "0000:41:00.0";

fn pf() -> PciAddress {
    PF.parse().unwrap()
}

/// An H100 SXM (10de:2330) on `nvidia`, with `vfs` SR-IOV VFs.
fn tree(vfs: u32) -> gpu_sysfs::testing::builder::Tree {
    let mut b = TreeBuilder::new();
    b.pci(PF, PciSpec::new(0x10de, 0x2330, 0x030200).driver("nvidia"));
    if vfs > 0 {
        b.sriov(
            PF,
            vfs,
            16,
            4,
            1,
            PciSpec::new(0x10de, 0x2330, 0x030200).driver("nvidia"),
            None,
        );
    }
    b.finish().unwrap()
}

fn h100_nvml(mode: MigMode) -> FakeNvml {
    let g = MigGeometry::for_device(0x2330).unwrap();
    FakeNvml::new().with_gpu(pf(), FakeGpu::mig(g).with_mig_mode(mode))
}

fn with<T>(vfs: u32, nvml: &FakeNvml, f: impl FnOnce(Mig<'_, '_>, &RealHost) -> T) -> T {
    let t = tree(vfs);
    let host = RealHost::new(t.root()).unwrap();
    let opts = DiscoverOptions::new("n");
    let node = Node::new(&host, &opts);
    f(node.mig(nvml), &host)
}

#[test]
fn mig_mode_goes_on_only_while_nothing_uses_the_gpu_and_before_vfs_exist() {
    let nvml = h100_nvml(MigMode::Disabled);
    with(2, &nvml, |mig, _| {
        let e = mig.set_mode(&pf(), MigMode::Enabled).unwrap_err();
        assert!(e.to_string().contains("sriov-manage -e"), "{e}");
        assert!(nvml.writes().is_empty());
    });
    with(0, &nvml, |mig, _| {
        nvml.start_process(&pf()).unwrap();
        // A process holds the GPU: NVML accepts the mode but it waits (IN_USE): reported.
        let e = mig.set_mode(&pf(), MigMode::Enabled).unwrap_err();
        assert!(matches!(e, MigError::PendingReset { .. }), "{e}");
        // Asked again, the pending mode is reported and nothing more is written.
        let before = nvml.writes().len();
        let again = mig.set_mode(&pf(), MigMode::Enabled).unwrap_err();
        assert!(again.to_string().contains("pending a GPU reset"), "{again}");
        assert_eq!(nvml.writes().len(), before);
        nvml.end_processes(&pf()).unwrap();
        nvml.reset(&pf()).unwrap();
        assert_eq!(mig.status(&pf()).unwrap().mig_mode, "enabled");
    });
}

#[test]
fn a_mode_that_needs_a_reset_is_reported_as_pending_never_assumed() {
    let g = MigGeometry::for_device(0x2330).unwrap();
    let nvml = FakeNvml::new().with_gpu(pf(), FakeGpu::mig(g).needing_reset());
    with(0, &nvml, |mig, _| {
        let e = mig.set_mode(&pf(), MigMode::Enabled).unwrap_err();
        assert!(
            matches!(
                e,
                MigError::PendingReset {
                    pending: "enabled",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(mig.status(&pf()).unwrap().mig_mode, "pending reset");
        let e = mig.create(&pf(), "1g.10gb", "test").unwrap_err();
        assert!(matches!(e, MigError::PendingReset { .. }), "{e}");
    });
}

#[test]
fn an_instance_is_made_where_it_keeps_the_most_layouts_and_recorded_as_ours() {
    let nvml = h100_nvml(MigMode::Enabled);
    with(0, &nvml, |mig, host| {
        let made = mig.create(&pf(), "1g.10gb", "vgpu create").unwrap();
        assert_eq!((made.start, made.slices, made.made_by), (6, 1, "gpuslice"));
        // Someone else's instance, made behind gpuslice's back.
        let theirs = nvml
            .create_gpu_instance(&pf(), 9, gpu_nvml::Placement { start: 0, size: 4 })
            .unwrap();
        let st = mig.status(&pf()).unwrap();
        let by: Vec<(u32, &str)> = st
            .gpu_instances
            .iter()
            .map(|i| (i.start, i.made_by))
            .collect();
        assert_eq!(by, [(0, "other"), (6, "gpuslice")]);
        let three = st.profiles.iter().find(|p| p.name == "3g.40gb").unwrap();
        assert!(three.placements.is_empty(), "{three:?}");
        let two = st.profiles.iter().find(|p| p.name == "2g.20gb").unwrap();
        assert_eq!(two.placements, [4]);
        // Only ours goes; theirs stays unless asked for every one.
        let e = mig.destroy(&pf(), theirs.id, false).unwrap_err();
        assert!(matches!(e, MigError::NotOurs { .. }), "{e}");
        let (cleared, kept) = mig.clear(&pf(), false).unwrap();
        assert_eq!((cleared.destroyed, kept), (vec![made.id], vec![]));
        assert_eq!(nvml.gpu_instances(&pf()).unwrap().len(), 1);
        assert!(owned::read(host).is_empty());
    });
}

#[test]
fn an_instance_a_vgpu_uses_is_never_destroyed() {
    let g = MigGeometry::for_device(0x2330).unwrap();
    let t =
        gpu_nvml::fake::FakeVgpuType::new(1, "NVIDIA H100XM-1-10C", 10240, 1, &[0]).mig_backed(19);
    let nvml = FakeNvml::new().with_gpu(
        pf(),
        FakeGpu::mig(g)
            .with_mig_mode(MigMode::Enabled)
            .with_vgpu_types(vec![t]),
    );
    with(0, &nvml, |mig, _| {
        let made = mig.create(&pf(), "1g.10gb", "vgpu create").unwrap();
        nvml.start_vgpu(&pf(), 1, None, Some(made.id)).unwrap();
        let (cleared, kept) = mig.clear(&pf(), false).unwrap();
        assert!(cleared.destroyed.is_empty());
        assert_eq!(kept, [made.id]);
        // Nor can MIG mode go off under it.
        let e = mig.set_mode(&pf(), MigMode::Disabled).unwrap_err();
        assert!(e.to_string().contains("vGPU"), "{e}");
    });
}

#[test]
fn an_unknown_board_is_planned_on_what_nvml_lists_never_past_its_memory_slices() {
    // A board gpu-core has no table for (device 0x9999) whose NVML lists the H100's lattice.
    let t = {
        let mut b = TreeBuilder::new();
        b.pci(PF, PciSpec::new(0x10de, 0x9999, 0x030200).driver("nvidia"));
        b.finish().unwrap()
    };
    let host = RealHost::new(t.root()).unwrap();
    let opts = DiscoverOptions::new("n");
    let node = Node::new(&host, &opts);
    let nvml = h100_nvml(MigMode::Enabled);
    let mig = node.mig(&nvml);
    let st = mig.status(&pf()).unwrap();
    assert_eq!(st.geometry, "nvml");
    assert!(
        st.profiles.iter().any(|p| p.name == "3g.40gb"),
        "{:?}",
        st.profiles
    );
    mig.create(&pf(), "3g.40gb", "t").unwrap();
    mig.create(&pf(), "3g.40gb", "t").unwrap();
    // Two 3g hold all eight memory slices: a 1g finds no room (compute slices alone would say 1).
    let e = mig.create(&pf(), "1g.10gb", "t").unwrap_err();
    assert!(matches!(e, MigError::NoRoom { .. }), "{e}");
    // MIG off and no table: unknown, said so.
    let off = h100_nvml(MigMode::Disabled);
    let st = node.mig(&off).status(&pf()).unwrap();
    assert_eq!(st.geometry, "unknown");
    assert!(st.note.unwrap().contains("no table"));
}

const PARTED: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  mixed:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "3g.40gb": 1
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
        "1g.10gb": 1
"#;

#[test]
fn a_mig_parted_config_is_applied_asserted_and_refused_before_any_write_when_it_cannot_fit() {
    let file = MigPartedFile::parse(PARTED).unwrap();
    let nvml = h100_nvml(MigMode::Disabled);
    with(0, &nvml, |mig, host| {
        let gpus = discover(host, &DiscoverOptions::new("n")).unwrap().gpus;
        let e = mig
            .apply(file.select("too-much").unwrap(), &gpus)
            .unwrap_err();
        assert!(matches!(e, MigError::NoRoom { .. }), "{e}");
        assert!(nvml.writes().is_empty(), "{:?}", nvml.writes());
        let mixed = file.select("mixed").unwrap();
        assert!(!mig.plan(mixed, &gpus).unwrap()[0].matches());
        let changes = mig.apply(mixed, &gpus).unwrap();
        assert_eq!(changes[0].mig_mode, Some("enabled"));
        let starts: Vec<(String, u32)> = changes[0]
            .created
            .iter()
            .map(|c| (c.profile.clone(), c.start))
            .collect();
        assert_eq!(starts[0], ("3g.40gb".to_owned(), 4));
        assert!(mig.plan(mixed, &gpus).unwrap()[0].matches());
        // Applying again changes nothing.
        let before = nvml.writes().len();
        assert!(!mig.apply(mixed, &gpus).unwrap()[0].changed());
        assert_eq!(nvml.writes().len(), before);
        // Back off: the instances go first, then MIG mode.
        let off = mig
            .apply(file.select("all-disabled").unwrap(), &gpus)
            .unwrap();
        assert_eq!(off[0].destroyed.len(), 3);
        assert_eq!(off[0].mig_mode, Some("disabled"));
        assert_eq!(
            nvml.mig_mode(&pf()).unwrap(),
            gpu_nvml::MigModes::settled(MigMode::Disabled)
        );
    });
}

#[test]
fn a_gpu_without_mig_is_said_to_be_one() {
    let nvml = FakeNvml::new().with_gpu(pf(), FakeGpu::new(46_068));
    with(0, &nvml, |mig, _| {
        let e = mig.status(&pf()).unwrap_err();
        assert!(matches!(e, MigError::NotMigCapable { .. }), "{e}");
        let _ = NvmlErrorKind::NotSupported;
    });
}

#[test]
fn a_type_of_the_other_kind_is_refused_before_anything_is_written_while_the_gpu_has_vfs() {
    let nvml = h100_nvml(MigMode::Enabled);
    with(2, &nvml, |mig, _| {
        let e = mig.before_vgpu(&pf(), "NVIDIA H100XM-80C").unwrap_err();
        assert!(matches!(e, MigError::InUse { .. }), "{e}");
        assert!(e.to_string().contains("time-sliced"), "{e}");
        assert!(e.to_string().contains("sriov-manage -e"), "{e}");
        assert!(nvml.writes().is_empty());
    });
    // A MIG-backed type with MIG mode off while VFs exist: said, nothing guessed.
    let off = h100_nvml(MigMode::Disabled);
    with(2, &off, |mig, _| {
        let e = mig.before_vgpu(&pf(), "NVIDIA H100XM-1-10C").unwrap_err();
        assert!(matches!(e, MigError::InUse { .. }), "{e}");
        assert!(e.to_string().contains("MIG-backed"), "{e}");
        assert_eq!(mig.before_vgpu(&pf(), "NVIDIA H100XM-80C").unwrap(), None);
        assert!(off.writes().is_empty());
    });
}

#[test]
fn a_mig_backed_type_gets_an_instance_of_its_profile_only_when_none_is_free() {
    let nvml = h100_nvml(MigMode::Enabled);
    with(0, &nvml, |mig, _| {
        let made = mig
            .before_vgpu(&pf(), "NVIDIA H100XM-3-40C")
            .unwrap()
            .unwrap();
        assert_eq!(
            (made.profile.as_str(), made.made_by),
            ("3g.40gb", "gpuslice")
        );
        // No VF holds a vGPU of it yet: the instance is free, nothing more is made.
        assert_eq!(mig.before_vgpu(&pf(), "NVIDIA H100XM-3-40C").unwrap(), None);
        // With no vGPU using it, the instance gpuslice made goes again.
        assert_eq!(
            mig.after_vgpu(&pf(), "NVIDIA H100XM-3-40C").unwrap(),
            Some(made.id)
        );
        assert!(nvml.gpu_instances(&pf()).unwrap().is_empty());
    });
}
