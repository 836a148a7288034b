//! `vgpu create --mixed-sizes` on the bundled L40S sandbox: the sandbox's NVML gives the L40S
//! no mixed-size mode (it starts, and stays, in same-size mode), so asking for mixed sizes is
//! refused before any write, naming why; not asked, the create goes on under the same-size rule,
//! which keeps refusing a second size.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sandbox_support;

use std::path::Path;

use sandbox_support::{gpuslice, ok, on, stderr, stdout};

fn vf_type(dir: &Path, vf: &str) -> String {
    std::fs::read_to_string(dir.join(format!(
        "host/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"
    )))
    .unwrap_or_default()
    .trim()
    .to_owned()
}

#[test]
fn mixed_sizes_asked_of_the_bundled_l40s_are_refused_before_any_write_and_one_size_holds() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("l40s");
    ok(gpuslice(&[
        "sandbox",
        "init",
        "--from",
        "examples/hosts/l40s-vendor-vfio.umockdev",
        dir.to_str().unwrap(),
    ]));
    let create = |profile: &str, mixed: bool| {
        let mut args = vec![
            "vgpu",
            "create",
            "--parent",
            "0000:26:00.0",
            "--profile",
            profile,
        ];
        if mixed {
            args.push("--mixed-sizes");
        }
        on(&dir, &args)
    };
    let o = create("L40S-24Q", true);
    assert!(!o.status.success(), "{}", stdout(&o));
    let e = stderr(&o);
    assert!(
        e.contains("GPU 0000:26:00.0 does not support mixed-size vGPUs"),
        "{e}"
    );
    assert_eq!(vf_type(&dir, "0000:26:00.4"), "0", "nothing written");

    ok(create("L40S-24Q", false));
    assert_eq!(vf_type(&dir, "0000:26:00.4"), "1155");
    let o = create("L40S-12Q", false);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(stderr(&o).contains("L40S-12Q"), "{}", stderr(&o));
}
