#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]
//! `gpuslice gpu list` and `gpuslice topology` against golden files in `tests/golden/inventory/`.
//! `GOLDEN_UPDATE=1 cargo test -p gpuslice-cli --test inventory` rewrites
//! the `.out` files.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/inventory")
}

/// The bundled example host, relative to the golden directory the commands run in.
const A2: &str = "../../../../examples/hosts/a2-sriov-mdev.umockdev";

/// Runs gpuslice in the golden directory; `root` replaces `{root}` in the arguments and is hidden
/// from the rendered text.
fn run(args: &[&str], root: Option<&Path>) -> (i32, String) {
    let real: Vec<String> = args
        .iter()
        .map(|a| match root {
            Some(r) => a.replace("{root}", &r.display().to_string()),
            None => (*a).to_owned(),
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(&real)
        .current_dir(golden_dir())
        .env_remove("GPUSLICE_ROOT")
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    let mut text = format!(
        "$ gpuslice {}\n--- exit {code}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(r) = root {
        text = text.replace(&r.display().to_string(), "{root}");
    }
    (code, text)
}

fn check_with(name: &str, args: &[&str], root: Option<&Path>, want_code: i32) -> String {
    let (code, text) = run(args, root);
    let path = golden_dir().join(format!("{name}.out"));
    gpu_sysfs::testing::assert_golden(&path, &text);
    assert_eq!(code, want_code, "{name}: exit status");
    text
}

/// The stdout part of a rendered run.
fn stdout_of(text: &str) -> &str {
    let after = text.split_once("--- stdout\n").map_or("", |(_, a)| a);
    after.split_once("--- stderr\n").map_or(after, |(o, _)| o)
}

fn check(name: &str, args: &[&str], want_code: i32) -> String {
    check_with(name, args, None, want_code)
}

#[test]
fn gpu_list_shows_the_a2_host_as_a_table() {
    let out = check(
        "gpu-list-a2",
        &["--root", A2, "--node", "a2-host", "gpu", "list"],
        0,
    );
    assert!(out.contains("nvidia0  0000:08:00.0  nvidia"));
}

#[test]
fn gpu_list_prints_json_gpus() {
    let text = check(
        "gpu-list-a2-json",
        &[
            "--root", A2, "--node", "a2-host", "gpu", "list", "-o", "json",
        ],
        0,
    );
    let gpus: Vec<gpu_core::Gpu> = serde_json::from_str(stdout_of(&text)).unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[1].memory_mib, Some(16384));
}

#[test]
fn topology_shows_one_free_4gb_vgpu_for_the_whole_a2() {
    let out = check(
        "topology-a2",
        &["--root", A2, "--node", "a2-host", "topology"],
        0,
    );
    assert!(out.contains("NVIDIA A2-4Q   nvidia-746  4096 MiB   1     13"));
    assert!(out.contains("GPU memory: 12288 MiB allocated of 16384 MiB total"));
}

#[test]
fn topology_json_is_the_node_topology() {
    let text = check(
        "topology-a2-json",
        &["--root", A2, "--node", "a2-host", "topology", "-o", "json"],
        0,
    );
    let t = gpu_core::NodeTopology::from_text(stdout_of(&text)).unwrap();
    assert_eq!(t.node, "a2-host");
    assert_eq!(t.mediated_devices.parents.len(), 16);
}

#[test]
fn topology_publishes_only_the_parents_asked_for() {
    check(
        "topology-a2-mdev-parents",
        &[
            "--root",
            A2,
            "--node",
            "a2-host",
            "topology",
            "--mdev-parents",
            "0000:08:01.7,0000:08:00.4,mbochs",
        ],
        0,
    );
}

fn lab_tree() -> gpu_sysfs::testing::builder::Tree {
    let mut b = TreeBuilder::new();
    let bochs = |class| PciSpec::new(0x1234, 0x1111, class).driver("bochs-drm");
    b.pci("0000:00:02.0", bochs(0x030000).group(1))
        .pci(
            "0000:00:04.0",
            PciSpec::new(0x1b36, 0x0001, 0x060400).group(3),
        )
        .pci("0000:01:01.0", bochs(0x038000).group(3))
        .pci(
            "0000:01:02.0",
            PciSpec::new(0x8086, 0x100e, 0x020000)
                .driver("e1000")
                .group(3),
        )
        .pci("0000:02:00.0", bochs(0x038000).group(6))
        .mdev_parent(
            "mbochs",
            &[
                MdevTypeSpec::new(
                    "mbochs-large",
                    "mbochs-large",
                    3,
                    Some("virtual display, 64 MB video memory"),
                ),
                MdevTypeSpec::new(
                    "mbochs-small",
                    "mbochs-small",
                    47,
                    Some("virtual display, 4 MB video memory"),
                ),
            ],
        )
        .mdev_instance(
            "a5c3d43a-fbab-4b91-9f23-5c8376a481e0",
            "mbochs",
            "mbochs-large",
        )
        .mdev_parent(
            "mtty",
            &[MdevTypeSpec::new("mtty-1", "Single port serial", 24, None)],
        );
    b.finish().unwrap()
}

#[test]
fn topology_of_a_lab_host_blocks_the_display_behind_the_shared_bridge() {
    let tree = lab_tree();
    let out = check_with(
        "topology-lab",
        &["--root", "{root}", "--node", "lab", "topology"],
        Some(tree.root()),
        0,
    );
    assert!(out.contains("IOMMU group 3 shared with 0000:01:02.0 (8086:100e, driver e1000)"));
}

#[test]
fn gpu_list_reports_malformed_files_as_warnings_and_goes_on() {
    let tree = lab_tree();
    std::fs::write(
        tree.root()
            .join("sys/devices/pci0000:00/0000:02:00.0/numa_node"),
        "many\n",
    )
    .unwrap();
    check_with(
        "gpu-list-lab-warning",
        &["--root", "{root}", "--node", "lab", "gpu", "list"],
        Some(tree.root()),
        0,
    );
}

#[test]
fn gpu_list_across_a_fleet_has_a_node_column() {
    check(
        "gpu-list-fleet",
        &["gpu", "list", "--inventory", "fleet.yaml"],
        0,
    );
    check(
        "gpu-list-fleet-node",
        &["gpu", "list", "--inventory", "fleet.yaml", "--node", "lab"],
        0,
    );
    check(
        "gpu-list-fleet-json",
        &[
            "gpu",
            "list",
            "--inventory",
            "fleet.yaml",
            "--node",
            "lab",
            "-o",
            "json",
        ],
        0,
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    check(
        "gpu-list-unknown-node",
        &[
            "gpu",
            "list",
            "--inventory",
            "fleet.yaml",
            "--node",
            "nosuch",
        ],
        2,
    );
    check(
        "gpu-list-missing-root",
        &["--root", "no/such/dir", "gpu", "list"],
        2,
    );
    check(
        "topology-bad-recording",
        &["--root", "bad.umockdev", "topology"],
        2,
    );
    check(
        "topology-bad-mdev-parents",
        &["--root", A2, "topology", "--mdev-parents", "08:00.4x"],
        2,
    );
    check(
        "gpu-list-bad-fleet",
        &["gpu", "list", "--inventory", "bad-fleet.yaml"],
        2,
    );
}

#[test]
fn a_closed_stdout_ends_every_listing_quietly() {
    for args in [
        vec!["--root", A2, "topology"],
        vec!["--root", A2, "gpu", "list"],
        vec!["--root", A2, "topology", "-o", "json"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .args(&args)
            .current_dir(golden_dir())
            .env_remove("GPUSLICE_ROOT")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the command writes (`| head -0`).
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}

/// `gpu list --inventory` reads a fleet's shapes without expanding its nodes: the compact form
/// of a fleet of many nodes of one host lists what the full form lists, row for row, with the
/// fleet's allocations marking the GPUs they hold on the node they name.
#[test]
fn gpu_list_of_a_compact_fleet_lists_what_the_full_form_lists() {
    let text = std::fs::read_to_string(golden_dir().join("fleet.yaml")).unwrap();
    let mut fleet = gpu_core::Fleet::from_text(&text).unwrap();
    let a2 = fleet.nodes[0].clone();
    fleet.nodes = (0..50)
        .map(|i| {
            let mut t = a2.clone();
            t.node = format!("a2-{i:02}");
            t
        })
        .collect();
    let (gpu, name) = (a2.gpus[0].address, &a2.gpus[0].name);
    let doc = format!(
        r#"{{"machine": "vm-1", "node": "a2-07", "devices": [{{"kind": "gpu", "request": "gpu", "name": "{name}", "address": "{gpu}"}}]}}"#
    );
    fleet.allocations = vec![serde_json::from_str(&doc).unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let compact = dir.path().join("compact.json");
    let full = dir.path().join("full.json");
    std::fs::write(&compact, fleet.to_text(true).unwrap()).unwrap();
    std::fs::write(&full, fleet.to_text_full(true).unwrap()).unwrap();
    let compact_len = std::fs::metadata(&compact).unwrap().len();
    let full_len = std::fs::metadata(&full).unwrap().len();
    assert!(compact_len * 10 < full_len, "{compact_len} vs {full_len}");
    let list = |f: &Path, extra: &[&str]| {
        let mut args = vec!["gpu", "list", "--inventory", f.to_str().unwrap()];
        args.extend(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .args(&args)
            .env_remove("GPUSLICE_ROOT")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    for extra in [
        &["-o", "json"][..],
        &[][..],
        &["--node", "a2-07", "-o", "json"][..],
    ] {
        assert_eq!(list(&compact, extra), list(&full, extra), "{extra:?}");
    }
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&list(&compact, &["-o", "json"])).unwrap();
    assert_eq!(rows.len(), 50 * a2.gpus.len());
    let held: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["allocatedTo"] == serde_json::json!(["vm-1"]))
        .collect();
    assert_eq!(held.len(), 1, "only a2-07's GPU is held");
    assert_eq!(held[0]["node"], "a2-07");
}
