//! `gpuslice export dra` and `gpuslice dra check`: ResourceSlices of the real captures and of
//! modelled hosts, against golden files and the Kubernetes rules of each supported version.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use serde_json::Value;

const VERSIONS: [&str; 5] = ["1.34", "1.35", "1.36", "1.36.2", "1.37"];

/// From 1.36.2 the size-lock encoding; before, one size per GPU, one device per instance.
fn size_lock(version: &str) -> bool {
    matches!(version, "1.36.2" | "1.37")
}

fn docs(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn slices(yaml: &str) -> Vec<Value> {
    docs(yaml)
        .into_iter()
        .filter(|d| d["kind"] == "ResourceSlice")
        .collect()
}

fn devices(yaml: &str) -> Vec<Value> {
    slices(yaml)
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn device<'a>(devs: &'a [Value], name: &str) -> &'a Value {
    devs.iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

fn check_passes(yaml: &str, version: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("slices.yaml");
    std::fs::write(&f, yaml).unwrap();
    let out = run(&[
        "dra",
        "check",
        f.to_str().unwrap(),
        "--k8s-version",
        version,
    ]);
    assert!(
        out.status.success(),
        "dra check {version} failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn check_fails(yaml: &str, version: &str, expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("slices.yaml");
    std::fs::write(&f, yaml).unwrap();
    let out = run(&[
        "dra",
        "check",
        f.to_str().unwrap(),
        "--k8s-version",
        version,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "expected a violation: {text}");
    assert!(text.contains(expect), "expected {expect:?} in:\n{text}");
}

fn a2_export(version: &str) -> String {
    let a2 = a2_root();
    ok(&[
        "--root",
        a2.path().to_str().unwrap(),
        "--node",
        "a2-host",
        "export",
        "dra",
        "--k8s-version",
        version,
        "--state-dir",
        a2.path().join("no-state").to_str().unwrap(),
    ])
}

#[test]
fn a2_capture_publishes_one_more_4gb_vgpu_and_no_whole_gpu() {
    for v in ["1.34", "1.37"] {
        let yaml = a2_export(v);
        golden("dra", &format!("a2-capture-{v}.yaml"), &yaml);
        check_passes(&yaml, v);
        let devs = devices(&yaml);
        // Three 4 GB vGPUs made outside Kubernetes lock the card: one more 4 GB vGPU, nothing else.
        assert_eq!(devs.len(), 1, "{yaml}");
        let d = if size_lock(v) {
            let d = device(&devs, "vgpu-0000-08-00-0-4096mi");
            assert_eq!(d["capacity"]["instances"]["value"], "1");
            assert_eq!(d["allowMultipleAllocations"], true);
            d
        } else {
            // Before 1.36.2: that one vGPU as a device of its own, counted by every scheduler.
            let d = device(&devs, "vgpu-0000-08-00-0-4096mi-0");
            assert!(d.get("allowMultipleAllocations").is_none());
            assert!(d.get("capacity").is_none());
            d
        };
        for p in ["profile_A2_4Q", "profile_A2_4C", "profile_A2_4A"] {
            assert_eq!(d["attributes"][p]["bool"], true, "{p}");
        }
        assert_eq!(
            d["consumesCounters"][0]["counters"]["framebuffer"]["value"],
            "4Gi"
        );
        let s = slices(&yaml);
        let count = s.len();
        assert!(s.iter().all(|x| x["spec"]["nodeName"] == "a2-host"
            && x["spec"]["pool"]["name"] == "a2-host"
            && x["spec"]["pool"]["resourceSliceCount"] == count));
        if v == "1.34" {
            assert_eq!(s.len(), 1, "1.34 keeps counters with their devices");
        } else {
            assert_eq!(s.len(), 2, "1.35+ splits counters from devices");
        }
    }
}

#[test]
fn a2_capture_as_json_is_a_list_of_the_same_objects() {
    let a2 = a2_root();
    let json = ok(&[
        "--root",
        a2.path().to_str().unwrap(),
        "--node",
        "a2-host",
        "-o",
        "json",
        "export",
        "dra",
        "--state-dir",
        a2.path().join("no-state").to_str().unwrap(),
    ]);
    let list: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap(), &docs(&a2_export("1.37")));
}

#[test]
fn l40s_capture_publishes_each_framebuffer_size_capped_by_free_vfs() {
    let free = l40s_root(false);
    let yaml = ok(&[
        "--root",
        free.root().to_str().unwrap(),
        "--node",
        "l40s-host",
        "export",
        "dra",
    ]);
    golden("dra", "l40s-capture-1.37.yaml", &yaml);
    check_passes(&yaml, "1.37");
    let devs = devices(&yaml);
    let sizes: Vec<&str> = devs.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(
        sizes,
        [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]
            .iter()
            .map(|g| format!("vgpu-0000-26-00-0-{}mi", g * 1024))
            .collect::<Vec<_>>()
    );
    // 1 GB would fit 48 times, but the card has 4 VFs.
    assert_eq!(
        device(&devs, "vgpu-0000-26-00-0-1024mi")["capacity"]["instances"]["value"],
        "4"
    );
    assert_eq!(
        device(&devs, "vgpu-0000-26-00-0-24576mi")["capacity"]["instances"]["value"],
        "2"
    );
    assert_eq!(
        device(&devs, "vgpu-0000-26-00-0-24576mi")["attributes"]["framework"]["string"],
        "vendor-vfio"
    );

    let busy = l40s_root(true);
    let yaml = ok(&[
        "--root",
        busy.root().to_str().unwrap(),
        "--node",
        "l40s-host",
        "export",
        "dra",
    ]);
    golden("dra", "l40s-one-24q-made-outside-1.37.yaml", &yaml);
    check_passes(&yaml, "1.37");
    let devs = devices(&yaml);
    assert_eq!(devs.len(), 1);
    let d = device(&devs, "vgpu-0000-26-00-0-24576mi");
    assert_eq!(d["capacity"]["instances"]["value"], "1");
    assert_eq!(
        d["consumesCounters"][0]["counters"]["framebuffer"]["value"],
        "24Gi"
    );
}

fn modelled_fleet(dir: &std::path::Path) -> std::path::PathBuf {
    write_fleet(
        dir,
        "fleet.json",
        &fleet(vec![h200_node("h200-a", 3), mixed_node("ws-1")]),
    )
}

#[test]
fn modelled_hosts_cover_mig_mixed_size_health_and_whole_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let f = modelled_fleet(dir.path());
    for v in VERSIONS {
        let yaml = ok(&[
            "export",
            "dra",
            "--inventory",
            f.to_str().unwrap(),
            "--k8s-version",
            v,
        ]);
        check_passes(&yaml, v);
        if v == "1.34" || v == "1.37" {
            golden("dra", &format!("modelled-fleet-{v}.yaml"), &yaml);
        }
        let devs = devices(&yaml);
        // MIG placements follow the H100/H200 geometry and consume their memory slices.
        let mig: Vec<&str> = devs
            .iter()
            .filter_map(|d| d["name"].as_str())
            .filter(|n| n.starts_with("mig-0000-18-00-0-"))
            .collect();
        assert_eq!(mig.len(), 7 + 3 + 2 + 1, "{mig:?}");
        let m = device(&devs, "mig-0000-18-00-0-3g-72704mi-s4");
        let used = &m["consumesCounters"][0]["counters"];
        for i in 4..7 {
            assert_eq!(used[format!("memory-slice-{i}")]["value"], "1");
        }
        assert!(used.get("memory-slice-3").is_none());
        if size_lock(v) {
            // Mixed-size: one device with consumable framebuffer in the profile sizes.
            let mixed = device(&devs, "vgpu-0000-17-00-0-mixed");
            assert_eq!(
                mixed["capacity"]["framebuffer"]["requestPolicy"]["validValues"],
                serde_json::json!(["4Gi", "8Gi", "16Gi"])
            );
        } else {
            // Before 1.36.2 no size was chosen for the Ada: none of its vGPUs, and no device is
            // both multi-allocatable and a consumer of counters.
            assert!(
                devs.iter()
                    .all(|d| !d["name"].as_str().unwrap().starts_with("vgpu-0000-17-00-0"))
            );
            assert!(
                devs.iter()
                    .all(|d| d.get("allowMultipleAllocations").is_none())
            );
        }
        // The whole Ada GPU excludes its vGPUs through the counter set.
        let whole = device(&devs, "gpu-0000-17-00-0");
        assert_eq!(
            whole["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
            "0000:17:00.0"
        );
        assert_eq!(whole["attributes"]["type"]["string"], "gpu");
        // Unknown memory: a whole GPU with no counters.
        let amd = device(&devs, "gpu-0000-3b-00-0");
        assert!(amd.get("consumesCounters").is_none());
        // Blocked GPUs are not published; the T4 with a foreign 2 GB vGPU keeps its size.
        assert!(
            devs.iter()
                .all(|d| !d["name"].as_str().unwrap().contains("5e-00-0"))
        );
        assert!(devs.iter().all(|d| d["name"] != "gpu-0000-af-00-0"));
        let t4 = if size_lock(v) {
            let t4 = device(&devs, "vgpu-0000-af-00-0-2048mi");
            assert_eq!(t4["capacity"]["instances"]["value"], "7");
            t4
        } else {
            assert!(
                devs.iter()
                    .all(|d| d["name"] != "vgpu-0000-af-00-0-2048mi-7")
            );
            device(&devs, "vgpu-0000-af-00-0-2048mi-6")
        };
        assert!(t4["attributes"].get("profile_T4_2Q").is_some());
        assert!(t4["attributes"].get("profile_T4_2B").is_some());
        // Health: Unhealthy blocks, Degraded is visible from 1.35 on.
        let on = |gpu: &str| {
            devs.iter()
                .find(|d| d["name"].as_str().unwrap().contains(gpu))
                .unwrap_or_else(|| panic!("{v}: no device on {gpu}"))
        };
        let sick = on("0000-38-00-0");
        assert_eq!(sick["taints"][0]["key"], "gpu.gpuslice.dev/unhealthy");
        assert_eq!(sick["taints"][0]["effect"], "NoSchedule");
        let degraded = on("0000-28-00-0");
        if v == "1.34" {
            assert!(degraded.get("taints").is_none());
        } else {
            assert_eq!(degraded["taints"][0]["effect"], "None");
        }
        assert_eq!(degraded["attributes"]["health"]["string"], "Degraded");
    }
}

#[test]
fn large_nodes_are_split_into_slices_within_every_limit() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "big.json", &fleet(vec![h200_node("big", 12)]));
    for v in VERSIONS {
        let yaml = ok(&[
            "export",
            "dra",
            "--inventory",
            f.to_str().unwrap(),
            "--k8s-version",
            v,
        ]);
        check_passes(&yaml, v);
        let s = slices(&yaml);
        assert!(s.len() > 2, "{v}: {} slices", s.len());
        let mut names = std::collections::BTreeSet::new();
        for slice in &s {
            let spec = &slice["spec"];
            let devs = spec["devices"].as_array().map_or(0, Vec::len);
            let sets = spec["sharedCounters"].as_array().map_or(0, Vec::len);
            assert!(devs <= 64 && sets <= 8, "{v}: {devs} devices, {sets} sets");
            assert_eq!(spec["pool"]["resourceSliceCount"], s.len());
            assert_eq!(spec["nodeName"], "big");
            if v != "1.34" {
                assert!(devs == 0 || sets == 0, "{v}: a slice holds both");
            }
            assert!(names.insert(slice["metadata"]["name"].as_str().unwrap().to_owned()));
        }
        if size_lock(v) {
            assert_eq!(
                devices(&yaml).len(),
                12 * (3 + 13),
                "every GPU's 3 sizes and 13 MIG placements"
            );
        } else {
            assert_eq!(
                devices(&yaml).len(),
                12 * 13,
                "{v}: no size chosen, every GPU's 13 MIG placements"
            );
        }
    }
}

