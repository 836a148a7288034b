//! The real `FmLibrary` against a stand-in `libnvfm.so.1` compiled from `data/nvfm_stub.c`:
//! loading, symbol checks, struct versions and layouts, and FM's return codes run for real
//! without an NVSwitch.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use gpu_core::PciAddress;
use gpu_core::fabric::FabricMode;
use gpu_fabric::{FabricManager, FmConfig, FmErrorKind, FmLibrary};

/// Builds the stand-in with extra `-D` flags; `None` (and a SKIPPED line) without a C compiler.
fn build_stub(defines: &[&str]) -> Option<(tempfile::TempDir, PathBuf)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nvfm_stub.c");
    gpu_nvml::stub::build_named(&src, "libnvfm.so.1", defines).unwrap()
}

fn config(lib: &Path, mode: FabricMode) -> FmConfig {
    FmConfig {
        library: Some(lib.to_path_buf()),
        mode,
        ..FmConfig::default()
    }
}

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

#[test]
fn partitions_are_listed_activated_and_deactivated_through_libnvfm() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let fm = FmLibrary::open(&config(&lib, FabricMode::SharedNvswitch)).unwrap();
    let parts = fm.partitions().unwrap();
    assert_eq!(parts.len(), 15);
    // The same set the fake lays out (gpu_core::fabric::hgx8_default_partitions).
    let named: Vec<(String, PciAddress)> = parts[0]
        .gpus
        .iter()
        .map(|g| (String::new(), g.pci_bus_id.unwrap()))
        .collect();
    let layout = gpu_core::fabric::hgx8_default_partitions(&named).unwrap();
    for (p, want) in parts.iter().zip(&layout) {
        let got: Vec<u32> = p.gpus.iter().map(|g| g.physical_id).collect();
        assert_eq!((p.id, &got), (want.id, &want.module_ids));
    }
    let p4 = &parts[3];
    // FM writes an 8-digit domain and capitals: read as the address.
    assert_eq!(p4.gpus[1].pci_bus_id, Some(addr("0000:3a:00.0")));
    assert_eq!(p4.gpus[1].uuid, "GPU-stub-3");
    assert_eq!((p4.gpus[0].nvlinks, p4.gpus[0].max_nvlinks), (18, 18));
    fm.activate(4).unwrap();
    assert!(fm.partitions().unwrap()[3].active);
    let e = fm.activate(4).unwrap_err();
    assert_eq!(
        (e.call, e.kind),
        ("fmActivateFabricPartition", FmErrorKind::InUse)
    );
    assert_eq!(fm.activate(2).unwrap_err().kind, FmErrorKind::InUse);
    assert_eq!(fm.activate(16).unwrap_err().kind, FmErrorKind::BadParam);
    fm.deactivate(4).unwrap();
    assert_eq!(
        fm.deactivate(4).unwrap_err().kind,
        FmErrorKind::Uninitialized
    );
    fm.set_activated(&[1]).unwrap();
    assert!(fm.partitions().unwrap()[0].active);
    fm.set_activated(&[]).unwrap();
    assert!(fm.partitions().unwrap().iter().all(|p| !p.active));
    assert!(fm.nvlink_failed_devices().unwrap().is_empty());
    assert_eq!(
        fm.activate_with_vfs(4, &[addr("0000:18:00.4"), addr("0000:3a:00.4")])
            .unwrap_err()
            .kind,
        FmErrorKind::NotSupported
    );
}

#[test]
fn in_vgpu_mode_a_partition_is_activated_with_one_vf_of_each_gpu_in_order() {
    let Some((_dir, lib)) = build_stub(&["STUB_VGPU"]) else {
        return;
    };
    let fm = FmLibrary::open(&config(&lib, FabricMode::Vgpu)).unwrap();
    assert_eq!(fm.mode(), FabricMode::Vgpu);
    assert_eq!(fm.activate(4).unwrap_err().kind, FmErrorKind::NotSupported);
    let swapped = [addr("0000:3a:00.4"), addr("0000:18:00.4")];
    assert_eq!(
        fm.activate_with_vfs(4, &swapped).unwrap_err().kind,
        FmErrorKind::BadParam
    );
    fm.activate_with_vfs(4, &[addr("0000:18:00.4"), addr("0000:3a:00.4")])
        .unwrap();
    assert!(fm.partitions().unwrap()[3].active);
}

#[test]
fn failed_nvlinks_are_read_with_their_ports() {
    let Some((_dir, lib)) = build_stub(&["STUB_FAILED_LINKS"]) else {
        return;
    };
    let fm = FmLibrary::open(&config(&lib, FabricMode::SharedNvswitch)).unwrap();
    let failed = fm.nvlink_failed_devices().unwrap();
    assert_eq!(failed.gpus.len(), 1);
    assert_eq!(failed.gpus[0].pci_bus_id, Some(addr("0000:3a:00.0")));
    assert_eq!(failed.gpus[0].ports, [3, 7]);
    assert_eq!(failed.switches[0].ports, [12]);
    assert!(fm.partitions().unwrap()[3].gpus[1].is_degraded());
}

#[test]
fn an_older_library_without_vf_activation_answers_function_not_found_naming_it() {
    let Some((_dir, lib)) = build_stub(&["STUB_OLD_LIBRARY"]) else {
        return;
    };
    let fm = FmLibrary::open(&config(&lib, FabricMode::Vgpu)).unwrap();
    let e = fm.activate_with_vfs(4, &[]).unwrap_err();
    assert_eq!(
        (e.call, e.kind),
        (
            "fmActivateFabricPartitionWithVFs",
            FmErrorKind::FunctionNotFound
        )
    );
    // The rest still works.
    assert_eq!(fm.partitions().unwrap().len(), 15);
}

#[test]
fn an_unreachable_fabric_manager_and_a_missing_library_are_values() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let mut c = config(&lib, FabricMode::SharedNvswitch);
    c.address = Some("10.0.0.9".into());
    let e = FmLibrary::open(&c).unwrap_err();
    assert_eq!(
        (e.call, e.kind.clone()),
        ("fmConnect", FmErrorKind::ConnectionNotValid)
    );
    assert!(e.kind.is_unreachable());
    c.address = Some("/run/fm.sock".into());
    c.unix_socket = true;
    FmLibrary::open(&c).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let missing = config(&dir.path().join("libnvfm.so.1"), FabricMode::SharedNvswitch);
    let e = FmLibrary::open(&missing).unwrap_err();
    assert!(matches!(e.kind, FmErrorKind::Unavailable(_)), "{e}");
    assert!(e.kind.is_unreachable());
}
