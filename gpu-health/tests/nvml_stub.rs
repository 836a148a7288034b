//! The NVML adapter against a stand-in `libnvidia-ml.so.1` compiled from `data/nvml_stub.c`, so
//! loading, symbol checks, every call and every error code run for real without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use gpu_core::PciAddress;
use gpu_health::{NvmlTelemetry, NvmlUnavailable, Reading, RowRemap, Telemetry};

/// Builds the stub with extra `-D` flags into its own tempdir ([`gpu_nvml::stub::build`]); `None`
/// (and a SKIPPED line) when there is no C compiler.
fn build_stub(defines: &[&str]) -> Option<(tempfile::TempDir, PathBuf)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nvml_stub.c");
    gpu_nvml::stub::build(&src, defines).unwrap()
}

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

#[test]
fn a_healthy_gpu_reads_every_signal_through_nvml() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let nvml = NvmlTelemetry::open(Some(&lib)).unwrap();
    assert_eq!(nvml.driver_version(), Some("550.54.15"));
    assert_eq!(nvml.source(), "NVML (driver 550.54.15)");
    let t = nvml.read(&addr("0000:08:00.0"));
    assert_eq!(t.ecc_uncorrected_volatile, Reading::Value(0));
    assert_eq!(t.ecc_corrected_aggregate, Reading::Value(0));
    assert_eq!(t.retired_pages_sbe, Reading::Value(0));
    assert_eq!(t.pages_pending_retirement, Reading::Value(false));
    assert_eq!(t.row_remap, Reading::Value(RowRemap::default()));
    assert_eq!(t.temperature_c, Reading::Value(41));
    assert_eq!(t.slowdown_c, Reading::Value(90));
    assert_eq!(t.shutdown_c, Reading::Value(95));
    assert_eq!(t.pcie_replay_counter, Reading::Value(0));
    assert_eq!(t.memory_mib(), Some(16384));
    assert!(!t.gpu_lost);
}

#[test]
fn a_failing_gpu_reports_its_counts_and_the_raw_row_remap_call() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let nvml = NvmlTelemetry::open(Some(&lib)).unwrap();
    let t = nvml.read(&addr("0000:41:00.0"));
    assert_eq!(t.ecc_uncorrected_volatile, Reading::Value(3));
    assert_eq!(t.ecc_uncorrected_aggregate, Reading::Value(3));
    assert_eq!(t.ecc_corrected_volatile, Reading::Value(5));
    assert_eq!(t.ecc_corrected_aggregate, Reading::Value(7));
    assert_eq!(t.retired_pages_sbe, Reading::Value(2));
    assert_eq!(t.retired_pages_dbe, Reading::Value(1));
    assert_eq!(t.pages_pending_retirement, Reading::Value(true));
    assert_eq!(
        t.row_remap,
        Reading::Value(RowRemap {
            corrected_rows: 1,
            uncorrected_rows: 2,
            pending: true,
            failure: true,
        })
    );
    assert_eq!(t.temperature_c, Reading::Value(96));
    assert_eq!(t.pcie_replay_counter, Reading::Value(12));
    assert_eq!(t.memory_mib(), Some(81920));
}

#[test]
fn calls_the_gpu_does_not_support_read_as_unsupported() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let nvml = NvmlTelemetry::open(Some(&lib)).unwrap();
    let t = nvml.read(&addr("0000:42:00.0"));
    assert_eq!(t, gpu_health::GpuTelemetry::unsupported());
}

#[test]
fn a_device_nvml_does_not_know_reads_as_unknown() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let nvml = NvmlTelemetry::open(Some(&lib)).unwrap();
    let t = nvml.read(&addr("0000:99:00.0"));
    assert_eq!(
        t.temperature_c,
        Reading::Unknown("NVML does not know this device".into())
    );
    assert_eq!(t.values_read(), 0);
}

#[test]
fn a_gpu_that_fell_off_the_bus_is_marked_lost() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let nvml = NvmlTelemetry::open(Some(&lib)).unwrap();
    let t = nvml.read(&addr("0000:43:00.0"));
    assert!(t.gpu_lost);
    assert_eq!(t.values_read(), 0);
}

#[test]
fn a_library_without_the_row_remap_symbol_reads_it_as_unsupported() {
    let Some((_dir, lib)) = build_stub(&["STUB_NO_REMAP"]) else {
        return;
    };
    let nvml = NvmlTelemetry::open(Some(&lib)).unwrap();
    let t = nvml.read(&addr("0000:41:00.0"));
    assert_eq!(t.row_remap, Reading::Unsupported);
    assert_eq!(t.ecc_uncorrected_volatile, Reading::Value(3));
}

