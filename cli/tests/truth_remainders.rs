#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Issue 27, the rest of "one truth": totals that are lower bounds say so, sizes read from an
//! mdev type's description, every check before the first write, the `virtualFunction` rule.

mod export_support;

use export_support::*;
use gpu_sysfs::host::Host;
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::testing::fixtures::{h200_host, h200_pf};
use serde_json::{Value, json};

fn json_of(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).unwrap()
}

#[test]
fn a_partly_used_h200_shows_its_whole_memory_and_all_seven_mig_slices() {
    let t = h200_host(&[(0, 0, 1414)]).unwrap();
    let root = t.root().to_str().unwrap();
    let table = ok(&["--root", root, "--node", "h", "topology"]);
    let pf = h200_pf(0);
    let head = table
        .lines()
        .find(|l| l.contains(&format!("({pf}): vendor-vfio")))
        .unwrap();
    assert!(
        head.contains("pool 0 MiB of 144384 MiB used") && head.contains("MIG slices 1 of 7 used"),
        "{head}"
    );
    assert!(!table.contains("72704 MiB   hosts vGPUs"), "{table}");
}

#[test]
fn a_total_inferred_from_what_a_partly_used_gpu_lists_is_labelled_a_lower_bound() {
    // The L40S holds one 24Q and its free VFs list only the 24 GB types: without NVML, 48 GiB
    // is all that can be told, and only as "at least".
    let t = l40s_root(true);
    let root = t.root().to_str().unwrap();
    let table = ok(&["--root", root, "--node", "l40s-1", "topology"]);
    assert!(
        table.contains("pool 24576 MiB of at least 49152 MiB used"),
        "{table}"
    );
    assert!(table.contains("at least 49152 MiB"), "{table}");
    assert!(
        table.contains("GPU memory: 24576 MiB allocated of at least 49152 MiB total"),
        "{table}"
    );
    let v = json_of(&["--root", root, "--node", "l40s-1", "-o", "json", "topology"]);
    assert_eq!(v["gpus"][0]["memoryMiB"], 49152);
    assert_eq!(v["gpus"][0]["memoryIsLowerBound"], true);
    // An unused L40S lists everything: its size is exact and carries no mark.
    let t = l40s_root(false);
    let v = json_of(&[
        "--root",
        t.root().to_str().unwrap(),
        "--node",
        "l40s-1",
        "-o",
        "json",
        "topology",
    ]);
    assert!(v["gpus"][0].get("memoryIsLowerBound").is_none(), "{v}");
}

/// The sample drivers with one small mbochs instance made through the fake kernel.
fn mbochs_with_one_small() -> FakeKernel {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    k.write(
        "sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
        b"0b7a2f4e-3c1d-4e5f-8a9b-1c2d3e4f5a6b",
    )
    .unwrap();
    k
}

