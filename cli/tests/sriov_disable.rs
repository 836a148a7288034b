//! `gpuslice sriov disable GPU` on a sandbox host: refused while a VF holds a vGPU (naming it,
//! nothing written), then the VFs go; asked again, there is nothing to disable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use gpu_sysfs::testing::FakeKernel;

fn gpuslice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .args(args)
        .output()
        .unwrap()
}

fn on(dir: &Path, args: &[&str]) -> Output {
    let root = format!("sandbox:{}", dir.display());
    let mut all = vec!["--root", root.as_str(), "--node", "demo"];
    all.extend_from_slice(args);
    gpuslice(&all)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

#[test]
fn sriov_disable_is_refused_while_a_vf_holds_a_vgpu_then_takes_the_vfs_away() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    ok(gpuslice(&[
        "sandbox",
        "init",
        dir.to_str().unwrap(),
        "--from",
        k.root().to_str().unwrap(),
    ]));
    let pf = "0000:26:00.0";
    let numvfs = || {
        std::fs::read_to_string(dir.join(format!("host/sys/bus/pci/devices/{pf}/sriov_numvfs")))
            .unwrap()
            .trim()
            .to_owned()
    };
    let made: serde_json::Value = serde_json::from_str(&ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            pf,
            "--profile",
            "NVIDIA L40S-24Q",
            "-o",
            "json",
        ],
    )))
    .unwrap();
    let vf = made["vf"].as_str().unwrap().to_owned();

    // A VF holds a vGPU: refused, naming it, and SR-IOV stays on.
    let o = on(&dir, &["sriov", "disable", pf]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("cannot disable SR-IOV on {pf}")),
        "{err}"
    );
    assert!(err.contains(&format!("VF {vf} holds vGPU type")), "{err}");
    assert_eq!(numvfs(), "4");
    let o = on(&dir, &["sriov", "disable", pf, "-o", "json"]);
    let err = text(&o.stderr);
    let at = err
        .find('{')
        .unwrap_or_else(|| panic!("no error document in {err}"));
    let doc: serde_json::Value = serde_json::from_str(&err[at..]).unwrap();
    assert_eq!(doc["error"]["kind"], "in-use", "{doc}");

    // Once the vGPU is gone, the VFs go.
    ok(on(&dir, &["vgpu", "remove", &vf]));
    let out = ok(on(&dir, &["sriov", "disable", pf]));
    assert_eq!(
        out.trim(),
        format!("disabled SR-IOV on {pf} (4 VFs removed)")
    );
    assert_eq!(numvfs(), "0");
    assert!(!dir.join(format!("host/sys/bus/pci/devices/{vf}")).exists());
    let out = ok(on(&dir, &["sriov", "disable", pf]));
    assert_eq!(out.trim(), format!("{pf} has no VFs (nothing to disable)"));
}