#[test]
fn a_library_without_nvml_shutdown_is_refused_rather_than_crashing_on_drop() {
    let Some((_dir, lib)) = build_stub(&["STUB_NO_SHUTDOWN"]) else {
        return;
    };
    match NvmlTelemetry::open(Some(&lib)) {
        Err(NvmlUnavailable::LibraryNotFound { message, .. }) => {
            assert_eq!(message, "nvmlShutdown not found");
        }
        other => panic!("expected LibraryNotFound, got {other:?}"),
    }
}

#[test]
fn driver_not_loaded_is_its_own_outcome() {
    let Some((_dir, lib)) = build_stub(&["STUB_DRIVER_NOT_LOADED"]) else {
        return;
    };
    assert_eq!(
        NvmlTelemetry::open(Some(&lib)).unwrap_err(),
        NvmlUnavailable::DriverNotLoaded
    );
}

#[test]
fn no_permission_is_its_own_outcome() {
    let Some((_dir, lib)) = build_stub(&["STUB_NO_PERMISSION"]) else {
        return;
    };
    assert_eq!(
        NvmlTelemetry::open(Some(&lib)).unwrap_err(),
        NvmlUnavailable::NoPermission
    );
}

#[test]
fn a_missing_library_is_a_value_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libnvidia-ml.so.1");
    match NvmlTelemetry::open(Some(&missing)) {
        Err(NvmlUnavailable::LibraryNotFound { library, message }) => {
            assert_eq!(library, missing.display().to_string());
            assert!(!message.is_empty());
        }
        other => panic!("expected LibraryNotFound, got {other:?}"),
    }
}

#[test]
fn a_library_that_is_not_nvml_is_reported_as_not_found() {
    let Some((dir, _lib)) = build_stub(&[]) else {
        return;
    };
    // A shared object without nvmlInit_v2.
    let other = dir.path().join("libother.so");
    let src = dir.path().join("other.c");
    std::fs::write(&src, "int not_nvml(void) { return 0; }\n").unwrap();
    let ok = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&other)
        .arg(&src)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    assert!(matches!(
        NvmlTelemetry::open(Some(&other)),
        Err(NvmlUnavailable::LibraryNotFound { .. })
    ));
}