#[test]
fn an_mbochs_types_size_is_read_from_its_description() {
    let k = mbochs_with_one_small();
    let root = k.root().to_str().unwrap();
    let table = ok(&["--root", root, "--node", "m", "topology"]);
    let medium = table.lines().find(|l| l.contains("mbochs-medium")).unwrap();
    assert!(medium.contains("16 MiB"), "{table}");
    let v = json_of(&["--root", root, "--node", "m", "-o", "json", "topology"]);
    let pool = v["mediatedDevices"]["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["gpu"] == "mbochs")
        .cloned()
        .unwrap_or_else(|| panic!("an mbochs pool: {v}"));
    assert_eq!(
        (pool["totalMiB"].clone(), pool["usedMiB"].clone()),
        (json!(256), json!(4))
    );
}

#[test]
fn after_three_pending_large_mbochs_instances_three_medium_still_fit() {
    let k = mbochs_with_one_small();
    let root = k.root().to_str().unwrap();
    let node = json_of(&["--root", root, "--node", "m", "-o", "json", "topology"]);
    let large = |machine: &str, uuid: &str| {
        json!({"machine": machine, "node": "m", "status": "pending", "devices": [{
            "parent": "mbochs", "profile": "mbochs-large", "framebufferMiB": 64, "uuid": uuid,
        }]})
    };
    let fleet = json!({"nodes": [node], "allocations": [
        large("vm-1", "11111111-1111-4111-8111-111111111111"),
        large("vm-2", "22222222-2222-4222-8222-222222222222"),
        large("vm-3", "33333333-3333-4333-8333-333333333333"),
    ]});
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("fleet.json");
    std::fs::write(&f, fleet.to_string()).unwrap();
    let machine = |count: u32| {
        let p = dir.path().join(format!("m{count}.yaml"));
        std::fs::write(
            &p,
            format!(
                "name: vm-m\ndevices: [{{name: gpu, profile: mbochs-medium, count: {count}}}]\n"
            ),
        )
        .unwrap();
        p
    };
    let f = f.to_str().unwrap();
    let three = machine(3);
    let placed = run(&[
        "place",
        "--inventory",
        f,
        "--machine",
        three.to_str().unwrap(),
    ]);
    assert!(
        placed.status.success(),
        "256 MiB - 4 - 3 x 64 leaves 60 MiB: three 16 MiB fit\n{}",
        String::from_utf8_lossy(&placed.stderr)
    );
    let four = machine(4);
    let refused = run(&[
        "place",
        "--inventory",
        f,
        "--machine",
        four.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(3), "a fourth does not fit");
}

#[test]
fn vgpu_create_remembers_the_name_of_the_type_it_set() {
    let t = l40s_root(false);
    let root = t.root().to_str().unwrap();
    ok(&[
        "--root",
        root,
        "vgpu",
        "create",
        "--parent",
        "0000:26:00.4",
        "--profile",
        "L40S-24Q",
    ]);
    let names = std::fs::read_to_string(t.root().join("run/gpuslice/vgpu-type-names.json"))
        .expect("the names file");
    let names: Value = serde_json::from_str(&names).unwrap();
    assert_eq!(names["1155"], "NVIDIA L40S-24Q", "{names}");
}

#[test]
fn a_layout_file_honours_the_document_cap_of_the_command() {
    let t = l40s_root(false);
    let root = t.root().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    // A layout padded past the default 64 MiB with a comment.
    let mut text =
        String::from("version: v1\nvgpu-configs:\n  two:\n    \"0000:26:00.0\": {L40S-24Q: 2}\n#");
    text.push_str(&"x".repeat(65 << 20));
    text.push('\n');
    std::fs::write(&path, &text).unwrap();
    drop(text);
    let path = path.to_str().unwrap();
    let args = |cap: &'static str| {
        let mut v = vec!["--root", root, "--node", "l40s-1"];
        if !cap.is_empty() {
            v.extend(["--max-document-mib", cap]);
        }
        v.extend(["vgpu", "apply", "-f", path, "-c", "two", "--dry-run"]);
        v
    };
    let refused = run(&args(""));
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("at most 64 MiB"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let raised = run(&args("80"));
    assert!(
        raised.status.success(),
        "{}",
        String::from_utf8_lossy(&raised.stderr)
    );
}

#[test]
fn a_machine_device_with_virtual_function_and_profile_gets_the_guides_rule() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        "name: vm\ndevices: [{name: gpu, virtualFunction: \"0000:26:00.4\", profile: L40S-24Q}]\n",
    )
    .unwrap();
    let fleet =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/fleet/fleet.yaml");
    let out = run(&[
        "place",
        "--inventory",
        fleet.to_str().unwrap(),
        "--machine",
        m.to_str().unwrap(),
        "--dry-run",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`virtualFunction` 0000:26:00.4 cannot be combined with `profile`"),
        "{err}"
    );
    assert!(!err.contains("unknown field"), "{err}");
}

fn slice_devices(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| v["kind"] == "ResourceSlice")
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[test]
fn export_dra_before_1_36_2_takes_each_gpus_size_from_the_layout_file() {
    let t = l40s_root(false);
    let root = t.root().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("l.yaml");
    std::fs::write(
        &layout,
        "version: v1\nvgpu-configs:\n  eights:\n    \"0000:26:00.0\": {L40S-8Q: 3}\n  big:\n    - devices: all\n      vgpu-devices: {L40S-24Q: 1}\n",
    )
    .unwrap();
    let layout = layout.to_str().unwrap();
    let export = |extra: &[&str]| {
        let mut args = vec![
            "--root",
            root,
            "--node",
            "l40s-1",
            "export",
            "dra",
            "--k8s-version",
            "1.35",
        ];
        args.extend(extra);
        let out = run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let names: Vec<String> = slice_devices(&String::from_utf8(out.stdout).unwrap())
            .iter()
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .filter(|n| n.starts_with("vgpu-0000-26-00-0"))
            .collect();
        (names, String::from_utf8(out.stderr).unwrap())
    };
    let (none, stderr) = export(&[]);
    assert!(
        none.is_empty() && stderr.contains("--size-for 0000:26:00.0=PROFILE"),
        "{stderr}"
    );
    let (eights, _) = export(&["--layout", layout, "-c", "eights"]);
    // Six 8 GB vGPUs fit the 48 GB card; its four VFs hold four.
    assert_eq!(
        eights,
        (0..4)
            .map(|i| format!("vgpu-0000-26-00-0-8192mi-{i}"))
            .collect::<Vec<_>>()
    );
    let (big, _) = export(&["--layout", layout, "-c", "big"]);
    assert_eq!(
        big,
        (0..2)
            .map(|i| format!("vgpu-0000-26-00-0-24576mi-{i}"))
            .collect::<Vec<_>>()
    );
    // --size-for wins for the GPU it names.
    let (chosen, _) = export(&[
        "--layout",
        layout,
        "-c",
        "big",
        "--size-for",
        "0000:26:00.0=L40S-8Q",
    ]);
    assert_eq!(chosen, eights);
}
