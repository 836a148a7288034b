//! `vgpu create --mixed-sizes` on the bundled L40S sandbox: the sandbox's NVML gives the L40S
//! mixed-size support starting in same-size mode (kept in `DIR/nvml.json` between commands), so
//! asking for mixed sizes on the idle GPU turns the mode on, a second size joins the first at
//! its own placement, and `vgpu list` / `topology` show each `placementId`; not asked, the
//! same-size rule keeps refusing a second size.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sandbox_support;

use std::path::Path;

use sandbox_support::{l40s_sandbox, ok, on, stderr, stdout};

fn vf_type(dir: &Path, vf: &str) -> String {
    std::fs::read_to_string(dir.join(format!(
        "host/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"
    )))
    .unwrap_or_default()
    .trim()
    .to_owned()
}

/// `vgpu create` of `profile` on the L40S sandbox's GPU, with `--mixed-sizes` when `mixed`.
fn create_on_l40s(dir: &std::path::Path, profile: &str, mixed: bool) -> std::process::Output {
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
    on(dir, &args)
}

#[test]
fn mixed_sizes_asked_of_the_bundled_l40s_turn_the_mode_on_and_place_two_sizes() {
    let t = tempfile::tempdir().unwrap();
    let dir = l40s_sandbox(t.path());
    let create = |profile: &str, mixed: bool| create_on_l40s(&dir, profile, mixed);
    ok(create("L40S-24Q", true));
    assert_eq!(vf_type(&dir, "0000:26:00.4"), "1155");
    let saved = std::fs::read_to_string(dir.join("nvml.json")).unwrap();
    assert!(saved.contains("heterogeneous"), "the mode kept: {saved}");
    // The mode is on (read back from nvml.json by the next process): a second size joins.
    ok(create("L40S-12Q", false));
    assert_eq!(vf_type(&dir, "0000:26:00.5"), "1153");
    for cmd in [
        &["vgpu", "list", "-o", "json"][..],
        &["topology", "-o", "json"][..],
    ] {
        let o = ok(on(&dir, cmd));
        let flat: String = stdout(&o).split_whitespace().collect();
        assert!(
            flat.contains("\"placementId\":0") && flat.contains("\"placementId\":24"),
            "{cmd:?}: {flat}"
        );
    }
}

#[test]
fn without_mixed_sizes_the_bundled_l40s_keeps_one_size() {
    let t = tempfile::tempdir().unwrap();
    let dir = l40s_sandbox(t.path());
    let create = |profile: &str| create_on_l40s(&dir, profile, false);
    ok(create("L40S-24Q"));
    assert_eq!(vf_type(&dir, "0000:26:00.4"), "1155");
    let o = create("L40S-12Q");
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(stderr(&o).contains("in same-size mode"), "{}", stderr(&o));
    assert_eq!(vf_type(&dir, "0000:26:00.5"), "0", "nothing written");
}