#[test]
fn nvml_events_arrive_graded_by_gpu_and_the_reader_stops_when_dropped() {
    use gpu_health::{GpuEventKind, GpuEventSource, NvmlEventSource, XidPolicy};
    use std::time::Duration;
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let mut source = NvmlEventSource::open(Some(&lib)).unwrap();
    // The unsupported GPU takes no registration and the lost one cannot be named.
    assert_eq!(
        source.watched,
        vec![addr("0000:08:00.0"), addr("0000:41:00.0")]
    );
    let first = source.next(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(first.address, addr("0000:08:00.0"));
    assert_eq!(first.kind, GpuEventKind::Xid { xid: Some(79) });
    let second = source.next(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(second.address, addr("0000:41:00.0"));
    assert_eq!(second.kind, GpuEventKind::DoubleBitEcc);
    assert_eq!(source.next(Duration::from_millis(100)).unwrap(), None);
    let policy = XidPolicy::default();
    assert_eq!(
        policy.grade(&first).map(|v| v.0),
        Some(gpu_core::HealthState::Unhealthy)
    );
    drop(source);
}

#[test]
fn nvml_events_without_a_driver_say_so() {
    use gpu_health::{NvmlEventSource, NvmlEventsUnavailable};
    let Some((_dir, lib)) = build_stub(&["STUB_DRIVER_NOT_LOADED"]) else {
        return;
    };
    assert_eq!(
        NvmlEventSource::open(Some(&lib)).unwrap_err(),
        NvmlEventsUnavailable::Nvml(NvmlUnavailable::DriverNotLoaded)
    );
}

// ----- MIG: GPU instances and their placements, through the raw NVML calls -----

mod mig {
    use std::sync::Arc;

    use gpu_core::{MigPlaced, NodeTopology, ParentId};
    use gpu_health::NvmlResolver;
    use gpu_sysfs::RealHost;
    use gpu_sysfs::discover::{DiscoverOptions, discover};
    use gpu_sysfs::resolver::{GpuInstancePlacement, GpuInstances, TypeNameResolver};
    use gpu_sysfs::testing::fixtures::{h200_mig_host, h200_pf};

    use super::{addr, build_stub};

    /// The stand-in's H200 in MIG mode (the PF of the fixture's H200 host).
    const H200: &str = "0000:18:00.0";

    fn one_g(id: u32, start: u32) -> GpuInstancePlacement {
        GpuInstancePlacement {
            id,
            compute_slices: 1,
            start,
            size: 1,
        }
    }

    /// The one-H200 host with two `H200X-1-18C` vGPUs, free VFs listing `listed`, discovered
    /// with the stand-in built with `defines` as its type-name and GPU-instance source.
    fn discovered(defines: &[&str], listed: &[u32]) -> Option<NodeTopology> {
        assert_eq!(h200_pf(0), H200);
        let (_dir, lib) = build_stub(defines)?;
        let resolver = NvmlResolver::open_library(Some(&lib)).unwrap();
        let tree = h200_mig_host(&[(0, 1414), (1, 1414)], listed).unwrap();
        let host = RealHost::new(tree.root()).unwrap();
        let opts = DiscoverOptions::new("h200").with_resolver(Arc::new(resolver));
        Some(discover(&host, &opts).unwrap())
    }

    fn slots(t: &NodeTopology) -> gpu_core::MigSlots {
        t.pool(&ParentId::Pci(addr(H200)))
            .unwrap()
            .mig_slots
            .as_deref()
            .cloned()
            .unwrap()
    }

    fn warnings(t: &NodeTopology) -> Vec<String> {
        t.gpus
            .iter()
            .find(|g| g.address == addr(H200))
            .unwrap()
            .warnings
            .clone()
    }

    /// The warnings of a discovery that fell back to the conservative rule: both 1g held
    /// wherever they may sit, none at a known start.
    fn fell_back(t: &NodeTopology) -> Vec<String> {
        let s = slots(t);
        assert!(s.placed.is_empty(), "{s:?}");
        assert_eq!(s.unplaced, ["1g.18gb", "1g.18gb"]);
        warnings(t)
    }

    fn placed(start: u8) -> MigPlaced {
        MigPlaced {
            profile: "1g.18gb".into(),
            start,
        }
    }

    #[test]
    fn nvml_reports_each_gpu_instance_with_its_placement_and_other_gpus_as_unsupported() {
        let Some((_dir, lib)) = build_stub(&[]) else {
            return;
        };
        let r = NvmlResolver::open_library(Some(&lib)).unwrap();
        assert_eq!(
            r.gpu_instances(&addr(H200)),
            GpuInstances::Known(vec![one_g(1, 0), one_g(2, 4)])
        );
        assert_eq!(
            r.gpu_instances(&addr("0000:08:00.0")),
            GpuInstances::Unsupported("the GPU has no GPU-instance profiles".into())
        );
        assert_eq!(
            r.gpu_instances(&addr("0000:99:00.0")),
            GpuInstances::Unsupported("NVML does not know 0000:99:00.0".into())
        );
        assert!(matches!(
            r.gpu_instances(&addr("0000:43:00.0")),
            GpuInstances::Failed(why) if why.contains("NVML")
        ));
    }

    #[test]
    fn one_g_at_slots_0_and_4_from_nvml_refuse_a_3g() {
        // Beside 1g at 0 and 4 the driver lists the 1g types, the 1g.35gb and the 2g only.
        let Some(t) = discovered(&[], &[1414, 1415, 1416, 1417]) else {
            return;
        };
        let s = slots(&t);
        assert_eq!(s.placed, [placed(0), placed(4)]);
        assert!(s.unplaced.is_empty());
        let three = s.geometry().unwrap().profile_named("3g.71gb").unwrap();
        let e = s.check(three).unwrap_err();
        assert!(
            e.to_string().contains("no free start slot for a 3g.71gb"),
            "{e}"
        );
        let two = s.geometry().unwrap().profile_named("2g.35gb").unwrap();
        assert!(s.check(two).is_ok());
    }

    #[test]
    fn one_g_at_slots_0_and_1_from_nvml_leave_a_3g_at_4_the_conservative_rule_alone_refuses() {
        let Some(t) = discovered(
            &["STUB_MIG_GI={19,0,1},{19,1,1}"],
            &[1414, 1415, 1416, 1417, 1418],
        ) else {
            return;
        };
        let s = slots(&t);
        assert_eq!(s.placed, [placed(0), placed(1)]);
        let g = s.geometry().unwrap();
        let three = g.profile_named("3g.71gb").unwrap();
        assert!(s.check(three).is_ok(), "{s:?}");
        let one = g.profile_named("1g.18gb").unwrap();
        // The two 1g held wherever they may sit (0 and 4 among them) leave no 3g for sure.
        assert!(
            g.fits_every(gpu_core::MigOccupancy::empty(), &[one, one], three)
                .is_err()
        );
        // And the free VFs offer it.
        let free = t
            .parent(&ParentId::Pci(addr(
                &gpu_sysfs::testing::fixtures::h200_vf(0, 2),
            )))
            .unwrap();
        let offered = free
            .profiles
            .iter()
            .find(|p| p.id.as_str() == "1418")
            .unwrap();
        assert_eq!(offered.available_instances, 1);
        assert!(warnings(&t).iter().all(|w| !w.starts_with("MIG slots:")));
    }

    #[test]
    fn a_library_without_the_gpu_instance_call_reads_as_unsupported_and_discovery_falls_back() {
        let Some((_dir, lib)) = build_stub(&["STUB_NO_GI_INFO"]) else {
            return;
        };
        let r = NvmlResolver::open_library(Some(&lib)).unwrap();
        assert!(matches!(
            r.gpu_instances(&addr(H200)),
            GpuInstances::Unsupported(why) if why.contains("nvmlGpuInstanceGetInfo")
        ));
        let t = discovered(&["STUB_NO_GI_INFO"], &[1414, 1415, 1416, 1417]).unwrap();
        assert!(fell_back(&t).iter().all(|w| !w.starts_with("MIG slots:")));
    }

    #[test]
    fn when_nvml_refuses_a_user_the_gpu_instances_discovery_falls_back_and_says_root_is_needed() {
        let defines = ["STUB_GI_NO_PERMISSION"];
        let Some(t) = discovered(&defines, &[1414, 1415, 1416, 1417]) else {
            return;
        };
        let w = fell_back(&t);
        assert!(
            w.iter().any(|w| w.starts_with(
                "MIG slots: NVML could not list the GPU instances (nvmlDeviceGetGpuInstances: NVML:"
            ) && w.contains("(listing GPU instances needs root)")
                && w.ends_with("each MIG-backed vGPU is held wherever it may sit")),
            "{w:?}"
        );
    }

    #[test]
    fn fewer_gpu_instances_than_mig_backed_vgpus_fall_back_with_a_warning() {
        let Some(t) = discovered(&["STUB_MIG_GI={19,0,1}"], &[1414, 1415, 1416, 1417, 1418]) else {
            return;
        };
        let w = fell_back(&t);
        assert!(
            w.iter().any(
                |w| w.starts_with("MIG slots: NVML's GPU-instance placements disagree")
                    && w.contains("sysfs shows 2 MIG-backed vGPU(s)")
                    && w.contains("NVML 1 GPU instance(s) [1g.18gb at 0]")
            ),
            "{w:?}"
        );
    }
}

/// A root with no devices at all: what NVML is opened for does not depend on the tree.
fn empty_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("sys/bus/pci/devices")).unwrap();
    root
}