#[test]
fn device_classes_select_on_the_drivers_type_attribute() {
    let dir = tempfile::tempdir().unwrap();
    let f = modelled_fleet(dir.path());
    let yaml = ok(&[
        "export",
        "dra",
        "--inventory",
        f.to_str().unwrap(),
        "--driver",
        "vgpu.example.com",
    ]);
    let classes: Vec<Value> = docs(&yaml)
        .into_iter()
        .filter(|d| d["kind"] == "DeviceClass")
        .collect();
    let names: Vec<&str> = classes
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu", "vgpu"]);
    assert_eq!(
        classes[1]["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == \"vgpu.example.com\" && device.attributes[\"vgpu.example.com\"].type == \"vgpu\""
    );
    assert!(
        slices(&yaml)
            .iter()
            .all(|s| s["spec"]["driver"] == "vgpu.example.com")
    );
    assert!(
        devices(&yaml)
            .iter()
            .filter_map(|d| d["taints"].as_array())
            .flatten()
            .all(|t| t["key"].as_str().unwrap().starts_with("vgpu.example.com/"))
    );
}

#[test]
fn names_kubernetes_would_refuse_are_errors_not_output() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "bad.json", &fleet(vec![h200_node("Node_A", 1)]));
    let out = run(&["export", "dra", "--inventory", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"Node_A\" is not a Kubernetes node name"),
        "{err}"
    );
    assert!(out.stdout.is_empty());

    let f = modelled_fleet(dir.path());
    let out = run(&[
        "export",
        "dra",
        "--inventory",
        f.to_str().unwrap(),
        "--driver",
        "Not_A_Domain",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&[
        "export",
        "dra",
        "--inventory",
        f.to_str().unwrap(),
        "--k8s-version",
        "1.33",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1.34, 1.35, 1.36 or 1.37"));
}

const SLICE_HEAD: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-gpu-0}
spec:
  driver: gpu.gpuslice.dev
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  nodeName: n1
"#;

fn slice_with(body: &str) -> String {
    format!("{SLICE_HEAD}{body}")
}

const COUNTERS: &str = r#"
  sharedCounters:
  - name: gpu-0
    counters:
      framebuffer: {value: 16Gi}
"#;

#[test]
fn check_refuses_counters_and_devices_in_one_slice_from_1_35() {
    let yaml = slice_with(&format!(
        "{COUNTERS}  devices:\n  - name: gpu-0\n    consumesCounters:\n    - counterSet: gpu-0\n      counters: {{framebuffer: {{value: 16Gi}}}}\n"
    ));
    check_passes(&yaml, "1.34");
    check_fails(&yaml, "1.35", "holds both sharedCounters and devices");
}

#[test]
fn check_refuses_the_none_taint_effect_before_1_35() {
    let yaml = slice_with(
        "  devices:\n  - name: gpu-0\n    taints:\n    - {key: gpu.gpuslice.dev/degraded, effect: None}\n",
    );
    check_fails(
        &yaml,
        "1.34",
        "taint effect None is not valid in Kubernetes 1.34",
    );
    check_passes(&yaml, "1.35");
}

#[test]
fn check_finds_a_whole_gpu_that_could_share_its_card_with_a_vgpu() {
    let yaml = slice_with(&format!(
        "{COUNTERS}  devices:\n  - name: gpu-0\n    consumesCounters:\n    - counterSet: gpu-0\n      counters: {{framebuffer: {{value: 8Gi}}}}\n  - name: vgpu-0-4096mi\n    allowMultipleAllocations: true\n    consumesCounters:\n    - counterSet: gpu-0\n      counters: {{framebuffer: {{value: 8Gi}}}}\n"
    ));
    check_fails(
        &yaml,
        "1.34",
        "devices gpu-0 and vgpu-0-4096mi can be allocated together",
    );
}

#[test]
fn check_counts_devices_names_references_and_policies() {
    let many: String = (0..65)
        .map(|i| format!("  - name: d{i}\n    taints:\n    - {{key: a/b, effect: NoSchedule}}\n"))
        .collect();
    check_fails(
        &slice_with(&format!("  devices:\n{many}")),
        "1.37",
        "65 devices, more than 64",
    );

    let bad = slice_with(
        "  devices:\n  - name: Bad_Name\n    attributes:\n      memory-size: {int: 1}\n    consumesCounters:\n    - counterSet: missing\n      counters: {x: {value: '1'}}\n    capacity:\n      instances:\n        value: '4'\n        requestPolicy: {default: '2', validValues: ['1', '8']}\n",
    );
    for expect in [
        "name is not a DNS label",
        "attribute \"memory-size\" is not a C identifier",
        "consumes from counter set missing that is not in the pool",
        "default 2 is not a valid value",
        "a valid value exceeds the capacity",
    ] {
        check_fails(&bad, "1.37", expect);
    }

    let wrong_node = SLICE_HEAD.replace("nodeName: n1", "nodeName: n2");
    check_fails(&wrong_node, "1.37", "nodeName n2 is not the pool's node n1");
    let count = SLICE_HEAD.replace("resourceSliceCount: 1", "resourceSliceCount: 2");
    check_fails(
        &count,
        "1.37",
        "resourceSliceCount 2 but the pool has 1 slices",
    );
}

#[test]
fn example_claims_name_the_profile_numa_alignment_and_a_fallback() {
    let yaml = ok(&["export", "dra", "--examples"]);
    golden("dra", "example-claims.yaml", &yaml);
    let claims = docs(&yaml);
    assert_eq!(claims.len(), 3);
    assert!(claims.iter().all(|c| c["kind"] == "ResourceClaim"));
    let vgpu = &claims[0]["spec"]["devices"];
    assert_eq!(
        vgpu["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"],
        "has(device.attributes[\"gpu.gpuslice.dev\"].profile_A2_4Q)"
    );
    assert_eq!(
        vgpu["config"][0]["opaque"]["parameters"]["profile"],
        "A2-4Q"
    );
    let numa = &claims[1]["spec"]["devices"];
    assert_eq!(numa["requests"][0]["exactly"]["count"], 2);
    assert_eq!(
        numa["constraints"][0]["matchAttribute"],
        "resource.kubernetes.io/numaNode"
    );
    let fallback = &claims[2]["spec"]["devices"]["requests"][0]["firstAvailable"];
    assert_eq!(fallback[0]["deviceClassName"], "vgpu");
    assert_eq!(fallback[1]["deviceClassName"], "gpu");
    assert_eq!(
        claims[2]["spec"]["devices"]["config"][0]["requests"][0],
        "gpu/a2-8q"
    );
}

/// An H200 node whose first VF holds a 1g MIG-backed vGPU made outside Kubernetes, at slot 0
/// when `placed` (the start NVML reports), else at a start nobody read.
fn h200_with_foreign_1g(placed: bool) -> gpu_core::NodeTopology {
    let mut t = h200_node("h200-a", 1);
    let vf = &mut t.mediated_devices.parents[0];
    vf.instances.push(gpu_core::Instance {
        uuid: None,
        address: Some("0000:18:00.4".parse().unwrap()),
        profile: gpu_core::VgpuTypeId::from_str_unchecked("1414"),
        profile_name: Some("NVIDIA H200X-1-18C".into()),
        framebuffer_mib: Some(18 * 1024),
        in_use: Some(true),
        placement_id: None,
    });
    let pool = &mut t.mediated_devices.pools[0];
    pool.used_mib = 18 * 1024;
    pool.mig_slices_used = Some(1);
    let mut slots = gpu_core::MigSlots::new(gpu_core::MigGeometry::for_device(0x2335).unwrap());
    if placed {
        slots.placed.push(gpu_core::MigPlaced {
            profile: "1g.18gb".into(),
            start: 0,
        });
    } else {
        slots.unplaced.push("1g.18gb".into());
    }
    pool.mig_slots = Some(std::sync::Arc::new(slots));
    t
}

fn mig_devices_of(node: gpu_core::NodeTopology) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![node]));
    let yaml = ok(&["export", "dra", "--inventory", f.to_str().unwrap()]);
    let mut names: Vec<String> = devices(&yaml)
        .iter()
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .filter(|n| n.starts_with("mig-"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_foreign_mig_vgpu_at_a_known_start_leaves_the_placements_beside_it_published() {
    let names = mig_devices_of(h200_with_foreign_1g(true));
    // Slot 0 is held: no placement that covers it (1g at 0, 2g at 0, 3g at 0, the 7g).
    for gone in [
        "mig-0000-18-00-0-1g-18432mi-s0",
        "mig-0000-18-00-0-2g-35840mi-s0",
        "mig-0000-18-00-0-3g-72704mi-s0",
    ] {
        assert!(!names.iter().any(|n| n == gone), "{gone} in {names:?}");
    }
    assert!(names.iter().all(|n| !n.contains("-7g-")), "{names:?}");
    for kept in [
        "mig-0000-18-00-0-1g-18432mi-s1",
        "mig-0000-18-00-0-1g-18432mi-s6",
        "mig-0000-18-00-0-2g-35840mi-s2",
        "mig-0000-18-00-0-3g-72704mi-s4",
    ] {
        assert!(names.iter().any(|n| n == kept), "{kept} not in {names:?}");
    }
}

#[test]
fn a_foreign_mig_vgpu_at_an_unknown_start_publishes_no_mig_placement() {
    assert_eq!(
        mig_devices_of(h200_with_foreign_1g(false)),
        Vec::<String>::new()
    );
}

/// A GPU holding a MIG-backed vGPU is in MIG mode: its time-sliced types are not published beside
/// the MIG placements (a claim for one could never be prepared), while the same GPU without the
/// vGPU publishes them.
#[test]
fn a_gpu_holding_a_mig_backed_vgpu_publishes_no_time_sliced_vgpu() {
    let names = |node| {
        let dir = tempfile::tempdir().unwrap();
        let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![node]));
        let yaml = ok(&["export", "dra", "--inventory", f.to_str().unwrap()]);
        devices(&yaml)
            .iter()
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .filter(|n| n.starts_with("vgpu-0000-18-00-0-"))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(h200_with_foreign_1g(true)), Vec::<String>::new());
    assert!(!names(h200_node("h200-a", 1)).is_empty());
}