fn request_with(lib: &Path) -> gpu_health::NodeRequest {
    let mut req = gpu_health::NodeRequest::new("n");
    req.nvml = gpu_health::NvmlSource::Library(lib.to_path_buf());
    req
}

#[test]
fn a_composed_node_opens_its_nvml_once_for_the_telemetry_and_the_type_names() {
    // The stub refuses a second nvmlInit_v2 while it is loaded: two opens would fail here.
    let Some((_dir, lib)) = build_stub(&["STUB_INIT_ONCE"]) else {
        return;
    };
    let root = empty_root();
    let node = gpu_health::open_node(root.path(), &request_with(&lib)).unwrap();
    assert!(node.topology.gpus.is_empty());
}

#[test]
fn a_host_opened_for_changes_opens_its_nvml_once_too() {
    let Some((_dir, lib)) = build_stub(&["STUB_INIT_ONCE"]) else {
        return;
    };
    let root = empty_root();
    let opened = gpu_health::open_node_host(root.path(), &request_with(&lib)).unwrap();
    assert!(opened.discover.resolver.is_some());
    assert!(opened.health.telemetry.is_some());
    assert_eq!(opened.health.telemetry_note, None);
}

#[test]
fn without_the_drivers_control_device_the_default_nvml_is_not_looked_for() {
    if Path::new(gpu_health::nvml::CONTROL_DEVICE).exists() {
        println!("SKIPPED: this machine has an NVIDIA driver");
        return;
    }
    assert_eq!(
        NvmlTelemetry::open(None).unwrap_err(),
        NvmlUnavailable::DriverNotLoaded
    );
    // A named library is opened whatever the machine has.
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    assert!(NvmlTelemetry::open(Some(&lib)).is_ok());
}
